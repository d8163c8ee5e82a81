//! The gateway's counters: [`Stats`] (simple counters plus the Prometheus
//! [`Metrics`]), which every other module counts into. A leaf: it names no
//! other module of the crate. The admin port serves them.

pub mod client_networks;
pub mod metrics;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use tokio::sync::watch;

pub use metrics::{AuthFailure, Glitch, Metrics, Refusal};

/// Counters of one gateway process.
#[derive(Debug)]
pub struct Stats {
    connections_accepted: AtomicU64,
    handshake_failures: AtomicU64,
    connections_without_identity: AtomicU64,
    accounts_granted: AtomicU64,
    accounts_renewed: AtomicU64,
    accounts_refused: AtomicU64,
    streams_refused: AtomicU64,
    streams_forwarded: AtomicU64,
    upstream_unavailable: AtomicU64,
    metrics: Metrics,
    // Bumped on a change while anyone waits, so a waiter can re-read
    // without polling.
    changed: watch::Sender<u64>,
    // How many wait: with none (the gateway's usual state) a change costs
    // the counter's own atomic only, not the channel's lock and wake-ups
    // that every carried stream would take on every worker.
    waiters: AtomicUsize,
}

/// One waiter counted in [`Stats::waiters`] until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    /// Counts a waiter. Whatever changed before the change's
    /// [`Stats::bump`] saw no waiter is visible to reads after this (the
    /// two `SeqCst` fences order the count against the changes).
    fn new(waiters: &'a AtomicUsize) -> Self {
        waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        Self(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// TCP connections accepted.
    pub connections_accepted: u64,
    /// TLS handshakes that failed (bad or missing client certificate, ...).
    pub handshake_failures: u64,
    /// Connections closed because their certificate named nobody.
    pub connections_without_identity: u64,
    /// Accounts granted a channel token by `Hello`.
    pub accounts_granted: u64,
    /// Of those, accounts the connection already held (token renewals).
    pub accounts_renewed: u64,
    /// Accounts refused by `Hello`.
    pub accounts_refused: u64,
    /// `Cache`/`Relay` streams refused for a missing or invalid token.
    pub streams_refused: u64,
    /// `Cache`/`Relay` streams carried to an upstream.
    pub streams_forwarded: u64,
    /// Streams answered `Unavailable` because no upstream could take them.
    pub upstream_unavailable: u64,
}

/// A counter in [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// See [`StatsSnapshot::connections_accepted`].
    ConnectionsAccepted,
    /// See [`StatsSnapshot::handshake_failures`].
    HandshakeFailures,
    /// See [`StatsSnapshot::connections_without_identity`].
    ConnectionsWithoutIdentity,
    /// See [`StatsSnapshot::accounts_granted`].
    AccountsGranted,
    /// See [`StatsSnapshot::accounts_renewed`].
    AccountsRenewed,
    /// See [`StatsSnapshot::accounts_refused`].
    AccountsRefused,
    /// See [`StatsSnapshot::streams_refused`].
    StreamsRefused,
    /// See [`StatsSnapshot::streams_forwarded`].
    StreamsForwarded,
    /// See [`StatsSnapshot::upstream_unavailable`].
    UpstreamUnavailable,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            connections_accepted: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
            connections_without_identity: AtomicU64::new(0),
            accounts_granted: AtomicU64::new(0),
            accounts_renewed: AtomicU64::new(0),
            accounts_refused: AtomicU64::new(0),
            streams_refused: AtomicU64::new(0),
            streams_forwarded: AtomicU64::new(0),
            upstream_unavailable: AtomicU64::new(0),
            metrics: Metrics::default(),
            changed: watch::Sender::new(0),
            waiters: AtomicUsize::new(0),
        }
    }
}

impl Stats {
    fn counter(&self, counter: Counter) -> &AtomicU64 {
        match counter {
            Counter::ConnectionsAccepted => &self.connections_accepted,
            Counter::HandshakeFailures => &self.handshake_failures,
            Counter::ConnectionsWithoutIdentity => &self.connections_without_identity,
            Counter::AccountsGranted => &self.accounts_granted,
            Counter::AccountsRenewed => &self.accounts_renewed,
            Counter::AccountsRefused => &self.accounts_refused,
            Counter::StreamsRefused => &self.streams_refused,
            Counter::StreamsForwarded => &self.streams_forwarded,
            Counter::UpstreamUnavailable => &self.upstream_unavailable,
        }
    }

    /// Adds `n` to a counter.
    pub fn add(&self, counter: Counter, n: u64) {
        if n == 0 {
            return;
        }
        self.counter(counter).fetch_add(n, Ordering::Relaxed);
        let m = &self.metrics;
        match counter {
            Counter::ConnectionsAccepted => m.connections.inc_by(n),
            Counter::HandshakeFailures => {
                for _ in 0..n {
                    m.handshake(false);
                    m.auth_failure(AuthFailure::Handshake);
                }
                0
            }
            Counter::ConnectionsWithoutIdentity => {
                for _ in 0..n {
                    m.auth_failure(AuthFailure::NoIdentity);
                }
                0
            }
            Counter::AccountsGranted => m.tokens_issued.inc_by(n),
            Counter::AccountsRenewed => m.tokens_renewed.inc_by(n),
            Counter::AccountsRefused
            | Counter::StreamsRefused
            | Counter::StreamsForwarded
            | Counter::UpstreamUnavailable => 0,
        };
        self.bump();
    }

    /// Wakes [`Stats::wait_until`] waiters after a metric changed directly.
    pub fn notify(&self) {
        self.bump();
    }

    fn bump(&self) {
        // Pairs with the fence in `Waiting::new`: either this sees the
        // waiter, or the waiter's reads see the change.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.changed.send_modify(|generation| *generation += 1);
        }
    }

    /// The Prometheus metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts a refusal (and wakes waiters).
    pub fn refuse(&self, reason: Refusal) {
        self.metrics.refuse(reason);
        self.bump();
    }

    /// Counts an authentication failure of a stream's token (and wakes
    /// waiters). Handshake and identity failures go through [`Stats::incr`].
    pub fn auth_failure(&self, reason: AuthFailure) {
        self.metrics.auth_failure(reason);
        self.bump();
    }

    /// Waits until `done` holds for these stats.
    pub async fn wait_until(&self, done: impl Fn(&Stats) -> bool) {
        let mut changes = self.changed.subscribe();
        let _waiting = Waiting::new(&self.waiters);
        while !done(self) {
            let _ = changes.changed().await;
        }
    }

    /// Adds one to a counter.
    pub fn incr(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c| self.counter(c).load(Ordering::Relaxed);
        StatsSnapshot {
            connections_accepted: get(Counter::ConnectionsAccepted),
            handshake_failures: get(Counter::HandshakeFailures),
            connections_without_identity: get(Counter::ConnectionsWithoutIdentity),
            accounts_granted: get(Counter::AccountsGranted),
            accounts_renewed: get(Counter::AccountsRenewed),
            accounts_refused: get(Counter::AccountsRefused),
            streams_refused: get(Counter::StreamsRefused),
            streams_forwarded: get(Counter::StreamsForwarded),
            upstream_unavailable: get(Counter::UpstreamUnavailable),
        }
    }

    /// Waits until `done` holds for the counters and returns them.
    pub async fn wait_for(&self, done: impl Fn(&StatsSnapshot) -> bool) -> StatsSnapshot {
        // Subscribe before reading so a change between the read and the wait
        // is not lost.
        let mut changes = self.changed.subscribe();
        let _waiting = Waiting::new(&self.waiters);
        loop {
            let now = self.snapshot();
            if done(&now) {
                return now;
            }
            // The sender lives in `self`, so `changed` cannot fail here.
            let _ = changes.changed().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn wait_for_wakes_on_increment() {
        let stats = Arc::new(Stats::default());
        let waiter = tokio::spawn({
            let stats = stats.clone();
            async move { stats.wait_for(|s| s.handshake_failures >= 2).await }
        });
        stats.incr(Counter::HandshakeFailures);
        stats.incr(Counter::HandshakeFailures);
        let seen = waiter.await.unwrap();
        assert_eq!(seen.handshake_failures, 2);
        assert_eq!(seen.streams_forwarded, 0);
    }

    #[test]
    fn a_change_nobody_waits_for_wakes_nobody() {
        let stats = Stats::default();
        stats.incr(Counter::StreamsForwarded);
        stats.refuse(Refusal::GoingAway);
        assert_eq!(*stats.changed.borrow(), 0, "the channel was sent to");
        assert_eq!(stats.snapshot().streams_forwarded, 1);
    }

    /// Waiters that start while other threads count are never left asleep
    /// past the change they wait for.
    #[test]
    fn a_waiter_starting_while_others_count_sees_every_change() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for round in 0..200u64 {
            let stats = Arc::new(Stats::default());
            let counter = std::thread::spawn({
                let stats = stats.clone();
                move || {
                    for _ in 0..=round % 7 {
                        stats.incr(Counter::StreamsForwarded);
                    }
                }
            });
            let want = round % 7 + 1;
            let seen = rt.block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    stats.wait_for(|s| s.streams_forwarded >= want),
                )
                .await
            });
            counter.join().unwrap();
            assert_eq!(
                seen.expect("a waiter missed a change").streams_forwarded,
                want
            );
        }
    }
}
