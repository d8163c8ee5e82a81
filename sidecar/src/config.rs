//! The sidecar's configuration file (YAML, camelCase keys): where the tunnel
//! listens and how it authenticates gateways, where the Kubernetes API facade
//! listens, which database the store uses, how long offline accounts are
//! kept, and how accounts are registered with Clouddriver. Start with
//! [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the tunnel listens when the file does not say.
pub const DEFAULT_TUNNEL_LISTEN: &str = "127.0.0.1:7001";
/// Where the facade listens when the file does not say.
pub const DEFAULT_FACADE_LISTEN: &str = "127.0.0.1:7002";
/// The database used when the file does not name one.
pub const DEFAULT_STORE_URL: &str = "sqlite::memory:";
/// The instance id used when the file does not name one.
pub const DEFAULT_INSTANCE_ID: &str = "sidecar";
/// How long a relayed request waits for the agent's response head.
pub const DEFAULT_RELAY_TIMEOUT_SECS: u64 = 60;
/// Memory the facade's OpenAPI cache may hold, shared by every account: a
/// cluster's documents take 10–15 MB (v2 as JSON and protobuf, the v3
/// documents), and clusters of one version and CRD set share one copy.
pub const DEFAULT_OPENAPI_CACHE_BYTES: u64 = 256 * 1024 * 1024;
/// How long an account whose agent disconnected is kept (served stale from
/// its cache, registered in Clouddriver) before it is removed.
pub const DEFAULT_GRACE_PERIOD_SECS: u64 = 600;
/// Relayed operations kept per account in the store's journal for the
/// accounts API.
pub const DEFAULT_OPERATION_HISTORY: usize = 200;
/// First delay before retrying a failed Clouddriver call.
pub const DEFAULT_RETRY_INITIAL_MILLIS: u64 = 500;
/// Longest delay between retries of a failed Clouddriver call.
pub const DEFAULT_RETRY_MAX_MILLIS: u64 = 30_000;
/// How long one Clouddriver call may take.
pub const DEFAULT_CLOUDDRIVER_TIMEOUT_SECS: u64 = 30;
/// `cacheThreads` of registered accounts (Clouddriver's own default).
pub const DEFAULT_CACHE_THREADS: u32 = 1;
/// Default interval between asking Clouddriver whether a stored account is
/// loaded (`clouddriver.liveCheckMillis`).
pub const DEFAULT_LIVE_CHECK_MILLIS: u64 = 5_000;
/// Default interval between re-checks of a registered account
/// (`clouddriver.recheckSeconds`).
pub const DEFAULT_RECHECK_SECS: u64 = 300;
/// Default time a stored account may wait to be loaded before its state
/// says why it is not (`clouddriver.liveTimeoutSeconds`): a few of the
/// credentials poller's usual intervals.
pub const DEFAULT_LIVE_TIMEOUT_SECS: u64 = 300;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML did not parse or named an unknown key.
    #[error("{origin}: {source}")]
    Parse {
        /// The file (or other origin) of the YAML.
        origin: String,
        /// The parser's error, naming the key and line.
        #[source]
        source: serde_norway::Error,
    },
    /// A value is not acceptable.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        /// The file (or other origin) of the YAML.
        origin: String,
        /// The key, dotted (`tunnel.tls.certFile`).
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The sidecar's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Names this sidecar instance (logs, ownership leases, forwarding).
    pub instance_id: String,
    /// The listener the gateways carry agent streams to.
    pub tunnel: TunnelConfig,
    /// The Kubernetes API facade and accounts API.
    pub facade: FacadeConfig,
    /// The database.
    pub store: StoreConfig,
    /// Account lifecycle: the grace period and the operation history.
    pub accounts: AccountsConfig,
    /// Registering accounts with Clouddriver (absent: not registered).
    pub clouddriver: Option<ClouddriverConfig>,
    /// Account ownership when several sidecars share the store.
    pub ownership: OwnershipConfig,
    /// Where this configuration came from (a file name), for error messages.
    #[serde(skip)]
    pub origin: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            instance_id: DEFAULT_INSTANCE_ID.to_owned(),
            tunnel: TunnelConfig::default(),
            facade: FacadeConfig::default(),
            store: StoreConfig::default(),
            accounts: AccountsConfig::default(),
            clouddriver: None,
            ownership: OwnershipConfig::default(),
            origin: "<default>".to_owned(),
        }
    }
}

/// The tunnel listener (gRPC over HTTP/2).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TunnelConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Certificate, key and the CA that signs gateway client certificates.
    pub tls: Option<TlsConfig>,
    /// Plaintext HTTP/2 without client certificates: development and tests only.
    pub insecure: bool,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        Self {
            listen: parse_addr(DEFAULT_TUNNEL_LISTEN),
            tls: None,
            insecure: false,
        }
    }
}

/// TLS files of the tunnel listener. A client certificate signed by
/// `clientCaFile` is required of every peer, and only the gateways named in
/// `gatewayIdentities` are served.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM bundle of the CAs that sign gateway client certificates.
    pub client_ca_file: PathBuf,
    /// The identities of the gateways' client certificates, exactly: a URI
    /// SAN (`spiffe://spinlink/gateway/spinlink`) or, for a certificate
    /// without one, a DNS SAN, read as [`crate::tunnel::gateways`] says.
    /// Every other certificate `clientCaFile` signs — an agent's — is
    /// refused. Required: there is no safe default.
    pub gateway_identities: Vec<String>,
}

/// The Kubernetes API facade (plain HTTP, meant for loopback).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FacadeConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Seconds a relayed request waits for the agent's response head.
    pub relay_timeout_seconds: u64,
    /// The URL other sidecars reach this facade at (requests for accounts
    /// this instance owns are forwarded there); defaults to
    /// `http://<listen>` with an unspecified address read as loopback.
    pub advertise_url: Option<String>,
    /// Bytes of OpenAPI documents kept in memory across all accounts
    /// (least recently used dropped first); 0 relays every OpenAPI request.
    pub openapi_cache_bytes: u64,
}

impl Default for FacadeConfig {
    fn default() -> Self {
        Self {
            listen: parse_addr(DEFAULT_FACADE_LISTEN),
            relay_timeout_seconds: DEFAULT_RELAY_TIMEOUT_SECS,
            advertise_url: None,
            openapi_cache_bytes: DEFAULT_OPENAPI_CACHE_BYTES,
        }
    }
}

/// Account ownership across sidecars sharing one store.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OwnershipConfig {
    /// Seconds an account's lease lasts unless renewed (renewed every third
    /// of it); also how long a dead sidecar's accounts wait for a new owner.
    pub lease_seconds: u64,
    /// Where this sidecar serves its account caches to its peers (the warm
    /// handover, [`crate::handover`]); defaults to the facade's address on
    /// an ephemeral port.
    pub handover_listen: Option<SocketAddr>,
    /// The base URL peers fetch snapshots from; defaults to
    /// `http://<handoverListen>` with an unspecified address read as loopback.
    pub handover_advertise_url: Option<String>,
    /// How long a new owner waits for the old owner's snapshot before its
    /// agent lists every kind instead. Keep it below the agents'
    /// `cache.resumeWaitMillis` (5 s by default).
    pub handover_timeout_millis: u64,
    /// How long a draining sidecar keeps serving snapshots of the accounts
    /// it gave up until every one was fetched.
    pub handover_drain_seconds: u64,
    /// The largest snapshot a new owner accepts, in bytes.
    pub handover_max_bytes: u64,
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        Self {
            lease_seconds: crate::ownership::DEFAULT_LEASE.as_secs(),
            handover_listen: None,
            handover_advertise_url: None,
            handover_timeout_millis: crate::handover::DEFAULT_TIMEOUT_MILLIS,
            handover_drain_seconds: crate::handover::DEFAULT_DRAIN_SECONDS,
            handover_max_bytes: crate::handover::DEFAULT_MAX_BYTES,
        }
    }
}

/// The database.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct StoreConfig {
    /// `sqlite://PATH` (created if missing) or `sqlite::memory:`.
    pub url: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_STORE_URL.to_owned(),
        }
    }
}

/// Account lifecycle.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AccountsConfig {
    /// Seconds an account stays (stale, served from its last cache, still
    /// registered) after its agent disconnected, before it is deregistered
    /// and its cache dropped.
    pub grace_period_seconds: u64,
    /// Relayed operations kept per account in the store's journal (the
    /// oldest are pruned).
    pub operation_history: usize,
    /// The key that seals dynamic accounts' kubeconfigs (AES-256-GCM): a
    /// file of 32 random bytes, raw or base64. Without it `POST
    /// /v1/accounts` answers 503.
    pub encryption_key_file: Option<PathBuf>,
}

impl Default for AccountsConfig {
    fn default() -> Self {
        Self {
            grace_period_seconds: DEFAULT_GRACE_PERIOD_SECS,
            operation_history: DEFAULT_OPERATION_HISTORY,
            encryption_key_file: None,
        }
    }
}

/// How accounts are made known to Clouddriver: through its account
/// management API (`baseUrl`), as kubeconfig files in a directory Clouddriver
/// reads (`kubeconfigDir`), or both.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ClouddriverConfig {
    /// Clouddriver's base URL (`http://localhost:7002`); accounts are
    /// registered with `PUT {baseUrl}/credentials`.
    pub base_url: Option<String>,
    /// A directory where one kubeconfig per account is written.
    pub kubeconfig_dir: Option<PathBuf>,
    /// The facade URL written into kubeconfigs; defaults to the facade's
    /// bound address (`http://127.0.0.1:PORT`).
    pub facade_url: Option<String>,
    /// Fields of every registered account definition.
    pub account: ClouddriverAccountConfig,
    /// Retries of failed Clouddriver calls.
    pub retry: RetryConfig,
    /// Seconds one Clouddriver call may take.
    pub request_timeout_seconds: u64,
    /// The user named in `X-SPINNAKER-USER` on every call. With Fiat on,
    /// Clouddriver refuses calls without one (anonymous) and requires a Fiat
    /// admin, or a user holding a role in `fiat.account.manager.roles` and
    /// one of the definition's `WRITE` roles.
    pub user: Option<String>,
    /// Milliseconds between asking Clouddriver (`GET
    /// /credentials/{name}`) whether an account it stored is loaded yet.
    pub live_check_millis: u64,
    /// Seconds between re-checks of a registered account: one that
    /// Clouddriver no longer serves (deleted, or replaced) is written again.
    pub recheck_seconds: u64,
    /// Seconds an account may be stored but not loaded before its state
    /// says so as an error (Clouddriver's credentials poller is off, or it
    /// refused the definition when loading it).
    pub live_timeout_seconds: u64,
}

impl Default for ClouddriverConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            kubeconfig_dir: None,
            facade_url: None,
            account: ClouddriverAccountConfig::default(),
            retry: RetryConfig::default(),
            request_timeout_seconds: DEFAULT_CLOUDDRIVER_TIMEOUT_SECS,
            user: None,
            live_check_millis: DEFAULT_LIVE_CHECK_MILLIS,
            recheck_seconds: DEFAULT_RECHECK_SECS,
            live_timeout_seconds: DEFAULT_LIVE_TIMEOUT_SECS,
        }
    }
}

impl ClouddriverConfig {
    /// The call timeout.
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.request_timeout_seconds)
    }
}

/// The fields of Clouddriver's Kubernetes account definition
/// (`KubernetesAccountProperties.ManagedAccount`) that the sidecar sets on
/// every account it registers.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ClouddriverAccountConfig {
    /// `environment` (Clouddriver defaults it to the account name).
    pub environment: Option<String>,
    /// `namespaces` Clouddriver manages; empty means all.
    pub namespaces: Vec<String>,
    /// `onlySpinnakerManaged`.
    pub only_spinnaker_managed: bool,
    /// `cacheThreads`.
    pub cache_threads: u32,
    /// `permissions`: authorization (`READ`, `WRITE`, `EXECUTE`) to roles.
    pub permissions: std::collections::BTreeMap<String, Vec<String>>,
}

impl Default for ClouddriverAccountConfig {
    fn default() -> Self {
        Self {
            environment: None,
            namespaces: Vec::new(),
            only_spinnaker_managed: false,
            cache_threads: DEFAULT_CACHE_THREADS,
            permissions: std::collections::BTreeMap::new(),
        }
    }
}

/// Exponential backoff with full jitter.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryConfig {
    /// First delay, milliseconds.
    pub initial_millis: u64,
    /// Longest delay, milliseconds.
    pub max_millis: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial_millis: DEFAULT_RETRY_INITIAL_MILLIS,
            max_millis: DEFAULT_RETRY_MAX_MILLIS,
        }
    }
}

fn parse_addr(s: &str) -> SocketAddr {
    // The defaults are literals above; a failure here is a typo in this file.
    s.parse().expect("default listen address is valid")
}

impl Config {
    /// Reads, parses and validates a YAML file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// Parses and validates YAML; `origin` names it in errors.
    pub fn from_yaml_str(s: &str, origin: &str) -> Result<Self> {
        let mut config: Config = if s.trim().is_empty() {
            Config::default()
        } else {
            serde_norway::from_str(s).map_err(|source| Error::Parse {
                origin: origin.to_owned(),
                source,
            })?
        };
        config.origin = origin.to_owned();
        config.validate()?;
        Ok(config)
    }

    /// Checks values the types cannot.
    pub fn validate(&self) -> Result<()> {
        let invalid = |key, message: &str| Error::Invalid {
            origin: self.origin.clone(),
            key,
            message: message.to_owned(),
        };
        if self.instance_id.trim().is_empty() {
            return Err(invalid("instanceId", "must not be empty"));
        }
        match (&self.tunnel.tls, self.tunnel.insecure) {
            (None, false) => {
                return Err(invalid(
                    "tunnel.tls",
                    "required unless tunnel.insecure is true",
                ));
            }
            (Some(_), true) => {
                return Err(invalid(
                    "tunnel.insecure",
                    "cannot be true together with tunnel.tls",
                ));
            }
            (Some(tls), false) => {
                for (key, path) in [
                    ("tunnel.tls.certFile", &tls.cert_file),
                    ("tunnel.tls.keyFile", &tls.key_file),
                    ("tunnel.tls.clientCaFile", &tls.client_ca_file),
                ] {
                    if path.as_os_str().is_empty() {
                        return Err(invalid(key, "required"));
                    }
                }
                // Without it any certificate the client CA signs could set
                // the verified headers the gateway alone may set.
                if tls.gateway_identities.is_empty() {
                    return Err(invalid(
                        "tunnel.tls.gatewayIdentities",
                        "required with tunnel.tls: name the URI SAN (or DNS SAN) of the \
                         gateways' client certificates, e.g. spiffe://spinlink/gateway/spinlink; \
                         every other certificate the client CA signs is refused",
                    ));
                }
                for id in &tls.gateway_identities {
                    if id.trim().is_empty() || id.trim() != id {
                        return Err(invalid(
                            "tunnel.tls.gatewayIdentities",
                            "an entry is empty or has surrounding spaces",
                        ));
                    }
                    if id.contains('*') {
                        return Err(invalid(
                            "tunnel.tls.gatewayIdentities",
                            &format!("{id:?}: identities are matched exactly, not as globs"),
                        ));
                    }
                }
            }
            (None, true) => {}
        }
        if self.facade.relay_timeout_seconds == 0 {
            return Err(invalid("facade.relayTimeoutSeconds", "must be at least 1"));
        }
        if self.ownership.lease_seconds == 0 {
            return Err(invalid("ownership.leaseSeconds", "must be at least 1"));
        }
        if let Some(u) = &self.facade.advertise_url {
            match url::Url::parse(u) {
                Ok(p) if p.scheme() == "http" && p.host().is_some() => {}
                _ => return Err(invalid("facade.advertiseUrl", "must be an http:// URL")),
            }
        }
        if let Some(u) = &self.ownership.handover_advertise_url {
            match url::Url::parse(u) {
                Ok(p) if p.scheme() == "http" && p.host().is_some() => {}
                _ => {
                    return Err(invalid(
                        "ownership.handoverAdvertiseUrl",
                        "must be an http:// URL",
                    ));
                }
            }
        }
        if self.ownership.handover_timeout_millis == 0 {
            return Err(invalid(
                "ownership.handoverTimeoutMillis",
                "must be at least 1",
            ));
        }
        if self.ownership.handover_max_bytes == 0 {
            return Err(invalid("ownership.handoverMaxBytes", "must be at least 1"));
        }
        if self.accounts.grace_period_seconds == 0 {
            return Err(invalid("accounts.gracePeriodSeconds", "must be at least 1"));
        }
        if self.accounts.operation_history == 0 {
            return Err(invalid("accounts.operationHistory", "must be at least 1"));
        }
        if let Some(cd) = &self.clouddriver {
            if cd.base_url.is_none() && cd.kubeconfig_dir.is_none() {
                return Err(invalid(
                    "clouddriver",
                    "needs baseUrl, kubeconfigDir or both",
                ));
            }
            if let Some(base) = &cd.base_url {
                match url::Url::parse(base) {
                    Ok(u) if u.scheme() == "http" && u.host().is_some() => {}
                    Ok(_) => {
                        return Err(invalid(
                            "clouddriver.baseUrl",
                            "must be an http:// URL (Clouddriver beside the sidecar)",
                        ));
                    }
                    Err(e) => return Err(invalid("clouddriver.baseUrl", &e.to_string())),
                }
            }
            if let Some(f) = &cd.facade_url
                && !(f.starts_with("http://") || f.starts_with("https://"))
            {
                return Err(invalid(
                    "clouddriver.facadeUrl",
                    "must be an http(s):// URL",
                ));
            }
            if cd.account.cache_threads == 0 {
                return Err(invalid(
                    "clouddriver.account.cacheThreads",
                    "must be at least 1",
                ));
            }
            for (key, value) in [
                (
                    "clouddriver.requestTimeoutSeconds",
                    cd.request_timeout_seconds,
                ),
                ("clouddriver.liveCheckMillis", cd.live_check_millis),
                ("clouddriver.recheckSeconds", cd.recheck_seconds),
                ("clouddriver.liveTimeoutSeconds", cd.live_timeout_seconds),
            ] {
                if value == 0 {
                    return Err(invalid(key, "must be at least 1"));
                }
            }
            if let Some(user) = &cd.user
                && (user.is_empty() || http::HeaderValue::from_str(user).is_err())
            {
                return Err(invalid(
                    "clouddriver.user",
                    "must be a non-empty header value (no control characters)",
                ));
            }
            if cd.retry.initial_millis == 0 || cd.retry.max_millis < cd.retry.initial_millis {
                return Err(invalid(
                    "clouddriver.retry",
                    "initialMillis must be at least 1 and at most maxMillis",
                ));
            }
            for key in cd.account.permissions.keys() {
                if !matches!(key.as_str(), "READ" | "WRITE" | "EXECUTE" | "CREATE") {
                    return Err(invalid(
                        "clouddriver.account.permissions",
                        &format!("unknown authorization {key:?} (READ, WRITE, EXECUTE, CREATE)"),
                    ));
                }
            }
        }
        if !crate::store::supported(&self.store.url) {
            return Err(invalid("store.url", "must be a sqlite: or postgres:// URL"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = Config::from_yaml_str(
            "instanceId: s1\ntunnel:\n  listen: 127.0.0.1:9001\n  tls: { certFile: a.crt, keyFile: a.key, clientCaFile: ca.crt, gatewayIdentities: [spiffe://t/gateway] }\nfacade:\n  listen: 127.0.0.1:9002\nstore:\n  url: sqlite:///tmp/x.db\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(c.instance_id, "s1");
        assert_eq!(c.tunnel.listen.port(), 9001);
        assert_eq!(c.facade.listen.port(), 9002);
        let tls = c.tunnel.tls.unwrap();
        assert_eq!(tls.client_ca_file, PathBuf::from("ca.crt"));
        assert_eq!(tls.gateway_identities, ["spiffe://t/gateway"]);
        assert_eq!(c.facade.relay_timeout_seconds, DEFAULT_RELAY_TIMEOUT_SECS);
        assert_eq!(c.facade.openapi_cache_bytes, DEFAULT_OPENAPI_CACHE_BYTES);
        let off = Config::from_yaml_str(
            "tunnel: { insecure: true }\nfacade: { openapiCacheBytes: 0 }\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(off.facade.openapi_cache_bytes, 0);
    }

    #[test]
    fn unknown_key_is_named_with_origin() {
        let e = Config::from_yaml_str("tunnel:\n  insecure: true\n  bogus: 1\n", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.yaml") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn tls_required_unless_insecure() {
        let e = Config::from_yaml_str("instanceId: x\n", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tunnel.tls") && e.contains("f.yaml"), "{e}");
        let c = Config::from_yaml_str("tunnel: { insecure: true }\n", "f.yaml").unwrap();
        assert_eq!(c.store.url, DEFAULT_STORE_URL);
    }

    #[test]
    fn clouddriver_and_accounts_sections() {
        let c = Config::from_yaml_str(
            "tunnel: { insecure: true }\naccounts: { gracePeriodSeconds: 5 }\nclouddriver:\n  baseUrl: http://localhost:7002\n  account: { namespaces: [a], permissions: { READ: [r], WRITE: [w] } }\n",
            "f.yaml",
        )
        .unwrap();
        assert_eq!(c.accounts.grace_period_seconds, 5);
        assert_eq!(c.accounts.operation_history, DEFAULT_OPERATION_HISTORY);
        let cd = c.clouddriver.unwrap();
        assert_eq!(cd.account.cache_threads, DEFAULT_CACHE_THREADS);
        assert_eq!(cd.retry.initial_millis, DEFAULT_RETRY_INITIAL_MILLIS);
        assert_eq!(cd.account.permissions["WRITE"], ["w"]);
        assert_eq!(Config::default().accounts.grace_period_seconds, 600);
        for (yaml, key) in [
            ("clouddriver: {}\n", "clouddriver"),
            ("clouddriver: { baseUrl: ftp://x }\n", "clouddriver.baseUrl"),
            ("clouddriver: { baseUrl: http://x, bogus: 1 }\n", "bogus"),
            (
                "accounts: { gracePeriodSeconds: 0 }\n",
                "accounts.gracePeriodSeconds",
            ),
            (
                "clouddriver: { kubeconfigDir: /tmp, account: { permissions: { ADMIN: [] } } }\n",
                "clouddriver.account.permissions",
            ),
        ] {
            let e =
                Config::from_yaml_str(&format!("tunnel: {{ insecure: true }}\n{yaml}"), "g.yaml")
                    .unwrap_err()
                    .to_string();
            assert!(e.contains(key) && e.contains("g.yaml"), "{yaml}: {e}");
        }
    }

    #[test]
    fn missing_tls_file_is_named() {
        let e = Config::from_yaml_str("tunnel: { tls: { certFile: a, keyFile: b } }\n", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tunnel.tls.clientCaFile"), "{e}");
    }

    #[test]
    fn tls_without_gateway_identities_is_refused_with_key_and_file() {
        let tls = "tunnel: { tls: { certFile: a, keyFile: b, clientCaFile: c";
        let e = Config::from_yaml_str(&format!("{tls} }} }}\n"), "s.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.yaml") && e.contains("tunnel.tls.gatewayIdentities"),
            "{e}"
        );
        for bad in ["[]", "['']", "[' gw']", "['spiffe://t/gateway/*']"] {
            let yaml = format!("{tls}, gatewayIdentities: {bad} }} }}\n");
            let e = Config::from_yaml_str(&yaml, "s.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("tunnel.tls.gatewayIdentities"), "{bad}: {e}");
        }
        let ok = format!("{tls}, gatewayIdentities: [gw.example, 'spiffe://t/gateway'] }} }}\n");
        Config::from_yaml_str(&ok, "s.yaml").unwrap();
        // Plaintext has no certificates to check; it stays development only.
        Config::from_yaml_str("tunnel: { insecure: true }\n", "s.yaml").unwrap();
    }
}
