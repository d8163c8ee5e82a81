//! Discovery and OpenAPI documents recorded from a real kube-apiserver, embedded at build time.

include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

/// The embedded file at `rel` (path under `fixtures/`, e.g. `discovery/api.json`).
pub(crate) fn file(rel: &str) -> Option<&'static [u8]> {
    FILES.iter().find(|(p, _)| *p == rel).map(|(_, b)| *b)
}

/// The discovery document for `/apis/{group}/{version}`.
pub(crate) fn group_version(group: &str, version: &str) -> Option<&'static [u8]> {
    file(&format!("discovery/apis_{group}_{version}.json"))
}

/// The OpenAPI v3 document for a path of the v3 index (`api/v1`, `apis/apps/v1`, ...).
pub(crate) fn openapi_v3(path: &str) -> Option<&'static [u8]> {
    if path.is_empty() {
        return file("openapi/v3/index.json");
    }
    if path.contains("..") {
        return None;
    }
    file(&format!("openapi/v3/{}.json", path.replace('/', "_")))
}

/// `/apis/{group}`: the group's entry of `/apis` as an `APIGroup` document.
pub(crate) fn group(group: &str) -> Option<serde_json::Value> {
    let list: serde_json::Value = serde_json::from_slice(file("discovery/apis.json")?).ok()?;
    let entry = list["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == group)?
        .clone();
    let mut doc = serde_json::json!({"kind": "APIGroup", "apiVersion": "v1"});
    if let (Some(doc), Some(entry)) = (doc.as_object_mut(), entry.as_object()) {
        doc.extend(entry.clone());
    }
    Some(doc)
}
