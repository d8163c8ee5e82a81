//! How long an ingress connection has gone without an open stream, for
//! `idleTimeoutSeconds`.
//!
//! A request opens and closes a stream; with HTTP/1.1 keep-alive that is
//! every request. Counting them costs two atomic operations and, when the
//! last stream closes, one clock read: nothing wakes and no timer is armed
//! or cancelled per request. The connection's one idle timer fires at most
//! once per timeout and then looks at the count and the time the last
//! stream closed, arming itself again for what is left.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// Open streams of one connection, and when the last one closed.
#[derive(Debug)]
pub(super) struct Activity {
    /// When the connection started; `idle_since` counts from here.
    start: Instant,
    open: AtomicUsize,
    /// Nanoseconds from `start` to when the count last fell to zero.
    idle_since: AtomicU64,
}

impl Activity {
    /// A connection with no stream yet, idle from now.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            open: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
        })
    }

    /// Counts a stream as open until the guard is dropped.
    pub(super) fn open(self: &Arc<Self>) -> ActiveStream {
        self.open.fetch_add(1, Ordering::AcqRel);
        ActiveStream(self.clone())
    }

    /// When the connection stops being idle enough: `None` while a stream
    /// is open, else when the last one closed (or the connection started).
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let nanos = self.idle_since.load(Ordering::Acquire);
        Some(self.start + Duration::from_nanos(nanos))
    }

    /// Resolves once the connection has had no open stream for `timeout`.
    pub(super) async fn idle(&self, timeout: Duration) {
        loop {
            match self.idle_since() {
                Some(since) if Instant::now() >= since + timeout => return,
                Some(since) => tokio::time::sleep_until(since + timeout).await,
                // Busy: nothing can end sooner than a full timeout from now.
                None => tokio::time::sleep(timeout).await,
            }
        }
    }
}

/// One open stream of a connection; dropping it closes it.
#[derive(Debug)]
pub(super) struct ActiveStream(Arc<Activity>);

impl Drop for ActiveStream {
    fn drop(&mut self) {
        let activity = &self.0;
        // Recorded before the count falls, so whoever sees zero sees this
        // time (or a later one).
        let nanos = u64::try_from(activity.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        activity.idle_since.fetch_max(nanos, Ordering::AcqRel);
        activity.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its stream counted as open.
pub(super) struct GuardedBody {
    pub(super) inner: tonic::body::Body,
    pub(super) _guard: ActiveStream,
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// Whether `idle` has resolved after `after` of (paused) time.
    async fn idle_after(activity: &Activity, after: Duration) -> bool {
        tokio::time::timeout(after, activity.idle(TIMEOUT))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_streams_is_idle_after_the_timeout() {
        let activity = Activity::new();
        assert!(!idle_after(&activity, TIMEOUT - Duration::from_millis(1)).await);
        // The timeout counts from the connection's start, not from the check.
        assert!(idle_after(&activity, Duration::from_millis(2)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_stream_keeps_the_connection_busy_for_as_long_as_it_is_open() {
        let activity = Activity::new();
        let stream = activity.open();
        assert!(!idle_after(&activity, TIMEOUT * 5).await);
        drop(stream);
        // Idle from the moment the stream closed.
        assert!(!idle_after(&activity, TIMEOUT - Duration::from_millis(1)).await);
        assert!(idle_after(&activity, Duration::from_millis(2)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeout_counts_from_the_last_stream_that_closed() {
        let activity = Activity::new();
        let idle = tokio::spawn({
            let activity = activity.clone();
            async move {
                activity.idle(TIMEOUT).await;
                Instant::now()
            }
        });
        // A request every 6 s for a minute: never 10 s without one.
        let start = Instant::now();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            let a = activity.open();
            let b = activity.open();
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(a);
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(b);
        }
        let last_closed = Instant::now();
        assert!(!idle.is_finished(), "idle while requests kept coming");
        let ended = idle.await.unwrap();
        // The timer wheel rounds to the millisecond.
        let due = last_closed + TIMEOUT;
        assert!(
            ended >= due && ended <= due + Duration::from_millis(2),
            "idle {:?} after the last stream closed",
            ended - last_closed
        );
        assert!(ended - start > Duration::from_secs(60));
    }
}
