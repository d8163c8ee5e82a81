//! The demo workload: namespace `demo` with two deployments and everything a real
//! cluster would show for them (replica sets, running pods, services, config, events).

use serde_json::{Value, json};

use crate::store::Sim;
use crate::store::meta::{meta_str, now};

/// Deployments of the demo: (name, image, replicas, pod-template-hash, port).
const DEPLOYMENTS: [(&str, &str, i64, &str, i64); 2] = [
    ("web", "nginx:1.25", 2, "7b46c4b544", 80),
    ("api", "ghcr.io/example/api:1.4.2", 1, "5d8f9c7b6d", 8080),
];

/// Pod name suffixes, like the replica set controller's random ones.
const POD_SUFFIXES: [&str; 2] = ["cwkb7", "xcmjm"];

fn owner(kind: &str, api_version: &str, obj: &Value) -> Value {
    json!([{
        "apiVersion": api_version,
        "kind": kind,
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

fn container(name: &str, image: &str, port: i64) -> Value {
    json!({
        "name": name,
        "image": image,
        "ports": [{"containerPort": port, "protocol": "TCP"}],
        "resources": {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    })
}

impl Sim {
    /// [`Sim::new`] plus namespace `demo` with deployments `web` (2 replicas) and `api`
    /// (1 replica), their replica sets and running pods, services, configmap
    /// `app-config`, secret `app-secret` and events.
    pub fn with_demo_workload() -> Self {
        let sim = Sim::new();
        sim.add_demo_workload();
        sim
    }

    /// Adds the demo workload of [`Sim::with_demo_workload`] to this simulator.
    ///
    /// # Panics
    /// If namespace `demo` or one of its objects already exists.
    pub fn add_demo_workload(&self) {
        let ok = |r: Result<Value, crate::Status>| r.expect("demo objects are valid");
        ok(self.create(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}),
        ));
        ok(self.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": "demo"}, "data": {"mode": "prod"}})));
        ok(self.create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "app-secret", "namespace": "demo"}, "type": "Opaque", "data": {"token": "czNjcjN0"}})));
        let t = now();
        let mut pod_ip = 10;
        for (name, image, replicas, hash, port) in DEPLOYMENTS {
            let labels = json!({"app": name});
            let cname = name.to_string();
            let dep = ok(self.create(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "demo", "labels": labels,
                             "annotations": {"deployment.kubernetes.io/revision": "1"}},
                "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"containers": [container(&cname, image, port)],
                                               "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                                               "dnsPolicy": "ClusterFirst", "securityContext": {},
                                               "schedulerName": "default-scheduler"}}},
            })));
            let rs_name = format!("{name}-{hash}");
            let rs_labels = json!({"app": name, "pod-template-hash": hash});
            let rs = ok(self.create(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": rs_name, "namespace": "demo", "labels": rs_labels,
                             "annotations": {"deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                                             "deployment.kubernetes.io/max-replicas": (replicas + 1).to_string(),
                                             "deployment.kubernetes.io/revision": "1"},
                             "ownerReferences": owner("Deployment", "apps/v1", &dep)},
                "spec": {"replicas": replicas, "selector": {"matchLabels": rs_labels},
                         "template": {"metadata": {"labels": rs_labels},
                                      "spec": {"containers": [container(&cname, image, port)]}}},
            })));
            for suffix in POD_SUFFIXES.iter().take(replicas as usize) {
                pod_ip += 1;
                let pod_name = format!("{rs_name}-{suffix}");
                let pod = ok(self.create(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "generateName": format!("{rs_name}-"), "namespace": "demo",
                                 "labels": rs_labels, "ownerReferences": owner("ReplicaSet", "apps/v1", &rs)},
                    "spec": {"containers": [container(&cname, image, port)], "nodeName": "sim-node-1",
                             "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                             "serviceAccountName": "default", "schedulerName": "default-scheduler"},
                    "status": {
                        "phase": "Running", "hostIP": "172.18.0.2", "podIP": format!("10.244.0.{pod_ip}"),
                        "podIPs": [{"ip": format!("10.244.0.{pod_ip}")}], "startTime": t, "qosClass": "BestEffort",
                        "conditions": [
                            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
                            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
                            {"type": "Ready", "status": "True", "lastTransitionTime": t},
                            {"type": "ContainersReady", "status": "True", "lastTransitionTime": t},
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}],
                        "containerStatuses": [{"name": name, "ready": true, "started": true, "restartCount": 0,
                            "image": image, "imageID": format!("docker.io/library/{image}"),
                            "containerID": format!("containerd://{}", meta_str(&rs, "uid").unwrap_or_default().replace('-', "")),
                            "state": {"running": {"startedAt": t}}}],
                    },
                })));
                for (reason, message) in [
                    (
                        "Scheduled",
                        format!("Successfully assigned demo/{pod_name} to sim-node-1"),
                    ),
                    ("Started", format!("Started container {name}")),
                ] {
                    ok(self.create(json!({
                        "apiVersion": "v1", "kind": "Event",
                        "metadata": {"name": format!("{pod_name}.{}", reason.to_lowercase()), "namespace": "demo"},
                        "involvedObject": {"kind": "Pod", "namespace": "demo", "name": pod_name,
                                           "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
                        "reason": reason, "message": message, "type": "Normal",
                        "source": {"component": if reason == "Scheduled" { "default-scheduler" } else { "kubelet" }},
                        "firstTimestamp": t, "lastTimestamp": t, "count": 1,
                        "reportingComponent": "", "reportingInstance": "",
                    })));
                }
            }
            ok(self.create(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "demo", "labels": labels},
                "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": port}]},
            })));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_workload_is_complete_and_consistent() {
        let sim = Sim::with_demo_workload();
        assert_eq!(sim.list("deployments", Some("demo")).len(), 2);
        assert_eq!(sim.list("replicasets", Some("demo")).len(), 2);
        let pods = sim.list("pods", Some("demo"));
        assert_eq!(pods.len(), 3);
        assert!(pods.iter().all(|p| p["status"]["phase"] == "Running"));
        let web = sim.get("deployments", Some("demo"), "web").unwrap();
        assert_eq!(web["status"]["readyReplicas"], 2);
        assert_eq!(sim.list("services", Some("demo")).len(), 2);
        assert!(sim.get("secrets", Some("demo"), "app-secret").is_some());
        assert!(!sim.list("events", Some("demo")).is_empty());
        // Deleting a deployment takes its replica set and pods with it.
        sim.delete("deployments", Some("demo"), "web").unwrap();
        assert_eq!(sim.list("pods", Some("demo")).len(), 1);
        assert_eq!(sim.list("replicasets", Some("demo")).len(), 1);
    }
}
