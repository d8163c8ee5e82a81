//! The cache path end to end: an agent (played here) streams discovery, a
//! listing and events; the accounts API shows the account synced; the facade
//! answers GET/LIST with selectors, Tables and Kubernetes-shaped errors.

mod common;

use anyhow::Context as _;
use common::*;
use serde_json::{Value, json};
use spinlink_proto::v1::{self, cache_up};

fn pod(ns: &str, name: &str, rv: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "c"}], "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    })
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn listing_events_and_queries() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let deployments = kind("apps", "v1", "deployments", "Deployment", true);

    cache
        .send(cache_up::Msg::Discovery(v1::DiscoverySnapshot {
            documents: vec![v1::Document {
                path: "/api".into(),
                content_type: "application/json".into(),
                body: br#"{"kind":"APIVersions","versions":["v1"]}"#.to_vec(),
            }],
        }))
        .await?;
    sync(
        &mut cache,
        &pods,
        &[
            pod(
                "demo",
                "web-2",
                "12",
                json!({"app": "web", "tier": "front"}),
            ),
            pod("demo", "web-1", "11", json!({"app": "web", "tier": "back"})),
            pod("demo", "db-0", "13", json!({"app": "db"})),
            pod("other", "web-9", "14", json!({"app": "web"})),
        ],
    )
    .await?;
    sync(
        &mut cache,
        &deployments,
        &[
            json!({"metadata": {"name": "web", "namespace": "demo", "resourceVersion": "20"},
                 "spec": {"replicas": 2}, "status": {"readyReplicas": 1}}),
        ],
    )
    .await?;
    // A delete after the listing, and a stale replay that must not resurrect data.
    cache
        .send(cache_up::Msg::Event(v1::WatchEvent {
            r#type: v1::watch_event::Type::Deleted as i32,
            kind: Some(pods.clone()),
            resource_version: "30".into(),
            object: serde_json::to_vec(&pod("other", "web-9", "30", json!({})))?,
        }))
        .await?;
    cache
        .send(added(
            &pods,
            &pod("demo", "web-1", "5", json!({"stale": "yes"})),
        ))
        .await?;
    cache.wait_acked().await?;

    let http = http();
    let status = get(&http, &sidecar.url("/v1/accounts/prod")).await?;
    assert_eq!(status.status, 200);
    let st = status.json();
    assert_eq!(st["online"], true);
    assert_eq!(st["kindsSynced"], 2);
    assert_eq!(st["kindsTotal"], 2);
    assert_eq!(st["objects"], 4);
    assert_eq!(st["discovery"], true);
    assert_eq!(st["relay"], false);
    assert_eq!(st["agentIdentity"], IDENTITY);
    let all = get(&http, &sidecar.url("/v1/accounts")).await?.json();
    assert_eq!(all.as_array().unwrap().len(), 1);

    // Discovery exactly as sent; aggregated requests get it as plain JSON.
    let d = request(
        &http,
        "GET",
        &sidecar.url("/accounts/prod/api"),
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )],
        "",
    )
    .await?;
    assert_eq!(d.status, 200);
    assert_eq!(d.headers["content-type"], "application/json");
    assert_eq!(d.json()["kind"], "APIVersions");
    // Aggregated discovery alone, where the API server cannot write it:
    // its 406, byte for byte, from the cache as from the server.
    for path in ["/accounts/prod/api/v1", "/accounts/prod/api/v1/pods"] {
        let r = request(
            &http,
            "GET",
            &sidecar.url(path),
            &[(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )],
            "",
        )
        .await?;
        assert_eq!(r.status, 406, "{path}");
        let want = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../kube-sim/fixtures/errors/406-aggregated-discovery-api-v1.json"
        ))?;
        assert_eq!(r.body, want, "{path}");
    }

    // LIST, all namespaces, sorted by namespace/name, stale replay ignored.
    let list = get(&http, &sidecar.url("/accounts/prod/api/v1/pods?limit=500")).await?;
    assert_eq!(list.status, 200);
    assert_eq!(list.headers["content-type"], "application/json");
    let list = list.json();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["metadata"]["resourceVersion"], "1000");
    assert_eq!(names(&list), ["demo/db-0", "demo/web-1", "demo/web-2"]);
    assert!(
        list["items"][1]["metadata"]["labels"]
            .get("stale")
            .is_none()
    );

    // Selectors.
    let q = |s: &str| sidecar.url(&format!("/accounts/prod/api/v1/namespaces/demo/pods?{s}"));
    let l = get(&http, &q("labelSelector=app%3Dweb%2Ctier%20in%20(front)"))
        .await?
        .json();
    assert_eq!(names(&l), ["demo/web-2"]);
    let l = get(&http, &q("labelSelector=app!%3Dweb")).await?.json();
    assert_eq!(names(&l), ["demo/db-0"]);
    let l = get(&http, &q("labelSelector=!tier")).await?.json();
    assert_eq!(names(&l), ["demo/db-0"]);
    let l = get(&http, &q("labelSelector=tier,app%20notin%20(db)"))
        .await?
        .json();
    assert_eq!(names(&l), ["demo/web-1", "demo/web-2"]);
    let l = get(&http, &q("fieldSelector=metadata.name%3Dweb-1"))
        .await?
        .json();
    assert_eq!(names(&l), ["demo/web-1"]);
    let l = get(
        &http,
        &q("fieldSelector=metadata.name!%3Dweb-1,status.phase%3DRunning"),
    )
    .await?
    .json();
    assert_eq!(names(&l), ["demo/db-0", "demo/web-2"]);

    // Bad selectors: 400 worded like the API server.
    let bad = get(&http, &q("labelSelector=app%20in%20(")).await?;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json(), fixture("errors/400-badselector.json"));
    let bad = get(&http, &q("fieldSelector=spec.foo%3D1")).await?;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json(), fixture("errors/400-badfieldselector.json"));

    // GET one; NotFound shaped like the server's.
    let one = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/web-1"),
    )
    .await?;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["metadata"]["resourceVersion"], "11");
    let gone = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/other/pods/web-9"),
    )
    .await?;
    assert_eq!(gone.status, 404);
    let nope = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/nope"),
    )
    .await?;
    assert_eq!(nope.status, 404);
    assert_eq!(nope.json(), fixture("errors/404-notfound.json"));
    let dep = get(
        &http,
        &sidecar.url("/accounts/prod/apis/apps/v1/namespaces/demo/deployments/web"),
    )
    .await?;
    assert_eq!(dep.json()["kind"], "Deployment");
    assert_eq!(dep.json()["apiVersion"], "apps/v1");

    // Tables, as kubectl asks.
    let table = request(
        &http,
        "GET",
        &sidecar.url("/accounts/prod/apis/apps/v1/deployments"),
        &[("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")],
        "",
    )
    .await?
    .json();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"][0]["cells"][0], "web");
    assert_eq!(table["rows"][0]["cells"][1], "1/2");
    assert_eq!(table["rows"][0]["object"]["metadata"]["namespace"], "demo");

    // Unknown account; known account without relay for what the cache cannot answer.
    let unknown = get(&http, &sidecar.url("/accounts/nope/api/v1/pods")).await?;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["reason"], "NotFound");
    let unavailable = get(&http, &sidecar.url("/accounts/prod/api/v1/configmaps")).await?;
    assert_eq!(unavailable.status, 503);
    assert_eq!(unavailable.json()["reason"], "ServiceUnavailable");
    let watch = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/configmaps?watch=true"),
    )
    .await?;
    assert_eq!(watch.status, 503, "watches of kinds not cached are relayed");

    // The stream ends: offline, the cache is kept.
    drop(cache);
    wait_status(&sidecar, "prod", |s| !s.online).await?;
    let still = get(&http, &sidecar.url("/accounts/prod/api/v1/pods")).await?;
    assert_eq!(names(&still.json()).len(), 3);
    sidecar.stop().await
}

#[tokio::test]
async fn streams_are_checked() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;

    // No verified headers.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(v1::CacheUp { seq: 1, msg: None }).await?;
    let err = client
        .cache(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    // First message not open, or open for another account.
    for first in [
        cache_up::Msg::Heartbeat(v1::Heartbeat {
            unix_millis: 1,
            ..Default::default()
        }),
        cache_up::Msg::Open(v1::CacheOpen {
            account: "other".into(),
            agent_id: "x".into(),
            ..v1::CacheOpen::default()
        }),
    ] {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(v1::CacheUp {
            seq: 1,
            msg: Some(first),
        })
        .await?;
        let err = client
            .cache(with_headers(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                "prod",
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    let err = client.hello(v1::HelloRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(sidecar.accounts.status("prod").is_none());
    sidecar.stop().await
}

/// What a client's HTTP cache may do with the facade's answers, as the API
/// server said for the same requests (`kube-sim/fixtures`): kubectl keeps
/// answers in its disk cache, and its version dispatcher takes `/version`
/// from there unless told to ask again (`no-cache`); aggregated discovery
/// carries the server's `Etag`, and asking again with it gets `304` as
/// `ServeHTTPWithETag` answers (k8s.io/apiserver/pkg/endpoints/discovery/
/// aggregated/etag.go; no 304 was recorded).
#[tokio::test]
async fn answers_tell_client_caches_what_the_api_server_tells_them() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let discovery = |file: &str| -> anyhow::Result<Vec<u8>> {
        Ok(std::fs::read(format!(
            "{}/../kube-sim/fixtures/discovery/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))?)
    };
    cache
        .send(cache_up::Msg::Discovery(v1::DiscoverySnapshot {
            documents: vec![
                v1::Document {
                    path: "/version".into(),
                    content_type: "application/json".into(),
                    body: discovery("version.json")?,
                },
                v1::Document {
                    path: format!("/api{}", spinlink_proto::aggregated::PATH_SUFFIX),
                    content_type: spinlink_proto::aggregated::ACCEPT.into(),
                    body: discovery("api.aggregated.json")?,
                },
            ],
        }))
        .await?;
    sync(&mut cache, &kind("", "v1", "pods", "Pod", true), &[]).await?;
    cache.wait_acked().await?;
    let http = http();
    for path in ["/version", "/api"] {
        let entry = recorded_request(|e| e["method"] == "GET" && e["path"] == path);
        let accept = recorded_header(&entry["request_headers"], "Accept").unwrap();
        let answer = request(
            &http,
            "GET",
            &sidecar.url(&format!("/accounts/prod{path}")),
            &[("accept", accept)],
            "",
        )
        .await?;
        assert_eq!(answer.status, 200, "{path}");
        for name in ["Cache-Control", "Vary", "Etag"] {
            assert_eq!(
                answer.headers.get(name).map(|v| v.to_str().unwrap()),
                recorded_header(&entry["response_headers"], name),
                "{name} of {path}"
            );
        }
    }
    let api = recorded_request(|e| e["method"] == "GET" && e["path"] == "/api");
    let accept = recorded_header(&api["request_headers"], "Accept").unwrap();
    let etag = recorded_header(&api["response_headers"], "Etag").unwrap();
    let again = request(
        &http,
        "GET",
        &sidecar.url("/accounts/prod/api"),
        &[("accept", accept), ("if-none-match", etag)],
        "",
    )
    .await?;
    assert_eq!(again.status, 304);
    assert!(again.body.is_empty());
    assert!(again.headers.get("content-type").is_none());
    for name in ["Cache-Control", "Vary", "Etag"] {
        assert_eq!(
            again.headers.get(name).map(|v| v.to_str().unwrap()),
            recorded_header(&api["response_headers"], name),
            "{name} of the 304"
        );
    }
    // A Status the facade answers itself: as the server's 404.
    let missing = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods/nope"),
    )
    .await?;
    assert_eq!(missing.status, 404);
    let server_404 = fixture("protobuf/11-get-configmaps.response.json");
    assert_eq!(
        missing
            .headers
            .get("cache-control")
            .map(|v| v.to_str().unwrap()),
        recorded_header(&server_404["headers"], "Cache-Control")
    );
    sidecar.stop().await
}

/// What a real API server answered to a LIST, a GET and a GET of a missing
/// object (`kube-sim/fixtures/authz/impersonate-list-allowed`,
/// `protobuf/08-get-deployments`, `protobuf/11-get-configmaps`), the
/// facade answers byte for byte from a cache holding the same objects:
/// compact JSON, one newline after. An object's `<`, `>` and `&` come
/// escaped, as Go's encoder writes them.
#[tokio::test]
async fn answers_are_the_bytes_the_api_server_sends() -> anyhow::Result<()> {
    let recorded = |name: &str| {
        let request = fixture(&format!("{name}.request.json"));
        let response = fixture(&format!("{name}.response.json"));
        let query = request["query"].as_str().unwrap_or("").to_owned();
        let path = request["path"].as_str().unwrap().to_owned();
        let target = if query.is_empty() {
            path
        } else {
            format!("{path}?{query}")
        };
        (target, response["body"].clone())
    };
    let (list_path, list) = recorded("authz/impersonate-list-allowed");
    let (get_path, deployment) = recorded("protobuf/08-get-deployments");
    let (missing_path, missing) = recorded("protobuf/11-get-configmaps");
    let mut escaped = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "page", "namespace": "web", "resourceVersion": "8600"},
        "data": {"index.html": "<b>a & b</b>"}});

    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let configmaps = kind("", "v1", "configmaps", "ConfigMap", true);
    // As an agent sends list items: `kind` and `apiVersion` filled in.
    let mut items: Vec<Value> = list["decoded"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let mut typed = json!({"kind": "ConfigMap", "apiVersion": "v1"});
            typed
                .as_object_mut()
                .unwrap()
                .extend(item.as_object().unwrap().clone());
            typed
        })
        .collect();
    items.push(escaped.clone());
    let list_rv = list["decoded"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap();
    sync_at(&mut cache, &configmaps, &items, list_rv).await?;
    let deployments = kind("apps", "v1", "deployments", "Deployment", true);
    sync(&mut cache, &deployments, &[deployment["decoded"].clone()]).await?;
    cache.wait_acked().await?;

    let http = http();
    for (path, answer, status) in [
        (&list_path, &list, 200),
        (&get_path, &deployment, 200),
        (&missing_path, &missing, 404),
    ] {
        let got = get(&http, &sidecar.url(&format!("/accounts/prod{path}"))).await?;
        assert_eq!(got.status, status, "{path}");
        let want = spinlink_kube_api::json::encode(&answer["decoded"]);
        assert_eq!(want.len() as u64, answer["bytes"].as_u64().unwrap());
        assert_eq!(
            String::from_utf8_lossy(&got.body),
            String::from_utf8_lossy(&want),
            "{path}"
        );
    }

    let got = get(
        &http,
        &sidecar.url("/accounts/prod/api/v1/namespaces/web/configmaps/page"),
    )
    .await?;
    let text = String::from_utf8(got.body.to_vec())?;
    assert!(
        text.contains(r#""index.html":"\u003cb\u003ea \u0026 b\u003c/b\u003e""#),
        "{text}"
    );
    assert!(text.ends_with("}\n"), "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text)?, escaped.take());
    sidecar.stop().await
}

async fn metrics(http: &HttpClient, url: &str) -> anyhow::Result<String> {
    let m = get(http, url).await?;
    Ok(String::from_utf8_lossy(&m.body).into_owned())
}

/// The value of the sample `name{account="<account>"}` in the text
/// exposition.
fn sample(metrics: &str, name: &str, account: &str) -> Option<f64> {
    let prefix = format!("{name}{{account=\"{account}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

#[tokio::test]
async fn metrics_count_what_each_account_caches() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    let mut prod = CacheStream::open(&mut client, "prod").await?;
    let prod_pods: Vec<Value> = (1..=3)
        .map(|i| {
            pod(
                "demo",
                &format!("web-{i}"),
                &format!("1{i}"),
                json!({"app": "web"}),
            )
        })
        .collect();
    sync(&mut prod, &pods, &prod_pods).await?;
    prod.wait_acked().await?;
    let mut dev = CacheStream::open(&mut client, "dev").await?;
    sync(&mut dev, &pods, &[pod("demo", "solo", "7", json!({}))]).await?;
    dev.wait_acked().await?;

    let http = http();
    let metrics_url = sidecar.url("/metrics");
    let text = metrics(&http, &metrics_url).await?;
    let objects = |account: &str| sample(&text, "spinlink_sidecar_cache_objects", account);
    let bytes = |text: &str, account: &str| {
        sample(text, "spinlink_sidecar_cache_bytes", account).unwrap_or_default()
    };
    // Counts per account, as the accounts API and the facade's lists say.
    for (account, want) in [("prod", 3.0), ("dev", 1.0)] {
        assert_eq!(objects(account), Some(want), "{text}");
        let status = get(&http, &sidecar.url(&format!("/v1/accounts/{account}")))
            .await?
            .json();
        assert_eq!(status["objects"].as_f64(), Some(want));
        let url = sidecar.url(&format!("/accounts/{account}/api/v1/pods"));
        let listed = get(&http, &url).await?.json();
        assert_eq!(
            listed["items"].as_array().map(Vec::len),
            Some(want as usize)
        );
    }
    // Bytes: the JSON of what is held, so one more object adds its size and
    // taking it away gives it back.
    let (prod_bytes, dev_bytes) = (bytes(&text, "prod"), bytes(&text, "dev"));
    assert!(prod_bytes > 0.0 && dev_bytes > 0.0, "{text}");
    let extra = pod("demo", "web-4", "20", json!({"app": "web"}));
    prod.send(added(&pods, &extra)).await?;
    prod.wait_acked().await?;
    let grown = metrics(&http, &metrics_url).await?;
    let size = serde_json::to_vec(&extra)?.len() as f64;
    assert_eq!(bytes(&grown, "prod"), prod_bytes + size, "{grown}");
    assert_eq!(
        bytes(&grown, "dev"),
        dev_bytes,
        "other accounts are untouched"
    );
    assert_eq!(
        sample(&grown, "spinlink_sidecar_cache_objects", "prod"),
        Some(4.0)
    );
    prod.send(cache_up::Msg::Event(v1::WatchEvent {
        r#type: v1::watch_event::Type::Deleted as i32,
        kind: Some(pods.clone()),
        resource_version: "21".into(),
        object: serde_json::to_vec(&extra)?,
    }))
    .await?;
    prod.wait_acked().await?;
    let shrunk = metrics(&http, &metrics_url).await?;
    assert_eq!(bytes(&shrunk, "prod"), prod_bytes, "{shrunk}");
    sidecar.stop().await
}

/// While its agent says the cluster's API server does not answer, reads
/// from the cache carry a Warning kubectl prints, the accounts API says so
/// and a gauge counts it; once it answers again, all of that goes.
#[tokio::test]
async fn reads_say_when_the_api_server_is_out_of_reach() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let http = http();
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(
        &mut cache,
        &pods,
        &[pod("demo", "web-1", "3", json!({"app": "web"}))],
    )
    .await?;
    let url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods");
    let metrics_url = sidecar.url("/metrics");
    let beat = |since: i64, error: &str| {
        cache_up::Msg::Heartbeat(v1::Heartbeat {
            unix_millis: 1,
            api_unreachable_since_unix_millis: since,
            api_error: error.into(),
        })
    };

    let fresh = get(&http, &url).await?;
    assert_eq!(fresh.status, 200);
    assert!(fresh.headers.get("warning").is_none());
    let since = chrono::Utc::now().timestamp_millis() - 5_000;
    cache
        .send(beat(since, "dial tcp 10.0.0.1:443: connect: \"refused\""))
        .await?;
    cache.wait_acked().await?;
    let stale = get(&http, &url).await?;
    assert_eq!(stale.status, 200, "the cache still answers");
    let warning = stale
        .headers
        .get("warning")
        .context("no Warning on a read while the API server is out of reach")?
        .to_str()?;
    assert!(
        warning.starts_with(
            "299 - \"spinlink: account prod's agent has not reached the cluster's API server since "
        ) && warning.contains("may be stale")
            && warning.contains("connect: refused"),
        "{warning}"
    );
    let view = get(&http, &sidecar.url("/v1/accounts/prod")).await?.json();
    assert_eq!(view["apiServer"]["reachable"], false, "{view}");
    assert!(view["apiServer"]["unreachableSince"].is_string(), "{view}");
    let m = metrics(&http, &metrics_url).await?;
    assert_eq!(
        sample(&m, "spinlink_sidecar_api_server_reachable", "prod"),
        Some(0.0)
    );

    cache.send(beat(0, "")).await?;
    cache.wait_acked().await?;
    assert!(get(&http, &url).await?.headers.get("warning").is_none());
    let view = get(&http, &sidecar.url("/v1/accounts/prod")).await?.json();
    assert_eq!(view["apiServer"], json!({"reachable": true}));
    let m = metrics(&http, &metrics_url).await?;
    assert_eq!(
        sample(&m, "spinlink_sidecar_api_server_reachable", "prod"),
        Some(1.0)
    );
    drop(cache);
    sidecar.stop().await
}
