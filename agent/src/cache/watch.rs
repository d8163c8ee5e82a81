//! One kind's watch, turned into `Cache` messages: `Init` → `SyncStart`,
//! listed objects → `ADDED`, `InitDone` → `SyncEnd`, then `MODIFIED` /
//! `DELETED` as the cluster changes.

use futures::StreamExt;
use kube::api::{Api, DynamicObject, TypeMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use spinlink_proto::v1::{self, cache_up, watch_event};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::kinds::WatchedKind;
use crate::scrub::LAST_APPLIED_ANNOTATION;

/// Tells the stream that a kind finished its initial listing.
pub type SyncedTx = mpsc::Sender<&'static str>;

/// Watches `kind` until `tx` closes. Errors are logged and the watch goes on
/// after a backoff (and, after a 410 Gone, a new listing with `SyncStart`).
pub async fn watch_kind(
    client: kube::Client,
    account: String,
    kind: WatchedKind,
    tx: mpsc::Sender<cache_up::Msg>,
    synced: SyncedTx,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &kind.api_resource());
    // Bookmarks on, initial list paginated (500 per page) by default.
    let config = watcher::Config::default();
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut highest = HighestVersion::default();
    while let Some(event) = events.next().await {
        let msg = match event {
            Ok(Event::Init) => {
                highest = HighestVersion::default();
                cache_up::Msg::SyncStart(v1::SyncStart {
                    kind: Some(kind.proto()),
                })
            }
            Ok(Event::InitApply(obj)) => {
                highest.see(obj.metadata.resource_version.as_deref());
                event_msg(&kind, watch_event::Type::Added, obj)
            }
            Ok(Event::InitDone) => {
                if synced.send(kind.resource).await.is_err() {
                    return;
                }
                cache_up::Msg::SyncEnd(v1::SyncEnd {
                    kind: Some(kind.proto()),
                    resource_version: highest.get(),
                })
            }
            Ok(Event::Apply(obj)) => event_msg(&kind, watch_event::Type::Modified, obj),
            Ok(Event::Delete(obj)) => event_msg(&kind, watch_event::Type::Deleted, obj),
            Err(e) => {
                warn!(%account, kind = kind.resource, error = %e, "watch failed, retrying");
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            debug!(%account, kind = kind.resource, "cache stream gone, watch ends");
            return;
        }
    }
}

fn event_msg(kind: &WatchedKind, ty: watch_event::Type, obj: DynamicObject) -> cache_up::Msg {
    let resource_version = obj.metadata.resource_version.clone().unwrap_or_default();
    cache_up::Msg::Event(v1::WatchEvent {
        r#type: ty.into(),
        kind: Some(kind.proto()),
        resource_version,
        object: encode_object(kind, obj),
    })
}

/// The object as JSON with `apiVersion`/`kind` set (list items lack them) and,
/// for Secrets, without values.
pub fn encode_object(kind: &WatchedKind, mut obj: DynamicObject) -> Vec<u8> {
    if kind.is_secret() {
        scrub_dynamic_secret(&mut obj);
    }
    let missing = obj
        .types
        .as_ref()
        .is_none_or(|t| t.api_version.is_empty() || t.kind.is_empty());
    if missing {
        obj.types = Some(TypeMeta {
            api_version: kind.api_version(),
            kind: kind.kind.to_owned(),
        });
    }
    // A DynamicObject is a JSON map with string keys: serialising it cannot
    // fail, but an empty object is sent rather than a panic if it ever did.
    serde_json::to_vec(&obj).unwrap_or_else(|_| b"{}".to_vec())
}

/// Removes a Secret's values from a parsed object.
pub fn scrub_dynamic_secret(obj: &mut DynamicObject) {
    crate::scrub::scrub_secret(&mut obj.data);
    if let Some(annotations) = obj.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// The highest resourceVersion seen during a listing. Resource versions are
/// opaque, but every API server issues them as increasing integers; a
/// non-numeric one is kept only when nothing numeric was seen.
#[derive(Debug, Default, Clone)]
struct HighestVersion {
    numeric: Option<u64>,
    other: Option<String>,
}

impl HighestVersion {
    fn see(&mut self, rv: Option<&str>) {
        let Some(rv) = rv.filter(|rv| !rv.is_empty()) else {
            return;
        };
        match rv.parse::<u64>() {
            Ok(n) => self.numeric = Some(self.numeric.map_or(n, |m| m.max(n))),
            Err(_) => self.other = Some(rv.to_owned()),
        }
    }

    fn get(&self) -> String {
        match (self.numeric, &self.other) {
            (Some(n), _) => n.to_string(),
            (None, Some(s)) => s.clone(),
            (None, None) => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::FIXED_KINDS;
    use serde_json::json;

    fn kind(resource: &str) -> WatchedKind {
        *FIXED_KINDS.iter().find(|k| k.resource == resource).unwrap()
    }

    #[test]
    fn list_items_get_api_version_and_kind() {
        let obj: DynamicObject = serde_json::from_value(
            json!({"metadata": {"name": "d", "resourceVersion": "7"}, "spec": {}}),
        )
        .unwrap();
        let bytes = encode_object(&kind("deployments"), obj);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["metadata"]["name"], "d");
        assert!(v.get("spec").is_some());
    }

    #[test]
    fn secrets_lose_values() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {
                LAST_APPLIED_ANNOTATION: "{\"data\":{\"k\":\"U0VOVElORUw=\"}}", "a": "b"}},
            "type": "Opaque",
            "data": {"k": "U0VOVElORUw="},
            "stringData": {"k2": "SENTINEL"}
        }))
        .unwrap();
        let bytes = encode_object(&kind("secrets"), obj);
        let text = String::from_utf8(bytes).unwrap();
        assert!(!text.contains("U0VOVElORUw="), "{text}");
        assert!(!text.contains("SENTINEL"), "{text}");
        assert!(text.contains("\"type\":\"Opaque\""), "{text}");
        assert!(text.contains("\"a\":\"b\""), "{text}");
    }

    #[test]
    fn configmaps_keep_data() {
        let obj: DynamicObject =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
        let text = String::from_utf8(encode_object(&kind("configmaps"), obj)).unwrap();
        assert!(text.contains("\"k\":\"v\""), "{text}");
    }

    #[test]
    fn highest_version() {
        let mut h = HighestVersion::default();
        assert_eq!(h.get(), "");
        h.see(Some("9"));
        h.see(Some("100"));
        h.see(Some("12"));
        h.see(None);
        h.see(Some("opaque"));
        assert_eq!(h.get(), "100");
        let mut h = HighestVersion::default();
        h.see(Some("opaque"));
        assert_eq!(h.get(), "opaque");
    }
}
