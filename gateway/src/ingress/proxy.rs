//! Carrying one ingress request to its upstream pool and the answer back.
//!
//! [`Pool`] holds an `upstream` block's servers (weights as repetition in a
//! round-robin ring, `backup` servers tried after every primary, `down` ones
//! never) and a pooled hyper client: HTTP/1.1 for `proxy_pass http://`, h2c
//! with prior knowledge for `grpc_pass grpc://`. A server that refuses the
//! connection is skipped for the next one when the request has no body to
//! replay (nginx's `proxy_next_upstream error`). `proxy_pass https://` and
//! `grpc_pass grpcs://` pools speak TLS ([`super::upstream_tls`]).
//!
//! Passive health as nginx's `max_fails` / `fail_timeout`: a server that
//! fails (refused, errored or timed out) `max_fails` times within
//! `fail_timeout` is skipped for the next `fail_timeout`; a success clears
//! its count. A pool of one server never skips it (as nginx); when every
//! server is down the answer is 502.
//!
//! [`forward`] rewrites the URI as `proxy_pass` with a URI part does, drops
//! hop-by-hop headers, adds `X-Forwarded-For/-Proto/-Host`, applies the
//! location's `proxy_set_header` templates (an empty value removes), bounds a
//! body without `Content-Length` by `client_max_body_size`, waits at most the
//! read timeout for the response head (504) and between body frames, and
//! splices an HTTP/1.1 `Upgrade` (WebSocket) through once both sides agree.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use tokio::time::Instant;

use super::upstream_tls::UpstreamTls;
use super::vars::{Template, Vars};
use super::{Body, ConnInfo, error_page};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ReqBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Most ring entries one server's `weight=` makes.
const MAX_WEIGHT: u32 = 100;
/// Idle pooled connections kept per upstream server.
const POOL_IDLE_PER_HOST: usize = 32;

/// An upstream pool and its client.
#[derive(Debug)]
pub struct Pool {
    name: String,
    /// Primaries in weighted order.
    ring: Vec<SocketAddrOrName>,
    backups: Vec<SocketAddrOrName>,
    next: AtomicUsize,
    /// One client (and so one set of kept-alive connections) per worker,
    /// and the last for any other thread: a request goes out on its
    /// worker's own connections, as the agent path's streams do.
    clients: Box<[UpstreamClient]>,
    /// Passive health per distinct server.
    health: HashMap<SocketAddrOrName, Health>,
}

/// The pooled client: clear text, or TLS to the pool's servers.
#[derive(Debug)]
enum UpstreamClient {
    Plain(Client<HttpConnector, ReqBody>),
    Tls(Client<HttpsConnector<HttpConnector>, ReqBody>),
}

impl UpstreamClient {
    fn scheme(&self) -> &'static str {
        match self {
            Self::Plain(_) => "http",
            Self::Tls(_) => "https",
        }
    }

    async fn request(
        &self,
        req: Request<ReqBody>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Self::Plain(c) => c.request(req).await,
            Self::Tls(c) => c.request(req).await,
        }
    }
}

/// One server's `max_fails` / `fail_timeout` state.
#[derive(Debug)]
struct Health {
    max_fails: u32,
    fail_timeout: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    fails: u32,
    /// When the first failure of the current count happened.
    first_fail: Option<Instant>,
    down_until: Option<Instant>,
}

impl Health {
    fn is_down(&self, now: Instant) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.down_until.is_some_and(|t| now < t)
    }

    fn failed(&self, now: Instant) -> bool {
        if self.max_fails == 0 {
            return false;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state
            .first_fail
            .is_none_or(|t| now.duration_since(t) >= self.fail_timeout)
        {
            state.fails = 0;
            state.first_fail = Some(now);
        }
        state.fails += 1;
        if state.fails >= self.max_fails {
            state.down_until = Some(now + self.fail_timeout);
            state.fails = 0;
            state.first_fail = None;
            return true;
        }
        false
    }

    fn succeeded(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.fails = 0;
        state.first_fail = None;
        state.down_until = None;
    }
}

/// `host:port` as the client dials it.
type SocketAddrOrName = String;

impl Pool {
    /// A pool of `servers` for a gateway with `workers` worker threads;
    /// `h2` speaks HTTP/2 with prior knowledge (h2c), or negotiated by ALPN
    /// over `tls`.
    pub fn new(
        name: &str,
        servers: &[spinlink_nginx_compat::UpstreamServer],
        h2: bool,
        tls: Option<UpstreamTls>,
        workers: usize,
    ) -> Self {
        let addr = |s: &spinlink_nginx_compat::UpstreamServer| {
            if s.host.contains(':') {
                format!("[{}]:{}", s.host, s.port)
            } else {
                format!("{}:{}", s.host, s.port)
            }
        };
        let mut ring = Vec::new();
        let mut backups = Vec::new();
        let mut health = HashMap::new();
        for s in servers.iter().filter(|s| !s.down) {
            health.entry(addr(s)).or_insert_with(|| Health {
                max_fails: s.max_fails,
                fail_timeout: Duration::from_millis(s.fail_timeout_ms),
                state: Mutex::default(),
            });
            if s.backup {
                backups.push(addr(s));
            } else {
                for _ in 0..s.weight.clamp(1, MAX_WEIGHT) {
                    ring.push(addr(s));
                }
            }
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(60)));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST)
            .http2_only(h2);
        let clients = match tls {
            None => (0..=workers)
                .map(|_| UpstreamClient::Plain(builder.build(connector.clone())))
                .collect(),
            Some(tls) => {
                connector.enforce_http(false);
                let https = HttpsConnectorBuilder::new()
                    .with_tls_config(tls.config)
                    .https_only()
                    .with_server_name_resolver(FixedServerNameResolver::new(tls.name));
                let https = if h2 {
                    https.enable_http2().wrap_connector(connector)
                } else {
                    https.enable_http1().wrap_connector(connector)
                };
                (0..=workers)
                    .map(|_| UpstreamClient::Tls(builder.build(https.clone())))
                    .collect()
            }
        };
        Self {
            name: name.to_owned(),
            ring,
            backups,
            next: AtomicUsize::new(0),
            clients,
            health,
        }
    }

    /// The calling thread's client: its worker's own, or the shared one.
    fn client(&self) -> &UpstreamClient {
        let shared = self.clients.len() - 1;
        let i = crate::workers::current().map_or(shared, |p| p.index.min(shared));
        &self.clients[i]
    }

    /// No server can be tried.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.backups.is_empty()
    }

    /// Counts a failed attempt on `addr` (for `max_fails`).
    fn failed(&self, addr: &str) {
        if let Some(h) = self.health.get(addr)
            && self.health.len() > 1
            && h.failed(Instant::now())
        {
            tracing::warn!(
                upstream = addr,
                pool = self.name,
                seconds = h.fail_timeout.as_secs_f64(),
                "upstream server marked down (max_fails reached)"
            );
        }
    }

    /// Clears `addr`'s failures.
    fn succeeded(&self, addr: &str) {
        if let Some(h) = self.health.get(addr) {
            h.succeeded();
        }
    }

    /// Live servers in the order this request tries them.
    fn order(&self) -> Vec<&str> {
        let now = Instant::now();
        let live = |a: &&str| {
            self.health.len() <= 1 || !self.health.get(*a).is_some_and(|h| h.is_down(now))
        };
        self.all_in_order().filter(live).collect()
    }

    /// Servers in the order this request tries them.
    fn all_in_order(&self) -> impl Iterator<Item = &str> {
        let n = self.ring.len();
        let start = if n == 0 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        let mut seen: Vec<&str> = Vec::new();
        for i in 0..n {
            let a = self.ring[(start + i) % n].as_str();
            if !seen.contains(&a) {
                seen.push(a);
            }
        }
        seen.into_iter()
            .chain(self.backups.iter().map(String::as_str))
    }
}

/// What [`forward`] needs from the route and the connection.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// gRPC (`grpc_pass`).
    pub grpc: bool,
    /// `proxy_pass`'s URI part.
    pub uri: Option<&'a str>,
    /// The location's path.
    pub location_path: &'a str,
    /// The location is `=`.
    pub exact: bool,
    /// The location's header templates.
    pub headers: &'a [(HeaderName, Option<Template>)],
    /// `proxy_read_timeout` / `grpc_read_timeout`.
    pub read_timeout: Duration,
    /// `client_max_body_size` (`None`: unlimited).
    pub max_body: Option<u64>,
    /// `$host`.
    pub host: &'a str,
    /// `$server_name`.
    pub server_name: &'a str,
    /// The connection.
    pub conn: &'a ConnInfo,
}

/// Hop-by-hop headers, never forwarded (RFC 9110 §7.6.1).
const HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
];

fn is_upgrade(version: Version, headers: &http::HeaderMap) -> bool {
    version <= Version::HTTP_11
        && headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// The path and query the upstream gets.
fn upstream_path(ctx: &Ctx<'_>, uri: &Uri) -> String {
    let path = uri.path();
    let mut out = match ctx.uri {
        None => path.to_owned(),
        Some(u) if ctx.exact => u.to_owned(),
        Some(u) => {
            let rest = path.strip_prefix(ctx.location_path).unwrap_or(path);
            format!("{u}{rest}")
        }
    };
    if let Some(q) = uri.query() {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Sends `req` to the context's pool and returns its answer.
pub async fn forward(ctx: Ctx<'_>, mut req: Request<Incoming>) -> Response<Body> {
    let upgrade = is_upgrade(req.version(), req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let path = upstream_path(&ctx, &parts.uri);
    let verify = ctx.conn.verify.as_nginx();
    let scheme = if ctx.conn.tls_server.is_some() {
        "https"
    } else {
        "http"
    };
    let vars = Vars {
        host: ctx.host,
        remote: ctx.conn.remote,
        scheme,
        server_name: ctx.server_name,
        server_port: ctx.conn.local_port,
        req: &parts,
        client_cert_escaped: &ctx.conn.client_cert_escaped,
        client_verify: &verify,
    };
    // Everything the request's own fields fill in is worked out first, so
    // its header map can then be taken over rather than copied.
    // The gateway always tells the upstream who asked (nginx only when
    // configured); a location's own setting below wins, so a default it
    // replaces is not worked out at all.
    let location_sets = |name: &str| ctx.headers.iter().any(|(n, _)| n.as_str() == name);
    let forwarded = [
        (
            "x-forwarded-for",
            (!location_sets("x-forwarded-for"))
                .then(|| HeaderValue::from_str(&super::vars::forwarded_for(&vars)).ok())
                .flatten(),
        ),
        (
            "x-forwarded-proto",
            (!location_sets("x-forwarded-proto")).then(|| HeaderValue::from_static(scheme)),
        ),
        (
            "x-forwarded-host",
            (!location_sets("x-forwarded-host"))
                .then(|| HeaderValue::from_str(ctx.host).ok())
                .flatten(),
        ),
    ];
    let set: Vec<(&HeaderName, String)> = ctx
        .headers
        .iter()
        .map(|(name, template)| {
            let value = template
                .as_ref()
                .map(|t| t.expand(&vars))
                .unwrap_or_default();
            (name, value)
        })
        .collect();
    let content_length = parts.headers.contains_key(header::CONTENT_LENGTH);
    let mut headers = std::mem::take(&mut parts.headers);
    for h in &HOP {
        // gRPC needs `te: trailers`; an upgrade keeps its `Upgrade`.
        let keep = (h == header::TE && ctx.grpc) || (h == header::UPGRADE && upgrade);
        if !keep {
            headers.remove(h);
        }
    }
    headers.remove(header::HOST);
    for (name, value) in forwarded {
        if let Some(v) = value {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    // nginx's default `Host: $proxy_host`, unless the location sets it.
    let mut host = Some(ctx.pool.name.clone());
    for (name, value) in set {
        headers.remove(name);
        if name == header::HOST {
            host = (!value.is_empty()).then_some(value);
            continue;
        }
        if value.is_empty() {
            continue;
        }
        match HeaderValue::from_str(&value) {
            Ok(v) => {
                headers.append(name.clone(), v);
            }
            Err(_) => tracing::debug!(header = %name, "header value not sendable; dropped"),
        }
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // HTTP/2 upstreams (gRPC) get the authority from the URI instead.
    if (upgrade || !ctx.grpc)
        && let Some(h) = host.as_deref().and_then(|h| HeaderValue::from_str(h).ok())
    {
        headers.insert(header::HOST, h);
    }

    let has_body = !body.is_end_stream();
    let mut body = Some(match ctx.max_body {
        Some(max) if !content_length => Limited {
            inner: body,
            left: max,
        }
        .boxed_unsync(),
        _ => body.map_err(Into::into).boxed_unsync(),
    });

    let mut last_error = None;
    let order = ctx.pool.order();
    if order.is_empty() {
        tracing::warn!(pool = ctx.pool.name, "no live upstreams");
        return error_page(StatusCode::BAD_GATEWAY, "502 Bad Gateway");
    }
    let client = ctx.pool.client();
    let scheme = client.scheme();
    let Ok(path) = PathAndQuery::from_maybe_shared(path) else {
        return error_page(StatusCode::BAD_REQUEST, "400 Bad Request");
    };
    let attempts = order.len();
    for (attempt, addr) in order.into_iter().enumerate() {
        let uri = Uri::builder()
            .scheme(scheme)
            .authority(addr)
            .path_and_query(path.clone())
            .build();
        let Ok(uri) = uri else {
            return error_page(StatusCode::BAD_REQUEST, "400 Bad Request");
        };
        let b = match body.take() {
            Some(b) => b,
            None => http_body_util::Empty::new()
                .map_err(Into::into)
                .boxed_unsync(),
        };
        let mut up = Request::new(b);
        *up.method_mut() = parts.method.clone();
        *up.uri_mut() = uri;
        // Only a request without a body is tried again (below); the last
        // or only try takes the headers.
        *up.headers_mut() = if attempt + 1 < attempts && !has_body {
            headers.clone()
        } else {
            std::mem::take(&mut headers)
        };
        *up.version_mut() = if ctx.grpc {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let sent = tokio::time::timeout(ctx.read_timeout, client.request(up)).await;
        match sent {
            Err(_) => {
                tracing::info!(upstream = addr, "upstream timed out");
                ctx.pool.failed(addr);
                return error_page(StatusCode::GATEWAY_TIMEOUT, "504 Gateway Time-out");
            }
            Ok(Err(e)) if e.is_connect() && !has_body => {
                tracing::info!(upstream = addr, error = %e, "upstream refused; trying the next");
                ctx.pool.failed(addr);
                last_error = Some(e);
                continue;
            }
            Ok(Err(e)) => {
                tracing::info!(upstream = addr, error = %e, "upstream failed");
                // The body cut off by `Limited` surfaces somewhere down the chain.
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
                let mut too_large = false;
                while let Some(s) = source {
                    too_large |= s.to_string() == BODY_TOO_LARGE;
                    source = s.source();
                }
                if !too_large {
                    ctx.pool.failed(addr);
                }
                return if too_large {
                    error_page(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "413 Request Entity Too Large",
                    )
                } else {
                    error_page(StatusCode::BAD_GATEWAY, "502 Bad Gateway")
                };
            }
            Ok(Ok(mut resp)) => {
                ctx.pool.succeeded(addr);
                if let Some(client_upgrade) = client_upgrade
                    && resp.status() == StatusCode::SWITCHING_PROTOCOLS
                {
                    let upstream_upgrade = hyper::upgrade::on(&mut resp);
                    tokio::spawn(splice(client_upgrade, upstream_upgrade, ctx.conn.remote));
                    let (mut parts, _) = resp.into_parts();
                    parts.headers.remove(header::TRANSFER_ENCODING);
                    return Response::from_parts(
                        parts,
                        Body::new(http_body_util::Empty::<Bytes>::new()),
                    );
                }
                let (mut parts, body) = resp.into_parts();
                for h in &HOP {
                    parts.headers.remove(h);
                }
                let body = Timed {
                    inner: body,
                    timeout: ctx.read_timeout,
                    sleep: None,
                };
                return Response::from_parts(parts, Body::new(body));
            }
        }
    }
    if let Some(e) = last_error {
        tracing::warn!(pool = ctx.pool.name, error = %e, "no upstream server answered");
    }
    error_page(StatusCode::BAD_GATEWAY, "502 Bad Gateway")
}

async fn splice(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    remote: SocketAddr,
) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(%remote, error = %e, "upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(%remote, error = %e, "upgraded connection ended");
    }
}

const BODY_TOO_LARGE: &str = "request body larger than client_max_body_size";

/// A request body cut off past `client_max_body_size`.
struct Limited {
    inner: Incoming,
    left: u64,
}

impl http_body::Body for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > self.left {
                        return Poll::Ready(Some(Err(BODY_TOO_LARGE.into())));
                    }
                    self.left -= n;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An upstream response body that fails when the upstream sends nothing for
/// the read timeout (nginx's `proxy_read_timeout` between two reads).
struct Timed {
    inner: Incoming,
    timeout: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            self.sleep = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let timeout = self.timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Some(Err("upstream read timed out".into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_ring_then_backups_and_never_down() {
        let s = |port, weight, backup, down| spinlink_nginx_compat::UpstreamServer {
            host: "127.0.0.1".into(),
            port,
            weight,
            max_fails: 1,
            fail_timeout_ms: 10_000,
            backup,
            down,
        };
        let pool = Pool::new(
            "p",
            &[
                s(1, 2, false, false),
                s(2, 1, false, false),
                s(3, 1, true, false),
                s(4, 1, false, true),
            ],
            false,
            None,
            1,
        );
        assert_eq!(pool.ring.len(), 3);
        assert_eq!(pool.order(), ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
    }

    fn server(port: u16, max_fails: u32) -> spinlink_nginx_compat::UpstreamServer {
        spinlink_nginx_compat::UpstreamServer {
            host: "127.0.0.1".into(),
            port,
            weight: 1,
            max_fails,
            fail_timeout_ms: 10_000,
            backup: false,
            down: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn max_fails_within_fail_timeout_marks_a_server_down_for_fail_timeout() {
        let pool = Pool::new("p", &[server(1, 2), server(2, 2)], false, None, 1);
        fn both(pool: &Pool) -> Vec<&str> {
            let mut o = pool.order();
            o.sort_unstable();
            o
        }
        pool.failed("127.0.0.1:1");
        assert_eq!(
            both(&pool),
            ["127.0.0.1:1", "127.0.0.1:2"],
            "one of two fails"
        );
        // The second failure comes after the window: the count starts over.
        tokio::time::advance(Duration::from_secs(11)).await;
        pool.failed("127.0.0.1:1");
        assert_eq!(both(&pool).len(), 2);
        pool.failed("127.0.0.1:1");
        assert_eq!(pool.order(), ["127.0.0.1:2"], "two within 10 s: down");
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(pool.order(), ["127.0.0.1:2"]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(both(&pool).len(), 2, "back after fail_timeout");
        // A success clears the count.
        pool.failed("127.0.0.1:2");
        pool.succeeded("127.0.0.1:2");
        pool.failed("127.0.0.1:2");
        assert_eq!(both(&pool).len(), 2);
        // Every server down: nothing to try.
        pool.failed("127.0.0.1:2");
        pool.failed("127.0.0.1:1");
        pool.failed("127.0.0.1:1");
        assert!(pool.order().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_server_or_max_fails_zero_is_never_marked_down() {
        let lone = Pool::new("p", &[server(1, 1)], false, None, 1);
        lone.failed("127.0.0.1:1");
        lone.failed("127.0.0.1:1");
        assert_eq!(lone.order(), ["127.0.0.1:1"]);
        let zero = Pool::new("p", &[server(1, 0), server(2, 1)], false, None, 1);
        for _ in 0..5 {
            zero.failed("127.0.0.1:1");
        }
        assert!(zero.order().contains(&"127.0.0.1:1"));
    }

    /// Each worker sends on a client of its own (its own kept-alive
    /// connections); any other thread on the shared one.
    #[tokio::test]
    async fn each_worker_has_its_own_client() {
        use std::sync::Arc;
        let workers = crate::workers::Workers::start(2).unwrap();
        let pool = Arc::new(Pool::new("p", &[server(1, 1)], false, None, 2));
        assert_eq!(pool.clients.len(), 3);
        let index_of = |c: &UpstreamClient| pool.clients.iter().position(|x| std::ptr::eq(x, c));
        assert_eq!(index_of(pool.client()), Some(2));
        for w in 0..2 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let p = pool.clone();
            workers.spawners().spawn(w, async move {
                let c: *const UpstreamClient = p.client();
                let _ = tx.send(p.clients.iter().position(|x| std::ptr::eq(x, c)));
            });
            assert_eq!(rx.await.unwrap(), Some(w));
        }
    }
}
