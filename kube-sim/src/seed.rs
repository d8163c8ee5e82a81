//! Bulk workloads for benchmarks: [`Sim::seed_pods`] fills the cluster with
//! many pods shaped like the ones a replica set controller and a kubelet leave
//! behind (labels, owner reference, one container, conditions), so lists,
//! selectors and cache sizes are measured on realistic objects.
//!
//! The pods go through [`Sim::create`] like any programmatic write, so they get
//! uids, resourceVersions and defaults exactly as other objects do; seeding is
//! bounded by `count` and takes about a second per 100,000 pods.

use serde_json::{Value, json};

use crate::error::Status;
use crate::store::Sim;
use crate::store::meta::now;

/// Namespaces the seeded pods are spread over (`seed-0` … `seed-9`).
pub const SEED_NAMESPACES: usize = 10;
/// Distinct values of the seeded pods' `app` label (`app-0` … `app-999`), so
/// `app=app-N` selects one pod in [`SEED_APPS`].
pub const SEED_APPS: usize = 1000;

/// The namespace of seeded pod `i`.
pub fn seed_namespace(i: usize) -> String {
    format!("seed-{}", i % SEED_NAMESPACES)
}

/// Seeded pod `i`, ready for [`Sim::create`].
fn seed_pod(i: usize, time: &str) -> Value {
    let app = format!("app-{}", i % SEED_APPS);
    let hash = format!("{:010x}", (i % SEED_APPS) * 7919 + 1_000_000_000);
    let rs = format!("{app}-{hash}");
    let name = format!("{rs}-{i:06}");
    let ip = format!("10.{}.{}.{}", 200 + i / 65536 % 50, i / 256 % 256, i % 256);
    let labels = json!({"app": app, "pod-template-hash": hash,
                        "tier": if i.is_multiple_of(2) { "frontend" } else { "backend" }});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": format!("{rs}-"), "namespace": seed_namespace(i),
            "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": format!("00000000-0000-4000-8000-{:012}", i % SEED_APPS),
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "containers": [{
                "name": app, "image": format!("registry.example/{app}:1.{}.0", i % 7),
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            }],
            "nodeName": format!("sim-node-{}", i % 20), "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30,
        },
        "status": {
            "phase": "Running", "hostIP": format!("172.18.0.{}", 2 + i % 20), "podIP": ip,
            "podIPs": [{"ip": ip}], "startTime": time, "qosClass": "Burstable",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": time},
                {"type": "Ready", "status": "True", "lastTransitionTime": time},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": time},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": time}],
            "containerStatuses": [{"name": app, "ready": true, "started": true, "restartCount": 0,
                "image": format!("registry.example/{app}:1.{}.0", i % 7),
                "imageID": format!("registry.example/{app}@sha256:{:064x}", i % SEED_APPS),
                "containerID": format!("containerd://{i:064x}"),
                "state": {"running": {"startedAt": time}}}],
        },
    })
}

impl Sim {
    /// Creates `count` running pods spread over namespaces `seed-0` … `seed-9`
    /// (created when missing), labelled `app=app-<i mod 1000>`,
    /// `tier=frontend|backend` and a `pod-template-hash`. Returns how many
    /// pods were created.
    pub fn seed_pods(&self, count: usize) -> Result<usize, Status> {
        for n in 0..SEED_NAMESPACES.min(count) {
            let ns = seed_namespace(n);
            if self.get("namespaces", None, &ns).is_none() {
                self.create(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )?;
            }
        }
        let time = now();
        for i in 0..count {
            self.create(seed_pod(i, &time))?;
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_pods_are_spread_and_selectable() {
        let sim = Sim::new();
        assert_eq!(sim.seed_pods(2500).unwrap(), 2500);
        assert_eq!(sim.list("pods", None).len(), 2500);
        assert_eq!(sim.list("pods", Some("seed-3")).len(), 250);
        let app7: Vec<_> = sim
            .list("pods", None)
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == "app-7")
            .collect();
        assert_eq!(app7.len(), 3);
        let pod = &app7[0];
        assert_eq!(pod["status"]["phase"], "Running");
        assert!(pod["metadata"]["uid"].is_string());
        assert!(pod["metadata"]["resourceVersion"].is_string());
        // Seeding more adds to what is there; names never collide within a run.
        assert!(sim.seed_pods(2500).is_err(), "the same pods exist already");
    }
}
