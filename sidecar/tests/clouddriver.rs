//! Registration with Clouddriver and migration from it, against a fake of
//! its account management API that answers as Clouddriver's
//! `CredentialsController` does over its account storage: `POST
//! /credentials` (400 for a name it already has), `PUT /credentials`,
//! `DELETE /credentials/{name}`, the stored definitions by type
//! (`GET /credentials/type/kubernetes?limit=&startingAccountName=`) and the
//! running account (`GET /credentials/{name}`, without its kubeconfig); and
//! the grace period: a stale account is served from its cache with a
//! warning, refuses writes, and is deregistered and dropped when it ends.

mod common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    query: String,
    user: Option<String>,
    content_type: Option<String>,
    body: Value,
}

/// A fake Clouddriver with account storage. `down` statuses are answered
/// first, in order, to any call (Clouddriver starting up); then each call
/// is answered as Clouddriver answers it. Every call is recorded.
#[derive(Clone, Default)]
struct FakeClouddriver {
    calls: Arc<Mutex<Vec<Call>>>,
    down: Arc<Mutex<VecDeque<u16>>>,
    /// Account storage: definitions by name, as posted.
    stored: Arc<Mutex<BTreeMap<String, Value>>>,
    /// Accounts from Clouddriver's configuration files: running, not stored.
    configured: Arc<Mutex<BTreeSet<String>>>,
}

/// A Spring Boot error body, as Clouddriver sends one.
fn spring_error(status: u16, message: &str, path: &str) -> Value {
    let error = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    json!({"timestamp": "2026-01-01T00:00:00.000+00:00", "status": status, "error": error,
           "message": message, "path": path})
}

impl FakeClouddriver {
    async fn start(down: &[u16]) -> anyhow::Result<(Self, SocketAddr)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        Ok((Self::serve(listener, down), addr))
    }

    fn serve(listener: TcpListener, down: &[u16]) -> Self {
        let fake = FakeClouddriver::default();
        fake.down.lock().unwrap().extend(down);
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
        fake
    }

    /// Stores `definition` as if posted earlier.
    fn store(&self, definition: Value) {
        let name = definition["name"].as_str().unwrap().to_owned();
        self.stored.lock().unwrap().insert(name, definition);
    }

    fn stored(&self, name: &str) -> Option<Value> {
        self.stored.lock().unwrap().get(name).cloned()
    }

    async fn answer(&self, req: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
        let header = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
        let query = req.uri().query().unwrap_or_default().to_owned();
        let (user, content_type) = (header("x-spinnaker-user"), header("content-type"));
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.calls.lock().unwrap().push(Call {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            user,
            content_type,
            body: body.clone(),
        });
        let (status, answer) = match self.down.lock().unwrap().pop_front() {
            Some(status) => (status, spring_error(status, "starting", &path)),
            None => self.account_api(&method, &path, &query, body),
        };
        let mut resp = http::Response::new(Full::new(Bytes::from(answer.to_string())));
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn account_api(&self, method: &str, path: &str, query: &str, body: Value) -> (u16, Value) {
        let mut stored = self.stored.lock().unwrap();
        let configured = self.configured.lock().unwrap();
        let name = body["name"].as_str().unwrap_or_default().to_owned();
        let param = |key: &str| {
            url::form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        match (method, path.strip_prefix("/credentials")) {
            ("POST", Some("")) if stored.contains_key(&name) || configured.contains(&name) => (
                400,
                spring_error(
                    400,
                    &format!("Cannot create duplicate account (name: {name})"),
                    path,
                ),
            ),
            ("POST" | "PUT", Some("")) => {
                stored.insert(name, body.clone());
                (200, body)
            }
            ("GET", Some("/type/kubernetes")) => {
                let limit = param("limit").map_or(100, |l| l.parse().unwrap());
                let from = param("startingAccountName").unwrap_or_default();
                let listed: Vec<&Value> = stored
                    .range(from..)
                    .map(|(_, d)| d)
                    .filter(|d| d["@type"] == "kubernetes")
                    .take(limit)
                    .collect();
                (200, json!(listed))
            }
            ("GET", Some(rest)) => {
                let name = rest.trim_start_matches('/');
                if stored.contains_key(name) || configured.contains(name) {
                    // The running account: no kubeconfig in it.
                    (
                        200,
                        json!({"name": name, "environment": name, "accountType": name,
                        "cloudProvider": "kubernetes", "type": "kubernetes", "cacheThreads": 1,
                        "requiredGroupMembership": [], "permissions": {},
                        "challengeDestructiveActions": false, "primaryAccount": false}),
                    )
                } else {
                    let message = format!("Account does not exist (name: {name})");
                    (404, spring_error(404, &message, path))
                }
            }
            ("DELETE", Some(rest)) => match stored.remove(rest.trim_start_matches('/')) {
                Some(_) => (200, Value::Null),
                None => (404, spring_error(404, "no such account", path)),
            },
            _ => (404, spring_error(404, "No handler", path)),
        }
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

/// A definition as sent, its `kubeconfigContents` parsed from YAML.
fn definition_of(body: &Value) -> anyhow::Result<Value> {
    let mut body = body.clone();
    let kubeconfig = body["kubeconfigContents"]
        .as_str()
        .context("no kubeconfigContents")?;
    body["kubeconfigContents"] = serde_norway::from_str(kubeconfig)?;
    Ok(body)
}

/// Exactly what the sidecar registers for `account` (as [`definition_of`]
/// reads it) with `clouddriver.account` as the tests configure it.
fn expected_definition(account: &str, facade: &str, namespaces: &[&str]) -> Value {
    json!({
        "@type": "kubernetes",
        "name": account,
        "context": account,
        "kubeconfigContents": {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": account, "cluster": {"server": facade}}],
            "users": [{"name": "spinlink", "user": {}}],
            "contexts": [{"name": account, "context": {"cluster": account, "user": "spinlink"}}],
            "current-context": account,
        },
        "onlySpinnakerManaged": false,
        "cacheThreads": 1,
        "checkPermissionsOnStartup": false,
        "namespaces": namespaces,
        "permissions": {"READ": ["ops"], "WRITE": ["ops"]},
    })
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
    // Clouddriver is down once, then says the account already exists: its
    // account storage holds an earlier definition.
    let (fake, cd) = FakeClouddriver::start(&[503]).await?;
    fake.store(json!({"@type": "kubernetes", "name": "prod", "kubeconfigFile": "/old"}));
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
    assert_eq!(calls.len(), 3, "{calls:#?}");
    let facade = format!("http://{}/accounts/prod", sidecar.facade);
    for (call, method) in calls.iter().zip(["POST", "POST", "PUT"]) {
        assert_eq!(call.method, method);
        assert_eq!(call.path, "/credentials");
        assert_eq!(call.user.as_deref(), Some("spinlink-sidecar"));
        assert_eq!(call.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            definition_of(&call.body)?,
            expected_definition("prod", &facade, &["demo"])
        );
    }
    assert_eq!(
        definition_of(&fake.stored("prod").context("nothing stored")?)?,
        expected_definition("prod", &facade, &["demo"]),
        "the facade-backed definition replaced the old one"
    );
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

/// A kubeconfig for a cluster that is not the facade, with a token that
/// must not leak.
const LEGACY_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
    clusters: [{name: k, cluster: {server: 'https://10.0.0.9:6443'}}]\n\
    users: [{name: u, user: {token: legacy-token-5f0e}}]\n\
    contexts: [{name: c, context: {cluster: k, user: u}}]\n";

#[tokio::test]
async fn migration_takes_the_stored_definition_and_registration_replaces_it() -> anyhow::Result<()>
{
    let (fake, cd) = FakeClouddriver::start(&[]).await?;
    let legacy = json!({"@type": "kubernetes", "name": "legacy", "context": "c",
        "namespaces": ["apps"], "kubeconfigContents": LEGACY_KUBECONFIG,
        "permissions": {"WRITE": ["ops"]}, "cacheThreads": 2});
    fake.store(legacy);
    // Definitions named after it sort after it: the lookup must not take them.
    fake.store(json!({"@type": "kubernetes", "name": "legacy-2", "kubeconfigContents": "x"}));
    fake.configured.lock().unwrap().insert("from-files".into());
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32])?;
    let extra = format!(
        "accounts: {{ encryptionKeyFile: {} }}\n\
         clouddriver: {{ baseUrl: http://{cd}, user: migrator, retry: {{ initialMillis: 20 }} }}\n",
        key.display()
    );
    let sidecar = start_config("", &extra).await?;
    let http = http();
    let migrate = |name: &str| {
        let url = sidecar.url(&format!("/v1/accounts/{name}/migrate"));
        let http = http.clone();
        async move { request(&http, "POST", &url, &[], r#"{"zone": "eu"}"#).await }
    };

    // The definition comes from account storage, read by type from its name.
    let answer = migrate("legacy").await?;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let view = answer.json();
    assert_eq!(
        (
            &view["name"],
            &view["zone"],
            &view["context"],
            &view["namespaces"]
        ),
        (
            &json!("legacy"),
            &json!("eu"),
            &json!("c"),
            &json!(["apps"])
        )
    );
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(
        (
            calls[0].method.as_str(),
            calls[0].path.as_str(),
            calls[0].query.as_str()
        ),
        (
            "GET",
            "/credentials/type/kubernetes",
            "limit=1&startingAccountName=legacy"
        )
    );
    assert_eq!(calls[0].user.as_deref(), Some("migrator"));

    // Its agent comes online here: registration finds the name taken in
    // Clouddriver and puts the facade-backed definition over the old one.
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "legacy").await?;
    sync(
        &mut cache,
        &kind("", "v1", "pods", "Pod", true),
        &[pod("web-1")],
    )
    .await?;
    fake.wait_for("the PUT", |c| c.iter().any(|c| c.method == "PUT"))
        .await?;
    let methods: Vec<(String, String)> = fake
        .calls()
        .iter()
        .map(|c| (c.method.clone(), c.path.clone()))
        .collect();
    assert_eq!(
        methods,
        [
            ("GET".into(), "/credentials/type/kubernetes".into()),
            ("POST".into(), "/credentials".into()),
            ("PUT".into(), "/credentials".into()),
        ]
    );
    let now = fake.stored("legacy").context("the definition is gone")?;
    assert_eq!(now["@type"], "kubernetes");
    let kc: Value = serde_norway::from_str(now["kubeconfigContents"].as_str().unwrap())?;
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        format!("http://{}/accounts/legacy", sidecar.facade)
    );
    assert!(!now.to_string().contains("legacy-token"), "{now}");
    wait_status(&sidecar, "legacy", |s| s.registration.state == "registered").await?;

    // An account from Clouddriver's configuration files has no stored
    // definition to read; one Clouddriver does not have at all is a 404.
    let answer = migrate("from-files").await?;
    assert_eq!(answer.status, 422);
    let message = answer.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("configuration files"), "{message}");
    assert!(message.contains("POST /v1/accounts"), "{message}");
    let answer = migrate("nowhere").await?;
    assert_eq!(answer.status, 404);
    assert!(
        answer.json()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Clouddriver has no account"),
        "{}",
        answer.json()
    );
    drop(cache);
    sidecar.stop().await
}

#[tokio::test]
async fn a_changed_definition_is_put_and_an_unreachable_clouddriver_retried() -> anyhow::Result<()>
{
    // Nothing listens on Clouddriver's port yet: connections are refused.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.port()
    };
    let extra = format!(
        "clouddriver:\n  baseUrl: http://127.0.0.1:{port}\n  \
         retry: {{ initialMillis: 20, maxMillis: 200 }}\n  \
         account: {{ namespaces: [demo], permissions: {{ READ: [ops], WRITE: [ops] }} }}\n"
    );
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let first = CacheStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "retrying"
            && s.registration
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("unreachable"))
    })
    .await?;

    // Clouddriver comes up: the retry registers the account.
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let fake = FakeClouddriver::serve(listener, &[]);
    fake.wait_for("the POST", |c| !c.is_empty()).await?;
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    let facade = format!("http://{}/accounts/prod", sidecar.facade);
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(
        (calls[0].method.as_str(), calls[0].path.as_str()),
        ("POST", "/credentials")
    );
    assert_eq!(
        definition_of(&calls[0].body)?,
        expected_definition("prod", &facade, &["demo"])
    );

    // Its agent now watches two namespaces only: Clouddriver is told, with a
    // PUT of the new definition (it knows the account already).
    let second = CacheStream::open_with(&mut client, "prod", &["web", "jobs"]).await?;
    fake.wait_for("the PUT", |c| c.len() >= 2).await?;
    let calls = fake.calls();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(
        (calls[1].method.as_str(), calls[1].path.as_str()),
        ("PUT", "/credentials")
    );
    let narrowed = expected_definition("prod", &facade, &["web", "jobs"]);
    assert_eq!(definition_of(&calls[1].body)?, narrowed);
    assert_eq!(
        definition_of(&fake.stored("prod").context("not stored")?)?,
        narrowed
    );
    // The same definition again is no call.
    drop(first);
    wait_status(&sidecar, "prod", |s| s.online && s.cache_streams == 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.calls().len(), 2, "{:#?}", fake.calls());
    drop(second);
    sidecar.stop().await
}
