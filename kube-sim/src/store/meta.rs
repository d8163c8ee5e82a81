//! Server-set fields, defaults and validation applied to objects on write, as the real
//! API server's registry strategies do for the served kinds.

use rand::Rng;
use serde_json::{Map, Value, json};

use crate::error::Status;
use crate::resources::ResourceInfo;

/// Current time as the API server formats timestamps (RFC 3339, seconds, `Z`).
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A random RFC 4122 version 4 UID.
pub(crate) fn new_uid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 5-character suffix `generateName` gets (the alphabet of `utilrand.String`).
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// `metadata` of `obj` as a map, created if missing.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The plural of a built-in resource, `""` for a custom one (whose plural may be any
/// word, `pods` included, without getting the built-in kind's behaviour).
pub(crate) fn builtin(res: &ResourceInfo) -> &'static str {
    if res.custom.is_some() { "" } else { res.plural }
}

/// Checks the object name the way the kind's validation does.
pub(crate) fn validate_name(res: &ResourceInfo, name: &str) -> Result<(), Status> {
    let invalid = |msg: &str| {
        Status::invalid(
            res.kind,
            name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: {name:?}: {msg}"),
        )
    };
    if name.is_empty() {
        return Err(Status::invalid(
            res.kind,
            "",
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ));
    }
    match builtin(res) {
        "namespaces" => {
            if !is_label(name) {
                return Err(invalid(LABEL_MSG));
            }
        }
        "services" => {
            if !is_label(name) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                return Err(invalid(DNS1035_MSG));
            }
        }
        _ => {
            if name.len() > 253 || !name.split('.').all(is_label) {
                return Err(invalid(SUBDOMAIN_MSG));
            }
        }
    }
    Ok(())
}

/// Fills the defaults the real server's defaulting sets on create (as it
/// decodes the body: what the create's field manager is then recorded as
/// having set).
pub(crate) fn default_on_create(res: &ResourceInfo, obj: &mut Value) {
    let name = meta_str(obj, "name").unwrap_or_default().to_string();
    match builtin(res) {
        "namespaces" => {
            let meta = meta_mut(obj);
            if !meta.get("labels").is_some_and(Value::is_object) {
                meta.insert("labels".into(), json!({}));
            }
            meta["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        "secrets" => {
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
            if let Some(Value::Object(string_data)) =
                obj.as_object_mut().and_then(|o| o.remove("stringData"))
            {
                use base64::Engine as _;
                if !obj["data"].is_object() {
                    obj["data"] = json!({});
                }
                for (k, v) in string_data {
                    let encoded = base64::engine::general_purpose::STANDARD
                        .encode(v.as_str().unwrap_or_default());
                    obj["data"][k] = json!(encoded);
                }
            }
        }
        "services" => {
            if !obj["spec"].is_object() {
                obj["spec"] = json!({});
            }
            let spec = &mut obj["spec"];
            if spec["type"].is_null() {
                spec["type"] = json!("ClusterIP");
            }
            if spec["type"] != "ExternalName" && spec["internalTrafficPolicy"].is_null() {
                spec["internalTrafficPolicy"] = json!("Cluster");
            }
            if spec["sessionAffinity"].is_null() {
                spec["sessionAffinity"] = json!("None");
            }
            if let Some(ports) = spec["ports"].as_array_mut() {
                for p in ports {
                    if p["protocol"].is_null() {
                        p["protocol"] = json!("TCP");
                    }
                    if p["targetPort"].is_null() {
                        p["targetPort"] = p["port"].clone();
                    }
                }
            }
        }
        "deployments" | "replicasets" => {
            if !obj["spec"].is_object() {
                obj["spec"] = json!({});
            }
            let spec = &mut obj["spec"];
            if spec["replicas"].is_null() {
                spec["replicas"] = json!(1);
            }
            if spec["revisionHistoryLimit"].is_null() && res.plural == "deployments" {
                spec["revisionHistoryLimit"] = json!(10);
                spec["progressDeadlineSeconds"] = json!(600);
                // Protobuf writes an unset strategy as an empty one.
                if spec["strategy"].as_object().is_none_or(|s| s.is_empty()) {
                    spec["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}});
                }
            }
        }
        "jobs" => default_job(obj),
        _ => {}
    }
    // Every pod template, as SetDefaults_PodSpec and SetDefaults_Container fill it.
    let template = match builtin(res) {
        "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "jobs" => {
            obj.pointer_mut("/spec/template/spec")
        }
        "cronjobs" => obj.pointer_mut("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    };
    if let Some(spec) = template.filter(|s| s.is_object()) {
        default_pod_spec(spec);
    }
}

/// Records what a create's field manager set, as an `Update` entry of
/// `managedFields` (a server-side apply that creates brings its own entry).
pub(crate) fn record_create_manager(res: &ResourceInfo, obj: &mut Value, manager: &str) {
    if obj["metadata"].get("managedFields").is_some() {
        return;
    }
    let Some(fields) = spinlink_kube_api::protobuf::fieldset::create_fields_v1(obj) else {
        return;
    };
    if fields.as_object().is_none_or(|f| f.is_empty()) {
        return;
    }
    let entry = json!({
        "manager": manager,
        "operation": "Update",
        "apiVersion": res.api_version,
        "time": now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    meta_mut(obj).insert("managedFields".into(), json!([entry]));
}

/// What the registry strategies and allocators set on create, after the
/// field manager's fields are recorded (so they are nobody's).
pub(crate) fn prepare_for_create(res: &ResourceInfo, obj: &mut Value, seq: u64) {
    match builtin(res) {
        "namespaces" => {
            if obj["spec"]["finalizers"].is_null() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            obj["status"] = json!({"phase": "Active"});
        }
        "services" => {
            let spec = &mut obj["spec"];
            if spec["clusterIP"].is_null() {
                let ip = format!("10.96.{}.{}", (seq / 250) % 250, seq % 250 + 2);
                spec["clusterIP"] = json!(ip);
                spec["clusterIPs"] = json!([ip]);
            }
            // The allocator's choice on a single-stack IPv4 cluster.
            if spec["type"] != "ExternalName" {
                if spec["ipFamilies"].is_null() {
                    spec["ipFamilies"] = json!(["IPv4"]);
                }
                if spec["ipFamilyPolicy"].is_null() {
                    spec["ipFamilyPolicy"] = json!("SingleStack");
                }
            }
            if obj["status"].is_null() {
                obj["status"] = json!({"loadBalancer": {}});
            }
        }
        "jobs" => {
            select_job_pods(obj);
            // A new job's status is empty, and Go writes it `{}`.
            if obj["status"].is_null() {
                obj["status"] = json!({});
            }
        }
        "pods" if obj["status"].is_null() => {
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        _ => {}
    }
}

/// What the API server's defaulting writes into a pod spec the client left
/// it to (values of a 1.36 server, `fixtures/protobuf/`).
fn default_pod_spec(spec: &mut Value) {
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
    ] {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers {
            let image = c["image"].as_str().unwrap_or_default();
            // `latest`, or no tag at all, is pulled every time.
            let last = image.rsplit('/').next().unwrap_or(image);
            let pull = if !image.contains('@')
                && last.split_once(':').is_none_or(|(_, tag)| tag == "latest")
            {
                "Always"
            } else {
                "IfNotPresent"
            };
            for (field, value) in [
                ("resources", json!({})),
                ("terminationMessagePath", json!("/dev/termination-log")),
                ("terminationMessagePolicy", json!("File")),
                ("imagePullPolicy", json!(pull)),
            ] {
                if c[field].is_null() {
                    c[field] = value;
                }
            }
        }
    }
}

/// SetDefaults_Job.
fn default_job(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    for (field, value) in [
        ("parallelism", json!(1)),
        ("backoffLimit", json!(6)),
        ("completionMode", json!("NonIndexed")),
        ("suspend", json!(false)),
        ("podReplacementPolicy", json!("TerminatingOrFailed")),
    ] {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    if spec["manualSelector"].is_null() {
        spec["manualSelector"] = json!(false);
    }
}

/// The job strategy's generated selector: the controller-uid labels tie the
/// job to its pods.
fn select_job_pods(obj: &mut Value) {
    let uid = meta_str(obj, "uid").unwrap_or_default().to_string();
    let name = meta_str(obj, "name").unwrap_or_default().to_string();
    let spec = &mut obj["spec"];
    if spec["manualSelector"] == true {
        return;
    }
    spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    if !spec["template"]["metadata"]["labels"].is_object() {
        spec["template"]["metadata"]["labels"] = json!({});
    }
    let labels = &mut spec["template"]["metadata"]["labels"];
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        labels[k] = json!(v);
    }
    let labels = labels.clone();
    let meta = meta_mut(obj);
    if meta
        .get("labels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.is_empty())
    {
        meta.insert("labels".into(), labels);
    }
}

/// Sets the status a controller would converge to for a workload at once (no controller
/// runs in the simulator): every desired replica ready and available.
pub(crate) fn converge_status(res: &ResourceInfo, obj: &mut Value) {
    if builtin(res) == super::crd::CRDS {
        return super::crd::converge_status(obj);
    }
    if !matches!(builtin(res), "deployments" | "replicasets") {
        return;
    }
    let replicas = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let name = meta_str(obj, "name").unwrap_or_default().to_string();
    let mut status = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "fullyLabeledReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    });
    if res.plural == "deployments" {
        let t = now();
        if let Some(s) = status.as_object_mut() {
            s.remove("fullyLabeledReplicas");
            s.insert("updatedReplicas".into(), json!(replicas));
            s.insert("terminatingReplicas".into(), json!(0));
            s.insert(
                "conditions".into(),
                json!([
                    {"type": "Available", "status": "True", "lastUpdateTime": t, "lastTransitionTime": t,
                     "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."},
                    {"type": "Progressing", "status": "True", "lastUpdateTime": t, "lastTransitionTime": t,
                     "reason": "NewReplicaSetAvailable", "message": format!("ReplicaSet \"{name}\" has successfully progressed.")}
                ]),
            );
        }
    }
    if replicas == 0
        && let Some(s) = status.as_object_mut()
    {
        s.remove("readyReplicas");
        s.remove("availableReplicas");
    }
    obj["status"] = status;
}

/// Builds the `autoscaling/v1` `Scale` of a deployment, replica set or custom resource
/// (whose CRD names the replica paths).
pub(crate) fn scale_of(res: &ResourceInfo, obj: &Value) -> Value {
    use super::crd::json_path;
    let meta = &obj["metadata"];
    let paths = res.custom.and_then(|c| c.scale_paths.clone());
    let (spec_replicas, status_replicas, selector) = match &paths {
        Some((spec, status, selector)) => (
            json_path(obj, spec).and_then(Value::as_i64).unwrap_or(0),
            json_path(obj, status).and_then(Value::as_i64).unwrap_or(0),
            selector
                .as_deref()
                .and_then(|p| json_path(obj, p))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        None => (
            obj["spec"]["replicas"].as_i64().unwrap_or(1),
            obj["status"]["replicas"].as_i64().unwrap_or(0),
            obj["spec"]["selector"]["matchLabels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
        ),
    };
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": spec_replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    })
}

/// Sets the desired replicas the `Scale` of `obj` reads.
pub(crate) fn set_scale_replicas(res: &ResourceInfo, obj: &mut Value, replicas: i64) {
    match res.custom.and_then(|c| c.scale_paths.as_ref()) {
        Some((spec, _, _)) => super::crd::set_json_path(obj, spec, json!(replicas)),
        None => obj["spec"]["replicas"] = json!(replicas),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_plural;

    #[test]
    fn uid_looks_like_a_v4_uuid() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
        assert_ne!(uid, new_uid());
    }

    #[test]
    fn names_are_validated_per_kind() {
        let cm = by_plural("configmaps").unwrap();
        assert!(validate_name(cm, "a.b-c").is_ok());
        assert_eq!(validate_name(cm, "Bad_Name").unwrap_err().code, 422);
        assert_eq!(
            validate_name(cm, "").unwrap_err().details.unwrap().causes[0].reason,
            "FieldValueRequired"
        );
        let ns = by_plural("namespaces").unwrap();
        assert!(validate_name(ns, "a.b").is_err());
        let svc = by_plural("services").unwrap();
        assert!(validate_name(svc, "1abc").is_err());
        assert!(validate_name(svc, "abc-1").is_ok());
    }

    #[test]
    fn scale_carries_replicas_and_selector() {
        let dep = json!({"metadata": {"name": "web", "namespace": "demo", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}}, "status": {"replicas": 2}});
        let s = scale_of(by_plural("deployments").unwrap(), &dep);
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"], json!({"replicas": 2, "selector": "app=web"}));
        assert_eq!(s["metadata"]["resourceVersion"], "7");
    }
}
