//! The admin port and drain: `/healthz`, `/readyz` (200 once the listener
//! accepts, 503 from the moment shutdown is signalled while connections
//! drain) and `/metrics`; on shutdown every agent gets `Reconnect{draining}`
//! on its `Control` stream, open streams keep working, new connections are
//! refused.

mod common;

use common::*;
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
    let (tx, mut down) = open_cache(&channel, |s| with_metadata(s, "dev-1", &token))
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);

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
