//! Registration with Clouddriver and migration from it, against a fake of
//! its account management API that answers as Clouddriver's source does
//! (`fake_clouddriver`: each rule names the file it models): the `type`
//! discriminator, 400s with and without a body, stored accounts loaded only
//! by the credentials poller, validation at load time, and Fiat. Also the
//! grace period: a stale account is served from its cache with a warning,
//! refuses writes, and is deregistered when it ends — by the sidecar that
//! holds it, never while another sidecar serves it.

mod common;
mod fake_clouddriver;

use std::time::Duration;

use anyhow::Context as _;
use common::*;
use fake_clouddriver::{FakeClouddriver, Fiat, FiatUser};
use serde_json::{Value, json};
use tokio::net::TcpListener;

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
        "type": "kubernetes",
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

/// The `clouddriver:` section the tests use: quick retries and checks,
/// `more` indented under it.
fn clouddriver_yaml(fake: &FakeClouddriver, more: &str) -> String {
    format!(
        "clouddriver:\n  baseUrl: {}\n  retry: {{ initialMillis: 20, maxMillis: 200 }}\n  \
         liveCheckMillis: 50\n  recheckSeconds: 1\n  \
         account: {{ namespaces: [demo], permissions: {{ READ: [ops], WRITE: [ops] }} }}\n{more}",
        fake.base_url()
    )
}

fn writes(fake: &FakeClouddriver) -> Vec<fake_clouddriver::Call> {
    fake.calls()
        .into_iter()
        .filter(|c| c.method != "GET")
        .collect()
}

fn last_error(sidecar: &Running, account: &str) -> String {
    let status = sidecar.accounts.status(account).expect("no such account");
    status.registration.last_error.unwrap_or_default()
}

async fn metrics(sidecar: &Running) -> anyhow::Result<String> {
    let answer = get(&http(), &sidecar.url("/metrics")).await?;
    Ok(String::from_utf8_lossy(&answer.body).into_owned())
}

#[tokio::test]
async fn registers_what_clouddriver_accepts_confirms_it_loaded_then_deregisters()
-> anyhow::Result<()> {
    // Clouddriver is starting (one 503), then loads accounts every 200 ms.
    // Its storage holds, and it serves, an older definition of the account.
    let fake = FakeClouddriver::start(Some(Duration::from_millis(200))).await?;
    fake.with(|s| s.down.push_back(503));
    fake.store(json!({"type": "kubernetes", "name": "prod", "kubeconfigFile": "/old"}));
    fake.reload();
    let dir = tempfile::tempdir()?;
    let extra = format!(
        "accounts: {{ gracePeriodSeconds: 2 }}\n{}",
        clouddriver_yaml(
            &fake,
            &format!(
                "  user: spinlink-sidecar\n  kubeconfigDir: {}\n",
                dir.path().display()
            )
        )
    );
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(&mut cache, &pods, &[pod("web-1")]).await?;
    cache.wait_acked().await?;

    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    let facade = format!("http://{}/accounts/prod", sidecar.facade);
    let expected = expected_definition("prod", &facade, &["demo"]);
    // Written with the upsert only: a 503, then stored.
    let written = writes(&fake);
    assert_eq!(written.len(), 2, "{written:#?}");
    for (call, status) in written.iter().zip([503, 200]) {
        assert_eq!(
            (call.method.as_str(), call.path.as_str()),
            ("PUT", "/credentials")
        );
        assert_eq!(call.status, status);
        assert_eq!(call.user.as_deref(), Some("spinlink-sidecar"));
        assert_eq!(call.content_type.as_deref(), Some("application/json"));
        assert_eq!(definition_of(&call.body)?, expected);
    }
    // Registered means loaded: Clouddriver serves the account from this
    // definition, and was asked before it was called registered.
    let loaded = fake.loaded("prod").context("Clouddriver never loaded it")?;
    assert_eq!(definition_of(&loaded)?, expected);
    assert!(
        fake.calls()
            .iter()
            .any(|c| c.method == "GET" && c.path == "/credentials/prod" && c.status == 200)
    );
    let status = sidecar.accounts.status("prod").unwrap().registration;
    assert!(status.stored && status.live, "{status:?}");
    assert_eq!(status.reason, None);
    let file = dir.path().join("prod.yaml");
    let kc: Value = serde_norway::from_str(&std::fs::read_to_string(&file)?)?;
    assert_eq!(kc["clusters"][0]["cluster"]["server"], facade);

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
    assert!(writes(&fake).iter().all(|c| c.method != "DELETE"));

    // The grace period ends: deleted, unloaded at the next reload, file
    // gone, account not found.
    fake.wait_for("DELETE", |c| c.iter().any(|c| c.method == "DELETE"))
        .await?;
    let delete = writes(&fake)
        .into_iter()
        .find(|c| c.method == "DELETE")
        .unwrap();
    assert_eq!(
        (delete.path.as_str(), delete.status),
        ("/credentials/prod", 200)
    );
    assert_eq!(delete.user.as_deref(), Some("spinlink-sidecar"));
    wait_status(&sidecar, "prod", |s| s.registration.state == "deregistered").await?;
    assert!(!file.exists());
    assert_eq!(get(&http, &pods_url).await?.status, 404);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.loaded("prod").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never unloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let text = metrics(&sidecar).await?;
    for line in [
        r#"spinlink_sidecar_registrations_total{target="clouddriver",op="save",outcome="failure"} 1"#,
        r#"spinlink_sidecar_registrations_total{target="clouddriver",op="save",outcome="success"} 1"#,
        r#"spinlink_sidecar_registrations_total{target="clouddriver",op="delete",outcome="success"} 1"#,
        r#"spinlink_sidecar_registration_failures_total{reason="unavailable"} 1"#,
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    sidecar.stop().await
}

#[tokio::test]
async fn stored_is_not_live_until_clouddriver_loads_the_account() -> anyhow::Result<()> {
    // No credentials poller: stored accounts load only at start-up (here,
    // when the test says).
    let fake = FakeClouddriver::start(None).await?;
    let extra = clouddriver_yaml(&fake, "  liveTimeoutSeconds: 1\n");
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let cache = CacheStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "stored" && s.registration.stored && !s.registration.live
    })
    .await?;
    assert!(fake.stored("prod").is_some());
    // Past liveTimeoutSeconds the state says why, in the accounts API.
    wait_status(&sidecar, "prod", |s| {
        s.registration.reason.as_deref() == Some("not_loaded")
    })
    .await?;
    let view = get(&http(), &sidecar.url("/v1/accounts/prod"))
        .await?
        .json();
    let registration = &view["registration"];
    assert_eq!(
        (
            &registration["state"],
            &registration["stored"],
            &registration["live"],
            &registration["reason"]
        ),
        (
            &json!("stored"),
            &json!(true),
            &json!(false),
            &json!("not_loaded")
        ),
        "{view}"
    );
    let message = registration["lastError"].as_str().unwrap_or_default();
    assert!(message.contains("credentials.poller.enabled"), "{message}");

    // Clouddriver reloads: registered, the error gone.
    fake.reload();
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "registered"
            && s.registration.live
            && s.registration.reason.is_none()
    })
    .await?;
    assert!(
        metrics(&sidecar)
            .await?
            .contains(r#"spinlink_sidecar_registration_failures_total{reason="not_loaded"}"#)
    );

    // Clouddriver loses it (an operator deleted it): the re-check writes it
    // again.
    fake.with(|s| s.stored.clear());
    fake.reload();
    assert!(fake.loaded("prod").is_none());
    fake.wait_for("a second PUT", |c| {
        c.iter().filter(|c| c.method == "PUT").count() == 2
    })
    .await?;
    assert!(fake.stored("prod").is_some());
    drop(cache);
    sidecar.stop().await
}

#[tokio::test]
async fn refusals_are_told_apart_and_an_omitting_agent_still_loads() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(100))).await?;
    fake.with(|s| s.storage_enabled = false);
    let extra = clouddriver_yaml(&fake, "");
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    // The agent watches every namespace but kube-system, while the
    // configuration names `demo`: Clouddriver would skip a definition
    // with both lists when loading it.
    let cache = CacheStream::open_omitting(&mut client, "prod", &[], &["kube-system"]).await?;
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "retrying"
            && s.registration.reason.as_deref() == Some("storage_disabled")
    })
    .await?;
    let error = last_error(&sidecar, "prod");
    assert!(
        error.contains("account.storage.kubernetes.enabled"),
        "{error}"
    );

    // Storage comes on: stored, loaded, registered.
    fake.with(|s| s.storage_enabled = true);
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    let loaded = fake.loaded("prod").context("not loaded")?;
    assert_eq!(loaded["namespaces"], json!(["demo"]));
    assert!(loaded.get("omitNamespaces").is_none(), "{loaded}");
    assert!(
        fake.with(|s| s.skipped.is_empty()),
        "{:?}",
        fake.with(|s| s.skipped.clone())
    );
    assert!(
        metrics(&sidecar)
            .await?
            .contains(r#"spinlink_sidecar_registration_failures_total{reason="storage_disabled"}"#)
    );
    drop(cache);
    sidecar.stop().await
}

#[tokio::test]
async fn fiat_decides_who_may_register_and_is_waited_for() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(100))).await?;
    fake.with(|s| s.fiat = Some(Fiat::default()));
    let extra = clouddriver_yaml(&fake, "  user: spinlink\n");
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let first = CacheStream::open(&mut client, "prod").await?;

    // Fiat does not know the user: 403, said so.
    wait_status(&sidecar, "prod", |s| {
        s.registration.reason.as_deref() == Some("forbidden")
    })
    .await?;
    let error = last_error(&sidecar, "prod");
    assert!(
        error.contains("spinlink") && error.contains("fiat.account.manager.roles"),
        "{error}"
    );
    // An account manager without any of the account's WRITE roles: 400.
    let manager = |roles: &[&str]| FiatUser {
        admin: false,
        account_manager: true,
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
    };
    fake.with(|s| {
        let users = &mut s.fiat.as_mut().unwrap().users;
        users.insert("spinlink".into(), manager(&["dev"]));
    });
    wait_status(&sidecar, "prod", |s| {
        s.registration.reason.as_deref() == Some("permissions")
    })
    .await?;
    // With the role: stored, loaded.
    fake.with(|s| {
        let users = &mut s.fiat.as_mut().unwrap().users;
        users.insert("spinlink".into(), manager(&["ops"]));
    });
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    assert!(
        fake.calls()
            .iter()
            .all(|c| c.user.as_deref() == Some("spinlink"))
    );

    // The agent now watches other namespaces: overwriting a loaded account
    // needs WRITE on it, which Fiat learns only at its next sync.
    let second = CacheStream::open_with(&mut client, "prod", &["web"]).await?;
    drop(first);
    let forbidden_before = fake.calls().iter().filter(|c| c.status == 403).count();
    fake.wait_for("a 403 for the update", |c| {
        c.iter().filter(|c| c.status == 403).count() > forbidden_before
    })
    .await?;
    wait_status(&sidecar, "prod", |s| {
        s.registration.reason.as_deref() == Some("forbidden")
    })
    .await?;
    fake.fiat_sync();
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "registered" && s.registration.reason.is_none()
    })
    .await?;
    assert_eq!(fake.loaded("prod").unwrap()["namespaces"], json!(["web"]));
    drop(second);
    sidecar.stop().await
}

/// Sidecars `ids` on one store (SQLite, or PostgreSQL when
/// `SPINLINK_TEST_POSTGRES_URL` is set), registering with `fake`, with a
/// 2 s grace period.
async fn sidecars(
    fake: &FakeClouddriver,
    ids: &[&str],
) -> anyhow::Result<(SharedStore, Vec<Running>)> {
    let store = SharedStore::new().await?;
    // Read when each sidecar binds; not needed after.
    let pki = PeerPki::new()?;
    let mut running = Vec::new();
    for id in ids {
        let extra = format!(
            "instanceId: {id}\nstore: {{ url: \"{}\" }}\nownership: {{ leaseSeconds: 30 }}\n\
             accounts: {{ gracePeriodSeconds: 2 }}\n{}{}",
            store.url,
            clouddriver_yaml(fake, ""),
            pki.yaml(),
        );
        running.push(start_named(&extra).await?);
    }
    Ok((store, running))
}

/// Fails the test if Clouddriver stops serving `account` while it runs.
fn watch_live(fake: &FakeClouddriver, account: &str) -> tokio::task::JoinHandle<()> {
    let (fake, account) = (fake.clone(), account.to_owned());
    tokio::spawn(async move {
        loop {
            assert!(
                fake.loaded(&account).is_some() && fake.stored(&account).is_some(),
                "Clouddriver lost {account}: {:#?}",
                fake.calls()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

async fn hold_live(watch: tokio::task::JoinHandle<()>) -> anyhow::Result<()> {
    assert!(!watch.is_finished(), "the account left Clouddriver");
    watch.abort();
    match watch.await {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        _ => Ok(()),
    }
}

#[tokio::test]
async fn a_handover_mid_grace_keeps_the_account_registered_and_live() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    let (_store, mut s) = sidecars(&fake, &["sidecar-a", "sidecar-b"]).await?;
    let b = s.pop().unwrap();
    let a = s.pop().unwrap();
    let mut to_a = a.client().await?;
    let cache_a = CacheStream::open(&mut to_a, "prod").await?;
    wait_status(&a, "prod", |s| s.registration.state == "registered").await?;
    let watch = watch_live(&fake, "prod");

    // The agent moves to B: A's grace period starts, B takes the account
    // and its registration (the definition now names B's facade).
    drop(cache_a);
    wait_status(&a, "prod", |s| !s.online).await?;
    let mut to_b = b.client().await?;
    let cache_b = CacheStream::open(&mut to_b, "prod").await?;
    wait_status(&b, "prod", |s| s.registration.state == "registered").await?;
    // Clouddriver's answer does not show the kubeconfig, so A's definition
    // (A's facade forwards to B) may count as loaded until the next reload
    // brings B's.
    let server = |d: &Value| {
        definition_of(d).unwrap()["kubeconfigContents"]["clusters"][0]["cluster"]["server"].clone()
    };
    let b_facade = json!(format!("http://{}/accounts/prod", b.facade));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.loaded("prod").map(|d| server(&d)) != Some(b_facade.clone()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's definition never loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A's grace period ends: A removes its cache but not the definition B
    // serves.
    wait_status(&a, "prod", |s| {
        s.state == spinlink_sidecar::accounts::Presence::Removed
    })
    .await?;
    wait_status(&a, "prod", |s| s.registration.state == "elsewhere").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    hold_live(watch).await?;
    assert!(
        writes(&fake).iter().all(|c| c.method != "DELETE"),
        "{:#?}",
        writes(&fake)
    );
    assert_eq!(
        b.accounts.status("prod").unwrap().registration.state,
        "registered"
    );
    drop(cache_b);
    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn three_sidecars_hand_an_account_along_and_only_the_last_deletes_it() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    let (_store, s) = sidecars(&fake, &["sidecar-a", "sidecar-b", "sidecar-c"]).await?;
    let mut clients = Vec::new();
    for sidecar in &s {
        clients.push(sidecar.client().await?);
    }
    let mut cache = CacheStream::open(&mut clients[0], "prod").await?;
    wait_status(&s[0], "prod", |s| s.registration.state == "registered").await?;
    let watch = watch_live(&fake, "prod");
    // A to B, then B to C, each while the last one's grace period runs.
    for next in 1..3 {
        drop(cache);
        wait_status(&s[next - 1], "prod", |s| !s.online).await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        cache = CacheStream::open(&mut clients[next], "prod").await?;
        wait_status(&s[next], "prod", |s| s.registration.state == "registered").await?;
    }
    for earlier in &s[..2] {
        wait_status(earlier, "prod", |s| {
            s.state == spinlink_sidecar::accounts::Presence::Removed
                && s.registration.state == "elsewhere"
        })
        .await?;
    }
    hold_live(watch).await?;
    assert!(writes(&fake).iter().all(|c| c.method != "DELETE"));

    // The agent goes for good: C, the last to hold it, deletes it once its
    // grace period ends (A and B, whose grace periods ended first, leave it
    // to C).
    drop(cache);
    fake.wait_for("the DELETE", |c| c.iter().any(|c| c.method == "DELETE"))
        .await?;
    wait_status(&s[2], "prod", |s| s.registration.state == "deregistered").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deletes: Vec<_> = writes(&fake)
        .into_iter()
        .filter(|c| c.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert!(fake.loaded("prod").is_none() && fake.stored("prod").is_none());
    for sidecar in s {
        sidecar.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn an_account_that_comes_back_within_grace_is_not_deregistered() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    let extra = format!(
        "accounts: {{ gracePeriodSeconds: 2 }}\n{}",
        clouddriver_yaml(&fake, "")
    );
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let cache = CacheStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
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
    let written = writes(&fake);
    assert_eq!(
        written.len(),
        1,
        "written once, never deleted: {written:#?}"
    );
    assert_eq!(written[0].method, "PUT");
    assert_eq!(
        sidecar.accounts.status("prod").unwrap().registration.state,
        "registered"
    );
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
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    let legacy = json!({"type": "kubernetes", "name": "legacy", "context": "c",
        "namespaces": ["apps"], "kubeconfigContents": LEGACY_KUBECONFIG,
        "permissions": {"WRITE": ["ops"]}, "cacheThreads": 2});
    fake.store(legacy);
    // Definitions named after it sort after it: the lookup must not take them.
    fake.store(json!({"type": "kubernetes", "name": "legacy-2", "kubeconfigContents": "x"}));
    fake.with(|s| {
        s.configured.insert(
            "from-files".into(),
            json!({"type": "kubernetes", "name": "from-files"}),
        )
    });
    fake.reload();
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32])?;
    let extra = format!(
        "accounts: {{ encryptionKeyFile: {} }}\n{}",
        key.display(),
        clouddriver_yaml(&fake, "  user: migrator\n")
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

    // Its agent comes online here: registration puts the facade-backed
    // definition over the old one, and waits until Clouddriver serves that
    // one rather than the legacy one still loaded.
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "legacy").await?;
    sync(
        &mut cache,
        &kind("", "v1", "pods", "Pod", true),
        &[pod("web-1")],
    )
    .await?;
    wait_status(&sidecar, "legacy", |s| s.registration.state == "registered").await?;
    let written: Vec<(String, String)> = writes(&fake)
        .iter()
        .map(|c| (c.method.clone(), c.path.clone()))
        .collect();
    assert_eq!(written, [("PUT".to_owned(), "/credentials".to_owned())]);
    let now = fake.loaded("legacy").context("the definition is gone")?;
    assert_eq!(now["type"], "kubernetes");
    let kc: Value = serde_norway::from_str(now["kubeconfigContents"].as_str().unwrap())?;
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        format!("http://{}/accounts/legacy", sidecar.facade)
    );
    assert!(!now.to_string().contains("legacy-token"), "{now}");

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
         retry: {{ initialMillis: 20, maxMillis: 200 }}\n  liveCheckMillis: 50\n  \
         account: {{ namespaces: [demo], permissions: {{ READ: [ops], WRITE: [ops] }} }}\n"
    );
    let sidecar = start_config("", &extra).await?;
    let mut client = sidecar.client().await?;
    let first = CacheStream::open(&mut client, "prod").await?;
    wait_status(&sidecar, "prod", |s| {
        s.registration.state == "retrying"
            && s.registration.reason.as_deref() == Some("unreachable")
            && s.registration
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("unreachable"))
    })
    .await?;

    // Clouddriver comes up: the retry registers the account.
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let fake = FakeClouddriver::serve(listener, Some(Duration::from_millis(50)));
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    let facade = format!("http://{}/accounts/prod", sidecar.facade);
    let written = writes(&fake);
    assert_eq!(written.len(), 1, "{written:#?}");
    assert_eq!(
        (written[0].method.as_str(), written[0].path.as_str()),
        ("PUT", "/credentials")
    );
    assert_eq!(
        definition_of(&written[0].body)?,
        expected_definition("prod", &facade, &["demo"])
    );

    // Its agent now watches two namespaces only: Clouddriver is told, with
    // a PUT of the new definition, and serves it.
    let second = CacheStream::open_with(&mut client, "prod", &["web", "jobs"]).await?;
    fake.wait_for("the second PUT", |c| {
        c.iter().filter(|c| c.method == "PUT").count() == 2
    })
    .await?;
    let narrowed = expected_definition("prod", &facade, &["web", "jobs"]);
    assert_eq!(definition_of(&writes(&fake)[1].body)?, narrowed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.loaded("prod").map(|d| definition_of(&d).unwrap()) != Some(narrowed.clone()) {
        assert!(tokio::time::Instant::now() < deadline, "never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_status(&sidecar, "prod", |s| s.registration.state == "registered").await?;
    // The same definition again is no call.
    drop(first);
    wait_status(&sidecar, "prod", |s| s.online && s.cache_streams == 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(writes(&fake).len(), 2, "{:#?}", writes(&fake));
    drop(second);
    sidecar.stop().await
}

/// The fake refuses what Clouddriver refuses, as the sidecar once sent it:
/// `@type` instead of `type` (400, no body), and a definition with both
/// namespace lists (stored with a 200, then skipped when loaded).
#[tokio::test]
async fn the_fake_refuses_what_clouddriver_refuses() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(None).await?;
    let http = http();
    let url = format!("{}/credentials", fake.base_url());
    let put = |body: Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            request(
                &http,
                "PUT",
                &url,
                &[("content-type", "application/json")],
                &body.to_string(),
            )
            .await
        }
    };
    let old = put(json!({"@type": "kubernetes", "name": "a"})).await?;
    assert_eq!((old.status, old.body.len()), (400, 0));
    let untyped = put(json!({"name": "a"})).await?;
    assert_eq!((untyped.status, untyped.body.len()), (400, 0));
    let scalar = put(json!({"type": "kubernetes", "name": "a", "namespaces": "x"})).await?;
    assert_eq!(scalar.status, 400);
    let both = put(json!({"type": "kubernetes", "name": "a",
        "namespaces": ["x"], "omitNamespaces": ["y"]}))
    .await?;
    assert_eq!(both.status, 200);
    fake.reload();
    assert!(fake.stored("a").is_some() && fake.loaded("a").is_none());
    assert_eq!(fake.with(|s| s.skipped.len()), 1);
    // A duplicate POST is a 400 (never 409); deleting an unknown name a 404.
    let dup = request(
        &http,
        "POST",
        &url,
        &[("content-type", "application/json")],
        &json!({"type": "kubernetes", "name": "a"}).to_string(),
    )
    .await?;
    assert_eq!(dup.status, 400);
    let gone = request(&http, "DELETE", &format!("{url}/nobody"), &[], "").await?;
    assert_eq!(gone.status, 404);
    Ok(())
}
