//! The Kubernetes API facade: plain HTTP/1.1 and HTTP/2 on loopback, one base
//! path per account (`/accounts/<name>/...`) plus the accounts API
//! (`/v1/accounts`). A request is answered, in this order, from the
//! discovery snapshot ([`read::discovery`]), from the cache
//! ([`route::from_cache`], [`read::resource`]), or relayed live to the agent
//! ([`relay`]). Every error is a `metav1.Status` from `spinlink-kube-api`, answered
//! by [`body::status`].

pub mod body;
pub mod read;
pub mod relay;
pub mod route;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accounts::{self, Accounts};
use body::Body;
use route::{Query, ResourcePath};
use spinlink_kube_api::Status;

/// How long open connections may finish after shutdown before they are cut.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// What every facade request needs.
#[derive(Debug, Clone)]
pub struct Facade {
    accounts: Accounts,
    relay_timeout: Duration,
}

impl Facade {
    /// A facade over `accounts`; relayed requests wait `relay_timeout` for
    /// the agent's response head.
    pub fn new(accounts: Accounts, relay_timeout: Duration) -> Self {
        Self {
            accounts,
            relay_timeout,
        }
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Send,
    {
        let path = req.uri().path().to_owned();
        if path == accounts::api::PREFIX || path.starts_with("/v1/accounts/") {
            return accounts::api::handle(&self.accounts, req.method(), &path);
        }
        let Some((name, k8s_path)) = route::split_account(&path) else {
            return body::status(&Status::not_found_message(format!(
                "the server could not find the requested resource ({path}); use /accounts/<name>/..."
            )));
        };
        let Some(account) = self.accounts.get(&name) else {
            return body::status(&Status::not_found_message(format!(
                "account \"{name}\" not found"
            )));
        };
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if req.method() == Method::GET {
            if let Some(resp) = read::discovery(&account, &k8s_path, &accept) {
                return resp;
            }
            if let Some(rp) = ResourcePath::parse(&k8s_path) {
                let query = Query::parse(req.uri().query());
                if route::from_cache(req.method(), &rp, &query, req.headers())
                    && let Some(resp) = read::resource(&account, &rp, &query, &accept)
                {
                    return resp;
                }
            }
        }
        relay::relay(account, req, k8s_path, self.relay_timeout).await
    }
}

/// Serves the facade on `listener` until `shutdown`, then lets open
/// connections finish for [`DEFAULT_DRAIN_GRACE`].
pub async fn serve(listener: TcpListener, facade: Facade, shutdown: CancellationToken) {
    let facade = Arc::new(facade);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "facade accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let facade = facade.clone();
        let stop = shutdown.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let facade = facade.clone();
                async move { Ok::<_, Infallible>(facade.handle(req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    match tokio::time::timeout(DEFAULT_DRAIN_GRACE, conn.as_mut()).await {
                        Ok(r) => r,
                        Err(_) => Ok(()),
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "facade connection ended with an error");
            }
        });
    }
    // Each connection task bounds its own drain.
    while conns.join_next().await.is_some() {}
}
