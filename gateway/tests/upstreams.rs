//! Sidecar instances coming and going: an instance that leaves the set ends
//! its streams with `Unavailable` and the reopened stream reaches the
//! account's new owner; active health checks take a dead instance out of
//! rotation before any stream is lost to it; passive outlier ejection does
//! the same after failed streams. Metrics per instance show it.

mod common;

use common::*;
use spinlink_gateway::upstream::Target;
use spinlink_proto::v1::{CacheDown, CacheUp};
use tonic::Code;
use tonic::transport::Channel;

fn yaml(urls: &[String], pool: &str) -> String {
    let list: Vec<String> = urls.iter().map(|u| format!("{{url: '{u}'}}")).collect();
    format!("upstreams: [{}]\nupstreamPool: {pool}\n", list.join(", "))
}

fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// Two sidecar instances behind a gateway, and agent a1 with a `dev-1`
/// `Cache` stream open (its first message acked) on the one that owns it.
struct OpenOnOne {
    gw: RunningGateway,
    channel: Channel,
    token: String,
    tx: tokio::sync::mpsc::Sender<CacheUp>,
    down: tonic::Streaming<CacheDown>,
    owner: FakeSidecar,
    other: FakeSidecar,
    _pki: Pki,
}

async fn open_on_one_of_two() -> OpenOnOne {
    let pki = pki();
    let a = FakeSidecar::plain().await;
    let b = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &yaml(&[a.url(), b.url()], "{healthCheck: {intervalSeconds: 0}}"),
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&channel, "dev-1").await;
    let (tx, down) = acked_cache(&channel, "dev-1", &token).await;
    let (owner, other) = if gw.upstreams.assigned("dev-1").unwrap() == a.url() {
        (a, b)
    } else {
        (b, a)
    };
    OpenOnOne {
        gw,
        channel,
        token,
        tx,
        down,
        owner,
        other,
        _pki: pki,
    }
}

#[tokio::test]
async fn streams_of_a_removed_instance_end_unavailable_and_resume_on_the_new_owner() {
    let OpenOnOne {
        gw,
        channel,
        token,
        tx: _tx,
        mut down,
        owner: gone,
        other: stays,
        ..
    } = open_on_one_of_two().await;
    assert_eq!(gone.streams().len(), 1);

    // The owner leaves (as a DNS answer or EndpointSlice would say).
    gw.upstreams
        .update(0, vec![Target::parse(&stays.url()).unwrap()]);
    let err = next_ack(&mut down).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // The agent reopens: same token, new owner.
    let _reopened = acked_cache(&channel, "dev-1", &token).await;
    assert_eq!(gw.upstreams.assigned("dev-1").unwrap(), stays.url());
    assert_eq!(stays.streams().len(), 1);
    let metrics = gw.stats.metrics().encode();
    assert!(
        metrics.contains("spinlink_gateway_upstream_instances 1"),
        "{metrics}"
    );
}

/// `streams_open` and `streams_total` per instance: the stream counts on
/// the instance that carries it, only there, and only while it is open.
#[tokio::test]
async fn streams_are_counted_on_the_instance_that_carries_them() {
    let OpenOnOne {
        gw,
        tx,
        mut down,
        owner,
        other,
        ..
    } = open_on_one_of_two().await;
    let (owner, other) = (owner.url(), other.url());
    assert_eq!(upstream_streams(&gw.stats, &owner), (1, 1));
    assert_eq!(upstream_streams(&gw.stats, &other), (0, 0));
    let text = gw.stats.metrics().encode();
    assert!(
        text.contains(&format!(
            "spinlink_gateway_streams_open{{upstream=\"{owner}\"}} 1"
        )),
        "{text}"
    );

    // The agent ends the stream; the sidecar ends its side.
    drop(tx);
    let end = tokio::time::timeout(WAIT, down.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
    eventually("the closed stream leaves streams_open", || {
        upstream_streams(&gw.stats, &owner) == (0, 1)
    })
    .await;
    assert_eq!(upstream_streams(&gw.stats, &other), (0, 0));
}

#[tokio::test]
async fn health_checks_take_a_dead_instance_out_of_rotation() {
    let pki = pki();
    let live = FakeSidecar::plain().await;
    let dead = dead_url();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &yaml(
            &[live.url(), dead.clone()],
            "{healthCheck: {intervalSeconds: 1, unhealthyThreshold: 1}, outlier: {consecutiveErrors: 0}}",
        ),
    ))
    .await;
    let dead_series = format!("spinlink_gateway_upstream_available{{upstream=\"{dead}\"}} 0");
    let live_series = format!(
        "spinlink_gateway_upstream_connections{{upstream=\"{}\"}} 1",
        live.url()
    );
    tokio::time::timeout(
        WAIT,
        gw.stats.wait_until(|s| {
            let m = s.metrics().encode();
            m.contains(&dead_series) && m.contains(&live_series)
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("{}", gw.stats.metrics().encode()));

    // Every account now lands on the live instance; without the checks
    // about half would go to the dead one and fail.
    let channel = agent_a1(gw.addr, &pki.pki).await;
    for i in 0..8 {
        let account = format!("dev-{i}");
        let token = token_for(&channel, &account).await;
        let _stream = acked_cache(&channel, &account, &token).await;
    }
    assert_eq!(live.streams().len(), 8);
}

#[tokio::test]
async fn failing_streams_eject_an_instance() {
    let pki = pki();
    let live = FakeSidecar::plain().await;
    let dead = dead_url();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &yaml(
            &[live.url(), dead.clone()],
            "{healthCheck: {intervalSeconds: 0}, outlier: {consecutiveErrors: 1, ejectionSeconds: 60}}",
        ),
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    // An account the dead instance would own.
    let urls = [live.url(), dead.clone()];
    let account = (0..1000)
        .map(|i| format!("dev-{i}"))
        .find(|a| {
            urls[spinlink_gateway::route::choose(urls.iter().map(String::as_str), a).unwrap()]
                == dead
        })
        .unwrap();
    let token = token_for(&channel, &account).await;
    let err = open_cache(&channel, |s| with_metadata(s, &account, &token))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // Ejected: the retry goes to the live instance.
    let (_tx, mut down) = open_cache(&channel, |s| with_metadata(s, &account, &token))
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);
    let m = gw.stats.metrics().encode();
    assert!(
        m.contains(&format!(
            "spinlink_gateway_upstream_ejections_total{{upstream=\"{dead}\"}} 1"
        )),
        "{m}"
    );
}

#[tokio::test]
async fn bad_upstream_pool_settings_name_their_key() {
    let pki = pki();
    for (pool, key) in [
        ("{loadFactor: 0.5}", "upstreamPool.loadFactor"),
        (
            "{healthCheck: {path: nope}}",
            "upstreamPool.healthCheck.path",
        ),
        ("{dnsRefreshSeconds: 0}", "upstreamPool.dnsRefreshSeconds"),
        ("{outlier: {ejectionSecs: 1}}", "ejectionSecs"),
    ] {
        let yaml = tls_gateway_yaml(&pki.pki, &yaml(&["http://127.0.0.1:9".into()], pool));
        let err = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap_err();
        assert!(err.to_string().contains(key), "{pool}: {err}");
    }
    let yaml = tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9', discovery: consul}]\n",
    );
    let err = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap_err();
    assert!(err.to_string().contains("consul"), "{err}");
    for (discovery, want) in [
        ("{endpointSlices: {service: s, namspace: x}}", "namspace"),
        ("{endpointSlice: {service: s}}", "endpointSlice"),
        (
            "{endpointSlices: {namespace: x}}",
            "upstreams[0].discovery.endpointSlices.service",
        ),
    ] {
        let yaml = tls_gateway_yaml(
            &pki.pki,
            &format!("upstreams: [{{url: 'http://127.0.0.1:9', discovery: {discovery}}}]\n"),
        );
        let err = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap_err();
        assert!(err.to_string().contains(want), "{discovery}: {err}");
    }
}

#[tokio::test]
async fn dns_upstreams_resolve_to_their_addresses() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let port = sidecar.addr.port();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: 'http://localhost:{port}', discovery: dns}}]\n\
             upstreamPool: {{healthCheck: {{intervalSeconds: 0}}}}\n"
        ),
    ))
    .await;
    let mut want: Vec<String> = tokio::net::lookup_host(("localhost", port))
        .await
        .unwrap()
        .map(|a| format!("http://{a}"))
        .collect();
    want.sort();
    want.dedup();
    let got: Vec<String> = gw
        .upstreams
        .instances()
        .iter()
        .map(|i| i.url().to_owned())
        .collect();
    assert_eq!(got, want);
    assert!(got.iter().any(|u| u.contains("127.0.0.1")));
    assert!(!gw.upstreams.is_empty());
}
