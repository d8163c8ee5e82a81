//! Cells of the built-in kinds beyond pods, workloads' parents, services and
//! events: each function follows the API server's printer for that kind
//! (`pkg/printers/internalversion`), wide, since the server always prints every
//! column and kubectl hides those of priority 1.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::{human_duration, len_of, load_balancer_ingress, since, str_or, template_columns};

/// `metav1.FormatLabelSelector`: `matchLabels` and `matchExpressions` as a
/// selector string sorted by key, `<none>` when empty or missing.
pub(super) fn label_selector(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    for (k, v) in sel["matchLabels"].as_object().into_iter().flatten() {
        reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())));
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = str_or(&e["key"], "");
        let mut values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let text = match str_or(&e["operator"], "") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => return "<error>".into(),
        };
        reqs.push((key.to_owned(), text));
    }
    // Requirements sort by key; the sort is stable, so labels stay first.
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    if reqs.is_empty() {
        "<none>".into()
    } else {
        reqs.into_iter().map(|r| r.1).collect::<Vec<_>>().join(",")
    }
}

/// `labels.FormatLabels` of a plain map.
fn labels(map: &Value) -> String {
    let s = map
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    if s.is_empty() { "<none>".into() } else { s }
}

fn int(v: &Value) -> Value {
    json!(v.as_i64().unwrap_or(0))
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

/// `printBoolPtr`.
fn bool_ptr(v: &Value) -> &'static str {
    match v.as_bool() {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    }
}

/// An `IntOrString` as `intstr.String()` prints it.
fn int_or_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// The default table convertor's `Created At`: the creation time in RFC 3339.
pub(super) fn created_at(o: &Value) -> Value {
    o["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| {
            json!(
                t.with_timezone(&Utc)
                    .to_rfc3339_opts(SecondsFormat::Secs, true)
            )
        })
        .unwrap_or(Value::Null)
}

fn has_condition(o: &Value, ty: &str) -> bool {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == ty && c["status"] == "True")
}

fn time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// `printStatefulSet` after the name: Ready, Age, Containers, Images.
pub(super) fn statefulset(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (names, images) = template_columns(o);
    vec![
        json!(format!(
            "{}/{}",
            o["status"]["readyReplicas"].as_i64().unwrap_or(0),
            o["spec"]["replicas"].as_i64().unwrap_or(1)
        )),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(names),
        json!(images),
    ]
}

/// `printDaemonSet` after the name.
pub(super) fn daemonset(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (st, spec) = (&o["status"], &o["spec"]);
    let (names, images) = template_columns(o);
    vec![
        int(&st["desiredNumberScheduled"]),
        int(&st["currentNumberScheduled"]),
        int(&st["numberReady"]),
        int(&st["updatedNumberScheduled"]),
        int(&st["numberAvailable"]),
        json!(labels(&spec["template"]["spec"]["nodeSelector"])),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(names),
        json!(images),
        json!(label_selector(&spec["selector"])),
    ]
}

/// `printJob` after the name: Status, Completions, Duration, Age, wide columns.
pub(super) fn job(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (spec, st) = (&o["spec"], &o["status"]);
    let succeeded = st["succeeded"].as_i64().unwrap_or(0);
    let completions = match spec["completions"].as_i64() {
        Some(c) => format!("{succeeded}/{c}"),
        None => match spec["parallelism"].as_i64().unwrap_or(0) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (time(&st["startTime"]), time(&st["completionTime"])) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration(now - start),
        (Some(start), Some(end)) => human_duration(end - start),
    };
    let status = if has_condition(o, "Complete") {
        "Complete"
    } else if has_condition(o, "Failed") {
        "Failed"
    } else if !o["metadata"]["deletionTimestamp"].is_null() {
        "Terminating"
    } else if has_condition(o, "Suspended") {
        "Suspended"
    } else if has_condition(o, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(o, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let (names, images) = template_columns(o);
    vec![
        json!(status),
        json!(completions),
        json!(duration),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(names),
        json!(images),
        json!(label_selector(&spec["selector"])),
    ]
}

/// `printCronJob` after the name.
pub(super) fn cronjob(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (spec, st) = (&o["spec"], &o["status"]);
    let job_spec = &spec["jobTemplate"]["spec"];
    let (names, images) = template_columns(&spec["jobTemplate"]);
    let last = if st["lastScheduleTime"].is_string() {
        since(&st["lastScheduleTime"], now)
    } else {
        "<none>".into()
    };
    vec![
        json!(str_or(&spec["schedule"], "")),
        json!(spec["timeZone"].as_str().unwrap_or("<none>")),
        json!(bool_ptr(&spec["suspend"])),
        json!(len_of(&st["active"])),
        json!(last),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(names),
        json!(images),
        json!(label_selector(&job_spec["selector"])),
    ]
}

/// `printIngress` after the name: Class, Hosts, Address, Ports, Age.
pub(super) fn ingress(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &o["spec"];
    let rules = spec["rules"].as_array().cloned().unwrap_or_default();
    // `formatHosts`: at most three hosts, then how many rules are left.
    let mut hosts = Vec::new();
    let mut more = false;
    for r in &rules {
        if hosts.len() == 3 {
            more = true;
        }
        if !more && let Some(h) = r["host"].as_str().filter(|h| !h.is_empty()) {
            hosts.push(h);
        }
    }
    let hosts = match (hosts.is_empty(), more) {
        (true, _) => "*".to_owned(),
        (false, true) => format!("{} + {} more...", hosts.join(","), rules.len() - 3),
        (false, false) => hosts.join(","),
    };
    let address = load_balancer_ingress(o).join(",");
    let ports = if len_of(&spec["tls"]) > 0 {
        "80, 443"
    } else {
        "80"
    };
    vec![
        json!(spec["ingressClassName"].as_str().unwrap_or("<none>")),
        json!(hosts),
        json!(address),
        json!(ports),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `printIngressClass` after the name.
pub(super) fn ingressclass(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let p = &o["spec"]["parameters"];
    let parameters = if p.is_object() {
        let kind = match p["apiGroup"].as_str() {
            Some(g) => format!("{}.{g}", str_or(&p["kind"], "")),
            None => str_or(&p["kind"], "").to_owned(),
        };
        format!("{kind}/{}", str_or(&p["name"], ""))
    } else {
        "<none>".into()
    };
    vec![
        json!(str_or(&o["spec"]["controller"], "")),
        json!(parameters),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `printNetworkPolicy` after the name.
pub(super) fn networkpolicy(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        json!(label_selector(&o["spec"]["podSelector"])),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `printRoleBinding` / `printClusterRoleBinding` after the name.
pub(super) fn rolebinding(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let r = &o["roleRef"];
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for s in o["subjects"].as_array().into_iter().flatten() {
        let name = str_or(&s["name"], "");
        match s["kind"].as_str() {
            Some("ServiceAccount") => sas.push(format!("{}/{name}", str_or(&s["namespace"], ""))),
            Some("User") => users.push(name.to_owned()),
            Some("Group") => groups.push(name.to_owned()),
            _ => {}
        }
    }
    vec![
        json!(format!(
            "{}/{}",
            str_or(&r["kind"], ""),
            str_or(&r["name"], "")
        )),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(users.join(", ")),
        json!(groups.join(", ")),
        json!(sas.join(", ")),
    ]
}

/// `printPodDisruptionBudget` after the name.
pub(super) fn poddisruptionbudget(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &o["spec"];
    let or_na = |v: &Value| {
        if v.is_null() {
            "N/A".to_owned()
        } else {
            int_or_string(v)
        }
    };
    vec![
        json!(or_na(&spec["minAvailable"])),
        json!(or_na(&spec["maxUnavailable"])),
        int(&o["status"]["disruptionsAllowed"]),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// One metric of `formatHPAMetrics` (autoscaling/v2 field names).
fn hpa_metric(spec: &Value, status: Option<&Value>) -> String {
    let unknown = || "<unknown>".to_owned();
    let quantity = |v: &Value| v.as_str().map(str::to_owned).unwrap_or_else(unknown);
    let ty = str_or(&spec["type"], "");
    // The metric source's field is the type with a lower-case first letter.
    let field = match ty {
        "External" => "external",
        "Pods" => "pods",
        "Object" => "object",
        "Resource" => "resource",
        "ContainerResource" => "containerResource",
        _ => return "<unknown type>".into(),
    };
    let source = &spec[field];
    let target = &source["target"];
    let current = status.map(|s| &s[field]).filter(|c| c.is_object());
    match ty {
        "Pods" => {
            let cur = current.map_or_else(unknown, |c| quantity(&c["current"]["averageValue"]));
            format!("{cur}/{}", quantity(&target["averageValue"]))
        }
        "External" | "Object" => {
            if target["averageValue"].is_string() {
                let cur = current
                    .filter(|c| c["current"]["averageValue"].is_string())
                    .map_or_else(unknown, |c| quantity(&c["current"]["averageValue"]));
                format!("{cur}/{} (avg)", quantity(&target["averageValue"]))
            } else {
                let cur = current.map_or_else(unknown, |c| quantity(&c["current"]["value"]));
                format!("{cur}/{}", quantity(&target["value"]))
            }
        }
        _ => {
            let name = str_or(&source["name"], "");
            let prefix = if ty == "ContainerResource" {
                format!("{name}/{}", str_or(&source["container"], ""))
            } else {
                name.to_owned()
            };
            if target["averageValue"].is_string() {
                let cur = current.map_or_else(unknown, |c| quantity(&c["current"]["averageValue"]));
                format!("{prefix}: {cur}/{}", quantity(&target["averageValue"]))
            } else {
                let cur = current
                    .and_then(|c| c["current"]["averageUtilization"].as_i64())
                    .map_or_else(unknown, |u| format!("{u}%"));
                let tgt = target["averageUtilization"]
                    .as_i64()
                    .map_or_else(|| "<auto>".to_owned(), |u| format!("{u}%"));
                format!("{prefix}: {cur}/{tgt}")
            }
        }
    }
}

/// `printHorizontalPodAutoscaler` after the name.
pub(super) fn horizontalpodautoscaler(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (spec, st) = (&o["spec"], &o["status"]);
    let specs = spec["metrics"].as_array().cloned().unwrap_or_default();
    let statuses = st["currentMetrics"].as_array().cloned().unwrap_or_default();
    let targets = if specs.is_empty() {
        "<none>".to_owned()
    } else {
        let list: Vec<String> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| hpa_metric(s, statuses.get(i)))
            .collect();
        if list.len() > 2 {
            format!("{} + {} more...", list[..2].join(", "), list.len() - 2)
        } else {
            list.join(", ")
        }
    };
    let target = &spec["scaleTargetRef"];
    vec![
        json!(format!(
            "{}/{}",
            str_or(&target["kind"], ""),
            str_or(&target["name"], "")
        )),
        json!(targets),
        json!(
            spec["minReplicas"]
                .as_i64()
                .map_or_else(|| "<unset>".to_owned(), |m| m.to_string())
        ),
        int(&spec["maxReplicas"]),
        int(&st["currentReplicas"]),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `helper.GetAccessModesAsString`.
fn access_modes(modes: &Value) -> String {
    let have: Vec<&str> = strings(modes).collect();
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(m, _)| have.contains(m))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// The storage class of a claim or volume, the beta annotation first.
fn storage_class(o: &Value) -> String {
    let beta = &o["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"];
    beta.as_str()
        .or(o["spec"]["storageClassName"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn phase(o: &Value) -> String {
    if o["metadata"]["deletionTimestamp"].is_null() {
        str_or(&o["status"]["phase"], "").to_owned()
    } else {
        "Terminating".into()
    }
}

fn unset(v: &Value) -> String {
    v.as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("<unset>")
        .to_owned()
}

/// `printPersistentVolumeClaim` after the name.
pub(super) fn persistentvolumeclaim(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &o["spec"];
    let volume = str_or(&spec["volumeName"], "");
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        let st = &o["status"];
        (
            str_or(&st["capacity"]["storage"], "0").to_owned(),
            access_modes(&st["accessModes"]),
        )
    };
    vec![
        json!(phase(o)),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(storage_class(o)),
        json!(unset(&spec["volumeAttributesClassName"])),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(unset(&spec["volumeMode"])),
    ]
}

/// `printPersistentVolume` after the name.
pub(super) fn persistentvolume(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &o["spec"];
    let claim = &spec["claimRef"];
    let claim = if claim.is_object() {
        format!(
            "{}/{}",
            str_or(&claim["namespace"], ""),
            str_or(&claim["name"], "")
        )
    } else {
        String::new()
    };
    vec![
        json!(str_or(&spec["capacity"]["storage"], "0")),
        json!(access_modes(&spec["accessModes"])),
        json!(str_or(&spec["persistentVolumeReclaimPolicy"], "")),
        json!(phase(o)),
        json!(claim),
        json!(storage_class(o)),
        json!(unset(&spec["volumeAttributesClassName"])),
        json!(str_or(&o["status"]["reason"], "")),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(unset(&spec["volumeMode"])),
    ]
}

/// `printStorageClass`, the name included (a default class is marked).
pub(super) fn storageclass(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let ann = &o["metadata"]["annotations"];
    let default = ann["storageclass.kubernetes.io/is-default-class"] == "true"
        || ann["storageclass.beta.kubernetes.io/is-default-class"] == "true";
    let mut name = str_or(&o["metadata"]["name"], "").to_owned();
    if default {
        name.push_str(" (default)");
    }
    vec![
        json!(name),
        json!(str_or(&o["provisioner"], "")),
        json!(str_or(&o["reclaimPolicy"], "Delete")),
        json!(str_or(&o["volumeBindingMode"], "Immediate")),
        json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `printPriorityClass` after the name.
pub(super) fn priorityclass(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        int(&o["value"]),
        json!(o["globalDefault"].as_bool().unwrap_or(false)),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(unset(&o["preemptionPolicy"])),
    ]
}

/// `printLease` after the name.
pub(super) fn lease(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        json!(o["spec"]["holderIdentity"].as_str().unwrap_or_default()),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// Resource names as `SortableResourceNames` orders them (plain string order).
fn sorted_keys(m: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = m
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    keys.sort_unstable();
    keys
}

/// `printResourceQuota` after the name: Request, Limit, Age.
pub(super) fn resourcequota(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let hard = &o["spec"]["hard"];
    let used = &o["status"]["used"];
    let (mut requests, mut limits) = (Vec::new(), Vec::new());
    for r in sorted_keys(hard) {
        let text = format!("{r}: {}/{}", str_or(&used[r], "0"), str_or(&hard[r], "0"));
        if r.split('.').next() == Some("limits") && r.contains('.') {
            limits.push(text);
        } else {
            requests.push(text);
        }
    }
    vec![
        json!(requests.join(", ")),
        json!(limits.join(", ")),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `formatEndpoints` of v1 Endpoints: `ip:port` for each port of each
/// subset, three at most, then how many more.
pub(super) fn endpoints(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let subsets = o["subsets"].as_array().cloned().unwrap_or_default();
    let text = if subsets.is_empty() {
        "<none>".to_owned()
    } else {
        let (mut list, mut more, mut count) = (Vec::new(), false, 0);
        for ss in &subsets {
            let addrs: Vec<&str> = ss["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a["ip"].as_str().unwrap_or_default())
                .collect();
            let ports = ss["ports"].as_array().cloned().unwrap_or_default();
            if ports.is_empty() {
                count += addrs.len();
                for a in &addrs {
                    if list.len() == 3 {
                        more = true;
                        break;
                    }
                    list.push((*a).to_owned());
                }
                continue;
            }
            for p in &ports {
                count += addrs.len();
                for a in &addrs {
                    if list.len() == 3 {
                        more = true;
                        break;
                    }
                    let port = p["port"].as_i64().unwrap_or(0);
                    // `net.JoinHostPort`: IPv6 addresses in brackets.
                    if a.contains(':') {
                        list.push(format!("[{a}]:{port}"));
                    } else {
                        list.push(format!("{a}:{port}"));
                    }
                }
            }
        }
        let joined = list.join(",");
        if more {
            format!("{joined} + {} more...", count - 3)
        } else {
            joined
        }
    };
    vec![
        json!(text),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `listWithMoreString`.
fn list_with_more(list: &[String], count: usize) -> String {
    let joined = list.join(",");
    if count > 3 {
        format!("{joined} + {} more...", count - 3)
    } else if joined.is_empty() {
        "<unset>".into()
    } else {
        joined
    }
}

/// `printEndpointSlice` after the name: AddressType, Ports, Endpoints, Age.
pub(super) fn endpointslice(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let ports: Vec<&Value> = o["ports"].as_array().into_iter().flatten().collect();
    let port_list: Vec<String> = ports
        .iter()
        .take(3)
        .map(|p| match (p["port"].as_i64(), p["name"].as_str()) {
            (Some(n), _) => n.to_string(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => "*".into(),
        })
        .collect();
    let addrs: Vec<String> = o["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| {
            strings(&e["addresses"])
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    vec![
        json!(str_or(&o["addressType"], "")),
        json!(list_with_more(&port_list, ports.len())),
        json!(list_with_more(&addrs[..addrs.len().min(3)], addrs.len())),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
    ]
}

/// `printNode` after the name.
pub(super) fn node(o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (spec, st) = (&o["spec"], &o["status"]);
    let mut status: Vec<String> = st["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .rfind(|c| c["type"] == "Ready")
        .map(|c| {
            if c["status"] == "True" {
                "Ready".to_owned()
            } else {
                "NotReady".to_owned()
            }
        })
        .into_iter()
        .collect();
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if spec["unschedulable"] == true {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<&str> = Vec::new();
    for (k, v) in o["metadata"]["labels"].as_object().into_iter().flatten() {
        if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
            if !role.is_empty() {
                roles.push(role);
            }
        } else if k == "kubernetes.io/role"
            && let Some(role) = v.as_str().filter(|r| !r.is_empty())
        {
            roles.push(role);
        }
    }
    roles.sort_unstable();
    roles.dedup();
    let address = |ty: &str| {
        st["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == ty)
            .and_then(|a| a["address"].as_str())
            .unwrap_or("<none>")
            .to_owned()
    };
    let info = &st["nodeInfo"];
    let known = |v: &Value| str_or(v, "<unknown>").to_owned();
    vec![
        json!(status.join(",")),
        json!(if roles.is_empty() {
            "<none>".to_owned()
        } else {
            roles.join(",")
        }),
        json!(since(&o["metadata"]["creationTimestamp"], now)),
        json!(str_or(&info["kubeletVersion"], "")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(known(&info["osImage"])),
        json!(kernel_version(info)),
        json!(known(&info["containerRuntimeVersion"])),
    ]
}

/// The Kernel-Version cell: since Kubernetes 1.35 the server follows the
/// kernel with the node's architecture, `6.8.0-45-generic (amd64)`
/// (kubernetes/kubernetes#132402).
fn kernel_version(info: &Value) -> String {
    let kernel = str_or(&info["kernelVersion"], "<unknown>");
    match info["architecture"].as_str().filter(|a| !a.is_empty()) {
        Some(arch) => format!("{kernel} ({arch})"),
        None => kernel.to_owned(),
    }
}

/// An `events.k8s.io` Event with the core Event's field names, which the
/// server's one event printer reads.
pub(super) fn core_event(o: &Value) -> Value {
    let mut e = o.clone();
    let pairs = [
        ("regarding", "involvedObject"),
        ("note", "message"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
        ("deprecatedSource", "source"),
        ("reportingController", "reportingComponent"),
    ];
    if let Some(m) = e.as_object_mut() {
        for (from, to) in pairs {
            if let Some(v) = m.remove(from) {
                m.insert(to.to_owned(), v);
            }
        }
    }
    e
}
