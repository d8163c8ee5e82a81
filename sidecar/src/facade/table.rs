//! `meta.k8s.io/v1` Tables, what `kubectl get` asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), built from cached
//! objects with the columns the API server prints for the common kinds and
//! Name + Age for every other kind. Shape: `kube-sim/fixtures/objects/pods.table.json`.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

/// What each row's `object` holds (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default; kubectl needs the namespace).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params
                .iter()
                .all(|p| !p.starts_with("g=") || *p == "g=meta.k8s.io")
    })
}

struct Column {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    description: &'static str,
    priority: u8,
}

const fn col(name: &'static str, ty: &'static str, description: &'static str) -> Column {
    Column {
        name,
        ty,
        format: "",
        description,
        priority: 0,
    }
}

const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
const AGE: Column = col(
    "Age",
    "string",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);

fn columns(resource: &str) -> Vec<Column> {
    let wide = |mut c: Column| {
        c.priority = 1;
        c
    };
    match resource {
        "pods" => vec![
            NAME,
            col(
                "Ready",
                "string",
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col(
                "Status",
                "string",
                "The aggregate status of the containers in this pod.",
            ),
            col(
                "Restarts",
                "string",
                "The number of times the containers in this pod have been restarted.",
            ),
            AGE,
            wide(col("IP", "string", "podIP address allocated to the pod.")),
            wide(col(
                "Node",
                "string",
                "NodeName indicates in which node this pod is scheduled.",
            )),
        ],
        "deployments" => vec![
            NAME,
            col("Ready", "string", "Number of the pod with ready state"),
            col(
                "Up-to-date",
                "integer",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            col(
                "Available",
                "integer",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            AGE,
        ],
        "replicasets" => vec![
            NAME,
            col(
                "Desired",
                "integer",
                "Replicas is the number of desired replicas.",
            ),
            col(
                "Current",
                "integer",
                "Replicas is the most recently observed number of replicas.",
            ),
            col(
                "Ready",
                "integer",
                "The number of ready replicas for this replica set.",
            ),
            AGE,
        ],
        "services" => vec![
            NAME,
            col(
                "Type",
                "string",
                "type determines how the Service is exposed.",
            ),
            col(
                "Cluster-IP",
                "string",
                "clusterIP is the IP address of the service.",
            ),
            col(
                "External-IP",
                "string",
                "List of IP addresses for which nodes in the cluster will also accept traffic for this service.",
            ),
            col(
                "Port(s)",
                "string",
                "The list of ports that are exposed by this service.",
            ),
            AGE,
        ],
        "namespaces" => vec![
            NAME,
            col("Status", "string", "The status of the namespace"),
            AGE,
        ],
        "configmaps" => vec![
            NAME,
            col("Data", "string", "Data contains the configuration data."),
            AGE,
        ],
        "secrets" => vec![
            NAME,
            col("Type", "string", "The type of the secret"),
            col(
                "Data",
                "string",
                "The number of entries in the secret's data",
            ),
            AGE,
        ],
        "events" => vec![
            col(
                "Last Seen",
                "string",
                "The time at which the most recent occurrence of this event was recorded.",
            ),
            col("Type", "string", "Type of this event (Normal, Warning)."),
            col(
                "Reason",
                "string",
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
            ),
            col("Object", "string", "The object that this event is about."),
            col(
                "Message",
                "string",
                "A human-readable description of the status of this operation.",
            ),
            wide(NAME),
        ],
        _ => vec![NAME, AGE],
    }
}

/// kubectl's `HumanDuration`: `5s`, `3m10s`, `5h`, `2d`, `3y`.
pub fn human_duration(d: chrono::Duration) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
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
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age_of(ts: Option<&Value>, now: DateTime<Utc>) -> String {
    ts.and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| human_duration(now - t.with_timezone(&Utc)))
        .unwrap_or_else(|| "<unknown>".into())
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, p| v.get(p))
}

fn str_or<'a>(v: &'a Value, path: &[&str], default: &'a str) -> &'a str {
    s(v, path)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default)
}

fn int(v: &Value, path: &[&str]) -> i64 {
    s(v, path).and_then(Value::as_i64).unwrap_or(0)
}

fn len_of(v: &Value, path: &[&str]) -> usize {
    match s(v, path) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

fn pod_status(o: &Value) -> String {
    let mut reason = str_or(o, &["status", "phase"], "").to_owned();
    if let Some(r) = s(o, &["status", "reason"])
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        reason = r.to_owned();
    }
    let mut init_failed = false;
    if let Some(Value::Array(inits)) = s(o, &["status", "initContainerStatuses"]) {
        let total = len_of(o, &["spec", "initContainers"]);
        for (i, c) in inits.iter().enumerate() {
            let terminated = c.pointer("/state/terminated");
            if terminated
                .and_then(|t| t.get("exitCode"))
                .and_then(Value::as_i64)
                == Some(0)
            {
                continue;
            }
            if let Some(t) = terminated {
                reason = match t
                    .get("reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                {
                    Some(r) => format!("Init:{r}"),
                    None => format!(
                        "Init:ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                };
            } else if let Some(w) = c
                .pointer("/state/waiting/reason")
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty() && *r != "PodInitializing")
            {
                reason = format!("Init:{w}");
            } else {
                reason = format!("Init:{i}/{total}");
            }
            init_failed = true;
            break;
        }
    }
    if !init_failed {
        let mut has_running = false;
        if let Some(Value::Array(cs)) = s(o, &["status", "containerStatuses"]) {
            for c in cs.iter().rev() {
                if let Some(w) = c
                    .pointer("/state/waiting/reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                {
                    reason = w.to_owned();
                } else if let Some(t) = c.pointer("/state/terminated") {
                    reason = match t
                        .get("reason")
                        .and_then(Value::as_str)
                        .filter(|r| !r.is_empty())
                    {
                        Some(r) => r.to_owned(),
                        None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                            Some(sig) => format!("Signal:{sig}"),
                            None => format!(
                                "ExitCode:{}",
                                t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                            ),
                        },
                    };
                } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                    && c.pointer("/state/running").is_some()
                {
                    has_running = true;
                }
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if s(o, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null()) {
        reason = if str_or(o, &["status", "reason"], "") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn pod_cells(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let statuses = s(o, &["status", "containerStatuses"]).and_then(Value::as_array);
    let total = len_of(o, &["spec", "containers"]);
    let ready = statuses.map_or(0, |cs| {
        cs.iter()
            .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
            .count()
    });
    let restarts: i64 = statuses.map_or(0, |cs| {
        cs.iter()
            .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
            .sum()
    });
    vec![
        json!(format!("{ready}/{total}")),
        json!(pod_status(o)),
        json!(restarts.to_string()),
        json!(age_of(s(o, &["metadata", "creationTimestamp"]), now)),
        json!(str_or(o, &["status", "podIP"], "<none>")),
        json!(str_or(o, &["spec", "nodeName"], "<none>")),
    ]
}

fn service_cells(o: &Value) -> Vec<Value> {
    let ty = str_or(o, &["spec", "type"], "ClusterIP");
    let cluster_ip = str_or(o, &["spec", "clusterIP"], "<none>");
    let mut external: Vec<String> = Vec::new();
    match ty {
        "ExternalName" => external.push(str_or(o, &["spec", "externalName"], "").to_owned()),
        "LoadBalancer" => {
            if let Some(Value::Array(ing)) = s(o, &["status", "loadBalancer", "ingress"]) {
                for i in ing {
                    let ip = i
                        .get("ip")
                        .or_else(|| i.get("hostname"))
                        .and_then(Value::as_str);
                    external.extend(ip.map(str::to_owned));
                }
            }
            if external.is_empty() {
                external.push("<pending>".into());
            }
        }
        _ => {}
    }
    if let Some(Value::Array(ips)) = s(o, &["spec", "externalIPs"]) {
        external.extend(ips.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    let external = if external.is_empty() {
        "<none>".to_owned()
    } else {
        external.join(",")
    };
    let ports = match s(o, &["spec", "ports"]) {
        Some(Value::Array(ps)) if !ps.is_empty() => ps
            .iter()
            .map(|p| {
                let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                match p
                    .get("nodePort")
                    .and_then(Value::as_i64)
                    .filter(|n| *n != 0)
                {
                    Some(np) => format!("{port}:{np}/{proto}"),
                    None => format!("{port}/{proto}"),
                }
            })
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".to_owned(),
    };
    vec![json!(ty), json!(cluster_ip), json!(external), json!(ports)]
}

fn event_cells(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let last = ["lastTimestamp", "eventTime", "firstTimestamp"]
        .iter()
        .find_map(|k| {
            o.get(*k)
                .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
        })
        .or_else(|| s(o, &["series", "lastObservedTime"]))
        .or_else(|| s(o, &["metadata", "creationTimestamp"]));
    let object = format!(
        "{}/{}",
        str_or(o, &["involvedObject", "kind"], "").to_lowercase(),
        str_or(o, &["involvedObject", "name"], "")
    );
    vec![
        json!(age_of(last, now)),
        json!(str_or(o, &["type"], "")),
        json!(str_or(o, &["reason"], "")),
        json!(object),
        json!(str_or(o, &["message"], "")),
        json!(str_or(o, &["metadata", "name"], "")),
    ]
}

fn cells(resource: &str, o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(str_or(o, &["metadata", "name"], ""));
    let age = json!(age_of(s(o, &["metadata", "creationTimestamp"]), now));
    let mut row = vec![name];
    match resource {
        "pods" => {
            let mut c = pod_cells(o, now);
            row.append(&mut c);
            return row;
        }
        "deployments" => row.extend([
            json!(format!(
                "{}/{}",
                int(o, &["status", "readyReplicas"]),
                s(o, &["spec", "replicas"])
                    .and_then(Value::as_i64)
                    .unwrap_or(1)
            )),
            json!(int(o, &["status", "updatedReplicas"])),
            json!(int(o, &["status", "availableReplicas"])),
        ]),
        "replicasets" => row.extend([
            json!(int(o, &["spec", "replicas"])),
            json!(int(o, &["status", "replicas"])),
            json!(int(o, &["status", "readyReplicas"])),
        ]),
        "services" => row.extend(service_cells(o)),
        "namespaces" => row.push(json!(str_or(o, &["status", "phase"], "Active"))),
        "configmaps" => row.push(json!(
            (len_of(o, &["data"]) + len_of(o, &["binaryData"])).to_string()
        )),
        // Values are scrubbed by the agent, so this counts what is left.
        "secrets" => row.extend([
            json!(str_or(o, &["type"], "Opaque")),
            json!((len_of(o, &["data"]) + len_of(o, &["stringData"])).to_string()),
        ]),
        "events" => return event_cells(o, now),
        _ => {}
    }
    row.push(age);
    row
}

fn row_object(o: &Value, include: IncludeObject) -> Value {
    match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Object => o.clone(),
        IncludeObject::Metadata => {
            let mut meta = o.get("metadata").cloned().unwrap_or_else(|| json!({}));
            if let Some(m) = meta.as_object_mut() {
                m.remove("managedFields");
            }
            json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
            })
        }
    }
}

/// Builds the Table of `objects` (all of one `resource`) at `resource_version`.
pub fn build(
    resource: &str,
    objects: &[&Value],
    resource_version: &str,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let defs: Vec<Value> = columns(resource)
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.ty,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": cells(resource, o, now),
                "object": row_object(o, include),
            })
        })
        .collect();
    let mut metadata = Map::new();
    if !resource_version.is_empty() {
        metadata.insert("resourceVersion".into(), resource_version.into());
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T04:26:36Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/../kube-sim/fixtures/objects/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn human_durations_like_kubectl() {
        let d = chrono::Duration::seconds;
        assert_eq!(human_duration(d(5)), "5s");
        assert_eq!(human_duration(d(119)), "119s");
        assert_eq!(human_duration(d(180)), "3m");
        assert_eq!(human_duration(d(190)), "3m10s");
        assert_eq!(human_duration(d(60 * 45)), "45m");
        assert_eq!(human_duration(d(3600 * 5 + 60 * 7)), "5h7m");
        assert_eq!(human_duration(d(3600 * 20)), "20h");
        assert_eq!(human_duration(d(86400 * 2)), "2d");
        assert_eq!(human_duration(d(86400 * 3 + 3600 * 4)), "3d4h");
        assert_eq!(human_duration(d(86400 * 30)), "30d");
        assert_eq!(human_duration(d(86400 * 365 * 3)), "3y");
        assert_eq!(human_duration(d(-1)), "0s");
        assert_eq!(human_duration(d(-5)), "<invalid>");
    }

    #[test]
    fn pods_table_matches_the_real_servers_leading_columns() {
        let list = fixture("pods.list.json");
        let want = fixture("pods.table.json");
        let items: Vec<&Value> = list["items"].as_array().unwrap().iter().collect();
        let got = build("pods", &items, "251", IncludeObject::Metadata, now());
        assert_eq!(got["kind"], "Table");
        assert_eq!(got["metadata"]["resourceVersion"], "251");
        let names = |t: &Value| -> Vec<String> {
            t["columnDefinitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&got)[..7], names(&want)[..7]);
        assert_eq!(got["rows"].as_array().unwrap().len(), items.len());
        let (g, w) = (&got["rows"][0], &want["rows"][0]);
        // Name, Ready, Status, Restarts, Age, IP, Node as the server printed them.
        assert_eq!(
            g["cells"].as_array().unwrap()[..7],
            w["cells"].as_array().unwrap()[..7]
        );
        assert_eq!(g["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(g["object"]["metadata"]["namespace"], "demo");
        assert!(g["object"]["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn every_kind_has_as_many_cells_as_columns() {
        for (file, resource) in [
            ("deployments.list.json", "deployments"),
            ("replicasets.list.json", "replicasets"),
            ("services.list.json", "services"),
            ("configmaps.list.json", "configmaps"),
            ("secrets.list.json", "secrets"),
            ("events.list.json", "events"),
            ("leases.list.json", "leases"),
        ] {
            let list = fixture(file);
            let items: Vec<&Value> = list["items"].as_array().unwrap().iter().collect();
            assert!(!items.is_empty(), "{file}");
            let t = build(resource, &items, "1", IncludeObject::None, now());
            let cols = t["columnDefinitions"].as_array().unwrap().len();
            for row in t["rows"].as_array().unwrap() {
                assert_eq!(row["cells"].as_array().unwrap().len(), cols, "{file}");
                assert!(row["object"].is_null());
            }
        }
    }

    #[test]
    fn deployment_and_service_cells() {
        let list = fixture("deployments.list.json");
        let d = &list["items"][0];
        let c = cells("deployments", d, now());
        assert_eq!(c[0], "web");
        assert_eq!(c[1], "0/2");
        assert_eq!(c[2], 2);
        assert_eq!(c[3], 0);
        let svc = json!({"metadata": {"name": "s"}, "spec": {"type": "NodePort", "clusterIP": "10.0.0.1",
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
        assert_eq!(
            service_cells(&svc),
            vec![
                json!("NodePort"),
                json!("10.0.0.1"),
                json!("<none>"),
                json!("80:30080/TCP,53/UDP")
            ]
        );
    }

    #[test]
    fn accept_header_detection() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
        assert!(!wants_table(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
    }
}
