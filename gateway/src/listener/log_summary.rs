//! Warnings a flood repeats, kept to a line or two per interval: the first
//! occurrence of a kind in each interval is logged as it happens (with its
//! details), the rest are counted and logged as one summary line when the
//! interval ends. A thousand refused connects a second from one address
//! used to write a thousand WARN lines a second; now they write two every
//! [`SUMMARY_INTERVAL`], and `spinlink_gateway_refusals_total` still counts
//! each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long one summary covers.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Per kind: when its interval started, how many were not logged since,
/// and whether a task will write the summary.
#[derive(Debug)]
struct Window {
    started: Instant,
    suppressed: u64,
    flushing: bool,
}

/// Occurrences by kind (a refusal reason, a handshake failure).
#[derive(Debug)]
pub struct Summarised {
    interval: Duration,
    windows: Mutex<HashMap<&'static str, Window>>,
}

impl Summarised {
    /// Summaries every `interval`.
    pub fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            interval,
            windows: Mutex::new(HashMap::new()),
        })
    }

    /// Whether this occurrence of `kind` should be logged now; if not, it
    /// is counted, and the count is logged (`what` says of what) when its
    /// interval ends. Needs a Tokio runtime.
    pub fn admit(self: &Arc<Self>, kind: &'static str, what: &'static str) -> bool {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh = false;
        let w = windows.entry(kind).or_insert_with(|| {
            fresh = true;
            Window {
                started: now,
                suppressed: 0,
                flushing: false,
            }
        });
        if fresh {
            return true;
        }
        if !w.flushing && now.duration_since(w.started) >= self.interval {
            // A quiet interval went by: this one starts the next.
            w.started = now;
            return true;
        }
        w.suppressed += 1;
        if !w.flushing {
            w.flushing = true;
            let at = w.started + self.interval;
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                if let Some(n) = this.take(kind) {
                    tracing::warn!(
                        reason = kind,
                        count = n,
                        seconds = this.interval.as_secs(),
                        "{what} (more of the same in the last interval; the first was logged on its own)"
                    );
                }
            });
        }
        false
    }

    /// Takes the count of `kind` not logged, starting a new interval.
    fn take(&self, kind: &'static str) -> Option<u64> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let w = windows.get_mut(kind)?;
        let n = std::mem::take(&mut w.suppressed);
        w.flushing = false;
        w.started = Instant::now();
        (n > 0).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On Tokio's paused clock: the summary task runs exactly when the
    /// interval ends, no sleep guesses at it.
    #[tokio::test(start_paused = true)]
    async fn the_first_of_each_interval_is_logged_the_rest_counted() {
        let interval = Duration::from_secs(10);
        let s = Summarised::new(interval);
        assert!(s.admit("a", "x"));
        assert!(!s.admit("a", "x"));
        assert!(!s.admit("a", "x"));
        // Another kind has an interval of its own.
        assert!(s.admit("b", "x"));
        assert_eq!(s.windows.lock().unwrap()["a"].suppressed, 2);
        // The summary task takes the count when the interval ends.
        tokio::time::sleep(interval).await;
        tokio::task::yield_now().await;
        assert_eq!(s.take("a"), None, "already taken by the summary");
        // A quiet interval after that, the next one is logged on its own.
        tokio::time::advance(interval).await;
        assert!(s.admit("a", "x"));
        assert!(!s.admit("a", "x"));
    }
}
