//! `Control`, served by the gateway: past its maximum age a connection gets
//! `Reconnect{max-age}` on the stream the agent opened, then GOAWAY after the
//! grace; a connection without `Control` is still closed. A raw tonic client
//! plays the agent.

mod common;

use common::*;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{ControlRequest, control_event};

#[tokio::test]
async fn max_age_sends_reconnect_then_goaway() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\nlistener:\n  maxConnectionAgeSeconds: 1\n  \
         maxConnectionAgeJitterPercent: 0\n  maxConnectionAgeGraceSeconds: 1\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let mut control = TunnelClient::new(channel.clone())
        .control(ControlRequest {
            agent_id: "a1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    hello(&channel, &["dev-1"]).await.unwrap();
    let event = tokio::time::timeout(WAIT, control.message())
        .await
        .unwrap()
        .unwrap()
        .expect("a control event");
    match event.event {
        Some(control_event::Event::Reconnect(r)) => {
            assert_eq!(r.reason, "max-age");
            assert_eq!(r.deadline_millis, 1_000);
        }
        other => panic!("not a reconnect: {other:?}"),
    }
    // Still usable during the grace (make-before-break)...
    hello(&channel, &["dev-1"]).await.unwrap();
    // ...then closed.
    tokio::time::timeout(
        WAIT,
        gw.stats
            .wait_until(|s| s.metrics().connections_open.get() == 0),
    )
    .await
    .unwrap();
    assert!(hello(&channel, &["dev-1"]).await.is_err());
}

#[tokio::test]
async fn a_second_control_stream_replaces_the_first() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let open = || async {
        TunnelClient::new(channel.clone())
            .control(ControlRequest {
                agent_id: "a1".into(),
            })
            .await
            .unwrap()
            .into_inner()
    };
    let mut first = open().await;
    let mut second = open().await;
    // The first ends (its sender was replaced); the second gets the signal.
    assert!(
        tokio::time::timeout(WAIT, first.message())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    gw.shutdown.cancel();
    let event = tokio::time::timeout(WAIT, second.message())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        event.and_then(|e| e.event),
        Some(control_event::Event::Reconnect(r)) if r.reason == "draining"
    ));
}
