//! Ingress: the gateway as Spinnaker's front door for Deck (UI), Gate (API)
//! and gRPC services, on the agents' listener.
//!
//! The configuration is nginx-compat's model ([`spinlink_nginx_compat::Ingress`],
//! the `ingress:` key, or `--nginx-config`), compiled once here
//! ([`Ingress::compile`]): server names, location trees, header templates
//! ([`vars`]), upstream pools ([`proxy`]) and per-server TLS ([`tls`]).
//! Per request ([`Ingress::handle`]), in nginx's order:
//!
//! 1. the server by Host / `:authority` (exact name, then the longest
//!    leading wildcard, then trailing wildcard, else the default server);
//!    421 when it differs from a client-certificate-checking SNI server;
//! 2. the client certificate verdict the server's `ssl_verify_client` asks
//!    for (400 otherwise);
//! 3. the location (exact, else the longest prefix, nested ones first; 404
//!    when none or it passes nowhere);
//! 4. `client_max_body_size` (413), then [`proxy::forward`] to the pool,
//!    which reads a body of up to `client_body_buffer_size` whole first
//!    (`proxy_request_buffering`); a client that stops sending it for
//!    `client_body_timeout` gets no answer ([`NoAnswer`]), as from nginx.
//!
//! Start at [`Ingress::compile`]; the listener calls [`Ingress::handle`] (see
//! `listener/ingress.rs`) and falls back to the agent tunnel for
//! `/spinlink.v1.Tunnel/` paths no location claims.

mod client;
pub mod from_nginx;
pub(crate) mod h1;
pub mod proxy;
pub mod tls;
pub mod upstream_tls;
pub mod vars;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use rustls::pki_types::CertificateDer;
use spinlink_nginx_compat as nginx;
use spinlink_nginx_compat::{MatchKind, VerifyClient};

pub use self::proxy::NoAnswer;
use self::proxy::Pool;
use self::tls::{ClientVerify, Reload, ReloadingServerTls, ServerTlsConfig};
use self::vars::Template;

/// A configuration error: the key under `ingress` and what is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key}: {message}")]
pub struct CompileError {
    /// Path of the key, e.g. `servers[1].locations[0].headers[2]`.
    pub key: String,
    /// What is wrong (naming the nginx source line where there is one).
    pub message: String,
}

fn err(key: impl Into<String>, message: impl Into<String>) -> CompileError {
    CompileError {
        key: key.into(),
        message: message.into(),
    }
}

/// A `server_name` as matched.
#[derive(Debug, Clone)]
enum Name {
    Exact(String),
    /// `*.example.com` or `.example.com` (the latter also matches `example.com`).
    Leading {
        suffix: String,
        bare: Option<String>,
    },
    /// `www.example.*`.
    Trailing(String),
}

impl Name {
    fn parse(s: &str) -> Self {
        let s = s.to_ascii_lowercase();
        if let Some(rest) = s.strip_prefix("*.") {
            Name::Leading {
                suffix: format!(".{rest}"),
                bare: None,
            }
        } else if let Some(rest) = s.strip_prefix('.') {
            Name::Leading {
                suffix: format!(".{rest}"),
                bare: Some(rest.to_owned()),
            }
        } else if let Some(rest) = s.strip_suffix(".*") {
            Name::Trailing(format!("{rest}."))
        } else {
            Name::Exact(s)
        }
    }
}

/// A compiled location.
#[derive(Debug)]
struct Route {
    kind: MatchKind,
    path: String,
    target: Option<RouteTarget>,
    children: Vec<Route>,
}

#[derive(Debug)]
struct RouteTarget {
    pool: Arc<Pool>,
    grpc: bool,
    uri: Option<String>,
    /// Header name (lowercase) → value template; an empty value removes it.
    headers: Vec<(http::HeaderName, Option<Template>)>,
    timeouts: client::Timeouts,
    /// `None`: unlimited (`client_max_body_size 0`).
    max_body: Option<u64>,
    /// `None`: bodies stream (`proxy_request_buffering off`, gRPC).
    read_ahead: Option<proxy::ReadAhead>,
    location_path: String,
    exact: bool,
}

/// A compiled `server` block.
#[derive(Debug)]
struct VServer {
    names: Vec<Name>,
    first_name: String,
    verify: VerifyClient,
    tls: Option<ReloadingServerTls>,
    routes: Vec<Route>,
}

/// The compiled ingress.
#[derive(Debug)]
pub struct Ingress {
    servers: Vec<VServer>,
    default: usize,
    /// Any server listens with `ssl`.
    tls: bool,
    /// `send_timeout` for every connection.
    send_timeout: Duration,
}

/// What the listener learned about a connection, for every request on it.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client (from the PROXY header when believed).
    pub remote: SocketAddr,
    /// Its address as `$remote_addr` writes it.
    pub remote_ip: Box<str>,
    /// The gateway's port.
    pub local_port: u16,
    /// The SNI name the client sent.
    pub sni: Option<String>,
    /// The server the handshake was made for (index into the servers).
    pub tls_server: Option<usize>,
    /// The client certificate's verdict.
    pub verify: ClientVerify,
    /// `$ssl_client_escaped_cert` of the leaf, when one was presented.
    pub client_cert_escaped: Arc<str>,
}

impl ConnInfo {
    /// Facts of a connection with verdict from `tls_server` on `chain`.
    pub fn new(
        remote: SocketAddr,
        local_port: u16,
        sni: Option<String>,
        tls_server: Option<usize>,
        verify: ClientVerify,
        chain: Option<&[CertificateDer<'static>]>,
    ) -> Self {
        let client_cert_escaped = chain
            .and_then(|c| c.first())
            .map(|leaf| vars::escape_pem(leaf.as_ref()))
            .unwrap_or_default();
        Self {
            remote,
            remote_ip: remote.ip().to_string().into(),
            local_port,
            sni,
            tls_server,
            verify,
            client_cert_escaped: client_cert_escaped.into(),
        }
    }
}

/// The response body type of the listener's service.
pub type Body = tonic::body::Body;

impl Ingress {
    /// Compiles the model: upstream names resolve, variables are known,
    /// certificates load. Every error names the key.
    pub fn compile(model: &nginx::Ingress) -> Result<Self, CompileError> {
        Self::compile_for(model, 1)
    }

    /// [`Ingress::compile`] for a gateway with `workers` worker threads,
    /// each of which gets its own upstream connections.
    pub fn compile_for(model: &nginx::Ingress, workers: usize) -> Result<Self, CompileError> {
        if model.servers.is_empty() {
            return Err(err("servers", "at least one server is required"));
        }
        let mut pools: HashMap<(String, bool, String), Arc<Pool>> = HashMap::new();
        let mut servers = Vec::with_capacity(model.servers.len());
        let mut default = None;
        let tls_any = model
            .servers
            .iter()
            .any(|s| s.listens.iter().any(|l| l.ssl));
        let ports: std::collections::BTreeSet<u16> = model
            .servers
            .iter()
            .flat_map(|s| s.listens.iter().map(|l| l.port))
            .collect();
        if ports.len() > 1 {
            return Err(err(
                "servers",
                format!(
                    "the gateway serves one port, the servers listen on {ports:?}; \
                     put them on one port (they are told apart by name)"
                ),
            ));
        }
        for (si, s) in model.servers.iter().enumerate() {
            let key = format!("servers[{si}]");
            let ssl = s.listens.iter().any(|l| l.ssl);
            if ssl != tls_any {
                return Err(err(
                    &key,
                    format!("({}) mixes ssl and plain listens on one port", s.source),
                ));
            }
            if let Some(real_ip) = &s.real_ip
                && real_ip.header != nginx::RealIpHeader::ProxyProtocol
            {
                return Err(err(
                    format!("{key}.realIp.header"),
                    format!(
                        "({}) only `real_ip_header proxy_protocol` is served",
                        s.source
                    ),
                ));
            }
            let http2 = s.http2 || s.listens.iter().any(|l| l.http2);
            let tls = match (&s.tls, ssl) {
                (Some(t), true) => Some(
                    ReloadingServerTls::load(t, http2)
                        .map_err(|m| err(format!("{key}.tls"), format!("({}) {m}", s.source)))?,
                ),
                (None, true) => {
                    return Err(err(
                        format!("{key}.tls"),
                        format!("({}) no \"ssl_certificate\" is defined", s.source),
                    ));
                }
                _ => None,
            };
            if default.is_none() && s.listens.iter().any(|l| l.default_server) {
                default = Some(si);
            }
            let mut routes = Vec::new();
            for (li, l) in s.locations.iter().enumerate() {
                routes.push(compile_location(
                    model,
                    l,
                    &format!("{key}.locations[{li}]"),
                    &mut pools,
                    workers,
                )?);
            }
            servers.push(VServer {
                names: s.server_names.iter().map(|n| Name::parse(n)).collect(),
                first_name: s.server_names.first().cloned().unwrap_or_default(),
                verify: s
                    .tls
                    .as_ref()
                    .map_or(VerifyClient::Off, |t| t.verify_client),
                tls,
                routes,
            });
        }
        Ok(Self {
            servers,
            default: default.unwrap_or(0),
            tls: tls_any,
            send_timeout: Duration::from_millis(
                model
                    .client_send_timeout_ms
                    .unwrap_or(nginx::resolve::DEFAULT_CLIENT_SEND_TIMEOUT_MS)
                    .max(1),
            ),
        })
    }

    /// nginx's `send_timeout`: how long a client may take nothing written
    /// to it before its connection is closed.
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The server for a host name (request or SNI), by nginx's order.
    pub fn find_server(&self, host: &str) -> Option<usize> {
        self.find_named(&host.trim_end_matches('.').to_ascii_lowercase())
    }

    /// [`Self::find_server`] for a name already lowercase, without its
    /// trailing dot (a [`request_host`]).
    fn find_named(&self, host: &str) -> Option<usize> {
        if let Some(i) = self.servers.iter().position(|s| {
            s.names
                .iter()
                .any(|n| matches!(n, Name::Exact(e) if *e == host))
        }) {
            return Some(i);
        }
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.servers.iter().enumerate() {
            for n in &s.names {
                if let Name::Leading { suffix, bare } = n {
                    let hit = host.ends_with(suffix.as_str()) || bare.as_deref() == Some(host);
                    if hit && best.is_none_or(|(_, len)| suffix.len() > len) {
                        best = Some((i, suffix.len()));
                    }
                }
            }
        }
        if let Some((i, _)) = best {
            return Some(i);
        }
        self.servers.iter().position(|s| {
            s.names
                .iter()
                .any(|n| matches!(n, Name::Trailing(p) if host.starts_with(p.as_str())))
        })
    }

    /// The server whose TLS settings a handshake with `sni` uses, and them.
    pub fn tls_for(&self, sni: Option<&str>) -> Option<(usize, Arc<ServerTlsConfig>)> {
        let i = sni
            .and_then(|n| self.find_server(n))
            .unwrap_or(self.default);
        let tls = self.servers[i].tls.as_ref()?.current();
        Some((i, tls))
    }

    /// Verifies a presented chain with the settings of server `i`.
    pub fn verify(&self, i: usize, chain: Option<&[CertificateDer<'static>]>) -> ClientVerify {
        self.servers[i]
            .tls
            .as_ref()
            .map_or(ClientVerify::None, |t| t.current().verify_peer(chain))
    }

    /// Re-reads every server's certificate files and puts changed, valid
    /// ones in service (new handshakes only); returns how many changed.
    pub fn reload_tls(&self) -> usize {
        let mut reloaded = 0;
        for s in &self.servers {
            let Some(tls) = &s.tls else { continue };
            match tls.reload() {
                Reload::Unchanged => {}
                Reload::Reloaded => {
                    reloaded += 1;
                    tracing::info!(
                        server = s.first_name,
                        cert = tls.certificate_file(),
                        "ingress certificate reloaded"
                    );
                }
                Reload::Refused(e) => tracing::error!(
                    server = s.first_name,
                    cert = tls.certificate_file(),
                    error = %e,
                    "new ingress certificate files refused; still serving the previous ones"
                ),
            }
        }
        reloaded
    }

    /// Calls [`Ingress::reload_tls`] every `interval` until `shutdown`.
    pub async fn run_tls_reloader(
        self: Arc<Self>,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        crate::reload::poll_blocking(interval, shutdown, "ingress certificates", move || {
            self.reload_tls();
        })
        .await;
    }

    /// Whether some location claims `(host, path)` — otherwise the listener
    /// may hand the request to the agent tunnel.
    pub fn claims(&self, req: &Request<Incoming>, conn: &ConnInfo) -> bool {
        // A host nginx would refuse is the ingress's to refuse (400).
        let Ok(host) = request_host(req) else {
            return true;
        };
        let server = &self.servers[self.server_for(host.as_deref(), conn)];
        select(&server.routes, req.uri().path()).is_some_and(|r| r.target.is_some())
    }

    /// The server for a request naming `host` (its [`request_host`]).
    fn server_for(&self, host: Option<&str>, conn: &ConnInfo) -> usize {
        match host {
            Some(host) => self.find_named(host).unwrap_or(self.default),
            None => conn
                .sni
                .as_deref()
                .and_then(|n| self.find_server(n))
                .unwrap_or(self.default),
        }
    }

    /// Serves one request: its answer, or [`NoAnswer`] when it ends
    /// without one.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        conn: &ConnInfo,
    ) -> Result<Response<Body>, NoAnswer> {
        let Ok(host) = request_host(&req) else {
            tracing::debug!(remote = %conn.remote, "client sent an invalid host");
            return Ok(error_page(StatusCode::BAD_REQUEST, "400 Bad Request"));
        };
        let si = self.server_for(host.as_deref(), conn);
        let server = &self.servers[si];
        // A request naming another host than the handshake's SNI is refused
        // when the server it names checks client certificates (421), as
        // nginx 1.22.1's `ngx_http_set_virtual_server` does: that server's
        // check did not run in the handshake.
        if let (Some(_), Some(sni), Some(h)) = (conn.tls_server, &conn.sni, &host)
            && !sni.eq_ignore_ascii_case(h)
            && server.verify != VerifyClient::Off
        {
            return Ok(error_page(
                StatusCode::MISDIRECTED_REQUEST,
                "421 Misdirected Request",
            ));
        }
        match (server.verify, &conn.verify) {
            (VerifyClient::On, ClientVerify::None) => {
                return Ok(error_page(
                    StatusCode::BAD_REQUEST,
                    "400 No required SSL certificate was sent",
                ));
            }
            (VerifyClient::On | VerifyClient::Optional, ClientVerify::Failed(reason)) => {
                tracing::info!(remote = %conn.remote, reason, "client certificate refused");
                return Ok(error_page(
                    StatusCode::BAD_REQUEST,
                    "400 The SSL certificate error",
                ));
            }
            _ => {}
        }
        let Some(route) = select(&server.routes, req.uri().path()) else {
            return Ok(error_page(StatusCode::NOT_FOUND, "404 Not Found"));
        };
        let Some(target) = &route.target else {
            return Ok(error_page(StatusCode::NOT_FOUND, "404 Not Found"));
        };
        if let Some(max) = target.max_body
            && let Some(len) = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
            && len > max
        {
            return Ok(error_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                "413 Request Entity Too Large",
            ));
        }
        let host = host.unwrap_or_else(|| server.first_name.clone());
        proxy::forward(target_ctx(target, server, conn, &host), req).await
    }
}

fn target_ctx<'a>(
    target: &'a RouteTarget,
    server: &'a VServer,
    conn: &'a ConnInfo,
    host: &'a str,
) -> proxy::Ctx<'a> {
    proxy::Ctx {
        pool: &target.pool,
        grpc: target.grpc,
        uri: target.uri.as_deref(),
        location_path: &target.location_path,
        exact: target.exact,
        headers: &target.headers,
        timeouts: target.timeouts,
        max_body: target.max_body,
        read_ahead: target.read_ahead,
        host,
        server_name: &server.first_name,
        conn,
    }
}

fn compile_location(
    model: &nginx::Ingress,
    l: &nginx::Location,
    key: &str,
    pools: &mut HashMap<(String, bool, String), Arc<Pool>>,
    workers: usize,
) -> Result<Route, CompileError> {
    let target = match &l.target {
        None => None,
        Some(t) => {
            let grpc = matches!(t.protocol, nginx::Protocol::Grpc | nginx::Protocol::Grpcs);
            let tls_wanted = matches!(t.protocol, nginx::Protocol::Https | nginx::Protocol::Grpcs);
            let (name, servers) = match &t.backend {
                nginx::Backend::Upstream { name } => {
                    let u = model.upstream(name).ok_or_else(|| {
                        err(
                            format!("{key}.target.backend"),
                            format!("({}) no upstream \"{name}\"", l.source),
                        )
                    })?;
                    (name.clone(), u.servers.clone())
                }
                nginx::Backend::Address { host, port } => (
                    format!("{host}:{port}"),
                    vec![nginx::UpstreamServer {
                        host: host.clone(),
                        port: *port,
                        weight: 1,
                        max_fails: 1,
                        fail_timeout_ms: 10_000,
                        backup: false,
                        down: false,
                    }],
                ),
            };
            // Locations sharing an upstream share its pool (and so its
            // passive health) when they speak to it alike; the TLS files are
            // read once per pool.
            let pool_key = (
                name.clone(),
                grpc,
                format!("{:?}", l.upstream_tls.as_ref().filter(|_| tls_wanted)),
            );
            let pool = match pools.entry(pool_key) {
                std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    // YAML configurations may leave `upstreamTls` out: nginx's
                    // defaults then, as the nginx reader would give.
                    let upstream_tls = if tls_wanted {
                        let host = match &t.backend {
                            nginx::Backend::Upstream { name } => name.as_str(),
                            nginx::Backend::Address { host, .. } => host.as_str(),
                        };
                        let family = if grpc { "grpc" } else { "proxy" };
                        let settings = l.upstream_tls.clone().unwrap_or_default();
                        Some(upstream_tls::load(&settings, host, family).map_err(|m| {
                            err(format!("{key}.upstreamTls"), format!("({}) {m}", l.source))
                        })?)
                    } else {
                        None
                    };
                    e.insert(Arc::new(Pool::new(
                        &name,
                        &servers,
                        grpc,
                        upstream_tls,
                        workers,
                    )))
                    .clone()
                }
            };
            if pool.is_empty() {
                return Err(err(
                    format!("{key}.target.backend"),
                    format!("({}) upstream \"{name}\" has no usable server", l.source),
                ));
            }
            let mut headers = Vec::with_capacity(l.headers.len());
            for (hi, h) in l.headers.iter().enumerate() {
                let hkey = format!("{key}.headers[{hi}]");
                let name = http::HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes())
                    .map_err(|e| err(&hkey, format!("({}) {e}", l.source)))?;
                let value = if h.value.is_empty() {
                    None
                } else {
                    Some(
                        Template::compile(&h.value)
                            .map_err(|m| err(&hkey, format!("({}) {m}", l.source)))?,
                    )
                };
                headers.push((name, value));
            }
            Some(RouteTarget {
                pool,
                grpc,
                uri: t.uri.clone(),
                headers,
                timeouts: client::Timeouts {
                    connect: Duration::from_millis(l.connect_timeout_ms.max(1)),
                    send: Duration::from_millis(l.send_timeout_ms.max(1)),
                    read: Duration::from_millis(l.read_timeout_ms.max(1)),
                },
                max_body: l.client_max_body_size.filter(|&n| n > 0),
                read_ahead: l.request_buffering.then(|| proxy::ReadAhead {
                    size: usize::try_from(l.client_body_buffer_size).unwrap_or(usize::MAX),
                    timeout: Duration::from_millis(l.client_body_timeout_ms.max(1)),
                }),
                location_path: l.path.clone(),
                exact: l.match_kind == MatchKind::Exact,
            })
        }
    };
    let mut children = Vec::new();
    for (ci, c) in l.locations.iter().enumerate() {
        children.push(compile_location(
            model,
            c,
            &format!("{key}.locations[{ci}]"),
            pools,
            workers,
        )?);
    }
    Ok(Route {
        kind: l.match_kind,
        path: l.path.clone(),
        target,
        children,
    })
}

/// nginx's location choice (as `Server::select_location`).
fn select<'a>(routes: &'a [Route], path: &str) -> Option<&'a Route> {
    if let Some(exact) = routes
        .iter()
        .find(|r| r.kind == MatchKind::Exact && r.path == path)
    {
        return Some(exact);
    }
    let best = routes
        .iter()
        .filter(|r| r.kind == MatchKind::Prefix && path.starts_with(r.path.as_str()))
        .max_by_key(|r| r.path.len())?;
    Some(select(&best.children, path).unwrap_or(best))
}

/// A host nginx refuses (400): see [`validate_host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InvalidHost;

/// The host a request names: HTTP/2 `:authority` (or an absolute URI's),
/// else `Host`, read by [`validate_host`]; `Ok(None)` when it names none.
fn request_host<B>(req: &Request<B>) -> Result<Option<String>, InvalidHost> {
    let raw = match req.uri().authority() {
        Some(a) => a.as_str().as_bytes(),
        None => match req.headers().get(http::header::HOST) {
            Some(h) => h.as_bytes().trim_ascii(),
            None => return Ok(None),
        },
    };
    validate_host(raw).map(Some)
}

/// A host as nginx 1.22.1's `ngx_http_validate_host`
/// (src/http/ngx_http_request.c) reads it, which names the server: the
/// name before the port (an IPv6 literal up to its `]`), one trailing dot
/// dropped, lowercase. Refused: two dots in a row, a NUL or a `/`
/// anywhere, nothing left.
pub(crate) fn validate_host(raw: &[u8]) -> Result<String, InvalidHost> {
    #[derive(PartialEq)]
    enum State {
        Usual,
        Literal,
        Rest,
    }
    let mut state = State::Usual;
    let mut len = raw.len();
    let mut last_dot = None;
    for (i, &ch) in raw.iter().enumerate() {
        match ch {
            b'.' => {
                if last_dot.is_some_and(|d| d + 1 == i) {
                    return Err(InvalidHost);
                }
                last_dot = Some(i);
            }
            b':' if state == State::Usual => {
                len = i;
                state = State::Rest;
            }
            b'[' if i == 0 => state = State::Literal,
            b']' if state == State::Literal => {
                len = i + 1;
                state = State::Rest;
            }
            b'\0' | b'/' => return Err(InvalidHost),
            _ => {}
        }
    }
    if len > 0 && last_dot == Some(len - 1) {
        len -= 1;
    }
    if len == 0 {
        return Err(InvalidHost);
    }
    // Header values are visible ASCII or obs-text; obs-text is kept as
    // nginx keeps its bytes (no server is named so).
    Ok(String::from_utf8_lossy(&raw[..len]).to_ascii_lowercase())
}

/// An error response shaped like nginx's built-in pages.
pub fn error_page(status: StatusCode, title: &str) -> Response<Body> {
    let body = format!(
        "<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{title}</h1></center>\r\n<hr><center>spinlink</center>\r\n</body>\r\n</html>\r\n"
    );
    let mut resp = Response::new(Body::new(http_body_util::Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/html"),
    );
    resp
}

#[cfg(test)]
mod tests;
