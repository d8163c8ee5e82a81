//! The HTTP side: a listener serving HTTP/1.1 and HTTP/2 (optionally over TLS) on one
//! port. Requests flow `Server::run` → connection → [`router`] (path → discovery,
//! OpenAPI or resource handlers) → [`watch`] for streaming watches.

mod authz;
mod custom_table;
pub(crate) mod discovery;
pub use discovery::derived_group_version;
pub mod logs;
mod router;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{Error, Result};
use crate::store::Sim;

/// How long `run` waits for open connections to finish after shutdown.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Concurrent HTTP/2 streams a client may open on one connection, as the
/// real API server allows (`--http2-max-streams-per-connection`, 100 since
/// the 2023 rapid-reset fixes): a client with more watches than this needs
/// a second connection, or waits.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// What the server offers by ALPN when its TLS configuration names nothing:
/// HTTP/2 first, then HTTP/1.1, as the real API server (Go's `net/http`).
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The connections a [`Server`] has open now (tests compare it with what a
/// client believes it holds).
#[derive(Debug, Clone, Default)]
pub struct OpenConnections(Arc<std::sync::atomic::AtomicUsize>);

impl OpenConnections {
    /// Connections accepted and not yet closed.
    pub fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn open(&self) -> OpenGuard {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        OpenGuard(self.clone())
    }
}

/// Counts one connection open until dropped.
struct OpenGuard(OpenConnections);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        (self.0)
            .0
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A bound kube-sim API server.
pub struct Server {
    sim: Sim,
    listener: TcpListener,
    local_addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    open: OpenConnections,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `addr` (port 0 picks one); TLS when a rustls config is given,
    /// offering [`ALPN`] unless the config names its own protocols.
    pub async fn bind(
        sim: Sim,
        addr: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let tls = tls.map(|config| {
            if config.alpn_protocols.is_empty() {
                let mut config = (*config).clone();
                config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
                Arc::new(config)
            } else {
                config
            }
        });
        Ok(Server {
            sim,
            listener,
            local_addr,
            tls: tls.map(tokio_rustls::TlsAcceptor::from),
            open: OpenConnections::default(),
        })
    }

    /// The connections open now, counted from here on.
    pub fn open_connections(&self) -> OpenConnections {
        self.open.clone()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://127.0.0.1:PORT` or `https://...`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Serves, with the simulated kubelet ([`Sim::run_kubelet`]), until `shutdown` is
    /// cancelled: then stops accepting, ends watches and waits (at most
    /// [`DEFAULT_DRAIN_GRACE`]) for connections to close.
    pub async fn run(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let tracker = TaskTracker::new();
        // The kubelet finishes what graceful pod deletions start.
        tracker.spawn(self.sim.clone().run_kubelet(shutdown.clone()));
        let ctx = Arc::new(router::Ctx {
            sim: self.sim.clone(),
            shutdown: shutdown.clone(),
        });
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Per-connection accept errors (e.g. the peer reset) must not stop the server.
                        tracing::debug!(error = %e, "accept failed");
                        continue;
                    }
                },
            };
            let ctx = ctx.clone();
            let tls = self.tls.clone();
            let shutdown = shutdown.clone();
            let open = self.open.open();
            tracker.spawn(async move {
                let _open = open;
                if let Err(e) = serve_connection(stream, tls, ctx, shutdown).await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
        tracker.close();
        let _ = tokio::time::timeout(DEFAULT_DRAIN_GRACE, tracker.wait()).await;
        Ok(())
    }
}

async fn serve_connection(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    ctx: Arc<router::Ctx>,
    shutdown: CancellationToken,
) -> Result<()> {
    stream.set_nodelay(true).map_err(Error::Serve)?;
    match tls {
        Some(acceptor) => {
            let stream = acceptor.accept(stream).await.map_err(Error::Handshake)?;
            serve_io(TokioIo::new(stream), ctx, shutdown).await
        }
        None => serve_io(TokioIo::new(stream), ctx, shutdown).await,
    }
}

async fn serve_io<I>(io: I, ctx: Arc<router::Ctx>, shutdown: CancellationToken) -> Result<()>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, std::convert::Infallible>(router::handle(ctx, req).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    result.map_err(|e| Error::Serve(std::io::Error::other(e)))
}
