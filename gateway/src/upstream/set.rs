//! [`UpstreamSet`]: the sidecar instances streams can go to now, and which
//! account goes to which.
//!
//! - **Instances** come from sources (the static list, each DNS name, each
//!   EndpointSlice watch); each source publishes its whole list with
//!   [`UpstreamSet::update`], the set is their union by URL. An instance that
//!   disappears is retired: its open streams end with `Unavailable` so the
//!   agents reopen them, on the account's new owner.
//! - **Accounts** are assigned on their first stream by rendezvous hashing
//!   with bounded load (`loadFactor` c: no instance above `ceil(c · mean)`
//!   accounts, [`crate::route::choose_bounded`]) among the instances in
//!   rotation, and stay on that instance while any of their streams is open
//!   ([`Lease`]), so `Cache` and `Relay` of one account meet on one sidecar.
//! - **Rotation**: an instance failing health checks or ejected as an
//!   outlier takes no new accounts and its streams are ended the same way.
//!   When no instance is in rotation, all of them are used (a sidecar that
//!   cannot be checked may still carry streams).
//!
//! Assignments are per gateway replica: replicas see different loads, so
//! under pressure two replicas may place one account differently.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Target, Upstream, UpstreamTls};
use crate::config::upstreams::{HealthCheckConfig, UpstreamPoolConfig};
use crate::route;
use crate::stats::Stats;
use crate::stats::metrics::UpstreamLabel;
use crate::workers::Spawners;

#[derive(Debug)]
struct Health {
    /// As the health checks say (true until they say otherwise).
    checked_ok: bool,
    check_failures: u32,
    check_passes: u32,
    stream_errors: u32,
    ejected_until: Option<Instant>,
    ejections: u32,
}

/// One sidecar instance: its connection pool and its rotation state.
#[derive(Debug)]
pub struct Instance {
    upstream: Upstream,
    label: UpstreamLabel,
    health: Mutex<Health>,
    /// Cancelled when the instance leaves rotation or the set; streams
    /// carried to it watch the token they started under.
    epoch: Mutex<CancellationToken>,
    /// Accounts assigned (changed under the set's assignment lock).
    accounts: Mutex<usize>,
    accounts_gauge: Gauge,
    available_gauge: Gauge,
    /// Streams carried to it, in all and open now (taken once, not looked
    /// up per stream).
    streams_total: prometheus_client::metrics::counter::Counter,
    streams_open: Gauge,
}

/// One stream carried to an instance, counted while it is open.
#[derive(Debug)]
pub struct Carried {
    open: Gauge,
}

impl Drop for Carried {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Instance {
    /// The instance's connection pool.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The instance's URL.
    pub fn url(&self) -> &str {
        self.upstream.target().url()
    }

    /// Whether the instance takes new accounts at `now`.
    pub fn available(&self, now: Instant) -> bool {
        let h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        h.checked_ok && h.ejected_until.is_none_or(|t| now >= t)
    }

    /// The token streams starting now end on.
    fn epoch(&self) -> CancellationToken {
        self.epoch.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts a stream carried to the instance until the guard drops.
    pub fn carried(&self) -> Carried {
        self.streams_total.inc();
        self.streams_open.inc();
        Carried {
            open: self.streams_open.clone(),
        }
    }

    /// Ends every stream carried to the instance so far (with `Unavailable`).
    fn retire(&self, why: &str) {
        let mut epoch = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        epoch.cancel();
        *epoch = CancellationToken::new();
        // Retryable: the agents reopen their streams, on another instance.
        self.upstream
            .end_streams("upstream instance gone; reopen the stream");
        tracing::info!(
            upstream = self.url(),
            why,
            "upstream out of rotation; its streams end"
        );
    }

    fn account_count(&self) -> usize {
        *self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add_accounts(&self, n: isize) {
        let mut a = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        *a = a.saturating_add_signed(n);
        self.accounts_gauge.set(*a as i64);
    }
}

/// An account's claim on its instance for one stream; dropping it (when the
/// stream ends) releases the assignment after the account's last stream.
#[derive(Debug)]
pub struct Lease {
    set: Arc<UpstreamSet>,
    instance: Arc<Instance>,
    // The assignment table's key, shared: a stream copies no name.
    account: Arc<str>,
    gone: CancellationToken,
}

impl Lease {
    /// The instance the stream goes to.
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// Cancelled when the instance leaves rotation or the set: the stream
    /// must end then.
    pub fn gone(&self) -> &CancellationToken {
        &self.gone
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut table = self.set.lock_assignments();
        if let Some(a) = table.get_mut(&self.account)
            && Arc::ptr_eq(&a.instance, &self.instance)
        {
            a.streams -= 1;
            if a.streams == 0 {
                table.remove(&self.account);
                self.instance.add_accounts(-1);
            }
        }
    }
}

#[derive(Debug)]
struct Assignment {
    /// Its key in the table, which leases share.
    account: Arc<str>,
    instance: Arc<Instance>,
    streams: usize,
}

/// The live set of sidecar instances and the account assignments.
#[derive(Debug)]
pub struct UpstreamSet {
    tls: Option<UpstreamTls>,
    connections: usize,
    workers: Spawners,
    config: UpstreamPoolConfig,
    stats: Arc<Stats>,
    sources: Mutex<Vec<Vec<Target>>>,
    /// Sources that find instances at run time (DNS, EndpointSlices).
    discovered: std::sync::atomic::AtomicUsize,
    instances: RwLock<Arc<Vec<Arc<Instance>>>>,
    assignments: Mutex<HashMap<Arc<str>, Assignment, foldhash::fast::RandomState>>,
    changed: watch::Sender<u64>,
}

impl Default for UpstreamSet {
    fn default() -> Self {
        Self::new(
            None,
            1,
            UpstreamPoolConfig::default(),
            Arc::new(Stats::default()),
        )
    }
}

impl UpstreamSet {
    /// An empty set; instances dial with `tls` and keep `connections`
    /// connections each.
    pub fn new(
        tls: Option<UpstreamTls>,
        connections: usize,
        config: UpstreamPoolConfig,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            tls,
            connections,
            workers: Spawners::default(),
            config,
            stats,
            sources: Mutex::new(Vec::new()),
            discovered: std::sync::atomic::AtomicUsize::new(0),
            instances: RwLock::new(Arc::new(Vec::new())),
            assignments: Mutex::new(HashMap::default()),
            changed: watch::channel(0).0,
        }
    }

    /// Spreads every instance's pool over `workers` (see
    /// [`Upstream::with_workers`]).
    #[must_use]
    pub fn with_workers(mut self, workers: Spawners) -> Self {
        self.workers = workers;
        self
    }

    /// The pool settings.
    pub fn config(&self) -> &UpstreamPoolConfig {
        &self.config
    }

    /// A new source of instances; its index is passed to [`update`](Self::update).
    pub fn add_source(&self) -> usize {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources.push(Vec::new());
        sources.len() - 1
    }

    /// A source that finds instances at run time (so the set is not
    /// [empty](Self::is_empty) even before it has found any).
    pub fn add_discovered_source(&self) -> usize {
        self.discovered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.add_source()
    }

    /// Whether no upstream is configured: no instance and no source that
    /// could find one.
    pub fn is_empty(&self) -> bool {
        self.instances().is_empty()
            && self.discovered.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// The instances now, sorted by URL.
    pub fn instances(&self) -> Arc<Vec<Arc<Instance>>> {
        self.instances
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Bumped whenever instances or their rotation change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn lock_assignments(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Assignment, foldhash::fast::RandomState>> {
        self.assignments.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn label(url: &str) -> UpstreamLabel {
        UpstreamLabel {
            upstream: url.to_owned(),
        }
    }

    /// Replaces source `source`'s instances with `targets`. Instances no
    /// source lists any more are retired; new ones are added (nothing is
    /// dialled until a stream or a health check needs it).
    pub fn update(self: &Arc<Self>, source: usize, targets: Vec<Target>) {
        let wanted: BTreeMap<String, Target> = {
            let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = sources.get_mut(source) {
                *slot = targets;
            }
            sources
                .iter()
                .flatten()
                .map(|t| (t.url().to_owned(), t.clone()))
                .collect()
        };
        let old = self.instances();
        if old.len() == wanted.len() && old.iter().all(|i| wanted.contains_key(i.url())) {
            return;
        }
        let metrics = self.stats.metrics();
        let mut next = Vec::with_capacity(wanted.len());
        for (url, target) in wanted {
            if let Some(existing) = old.iter().find(|i| i.url() == url) {
                next.push(existing.clone());
                continue;
            }
            let label = Self::label(&url);
            let upstream = match Upstream::new(target, self.tls.as_ref(), self.connections) {
                Ok(u) => u
                    .with_workers(self.workers.clone())
                    .with_connection_gauge(
                        metrics.upstream_connections.get_or_create(&label).clone(),
                    )
                    .with_bytes_counter(metrics.bytes_counter(false)),
                Err(e) => {
                    tracing::warn!(upstream = %url, error = %e, "upstream instance skipped");
                    continue;
                }
            };
            let instance = Instance {
                upstream,
                health: Mutex::new(Health {
                    checked_ok: true,
                    check_failures: 0,
                    check_passes: 0,
                    stream_errors: 0,
                    ejected_until: None,
                    ejections: 0,
                }),
                epoch: Mutex::new(CancellationToken::new()),
                accounts: Mutex::new(0),
                accounts_gauge: metrics.upstream_accounts.get_or_create(&label).clone(),
                available_gauge: metrics.upstream_available.get_or_create(&label).clone(),
                streams_total: metrics.streams.get_or_create(&label).clone(),
                streams_open: metrics.streams_open.get_or_create(&label).clone(),
                label,
            };
            instance.available_gauge.set(1);
            tracing::info!(upstream = %url, "upstream instance added");
            let instance = Arc::new(instance);
            // Streams that fail to open count towards ejection; one that
            // gets its answer clears the count.
            let (set, weak) = (Arc::downgrade(self), Arc::downgrade(&instance));
            instance.upstream.set_outcome(Arc::new(move |ok| {
                if let (Some(set), Some(instance)) = (set.upgrade(), weak.upgrade()) {
                    if ok {
                        set.stream_ok(&instance);
                    } else {
                        set.stream_failed(&instance);
                    }
                }
            }));
            next.push(instance);
        }
        let removed: Vec<Arc<Instance>> = old
            .iter()
            .filter(|i| !next.iter().any(|n| Arc::ptr_eq(n, i)))
            .cloned()
            .collect();
        metrics.upstream_instances.set(next.len() as i64);
        *self.instances.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        if !removed.is_empty() {
            let mut table = self.lock_assignments();
            table.retain(|_, a| !removed.iter().any(|r| Arc::ptr_eq(r, &a.instance)));
        }
        for instance in removed {
            instance.retire("removed");
            // Its series go with it, so churn does not grow the metrics.
            metrics.upstream_accounts.remove(&instance.label);
            metrics.upstream_available.remove(&instance.label);
            metrics.upstream_connections.remove(&instance.label);
            metrics.streams_open.remove(&instance.label);
            instance.upstream.close();
        }
        self.changed.send_modify(|n| *n += 1);
        self.stats.notify();
    }

    /// A lease on `account`'s instance: the one it is assigned to while any
    /// of its streams is open and that instance is in rotation, else a new
    /// assignment. `None` when there is no instance at all.
    pub fn pick(self: &Arc<Self>, account: &str) -> Option<Lease> {
        let now = Instant::now();
        let instances = self.instances();
        let mut table = self.lock_assignments();
        if let Some(a) = table.get_mut(account) {
            if a.instance.available(now) {
                a.streams += 1;
                let (instance, account) = (a.instance.clone(), a.account.clone());
                drop(table);
                return Some(self.lease(instance, account));
            }
            // Its instance left rotation (its streams were ended): reassign.
            a.instance.add_accounts(-1);
            table.remove(account);
        }
        let mut candidates: Vec<&Arc<Instance>> =
            instances.iter().filter(|i| i.available(now)).collect();
        if candidates.is_empty() {
            candidates = instances.iter().collect();
        }
        let loads: Vec<usize> = candidates.iter().map(|i| i.account_count()).collect();
        let assigned: usize = loads.iter().sum();
        let capacity = route::capacity(assigned + 1, candidates.len(), self.config.load_factor);
        let i = route::choose_bounded(
            candidates
                .iter()
                .map(|c| c.url())
                .zip(loads.iter().copied()),
            account,
            capacity,
        )?;
        let instance = candidates[i].clone();
        instance.add_accounts(1);
        let account: Arc<str> = Arc::from(account);
        table.insert(
            account.clone(),
            Assignment {
                account: account.clone(),
                instance: instance.clone(),
                streams: 1,
            },
        );
        drop(table);
        Some(self.lease(instance, account))
    }

    fn lease(self: &Arc<Self>, instance: Arc<Instance>, account: Arc<str>) -> Lease {
        Lease {
            set: self.clone(),
            gone: instance.epoch(),
            instance,
            account,
        }
    }

    /// The instance `account` is assigned to now, if any.
    pub fn assigned(&self, account: &str) -> Option<String> {
        self.lock_assignments()
            .get(account)
            .map(|a| a.instance.url().to_owned())
    }

    /// Records a stream that opened on `instance`.
    pub fn stream_ok(&self, instance: &Instance) {
        instance
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stream_errors = 0;
    }

    /// Records a stream that could not be opened on `instance`; enough in a
    /// row eject it (outlier detection).
    pub fn stream_failed(&self, instance: &Instance) {
        self.stats.incr(crate::stats::Counter::UpstreamUnavailable);
        let outlier = &self.config.outlier;
        let ejected = {
            let mut h = instance.health.lock().unwrap_or_else(|e| e.into_inner());
            h.stream_errors += 1;
            if outlier.consecutive_errors > 0 && h.stream_errors >= outlier.consecutive_errors {
                h.stream_errors = 0;
                h.ejections += 1;
                let until = Instant::now() + outlier.ejection(h.ejections);
                h.ejected_until = Some(until);
                Some(outlier.ejection(h.ejections))
            } else {
                None
            }
        };
        if let Some(duration) = ejected {
            tracing::warn!(
                upstream = instance.url(),
                seconds = duration.as_secs(),
                "upstream ejected: streams keep failing"
            );
            self.left_rotation(instance, "ejected");
        }
    }

    /// Records a health check result.
    pub fn record_check(&self, instance: &Instance, ok: bool, config: &HealthCheckConfig) {
        let changed = {
            let mut h = instance.health.lock().unwrap_or_else(|e| e.into_inner());
            if ok {
                h.check_failures = 0;
                h.check_passes += 1;
                if !h.checked_ok && h.check_passes >= config.healthy_threshold.max(1) {
                    h.checked_ok = true;
                    Some(true)
                } else {
                    None
                }
            } else {
                h.check_passes = 0;
                h.check_failures += 1;
                if h.checked_ok && h.check_failures >= config.unhealthy_threshold.max(1) {
                    h.checked_ok = false;
                    Some(false)
                } else {
                    None
                }
            }
        };
        match changed {
            Some(false) => {
                tracing::warn!(upstream = instance.url(), "upstream unhealthy");
                self.left_rotation(instance, "unhealthy");
            }
            Some(true) => {
                tracing::info!(upstream = instance.url(), "upstream healthy again");
                self.refresh();
            }
            None => {}
        }
    }

    fn left_rotation(&self, instance: &Instance, why: &str) {
        self.stats
            .metrics()
            .upstream_ejections
            .get_or_create(&instance.label)
            .inc();
        instance.retire(why);
        self.refresh();
    }

    /// Brings the `upstream_available` gauges up to date (ejections expire
    /// with time) and tells subscribers.
    pub fn refresh(&self) {
        let now = Instant::now();
        for i in self.instances().iter() {
            i.available_gauge.set(i64::from(i.available(now)));
        }
        self.changed.send_modify(|n| *n += 1);
        self.stats.notify();
    }
}

#[cfg(test)]
mod tests;
