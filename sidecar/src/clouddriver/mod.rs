//! Making accounts known to Clouddriver. When an account comes online the
//! sidecar registers it through Clouddriver's account management API
//! (`POST {baseUrl}/credentials`, `PUT` when it already exists there) as a
//! `kubernetes` account whose `kubeconfigContents` points at this sidecar's
//! facade, limited to the namespaces its agent watches; when that definition
//! changes (the agent watches other namespaces) it is `PUT` again. When the
//! account is removed after its grace period it is
//! deregistered (`DELETE {baseUrl}/credentials/{name}`). For Clouddriver
//! without that API, one kubeconfig file per account is written to (and
//! removed from) `kubeconfigDir`. Start with [`Registrar`].
//!
//! Calls are made by one worker task, level-triggered: [`Registrar::want`]
//! records what should be true of an account and wakes the worker, which
//! retries a failing call with exponential backoff and full jitter until it
//! succeeds or the wish changes. Kubeconfig contents never reach logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::{Account, NamespaceScope};
use crate::config::ClouddriverConfig;
use crate::metrics::Metrics;

/// The account type discriminator of Clouddriver's Kubernetes accounts.
pub const ACCOUNT_TYPE: &str = "kubernetes";
/// The header Clouddriver (Fiat) reads the calling user from.
pub const USER_HEADER: &str = "X-SPINNAKER-USER";
/// Bytes escaped in an account name used as a path segment or query
/// value: all but RFC 3986's unreserved characters.
pub const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
/// Longest Clouddriver error body kept for the accounts API.
const ERROR_BODY_LIMIT: usize = 512;

/// What should be true of an account in Clouddriver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wish {
    Registered,
    Deregistered,
}

#[derive(Debug)]
struct Entry {
    account: Arc<Account>,
    wish: Wish,
    /// The namespaces of the definition to register (with
    /// [`Wish::Registered`]); the definition is built from them only when a
    /// call is made.
    scope: NamespaceScope,
    /// What Clouddriver (and the directory) hold, as far as we know.
    done: Option<Wish>,
    /// Clouddriver holds a definition of ours for the account: a changed one
    /// is put over it at once, with no `POST` first.
    exists: bool,
    failures: u32,
    next_try: Option<Instant>,
}

#[derive(Debug)]
struct Shared {
    config: ClouddriverConfig,
    facade_url: String,
    entries: Mutex<BTreeMap<String, Entry>>,
    wake: Notify,
    metrics: Metrics,
}

/// Registers and deregisters accounts with Clouddriver.
#[derive(Debug)]
pub struct Registrar {
    shared: Arc<Shared>,
    stop: CancellationToken,
    worker: JoinHandle<()>,
}

/// Why one call failed.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("Clouddriver answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("Clouddriver unreachable: {0}")]
    Transport(String),
    #[error("no answer from Clouddriver within {0:?}")]
    Timeout(Duration),
    #[error("kubeconfig file {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Registrar {
    /// Starts the worker. `facade_url` is the facade's base URL as
    /// Clouddriver reaches it (`clouddriver.facadeUrl` wins when set).
    pub fn start(config: ClouddriverConfig, facade_url: &str, metrics: Metrics) -> Self {
        let facade_url = config
            .facade_url
            .clone()
            .unwrap_or_else(|| facade_url.to_owned())
            .trim_end_matches('/')
            .to_owned();
        let shared = Arc::new(Shared {
            config,
            facade_url,
            entries: Mutex::default(),
            wake: Notify::new(),
            metrics,
        });
        let stop = CancellationToken::new();
        let worker = tokio::spawn(work(shared.clone(), stop.clone()));
        Self {
            shared,
            stop,
            worker,
        }
    }

    /// Records that `account` should be registered (`true`) or not, with
    /// the definition it has now ([`definition`]; it follows the namespaces
    /// its agent watches). Idempotent: wishing what is already done makes no
    /// call; a registered account whose definition changed is put again.
    pub fn want(&self, account: &Arc<Account>, registered: bool) {
        let wish = if registered {
            Wish::Registered
        } else {
            Wish::Deregistered
        };
        let scope = if registered {
            account.scope()
        } else {
            NamespaceScope::default()
        };
        let mut entries = self
            .shared
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match entries.get_mut(account.name()) {
            Some(e) if e.wish == wish && (wish == Wish::Deregistered || e.scope == scope) => return,
            Some(e) => {
                if e.wish == wish {
                    tracing::info!(account = account.name(), "account definition changed");
                    e.done = None;
                }
                e.wish = wish;
                e.scope = scope;
                e.failures = 0;
                e.next_try = None;
                e.account = account.clone();
            }
            None if wish == Wish::Deregistered => return,
            None => {
                entries.insert(
                    account.name().to_owned(),
                    Entry {
                        account: account.clone(),
                        wish,
                        scope,
                        done: None,
                        exists: false,
                        failures: 0,
                        next_try: None,
                    },
                );
            }
        }
        account.set_registration("pending", None);
        drop(entries);
        self.shared.wake.notify_one();
    }

    /// Stops the worker. Accounts stay registered: Clouddriver keeps
    /// serving them through whichever sidecar takes them over.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.worker.await;
    }
}

/// The kubeconfig Clouddriver's kubectl uses for `account`: one cluster at
/// the facade's base path for the account, no credentials (the facade
/// listens on loopback beside Clouddriver).
pub fn kubeconfig(facade_url: &str, account: &str) -> String {
    let server = format!(
        "{}/accounts/{}",
        facade_url.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(account, SEGMENT)
    );
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": account, "cluster": {"server": server}}],
        "users": [{"name": "spinlink", "user": {}}],
        "contexts": [{"name": account, "context": {"cluster": account, "user": "spinlink"}}],
        "current-context": account,
    });
    serde_norway::to_string(&doc).unwrap_or_default()
}

/// The body of `POST`/`PUT {baseUrl}/credentials` for `account`, whose
/// agent watches `scope`: those namespaces, when it names any, else the
/// configured ones (`clouddriver.account.namespaces`).
pub fn definition(
    config: &ClouddriverConfig,
    facade_url: &str,
    account: &str,
    scope: &NamespaceScope,
) -> Value {
    let a = &config.account;
    let mut def = json!({
        "@type": ACCOUNT_TYPE,
        "name": account,
        "kubeconfigContents": kubeconfig(facade_url, account),
        "context": account,
        "onlySpinnakerManaged": a.only_spinnaker_managed,
        "cacheThreads": a.cache_threads,
        // Discovery decides the kinds; the facade serves them all.
        "checkPermissionsOnStartup": false,
    });
    if let Some(env) = &a.environment {
        def["environment"] = json!(env);
    }
    if !scope.namespaces.is_empty() {
        def["namespaces"] = json!(scope.namespaces);
    } else if !a.namespaces.is_empty() {
        def["namespaces"] = json!(a.namespaces);
    }
    if !scope.omit_namespaces.is_empty() {
        def["omitNamespaces"] = json!(scope.omit_namespaces);
    }
    if !a.permissions.is_empty() {
        def["permissions"] = json!(a.permissions);
    }
    def
}

fn backoff(config: &ClouddriverConfig, failures: u32) -> Duration {
    let initial = config.retry.initial_millis.max(1);
    let cap = config
        .retry
        .max_millis
        .min(initial.saturating_mul(1u64 << failures.min(20)));
    // Full jitter: a fleet of sidecars retrying a restarted Clouddriver spreads out.
    Duration::from_millis(rand::rng().random_range(initial / 2..=cap.max(initial / 2)))
}

/// One call to make, taken from an [`Entry`] so the lock is not held
/// across it.
struct Due {
    name: String,
    account: Arc<Account>,
    wish: Wish,
    scope: NamespaceScope,
    exists: bool,
}

async fn work(shared: Arc<Shared>, stop: CancellationToken) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    loop {
        let now = Instant::now();
        let due: Vec<Due> = {
            let entries = shared
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            entries
                .iter()
                .filter(|(_, e)| e.done != Some(e.wish) && e.next_try.is_none_or(|t| t <= now))
                .map(|(n, e)| Due {
                    name: n.clone(),
                    account: e.account.clone(),
                    wish: e.wish,
                    scope: e.scope.clone(),
                    exists: e.exists,
                })
                .collect()
        };
        for Due {
            name,
            account,
            wish,
            scope,
            exists,
        } in due
        {
            let result = match wish {
                Wish::Registered => {
                    let def = definition(&shared.config, &shared.facade_url, &name, &scope);
                    let body = serde_json::to_vec(&def).unwrap_or_default();
                    register(&shared, &client, &name, body, exists).await
                }
                Wish::Deregistered => deregister(&shared, &client, &name).await,
            };
            let mut entries = shared
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Some(e) = entries.get_mut(&name) else {
                continue;
            };
            if e.wish != wish || e.scope != scope {
                // The wish changed while the call ran; the next pass acts on it.
                continue;
            }
            match result {
                Ok(()) => {
                    e.done = Some(wish);
                    e.exists = wish == Wish::Registered && shared.config.base_url.is_some();
                    e.failures = 0;
                    e.next_try = None;
                    let state = match wish {
                        Wish::Registered => "registered",
                        Wish::Deregistered => "deregistered",
                    };
                    tracing::info!(account = %name, state, "Clouddriver registration");
                    account.set_registration(state, None);
                }
                Err(error) => {
                    let delay = backoff(&shared.config, e.failures);
                    e.failures = e.failures.saturating_add(1);
                    e.next_try = Some(Instant::now() + delay);
                    tracing::warn!(
                        account = %name, %error, failures = e.failures,
                        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        "Clouddriver registration failed; retrying"
                    );
                    account.set_registration("retrying", Some(error.to_string()));
                }
            }
        }
        let next = {
            let entries = shared
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            entries
                .values()
                .filter(|e| e.done != Some(e.wish))
                .filter_map(|e| e.next_try)
                .min()
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.wake.notified() => {}
            () = sleep => {}
        }
    }
}

/// Registers `name` with the definition `body`: `POST`, then `PUT` when
/// Clouddriver already has the name; only `PUT` when it `exists` (ours,
/// changed since).
async fn register(
    shared: &Shared,
    client: &Client<HttpConnector, Full<Bytes>>,
    name: &str,
    body: Vec<u8>,
    exists: bool,
) -> Result<(), CallError> {
    if let Some(dir) = &shared.config.kubeconfig_dir {
        let r = write_kubeconfig(dir, name, &kubeconfig(&shared.facade_url, name)).await;
        shared
            .metrics
            .registration("kubeconfig", "register", r.is_ok());
        r?;
    }
    let Some(base) = &shared.config.base_url else {
        return Ok(());
    };
    let url = format!("{}/credentials", base.trim_end_matches('/'));
    if exists {
        let updated = call(shared, client, Method::PUT, &url, Some(body)).await;
        shared
            .metrics
            .registration("clouddriver", "update", updated.is_ok());
        return updated;
    }
    let created = call(shared, client, Method::POST, &url, Some(body.clone())).await;
    shared
        .metrics
        .registration("clouddriver", "create", created.is_ok());
    match created {
        Ok(()) => Ok(()),
        // The account is already stored (an earlier run, another sidecar,
        // or an operator): update it to point at this facade. Clouddriver's
        // repository reports a duplicate as a conflict, a bad request or an
        // internal error depending on its store; 502-504 mean it is not up.
        Err(CallError::Status { status, .. })
            if status == StatusCode::CONFLICT
                || status == StatusCode::BAD_REQUEST
                || status == StatusCode::INTERNAL_SERVER_ERROR =>
        {
            let updated = call(shared, client, Method::PUT, &url, Some(body)).await;
            shared
                .metrics
                .registration("clouddriver", "update", updated.is_ok());
            updated
        }
        Err(e) => Err(e),
    }
}

async fn deregister(
    shared: &Shared,
    client: &Client<HttpConnector, Full<Bytes>>,
    name: &str,
) -> Result<(), CallError> {
    if let Some(dir) = &shared.config.kubeconfig_dir {
        let path = kubeconfig_path(dir, name);
        let r = match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(CallError::File { path, source: e })
            }
            _ => Ok(()),
        };
        shared
            .metrics
            .registration("kubeconfig", "deregister", r.is_ok());
        r?;
    }
    let Some(base) = &shared.config.base_url else {
        return Ok(());
    };
    let url = format!(
        "{}/credentials/{}",
        base.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(name, SEGMENT)
    );
    let r = match call(shared, client, Method::DELETE, &url, None).await {
        // Already gone is what we wanted.
        Err(CallError::Status { status, .. }) if status == StatusCode::NOT_FOUND => Ok(()),
        r => r,
    };
    shared
        .metrics
        .registration("clouddriver", "delete", r.is_ok());
    r
}

async fn call(
    shared: &Shared,
    client: &Client<HttpConnector, Full<Bytes>>,
    method: Method,
    url: &str,
    body: Option<Vec<u8>>,
) -> Result<(), CallError> {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header(header::ACCEPT, "application/json");
    if let Some(user) = &shared.config.user {
        req = req.header(USER_HEADER, user);
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| CallError::Transport(e.to_string()))?;
    let timeout = shared.config.request_timeout();
    let resp = tokio::time::timeout(timeout, client.request(req))
        .await
        .map_err(|_| CallError::Timeout(timeout))?
        .map_err(|e| CallError::Transport(e.to_string()))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let bytes = tokio::time::timeout(timeout, resp.into_body().collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let end = bytes.len().min(ERROR_BODY_LIMIT);
    Err(CallError::Status {
        status,
        body: String::from_utf8_lossy(&bytes[..end]).into_owned(),
    })
}

fn kubeconfig_path(dir: &Path, name: &str) -> PathBuf {
    // Account names are DNS-1123-like, but a name is input: keep it to one
    // path component.
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}.yaml"))
}

/// Writes atomically (a temporary file renamed over the old one), so
/// Clouddriver never reads half a kubeconfig.
async fn write_kubeconfig(dir: &Path, name: &str, contents: &str) -> Result<(), CallError> {
    let path = kubeconfig_path(dir, name);
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|f| f.to_str()).unwrap_or("x")
    ));
    let err = |source| CallError::File {
        path: path.clone(),
        source,
    };
    tokio::fs::create_dir_all(dir).await.map_err(err)?;
    tokio::fs::write(&tmp, contents).await.map_err(err)?;
    tokio::fs::rename(&tmp, &path).await.map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_has_the_managed_account_shape() {
        let mut config = ClouddriverConfig::default();
        config.account.namespaces = vec!["a".into()];
        config
            .account
            .permissions
            .insert("READ".into(), vec!["dev".into()]);
        let def = definition(
            &config,
            "http://127.0.0.1:7003/",
            "prod-1",
            &NamespaceScope::default(),
        );
        assert_eq!(def["@type"], "kubernetes");
        assert_eq!(def["name"], "prod-1");
        assert_eq!(def["namespaces"], json!(["a"]));
        assert!(def.get("omitNamespaces").is_none());
        // The agent's namespaces win over the configured ones.
        let scope = NamespaceScope {
            namespaces: vec!["b".into()],
            omit_namespaces: vec!["kube-system".into()],
        };
        let narrowed = definition(&config, "http://127.0.0.1:7003/", "prod-1", &scope);
        assert_eq!(narrowed["namespaces"], json!(["b"]));
        assert_eq!(narrowed["omitNamespaces"], json!(["kube-system"]));
        assert_eq!(def["permissions"]["READ"], json!(["dev"]));
        assert!(def.get("environment").is_none());
        let kc: Value =
            serde_norway::from_str(def["kubeconfigContents"].as_str().unwrap()).unwrap();
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "http://127.0.0.1:7003/accounts/prod-1"
        );
        assert_eq!(kc["current-context"], "prod-1");
    }

    #[test]
    fn kubeconfig_file_names_stay_in_the_directory() {
        let p = kubeconfig_path(Path::new("/d"), "../../etc/passwd");
        assert_eq!(p.parent(), Some(Path::new("/d")));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut config = ClouddriverConfig::default();
        config.retry.initial_millis = 100;
        config.retry.max_millis = 1000;
        for failures in 0..30 {
            let d = backoff(&config, failures);
            assert!(d <= Duration::from_millis(1000), "{d:?}");
            assert!(d >= Duration::from_millis(50), "{d:?}");
        }
    }
}
