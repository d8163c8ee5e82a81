//! The dynamic accounts API driven through the facade's handler: create,
//! list, delete, the 503 without a key, the 409 on a fingerprint conflict,
//! what a migration reads from Clouddriver's definition (the calls to
//! Clouddriver are in `tests/clouddriver.rs`), and kubeconfigs kept out of the
//! store's clear text, the answers and the logs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::*;
use crate::facade::Facade;

/// A marker that must never leave the request: the kubeconfig's token.
const SECRET: &str = "s3cr3t-bearer-d41d8cd9";

fn kubeconfig(ca_pem: Option<&str>) -> String {
    let ca = ca_pem
        .map(|pem| {
            format!(
                ", certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{{name: k, cluster: {{server: 'https://10.0.0.1:6443'{ca}}}}}]\n\
         users: [{{name: u, user: {{token: {SECRET}}}}}]\n\
         contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
    )
}

fn ca() -> String {
    rcgen::generate_simple_self_signed(vec!["ca.test".into()])
        .unwrap()
        .cert
        .pem()
}

struct Fixture {
    facade: Facade,
    store: Store,
    accounts: Accounts,
}

async fn fixture(key: bool, clouddriver: Option<ClouddriverConfig>) -> Fixture {
    let store = Store::open("sqlite::memory:").await.unwrap();
    let accounts = Accounts::new();
    let cipher = key.then(|| Cipher::new(&[42; crypto::KEY_LEN]).unwrap());
    let dynamic =
        Dynamic::new(store.clone(), cipher, accounts.clone()).with_clouddriver(clouddriver);
    let facade =
        Facade::new(accounts.clone(), Duration::from_secs(5)).with_dynamic(Arc::new(dynamic));
    Fixture {
        facade,
        store,
        accounts,
    }
}

async fn call(
    f: &Fixture,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::from(bytes)))
        .unwrap();
    let resp = f.facade.handle(req).await;
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Everything logged while `f` runs, at every level.
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || Logs(writer.clone()))
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn create_list_delete_without_the_kubeconfig_in_store_answers_or_logs() {
    let (logs, _guard) = capture_logs();
    let f = fixture(true, None).await;
    let ca = ca();
    let body = json!({"name": "prod-eu", "kubeconfig": kubeconfig(Some(&ca)), "zone": "eu",
                      "namespaces": ["web"]});
    let (status, created) = call(&f, Method::POST, "/v1/accounts", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(created["name"], "prod-eu");
    assert_eq!(created["zone"], "eu");
    assert_eq!(created["namespaces"], json!(["web"]));
    assert_eq!(created["agentId"], "");
    assert_eq!(created["caFingerprint"].as_str().unwrap().len(), 64);

    // Sealed in the store: the kubeconfig's bytes are not there in clear.
    let row = f.store.dynamic_account("prod-eu").await.unwrap().unwrap();
    let stored = &row.sealed_kubeconfig;
    assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
    assert!(!stored.windows(10).any(|w| w == b"apiVersion"));
    assert!(format!("{row:?}").find(SECRET).is_none());

    let (status, list) = call(&f, Method::GET, "/v1/dynamic-accounts", None).await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert!(list[0].get("kubeconfig").is_none());
    assert!(!list.to_string().contains(SECRET));

    // An agent claims it and gets the kubeconfig back, opened.
    let rows = f
        .store
        .claim_dynamic("agent-1", "eu", DEFAULT_ASSIGNMENT_TTL, |_| true)
        .await
        .unwrap();
    let cipher = Cipher::new(&[42; crypto::KEY_LEN]).unwrap();
    let opened = cipher.open("prod-eu", &rows[0].sealed_kubeconfig).unwrap();
    assert!(String::from_utf8(opened).unwrap().contains(SECRET));
    let (_, list) = call(&f, Method::GET, "/v1/dynamic-accounts", None).await;
    assert!(list.contains("\"agentId\":\"agent-1\""), "{list}");

    // Served here: deleting it withdraws it (removed once offline).
    f.accounts.get_or_create("prod-eu").cache_opened("agent-1");
    let (status, deleted) = call(&f, Method::DELETE, "/v1/accounts/prod-eu", None).await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert!(!deleted.contains(SECRET));
    assert!(f.store.dynamic_account("prod-eu").await.unwrap().is_none());
    assert!(f.accounts.get("prod-eu").unwrap().withdrawn());
    let (status, _) = call(&f, Method::DELETE, "/v1/accounts/prod-eu", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Never online: the name is free for another cluster at once.
    let other = json!({"name": "prod-eu", "kubeconfig": kubeconfig(Some(&self::ca()))});
    let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(other)).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, _) = call(&f, Method::DELETE, "/v1/accounts/prod-eu", None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, list) = call(&f, Method::GET, "/v1/dynamic-accounts", None).await;
    assert_eq!(list, "[]");

    // A bad kubeconfig is refused without being quoted.
    let bad = json!({"name": "x", "kubeconfig": format!("token: {SECRET}: [")});
    let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(!answer.contains(SECRET), "{answer}");
    let wrong_type = json!({"name": "x", "kubeconfig": kubeconfig(None), "namespaces": SECRET});
    let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(wrong_type)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(!answer.contains(SECRET), "{answer}");

    let logged = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("dynamic account stored"),
        "nothing logged: {logged}"
    );
    assert!(
        !logged.contains(SECRET),
        "a secret reached the logs: {logged}"
    );
}

#[tokio::test]
async fn without_a_key_nothing_is_stored_and_the_answer_says_why() {
    let f = fixture(false, None).await;
    let body = json!({"name": "prod", "kubeconfig": kubeconfig(None)});
    let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(answer.contains("encryptionKeyFile"), "{answer}");
    assert!(f.store.dynamic_accounts().await.unwrap().is_empty());
    let (status, _) = call(&f, Method::POST, "/v1/accounts/prod/migrate", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_name_held_for_another_cluster_is_refused_with_409() {
    let f = fixture(true, None).await;
    let (first, second) = (ca(), ca());
    let post = |pem: &str| json!({"name": "prod", "kubeconfig": kubeconfig(Some(pem))});
    let (status, _) = call(&f, Method::POST, "/v1/accounts", Some(post(&first))).await;
    assert_eq!(status, StatusCode::CREATED);
    // The same cluster again is an update.
    let (status, _) = call(&f, Method::POST, "/v1/accounts", Some(post(&first))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(post(&second))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["reason"], "Conflict");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("another cluster"),
        "{answer}"
    );
    // The stored account is still the first cluster's.
    let held = f.store.dynamic_account("prod").await.unwrap().unwrap();
    let expected = kubeconfig::check(&kubeconfig(Some(&first)), None).unwrap();
    assert_eq!(held.ca_fingerprint, expected.ca_fingerprint);
    // A name a cache stream already holds for another cluster, too.
    f.store
        .claim_fingerprint("static", &"cd".repeat(32))
        .await
        .unwrap();
    let body = json!({"name": "static", "kubeconfig": kubeconfig(Some(&first))});
    let (status, _) = call(&f, Method::POST, "/v1/accounts", Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn bad_names_and_unknown_fields_are_refused() {
    let f = fixture(true, None).await;
    for body in [
        json!({"name": "Bad Name", "kubeconfig": kubeconfig(None)}),
        json!({"name": "../x", "kubeconfig": kubeconfig(None)}),
        json!({"name": "ok", "kubeconfig": kubeconfig(None), "namespaces": ["a/b"]}),
        json!({"name": "ok", "kubeconfig": kubeconfig(None), "extra": 1}),
        json!({"name": "ok"}),
    ] {
        let (status, answer) = call(&f, Method::POST, "/v1/accounts", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
    }
    assert!(f.store.dynamic_accounts().await.unwrap().is_empty());
}

#[tokio::test]
async fn migration_reads_a_kubeconfig_file_it_can_reach_and_says_why_not_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("legacy.kubeconfig");
    std::fs::write(&file, kubeconfig(None)).unwrap();
    let read = stored_kubeconfig(
        "legacy",
        &json!({"name": "legacy", "kubeconfigFile": file.display().to_string()}),
    )
    .await
    .unwrap();
    assert!(read.contains(SECRET));
    // Contents win over a file.
    let both = json!({"name": "legacy", "kubeconfigContents": "inline",
                      "kubeconfigFile": file.display().to_string()});
    assert_eq!(stored_kubeconfig("legacy", &both).await.unwrap(), "inline");

    let refused = |definition: Value, says: &'static str| async move {
        let e = stored_kubeconfig("legacy", &definition).await.unwrap_err();
        assert!(matches!(e, Error::NotMigratable(_)), "{e:?}");
        let message = e.to_string();
        assert!(message.contains(says), "{message}");
        assert!(!message.contains(SECRET), "{message}");
    };
    let missing = dir.path().join("absent.kubeconfig").display().to_string();
    refused(
        json!({"kubeconfigFile": missing}),
        "cannot read (entity not found)",
    )
    .await;
    refused(
        json!({"kubeconfigFile": "encryptedFile:s3!r:us-west-2!b:b!f:kc"}),
        "not an absolute path",
    )
    .await;
    refused(
        json!({"kubeconfigFile": dir.path().display().to_string()}),
        "not a file",
    )
    .await;
    refused(json!({"serviceAccount": true}), "own service account").await;
    refused(json!({"name": "legacy"}), "neither kubeconfigContents nor").await;
    // Every refusal names what to do instead.
    let e = stored_kubeconfig("legacy", &json!({"kubeconfigFile": "rel/kc"}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("POST /v1/accounts"), "{e}");
}

#[tokio::test]
async fn migration_without_clouddriver_configured_says_so() {
    let f = fixture(true, None).await;
    let (status, answer) = call(&f, Method::POST, "/v1/accounts/legacy/migrate", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(answer.contains("clouddriver.baseUrl"), "{answer}");
}
