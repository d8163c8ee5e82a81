//! One memory budget for what all agent connections together make the
//! gateway hold (Envoy's overload manager is the model).
//!
//! Each connection already bounds itself: it stops reading while 4 MiB
//! wait to be written to its peer, and what it forwards waits under the
//! flow-control windows the other side granted. Ten thousand connections
//! each within their bounds can still hold more than the process has. So
//! every agent connection reports, each time its task runs, the bytes it
//! holds — frames waiting for its socket, data queued behind its peer's
//! windows, and its own data forwarded and waiting at a sidecar — and a
//! sweeper adds them up every [`SWEEP`]. Over the budget, the connections
//! holding the most (the slowest readers, or the peers that send the most
//! and read the least) are ended first, with GOAWAY `ENHANCE_YOUR_CALM`,
//! until the rest fit in nine tenths of it; an honest agent reconnects and
//! resumes where its cache stream left off.
//!
//! Reporting is one relaxed store into the connection's own slot: nothing
//! is shared on the data path. The price is that the budget is enforced
//! every [`SWEEP`] rather than on every byte, so it may be overrun by what
//! connections read in that time, which their own bounds keep finite.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Waker;
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio_util::sync::CancellationToken;

use crate::stats::Stats;

/// How often the connections' reports are added up.
pub const SWEEP: Duration = Duration::from_millis(100);

/// The budget, and every connection under it.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Weak<Usage>>>,
}

/// One connection's report.
#[derive(Debug, Default)]
struct Usage {
    bytes: AtomicUsize,
    /// Set by the sweeper: the connection must end.
    over: AtomicBool,
    waker: AtomicWaker,
}

/// A connection's place under the budget; dropping it leaves.
#[derive(Debug)]
pub struct Registration {
    budget: Arc<Budget>,
    id: u64,
    usage: Arc<Usage>,
}

/// What a sweep found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Bytes all connections held.
    pub total: usize,
    /// Connections told to end.
    pub ended: usize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// A new connection's place.
    pub fn register(self: &Arc<Self>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let usage = Arc::new(Usage::default());
        lock(&self.conns).insert(id, Arc::downgrade(&usage));
        Registration {
            budget: self.clone(),
            id,
            usage,
        }
    }

    /// Adds up the reports; over the budget, tells the connections that
    /// hold the most to end, until the rest fit in nine tenths of it.
    pub fn sweep(&self) -> Swept {
        let mut held: Vec<(usize, Arc<Usage>)> = lock(&self.conns)
            .values()
            .filter_map(Weak::upgrade)
            .filter(|u| !u.over.load(Ordering::Relaxed))
            .map(|u| (u.bytes.load(Ordering::Relaxed), u))
            .collect();
        let total: usize = held.iter().map(|(b, _)| b).sum();
        let mut ended = 0;
        if total > self.limit {
            let target = self.limit / 10 * 9;
            held.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
            let mut left = total;
            for (bytes, usage) in held {
                if left <= target || bytes == 0 {
                    break;
                }
                usage.over.store(true, Ordering::Relaxed);
                usage.waker.wake();
                left -= bytes;
                ended += 1;
            }
        }
        Swept { total, ended }
    }
}

impl Budget {
    /// Sweeps every [`SWEEP`] until `stop`, keeping the gauges
    /// `spinlink_gateway_buffered_bytes` and `..._buffer_budget_bytes`.
    pub async fn run(self: Arc<Self>, stats: Arc<Stats>, stop: CancellationToken) {
        let metrics = stats.metrics();
        metrics
            .buffer_budget_bytes
            .set(i64::try_from(self.limit).unwrap_or(i64::MAX));
        let mut tick = tokio::time::interval(SWEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let swept = self.sweep();
            metrics
                .buffered_bytes
                .set(i64::try_from(swept.total).unwrap_or(i64::MAX));
            if swept.ended > 0 {
                tracing::warn!(
                    held = swept.total,
                    budget = self.limit,
                    ended = swept.ended,
                    "agent connections over listener.maxBufferedBytes; those holding the most end"
                );
            }
        }
    }
}

impl Registration {
    /// Reports that the connection holds `bytes` now; `false` once the
    /// budget says it must end. `waker` is woken when that happens.
    pub fn report(&self, bytes: usize, waker: &Waker) -> bool {
        self.usage.waker.register(waker);
        self.usage.bytes.store(bytes, Ordering::Relaxed);
        !self.usage.over.load(Ordering::Relaxed)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.budget.conns).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_budget_the_biggest_holders_end_first() {
        let budget = Budget::new(1000);
        let waker = Waker::noop();
        let conns: Vec<Registration> = (0..5).map(|_| budget.register()).collect();
        for (c, bytes) in conns.iter().zip([100, 500, 50, 300, 200]) {
            assert!(c.report(bytes, waker));
        }
        // 1,150 held: the 500 goes, leaving 650 (under 900).
        assert_eq!(
            budget.sweep(),
            Swept {
                total: 1150,
                ended: 1
            }
        );
        let ended: Vec<bool> = conns.iter().map(|c| !c.report(0, waker)).collect();
        assert_eq!(ended, [false, true, false, false, false]);
        // Within the budget nothing more happens; the one told stays told.
        for c in &conns {
            c.report(100, waker);
        }
        assert_eq!(
            budget.sweep(),
            Swept {
                total: 400,
                ended: 0
            }
        );
        assert!(!conns[1].report(0, waker));
    }

    #[test]
    fn a_connection_gone_leaves_the_budget() {
        let budget = Budget::new(10);
        let a = budget.register();
        a.report(1_000, Waker::noop());
        drop(a);
        assert_eq!(budget.sweep(), Swept { total: 0, ended: 0 });
        assert!(lock(&budget.conns).is_empty());
    }
}
