//! Bad input on the agent port: garbage bytes, HTTP/1.1 in plaintext and
//! inside TLS, a stalled TLS handshake (see `limits.rs`), and a flood of
//! streams with bad tokens — each closed or refused cleanly, counted, and
//! nothing left open afterwards.

mod common;

use std::sync::Arc;

use common::*;
use spinlink_gateway::stats::Refusal;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn gateway(pki: &spinlink_tls::dev::DevPki, extra: &str) -> RunningGateway {
    start_gateway(&tls_gateway_yaml(
        pki,
        &format!("upstreams: [{{url: 'http://127.0.0.1:9'}}]\n{extra}"),
    ))
    .await
}

async fn none_open(gw: &RunningGateway) {
    tokio::time::timeout(
        WAIT,
        gw.stats
            .wait_until(|s| s.metrics().connections_open.get() == 0),
    )
    .await
    .expect("a connection was left open");
}

#[tokio::test]
async fn garbage_and_plaintext_http1_fail_the_handshake() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    let mut garbage = TcpStream::connect(gw.addr).await.unwrap();
    garbage
        .write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64))
        .await
        .unwrap();
    assert!(closed_by_peer(&mut garbage).await);
    let mut http1 = TcpStream::connect(gw.addr).await.unwrap();
    http1
        .write_all(b"GET / HTTP/1.1\r\nHost: gateway\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_by_peer(&mut http1).await);
    tokio::time::timeout(WAIT, gw.stats.wait_for(|s| s.handshake_failures >= 2))
        .await
        .unwrap();
    none_open(&gw).await;
    // And the gateway still serves.
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    hello(&a1, &["dev-1"]).await.unwrap();
}

#[tokio::test]
async fn http1_inside_tls_is_a_protocol_error() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    // A client with a valid certificate that offers no ALPN and speaks HTTP/1.1.
    let ca = pki.pki.ca_cert();
    let (cert, key) = (pki.pki.cert("agent-a1"), pki.pki.key("agent-a1"));
    let config = spinlink_tls::config::client_config(
        spinlink_tls::config::ClientFiles {
            ca: &ca,
            identity: Some((&cert, &key)),
        },
        &[],
    )
    .unwrap();
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: gateway\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_by_peer(&mut tls).await);
    wait_refusals(&gw.stats, Refusal::Protocol, 1).await;
    none_open(&gw).await;
}

/// 300 streams at once on one connection, most with forged tokens and
/// every tenth a real one the agent abandons after its first answer: the
/// forged ones are refused, and afterwards no stream is counted open on the
/// sidecar and every one of the identity's stream slots is free again.
#[tokio::test]
async fn a_flood_of_bad_streams_is_refused_and_leaves_nothing() {
    const SLOTS: usize = 8;
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: '{}'}}]\n\
             upstreamPool: {{healthCheck: {{intervalSeconds: 0}}}}\n\
             listener:\n  maxConcurrentStreams: 32\n  maxStreamsPerIdentity: {SLOTS}\n",
            sidecar.url()
        ),
    ))
    .await;
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&a1, "dev-1").await;
    let flood: Vec<_> = (0..300)
        .map(|i| {
            let a1 = a1.clone();
            let token = if i % 10 == 0 {
                token.clone()
            } else {
                format!("forged-{i}")
            };
            tokio::spawn(async move {
                let (tx, mut down) = open_cache(&a1, |s| with_metadata(s, "dev-1", &token)).await?;
                next_ack(&mut down).await?;
                // Abandoned: the agent resets it rather than closing it.
                drop((tx, down));
                Ok::<_, tonic::Status>(())
            })
        })
        .collect();
    let (mut carried, mut busy) = (0, 0);
    for (i, stream) in flood.into_iter().enumerate() {
        match (i % 10 == 0, stream.await.unwrap()) {
            (true, Ok(())) => carried += 1,
            // More real streams at once than the identity has slots.
            (true, Err(s)) if s.code() == tonic::Code::ResourceExhausted => busy += 1,
            (false, Err(s)) => assert_eq!(s.code(), tonic::Code::Unauthenticated),
            (real, other) => panic!("stream {i} (real: {real}): {other:?}"),
        }
    }
    assert!(carried >= 1);
    assert_eq!(carried + busy, 30);
    let stats = gw.stats.snapshot();
    assert_eq!(
        (stats.streams_refused, stats.streams_forwarded),
        (270, carried)
    );

    eventually("the abandoned streams leave streams_open", || {
        upstream_streams(&gw.stats, &sidecar.url()).0 == 0
    })
    .await;
    // Every slot is free: the identity opens its full share at once.
    let mut held = Vec::new();
    for _ in 0..SLOTS {
        // A slot left taken would refuse one of these.
        held.push(acked_cache(&a1, "dev-1", &token).await);
    }
    let err = open_cache(&a1, |s| with_metadata(s, "dev-1", &token))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    drop(held);

    // The connection still serves, and closing it leaves nothing behind.
    hello(&a1, &["dev-1"]).await.unwrap();
    drop(a1);
    none_open(&gw).await;
    eventually("the held streams leave streams_open", || {
        upstream_streams(&gw.stats, &sidecar.url()).0 == 0
    })
    .await;
}
