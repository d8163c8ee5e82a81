//! The agent listener: TCP (TCP_NODELAY) → mTLS (a client certificate from the
//! configured CA bundle is required) → an HTTP/2 server per connection. After
//! the handshake each connection is named — the identity from its leaf
//! certificate and the binding from the TLS exporter — and every request on
//! it goes to [`crate::tunnel::handle`] with that name.
//!
//! On shutdown the listener stops accepting, asks each connection to finish
//! (HTTP/2 GOAWAY; in-flight streams go on), and closes whatever is still
//! open when the grace period ends.

pub mod cidr;
pub mod limits;
pub mod proxy_protocol;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use spinlink_tls::binding::{ConnectionBinding, connection_binding};
use spinlink_tls::identity::{IdentitySource, identity_from_cert};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::Counter;
use crate::tunnel::{self, ConnPeer, Shared};

/// How long a TLS handshake may take before the connection is dropped.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of HTTP/2 PINGs to agents; well inside load balancers' idle cuts
/// (AWS NLB: 350 s).
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Streams one agent connection may have open at once (two per account).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 4096;
/// Pause after a failed `accept` (e.g. out of file descriptors) before the
/// next, so the loop does not spin.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The bound agent listener.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    sources: Arc<[IdentitySource]>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.tcp.local_addr().ok())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener on `tcp`; `tls` is `None` only for the insecure (h2c)
    /// development listener.
    pub fn new(
        tcp: TcpListener,
        tls: Option<TlsAcceptor>,
        sources: Vec<IdentitySource>,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            tcp,
            tls,
            sources: sources.into(),
            shared,
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts connections until `shutdown`, then gives open connections
    /// `grace` to finish.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let connections = TaskTracker::new();
        // Cancelled when the grace period is over: connections still open close.
        let hard = CancellationToken::new();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.tcp.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            };
            self.shared.stats.incr(Counter::ConnectionsAccepted);
            let conn = Connection {
                tls: self.tls.clone(),
                sources: self.sources.clone(),
                shared: self.shared.clone(),
                remote,
                shutdown: shutdown.clone(),
                hard: hard.clone(),
            };
            connections.spawn(conn.serve(stream));
        }
        drop(self.tcp);
        connections.close();
        tracing::info!(
            open = connections.len(),
            "listener stopped; draining connections"
        );
        if tokio::time::timeout(grace, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = connections.len(),
                "shutdown grace period over; closing remaining connections"
            );
            hard.cancel();
            connections.wait().await;
        }
    }
}

struct Connection {
    tls: Option<TlsAcceptor>,
    sources: Arc<[IdentitySource]>,
    shared: Arc<Shared>,
    remote: SocketAddr,
    shutdown: CancellationToken,
    hard: CancellationToken,
}

impl Connection {
    async fn serve(self, stream: TcpStream) {
        let remote = self.remote;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "setting TCP_NODELAY failed");
        }
        let Some(acceptor) = self.tls.clone() else {
            // Insecure listener: no TLS exporter, so a random value stands in
            // for the binding; tokens stay tied to this connection.
            let peer = ConnPeer {
                identity: None,
                binding: ConnectionBinding(rand::random()),
                remote,
            };
            return self.serve_h2(stream, peer).await;
        };
        let tls =
            match tokio::time::timeout(DEFAULT_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    self.shared.stats.incr(Counter::HandshakeFailures);
                    tracing::warn!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    self.shared.stats.incr(Counter::HandshakeFailures);
                    tracing::warn!(%remote, "TLS handshake timed out");
                    return;
                }
            };
        let (_, server) = tls.get_ref();
        let identity = match server.peer_certificates().and_then(|certs| certs.first()) {
            Some(leaf) => identity_from_cert(leaf, &self.sources),
            None => Ok(None),
        };
        let identity = match identity {
            Ok(Some(identity)) => identity,
            Ok(None) => {
                self.shared.stats.incr(Counter::ConnectionsWithoutIdentity);
                tracing::warn!(%remote, "client certificate names no identity; closing");
                return;
            }
            Err(e) => {
                self.shared.stats.incr(Counter::ConnectionsWithoutIdentity);
                tracing::warn!(%remote, error = %e, "client certificate unreadable; closing");
                return;
            }
        };
        let binding = match connection_binding(&**server) {
            Ok(binding) => binding,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "no connection binding; closing");
                return;
            }
        };
        tracing::debug!(%remote, identity, "agent connected");
        let peer = ConnPeer {
            identity: Some(identity.into()),
            binding,
            remote,
        };
        self.serve_h2(tls, peer).await;
    }

    async fn serve_h2<I>(self, io: I, peer: ConnPeer)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let remote = peer.remote;
        let shared = self.shared.clone();
        let peer = Arc::new(peer);
        let service = hyper::service::service_fn(move |req| {
            let shared = shared.clone();
            let peer = peer.clone();
            async move { Ok::<_, std::convert::Infallible>(tunnel::handle(shared, &peer, req).await) }
        });
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(DEFAULT_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(DEFAULT_KEEPALIVE_TIMEOUT)
            .max_concurrent_streams(DEFAULT_MAX_CONCURRENT_STREAMS);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let mut conn = std::pin::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = self.shutdown.cancelled() => {
                // GOAWAY: no new streams, the open ones run on.
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    result = conn.as_mut() => result,
                    () = self.hard.cancelled() => Ok(()),
                }
            }
        };
        match result {
            Ok(()) => tracing::debug!(%remote, "agent connection closed"),
            Err(e) => tracing::info!(%remote, error = %e, "agent connection ended"),
        }
    }
}
