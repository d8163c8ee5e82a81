//! The agent's configuration file: who the agent is, how it reaches the
//! gateway, how it backs off, and which clusters (accounts) it serves.
//!
//! Start with [`Config::load`]; every error names the offending key and
//! the file it came from. The Armory Scale Agent's file is read too: see
//! [`armory`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod armory;

/// Default first reconnect delay cap, in milliseconds.
pub const DEFAULT_INITIAL_BACKOFF_MILLIS: u64 = 200;
/// Default largest reconnect delay cap, in milliseconds.
pub const DEFAULT_MAX_BACKOFF_MILLIS: u64 = 30_000;
/// Default `reconnect.moveSpreadMaxMillis`.
pub const DEFAULT_MOVE_SPREAD_MAX_MILLIS: u64 = 10_000;
/// Default interval of application heartbeats on each cache stream, in seconds.
/// Well inside the 350 s idle cut of cloud load balancers.
pub const DEFAULT_HEARTBEAT_SECONDS: u64 = 30;
/// Where Kubernetes mounts a pod's service account.
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Default `leaderElection.leaseDurationSeconds` (as client-go's default).
pub const DEFAULT_LEASE_DURATION_SECONDS: u64 = 15;
/// Default `leaderElection.namespace`.
pub const DEFAULT_LEASE_NAMESPACE: &str = "default";
/// Default interval of configuration file checks (hot reload).
pub const DEFAULT_RELOAD_INTERVAL_SECONDS: u64 = 2;

/// Default size of the unacked window: `CacheUp` messages sent but not yet
/// acknowledged by the sidecar, per account. When full, the watches wait.
pub const DEFAULT_UNACKED_WINDOW: usize = 10_000;
/// Default page size (`limit`) of initial lists.
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// Default interval between discovery refreshes, in seconds.
pub const DEFAULT_DISCOVERY_INTERVAL_SECONDS: u64 = 30;
/// Default wait for the sidecar's `ResumeFrom` after a cache stream opens.
pub const DEFAULT_RESUME_WAIT_MILLIS: u64 = 5_000;
/// Default number of initial lists running at once, over all accounts.
pub const DEFAULT_TOTAL_BUDGET: usize = 8;
/// Default number of initial lists running at once per account.
pub const DEFAULT_BUDGET_PER_ACCOUNT: usize = 4;
/// Default interval of HTTP/2 PINGs on the gateway connection, in seconds.
pub const DEFAULT_KEEPALIVE_INTERVAL_SECONDS: u64 = 20;
/// Default time a PING may go unanswered, in seconds.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECONDS: u64 = 10;

/// Why a configuration could not be used.
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
    /// The YAML did not parse into the expected shape (unknown key, wrong type).
    #[error("{origin}: {message}")]
    Parse {
        /// Where the YAML came from.
        origin: String,
        /// The parser's message; it names the key.
        message: String,
    },
    /// A value is missing or not acceptable.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        /// Where the YAML came from.
        origin: String,
        /// The key, as a path (`kubernetes.accounts[0].name`).
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The whole agent configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The agent's id, stated in `Hello`. Required.
    pub agent_id: String,
    /// How to reach the gateway.
    pub gateway: GatewayConfig,
    /// Reconnect backoff.
    pub reconnect: ReconnectConfig,
    /// Interval of cache stream heartbeats.
    pub heartbeat_seconds: u64,
    /// The clusters this agent serves.
    pub kubernetes: KubernetesConfig,
    /// Delivery and listing of the cache streams.
    pub cache: CacheConfig,
    /// Concurrency budgets.
    pub tasks: TasksConfig,
    /// The admin port.
    pub admin: AdminConfig,
    /// How often the configuration file is checked for changes (hot reload
    /// of `kubernetes.accounts`); 0 turns it off.
    pub reload_interval_seconds: u64,
    /// Several replicas per cluster: a Lease per account elects the one that
    /// caches; every replica relays.
    pub leader_election: LeaderElectionConfig,
    /// Accounts the sidecars assign to this agent at run time over the
    /// `Assignments` stream (infrastructure mode only).
    pub dynamic_accounts: DynamicAccountsConfig,
    /// The file the configuration was read from, watched for changes. Not a
    /// YAML key.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// Where the configuration came from (file path or an origin label), for
    /// error messages. Not a YAML key.
    #[serde(skip)]
    pub origin: String,
}

/// The `leaderElection:` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderElectionConfig {
    /// Off: every replica caches (one replica per cluster).
    pub enabled: bool,
    /// How long a leader that stopped renewing keeps the Lease; another
    /// replica takes over within this time.
    pub lease_duration_seconds: u64,
    /// Namespace of the Leases (`spinlink-agent-<account>`), in each
    /// account's cluster.
    pub namespace: String,
    /// This replica's holder identity; default the `POD_NAME` environment
    /// variable, else the host name, plus a random suffix.
    pub identity: Option<String>,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            lease_duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
            namespace: DEFAULT_LEASE_NAMESPACE.to_owned(),
            identity: None,
        }
    }
}

/// The `dynamicAccounts:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DynamicAccountsConfig {
    /// Open `Assignments` on every connection and serve what it assigns.
    pub enabled: bool,
    /// The zone whose accounts this agent takes; empty takes the accounts
    /// created without a zone.
    pub zone: String,
}

/// A kubeconfig held in memory: an account assigned over `Assignments`.
/// A credential: its `Debug` shows the size only, and errors about it never
/// quote it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct InlineKubeconfig(pub std::sync::Arc<Vec<u8>>);

impl std::fmt::Debug for InlineKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<kubeconfig, {} bytes>", self.0.len())
    }
}

/// The `gateway:` section: the address and TLS material of the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayConfig {
    /// `https://host:port` (or `http://` with `insecure: true`, meaning h2c).
    pub url: String,
    /// TLS server name to verify; defaults to the host of `url`.
    pub server_name: Option<String>,
    /// CA bundle that signs the gateway's certificate.
    pub ca_file: Option<PathBuf>,
    /// The agent's client certificate (its identity).
    pub cert_file: Option<PathBuf>,
    /// The key of `cert_file` (PKCS#8, PKCS#1 or SEC1; PKCS#8 may be
    /// encrypted, see `key_password`).
    pub key_file: Option<PathBuf>,
    /// The password of an encrypted PKCS#8 `key_file`.
    pub key_password: Option<Password>,
    /// Plaintext HTTP/2 (h2c), for local development only.
    pub insecure: bool,
    /// Interval of HTTP/2 PINGs, in seconds.
    pub keepalive_interval_seconds: u64,
    /// How long a PING may go unanswered before the connection is dropped.
    pub keepalive_timeout_seconds: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            server_name: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            key_password: None,
            insecure: false,
            keepalive_interval_seconds: DEFAULT_KEEPALIVE_INTERVAL_SECONDS,
            keepalive_timeout_seconds: DEFAULT_KEEPALIVE_TIMEOUT_SECONDS,
        }
    }
}

/// A password from the configuration: its `Debug` never shows it, and a
/// value of the wrong shape is refused without quoting it. A YAML number or
/// boolean is the text it was written as (`12345` is the password "12345").
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde_norway::Value;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Self(s)),
            Value::Number(n) => Ok(Self(n.to_string())),
            Value::Bool(b) => Ok(Self(b.to_string())),
            _ => Err(serde::de::Error::custom("a password must be a string")),
        }
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<password>")
    }
}

/// The `admin:` section: `/healthz`, `/readyz` and `/metrics` over plain
/// HTTP. Off unless `listen` is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminConfig {
    /// Address to serve on, e.g. `0.0.0.0:9090` (port 0: any free port).
    pub listen: Option<std::net::SocketAddr>,
}

/// The `cache:` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CacheConfig {
    /// Messages sent and not yet acknowledged, per account, before the
    /// watches wait.
    pub unacked_window: usize,
    /// `limit` of each page of an initial list.
    pub page_size: u32,
    /// Seconds between discovery refreshes (new CRDs are picked up).
    pub discovery_interval_seconds: u64,
    /// How long a new cache stream waits for the sidecar's resume points.
    pub resume_wait_millis: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            unacked_window: DEFAULT_UNACKED_WINDOW,
            page_size: DEFAULT_PAGE_SIZE,
            discovery_interval_seconds: DEFAULT_DISCOVERY_INTERVAL_SECONDS,
            resume_wait_millis: DEFAULT_RESUME_WAIT_MILLIS,
        }
    }
}

/// The `tasks:` section: how many initial lists may run at once, so memory
/// depends on these numbers and the page size, not on the cluster's size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TasksConfig {
    /// Over all accounts.
    pub total_budget: usize,
    /// Per account.
    pub budget_per_account: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            total_budget: DEFAULT_TOTAL_BUDGET,
            budget_per_account: DEFAULT_BUDGET_PER_ACCOUNT,
        }
    }
}

/// The `reconnect:` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ReconnectConfig {
    /// The first delay cap.
    pub initial_backoff_millis: u64,
    /// The largest delay cap.
    pub max_backoff_millis: u64,
    /// The longest wait before following a gateway's `Reconnect` (never
    /// more than half its deadline): see [`crate::backoff::move_spread`].
    pub move_spread_max_millis: u64,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self {
            initial_backoff_millis: DEFAULT_INITIAL_BACKOFF_MILLIS,
            max_backoff_millis: DEFAULT_MAX_BACKOFF_MILLIS,
            move_spread_max_millis: DEFAULT_MOVE_SPREAD_MAX_MILLIS,
        }
    }
}

impl ReconnectConfig {
    /// The first delay cap as a duration.
    pub fn initial(&self) -> Duration {
        Duration::from_millis(self.initial_backoff_millis)
    }

    /// The largest delay cap as a duration.
    pub fn max(&self) -> Duration {
        Duration::from_millis(self.max_backoff_millis)
    }

    /// The longest wait before following a `Reconnect`, as a duration.
    pub fn move_spread_max(&self) -> Duration {
        Duration::from_millis(self.move_spread_max_millis)
    }
}

/// The `kubernetes:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// The accounts (clusters) served.
    pub accounts: Vec<AccountConfig>,
}

/// `kubeconfigSecret:` of an account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's namespace. Required.
    pub namespace: String,
    /// The Secret's name. Required.
    pub name: String,
    /// The data key holding the kubeconfig; default `config`.
    pub key: Option<String>,
}

/// One account: a cluster and how to reach its API server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AccountConfig {
    /// The account name, unique within the agent. Required.
    pub name: String,
    /// A kubeconfig file; exclusive with `service_account`.
    pub kubeconfig_file: Option<PathBuf>,
    /// The kubeconfig context to use (its current context when absent).
    pub context: Option<String>,
    /// Use the in-cluster service account; exclusive with `kubeconfig_file`.
    pub service_account: bool,
    /// A kubeconfig kept in a Secret of the cluster the agent runs in, read
    /// with the in-cluster service account; exclusive with `kubeconfigFile`
    /// and `serviceAccount`.
    pub kubeconfig_secret: Option<SecretRef>,
    /// An assigned account's kubeconfig (see [`InlineKubeconfig`]). Not a
    /// YAML key: only `Assignments` sets it.
    #[serde(skip)]
    pub kubeconfig_inline: Option<InlineKubeconfig>,
    /// SHA-256 of `kubeconfig_file`'s content as last read (see
    /// [`Config::read_kubeconfig_digests`]): a kubeconfig rewritten in place
    /// (a rotated token or certificate, a mounted Secret updated) makes the
    /// account differ, so a reload restarts it. Not a YAML key.
    #[serde(skip)]
    pub kubeconfig_digest: Option<Vec<u8>>,
    /// Where the service account's `token`, `ca.crt` and `namespace` are
    /// mounted (with `serviceAccount: true` or `kubeconfigSecret`); default
    /// [`DEFAULT_SERVICE_ACCOUNT_DIR`]. The token is read again whenever the
    /// file changes (the kubelet rotates it).
    pub service_account_dir: Option<PathBuf>,
    /// Watch only these kinds: a kind name (`Deployment`), a plural resource
    /// (`deployments`), `resource.group` or `Kind.group`. Every kind the API
    /// server can list and watch when empty. Exclusive with `omit_kinds`.
    pub kinds: Vec<String>,
    /// Watch every kind but these (same forms as `kinds`).
    pub omit_kinds: Vec<String>,
    /// Watch namespaced kinds only in these namespaces, one watch each.
    pub namespaces: Vec<String>,
    /// Leave out objects in these namespaces.
    pub omit_namespaces: Vec<String>,
    /// Custom resources to include when `kinds` is set, as in Spinnaker's
    /// account configuration (`- kind: CronTab.stable.example.com`, or just
    /// the name).
    pub custom_resource_definitions: Vec<CustomResourceDefinition>,
    /// What relayed requests may do.
    pub relay: RelayPolicyConfig,
    /// Whom relayed requests act as (`Impersonate-User`/`-Group`); the
    /// agent's own credentials when absent. Watches always use the agent's.
    pub impersonate: Option<ImpersonateConfig>,
}

/// The `impersonate:` section of an account: a user (or a service account)
/// and groups. The agent's credentials need the `impersonate` verb on them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ImpersonateConfig {
    /// A user name; exclusive with `service_account`.
    pub user: Option<String>,
    /// `namespace/name` of a service account, impersonated as
    /// `system:serviceaccount:namespace:name`.
    pub service_account: Option<String>,
    /// Groups, sent as one `Impersonate-Group` header each.
    pub groups: Vec<String>,
}

impl ImpersonateConfig {
    /// The user name to send, checked: one of `user` or `serviceAccount`.
    pub fn user_name(&self) -> std::result::Result<String, String> {
        match (&self.user, &self.service_account) {
            (Some(_), Some(_)) => Err("set either user or serviceAccount, not both".into()),
            (None, None) => Err("one of user or serviceAccount is required".into()),
            (Some(user), None) if !user.is_empty() => Ok(user.clone()),
            (Some(_), None) => Err("user is empty".into()),
            (None, Some(sa)) => match sa.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Ok(format!("system:serviceaccount:{ns}:{name}"))
                }
                _ => Err(format!("serviceAccount {sa:?} must be namespace/name")),
            },
        }
    }
}

/// One `customResourceDefinitions` entry: a name, or Spinnaker's object form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CustomResourceDefinition {
    /// `crontabs.stable.example.com` or `CronTab.stable.example.com`.
    Name(String),
    /// `{kind: CronTab.stable.example.com, spinnakerKind: ..., versioned: ...}`.
    Object(CustomResourceObject),
}

/// Spinnaker's form of a custom resource entry; only `kind` is supported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomResourceObject {
    /// `Kind.group` or `resource.group`.
    pub kind: String,
    /// Spinnaker's kind mapping: refused by validation (the agent keeps
    /// Kubernetes kind names).
    pub spinnaker_kind: Option<String>,
    /// Refused by validation.
    pub versioned: Option<bool>,
}

impl CustomResourceDefinition {
    /// The name it gives.
    pub fn name(&self) -> &str {
        match self {
            Self::Name(n) => n,
            Self::Object(o) => &o.kind,
        }
    }
}

/// The `relay:` section of an account: allow-lists (with `*` globs) for
/// relayed requests. The default allows everything except reading Secret
/// values (Secrets are returned without `data` and `stringData`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RelayPolicyConfig {
    /// Verbs: get, list, watch, create, update, patch, delete, deletecollection.
    pub verbs: Vec<String>,
    /// Resources: `pods`, `deployments.apps`, `*.apps`, `pods/log`.
    pub resources: Vec<String>,
    /// Namespaces. Requests across all namespaces or on cluster-scoped
    /// resources need `*`.
    pub namespaces: Vec<String>,
    /// Relay Secret values unchanged (they are removed by default).
    pub read_secrets: bool,
}

impl Default for RelayPolicyConfig {
    fn default() -> Self {
        let all = || vec!["*".to_owned()];
        Self {
            verbs: all(),
            resources: all(),
            namespaces: all(),
            read_secrets: false,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agent_id: String::new(),
            gateway: GatewayConfig::default(),
            reconnect: ReconnectConfig::default(),
            heartbeat_seconds: DEFAULT_HEARTBEAT_SECONDS,
            kubernetes: KubernetesConfig::default(),
            cache: CacheConfig::default(),
            tasks: TasksConfig::default(),
            admin: AdminConfig::default(),
            reload_interval_seconds: DEFAULT_RELOAD_INTERVAL_SECONDS,
            leader_election: LeaderElectionConfig::default(),
            dynamic_accounts: DynamicAccountsConfig::default(),
            file: None,
            origin: String::new(),
        }
    }
}

impl Config {
    /// Reads, parses and validates a YAML configuration file, native or
    /// Armory's (the warnings of an Armory file are dropped: see
    /// [`Config::load`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        Ok(Self::load(path)?.config)
    }

    /// Reads, parses and validates a configuration file: a native one, or
    /// an Armory agent's (with its `armory-agent-local.yaml` override on
    /// top), whose keys without a meaning here come back as warnings.
    pub fn load(path: &Path) -> Result<Loaded> {
        Sources::read(path)?.load()
    }

    /// Records the digest of every account's kubeconfig file as it is now
    /// (`None` for one that cannot be read: connecting names the error).
    pub fn read_kubeconfig_digests(&mut self) {
        for account in &mut self.kubernetes.accounts {
            account.kubeconfig_digest = account.kubeconfig_file.as_deref().and_then(|path| {
                let bytes = std::fs::read(path).ok()?;
                Some(
                    ring::digest::digest(&ring::digest::SHA256, &bytes)
                        .as_ref()
                        .to_vec(),
                )
            });
        }
    }

    /// Parses and validates YAML; `origin` names its source in errors.
    pub fn from_yaml_str(s: &str, origin: &str) -> Result<Self> {
        let mut config: Config = serde_norway::from_str(s).map_err(|e| Error::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        config.origin = origin.to_owned();
        config.validate()?;
        Ok(config)
    }

    /// Checks required keys, exclusive choices, uniqueness and that named
    /// files exist.
    pub fn validate(&self) -> Result<()> {
        let invalid = |key: &str, message: &str| Error::Invalid {
            origin: if self.origin.is_empty() {
                "config".to_owned()
            } else {
                self.origin.clone()
            },
            key: key.to_owned(),
            message: message.to_owned(),
        };
        let file_exists = |key: &str, path: &Path| {
            if path.is_file() {
                Ok(())
            } else {
                Err(invalid(
                    key,
                    &format!("file {} does not exist", path.display()),
                ))
            }
        };

        if self.agent_id.trim().is_empty() {
            return Err(invalid("agentId", "required"));
        }

        let gw = &self.gateway;
        if gw.url.is_empty() {
            return Err(invalid("gateway.url", "required"));
        }
        let uri: http::Uri = gw
            .url
            .parse()
            .map_err(|e| invalid("gateway.url", &format!("not a URL: {e}")))?;
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("gateway.url", "has no host"));
        }
        match (uri.scheme_str(), gw.insecure) {
            (Some("https"), _) => {}
            (Some("http"), true) => {}
            (Some("http"), false) => {
                return Err(invalid(
                    "gateway.url",
                    "http:// (plaintext) needs `gateway.insecure: true`; use https://",
                ));
            }
            _ => return Err(invalid("gateway.url", "scheme must be https (or http)")),
        }
        if !gw.insecure {
            match &gw.ca_file {
                Some(ca) => file_exists("gateway.caFile", ca)?,
                None => return Err(invalid("gateway.caFile", "required for https")),
            }
            match (&gw.cert_file, &gw.key_file) {
                (Some(cert), Some(key)) => {
                    file_exists("gateway.certFile", cert)?;
                    file_exists("gateway.keyFile", key)?;
                }
                (None, None) => {}
                (Some(_), None) => {
                    return Err(invalid("gateway.keyFile", "required with gateway.certFile"));
                }
                (None, Some(_)) => {
                    return Err(invalid("gateway.certFile", "required with gateway.keyFile"));
                }
            }
        }
        if gw.key_password.is_some() && gw.key_file.is_none() {
            return Err(invalid(
                "gateway.keyPassword",
                "only used with gateway.keyFile",
            ));
        }
        if let Some(name) = &gw.server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return Err(invalid("gateway.serverName", "not a valid DNS name or IP"));
        }

        let rc = &self.reconnect;
        if rc.initial_backoff_millis == 0 {
            return Err(invalid("reconnect.initialBackoffMillis", "must be > 0"));
        }
        if rc.max_backoff_millis < rc.initial_backoff_millis {
            return Err(invalid(
                "reconnect.maxBackoffMillis",
                "must be >= reconnect.initialBackoffMillis",
            ));
        }
        if self.heartbeat_seconds == 0 {
            return Err(invalid("heartbeatSeconds", "must be > 0"));
        }
        if gw.keepalive_interval_seconds == 0 {
            return Err(invalid("gateway.keepaliveIntervalSeconds", "must be > 0"));
        }
        if gw.keepalive_timeout_seconds == 0 {
            return Err(invalid("gateway.keepaliveTimeoutSeconds", "must be > 0"));
        }
        let c = &self.cache;
        for (key, value) in [
            ("cache.unackedWindow", c.unacked_window as u64),
            ("cache.pageSize", u64::from(c.page_size)),
            (
                "cache.discoveryIntervalSeconds",
                c.discovery_interval_seconds,
            ),
            ("tasks.totalBudget", self.tasks.total_budget as u64),
            (
                "tasks.budgetPerAccount",
                self.tasks.budget_per_account as u64,
            ),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be > 0"));
            }
        }

        let le = &self.leader_election;
        if le.enabled {
            if le.lease_duration_seconds < 2 {
                return Err(invalid(
                    "leaderElection.leaseDurationSeconds",
                    "must be >= 2",
                ));
            }
            if le.namespace.is_empty() {
                return Err(invalid("leaderElection.namespace", "required"));
            }
            if le.identity.as_deref().is_some_and(str::is_empty) {
                return Err(invalid("leaderElection.identity", "must not be empty"));
            }
        }

        let dynamic = &self.dynamic_accounts;
        if dynamic.enabled {
            if le.enabled {
                // Every replica would claim accounts for itself.
                return Err(invalid(
                    "dynamicAccounts.enabled",
                    "cannot be used with leaderElection.enabled",
                ));
            }
            if let Some(i) = self
                .kubernetes
                .accounts
                .iter()
                .position(|a| a.service_account)
            {
                return Err(invalid(
                    &format!("kubernetes.accounts[{i}].serviceAccount"),
                    "dynamicAccounts is for infrastructure mode (accounts from kubeconfigs); \
                     an agent serving its own cluster with serviceAccount: true cannot take them",
                ));
            }
            if http::HeaderValue::from_str(&dynamic.zone).is_err() {
                return Err(invalid(
                    "dynamicAccounts.zone",
                    "not usable as a header value",
                ));
            }
        } else if !dynamic.zone.is_empty() {
            return Err(invalid(
                "dynamicAccounts.zone",
                "only used with dynamicAccounts.enabled: true",
            ));
        }
        if self.kubernetes.accounts.is_empty() && !dynamic.enabled {
            return Err(invalid(
                "kubernetes.accounts",
                "at least one account is required (or dynamicAccounts.enabled: true)",
            ));
        }
        let mut names = BTreeSet::new();
        for (i, account) in self.kubernetes.accounts.iter().enumerate() {
            let key = |k: &str| format!("kubernetes.accounts[{i}].{k}");
            if account.name.trim().is_empty() {
                return Err(invalid(&key("name"), "required"));
            }
            // The name travels in an HTTP/2 header.
            if http::HeaderValue::from_str(&account.name).is_err() {
                return Err(invalid(&key("name"), "not usable as a header value"));
            }
            if !names.insert(account.name.as_str()) {
                return Err(invalid(
                    &key("name"),
                    &format!("duplicate account name {:?}", account.name),
                ));
            }
            let sources = usize::from(account.kubeconfig_file.is_some())
                + usize::from(account.service_account)
                + usize::from(account.kubeconfig_secret.is_some())
                + usize::from(account.kubeconfig_inline.is_some());
            if sources != 1 {
                return Err(invalid(
                    &key("kubeconfigFile"),
                    "exactly one of kubeconfigFile, kubeconfigSecret or serviceAccount: true is required",
                ));
            }
            if let Some(path) = &account.kubeconfig_file {
                file_exists(&key("kubeconfigFile"), path)?;
            }
            if let Some(secret) = &account.kubeconfig_secret {
                if secret.namespace.is_empty() {
                    return Err(invalid(&key("kubeconfigSecret.namespace"), "required"));
                }
                if secret.name.is_empty() {
                    return Err(invalid(&key("kubeconfigSecret.name"), "required"));
                }
                if secret.key.as_deref().is_some_and(str::is_empty) {
                    return Err(invalid(&key("kubeconfigSecret.key"), "must not be empty"));
                }
            }
            if account.service_account_dir.is_some()
                && !account.service_account
                && account.kubeconfig_secret.is_none()
            {
                return Err(invalid(
                    &key("serviceAccountDir"),
                    "only used with serviceAccount: true or kubeconfigSecret",
                ));
            }
            // A list and its omit list together would leave the reader
            // guessing which wins.
            for (list, omit, both) in [
                (
                    "kinds",
                    "omitKinds",
                    !account.kinds.is_empty() && !account.omit_kinds.is_empty(),
                ),
                (
                    "namespaces",
                    "omitNamespaces",
                    !account.namespaces.is_empty() && !account.omit_namespaces.is_empty(),
                ),
            ] {
                if both {
                    return Err(invalid(
                        &key(list),
                        &format!("set either {} or {}, not both", key(list), key(omit)),
                    ));
                }
            }
            if let Some(imp) = &account.impersonate {
                let user = imp
                    .user_name()
                    .map_err(|m| invalid(&key("impersonate"), &m))?;
                for value in std::iter::once(&user).chain(&imp.groups) {
                    if http::HeaderValue::from_str(value).is_err() || value.is_empty() {
                        return Err(invalid(
                            &key("impersonate"),
                            &format!("{value:?} is not usable as a header value"),
                        ));
                    }
                }
            }
            for (j, crd) in account.custom_resource_definitions.iter().enumerate() {
                // Spinnaker's mapping keys change nothing in what the agent
                // watches; accepting them silently would mislead.
                if let CustomResourceDefinition::Object(o) = crd {
                    let crd_key = |k: &str| key(&format!("customResourceDefinitions[{j}].{k}"));
                    if o.spinnaker_kind.is_some() {
                        return Err(invalid(
                            &crd_key("spinnakerKind"),
                            "not supported by this agent (kinds keep their Kubernetes names); remove it",
                        ));
                    }
                    if o.versioned.is_some() {
                        return Err(invalid(
                            &crd_key("versioned"),
                            "not supported by this agent; remove it",
                        ));
                    }
                    if o.kind.is_empty() {
                        return Err(invalid(&crd_key("kind"), "required"));
                    }
                }
            }
            let relay = &account.relay;
            for (k, globs) in [
                ("relay.verbs", &relay.verbs),
                ("relay.resources", &relay.resources),
                ("relay.namespaces", &relay.namespaces),
            ] {
                for g in globs {
                    if let Err(e) = globset::Glob::new(g) {
                        return Err(invalid(&key(k), &format!("bad pattern {g:?}: {e}")));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Which format a configuration file is written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// spinlink's own.
    Native,
    /// The Armory Scale Agent's, with the override file read on top of it
    /// when there is one.
    Armory {
        /// The `armory-agent-local.yaml` read, if any.
        local: Option<PathBuf>,
    },
}

/// A configuration as loaded.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration, validated.
    pub config: Config,
    /// The format of the file.
    pub format: Format,
    /// Keys accepted without effect (Armory files only), one each.
    pub warnings: Vec<armory::Warning>,
}

/// The text of a configuration file, and of the Armory override beside it
/// when the file is Armory's: what a load reads, and what hot reload
/// compares.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The configuration file.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
    /// Whether it is an Armory agent's file.
    pub armory: bool,
    /// The override file and its text (Armory files only).
    pub local: Option<(PathBuf, String)>,
}

impl Sources {
    /// Reads `path` and, when it is an Armory file, the override beside it.
    pub fn read(path: &Path) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })
        };
        let text = read(path)?;
        // A file that does not parse is reported by the native parser.
        let armory = serde_norway::from_str::<serde_norway::Value>(&text)
            .is_ok_and(|doc| doc.is_null() || armory::is_armory(&doc));
        let local = match armory.then(|| armory::local_override(path)).flatten() {
            Some(local) => {
                let text = read(&local)?;
                Some((local, text))
            }
            None => None,
        };
        Ok(Self {
            path: path.to_owned(),
            text,
            armory,
            local,
        })
    }

    /// Where the configuration came from, for messages.
    pub fn origin(&self) -> String {
        match &self.local {
            Some((local, _)) => format!("{} (with {})", self.path.display(), local.display()),
            None => self.path.display().to_string(),
        }
    }

    /// An Armory file as the native configuration's YAML, with what it
    /// dropped; `None` for a native file.
    pub fn armory_to_native(&self) -> Result<Option<armory::Converted>> {
        if !self.armory {
            return Ok(None);
        }
        let mut doc = armory::parse_text(&self.text, &self.path.display().to_string())?;
        if let Some((local, text)) = &self.local {
            armory::merge(
                &mut doc,
                armory::parse_text(text, &local.display().to_string())?,
            );
        }
        // Armory has no key for an agent id: the pod's name is the natural
        // one (Kubernetes sets HOSTNAME to it).
        let agent_id = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .unwrap_or_else(|| armory::DEFAULT_AGENT_ID.to_owned());
        armory::convert(doc, &agent_id, &self.origin()).map(Some)
    }

    /// Parses and validates.
    pub fn load(&self) -> Result<Loaded> {
        let origin = self.origin();
        let Some(converted) = self.armory_to_native()? else {
            let mut config = Config::from_yaml_str(&self.text, &origin)?;
            config.file = Some(self.path.clone());
            return Ok(Loaded {
                config,
                format: Format::Native,
                warnings: Vec::new(),
            });
        };
        let mut config: Config =
            serde_norway::from_value(converted.native).map_err(|e| Error::Parse {
                origin: origin.clone(),
                message: e.to_string(),
            })?;
        config.origin = origin;
        config.file = Some(self.path.clone());
        // Errors name the key as the operator wrote it.
        config.validate().map_err(|e| match e {
            Error::Invalid {
                origin,
                key,
                message,
            } => Error::Invalid {
                origin,
                key: converted.sources.get(&key).cloned().unwrap_or(key),
                message,
            },
            other => other,
        })?;
        Ok(Loaded {
            config,
            format: Format::Armory {
                local: self.local.as_ref().map(|(p, _)| p.clone()),
            },
            warnings: converted.warnings,
        })
    }
}

#[cfg(test)]
mod tests;
