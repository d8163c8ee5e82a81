//! Dynamic accounts: accounts created at run time through the accounts API
//! (`POST /v1/accounts` with a kubeconfig, `DELETE /v1/accounts/{name}`,
//! `POST /v1/accounts/{name}/migrate` from Clouddriver) and handed to one
//! agent of their zone over its `Assignments` stream
//! ([`crate::tunnel::assignments`]). Start with [`Dynamic`]; its REST API
//! is [`crate::api::dynamic`], and [`crate::api::armory`] serves the same
//! accounts through the Armory Scale Agent's REST paths.
//!
//! The kubeconfig is checked ([`kubeconfig`]), its cluster's CA fingerprint
//! claimed for the name (an account name held for another cluster is
//! refused), then sealed with AES-256-GCM ([`crypto`]) before it reaches the
//! store; without a key nothing is stored. Kubeconfigs never reach logs,
//! errors or the API's answers.

pub mod crypto;
pub mod kubeconfig;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::accounts::Accounts;
use crate::config::ClouddriverConfig;
use crate::store::{DynamicRow, Store};
use crypto::Cipher;

/// An agent that has had no `Assignments` stream for this long loses its
/// dynamic accounts to another agent of its zone.
pub const DEFAULT_ASSIGNMENT_TTL: Duration = Duration::from_secs(30);
/// How often an `Assignments` stream looks at the store for changes made
/// on other sidecars (changes made here are seen at once).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest account name: a DNS subdomain, like Clouddriver's names.
pub const MAX_NAME_LEN: usize = 253;

/// Why a dynamic account request failed; each maps to one HTTP status in
/// [`crate::api::dynamic`]. Messages never quote a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No `accounts.encryptionKeyFile`: nothing may be stored (503).
    #[error(
        "dynamic accounts need an encryption key: set accounts.encryptionKeyFile in the \
         sidecar configuration (a file of 32 random bytes, raw or base64); kubeconfigs are \
         never stored in clear"
    )]
    NoKey,
    /// The request is not acceptable (400).
    #[error("{0}")]
    Invalid(String),
    /// The name is held for another cluster (409).
    #[error(
        "account {name:?} is already held for another cluster (CA fingerprint {held}…, this \
         kubeconfig's is {offered}…); delete that account first or choose another name"
    )]
    Conflict {
        /// The account name.
        name: String,
        /// The first 16 hex digits of the fingerprint held.
        held: String,
        /// The first 16 hex digits of the fingerprint offered.
        offered: String,
    },
    /// No such dynamic account (404).
    #[error("dynamic account {0:?} not found")]
    NotFound(String),
    /// Clouddriver has no such account to migrate (404).
    #[error("Clouddriver has no account {0:?} to migrate")]
    NotInClouddriver(String),
    /// Clouddriver holds the account, but not in a form this sidecar can
    /// take over (422): the message says why and what to do instead.
    #[error("{0}")]
    NotMigratable(String),
    /// Clouddriver could not be read for a migration (502), or is not
    /// configured (400).
    #[error("migrating from Clouddriver: {0}")]
    Clouddriver(String),
    /// Sealing or opening failed (500).
    #[error(transparent)]
    Crypto(#[from] crypto::Error),
    /// The store failed (503).
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The body of `POST /v1/accounts`. Not `Debug`: it holds a kubeconfig.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateRequest {
    /// Account name.
    pub name: String,
    /// The kubeconfig, YAML.
    pub kubeconfig: String,
    /// The kubeconfig context; its current context when absent.
    #[serde(default)]
    pub context: Option<String>,
    /// The zone whose agents may take it.
    #[serde(default)]
    pub zone: String,
    /// Namespaces to watch; all when empty.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

/// The body of `POST /v1/accounts/{name}/migrate`: every field optional,
/// each overriding what Clouddriver's definition says.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MigrateRequest {
    /// The zone whose agents may take it.
    pub zone: String,
    /// Namespaces to watch.
    pub namespaces: Option<Vec<String>>,
    /// The kubeconfig context.
    pub context: Option<String>,
}

/// A dynamic account as the API shows it: never its kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    /// Account name.
    pub name: String,
    /// Its zone; empty for agents without one.
    pub zone: String,
    /// Namespaces watched; all when empty.
    pub namespaces: Vec<String>,
    /// The kubeconfig context; empty: its current context.
    pub context: String,
    /// SHA-256 (hex) of the cluster CA; empty when the kubeconfig has none.
    pub ca_fingerprint: String,
    /// The agent it is assigned to; empty until one claims it.
    pub agent_id: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it last changed (RFC 3339).
    pub updated_at: String,
}

fn rfc3339(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

impl From<&DynamicRow> for View {
    fn from(row: &DynamicRow) -> Self {
        Self {
            name: row.name.clone(),
            zone: row.zone.clone(),
            namespaces: row.namespaces.clone(),
            context: row.context.clone(),
            ca_fingerprint: row.ca_fingerprint.clone(),
            agent_id: row.agent_id.clone(),
            created_at: rfc3339(row.created_at),
            updated_at: rfc3339(row.updated_at),
        }
    }
}

/// The first 16 hex digits of a fingerprint, for messages.
fn short(fingerprint: &str) -> String {
    fingerprint.get(..16).unwrap_or(fingerprint).to_owned()
}

/// Dynamic accounts on this sidecar: the store, the key, and the signal
/// that wakes this sidecar's `Assignments` streams.
#[derive(Debug)]
pub struct Dynamic {
    store: Store,
    cipher: Option<Cipher>,
    accounts: Accounts,
    changes: watch::Sender<u64>,
    clouddriver: Option<ClouddriverConfig>,
    ttl: Duration,
    poll: Duration,
}

impl Dynamic {
    /// Dynamic accounts in `store`, sealed with `cipher` (none: creating
    /// them is refused).
    pub fn new(store: Store, cipher: Option<Cipher>, accounts: Accounts) -> Self {
        Self {
            store,
            cipher,
            accounts,
            changes: watch::Sender::new(0),
            clouddriver: None,
            ttl: DEFAULT_ASSIGNMENT_TTL,
            poll: DEFAULT_POLL_INTERVAL,
        }
    }

    /// Migrations read accounts from this Clouddriver.
    #[must_use]
    pub fn with_clouddriver(mut self, clouddriver: Option<ClouddriverConfig>) -> Self {
        self.clouddriver = clouddriver;
        self
    }

    /// The accounts this sidecar serves.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// How long an agent keeps its accounts without a stream.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often streams look at the store.
    pub fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// Bumped on every change made on this sidecar.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The kubeconfig of `row`, opened.
    pub fn kubeconfig(&self, row: &DynamicRow) -> Result<Vec<u8>> {
        let cipher = self.cipher.as_ref().ok_or(Error::NoKey)?;
        Ok(cipher.open(&row.name, &row.sealed_kubeconfig)?)
    }

    /// Whether `name` is a deleted dynamic account: the facade answers 404
    /// for it at once, not "moving between sidecars".
    pub async fn deleted(&self, name: &str) -> bool {
        self.store.dynamic_deleted(name).await.unwrap_or_else(|e| {
            tracing::warn!(account = %name, error = %e, "reading dynamic account failed");
            false
        })
    }

    /// Every dynamic account.
    pub async fn list(&self) -> Result<Vec<View>> {
        Ok(self
            .store
            .dynamic_accounts()
            .await?
            .iter()
            .map(View::from)
            .collect())
    }

    /// Creates (or replaces) a dynamic account.
    pub async fn create(&self, request: CreateRequest) -> Result<View> {
        let cipher = self.cipher.as_ref().ok_or(Error::NoKey)?;
        let CreateRequest {
            name,
            kubeconfig,
            context,
            zone,
            namespaces,
        } = request;
        check_name(&name)?;
        if http::HeaderValue::from_str(&zone).is_err() {
            return Err(Error::Invalid(
                "zone is not usable as a header value".into(),
            ));
        }
        if let Some(ns) = namespaces.iter().find(|n| !valid_label(n, 63)) {
            return Err(Error::Invalid(format!(
                "namespace {ns:?} is not a valid name"
            )));
        }
        let context = context.filter(|c| !c.is_empty());
        let checked = kubeconfig::check(&kubeconfig, context.as_deref())
            .map_err(|e| Error::Invalid(format!("kubeconfig: {e}")))?;
        if let Some(held) = self
            .store
            .claim_fingerprint(&name, &checked.ca_fingerprint)
            .await?
        {
            tracing::error!(account = %name, held = %held, offered = %checked.ca_fingerprint,
                "dynamic account refused: the name is held for another cluster");
            return Err(Error::Conflict {
                name,
                held: short(&held),
                offered: short(&checked.ca_fingerprint),
            });
        }
        let row = DynamicRow {
            sealed_kubeconfig: cipher.seal(&name, kubeconfig.as_bytes())?,
            name,
            zone,
            namespaces,
            context: context.unwrap_or_default(),
            ca_fingerprint: checked.ca_fingerprint,
            ..DynamicRow::default()
        };
        self.store.put_dynamic(&row).await?;
        if let Some(account) = self.accounts.get(&row.name) {
            account.restore();
        }
        tracing::info!(account = %row.name, zone = %row.zone, server = %checked.server,
            "dynamic account stored");
        self.changed();
        let stored = self.store.dynamic_account(&row.name).await?;
        Ok(View::from(stored.as_ref().unwrap_or(&row)))
    }

    /// Deletes a dynamic account: its agent is told to stop serving it, and
    /// once its streams close here it is removed at once (no grace period).
    pub async fn delete(&self, name: &str) -> Result<View> {
        let row = self
            .store
            .dynamic_account(name)
            .await?
            .ok_or_else(|| Error::NotFound(name.to_owned()))?;
        self.store.delete_dynamic(name).await?;
        if let Some(account) = self.accounts.get(name) {
            account.withdraw();
        }
        // A name no cache stream holds is free for another cluster at once;
        // one that is online is freed when its owner removes it.
        let online = self
            .store
            .account(name)
            .await?
            .is_some_and(|a| a.state == "online");
        if !online {
            self.store.clear_fingerprint(name).await?;
        }
        tracing::info!(account = %name, agent = %row.agent_id, "dynamic account deleted");
        self.changed();
        Ok(View::from(&row))
    }

    /// Creates a dynamic account from the definition Clouddriver's account
    /// storage holds for `name` ([`Dynamic::clouddriver_definition`]): its
    /// `kubeconfigContents`, or the file its `kubeconfigFile` names when
    /// this sidecar can read it (the same volume mounted in both
    /// containers). Once the account comes online, the usual registration
    /// replaces Clouddriver's definition with the facade-backed one.
    pub async fn migrate(&self, name: &str, request: MigrateRequest) -> Result<View> {
        let create = self.migration_request(name, request).await?;
        let view = self.create(create).await?;
        tracing::info!(account = %name, "account migrated from Clouddriver");
        Ok(view)
    }

    /// What [`Dynamic::migrate`] would create for `name`, read from
    /// Clouddriver's definition but not stored.
    pub async fn migration_request(
        &self,
        name: &str,
        request: MigrateRequest,
    ) -> Result<CreateRequest> {
        if self.cipher.is_none() {
            return Err(Error::NoKey);
        }
        check_name(name)?;
        let definition = self.clouddriver_definition(name).await?;
        let kubeconfig = stored_kubeconfig(name, &definition).await?;
        let strings = |key: &str| -> Vec<String> {
            definition
                .get(key)
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let context = request.context.or_else(|| {
            definition
                .get("context")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        });
        Ok(CreateRequest {
            name: name.to_owned(),
            kubeconfig,
            context,
            zone: request.zone,
            namespaces: request.namespaces.unwrap_or_else(|| strings("namespaces")),
        })
    }

    /// The definition of `name` as Clouddriver's account storage serves it:
    /// `GET {baseUrl}/credentials/type/kubernetes?limit=1&startingAccountName=`
    /// (definitions sorted by name from that one on, secret references
    /// resolved). `GET /credentials/{name}` is no use for this: it shows the
    /// running account, without its kubeconfig. It only tells an account
    /// Clouddriver has from its configuration files apart from none at all.
    async fn clouddriver_definition(&self, name: &str) -> Result<serde_json::Value> {
        let cd = self
            .clouddriver
            .as_ref()
            .filter(|cd| cd.base_url.is_some())
            .ok_or_else(|| {
                Error::Invalid(
                    "migration needs clouddriver.baseUrl in the sidecar configuration".into(),
                )
            })?;
        let base = cd
            .base_url
            .as_deref()
            .unwrap_or_default()
            .trim_end_matches('/');
        let segment = percent_encoding::utf8_percent_encode(name, crate::clouddriver::SEGMENT);
        let url = format!(
            "{base}/credentials/type/{}?limit=1&startingAccountName={segment}",
            crate::clouddriver::ACCOUNT_TYPE
        );
        let (status, listed) = get_json(cd, &url).await?;
        if !status.is_success() {
            return Err(Error::Clouddriver(format!(
                "GET {url}: HTTP {status} (is Clouddriver's account storage on? \
                 account.storage.enabled)"
            )));
        }
        let found = listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d.get("name").and_then(|n| n.as_str()) == Some(name));
        if let Some(definition) = found {
            return Ok(definition.clone());
        }
        let url = format!("{base}/credentials/{segment}");
        let (status, _) = get_json(cd, &url).await?;
        if status == http::StatusCode::NOT_FOUND {
            return Err(Error::NotInClouddriver(name.to_owned()));
        }
        if !status.is_success() {
            return Err(Error::Clouddriver(format!("GET {url}: HTTP {status}")));
        }
        Err(Error::NotMigratable(format!(
            "Clouddriver serves account {name:?} from its configuration files, not from its \
             account storage, and does not give out its kubeconfig; create it with POST \
             /v1/accounts and its kubeconfig, then take it out of those files"
        )))
    }
}

/// Largest kubeconfig file a migration reads.
const MAX_KUBECONFIG_FILE: u64 = 1 << 20;

/// The kubeconfig of Clouddriver's definition of `name`: its
/// `kubeconfigContents`, else the file `kubeconfigFile` names, read here.
pub async fn stored_kubeconfig(name: &str, definition: &serde_json::Value) -> Result<String> {
    let field = |key: &str| {
        definition
            .get(key)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if let Some(contents) = field("kubeconfigContents") {
        return Ok(contents.to_owned());
    }
    let instead = "mount the same file into the sidecar at that path, or create the account \
                   with POST /v1/accounts and its kubeconfig";
    let Some(file) = field("kubeconfigFile") else {
        let why = if definition.get("serviceAccount").and_then(|v| v.as_bool()) == Some(true) {
            "uses Clouddriver's own service account (serviceAccount: true), so there is no \
             kubeconfig to move; an agent in that cluster serves it instead"
        } else {
            "has neither kubeconfigContents nor kubeconfigFile"
        };
        return Err(Error::NotMigratable(format!(
            "Clouddriver's definition of account {name:?} {why}"
        )));
    };
    // Secret references (`encryptedFile:…`) are resolved by Clouddriver's
    // secret engines, which this sidecar does not have.
    if !file.starts_with('/') {
        return Err(Error::NotMigratable(format!(
            "Clouddriver's definition of account {name:?} names kubeconfigFile {file:?}, which \
             is not an absolute path this sidecar can read; {instead}"
        )));
    }
    let unreadable = |why: String| {
        Error::NotMigratable(format!(
            "Clouddriver's definition of account {name:?} names kubeconfigFile {file:?}, which \
             this sidecar cannot read ({why}); {instead}"
        ))
    };
    let meta = tokio::fs::metadata(file)
        .await
        .map_err(|e| unreadable(e.kind().to_string()))?;
    if !meta.is_file() || meta.len() > MAX_KUBECONFIG_FILE {
        return Err(unreadable(format!(
            "not a file of at most {MAX_KUBECONFIG_FILE} bytes"
        )));
    }
    let bytes = tokio::fs::read(file)
        .await
        .map_err(|e| unreadable(e.kind().to_string()))?;
    String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8 text".into()))
}

/// GETs `url` from Clouddriver; the status, and the body when it is JSON
/// (`null` otherwise).
async fn get_json(
    cd: &ClouddriverConfig,
    url: &str,
) -> Result<(http::StatusCode, serde_json::Value)> {
    let mut request = http::Request::get(url).header(http::header::ACCEPT, "application/json");
    if let Some(user) = &cd.user {
        request = request.header(crate::clouddriver::USER_HEADER, user);
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .map_err(|e| Error::Clouddriver(e.to_string()))?;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let timeout = cd.request_timeout();
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .map_err(|_| Error::Clouddriver(format!("GET {url}: timed out")))?
        .map_err(|e| Error::Clouddriver(format!("GET {url}: {e}")))?;
    let status = response.status();
    // Bounded: definitions are a few kilobytes. The body is never quoted
    // in errors: it may hold credentials.
    let body = http_body_util::Limited::new(response.into_body(), 4 << 20)
        .collect()
        .await
        .map_err(|e| Error::Clouddriver(format!("GET {url}: {e}")))?
        .to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    if status.is_success() && json.is_null() {
        return Err(Error::Clouddriver(format!(
            "GET {url}: the answer is not JSON"
        )));
    }
    Ok((status, json))
}

/// Names travel in HTTP/2 headers and facade paths: DNS-label characters
/// and dots only.
pub fn check_name(name: &str) -> Result<()> {
    if valid_label(name, MAX_NAME_LEN) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "account name {name:?} must be 1-{MAX_NAME_LEN} characters of a-z, 0-9, '-' and '.', \
             starting and ending with a letter or digit"
        )))
    }
}

fn valid_label(name: &str, max: usize) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= max
        && name.chars().all(|c| ok(c) || c == '-' || c == '.')
        && name.starts_with(ok)
        && name.ends_with(ok)
}

#[cfg(test)]
mod tests;
