//! The agent's connections to the API server (kube-sim over TLS, offering
//! HTTP/2 and HTTP/1.1 by ALPN and 100 streams per connection, as the real
//! server does): a default cluster's watches share a handful of HTTP/2
//! connections, more watches than one connection carries open another one
//! instead of waiting, and a server without HTTP/2 is still served.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use common::{FakeGateway, WAIT};
use prometheus_client::metrics::gauge::Gauge;
use spinlink_agent::{Agent, Config};
use spinlink_kube_sim::{OpenConnections, Server, Sim};
use spinlink_proto::v1::cache_up;
use spinlink_tls::config::{ClientAuth, ServerFiles, server_config};
use spinlink_tls::dev::DevPki;
use tokio_util::sync::CancellationToken;

/// The goal of issue 20's finding 9: an agent holds a handful.
const MOST_CONNECTIONS: i64 = 4;

/// kube-sim with the demo workload over TLS offering `alpn` (empty: kube-sim's
/// own choice, HTTP/2 then HTTP/1.1), and a kubeconfig for it in `dir`.
async fn tls_sim(
    dir: &Path,
    alpn: &[&[u8]],
    stop: &CancellationToken,
) -> (Sim, OpenConnections, std::path::PathBuf) {
    let pki = DevPki::ensure(&dir.join("sim-pki"), &[]).unwrap();
    let tls = server_config(
        ServerFiles {
            cert: &pki.cert("sidecar"),
            key: &pki.key("sidecar"),
            client_ca: None,
        },
        ClientAuth::Off,
        alpn,
    )
    .unwrap();
    let sim = Sim::with_demo_workload();
    let server = Server::bind(
        sim.clone(),
        "127.0.0.1:0".parse().unwrap(),
        Some(Arc::new(tls)),
    )
    .await
    .unwrap();
    let open = server.open_connections();
    let kubeconfig = dir.join("sim.kubeconfig");
    let ca = std::fs::read_to_string(pki.ca_cert()).unwrap();
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", Some(&ca)).unwrap();
    tokio::spawn(server.run(stop.clone()));
    (sim, open, kubeconfig)
}

/// A client of the agent's kind for `kubeconfig`, counting in `connections`.
async fn client(kubeconfig: &Path, connections: Gauge) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    spinlink_agent::apiserver::builder(&config, connections)
        .unwrap()
        .build()
}

/// Sends a watch of the demo configmaps; its response head.
async fn watch(client: &kube::Client) -> http::Response<kube::client::Body> {
    let request = http::Request::get("/api/v1/namespaces/demo/configmaps?watch=1")
        .body(kube::client::Body::empty())
        .unwrap();
    client.send(request).await.unwrap()
}

#[tokio::test]
async fn a_default_cluster_is_watched_over_a_handful_of_connections() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (_sim, server_open, kubeconfig) = tls_sim(dir.path(), &[], &stop).await;
    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let yaml = gw.agent_yaml(&[("dev", &kubeconfig)]);
    let agent = Agent::new(Config::from_yaml_str(&yaml, "test.yaml").unwrap()).unwrap();
    let metrics = agent.metrics();
    let agent_task = tokio::spawn(agent.run(stop.clone()));

    // Every kind discovery found (Hello says which) listed and watched.
    gw.wait_for("every kind synced", |r| {
        let Some(kinds) = r.hellos.last().map(|(_, h)| h.accounts[0].kinds.len()) else {
            return false;
        };
        let synced: BTreeSet<_> = r
            .cache_up
            .iter()
            .filter_map(|(_, m)| match &m.msg {
                Some(cache_up::Msg::SyncEnd(e)) => e.kind.clone().map(|k| (k.group, k.resource)),
                _ => None,
            })
            .collect();
        kinds > 0 && synced.len() == kinds
    })
    .await;
    let kinds = gw.with(|r| r.hellos.last().unwrap().1.accounts[0].kinds.len());
    assert!(kinds >= 50, "a default cluster's kinds, not {kinds}");

    // The metric says what the server sees, and it is a handful, not one
    // connection per watch.
    let gauge = metrics.apiserver_connections("dev");
    common::wait_until("the agent's count to match the server's", || {
        usize::try_from(gauge.get()).ok() == Some(server_open.get())
    })
    .await;
    let connections = gauge.get();
    assert!(
        (1..=MOST_CONNECTIONS).contains(&connections),
        "{connections} connections to the API server for {kinds} watches"
    );
    let text = metrics.encode();
    assert!(
        text.contains(&format!(
            "spinlink_agent_apiserver_connections{{account=\"dev\"}} {connections}"
        )),
        "{text}"
    );

    stop.cancel();
    tokio::time::timeout(WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    gw.stop().await;
}

#[tokio::test]
async fn more_watches_than_a_connection_carries_open_another_connection() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (_sim, server_open, kubeconfig) = tls_sim(dir.path(), &[], &stop).await;
    let gauge = Gauge::default();
    let client = client(&kubeconfig, gauge.clone()).await;

    // kube-sim allows 100 streams per connection; a client queueing the
    // 101st on the first connection would never see its answer.
    let watches = futures::future::join_all((0..150).map(|_| watch(&client)));
    let watches = tokio::time::timeout(WAIT, watches)
        .await
        .expect("every watch answered");
    for response in &watches {
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.version(), http::Version::HTTP_2);
    }
    assert_eq!(gauge.get(), 2, "150 watches over two connections");
    assert_eq!(server_open.get(), 2);

    // With the watches gone, requests keep to the connections there are.
    drop(watches);
    let more = futures::future::join_all((0..20).map(|_| watch(&client))).await;
    assert!(more.iter().all(|r| r.version() == http::Version::HTTP_2));
    assert!(gauge.get() <= 2, "{} connections", gauge.get());
    stop.cancel();
}

#[tokio::test]
async fn a_server_without_http2_is_served_over_http1() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (_sim, server_open, kubeconfig) = tls_sim(dir.path(), &[b"http/1.1"], &stop).await;
    let gauge = Gauge::default();
    let client = client(&kubeconfig, gauge.clone()).await;

    let watches = futures::future::join_all((0..3).map(|_| watch(&client))).await;
    for response in &watches {
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.version(), http::Version::HTTP_11);
    }
    // HTTP/1.1 carries one request at a time: a connection per watch.
    assert_eq!(gauge.get(), 3);
    assert_eq!(server_open.get(), 3);
    stop.cancel();
}
