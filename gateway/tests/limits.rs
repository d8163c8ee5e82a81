//! The listener's limits, each refused and counted by reason: open
//! connections, the handshake admission rate, the handshake timeout, the
//! per-identity `Hello` rate, the `Hello` size, carried streams per identity,
//! streams per connection, the size of carried messages, and idle
//! connections.

mod common;

use common::*;
use spinlink_gateway::stats::Glitch;
use spinlink_gateway::stats::Refusal;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{CacheUp, WatchEvent, cache_up};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn gateway(pki: &spinlink_tls::dev::DevPki, sidecar: &str, listener: &str) -> RunningGateway {
    start_gateway(&tls_gateway_yaml(
        pki,
        &format!("upstreams: [{{url: '{sidecar}'}}]\nlistener:\n{listener}"),
    ))
    .await
}

#[tokio::test]
async fn connections_past_the_maximum_are_closed() {
    let pki = pki();
    let gw = gateway(&pki.pki, "http://127.0.0.1:9", "  maxConnections: 1\n").await;
    let first = agent_a1(gw.addr, &pki.pki).await;
    hello(&first, &["dev-1"]).await.unwrap();
    let mut second = TcpStream::connect(gw.addr).await.unwrap();
    assert!(closed_by_peer(&mut second).await);
    wait_refusals(&gw.stats, Refusal::MaxConnections, 1).await;
    // The first is unaffected; once it goes, its slot is free again.
    hello(&first, &["dev-1"]).await.unwrap();
    drop(first);
    tokio::time::timeout(
        WAIT,
        gw.stats
            .wait_until(|s| s.metrics().connections_open.get() == 0),
    )
    .await
    .unwrap();
    let third = agent_a1(gw.addr, &pki.pki).await;
    hello(&third, &["dev-1"]).await.unwrap();
}

#[tokio::test]
async fn handshakes_past_the_rate_are_refused() {
    let pki = pki();
    let gw = gateway(
        &pki.pki,
        "http://127.0.0.1:9",
        // Nothing reserved for returning agents: the global bucket alone.
        "  handshakesPerSecond: 0.001\n  handshakeBurst: 2\n  handshakeReservedPercent: 0\n",
    )
    .await;
    for _ in 0..2 {
        let c = agent_a1(gw.addr, &pki.pki).await;
        hello(&c, &["dev-1"]).await.unwrap();
    }
    let storm = agent_channel(
        gw.addr,
        &pki.pki,
        Some((&pki.pki.cert("agent-a1"), &pki.pki.key("agent-a1"))),
    )
    .await;
    assert!(storm.is_err(), "third handshake admitted");
    wait_refusals(&gw.stats, Refusal::HandshakeRate, 1).await;
}

#[tokio::test]
async fn handshakes_past_the_burst_wait_their_turn() {
    // One at once, then one every 100 ms: a storm of four is admitted in
    // turn within the queue bound, none refused.
    let pki = pki();
    let gw = gateway(
        &pki.pki,
        "http://127.0.0.1:9",
        "  handshakesPerSecond: 10\n  handshakeBurst: 1\n  handshakeQueueSeconds: 5\n",
    )
    .await;
    let storm = (0..4).map(|_| async {
        let c = agent_a1(gw.addr, &pki.pki).await;
        hello(&c, &["dev-1"]).await.map(|_| c)
    });
    let admitted = futures::future::join_all(storm).await;
    assert!(admitted.iter().all(Result::is_ok), "{admitted:?}");
    assert_eq!(gw.stats.metrics().refusals(Refusal::HandshakeRate), 0);
}

#[tokio::test]
async fn stalled_handshakes_time_out() {
    let pki = pki();
    let gw = gateway(
        &pki.pki,
        "http://127.0.0.1:9",
        "  handshakeTimeoutSeconds: 1\n",
    )
    .await;
    // Silent after connecting, and a ClientHello that stops halfway.
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let mut half = TcpStream::connect(gw.addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    assert!(closed_by_peer(&mut silent).await);
    assert!(closed_by_peer(&mut half).await);
    wait_refusals(&gw.stats, Refusal::HandshakeTimeout, 2).await;
    tokio::time::timeout(
        WAIT,
        gw.stats
            .wait_until(|s| s.metrics().connections_open.get() == 0),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn hello_rate_is_per_identity() {
    let pki = pki();
    let gw = gateway(
        &pki.pki,
        "http://127.0.0.1:9",
        "  helloPerSecond: 0.001\n  helloBurst: 2\n",
    )
    .await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    hello(&a1, &["dev-1"]).await.unwrap();
    // A second connection of the same identity shares the budget.
    let a1_again = agent_a1(gw.addr, &pki.pki).await;
    hello(&a1_again, &["dev-1"]).await.unwrap();
    let refused = hello(&a1, &["dev-1"]).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(gw.stats.metrics().refusals(Refusal::HelloRate), 1);
    // Another identity has its own.
    let a2 = agent_channel(
        gw.addr,
        &pki.pki,
        Some((&pki.pki.cert("agent-a2"), &pki.pki.key("agent-a2"))),
    )
    .await
    .unwrap();
    hello(&a2, &["dev-2"]).await.unwrap();
}

#[tokio::test]
async fn oversized_hello_is_refused() {
    let pki = pki();
    let gw = gateway(&pki.pki, "http://127.0.0.1:9", "  maxHelloBytes: 1024\n").await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    let long = "x".repeat(2000);
    let refused = hello(&a1, &[&long]).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert_eq!(gw.stats.metrics().refusals(Refusal::HelloTooLarge), 1);
    hello(&a1, &["dev-1"]).await.unwrap();
}

#[tokio::test]
async fn carried_streams_per_identity_are_bounded() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = gateway(&pki.pki, &sidecar.url(), "  maxStreamsPerIdentity: 1\n").await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    let t1 = token_for(&a1, "dev-1").await;
    let (tx1, mut down1) = open_cache(&a1, |s| with_metadata(s, "dev-1", &t1))
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down1).await.unwrap(), 1);

    // Another connection of the same identity counts against the same budget.
    let again = agent_a1(gw.addr, &pki.pki).await;
    let t2 = token_for(&again, "dev-2").await;
    let refused = open_cache(&again, |s| with_metadata(s, "dev-2", &t2))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(gw.stats.metrics().refusals(Refusal::IdentityStreams), 1);

    // The first stream ends; its slot is given back.
    drop((tx1, down1));
    tokio::time::timeout(
        WAIT,
        gw.stats.wait_until(|s| {
            s.metrics()
                .streams_open
                .get(&spinlink_gateway::stats::metrics::UpstreamLabel {
                    upstream: sidecar.url(),
                })
                .is_some_and(|g| g.get() == 0)
        }),
    )
    .await
    .unwrap();
    let (_tx, _down) = acked_cache(&again, "dev-2", &t2).await;
}

#[tokio::test]
async fn streams_per_connection_are_bounded() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = gateway(&pki.pki, &sidecar.url(), "  maxConcurrentStreams: 1\n").await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    let t1 = token_for(&a1, "dev-1").await;
    let (tx1, mut down1) = open_cache(&a1, |s| with_metadata(s, "dev-1", &t1))
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down1).await.unwrap(), 1);
    // The one stream this connection may have is taken: a second waits for it.
    let mut second = Box::pin(hello(&a1, &["dev-2"]));
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), &mut second)
            .await
            .is_err(),
        "a second concurrent stream was served"
    );
    drop((tx1, down1));
    tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
}

#[tokio::test]
async fn idle_connections_are_closed_but_control_keeps_them() {
    let pki = pki();
    let gw = gateway(&pki.pki, "http://127.0.0.1:9", "  idleTimeoutSeconds: 1\n").await;
    // No stream at all: closed.
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let mut idle = agent_tls_over(tcp, &pki.pki, "agent-a1").await.unwrap();
    assert!(closed_by_peer(&mut idle).await);
    wait_refusals(&gw.stats, Refusal::Idle, 1).await;

    // An open Control stream is activity: the connection stays past the timeout.
    let busy = agent_a1(gw.addr, &pki.pki).await;
    let _control = TunnelClient::new(busy.clone())
        .control(spinlink_proto::v1::ControlRequest {
            agent_id: "a1".into(),
        })
        .await
        .unwrap();
    let idle_before = gw.stats.metrics().refusals(Refusal::Idle);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(gw.stats.metrics().refusals(Refusal::Idle), idle_before);
    hello(&busy, &["dev-1"]).await.unwrap();
}

/// A `Cache` message whose object is `bytes` long.
fn event_of(seq: u64, bytes: usize) -> CacheUp {
    CacheUp {
        seq,
        msg: Some(cache_up::Msg::Event(WatchEvent {
            object: vec![b'x'; bytes],
            ..WatchEvent::default()
        })),
    }
}

/// A message over `listener.maxMessageBytes` ends its stream as soon as its
/// length prefix arrives: the agent gets `RESOURCE_EXHAUSTED`, the sidecar
/// never gets the message, and the agent's connection and other streams
/// go on. Messages up to the limit are carried.
#[tokio::test]
async fn a_message_over_the_limit_ends_its_stream_before_the_sidecar_gets_it() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = gateway(&pki.pki, &sidecar.url(), "  maxMessageBytes: 65536\n").await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    let t1 = token_for(&a1, "dev-1").await;
    let (tx, mut down) = acked_cache(&a1, "dev-1", &t1).await;

    tx.send(event_of(2, 60_000)).await.unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 2);
    assert_eq!(sidecar.record.lock().unwrap().messages, 2);

    tx.send(event_of(3, 100_000)).await.unwrap();
    let ended = next_ack(&mut down).await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::ResourceExhausted, "{ended:?}");
    assert_eq!(sidecar.record.lock().unwrap().messages, 2);
    assert!(gw.stats.metrics().glitches(Glitch::StreamError) >= 1);

    // The same connection carries the agent's next stream.
    let t2 = token_for(&a1, "dev-2").await;
    let (tx2, mut down2) = acked_cache(&a1, "dev-2", &t2).await;
    tx2.send(event_of(2, 1_000)).await.unwrap();
    assert_eq!(next_ack(&mut down2).await.unwrap(), 2);
}

#[test]
fn the_message_limit_is_checked() {
    let pki = pki();
    let yaml = |v: &str| {
        tls_gateway_yaml(
            &pki.pki,
            &format!(
                "upstreams: [{{url: 'http://127.0.0.1:9'}}]\nlistener:\n  maxMessageBytes: {v}\n"
            ),
        )
    };
    let err = spinlink_gateway::Config::from_yaml_str(&yaml("1000"), "gw.yaml").unwrap_err();
    assert!(err.to_string().contains("maxMessageBytes"), "{err}");
    spinlink_gateway::Config::from_yaml_str(&yaml("1048576"), "gw.yaml").unwrap();
}

/// The buffer budget: an agent that reads nothing of what its sidecar
/// sends holds what the gateway queued for it; past
/// `listener.maxBufferedBytes` (together with everyone else) the
/// connection holding the most ends with GOAWAY `ENHANCE_YOUR_CALM`,
/// counted as `memory_budget`, and the other agents go on.
#[tokio::test]
async fn over_the_buffer_budget_the_connection_holding_the_most_ends() {
    let pki = pki();
    let sidecar = FakeSidecar::flooding(&["dev-1", "dev-2"]).await;
    let gw = gateway(&pki.pki, &sidecar.url(), "  maxBufferedBytes: 1048576\n").await;

    // A well-behaved agent on its own connection, with a quiet account.
    let good = agent_a1(gw.addr, &pki.pki).await;
    let t3 = token_for(&good, "dev-3").await;
    let (tx3, mut down3) = acked_cache(&good, "dev-3", &t3).await;

    // The slow reader: two flooded streams it never reads. Each holds up
    // to the window the gateway grants the sidecar (1 MiB) less what the
    // agent's own window took.
    let slow = agent_a1(gw.addr, &pki.pki).await;
    let t1 = token_for(&slow, "dev-1").await;
    let t2 = token_for(&slow, "dev-2").await;
    let (_tx1, down1) = open_cache(&slow, |s| with_metadata(s, "dev-1", &t1))
        .await
        .unwrap();
    let (_tx2, down2) = open_cache(&slow, |s| with_metadata(s, "dev-2", &t2))
        .await
        .unwrap();
    wait_refusals(&gw.stats, Refusal::MemoryBudget, 1).await;
    drop((down1, down2));
    // It lost its connection: a new call on it fails.
    let again = hello(&slow, &["dev-1"]).await;
    assert!(again.is_err(), "{again:?}");

    // The good agent was never over anything.
    tx3.send(CacheUp { seq: 2, msg: None }).await.unwrap();
    assert_eq!(next_ack(&mut down3).await.unwrap(), 2);
    assert_eq!(gw.stats.metrics().refusals(Refusal::MemoryBudget), 1);
    let metrics = gw.stats.metrics();
    assert_eq!(metrics.buffer_budget_bytes.get(), 1 << 20);
}
