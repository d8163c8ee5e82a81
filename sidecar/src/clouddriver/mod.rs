//! Making accounts known to Clouddriver, as its source implements the
//! account management API (clouddriver-web `CredentialsController`,
//! clouddriver-core `AccountDefinitionService`). Start with [`Registrar`].
//!
//! For an online account the sidecar writes a `kubernetes` definition
//! ([`definition`]) whose `kubeconfigContents` points at its facade with
//! `PUT {baseUrl}/credentials` — the upsert (`saveAccount`); `POST` only
//! creates, and answers 400 for a name Clouddriver already has. A 200 means
//! *stored*: Clouddriver loads stored accounts at start-up and at each
//! reload of its credentials poller (kork `BasicCredentialsLoader`,
//! `PollerConfiguration`), so the account is called registered only once
//! `GET {baseUrl}/credentials/{name}` — which answers from the *loaded*
//! accounts (`AccountCredentialsProvider`) — shows it, loaded from this
//! definition ([`definition::loaded_from`]). A registered account is
//! re-checked now and then, and written again if Clouddriver lost it.
//!
//! Several sidecars share Clouddriver's one account store, so each
//! account's registration has one owner: the sidecar holding its lease
//! ([`crate::ownership`]). Only it writes the definition; a sidecar whose
//! account went away deletes it (`DELETE {baseUrl}/credentials/{name}`)
//! only after taking the lease itself — never while another sidecar
//! serves the account, so a handover never removes a live account.
//!
//! For Clouddriver without that API, one kubeconfig file per account is
//! written to (and removed from) `kubeconfigDir`.
//!
//! Calls are made by one worker task, level-triggered: [`Registrar::want`]
//! records what should be true of an account and wakes the worker, which
//! retries a failing call with exponential backoff and full jitter until it
//! succeeds or the wish changes. Kubeconfig contents never reach logs.

mod answer;
mod definition;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use answer::CallError;
pub use definition::{definition, kubeconfig};

use crate::accounts::{Account, NamespaceScope, RegistrationUpdate};
use crate::config::ClouddriverConfig;
use crate::metrics::Metrics;
use crate::ownership::{Deregistration, Ownership};

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
/// Longest Clouddriver answer read: error bodies are small, and one loaded
/// account renders in a few KiB.
const BODY_LIMIT: usize = 1 << 20;

/// What should be true of an account in Clouddriver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wish {
    Registered,
    Deregistered,
}

/// Where an account's registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A write (or, for [`Wish::Deregistered`], the delete) is due.
    Write,
    /// Stored since the instant given; waiting for Clouddriver to load it.
    Confirm(Instant),
    /// Loaded: re-checked now and then.
    Live,
    /// Nothing more to do.
    Done,
}

#[derive(Debug)]
struct Entry {
    account: Arc<Account>,
    wish: Wish,
    /// The namespaces of the definition to register (with
    /// [`Wish::Registered`]); the definition is built from them only when a
    /// call is made.
    scope: NamespaceScope,
    step: Step,
    stored: bool,
    live: bool,
    failures: u32,
    next_try: Option<Instant>,
}

#[derive(Debug)]
struct Shared {
    config: ClouddriverConfig,
    facade_url: String,
    ownership: Option<Arc<Ownership>>,
    entries: Mutex<BTreeMap<String, Entry>>,
    wake: Notify,
    metrics: Metrics,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Registers and deregisters accounts with Clouddriver.
#[derive(Debug)]
pub struct Registrar {
    shared: Arc<Shared>,
    stop: CancellationToken,
    worker: JoinHandle<()>,
}

impl Registrar {
    /// Starts the worker. `facade_url` is the facade's base URL as
    /// Clouddriver reaches it (`clouddriver.facadeUrl` wins when set).
    /// With `ownership`, only the holder of an account's lease writes its
    /// definition and a definition is deleted only under the lease.
    pub fn start(
        config: ClouddriverConfig,
        facade_url: &str,
        ownership: Option<Arc<Ownership>>,
        metrics: Metrics,
    ) -> Self {
        let facade_url = config
            .facade_url
            .clone()
            .unwrap_or_else(|| facade_url.to_owned())
            .trim_end_matches('/')
            .to_owned();
        let shared = Arc::new(Shared {
            config,
            facade_url,
            ownership,
            entries: Mutex::default(),
            wake: Notify::new(),
            metrics,
            client: Client::builder(TokioExecutor::new()).build_http(),
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
    /// its agent watches). Idempotent: wishing what is already wished makes
    /// no call; a registered account whose definition changed is written
    /// again.
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
        let (stored, live) = match entries.get_mut(account.name()) {
            Some(e) if e.wish == wish && (wish == Wish::Deregistered || e.scope == scope) => return,
            Some(e) => {
                if e.wish == wish {
                    tracing::info!(account = account.name(), "account definition changed");
                }
                e.wish = wish;
                e.scope = scope;
                e.step = Step::Write;
                e.failures = 0;
                e.next_try = None;
                e.account = account.clone();
                (e.stored, e.live)
            }
            None if wish == Wish::Deregistered => return,
            None => {
                entries.insert(
                    account.name().to_owned(),
                    Entry {
                        account: account.clone(),
                        wish,
                        scope,
                        step: Step::Write,
                        stored: false,
                        live: false,
                        failures: 0,
                        next_try: None,
                    },
                );
                (false, false)
            }
        };
        account.set_registration(RegistrationUpdate {
            state: "pending",
            stored,
            live,
            error: None,
        });
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

fn backoff(config: &ClouddriverConfig, failures: u32) -> Duration {
    let initial = config.retry.initial_millis.max(1);
    let cap = config
        .retry
        .max_millis
        .min(initial.saturating_mul(1u64 << failures.min(20)));
    // Full jitter: a fleet of sidecars retrying a restarted Clouddriver spreads out.
    Duration::from_millis(rand::rng().random_range(initial / 2..=cap.max(initial / 2)))
}

/// One step to take, copied out of an [`Entry`] so the lock is not held
/// across its calls.
struct Due {
    name: String,
    wish: Wish,
    scope: NamespaceScope,
    step: Step,
}

/// What a step found.
enum Outcome {
    /// The definition is stored; confirm it is loaded next.
    Stored,
    /// Stored, not loaded yet (or loaded from another definition).
    NotLoaded,
    /// Loaded from this definition (or written as a file): registered.
    Live,
    /// Clouddriver no longer serves the registered account: write it again.
    Lost,
    /// Another sidecar holds the account: it owns the registration.
    Elsewhere,
    /// Deleted (or never there).
    Deregistered,
    /// Another sidecar held the account last; its grace period runs until
    /// then: it deletes the definition itself, or, if it died, this one
    /// does then.
    NotBefore(Instant),
}

async fn work(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let now = Instant::now();
        let due: Vec<Due> = {
            let entries = shared
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            entries
                .iter()
                .filter(|(_, e)| e.step != Step::Done && e.next_try.is_none_or(|t| t <= now))
                .map(|(n, e)| Due {
                    name: n.clone(),
                    wish: e.wish,
                    scope: e.scope.clone(),
                    step: e.step,
                })
                .collect()
        };
        for due in due {
            if stop.is_cancelled() {
                return;
            }
            let result = step(&shared, &due).await;
            settle(&shared, &due, result);
        }
        let next = {
            let entries = shared
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            entries
                .values()
                .filter(|e| e.step != Step::Done)
                .map(|e| e.next_try.unwrap_or(now))
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

/// Takes one step for `due`.
async fn step(shared: &Shared, due: &Due) -> Result<Outcome, CallError> {
    let name = due.name.as_str();
    match (due.wish, due.step) {
        (Wish::Registered, Step::Write) => {
            if !owns(shared, name).await? {
                return Ok(Outcome::Elsewhere);
            }
            let def = definition(&shared.config, &shared.facade_url, name, &due.scope);
            save(shared, name, &def).await
        }
        (Wish::Registered, Step::Confirm(_) | Step::Live) => {
            if due.step == Step::Live && !owns(shared, name).await? {
                return Ok(Outcome::Elsewhere);
            }
            let def = definition(&shared.config, &shared.facade_url, name, &due.scope);
            let loaded = check(shared, name, &def).await;
            shared
                .metrics
                .registration("clouddriver", "check", loaded.is_ok());
            Ok(match (loaded?, due.step) {
                (true, _) => Outcome::Live,
                (false, Step::Live) => Outcome::Lost,
                (false, _) => Outcome::NotLoaded,
            })
        }
        (Wish::Deregistered, _) => delete(shared, name).await,
        // Never due: a registered account is never done, only live.
        (Wish::Registered, Step::Done) => Ok(Outcome::Live),
    }
}

/// Whether this sidecar owns `name`'s registration (holds its lease).
async fn owns(shared: &Shared, name: &str) -> Result<bool, CallError> {
    let Some(ownership) = &shared.ownership else {
        return Ok(true);
    };
    Ok(ownership.holds(name).await?)
}

/// Records what a step found in the entry, if the wish is still the one
/// the step acted on.
fn settle(shared: &Shared, due: &Due, result: Result<Outcome, CallError>) {
    let mut entries = shared
        .entries
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let Some(e) = entries.get_mut(&due.name) else {
        return;
    };
    if e.wish != due.wish || e.scope != due.scope || e.step != due.step {
        // The wish changed while the step ran; the next pass acts on it.
        return;
    }
    let config = &shared.config;
    let now = Instant::now();
    let name = due.name.as_str();
    let mut error = None;
    let state = match result {
        Ok(outcome) => {
            if !matches!(outcome, Outcome::NotLoaded) {
                e.failures = 0;
            }
            match outcome {
                Outcome::Stored => {
                    e.stored = true;
                    e.step = Step::Confirm(now);
                    e.next_try = None;
                    tracing::info!(account = %name, "stored in Clouddriver; waiting for it to load the account");
                    "stored"
                }
                Outcome::NotLoaded => {
                    let since = match e.step {
                        Step::Confirm(since) => since,
                        _ => now,
                    };
                    e.next_try = Some(now + Duration::from_millis(config.live_check_millis));
                    e.live = false;
                    if since.elapsed() >= Duration::from_secs(config.live_timeout_seconds) {
                        let message = format!(
                            "Clouddriver stored the account {} s ago but has not loaded it: \
                             set credentials.poller.enabled and \
                             credentials.poller.types.kubernetes.reloadFrequencyMs in Clouddriver, \
                             and look for \"Skipping invalid account definition\" in its log",
                            since.elapsed().as_secs()
                        );
                        if e.failures == 0 {
                            shared.metrics.registration_failure("not_loaded");
                        }
                        e.failures = e.failures.saturating_add(1);
                        error = Some(("not_loaded", message));
                    }
                    "stored"
                }
                Outcome::Live => {
                    if !e.live {
                        tracing::info!(account = %name, "registered: Clouddriver serves the account");
                    }
                    e.stored = true;
                    e.live = true;
                    e.step = Step::Live;
                    e.next_try = Some(now + Duration::from_secs(config.recheck_seconds));
                    "registered"
                }
                Outcome::Lost => {
                    tracing::warn!(account = %name, "Clouddriver no longer serves the account; writing it again");
                    e.stored = false;
                    e.live = false;
                    e.step = Step::Write;
                    e.next_try = None;
                    "pending"
                }
                Outcome::Elsewhere => {
                    e.stored = false;
                    e.live = false;
                    if due.wish == Wish::Registered {
                        // Ours again once its lease is: look again soon.
                        e.step = Step::Write;
                        e.next_try = Some(now + Duration::from_millis(config.live_check_millis));
                    } else {
                        tracing::info!(account = %name, "another sidecar serves the account; its definition stays");
                        e.step = Step::Done;
                    }
                    "elsewhere"
                }
                Outcome::NotBefore(at) => {
                    e.stored = false;
                    e.live = false;
                    e.next_try = Some(at);
                    "elsewhere"
                }
                Outcome::Deregistered => {
                    tracing::info!(account = %name, "deregistered from Clouddriver");
                    e.stored = false;
                    e.live = false;
                    e.step = Step::Done;
                    "deregistered"
                }
            }
        }
        Err(err) => {
            let delay = backoff(config, e.failures);
            e.failures = e.failures.saturating_add(1);
            e.next_try = Some(now + delay);
            let reason = err.reason();
            shared.metrics.registration_failure(reason);
            tracing::warn!(
                account = %name, reason, error = %err, failures = e.failures,
                retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "Clouddriver registration failed; retrying"
            );
            error = Some((reason, err.to_string()));
            "retrying"
        }
    };
    e.account.set_registration(RegistrationUpdate {
        state,
        stored: e.stored,
        live: e.live,
        error,
    });
    if e.step == Step::Done {
        // Nothing more to do: an account that comes back starts anew.
        entries.remove(name);
    }
}

/// Writes `def` for `name`: the kubeconfig file, and `PUT /credentials`.
async fn save(shared: &Shared, name: &str, def: &Value) -> Result<Outcome, CallError> {
    if let Some(dir) = &shared.config.kubeconfig_dir {
        let r = write_kubeconfig(dir, name, &kubeconfig(&shared.facade_url, name)).await;
        shared
            .metrics
            .registration("kubeconfig", "register", r.is_ok());
        r?;
    }
    let Some(base) = &shared.config.base_url else {
        return Ok(Outcome::Live);
    };
    let url = format!("{}/credentials", base.trim_end_matches('/'));
    let body = serde_json::to_vec(def).unwrap_or_default();
    let r = call(shared, Method::PUT, &url, Some(body))
        .await
        .map(|_| ());
    shared
        .metrics
        .registration("clouddriver", "save", r.is_ok());
    r.map(|()| Outcome::Stored)
}

/// Whether Clouddriver serves `name`, loaded from `def`.
async fn check(shared: &Shared, name: &str, def: &Value) -> Result<bool, CallError> {
    let Some(base) = &shared.config.base_url else {
        return Ok(true);
    };
    let url = account_url(base, name);
    match call(shared, Method::GET, &url, None).await {
        Ok(body) => {
            let live: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            Ok(definition::loaded_from(&live, def))
        }
        // CredentialsController.getAccountCredentialsDetails: not loaded.
        Err(CallError::Refused { status, .. }) if status == StatusCode::NOT_FOUND => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes `name`'s kubeconfig file and, under its lease, its definition.
async fn delete(shared: &Shared, name: &str) -> Result<Outcome, CallError> {
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
        return Ok(Outcome::Deregistered);
    };
    // No other sidecar may take the account while its definition goes.
    let fence = match &shared.ownership {
        None => None,
        Some(ownership) => match ownership.deregistration(name).await {
            Ok(Deregistration::Fenced(epoch)) => Some((ownership, epoch)),
            Ok(Deregistration::Elsewhere) => return Ok(Outcome::Elsewhere),
            Ok(Deregistration::NotBefore(at)) => return Ok(Outcome::NotBefore(at)),
            Err(e) => return Err(e.into()),
        },
    };
    let r = match call(shared, Method::DELETE, &account_url(base, name), None).await {
        // SqlAccountDefinitionRepository.delete: no stored account. Gone
        // already is what was wanted.
        Err(CallError::Refused { status, .. }) if status == StatusCode::NOT_FOUND => Ok(()),
        r => r.map(|_| ()),
    };
    if let Some((ownership, epoch)) = fence {
        ownership.unfence(name, epoch).await;
    }
    shared
        .metrics
        .registration("clouddriver", "delete", r.is_ok());
    r.map(|()| Outcome::Deregistered)
}

fn account_url(base: &str, name: &str) -> String {
    format!(
        "{}/credentials/{}",
        base.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(name, SEGMENT)
    )
}

/// Makes one call; a success's body, or what the error means.
async fn call(
    shared: &Shared,
    method: Method,
    url: &str,
    body: Option<Vec<u8>>,
) -> Result<Bytes, CallError> {
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
    let resp = tokio::time::timeout(timeout, shared.client.request(req))
        .await
        .map_err(|_| CallError::Timeout(timeout))?
        .map_err(|e| CallError::Transport(e.to_string()))?;
    let status = resp.status();
    let bytes = tokio::time::timeout(
        timeout,
        Limited::new(resp.into_body(), BODY_LIMIT).collect(),
    )
    .await
    .map_err(|_| CallError::Timeout(timeout))?
    .map(http_body_util::Collected::to_bytes);
    match bytes {
        Ok(bytes) if status.is_success() => Ok(bytes),
        Ok(bytes) => Err(answer::refused(
            status,
            &bytes,
            shared.config.user.as_deref(),
        )),
        Err(_) if status.is_success() => Err(CallError::Transport(format!(
            "Clouddriver's answer was cut short or over {BODY_LIMIT} bytes"
        ))),
        Err(_) => Err(answer::refused(status, b"", shared.config.user.as_deref())),
    }
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
