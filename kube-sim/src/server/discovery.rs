//! Discovery documents: the recorded ones (`fixtures/discovery/`) plus the groups and
//! resources this simulator's CRDs add, in the three forms clients read them — legacy
//! `/apis` (`APIGroupList`), `/apis/{group}[/{version}]` (`APIGroup`,
//! `APIResourceList`) and aggregated `apidiscovery.k8s.io/v2` (what kubectl 1.28+ asks).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::fixtures;
use crate::resources::ResourceInfo;

/// The verbs of a custom resource, in the order the real server lists them.
const CUSTOM_VERBS: [&str; 8] = [
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "create",
    "update",
    "watch",
];

/// Kubernetes version priority: GA before beta before alpha, higher numbers first,
/// anything else last in lexical order (`version.CompareKubeAwareVersionStrings`).
fn version_rank(v: &str) -> (u8, i64, i64, String) {
    let parse = || -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let rest = &rest[digits.len()..];
        if rest.is_empty() {
            return Some((0, -major, 0));
        }
        let (kind, num) = if let Some(n) = rest.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = rest.strip_prefix("alpha") {
            (2, n)
        } else {
            return None;
        };
        Some((kind, -major, -num.parse::<i64>().ok()?))
    };
    match parse() {
        Some((k, a, b)) => (k, a, b, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// One API group's versions and their resources.
type GroupVersions = (String, Vec<(String, Vec<&'static ResourceInfo>)>);

/// Custom resources by group, then version (versions in priority order).
fn custom_groups(custom: &[&'static ResourceInfo]) -> Vec<GroupVersions> {
    let mut groups: BTreeMap<&str, BTreeMap<&str, Vec<&'static ResourceInfo>>> = BTreeMap::new();
    for r in custom {
        groups
            .entry(r.group)
            .or_default()
            .entry(r.version)
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|(g, versions)| {
            let mut versions: Vec<(String, Vec<&'static ResourceInfo>)> = versions
                .into_iter()
                .map(|(v, rs)| (v.to_string(), rs))
                .collect();
            versions.sort_by_key(|(v, _)| version_rank(v));
            (g.to_string(), versions)
        })
        .collect()
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": gvs, "preferredVersion": gvs.first().cloned().unwrap_or(Value::Null)})
}

fn fixture_json(rel: &str) -> Option<Value> {
    serde_json::from_slice(fixtures::file(rel)?).ok()
}

/// `/apis` as an `APIGroupList` (`aggregated: false`) or an `APIGroupDiscoveryList`.
pub(crate) fn apis(custom: &[&'static ResourceInfo], aggregated: bool) -> Option<Value> {
    let rel = if aggregated {
        "discovery/apis.aggregated.json"
    } else {
        "discovery/apis.json"
    };
    let mut doc = fixture_json(rel)?;
    let list_key = if aggregated { "items" } else { "groups" };
    for (group, versions) in custom_groups(custom) {
        let names: Vec<String> = versions.iter().map(|(v, _)| v.clone()).collect();
        let entry = if aggregated {
            let vs: Vec<Value> = versions
                .iter()
                .map(|(v, rs)| {
                    json!({"version": v, "resources": rs.iter().map(|r| aggregated_resource(r)).collect::<Vec<_>>(), "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": group}, "versions": vs})
        } else {
            group_entry(&group, &names)
        };
        if let Some(list) = doc[list_key].as_array_mut() {
            list.push(entry);
        }
    }
    Some(doc)
}

/// `/apis/{group}`: an `APIGroup`.
pub(crate) fn group(custom: &[&'static ResourceInfo], group: &str) -> Option<Value> {
    if let Some(doc) = fixtures::group(group) {
        return Some(doc);
    }
    let (_, versions) = custom_groups(custom)
        .into_iter()
        .find(|(g, _)| g == group)?;
    let names: Vec<String> = versions.into_iter().map(|(v, _)| v).collect();
    let mut doc = json!({"kind": "APIGroup", "apiVersion": "v1"});
    if let (Some(d), Value::Object(e)) = (doc.as_object_mut(), group_entry(group, &names)) {
        d.extend(e);
    }
    Some(doc)
}

/// The `APIResourceList` of a built-in group version whose legacy document
/// was not recorded, derived from the recorded aggregated discovery: the API
/// server builds both from the same resource table, so they say the same
/// (less `storageVersionHash`, which the aggregated form does not carry).
pub fn derived_group_version(group: &str, version: &str) -> Option<Value> {
    let all = fixture_json("discovery/apis.aggregated.json")?;
    let entry = all["items"]
        .as_array()?
        .iter()
        .find(|i| i["metadata"]["name"] == group)?;
    let resources = entry["versions"]
        .as_array()?
        .iter()
        .find(|v| v["version"] == version)?["resources"]
        .as_array()?;
    let mut out = Vec::new();
    for r in resources {
        let namespaced = r["scope"] == "Namespaced";
        let mut e = json!({
            "name": r["resource"], "singularName": r["singularResource"],
            "namespaced": namespaced, "kind": r["responseKind"]["kind"], "verbs": r["verbs"],
        });
        for key in ["shortNames", "categories"] {
            if let Some(v) = r.get(key) {
                e[key] = v.clone();
            }
        }
        out.push(e);
        for sub in r["subresources"].as_array().into_iter().flatten() {
            let mut e = json!({
                "name": format!("{}/{}", r["resource"].as_str().unwrap_or_default(),
                    sub["subresource"].as_str().unwrap_or_default()),
                "singularName": "", "namespaced": namespaced,
                "kind": sub["responseKind"]["kind"], "verbs": sub["verbs"],
            });
            for key in ["group", "version"] {
                if let Some(v) = sub["responseKind"][key].as_str().filter(|v| !v.is_empty()) {
                    e[key] = json!(v);
                }
            }
            out.push(e);
        }
    }
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"), "resources": out,
    }))
}

/// `/apis/{group}/{version}`: an `APIResourceList`.
pub(crate) fn group_version(
    custom: &[&'static ResourceInfo],
    group: &str,
    version: &str,
) -> Option<Value> {
    if let Some(b) = fixtures::group_version(group, version) {
        return serde_json::from_slice(b).ok();
    }
    if let Some(doc) = derived_group_version(group, version) {
        return Some(doc);
    }
    let served: Vec<&&'static ResourceInfo> = custom
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in served {
        let c = r.custom.expect("custom resources carry their CRD");
        let mut entry = json!({
            "name": r.plural, "singularName": c.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": CUSTOM_VERBS,
        });
        if !c.short_names.is_empty() {
            entry["shortNames"] = json!(c.short_names);
        }
        if !c.categories.is_empty() {
            entry["categories"] = json!(c.categories);
        }
        entry["storageVersionHash"] = json!(storage_version_hash(r));
        resources.push(entry);
        if r.status_subresource {
            resources.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.scale_subresource {
            resources.push(json!({"name": format!("{}/scale", r.plural), "singularName": "",
                "namespaced": r.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}));
        }
    }
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"), "resources": resources,
    }))
}

fn aggregated_resource(r: &ResourceInfo) -> Value {
    let c = r.custom.expect("custom resources carry their CRD");
    let mut entry = json!({
        "resource": r.plural,
        "responseKind": {"group": "", "version": "", "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": c.singular,
        "verbs": CUSTOM_VERBS,
    });
    if !c.short_names.is_empty() {
        entry["shortNames"] = json!(c.short_names);
    }
    if !c.categories.is_empty() {
        entry["categories"] = json!(c.categories);
    }
    let mut subs = Vec::new();
    if r.scale_subresource {
        subs.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": ["get", "patch", "update"]}));
    }
    if r.status_subresource {
        subs.push(json!({"subresource": "status", "responseKind": {"group": "", "version": "", "kind": r.kind}, "verbs": ["get", "patch", "update"]}));
    }
    if !subs.is_empty() {
        entry["subresources"] = Value::Array(subs);
    }
    entry
}

/// An opaque hash of the storage version (clients only compare it): FNV-64 of
/// `group/storageVersion/kind`, first 8 bytes base64 as the real server formats its
/// SHA-256 one.
fn storage_version_hash(r: &ResourceInfo) -> String {
    use base64::Engine as _;
    let storage = r.custom.map_or(r.version, |c| c.storage_version.as_str());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{}/{storage}/{}", r.group, r.kind).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    base64::engine::general_purpose::STANDARD.encode(h.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut v = vec!["v1alpha1", "v2", "foo", "v1beta2", "v1", "v1beta1", "v10"];
        v.sort_by_key(|s| version_rank(s));
        assert_eq!(
            v,
            ["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }
}
