//! A fake Clouddriver whose account management API answers as Clouddriver's
//! source does. Each rule names the file it models, so a reader can check
//! it against spinnaker/clouddriver, kork and fiat:
//!
//! - endpoints: clouddriver-web `controllers/CredentialsController.java`;
//! - create/save/update rules and Fiat checks: clouddriver-core
//!   `security/AccountDefinitionService.java`,
//!   `security/DefaultAccountSecurityPolicy.java`;
//! - storage: clouddriver-sql `security/SqlAccountDefinitionRepository.kt`
//!   (and `SqlAccountDefinitionException`, a kork `UserException`);
//! - the body's type: clouddriver-core `jackson/mixins/CredentialsDefinitionMixin.java`
//!   (`property = "type"`), clouddriver-kubernetes
//!   `config/KubernetesAccountProperties.java` (`ManagedAccount`, its fields,
//!   `validate()`);
//! - loading: kork-credentials-api `definition/BasicCredentialsLoader.java`,
//!   kork-credentials `poller/PollerConfiguration(Properties).java`,
//!   clouddriver-kubernetes `security/KubernetesCredentialsParser.java`,
//!   `config/KubernetesAccountDefinitionSourceConfiguration.java`;
//! - error bodies: kork-web `exceptions/GenericExceptionHandlers.java`,
//!   `exceptions/BaseExceptionHandlers.java` (a Spring
//!   `ResponseEntityExceptionHandler`), `config/ErrorConfiguration.groovy`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One call the fake answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: String,
    pub user: Option<String>,
    pub content_type: Option<String>,
    pub body: Value,
    pub status: u16,
}

/// A Fiat user.
#[derive(Debug, Clone, Default)]
pub struct FiatUser {
    pub admin: bool,
    /// Holds a role listed in `fiat.account.manager.roles`.
    pub account_manager: bool,
    pub roles: Vec<String>,
}

/// Fiat, as `DefaultAccountSecurityPolicy` asks it.
#[derive(Debug, Clone, Default)]
pub struct Fiat {
    pub users: BTreeMap<String, FiatUser>,
    /// Each account's WRITE roles as Fiat last synced them
    /// (`fiat.write-mode.sync-delay-ms`): Fiat knows no account it has not
    /// synced.
    pub synced: BTreeMap<String, Vec<String>>,
}

#[derive(Debug)]
pub struct State {
    /// `account.storage.enabled` (the `AccountDefinitionService` bean exists).
    pub storage_enabled: bool,
    /// `account.storage.kubernetes.enabled`: stored Kubernetes accounts are
    /// a definition source (`KubernetesAccountDefinitionSourceConfiguration`).
    pub kubernetes_storage: bool,
    /// Definitions in account storage, by name (the SQL `id` column).
    pub stored: BTreeMap<String, Value>,
    /// Accounts from Clouddriver's configuration files.
    pub configured: BTreeMap<String, Value>,
    /// Loaded accounts: the definition each was parsed from
    /// (`BasicCredentialsLoader.loadedDefinitions`).
    pub loaded: BTreeMap<String, Value>,
    /// Fiat, when it is on (`DefaultAccountSecurityPolicy`); off is
    /// `AllowAllAccountSecurityPolicy`.
    pub fiat: Option<Fiat>,
    /// Statuses answered first, in order, to any call (Clouddriver starting).
    pub down: VecDeque<u16>,
    pub calls: Vec<Call>,
    /// Definitions the loader skipped as invalid, with why.
    pub skipped: Vec<(String, String)>,
    /// Loads so far.
    pub reloads: u64,
}

/// The fake; clones share one state.
#[derive(Clone)]
pub struct FakeClouddriver {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
}

/// kork-web's error body (`ErrorConfiguration` drops `path`).
fn kork_error(status: u16, message: &str) -> Value {
    let error = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    json!({"timestamp": "2026-01-01T00:00:00.000+00:00", "status": status, "error": error,
           "message": message})
}

/// An answer: status and body (`None`: no body at all).
type Answer = (u16, Option<Value>);

fn err(status: u16, message: &str) -> Answer {
    (status, Some(kork_error(status, message)))
}

/// `CredentialsController.validateAccountStorageEnabled`: a
/// `ConfigurationException` (a `UserException`), so 400.
fn storage_off() -> Answer {
    err(
        400,
        "Cannot use AccountDefinitionService endpoints without enabling AccountDefinitionService bean",
    )
}

/// `HttpMessageNotReadableException`, answered by Spring's
/// `ResponseEntityExceptionHandler`: 400 and no body.
const UNREADABLE: Answer = (400, None);

/// `ManagedAccount`'s list and map fields; Jackson refuses a scalar where
/// one of them is due (no `ACCEPT_SINGLE_VALUE_AS_ARRAY`).
const LIST_FIELDS: [&str; 6] = [
    "namespaces",
    "omitNamespaces",
    "kinds",
    "omitKinds",
    "requiredGroupMembership",
    "oAuthScopes",
];

impl FakeClouddriver {
    /// A Clouddriver with account storage on (both flags) and Fiat off,
    /// loading stored accounts every `reload` (`credentials.poller`), or
    /// only at start-up (and [`FakeClouddriver::reload`]) with `None`.
    pub async fn start(reload: Option<Duration>) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Ok(Self::serve(listener, reload))
    }

    pub fn serve(listener: TcpListener, reload: Option<Duration>) -> Self {
        let addr = listener.local_addr().unwrap();
        let fake = FakeClouddriver {
            addr,
            state: Arc::new(Mutex::new(State {
                storage_enabled: true,
                kubernetes_storage: true,
                stored: BTreeMap::new(),
                configured: BTreeMap::new(),
                loaded: BTreeMap::new(),
                fiat: None,
                down: VecDeque::new(),
                calls: Vec::new(),
                skipped: Vec::new(),
                reloads: 0,
            })),
        };
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
        if let Some(every) = reload {
            // PollerConfiguration: a poller per type, every reloadFrequencyMs.
            let f = fake.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    f.reload();
                }
            });
        }
        fake
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    /// Stores `definition` as if saved earlier.
    pub fn store(&self, definition: Value) {
        let name = definition["name"].as_str().unwrap().to_owned();
        self.with(|s| s.stored.insert(name, definition));
    }

    pub fn stored(&self, name: &str) -> Option<Value> {
        self.with(|s| s.stored.get(name).cloned())
    }

    /// The definition Clouddriver serves `name` from, if it is loaded.
    pub fn loaded(&self, name: &str) -> Option<Value> {
        self.with(|s| s.loaded.get(name).cloned())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// Fiat syncs: it learns every loaded account's WRITE roles.
    pub fn fiat_sync(&self) {
        self.with(|s| {
            let synced = s
                .loaded
                .iter()
                .map(|(n, d)| (n.clone(), write_roles(d)))
                .collect();
            if let Some(fiat) = &mut s.fiat {
                fiat.synced = synced;
            }
        });
    }

    /// One load of every definition source (`BasicCredentialsLoader.parse`):
    /// accounts no source defines any more are removed; a new or changed
    /// definition is parsed (`KubernetesCredentialsParser`: an invalid one
    /// is logged and skipped, and an older one of the same name stays
    /// loaded); an unchanged one is left alone.
    pub fn reload(&self) {
        self.with(|s| {
            s.reloads += 1;
            let mut definitions: BTreeMap<String, Value> = s.configured.clone();
            if s.kubernetes_storage {
                for (name, d) in &s.stored {
                    definitions.entry(name.clone()).or_insert_with(|| d.clone());
                }
            }
            s.loaded.retain(|name, _| definitions.contains_key(name));
            for (name, d) in definitions {
                if s.loaded.get(&name) == Some(&d) {
                    continue;
                }
                match validate(&d) {
                    Ok(()) => {
                        s.loaded.insert(name, d);
                    }
                    Err(why) => s.skipped.push((name, why)),
                }
            }
        });
    }

    /// Waits (bounded) until `pred` holds of the calls so far.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Call]) -> bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !pred(&self.calls()) {
            if tokio::time::Instant::now() > deadline {
                bail!("fake Clouddriver never saw {what}: {:#?}", self.calls());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
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
        // fiat-api FiatAuthenticationFilter: the user is X-SPINNAKER-USER.
        let (user, content_type) = (header("x-spinnaker-user"), header("content-type"));
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let (status, answer) = {
            let mut s = self.state.lock().unwrap();
            let answer = match s.down.pop_front() {
                Some(status) => err(status, "starting"),
                None => s.account_api(&method, &path, &query, user.as_deref(), body.as_ref()),
            };
            s.calls.push(Call {
                method,
                path,
                query,
                user,
                content_type,
                body: body.unwrap_or(Value::Null),
                status: answer.0,
            });
            answer
        };
        let mut resp = http::Response::new(Full::new(match &answer {
            Some(v) => Bytes::from(v.to_string()),
            None => Bytes::new(),
        }));
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        if answer.is_some() {
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
        }
        resp
    }
}

/// `ManagedAccount.validate()`, run when the account is loaded.
fn validate(d: &Value) -> Result<(), String> {
    let non_empty = |k: &str| d[k].as_array().is_some_and(|a| !a.is_empty());
    if d["name"].as_str().is_none_or(str::is_empty) {
        return Err("Account name for Kubernetes provider missing.".into());
    }
    if non_empty("namespaces") && non_empty("omitNamespaces") {
        return Err("At most one of 'namespaces' and 'omitNamespaces' can be specified".into());
    }
    if non_empty("kinds") && non_empty("omitKinds") {
        return Err("At most one of 'kinds' and 'omitKinds' can be specified".into());
    }
    Ok(())
}

fn write_roles(d: &Value) -> Vec<String> {
    d["permissions"]["WRITE"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Jackson reading a `CredentialsDefinition`: an object whose `type` names
/// a registered subtype (`kubernetes`), with list fields that are lists.
fn readable(body: Option<&Value>) -> Option<&Value> {
    let d = body?.as_object()?;
    if d.get("type")?.as_str()? != "kubernetes" {
        return None;
    }
    for key in LIST_FIELDS {
        if let Some(v) = d.get(key)
            && !(v.is_null() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
        {
            return None;
        }
    }
    if let Some(p) = d.get("permissions")
        && !(p.is_null()
            || p.as_object()
                .is_some_and(|o| o.values().all(Value::is_array)))
    {
        return None;
    }
    body
}

impl State {
    fn fiat_user(&self, user: Option<&str>) -> Option<FiatUser> {
        let fiat = self.fiat.as_ref()?;
        user.and_then(|u| fiat.users.get(u)).cloned()
    }

    /// `isAccountManager`: off, everyone; on, a known admin or manager.
    fn is_account_manager(&self, user: Option<&str>) -> bool {
        self.fiat.is_none()
            || self
                .fiat_user(user)
                .is_some_and(|u| u.admin || u.account_manager)
    }

    fn is_admin(&self, user: Option<&str>) -> bool {
        self.fiat.is_none() || self.fiat_user(user).is_some_and(|u| u.admin)
    }

    /// `canModifyAccount`: admin, or manager with WRITE on the account as
    /// Fiat last synced it (an account Fiat has not synced is unknown).
    fn can_modify(&self, user: Option<&str>, account: &str) -> bool {
        let Some(fiat) = &self.fiat else {
            return true;
        };
        let Some(u) = self.fiat_user(user) else {
            return false;
        };
        u.admin
            || u.account_manager
                && fiat.synced.get(account).is_some_and(|roles| {
                    roles.is_empty() || roles.iter().any(|r| u.roles.contains(r))
                })
    }

    /// `validateAccountWritePermissions`: a non-admin must hold one of the
    /// definition's authorized roles.
    fn check_write_roles(&self, user: Option<&str>, d: &Value, action: &str) -> Result<(), Answer> {
        if self.is_admin(user) {
            return Ok(());
        }
        let mine: BTreeSet<String> = self
            .fiat_user(user)
            .map(|u| u.roles.into_iter().collect())
            .unwrap_or_default();
        let authorized = write_roles(d);
        if !authorized.is_empty() && !authorized.iter().any(|r| mine.contains(r)) {
            let name = d["name"].as_str().unwrap_or_default();
            return Err(err(
                400,
                &format!(
                    "Cannot {action} account without granting permissions for current user (name: {name})"
                ),
            ));
        }
        Ok(())
    }

    /// What `createAccount` and `saveAccount` check first: the body is
    /// read before the controller method runs, which checks storage; then
    /// `@PreAuthorize isAccountManager`.
    fn admit_write(&self, body: Option<&Value>, user: Option<&str>) -> Result<Value, Answer> {
        let d = readable(body).cloned().ok_or(UNREADABLE)?;
        if !self.storage_enabled {
            return Err(storage_off());
        }
        if !self.is_account_manager(user) {
            return Err(err(403, "Access is denied"));
        }
        Ok(d)
    }

    fn account_api(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        user: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let Some(rest) = path.strip_prefix("/credentials") else {
            return err(404, "");
        };
        let param = |key: &str| {
            url::form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        let denied = || err(403, "Access is denied");
        let segment = rest.strip_prefix('/');
        match (method, segment) {
            // listAccountCredentials: the loaded accounts.
            ("GET", None) => {
                let expand = param("expand").as_deref() == Some("true");
                let all: Vec<Value> = self
                    .loaded
                    .iter()
                    .map(|(n, d)| render(n, d, expand))
                    .collect();
                (200, Some(Value::Array(all)))
            }
            ("GET", Some(s)) if s.starts_with("type/") => {
                if !self.storage_enabled {
                    return storage_off();
                }
                // @PreAuthorize isAccountManager.
                if !self.is_account_manager(user) {
                    return denied();
                }
                let ty = &s["type/".len()..];
                let limit = param("limit").map_or(100, |l| l.parse().unwrap_or(100));
                let from = param("startingAccountName").unwrap_or_default();
                // SqlAccountDefinitionRepository.listByType: id >= from,
                // ordered by id, limited.
                let listed: Vec<Value> = self
                    .stored
                    .range(from..)
                    .map(|(_, d)| d)
                    .filter(|d| d["type"] == ty)
                    .take(limit)
                    .cloned()
                    .collect();
                (200, Some(Value::Array(listed)))
            }
            // getAccountCredentialsDetails: loaded accounts only.
            ("GET", Some(name)) => match self.loaded.get(name) {
                Some(d) => (200, Some(render(name, d, true))),
                None => err(404, &format!("Account does not exist (name: {name})")),
            },
            ("POST", None) => {
                let d = match self.admit_write(body, user) {
                    Ok(d) => d,
                    Err(answer) => return answer,
                };
                let name = d["name"].as_str().unwrap_or_default().to_owned();
                if self.loaded.contains_key(&name) {
                    return err(
                        400,
                        &format!("Cannot create an account which already exists (name: {name})"),
                    );
                }
                if let Err(a) = self.check_write_roles(user, &d, "create") {
                    return a;
                }
                // repository.create: an INSERT; a duplicate key (or no id)
                // is a DataAccessException, rethrown with the whole body.
                if name.is_empty() || self.stored.contains_key(&name) {
                    return err(400, &format!("Cannot create account with definition {d}"));
                }
                self.stored.insert(name, d.clone());
                (200, Some(d))
            }
            ("PUT", None) => {
                let d = match self.admit_write(body, user) {
                    Ok(d) => d,
                    Err(answer) => return answer,
                };
                let name = d["name"].as_str().unwrap_or_default().to_owned();
                // saveAccount: overwriting a loaded account needs
                // canModifyAccount (an AccessDeniedException, so 403).
                if self.loaded.contains_key(&name) && !self.can_modify(user, &name) {
                    return denied();
                }
                if let Err(a) = self.check_write_roles(user, &d, "save") {
                    return a;
                }
                if name.is_empty() {
                    return err(400, &format!("Cannot save account with definition {d}"));
                }
                // repository.save: an upsert.
                self.stored.insert(name, d.clone());
                (200, Some(d))
            }
            ("PUT", Some(account)) => {
                // The body is read before the controller method runs.
                let Some(d) = readable(body).cloned() else {
                    return UNREADABLE;
                };
                if !self.storage_enabled {
                    return storage_off();
                }
                let name = d["name"].as_str().unwrap_or_default().to_owned();
                if name != account {
                    return err(
                        400,
                        &format!(
                            "Mismatched account names. URI value: {account}. Request body value: {name}."
                        ),
                    );
                }
                if !self.can_modify(user, &name) {
                    return denied();
                }
                if !self.loaded.contains_key(&name) {
                    return err(
                        400,
                        &format!("Cannot update an account which does not exist (name: {name})"),
                    );
                }
                if let Err(a) = self.check_write_roles(user, &d, "update") {
                    return a;
                }
                if !self.stored.contains_key(&name) {
                    return err(404, &format!("No account found with name {name}"));
                }
                self.stored.insert(name, d.clone());
                (200, Some(d))
            }
            ("DELETE", Some(name)) => {
                if !self.storage_enabled {
                    return storage_off();
                }
                // @PreAuthorize canModifyAccount.
                if !self.can_modify(user, name) {
                    return denied();
                }
                match self.stored.remove(name) {
                    Some(_) => (200, None),
                    None => err(404, &format!("No account found with name {name}")),
                }
            }
            _ => err(405, "Method Not Allowed"),
        }
    }
}

/// `renderAccountCredentials` of the `KubernetesNamedAccountCredentials`
/// loaded from `d`: its getters, `credentials` (`KubernetesCredentials`)
/// included when expanded, plus `type`, `challengeDestructiveActions` and
/// `primaryAccount`.
fn render(name: &str, d: &Value, expand: bool) -> Value {
    let list = |k: &str| d[k].as_array().cloned().unwrap_or_default();
    let mut v = json!({
        "name": name,
        "environment": d["environment"].as_str().unwrap_or(name),
        "accountType": d["accountType"].as_str().unwrap_or(name),
        "cloudProvider": "kubernetes",
        "requiredGroupMembership": [],
        "permissions": d["permissions"].clone(),
    });
    if expand {
        v["cacheThreads"] = d["cacheThreads"].clone();
        v["namespaces"] = json!(list("namespaces"));
        v["credentials"] = json!({
            "accountName": name,
            "namespaces": list("namespaces"),
            "omitNamespaces": list("omitNamespaces"),
            "context": d["context"].clone(),
            // KubernetesCredentials.Factory: contents are written to a
            // temporary file (kork ConfigFileService), which kubectl reads.
            "kubeconfigFile": if d["kubeconfigContents"].is_string() {
                json!(format!("/tmp/kubeconfig-{name}"))
            } else {
                d["kubeconfigFile"].clone()
            },
            "onlySpinnakerManaged": d["onlySpinnakerManaged"].as_bool().unwrap_or(false),
            "serviceAccount": d["serviceAccount"].as_bool().unwrap_or(false),
        });
    }
    v["type"] = json!("kubernetes");
    v["challengeDestructiveActions"] = json!(false);
    v["primaryAccount"] = json!(false);
    v
}
