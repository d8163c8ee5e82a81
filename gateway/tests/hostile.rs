//! Hostile peers on the agent port, with a raw HTTP/2 client: each attack
//! ends the connection with the GOAWAY code RFC 9113 (or the practice of
//! nginx) names, is counted by reason, and leaves the gateway serving.
//!
//! - an HPACK bomb (a header block of one-octet references to one large
//!   table entry) is refused before it is decoded past the header list
//!   limit: `ENHANCE_YOUR_CALM`, and the process's peak memory barely moves;
//! - a SETTINGS_INITIAL_WINDOW_SIZE that takes an open stream's send window
//!   past 2^31−1: `FLOW_CONTROL_ERROR`;
//! - a connection that never sends the HTTP/2 preface is closed after
//!   `listener.prefaceTimeoutSeconds`, while one that did stays;
//! - an identity cancelling carried streams before their answer loses its
//!   connection past `listener.cancelBurst`, across reconnects.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::BytesMut;
use common::*;
use spinlink_gateway::stats::Glitch;
use spinlink_gateway::stats::Refusal;
use spinlink_http2::frame::{self, Reason, kind};
use spinlink_http2::hpack::Indexing;
use spinlink_proto::paths;

async fn gateway(pki: &spinlink_tls::dev::DevPki, extra: &str) -> RunningGateway {
    start_gateway(&tls_gateway_yaml(
        pki,
        &format!("upstreams: [{{url: 'http://127.0.0.1:9'}}]\n{extra}"),
    ))
    .await
}

/// The most this process has held resident so far (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmHWM line");
    kib * 1024
}

/// A 64 KiB header block that adds one 2,000-octet field to the HPACK
/// table and then refers to it in one octet, over and over: about 130 MB
/// of header list for 64 KiB on the wire.
fn hpack_bomb(raw: &mut RawH2) -> BytesMut {
    let value = vec![b'a'; 2000];
    let mut block = BytesMut::new();
    // The encoder indexes the first and sends each repeat as index 62.
    raw.enc.encode(
        std::iter::repeat_n((&b"x-bomb"[..], &value[..], Indexing::Indexed), 63_000),
        &mut block,
    );
    assert!(block.len() <= 64 * 1024, "within the CONTINUATION cap");
    block
}

#[tokio::test]
async fn an_hpack_bomb_ends_the_connection_before_it_is_decoded() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    let mut raw = RawH2::connect(gw.addr, &pki.pki).await;
    raw.ping().await;
    let before = peak_rss();
    let bomb = hpack_bomb(&mut raw);
    raw.headers(1, &bomb).await;
    // The gateway's answer to the block, whatever it is, comes once it
    // has done with it.
    let (head, payload) = tokio::time::timeout(WAIT, async {
        loop {
            let (head, payload) = raw.next().await;
            if matches!(head.kind, kind::GOAWAY | kind::RST_STREAM) {
                return (head, payload);
            }
        }
    })
    .await
    .expect("no answer to the header block");
    // Decoded whole, the block would have been ~130 MB in one buffer.
    let grown = peak_rss().saturating_sub(before);
    assert!(grown < 32 << 20, "peak memory grew by {} MiB", grown >> 20);
    // Not a stream reset the peer could answer with the same block again:
    // the connection ends.
    assert_eq!(head.kind, kind::GOAWAY, "answered with frame {head:?}");
    assert_eq!(Reason(word(&payload[4..])), Reason::ENHANCE_YOUR_CALM);
    assert!(raw.closed().await, "still open after GOAWAY");
    wait_refusals(&gw.stats, Refusal::HeaderListTooLarge, 1).await;
    // The same peer cannot try again on that connection; the gateway
    // serves the next one.
    let a1 = agent_a1(gw.addr, &pki.pki).await;
    hello(&a1, &["dev-1"]).await.unwrap();
}

#[tokio::test]
async fn a_settings_change_past_the_maximum_window_is_a_flow_control_error() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    let mut raw = RawH2::connect(gw.addr, &pki.pki).await;
    // A `Hello` whose request never comes keeps stream 1 open, its send
    // window at the 65,535 of the peer's initial SETTINGS.
    raw.open(1, paths::HELLO).await;
    let mut out = BytesMut::new();
    frame::write_window_update(&mut out, 1, frame::MAX_WINDOW - frame::DEFAULT_WINDOW);
    raw.send(&out).await;
    // The PING's answer says the WINDOW_UPDATE was taken: the window is at
    // 2^31−1, which is allowed.
    raw.ping().await;
    let mut out = BytesMut::new();
    frame::Settings {
        initial_window_size: Some(frame::DEFAULT_WINDOW + 1),
        ..frame::Settings::default()
    }
    .write(&mut out);
    raw.send(&out).await;
    assert_eq!(raw.goaway_then_closed().await, Reason::FLOW_CONTROL_ERROR);
    wait_refusals(&gw.stats, Refusal::WindowOverflow, 1).await;
}

#[tokio::test]
async fn a_connection_without_a_preface_is_closed_after_the_timeout() {
    let pki = pki();
    let gw = gateway(&pki.pki, "listener:\n  prefaceTimeoutSeconds: 1\n").await;
    // One connection says nothing after TLS; one says its preface at once.
    let started = Instant::now();
    let mut silent = RawH2::connect_silent(gw.addr, &pki.pki).await;
    let mut talking = RawH2::connect(gw.addr, &pki.pki).await;
    talking.ping().await;
    assert!(
        silent.closed().await,
        "the silent connection was not closed"
    );
    let waited = started.elapsed();
    assert!(
        waited.as_secs_f64() >= 1.0,
        "closed after {waited:?}, before its timeout"
    );
    wait_refusals(&gw.stats, Refusal::PrefaceTimeout, 1).await;
    // Past the timeout, the connection that spoke is still served.
    talking.ping().await;
    assert_eq!(gw.stats.metrics().refusals(Refusal::PrefaceTimeout), 1);
}

/// A WINDOW_UPDATE of 0 on stream `id`: a stream error the gateway raises
/// itself (RFC 9113 §6.9).
fn zero_window_update(id: u32) -> BytesMut {
    let mut out = BytesMut::new();
    frame::Head {
        len: 4,
        kind: kind::WINDOW_UPDATE,
        flags: 0,
        stream: id,
    }
    .write(&mut out);
    out.extend_from_slice(&[0; 4]);
    out
}

/// MadeYouReset (CVE-2025-8671): streams opened on a path the gateway
/// answers and made to reset by the gateway itself. Before the
/// misbehaviour budget, over a million streams went by on one connection
/// without a GOAWAY; now the budget (1,000 glitches) ends it.
#[tokio::test]
async fn made_you_reset_spends_the_budget_and_ends_the_connection() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    let mut raw = RawH2::connect(gw.addr, &pki.pki).await;
    let mut streams = 0;
    let reason = tokio::time::timeout(WAIT, async {
        for i in 0..5_000u32 {
            let id = 1 + 2 * i;
            raw.open(id, paths::HELLO).await;
            raw.send(&zero_window_update(id)).await;
            streams += 1;
            if i % 100 == 99 {
                // Read what came back; stop at the GOAWAY.
                loop {
                    let (head, payload) = raw.next().await;
                    if head.kind == kind::GOAWAY {
                        return Some(Reason(word(&payload[4..])));
                    }
                    if head.kind == kind::PING {
                        break;
                    }
                }
            }
            if i % 100 == 98 {
                raw.send(&ping_frame()).await;
            }
        }
        None
    })
    .await
    .expect("the attack outlasted its wait");
    assert_eq!(
        reason,
        Some(Reason::ENHANCE_YOUR_CALM),
        "{streams} streams made to reset without a GOAWAY"
    );
    assert!(streams <= 1_200, "{streams} streams before the GOAWAY");
    wait_refusals(&gw.stats, Refusal::Glitches, 1).await;
    // Streams it reset, and (once the identity's Hello rate ran out and
    // the gateway answered at once) WINDOW_UPDATEs that did nothing.
    let charged: u64 = Glitch::ALL
        .iter()
        .map(|g| gw.stats.metrics().glitches(*g))
        .sum();
    assert!(charged >= 1_000, "{charged} glitches charged");
    assert!(gw.stats.metrics().glitches(Glitch::StreamError) > 0);
    // The gateway serves the next connection.
    let mut next = RawH2::connect(gw.addr, &pki.pki).await;
    next.ping().await;
}

/// A PING flood: each PING is answered, and costs a glitch; a thousand in
/// a burst end the connection.
#[tokio::test]
async fn a_ping_flood_ends_the_connection() {
    let pki = pki();
    let gw = gateway(&pki.pki, "").await;
    let mut raw = RawH2::connect(gw.addr, &pki.pki).await;
    let mut flood = BytesMut::new();
    for _ in 0..2_000 {
        flood.extend_from_slice(&ping_frame());
    }
    raw.send(&flood).await;
    assert_eq!(raw.goaway_then_closed().await, Reason::ENHANCE_YOUR_CALM);
    wait_refusals(&gw.stats, Refusal::Glitches, 1).await;
    assert!(gw.stats.metrics().glitches(Glitch::Ping) >= 1_000);
}

fn ping_frame() -> BytesMut {
    let mut out = BytesMut::new();
    frame::write_ping(&mut out, false, [9; 8]);
    out
}

/// A sidecar that takes every stream and never answers one: whatever the
/// agent cancels is cancelled before its answer. Counts the streams it got.
async fn silent_sidecar() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let got = got.clone();
        async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let got = got.clone();
                let service = hyper::service::service_fn(move |_req| {
                    got.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<Result<http::Response<String>, std::io::Error>>()
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                );
            }
        }
    });
    (addr, got)
}

/// Opens a `Cache` stream for `account` on `channel`, waits until the
/// sidecar has it (the `got`-th stream), and drops it: the agent's client
/// resets it before any answer.
async fn cancel_one(
    channel: &tonic::transport::Channel,
    account: &str,
    token: &str,
    got: &AtomicUsize,
    nth: usize,
) {
    let (channel, account, token) = (channel.clone(), account.to_owned(), token.to_owned());
    let call = tokio::spawn(async move {
        let _ = open_cache(&channel, move |s| with_metadata(s, &account, &token)).await;
    });
    eventually("the sidecar to get the stream", || {
        got.load(Ordering::SeqCst) >= nth
    })
    .await;
    call.abort();
}

/// An identity that keeps cancelling carried streams before the sidecar
/// answered sends the sidecar's shared connection a reset for each; past
/// `listener.cancelBurst` it loses its own connection, and reconnecting buys
/// it nothing: the budget is the identity's, not the connection's. (Before
/// it, resets were bounded only per connection — a thousand each — and an
/// agent reconnecting in a loop made the sidecar's HTTP/2 server end the
/// connection every account shares.)
#[tokio::test]
async fn cancelling_streams_before_their_answer_is_budgeted_per_identity() {
    let pki = pki();
    let (sidecar, got) = silent_sidecar().await;
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: 'http://{sidecar}'}}]\n\
             upstreamPool: {{healthCheck: {{intervalSeconds: 0}}}}\n\
             listener: {{cancelsPerSecond: 0.001, cancelBurst: 3}}\n"
        ),
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&channel, "dev-1").await;
    for n in 1..=3 {
        cancel_one(&channel, "dev-1", &token, &got, n).await;
    }
    // Within the burst: the connection goes on.
    assert_eq!(gw.stats.metrics().refusals(Refusal::Cancels), 0);
    cancel_one(&channel, "dev-1", &token, &got, 4).await;
    wait_refusals(&gw.stats, Refusal::Cancels, 1).await;

    // A new connection of the same identity: one cancel ends it.
    let again = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&again, "dev-1").await;
    cancel_one(&again, "dev-1", &token, &got, 5).await;
    wait_refusals(&gw.stats, Refusal::Cancels, 2).await;

    // Another identity has its own budget.
    let other = agent_channel(
        gw.addr,
        &pki.pki,
        Some((&pki.pki.cert("agent-a2"), &pki.pki.key("agent-a2"))),
    )
    .await
    .unwrap();
    let token = token_for(&other, "dev-2").await;
    cancel_one(&other, "dev-2", &token, &got, 6).await;
    // Its connection still answers: the gateway reads a connection's frames
    // in order, so this Hello comes after the reset it charged.
    hello(&other, &["dev-2"])
        .await
        .expect("the other identity's connection ended");
    assert_eq!(gw.stats.metrics().refusals(Refusal::Cancels), 2);
}
