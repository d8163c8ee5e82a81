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
async fn relay_stream_gone_fails_waiting_requests_with_503() -> anyhow::Result<()> {
    let (sidecar, mut relay, _cache) = setup().await?;
    let http = http();
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/p/log");
    let client = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move { get(&http, &url).await })
    };
    let relay_down::Msg::Head(_) = relay.next().await? else {
        panic!("expected a request head");
    };
    drop(relay);
    let answer = client.await??;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.json()["reason"], "ServiceUnavailable");
    wait_status(&sidecar, "prod", |s| !s.relay).await?;
    let after = get(&http, &url).await?;
    assert_eq!(after.status, 503);
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
