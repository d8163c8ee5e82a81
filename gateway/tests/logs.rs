//! Channel tokens never reach the logs: with every crate logging at TRACE,
//! a `Hello`, a renewal, a carried `Cache` stream and a stream refused for a
//! forged token leave no token text in what was written.

mod common;

use common::*;
use spinlink_proto::v1::CacheUp;
use tonic::Code;

#[tokio::test]
async fn tokens_never_appear_in_logs() {
    capture_logs();
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!("upstreams: [{{url: '{}'}}]\n", sidecar.url()),
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&channel, "dev-1").await;
    let (tx, mut down) = acked_cache(&channel, "dev-1", &token).await;
    tx.send(CacheUp { seq: 2, msg: None }).await.unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 2);
    // A renewal on the same connection: a second token.
    let renewed = token_for(&channel, "dev-1").await;
    assert_ne!(renewed, token);
    // A forged token (one character changed) is refused, and not logged either.
    let mut forged = renewed.clone().into_bytes();
    forged[10] = if forged[10] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let err = open_cache(&channel, |s| with_metadata(s, "dev-1", &forged))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // The capture works: the steps above were logged, with their context.
    wait_log_line(&["tunnel::hello: hello ", "identity=", "granted=1"]).await;
    // Carried streams go to the access log's own target, which
    // `SPINLINK_LOG=…,spinlink_gateway::access=off` turns off.
    wait_log_line(&[
        "spinlink_gateway::access: stream carried",
        "account=\"dev-1\"",
    ])
    .await;
    wait_log_line(&["stream refused", "account=\"dev-1\""]).await;
    // TRACE from the HTTP/2 and TLS layers was captured too.
    let text = logs();
    assert!(text.contains("TRACE"), "{text}");

    for secret in [&token, &renewed, &forged] {
        assert!(
            !text.contains(secret.as_str()),
            "token {secret} logged:\n{text}"
        );
    }
}

/// A flood of connections the listener refuses writes one warning with the
/// first one's details and then one summary line with the count, not a line
/// each (`listener/log_summary.rs`); the refusals metric counts every one.
#[tokio::test]
async fn a_flood_of_refusals_is_summarised() {
    capture_logs();
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n\
         listener: {handshakesPerSecond: 0.01, handshakeBurst: 1, handshakeQueueSeconds: 0,\n\
         \x20 handshakeReservedPercent: 0, handshakeBurstPerSource: 1000}\n",
    ))
    .await;
    // The first takes the one handshake token; the next 200 are refused,
    // each once its ClientHello's first record (here a stub) is read.
    let mut held = Vec::new();
    for _ in 0..201 {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        tcp.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00])
            .await
            .unwrap();
        held.push(tcp);
    }
    wait_refusals(
        &gw.stats,
        spinlink_gateway::stats::Refusal::HandshakeRate,
        200,
    )
    .await;
    let line = wait_log_line(&[
        "connections refused",
        "reason=\"handshake_rate\"",
        "count=199",
    ])
    .await;
    assert!(line.contains("WARN"), "{line}");
    let single = logs()
        .lines()
        .filter(|l| l.contains("connection refused") && l.contains("handshake_rate"))
        .count();
    assert_eq!(single, 1, "one warning of its own, then the summary");
}
