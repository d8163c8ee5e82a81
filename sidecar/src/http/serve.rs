//! Serving HTTP/1.1 and HTTP/2 on a listener with a drain: the facade
//! port, the metrics listener and the peer port all run on [`serve_with`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::body::Body;

/// Serves HTTP/1.1 and h2c on `listener` with `handle` until `shutdown`, as
/// [`serve_with`] says.
pub async fn serve_http<F, Fut>(
    listener: TcpListener,
    what: &'static str,
    handle: F,
    shutdown: CancellationToken,
    grace: Duration,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    serve_with(
        listener,
        what,
        move |tcp, _| {
            let handle = handle.clone();
            async move { Some((tcp, handle)) }
        },
        shutdown,
        grace,
    )
    .await;
}

/// Serves HTTP/1.1 and HTTP/2 on `listener` until `shutdown`; then refuses
/// new connections at once (rather than leave them queued in the backlog
/// until the process exits, so a load balancer or Service sends them to
/// another instance) and gives each open one `grace` to finish. `accept`
/// turns each connection (TCP_NODELAY set) into the stream to speak HTTP on
/// and the handler of its requests — a TLS handshake and the peer it
/// names, on the peer port — or refuses it (`None`); it runs in the
/// connection's own task, so a slow handshake holds no other up. `what`
/// names the listener in logs.
pub async fn serve_with<A, AFut, Io, F, Fut>(
    listener: TcpListener,
    what: &'static str,
    accept: A,
    shutdown: CancellationToken,
    grace: Duration,
) where
    A: Fn(tokio::net::TcpStream, std::net::SocketAddr) -> AFut + Send + 'static,
    AFut: std::future::Future<Output = Option<(Io, F)>> + Send + 'static,
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(listener = what, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let accepted = accept(tcp, peer);
        let stop = shutdown.clone();
        conns.spawn(async move {
            let Some((io, handle)) = accepted.await else {
                return;
            };
            let handle = Arc::new(handle);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    match tokio::time::timeout(grace, conn.as_mut()).await {
                        Ok(r) => r,
                        Err(_) => Ok(()),
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(listener = what, %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Each connection task bounds its own drain.
    while conns.join_next().await.is_some() {}
}
