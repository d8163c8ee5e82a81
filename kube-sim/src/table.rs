//! `Table` responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what
//! `kubectl get` asks for: the real server's columns for pods and deployments, Name and
//! Age (plus a few well-known columns) for the other kinds.

use serde_json::{Value, json};

use crate::resources::ResourceInfo;

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// What a row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
    /// Nothing.
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

fn col(name: &str, ty: &str, format: &str, desc: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": desc, "priority": priority})
}

fn columns(res: &ResourceInfo) -> Vec<Value> {
    let name = col("Name", "string", "name", NAME_DESC, 0);
    let age = col("Age", "string", "", AGE_DESC, 0);
    match res.plural {
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
                "integer",
                "",
                "Data contains the configuration data.",
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
            col("Data", "integer", "", "Data contains the secret data.", 0),
            age,
        ],
        "namespaces" => vec![
            name,
            col("Status", "string", "", "The status of the namespace", 0),
            age,
        ],
        _ => vec![name, age],
    }
}

/// Age as `kubectl` prints it (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
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

fn age(obj: &Value) -> String {
    let Some(ts) = obj["metadata"]["creationTimestamp"].as_str() else {
        return "<unknown>".into();
    };
    match chrono::DateTime::parse_from_rfc3339(ts) {
        Ok(t) => human_duration((chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

fn or_none(v: &Value) -> String {
    match v.as_str() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => "<none>".into(),
    }
}

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

fn pod_status(obj: &Value) -> String {
    let status = &obj["status"];
    let mut reason = status["reason"]
        .as_str()
        .or(status["phase"].as_str())
        .unwrap_or("Unknown")
        .to_string();
    for cs in status["containerStatuses"].as_array().into_iter().flatten() {
        if let Some(r) = cs["state"]["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = r.to_string();
        } else if let Some(r) = cs["state"]["terminated"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = r.to_string();
        }
    }
    if obj["metadata"]["deletionTimestamp"].is_string() {
        reason = "Terminating".into();
    }
    reason
}

fn cells(res: &ResourceInfo, obj: &Value) -> Vec<Value> {
    let name = json!(obj["metadata"]["name"].as_str().unwrap_or_default());
    let spec = &obj["spec"];
    let status = &obj["status"];
    let int = |v: &Value| json!(v.as_i64().unwrap_or(0));
    match res.plural {
        "pods" => {
            let total = spec["containers"].as_array().map_or(0, Vec::len);
            let statuses = status["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let gates = match spec["readinessGates"].as_array() {
                Some(g) if !g.is_empty() => {
                    let conds = status["conditions"].as_array().cloned().unwrap_or_default();
                    let met = g
                        .iter()
                        .filter(|gate| {
                            conds.iter().any(|c| {
                                c["type"] == gate["conditionType"] && c["status"] == "True"
                            })
                        })
                        .count();
                    format!("{met}/{}", g.len())
                }
                _ => "<none>".into(),
            };
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(pod_status(obj)),
                json!(restarts.to_string()),
                json!(age(obj)),
                json!(or_none(&status["podIP"])),
                json!(or_none(&spec["nodeName"])),
                json!(or_none(&status["nominatedNodeName"])),
                json!(gates),
            ]
        }
        "deployments" => {
            let (names, images) = template_columns(obj);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    status["readyReplicas"].as_i64().unwrap_or(0),
                    spec["replicas"].as_i64().unwrap_or(0)
                )),
                int(&status["updatedReplicas"]),
                int(&status["availableReplicas"]),
                json!(age(obj)),
                json!(names),
                json!(images),
                json!(selector_string(&spec["selector"]["matchLabels"])),
            ]
        }
        "replicasets" => {
            let (names, images) = template_columns(obj);
            vec![
                name,
                int(&spec["replicas"]),
                int(&status["replicas"]),
                int(&status["readyReplicas"]),
                json!(age(obj)),
                json!(names),
                json!(images),
                json!(selector_string(&spec["selector"]["matchLabels"])),
            ]
        }
        "services" => {
            let ports = spec["ports"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            format!(
                                "{}/{}",
                                p["port"].as_i64().unwrap_or(0),
                                p["protocol"].as_str().unwrap_or("TCP")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(spec["type"].as_str().unwrap_or("ClusterIP")),
                json!(or_none(&spec["clusterIP"])),
                json!("<none>"),
                json!(ports),
                json!(age(obj)),
                json!(selector_string(&spec["selector"])),
            ]
        }
        "configmaps" => {
            let n = obj["data"].as_object().map_or(0, |m| m.len())
                + obj["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), json!(age(obj))]
        }
        "secrets" => vec![
            name,
            json!(obj["type"].as_str().unwrap_or("Opaque")),
            json!(obj["data"].as_object().map_or(0, |m| m.len())),
            json!(age(obj)),
        ],
        "namespaces" => vec![
            name,
            json!(status["phase"].as_str().unwrap_or("Active")),
            json!(age(obj)),
        ],
        _ => vec![name, json!(age(obj))],
    }
}

fn row(res: &ResourceInfo, obj: &Value, include: IncludeObject) -> Value {
    let mut row = json!({"cells": cells(res, obj)});
    match include {
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            });
        }
        IncludeObject::Object => {
            let mut o = obj.clone();
            o["kind"] = json!(res.kind);
            o["apiVersion"] = json!(res.api_version);
            row["object"] = o;
        }
        IncludeObject::None => {}
    }
    row
}

/// A Table of `objects`; `list_meta` becomes the table's `metadata`.
pub fn table<'a>(
    res: &ResourceInfo,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
) -> Value {
    let rows: Vec<Value> = objects.into_iter().map(|o| row(res, o, include)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns(res),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_header_detection() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(wants_table("application/json;as=Table;g=meta.k8s.io;v=v1"));
        assert!(!wants_table("application/json"));
        assert!(!wants_table(
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
        ));
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(3), "3s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 5 * 60), "3h5m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400), "3d");
        assert_eq!(human_duration(400 * 86400), "400d");
        assert_eq!(human_duration(-5), "<invalid>");
    }
}
