//! The gateway's configuration file (YAML): what it listens on, the TLS files,
//! which identities may serve which accounts, and the sidecars it carries
//! streams to. Plain data: [`Config::from_file`] parses and validates each
//! value on its own; [`crate::Gateway::check`] compiles what needs the other
//! modules (policy, upstream URLs, ingress). Every error names the key and
//! the file.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use spinlink_tls::identity::IdentitySource;

pub mod upstreams;

use self::upstreams::{Discovery, UpstreamPoolConfig};
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
/// Default claim listing the accounts a bootstrap JWT grants.
pub const DEFAULT_ACCOUNTS_CLAIM: &str = "spinlink_accounts";
/// Default clock skew allowed on `exp` and `nbf`, in seconds.
pub const DEFAULT_LEEWAY_SECONDS: u64 = 30;
/// Default number of HTTP/2 connections kept to each upstream sidecar.
pub const DEFAULT_UPSTREAM_CONNECTIONS: usize = 2;
/// Most HTTP/2 connections kept to one upstream sidecar.
pub const MAX_UPSTREAM_CONNECTIONS: usize = 16;
/// Most worker threads a gateway may be given.
pub const MAX_WORKERS: usize = 256;
/// Default time connections get to finish after shutdown is signalled.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 30;
/// Default interval of the certificate reload check.
pub const DEFAULT_TLS_RELOAD_INTERVAL_SECONDS: u64 = 2;
/// Default bound on open agent connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default bound on concurrent streams per connection (two per account).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 4096;
/// Default bound on concurrent carried streams per identity, across its
/// connections (a second replica or a reconnect doubles them for a while).
pub const DEFAULT_MAX_STREAMS_PER_IDENTITY: usize = 20_000;
/// Default rate of new TLS handshakes admitted per second: about a third
/// of what one gateway completes on two cores (full mTLS handshakes,
/// bench/RESULTS.md), leaving the rest for the connections it serves.
pub const DEFAULT_HANDSHAKES_PER_SECOND: f64 = 1000.0;
/// Default burst of TLS handshakes admitted at once (one second's worth).
pub const DEFAULT_HANDSHAKE_BURST: u32 = 1000;
/// Default share of `handshakesPerSecond`, in percent, that only returning
/// agents (a session ticket this deployment issued) may use: strangers
/// together get the rest, however many of them there are.
pub const DEFAULT_HANDSHAKE_RESERVED_PERCENT: u32 = 50;
/// Default handshakes per second one client network (IPv4 /24, IPv6 /64)
/// may start without a session ticket.
pub const DEFAULT_HANDSHAKES_PER_SECOND_PER_SOURCE: f64 = 20.0;
/// Default burst of ticketless handshakes from one client network.
pub const DEFAULT_HANDSHAKE_BURST_PER_SOURCE: u32 = 40;
/// Default longest wait of a new connection for its handshake token. Well
/// inside the agent's 10 s connect timeout: a reconnect storm of up to
/// `burst + 5 × rate` connections per gateway is admitted in turn, none
/// refused.
pub const DEFAULT_HANDSHAKE_QUEUE_SECONDS: f64 = 5.0;
/// Largest `handshakeQueueSeconds` accepted.
pub const MAX_HANDSHAKE_QUEUE_SECONDS: f64 = 60.0;
/// Default rate of `Hello` calls per identity per second.
pub const DEFAULT_HELLO_PER_SECOND: f64 = 1.0;
/// Default burst of `Hello` calls per identity.
pub const DEFAULT_HELLO_BURST: u32 = 10;
/// Default rate of carried streams an identity may cancel before their
/// answer, per second. An honest agent cancels one when a client gives up on
/// a relayed request before the cluster answered: a few a minute.
pub const DEFAULT_CANCELS_PER_SECOND: f64 = 5.0;
/// Default burst of such cancels per identity.
pub const DEFAULT_CANCEL_BURST: u32 = 50;
/// Default bound on a `Hello` request's size.
pub const DEFAULT_MAX_HELLO_BYTES: usize = 4 * 1024 * 1024;
/// Default `listener.maxBufferedBytes`: half the Helm chart's memory limit
/// for a gateway pod.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 * 1024 * 1024;
/// Default `listener.maxMessageBytes`: what a sidecar decodes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = spinlink_proto::MAX_MESSAGE_BYTES;
/// Seconds between the `Heartbeat`s the gateway sends on every `Control`
/// stream (the agent reads the gateway's clock from them).
pub const DEFAULT_CONTROL_HEARTBEAT_SECONDS: u64 = 30;
/// Default TLS handshake timeout.
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECONDS: u64 = 10;
/// Default time an agent has, after its TLS handshake, to send the HTTP/2
/// preface and first SETTINGS. A client does so at once; a connection that
/// does not holds a connection slot for nothing (nginx waits
/// `client_header_timeout`, 60 s; Envoy and HAProxy their idle timeouts).
pub const DEFAULT_PREFACE_TIMEOUT_SECONDS: u64 = 10;
/// Default time a PROXY header may take to arrive.
pub const DEFAULT_PROXY_HEADER_TIMEOUT_SECONDS: u64 = 5;
/// Default time a connection may go without any open stream. Agents keep
/// `Control` open, so only connections that never got going are cut.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 300;
/// Default spread of the maximum connection age, in percent either way.
pub const DEFAULT_MAX_CONNECTION_AGE_JITTER_PERCENT: u32 = 10;
/// Default time an agent gets to move off a connection past its age.
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS: u64 = 60;

/// The gateway's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Name of this gateway replica, reported to agents in `Hello`.
    pub gateway_id: String,
    /// Address the agent listener binds.
    pub listen: SocketAddr,
    /// Server certificate and the CA bundle client certificates are checked
    /// against; required unless `insecure` or an `ingress` (whose servers
    /// carry their own certificates) is configured.
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
    /// Sidecar tunnel endpoints; at least one unless an `ingress` is configured.
    pub upstreams: Vec<UpstreamConfig>,
    /// TLS towards `https://` upstreams.
    pub upstream_tls: Option<UpstreamTlsConfig>,
    /// HTTP/2 connections kept to each upstream (1..=16), spread over the
    /// workers; each worker keeps at least one.
    pub upstream_connections: usize,
    /// Threads that serve connections, each owning its connections and its
    /// own upstream connections (0, the default: one per CPU the process
    /// may use; at most 256).
    pub workers: usize,
    /// Seconds connections get to finish after shutdown is signalled.
    pub shutdown_grace_seconds: u64,
    /// The admin HTTP port; none when absent.
    pub admin: Option<AdminConfig>,
    /// PROXY protocol, limits and timeouts of the agent listener.
    pub listener: ListenerConfig,
    /// Bootstrap JWTs for agents without client certificates; when set, TLS
    /// accepts connections without one and their `Hello` must carry a JWT.
    pub jwt_bootstrap: Option<JwtBootstrapConfig>,
    /// Bounded-load factor, DNS refresh, health checks and outlier ejection
    /// of the upstream instances.
    pub upstream_pool: UpstreamPoolConfig,
    /// Ingress routes for Spinnaker's UI and API (and gRPC) on the same
    /// listener: the model `spinlink nginx convert` writes (see
    /// `docs/ingress.md`). Absent: the listener serves agents only.
    pub ingress: Option<spinlink_nginx_compat::Ingress>,
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
            workers: 0,
            shutdown_grace_seconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
            admin: None,
            listener: ListenerConfig::default(),
            jwt_bootstrap: None,
            upstream_pool: UpstreamPoolConfig::default(),
            ingress: None,
            origin: "<default>".to_owned(),
        }
    }
}

/// The listener's certificate and client CA bundle. The files are read again
/// when their content changes, so a rotated certificate is served without a
/// restart.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM bundle of CAs that sign agent certificates; a client certificate
    /// signed by one of them is required.
    pub client_ca_file: PathBuf,
    /// Seconds between checks of the files for new content; 0 turns reloading off.
    pub reload_interval_seconds: u64,
    /// The oldest TLS version agents may use: `"1.3"` (the default: every
    /// agent speaks it, and it hides the client certificate from anyone on
    /// the path) or `"1.2"` for old clients.
    pub min_version: TlsVersion,
    /// Accept handshakes without a client certificate (set by the gateway
    /// when `jwtBootstrap` is configured; not read from the file).
    #[serde(skip)]
    pub client_certificate_optional: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            client_ca_file: PathBuf::new(),
            reload_interval_seconds: DEFAULT_TLS_RELOAD_INTERVAL_SECONDS,
            min_version: TlsVersion::V1_3,
            client_certificate_optional: false,
        }
    }
}

/// A TLS protocol version (`tls.minVersion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2 (RFC 5246).
    #[serde(rename = "1.2")]
    V1_2,
    /// TLS 1.3 (RFC 8446).
    #[serde(rename = "1.3")]
    V1_3,
}

/// The admin port.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminConfig {
    /// Address of the plain-HTTP admin port (`/healthz`, `/readyz`, `/metrics`).
    pub listen: SocketAddr,
}

/// The agent listener's PROXY protocol handling, limits and timeouts.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerConfig {
    /// Read a PROXY protocol (v1 or v2) header before TLS on connections from
    /// `trustedProxies`, and use the client address it names.
    pub proxy_protocol: bool,
    /// With `proxyProtocol`: connections must come from `trustedProxies` and
    /// carry a header. When false, other connections are served as direct
    /// clients (but a PROXY header from them is still refused).
    pub proxy_protocol_required: bool,
    /// CIDRs of the load balancers whose PROXY headers are believed.
    pub trusted_proxies: Vec<String>,
    /// Seconds the PROXY header may take to arrive.
    pub proxy_header_timeout_seconds: u64,
    /// Seconds the TLS handshake may take.
    pub handshake_timeout_seconds: u64,
    /// Seconds the agent has after its TLS handshake to send the HTTP/2
    /// preface and first SETTINGS; the connection is closed otherwise.
    pub preface_timeout_seconds: u64,
    /// Agent connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Streams one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// Carried (`Cache`/`Relay`) streams one identity may have open.
    pub max_streams_per_identity: usize,
    /// New TLS handshakes admitted per second (token bucket).
    pub handshakes_per_second: f64,
    /// Handshakes admitted at once when the bucket is full.
    pub handshake_burst: u32,
    /// Seconds a new connection may wait for its handshake token (its turn
    /// at `handshakesPerSecond`) before it is refused; 0 refuses at once.
    pub handshake_queue_seconds: f64,
    /// Percent of `handshakesPerSecond` kept for returning agents (those
    /// offering a session ticket this deployment issued); strangers share
    /// the rest. 0 reserves nothing, 100 admits no stranger.
    pub handshake_reserved_percent: u32,
    /// Handshakes per second one client network (IPv4 /24, IPv6 /64, after
    /// PROXY protocol) may start without a session ticket; past its burst
    /// more are refused at once.
    pub handshakes_per_second_per_source: f64,
    /// Ticketless handshakes one client network may start at once.
    pub handshake_burst_per_source: u32,
    /// `Hello` calls per identity per second (token bucket).
    pub hello_per_second: f64,
    /// `Hello` calls one identity may make at once.
    pub hello_burst: u32,
    /// Carried streams one identity may cancel (by its reset, or by frames
    /// that make the gateway reset them) before the sidecar answered, per
    /// second, across its connections: each such cancel reaches a sidecar's
    /// shared connection as a reset, and a sidecar's HTTP/2 server ends the
    /// whole connection when too many come.
    pub cancels_per_second: f64,
    /// Such cancels one identity may make at once.
    pub cancel_burst: u32,
    /// Largest `Hello` request accepted, in bytes.
    pub max_hello_bytes: usize,
    /// Largest gRPC message an agent may send on a carried (`Cache`,
    /// `Relay`) stream, in bytes, read from each message's length prefix:
    /// a larger one resets the stream before it is forwarded.
    pub max_message_bytes: usize,
    /// What all agent connections together may hold for their peers (frames
    /// waiting for sockets, data waiting behind flow-control windows), in
    /// bytes; over it, the connections holding the most end first.
    pub max_buffered_bytes: usize,
    /// Seconds between `Heartbeat`s on each `Control` stream; 0 sends none.
    pub control_heartbeat_seconds: u64,
    /// Seconds a connection may go without any open stream before it is closed.
    pub idle_timeout_seconds: u64,
    /// Age in seconds after which a connection is asked to reconnect
    /// (`Reconnect{reason: "max-age"}`); 0 turns it off.
    pub max_connection_age_seconds: u64,
    /// Spread of the maximum age, in percent either way, so connections made
    /// together do not all reconnect together.
    pub max_connection_age_jitter_percent: u32,
    /// Seconds an agent gets to move off a connection past its age.
    pub max_connection_age_grace_seconds: u64,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            proxy_protocol: false,
            proxy_protocol_required: true,
            trusted_proxies: Vec::new(),
            proxy_header_timeout_seconds: DEFAULT_PROXY_HEADER_TIMEOUT_SECONDS,
            handshake_timeout_seconds: DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
            preface_timeout_seconds: DEFAULT_PREFACE_TIMEOUT_SECONDS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_streams_per_identity: DEFAULT_MAX_STREAMS_PER_IDENTITY,
            handshakes_per_second: DEFAULT_HANDSHAKES_PER_SECOND,
            handshake_burst: DEFAULT_HANDSHAKE_BURST,
            handshake_queue_seconds: DEFAULT_HANDSHAKE_QUEUE_SECONDS,
            handshake_reserved_percent: DEFAULT_HANDSHAKE_RESERVED_PERCENT,
            handshakes_per_second_per_source: DEFAULT_HANDSHAKES_PER_SECOND_PER_SOURCE,
            handshake_burst_per_source: DEFAULT_HANDSHAKE_BURST_PER_SOURCE,
            hello_per_second: DEFAULT_HELLO_PER_SECOND,
            hello_burst: DEFAULT_HELLO_BURST,
            cancels_per_second: DEFAULT_CANCELS_PER_SECOND,
            cancel_burst: DEFAULT_CANCEL_BURST,
            max_hello_bytes: DEFAULT_MAX_HELLO_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            control_heartbeat_seconds: DEFAULT_CONTROL_HEARTBEAT_SECONDS,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            max_connection_age_seconds: 0,
            max_connection_age_jitter_percent: DEFAULT_MAX_CONNECTION_AGE_JITTER_PERCENT,
            max_connection_age_grace_seconds: DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS,
        }
    }
}

/// How identities are read from agent certificates.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct IdentityConfig {
    /// Places tried in order; the first one present names the agent.
    pub sources: Vec<IdentitySourceName>,
}

impl Default for IdentityConfig {
    /// URI SAN, else DNS SAN. Not the subject's common name unless the
    /// configuration lists `commonName`: a CN is free text, so a certificate
    /// made for something else could name itself `spiffe://…/agent/prod`
    /// there.
    fn default() -> Self {
        Self {
            sources: vec![IdentitySourceName::UriSan, IdentitySourceName::DnsSan],
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

/// `jwtBootstrap` in the gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtBootstrapConfig {
    /// JWKS (RFC 7517) file of the public keys bootstrap JWTs are signed with:
    /// EC P-256 (ES256), RSA (RS256) or OKP Ed25519 (EdDSA).
    pub jwks_file: PathBuf,
    /// Accepted `aud` values; a JWT must name at least one. Required.
    pub audiences: Vec<String>,
    /// Accepted `iss` values; empty accepts any issuer.
    pub issuers: Vec<String>,
    /// Claim holding the accounts (a list of names or globs, or one
    /// space-separated string).
    pub accounts_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_seconds: u64,
}

impl Default for JwtBootstrapConfig {
    fn default() -> Self {
        Self {
            jwks_file: PathBuf::new(),
            audiences: Vec::new(),
            issuers: Vec::new(),
            accounts_claim: DEFAULT_ACCOUNTS_CLAIM.to_owned(),
            leeway_seconds: DEFAULT_LEEWAY_SECONDS,
        }
    }
}

/// A sidecar tunnel endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamConfig {
    /// `https://host:port` (mTLS with `upstreamTls`) or `http://host:port`
    /// (h2c with prior knowledge).
    pub url: String,
    /// How the URL's host becomes instances: `static` (itself, the
    /// default), `dns` (every address it resolves to, re-resolved every
    /// `upstreamPool.dnsRefreshSeconds`) or `{endpointSlices: {service,
    /// namespace, portName, kubeconfig}}` (a watch of the Service's slices).
    pub discovery: Discovery,
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

    /// Checks the values serde cannot: required keys, ranges, CIDRs. What
    /// takes another module to check (policy globs, upstream URLs, the
    /// ingress) is checked by [`crate::Gateway::check`].
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
            // Ingress servers carry their own certificates.
            None if self.ingress.is_some() => {}
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
        if self.ingress.is_some() && self.insecure {
            return Err(invalid("ingress", "not supported with `insecure: true`"));
        }
        // An ingress-only gateway carries no agent streams of its own.
        if self.upstreams.is_empty() && self.ingress.is_none() {
            return Err(invalid("upstreams", "at least one upstream is required"));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            if let Discovery::EndpointSlices(slices) = &upstream.discovery
                && slices.service.is_empty()
            {
                return Err(invalid(
                    &format!("upstreams[{i}].discovery.endpointSlices.service"),
                    "required",
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
        self.upstream_pool
            .validate()
            .map_err(|(key, message)| invalid(&format!("upstreamPool.{key}"), message))?;
        if !(1..=MAX_UPSTREAM_CONNECTIONS).contains(&self.upstream_connections) {
            return Err(invalid(
                "upstreamConnections",
                &format!("must be between 1 and {MAX_UPSTREAM_CONNECTIONS}"),
            ));
        }
        if self.workers > MAX_WORKERS {
            return Err(invalid(
                "workers",
                &format!("must be at most {MAX_WORKERS} (0: one per CPU)"),
            ));
        }
        if let Some(jwt) = &self.jwt_bootstrap {
            if self.insecure {
                return Err(invalid(
                    "jwtBootstrap",
                    "not supported with `insecure: true`",
                ));
            }
            if jwt.jwks_file.as_os_str().is_empty() {
                return Err(invalid("jwtBootstrap.jwksFile", "required"));
            }
            if jwt.audiences.is_empty() {
                return Err(invalid(
                    "jwtBootstrap.audiences",
                    "must name at least one audience",
                ));
            }
            if jwt.accounts_claim.is_empty() {
                return Err(invalid("jwtBootstrap.accountsClaim", "must not be empty"));
            }
        }
        self.validate_listener()
    }

    fn validate_listener(&self) -> Result<()> {
        let invalid = |key: &str, message: &str| Error::InvalidConfig {
            origin: self.origin.clone(),
            key: format!("listener.{key}"),
            message: message.to_owned(),
        };
        let l = &self.listener;
        for (i, cidr) in l.trusted_proxies.iter().enumerate() {
            crate::cidr::Cidr::parse(cidr)
                .map_err(|e| invalid(&format!("trustedProxies[{i}]"), &e.to_string()))?;
        }
        if l.proxy_protocol && l.proxy_protocol_required && l.trusted_proxies.is_empty() {
            return Err(invalid(
                "trustedProxies",
                "required when `proxyProtocol` is on and required",
            ));
        }
        if self.insecure && l.proxy_protocol {
            return Err(invalid(
                "proxyProtocol",
                "not supported with `insecure: true`",
            ));
        }
        for (key, value) in [
            ("proxyHeaderTimeoutSeconds", l.proxy_header_timeout_seconds),
            ("handshakeTimeoutSeconds", l.handshake_timeout_seconds),
            ("prefaceTimeoutSeconds", l.preface_timeout_seconds),
            ("idleTimeoutSeconds", l.idle_timeout_seconds),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if l.max_connections == 0 {
            return Err(invalid("maxConnections", "must be at least 1"));
        }
        if l.max_concurrent_streams == 0 {
            return Err(invalid("maxConcurrentStreams", "must be at least 1"));
        }
        if l.max_streams_per_identity == 0 {
            return Err(invalid("maxStreamsPerIdentity", "must be at least 1"));
        }
        for (key, rate) in [
            ("handshakesPerSecond", l.handshakes_per_second),
            (
                "handshakesPerSecondPerSource",
                l.handshakes_per_second_per_source,
            ),
            ("helloPerSecond", l.hello_per_second),
            ("cancelsPerSecond", l.cancels_per_second),
        ] {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(invalid(key, "must be a positive number"));
            }
        }
        if l.cancel_burst == 0 {
            return Err(invalid("cancelBurst", "must be at least 1"));
        }
        if l.handshake_burst == 0 {
            return Err(invalid("handshakeBurst", "must be at least 1"));
        }
        if l.handshake_burst_per_source == 0 {
            return Err(invalid("handshakeBurstPerSource", "must be at least 1"));
        }
        if l.handshake_reserved_percent > 100 {
            return Err(invalid(
                "handshakeReservedPercent",
                "must be between 0 and 100",
            ));
        }
        if !(0.0..=MAX_HANDSHAKE_QUEUE_SECONDS).contains(&l.handshake_queue_seconds) {
            return Err(invalid(
                "handshakeQueueSeconds",
                &format!("must be between 0 and {MAX_HANDSHAKE_QUEUE_SECONDS}"),
            ));
        }
        if l.hello_burst == 0 {
            return Err(invalid("helloBurst", "must be at least 1"));
        }
        if l.max_hello_bytes < 1024 {
            return Err(invalid("maxHelloBytes", "must be at least 1024"));
        }
        if l.max_buffered_bytes < 1024 * 1024 {
            return Err(invalid("maxBufferedBytes", "must be at least 1048576"));
        }
        if !(64 * 1024..=u32::MAX as usize).contains(&l.max_message_bytes) {
            return Err(invalid(
                "maxMessageBytes",
                "must be between 65536 and 4294967295",
            ));
        }
        if l.max_connection_age_jitter_percent > 50 {
            return Err(invalid(
                "maxConnectionAgeJitterPercent",
                "must be between 0 and 50",
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
