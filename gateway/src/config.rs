//! The gateway's configuration file (YAML): what it listens on, the TLS files,
//! which identities may serve which accounts, and the sidecars it carries
//! streams to. [`Config::from_file`] parses and validates in one step; every
//! error names the key and the file.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use spinlink_tls::identity::IdentitySource;

use crate::{Error, Result};

/// Default listen address: every interface, port 7443.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7443));
/// Default gateway id reported in `Hello` answers.
pub const DEFAULT_GATEWAY_ID: &str = "spinlink-gateway";
/// Default channel token lifetime.
pub const DEFAULT_TOKEN_TTL_SECONDS: u64 = 900;
/// Longest channel token lifetime accepted: a day.
pub const MAX_TOKEN_TTL_SECONDS: u64 = 86_400;
/// Default number of HTTP/2 connections kept to each upstream sidecar.
pub const DEFAULT_UPSTREAM_CONNECTIONS: usize = 2;
/// Most HTTP/2 connections kept to one upstream sidecar.
pub const MAX_UPSTREAM_CONNECTIONS: usize = 16;
/// Default time connections get to finish after shutdown is signalled.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 30;

/// The gateway's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Name of this gateway replica, reported to agents in `Hello`.
    pub gateway_id: String,
    /// Address the agent listener binds.
    pub listen: SocketAddr,
    /// Server certificate and the CA bundle client certificates are checked
    /// against; required unless `insecure`.
    pub tls: Option<TlsConfig>,
    /// How an agent's identity is read from its certificate.
    pub identity: IdentityConfig,
    /// Plaintext HTTP/2 (h2c) listener; identity from the
    /// `spinlink-dev-identity` header. Local development only.
    pub insecure: bool,
    /// Lifetime of channel tokens in seconds.
    pub token_ttl_seconds: u64,
    /// Which identities may serve which accounts. Empty grants nothing.
    pub policy: Vec<PolicyRule>,
    /// Sidecar tunnel endpoints; at least one.
    pub upstreams: Vec<UpstreamConfig>,
    /// TLS towards `https://` upstreams.
    pub upstream_tls: Option<UpstreamTlsConfig>,
    /// HTTP/2 connections kept to each upstream (1..=16).
    pub upstream_connections: usize,
    /// Seconds connections get to finish after shutdown is signalled.
    pub shutdown_grace_seconds: u64,
    /// Where this configuration came from, for error messages.
    #[serde(skip)]
    pub origin: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            gateway_id: DEFAULT_GATEWAY_ID.to_owned(),
            listen: DEFAULT_LISTEN,
            tls: None,
            identity: IdentityConfig::default(),
            insecure: false,
            token_ttl_seconds: DEFAULT_TOKEN_TTL_SECONDS,
            policy: Vec::new(),
            upstreams: Vec::new(),
            upstream_tls: None,
            upstream_connections: DEFAULT_UPSTREAM_CONNECTIONS,
            shutdown_grace_seconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
            origin: "<default>".to_owned(),
        }
    }
}

/// The listener's certificate and client CA bundle.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM bundle of CAs that sign agent certificates; a client certificate
    /// signed by one of them is required.
    pub client_ca_file: PathBuf,
}

/// How identities are read from agent certificates.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct IdentityConfig {
    /// Places tried in order; the first one present names the agent.
    pub sources: Vec<IdentitySourceName>,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            sources: vec![
                IdentitySourceName::UriSan,
                IdentitySourceName::DnsSan,
                IdentitySourceName::CommonName,
            ],
        }
    }
}

impl IdentityConfig {
    /// The sources as `spinlink-tls` names them.
    pub fn sources(&self) -> Vec<IdentitySource> {
        self.sources.iter().map(|s| s.to_source()).collect()
    }
}

/// A place in a certificate an identity is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IdentitySourceName {
    /// The first URI subject alternative name.
    UriSan,
    /// The first DNS subject alternative name.
    DnsSan,
    /// The subject's common name.
    CommonName,
}

impl IdentitySourceName {
    fn to_source(self) -> IdentitySource {
        match self {
            Self::UriSan => IdentitySource::UriSan,
            Self::DnsSan => IdentitySource::DnsSan,
            Self::CommonName => IdentitySource::CommonName,
        }
    }
}

/// One policy rule: identities matching any of `identities` may serve the
/// accounts matching any of `accounts`. Both are glob lists.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyRule {
    /// Identity globs, e.g. `spiffe://spinlink.dev/agent/*`.
    pub identities: Vec<String>,
    /// Account globs, e.g. `dev-*`.
    pub accounts: Vec<String>,
}

/// A sidecar tunnel endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamConfig {
    /// `https://host:port` (mTLS with `upstreamTls`) or `http://host:port`
    /// (h2c with prior knowledge).
    pub url: String,
}

/// TLS towards the sidecars.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamTlsConfig {
    /// PEM bundle of CAs that sign the sidecars' server certificates.
    pub ca_file: PathBuf,
    /// The gateway's client certificate towards sidecars.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// Name checked against the sidecar's certificate instead of the URL host.
    pub server_name: Option<String>,
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// Parses and validates YAML; `origin` names it in errors.
    pub fn from_yaml_str(s: &str, origin: &str) -> Result<Self> {
        let mut config: Config =
            serde_norway::from_str(s).map_err(|source| Error::ParseConfig {
                origin: origin.to_owned(),
                source,
            })?;
        config.origin = origin.to_owned();
        config.validate()?;
        Ok(config)
    }

    /// Checks the values serde cannot: required keys, ranges, globs, URLs.
    pub fn validate(&self) -> Result<()> {
        let invalid = |key: &str, message: &str| Error::InvalidConfig {
            origin: self.origin.clone(),
            key: key.to_owned(),
            message: message.to_owned(),
        };
        if self.gateway_id.trim().is_empty() {
            return Err(invalid("gatewayId", "must not be empty"));
        }
        match &self.tls {
            None if !self.insecure => {
                return Err(invalid("tls", "required unless `insecure: true`"));
            }
            Some(tls) if !self.insecure => {
                for (key, path) in [
                    ("tls.certFile", &tls.cert_file),
                    ("tls.keyFile", &tls.key_file),
                    ("tls.clientCaFile", &tls.client_ca_file),
                ] {
                    if path.as_os_str().is_empty() {
                        return Err(invalid(key, "required"));
                    }
                }
            }
            _ => {}
        }
        if self.identity.sources.is_empty() {
            return Err(invalid("identity.sources", "must name at least one source"));
        }
        if self.token_ttl_seconds == 0 || self.token_ttl_seconds > MAX_TOKEN_TTL_SECONDS {
            return Err(invalid(
                "tokenTtlSeconds",
                &format!("must be between 1 and {MAX_TOKEN_TTL_SECONDS}"),
            ));
        }
        crate::identity::Policy::compile(&self.policy)
            .map_err(|e| invalid(&e.key(), &e.to_string()))?;
        if self.upstreams.is_empty() {
            return Err(invalid("upstreams", "at least one upstream is required"));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let target = crate::upstream::Target::parse(&upstream.url)
                .map_err(|e| invalid(&format!("upstreams[{i}].url"), &e.to_string()))?;
            if target.is_tls() && self.upstream_tls.is_none() {
                return Err(invalid(
                    &format!("upstreams[{i}].url"),
                    "https upstreams need `upstreamTls`",
                ));
            }
        }
        if let Some(tls) = &self.upstream_tls {
            for (key, path) in [
                ("upstreamTls.caFile", &tls.ca_file),
                ("upstreamTls.certFile", &tls.cert_file),
                ("upstreamTls.keyFile", &tls.key_file),
            ] {
                if path.as_os_str().is_empty() {
                    return Err(invalid(key, "required"));
                }
            }
            if tls
                .server_name
                .as_deref()
                .is_some_and(|n| rustls::pki_types::ServerName::try_from(n.to_owned()).is_err())
            {
                return Err(invalid(
                    "upstreamTls.serverName",
                    "not a DNS name or IP address",
                ));
            }
        }
        if !(1..=MAX_UPSTREAM_CONNECTIONS).contains(&self.upstream_connections) {
            return Err(invalid(
                "upstreamConnections",
                &format!("must be between 1 and {MAX_UPSTREAM_CONNECTIONS}"),
            ));
        }
        Ok(())
    }

    /// [`Config::token_ttl_seconds`] as a duration.
    pub fn token_ttl(&self) -> Duration {
        Duration::from_secs(self.token_ttl_seconds)
    }

    /// [`Config::shutdown_grace_seconds`] as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_seconds)
    }
}

#[cfg(test)]
mod tests;
