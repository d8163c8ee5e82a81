//! The admin port and drain: `/healthz`, `/readyz` (200 once the listener
//! accepts, 503 from the moment shutdown is signalled while connections
//! drain) and `/metrics`; on shutdown every agent gets `Reconnect{draining}`
//! on its `Control` stream and GOAWAY (a later stream is refused and
//! counted), open streams keep working, new connections are refused, and the
//! drain's duration is exported.

mod common;

use common::*;
use spinlink_gateway::stats::Refusal;
use spinlink_http2::frame::{Reason, kind};
use spinlink_proto::paths;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{CacheUp, ControlRequest, control_event};

#[tokio::test]
async fn readiness_follows_the_listener_and_drain_signals_agents() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: '{}'}}]\nadmin: {{listen: '127.0.0.1:0'}}\nshutdownGraceSeconds: 15\n",
            sidecar.url()
        ),
    ))
    .await;
    let admin = gw.admin.expect("admin port bound");
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
    assert_eq!(
        http_get(admin, "/readyz").await,
        (200, "ready\n".to_owned())
    );

    let channel = agent_a1(gw.addr, &pki.pki).await;
    let mut control = TunnelClient::new(channel.clone())
        .control(ControlRequest {
            agent_id: "a1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let token = token_for(&channel, "dev-1").await;
    let (tx, mut down) = acked_cache(&channel, "dev-1", &token).await;

    let (status, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("spinlink_gateway_connections_open 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("spinlink_gateway_handshakes_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("spinlink_gateway_draining 0"), "{metrics}");
    assert_eq!(drain_seconds(&metrics), 0.0, "{metrics}");

    gw.shutdown.cancel();
    let event = tokio::time::timeout(WAIT, control.message())
        .await
        .unwrap()
        .unwrap()
        .expect("a control event");
    match event.event {
        Some(control_event::Event::Reconnect(r)) => {
            assert_eq!(r.reason, "draining");
            assert_eq!(r.deadline_millis, 15_000);
        }
        other => panic!("not a reconnect: {other:?}"),
    }
    // The signal sent, the control stream ends and no longer holds the connection.
    assert!(
        tokio::time::timeout(WAIT, control.message())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );

    // Draining: not ready, new connections refused, open streams carry on.
    assert_eq!(
        http_get(admin, "/readyz").await,
        (503, "draining\n".to_owned())
    );
    assert!(
        http_get(admin, "/metrics")
            .await
            .1
            .contains("spinlink_gateway_draining 1")
    );
    assert!(tokio::net::TcpStream::connect(gw.addr).await.is_err());
    // GOAWAY: the connection takes no new stream (the client, told so, does
    // not even send it), while the one already open carries on.
    let granted = gw.stats.snapshot().accounts_granted;
    let result = hello(&channel, &["dev-2"]).await;
    assert!(result.is_err(), "a Hello after GOAWAY: {result:?}");
    assert_eq!(gw.stats.snapshot().accounts_granted, granted);
    tx.send(CacheUp { seq: 2, msg: None }).await.unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 2);

    // The last stream ends: the drain completes well inside the grace.
    drop((tx, down, channel));
    let mut gw = gw;
    tokio::time::timeout(WAIT, &mut gw.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "admin port outlived the drain"
    );
    // How long the drain took: from the signal to the last stream's end.
    let seconds = drain_seconds(&gw.stats.metrics().encode());
    assert!(
        seconds > 0.0 && seconds < WAIT.as_secs_f64(),
        "drain took {seconds} s"
    );
}

/// The value of `spinlink_gateway_drain_duration_seconds` in a scrape.
fn drain_seconds(metrics: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("spinlink_gateway_drain_duration_seconds "))
        .unwrap_or_else(|| panic!("no drain duration in:\n{metrics}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn drain_sends_goaway_and_refuses_later_streams() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: '{}'}}]\nshutdownGraceSeconds: 15\n",
            sidecar.url()
        ),
    ))
    .await;
    let mut raw = RawH2::connect(gw.addr, &pki.pki).await;
    // A `Hello` whose request never comes keeps stream 1 open; the PING's
    // answer says the gateway has read its HEADERS.
    raw.open(1, paths::HELLO).await;
    raw.ping().await;

    gw.shutdown.cancel();
    let goaway = raw.until(kind::GOAWAY, 0).await;
    assert_eq!(
        word(&goaway),
        1,
        "GOAWAY names stream 1 the last one processed"
    );
    assert_eq!(word(&goaway[4..]), Reason::NO_ERROR.0);
    // A stream opened after GOAWAY is refused, unprocessed, and counted.
    raw.open(3, paths::HELLO).await;
    let reset = raw.until(kind::RST_STREAM, 3).await;
    assert_eq!(word(&reset), Reason::REFUSED_STREAM.0);
    wait_refusals(&gw.stats, Refusal::GoingAway, 1).await;
    assert_eq!(gw.stats.metrics().refusals(Refusal::ConnectionStreams), 0);
}

#[tokio::test]
async fn no_admin_port_unless_configured() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    assert!(gw.admin.is_none());
}
