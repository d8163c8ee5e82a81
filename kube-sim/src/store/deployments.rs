//! A minimal deployment controller, enough for `kubectl rollout history|undo|pause|
//! resume|restart|status`: each distinct pod template of a Deployment gets a ReplicaSet
//! it controls, named `{deployment}-{pod-template-hash}`, carrying the
//! `deployment.kubernetes.io/revision` annotation; the current one has the
//! deployment's replicas, the others none; old ones beyond `revisionHistoryLimit` go.
//!
//! As the real controller: a paused deployment does not roll out; going back to an
//! old template (what `kubectl rollout undo` patches in, client-side) revives that
//! template's ReplicaSet under a new revision. Unlike it, the rollout completes at
//! once, no pods are created for new ReplicaSets, and the revision annotation is set
//! in the same write as the template change (the real controller writes it a moment
//! later).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::meta::{meta_mut, meta_str};
use super::{EventType, Key, Sim, State, WriteOptions};
use crate::resources;

/// The annotation holding a deployment's and its replica sets' revision.
pub(crate) const REVISION: &str = "deployment.kubernetes.io/revision";
/// The label distinguishing a deployment's replica sets.
pub(crate) const HASH_LABEL: &str = "pod-template-hash";

/// Deployment annotations the controller does not copy onto replica sets.
const NOT_COPIED: [&str; 4] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
];

/// Keys sorted at every level, so equal templates hash equally whatever their key order.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> =
                m.iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The `pod-template-hash` of a template: FNV-32a of the template, its decimal digits
/// mapped onto the apimachinery `SafeEncodeString` alphabet, as the controller names
/// replica sets.
pub(crate) fn pod_template_hash(template: &Value) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let text = canonical(&without_hash(template)).to_string();
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// A template without the `pod-template-hash` label (and an empty label map dropped).
fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t["metadata"]["labels"].as_object_mut() {
        labels.remove(HASH_LABEL);
    }
    t
}

fn revision(obj: &Value) -> i64 {
    obj["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn owned_by(obj: &Value, uid: &str) -> bool {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r["uid"] == uid && r["controller"] == true)
        })
}

impl Sim {
    /// The replica sets the deployment controls, by key.
    fn owned_replica_sets(st: &State, dep: &Value) -> Vec<(Key, Value)> {
        let uid = meta_str(dep, "uid").unwrap_or_default();
        let ns = meta_str(dep, "namespace").unwrap_or_default();
        let rs = resources::by_plural("replicasets").expect("replicasets are served");
        Self::range(st, rs)
            .filter(|(k, o)| k.namespace == ns && owned_by(o, uid))
            .map(|(k, o)| (k.clone(), (**o).clone()))
            .collect()
    }

    /// Before a deployment write is committed: when it rolls out (created, template
    /// changed, or resumed), sets the revision its current replica set will have.
    pub(super) fn plan_rollout(st: &State, old: Option<&Value>, dep: &mut Value) {
        if dep["spec"]["paused"] == true {
            return;
        }
        let rolls = match old {
            None => true,
            Some(old) => {
                old["spec"]["template"] != dep["spec"]["template"]
                    || (old["spec"]["paused"] == true)
                    || revision(dep) == 0
            }
        };
        if !rolls {
            // Keep the revision even when a client replaced the annotations.
            if let Some(old) = old
                && revision(dep) != revision(old)
                && revision(old) > 0
            {
                set_annotation(dep, REVISION, &revision(old).to_string());
            }
            return;
        }
        let owned = Self::owned_replica_sets(st, dep);
        let max = owned.iter().map(|(_, rs)| revision(rs)).max().unwrap_or(0);
        let template = without_hash(&dep["spec"]["template"]);
        let current = owned
            .iter()
            .find(|(_, rs)| without_hash(&rs["spec"]["template"]) == template);
        let rev = match current {
            Some((_, rs)) if revision(rs) == max && max > 0 => max,
            _ => max + 1,
        };
        set_annotation(dep, REVISION, &rev.to_string());
    }

    /// After a deployment write is committed: creates or revives the replica set of its
    /// template under the deployment's revision, scales the others to zero and prunes
    /// old ones beyond `revisionHistoryLimit`.
    pub(super) fn reconcile_deployment(&self, st: &mut State, dep: &Value) {
        if dep["spec"]["paused"] == true {
            return;
        }
        let rs_res = resources::by_plural("replicasets").expect("replicasets are served");
        let replicas = dep["spec"]["replicas"].as_i64().unwrap_or(1);
        let rev = revision(dep);
        let template = without_hash(&dep["spec"]["template"]);
        let owned = Self::owned_replica_sets(st, dep);
        let mut current = None;
        for (key, rs) in &owned {
            let mine = without_hash(&rs["spec"]["template"]) == template && current.is_none();
            let mut new = rs.clone();
            if mine {
                current = Some(key.clone());
                new["spec"]["replicas"] = json!(replicas);
                set_annotation(&mut new, REVISION, &rev.to_string());
                set_annotation(
                    &mut new,
                    "deployment.kubernetes.io/desired-replicas",
                    &replicas.to_string(),
                );
                copy_annotations(dep, &mut new);
            } else {
                new["spec"]["replicas"] = json!(0);
            }
            if new != *rs {
                self.commit_controlled(st, rs_res, key.clone(), rs, new);
            }
        }
        if current.is_none() {
            let hash = pod_template_hash(&dep["spec"]["template"]);
            let name = format!("{}-{hash}", meta_str(dep, "name").unwrap_or_default());
            let mut tpl = dep["spec"]["template"].clone();
            tpl["metadata"]["labels"][HASH_LABEL] = json!(hash);
            let mut selector = dep["spec"]["selector"].clone();
            selector["matchLabels"][HASH_LABEL] = json!(hash);
            let mut rs = json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": name,
                    "namespace": dep["metadata"]["namespace"],
                    "labels": tpl["metadata"]["labels"],
                    "annotations": {
                        REVISION: rev.to_string(),
                        "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                        "deployment.kubernetes.io/max-replicas": (replicas + 1).to_string(),
                    },
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "name": dep["metadata"]["name"], "uid": dep["metadata"]["uid"],
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {"replicas": replicas, "selector": selector, "template": tpl},
            });
            copy_annotations(dep, &mut rs);
            let key = Self::key(rs_res, meta_str(dep, "namespace"), &name);
            if !st.objects.contains_key(&key) {
                let meta = meta_mut(&mut rs);
                meta.insert("uid".into(), json!(super::meta::new_uid()));
                meta.insert("creationTimestamp".into(), json!(super::meta::now()));
                meta.insert("generation".into(), json!(1));
                super::meta::converge_status(rs_res, &mut rs);
                self.commit(st, key, EventType::Added, rs);
            }
        }
        // Prune: scaled-down replica sets beyond the history limit, oldest first.
        let limit = dep["spec"]["revisionHistoryLimit"]
            .as_i64()
            .unwrap_or(10)
            .max(0) as usize;
        let mut old: Vec<(i64, Key)> = Self::owned_replica_sets(st, dep)
            .into_iter()
            .filter(|(_, rs)| rs["spec"]["replicas"] == 0 && revision(rs) != rev)
            .map(|(k, rs)| (revision(&rs), k))
            .collect();
        old.sort();
        let excess = old.len().saturating_sub(limit);
        for (_, key) in old.into_iter().take(excess) {
            if let Some(obj) = st.objects.get(&key).cloned() {
                self.commit(st, key, EventType::Deleted, (*obj).clone());
            }
        }
    }

    /// Commits a controller's change of a replica set (generation and status follow).
    fn commit_controlled(
        &self,
        st: &mut State,
        res: &'static resources::ResourceInfo,
        key: Key,
        old: &Value,
        new: Value,
    ) {
        let opts = WriteOptions {
            keep_status: false,
            ..Default::default()
        };
        if let Ok(new) = Self::prepare_update(res, &key, old, new, &opts) {
            self.commit(st, key, EventType::Modified, new);
        }
    }
}

fn set_annotation(obj: &mut Value, key: &str, value: &str) {
    let meta = meta_mut(obj);
    if !meta.get("annotations").is_some_and(Value::is_object) {
        meta.insert("annotations".into(), json!({}));
    }
    meta["annotations"][key] = json!(value);
}

fn copy_annotations(dep: &Value, rs: &mut Value) {
    if let Some(anns) = dep["metadata"]["annotations"].as_object() {
        for (k, v) in anns {
            if !NOT_COPIED.contains(&k.as_str())
                && let Some(v) = v.as_str()
            {
                set_annotation(rs, k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_key_order_and_the_hash_label() {
        let a = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let b = json!({"spec": {"containers": [{"image": "i", "name": "c"}]}, "metadata": {"labels": {"app": "x", "pod-template-hash": "zz"}}});
        let h = pod_template_hash(&a);
        assert_eq!(h, pod_template_hash(&b));
        assert!(h.len() >= 8 && h.bytes().all(|c| c.is_ascii_alphanumeric()));
        let c = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "j"}]}});
        assert_ne!(h, pod_template_hash(&c));
    }
}
