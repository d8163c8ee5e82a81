//! `Table` responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what
//! `kubectl get` asks for: the columns and cells the real server's printers produce
//! for the built-in kinds ([`table`]; the column definitions are the server's,
//! recorded in `table/columns.json`; the cells are computed in `table/printers.rs`
//! and below), the default convertor's Name and Created At for kinds without a
//! printer, and the columns a CRD declares for custom resources ([`custom_table`],
//! evaluating `additionalPrinterColumns` with [`jsonpath`]). Rows carry
//! `PartialObjectMetadata`, the whole object or nothing (`includeObject`).
//!
//! The server prints wide (every column, `priority` 1 included); kubectl hides the
//! priority-1 columns unless asked for `-o wide`. The recorded answers this is
//! checked against are in `kube-sim/fixtures/tables/`.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::Resource;

mod custom;
pub mod jsonpath;
mod printers;

pub use custom::{PrinterColumn, custom_table};

/// What a row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// `PartialObjectMetadata` (the default; kubectl needs the namespace).
    #[default]
    Metadata,
    /// The whole object.
    Object,
    /// Nothing (`"object": null`).
    None,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Object") => IncludeObject::Object,
            Some("None") => IncludeObject::None,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Whether an `Accept` header asks for a `meta.k8s.io/v1` Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params.contains(&"g=meta.k8s.io")
            && params.contains(&"v=v1")
    })
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn col(name: &str, ty: &str, desc: &str) -> Value {
    json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" },
        "description": desc, "priority": 0})
}

/// The column definitions the real server sends for each built-in kind,
/// keyed by `plural.group`, as recorded from a kube-apiserver 1.36
/// (`kube-sim/fixtures/tables/`): names, types, descriptions and priorities
/// are the server's own text, so they are data rather than code.
static COLUMNS: LazyLock<Map<String, Value>> =
    LazyLock::new(|| serde_json::from_str(include_str!("table/columns.json")).unwrap_or_default());

/// Whether the server has a printer for `res` that spinlink renders (the
/// others get the default convertor's Name and Created At).
pub fn has_printer(res: Resource<'_>) -> bool {
    COLUMNS.contains_key(&res.qualified())
}

fn columns(res: Resource<'_>) -> Value {
    COLUMNS.get(&res.qualified()).cloned().unwrap_or_else(|| {
        json!([
            col("Name", "string", NAME_DESC),
            col("Created At", "date", AGE_DESC)
        ])
    })
}

/// kubectl's `duration.HumanDuration`: `5s`, `3m10s`, `5h`, `2d`, `3y`.
pub fn human_duration(d: chrono::Duration) -> String {
    let secs = d.num_seconds();
    // Up to a second in the future counts as now: clocks differ.
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `translateTimestampSince`: the age of an RFC 3339 timestamp, `<unknown>` without one.
fn since(ts: &Value, now: DateTime<Utc>) -> String {
    ts.as_str()
        .filter(|s| !s.is_empty())
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| human_duration(now - t.with_timezone(&Utc)))
        .unwrap_or_else(|| "<unknown>".into())
}

/// A string field, or `default` when missing or empty.
fn str_or<'a>(v: &'a Value, default: &'a str) -> &'a str {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or(default)
}

fn len_of(v: &Value) -> usize {
    match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    }
}

/// `labels.FormatLabels`: `k=v,k2=v2`, or `<none>`.
fn selector_string(sel: &Value) -> String {
    let s = sel
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    if s.is_empty() { "<none>".into() } else { s }
}

fn template_columns(obj: &Value) -> (String, String) {
    let cs = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names = cs
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect::<Vec<_>>()
        .join(",");
    let images = cs
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

fn later(a: Option<DateTime<Utc>>, ts: &Value) -> Option<DateTime<Utc>> {
    let t = ts
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    match (a, t) {
        (Some(a), Some(t)) => Some(a.max(t)),
        (a, t) => a.or(t),
    }
}

/// `printPod`'s Ready, Status and Restarts: init containers first, then the app
/// containers from last to first, as kubectl shows them.
fn pod_state(o: &Value, now: DateTime<Utc>) -> (String, String, String) {
    let status = &o["status"];
    let mut reason = str_or(&status["phase"], "").to_owned();
    if let Some(r) = status["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_owned();
    }
    for c in status["conditions"].as_array().into_iter().flatten() {
        if c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }
    let total = len_of(&o["spec"]["containers"]);
    let mut ready = 0;
    let mut restarts = 0;
    let mut last_restart = None;
    let mut initializing = false;
    let inits = status["initContainerStatuses"].as_array();
    for (i, c) in inits.into_iter().flatten().enumerate() {
        restarts += c["restartCount"].as_i64().unwrap_or(0);
        last_restart = later(last_restart, &c["lastState"]["terminated"]["finishedAt"]);
        let terminated = &c["state"]["terminated"];
        if terminated["exitCode"].as_i64() == Some(0) {
            continue;
        }
        if terminated.is_object() {
            reason = match terminated["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => match terminated["signal"].as_i64().filter(|s| *s != 0) {
                    Some(sig) => format!("Init:Signal:{sig}"),
                    None => format!(
                        "Init:ExitCode:{}",
                        terminated["exitCode"].as_i64().unwrap_or(0)
                    ),
                },
            };
        } else if let Some(w) = c["state"]["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{w}");
        } else {
            reason = format!("Init:{i}/{}", len_of(&o["spec"]["initContainers"]));
        }
        initializing = true;
        break;
    }
    if !initializing {
        restarts = 0;
        last_restart = None;
        let mut has_running = false;
        let statuses = status["containerStatuses"].as_array();
        for c in statuses.into_iter().flatten().rev() {
            restarts += c["restartCount"].as_i64().unwrap_or(0);
            last_restart = later(last_restart, &c["lastState"]["terminated"]["finishedAt"]);
            let terminated = &c["state"]["terminated"];
            if let Some(w) = c["state"]["waiting"]["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
            {
                reason = w.to_owned();
            } else if let Some(r) = terminated["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_owned();
            } else if terminated.is_object() {
                reason = match terminated["signal"].as_i64().filter(|s| *s != 0) {
                    Some(sig) => format!("Signal:{sig}"),
                    None => format!("ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
                };
            } else if c["ready"] == true && c["state"]["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if !o["metadata"]["deletionTimestamp"].is_null() {
        if status["reason"] == "NodeLost" {
            reason = "Unknown".into();
        } else if !matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")) {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(now - t)),
        _ => restarts.to_string(),
    };
    (format!("{ready}/{total}"), reason, restarts)
}

fn pod_cells(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (spec, status) = (&o["spec"], &o["status"]);
    let (ready, reason, restarts) = pod_state(o, now);
    let ip = status["podIPs"][0]["ip"]
        .as_str()
        .or(status["podIP"].as_str());
    let gates = match spec["readinessGates"].as_array() {
        Some(g) if !g.is_empty() => {
            let conds = status["conditions"].as_array().cloned().unwrap_or_default();
            let met = g
                .iter()
                .filter(|gate| {
                    conds
                        .iter()
                        .find(|c| c["type"] == gate["conditionType"])
                        .is_some_and(|c| c["status"] == "True")
                })
                .count();
            format!("{met}/{}", g.len())
        }
        _ => "<none>".into(),
    };
    vec![
        json!(str_or(&o["metadata"]["name"], "")),
        json!(ready),
        json!(reason),
        json!(restarts),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(str_or(&Value::from(ip), "<none>")),
        json!(str_or(&spec["nodeName"], "<none>")),
        json!(str_or(&status["nominatedNodeName"], "<none>")),
        json!(gates),
    ]
}

/// The IP, or else the host name, of each `status.loadBalancer.ingress` entry
/// (services and ingresses).
fn load_balancer_ingress(o: &Value) -> Vec<&str> {
    o["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            i["ip"]
                .as_str()
                .filter(|s| !s.is_empty())
                .or(i["hostname"].as_str().filter(|s| !s.is_empty()))
        })
        .collect()
}

/// `getServiceExternalIP`, as the server prints it (wide, so never truncated).
fn service_external_ip(o: &Value) -> String {
    let spec = &o["spec"];
    let external: Vec<&str> = spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match str_or(&spec["type"], "ClusterIP") {
        "ClusterIP" | "NodePort" if external.is_empty() => "<none>".into(),
        "ClusterIP" | "NodePort" => external.join(","),
        "LoadBalancer" => {
            let mut lb = load_balancer_ingress(o);
            lb.sort_unstable();
            lb.dedup();
            lb.extend(external);
            if lb.is_empty() {
                "<pending>".into()
            } else {
                lb.join(",")
            }
        }
        "ExternalName" => str_or(&spec["externalName"], "").to_owned(),
        _ => "<unknown>".into(),
    }
}

/// Type, Cluster-IP, External-IP and Port(s) of a service.
fn service_cells(o: &Value) -> Vec<Value> {
    let spec = &o["spec"];
    let cluster_ip = spec["clusterIPs"][0]
        .as_str()
        .or(spec["clusterIP"].as_str());
    let ports = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p["port"].as_i64().unwrap_or(0);
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64().filter(|n| *n > 0) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    vec![
        json!(str_or(&spec["type"], "ClusterIP")),
        json!(str_or(&Value::from(cluster_ip), "<none>")),
        json!(service_external_ip(o)),
        json!(if ports.is_empty() {
            "<none>".into()
        } else {
            ports
        }),
    ]
}

/// `printEvent`, wide.
fn event_cells(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let first = if o["firstTimestamp"].as_str().is_some_and(|s| !s.is_empty()) {
        since(&o["firstTimestamp"], now)
    } else {
        since(&o["eventTime"], now)
    };
    let mut last = if o["lastTimestamp"].as_str().is_some_and(|s| !s.is_empty()) {
        since(&o["lastTimestamp"], now)
    } else {
        first.clone()
    };
    let mut count = o["count"].as_i64().unwrap_or(0);
    if o["series"].is_object() {
        last = since(&o["series"]["lastObservedTime"], now);
        count = o["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        // Singleton events of the events.k8s.io API have no count.
        count = 1;
    }
    let involved = &o["involvedObject"];
    let kind = str_or(&involved["kind"], "").to_lowercase();
    let target = match involved["name"].as_str().filter(|n| !n.is_empty()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind,
    };
    let component = str_or(
        &o["source"]["component"],
        str_or(&o["reportingComponent"], ""),
    );
    let instance = str_or(&o["source"]["host"], str_or(&o["reportingInstance"], ""));
    let source = match (component, instance) {
        ("", _) => String::new(),
        (c, "") => c.to_owned(),
        (c, i) => format!("{c}, {i}"),
    };
    vec![
        json!(last),
        json!(str_or(&o["type"], "")),
        json!(str_or(&o["reason"], "")),
        json!(target),
        json!(str_or(&involved["fieldPath"], "")),
        json!(source),
        json!(str_or(&o["message"], "").trim()),
        json!(first),
        json!(count),
        json!(str_or(&o["metadata"]["name"], "")),
    ]
}

fn cells(res: Resource<'_>, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(obj["metadata"]["name"].as_str().unwrap_or_default());
    let age = json!(since(&obj["metadata"]["creationTimestamp"], now));
    let spec = &obj["spec"];
    let status = &obj["status"];
    let int = |v: &Value| json!(v.as_i64().unwrap_or(0));
    // The server defaults `spec.replicas` to 1; an undefaulted object reads the same.
    let replicas = spec["replicas"].as_i64().unwrap_or(1);
    let after_name = |rest: Vec<Value>| {
        let mut row = vec![name.clone()];
        row.extend(rest);
        row
    };
    match (res.group, res.plural) {
        ("", "pods") => pod_cells(obj, now),
        ("apps", "deployments") => {
            let (names, images) = template_columns(obj);
            vec![
                name,
                json!(format!(
                    "{}/{replicas}",
                    status["readyReplicas"].as_i64().unwrap_or(0),
                )),
                int(&status["updatedReplicas"]),
                int(&status["availableReplicas"]),
                age,
                json!(names),
                json!(images),
                json!(printers::label_selector(&spec["selector"])),
            ]
        }
        ("apps", "replicasets") => {
            let (names, images) = template_columns(obj);
            vec![
                name,
                json!(replicas),
                int(&status["replicas"]),
                int(&status["readyReplicas"]),
                age,
                json!(names),
                json!(images),
                json!(printers::label_selector(&spec["selector"])),
            ]
        }
        ("", "services") => {
            let mut row = vec![name];
            row.extend(service_cells(obj));
            row.extend([age, json!(selector_string(&spec["selector"]))]);
            row
        }
        ("", "configmaps") => {
            let n = len_of(&obj["data"]) + len_of(&obj["binaryData"]);
            vec![name, json!(n), age]
        }
        // The agent keeps a Secret's keys (never its values), so the count
        // is the cluster's.
        ("", "secrets") => vec![
            name,
            json!(str_or(&obj["type"], "Opaque")),
            json!(len_of(&obj["data"])),
            age,
        ],
        ("", "namespaces") => vec![name, json!(str_or(&status["phase"], "Active")), age],
        ("", "serviceaccounts") => vec![name, age],
        ("", "events") => event_cells(obj, now),
        ("events.k8s.io", "events") => event_cells(&printers::core_event(obj), now),
        ("", "endpoints") => after_name(printers::endpoints(obj, now)),
        ("discovery.k8s.io", "endpointslices") => after_name(printers::endpointslice(obj, now)),
        ("", "nodes") => after_name(printers::node(obj, now)),
        ("", "persistentvolumeclaims") => after_name(printers::persistentvolumeclaim(obj, now)),
        ("", "persistentvolumes") => after_name(printers::persistentvolume(obj, now)),
        ("", "resourcequotas") => after_name(printers::resourcequota(obj, now)),
        ("apps", "statefulsets") => after_name(printers::statefulset(obj, now)),
        ("apps", "daemonsets") => after_name(printers::daemonset(obj, now)),
        ("batch", "jobs") => after_name(printers::job(obj, now)),
        ("batch", "cronjobs") => after_name(printers::cronjob(obj, now)),
        ("networking.k8s.io", "ingresses") => after_name(printers::ingress(obj, now)),
        ("networking.k8s.io", "ingressclasses") => after_name(printers::ingressclass(obj, now)),
        ("networking.k8s.io", "networkpolicies") => after_name(printers::networkpolicy(obj, now)),
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            after_name(printers::rolebinding(obj, now))
        }
        ("policy", "poddisruptionbudgets") => after_name(printers::poddisruptionbudget(obj, now)),
        ("autoscaling", "horizontalpodautoscalers") => {
            after_name(printers::horizontalpodautoscaler(obj, now))
        }
        ("storage.k8s.io", "storageclasses") => printers::storageclass(obj, now),
        ("scheduling.k8s.io", "priorityclasses") => after_name(printers::priorityclass(obj, now)),
        ("coordination.k8s.io", "leases") => after_name(printers::lease(obj, now)),
        // Roles, cluster roles, limit ranges, CRDs and every kind without a
        // printer: the server's default convertor.
        _ => vec![name, printers::created_at(obj)],
    }
}

/// The printer's row conditions: a finished pod's row says it completed
/// (`podSuccessConditions`, `podFailedConditions`).
fn row_conditions(res: Resource<'_>, obj: &Value) -> Option<Value> {
    if (res.group, res.plural) != ("", "pods") {
        return None;
    }
    let (reason, message) = match obj["status"]["phase"].as_str()? {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

/// What a row carries besides its cells, as `includeObject` asks.
fn row_object(res: Resource<'_>, obj: &Value, include: IncludeObject) -> Value {
    match include {
        // The real server keeps every metadata field, `managedFields` included.
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }),
        IncludeObject::Object => {
            let mut o = obj.clone();
            o["kind"] = json!(res.kind);
            o["apiVersion"] = json!(res.api_version());
            o
        }
        IncludeObject::None => Value::Null,
    }
}

/// A Table of `objects` (all of the built-in resource `res`) as of `now`;
/// `list_meta` becomes the table's `metadata` (`resourceVersion`,
/// `continue`). Custom resources are printed by [`custom_table`].
pub fn table<'a>(
    res: Resource<'_>,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| {
            let mut row =
                json!({"cells": cells(res, o, now), "object": row_object(res, o, include)});
            if let Some(conditions) = row_conditions(res, o) {
                row["conditions"] = conditions;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns(res),
        "rows": rows,
    })
}

#[cfg(test)]
mod recorded_tests;
#[cfg(test)]
mod tests;
