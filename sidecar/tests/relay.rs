//! The relay path end to end: requests the cache cannot answer go down the
//! agent's `Relay` stream (played here) and its answers come back to the
//! facade client; errors, a vanished stream and a vanished client are handled.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use spinlink_proto::v1::{self, relay_down, relay_up};

async fn setup() -> anyhow::Result<(Running, RelayStream, CacheStream)> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let cache = CacheStream::open(&mut client, "prod").await?;
    let relay = RelayStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| s.relay && s.online).await?;
    Ok((sidecar, relay, cache))
}

fn head(id: u64, status: u32) -> relay_up::Msg {
    relay_up::Msg::Head(v1::ResponseHead {
        id,
        status,
        headers: vec![
            v1::Header {
                name: "Content-Type".into(),
                value: b"application/json".to_vec(),
            },
            v1::Header {
                name: "Content-Length".into(),
                value: b"999".to_vec(),
            },
        ],
        // An agent older than `AgentTiming`.
        timing: None,
    })
}

fn chunk(id: u64, data: &str, end: bool) -> relay_up::Msg {
    relay_up::Msg::Body(v1::BodyChunk {
        id,
        data: data.as_bytes().to_vec(),
        end_stream: end,
    })
}

#[tokio::test]
async fn post_is_relayed_with_its_body_and_answered_in_chunks() -> anyhow::Result<()> {
    let (sidecar, mut relay, _cache) = setup().await?;
    let http = http();
    let url = sidecar.url(
        "/accounts/prod/api/v1/namespaces/demo/configmaps?fieldManager=kubectl&timeoutSeconds=30",
    );
    let client = tokio::spawn(async move {
        request(
            &http,
            "POST",
            &url,
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer secret"),
                ("cookie", "a=b"),
                ("kubectl-command", "kubectl create"),
            ],
            r#"{"kind":"ConfigMap"}"#,
        )
        .await
    });

    let relay_down::Msg::Head(req) = relay.next().await? else {
        panic!("expected a request head");
    };
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/api/v1/namespaces/demo/configmaps");
    assert_eq!(req.query, "fieldManager=kubectl&timeoutSeconds=30");
    assert!(req.deadline_unix_millis > 0);
    assert!(!req.end_stream);
    let names: Vec<&str> = req.headers.iter().map(|h| h.name.as_str()).collect();
    assert!(
        names.contains(&"content-type") && names.contains(&"kubectl-command"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"authorization") && !names.contains(&"cookie"),
        "{names:?}"
    );
    let mut body = Vec::new();
    loop {
        let relay_down::Msg::Body(c) = relay.next().await? else {
            panic!("expected body chunks");
        };
        assert_eq!(c.id, req.id);
        body.extend_from_slice(&c.data);
        if c.end_stream {
            break;
        }
    }
    assert_eq!(body, br#"{"kind":"ConfigMap"}"#);

    relay.send(head(req.id, 201)).await?;
    relay
        .send(chunk(req.id, r#"{"kind":"Config"#, false))
        .await?;
    relay.send(chunk(req.id, r#"Map"}"#, true)).await?;
    let answer = client.await??;
    assert_eq!(answer.status, 201);
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(answer.body, r#"{"kind":"ConfigMap"}"#);

    // Ids are unique per account.
    let http = common::http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = tokio::spawn(async move { get(&http, &url).await });
    let relay_down::Msg::Head(second) = relay.next().await? else {
        panic!("expected a request head");
    };
    assert!(second.end_stream, "a GET has no body");
    assert_ne!(second.id, req.id);
    relay.send(head(second.id, 200)).await?;
    relay.send(chunk(second.id, "", true)).await?;
    assert_eq!(client.await??.status, 200);
    sidecar.stop().await
}

#[tokio::test]
async fn agent_error_before_head_is_a_502_status() -> anyhow::Result<()> {
    let (sidecar, mut relay, _cache) = setup().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = tokio::spawn(async move { get(&http, &url).await });
    let relay_down::Msg::Head(req) = relay.next().await? else {
        panic!("expected a request head");
    };
    relay
        .send(relay_up::Msg::Error(v1::RelayError {
            id: req.id,
            status: 0,
            message: "api server unreachable".into(),
            timing: None,
        }))
        .await?;
    let answer = client.await??;
    assert_eq!(answer.status, 502);
    let status = answer.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["message"], "api server unreachable");
    assert_eq!(status["code"], 502);
    sidecar.stop().await
}

#[tokio::test]
async fn relay_stream_gone_fails_a_waiting_write_with_503() -> anyhow::Result<()> {
    let (sidecar, mut relay, _cache) = setup().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/configmaps");
    let client = spawn_request(&http, "POST", &url, &[], r#"{"kind":"ConfigMap"}"#);
    let relay_down::Msg::Head(_) = relay.next().await? else {
        panic!("expected a request head");
    };
    // A second stream opens before the write is answered: it is not sent
    // there, as the agent may have applied it.
    let mut client2 = sidecar.client().await?;
    let mut second = RelayStream::open(&mut client2, "prod").await?;
    drop(relay);
    let answer = client.await??;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.json()["reason"], "ServiceUnavailable");
    assert!(
        answer.message().contains("closed before it answered"),
        "{}",
        answer.message()
    );
    assert!(
        futures::FutureExt::now_or_never(second.down.message()).is_none(),
        "the write went again on the second stream"
    );
    drop(second);
    wait_status(&sidecar, "prod", |s| !s.relay).await?;
    let after = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log"),
    )
    .await?;
    assert_eq!(after.status, 503);
    sidecar.stop().await
}

#[tokio::test]
async fn a_read_whose_stream_closed_before_the_answer_goes_again_on_the_next() -> anyhow::Result<()>
{
    // The agent's connection breaks (its gateway went away) with a read on
    // the way; the agent comes back on a new connection.
    let (sidecar, mut relay, _cache) = setup().await?;
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = spawn_request(&http(), "GET", &url, &[], "");
    let first = next_request(&mut relay, "GET").await?;
    drop(relay);
    wait_status(&sidecar, "prod", |s| !s.relay).await?;
    let mut client2 = sidecar.client().await?;
    let mut next = RelayStream::open(&mut client2, "prod").await?;
    let again = next_request(&mut next, "GET").await?;
    assert_eq!(again, first, "the same request, under its id");
    next.send(head(again, 200)).await?;
    next.send(chunk(again, "line\n", true)).await?;
    let answer = client.await??;
    assert_eq!((answer.status, &answer.body[..]), (200, &b"line\n"[..]));
    sidecar.stop().await
}

#[tokio::test]
async fn a_draining_stream_answers_what_it_carries_then_the_sidecar_ends_it() -> anyhow::Result<()>
{
    // The agent moves the account to a new connection: the new relay stream
    // opens, then the old one says `RelayDrain`. A request the sidecar sent
    // on the old stream just before is still on its way to the agent (here:
    // not yet read); it is answered there, and only then does the sidecar
    // end the old stream. No timer decides it.
    let (sidecar, mut old, _cache) = setup().await?;
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let in_transit = spawn_request(&http(), "GET", &url, &[], "");
    wait_until_in_flight(&sidecar, 1).await?;
    let mut client2 = sidecar.client().await?;
    let mut new = RelayStream::open(&mut client2, "prod").await?;
    old.send(relay_up::Msg::Drain(v1::RelayDrain {})).await?;

    // New requests go to the new stream.
    let answer = relayed_by(&sidecar, &mut new, "from the new stream").await?;
    assert_eq!(answer.body, "from the new stream");

    // The old stream is still open for the request it carries.
    let id = next_request(&mut old, "GET").await?;
    assert!(
        futures::FutureExt::now_or_never(old.down.message()).is_none(),
        "the old stream ended with a request unanswered"
    );
    old.send(head(id, 200)).await?;
    old.send(chunk(id, "from the old stream", true)).await?;
    let answer = in_transit.await??;
    assert_eq!(
        (answer.status, &answer.body[..]),
        (200, &b"from the old stream"[..])
    );
    // Answered: the sidecar ends the old stream, with OK.
    let end = tokio::time::timeout(WAIT, old.down.message()).await?;
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(sidecar.accounts.status("prod").is_some_and(|s| s.relay));
    sidecar.stop().await
}

#[tokio::test]
async fn a_drain_on_the_only_stream_leaves_the_account_without_a_relay_at_once()
-> anyhow::Result<()> {
    // What an agent that says `RelayDrain` with no newer stream costs: its
    // own account's relayed requests fail at once (503, as with no stream),
    // none waits out its timeout, and the sidecar ends the stream.
    let (sidecar, mut relay, _cache) = setup().await?;
    relay.send(relay_up::Msg::Drain(v1::RelayDrain {})).await?;
    let end = tokio::time::timeout(WAIT, relay.down.message()).await?;
    assert!(matches!(end, Ok(None)), "{end:?}");
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log?timeoutSeconds=30");
    let answer = tokio::time::timeout(Duration::from_secs(5), get(&http(), &url)).await??;
    assert_eq!(answer.status, 503, "{:?}", answer.json());
    assert!(
        answer.message().contains("no relay stream"),
        "{}",
        answer.message()
    );
    sidecar.stop().await
}

/// How long a step may take.
const WAIT: Duration = Duration::from_secs(10);

/// Waits until `n` relayed requests of `prod` wait for their answer.
async fn wait_until_in_flight(sidecar: &Running, n: usize) -> anyhow::Result<()> {
    let account = sidecar.accounts.get("prod").expect("prod");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if account.relay().is_some_and(|r| r.in_flight() == n) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{n} requests never in flight"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_relay_stream_without_a_cache_stream_still_relays() -> anyhow::Result<()> {
    // An agent moving connections: the old cache stream has ended, the new
    // relay stream is open, the new cache stream is not yet.
    let (sidecar, mut relay, cache) = setup().await?;
    drop(cache);
    wait_status(&sidecar, "prod", |s| !s.online && s.relay).await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move { get(&http, &url).await })
    };
    let relay_down::Msg::Head(req) = relay.next().await? else {
        panic!("expected a request head");
    };
    relay.send(head(req.id, 200)).await?;
    relay.send(chunk(req.id, "line\n", true)).await?;
    let answer = client.await??;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, &b"line\n"[..]);

    // With neither stream the account is offline: refused, retryable.
    drop(relay);
    wait_status(&sidecar, "prod", |s| !s.relay).await?;
    let refused = get(&http, &url).await?;
    assert_eq!(refused.status, 503);
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("offline")
    );
    sidecar.stop().await
}

#[tokio::test]
async fn client_going_away_cancels_the_request() -> anyhow::Result<()> {
    let (sidecar, mut relay, _cache) = setup().await?;
    let http = http();
    let req = http::Request::get(sidecar.url("/accounts/prod/api/v1/pods?watch=true"))
        .body(Full::new(Bytes::new()))?;
    let pending = tokio::spawn(async move { http.request(req).await });
    let relay_down::Msg::Head(watch) = relay.next().await? else {
        panic!("expected a request head");
    };
    relay.send(head(watch.id, 200)).await?;
    relay
        .send(chunk(watch.id, "{\"type\":\"ADDED\"}\n", false))
        .await?;
    let resp = pending.await??;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap()?.into_data().unwrap();
    assert_eq!(first, "{\"type\":\"ADDED\"}\n");
    drop(body);

    // The server notices the closed connection when it writes next: keep the
    // watch flowing until the cancel comes back.
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                msg = relay.next() => {
                    if let relay_down::Msg::Cancel(c) = msg? {
                        return anyhow::Ok(c.id);
                    }
                }
                _ = tick.tick() => relay.send(chunk(watch.id, "{\"type\":\"MODIFIED\"}\n", false)).await?,
            }
        }
    })
    .await??;
    assert_eq!(cancelled, watch.id);
    sidecar.stop().await
}

#[tokio::test]
async fn no_head_in_time_is_a_504_and_cancels() -> anyhow::Result<()> {
    let sidecar = start_with(", relayTimeoutSeconds: 1").await?;
    let mut client = sidecar.client().await?;
    let _cache = CacheStream::open(&mut client, "prod").await?;
    let mut relay = RelayStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| s.relay).await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = tokio::spawn(async move { get(&http, &url).await });
    let relay_down::Msg::Head(req) = relay.next().await? else {
        panic!("expected a request head");
    };
    let answer = client.await??;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.json()["reason"], "Timeout");
    let relay_down::Msg::Cancel(c) = relay.next().await? else {
        panic!("expected a cancel");
    };
    assert_eq!(c.id, req.id);
    sidecar.stop().await
}

/// The agent (played here) answers the next relayed request with `status`
/// and `body`, after checking its method.
async fn answer(
    relay: &mut RelayStream,
    method: &str,
    status: u32,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    let id = next_request(relay, method).await?;
    relay.send(head(id, status)).await?;
    relay.send(chunk(id, &body.to_string(), true)).await
}

/// Takes the next relayed request, whole, after checking its method;
/// returns its id.
async fn next_request(relay: &mut RelayStream, method: &str) -> anyhow::Result<u64> {
    let relay_down::Msg::Head(req) = relay.next().await? else {
        anyhow::bail!("expected a request head");
    };
    assert_eq!(req.method, method);
    if !req.end_stream {
        // The request body, up to its end.
        loop {
            if let relay_down::Msg::Body(b) = relay.next().await?
                && b.end_stream
            {
                break;
            }
        }
    }
    Ok(req.id)
}

/// How long the played agent works on a request it answers with its times:
/// long enough for its duration to show in the journal's milliseconds.
const AGENT_WORK: std::time::Duration = std::time::Duration::from_millis(20);

/// Answers the next request as an agent whose clock reads `agent_clock`
/// off this one's, taking [`AGENT_WORK`] over it; returns the timing it
/// reported.
async fn answer_timed(
    relay: &mut RelayStream,
    method: &str,
    status: u32,
    body: &serde_json::Value,
    agent_clock: chrono::TimeDelta,
) -> anyhow::Result<v1::AgentTiming> {
    let id = next_request(relay, method).await?;
    let now = || (chrono::Utc::now() + agent_clock).timestamp_micros();
    let started = now();
    tokio::time::sleep(AGENT_WORK).await;
    let relay_up::Msg::Head(mut response) = head(id, status) else {
        unreachable!("head() makes a head");
    };
    let timing = v1::AgentTiming {
        started_unix_micros: started,
        finished_unix_micros: now(),
    };
    response.timing = Some(timing);
    relay.send(relay_up::Msg::Head(response)).await?;
    relay.send(chunk(id, &body.to_string(), true)).await?;
    Ok(timing)
}

/// kubectl 1.32+ creates in protobuf and the API server answers in
/// protobuf: the client gets the server's bytes as they are, and the object
/// is in the cache before the answer (here the real server's answer to
/// `kubectl create configmap`, recorded).
#[tokio::test]
async fn a_protobuf_answer_to_a_write_is_read_back_at_once() -> anyhow::Result<()> {
    let (sidecar, mut relay, mut cache) = setup().await?;
    let configmaps = kind("", "v1", "configmaps", "ConfigMap", true);
    sync(&mut cache, &configmaps, &[]).await?;
    cache.wait_acked().await?;
    let dir = format!(
        "{}/../kube-sim/fixtures/protobuf",
        env!("CARGO_MANIFEST_DIR")
    );
    let request_body = std::fs::read(format!("{dir}/02-create-configmaps.request.bin"))?;
    let recorded = std::fs::read(format!("{dir}/02-create-configmaps.response.bin"))?;
    let http = http();
    let pb = "application/vnd.kubernetes.protobuf";
    let create = {
        let http = http.clone();
        let url = sidecar.url("/accounts/prod/api/v1/namespaces/fx-proto/configmaps");
        let body = request_body.clone();
        tokio::spawn(async move {
            let req = http::Request::builder()
                .method("POST")
                .uri(url)
                .header("content-type", pb)
                .header(
                    "accept",
                    "application/vnd.kubernetes.protobuf,application/json",
                )
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
            let resp = http.request(req).await?;
            let status = resp.status();
            let content_type = resp.headers()["content-type"].to_str()?.to_owned();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await?
                .to_bytes();
            anyhow::Ok((status, content_type, body))
        })
    };
    let id = next_request(&mut relay, "POST").await?;
    relay
        .send(relay_up::Msg::Head(v1::ResponseHead {
            id,
            status: 201,
            headers: vec![v1::Header {
                name: "Content-Type".into(),
                value: pb.as_bytes().to_vec(),
            }],
            timing: None,
        }))
        .await?;
    relay
        .send(relay_up::Msg::Body(v1::BodyChunk {
            id,
            data: recorded.clone(),
            end_stream: true,
        }))
        .await?;
    let (status, content_type, body) = create.await??;
    assert_eq!(status, 201);
    assert_eq!(content_type, pb);
    assert_eq!(body.as_ref(), recorded.as_slice());
    // No watch event has come: the read is the folded answer.
    let read = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/fx-proto/configmaps/fx-settings"),
    )
    .await?;
    assert_eq!(read.status, 200);
    let want = spinlink_kube_api::protobuf::decode(&recorded)?;
    assert_eq!(read.json()["data"], want["data"]);
    assert_eq!(read.json()["metadata"], want["metadata"]);
    Ok(())
}

#[tokio::test]
async fn writes_are_read_back_at_once_and_operations_are_recorded() -> anyhow::Result<()> {
    let (sidecar, mut relay, mut cache) = setup().await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let pod = |rv: &str, image: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "demo", "resourceVersion": rv},
            "spec": {"containers": [{"name": "c", "image": image}]}})
    };
    sync(&mut cache, &pods, &[pod("10", "one")]).await?;
    cache.wait_acked().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/web");

    // A patch answered by the agent: the next read (from the cache) sees it,
    // although no watch event has come.
    let patch = spawn_request(
        &http,
        "PATCH",
        &url,
        &[
            ("content-type", "application/merge-patch+json"),
            ("kubectl-command", "kubectl patch"),
        ],
        "{}",
    );
    // This agent's clock agrees with the sidecar's.
    let patch_timing = answer_timed(
        &mut relay,
        "PATCH",
        200,
        &pod("11", "two"),
        chrono::TimeDelta::zero(),
    )
    .await?;
    let patched = patch.await??;
    assert_eq!(patched.status, 200);
    assert_eq!(patched.json()["metadata"]["resourceVersion"], "11");
    let read = get(&http, &url).await?;
    assert_eq!(read.json()["spec"]["containers"][0]["image"], "two");
    // The list still claims only what the watch delivered.
    let list = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods"),
    )
    .await?;
    assert_eq!(list.json()["metadata"]["resourceVersion"], "1000");

    // A failed write changes nothing; a finished delete removes it.
    let failed = spawn_request(
        &http,
        "PUT",
        &url,
        &[("content-type", "application/json")],
        "{}",
    );
    // This one's runs an hour behind, the next one's an hour ahead.
    let put_timing = answer_timed(
        &mut relay,
        "PUT",
        409,
        &serde_json::json!({"kind": "Status", "code": 409}),
        -chrono::TimeDelta::hours(1),
    )
    .await?;
    assert_eq!(failed.await??.status, 409);
    assert_eq!(
        get(&http, &url).await?.json()["spec"]["containers"][0]["image"],
        "two"
    );
    let delete = spawn_request(&http, "DELETE", &url, &[], "");
    let delete_timing = answer_timed(
        &mut relay,
        "DELETE",
        200,
        &pod("12", "two"),
        chrono::TimeDelta::hours(1),
    )
    .await?;
    assert_eq!(delete.await??.status, 200);
    assert_eq!(get(&http, &url).await?.status, 404);

    // The history: method, path, status, outcome and the time of each hop.
    let ops = get(&http, &sidecar.url("/v1/accounts/prod/operations"))
        .await?
        .json();
    let ops = ops.as_array().unwrap();
    let summary: Vec<(String, u64, String)> = ops
        .iter()
        .map(|o| {
            (
                o["method"].as_str().unwrap().to_owned(),
                o["status"].as_u64().unwrap(),
                o["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("PATCH".into(), 200, "answered".into()),
            ("PUT".into(), 409, "answered".into()),
            ("DELETE".into(), 200, "answered".into()),
        ]
    );
    let first = &ops[0];
    assert_eq!(first["path"], "/api/v1/namespaces/demo/pods/web");
    assert_eq!(first["kubectlCommand"], "kubectl patch");
    // Every hop, in order, on the sidecar's clock: the agent's times as it
    // reported them when the clocks agree, else moved inside the round trip
    // with the agent's own duration kept. The history comes from the store's
    // journal, which keeps milliseconds: each end is cut to its millisecond,
    // so the duration read back is within one of the reported one.
    let millis = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis();
    for (op, timing, skewed) in [
        (&ops[0], patch_timing, false),
        (&ops[1], put_timing, true),
        (&ops[2], delete_timing, true),
    ] {
        let hops = hop_times(op);
        assert!(hops.is_sorted(), "hops out of order: {op}");
        let (started, finished) = (millis(hops[2]), millis(hops[3]));
        let reported = timing.finished_unix_micros - timing.started_unix_micros;
        assert!(
            ((finished - started) * 1000 - reported).abs() < 1000,
            "the agent's {reported} µs: {op}"
        );
        let reported_start = timing.started_unix_micros.div_euclid(1000);
        assert_eq!(started != reported_start, skewed, "{op}");
    }
    assert_eq!(
        get(&http, &sidecar.url("/v1/accounts/zzz/operations"))
            .await?
            .status,
        404
    );
    sidecar.stop().await
}

#[tokio::test]
async fn agents_are_listed_and_can_be_disconnected() -> anyhow::Result<()> {
    let (sidecar, _relay, mut cache) = setup().await?;
    let http = http();
    let agents = get(&http, &sidecar.url("/v1/agents")).await?.json();
    assert_eq!(agents[0]["identity"], IDENTITY);
    assert_eq!(agents[0]["accounts"][0]["name"], "prod");
    assert_eq!(agents[0]["accounts"][0]["relay"], true);

    let encoded: String = url::form_urlencoded::byte_serialize(IDENTITY.as_bytes()).collect();
    let unknown = request(
        &http,
        "POST",
        &sidecar.url("/v1/agents/nobody/disconnect"),
        &[],
        "",
    )
    .await?;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        get(
            &http,
            &sidecar.url(&format!("/v1/agents/{encoded}/disconnect"))
        )
        .await?
        .status,
        405
    );
    let done = request(
        &http,
        "POST",
        &sidecar.url(&format!("/v1/agents/{encoded}/disconnect")),
        &[],
        "",
    )
    .await?;
    assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.body));
    assert_eq!(done.json()["accounts"], serde_json::json!(["prod"]));
    // The agent's cache stream is ended by the sidecar.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match cache.down.message().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the cache stream stayed open");
    wait_status(&sidecar, "prod", |s| !s.online && !s.relay).await?;
    sidecar.stop().await
}

#[tokio::test]
async fn apply_reads_go_live_plain_reads_come_from_the_cache_and_metrics_say_so()
-> anyhow::Result<()> {
    let (sidecar, mut relay, mut cache) = setup().await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let pod = |rv: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "demo", "resourceVersion": rv}})
    };
    sync(&mut cache, &pods, &[pod("10")]).await?;
    cache.wait_acked().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/web");

    let plain = get(&http, &url).await?;
    assert_eq!(plain.json()["metadata"]["resourceVersion"], "10");
    // kubectl apply reads what it is about to change live: a cache a moment
    // behind would make it compute the wrong patch.
    let live = spawn_request(
        &http,
        "GET",
        &url,
        &[("kubectl-command", "kubectl apply")],
        "",
    );
    let relay_down::Msg::Head(req) = relay.next().await? else {
        anyhow::bail!("apply's GET was not relayed");
    };
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("GET", "/api/v1/namespaces/demo/pods/web")
    );
    relay.send(head(req.id, 200)).await?;
    relay
        .send(chunk(req.id, &pod("11").to_string(), true))
        .await?;
    assert_eq!(live.await??.json()["metadata"]["resourceVersion"], "11");

    let metrics = get(&http, &sidecar.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body);
    let value = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
    };
    let requests = "spinlink_sidecar_facade_requests_total{account=\"prod\",verb=\"get\"";
    assert_eq!(
        value(&format!("{requests},source=\"cache\"}}")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&format!("{requests},source=\"relay\"}}")),
        Some(1.0),
        "{text}"
    );
    let latency = "spinlink_sidecar_relay_duration_seconds";
    assert_eq!(
        value(&format!("{latency}_count{{account=\"prod\"}}")),
        Some(1.0),
        "{text}"
    );
    assert!(
        value(&format!("{latency}_sum{{account=\"prod\"}}")).is_some_and(|s| s > 0.0),
        "{text}"
    );
    sidecar.stop().await
}

#[tokio::test]
async fn a_pod_deleted_gracefully_stays_cached_until_its_watch_event() -> anyhow::Result<()> {
    let (sidecar, mut relay, mut cache) = setup().await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let pod = |rv: &str, deletion: Option<(&str, i64)>| {
        let mut p = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "demo", "resourceVersion": rv}});
        if let Some((at, grace)) = deletion {
            p["metadata"]["deletionTimestamp"] = at.into();
            p["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        }
        p
    };
    sync(&mut cache, &pods, &[pod("10", None)]).await?;
    cache.wait_acked().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/web");

    // The API server answers a graceful delete with the pod, terminating:
    // it is still there (kubectl waits for it to go), as the cache says.
    // Forced (grace period 0), it is gone at once.
    for (answered, grace, read) in [("11", 30, 200), ("12", 0, 404)] {
        let delete = spawn_request(&http, "DELETE", &url, &[], "");
        let terminating = pod(answered, Some(("2026-01-01T00:00:30Z", grace)));
        answer(&mut relay, "DELETE", 200, &terminating).await?;
        assert_eq!(delete.await??.status, 200);
        let after = get(&http, &url).await?;
        assert_eq!(after.status, read, "grace period {grace}");
        if read == 200 {
            assert_eq!(
                after.json()["metadata"]["deletionGracePeriodSeconds"],
                grace
            );
        }
    }
    sidecar.stop().await
}

/// Another agent's identity, granted the same account (by a second
/// gateway replica's policy, say).
const OTHER: &str = "spiffe://spinlink.dev/agent/other";

/// Relays one GET and answers it on `relay` with `body`; returns what the
/// facade client got.
async fn relayed_by(
    sidecar: &Running,
    relay: &mut RelayStream,
    body: &str,
) -> anyhow::Result<Answer> {
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = spawn_request(&http(), "GET", &url, &[], "");
    let id = next_request(relay, "GET").await?;
    relay.send(head(id, 200)).await?;
    relay.send(chunk(id, body, true)).await?;
    client.await?
}

#[tokio::test]
async fn a_newer_relay_stream_of_the_same_identity_serves_and_its_close_restores_the_older()
-> anyhow::Result<()> {
    // The agent moving connections: a second relay stream opens before
    // the first closes — or the second breaks first.
    let (sidecar, mut first, _cache) = setup().await?;
    let account = sidecar.accounts.get("prod").expect("prod");
    let serving = || account.relay().map(|r| r.serial());
    let first_serial = serving();
    let mut client = sidecar.client().await?;
    let mut second = RelayStream::open(&mut client, "prod").await?;
    assert_ne!(serving(), first_serial, "the newer stream serves");
    let answer = relayed_by(&sidecar, &mut second, "from the second").await?;
    assert_eq!(answer.body, "from the second");

    // The second goes; the first is still open and serves again.
    drop(second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while serving() != first_serial {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first relay stream, still open, does not serve again: {:?}",
            sidecar.accounts.status("prod")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = relayed_by(&sidecar, &mut first, "from the first").await?;
    assert_eq!(
        (answer.status, &answer.body[..]),
        (200, &b"from the first"[..])
    );
    assert!(sidecar.accounts.status("prod").is_some_and(|s| s.relay));

    // With both gone there is no relay.
    drop(first);
    wait_status(&sidecar, "prod", |s| !s.relay).await?;
    sidecar.stop().await
}

#[tokio::test]
async fn another_identity_never_replaces_open_streams() -> anyhow::Result<()> {
    let (sidecar, mut relay, cache) = setup().await?;
    let mut client = sidecar.client().await?;
    let refused = RelayStream::open_as(&mut client, "prod", OTHER)
        .await
        .err()
        .expect("another identity's relay stream replaced the open one");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("another agent identity")
            && !refused.message().contains(IDENTITY),
        "the refused agent is not told who holds the account: {refused:?}"
    );
    let refused = CacheStream::open_as(&mut client, "prod", OTHER, 1, &[])
        .await
        .err()
        .expect("another identity's cache stream was taken");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let status = sidecar.accounts.status("prod").expect("prod");
    assert_eq!(
        (status.agent_identity.as_str(), status.cache_streams),
        (IDENTITY, 1)
    );
    assert_eq!(
        metric(
            &sidecar,
            r#"spinlink_sidecar_tunnel_refused_total{reason="account_held"}"#
        )
        .await?,
        2.0
    );
    // The holder's relay still serves.
    let answer = relayed_by(&sidecar, &mut relay, "holder").await?;
    assert_eq!(answer.body, "holder");

    // Once the holder's streams have all closed, the account may move to
    // the other identity (a redeployed agent with a new certificate).
    drop(relay);
    drop(cache);
    wait_status(&sidecar, "prod", |s| !s.relay && !s.online).await?;
    let mut moved = RelayStream::open_as(&mut client, "prod", OTHER).await?;
    let _cache = CacheStream::open_as(&mut client, "prod", OTHER, 1, &[]).await?;
    wait_status(&sidecar, "prod", |s| s.online && s.agent_identity == OTHER).await?;
    let answer = relayed_by(&sidecar, &mut moved, "moved").await?;
    assert_eq!(answer.body, "moved");
    sidecar.stop().await
}
