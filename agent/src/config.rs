//! The agent's configuration file: who the agent is, how it reaches the
//! gateway, how it backs off, and which clusters (accounts) it serves.
//!
//! Start with [`Config::from_file`]; every error names the offending key and
//! the file it came from.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default first reconnect delay cap, in milliseconds.
pub const DEFAULT_INITIAL_BACKOFF_MILLIS: u64 = 200;
/// Default largest reconnect delay cap, in milliseconds.
pub const DEFAULT_MAX_BACKOFF_MILLIS: u64 = 30_000;
/// Default interval of application heartbeats on each cache stream, in seconds.
/// Well inside the 350 s idle cut of cloud load balancers.
pub const DEFAULT_HEARTBEAT_SECONDS: u64 = 30;

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
    /// Where the configuration came from (file path or an origin label), for
    /// error messages. Not a YAML key.
    #[serde(skip)]
    pub origin: String,
}

/// The `gateway:` section: the address and TLS material of the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
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
    /// The key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Plaintext HTTP/2 (h2c), for local development only.
    pub insecure: bool,
}

/// The `reconnect:` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ReconnectConfig {
    /// The first delay cap.
    pub initial_backoff_millis: u64,
    /// The largest delay cap.
    pub max_backoff_millis: u64,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        Self {
            initial_backoff_millis: DEFAULT_INITIAL_BACKOFF_MILLIS,
            max_backoff_millis: DEFAULT_MAX_BACKOFF_MILLIS,
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
}

/// The `kubernetes:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// The accounts (clusters) served.
    pub accounts: Vec<AccountConfig>,
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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agent_id: String::new(),
            gateway: GatewayConfig::default(),
            reconnect: ReconnectConfig::default(),
            heartbeat_seconds: DEFAULT_HEARTBEAT_SECONDS,
            kubernetes: KubernetesConfig::default(),
            origin: String::new(),
        }
    }
}

impl Config {
    /// Reads, parses and validates a YAML configuration file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml_str(&text, &path.display().to_string())
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

        if self.kubernetes.accounts.is_empty() {
            return Err(invalid(
                "kubernetes.accounts",
                "at least one account is required",
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
            match (&account.kubeconfig_file, account.service_account) {
                (Some(_), true) => {
                    return Err(invalid(
                        &key("kubeconfigFile"),
                        "set either kubeconfigFile or serviceAccount: true, not both",
                    ));
                }
                (None, false) => {
                    return Err(invalid(
                        &key("kubeconfigFile"),
                        "one of kubeconfigFile or serviceAccount: true is required",
                    ));
                }
                (Some(path), false) => file_exists(&key("kubeconfigFile"), path)?,
                (None, true) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
