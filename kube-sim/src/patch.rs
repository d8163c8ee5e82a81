//! PATCH bodies: JSON merge patch, JSON patch, strategic merge patch (with the patch
//! merge keys of the served kinds) and server-side apply.
//!
//! [`apply_patch`] is the entry point; it turns the current object and a patch body
//! into the patched object, or a [`Status`] explaining why it cannot.

use serde_json::{Map, Value};

use crate::error::Status;

/// The PATCH flavours, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// The patch type of a `Content-Type` header value.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        match essence {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Parses a patch body (JSON, or YAML for apply).
pub fn parse_body(patch_type: PatchType, body: &[u8]) -> Result<Value, Status> {
    let parsed = if patch_type == PatchType::Apply {
        serde_norway::from_slice::<Value>(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))
}

/// Applies `patch` of `patch_type` to `current`, returning the new object.
pub fn apply_patch(current: &Value, patch_type: PatchType, patch: &Value) -> Result<Value, Status> {
    let mut doc = current.clone();
    match patch_type {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(Status::bad_request(
                    "error decoding patch: a merge patch must be a JSON object",
                ));
            }
            json_patch::merge(&mut doc, patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut doc, &ops.0)
                .map_err(|e| Status::unprocessable(e.to_string()))?;
        }
        PatchType::Strategic | PatchType::Apply => {
            let (Some(target), Some(patch)) = (doc.as_object_mut(), patch.as_object()) else {
                return Err(Status::bad_request(
                    "error decoding patch: a strategic merge patch must be a JSON object",
                ));
            };
            strategic_merge(target, patch);
        }
    }
    Ok(doc)
}

/// The patch merge key of a list field, from the Kubernetes API's `patchMergeKey` tags.
fn merge_key(field: &str, target: &[Value], patch: &[Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        // Container ports merge on containerPort, Service ports on port.
        "ports" => {
            if target
                .iter()
                .chain(patch)
                .any(|p| p.get("containerPort").is_some())
            {
                "containerPort"
            } else {
                "port"
            }
        }
        _ => return None,
    })
}

/// Lists of scalars whose patch strategy is `merge` (a set union).
fn is_merged_scalar_list(field: &str) -> bool {
    field == "finalizers"
}

/// Merges a strategic merge patch map into `target`.
pub fn strategic_merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut fresh = Map::new();
        let mut rest = patch.clone();
        rest.remove("$patch");
        strategic_merge(&mut fresh, &rest);
        *target = fresh;
        return;
    }
    for (key, pv) in patch {
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (target.get_mut(field), pv.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        match pv {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(key);
                    continue;
                }
                match target.get_mut(key) {
                    Some(Value::Object(tm)) => strategic_merge(tm, pm),
                    _ => {
                        let mut fresh = Map::new();
                        strategic_merge(&mut fresh, pm);
                        target.insert(key.clone(), Value::Object(fresh));
                    }
                }
            }
            Value::Array(pa) => {
                let existing = match target.get(key) {
                    Some(Value::Array(t)) => t.clone(),
                    _ => Vec::new(),
                };
                if let Some(mk) = merge_key(key, &existing, pa) {
                    let mut list = existing;
                    merge_list(&mut list, pa, mk);
                    target.insert(key.clone(), Value::Array(list));
                } else if is_merged_scalar_list(key) {
                    let mut list = existing;
                    for v in pa {
                        if !list.contains(v) {
                            list.push(v.clone());
                        }
                    }
                    target.insert(key.clone(), Value::Array(list));
                } else {
                    target.insert(key.clone(), Value::Array(pa.iter().map(clean).collect()));
                }
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        target.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
}

/// A patch value with its directives resolved against nothing.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut fresh = Map::new();
            strategic_merge(&mut fresh, m);
            Value::Object(fresh)
        }
        other => other.clone(),
    }
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value], key: &str) {
    let is_directive = |v: &Value, d: &str| v.get("$patch").and_then(Value::as_str) == Some(d);
    if patch.iter().any(|v| is_directive(v, "replace")) {
        *target = patch
            .iter()
            .filter(|v| !is_directive(v, "replace"))
            .map(clean)
            .collect();
        return;
    }
    for pv in patch {
        let Some(pm) = pv.as_object() else {
            if !target.contains(pv) {
                target.push(pv.clone());
            }
            continue;
        };
        let id = pm.get(key);
        let pos = id.and_then(|id| target.iter().position(|t| t.get(key) == Some(id)));
        if is_directive(pv, "delete") {
            if let Some(id) = id {
                target.retain(|t| t.get(key) != Some(id));
            }
            continue;
        }
        match pos {
            Some(i) => {
                if let Some(tm) = target[i].as_object_mut() {
                    strategic_merge(tm, pm);
                }
            }
            None => target.push(clean(pv)),
        }
    }
}

/// `fieldsV1` describing the fields set in `applied` (what server-side apply records
/// in `managedFields`); identity fields (`apiVersion`, `kind`, name, namespace) are not owned.
pub fn fields_v1(applied: &Value) -> Value {
    let mut root = match applied {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("apiVersion");
            m.remove("kind");
            if let Some(Value::Object(meta)) = m.get_mut("metadata") {
                for k in [
                    "name",
                    "namespace",
                    "resourceVersion",
                    "uid",
                    "managedFields",
                    "creationTimestamp",
                ] {
                    meta.remove(k);
                }
                if meta.is_empty() {
                    m.remove("metadata");
                }
            }
            Value::Object(m)
        }
        other => other.clone(),
    };
    fields_of(&mut root, "")
}

fn fields_of(v: &mut Value, field: &str) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, child) in m.iter_mut() {
                out.insert(format!("f:{k}"), fields_of(child, k));
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Map::new();
            let key = merge_key(field, items, &[]);
            if let Some(key) = key {
                for item in items.iter_mut() {
                    if let Some(id) = item.get(key).cloned() {
                        let k = format!("k:{}", serde_json::json!({ key: id }));
                        out.insert(k, fields_of(item, ""));
                    }
                }
            }
            Value::Object(out)
        }
        _ => Value::Object(Map::new()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn smp(target: Value, patch: Value) -> Value {
        apply_patch(&target, PatchType::Strategic, &patch).unwrap()
    }

    fn deployment() -> Value {
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80}],
             "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "busybox"}
        ]}}}})
    }

    #[test]
    fn containers_merge_by_name() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}}}}),
        );
        let cs = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(cs.len(), 2, "other containers kept");
        assert_eq!(cs[0]["image"], "nginx:1.27");
        assert_eq!(
            cs[0]["ports"][0]["containerPort"], 80,
            "fields not in the patch kept"
        );
        assert_eq!(cs[1]["name"], "sidecar");
    }

    #[test]
    fn new_elements_append_and_env_merges_by_name() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "nginx", "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
                {"name": "extra", "image": "redis"}
            ]}}}}),
        );
        let cs = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(cs.len(), 3);
        assert_eq!(
            cs[0]["env"],
            json!([{"name": "A", "value": "2"}, {"name": "B", "value": "3"}])
        );
        assert_eq!(cs[2]["name"], "extra");
    }

    #[test]
    fn delete_and_replace_directives() {
        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "nginx"}],
                "containers": [{"name": "sidecar", "$patch": "delete"}]
            }}}}),
        );
        let cs = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0]["name"], "nginx");
        assert!(
            out["spec"]["template"]["spec"]
                .get("$setElementOrder/containers")
                .is_none()
        );

        let out = smp(
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "x"}]}}}}),
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );

        let out = smp(
            json!({"spec": {"a": 1, "b": 2}}),
            json!({"spec": {"$patch": "replace", "c": 3}}),
        );
        assert_eq!(out, json!({"spec": {"c": 3}}));
        let out = smp(
            json!({"spec": {"a": 1}, "x": 1}),
            json!({"spec": {"$patch": "delete"}}),
        );
        assert_eq!(out, json!({"x": 1}));
    }

    #[test]
    fn ports_merge_by_their_keys_and_null_deletes() {
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let out = smp(
            svc,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
        );
        assert_eq!(out["spec"]["ports"].as_array().unwrap().len(), 2);
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 8080);
        let out = smp(
            json!({"data": {"a": "1", "b": "2"}}),
            json!({"data": {"a": null}}),
        );
        assert_eq!(out, json!({"data": {"b": "2"}}));
    }

    #[test]
    fn retain_keys_and_unknown_lists_replace() {
        let out = smp(
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}, "args": ["a", "b"]}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}, "args": ["c"]}}),
        );
        assert_eq!(
            out,
            json!({"spec": {"strategy": {"type": "Recreate"}, "args": ["c"]}})
        );
    }

    #[test]
    fn merge_and_json_patch() {
        let out = apply_patch(
            &json!({"a": {"b": 1, "c": 2}}),
            PatchType::Merge,
            &json!({"a": {"b": null, "d": 3}}),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"c": 2, "d": 3}}));
        let out = apply_patch(
            &json!({"spec": {"replicas": 1}}),
            PatchType::Json,
            &json!([{"op": "replace", "path": "/spec/replicas", "value": 4}]),
        )
        .unwrap();
        assert_eq!(out["spec"]["replicas"], 4);
        let err = apply_patch(
            &json!({}),
            PatchType::Json,
            &json!([{"op": "remove", "path": "/nope"}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            apply_patch(&json!({}), PatchType::Json, &json!({"op": 1}))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn fields_v1_matches_the_ssa_fixture_shape() {
        let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa-demo", "namespace": "demo"}, "data": {"k": "v"}});
        assert_eq!(fields_v1(&applied), json!({"f:data": {"f:k": {}}}));
        let dep = json!({"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "x"}]}}}});
        assert_eq!(
            fields_v1(&dep),
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": {"f:image": {}, "f:name": {}}}}}}})
        );
    }
}
