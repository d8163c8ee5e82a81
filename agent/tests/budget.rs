//! Bounded listing: initial lists are paginated (`cache.pageSize`) and no
//! more of them run at once than `tasks.budgetPerAccount` per account and
//! `tasks.totalBudget` over all accounts. A counting proxy in front of
//! kube-sim (one per account) sees every list request.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::FakeGateway;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_proto::v1::cache_up;
use tokio_util::sync::CancellationToken;

/// Concurrent list requests: now and the most seen.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    pages_after_first: AtomicUsize,
}

impl Gauge {
    /// Counts a request until the guard drops (also when the client gives up).
    fn enter(self: &Arc<Self>) -> impl Drop {
        struct Leave(Arc<Gauge>);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0.now.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        Leave(self.clone())
    }
}

/// A proxy to `upstream` that counts list requests in `account` and `total`,
/// holding each one briefly so that overlapping lists overlap here too.
async fn proxy(upstream: SocketAddr, account: Arc<Gauge>, total: Arc<Gauge>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (client, account, total) = (client.clone(), account.clone(), total.clone());
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let (client, account, total) = (client.clone(), account.clone(), total.clone());
                async move {
                    let query = req.uri().query().unwrap_or_default().to_owned();
                    let list = query.contains("limit=") && !query.contains("watch");
                    let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap();
                    let uri: hyper::Uri = format!("http://{upstream}{path}").parse().unwrap();
                    let mut forward = hyper::Request::get(uri).body(Empty::new()).unwrap();
                    *forward.headers_mut() = req.headers().clone();
                    let _counted = list.then(|| {
                        if query.contains("continue=") {
                            account.pages_after_first.fetch_add(1, Ordering::SeqCst);
                        }
                        (account.enter(), total.enter())
                    });
                    if list {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    client.request(forward).await
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_paginated_and_within_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::with_demo_workload();
    for n in 0..8 {
        sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm-{n}"), "namespace": "demo"}}))
            .unwrap();
    }
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let sim_addr = server.local_addr();
    let stop = CancellationToken::new();
    let sim_task = tokio::spawn(server.run(stop.clone()));

    let total = Arc::new(Gauge::default());
    let mut gauges = Vec::new();
    let mut accounts = Vec::new();
    for name in ["one", "two"] {
        let gauge = Arc::new(Gauge::default());
        let addr = proxy(sim_addr, gauge.clone(), total.clone()).await;
        let kubeconfig = dir.path().join(format!("{name}.kubeconfig"));
        spinlink_kube_sim::write_kubeconfig(&kubeconfig, &format!("http://{addr}"), "sim", None)
            .unwrap();
        gauges.push(gauge);
        accounts.push((name, kubeconfig));
    }
    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let refs: Vec<(&str, &std::path::Path)> =
        accounts.iter().map(|(n, p)| (*n, p.as_path())).collect();
    let yaml = format!(
        "{}cache:\n  pageSize: 2\ntasks:\n  totalBudget: 3\n  budgetPerAccount: 2\n",
        gw.agent_yaml(&refs)
    );
    let agent = Agent::new(Config::from_yaml_str(&yaml, "test.yaml").unwrap()).unwrap();
    let agent_task = tokio::spawn(agent.run(stop.clone()));

    // Every kind kube-sim serves (10; it advertises more) lists once in both
    // accounts — configmaps among them, whose 8+ objects take several pages
    // (kinds finish in any order, so the count alone may be all small ones).
    gw.wait_for("both accounts synced", |r| {
        ["one", "two"].iter().all(|a| {
            let ends: Vec<&str> = r
                .cache_up
                .iter()
                .filter(|(acc, _)| acc == a)
                .filter_map(|(_, m)| match &m.msg {
                    Some(cache_up::Msg::SyncEnd(end)) => {
                        Some(end.kind.as_ref().map_or("", |k| k.resource.as_str()))
                    }
                    _ => None,
                })
                .collect();
            ends.len() >= 10 && ends.contains(&"configmaps")
        })
    })
    .await;
    for g in &gauges {
        let max = g.max.load(Ordering::SeqCst);
        assert!((1..=2).contains(&max), "per-account lists at once: {max}");
        assert!(
            g.pages_after_first.load(Ordering::SeqCst) > 0,
            "lists were paginated"
        );
    }
    let max = total.max.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&max),
        "lists at once over all accounts: {max}"
    );
    // The configmaps arrived whole, over several pages.
    gw.with(|r| {
        let names: std::collections::BTreeSet<String> = r
            .cache_up
            .iter()
            .filter(|(a, _)| a == "one")
            .filter_map(|(_, m)| match &m.msg {
                Some(cache_up::Msg::Event(e))
                    if e.kind.as_ref().unwrap().resource == "configmaps" =>
                {
                    let o: serde_json::Value = serde_json::from_slice(&e.object).unwrap();
                    o["metadata"]["name"].as_str().map(str::to_owned)
                }
                _ => None,
            })
            .collect();
        for n in 0..8 {
            assert!(names.contains(&format!("cm-{n}")), "{names:?}");
        }
    });

    stop.cancel();
    tokio::time::timeout(common::WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let _ = tokio::time::timeout(common::WAIT, sim_task).await;
    gw.stop().await;
}
