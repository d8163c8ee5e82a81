//! Kinds from discovery against kube-sim: CRDs picked up while running, and
//! the account's `kinds`/`omitKinds` and `namespaces`/`omitNamespaces`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{FakeGateway, Records};
use serde_json::json;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_proto::v1::{cache_up, watch_event};
use tokio_util::sync::CancellationToken;

struct Running {
    sim: Sim,
    gw: FakeGateway,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// kube-sim with the demo workload, the fake gateway, and an agent whose one
/// account `dev` has `account_keys` (YAML lines at account indentation) and
/// whose config ends with `top_keys`.
async fn start(account_keys: &str, top_keys: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::with_demo_workload();
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = dir.path().join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    let stop = CancellationToken::new();
    let sim_task = tokio::spawn(server.run(stop.clone()));
    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let yaml = agent_yaml(&gw, &kubeconfig, account_keys, top_keys);
    let agent = Agent::new(Config::from_yaml_str(&yaml, "test.yaml").unwrap()).unwrap();
    let agent_task = tokio::spawn(agent.run(stop.clone()));
    Running {
        sim,
        gw,
        stop,
        tasks: vec![
            tokio::spawn(async move {
                let _ = sim_task.await;
            }),
            tokio::spawn(async move {
                agent_task.await.unwrap().unwrap();
            }),
        ],
        _dir: dir,
    }
}

fn agent_yaml(gw: &FakeGateway, kubeconfig: &Path, account_keys: &str, top_keys: &str) -> String {
    format!(
        "{}{account_keys}{top_keys}",
        gw.agent_yaml(&[("dev", kubeconfig)])
    )
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            tokio::time::timeout(common::WAIT, t)
                .await
                .unwrap()
                .unwrap();
        }
        self.gw.stop().await;
    }
}

/// `resource.group` (or `resource`) of every kind listed so far.
fn synced(r: &Records) -> BTreeSet<String> {
    r.cache_up
        .iter()
        .filter_map(|(_, m)| match &m.msg {
            Some(cache_up::Msg::SyncEnd(e)) => e.kind.as_ref(),
            _ => None,
        })
        .map(|k| {
            if k.group.is_empty() {
                k.resource.clone()
            } else {
                format!("{}.{}", k.resource, k.group)
            }
        })
        .collect()
}

/// (type, resource, namespace, name) of every object event.
fn objects(r: &Records) -> Vec<(watch_event::Type, String, String, String)> {
    r.cache_up
        .iter()
        .filter_map(|(_, m)| match &m.msg {
            Some(cache_up::Msg::Event(e)) if !e.object.is_empty() => {
                let o: serde_json::Value = serde_json::from_slice(&e.object).unwrap();
                let s = |k: &str| o["metadata"][k].as_str().unwrap_or_default().to_owned();
                Some((
                    e.r#type(),
                    e.kind.as_ref().unwrap().resource.clone(),
                    s("namespace"),
                    s("name"),
                ))
            }
            _ => None,
        })
        .collect()
}

fn crontab_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "crontabs.stable.example.com"},
        "spec": {
            "group": "stable.example.com",
            "scope": "Namespaced",
            "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_created_while_running_is_watched() {
    let run = start(
        "      omitKinds: [events, Lease.coordination.k8s.io]\n",
        "cache:\n  discoveryIntervalSeconds: 1\n",
    )
    .await;
    // Kinds sync in no set order: wait for every one checked below.
    run.gw
        .wait_for("first sync", |r| {
            let kinds = synced(r);
            ["deployments.apps", "pods", "secrets"]
                .iter()
                .all(|k| kinds.contains(*k))
        })
        .await;
    run.gw.with(|r| {
        let kinds = synced(r);
        assert!(
            kinds.contains("pods") && kinds.contains("secrets"),
            "{kinds:?}"
        );
        // omitKinds, by resource and by Kind.group.
        assert!(!kinds.contains("events"), "{kinds:?}");
        assert!(!kinds.contains("leases.coordination.k8s.io"), "{kinds:?}");
        assert!(!kinds.contains("crontabs.stable.example.com"));
    });

    run.sim.create(crontab_crd()).unwrap();
    run.gw
        .wait_for("the new CRD's kind listed", |r| {
            synced(r).contains("crontabs.stable.example.com")
        })
        .await;
    run.sim
        .create(
            json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "nightly", "namespace": "demo"},
            "spec": {"cronSpec": "0 3 * * *"}}),
        )
        .unwrap();
    run.gw
        .wait_for("the custom object's event", |r| {
            objects(r).iter().any(|(t, res, ns, name)| {
                *t == watch_event::Type::Added
                    && res == "crontabs"
                    && ns == "demo"
                    && name == "nightly"
            })
        })
        .await;
    // The discovery snapshot sent after the change names the new group.
    run.gw.with(|r| {
        let last = r
            .cache_up
            .iter()
            .rev()
            .find_map(|(_, m)| match &m.msg {
                Some(cache_up::Msg::Discovery(d)) => Some(d),
                _ => None,
            })
            .unwrap();
        assert!(
            last.documents
                .iter()
                .any(|d| d.path == "/apis/stable.example.com/v1"),
            "{:?}",
            last.documents.iter().map(|d| &d.path).collect::<Vec<_>>()
        );
    });
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_and_namespaces_narrow_what_is_sent() {
    let run = start(
        "      kinds: [ConfigMap, namespaces, deployments.apps]\n      namespaces: [demo]\n",
        "",
    )
    .await;
    run.sim
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "elsewhere", "namespace": "default"}}))
        .unwrap();
    run.sim
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "here", "namespace": "demo"}}))
        .unwrap();
    run.gw
        .wait_for("three kinds synced", |r| synced(r).len() >= 3)
        .await;
    run.gw
        .wait_for("the live configmap", |r| {
            objects(r).iter().any(|(_, _, _, name)| name == "here")
        })
        .await;
    run.gw.with(|r| {
        let kinds = synced(r);
        let expected: BTreeSet<String> = ["configmaps", "deployments.apps", "namespaces"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        assert_eq!(kinds, expected);
        let objs = objects(r);
        assert!(
            objs.iter().any(|(_, res, _, _)| res == "deployments"),
            "{objs:?}"
        );
        for (_, res, ns, name) in &objs {
            if res == "namespaces" {
                assert_eq!(name, "demo", "{objs:?}");
            } else {
                assert_eq!(ns, "demo", "{objs:?}");
            }
        }
    });
    run.stop().await;
}
