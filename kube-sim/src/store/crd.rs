//! CustomResourceDefinitions: validation and defaults of `apiextensions.k8s.io/v1`
//! CRDs as the apiextensions-apiserver applies them, the `Established` status its
//! controllers converge to, and the served custom resources a CRD registers.
//!
//! A real server establishes a CRD asynchronously (a few milliseconds later); kube-sim
//! converges at once, as it does for workload status. Schemas are stored and served
//! but objects are neither pruned nor validated against them.

use serde_json::{Value, json};

use super::meta::{meta_str, now};
use super::{EventType, Key, Sim, State};
use crate::error::Status;
use crate::resources::{self, CustomResource, CustomSpec, PrinterColumn, ResourceInfo};

/// Plural of the CRD resource itself.
pub(crate) const CRDS: &str = "customresourcedefinitions";

fn crd_invalid(name: &str, field: &str, reason: &str, detail: &str) -> Status {
    let mut s = Status::invalid("CustomResourceDefinition", name, field, reason, detail);
    s.message = format!(
        "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {field}: {detail}"
    );
    if let Some(d) = s.details.as_mut() {
        d.group = Some("apiextensions.k8s.io".into());
    }
    s
}

fn str_at<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_default()
}

/// Validates a CRD and fills the defaults the API server sets (`names.singular`,
/// `names.listKind`, `conversion`).
pub(crate) fn validate_and_default(crd: &mut Value) -> Result<(), Status> {
    let name = meta_str(crd, "name").unwrap_or_default().to_string();
    let spec = &crd["spec"];
    let group = str_at(spec, "group").to_string();
    let names = &spec["names"];
    let plural = str_at(names, "plural").to_string();
    let kind = str_at(names, "kind").to_string();
    if group.is_empty() {
        return Err(crd_invalid(
            &name,
            "spec.group",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if !group.contains('.') {
        return Err(crd_invalid(
            &name,
            "spec.group",
            "FieldValueInvalid",
            &format!("Invalid value: {group:?}: should be a domain with at least one dot"),
        ));
    }
    if plural.is_empty() {
        return Err(crd_invalid(
            &name,
            "spec.names.plural",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if kind.is_empty() {
        return Err(crd_invalid(
            &name,
            "spec.names.kind",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if name != format!("{plural}.{group}") {
        return Err(crd_invalid(
            &name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let scope = str_at(spec, "scope");
    if scope != "Namespaced" && scope != "Cluster" {
        return Err(crd_invalid(
            &name,
            "spec.scope",
            "FieldValueNotSupported",
            &format!("Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        return Err(crd_invalid(
            &name,
            "spec.versions",
            "FieldValueInvalid",
            "Invalid value: null: must have exactly one version marked as storage version",
        ));
    }
    if versions.iter().filter(|v| v["storage"] == true).count() != 1 {
        return Err(crd_invalid(
            &name,
            "spec.versions",
            "FieldValueInvalid",
            &format!(
                "Invalid value: {}: must have exactly one version marked as storage version",
                Value::Array(versions.clone())
            ),
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if str_at(v, "name").is_empty() {
            return Err(crd_invalid(
                &name,
                &format!("spec.versions[{i}].name"),
                "FieldValueRequired",
                "Required value",
            ));
        }
        if !v["schema"]["openAPIV3Schema"].is_object() {
            return Err(crd_invalid(
                &name,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "FieldValueRequired",
                "Required value: schemas are required",
            ));
        }
    }
    let names = &mut crd["spec"]["names"];
    if str_at(names, "singular").is_empty() {
        names["singular"] = json!(kind.to_lowercase());
    }
    if str_at(names, "listKind").is_empty() {
        names["listKind"] = json!(format!("{kind}List"));
    }
    if crd["spec"]["conversion"].is_null() {
        crd["spec"]["conversion"] = json!({"strategy": "None"});
    }
    Ok(())
}

/// The status the apiextensions controllers converge to: names accepted, established,
/// the storage version recorded.
pub(crate) fn converge_status(crd: &mut Value) {
    let t = now();
    let names = crd["spec"]["names"].clone();
    let storage = crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["storage"] == true))
        .map(|v| v["name"].clone())
        .unwrap_or(Value::Null);
    let mut stored: Vec<Value> = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !storage.is_null() && !stored.contains(&storage) {
        stored.push(storage);
    }
    crd["status"] = json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": t,
             "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": t,
             "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "acceptedNames": names,
        "storedVersions": stored,
    });
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The resource versions a (valid) CRD serves.
pub(crate) fn served(crd: &Value) -> Vec<&'static ResourceInfo> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let group = str_at(spec, "group");
    let plural = str_at(names, "plural");
    let kind = str_at(names, "kind");
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v["storage"] == true)
        .map(|v| str_at(v, "name").to_string())
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v["served"] != false)
        .map(|v| {
            let printer_columns = v["additionalPrinterColumns"]
                .as_array()
                .map(|cols| {
                    cols.iter()
                        .map(|c| PrinterColumn {
                            name: str_at(c, "name").to_string(),
                            type_: str_at(c, "type").to_string(),
                            format: str_at(c, "format").to_string(),
                            description: str_at(c, "description").to_string(),
                            priority: c["priority"].as_i64().unwrap_or(0),
                            json_path: str_at(c, "jsonPath").to_string(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let scale = &v["subresources"]["scale"];
            let scale_paths = scale.is_object().then(|| {
                (
                    str_at(scale, "specReplicasPath").to_string(),
                    str_at(scale, "statusReplicasPath").to_string(),
                    scale["labelSelectorPath"].as_str().map(str::to_string),
                )
            });
            resources::intern(&CustomSpec {
                group: group.to_string(),
                version: str_at(v, "name").to_string(),
                plural: plural.to_string(),
                kind: kind.to_string(),
                namespaced: str_at(spec, "scope") == "Namespaced",
                status_subresource: v["subresources"]["status"].is_object(),
                custom: CustomResource {
                    crd_name: format!("{plural}.{group}"),
                    singular: str_at(names, "singular").to_string(),
                    short_names: strings(&names["shortNames"]),
                    categories: strings(&names["categories"]),
                    list_kind: str_at(names, "listKind").to_string(),
                    storage_version: storage_version.clone(),
                    printer_columns,
                    scale_paths,
                },
            })
        })
        .collect()
}

impl Sim {
    /// Serves what the stored CRD `crd` defines (replacing what it served before).
    pub(super) fn register_crd(st: &mut State, crd: &Value) {
        let name = meta_str(crd, "name").unwrap_or_default();
        st.custom
            .retain(|r| r.custom.is_none_or(|c| c.crd_name != name));
        st.custom.extend(served(crd));
    }

    /// Deletes every object of the CRD `crd_name` (as the CRD finalizer does before the
    /// CRD goes) and stops serving its resources.
    pub(super) fn unregister_crd(&self, st: &mut State, crd_name: &str) {
        let Some(storage_key) = st
            .custom
            .iter()
            .find(|r| r.storage_key() == crd_name)
            .map(|r| r.storage_key())
        else {
            return;
        };
        let doomed: Vec<Key> = st
            .objects
            .keys()
            .filter(|k| k.resource == storage_key)
            .cloned()
            .collect();
        for k in doomed {
            if let Some(obj) = st.objects.get(&k).cloned() {
                self.commit(st, k, EventType::Deleted, (*obj).clone());
            }
        }
        st.custom.retain(|r| r.storage_key() != crd_name);
    }
}

/// The value of a simple JSON path (`.spec.replicas`, `.metadata.labels.app`,
/// `.status.conditions[0].type`) in `obj`, as additionalPrinterColumns and the scale
/// subresource use them.
pub(crate) fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for part in path.trim_start_matches('.').split('.') {
        if part.is_empty() {
            continue;
        }
        let (field, index) = match part.split_once('[') {
            Some((f, rest)) => (f, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// Sets the value at a simple JSON path, creating objects on the way.
pub(crate) fn set_json_path(obj: &mut Value, path: &str, value: Value) {
    let mut cur = obj;
    for part in path.trim_start_matches('.').split('.') {
        if part.is_empty() {
            continue;
        }
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = &mut cur[part];
    }
    *cur = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                    "subresources": {"status": {}}}]}})
    }

    #[test]
    fn defaults_names_and_conversion() {
        let mut c = crd();
        validate_and_default(&mut c).unwrap();
        assert_eq!(c["spec"]["names"]["singular"], "widget");
        assert_eq!(c["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(c["spec"]["conversion"]["strategy"], "None");
        converge_status(&mut c);
        assert_eq!(c["status"]["conditions"][1]["type"], "Established");
        assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
        let served = served(&c);
        assert_eq!(served.len(), 1);
        assert_eq!(served[0].api_version, "example.com/v1");
        assert_eq!(served[0].storage_key(), "widgets.example.com");
        assert!(served[0].status_subresource && served[0].namespaced);
        // Interned: the same definition gives the same description.
        assert!(std::ptr::eq(served[0], super::served(&c)[0]));
    }

    #[test]
    fn invalid_definitions_are_refused_with_the_field() {
        let mut c = crd();
        c["metadata"]["name"] = json!("gadgets.example.com");
        let s = validate_and_default(&mut c).unwrap_err();
        assert_eq!(s.code, 422);
        assert_eq!(s.details.unwrap().causes[0].field, "metadata.name");
        let mut c = crd();
        c["spec"]["versions"][0]["storage"] = json!(false);
        assert_eq!(
            validate_and_default(&mut c)
                .unwrap_err()
                .details
                .unwrap()
                .causes[0]
                .field,
            "spec.versions"
        );
        let mut c = crd();
        c["spec"]["scope"] = json!("Global");
        assert_eq!(validate_and_default(&mut c).unwrap_err().code, 422);
    }

    #[test]
    fn json_paths() {
        let o = json!({"spec": {"replicas": 3, "list": [{"a": 1}]}});
        assert_eq!(json_path(&o, ".spec.replicas"), Some(&json!(3)));
        assert_eq!(json_path(&o, ".spec.list[0].a"), Some(&json!(1)));
        assert_eq!(json_path(&o, ".spec.missing"), None);
        let mut o = json!({});
        set_json_path(&mut o, ".spec.replicas", json!(2));
        assert_eq!(o, json!({"spec": {"replicas": 2}}));
    }
}
