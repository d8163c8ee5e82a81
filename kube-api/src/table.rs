//! `Table` responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what
//! `kubectl get` asks for: the columns and cells the real server's printers produce
//! for pods, deployments, replica sets, services, namespaces, config maps, secrets and
//! events, Name and Age for every other kind, and rows carrying
//! `PartialObjectMetadata`. Start at [`table`]; the recorded shape is
//! `kube-sim/fixtures/objects/pods.table.json`.
//!
//! The server prints wide (every column, `priority` 1 included); kubectl hides the
//! priority-1 columns unless asked for `-o wide`.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::Resource;

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

fn col(name: &str, ty: &str, format: &str, desc: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": desc, "priority": priority})
}

fn columns(plural: &str) -> Vec<Value> {
    let name = col("Name", "string", "name", NAME_DESC, 0);
    let age = col("Age", "string", "", AGE_DESC, 0);
    match plural {
        "pods" => vec![
            name,
            col(
                "Ready",
                "string",
                "",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            col(
                "Status",
                "string",
                "",
                "The aggregate status of the containers in this pod.",
                0,
            ),
            col(
                "Restarts",
                "string",
                "",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
            ),
            age,
            col(
                "IP",
                "string",
                "",
                "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                1,
            ),
            col(
                "Node",
                "string",
                "",
                "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
                1,
            ),
            col(
                "Nominated Node",
                "string",
                "",
                "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
                1,
            ),
            col(
                "Readiness Gates",
                "string",
                "",
                "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
                1,
            ),
        ],
        "deployments" => vec![
            name,
            col(
                "Ready",
                "string",
                "",
                "Number of the pod with ready state",
                0,
            ),
            col(
                "Up-to-date",
                "integer",
                "",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                0,
            ),
            col(
                "Available",
                "integer",
                "",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                0,
            ),
            age,
            col(
                "Containers",
                "string",
                "",
                "Names of each container in the template.",
                1,
            ),
            col(
                "Images",
                "string",
                "",
                "Images referenced by each container in the template.",
                1,
            ),
            col(
                "Selector",
                "string",
                "",
                "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
                1,
            ),
        ],
        "replicasets" => vec![
            name,
            col(
                "Desired",
                "integer",
                "",
                "Replicas is the number of desired pods.",
                0,
            ),
            col(
                "Current",
                "integer",
                "",
                "Replicas is the most recently observed number of replicas.",
                0,
            ),
            col(
                "Ready",
                "integer",
                "",
                "The number of ready replicas for this replica set.",
                0,
            ),
            age,
            col(
                "Containers",
                "string",
                "",
                "Names of each container in the template.",
                1,
            ),
            col(
                "Images",
                "string",
                "",
                "Images referenced by each container in the template.",
                1,
            ),
            col(
                "Selector",
                "string",
                "",
                "Selector is a label query over pods that should match the replica count.",
                1,
            ),
        ],
        "services" => vec![
            name,
            col(
                "Type",
                "string",
                "",
                "type determines how the Service is exposed.",
                0,
            ),
            col(
                "Cluster-IP",
                "string",
                "",
                "clusterIP is the IP address of the service.",
                0,
            ),
            col(
                "External-IP",
                "string",
                "",
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
                0,
            ),
            col(
                "Port(s)",
                "string",
                "",
                "The list of ports that are exposed by this service.",
                0,
            ),
            age,
            col(
                "Selector",
                "string",
                "",
                "Route service traffic to pods with label keys and values matching this selector.",
                1,
            ),
        ],
        "configmaps" => vec![
            name,
            col(
                "Data",
                "string",
                "",
                "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
                0,
            ),
            age,
        ],
        "secrets" => vec![
            name,
            col(
                "Type",
                "string",
                "",
                "Used to facilitate programmatic handling of secret data.",
                0,
            ),
            col(
                "Data",
                "string",
                "",
                "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
                0,
            ),
            age,
        ],
        "namespaces" => vec![
            name,
            col("Status", "string", "", "The status of the namespace", 0),
            age,
        ],
        "events" => vec![
            col(
                "Last Seen",
                "string",
                "",
                "The time at which the most recent occurrence of this event was recorded.",
                0,
            ),
            col(
                "Type",
                "string",
                "",
                "Type of this event (Normal, Warning), new types could be added in the future",
                0,
            ),
            col(
                "Reason",
                "string",
                "",
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                0,
            ),
            col(
                "Object",
                "string",
                "",
                "The object that this event is about.",
                0,
            ),
            col(
                "Subobject",
                "string",
                "",
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object.",
                1,
            ),
            col(
                "Source",
                "string",
                "",
                "The component reporting this event. Should be a short machine understandable string.",
                1,
            ),
            col(
                "Message",
                "string",
                "",
                "A human-readable description of the status of this operation.",
                0,
            ),
            col(
                "First Seen",
                "string",
                "",
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
                1,
            ),
            col(
                "Count",
                "string",
                "",
                "The number of times this event has occurred.",
                1,
            ),
            col("Name", "string", "name", NAME_DESC, 1),
        ],
        _ => vec![name, age],
    }
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
            let mut lb: Vec<&str> = o["status"]["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    i["ip"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .or(i["hostname"].as_str().filter(|s| !s.is_empty()))
                })
                .collect();
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

fn cells(plural: &str, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(obj["metadata"]["name"].as_str().unwrap_or_default());
    let age = json!(since(&obj["metadata"]["creationTimestamp"], now));
    let spec = &obj["spec"];
    let status = &obj["status"];
    let int = |v: &Value| json!(v.as_i64().unwrap_or(0));
    // The server defaults `spec.replicas` to 1; an undefaulted object reads the same.
    let replicas = spec["replicas"].as_i64().unwrap_or(1);
    match plural {
        "pods" => pod_cells(obj, now),
        "deployments" => {
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
                json!(selector_string(&spec["selector"]["matchLabels"])),
            ]
        }
        "replicasets" => {
            let (names, images) = template_columns(obj);
            vec![
                name,
                json!(replicas),
                int(&status["replicas"]),
                int(&status["readyReplicas"]),
                age,
                json!(names),
                json!(images),
                json!(selector_string(&spec["selector"]["matchLabels"])),
            ]
        }
        "services" => {
            let mut row = vec![name];
            row.extend(service_cells(obj));
            row.extend([age, json!(selector_string(&spec["selector"]))]);
            row
        }
        "configmaps" => {
            let n = len_of(&obj["data"]) + len_of(&obj["binaryData"]);
            vec![name, json!(n), age]
        }
        // The agent scrubs secret values before they reach the sidecar, so there the
        // count is of what is left.
        "secrets" => vec![
            name,
            json!(str_or(&obj["type"], "Opaque")),
            json!(len_of(&obj["data"])),
            age,
        ],
        "namespaces" => vec![name, json!(str_or(&status["phase"], "Active")), age],
        "events" => event_cells(obj, now),
        _ => vec![name, age],
    }
}

fn row(res: Resource<'_>, obj: &Value, include: IncludeObject, now: DateTime<Utc>) -> Value {
    let object = match include {
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
    };
    json!({"cells": cells(res.plural, obj, now), "object": object})
}

/// A Table of `objects` (all of `res`) as of `now`; `list_meta` becomes the table's
/// `metadata` (`resourceVersion`, `continue`).
pub fn table<'a>(
    res: Resource<'_>,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| row(res, o, include, now))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns(res.plural),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests;
