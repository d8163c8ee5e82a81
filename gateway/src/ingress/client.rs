//! The ingress's connections to its upstream servers, kept alive and reused
//! as nginx's `keepalive` does: HTTP/1.1 on the gateway's own exchange
//! ([`super::h1`]), HTTP/2 on hyper's connection-level client.
//!
//! Each worker keeps its own idle connections per server (and one more set
//! serves every other thread), so a request and its upstream connection
//! stay on the worker that accepted the client: no pool shared between
//! threads, no lookup by authority per request.
//!
//! HTTP/1.1: a connection carries one request at a time, and no task of
//! its own: the request's task writes the request and reads the answer. It
//! goes back to its worker's idle list when the response body has been read
//! to its end (the body holds it until then); a body dropped early takes
//! the connection with it. Idle connections are taken newest first; one
//! idle longer than [`IDLE_TIMEOUT`], closed by the server, or with bytes
//! the server sent unasked is dropped when met, and at most [`MAX_IDLE`]
//! wait per server and worker.
//!
//! HTTP/2 (`grpc_pass`): one connection per server and worker carries every
//! stream, redialled once it closes.
//!
//! A kept-alive connection that took a request and then failed before
//! answering (the server closed or reset it: its idle timeout met the
//! request on the wire) costs the request only if it cannot be sent again:
//! a request without a body, or with one read whole ([`Outgoing::Whole`]),
//! whose method is not POST, PATCH or LOCK is sent again (its head as it
//! was written), once, on a new connection, as nginx
//! repeats a request whose cached connection failed
//! (`ngx_http_upstream_next`: `u->peer.cached` with
//! `NGX_HTTP_UPSTREAM_FT_ERROR` takes another try, and a request already
//! sent with a non-idempotent method is not repeated). nginx may walk
//! through its other cached connections first; the gateway does not, so a
//! request the server fails on (or closes the connection for) reaches it at
//! most twice, not once per idle connection. A new connection's failure is
//! the answer.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Method, Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::h1;
use super::upstream_tls::UpstreamTls;

pub(super) use super::h1::{BoxError, ReqBody, Timeouts};

/// Idle connections kept per upstream server and worker.
const MAX_IDLE: usize = 32;
/// How long an idle connection is reused: nginx's upstream
/// `keepalive_timeout` default.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// No connection to the server could be made (refused, unreachable,
    /// or not within the connect timeout): nothing was sent, and the
    /// request's body, not read from, comes back with the error.
    #[error("connecting: {error}")]
    Connect {
        #[source]
        error: BoxError,
        /// The connect timeout ran out (nginx's `timeout`, not `error`).
        timed_out: bool,
        body: Option<ReqBody>,
    },
    /// The request was handed to an HTTP/2 connection and no answer's
    /// head came within the read timeout (HTTP/1.1 says it in
    /// [`h1::Error::TimedOut`]).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// An HTTP/1.1 exchange failed after the request was handed over.
    #[error(transparent)]
    H1(#[from] h1::Error),
    /// An HTTP/2 exchange failed after the request was handed over.
    #[error(transparent)]
    H2(#[from] hyper::Error),
}

impl SendError {
    fn connect(error: impl Into<BoxError>, body: Option<ReqBody>) -> Self {
        Self::Connect {
            error: error.into(),
            timed_out: false,
            body,
        }
    }

    /// Nothing reached the server; another may be tried.
    pub(super) fn is_connect(&self) -> bool {
        matches!(self, Self::Connect { .. })
    }

    /// A timeout ended the attempt (connecting or waiting for the answer),
    /// not an error.
    pub(super) fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Connect { timed_out, .. } => *timed_out,
            Self::H1(e) => e.is_timeout(),
            Self::H2(_) => false,
        }
    }

    /// The error with `body` handed back in it, when no connection was
    /// made (any other error keeps none: the body went to the server).
    fn handing_back(mut self, body: Option<ReqBody>) -> Self {
        if let Self::Connect { body: slot, .. } = &mut self {
            *slot = body;
        }
        self
    }

    /// Whether the error hands a request's body back.
    pub(super) fn has_body(&self) -> bool {
        matches!(self, Self::Connect { body: Some(_), .. })
    }

    /// The body of a request that never reached the server, for the next.
    pub(super) fn take_body(&mut self) -> Option<ReqBody> {
        match self {
            Self::Connect { body, .. } => body.take(),
            _ => None,
        }
    }

    /// The request reached the server, whose connection then failed before
    /// answering (closed, reset): another server may be tried with a
    /// request that can be sent again ([`sendable_again`]).
    pub(super) fn is_connection_failure(&self) -> bool {
        matches!(self, Self::H1(e) if e.is_connection_failure())
    }
}

/// An upstream answer's body: off an HTTP/1.1 connection the gateway reads
/// itself, or an HTTP/2 stream.
pub(super) enum UpstreamBody {
    H1(h1::Answer),
    H2(Incoming),
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::H1(answer) => Pin::new(answer)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(Into::into))),
            Self::H2(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::H1(answer) => answer.is_end_stream(),
            Self::H2(incoming) => incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::H1(answer) => answer.size_hint(),
            Self::H2(incoming) => incoming.size_hint(),
        }
    }
}

/// A request's body as it goes to a server.
pub(super) enum Outgoing {
    /// Read whole before the request went (nginx's request buffering): it
    /// can be sent again.
    Whole(Bytes),
    /// Carried as it arrives: it goes once.
    Streamed(ReqBody),
}

impl Outgoing {
    /// The body to send once.
    fn into_body(self) -> ReqBody {
        match self {
            Self::Whole(bytes) => whole_body(bytes),
            Self::Streamed(body) => body,
        }
    }
}

/// How a pool reaches its servers.
pub(super) struct Dialer {
    h2: bool,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
}

impl Dialer {
    /// HTTP/2 with prior knowledge (or by ALPN over `tls`) when `h2`,
    /// HTTP/1.1 otherwise.
    pub(super) fn new(h2: bool, tls: Option<UpstreamTls>) -> Self {
        let tls = tls.map(|UpstreamTls { mut config, name }| {
            config.alpn_protocols = vec![if h2 { &b"h2"[..] } else { b"http/1.1" }.to_vec()];
            (tokio_rustls::TlsConnector::from(Arc::new(config)), name)
        });
        Self { h2, tls }
    }

    /// Whether the pool speaks HTTP/2.
    pub(super) fn is_h2(&self) -> bool {
        self.h2
    }

    /// Whether the pool speaks TLS.
    pub(super) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A new connection to `addr`, TLS on it when the pool speaks TLS,
    /// within `timeout` (nginx times the handshake under the same
    /// `proxy_connect_timeout`). The error is a [`SendError::Connect`]
    /// without a body.
    async fn dial(&self, addr: &str, timeout: Duration) -> Result<Box<dyn h1::Io>, SendError> {
        let dial = async {
            let tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            Ok::<Box<dyn h1::Io>, std::io::Error>(match &self.tls {
                None => Box::new(tcp),
                Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await?),
            })
        };
        match tokio::time::timeout(timeout, dial).await {
            Ok(Ok(io)) => Ok(io),
            Ok(Err(e)) => Err(SendError::connect(e, None)),
            Err(_) => Err(SendError::Connect {
                error: format!("no connection within {timeout:?}").into(),
                timed_out: true,
                body: None,
            }),
        }
    }

    /// A new HTTP/2 connection to `addr`, its task spawned.
    async fn dial_h2(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<http2::SendRequest<ReqBody>, SendError> {
        let io = TokioIo::new(self.dial(addr, timeout).await?);
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(io)
            .await
            .map_err(|e| SendError::connect(e, None))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(sender)
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("h2", &self.h2)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

/// One worker's connections to one server.
#[derive(Default)]
struct Idle {
    /// HTTP/1.1 connections between requests, oldest first, with when
    /// each was put back.
    h1: Vec<(h1::Conn, Instant)>,
    /// The HTTP/2 connection every stream shares.
    h2: Option<http2::SendRequest<ReqBody>>,
}

/// A worker's idle connections to each of a pool's servers.
pub(super) struct Connections {
    servers: Box<[Mutex<Idle>]>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("servers", &self.servers.len())
            .finish()
    }
}

impl Connections {
    /// Nothing kept yet for `servers` servers.
    pub(super) fn new(servers: usize) -> Self {
        Self {
            servers: (0..servers).map(|_| Mutex::default()).collect(),
        }
    }

    fn idle(&self, server: usize) -> std::sync::MutexGuard<'_, Idle> {
        self.servers[server]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The newest usable idle HTTP/1.1 connection to `server`.
    fn take_h1(&self, server: usize) -> Option<h1::Conn> {
        let mut idle = self.idle(server);
        let now = Instant::now();
        while let Some((mut conn, since)) = idle.h1.pop() {
            if now.duration_since(since) < IDLE_TIMEOUT && conn.is_usable() {
                return Some(conn);
            }
        }
        None
    }

    /// Puts an HTTP/1.1 connection whose exchange ended back for reuse.
    pub(super) fn put_h1(&self, server: usize, conn: h1::Conn) {
        let mut idle = self.idle(server);
        let now = Instant::now();
        // The oldest wait at the front: drop the stale there.
        let stale = idle
            .h1
            .iter()
            .take_while(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT)
            .count();
        idle.h1.drain(..stale);
        if idle.h1.len() < MAX_IDLE {
            idle.h1.push((conn, now));
        }
    }

    /// How many HTTP/1.1 connections to `server` wait idle.
    #[cfg(test)]
    pub(super) fn idle_h1(&self, server: usize) -> usize {
        self.idle(server).h1.len()
    }

    /// How many of them the server has not closed.
    #[cfg(test)]
    pub(super) fn idle_h1_open(&self, server: usize) -> usize {
        self.idle(server)
            .h1
            .iter_mut()
            .map(|(c, _)| c.is_usable())
            .filter(|&open| open)
            .count()
    }

    /// Sends `req` to server `server` at `addr`, on an idle connection or a
    /// new one, within `timeouts`. An HTTP/1.1 answer's body holds its
    /// connection, to be put back ([`Self::put_h1`],
    /// [`h1::Answer::reusable`]) once read. When no connection could be
    /// made the request's body comes back in the error
    /// ([`SendError::take_body`]).
    pub(super) async fn send(
        &self,
        dialer: &Dialer,
        server: usize,
        addr: &str,
        req: Request<Outgoing>,
        timeouts: Timeouts,
    ) -> Result<Response<UpstreamBody>, SendError> {
        if dialer.h2 {
            let req = req.map(Outgoing::into_body);
            return self.send_h2(dialer, server, addr, req, timeouts).await;
        }
        let (parts, body) = req.into_parts();
        let whole = match &body {
            Outgoing::Whole(bytes) => Some(bytes.clone()),
            Outgoing::Streamed(_) => None,
        };
        let body = body.into_body();
        let path = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let (head, out) = h1::encode_head(&parts.method, path, &parts.headers, &body)?;
        let repeatable = (out == h1::Out::None || whole.is_some()) && sendable_again(&parts.method);
        let head_request = parts.method == Method::HEAD;
        let mut body = Some(body);
        // Set once the request reached a kept-alive connection that failed
        // under it: it is sent again once, on a new connection, so a
        // request the server fails on reaches it at most twice whatever
        // the idle list holds.
        let mut sent_once = false;
        loop {
            let idle = if sent_once {
                None
            } else {
                self.take_h1(server)
            };
            let (conn, reused) = match idle {
                Some(conn) => (conn, true),
                // Boxed: dialling's state (a TLS handshake among it) would
                // otherwise make every request's future as large, and the
                // HTTP/2 front moves each request's future when it spawns it.
                None => match Box::pin(dialer.dial(addr, timeouts.connect)).await {
                    Ok(io) => (h1::Conn::from_io(io), false),
                    Err(e) => return Err(e.handing_back(body.take())),
                },
            };
            // Sent again: the body read whole once more, or none.
            let b = body
                .take()
                .or_else(|| whole.clone().map(whole_body))
                .unwrap_or_else(empty_body);
            match conn
                .exchange(head.clone(), out, b, head_request, timeouts)
                .await
            {
                Ok(resp) => return Ok(resp.map(UpstreamBody::H1)),
                Err(e) if reused && repeatable && e.is_connection_failure() => {
                    tracing::debug!(
                        upstream = addr,
                        error = %e,
                        "kept-alive upstream connection failed under a request; sending it again"
                    );
                    sent_once = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends `req` on the worker's HTTP/2 connection to `server`, dialling
    /// it when there is none (or it has closed).
    async fn send_h2(
        &self,
        dialer: &Dialer,
        server: usize,
        addr: &str,
        mut req: Request<ReqBody>,
        timeouts: Timeouts,
    ) -> Result<Response<UpstreamBody>, SendError> {
        loop {
            let shared = self.idle(server).h2.clone().filter(|s| !s.is_closed());
            let (mut sender, reused) = match shared {
                Some(sender) => (sender, true),
                None => match Box::pin(dialer.dial_h2(addr, timeouts.connect)).await {
                    Ok(sender) => {
                        self.idle(server).h2 = Some(sender.clone());
                        (sender, false)
                    }
                    Err(e) => return Err(e.handing_back(Some(req.into_body()))),
                },
            };
            let sent = async {
                if sender.ready().await.is_err() {
                    return Err(req);
                }
                Ok(sender.try_send_request(req).await)
            };
            let Ok(sent) = tokio::time::timeout(timeouts.read, sent).await else {
                return Err(SendError::Timeout(timeouts.read));
            };
            match sent {
                Ok(Ok(resp)) => return Ok(resp.map(UpstreamBody::H2)),
                Err(unsent) => {
                    self.idle(server).h2 = None;
                    if !reused {
                        let body = Some(unsent.into_body());
                        return Err(SendError::connect("connection closed at once", body));
                    }
                    req = unsent;
                }
                Ok(Err(mut e)) => match e.take_message() {
                    // Not sent: the connection had closed under it.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }
}

/// Whether a request already sent may be sent again: not with a method
/// nginx counts as non-idempotent (POST, PATCH, LOCK).
pub(super) fn sendable_again(method: &Method) -> bool {
    !(*method == Method::POST || *method == Method::PATCH || method.as_str() == "LOCK")
}

/// A body read whole, as the exchange takes one.
fn whole_body(bytes: Bytes) -> ReqBody {
    use http_body_util::BodyExt as _;
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The body of a request without one (or sent again: it had none); boxing
/// it allocates nothing.
pub(super) fn empty_body() -> ReqBody {
    use http_body_util::BodyExt as _;
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}
