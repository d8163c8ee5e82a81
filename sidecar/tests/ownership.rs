//! Two sidecars sharing one store (SQLite, or PostgreSQL in a schema of its
//! own when `SPINLINK_TEST_POSTGRES_URL` is set): an account is owned by the
//! instance whose lease it holds, a request to the other is forwarded once, a forwarded
//! request that finds no owner is a retryable 503, a cache stream for an
//! owned account is refused elsewhere (after a short wait for the holder to
//! let go), and a drained owner's accounts can be taken over at once.

mod common;

use anyhow::Context as _;
use common::*;
use futures::StreamExt as _;
use serde_json::json;

fn pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "resourceVersion": "5"},
        "spec": {"containers": [{"name": "c"}]}})
}

/// Sidecars `sidecar-a` and `sidecar-b` on one store (SQLite, or
/// PostgreSQL when `SPINLINK_TEST_POSTGRES_URL` is set) with
/// `lease_seconds` leases, speaking to each other over their peer ports
/// with mutual TLS and the sidecar identity, as deployed.
async fn two_sidecars(
    lease_seconds: u64,
) -> anyhow::Result<(SharedStore, PeerPki, Running, Running)> {
    let store = SharedStore::new().await?;
    let pki = PeerPki::new()?;
    let a = start_named(&peer_config(
        &store,
        &pki,
        "sidecar-a",
        "sidecar-peer",
        lease_seconds,
    ))
    .await?;
    let b = start_named(&peer_config(
        &store,
        &pki,
        "sidecar-b",
        "sidecar-peer",
        lease_seconds,
    ))
    .await?;
    Ok((store, pki, a, b))
}

/// Sidecar `id` on `store` whose peer port presents `pki`'s certificate
/// `cert`.
fn peer_config(store: &SharedStore, pki: &PeerPki, id: &str, cert: &str, lease: u64) -> String {
    format!(
        "store: {{ url: \"{}\" }}\nownership: {{ leaseSeconds: {lease} }}\ninstanceId: {id}\n{}",
        store.url,
        pki.yaml_as(cert)
    )
}

/// An agent's cache stream for `prod` on `sidecar`, its pods (`web-1`)
/// synced and acknowledged, the account online there.
async fn serve_prod(
    sidecar: &Running,
    client: &mut spinlink_proto::v1::tunnel_client::TunnelClient<tonic::transport::Channel>,
) -> anyhow::Result<CacheStream> {
    let mut cache = CacheStream::open(client, "prod").await?;
    sync(&mut cache, &pods_kind(), &[pod("web-1")]).await?;
    cache.wait_acked().await?;
    wait_status(sidecar, "prod", |s| s.online && s.kinds_synced == 1).await?;
    Ok(cache)
}

fn pods_kind() -> spinlink_proto::v1::Kind {
    kind("", "v1", "pods", "Pod", true)
}

#[tokio::test]
async fn accounts_are_owned_forwarded_once_and_taken_over() -> anyhow::Result<()> {
    let (_store, _pki, a, b) = two_sidecars(30).await?;

    let mut to_a = a.client().await?;
    let cache = serve_prod(&a, &mut to_a).await?;
    let pods = pods_kind();

    let http = http();
    let path = "/accounts/prod/api/v1/namespaces/demo/pods";
    // Through B: forwarded to A, answered from A's cache.
    let via_b = get(&http, &b.url(path)).await?;
    assert_eq!(
        via_b.status,
        200,
        "{}",
        String::from_utf8_lossy(&via_b.body)
    );
    assert_eq!(via_b.json()["items"][0]["metadata"]["name"], "web-1");
    // A request already forwarded once is never forwarded again.
    let hop = request(
        &http,
        "GET",
        &b.url(path),
        &[("spinlink-forwarded-by", "sidecar-x")],
        "",
    )
    .await?;
    assert_retryable(&hop);
    assert!(
        hop.json()["message"]
            .as_str()
            .unwrap()
            .contains("sidecar-a")
    );
    // The owner answers a forwarded request itself.
    let at_a = request(
        &http,
        "GET",
        &a.url(path),
        &[("spinlink-forwarded-by", "sidecar-b")],
        "",
    )
    .await?;
    assert_eq!(at_a.status, 200);
    // A forwarded request for an account nobody owns: retryable, not 404.
    let nobody = request(
        &http,
        "GET",
        &b.url("/accounts/ghost/api/v1/pods"),
        &[("spinlink-forwarded-by", "x")],
        "",
    )
    .await?;
    assert_eq!(nobody.status, 503);
    assert_eq!(
        get(&http, &b.url("/accounts/ghost/api/v1/pods"))
            .await?
            .status,
        404
    );

    // B may not take A's account while A holds it.
    let mut to_b = b.client().await?;
    let refused = CacheStream::open(&mut to_b, "prod").await;
    let err = refused.err().expect("a second owner was accepted");
    let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("sidecar-a"),
        "{}",
        status.message()
    );

    // A drains: its leases are released and B takes the account at once.
    drop(cache);
    a.stop().await?;
    let mut cache_b = CacheStream::open(&mut to_b, "prod").await?;
    sync(&mut cache_b, &pods, &[pod("web-2")]).await?;
    cache_b.wait_acked().await?;
    let now = get(&http, &b.url(path)).await?;
    assert_eq!(now.json()["items"][0]["metadata"]["name"], "web-2");
    drop(cache_b);
    b.stop().await
}

#[tokio::test]
async fn an_account_whose_streams_ended_is_released_for_another_owner_at_once() -> anyhow::Result<()>
{
    // A 60 s lease, renewed every 20 s: the takeover below must come from
    // the release when the streams end, long before either.
    let (_store, _pki, a, b) = two_sidecars(60).await?;
    let mut to_a = a.client().await?;
    let cache = serve_prod(&a, &mut to_a).await?;

    // The agent's streams to A end (its gateway died); A stays up.
    let started = tokio::time::Instant::now();
    drop(cache);
    wait_status(&a, "prod", |s| !s.online).await?;
    let mut to_b = b.client().await?;
    let deadline = started + std::time::Duration::from_secs(10);
    let cache_b = loop {
        match CacheStream::open(&mut to_b, "prod").await {
            Ok(stream) => break stream,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let status = e.downcast_ref::<tonic::Status>().expect("a gRPC status");
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.context("B never took over A's released account")),
        }
    };
    served_by_b(cache_b, a, b).await
}

/// B serves `prod` on `cache_b` (its listing applied and acknowledged);
/// then both sidecars stop.
async fn served_by_b(mut cache_b: CacheStream, a: Running, b: Running) -> anyhow::Result<()> {
    sync(&mut cache_b, &pods_kind(), &[pod("web-2")]).await?;
    cache_b.wait_acked().await?;
    drop(cache_b);
    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn a_cache_stream_waits_for_the_sidecar_letting_its_account_go() -> anyhow::Result<()> {
    // An agent moving to a new gateway connection ends its cache stream to
    // A just before it opens the new one, which the new gateway sends to B
    // (it balances by its own load). B waits for A to let go rather than
    // refuse the stream, so the move needs no second try (and the agent no
    // new connection).
    let (_store, _pki, a, b) = two_sidecars(60).await?;
    let mut to_a = a.client().await?;
    let cache = serve_prod(&a, &mut to_a).await?;
    let mut to_b = b.client().await?;
    let opening = tokio::spawn(async move { CacheStream::open(&mut to_b, "prod").await });
    // Refused at once, the open would be over well within this.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !opening.is_finished(),
        "B answered while A still held the account, instead of waiting"
    );
    drop(cache);
    let cache_b = opening.await??;
    served_by_b(cache_b, a, b).await
}

#[tokio::test]
async fn an_account_name_is_refused_for_a_second_cluster() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let open = |fingerprint: &str| spinlink_proto::v1::CacheUp {
        seq: 1,
        msg: Some(spinlink_proto::v1::cache_up::Msg::Open(
            spinlink_proto::v1::CacheOpen {
                account: "prod".into(),
                agent_id: "test".into(),
                ca_fingerprint: fingerprint.into(),
                ..Default::default()
            },
        )),
    };
    let first = client
        .cache(with_headers(
            futures::stream::iter([open("aa11")]).chain(futures::stream::pending()),
            "prod",
        ))
        .await;
    assert!(first.is_ok());
    let second = client
        .cache(with_headers(futures::stream::iter([open("bb22")]), "prod"))
        .await
        .expect_err("a second cluster under the same name was accepted");
    assert_eq!(second.code(), tonic::Code::FailedPrecondition);
    assert!(
        second.message().contains("another cluster"),
        "{}",
        second.message()
    );
    // The same cluster again is fine.
    let again = client
        .cache(with_headers(
            futures::stream::iter([open("aa11")]).chain(futures::stream::pending()),
            "prod",
        ))
        .await;
    assert!(again.is_ok());
    drop((first, again));
    sidecar.stop().await
}

/// Opens a cache stream for `account` numbered from `seq`, retrying while
/// another instance still holds its lease (it has not seen its streams end).
async fn open_when_free(
    client: &mut spinlink_proto::v1::tunnel_client::TunnelClient<tonic::transport::Channel>,
    account: &str,
    seq: u64,
) -> anyhow::Result<CacheStream> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match CacheStream::open_at(client, account, seq).await {
            Ok(stream) => return Ok(stream),
            Err(e) if tokio::time::Instant::now() < deadline => {
                let status = e.downcast_ref::<tonic::Status>().expect("a gRPC status");
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.context("the lease was never released")),
        }
    }
}

/// Waits until the store records pods of `account` at `rv`.
async fn recorded(store: &SharedStore, account: &str, rv: &str) -> anyhow::Result<()> {
    let db = spinlink_sidecar::store::Store::open(&store.url).await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let kinds = db.resource_versions(account).await?;
        if kinds
            .iter()
            .any(|k| k.resource == "pods" && k.resource_version == rv)
        {
            db.close().await;
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("pods of {account} never recorded at {rv}: {kinds:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn pod_at(name: &str, rv: &str) -> serde_json::Value {
    let mut p = pod(name);
    p["metadata"]["resourceVersion"] = json!(rv);
    p
}

/// An account that goes away from a sidecar and comes back while its cache
/// is still held there (the grace period): where the store's record shows
/// another owner moved on, that owner's snapshot replaces the older cache
/// and the agent resumes from it; where the record matches the cache held,
/// the agent resumes from that. Either way nothing is listed again.
#[tokio::test]
async fn an_account_back_with_its_old_cache_resumes_from_the_freshest_one() -> anyhow::Result<()> {
    let (store, _pki, a, b) = two_sidecars(30).await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let (mut to_a, mut to_b) = (a.client().await?, b.client().await?);

    // A owns it first: pods synced at 1000 (messages 1..=4).
    let mut cache = CacheStream::open_at(&mut to_a, "prod", 1).await?;
    assert!(cache.resume_from().await?.is_empty());
    sync(&mut cache, &pods, &[pod_at("web-1", "999")]).await?;
    cache.wait_acked().await?;
    drop(cache);
    wait_status(&a, "prod", |s| !s.online).await?;
    recorded(&store, "prod", "1000").await?;

    // B takes it over warm from A and moves on: web-2 at 1001.
    let mut cache = open_when_free(&mut to_b, "prod", 4).await?;
    assert_eq!(cache.resume_from().await?, [("pods".into(), "1000".into())]);
    cache.send(added(&pods, &pod_at("web-2", "1001"))).await?;
    cache.wait_acked().await?;
    drop(cache);
    wait_status(&b, "prod", |s| !s.online).await?;
    recorded(&store, "prod", "1001").await?;

    // Back at A, whose cache is still at 1000: B's snapshot replaces it.
    let mut cache = open_when_free(&mut to_a, "prod", 5).await?;
    assert_eq!(
        cache.resume_from().await?,
        [("pods".into(), "1001".into())],
        "A resumes from where B left off, not from its older cache"
    );
    cache.wait_acked().await?;
    let http = http();
    let list = get(&http, &a.url("/accounts/prod/api/v1/namespaces/demo/pods"))
        .await?
        .json();
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web-1", "web-2"]);
    drop(cache);
    wait_status(&a, "prod", |s| !s.online).await?;

    // Back at A again, nobody in between: its cache is the record.
    let mut cache = open_when_free(&mut to_a, "prod", 5).await?;
    assert_eq!(cache.resume_from().await?, [("pods".into(), "1001".into())]);
    let metrics = get(&http, &a.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        "spinlink_sidecar_handovers_total{outcome=\"warm\",reason=\"fresher\"} 1",
        "spinlink_sidecar_handovers_total{outcome=\"resumed\",reason=\"current\"} 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    drop((cache, to_a, to_b));
    a.stop().await?;
    b.stop().await
}

/// A 503 that client-go sends again a second later (`Retry-After: 1`), and
/// that no client cache answers in place of the server later: its
/// `Cache-Control` is that of the API server's own "retry" answer (a `429`
/// with `Retry-After`, recorded in `kube-sim/fixtures/errors/requests.json`).
fn assert_retryable(answer: &Answer) {
    assert_eq!(
        answer.status,
        503,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(
        answer
            .headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1"),
        "{}",
        answer.message()
    );
    let server_retry = recorded_request(|e| e["status"] == 429);
    assert_eq!(
        answer
            .headers
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        recorded_header(&server_retry["response_headers"], "Cache-Control"),
        "{}",
        answer.message()
    );
    // The server says it in the Status too, and ends its JSON with a
    // newline.
    let recorded = fixture(&format!(
        "errors/{}",
        server_retry["file"].as_str().unwrap()
    ));
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(
        body["details"]["retryAfterSeconds"],
        recorded["details"]["retryAfterSeconds"],
        "{}",
        answer.message()
    );
    assert!(answer.body.ends_with(b"}\n"), "{}", answer.message());
}

/// The answer the agent (played here, on this clock) gives every relayed
/// request: 200 with a tiny JSON body, and its times.
async fn answer_all(mut relay: RelayStream) {
    use spinlink_proto::v1::{self, relay_down, relay_up};
    while let Ok(msg) = relay.next().await {
        let relay_down::Msg::Head(head) = msg else {
            continue;
        };
        let started = chrono::Utc::now().timestamp_micros();
        let id = head.id;
        let _ = relay
            .send(relay_up::Msg::Head(v1::ResponseHead {
                id,
                status: 200,
                headers: vec![v1::Header {
                    name: "content-type".into(),
                    value: b"application/json".to_vec(),
                }],
                timing: Some(v1::AgentTiming {
                    started_unix_micros: started,
                    finished_unix_micros: chrono::Utc::now().timestamp_micros(),
                }),
            }))
            .await;
        let _ = relay
            .send(relay_up::Msg::Body(v1::BodyChunk {
                id,
                data: br#"{"kind":"Status","status":"Success"}"#.to_vec(),
                end_stream: true,
            }))
            .await;
    }
}

/// Relayed operations are journaled in the store: every sidecar's accounts
/// API shows them, whichever relayed them, also after that one is gone.
#[tokio::test]
async fn relayed_operations_are_shown_by_every_sidecar_and_outlive_the_one_that_relayed_them()
-> anyhow::Result<()> {
    let (store, _pki, a, b) = two_sidecars(30).await?;
    let mut to_a = a.client().await?;
    let cache = CacheStream::open(&mut to_a, "prod").await?;
    let relay = RelayStream::open(&mut to_a, "prod").await?;
    wait_status(&a, "prod", |s| s.online && s.relay).await?;
    let agent = tokio::spawn(answer_all(relay));

    // Through B (forwarded to A, relayed there) and through A.
    let http = http();
    let path = "/accounts/prod/api/v1/namespaces/demo/pods/web-1";
    let patched = request(
        &http,
        "PATCH",
        &b.url(path),
        &[
            ("content-type", "application/merge-patch+json"),
            ("kubectl-command", "kubectl label"),
            ("authorization", "Bearer must-not-be-journaled"),
        ],
        r#"{"metadata":{"labels":{"secret":"must-not-be-journaled"}}}"#,
    )
    .await?;
    assert_eq!(patched.status, 200);
    let deleted = request(&http, "DELETE", &a.url(path), &[], "").await?;
    assert_eq!(deleted.status, 200);

    let ops = |running: &Running| {
        let (http, url) = (http.clone(), running.url("/v1/accounts/prod/operations"));
        async move { get(&http, &url).await }
    };
    // B waits for its own queued entries before it reads; A's are written
    // by A's journal writer a moment after A answered.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let via_b = loop {
        let via_b = ops(&b).await?;
        assert_eq!(
            via_b.status,
            200,
            "{}",
            String::from_utf8_lossy(&via_b.body)
        );
        if via_b.json().as_array().map(Vec::len) == Some(2)
            || tokio::time::Instant::now() > deadline
        {
            break via_b;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let list = via_b.json();
    let summary: Vec<(&str, &str, &str, u64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["instance"].as_str().unwrap(),
                o["method"].as_str().unwrap(),
                o["outcome"].as_str().unwrap(),
                o["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("sidecar-a", "PATCH", "answered", 200),
            ("sidecar-a", "DELETE", "answered", 200)
        ],
        "{list}"
    );
    assert_eq!(list[0]["kubectlCommand"], "kubectl label");
    // The agent's times, placed by A before it journaled them, come with
    // the rest: every hop, in order.
    for op in list.as_array().unwrap() {
        assert!(hop_times(op).is_sorted(), "hops out of order: {op}");
    }
    let text = String::from_utf8_lossy(&via_b.body);
    assert!(!text.contains("must-not-be-journaled"), "{text}");

    // A goes away for good: B still shows what A relayed.
    drop((cache, to_a));
    agent.abort();
    a.stop().await?;
    let after = ops(&b).await?;
    assert_eq!(after.status, 200);
    assert_eq!(after.json().as_array().map(Vec::len), Some(2));
    // An account nobody ever served is still not found.
    assert_eq!(
        get(&http, &b.url("/v1/accounts/ghost/operations"))
            .await?
            .status,
        404
    );
    drop(store);
    b.stop().await
}

/// Waits until `series` on `running`'s metrics reaches `want` (refusals are
/// counted by the server as it refuses, a moment after the client sees it).
async fn metric_reaches(running: &Running, series: &str, want: f64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let value = metric(running, series).await?;
        if value >= want {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{series} stayed at {value}, not {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The peer port answers forwarded requests and snapshots only to a client
/// certificate of the CA that names a sidecar identity: a gateway's or an
/// agent's certificate of the same CA gets a 403, a client without a
/// certificate no handshake, each counted by reason; the accounts API and
/// metrics are not on it at all.
#[tokio::test]
async fn the_peer_port_serves_only_sidecar_certificates() -> anyhow::Result<()> {
    let (_store, pki, a, b) = two_sidecars(30).await?;
    let mut to_a = a.client().await?;
    let cache = serve_prod(&a, &mut to_a).await?;
    let peer = a.peer.expect("A serves a peer port");
    let list = "/accounts/prod/api/v1/namespaces/demo/pods";
    let snapshot = "/internal/accounts/prod/snapshot";

    // A sidecar's certificate: served, as a forwarded request.
    let (status, body) = pki.get(peer, Some("sidecar-peer"), list).await?;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let items: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(items["items"][0]["metadata"]["name"], "web-1");
    // Online at A: not handed over, but judged and answered.
    assert_eq!(pki.get(peer, Some("sidecar-peer"), snapshot).await?.0, 409);
    assert_eq!(
        pki.get(peer, Some("sidecar-peer"), "/v1/accounts").await?.0,
        404
    );
    assert_eq!(
        pki.get(peer, Some("sidecar-peer"), "/metrics").await?.0,
        404
    );

    // Certificates of the same CA naming no sidecar.
    for (cert, path) in [("gateway", list), ("agent-test", snapshot)] {
        let (status, body) = pki.get(peer, Some(cert), path).await?;
        assert_eq!(status, 403, "{cert}: {}", String::from_utf8_lossy(&body));
        assert!(
            String::from_utf8_lossy(&body).contains("peer.tls.peerIdentities"),
            "{cert}: the refusal names the key"
        );
    }
    // No certificate: no handshake, nothing read.
    assert!(
        pki.get(peer, None, snapshot).await.is_err(),
        "a client without a certificate must not get a snapshot"
    );
    let refused =
        |reason: &str| format!("spinlink_sidecar_peer_refused_total{{reason=\"{reason}\"}}");
    metric_reaches(&a, &refused("not_peer"), 2.0).await?;
    metric_reaches(&a, &refused("handshake"), 1.0).await?;
    metric_reaches(&a, &refused("path"), 2.0).await?;
    // The facade never listens where the peers are.
    assert_ne!(a.facade, peer);

    drop(cache);
    a.stop().await?;
    b.stop().await
}

/// A sidecar whose peer certificate (of the same CA) is not a sidecar
/// identity is neither forwarded to, nor served when it forwards, nor
/// handed an account's cache: a retryable 503 where it owns the account, a
/// 403 from the owner where it forwards, a cold handover where it takes
/// one over.
#[tokio::test]
async fn a_sidecar_without_a_sidecar_identity_is_neither_forwarded_to_nor_served()
-> anyhow::Result<()> {
    let (store, pki, a, b) = two_sidecars(30).await?;
    // C presents the gateway's certificate on its peer port, both ways.
    let c = start_named(&peer_config(&store, &pki, "sidecar-c", "gateway", 30)).await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let (mut to_a, mut to_c) = (a.client().await?, c.client().await?);
    let mut at_a = CacheStream::open(&mut to_a, "prod").await?;
    sync(&mut at_a, &pods, &[pod("web-1")]).await?;
    at_a.wait_acked().await?;
    let mut at_c = CacheStream::open(&mut to_c, "other").await?;
    sync(&mut at_c, &pods, &[pod("web-9")]).await?;
    at_c.wait_acked().await?;
    wait_status(&a, "prod", |s| s.online).await?;
    wait_status(&c, "other", |s| s.online).await?;
    let http = http();
    let path = |account: &str| format!("/accounts/{account}/api/v1/namespaces/demo/pods");

    // B forwards to A (sidecar to sidecar, mutual TLS) ...
    let via_b = get(&http, &b.url(&path("prod"))).await?;
    assert_eq!(
        via_b.status,
        200,
        "{}",
        String::from_utf8_lossy(&via_b.body)
    );
    // ... but does not speak to C: its server certificate names no sidecar.
    let to_c_owner = get(&http, &b.url(&path("other"))).await?;
    assert_retryable(&to_c_owner);
    // C forwards to A, which refuses it and counts it.
    let via_c = get(&http, &c.url(&path("prod"))).await?;
    assert_eq!(
        via_c.status,
        403,
        "{}",
        String::from_utf8_lossy(&via_c.body)
    );
    metric_reaches(
        &a,
        "spinlink_sidecar_peer_refused_total{reason=\"not_peer\"}",
        1.0,
    )
    .await?;

    // prod's agent moves from A to C: A refuses C its snapshot, so C's
    // agent lists every kind again.
    drop(at_a);
    wait_status(&a, "prod", |s| !s.online).await?;
    let mut moved = open_when_free(&mut to_c, "prod", 4).await?;
    assert!(
        moved.resume_from().await?.is_empty(),
        "no cache handed to a sidecar that is not one"
    );
    assert_eq!(
        metric(
            &c,
            "spinlink_sidecar_handovers_total{outcome=\"cold\",reason=\"refused\"}"
        )
        .await?,
        1.0
    );
    metric_reaches(
        &a,
        "spinlink_sidecar_peer_refused_total{reason=\"not_peer\"}",
        2.0,
    )
    .await?;

    drop((moved, at_c, to_a, to_c));
    c.stop().await?;
    a.stop().await?;
    b.stop().await
}

/// A rolling restart: the owner drains (SIGTERM) while a write another
/// sidecar forwarded to it is with the agent. The owner's own facade holds
/// no request, but that write is answered before the owner's streams end;
/// a request forwarded after the drain began is refused as retryable
/// (`Retry-After`: client-go sends it again) before it reaches the agent.
#[tokio::test]
async fn a_draining_owner_answers_the_writes_its_peers_forwarded() -> anyhow::Result<()> {
    use spinlink_proto::v1::{self, relay_down, relay_up};
    let (_store, _pki, a, b) = two_sidecars(30).await?;
    let mut to_a = a.client().await?;
    let _cache = serve_prod(&a, &mut to_a).await?;
    let mut relay = RelayStream::open(&mut to_a, "prod").await?;
    wait_status(&a, "prod", |s| s.relay).await?;
    let http = http();
    let url = b.url("/accounts/prod/api/v1/namespaces/demo/configmaps");
    const BODY: &str = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"}}"#;
    let write = spawn_request(&http, "POST", &url, &[], BODY);
    let relay_down::Msg::Head(head) = relay.next().await? else {
        anyhow::bail!("expected the write's head");
    };
    assert_eq!(head.method, "POST");
    while !matches!(relay.next().await?, relay_down::Msg::Body(b) if b.end_stream) {}

    a.shutdown.cancel();
    // The owner's facade has stopped taking connections.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(a.facade).await.is_ok() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the facade still listens"
        );
        tokio::task::yield_now().await;
    }
    let later = request(&http, "POST", &url, &[], BODY).await?;
    assert_retryable(&later);

    let created = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c","namespace":"demo","resourceVersion":"9"}}"#;
    relay
        .send(relay_up::Msg::Head(v1::ResponseHead {
            id: head.id,
            status: 201,
            headers: vec![v1::Header {
                name: "content-type".into(),
                value: b"application/json".to_vec(),
            }],
            timing: None,
        }))
        .await
        .context("the owner ended the relay stream with the write unanswered")?;
    relay
        .send(relay_up::Msg::Body(v1::BodyChunk {
            id: head.id,
            data: created.as_bytes().to_vec(),
            end_stream: true,
        }))
        .await
        .context("the owner ended the relay stream with the write unanswered")?;
    let answer = write.await??;
    assert_eq!(
        (answer.status, &answer.body[..]),
        (201, created.as_bytes()),
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    // Nothing else reached the agent; the owner's streams end and it exits.
    let end =
        tokio::time::timeout(std::time::Duration::from_secs(10), relay.down.message()).await?;
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    a.task.await??;
    b.stop().await
}
