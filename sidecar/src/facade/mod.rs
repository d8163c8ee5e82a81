//! The Kubernetes API facade: plain HTTP/1.1 and HTTP/2 on loopback, one base
//! path per account (`/accounts/<name>/...`) plus the REST APIs of
//! [`crate::api`] (`/v1/accounts`, `/armory/…`), which it routes to. A request is answered, in this order, from the
//! discovery snapshot ([`read::discovery`]), from the OpenAPI documents
//! fetched through earlier ([`openapi`]), from the cache
//! ([`route::from_cache`], [`read::resource`]; watches [`watch::serve`]) when
//! it holds the whole answer and the account's identity may read it
//! ([`authz`]), or relayed live to the agent ([`relay`]); a relayed OpenAPI
//! `200` is kept.
//! Every error is a `metav1.Status` from `spinlink-kube-api`, answered by
//! [`crate::http::body::status`].
//!
//! While an account is stale (its agent went away, the grace period runs),
//! reads the cache can answer are served with a `Warning` header saying how
//! stale they are, and everything that would go to the agent gets a 503
//! Status. A removed account is not found. `/metrics` serves the sidecar's
//! Prometheus metrics.

pub mod authz;
pub mod openapi;
pub mod printer;
pub mod read;
pub mod relay;
pub mod route;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, header};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accounts::{self, Account, Accounts, Presence};
use crate::http::body::{self, Body};
use crate::metrics::{self, Metrics, Source};
use crate::ownership::{self, Ownership};
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
    /// OpenAPI documents fetched through, shared by every account.
    openapi: Arc<openapi::OpenApiCache>,
    /// Dynamic accounts (`POST`/`DELETE /v1/accounts`…), when served.
    dynamic: Option<Arc<crate::dynamic::Dynamic>>,
    /// Armory's accounts API (`/armory/...`) over the same dynamic accounts.
    armory: Option<Arc<crate::api::armory::Armory>>,
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
            dynamic: None,
            armory: None,
            watch: watch::Settings::default(),
            openapi: Arc::new(openapi::OpenApiCache::new(
                usize::try_from(crate::config::DEFAULT_OPENAPI_CACHE_BYTES).unwrap_or(usize::MAX),
            )),
        }
    }

    /// Keeps at most `bytes` of OpenAPI documents (default
    /// [`crate::config::DEFAULT_OPENAPI_CACHE_BYTES`]; 0 relays every one).
    #[must_use]
    pub fn with_openapi_cache_bytes(mut self, bytes: usize) -> Self {
        self.openapi = Arc::new(openapi::OpenApiCache::new(bytes));
        self
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

    /// Serves the dynamic accounts API, and Armory's accounts API over it,
    /// from `dynamic`.
    #[must_use]
    pub fn with_dynamic(mut self, dynamic: Arc<crate::dynamic::Dynamic>) -> Self {
        self.armory = Some(Arc::new(crate::api::armory::Armory::new(dynamic.clone())));
        self.dynamic = Some(dynamic);
        self
    }

    /// Counts requests in `metrics` (and serves them at `/metrics`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.watch.metrics = metrics.clone();
        self.metrics = metrics;
        self
    }

    /// Answers one request. An answer that says nothing of caching says
    /// `Cache-Control: no-cache, private`, as every kube-apiserver answer
    /// does (its `WithCacheControl` filter; the recorded answers in
    /// `kube-sim/fixtures` carry it, a `429` with `Retry-After` too): a
    /// client's HTTP cache must ask again before it uses one. kubectl's
    /// version dispatcher asks `/version` with `Cache-Control:
    /// max-age=7200` through its disk cache, so without it a 503 answered
    /// while an account moved between sidecars was taken from the cache for
    /// two hours, each command waiting out the dispatcher's 5 s first.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Send,
    {
        let mut resp = self.answer(req).await;
        resp.headers_mut().entry(header::CACHE_CONTROL).or_insert(
            header::HeaderValue::from_static(spinlink_kube_api::NO_CACHE),
        );
        resp
    }

    async fn answer<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Send,
    {
        let path = req.uri().path().to_owned();
        if path == "/metrics" && req.method() == Method::GET {
            // The gauge shows live documents only.
            self.openapi.sweep(|name| {
                let account = self.accounts.get(name)?;
                (account.presence() != Presence::Removed)
                    .then(|| account.read_cache().discovery_digest())
            });
            self.metrics
                .openapi_cache(self.openapi.bytes(), self.openapi.documents());
            return body::text(self.metrics.render(&self.accounts.gauges()));
        }
        if let Some(armory) = &self.armory
            && crate::api::armory::serves(req.method(), &path)
        {
            return crate::api::armory::handle(armory, self.ownership.as_deref(), req).await;
        }
        if let Some(dynamic) = &self.dynamic
            && crate::api::dynamic::serves(req.method(), &path)
        {
            return crate::api::dynamic::handle(dynamic, req).await;
        }
        if crate::api::accounts::owns(&path) {
            return crate::api::accounts::handle(&self.accounts, req.method(), &path).await;
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
            // A deleted dynamic account is gone, not moving.
            let deleted = match &self.dynamic {
                Some(dynamic) => dynamic.deleted(&name).await,
                None => false,
            };
            if !deleted
                && let Some(own) = &self.ownership
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
        // Answered as the API server would, before the cache or a relay.
        if let Some(refusal) = spinlink_kube_api::media::refusal(&k8s_path, &accept) {
            return body::status(&refusal);
        }
        let rp = ResourcePath::parse(&k8s_path);
        let verb = if openapi::is_openapi(&k8s_path) {
            "openapi"
        } else {
            metrics::verb(
                req.method(),
                rp.as_ref().is_some_and(|p| p.name.is_some()),
                Query::parse(req.uri().query())
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1"),
            )
        };
        let openapi_key = (req.method() == Method::GET)
            .then(|| openapi::Key::new(&k8s_path, req.uri().query(), &accept))
            .flatten();
        if req.method() == Method::GET {
            let query = Query::parse(req.uri().query());
            // A read of objects the cache may answer: it holds all of it,
            // and the account's identity may make it ([`authz`]).
            let cache_read = match &rp {
                Some(rp) if openapi_key.is_none() => {
                    let watch = route::watch_from_cache(req.method(), rp, &query);
                    let read = watch || route::from_cache(req.method(), rp, &query, req.headers());
                    (read && authz::covers(&account, rp)).then_some(watch)
                }
                _ => None,
            };
            // Owned, so nothing borrowed is held across the review's await.
            let review = match (&rp, cache_read) {
                (Some(rp), Some(_)) => Some(authz::attributes(rp, query.flag("watch"))),
                _ => None,
            };
            let allowed = match review {
                Some(read) => authz::allowed(&account, read, self.relay_timeout).await,
                None => true,
            };
            let cache_read = cache_read.filter(|_| allowed);
            let cached =
                read::discovery(&account, &k8s_path, &accept, req.headers()).or_else(|| {
                    if let Some(key) = &openapi_key {
                        return openapi::serve(&self.openapi, &account, key, req.headers());
                    }
                    let rp = rp.as_ref()?;
                    if cache_read? {
                        watch::serve(&account, rp, &query, &accept, &self.watch)
                    } else {
                        read::resource(&account, rp, &query, &accept)
                    }
                });
            if let Some(mut resp) = cached {
                self.metrics.request(&name, verb, Source::Cache);
                warn_stale(&account, stale, &mut resp);
                return resp;
            }
        }
        // Its agent moving to a new gateway connection opens the new relay
        // stream first and replaces the cache stream after: in between the
        // account has no cache stream but can still relay.
        if stale && account.relay().is_none() {
            self.metrics.request(&name, verb, Source::Refused);
            let offline = accounts::age_seconds(account.offline_since());
            let status = Status::new(
                503,
                "ServiceUnavailable",
                format!(
                    "account \"{name}\" is offline (its agent disconnected {offline}s ago); \
                     only reads from its cache are served until it reconnects"
                ),
            )
            .retry_after(1);
            relay::record_refusal(&account, &req, &k8s_path, &status);
            // Its agent is expected back (within the grace period): clients
            // retry rather than fail.
            let mut resp = body::status(&status);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return resp;
        }
        // One relay per document at a time; whoever waited finds it kept.
        let _flight = match &openapi_key {
            Some(key) if self.openapi.enabled() => {
                let flight = self.openapi.flight(&name, key).await;
                if let Some(mut resp) = openapi::serve(&self.openapi, &account, key, req.headers())
                {
                    self.metrics.request(&name, verb, Source::Cache);
                    warn_stale(&account, stale, &mut resp);
                    return resp;
                }
                Some(flight)
            }
            _ => None,
        };
        self.metrics.request(&name, verb, Source::Relay);
        let started = std::time::Instant::now();
        let discovery = account.read_cache().discovery_digest();
        let resp = relay::relay(account.clone(), req, k8s_path, self.relay_timeout).await;
        self.metrics
            .relay_latency(&name, started.elapsed().as_secs_f64());
        match openapi_key {
            Some(key) => openapi::keep(&self.openapi, &account, key, discovery, resp).await,
            None => resp,
        }
    }
}

/// The `Warning` headers of an answer from an account's cache that may be
/// stale: its agent is offline (`offline`), or its agent cannot reach the
/// cluster's API server. kubectl prints warnings with code 299 to its
/// stderr.
fn warn_stale(account: &Account, offline: bool, resp: &mut Response<Body>) {
    let mut texts = Vec::new();
    if offline {
        let age = accounts::age_seconds(account.offline_since());
        texts.push(format!(
            "299 - \"spinlink: account {} is offline; this answer is from a cache {age}s old\"",
            account.name()
        ));
    }
    if let Some((since, error)) = account.api_down() {
        let age = (chrono::Utc::now() - since).num_seconds().max(0);
        // The error is the agent's words: keep them to what a header holds.
        let error: String = error
            .chars()
            .filter(|c| c.is_ascii() && !c.is_ascii_control() && !matches!(c, '"' | '\\'))
            .collect();
        texts.push(format!(
            "299 - \"spinlink: account {}'s agent has not reached the cluster's API server since {} ({age}s); this answer is from its cache and may be stale: {error}\"",
            account.name(),
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ));
    }
    for text in texts {
        if let Ok(v) = header::HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
}

/// Serves the facade on `listener` until `shutdown`, then lets open
/// connections finish for [`DEFAULT_DRAIN_GRACE`]. The peer port
/// ([`crate::peer`]) answers forwarded requests with the same `facade`.
pub async fn serve(listener: TcpListener, facade: Arc<Facade>, shutdown: CancellationToken) {
    crate::http::serve::serve_http(
        listener,
        "facade",
        move |req| {
            let facade = facade.clone();
            async move { facade.handle(req).await }
        },
        shutdown,
        DEFAULT_DRAIN_GRACE,
    )
    .await;
}
