//! Carrying one ingress request to its upstream pool and the answer back.
//!
//! [`Pool`] holds an `upstream` block's servers (weights as repetition in a
//! round-robin ring, `backup` servers tried after every primary, `down` ones
//! never) and each worker's kept-alive connections to them
//! (`ingress/client.rs`): HTTP/1.1 for `proxy_pass http://`, h2c with prior
//! knowledge for `grpc_pass grpc://`. A server that refuses the
//! connection, or does not take it within the connect timeout, is skipped
//! for the next one (the body, unread, goes with the request), and so is
//! one whose connection failed after taking the request when the request
//! has no body or one read whole, and an idempotent method (nginx's
//! `proxy_next_upstream error timeout`); a request a kept-alive connection
//! failed under is first sent again, once, on a new connection to the same
//! server when it can be (`ingress/client.rs`). `proxy_pass https://` and
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
//! location's `proxy_set_header` templates (each sent, several of one name
//! too; an empty value only removes the request's), reads a body of up to
//! `client_body_buffer_size` whole before any server is tried
//! ([`ReadAhead`], nginx's `proxy_request_buffering`), bounds a
//! body without `Content-Length` by `client_max_body_size`, waits at most the
//! read timeout for the response head (504) and between body frames, and
//! splices an HTTP/1.1 `Upgrade` (WebSocket) through once both sides agree.

use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use smallvec::SmallVec;

use tokio::time::Instant;

use super::client::{BoxError, Connections, Dialer, Outgoing, ReqBody, Timeouts, UpstreamBody};
use super::upstream_tls::UpstreamTls;
use super::vars::{Template, Vars, X_FORWARDED_FOR};
use super::{Body, ConnInfo, error_page};

/// Most ring entries one server's `weight=` makes.
const MAX_WEIGHT: u32 = 100;

/// The servers one request tries, in order: a pool's few held inline.
type Order = SmallVec<[usize; 4]>;

/// An upstream pool and its connections.
#[derive(Debug)]
pub struct Pool {
    name: String,
    /// `$proxy_host` as the `Host` requests get by default (`None`: not a
    /// header value; the server's address is sent then).
    host: Option<HeaderValue>,
    /// Each distinct server once.
    servers: Vec<Server>,
    /// Primaries in weighted order (indices into `servers`).
    ring: Vec<usize>,
    backups: Vec<usize>,
    next: AtomicUsize,
    dialer: Dialer,
    /// Kept-alive connections per worker, and the last for any other
    /// thread: a request goes out on its worker's own connections, as the
    /// agent path's streams do.
    connections: Box<[Connections]>,
}

/// One server: `host:port` as dialled, and its passive health.
#[derive(Debug)]
struct Server {
    addr: String,
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

impl Server {
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
        let mut distinct: Vec<Server> = Vec::new();
        let mut ring = Vec::new();
        let mut backups = Vec::new();
        for s in servers.iter().filter(|s| !s.down) {
            let a = addr(s);
            let i = match distinct.iter().position(|d| d.addr == a) {
                Some(i) => i,
                None => {
                    distinct.push(Server {
                        addr: a,
                        max_fails: s.max_fails,
                        fail_timeout: Duration::from_millis(s.fail_timeout_ms),
                        state: Mutex::default(),
                    });
                    distinct.len() - 1
                }
            };
            if s.backup {
                backups.push(i);
            } else {
                for _ in 0..s.weight.clamp(1, MAX_WEIGHT) {
                    ring.push(i);
                }
            }
        }
        let connections = (0..=workers)
            .map(|_| Connections::new(distinct.len()))
            .collect();
        Self {
            name: name.to_owned(),
            host: HeaderValue::from_str(name).ok(),
            servers: distinct,
            ring,
            backups,
            next: AtomicUsize::new(0),
            dialer: Dialer::new(h2, tls),
            connections,
        }
    }

    /// The calling thread's connections: its worker's own, or the shared
    /// ones (the last).
    fn connections_index(&self) -> usize {
        let shared = self.connections.len() - 1;
        crate::workers::current().map_or(shared, |p| p.index.min(shared))
    }

    /// No server can be tried.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.backups.is_empty()
    }

    /// Counts a failed attempt on server `i` (for `max_fails`); a pool of
    /// one server never marks it down.
    fn failed(&self, i: usize) {
        let server = &self.servers[i];
        if self.servers.len() > 1 && server.failed(Instant::now()) {
            tracing::warn!(
                upstream = server.addr,
                pool = self.name,
                seconds = server.fail_timeout.as_secs_f64(),
                "upstream server marked down (max_fails reached)"
            );
        }
    }

    /// Clears server `i`'s failures.
    fn succeeded(&self, i: usize) {
        if self.servers.len() > 1 {
            self.servers[i].succeeded();
        }
    }

    /// Live servers in the order this request tries them.
    fn order(&self) -> Order {
        let now = Instant::now();
        let mut order = self.all_in_order();
        if self.servers.len() > 1 {
            order.retain(|i| !self.servers[*i].is_down(now));
        }
        order
    }

    /// Servers in the order this request tries them: the ring from the next
    /// position, each server once, then the backups.
    fn all_in_order(&self) -> Order {
        let n = self.ring.len();
        let mut order = Order::with_capacity(self.servers.len());
        if n > 0 {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
            for i in 0..n {
                let s = self.ring[(start + i) % n];
                if !order.contains(&s) {
                    order.push(s);
                }
            }
        }
        order.extend_from_slice(&self.backups);
        order
    }
}

/// What [`forward`] needs from the route and the connection.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The pool.
    pub pool: &'a Arc<Pool>,
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
    /// The location's connect, send and read timeouts.
    pub(crate) timeouts: Timeouts,
    /// `client_max_body_size` (`None`: unlimited).
    pub max_body: Option<u64>,
    /// How a body is read before it goes upstream (`None`: streamed as
    /// it arrives).
    pub(crate) read_ahead: Option<ReadAhead>,
    /// `$host`.
    pub host: &'a str,
    /// `$server_name`.
    pub server_name: &'a str,
    /// The connection.
    pub conn: &'a ConnInfo,
}

/// Reading a request's body before it goes upstream, as nginx's
/// `proxy_request_buffering on` does: a body of at most `size` bytes is
/// read whole first, so a slow client costs no upstream connection and the
/// request can be sent again; each read comes within `timeout`
/// (`client_body_timeout`) or the request ends without an answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadAhead {
    /// `client_body_buffer_size`: a body declared larger, or found larger
    /// as it arrives, is streamed (what was read first, then the rest).
    pub size: usize,
    /// `client_body_timeout`: the longest wait for the next part.
    pub timeout: Duration,
}

/// A request ended without an answer, as nginx ends one whose client
/// stopped sending its body for `client_body_timeout` or broke off while
/// sending it (nginx logs 408 or 400 and sends nothing): an HTTP/1.1
/// connection is closed, an HTTP/2 stream reset.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoAnswer(&'static str);

/// A request body read ahead ([`ReadAhead`]).
enum ReadBody {
    /// All of it.
    Whole(Bytes),
    /// More than the buffer holds: what was read, and the rest to come.
    Started { read: Bytes, rest: Incoming },
}

/// Why a body read ahead was not read.
enum ReadFailure {
    /// Nothing came for the read timeout.
    TimedOut,
    /// Past `client_max_body_size`.
    TooLarge,
    /// The client broke the body off.
    Client(hyper::Error),
}

/// Reads `body` ahead: whole when it ends within `ahead.size` bytes. A body
/// that arrives in one part is kept as it came; parts after the first are
/// joined into one buffer, so the memory held is what arrived, however
/// small the parts. Trailers are dropped (nginx passes none of a
/// request's).
async fn read_ahead(
    mut body: Incoming,
    ahead: ReadAhead,
    max_body: Option<u64>,
) -> Result<ReadBody, ReadFailure> {
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut len = 0usize;
    loop {
        let frame = match tokio::time::timeout(ahead.timeout, body.frame()).await {
            Err(_) => return Err(ReadFailure::TimedOut),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(ReadFailure::Client(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        len = len.saturating_add(data.len());
        if max_body.is_some_and(|max| len as u64 > max) {
            return Err(ReadFailure::TooLarge);
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            earlier => {
                if let Some(earlier) = earlier {
                    joined.reserve(len.min(ahead.size.saturating_add(1)));
                    joined.extend_from_slice(&earlier);
                }
                joined.extend_from_slice(&data);
            }
        }
        if len > ahead.size {
            let read = first.take().unwrap_or_else(|| joined.split().freeze());
            return Ok(ReadBody::Started { read, rest: body });
        }
    }
    Ok(ReadBody::Whole(first.unwrap_or_else(|| joined.freeze())))
}

/// A request body whose first part was read ahead: that, then the rest.
struct Started {
    read: Option<Bytes>,
    rest: ReqBody,
}

impl http_body::Body for Started {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read.as_ref().map_or(0, |b| b.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
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

const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes the [`HOP`] headers but those `keep` names: one pass over the
/// names present, a removal only for each one found (most requests and
/// answers carry none).
fn remove_hop_by_hop(headers: &mut http::HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    let hop = HOP;
    // Bit `i` set: `hop[i]` is present.
    let mut found = 0u8;
    for name in headers.keys() {
        if let Some(i) = hop.iter().position(|h| h == name) {
            found |= 1 << i;
        }
    }
    for (i, h) in hop.iter().enumerate() {
        if found & (1 << i) != 0 && !keep(h) {
            headers.remove(h);
        }
    }
}

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

/// The path and query the upstream gets: the request's own (sharing its
/// memory) unless `proxy_pass` names a URI.
fn upstream_path(ctx: &Ctx<'_>, uri: &Uri) -> Result<PathAndQuery, http::uri::InvalidUri> {
    match (ctx.uri, uri.path_and_query()) {
        (None, Some(own)) if own.as_str().starts_with('/') => Ok(own.clone()),
        _ => PathAndQuery::from_maybe_shared(upstream_path_text(ctx, uri)),
    }
}

/// [`upstream_path`] written out.
fn upstream_path_text(ctx: &Ctx<'_>, uri: &Uri) -> String {
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

/// What the text of one request's header values starts with room for.
const VALUES_CAPACITY: usize = 256;

/// Writes a value at the end of `text`; where it lies.
fn written(text: &mut String, write: impl FnOnce(&mut String)) -> Range<usize> {
    let start = text.len();
    write(text);
    start..text.len()
}

/// Sends `req` to the context's pool and returns its answer.
pub async fn forward(ctx: Ctx<'_>, mut req: Request<Incoming>) -> Result<Response<Body>, NoAnswer> {
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
        remote_ip: &ctx.conn.remote_ip,
        remote_port: ctx.conn.remote.port(),
        scheme,
        server_name: ctx.server_name,
        server_port: ctx.conn.local_port,
        req: &parts,
        client_cert_escaped: &ctx.conn.client_cert_escaped,
        client_verify: &verify,
    };
    // Everything the request's own fields fill in is worked out first, so
    // its header map can then be taken over rather than copied. Every such
    // value is written into one text, which the header values then share:
    // two allocations per request whatever the templates, not two per value.
    // The gateway always tells the upstream who asked (nginx only when
    // configured); a location's own setting below wins, so a default it
    // replaces is not worked out at all.
    let mut text = String::with_capacity(VALUES_CAPACITY);
    let location_sets = |name: &HeaderName| ctx.headers.iter().any(|(n, _)| n == name);
    let forwarded_for = (!location_sets(&X_FORWARDED_FOR))
        .then(|| written(&mut text, |out| super::vars::forwarded_for_into(&vars, out)));
    let forwarded_host = (!location_sets(&X_FORWARDED_HOST))
        .then(|| written(&mut text, |out| out.push_str(ctx.host)));
    // Each location header and where its value lies in `text` (empty:
    // nothing to send).
    let set: SmallVec<[(&HeaderName, Range<usize>); 8]> = ctx
        .headers
        .iter()
        .map(|(name, template)| {
            let at = match template {
                Some(t) => written(&mut text, |out| t.expand_into(&vars, out)),
                None => 0..0,
            };
            (name, at)
        })
        .collect();
    let text = Bytes::from(text);
    let value = |at: Range<usize>| HeaderValue::from_maybe_shared(text.slice(at)).ok();
    let forwarded = [
        (X_FORWARDED_FOR, forwarded_for.and_then(value)),
        (
            X_FORWARDED_PROTO,
            (!location_sets(&X_FORWARDED_PROTO)).then(|| HeaderValue::from_static(scheme)),
        ),
        (X_FORWARDED_HOST, forwarded_host.and_then(value)),
    ];
    let content_length = parts.headers.contains_key(header::CONTENT_LENGTH);
    let mut headers = std::mem::take(&mut parts.headers);
    // gRPC needs `te: trailers`; an upgrade keeps its `Upgrade`.
    remove_hop_by_hop(&mut headers, |h| {
        (h == header::TE && ctx.grpc) || (h == header::UPGRADE && upgrade)
    });
    headers.remove(header::HOST);
    for (name, value) in forwarded {
        if let Some(v) = value {
            headers.insert(name, v);
        }
    }
    // nginx's default `Host: $proxy_host`, unless the location sets it.
    let mut host = ctx.pool.host.clone();
    // A name the location sets is not passed from the request, and each of
    // its settings with a value is sent, as nginx sends them (the first
    // replaces what the request had, in one lookup; the next ones add).
    for (i, (name, at)) in set.into_iter().enumerate() {
        let empty = at.is_empty();
        let v = if empty { None } else { value(at) };
        if name == header::HOST {
            host = v;
            continue;
        }
        if v.is_none() && !empty {
            tracing::debug!(header = %name, "header value not sendable; dropped");
        }
        let first = !ctx.headers[..i].iter().any(|(n, _)| n == name);
        match (v, first) {
            (Some(v), true) => {
                headers.insert(name.clone(), v);
            }
            (Some(v), false) => {
                headers.append(name.clone(), v);
            }
            (None, true) => {
                headers.remove(name);
            }
            (None, false) => {}
        }
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // HTTP/2 upstreams (gRPC) get the authority from the URI instead.
    if (upgrade || !ctx.grpc)
        && let Some(h) = host
    {
        headers.insert(header::HOST, h);
    }

    let has_body = !body.is_end_stream();
    // The body read whole ahead of the upstream, when it was: every try
    // sends it (with its length); `body` then holds none.
    let mut whole = None;
    let declared = || {
        headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    };
    let limited = |inner: Incoming, read: u64| match ctx.max_body {
        Some(max) if !content_length => Limited {
            inner,
            left: max.saturating_sub(read),
        }
        .boxed_unsync(),
        _ => inner.map_err(Into::into).boxed_unsync(),
    };
    let mut body = match ctx.read_ahead {
        // Nothing to carry: a body that needs no box of its own.
        _ if !has_body => None,
        Some(ahead) if !upgrade && declared().is_none_or(|n| n <= ahead.size as u64) => {
            // Boxed: its state (a timer among it) would otherwise make every
            // request's future as large, bodies or not.
            match Box::pin(read_ahead(body, ahead, ctx.max_body)).await {
                Ok(ReadBody::Whole(bytes)) => {
                    // Sent with its length, as nginx sends a body it read.
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                    whole = Some(bytes);
                    None
                }
                Ok(ReadBody::Started { read, rest }) => {
                    let rest = limited(rest, read.len() as u64);
                    Some(Outgoing::Streamed(
                        Started {
                            read: Some(read),
                            rest,
                        }
                        .boxed_unsync(),
                    ))
                }
                Err(ReadFailure::TooLarge) => {
                    return Ok(error_page(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "413 Request Entity Too Large",
                    ));
                }
                Err(ReadFailure::TimedOut) => {
                    tracing::debug!(remote = %ctx.conn.remote, "client timed out sending its request body");
                    return Err(NoAnswer("client_body_timeout: the request body stopped"));
                }
                Err(ReadFailure::Client(e)) => {
                    tracing::debug!(remote = %ctx.conn.remote, error = %e, "client broke its request body off");
                    return Err(NoAnswer("the request body was broken off"));
                }
            }
        }
        _ => Some(Outgoing::Streamed(limited(body, 0))),
    };

    let mut last_error = None;
    // What the client gets when no server answers: the last failure's
    // status, as nginx answers (504 after a timeout, 502 otherwise).
    let mut no_answer = (StatusCode::BAD_GATEWAY, "502 Bad Gateway");
    let pool = ctx.pool;
    let order = pool.order();
    if order.is_empty() {
        tracing::warn!(pool = pool.name, "no live upstreams");
        return Ok(error_page(StatusCode::BAD_GATEWAY, "502 Bad Gateway"));
    }
    let Ok(path) = path else {
        return Ok(error_page(StatusCode::BAD_REQUEST, "400 Bad Request"));
    };
    let h2 = pool.dialer.is_h2();
    let scheme = if pool.dialer.is_tls() {
        "https"
    } else {
        "http"
    };
    let connections = pool.connections_index();
    let attempts = order.len();
    for (attempt, server) in order.into_iter().enumerate() {
        let addr = pool.servers[server].addr.as_str();
        // HTTP/1.1 names the path alone (origin form) and the server in
        // `Host`; HTTP/2 carries scheme and authority as pseudo-headers.
        let uri = if h2 {
            Uri::builder()
                .scheme(scheme)
                .authority(addr)
                .path_and_query(path.clone())
                .build()
        } else {
            Ok(Uri::from(path.clone()))
        };
        let Ok(uri) = uri else {
            return Ok(error_page(StatusCode::BAD_REQUEST, "400 Bad Request"));
        };
        let b = match (&whole, body.take()) {
            (Some(bytes), _) => Outgoing::Whole(bytes.clone()),
            (None, Some(streamed)) => streamed,
            (None, None) => Outgoing::Streamed(super::client::empty_body()),
        };
        let mut up = Request::new(b);
        *up.method_mut() = parts.method.clone();
        *up.uri_mut() = uri;
        // A request may go on to the next server (below); the last or
        // only try takes the headers.
        *up.headers_mut() = if attempt + 1 < attempts {
            headers.clone()
        } else {
            std::mem::take(&mut headers)
        };
        if !h2
            && !up.headers().contains_key(header::HOST)
            && let Ok(h) = HeaderValue::from_str(addr)
        {
            // HTTP/1.1 needs one; a location that empties `Host` gets the
            // server's address.
            up.headers_mut().insert(header::HOST, h);
        }
        *up.version_mut() = if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let sent = pool.connections[connections]
            .send(&pool.dialer, server, addr, up, ctx.timeouts)
            .await;
        // nginx's `proxy_next_upstream error timeout` (its default): what
        // failed goes on to the next server — any request when no
        // connection was made (its body, not read from, with it), and one
        // already sent only if its body (if any) was read whole and its
        // method is idempotent (ngx_http_upstream_next: FT_NON_IDEMPOTENT
        // for POST, LOCK and PATCH once sent). No server left: 504 when the
        // last failure was a timeout, 502 otherwise.
        let again = !has_body || whole.is_some();
        let next = match &sent {
            Ok(_) => false,
            Err(e) if e.is_connect() => again || e.has_body(),
            Err(e) => {
                again
                    && (e.is_timeout() || e.is_connection_failure())
                    && super::client::sendable_again(&parts.method)
            }
        };
        match sent {
            Err(mut e) if next => {
                tracing::info!(upstream = addr, error = %e, "upstream failed; trying the next");
                pool.failed(server);
                // A streamed body comes back only from a server that took
                // none of it; one read whole goes again from `whole`.
                body = e.take_body().map(Outgoing::Streamed);
                no_answer = if e.is_timeout() {
                    (StatusCode::GATEWAY_TIMEOUT, "504 Gateway Time-out")
                } else {
                    (StatusCode::BAD_GATEWAY, "502 Bad Gateway")
                };
                last_error = Some(e);
                continue;
            }
            Err(e) if e.is_timeout() => {
                tracing::info!(upstream = addr, error = %e, "upstream timed out");
                pool.failed(server);
                return Ok(error_page(
                    StatusCode::GATEWAY_TIMEOUT,
                    "504 Gateway Time-out",
                ));
            }
            Err(e) => {
                tracing::info!(upstream = addr, error = %e, "upstream failed");
                // The body cut off by `Limited` surfaces somewhere down the chain.
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
                let mut too_large = false;
                while let Some(s) = source {
                    too_large |= s.to_string() == BODY_TOO_LARGE;
                    source = s.source();
                }
                if !too_large {
                    pool.failed(server);
                }
                return Ok(if too_large {
                    error_page(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "413 Request Entity Too Large",
                    )
                } else {
                    error_page(StatusCode::BAD_GATEWAY, "502 Bad Gateway")
                });
            }
            Ok(resp) => {
                pool.succeeded(server);
                let (mut parts, body) = resp.into_parts();
                if let Some(client_upgrade) = client_upgrade
                    && parts.status == StatusCode::SWITCHING_PROTOCOLS
                    && let UpstreamBody::H1(answer) = body
                {
                    if let Some(upstream) = answer.into_conn() {
                        tokio::spawn(splice(
                            client_upgrade,
                            upstream,
                            ctx.conn.remote,
                            ctx.timeouts.read,
                        ));
                    }
                    parts.headers.remove(header::TRANSFER_ENCODING);
                    return Ok(Response::from_parts(
                        parts,
                        Body::new(http_body_util::Empty::<Bytes>::new()),
                    ));
                }
                remove_hop_by_hop(&mut parts.headers, |_| false);
                let body = Timed {
                    inner: body,
                    timeout: ctx.timeouts.read,
                    sleep: None,
                    ended: false,
                    lease: Lease {
                        pool: pool.clone(),
                        connections,
                        server,
                    },
                };
                return Ok(Response::from_parts(parts, Body::new(body)));
            }
        }
    }
    match last_error {
        Some(e) => tracing::warn!(pool = pool.name, error = %e, "no upstream server answered"),
        None => tracing::warn!(pool = pool.name, "no upstream server answered in time"),
    }
    Ok(error_page(no_answer.0, no_answer.1))
}

/// Where an HTTP/1.1 upstream connection lent to one response goes back
/// to (its worker's idle list) when the body has been read to its end.
struct Lease {
    pool: Arc<Pool>,
    connections: usize,
    server: usize,
}

/// Carries an upgraded (`101`) exchange's bytes both ways: what the
/// upstream sent past its answer's head first, then whatever either side
/// sends, until either side ends or nothing moves either way for `idle`
/// (the location's read timeout), as nginx's `ngx_http_upstream_process_upgraded`
/// ends an upgraded connection whose upstream read timer runs out (each
/// event in either direction sets it again).
async fn splice(
    client: hyper::upgrade::OnUpgrade,
    upstream: super::h1::Conn,
    remote: SocketAddr,
    idle: Duration,
) {
    use tokio::io::AsyncWriteExt as _;
    let client = match client.await {
        Ok(client) => client,
        Err(e) => {
            tracing::debug!(%remote, error = %e, "upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let (upstream, early) = upstream.into_parts();
    if !early.is_empty()
        && let Err(e) = client.write_all(&early).await
    {
        tracing::debug!(%remote, error = %e, "upgraded connection ended");
        return;
    }
    if let Err(e) = carry(client, upstream, idle).await {
        tracing::debug!(%remote, error = %e, "upgraded connection ended");
    }
}

/// Bytes read on one side of an upgraded exchange are written to the
/// other; ends when either side ends (nginx ends both once one has and
/// what it sent is passed on) or nothing has moved for `idle`.
async fn carry<C, U>(client: C, upstream: U, idle: Duration) -> std::io::Result<()>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    use tokio::io::AsyncReadExt as _;
    const BUF: usize = 8 * 1024;
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut upstream_rd, mut upstream_wr) = tokio::io::split(upstream);
    let (mut up, mut down) = (vec![0u8; BUF], vec![0u8; BUF]);
    loop {
        let deadline = Instant::now() + idle;
        let open = tokio::select! {
            read = client_rd.read(&mut up) => pass(read?, &up, &mut upstream_wr, deadline, idle).await?,
            read = upstream_rd.read(&mut down) => pass(read?, &down, &mut client_wr, deadline, idle).await?,
            () = tokio::time::sleep_until(deadline) => return Err(quiet(idle)),
        };
        if !open {
            return Ok(());
        }
    }
}

/// Writes the `n` bytes one side of an upgraded exchange sent in `buf` to
/// the other by `deadline` (`idle` after the last move); `false` when the
/// side ended (the other is shut down then).
async fn pass<W: tokio::io::AsyncWrite + Unpin>(
    n: usize,
    buf: &[u8],
    to: &mut W,
    deadline: Instant,
    idle: Duration,
) -> std::io::Result<bool> {
    use tokio::io::AsyncWriteExt as _;
    if n == 0 {
        to.shutdown().await?;
        return Ok(false);
    }
    tokio::time::timeout_at(deadline, to.write_all(&buf[..n]))
        .await
        .map_err(|_| quiet(idle))??;
    Ok(true)
}

/// An upgraded exchange where nothing moved for `idle`.
fn quiet(idle: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("nothing moved either way for {idle:?}"),
    )
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
/// the read timeout (nginx's `proxy_read_timeout` between two reads), and
/// gives its connection back once read to the end.
struct Timed {
    inner: UpstreamBody,
    timeout: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The last frame has been read.
    ended: bool,
    lease: Lease,
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
            self.ended |= match &frame {
                None => true,
                Some(Ok(f)) => f.is_trailers(),
                Some(Err(_)) => false,
            };
            return Poll::Ready(frame);
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

impl Drop for Timed {
    fn drop(&mut self) {
        // A body left unread keeps the connection busy: it goes with it.
        if (self.ended || self.inner.is_end_stream())
            && let UpstreamBody::H1(answer) = &mut self.inner
            && let Some(conn) = answer.reusable()
        {
            let lease = &self.lease;
            lease.pool.connections[lease.connections].put_h1(lease.server, conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    /// The addresses `order` names.
    fn addrs(pool: &Pool, order: Order) -> Vec<&str> {
        order
            .into_iter()
            .map(|i| pool.servers[i].addr.as_str())
            .collect()
    }

    /// The index of the server at `addr`.
    fn at(pool: &Pool, addr: &str) -> usize {
        pool.servers.iter().position(|s| s.addr == addr).unwrap()
    }

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
        assert_eq!(
            addrs(&pool, pool.order()),
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        );
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
            let mut o = addrs(pool, pool.order());
            o.sort_unstable();
            o
        }
        pool.failed(at(&pool, "127.0.0.1:1"));
        assert_eq!(
            both(&pool),
            ["127.0.0.1:1", "127.0.0.1:2"],
            "one of two fails"
        );
        // The second failure comes after the window: the count starts over.
        tokio::time::advance(Duration::from_secs(11)).await;
        pool.failed(at(&pool, "127.0.0.1:1"));
        assert_eq!(both(&pool).len(), 2);
        pool.failed(at(&pool, "127.0.0.1:1"));
        assert_eq!(
            addrs(&pool, pool.order()),
            ["127.0.0.1:2"],
            "two within 10 s: down"
        );
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(addrs(&pool, pool.order()), ["127.0.0.1:2"]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(both(&pool).len(), 2, "back after fail_timeout");
        // A success clears the count.
        pool.failed(at(&pool, "127.0.0.1:2"));
        pool.succeeded(at(&pool, "127.0.0.1:2"));
        pool.failed(at(&pool, "127.0.0.1:2"));
        assert_eq!(both(&pool).len(), 2);
        // Every server down: nothing to try.
        pool.failed(at(&pool, "127.0.0.1:2"));
        pool.failed(at(&pool, "127.0.0.1:1"));
        pool.failed(at(&pool, "127.0.0.1:1"));
        assert!(pool.order().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_server_or_max_fails_zero_is_never_marked_down() {
        let lone = Pool::new("p", &[server(1, 1)], false, None, 1);
        lone.failed(at(&lone, "127.0.0.1:1"));
        lone.failed(at(&lone, "127.0.0.1:1"));
        assert_eq!(addrs(&lone, lone.order()), ["127.0.0.1:1"]);
        let zero = Pool::new("p", &[server(1, 0), server(2, 1)], false, None, 1);
        for _ in 0..5 {
            zero.failed(at(&zero, "127.0.0.1:1"));
        }
        assert!(addrs(&zero, zero.order()).contains(&"127.0.0.1:1"));
    }

    /// Each worker sends on connections of its own; any other thread on
    /// the shared ones.
    #[tokio::test]
    async fn each_worker_has_its_own_connections() {
        let workers = crate::workers::Workers::start(2).unwrap();
        let pool = Arc::new(Pool::new("p", &[server(1, 1)], false, None, 2));
        assert_eq!(pool.connections.len(), 3);
        assert_eq!(pool.connections_index(), 2);
        for w in 0..2 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let p = pool.clone();
            workers.spawners().spawn(w, async move {
                let _ = tx.send(p.connections_index());
            });
            assert_eq!(rx.await.unwrap(), w);
        }
    }

    #[test]
    fn hop_by_hop_headers_go_but_those_kept_and_the_rest_stay() {
        let mut headers = http::HeaderMap::new();
        for h in HOP {
            headers.append(h.clone(), HeaderValue::from_static("a"));
            headers.append(h, HeaderValue::from_static("b"));
        }
        headers.insert("x-end", HeaderValue::from_static("1"));
        headers.insert(header::HOST, HeaderValue::from_static("h"));
        let mut all = headers.clone();
        remove_hop_by_hop(&mut all, |_| false);
        let names = |m: &http::HeaderMap| {
            let mut n: Vec<_> = m.keys().map(|k| k.as_str().to_owned()).collect();
            n.sort();
            n
        };
        assert_eq!(names(&all), ["host", "x-end"]);
        remove_hop_by_hop(&mut headers, |h| h == header::TE);
        assert_eq!(names(&headers), ["host", "te", "x-end"]);
        assert_eq!(
            headers.get_all(header::TE).iter().count(),
            2,
            "both values kept"
        );
        let mut none = http::HeaderMap::new();
        none.insert("x-end", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut none, |_| false);
        assert_eq!(names(&none), ["x-end"]);
    }

    /// A raw HTTP/1.1 upstream: `ok` to every request, except `/stall`,
    /// which gets two bytes of a ten-byte body and then nothing. Counts the
    /// connections it accepted; closes each after its first answer unless
    /// `keep_alive`.
    async fn counting_upstream(keep_alive: bool) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    loop {
                        let Ok(n) = s.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let stall = head.starts_with(b"GET /stall ");
                        head.drain(..end + 4);
                        if stall {
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab")
                                .await;
                            std::future::pending::<()>().await;
                        }
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        if !keep_alive {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    const TIMEOUTS: Timeouts = Timeouts {
        connect: Duration::from_secs(10),
        send: Duration::from_secs(10),
        read: Duration::from_secs(10),
    };

    /// `method path` with `body` through the pool's shared connections: the
    /// answer's status, its body read to the end.
    async fn request(
        pool: &Arc<Pool>,
        method: Method,
        path: &str,
        body: &'static [u8],
    ) -> Result<StatusCode, super::super::client::SendError> {
        let body = Outgoing::Streamed(
            http_body_util::Full::new(Bytes::from_static(body))
                .map_err(Into::into)
                .boxed_unsync(),
        );
        request_with(pool, method, path, body).await
    }

    /// [`request`] with `body` as `forward` hands one over.
    async fn request_with(
        pool: &Arc<Pool>,
        method: Method,
        path: &str,
        body: Outgoing,
    ) -> Result<StatusCode, super::super::client::SendError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "up.test");
        let len = match &body {
            Outgoing::Whole(b) => b.len() as u64,
            Outgoing::Streamed(b) => b.size_hint().exact().unwrap_or(0),
        };
        if len > 0 {
            req = req.header(header::CONTENT_LENGTH, len);
        }
        let (status, body) = lent(pool, req.body(body).unwrap()).await?;
        body.collect().await.unwrap();
        Ok(status)
    }

    /// `req` through the pool's shared connections: the answer's status and
    /// its body wrapped as `forward` wraps it, the connection lent to it.
    async fn lent(
        pool: &Arc<Pool>,
        req: Request<Outgoing>,
    ) -> Result<(StatusCode, Timed), super::super::client::SendError> {
        let addr = pool.servers[0].addr.clone();
        let connections = pool.connections_index();
        let resp = pool.connections[connections]
            .send(&pool.dialer, 0, &addr, req, TIMEOUTS)
            .await?;
        let status = resp.status();
        let body = Timed {
            inner: resp.into_body(),
            timeout: Duration::from_secs(10),
            sleep: None,
            ended: false,
            lease: Lease {
                pool: pool.clone(),
                connections,
                server: 0,
            },
        };
        Ok((status, body))
    }

    /// nginx sends a request again when its cached (kept-alive) connection
    /// fails under it, unless the request was sent with a method it counts
    /// as non-idempotent (`ngx_http_upstream_next` in
    /// src/http/ngx_http_upstream.c: `u->peer.cached && ft_type ==
    /// NGX_HTTP_UPSTREAM_FT_ERROR` adds a try; POST, LOCK and PATCH once
    /// sent are `NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT`, not in the default
    /// `proxy_next_upstream error timeout`). nginx 1.22.1 with `keepalive`
    /// in front of this upstream answers 200 to a GET and a DELETE on the
    /// failing connection (each seen twice upstream) and 502 to a POST.
    #[tokio::test]
    async fn a_request_a_kept_alive_connection_failed_under_is_sent_again() {
        let (addr, log) = crate::test_support::closing_upstream().await;
        let pool = upstream_pool(&addr.to_string());
        for (method, path) in [
            (Method::GET, "/one"),
            (Method::GET, "/two"),
            (Method::DELETE, "/three"),
        ] {
            assert_eq!(
                request(&pool, method, path, b"").await.unwrap(),
                StatusCode::OK,
                "{path}"
            );
        }
        assert_eq!(
            *log.lock().unwrap(),
            [
                (1, "GET /one HTTP/1.1".to_owned()),
                (1, "GET /two HTTP/1.1".to_owned()),
                (2, "GET /two HTTP/1.1".to_owned()),
                (2, "DELETE /three HTTP/1.1".to_owned()),
                (3, "DELETE /three HTTP/1.1".to_owned()),
            ]
        );
    }

    /// A request the server fails on reaches it at most twice, however many
    /// kept-alive connections wait: a client cannot make the gateway send
    /// one request once per idle connection.
    #[tokio::test]
    async fn a_request_is_sent_again_once_on_a_new_connection() {
        let (addr, log) = crate::test_support::closing_upstream().await;
        let pool = upstream_pool(&addr.to_string());
        let shared = pool.connections_index();
        // Three answers held at once: three connections, then all idle.
        let held = [
            get(&pool, "/a").await,
            get(&pool, "/b").await,
            get(&pool, "/c").await,
        ];
        for body in held {
            body.collect().await.unwrap();
        }
        assert_eq!(pool.connections[shared].idle_h1(0), 3);
        assert_eq!(
            request(&pool, Method::GET, "/x", b"").await.unwrap(),
            StatusCode::OK
        );
        let sent: Vec<usize> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, line)| line.starts_with("GET /x "))
            .map(|(conn, _)| *conn)
            .collect();
        assert_eq!(sent, [3, 4], "once on the newest idle, once on a new one");
    }

    /// What cannot be sent again is not: a POST (as nginx), and a request
    /// whose body was streamed (it is gone); a PUT whose body was read
    /// whole is sent again with it, as nginx sends a body it buffered.
    #[tokio::test]
    async fn a_post_or_a_streamed_body_is_not_sent_again_on_a_failed_connection() {
        let (addr, log) = crate::test_support::closing_upstream().await;
        let pool = upstream_pool(&addr.to_string());
        for (method, path, body) in [
            (Method::POST, "/post", &b""[..]),
            (Method::PUT, "/put", &b"body"[..]),
            (Method::PATCH, "/patch", &b""[..]),
        ] {
            log.lock().unwrap().clear();
            assert_eq!(
                request(&pool, Method::GET, "/first", b"").await.unwrap(),
                StatusCode::OK
            );
            let e = request(&pool, method.clone(), path, body)
                .await
                .unwrap_err();
            assert!(!e.is_connect(), "{method}: {e}");
            let seen: Vec<String> = log.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
            assert_eq!(
                seen,
                [
                    "GET /first HTTP/1.1".to_owned(),
                    format!("{method} {path} HTTP/1.1")
                ],
                "{method} sent once"
            );
        }
        log.lock().unwrap().clear();
        assert_eq!(
            request(&pool, Method::GET, "/first", b"").await.unwrap(),
            StatusCode::OK
        );
        let whole = Outgoing::Whole(Bytes::from_static(b"body"));
        assert_eq!(
            request_with(&pool, Method::PUT, "/whole", whole)
                .await
                .unwrap(),
            StatusCode::OK
        );
        let seen: Vec<(usize, String)> = log.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
            [
                "GET /first HTTP/1.1",
                "PUT /whole HTTP/1.1",
                "PUT /whole HTTP/1.1"
            ],
            "the PUT read whole is sent again"
        );
        assert_ne!(seen[1].0, seen[2].0, "on a new connection");
    }

    /// Where no connection was made — refused, or not within the connect
    /// timeout — over HTTP/1.1 and HTTP/2 alike, the error hands the
    /// request's body back unread, for the next server; the connect
    /// timeout, not the read timeout, ends a connect that hangs.
    #[tokio::test]
    async fn no_connection_hands_the_body_back_unread() {
        let hole = crate::test_support::BlackHole::new().await;
        let (refusing, _bound) = crate::test_support::refusing_address();
        let timeouts = Timeouts {
            connect: Duration::from_millis(100),
            send: Duration::from_secs(600),
            read: Duration::from_secs(600),
        };
        for h2 in [false, true] {
            for (addr, timed_out) in [(refusing, false), (hole.addr(), true)] {
                let (host, port) = (addr.ip().to_string(), addr.port());
                let mut s = server(port, 1);
                s.host = host;
                let pool = Pool::new("up", &[s], h2, None, 1);
                let req = Request::post("/upload")
                    .header(header::CONTENT_LENGTH, 5)
                    .body(Outgoing::Streamed(
                        http_body_util::Full::new(Bytes::from_static(b"hello"))
                            .map_err(Into::into)
                            .boxed_unsync(),
                    ))
                    .unwrap();
                let sent = tokio::time::timeout(
                    Duration::from_secs(30),
                    pool.connections[pool.connections_index()].send(
                        &pool.dialer,
                        0,
                        &addr.to_string(),
                        req,
                        timeouts,
                    ),
                )
                .await
                .expect("the connect timeout ends the attempt");
                let mut e = sent.map(|_| ()).unwrap_err();
                let case = format!("{addr} (h2: {h2}): {e}");
                assert!(e.is_connect(), "{case}");
                assert_eq!(e.is_timeout(), timed_out, "{case}");
                let body = e.take_body().expect("the body comes back");
                let bytes = body.collect().await.unwrap().to_bytes();
                assert_eq!(&bytes[..], b"hello", "{case}");
            }
        }
    }

    /// An upgraded exchange carries bytes both ways, ends after `idle`
    /// with nothing moving (traffic either way sets the timer again), and
    /// ends for both sides once one side ends.
    #[tokio::test(start_paused = true)]
    async fn an_upgraded_exchange_ends_when_quiet_or_when_a_side_ends() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let idle = Duration::from_secs(60);

        // Bytes from the client every 59 s keep it up; then 60 s of quiet
        // end it.
        let (client, mut client_far) = tokio::io::duplex(64);
        let (upstream, mut upstream_far) = tokio::io::duplex(64);
        let carried = tokio::spawn(carry(client, upstream, idle));
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(59)).await;
            client_far.write_all(b"up").await.unwrap();
            let mut got = [0u8; 2];
            upstream_far.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"up");
        }
        let quiet = Instant::now();
        let e = carried.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert_eq!(quiet.elapsed(), idle);

        // The upstream ends: what it sent is passed on, then the client's
        // side ends too.
        let (client, mut client_far) = tokio::io::duplex(64);
        let (upstream, mut upstream_far) = tokio::io::duplex(64);
        let carried = tokio::spawn(carry(client, upstream, idle));
        upstream_far.write_all(b"bye").await.unwrap();
        drop(upstream_far);
        let mut got = Vec::new();
        client_far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
        carried.await.unwrap().unwrap();
    }

    /// One request through the pool's shared connections, its body wrapped
    /// as `forward` wraps it.
    async fn get(pool: &Arc<Pool>, path: &str) -> Timed {
        let req = Request::get(path)
            .header(header::HOST, "up.test")
            .body(Outgoing::Streamed(
                http_body_util::Empty::new()
                    .map_err(Into::into)
                    .boxed_unsync(),
            ))
            .unwrap();
        let (status, body) = lent(pool, req).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        body
    }

    fn upstream_pool(addr: &str) -> Arc<Pool> {
        let (host, port) = addr.rsplit_once(':').unwrap();
        let mut s = server(port.parse().unwrap(), 1);
        s.host = host.into();
        Arc::new(Pool::new("up", &[s], false, None, 1))
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_is_reused() {
        let (addr, accepted) = counting_upstream(true).await;
        let pool = upstream_pool(&addr);
        let shared = pool.connections_index();
        for _ in 0..3 {
            let body = get(&pool, "/").await.collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            assert_eq!(pool.connections[shared].idle_h1(0), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for all");
    }

    #[tokio::test]
    async fn a_body_dropped_unread_takes_its_connection_along() {
        let (addr, accepted) = counting_upstream(true).await;
        let pool = upstream_pool(&addr);
        let shared = pool.connections_index();
        let mut stalled = get(&pool, "/stall").await;
        let first = stalled.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"ab");
        drop(stalled);
        assert_eq!(pool.connections[shared].idle_h1(0), 0, "not reusable");
        let body = get(&pool, "/").await.collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_reused() {
        let (addr, accepted) = counting_upstream(false).await;
        let pool = upstream_pool(&addr);
        let shared = pool.connections_index();
        for i in 1..=3 {
            let body = get(&pool, "/").await.collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            // Until the connection's task has seen the server's close (it
            // may have before the body ended: then it was not put back).
            tokio::time::timeout(Duration::from_secs(10), async {
                while pool.connections[shared].idle_h1_open(0) > 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the server's close seen");
            assert_eq!(accepted.load(Ordering::SeqCst), i);
        }
    }
}
