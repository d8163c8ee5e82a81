//! The sidecar's configuration file (YAML, camelCase keys): where the tunnel
//! listens and how it authenticates gateways, where the Kubernetes API facade
//! listens (loopback only), where other sidecars of the store reach this one
//! and how they authenticate (`peer`), which database the store uses, how long offline accounts are
//! kept, and how accounts are registered with Clouddriver. Start with
//! [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the tunnel listens when the file does not say.
pub const DEFAULT_TUNNEL_LISTEN: &str = "127.0.0.1:7001";
/// Where the facade listens when the file does not say.
pub const DEFAULT_FACADE_LISTEN: &str = "127.0.0.1:7002";
/// Where the peer port listens when the file does not say: every address,
/// since other sidecars' pods reach it over the pod network.
pub const DEFAULT_PEER_LISTEN: &str = "0.0.0.0:7011";
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
/// Default `ownership.leaseSeconds`: how long an account's lease lasts
/// unless renewed.
pub const DEFAULT_LEASE_SECS: u64 = 15;
/// Default `ownership.handoverTimeoutMillis`: below the agents' default
/// wait for `ResumeFrom` (5 s), so a slow fetch still ends in a list, not
/// in an agent that stopped waiting.
pub const DEFAULT_HANDOVER_TIMEOUT_MILLIS: u64 = 3_000;
/// Default `ownership.handoverDrainSeconds`.
pub const DEFAULT_HANDOVER_DRAIN_SECS: u64 = 5;
/// Default `ownership.handoverMaxBytes`.
pub const DEFAULT_HANDOVER_MAX_BYTES: u64 = 1 << 30;

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
    /// The port other sidecars of the store forward facade requests to and
    /// fetch account snapshots from (absent: neither, which only a store no
    /// other sidecar shares allows).
    pub peer: PeerConfig,
    /// A listener serving only `/metrics`, for Prometheus to scrape over
    /// the pod network (absent: none; the facade, on loopback, serves
    /// `/metrics` too).
    pub metrics: MetricsConfig,
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
            peer: PeerConfig::default(),
            metrics: MetricsConfig::default(),
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
    /// without one, a DNS SAN, read as [`crate::identity`] says.
    /// Every other certificate `clientCaFile` signs — an agent's — is
    /// refused. Required: there is no safe default.
    pub gateway_identities: Vec<String>,
}

/// The Kubernetes API facade: plain HTTP, unauthenticated, with the agents'
/// rights in their clusters — so on loopback only, for the Clouddriver
/// beside it. Other sidecars reach this one through [`PeerConfig`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FacadeConfig {
    /// Address to listen on: a loopback address.
    pub listen: SocketAddr,
    /// Seconds a relayed request waits for the agent's response head.
    pub relay_timeout_seconds: u64,
    /// Bytes of OpenAPI documents kept in memory across all accounts
    /// (least recently used dropped first); 0 relays every OpenAPI request.
    pub openapi_cache_bytes: u64,
}

impl Default for FacadeConfig {
    fn default() -> Self {
        Self {
            listen: parse_addr(DEFAULT_FACADE_LISTEN),
            relay_timeout_seconds: DEFAULT_RELAY_TIMEOUT_SECS,
            openapi_cache_bytes: DEFAULT_OPENAPI_CACHE_BYTES,
        }
    }
}

/// The metrics listener: plain HTTP serving `/metrics` and nothing else
/// (no account data, no rights in any cluster), so unlike the facade it may
/// listen on the pod's address.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsConfig {
    /// Address to listen on (absent: no metrics listener).
    pub listen: Option<SocketAddr>,
}

/// Account ownership across sidecars sharing one store.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OwnershipConfig {
    /// Seconds an account's lease lasts unless renewed (renewed every third
    /// of it); also how long a dead sidecar's accounts wait for a new owner.
    pub lease_seconds: u64,
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
            lease_seconds: DEFAULT_LEASE_SECS,
            handover_timeout_millis: DEFAULT_HANDOVER_TIMEOUT_MILLIS,
            handover_drain_seconds: DEFAULT_HANDOVER_DRAIN_SECS,
            handover_max_bytes: DEFAULT_HANDOVER_MAX_BYTES,
        }
    }
}

/// The peer port ([`crate::peer`]): sidecars sharing a store forward facade
/// requests for the accounts another one owns to it, and fetch the caches
/// of accounts they take over from it. Served only with `tls` (mutual: the
/// client certificate must chain to `caFile` and name one of
/// `peerIdentities`) or, for development, `insecure`; neither leaves it
/// off.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The base URL the other sidecars reach this port at (`https://` with
    /// `tls`), recorded in the store: in a pod its own address, which the
    /// chart passes as `--peer-advertise-url https://$(POD_IP):7011`.
    /// Derived from `listen` when that is a specific address; required when
    /// it is unspecified and the store is PostgreSQL.
    pub advertise_url: Option<String>,
    /// Allows advertising a loopback address with a PostgreSQL store:
    /// every sidecar of the store runs on one host (tests, `spinlink dev`).
    /// Otherwise refused, as each sidecar would reach only itself.
    pub allow_loopback: bool,
    /// Certificate, key, CA and the sidecar identities served.
    pub tls: Option<PeerTlsConfig>,
    /// Plaintext HTTP without client certificates: development and tests
    /// only — it serves cluster caches and the agents' rights to whoever
    /// connects.
    pub insecure: bool,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            listen: parse_addr(DEFAULT_PEER_LISTEN),
            advertise_url: None,
            allow_loopback: false,
            tls: None,
            insecure: false,
        }
    }
}

impl PeerConfig {
    /// Whether the peer port is served.
    pub fn enabled(&self) -> bool {
        self.tls.is_some() || self.insecure
    }

    /// The URL scheme of the peer port.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The advertised base URL: `advertiseUrl`, else `<scheme>://<bound>`
    /// with an unspecified address read as loopback (validation allows that
    /// only where every sharer of the store runs on one host).
    pub fn advertise(&self, bound: SocketAddr) -> String {
        if let Some(url) = &self.advertise_url {
            return url.trim_end_matches('/').to_owned();
        }
        let ip = match bound.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        format!("{}://{}", self.scheme(), SocketAddr::new(ip, bound.port()))
    }
}

/// TLS files and identities of the peer port, used both ways: the server
/// requires this of the sidecars that connect, and each sidecar presents its
/// certificate and checks the other's when it forwards or fetches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerTlsConfig {
    /// PEM certificate chain, leaf first: served, and presented as client.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM bundle of the CAs that sign the sidecars' certificates.
    pub ca_file: PathBuf,
    /// The sidecars' identities, exactly: a URI SAN
    /// (`spiffe://spinlink/sidecar/spinlink`) or, for a certificate without
    /// one, a DNS SAN — read as the tunnel reads gateways'. Any other
    /// certificate `caFile` signs (a gateway's, an agent's) is refused, both
    /// as client and as server. Required: there is no safe default.
    pub peer_identities: Vec<String>,
}

/// The database.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct StoreConfig {
    /// `sqlite://PATH` (created if missing), `sqlite::memory:` or
    /// `postgres://…`.
    pub url: String,
}

impl StoreConfig {
    /// Whether other sidecars may share this store: any but an in-memory
    /// SQLite database.
    pub fn shared(&self) -> bool {
        !(self.url.contains(":memory:") || self.url.contains("mode=memory"))
    }

    /// Whether sidecars on other hosts may share it: PostgreSQL. A SQLite
    /// file is shared only by processes on one host.
    pub fn networked(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    /// Whether the URL names an engine the store supports: SQLite or
    /// PostgreSQL.
    pub fn supported(&self) -> bool {
        self.url.starts_with("sqlite:") || self.networked()
    }
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

/// Settings given outside the file: what differs per pod of one Deployment
/// and so cannot be in the ConfigMap they share.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Replaces `peer.advertiseUrl` (`--peer-advertise-url`,
    /// `SPINLINK_PEER_ADVERTISE_URL`).
    pub peer_advertise_url: Option<String>,
    /// Replaces `instanceId` (`--instance-id`, `SPINLINK_INSTANCE_ID`): per
    /// pod, so not in the configuration the pods share (the chart sets the
    /// pod's name).
    pub instance_id: Option<String>,
}

/// `url` with an IPv6 host put in brackets when it came without: the chart
/// passes `https://$(POD_IP):7011`, which on an IPv6 pod reads
/// `https://fd00:10::5:7011`. The port is always there (the chart writes
/// it), so the last colon starts it; anything that is not an IPv6 address
/// and a port that way is left as it is, for validation to judge.
fn bracket_ipv6_host(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    if authority.contains('[') || authority.matches(':').count() < 2 {
        return url.to_owned();
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return url.to_owned();
    };
    match (host.parse::<std::net::Ipv6Addr>(), port.parse::<u16>()) {
        (Ok(ip), Ok(port)) => format!("{scheme}://[{ip}]:{port}{path}"),
        _ => url.to_owned(),
    }
}

/// What is wrong with a list of certificate identities matched exactly
/// (`tunnel.tls.gatewayIdentities`, `peer.tls.peerIdentities`), if anything.
fn check_identities(identities: &[String]) -> Result<(), String> {
    for id in identities {
        if id.trim().is_empty() || id.trim() != id {
            return Err("an entry is empty or has surrounding spaces".to_owned());
        }
        if id.contains('*') {
            return Err(format!(
                "{id:?}: identities are matched exactly, not as globs"
            ));
        }
    }
    Ok(())
}

fn parse_addr(s: &str) -> SocketAddr {
    // The defaults are literals above; a failure here is a typo in this file.
    s.parse().expect("default listen address is valid")
}

impl Config {
    /// Reads, parses and validates a YAML file.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_file_with(path, &Overrides::default())
    }

    /// Reads and parses a YAML file, applies what the command line or the
    /// environment set, then validates the result.
    pub fn from_file_with(path: &Path, overrides: &Overrides) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml_str_with(&text, &path.display().to_string(), overrides)
    }

    /// Parses and validates YAML; `origin` names it in errors.
    pub fn from_yaml_str(s: &str, origin: &str) -> Result<Self> {
        Self::from_yaml_str_with(s, origin, &Overrides::default())
    }

    /// Parses YAML, applies `overrides`, and validates.
    pub fn from_yaml_str_with(s: &str, origin: &str, overrides: &Overrides) -> Result<Self> {
        let mut config: Config = if s.trim().is_empty() {
            Config::default()
        } else {
            serde_norway::from_str(s).map_err(|source| Error::Parse {
                origin: origin.to_owned(),
                source,
            })?
        };
        config.origin = origin.to_owned();
        if let Some(url) = &overrides.peer_advertise_url {
            config.peer.advertise_url = Some(bracket_ipv6_host(url));
        }
        if let Some(id) = &overrides.instance_id {
            config.instance_id = id.clone();
        }
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
        // Leases and forwarding tell the sidecars of a shared store apart by
        // it: replicas left at the default would each take themselves for
        // the owner of every account.
        if self.store.networked() && self.instance_id == DEFAULT_INSTANCE_ID {
            return Err(invalid(
                "instanceId",
                "must name this sidecar, uniquely among those sharing the PostgreSQL store \
                 (the chart sets SPINLINK_INSTANCE_ID to the pod's name, metadata.name)",
            ));
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
                check_identities(&tls.gateway_identities)
                    .map_err(|m| invalid("tunnel.tls.gatewayIdentities", &m))?;
            }
            (None, true) => {}
        }
        if !self.facade.listen.ip().is_loopback() {
            return Err(invalid(
                "facade.listen",
                &format!(
                    "{} is not a loopback address: the facade is plain HTTP without \
                     authentication that acts with the agents' rights in their clusters, \
                     for the Clouddriver beside it only; other sidecars use the peer port \
                     (peer.listen, mutual TLS)",
                    self.facade.listen
                ),
            ));
        }
        if self.facade.relay_timeout_seconds == 0 {
            return Err(invalid("facade.relayTimeoutSeconds", "must be at least 1"));
        }
        if self.ownership.lease_seconds == 0 {
            return Err(invalid("ownership.leaseSeconds", "must be at least 1"));
        }
        self.validate_peer()?;
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
        if !self.store.supported() {
            return Err(invalid("store.url", "must be a sqlite: or postgres:// URL"));
        }
        Ok(())
    }

    /// The peer port: TLS files and identities, and an address the other
    /// sidecars of the store can reach.
    fn validate_peer(&self) -> Result<()> {
        let invalid = |key, message: String| Error::Invalid {
            origin: self.origin.clone(),
            key,
            message,
        };
        let peer = &self.peer;
        match (&peer.tls, peer.insecure) {
            (Some(_), true) => {
                return Err(invalid(
                    "peer.insecure",
                    "cannot be true together with peer.tls".into(),
                ));
            }
            (None, false) if self.store.networked() => {
                return Err(invalid(
                    "peer.tls",
                    "required with a PostgreSQL store (unless peer.insecure is true): sidecars \
                     sharing it forward requests to, and take account caches over from, each \
                     other on the peer port"
                        .into(),
                ));
            }
            (None, _) => {}
            (Some(tls), false) => {
                for (key, path) in [
                    ("peer.tls.certFile", &tls.cert_file),
                    ("peer.tls.keyFile", &tls.key_file),
                    ("peer.tls.caFile", &tls.ca_file),
                ] {
                    if path.as_os_str().is_empty() {
                        return Err(invalid(key, "required".into()));
                    }
                }
                // Without it any certificate the CA signs — a gateway's —
                // could read every account's cache and act with its rights.
                if tls.peer_identities.is_empty() {
                    return Err(invalid(
                        "peer.tls.peerIdentities",
                        "required with peer.tls: name the URI SAN (or DNS SAN) of the sidecars' \
                         certificates, e.g. spiffe://spinlink/sidecar/spinlink; every other \
                         certificate the CA signs is refused"
                            .into(),
                    ));
                }
                check_identities(&tls.peer_identities)
                    .map_err(|m| invalid("peer.tls.peerIdentities", m))?;
            }
        }
        if !peer.enabled() {
            return Ok(());
        }
        let host = match &peer.advertise_url {
            Some(u) => match url::Url::parse(u) {
                Ok(p) if p.scheme() == peer.scheme() && p.host().is_some() => {
                    p.host().map(|h| match h {
                        url::Host::Ipv4(ip) => Some(std::net::IpAddr::V4(ip)),
                        url::Host::Ipv6(ip) => Some(std::net::IpAddr::V6(ip)),
                        url::Host::Domain(d) if d.eq_ignore_ascii_case("localhost") => {
                            Some(std::net::Ipv4Addr::LOCALHOST.into())
                        }
                        url::Host::Domain(_) => None,
                    })
                }
                _ => {
                    return Err(invalid(
                        "peer.advertiseUrl",
                        format!(
                            "must be a {}:// URL with a host (https with peer.tls, http with \
                             peer.insecure)",
                            peer.scheme()
                        ),
                    ));
                }
            },
            None if peer.listen.ip().is_unspecified() && self.store.networked() => {
                return Err(invalid(
                    "peer.advertiseUrl",
                    format!(
                        "required when peer.listen ({}) is an unspecified address and the store \
                         is PostgreSQL: the other sidecars need this one's own address, e.g. \
                         --peer-advertise-url https://$(POD_IP):{} from the downward API",
                        peer.listen,
                        peer.listen.port()
                    ),
                ));
            }
            None => Some(Some(peer.listen.ip())),
        };
        let ip = host.flatten();
        if self.store.networked()
            && !peer.allow_loopback
            && ip.is_some_and(|ip| ip.is_loopback() || ip.is_unspecified())
        {
            return Err(invalid(
                "peer.advertiseUrl",
                format!(
                    "{} is a loopback or unspecified address, and sidecars sharing a PostgreSQL \
                     store run on other hosts: each would reach only itself. Advertise this \
                     sidecar's own address (--peer-advertise-url), or set peer.allowLoopback \
                     when every sidecar of the store runs on this host",
                    peer.advertise(peer.listen)
                ),
            ));
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

    const PEER_TLS: &str = "tls: { certFile: p.crt, keyFile: p.key, caFile: ca.crt, peerIdentities: ['spiffe://t/sidecar'] }";
    const PG: &str = "instanceId: s1\nstore: { url: 'postgres://spinlink@db/spinlink' }\n";

    #[test]
    fn an_ipv6_pod_address_is_put_in_brackets() {
        for (given, want) in [
            (
                "https://fd00:10:244::5:7011",
                "https://[fd00:10:244::5]:7011",
            ),
            ("https://[fd00::5]:7011", "https://[fd00::5]:7011"),
            ("https://10.1.2.3:7011", "https://10.1.2.3:7011"),
            ("https://s-0.sidecars:7011/", "https://s-0.sidecars:7011/"),
            ("https://fd00::5:7011/x", "https://[fd00::5]:7011/x"),
        ] {
            assert_eq!(bracket_ipv6_host(given), want, "{given}");
        }
        let pod = Overrides {
            peer_advertise_url: Some("https://fd00:10:244::5:7011".into()),
            instance_id: Some("spin-clouddriver-5d8f-x2x7q".into()),
        };
        let c = Config::from_yaml_str_with(
            &format!(
                "tunnel: {{ insecure: true }}\n{PG}peer: {{ listen: '[::]:7011', {PEER_TLS} }}\n"
            ),
            "p.yaml",
            &pod,
        )
        .unwrap();
        assert_eq!(
            c.peer.advertise(parse_addr("[::]:7011")),
            "https://[fd00:10:244::5]:7011"
        );
    }

    #[test]
    fn sidecars_sharing_postgresql_are_named_each() {
        let shared = format!(
            "store: {{ url: 'postgres://spinlink@db/spinlink' }}\npeer: {{ {PEER_TLS}, advertiseUrl: 'https://10.1.2.3:7011' }}\n"
        );
        let e = refused(&shared, "instanceId");
        assert!(e.contains("SPINLINK_INSTANCE_ID"), "{e}");
        // The pod's name, from the downward API.
        let pod = Overrides {
            instance_id: Some("spin-clouddriver-5d8f-x2x7q".into()),
            ..Overrides::default()
        };
        let c = Config::from_yaml_str_with(
            &format!("tunnel: {{ insecure: true }}\n{shared}"),
            "p.yaml",
            &pod,
        )
        .unwrap();
        assert_eq!(c.instance_id, "spin-clouddriver-5d8f-x2x7q");
        // One SQLite file is one sidecar's: the default name is fine.
        with("store: { url: 'sqlite:///tmp/x.db' }\n").unwrap();
    }

    fn with(yaml: &str) -> Result<Config> {
        Config::from_yaml_str(&format!("tunnel: {{ insecure: true }}\n{yaml}"), "p.yaml")
    }

    fn refused(yaml: &str, key: &str) -> String {
        let e = with(yaml).unwrap_err().to_string();
        assert!(e.contains("p.yaml") && e.contains(key), "{yaml}: {e}");
        e
    }

    #[test]
    fn the_facade_listens_on_loopback_only() {
        for addr in ["0.0.0.0:7002", "10.0.0.5:7002", "[::]:7002"] {
            let e = refused(
                &format!("facade: {{ listen: '{addr}' }}\n"),
                "facade.listen",
            );
            assert!(e.contains("peer port"), "{e}");
        }
        for addr in ["127.0.0.1:7002", "127.0.0.2:0", "[::1]:7002"] {
            with(&format!("facade: {{ listen: '{addr}' }}\n")).unwrap();
        }
    }

    #[test]
    fn the_metrics_listener_is_off_unless_named_and_may_use_any_address() {
        assert!(with("").unwrap().metrics.listen.is_none());
        let c = with("metrics: { listen: '0.0.0.0:7010' }\n").unwrap();
        assert_eq!(c.metrics.listen, Some(parse_addr("0.0.0.0:7010")));
        refused("metrics: { port: 7010 }\n", "port");
    }

    #[test]
    fn the_old_forwarding_and_handover_addresses_are_gone() {
        refused(
            "facade: { advertiseUrl: 'http://10.0.0.5:7002' }\n",
            "advertiseUrl",
        );
        refused(
            "ownership: { handoverListen: '0.0.0.0:7010' }\n",
            "handoverListen",
        );
    }

    #[test]
    fn the_peer_port_needs_tls_files_and_sidecar_identities() {
        let c = with(&format!("peer: {{ {PEER_TLS} }}\n")).unwrap();
        assert!(c.peer.enabled());
        assert_eq!(c.peer.listen, parse_addr(DEFAULT_PEER_LISTEN));
        assert_eq!(c.peer.tls.unwrap().peer_identities, ["spiffe://t/sidecar"]);
        // Without either it is off, which a store of one's own allows.
        assert!(!with("").unwrap().peer.enabled());
        refused(
            "peer: { tls: { certFile: a, keyFile: b, peerIdentities: [x] } }\n",
            "peer.tls.caFile",
        );
        for bad in ["[]", "['']", "[' s']", "['spiffe://t/*']"] {
            refused(
                &format!(
                    "peer: {{ tls: {{ certFile: a, keyFile: b, caFile: c, peerIdentities: {bad} }} }}\n"
                ),
                "peer.tls.peerIdentities",
            );
        }
        refused(
            &format!("peer: {{ insecure: true, {PEER_TLS} }}\n"),
            "peer.insecure",
        );
        // A PostgreSQL store is shared across hosts: the port is required.
        let e = refused(PG, "peer.tls");
        assert!(e.contains("PostgreSQL"), "{e}");
        refused(
            &format!("peer: {{ advertiseUrl: 'http://10.0.0.5:7011', {PEER_TLS} }}\n"),
            "peer.advertiseUrl",
        );
    }

    #[test]
    fn a_postgresql_store_needs_an_address_other_hosts_reach() {
        // The chart's shape: every address, the pod's own advertised.
        let listen_all = format!("{PG}peer: {{ listen: '0.0.0.0:7011', {PEER_TLS} }}\n");
        let e = refused(&listen_all, "peer.advertiseUrl");
        assert!(e.contains("--peer-advertise-url"), "{e}");
        let pod = Overrides {
            peer_advertise_url: Some("https://10.1.2.3:7011".into()),
            instance_id: Some("spin-clouddriver-5d8f-x2x7q".into()),
        };
        let c = Config::from_yaml_str_with(
            &format!("tunnel: {{ insecure: true }}\n{listen_all}"),
            "p.yaml",
            &pod,
        )
        .unwrap();
        assert_eq!(
            c.peer.advertise(parse_addr("0.0.0.0:7011")),
            "https://10.1.2.3:7011"
        );
        // Loopback, given or derived, reaches only this sidecar.
        for peer in [
            format!("listen: '127.0.0.1:7011', {PEER_TLS}"),
            format!("advertiseUrl: 'https://127.0.0.1:7011', {PEER_TLS}"),
            format!("advertiseUrl: 'https://localhost:7011', {PEER_TLS}"),
            format!("advertiseUrl: 'https://0.0.0.0:7011', {PEER_TLS}"),
        ] {
            let e = refused(&format!("{PG}peer: {{ {peer} }}\n"), "peer.advertiseUrl");
            assert!(e.contains("allowLoopback"), "{e}");
            // Unless every sidecar of the store runs on this host.
            with(&format!("{PG}peer: {{ allowLoopback: true, {peer} }}\n")).unwrap();
        }
        // A name resolved elsewhere (a headless Service's pod name) is the
        // operator's to get right.
        with(&format!(
            "{PG}peer: {{ advertiseUrl: 'https://s-0.sidecars:7011', {PEER_TLS} }}\n"
        ))
        .unwrap();
        // A SQLite file is shared only on one host: loopback is right.
        let c = with(
            "store: { url: 'sqlite:///tmp/s.db' }\npeer: { listen: '0.0.0.0:0', insecure: true }\n",
        )
        .unwrap();
        assert_eq!(
            c.peer.advertise(parse_addr("0.0.0.0:4242")),
            "http://127.0.0.1:4242"
        );
    }
}
