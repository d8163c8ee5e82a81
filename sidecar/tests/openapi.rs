//! OpenAPI through the facade: the first GET of a document is relayed down
//! the agent's `Relay` stream (played here), later ones are served from the
//! sidecar's memory, a changed discovery snapshot sends the next GET to the
//! agent again, and a stale account keeps being served with a warning.

mod common;

use common::*;
use spinlink_proto::v1::{self, cache_up, relay_down, relay_up};

const PB: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const PB_ANSWERED: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

fn discovery(groups: &str) -> cache_up::Msg {
    cache_up::Msg::Discovery(v1::DiscoverySnapshot {
        documents: vec![v1::Document {
            path: "/apis".into(),
            content_type: "application/json".into(),
            body: format!(r#"{{"kind":"APIGroupList","groups":[{groups}]}}"#).into_bytes(),
        }],
    })
}

/// Answers the next relayed request with `body`; returns its path and query.
async fn answer(
    relay: &mut RelayStream,
    content_type: &str,
    body: &str,
) -> anyhow::Result<(String, String)> {
    let relay_down::Msg::Head(req) = relay.next().await? else {
        anyhow::bail!("expected a request head");
    };
    relay
        .send(relay_up::Msg::Head(v1::ResponseHead {
            id: req.id,
            status: 200,
            headers: vec![
                v1::Header {
                    name: "Content-Type".into(),
                    value: content_type.as_bytes().to_vec(),
                },
                v1::Header {
                    name: "ETag".into(),
                    value: format!("\"{}\"", body.len()).into_bytes(),
                },
            ],
            timing: None,
        }))
        .await?;
    // Two chunks: the facade reads the document whole before keeping it.
    let (a, b) = body.split_at(body.len() / 2);
    for (data, end) in [(a, false), (b, true)] {
        relay
            .send(relay_up::Msg::Body(v1::BodyChunk {
                id: req.id,
                data: data.as_bytes().to_vec(),
                end_stream: end,
            }))
            .await?;
    }
    Ok((req.path, req.query))
}

/// A sidecar (with `extra` config) whose account "prod" is online: the
/// agent's cache stream, with a discovery snapshot acknowledged, and its
/// relay stream, both played here.
async fn online(extra: &str) -> anyhow::Result<(Running, CacheStream, RelayStream)> {
    let sidecar = start_with(extra).await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let relay = RelayStream::open(&mut client, "prod").await?;
    cache.send(discovery("")).await?;
    cache.wait_acked().await?;
    wait_status(&sidecar, "prod", |s| s.relay && s.online && s.discovery).await?;
    Ok((sidecar, cache, relay))
}

fn counted(metrics: &str, source: &str) -> u64 {
    let prefix = format!(
        "spinlink_sidecar_facade_requests_total{{account=\"prod\",verb=\"openapi\",source=\"{source}\"}}"
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn openapi_is_fetched_once_and_refetched_after_a_crd_change() -> anyhow::Result<()> {
    // A relayed GET nobody answers fails after a second: a GET that was
    // meant to come from memory cannot pass by waiting on the agent.
    let (sidecar, mut cache, mut relay) = online(", relayTimeoutSeconds: 1").await?;
    let http = http();
    let v2 = sidecar.url("/accounts/prod/openapi/v2");
    let json = [("accept", "application/json")];
    let v2_json = r#"{"swagger":"2.0","info":{"title":"Kubernetes"}}"#;

    // First GET: relayed, kept.
    let first = tokio::spawn({
        let (http, v2) = (http.clone(), v2.clone());
        async move { request(&http, "GET", &v2, &json, "").await }
    });
    let (path, _) = answer(&mut relay, "application/json", v2_json).await?;
    assert_eq!(path, "/openapi/v2");
    let first = first.await??;
    assert_eq!((first.status, &first.body[..]), (200, v2_json.as_bytes()));

    // Second GET: from memory, with the document's headers.
    let second = request(&http, "GET", &v2, &json, "").await?;
    assert_eq!((second.status, &second.body[..]), (200, v2_json.as_bytes()));
    assert_eq!(second.headers["content-type"], "application/json");
    let etag = second.headers["etag"].to_str()?.to_owned();
    let again = request(
        &http,
        "GET",
        &v2,
        &[("accept", "application/json"), ("if-none-match", &etag)],
        "",
    )
    .await?;
    assert_eq!(again.status, 304);

    // Protobuf is another document: relayed once too.
    let pb = tokio::spawn({
        let (http, v2) = (http.clone(), v2.clone());
        async move { request(&http, "GET", &v2, &[("accept", PB)], "").await }
    });
    answer(&mut relay, PB_ANSWERED, "\u{a}\u{3}2.0-protobuf").await?;
    assert_eq!(pb.await??.headers["content-type"], PB_ANSWERED);
    let pb = request(&http, "GET", &v2, &[("accept", PB)], "").await?;
    assert_eq!((pb.status, &pb.body[..]), (200, &b"\n\x032.0-protobuf"[..]));

    // A v3 document named by hash, and the v3 index.
    let apps = sidecar.url("/accounts/prod/openapi/v3/apis/apps/v1?hash=ABC123");
    let index = sidecar.url("/accounts/prod/openapi/v3");
    for (url, body) in [
        (&apps, r#"{"openapi":"3.0.0"}"#),
        (&index, r#"{"paths":{}}"#),
    ] {
        let got = tokio::spawn({
            let (http, url) = (http.clone(), url.clone());
            async move { get(&http, &url).await }
        });
        answer(&mut relay, "application/json", body).await?;
        assert_eq!(got.await??.body, body.as_bytes());
        assert_eq!(get(&http, url).await?.body, body.as_bytes());
    }

    // The same snapshot again (an agent reconnecting sends it): still cached.
    cache.send(discovery("")).await?;
    cache.wait_acked().await?;
    assert_eq!(request(&http, "GET", &v2, &json, "").await?.status, 200);

    // A CRD was added: the next v2 and index GETs go to the agent again;
    // the hash document stays.
    cache.send(discovery(r#"{"name":"example.com"}"#)).await?;
    cache.wait_acked().await?;
    assert_eq!(
        get(&http, &apps).await?.body,
        r#"{"openapi":"3.0.0"}"#.as_bytes()
    );
    let v2_crd = r#"{"swagger":"2.0","definitions":{"com.example.v1.Widget":{}}}"#;
    let refetched = tokio::spawn({
        let (http, v2) = (http.clone(), v2.clone());
        async move { request(&http, "GET", &v2, &json, "").await }
    });
    answer(&mut relay, "application/json", v2_crd).await?;
    assert_eq!(refetched.await??.body, v2_crd.as_bytes());
    assert_eq!(
        request(&http, "GET", &v2, &json, "").await?.body,
        v2_crd.as_bytes()
    );
    let index_again = tokio::spawn({
        let (http, index) = (http.clone(), index.clone());
        async move { get(&http, &index).await }
    });
    answer(
        &mut relay,
        "application/json",
        r#"{"paths":{"apis/example.com/v1":{}}}"#,
    )
    .await?;
    assert_eq!(index_again.await??.status, 200);

    let metrics = get(&http, &sidecar.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    // Relayed: v2 JSON, protobuf, apps, index, v2 JSON and index again.
    assert_eq!(counted(&text, "relay"), 6, "{text}");
    // From memory: v2 JSON twice (one 304), protobuf, apps twice, index,
    // v2 JSON after the same snapshot and after the CRD.
    assert_eq!(counted(&text, "cache"), 8, "{text}");
    let bytes: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("spinlink_sidecar_openapi_cache_bytes ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(bytes > v2_crd.len() as u64, "{text}");

    // The agent goes away (both its streams end): the kept documents are
    // still served, marked stale.
    drop(cache);
    drop(relay);
    wait_status(&sidecar, "prod", |s| !s.online && !s.relay).await?;
    let stale = request(&http, "GET", &v2, &json, "").await?;
    assert_eq!((stale.status, &stale.body[..]), (200, v2_crd.as_bytes()));
    let warning = stale.headers["warning"].to_str()?;
    assert!(
        warning.starts_with("299 ") && warning.contains("offline"),
        "{warning}"
    );
    // What was never fetched needs the agent: refused.
    let unknown = get(&http, &sidecar.url("/accounts/prod/openapi/v3/api/v1")).await?;
    assert_eq!(unknown.status, 503);
    sidecar.stop().await
}

#[tokio::test]
async fn concurrent_first_gets_relay_a_document_once() -> anyhow::Result<()> {
    let (sidecar, _cache, mut relay) = online("").await?;
    let http = http();
    let v3 = sidecar.url("/accounts/prod/openapi/v3");
    let doc = r#"{"paths":{"api/v1":{}}}"#;

    // Eight kubectl processes at once, none of them answered yet.
    let gets: Vec<_> = (0..8)
        .map(|_| {
            let (http, v3) = (http.clone(), v3.clone());
            tokio::spawn(async move { get(&http, &v3).await })
        })
        .collect();
    let (path, _) = answer(&mut relay, "application/json", doc).await?;
    assert_eq!(path, "/openapi/v3");
    for answered in gets {
        let answered = answered.await??;
        assert_eq!((answered.status, &answered.body[..]), (200, doc.as_bytes()));
    }
    // Nothing else went down the relay stream.
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), relay.next())
            .await
            .is_err(),
        "a second relay of the same document"
    );
    let metrics = get(&http, &sidecar.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert_eq!(counted(&text, "relay"), 1, "{text}");
    assert_eq!(counted(&text, "cache"), 7, "{text}");
    sidecar.stop().await
}
