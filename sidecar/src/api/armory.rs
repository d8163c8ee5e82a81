//! The Armory Scale Agent's accounts REST API, served beside `/v1` so
//! scripts written for Armory keep working (`docs/api/armory.openapi.yaml`,
//! "your scripts" in `docs/deploy/migrating-from-armory.md`). Every call is
//! mapped onto [`Dynamic`]: a migration reads Clouddriver's definition, a
//! dynamic account is a [`Dynamic::create`], a deletion a
//! [`Dynamic::delete`]. Start with [`handle`]; [`state`] is the mapping of
//! spinlink's account states onto Armory's `status` enum.
//!
//! Armory keeps migrated accounts INACTIVE until a `PATCH` activates them;
//! spinlink's store knows only accounts that are handed to agents, so
//! INACTIVE accounts are held in this sidecar's memory ([`Armory`]) until
//! activated: a restart or another sidecar replica does not see them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::dynamic::{BodyError, decode, read_body};
use crate::accounts::Presence;
use crate::dynamic::{CreateRequest, Dynamic, Error, MigrateRequest, View};
use crate::http::body::{Body, json};

/// Every path of Armory's REST API starts with this...
pub const PREFIX: &str = "/armory/";
/// ...but the account detail scripts poll for ACTIVE, served here too.
pub const KUBERNETES_ACCOUNTS: &str = "/agents/kubernetes/accounts/";
/// Most entries in one `POST`/`PATCH`/`DELETE /armory/accounts` body.
pub const MAX_ITEMS: usize = 1000;
/// Most INACTIVE accounts held in memory.
pub const MAX_INACTIVE: usize = 10_000;

/// Armory's account `status` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ArmoryState {
    /// Known, not handed to any agent.
    Inactive,
    /// Waiting to be migrated (spinlink migrates at once: never reported).
    ToMigrate,
    /// Handed to agents, no agent serves it yet.
    Activating,
    /// An agent serves it (or its cache is served within the grace period).
    Active,
    /// Waiting to be deactivated (never reported: deactivation is at once).
    ToDeactivate,
    /// Being deactivated (never reported).
    Deactivating,
    /// Could not be activated (never reported: a refused activation is an
    /// error answer, not a stored state).
    Failed,
    /// Its agent went away and the grace period ended.
    Orphaned,
    /// Deleted; its agent still has a stream open or its cache is still held.
    Deleting,
    /// Deletion failed (never reported: a failed deletion is an error answer).
    DeleteFailed,
}

/// What spinlink knows of one account, the input of [`state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// Held INACTIVE in memory.
    pub inactive: bool,
    /// A dynamic account in the store (handed to agents).
    pub dynamic: bool,
    /// Its presence on this sidecar, when it has been served here.
    pub presence: Option<Presence>,
    /// A deleted dynamic account still held.
    pub withdrawn: bool,
}

/// spinlink's account state in Armory's enum; `None`: no such account.
pub fn state(k: Known) -> Option<ArmoryState> {
    if k.inactive {
        return Some(ArmoryState::Inactive);
    }
    let held = matches!(k.presence, Some(Presence::Online | Presence::Stale));
    match (k.dynamic, k.presence) {
        (true, Some(Presence::Online | Presence::Stale)) => Some(ArmoryState::Active),
        (true, Some(Presence::Removed)) => Some(ArmoryState::Orphaned),
        (true, None) => Some(ArmoryState::Activating),
        (false, _) if k.withdrawn => held.then_some(ArmoryState::Deleting),
        (false, Some(Presence::Online | Presence::Stale)) => Some(ArmoryState::Active),
        (false, Some(Presence::Removed)) => Some(ArmoryState::Orphaned),
        (false, None) => None,
    }
}

/// Armory's `KubesvcAccount`, as far as spinlink has its fields. Never a
/// kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubesvcAccount {
    /// Account name.
    pub name: String,
    /// Armory's state.
    pub status: ArmoryState,
    /// The zone whose agents may take it; empty for none.
    pub zone_id: String,
    /// SHA-256 (hex) of the cluster CA, when known.
    pub cert_fingerprint: String,
    /// Cache streams open on this sidecar.
    pub connections: usize,
    /// Created through the API (not configured in an agent).
    pub dynamic: bool,
    /// The agent it is assigned to; empty until one claims it.
    pub agent_id: String,
    /// Why it is not served, when spinlink knows.
    pub error_message: String,
    /// Always 0: spinlink does not retry refused activations.
    pub retry_count: u32,
    /// When it last changed (RFC 3339), when stored.
    pub last_updated: String,
}

/// An agent in the shape of Armory's `GET /armory/agents`: its identity,
/// the accounts it serves (or served) here, and whether it caches any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmoryAgent {
    /// The agent identity the gateway verified.
    pub agent_id: String,
    /// Its accounts on this sidecar.
    pub accounts: Vec<String>,
    /// A cache stream of it is open here.
    pub caching: bool,
    /// Always `kubernetes`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A sidecar instance in the shape of Armory's `GET /armory/clouddrivers`
/// (in Armory, the Clouddriver replicas; in spinlink, the sidecars beside
/// them, which share the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmoryClouddriver {
    /// Where its peers reach it: its peer port.
    pub base_url: String,
    /// Its instance id (`instanceId`, the pod name in the charts).
    pub id: String,
    /// When it last said it runs (RFC 3339).
    pub last_updated: String,
    /// It said so within one ownership lease.
    pub ready: bool,
}

impl From<crate::ownership::Instance> for ArmoryClouddriver {
    fn from(i: crate::ownership::Instance) -> Self {
        Self {
            base_url: i.url,
            id: i.id,
            last_updated: chrono::DateTime::from_timestamp_millis(i.last_seen)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .unwrap_or_default(),
            ready: i.ready,
        }
    }
}

/// Armory's accounts API over [`Dynamic`], with the INACTIVE accounts.
pub struct Armory {
    dynamic: Arc<Dynamic>,
    /// Kubeconfigs in memory only until activated; never logged.
    inactive: Mutex<BTreeMap<String, CreateRequest>>,
}

impl std::fmt::Debug for Armory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armory").finish_non_exhaustive()
    }
}

/// `POST`/`PUT /armory/accounts/dynamic`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DynamicBody {
    name: String,
    #[serde(default)]
    kubeconfig_contents: Option<String>,
    #[serde(default)]
    kubeconfig_file: Option<String>,
    #[serde(default)]
    service_account: Option<bool>,
    #[serde(default)]
    zone_id: Option<String>,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    namespaces: Option<Vec<String>>,
}

/// One entry of `POST`/`PATCH /armory/accounts`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AccountItem {
    name: String,
    #[serde(default)]
    state: Option<ArmoryState>,
    #[serde(default)]
    zone_id: Option<String>,
    #[serde(default)]
    kubeconfig_file: Option<String>,
}

/// An error answer in Armory's shape: `{"error", "message"}`, plus the
/// entries that failed when a list was sent.
fn error_response(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    json(
        code,
        &serde_json::json!({"error": code.canonical_reason(), "message": message.into()}),
    )
}

/// The one place a [`Error`] becomes an Armory answer.
fn dynamic_error(e: &Error) -> Response<Body> {
    let code = match e {
        Error::NoKey => StatusCode::NOT_IMPLEMENTED,
        Error::Invalid(_) | Error::NotMigratable(_) => StatusCode::BAD_REQUEST,
        Error::Conflict { .. } => StatusCode::CONFLICT,
        Error::NotFound(_) | Error::NotInClouddriver(_) => StatusCode::NOT_FOUND,
        Error::Clouddriver(_) => StatusCode::BAD_GATEWAY,
        Error::Crypto(_) => StatusCode::INTERNAL_SERVER_ERROR,
        Error::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    tracing::warn!(error = %e, "Armory accounts request refused");
    error_response(code, e.to_string())
}

/// [`read_body`], its errors in Armory's shape.
async fn read_json<B, T>(body: B) -> Result<T, Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
    T: serde::de::DeserializeOwned,
{
    read_body(body, None).await.map_err(|e| {
        let code = match e {
            BodyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Cut | BodyError::Json(_) => StatusCode::BAD_REQUEST,
        };
        error_response(code, e.message())
    })
}

/// What a request asks for.
enum Route {
    CreateDynamic,
    UpdateDynamic,
    Get(String),
    DeleteOne(String),
    Migrate,
    Patch,
    DeleteMany,
    Agents,
    Agent(String),
    Operations,
    Operation(String),
    Disconnect(String),
    Namespaces(String),
    Clouddrivers,
    Clouddriver(String),
    /// An Armory path spinlink has no meaning for: 501 with this message.
    NotImplemented(&'static str),
}

fn route(method: &Method, path: &str) -> Option<Route> {
    if let Some(rest) = path.strip_prefix(KUBERNETES_ACCOUNTS) {
        if method != Method::GET {
            return None;
        }
        let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        return match segs.as_slice() {
            [name] if !name.is_empty() => Some(Route::Get(decode(name))),
            [name, "namespaces"] if !name.is_empty() => Some(Route::Namespaces(decode(name))),
            _ => None,
        };
    }
    let rest = path.strip_prefix(PREFIX)?;
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    Some(match (method, segs.as_slice()) {
        (&Method::POST, ["accounts", "dynamic"]) => Route::CreateDynamic,
        (&Method::PUT, ["accounts", "dynamic"]) => Route::UpdateDynamic,
        (&Method::POST, ["accounts"]) => Route::Migrate,
        (&Method::PATCH, ["accounts"]) => Route::Patch,
        (&Method::DELETE, ["accounts"]) => Route::DeleteMany,
        (&Method::GET, ["accounts", name]) => Route::Get(decode(name)),
        (&Method::DELETE, ["accounts", name]) => Route::DeleteOne(decode(name)),
        (&Method::GET, ["agent", "operations"]) => Route::Operations,
        (&Method::GET, ["agent", "operations", id]) => Route::Operation(decode(id)),
        (&Method::GET, ["agents"]) => Route::Agents,
        (&Method::GET, ["agents", id]) => Route::Agent(decode(id)),
        (&Method::POST, ["agent", id, "disconnect"]) => Route::Disconnect(decode(id)),
        (&Method::GET, ["clouddrivers"]) => Route::Clouddrivers,
        (&Method::GET, ["clouddrivers", id]) => Route::Clouddriver(decode(id)),
        (_, ["clouddrivers", "sql", "pool", "settings"]) => Route::NotImplemented(
            "spinlink keeps no SQL pool in Clouddriver; the sidecar's store is configured \
             under store: in its configuration (see docs/deploy/sidecar.md)",
        ),
        (&Method::POST, ["agent", "operations" | "operationresults"]) => Route::NotImplemented(
            "spinlink does not forward operations between Clouddriver replicas: a sidecar that \
             does not hold an account's stream forwards the Kubernetes request itself to the \
             sidecar that does (see docs/architecture.md, ownership)",
        ),
        (&Method::POST, ["agent", "operations", "database"]) => Route::NotImplemented(
            "spinlink queues no operations in a database: each request is relayed at once over \
             the agent's relay stream",
        ),
        (&Method::POST, ["agent", "assignments"]) => Route::NotImplemented(
            "spinlink assigns dynamic accounts to an agent of their zone by itself; see GET \
             /v1/dynamic-accounts for each account's agentId",
        ),
        _ => return None,
    })
}

/// Whether this API answers `method` on `path`.
pub fn serves(method: &Method, path: &str) -> bool {
    route(method, path).is_some()
}

impl Armory {
    /// Armory's API over `dynamic`.
    pub fn new(dynamic: Arc<Dynamic>) -> Self {
        Self {
            dynamic,
            inactive: Mutex::new(BTreeMap::new()),
        }
    }

    fn inactive(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, CreateRequest>> {
        self.inactive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `request` INACTIVE; a full table is a 503 answer.
    fn hold_inactive(&self, request: CreateRequest) -> Result<(), Box<Response<Body>>> {
        let mut inactive = self.inactive();
        if inactive.len() >= MAX_INACTIVE && !inactive.contains_key(&request.name) {
            return Err(Box::new(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{MAX_INACTIVE} accounts are INACTIVE already; activate or delete some"),
            )));
        }
        inactive.insert(request.name.clone(), request);
        Ok(())
    }

    /// The account `name` in Armory's shape; `None`: no such account.
    pub async fn account(&self, name: &str) -> Result<Option<KubesvcAccount>, Error> {
        let inactive = self.inactive().get(name).map(|r| r.zone.clone());
        let row = self.dynamic.store().dynamic_account(name).await?;
        let account = self.dynamic.accounts().get(name);
        let status = account.as_ref().map(|a| a.status());
        let known = Known {
            inactive: inactive.is_some(),
            dynamic: row.is_some(),
            presence: status.as_ref().map(|s| s.state),
            withdrawn: account.as_ref().is_some_and(|a| a.withdrawn()),
        };
        let Some(state) = state(known) else {
            return Ok(None);
        };
        let view = row.as_ref().map(View::from);
        let error_message = match state {
            ArmoryState::Orphaned => {
                "its agent went away and the grace period ended; it comes back when an agent \
                 serving it connects"
                    .to_owned()
            }
            _ => String::new(),
        };
        Ok(Some(KubesvcAccount {
            name: name.to_owned(),
            status: state,
            zone_id: view
                .as_ref()
                .map(|v| v.zone.clone())
                .or(inactive)
                .unwrap_or_default(),
            cert_fingerprint: view
                .as_ref()
                .map(|v| v.ca_fingerprint.clone())
                .unwrap_or_default(),
            connections: status.as_ref().map_or(0, |s| s.cache_streams),
            dynamic: known.dynamic || known.inactive || known.withdrawn,
            agent_id: view
                .as_ref()
                .map(|v| v.agent_id.clone())
                .filter(|a| !a.is_empty())
                .or_else(|| status.map(|s| s.agent_identity))
                .unwrap_or_default(),
            error_message,
            retry_count: 0,
            last_updated: view.map(|v| v.updated_at).unwrap_or_default(),
        }))
    }

    /// The namespaces known for account `name`; `None`: no such account.
    /// Served here: the namespaces its cache holds (the `namespaces` kind
    /// when its agent watches it, else those its cached objects are in),
    /// within the namespaces its agent watches; not served here (INACTIVE,
    /// not yet taken by an agent, or on another sidecar): the namespaces
    /// its definition names, empty for all.
    pub async fn namespaces(&self, name: &str) -> Result<Option<Vec<String>>, Error> {
        if self.account(name).await?.is_none() {
            return Ok(None);
        }
        if let Some(account) = self
            .dynamic
            .accounts()
            .get(name)
            .filter(|a| a.presence() != Presence::Removed)
        {
            let scope = account.scope();
            let cache = account.read_cache();
            let mut names: Vec<String> = match cache.kind("", "v1", "namespaces") {
                Some(kind) if kind.synced => kind.objects.keys().map(|(_, n)| n.clone()).collect(),
                _ => cache
                    .kinds()
                    .flat_map(|k| k.objects.keys().map(|(ns, _)| ns.clone()))
                    .filter(|ns| !ns.is_empty())
                    .collect(),
            };
            names.retain(|ns| scope.covers(ns));
            names.sort();
            names.dedup();
            if names.is_empty() {
                names = scope.namespaces;
            }
            return Ok(Some(names));
        }
        if let Some(held) = self.inactive().get(name) {
            return Ok(Some(held.namespaces.clone()));
        }
        let row = self.dynamic.store().dynamic_account(name).await?;
        Ok(Some(row.map(|r| r.namespaces).unwrap_or_default()))
    }

    /// Every agent with an account on this sidecar, by identity.
    pub fn agents(&self) -> Vec<ArmoryAgent> {
        self.dynamic
            .accounts()
            .agents()
            .into_iter()
            .map(|a| ArmoryAgent {
                agent_id: a.identity,
                caching: a.accounts.iter().any(|x| x.cache_streams > 0),
                accounts: a.accounts.into_iter().map(|x| x.name).collect(),
                kind: "kubernetes",
            })
            .collect()
    }

    /// The recent relayed operations of every account this sidecar knows,
    /// from the journal, newest first, in Armory's `OperationHistoryRecord`
    /// shape. Their `operationId` is `{account}:{sidecar}:{id}`.
    pub async fn operations(&self) -> Result<Vec<serde_json::Value>, crate::store::Error> {
        let accounts = self.dynamic.accounts();
        let mut records = Vec::new();
        for account in accounts.all() {
            let name = account.name();
            let agent = account.status().agent_identity;
            for op in accounts.operations(name).await?.unwrap_or_default() {
                records.push((op.received, history_record(name, &agent, &op)));
            }
        }
        records.sort_by_key(|r| std::cmp::Reverse(r.0));
        Ok(records.into_iter().map(|(_, r)| r).collect())
    }

    /// The create request of a `POST`/`PUT /armory/accounts/dynamic` body.
    async fn create_request(&self, body: DynamicBody) -> Result<CreateRequest, Error> {
        let definition = serde_json::json!({
            "kubeconfigContents": body.kubeconfig_contents,
            "kubeconfigFile": body.kubeconfig_file,
            "serviceAccount": body.service_account,
        });
        let kubeconfig = crate::dynamic::stored_kubeconfig(&body.name, &definition)
            .await
            .map_err(|e| match e {
                Error::NotMigratable(m) => Error::Invalid(
                    m.replace("Clouddriver's definition of account", "account")
                        .replace("POST /v1/accounts", "POST /armory/accounts/dynamic"),
                ),
                e => e,
            })?;
        Ok(CreateRequest {
            name: body.name,
            kubeconfig,
            context: body.context,
            zone: body.zone_id.unwrap_or_default(),
            namespaces: body.namespaces.unwrap_or_default(),
        })
    }

    async fn answer(&self, name: &str) -> Response<Body> {
        match self.account(name).await {
            Ok(Some(account)) => json(StatusCode::ACCEPTED, &account),
            Ok(None) => json(StatusCode::ACCEPTED, &Vec::<String>::new()),
            Err(e) => dynamic_error(&e),
        }
    }

    async fn exists(&self, name: &str) -> Result<bool, Error> {
        Ok(self.inactive().contains_key(name)
            || self.dynamic.store().dynamic_account(name).await?.is_some())
    }

    async fn create_dynamic(&self, body: DynamicBody, update: bool) -> Response<Body> {
        let name = body.name.clone();
        match self.exists(&name).await {
            Ok(true) if !update => {
                return error_response(
                    StatusCode::CONFLICT,
                    format!("account {name:?} exists; update it with PUT /armory/accounts/dynamic"),
                );
            }
            Ok(false) if update => {
                return error_response(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no dynamic account {name:?}; create it with POST /armory/accounts/dynamic"
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => return dynamic_error(&e),
        }
        let request = match self.create_request(body).await {
            Ok(r) => r,
            Err(e) => return dynamic_error(&e),
        };
        // An INACTIVE account stays INACTIVE when updated.
        if update && self.inactive().contains_key(&name) {
            if let Err(e) = crate::dynamic::check_name(&name) {
                return dynamic_error(&e);
            }
            if let Err(resp) = self.hold_inactive(request) {
                return *resp;
            }
            return self.answer(&name).await;
        }
        match self.dynamic.create(request).await {
            Ok(_) => self.answer(&name).await,
            Err(e) => dynamic_error(&e),
        }
    }

    async fn delete_one(&self, name: &str) -> Result<bool, Error> {
        if self.inactive().remove(name).is_some() {
            return Ok(true);
        }
        match self.dynamic.delete(name).await {
            Ok(_) => Ok(true),
            Err(Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `POST /armory/accounts`: each name's Clouddriver definition is held
    /// INACTIVE. 409 lists the names that exist already; 400 those that
    /// could not be read (with why); the others are taken either way.
    async fn migrate(&self, items: Vec<AccountItem>) -> Response<Body> {
        let mut existing = Vec::new();
        let mut failed = Vec::new();
        for item in items {
            match self.exists(&item.name).await {
                Ok(true) => {
                    existing.push(item.name);
                    continue;
                }
                Ok(false) => {}
                Err(e) => return dynamic_error(&e),
            }
            let request = self
                .dynamic
                .migration_request(
                    &item.name,
                    MigrateRequest {
                        zone: item.zone_id.unwrap_or_default(),
                        ..MigrateRequest::default()
                    },
                )
                .await;
            let request = match (request, item.kubeconfig_file) {
                (Ok(mut r), Some(file)) => {
                    let definition = serde_json::json!({ "kubeconfigFile": file });
                    crate::dynamic::stored_kubeconfig(&item.name, &definition)
                        .await
                        .map(|k| {
                            r.kubeconfig = k;
                            r
                        })
                }
                (r, _) => r,
            };
            match request {
                Ok(r) => {
                    tracing::info!(account = %item.name, "account taken from Clouddriver as INACTIVE");
                    if let Err(resp) = self.hold_inactive(r) {
                        return *resp;
                    }
                }
                Err(e) => {
                    failed.push(serde_json::json!({"name": item.name, "message": e.to_string()}))
                }
            }
        }
        if !existing.is_empty() {
            return json(StatusCode::CONFLICT, &existing);
        }
        if !failed.is_empty() {
            return json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"error": "Bad Request",
                    "message": "some accounts could not be taken from Clouddriver",
                    "failed": failed}),
            );
        }
        json(StatusCode::ACCEPTED, &Vec::<String>::new())
    }

    /// `PATCH /armory/accounts`: ACTIVE hands an INACTIVE account to its
    /// zone's agents; INACTIVE takes a dynamic account from its agent and
    /// holds it here.
    async fn patch(&self, items: Vec<AccountItem>) -> Response<Body> {
        let mut failed = Vec::new();
        for item in items {
            let name = item.name;
            let outcome = match item.state {
                Some(ArmoryState::Active) => self.activate(&name, item.zone_id).await,
                Some(ArmoryState::Inactive) => self.deactivate(&name).await,
                other => Err(Error::Invalid(format!(
                    "state {other:?} cannot be asked for: send ACTIVE or INACTIVE"
                ))),
            };
            if let Err(e) = outcome {
                failed.push(serde_json::json!({"name": name, "message": e.to_string()}));
            }
        }
        if !failed.is_empty() {
            return json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"error": "Bad Request",
                    "message": "some accounts could not change state", "failed": failed}),
            );
        }
        json(StatusCode::ACCEPTED, &Vec::<String>::new())
    }

    async fn activate(&self, name: &str, zone: Option<String>) -> Result<(), Error> {
        let held = self.inactive().remove(name);
        let Some(mut request) = held else {
            return match self.dynamic.store().dynamic_account(name).await? {
                Some(_) => Ok(()),
                None => Err(Error::NotFound(name.to_owned())),
            };
        };
        if let Some(zone) = zone {
            request.zone = zone;
        }
        match self.dynamic.create(request.clone()).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // Refused: it stays INACTIVE, as it was.
                self.inactive().insert(name.to_owned(), request);
                Err(e)
            }
        }
    }

    async fn deactivate(&self, name: &str) -> Result<(), Error> {
        if self.inactive().contains_key(name) {
            return Ok(());
        }
        let row = self
            .dynamic
            .store()
            .dynamic_account(name)
            .await?
            .ok_or_else(|| Error::NotFound(name.to_owned()))?;
        let kubeconfig = String::from_utf8(self.dynamic.kubeconfig(&row)?)
            .map_err(|_| Error::Invalid("the stored kubeconfig is not UTF-8".into()))?;
        let request = CreateRequest {
            name: row.name.clone(),
            kubeconfig,
            context: Some(row.context.clone()).filter(|c| !c.is_empty()),
            zone: row.zone.clone(),
            namespaces: row.namespaces.clone(),
        };
        if self.inactive().len() >= MAX_INACTIVE {
            return Err(Error::Invalid(format!(
                "{MAX_INACTIVE} accounts are INACTIVE already; activate or delete some"
            )));
        }
        self.dynamic.delete(name).await?;
        self.inactive().insert(name.to_owned(), request);
        Ok(())
    }
}

/// One relayed operation as Armory's `OperationHistoryRecord`.
fn history_record(
    account: &str,
    agent: &str,
    op: &crate::accounts::Operation,
) -> serde_json::Value {
    let millis = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.timestamp_millis());
    let agent_ms = match (op.agent_started, op.agent_finished) {
        (Some(s), Some(f)) => Some((f - s).num_milliseconds()),
        _ => None,
    };
    serde_json::json!({
        "operationId": format!("{account}:{}:{}", op.instance, op.id),
        "operationType": format!("{} {}", op.method, op.path),
        "account": account,
        "startTime": op.received.timestamp_millis(),
        "endTime": millis(op.answered),
        "totalDurationMs": op.answered.map(|a| (a - op.received).num_milliseconds()),
        "finalOutcome": op.outcome,
        "opReceivedByClouddriver": {"clouddriverId": op.instance, "time": op.received.timestamp_millis()},
        "opProcessedByClouddriver": {"clouddriverId": op.instance, "time": op.received.timestamp_millis()},
        "opSentToAgent": millis(op.sent_to_agent),
        "resultReceivedFromAgent": {
            "agentId": agent,
            "clouddriverId": op.instance,
            "result": {"status": op.status, "durationMs": agent_ms},
        },
        "resultReceivedByClouddriver": millis(op.answered),
    })
}

/// What was read for account `name`: 200 with it, 404 for no such account.
fn found<T: Serialize>(name: &str, read: Result<Option<T>, Error>) -> Response<Body> {
    match read {
        Ok(Some(value)) => json(StatusCode::OK, &value),
        Ok(None) => error_response(
            StatusCode::NOT_FOUND,
            format!("no account {name:?} on this sidecar"),
        ),
        Err(e) => dynamic_error(&e),
    }
}

/// A list body must have 1 to [`MAX_ITEMS`] entries.
async fn read_list<B, T>(body: B) -> Result<Vec<T>, Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
    T: serde::de::DeserializeOwned,
{
    let items: Vec<T> = read_json(body).await?;
    if items.is_empty() {
        return Err(error_response(
            StatusCode::BAD_REQUEST,
            "the body must be a non-empty JSON array",
        ));
    }
    if items.len() > MAX_ITEMS {
        return Err(error_response(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_ITEMS} entries per request"),
        ));
    }
    Ok(items)
}

/// Answers a request [`serves`] accepts; `ownership` knows the sidecar
/// instances sharing the store (`/armory/clouddrivers`).
pub async fn handle<B>(
    armory: &Armory,
    ownership: Option<&crate::ownership::Ownership>,
    req: Request<B>,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
{
    let Some(route) = route(req.method(), req.uri().path()) else {
        return error_response(StatusCode::NOT_FOUND, "no such Armory-compatible route");
    };
    match route {
        Route::NotImplemented(message) => error_response(StatusCode::NOT_IMPLEMENTED, message),
        Route::Agents => json(StatusCode::OK, &armory.agents()),
        Route::Clouddrivers | Route::Clouddriver(_) => {
            let Some(ownership) = ownership else {
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this sidecar runs without ownership: no instances are recorded",
                );
            };
            let all: Vec<ArmoryClouddriver> = match ownership.instances().await {
                Ok(all) => all.into_iter().map(ArmoryClouddriver::from).collect(),
                Err(e) => {
                    return error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the sidecar instances could not be read from the store: {e}"),
                    );
                }
            };
            match route {
                Route::Clouddriver(id) => match all.into_iter().find(|c| c.id == id) {
                    Some(one) => json(StatusCode::OK, &one),
                    None => error_response(
                        StatusCode::NOT_FOUND,
                        format!("no sidecar instance {id:?} shares this sidecar's store"),
                    ),
                },
                _ => json(StatusCode::OK, &all),
            }
        }
        Route::Namespaces(name) => found(&name, armory.namespaces(&name).await),
        Route::Operations | Route::Operation(_) => {
            let all = match armory.operations().await {
                Ok(all) => all,
                Err(e) => {
                    return error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the journal of relayed operations could not be read: {e}"),
                    );
                }
            };
            match route {
                Route::Operation(id) => match all.into_iter().find(|r| r["operationId"] == id) {
                    Some(record) => json(StatusCode::OK, &record),
                    None => error_response(
                        StatusCode::NOT_FOUND,
                        format!("no operation {id:?} in the journal"),
                    ),
                },
                _ => json(StatusCode::OK, &all),
            }
        }
        Route::Agent(id) => match armory.agents().into_iter().find(|a| a.agent_id == id) {
            Some(agent) => json(StatusCode::OK, &agent),
            None => error_response(
                StatusCode::NOT_FOUND,
                format!("no agent {id:?} has an account on this sidecar"),
            ),
        },
        // Armory's `DisconnectRequest` body says who asked; spinlink needs
        // nothing from it, so it is not read.
        Route::Disconnect(id) => match armory.dynamic.accounts().disconnect_agent(&id) {
            Some(names) => {
                tracing::info!(identity = %id, accounts = ?names, "agent disconnected by the Armory API");
                json(
                    StatusCode::ACCEPTED,
                    &serde_json::json!({"agentId": id, "accounts": names}),
                )
            }
            None => error_response(
                StatusCode::NOT_FOUND,
                format!("no agent {id:?} has an account on this sidecar"),
            ),
        },
        Route::Get(name) => found(&name, armory.account(&name).await),
        Route::DeleteOne(name) => match armory.delete_one(&name).await {
            Ok(true) => armory.answer(&name).await,
            Ok(false) => error_response(
                StatusCode::NOT_FOUND,
                format!(
                    "no dynamic or INACTIVE account {name:?}; accounts configured in an agent \
                     are removed from its configuration"
                ),
            ),
            Err(e) => dynamic_error(&e),
        },
        Route::CreateDynamic | Route::UpdateDynamic => {
            let update = matches!(route, Route::UpdateDynamic);
            match read_json::<_, DynamicBody>(req.into_body()).await {
                Ok(body) => armory.create_dynamic(body, update).await,
                Err(resp) => resp,
            }
        }
        Route::Migrate | Route::Patch => {
            let patch = matches!(route, Route::Patch);
            let items = match read_list::<_, AccountItem>(req.into_body()).await {
                Ok(items) => items,
                Err(resp) => return resp,
            };
            if patch {
                armory.patch(items).await
            } else {
                armory.migrate(items).await
            }
        }
        Route::DeleteMany => {
            let names = match read_list::<_, String>(req.into_body()).await {
                Ok(names) => names,
                Err(resp) => return resp,
            };
            let mut missing = Vec::new();
            for name in names {
                match armory.delete_one(&name).await {
                    Ok(true) => {}
                    Ok(false) => missing.push(name),
                    Err(e) => return dynamic_error(&e),
                }
            }
            if missing.is_empty() {
                json(StatusCode::ACCEPTED, &Vec::<String>::new())
            } else {
                json(
                    StatusCode::NOT_FOUND,
                    &serde_json::json!({"error": "Not Found",
                        "message": "not dynamic or INACTIVE accounts; nothing done for them",
                        "names": missing}),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(inactive: bool, dynamic: bool, presence: Option<Presence>, withdrawn: bool) -> Known {
        Known {
            inactive,
            dynamic,
            presence,
            withdrawn,
        }
    }

    #[tokio::test]
    async fn list_bodies_are_bounded() {
        let body = |text: String| http_body_util::Full::new(Bytes::from(text));
        let names = |n: usize| serde_json::to_string(&vec!["a"; n]).unwrap();
        // A client may not make one request do unbounded work.
        let over = read_list::<_, String>(body(names(MAX_ITEMS + 1)))
            .await
            .unwrap_err();
        assert_eq!(over.status(), StatusCode::BAD_REQUEST);
        let empty = read_list::<_, String>(body("[]".into())).await.unwrap_err();
        assert_eq!(empty.status(), StatusCode::BAD_REQUEST);
        let most = read_list::<_, String>(body(names(MAX_ITEMS)))
            .await
            .unwrap();
        assert_eq!(most.len(), MAX_ITEMS);
    }

    #[test]
    fn spinlink_states_map_onto_armory_states() {
        use ArmoryState::*;
        use Presence::*;
        let cases = [
            (known(true, false, None, false), Some(Inactive)),
            (known(false, true, None, false), Some(Activating)),
            (known(false, true, Some(Online), false), Some(Active)),
            (known(false, true, Some(Stale), false), Some(Active)),
            (known(false, true, Some(Removed), false), Some(Orphaned)),
            (known(false, false, Some(Online), false), Some(Active)),
            (known(false, false, Some(Removed), false), Some(Orphaned)),
            (known(false, false, Some(Online), true), Some(Deleting)),
            (known(false, false, Some(Stale), true), Some(Deleting)),
            (known(false, false, Some(Removed), true), None),
            (known(false, false, None, false), None),
        ];
        for (k, want) in cases {
            assert_eq!(state(k), want, "{k:?}");
        }
    }

    #[test]
    fn paths_without_meaning_in_spinlink_are_501_and_unknown_ones_not_served() {
        assert!(matches!(
            route(&Method::GET, "/armory/clouddrivers/sql/pool/settings"),
            Some(Route::NotImplemented(_))
        ));
        assert!(matches!(
            route(&Method::POST, "/armory/agent/operationresults"),
            Some(Route::NotImplemented(_))
        ));
        assert!(matches!(
            route(&Method::GET, "/armory/accounts/a%2Eb"),
            Some(Route::Get(n)) if n == "a.b"
        ));
        assert!(matches!(
            route(&Method::GET, "/agents/kubernetes/accounts/prod"),
            Some(Route::Get(n)) if n == "prod"
        ));
        assert!(!serves(&Method::GET, "/agents/kubernetes/accounts/"));
        assert!(matches!(
            route(&Method::GET, "/agents/kubernetes/accounts/a%2Eb/namespaces"),
            Some(Route::Namespaces(n)) if n == "a.b"
        ));
        assert!(!serves(
            &Method::POST,
            "/agents/kubernetes/accounts/a/namespaces"
        ));
        assert!(!serves(&Method::GET, "/agents/kubernetes/accounts/a/pods"));
        assert!(matches!(
            route(&Method::GET, "/armory/clouddrivers/sidecar-0"),
            Some(Route::Clouddriver(id)) if id == "sidecar-0"
        ));
        assert!(!serves(&Method::GET, "/armory/nothing"));
        assert!(!serves(&Method::GET, "/v1/accounts"));
    }

    /// `value` serializes to the properties of `schema` in `doc`, no more.
    fn assert_documented(doc: &serde_json::Value, schema: &str, value: &impl Serialize) {
        let keys = |v: &serde_json::Value| {
            let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        assert_eq!(
            keys(&serde_json::to_value(value).unwrap()),
            keys(&doc["components"]["schemas"][schema]["properties"]),
            "{schema}"
        );
    }

    /// The documented API and the served one cannot drift apart.
    #[test]
    fn every_documented_path_is_served_and_every_field_documented() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/api/armory.openapi.yaml"
        );
        let doc: serde_json::Value =
            serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut count = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            let concrete = path
                .replace("{accountName}", "a")
                .replace("{agentId}", "a")
                .replace("{id}", "a");
            for method in item.as_object().unwrap().keys() {
                if method == "parameters" {
                    continue;
                }
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                assert!(
                    serves(&m, &concrete),
                    "{method} {path} is documented, not served"
                );
                count += 1;
            }
        }
        assert_eq!(count, 21, "operations documented");
        let account = KubesvcAccount {
            name: String::new(),
            status: ArmoryState::Active,
            zone_id: String::new(),
            cert_fingerprint: String::new(),
            connections: 0,
            dynamic: false,
            agent_id: String::new(),
            error_message: String::new(),
            retry_count: 0,
            last_updated: String::new(),
        };
        assert_documented(&doc, "KubesvcAccount", &account);
        let states: Vec<serde_json::Value> =
            doc["components"]["schemas"]["KubesvcAccount"]["properties"]["status"]["enum"]
                .as_array()
                .unwrap()
                .clone();
        for s in &states {
            let parsed: ArmoryState = serde_json::from_value(s.clone()).unwrap();
            assert_eq!(&serde_json::to_value(parsed).unwrap(), s);
        }
        assert_eq!(states.len(), 10);
        let clouddriver = ArmoryClouddriver::from(crate::ownership::Instance {
            id: "s".into(),
            url: String::new(),
            last_seen: 0,
            ready: true,
        });
        assert_documented(&doc, "Clouddriver", &clouddriver);
        assert_eq!(clouddriver.last_updated, "1970-01-01T00:00:00.000Z");
    }
}
