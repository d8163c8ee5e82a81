//! The Kubernetes API facade: plain HTTP/1.1 and HTTP/2 on loopback, one base
//! path per account (`/accounts/<name>/...`) plus the accounts API
//! (`/v1/accounts`). A request is answered, in this order, from the
//! discovery snapshot ([`read::discovery`]), from the cache
//! ([`route::from_cache`], [`read::resource`]; watches [`watch::serve`]), or
//! relayed live to the agent ([`relay`]). Every error is a `metav1.Status`
//! from `spinlink-kube-api`, answered by [`body::status`].
//!
//! While an account is stale (its agent went away, the grace period runs),
//! reads the cache can answer are served with a `Warning` header saying how
//! stale they are, and everything that would go to the agent gets a 503
//! Status. A removed account is not found. `/metrics` serves the sidecar's
//! Prometheus metrics.

pub mod body;
pub mod read;
pub mod relay;
pub mod route;
pub mod watch;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accounts::{self, Account, Accounts, Presence};
use crate::metrics::{self, Metrics, Source};
use crate::ownership::{self, Ownership};
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
    metrics: Metrics,
    ownership: Option<Arc<Ownership>>,
    watch: watch::Settings,
}

impl Facade {
    /// A facade over `accounts`; relayed requests wait `relay_timeout` for
    /// the agent's response head.
    pub fn new(accounts: Accounts, relay_timeout: Duration) -> Self {
        Self {
            accounts,
            relay_timeout,
            metrics: Metrics::default(),
            ownership: None,
            watch: watch::Settings::default(),
        }
    }

    /// Ends the watches served from the cache when `shutdown` fires.
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.watch.shutdown = shutdown;
        self
    }

    /// Sends bookmarks on cache-served watches every `interval` (default
    /// [`watch::DEFAULT_BOOKMARK_INTERVAL`]).
    #[must_use]
    pub fn with_bookmark_interval(mut self, interval: Duration) -> Self {
        self.watch.bookmark_interval = interval;
        self
    }

    /// Forwards requests for accounts other sidecars own (see
    /// [`crate::ownership`]).
    #[must_use]
    pub fn with_ownership(mut self, ownership: Arc<Ownership>) -> Self {
        self.ownership = Some(ownership);
        self
    }

    /// Counts requests in `metrics` (and serves them at `/metrics`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.watch.metrics = metrics.clone();
        self.metrics = metrics;
        self
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Send,
    {
        let path = req.uri().path().to_owned();
        if path == "/metrics" && req.method() == Method::GET {
            return body::text(self.metrics.render(&self.accounts));
        }
        if accounts::api::owns(&path) {
            return accounts::api::handle(&self.accounts, req.method(), &path);
        }
        let Some((name, k8s_path)) = route::split_account(&path) else {
            return body::status(&Status::not_found_message(format!(
                "the server could not find the requested resource ({path}); use /accounts/<name>/..."
            )));
        };
        let local = self
            .accounts
            .get(&name)
            .filter(|a| a.presence() != Presence::Removed);
        let forwarded = req.headers().contains_key(ownership::FORWARDED_HEADER);
        // Not served here right now: another sidecar may own it (one hop only).
        if local
            .as_ref()
            .is_none_or(|a| a.presence() != Presence::Online)
            && let Some(own) = &self.ownership
            && let Some(owner) = own.owner(&name).await
        {
            if forwarded {
                return ownership::retryable(format!(
                    "account \"{name}\" is owned by sidecar {}, not this one; retry",
                    owner.instance
                ));
            }
            self.metrics.request(&name, "forward", Source::Relay);
            return own.forward(&owner, req).await;
        }
        let Some(account) = local else {
            if forwarded {
                return ownership::retryable(format!(
                    "account \"{name}\" is not served by this sidecar (its owner moved); retry"
                ));
            }
            // Between owners (one drained or died, its agent is reconnecting
            // to another): the account exists, so "not found" would be a lie
            // clients act on.
            if let Some(own) = &self.ownership
                && own.recently_served(&name).await
            {
                return ownership::retryable(format!(
                    "account \"{name}\" is moving between sidecars; retry"
                ));
            }
            return body::status(&Status::not_found_message(format!(
                "account \"{name}\" not found"
            )));
        };
        let stale = account.presence() == Presence::Stale;
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let rp = ResourcePath::parse(&k8s_path);
        let verb = metrics::verb(
            req.method(),
            rp.as_ref().is_some_and(|p| p.name.is_some()),
            Query::parse(req.uri().query())
                .get("watch")
                .is_some_and(|w| w == "true" || w == "1"),
        );
        if req.method() == Method::GET {
            let cached = read::discovery(&account, &k8s_path, &accept).or_else(|| {
                let rp = rp.as_ref()?;
                let query = Query::parse(req.uri().query());
                if route::watch_from_cache(req.method(), rp, &query) {
                    watch::serve(&account, rp, &query, &accept, &self.watch)
                } else if route::from_cache(req.method(), rp, &query, req.headers()) {
                    read::resource(&account, rp, &query, &accept)
                } else {
                    None
                }
            });
            if let Some(mut resp) = cached {
                self.metrics.request(&name, verb, Source::Cache);
                if stale {
                    warn_stale(&account, &mut resp);
                }
                return resp;
            }
        }
        if stale {
            self.metrics.request(&name, verb, Source::Refused);
            let offline = accounts::age_seconds(account.offline_since());
            let status = Status::new(
                503,
                "ServiceUnavailable",
                format!(
                    "account \"{name}\" is offline (its agent disconnected {offline}s ago); \
                     only reads from its cache are served until it reconnects"
                ),
            );
            relay::record_refusal(&account, &req, &k8s_path, &status);
            // Its agent is expected back (within the grace period): clients
            // retry rather than fail.
            let mut resp = body::status(&status);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return resp;
        }
        self.metrics.request(&name, verb, Source::Relay);
        let started = std::time::Instant::now();
        let resp = relay::relay(account, req, k8s_path, self.relay_timeout).await;
        self.metrics
            .relay_latency(&name, started.elapsed().as_secs_f64());
        resp
    }
}

/// The `Warning` header of an answer from a stale account's cache. kubectl
/// prints warnings with code 299 to its stderr.
fn warn_stale(account: &Account, resp: &mut Response<Body>) {
    let offline = accounts::age_seconds(account.offline_since());
    let text = format!(
        "299 - \"spinlink: account {} is offline; this answer is from a cache {offline}s old\"",
        account.name()
    );
    if let Ok(v) = header::HeaderValue::from_str(&text) {
        resp.headers_mut().append(header::WARNING, v);
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
    // Refuse new connections at once rather than leave them queued in the
    // backlog until the process exits (a load balancer or Service then
    // sends them to another instance).
    drop(listener);
    // Each connection task bounds its own drain.
    while conns.join_next().await.is_some() {}
}
