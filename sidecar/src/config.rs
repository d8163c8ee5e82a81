//! The sidecar's configuration file (YAML, camelCase keys): where the tunnel
//! listens and how it authenticates gateways, where the Kubernetes API facade
//! listens, and which database the store uses. Start with [`Config`].

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
    /// Names this sidecar instance (logs, and later ownership leases).
    pub instance_id: String,
    /// The listener the gateways carry agent streams to.
    pub tunnel: TunnelConfig,
    /// The Kubernetes API facade and accounts API.
    pub facade: FacadeConfig,
    /// The database.
    pub store: StoreConfig,
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
/// `clientCaFile` is required of every peer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM bundle of the CAs that sign gateway client certificates.
    pub client_ca_file: PathBuf,
}

/// The Kubernetes API facade (plain HTTP, meant for loopback).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FacadeConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Seconds a relayed request waits for the agent's response head.
    pub relay_timeout_seconds: u64,
}

impl Default for FacadeConfig {
    fn default() -> Self {
        Self {
            listen: parse_addr(DEFAULT_FACADE_LISTEN),
            relay_timeout_seconds: DEFAULT_RELAY_TIMEOUT_SECS,
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
            }
            (None, true) => {}
        }
        if self.facade.relay_timeout_seconds == 0 {
            return Err(invalid("facade.relayTimeoutSeconds", "must be at least 1"));
        }
        if !self.store.url.starts_with("sqlite:") {
            return Err(invalid(
                "store.url",
                "only sqlite: URLs are supported in this version",
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
            "instanceId: s1\ntunnel:\n  listen: 127.0.0.1:9001\n  tls: { certFile: a.crt, keyFile: a.key, clientCaFile: ca.crt }\nfacade:\n  listen: 127.0.0.1:9002\nstore:\n  url: sqlite:///tmp/x.db\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(c.instance_id, "s1");
        assert_eq!(c.tunnel.listen.port(), 9001);
        assert_eq!(c.facade.listen.port(), 9002);
        assert_eq!(
            c.tunnel.tls.unwrap().client_ca_file,
            PathBuf::from("ca.crt")
        );
        assert_eq!(c.facade.relay_timeout_seconds, DEFAULT_RELAY_TIMEOUT_SECS);
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
    fn missing_tls_file_is_named() {
        let e = Config::from_yaml_str("tunnel: { tls: { certFile: a, keyFile: b } }\n", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tunnel.tls.clientCaFile"), "{e}");
    }
}
