//! WATCH served from the cache. Through a running sidecar, with an agent
//! played here: the watch never reaches the agent's relay stream, events come
//! in order with selectors applied, a re-listing that dropped an object
//! gives DELETED, and a resourceVersion older than the history gives the
//! 410 ERROR event. In process with the clock paused: bookmarks,
//! `timeoutSeconds`, `sendInitialEvents`, Tables, and a watcher too slow for
//! the history.

mod common;

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use spinlink_proto::v1::{self, cache_up, relay_down};
use spinlink_sidecar::Accounts;
use spinlink_sidecar::cache::Cache;
use spinlink_sidecar::facade::Facade;
use spinlink_sidecar::http::body::Body;

fn pod(ns: &str, name: &str, rv: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "c"}], "nodeName": "node-1"},
        "status": {"phase": "Running"},
    })
}

fn event(ty: v1::watch_event::Type, kind: &v1::Kind, object: &Value) -> v1::WatchEvent {
    v1::WatchEvent {
        r#type: ty as i32,
        kind: Some(kind.clone()),
        resource_version: object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        object: serde_json::to_vec(object).unwrap(),
    }
}

/// A watch response read line by line.
struct Lines<B> {
    body: B,
    buf: Vec<u8>,
    /// How long to wait for a line (beyond any bookmark interval or
    /// timeout a test waits for on the paused clock).
    patience: Duration,
}

impl<B> Lines<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    /// The next event, or `None` when the stream ended.
    async fn next(&mut self) -> anyhow::Result<Option<Value>> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(serde_json::from_slice(&line)?));
            }
            let frame = tokio::time::timeout(self.patience, self.body.frame())
                .await
                .context("no watch event")?;
            match frame {
                None => {
                    anyhow::ensure!(self.buf.is_empty(), "a partial line at the end");
                    return Ok(None);
                }
                Some(Err(e)) => anyhow::bail!("watch body failed: {e:?}"),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    async fn event(&mut self) -> anyhow::Result<(String, Value)> {
        let e = self.next().await?.context("the watch ended")?;
        Ok((
            e["type"].as_str().unwrap_or_default().to_owned(),
            e["object"].clone(),
        ))
    }
}

/// `TYPE name@rv` of an event, for comparing sequences.
fn short((ty, object): &(String, Value)) -> String {
    format!(
        "{ty} {}@{}",
        object["metadata"]["name"].as_str().unwrap_or_default(),
        object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
    )
}

async fn open(
    client: &HttpClient,
    url: &str,
) -> anyhow::Result<(u16, Lines<hyper::body::Incoming>)> {
    let req = http::Request::get(url).body(Full::new(Bytes::new()))?;
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .context("facade did not answer")??;
    Ok((
        resp.status().as_u16(),
        Lines {
            body: resp.into_body(),
            buf: Vec::new(),
            patience: Duration::from_secs(20),
        },
    ))
}

#[tokio::test]
async fn watches_are_served_from_the_cache_without_the_agent() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let mut relay = RelayStream::open(&mut client, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(
        &mut cache,
        &pods,
        &[
            pod("demo", "web-1", "11", json!({"app": "web"})),
            pod("demo", "web-2", "12", json!({"app": "web"})),
            pod("demo", "db-0", "13", json!({"app": "db"})),
        ],
    )
    .await?;
    cache.wait_acked().await?;
    let http = http();
    let url = |q: &str| sidecar.url(&format!("/accounts/prod/api/v1/namespaces/demo/pods?{q}"));

    // From the current state: synthetic ADDED for what the selector takes.
    let (status, mut web) = open(&http, &url("watch=1&labelSelector=app%3Dweb")).await?;
    assert_eq!(status, 200);
    assert_eq!(short(&web.event().await?), "ADDED web-1@11");
    assert_eq!(short(&web.event().await?), "ADDED web-2@12");
    // After the list's resourceVersion, one name, as `kubectl delete` waits.
    let (_, mut one) = open(
        &http,
        &url("watch=true&resourceVersion=1000&allowWatchBookmarks=true&fieldSelector=metadata.name%3Dweb-1"),
    )
    .await?;
    // All namespaces.
    let (_, mut all) = open(
        &http,
        &sidecar.url("/accounts/prod/api/v1/pods?watch=1&resourceVersion=1000"),
    )
    .await?;

    use v1::watch_event::Type::*;
    let send = |ty, o: Value| cache_up::Msg::Event(event(ty, &pods, &o));
    cache
        .send(send(
            Modified,
            pod("demo", "web-1", "1001", json!({"app": "web", "v": "2"})),
        ))
        .await?;
    cache
        .send(send(
            Added,
            pod("other", "web-9", "1002", json!({"app": "web"})),
        ))
        .await?;
    // web-2 stops matching app=web: DELETED for that watcher.
    cache
        .send(send(
            Modified,
            pod("demo", "web-2", "1003", json!({"app": "api"})),
        ))
        .await?;
    cache
        .send(send(
            Deleted,
            pod("demo", "web-1", "1004", json!({"app": "web"})),
        ))
        .await?;
    cache.wait_acked().await?;

    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(short(&web.event().await?));
    }
    assert_eq!(
        got,
        [
            "MODIFIED web-1@1001",
            "DELETED web-2@1003",
            "DELETED web-1@1004"
        ]
    );
    assert_eq!(short(&one.event().await?), "MODIFIED web-1@1001");
    assert_eq!(short(&one.event().await?), "DELETED web-1@1004");
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(short(&all.event().await?));
    }
    assert_eq!(
        got,
        [
            "MODIFIED web-1@1001",
            "ADDED web-9@1002",
            "MODIFIED web-2@1003",
            "DELETED web-1@1004"
        ]
    );
    // Objects are shaped as the cache's LIST gives them, with the `kind`
    // and `apiVersion` a typed LIST leaves out of its items and a watch
    // event carries (recorded: `watch/configmaps.watch.jsonl`,
    // `authz/impersonate-list-allowed`).
    let list = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/other/pods"),
    )
    .await?;
    let (_, mut from_start) = open(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/other/pods?watch=1"),
    )
    .await?;
    let mut item = list.json()["items"][0].clone();
    assert_eq!(item.get("kind"), None, "{item}");
    item["kind"] = "Pod".into();
    item["apiVersion"] = "v1".into();
    assert_eq!(from_start.event().await?.1, item);

    // The agent re-lists (it reconnected): web-2 changed, db-0 is gone.
    cache
        .send(cache_up::Msg::SyncStart(v1::SyncStart {
            kind: Some(pods.clone()),
        }))
        .await?;
    for o in [
        pod("demo", "web-2", "1010", json!({"app": "api"})),
        // Unchanged: nothing for watchers.
        pod("other", "web-9", "1002", json!({"app": "web"})),
    ] {
        cache.send(added(&pods, &o)).await?;
    }
    cache
        .send(cache_up::Msg::SyncEnd(v1::SyncEnd {
            kind: Some(pods.clone()),
            resource_version: "1020".into(),
        }))
        .await?;
    cache.wait_acked().await?;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(short(&all.event().await?));
    }
    assert_eq!(got, ["MODIFIED web-2@1010", "DELETED db-0@13"]);

    // Older than the history: the real server's 410 ERROR event, and the end.
    let (status, mut old) = open(&http, &url("watch=1&resourceVersion=5")).await?;
    assert_eq!(status, 200);
    let (ty, object) = old.event().await?;
    assert_eq!(ty, "ERROR");
    assert_eq!(object["kind"], "Status");
    assert_eq!(object["code"], 410);
    assert_eq!(object["reason"], "Expired");
    assert_eq!(object["message"], "too old resource version: 5 (1000)");
    assert!(old.next().await?.is_none());

    // None of these reached the agent: the first thing relayed is this.
    let relayed = tokio::spawn({
        let http = http.clone();
        let url = sidecar.url("/accounts/prod/api/v1/configmaps");
        async move { get(&http, &url).await }
    });
    match relay.next().await? {
        relay_down::Msg::Head(head) => assert_eq!(head.path, "/api/v1/configmaps"),
        other => panic!("expected the configmaps request, got {other:?}"),
    }
    relayed.abort();
    // An uncached kind's watch is still relayed.
    let relayed = tokio::spawn({
        let http = http.clone();
        let url = sidecar.url("/accounts/prod/api/v1/configmaps?watch=1");
        async move { get(&http, &url).await }
    });
    loop {
        if let relay_down::Msg::Head(head) = relay.next().await? {
            assert_eq!(
                (head.path.as_str(), head.query.as_str()),
                ("/api/v1/configmaps", "watch=1")
            );
            break;
        }
    }
    relayed.abort();

    let metrics = get(&http, &sidecar.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(r#"spinlink_sidecar_facade_requests_total{account="prod",verb="watch",source="cache"} 5"#),
        "{text}"
    );
    assert!(
        text.contains(r#"spinlink_sidecar_facade_requests_total{account="prod",verb="watch",source="relay"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"spinlink_sidecar_cache_watches_expired_total{account="prod"} 1"#),
        "{text}"
    );
    drop((web, one, all, from_start));
    sidecar.stop().await
}

/// An account online in `accounts` with pods synced at resourceVersion 10.
fn account_with_pods(accounts: &Accounts, history: usize) -> v1::Kind {
    let account = accounts.get_or_create("prod");
    account.cache_opened("spiffe://test/agent");
    let pods = kind("", "v1", "pods", "Pod", true);
    let mut cache = account.write_cache();
    *cache = Cache::with_history(history);
    cache.sync_start(&pods);
    for (name, rv) in [("a", "4"), ("b", "5")] {
        cache
            .apply(&event(
                v1::watch_event::Type::Added,
                &pods,
                &pod("demo", name, rv, json!({})),
            ))
            .unwrap();
    }
    cache.sync_end(&pods, "10");
    pods
}

async fn watch(facade: &Facade, query: &str, accept: &str) -> (u16, Lines<Body>) {
    let req = http::Request::get(format!(
        "/accounts/prod/api/v1/namespaces/demo/pods?{query}"
    ))
    .header("accept", accept)
    .body(Full::new(Bytes::new()))
    .unwrap();
    let resp = facade.handle(req).await;
    (
        resp.status().as_u16(),
        Lines {
            body: resp.into_body(),
            buf: Vec::new(),
            patience: Duration::from_secs(3600),
        },
    )
}

#[tokio::test(start_paused = true)]
async fn bookmarks_timeouts_and_initial_events() -> anyhow::Result<()> {
    let accounts = Accounts::new();
    account_with_pods(&accounts, 100);
    let facade = Facade::new(accounts.clone(), Duration::from_secs(5));
    let started = tokio::time::Instant::now();

    // Bookmarks every minute carry the cache's resourceVersion; the
    // stream ends cleanly at timeoutSeconds.
    let (status, mut w) = watch(
        &facade,
        "watch=1&resourceVersion=10&allowWatchBookmarks=true&timeoutSeconds=150",
        "application/json",
    )
    .await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        let (ty, object) = w.event().await?;
        assert_eq!(ty, "BOOKMARK");
        assert_eq!(
            object,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}})
        );
    }
    assert!(w.next().await?.is_none());
    assert_eq!(started.elapsed(), Duration::from_secs(150));

    // sendInitialEvents: the objects, then the initial-events-end bookmark.
    let (_, mut w) = watch(
        &facade,
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
        "application/json",
    )
    .await;
    assert_eq!(short(&w.event().await?), "ADDED a@4");
    assert_eq!(short(&w.event().await?), "ADDED b@5");
    let (ty, object) = w.event().await?;
    assert_eq!(ty, "BOOKMARK");
    assert_eq!(object["metadata"]["resourceVersion"], "10");
    assert_eq!(
        object["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(w.next().await?.is_none());

    // kubectl get -w: one-row Tables.
    let (_, mut w) = watch(
        &facade,
        "watch=1&resourceVersion=0&timeoutSeconds=1",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    let (ty, table) = w.event().await?;
    assert_eq!(ty, "ADDED");
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(table["rows"][0]["cells"][0], "a");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_watcher_too_slow_for_the_history_gets_410() -> anyhow::Result<()> {
    let accounts = Accounts::new();
    let pods = account_with_pods(&accounts, 16);
    let facade = Facade::new(accounts.clone(), Duration::from_secs(5));
    let (_, mut slow) = watch(&facade, "watch=1&resourceVersion=10", "application/json").await;
    // The cache goes on without waiting for the watcher.
    let account = accounts.get("prod").unwrap();
    for rv in 11..=200 {
        account
            .write_cache()
            .apply(&event(
                v1::watch_event::Type::Added,
                &pods,
                &pod("demo", &format!("p{rv}"), &rv.to_string(), json!({})),
            ))
            .unwrap();
    }
    assert_eq!(account.read_cache().history().len(), 16);
    let mut last = None;
    while let Some(e) = slow.next().await? {
        last = Some(e);
    }
    let last = last.context("no event at all")?;
    assert_eq!(last["type"], "ERROR");
    assert_eq!(last["object"]["code"], 410);
    assert_eq!(last["object"]["reason"], "Expired");
    Ok(())
}
