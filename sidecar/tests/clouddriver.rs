//! Registration with Clouddriver, against a fake of its account management
//! API (`CredentialsController`: `POST`/`PUT /credentials`,
//! `DELETE /credentials/{name}`) that checks the request shapes; and the
//! grace period: a stale account is served from its cache with a warning,
//! refuses writes, and is deregistered and dropped when the period ends.

mod common;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    user: Option<String>,
    content_type: Option<String>,
    body: Value,
}

/// A fake Clouddriver: answers with the scripted statuses in order (200
/// once the script runs out) and records every call.
#[derive(Clone, Default)]
struct FakeClouddriver {
    calls: Arc<Mutex<Vec<Call>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
}

impl FakeClouddriver {
    async fn start(script: &[u16]) -> anyhow::Result<(Self, SocketAddr)> {
        let fake = FakeClouddriver::default();
        fake.script.lock().unwrap().extend(script);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let f = fake.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let f = f.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                        let f = f.clone();
                        async move { Ok::<_, Infallible>(f.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Ok((fake, addr))
    }

    async fn answer(&self, req: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
        let header = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
        let (user, content_type) = (header("x-spinnaker-user"), header("content-type"));
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.calls.lock().unwrap().push(Call {
            method,
            path,
            user,
            content_type,
            body: body.clone(),
        });
        let status = self.script.lock().unwrap().pop_front().unwrap_or(200);
        let mut resp = http::Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        resp
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    async fn wait_for(&self, what: &str, pred: impl Fn(&[Call]) -> bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !pred(&self.calls()) {
            if tokio::time::Instant::now() > deadline {
                bail!("fake Clouddriver never saw {what}: {:#?}", self.calls());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "c"}]},
    })
}

#[tokio::test]
async fn registers_with_retries_serves_stale_then_deregisters_after_grace() -> anyhow::Result<()> {
    // Clouddriver is down once, then says the account already exists.
    let (fake, cd) = FakeClouddriver::start(&[503, 409]).await?;
    let dir = tempfile::tempdir()?;
    let extra = format!(
        "accounts: {{ gracePeriodSeconds: 2 }}\n\
         clouddriver:\n  baseUrl: http://{cd}\n  user: spinlink-sidecar\n  kubeconfigDir: {}\n  \
         retry: {{ initialMillis: 20, maxMillis: 100 }}\n  \
         account: {{ namespaces: [demo], permissions: {{ READ: [ops], WRITE: [ops] }} }}\n",
        dir.path().display()
    );
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(&mut cache, &pods, &[pod("web-1")]).await?;
    cache.wait_acked().await?;

    fake.wait_for("POST, POST, PUT", |c| c.len() >= 3).await?;
    let calls = fake.calls();
    let facade = format!("http://{}/accounts/prod", sidecar.facade);
    for (call, method) in calls.iter().zip(["POST", "POST", "PUT"]) {
        assert_eq!(call.method, method);
        assert_eq!(call.path, "/credentials");
        assert_eq!(call.user.as_deref(), Some("spinlink-sidecar"));
        assert_eq!(call.content_type.as_deref(), Some("application/json"));
        let b = &call.body;
        assert_eq!(b["@type"], "kubernetes");
        assert_eq!(b["name"], "prod");
        assert_eq!(b["namespaces"], json!(["demo"]));
        assert_eq!(b["permissions"]["WRITE"], json!(["ops"]));
        let kc: Value = serde_norway::from_str(b["kubeconfigContents"].as_str().unwrap())?;
        assert_eq!(kc["clusters"][0]["cluster"]["server"], facade);
        assert_eq!(kc["current-context"], b["context"]);
    }
    let file = dir.path().join("prod.yaml");
    let kc: Value = serde_norway::from_str(&std::fs::read_to_string(&file)?)?;
    assert_eq!(kc["clusters"][0]["cluster"]["server"], facade);
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;

    // The agent goes away: reads come from the cache with a warning,
    // everything that needs the agent is refused.
    drop(cache);
    wait_status(&sidecar, "prod", |s| !s.online).await?;
    let http = http();
    let pods_url = sidecar.url("/accounts/prod/api/v1/namespaces/demo/pods");
    let read = get(&http, &pods_url).await?;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["items"][0]["metadata"]["name"], "web-1");
    let warning = read
        .headers
        .get("warning")
        .context("no Warning header on a stale read")?
        .to_str()?;
    assert!(
        warning.starts_with("299 - ") && warning.contains("offline"),
        "{warning}"
    );
    let write = request(
        &http,
        "POST",
        &pods_url,
        &[("content-type", "application/json")],
        "{}",
    )
    .await?;
    assert_eq!(write.status, 503);
    assert_eq!(write.json()["reason"], "ServiceUnavailable");
    assert!(calls.iter().all(|c| c.method != "DELETE"));

    // The grace period ends: deregistered, file gone, account not found.
    fake.wait_for("DELETE", |c| c.iter().any(|c| c.method == "DELETE"))
        .await?;
    let delete = fake
        .calls()
        .into_iter()
        .find(|c| c.method == "DELETE")
        .unwrap();
    assert_eq!(delete.path, "/credentials/prod");
    assert_eq!(delete.user.as_deref(), Some("spinlink-sidecar"));
    wait_status(&sidecar, "prod", |s| s.registration.state == "deregistered").await?;
    assert!(!file.exists());
    assert_eq!(get(&http, &pods_url).await?.status, 404);

    let metrics = get(&http, &sidecar.url("/metrics")).await?;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"spinlink_sidecar_registrations_total{target="clouddriver",op="create",outcome="failure"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"op="update",outcome="success"} 1"#),
        "{text}"
    );
    sidecar.stop().await
}

#[tokio::test]
async fn an_account_that_comes_back_within_grace_is_not_deregistered() -> anyhow::Result<()> {
    let (fake, cd) = FakeClouddriver::start(&[]).await?;
    let extra =
        format!("accounts: {{ gracePeriodSeconds: 2 }}\nclouddriver: {{ baseUrl: http://{cd} }}\n");
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let cache = CacheStream::open(&mut client, "prod").await?;
    fake.wait_for("POST", |c| c.len() == 1).await?;
    drop(cache);
    wait_status(&sidecar, "prod", |s| !s.online).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    cache
        .send(spinlink_proto::v1::cache_up::Msg::Heartbeat(
            Default::default(),
        ))
        .await?;
    wait_status(&sidecar, "prod", |s| s.online).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        fake.calls().iter().all(|c| c.method == "POST"),
        "{:#?}",
        fake.calls()
    );
    assert_eq!(fake.calls().len(), 1, "registered once, not again");
    drop(cache);
    sidecar.stop().await
}
