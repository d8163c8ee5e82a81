//! The typed result: what the gateway needs to serve an nginx ingress
//! configuration, with nginx's inheritance already applied. Start at
//! [`Ingress`].
//!
//! Every value here is *effective*: a location carries the headers, timeout
//! and body limit that apply to it, whether written in it or inherited from
//! its server or `http`. Paths of certificate files are joined to the conf
//! prefix, as nginx joins them. Variables (`$host`) are kept as written.
//! `source` fields say where in the configuration an item came from
//! (`file:line`), so gateway errors can point at it.
//!
//! The format is ours (it is embedded in the gateway config as `ingress:`),
//! so unknown fields are refused when it is read back.

use serde::{Deserialize, Serialize};

/// The `http` block: virtual servers and upstream pools.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ingress {
    /// `server` blocks, in file order.
    pub servers: Vec<Server>,
    /// `upstream` blocks, in file order.
    pub upstreams: Vec<Upstream>,
    /// `send_timeout` of the `http` block, in milliseconds: how long a
    /// client may take nothing the gateway writes to it before its
    /// connection is closed. `None`: nginx's default, 60 s
    /// ([`crate::resolve::DEFAULT_CLIENT_SEND_TIMEOUT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_send_timeout_ms: Option<u64>,
}

/// A `server` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Server {
    /// Its `listen` directives; `*:80` when it has none, as nginx run as root.
    pub listens: Vec<Listen>,
    /// Its `server_name`s, lowercased; `[""]` when it has none (nginx's
    /// default since 0.8.48).
    pub server_names: Vec<String>,
    /// HTTP/2 enabled, by `http2 on` or by `listen … http2`.
    pub http2: bool,
    /// TLS settings, present when one of its listens has `ssl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
    /// Client address rewriting, present when `set_real_ip_from` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_ip: Option<RealIp>,
    /// Top-level locations, in file order; nested ones inside them.
    pub locations: Vec<Location>,
    /// Where the `server` directive is.
    pub source: String,
}

/// A `listen` directive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listen {
    /// `*` for every IPv4 address, else the address or host name as written
    /// (IPv6 without brackets).
    pub address: String,
    /// The port (80 when not written).
    pub port: u16,
    /// `ssl`. nginx applies it to every server on the same address and port.
    #[serde(default)]
    pub ssl: bool,
    /// `http2` (deprecated in nginx 1.25.1 in favour of `http2 on`).
    #[serde(default)]
    pub http2: bool,
    /// `proxy_protocol`: a PROXY protocol header precedes each connection.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// `default_server` (or its old spelling `default`).
    #[serde(default)]
    pub default_server: bool,
}

/// The TLS settings of a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tls {
    /// `ssl_certificate` / `ssl_certificate_key` pairs, in order.
    pub certificates: Vec<CertificateKey>,
    /// `ssl_client_certificate`: CA bundle for client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    /// `ssl_verify_client`.
    pub verify_client: VerifyClient,
    /// `ssl_protocols` (default `TLSv1.2 TLSv1.3`).
    pub protocols: Vec<TlsProtocol>,
}

/// One certificate chain and its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateKey {
    /// The certificate chain file.
    pub certificate: String,
    /// The private key file.
    pub key: String,
}

/// `ssl_verify_client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VerifyClient {
    /// No client certificate is asked for.
    #[default]
    Off,
    /// A valid client certificate is required (nginx answers 400 without one).
    On,
    /// A client certificate is asked for and checked if sent.
    Optional,
    /// Asked for, and not checked against the CA.
    OptionalNoCa,
}

/// A protocol name of `ssl_protocols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TlsProtocol {
    /// `SSLv2`.
    #[serde(rename = "SSLv2")]
    SslV2,
    /// `SSLv3`.
    #[serde(rename = "SSLv3")]
    SslV3,
    /// `TLSv1`.
    #[serde(rename = "TLSv1")]
    TlsV1,
    /// `TLSv1.1`.
    #[serde(rename = "TLSv1.1")]
    TlsV1_1,
    /// `TLSv1.2`.
    #[serde(rename = "TLSv1.2")]
    TlsV1_2,
    /// `TLSv1.3`.
    #[serde(rename = "TLSv1.3")]
    TlsV1_3,
}

/// `set_real_ip_from` / `real_ip_header`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RealIp {
    /// Peers trusted to tell the client address: CIDRs or single addresses.
    pub trusted: Vec<String>,
    /// Where the client address is read from (default `X-Real-IP`).
    pub header: RealIpHeader,
}

/// `real_ip_header`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RealIpHeader {
    /// `proxy_protocol`: the source address of the PROXY protocol header.
    ProxyProtocol,
    /// A request header (`X-Real-IP`, `X-Forwarded-For`, …).
    Header(String),
}

/// A `location` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Location {
    /// `=` or prefix (also `^~`, which means the same without regex locations).
    pub match_kind: MatchKind,
    /// The path.
    pub path: String,
    /// Where requests go; `None` when the location has no `proxy_pass` or
    /// `grpc_pass` (nginx would serve files from its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Headers to set on the upstream request, in order: the effective
    /// `proxy_set_header`s for a proxy target, `grpc_set_header`s for gRPC.
    /// An empty value means the header is not passed.
    #[serde(default)]
    pub headers: Vec<Header>,
    /// The effective `proxy_read_timeout` or `grpc_read_timeout`, in
    /// milliseconds (nginx's default 60 s).
    pub read_timeout_ms: u64,
    /// The effective `proxy_connect_timeout` or `grpc_connect_timeout`, in
    /// milliseconds: connecting to a server (and its TLS handshake) within
    /// it (nginx's default 60 s, also when a configuration leaves it out).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// The effective `proxy_send_timeout`, in milliseconds: how long the
    /// request may go without a write to an HTTP/1.1 server while it is
    /// sent (nginx's default 60 s, also when a configuration leaves it out).
    #[serde(default = "default_send_timeout_ms")]
    pub send_timeout_ms: u64,
    /// The effective `client_max_body_size` in bytes; `None` for `0`, no limit
    /// (nginx's default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_max_body_size: Option<u64>,
    /// Whether a request's body is read before the request goes upstream
    /// (nginx's `proxy_request_buffering`, default on; never for gRPC,
    /// whose streams nginx does not read ahead). Bodies up to
    /// `client_body_buffer_size` are read whole; larger ones stream.
    #[serde(default = "default_request_buffering")]
    pub request_buffering: bool,
    /// The effective `client_body_buffer_size` in bytes: the most of a
    /// request body held to read it whole (16 KiB by default).
    #[serde(default = "default_client_body_buffer_size")]
    pub client_body_buffer_size: u64,
    /// The effective `client_body_timeout`, in milliseconds: how long a
    /// body being read ahead may go without a byte (nginx's default 60 s).
    #[serde(default = "default_client_body_timeout_ms")]
    pub client_body_timeout_ms: u64,
    /// TLS to the upstream, for an `https://` or `grpcs://` target: the
    /// effective `proxy_ssl_*` (or `grpc_ssl_*`) settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_tls: Option<UpstreamTls>,
    /// Nested locations, searched after this one matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<Location>,
    /// Where the `location` directive is.
    pub source: String,
}

/// How the gateway speaks TLS to an upstream: `proxy_ssl_*` for
/// `proxy_pass https://`, `grpc_ssl_*` for `grpc_pass grpcs://`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamTls {
    /// `proxy_ssl_verify`; `None` when not written. nginx then does not
    /// verify; the gateway does (against `trusted_certificate`, else the
    /// system's roots), and only an explicit `off` turns verification off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
    /// `proxy_ssl_trusted_certificate`: the CA bundle upstream certificates
    /// are verified against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_certificate: Option<String>,
    /// `proxy_ssl_server_name`: send the name as SNI (default off).
    #[serde(default)]
    pub server_name: bool,
    /// `proxy_ssl_name`: the name verified and sent; default the host of the
    /// pass directive (the `upstream` block's name for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `proxy_ssl_certificate`: the gateway's client certificate chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// `proxy_ssl_certificate_key`: its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_key: Option<String>,
}

/// How a location matches the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MatchKind {
    /// `location = /path`: the whole path.
    Exact,
    /// `location /path` or `location ^~ /path`: the longest such prefix wins.
    Prefix,
}

/// A `proxy_set_header` or `grpc_set_header`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    /// Header name as written.
    pub name: String,
    /// Value as written, variables literal.
    pub value: String,
}

/// Where a location sends requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// `proxy_pass http://` / `https://`, `grpc_pass grpc://` / `grpcs://`.
    pub protocol: Protocol,
    /// The upstream block or the address.
    pub backend: Backend,
    /// `proxy_pass` with a URI part (`http://gate/api/`): the matched location
    /// prefix is replaced by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

/// The protocol to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protocol {
    /// HTTP/1.x in clear text (`proxy_pass http://`).
    Http,
    /// HTTP/1.x over TLS (`proxy_pass https://`).
    Https,
    /// gRPC over h2c (`grpc_pass grpc://` or no scheme).
    Grpc,
    /// gRPC over TLS (`grpc_pass grpcs://`).
    Grpcs,
}

/// An upstream block by name, or one address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Backend {
    /// An `upstream` block of [`Ingress::upstreams`].
    Upstream {
        /// Its name.
        name: String,
    },
    /// A host and port written in the pass directive.
    Address {
        /// Host name or address (IPv6 without brackets).
        host: String,
        /// Port.
        port: u16,
    },
}

/// An `upstream` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    /// Its name.
    pub name: String,
    /// Its `server` entries.
    pub servers: Vec<UpstreamServer>,
    /// Where the `upstream` directive is.
    pub source: String,
}

/// A `server` inside `upstream`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamServer {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port (80 when not written).
    pub port: u16,
    /// `weight=` (default 1).
    pub weight: u32,
    /// `max_fails=` (default 1; 0 disables).
    pub max_fails: u32,
    /// `fail_timeout=` in milliseconds (default 10 s).
    pub fail_timeout_ms: u64,
    /// `backup`.
    #[serde(default)]
    pub backup: bool,
    /// `down`.
    #[serde(default)]
    pub down: bool,
}

impl Ingress {
    /// The `upstream` block a [`Backend::Upstream`] names.
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}

impl Server {
    /// The location nginx would pick for `path`, without regex locations:
    /// at each level an exact match wins, else the longest matching prefix,
    /// and then its nested locations are searched the same way (a nested
    /// match wins over its parent).
    pub fn select_location(&self, path: &str) -> Option<&Location> {
        select(&self.locations, path)
    }
}

fn select<'a>(locations: &'a [Location], path: &str) -> Option<&'a Location> {
    if let Some(exact) = locations
        .iter()
        .find(|l| l.match_kind == MatchKind::Exact && l.path == path)
    {
        return Some(exact);
    }
    let best = locations
        .iter()
        .filter(|l| l.match_kind == MatchKind::Prefix && path.starts_with(l.path.as_str()))
        .max_by_key(|l| l.path.len())?;
    Some(select(&best.locations, path).unwrap_or(best))
}

/// A configuration without `connectTimeoutMs` (written before the gateway
/// read `proxy_connect_timeout`) gets nginx's default.
fn default_connect_timeout_ms() -> u64 {
    crate::resolve::DEFAULT_CONNECT_TIMEOUT_MS
}

/// A configuration without `requestBuffering` (written before the gateway
/// read request bodies ahead) gets nginx's default.
fn default_request_buffering() -> bool {
    true
}

/// A configuration without `clientBodyBufferSize` gets the default.
fn default_client_body_buffer_size() -> u64 {
    crate::resolve::DEFAULT_CLIENT_BODY_BUFFER_SIZE
}

/// A configuration without `clientBodyTimeoutMs` gets nginx's default.
fn default_client_body_timeout_ms() -> u64 {
    crate::resolve::DEFAULT_CLIENT_BODY_TIMEOUT_MS
}

/// A configuration without `sendTimeoutMs` gets nginx's default.
fn default_send_timeout_ms() -> u64 {
    crate::resolve::DEFAULT_SEND_TIMEOUT_MS
}
