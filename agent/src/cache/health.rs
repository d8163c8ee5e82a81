//! Whether the cluster's API server answers this account's agent. Every
//! request of the account's watches reports here ([`ApiHealth::answered`],
//! [`ApiHealth::failed`]); the cache stream's heartbeat carries the state to
//! the sidecar, at once when it changes, so that reads the sidecar answers
//! from its cache while the API server is out of reach say so.

use std::sync::Mutex;

use tokio::sync::Notify;

/// Longest error text carried to the sidecar.
const ERROR_LIMIT: usize = 256;

/// One account's view of its API server.
#[derive(Debug, Default)]
pub struct ApiHealth {
    /// Since when (Unix milliseconds) requests failed without an answer,
    /// and the last such failure.
    down: Mutex<Option<(i64, String)>>,
    changed: Notify,
}

impl ApiHealth {
    /// The API server answered (with any status: it is reachable).
    pub fn answered(&self) {
        let was = self
            .down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((since, _)) = was {
            tracing::info!(
                down_for_ms = crate::clock::unix_millis().saturating_sub(since),
                "the cluster's API server answers again"
            );
            self.changed.notify_waiters();
        }
    }

    /// A request got no answer (`error`: why), or a 5xx.
    pub fn failed(&self, error: &str) {
        let mut down = self
            .down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let text: String = error.chars().take(ERROR_LIMIT).collect();
        match &mut *down {
            Some((_, last)) => *last = text,
            None => {
                tracing::warn!(error = %text, "the cluster's API server does not answer; the sidecar marks cached reads as possibly stale");
                *down = Some((crate::clock::unix_millis(), text));
                drop(down);
                self.changed.notify_waiters();
            }
        }
    }

    /// `(since, error)` while the API server does not answer.
    pub fn down(&self) -> Option<(i64, String)> {
        self.down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Resolves at the next change of state.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_from_the_first_failure_until_an_answer() {
        let h = ApiHealth::default();
        assert_eq!(h.down(), None);
        h.failed("connection refused");
        let (since, e) = h.down().unwrap();
        assert_eq!(e, "connection refused");
        h.failed(&"x".repeat(1000));
        let (again, e) = h.down().unwrap();
        assert_eq!(again, since, "the outage starts at its first failure");
        assert_eq!(e.len(), ERROR_LIMIT);
        h.answered();
        assert_eq!(h.down(), None);
    }

    #[tokio::test]
    async fn changes_wake_the_heartbeat() {
        let h = std::sync::Arc::new(ApiHealth::default());
        let waiting = tokio::spawn({
            let h = h.clone();
            async move { h.changed().await }
        });
        tokio::task::yield_now().await;
        h.failed("refused");
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("no wake-up")
            .unwrap();
    }
}
