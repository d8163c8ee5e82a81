//! Bulk workloads for benchmarks: [`Sim::seed_pods`] fills the cluster with
//! many pods shaped like the ones a replica set controller and a kubelet leave
//! behind (labels, owner reference, one container, conditions), so lists,
//! selectors and cache sizes are measured on realistic objects.
//! [`Sim::seed_objects`] spreads objects over the ten kinds of [`SEED_KINDS`]
//! instead (a custom resource among them), for the agent's benchmarks, where
//! the number of kinds listed and watched matters as much as the objects.
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

/// The kinds [`Sim::seed_objects`] spreads objects over, as plurals; object
/// `i` is of kind `i mod 10`. `widgets.bench.spinlink.dev` is a custom
/// resource whose definition seeding creates.
pub const SEED_KINDS: [&str; 10] = [
    "pods",
    "configmaps",
    "secrets",
    "services",
    "deployments",
    "replicasets",
    "serviceaccounts",
    "endpoints",
    "events",
    "widgets.bench.spinlink.dev",
];

/// The CustomResourceDefinition of the seeded custom kind (`Widget`).
fn seed_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.bench.spinlink.dev"},
        "spec": {"group": "bench.spinlink.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

/// Seeded object `i` of kind `SEED_KINDS[i % 10]`, about 1–2 KB of JSON, ready
/// for [`Sim::create`].
fn seed_object(i: usize, time: &str) -> Value {
    const COLORS: [&str; 3] = ["red", "green", "blue"];
    // Every kind spread over every namespace.
    let ns = seed_namespace(i / SEED_KINDS.len());
    let app = format!("app-{}", i % SEED_APPS);
    let labels =
        json!({"app": app, "tier": if i.is_multiple_of(2) { "frontend" } else { "backend" }});
    let meta = |prefix: &str| {
        json!({"name": format!("{prefix}-{i:07}"), "namespace": ns, "labels": labels,
               "annotations": {"bench.spinlink.dev/owner": format!("team-{}", i % 37)}})
    };
    let template = json!({
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": app, "image": format!("registry.example/{app}:1.{}.0", i % 7),
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}});
    match i % SEED_KINDS.len() {
        0 => {
            let mut pod = seed_pod(i, time);
            pod["metadata"]["namespace"] = json!(ns);
            pod
        }
        1 => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("config"),
            "data": {"app.properties": format!("name={app}\nreplicas={}\nlog.level=info\n{}", i % 5, "feature.x=true\n".repeat(20)),
                     "owner": format!("team-{}", i % 37)}}),
        // Values are base64 of 96 bytes each; the agent never even allocates them.
        2 => {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("secret"), "type": "Opaque",
            "data": {"username": "YWRtaW4=", "password": "c2VjcmV0".repeat(16),
                     "token": format!("{:0128x}", i).chars().take(128).collect::<String>()}})
        }
        3 => json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("svc"),
            "spec": {"type": "ClusterIP", "selector": {"app": app},
                "clusterIP": format!("10.96.{}.{}", i / 256 % 256, i % 256),
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                          {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"}],
                "sessionAffinity": "None"}}),
        // Paused: the simulated controller adds no ReplicaSets, so the count stays exact.
        4 => json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("deploy"),
            "spec": {"replicas": 2, "paused": true, "selector": {"matchLabels": {"app": app}},
                     "template": template}}),
        5 => json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta("rs"),
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": app}}, "template": template},
            "status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2}}),
        6 => json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("sa"),
            "automountServiceAccountToken": false}),
        7 => json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("svc"),
            "subsets": [{"addresses": (0..4).map(|n| json!({"ip": format!("10.{}.{}.{n}", 200 + i / 65536 % 50, i / 256 % 256),
                    "nodeName": format!("sim-node-{}", (i + n) % 20)})).collect::<Vec<_>>(),
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}),
        8 => json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("event"),
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
                "name": format!("{app}-{i:07}"), "fieldPath": format!("spec.containers{{{app}}}")},
            "reason": "Pulled", "type": "Normal", "count": 1,
            "message": format!("Container image \"registry.example/{app}:1.{}.0\" already present on machine", i % 7),
            "source": {"component": "kubelet", "host": format!("sim-node-{}", i % 20)},
            "firstTimestamp": time, "lastTimestamp": time}),
        _ => {
            json!({"apiVersion": "bench.spinlink.dev/v1", "kind": "Widget", "metadata": meta("widget"),
            "spec": {"size": i % 100, "color": COLORS[i % 3],
                     "parts": (0..8).map(|n| format!("part-{n}-{app}")).collect::<Vec<_>>()},
            "status": {"ready": true}})
        }
    }
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

    /// Creates `count` objects spread evenly over the ten kinds of
    /// [`SEED_KINDS`] (object `i` is of kind `i mod 10`) and, within each
    /// kind, over namespaces `seed-0` … `seed-9`, labelled `app=app-<i mod 1000>`; the custom
    /// resource's definition and the namespaces are created when missing.
    /// Returns how many objects were created (the definition and namespaces
    /// not counted).
    pub fn seed_objects(&self, count: usize) -> Result<usize, Status> {
        for n in 0..SEED_NAMESPACES.min(count) {
            let ns = seed_namespace(n);
            if self.get("namespaces", None, &ns).is_none() {
                self.create(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )?;
            }
        }
        if count > SEED_KINDS.len() - 1
            && self
                .get(
                    "customresourcedefinitions",
                    None,
                    "widgets.bench.spinlink.dev",
                )
                .is_none()
        {
            self.create(seed_crd())?;
        }
        let time = now();
        for i in 0..count {
            self.create(seed_object(i, &time))?;
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

    #[test]
    fn seeded_objects_are_spread_over_ten_kinds() {
        let sim = Sim::new();
        assert_eq!(sim.seed_objects(1000).unwrap(), 1000);
        for kind in SEED_KINDS {
            assert_eq!(sim.list(kind, None).len(), 100, "{kind}");
        }
        // No controller added anything: paused deployments get no replica sets.
        assert_eq!(sim.list("replicasets", Some("seed-5")).len(), 10);
        let secret = &sim.list("secrets", Some("seed-2"))[0];
        assert_eq!(secret["type"], "Opaque");
        assert!(secret["data"]["password"].is_string());
        let widget = &sim.list("widgets", Some("seed-9"))[0];
        assert_eq!(widget["apiVersion"], "bench.spinlink.dev/v1");
        assert!(widget["metadata"]["resourceVersion"].is_string());
    }
}
