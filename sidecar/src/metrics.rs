//! The sidecar's Prometheus metrics (`prometheus-client`), served at
//! `/metrics` on the facade port beside the accounts API. Counters and the
//! relay latency histogram are updated where things happen (facade,
//! Clouddriver registration); per-account gauges (objects, cache bytes,
//! state) are set from the [`AccountGauges`] handed to [`Metrics::render`]
//! at scrape time, so a removed account's series disappear with it. It
//! knows nothing of the accounts registry. Start with [`Metrics`].

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The `state` labels of `account_state`, one of which is 1 per account.
pub const ACCOUNT_STATES: [&str; 3] = ["online", "stale", "removed"];

/// One account's gauges as they stand at scrape time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountGauges {
    /// The account's name.
    pub name: String,
    /// Objects cached.
    pub objects: usize,
    /// Approximate bytes of the cached objects (their JSON encoding).
    pub cache_bytes: usize,
    /// Whether its agent reaches the cluster's API server.
    pub api_server_reachable: bool,
    /// One of [`ACCOUNT_STATES`].
    pub state: &'static str,
}

/// Where a facade request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From the account's cache or discovery snapshot.
    Cache,
    /// Relayed live to the agent.
    Relay,
    /// Refused by the sidecar (account stale or unknown).
    Refused,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Relay => "relay",
            Self::Refused => "refused",
        }
    }
}

fn relay_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    requests: Family<Labels, Counter>,
    relay_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    registrations: Family<Labels, Counter>,
    registration_failures: Family<Labels, Counter>,
    objects: Family<Labels, Gauge>,
    api_server_reachable: Family<Labels, Gauge>,
    cache_bytes: Family<Labels, Gauge>,
    state: Family<Labels, Gauge>,
    cache_watches: Family<Labels, Gauge>,
    cache_watches_expired: Family<Labels, Counter>,
    handovers: Family<Labels, Counter>,
    tunnel_refused: Family<Labels, Counter>,
    peer_refused: Family<Labels, Counter>,
    journal_dropped: Counter,
    resource_version_writes: Counter,
    openapi_bytes: Gauge,
    openapi_documents: Gauge,
    certificate_not_after: Family<Labels, Gauge>,
}

/// Holds one open cache-served watch in the gauge; dropping it lets go.
#[derive(Debug)]
pub struct OpenWatch {
    gauge: Gauge,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every sidecar metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spinlink_sidecar");
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "facade_requests",
            "Facade requests by account, verb and where they were answered (cache, relay, refused)",
            requests.clone(),
        );
        let relay_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(relay_histogram);
        registry.register(
            "relay_duration_seconds",
            "Time from receiving a relayed request to the agent's response head",
            relay_seconds.clone(),
        );
        let registrations = Family::<Labels, Counter>::default();
        registry.register(
            "registrations",
            "Account registration calls by target (clouddriver, kubeconfig), operation and outcome",
            registrations.clone(),
        );
        let registration_failures = Family::<Labels, Counter>::default();
        registry.register(
            "registration_failures",
            "Failed Clouddriver registration steps by reason (storage_disabled, forbidden, unreadable, not_loaded, ...)",
            registration_failures.clone(),
        );
        let api_server_reachable = Family::<Labels, Gauge>::default();
        registry.register(
            "api_server_reachable",
            "Whether each account's agent reaches its cluster's API server (0: cached reads may be stale)",
            api_server_reachable.clone(),
        );
        let objects = Family::<Labels, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects cached per account",
            objects.clone(),
        );
        let cache_bytes = Family::<Labels, Gauge>::default();
        registry.register(
            "cache_bytes",
            "Approximate size of the cached objects per account (their JSON encoding)",
            cache_bytes.clone(),
        );
        let state = Family::<Labels, Gauge>::default();
        registry.register(
            "account_state",
            "1 for the state each account is in (online, stale, removed)",
            state.clone(),
        );
        let cache_watches = Family::<Labels, Gauge>::default();
        registry.register(
            "cache_watches_open",
            "Watches the facade is serving from the cache, per account (relayed ones are counted in facade_requests with verb=watch, source=relay)",
            cache_watches.clone(),
        );
        let cache_watches_expired = Family::<Labels, Counter>::default();
        registry.register(
            "cache_watches_expired",
            "Cache-served watches ended with 410 Expired (resourceVersion too old, or the watcher fell behind the history)",
            cache_watches_expired.clone(),
        );
        let handovers = Family::<Labels, Counter>::default();
        registry.register(
            "handovers",
            "Where an account's first cache stream here started from, by outcome: warm (a previous owner's snapshot loaded; reason fresher when it replaced an older cache held here), resumed (the cache held here since an earlier stream; reason current or behind the store's record) or cold with the reason (the agent listed again)",
            handovers.clone(),
        );
        let tunnel_refused = Family::<Labels, Counter>::default();
        registry.register(
            "tunnel_refused",
            "Tunnel streams refused, by reason: not_gateway (the client certificate names none of tunnel.tls.gatewayIdentities), no_certificate, account_held (the account's streams are open from another agent identity)",
            tunnel_refused.clone(),
        );
        let peer_refused = Family::<Labels, Counter>::default();
        registry.register(
            "peer_refused",
            "Connections and requests the peer port refused, by reason: handshake (no client certificate, one peer.tls.caFile does not sign, or a broken handshake; per connection), not_peer (the certificate names none of peer.tls.peerIdentities; per request), path (not a forwarded facade request or a snapshot)",
            peer_refused.clone(),
        );
        let journal_dropped = Counter::default();
        registry.register(
            "journal_dropped",
            "Relayed operations not journaled because the queue to the store was full",
            journal_dropped.clone(),
        );
        let resource_version_writes = Counter::default();
        registry.register(
            "resource_version_writes",
            "Per-kind resourceVersions written to the store (batched per account, not per event)",
            resource_version_writes.clone(),
        );
        let openapi_bytes = Gauge::default();
        registry.register(
            "openapi_cache_bytes",
            "Bytes of OpenAPI documents the facade holds for all accounts (distinct bodies plus per-entry keys and headers)",
            openapi_bytes.clone(),
        );
        let openapi_documents = Gauge::default();
        registry.register(
            "openapi_cache_documents",
            "Distinct OpenAPI documents the facade holds (accounts with the same document share one)",
            openapi_documents.clone(),
        );
        // A family: a listener without TLS exports no series, rather than a
        // notAfter of 1970 that expiry alerts would take for an expired one.
        let certificate_not_after = Family::<Labels, Gauge>::default();
        registry.register_with_unit(
            "certificate_not_after",
            "The notAfter of the certificate each TLS listener serves (tunnel, peer) as a Unix time",
            prometheus_client::registry::Unit::Seconds,
            certificate_not_after.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                certificate_not_after,
                openapi_bytes,
                openapi_documents,
                cache_watches,
                cache_watches_expired,
                handovers,
                tunnel_refused,
                peer_refused,
                journal_dropped,
                resource_version_writes,
                requests,
                relay_seconds,
                registrations,
                registration_failures,
                objects,
                api_server_reachable,
                cache_bytes,
                state,
            }),
        }
    }

    /// Records the notAfter (Unix seconds) of the certificate `listener`
    /// (`tunnel`, `peer`) serves.
    pub fn certificate(&self, listener: &str, not_after: i64) {
        self.inner
            .certificate_not_after
            .get_or_create(&vec![("listener".to_owned(), listener.to_owned())])
            .set(not_after);
    }

    /// Counts relayed operations the journal's full queue dropped.
    pub fn journal_dropped(&self) -> Counter {
        self.inner.journal_dropped.clone()
    }

    /// Counts per-kind resourceVersions written to the store.
    pub fn resource_version_writes(&self) -> Counter {
        self.inner.resource_version_writes.clone()
    }

    /// Counts one facade request.
    pub fn request(&self, account: &str, verb: &str, source: Source) {
        self.inner
            .requests
            .get_or_create(&vec![
                ("account".to_owned(), account.to_owned()),
                ("verb".to_owned(), verb.to_owned()),
                ("source".to_owned(), source.as_str().to_owned()),
            ])
            .inc();
    }

    /// A watch served from the cache opened; it counts as open until the
    /// returned guard is dropped.
    pub fn cache_watch_opened(&self, account: &str) -> OpenWatch {
        let gauge = self
            .inner
            .cache_watches
            .get_or_create(&vec![("account".to_owned(), account.to_owned())])
            .clone();
        gauge.inc();
        OpenWatch { gauge }
    }

    /// An account was taken over from another sidecar: `outcome` is `warm`
    /// or `cold`, `reason` why it was cold (empty when warm).
    pub fn handover(&self, outcome: &str, reason: &str) {
        self.inner
            .handovers
            .get_or_create(&vec![
                ("outcome".to_owned(), outcome.to_owned()),
                ("reason".to_owned(), reason.to_owned()),
            ])
            .inc();
    }

    /// Counts one tunnel stream refused for `reason`.
    pub fn tunnel_refused(&self, reason: &str) {
        self.inner
            .tunnel_refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    /// A connection or request refused on the peer port, by reason
    /// ([`crate::peer`]).
    pub fn peer_refused(&self, reason: &str) {
        self.inner
            .peer_refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    /// A watch served from the cache ended with 410 Expired.
    pub fn cache_watch_expired(&self, account: &str) {
        self.inner
            .cache_watches_expired
            .get_or_create(&vec![("account".to_owned(), account.to_owned())])
            .inc();
    }

    /// Records the OpenAPI cache's size (set before each scrape).
    pub fn openapi_cache(&self, bytes: usize, documents: usize) {
        let inner = &self.inner;
        inner
            .openapi_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        inner
            .openapi_documents
            .set(i64::try_from(documents).unwrap_or(i64::MAX));
    }

    /// Records how long a relayed request waited for its response head.
    pub fn relay_latency(&self, account: &str, seconds: f64) {
        self.inner
            .relay_seconds
            .get_or_create(&vec![("account".to_owned(), account.to_owned())])
            .observe(seconds);
    }

    /// Counts one failed registration step by its reason.
    pub fn registration_failure(&self, reason: &str) {
        self.inner
            .registration_failures
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    /// Counts one registration call.
    pub fn registration(&self, target: &str, op: &str, success: bool) {
        self.inner
            .registrations
            .get_or_create(&vec![
                ("target".to_owned(), target.to_owned()),
                ("op".to_owned(), op.to_owned()),
                (
                    "outcome".to_owned(),
                    if success { "success" } else { "failure" }.to_owned(),
                ),
            ])
            .inc();
    }

    /// The text exposition, with the per-account gauges of `accounts`
    /// (accounts not listed have none).
    pub fn render(&self, accounts: &[AccountGauges]) -> String {
        let inner = &self.inner;
        inner.objects.clear();
        inner.api_server_reachable.clear();
        inner.cache_bytes.clear();
        inner.state.clear();
        for account in accounts {
            let label = vec![("account".to_owned(), account.name.clone())];
            inner
                .objects
                .get_or_create(&label)
                .set(i64::try_from(account.objects).unwrap_or(i64::MAX));
            inner
                .cache_bytes
                .get_or_create(&label)
                .set(i64::try_from(account.cache_bytes).unwrap_or(i64::MAX));
            inner
                .api_server_reachable
                .get_or_create(&label)
                .set(i64::from(account.api_server_reachable));
            for name in ACCOUNT_STATES {
                let mut l = label.clone();
                l.push(("state".to_owned(), name.to_owned()));
                inner
                    .state
                    .get_or_create(&l)
                    .set(i64::from(account.state == name));
            }
        }
        let mut out = String::new();
        if encode(&mut out, &inner.registry).is_err() {
            let _ = writeln!(out, "# encoding failed");
        }
        out
    }
}

/// The Kubernetes verb of a request, for metrics.
pub fn verb(method: &http::Method, named: bool, watch: bool) -> &'static str {
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_counters_gauges_and_histogram() {
        let m = Metrics::new();
        let mut accounts = vec![AccountGauges {
            name: "prod".into(),
            objects: 0,
            cache_bytes: 0,
            api_server_reachable: true,
            state: "online",
        }];
        m.request("prod", "list", Source::Cache);
        m.request("prod", "list", Source::Cache);
        m.request("prod", "create", Source::Relay);
        m.relay_latency("prod", 0.01);
        m.registration("clouddriver", "register", false);
        let text = m.render(&accounts);
        assert!(
            text.contains(
                r#"spinlink_sidecar_facade_requests_total{account="prod",verb="list",source="cache"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"spinlink_sidecar_relay_duration_seconds_count{account="prod"} 1"#),
            "{text}"
        );
        assert!(text.contains(
            r#"spinlink_sidecar_registrations_total{target="clouddriver",op="register",outcome="failure"} 1"#
        ), "{text}");
        assert!(
            text.contains(r#"spinlink_sidecar_cache_objects{account="prod"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"spinlink_sidecar_account_state{account="prod",state="online"} 1"#),
            "{text}"
        );
        assert_eq!(verb(&http::Method::GET, false, true), "watch");
        accounts.push(AccountGauges {
            name: "gone".into(),
            objects: 3,
            cache_bytes: 120,
            api_server_reachable: false,
            state: "removed",
        });
        let text = m.render(&accounts);
        for line in [
            r#"spinlink_sidecar_account_state{account="gone",state="removed"} 1"#,
            r#"spinlink_sidecar_account_state{account="gone",state="online"} 0"#,
            r#"spinlink_sidecar_cache_objects{account="gone"} 3"#,
            r#"spinlink_sidecar_cache_bytes{account="gone"} 120"#,
            r#"spinlink_sidecar_api_server_reachable{account="gone"} 0"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // An account no longer listed loses its series.
        let text = m.render(&accounts[..1]);
        assert!(!text.contains(r#"account="gone""#), "{text}");
        let open = m.cache_watch_opened("prod");
        m.cache_watch_expired("prod");
        let text = m.render(&accounts);
        assert!(
            text.contains(r#"spinlink_sidecar_cache_watches_open{account="prod"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"spinlink_sidecar_cache_watches_expired_total{account="prod"} 1"#),
            "{text}"
        );
        drop(open);
        assert!(
            !text.contains("spinlink_sidecar_certificate_not_after_seconds{"),
            "no TLS listener recorded yet: {text}"
        );
        m.certificate("tunnel", 1_900_000_000);
        m.openapi_cache(4096, 2);
        let text = m.render(&accounts);
        assert!(
            text.contains(
                r#"spinlink_sidecar_certificate_not_after_seconds{listener="tunnel"} 1900000000"#
            ),
            "{text}"
        );
        assert!(
            text.contains("spinlink_sidecar_openapi_cache_bytes 4096")
                && text.contains("spinlink_sidecar_openapi_cache_documents 2"),
            "{text}"
        );
        assert!(
            text.contains(r#"spinlink_sidecar_cache_watches_open{account="prod"} 0"#),
            "{text}"
        );
    }
}
