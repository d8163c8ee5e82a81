//! The ingress's connections to its upstream servers, kept alive and reused
//! as nginx's `keepalive` does, on hyper's connection-level client.
//!
//! Each worker keeps its own idle connections per server (and one more set
//! serves every other thread), so a request, its upstream connection and
//! that connection's task all run on the worker that accepted the client:
//! no pool shared between threads, no lookup by authority per request.
//!
//! HTTP/1.1: a connection carries one request at a time. It goes back to
//! its worker's idle list when the response body has been read to its end
//! (the proxy's lease on it is dropped with the body); a body dropped early
//! takes the connection with it (hyper closes it). Idle connections are
//! taken newest first; one idle longer than [`IDLE_TIMEOUT`] or closed by
//! the server is dropped, and at most [`MAX_IDLE`] wait per server and
//! worker.
//!
//! HTTP/2 (`grpc_pass`): one connection per server and worker carries every
//! stream, redialled once it closes.
//!
//! A reused connection can turn out closed only when the request is handed
//! to it; hyper gives an unsent request back, and it goes to the next idle
//! connection or a new one. One that took the request and then failed
//! before answering (the server closed or reset it: its idle timeout met
//! the request on the wire) costs the request only if it cannot be sent
//! again: a request without a body whose method is not POST, PATCH or LOCK
//! is sent again, once, on a new connection, as nginx repeats a request
//! whose cached connection failed (`ngx_http_upstream_next`:
//! `u->peer.cached` with `NGX_HTTP_UPSTREAM_FT_ERROR` takes another try,
//! and a request already sent with a non-idempotent method is not
//! repeated). nginx may walk through its other cached connections first;
//! the gateway does not, so a request the server fails on (or closes the
//! connection for) reaches it at most twice, not once per idle connection.
//! A new connection's failure is the answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::upstream_tls::UpstreamTls;

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a request to an upstream carries.
pub(super) type ReqBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

/// Idle connections kept per upstream server and worker.
const MAX_IDLE: usize = 32;
/// How long an idle connection is reused: nginx's upstream
/// `keepalive_timeout` default.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's `proxy_connect_timeout` default.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// No connection to the server could be made: nothing was sent.
    #[error("connecting: {0}")]
    Connect(#[source] BoxError),
    /// The exchange failed after the request was handed over.
    #[error(transparent)]
    Request(#[from] hyper::Error),
}

impl SendError {
    /// Nothing reached the server; another may be tried.
    pub(super) fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
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

    async fn dial(&self, addr: &str) -> Result<Sender, SendError> {
        let connect = |e: std::io::Error| SendError::Connect(e.into());
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| SendError::Connect("timed out".into()))?
            .map_err(connect)?;
        tcp.set_nodelay(true).map_err(connect)?;
        match &self.tls {
            None => self.handshake(tcp).await,
            Some((connector, name)) => {
                let tls =
                    tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), tcp))
                        .await
                        .map_err(|_| SendError::Connect("TLS handshake timed out".into()))?
                        .map_err(connect)?;
                self.handshake(tls).await
            }
        }
    }

    async fn handshake<I>(&self, io: I) -> Result<Sender, SendError>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if self.h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .handshake(io)
                .await
                .map_err(|e| SendError::Connect(e.into()))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            });
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) = http1::handshake(io)
                .await
                .map_err(|e| SendError::Connect(e.into()))?;
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            });
            Ok(Sender::H1(sender))
        }
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

enum Sender {
    H1(http1::SendRequest<ReqBody>),
    H2(http2::SendRequest<ReqBody>),
}

/// One worker's connections to one server.
#[derive(Debug, Default)]
struct Idle {
    /// HTTP/1.1 connections between requests, oldest first, with when
    /// each was put back.
    h1: Vec<(http1::SendRequest<ReqBody>, Instant)>,
    /// The HTTP/2 connection every stream shares.
    h2: Option<http2::SendRequest<ReqBody>>,
}

/// A worker's idle connections to each of a pool's servers.
#[derive(Debug)]
pub(super) struct Connections {
    servers: Box<[Mutex<Idle>]>,
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

    /// The newest reusable idle HTTP/1.1 connection to `server`.
    fn take_h1(&self, server: usize) -> Option<http1::SendRequest<ReqBody>> {
        let mut idle = self.idle(server);
        let now = Instant::now();
        while let Some((sender, since)) = idle.h1.pop() {
            if !sender.is_closed() && now.duration_since(since) < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    /// Puts an HTTP/1.1 connection whose exchange ended back for reuse.
    pub(super) fn put_h1(&self, server: usize, sender: http1::SendRequest<ReqBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle(server);
        let now = Instant::now();
        // The oldest wait at the front: drop the stale and the closed there.
        let stale = idle
            .h1
            .iter()
            .take_while(|(s, since)| s.is_closed() || now.duration_since(*since) >= IDLE_TIMEOUT)
            .count();
        idle.h1.drain(..stale);
        if idle.h1.len() < MAX_IDLE {
            idle.h1.push((sender, now));
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
            .iter()
            .filter(|(s, _)| !s.is_closed())
            .count()
    }

    /// Sends `req` to server `server` at `addr`, on an idle connection or a
    /// new one. An HTTP/1.1 answer comes with its connection, to be put back
    /// ([`Self::put_h1`]) once its body has been read.
    pub(super) async fn send(
        &self,
        dialer: &Dialer,
        server: usize,
        addr: &str,
        mut req: Request<ReqBody>,
    ) -> Result<(Response<Incoming>, Option<http1::SendRequest<ReqBody>>), SendError> {
        // Set once the request reached a kept-alive connection that failed
        // under it: it is sent again once, on a new connection, so a
        // request the server fails on reaches it at most twice whatever
        // the idle list holds.
        let mut sent_once = false;
        loop {
            let reused = if dialer.h2 {
                let shared = self.idle(server).h2.clone().filter(|s| !s.is_closed());
                shared.map(Sender::H2)
            } else if sent_once {
                None
            } else {
                self.take_h1(server).map(Sender::H1)
            };
            let (sender, reused) = match reused {
                Some(sender) => (sender, true),
                // Boxed: dialling's state (a TLS handshake among it) would
                // otherwise make every request's future as large, and the
                // HTTP/2 front moves each request's future when it spawns it.
                None => (Box::pin(dialer.dial(addr)).await?, false),
            };
            // What is sent again should this kept-alive connection fail
            // under the request.
            let mut again = None;
            let attempt = match sender {
                Sender::H1(mut sender) => {
                    if sender.ready().await.is_err() {
                        if reused {
                            continue;
                        }
                        return Err(SendError::Connect("connection closed at once".into()));
                    }
                    if reused {
                        again = repeatable(&req);
                    }
                    sender
                        .try_send_request(req)
                        .await
                        .map(|resp| (resp, Some(sender)))
                }
                Sender::H2(mut sender) => {
                    if !reused {
                        self.idle(server).h2 = Some(sender.clone());
                    }
                    if sender.ready().await.is_err() {
                        self.idle(server).h2 = None;
                        if reused {
                            continue;
                        }
                        return Err(SendError::Connect("connection closed at once".into()));
                    }
                    sender.try_send_request(req).await.map(|resp| (resp, None))
                }
            };
            match attempt {
                Ok(answer) => return Ok(answer),
                Err(mut e) => match (e.take_message(), again) {
                    // Not sent: the connection had closed under it.
                    (Some(unsent), _) if reused => req = unsent,
                    (None, Some(head)) if connection_failed(e.error()) => {
                        tracing::debug!(
                            upstream = addr,
                            error = %e.error(),
                            "kept-alive upstream connection failed under a request; sending it again"
                        );
                        req = head.map(|()| empty_body());
                        sent_once = true;
                    }
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }
}

/// A copy of `req` to send again if its connection fails before answering,
/// when it can be sent again: no body, and not a method nginx counts as
/// non-idempotent (POST, PATCH, LOCK).
fn repeatable(req: &Request<ReqBody>) -> Option<Request<()>> {
    let method = req.method();
    if *method == Method::POST
        || *method == Method::PATCH
        || method.as_str() == "LOCK"
        || !req.body().is_end_stream()
    {
        return None;
    }
    let mut head = Request::new(());
    *head.method_mut() = method.clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    Some(head)
}

/// Whether `e` says the connection failed (closed before the answer came,
/// reset, or any other I/O error), not that the answer was unreadable.
fn connection_failed(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The body of a request sent again: it had none.
fn empty_body() -> ReqBody {
    use http_body_util::BodyExt as _;
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}
