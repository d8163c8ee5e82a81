//! Delivery without loss: an account's `CacheUp` messages from the moment a
//! watch produces them until the sidecar acknowledges them.
//!
//! Every message gets the account's next sequence number and stays in the
//! window until an `Ack{seq}` at or above it arrives. The window is bounded
//! ([`crate::config::CacheConfig::unacked_window`]): when it is full,
//! [`Outbox::push`] waits, so the watches slow down instead of memory growing.
//! A new cache stream sends `open` with the sequence number of the last ack
//! (so the sidecar sees no gap) and then replays the window from there
//! ([`Outbox::stream_from`]). The window outlives streams and connections; it
//! is the only state the agent keeps per account besides which kinds have an
//! unfinished listing.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use futures::Stream;
use spinlink_proto::v1::{CacheUp, cache_up};
use tokio::sync::{Notify, Semaphore};

use crate::kinds::WatchedKind;

/// Sequence numbers start from the process start time in microseconds, so
/// an agent that restarts keeps counting upwards and the sidecar never takes
/// new messages for ones it already holds.
pub fn initial_seq() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
        .unwrap_or(0)
}

#[derive(Debug)]
struct Inner {
    /// Sent or waiting to be sent, not acknowledged; seqs contiguous.
    window: VecDeque<CacheUp>,
    /// The last number handed out.
    last_seq: u64,
    /// The highest acknowledged number (or the starting point).
    acked: u64,
    /// Kinds whose listing began (`SyncStart`) and has not ended.
    listing: BTreeSet<WatchedKind>,
    /// When each message of `window` was pushed, in the same order (the
    /// delivery lag is the age of the oldest).
    pushed_at: VecDeque<tokio::time::Instant>,
    /// Messages pushed since creation (for metrics).
    pushed: u64,
    /// The leadership term the numbering belongs to (0: no election).
    term: u64,
}

/// One account's window of unacknowledged messages.
#[derive(Debug)]
pub struct Outbox {
    inner: Mutex<Inner>,
    space: Semaphore,
    added: Notify,
    capacity: usize,
}

impl Outbox {
    /// An empty window of `capacity` messages whose first message gets
    /// `start + 1`.
    pub fn new(capacity: usize, start: u64) -> Self {
        Self {
            inner: Mutex::new(Inner {
                window: VecDeque::new(),
                pushed_at: VecDeque::new(),
                last_seq: start,
                acked: start,
                listing: BTreeSet::new(),
                pushed: 0,
                term: 0,
            }),
            space: Semaphore::new(capacity),
            added: Notify::new(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `msg` with the next sequence number, waiting while the window
    /// is full. Returns the number given.
    pub async fn push(&self, msg: cache_up::Msg) -> u64 {
        // The semaphore is never closed, so acquiring only fails if it were.
        if let Ok(permit) = self.space.acquire().await {
            permit.forget();
        }
        let seq = {
            let mut inner = self.lock();
            match &msg {
                cache_up::Msg::SyncStart(s) => {
                    if let Some(k) = &s.kind {
                        inner.listing.insert(WatchedKind::from_proto(k));
                    }
                }
                cache_up::Msg::SyncEnd(s) => {
                    if let Some(k) = &s.kind {
                        inner.listing.remove(&WatchedKind::from_proto(k));
                    }
                }
                _ => {}
            }
            inner.last_seq += 1;
            inner.pushed += 1;
            let seq = inner.last_seq;
            inner.window.push_back(CacheUp {
                seq,
                msg: Some(msg),
            });
            inner.pushed_at.push_back(tokio::time::Instant::now());
            seq
        };
        self.added.notify_waiters();
        seq
    }

    /// Starts leadership term `term` (leader election): the first time for a
    /// term, the window is dropped and numbering continues from `start` if
    /// that is higher. The replica that led before counted from its own start
    /// time, so a number taken from the clock now is above anything it sent;
    /// what the window held is covered by resuming from the sidecar's
    /// resourceVersions. Returns whether anything changed.
    pub fn start_term(&self, term: u64, start: u64) -> bool {
        let freed = {
            let mut inner = self.lock();
            if inner.term == term {
                return false;
            }
            inner.term = term;
            let freed = inner.window.len();
            inner.window.clear();
            inner.pushed_at.clear();
            inner.listing.clear();
            let from = inner.last_seq.max(start);
            inner.last_seq = from;
            inner.acked = from;
            freed
        };
        self.space.add_permits(freed);
        true
    }

    /// The sidecar holds everything up to `seq`: drop it from the window.
    pub fn ack(&self, seq: u64) {
        let freed = {
            let mut inner = self.lock();
            let seq = seq.min(inner.last_seq);
            if seq <= inner.acked {
                return;
            }
            inner.acked = seq;
            let mut freed = 0;
            while inner.window.front().is_some_and(|m| m.seq <= seq) {
                inner.window.pop_front();
                inner.pushed_at.pop_front();
                freed += 1;
            }
            freed
        };
        self.space.add_permits(freed);
    }

    /// The highest acknowledged sequence number: what `open` carries.
    pub fn acked(&self) -> u64 {
        self.lock().acked
    }

    /// Messages in the window.
    pub fn unacked(&self) -> usize {
        self.lock().window.len()
    }

    /// How long the oldest unacknowledged message has waited: the delivery
    /// lag (zero when everything is acknowledged).
    pub fn lag(&self) -> std::time::Duration {
        self.lock()
            .pushed_at
            .front()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    /// The window's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `kind` has a listing that began and did not end (its watch
    /// cannot resume from the sidecar's resourceVersion: deletions during
    /// the listing would be missed).
    pub fn listing(&self, kind: &WatchedKind) -> bool {
        self.lock().listing.contains(kind)
    }

    fn after(&self, cursor: u64) -> Option<CacheUp> {
        let inner = self.lock();
        let front = inner.window.front()?.seq;
        let index = cursor.saturating_add(1).max(front) - front;
        inner.window.get(usize::try_from(index).ok()?).cloned()
    }

    /// The messages after `cursor` in order: first those already in the
    /// window (a replay), then each new one as it is pushed. Never ends.
    pub fn stream_from(
        self: std::sync::Arc<Self>,
        cursor: u64,
    ) -> impl Stream<Item = CacheUp> + Send + 'static {
        futures::stream::unfold((self, cursor), |(outbox, cursor)| async move {
            let msg = loop {
                // Registered before looking, so a push in between wakes us.
                let notified = outbox.added.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if let Some(msg) = outbox.after(cursor) {
                    break msg;
                }
                notified.await;
            };
            let seq = msg.seq;
            Some((msg, (outbox, seq)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use spinlink_proto::v1;
    use std::sync::Arc;
    use std::time::Duration;

    fn beat(n: i64) -> cache_up::Msg {
        cache_up::Msg::Heartbeat(v1::Heartbeat {
            unix_millis: n,
            ..Default::default()
        })
    }

    fn millis(m: &CacheUp) -> i64 {
        match &m.msg {
            Some(cache_up::Msg::Heartbeat(h)) => h.unix_millis,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn numbers_and_replay_after_ack() {
        let outbox = Arc::new(Outbox::new(10, 100));
        for n in 1..=5 {
            assert_eq!(outbox.push(beat(n)).await, 100 + n as u64);
        }
        let first: Vec<CacheUp> = outbox.clone().stream_from(100).take(5).collect().await;
        assert_eq!(
            first.iter().map(|m| m.seq).collect::<Vec<_>>(),
            vec![101, 102, 103, 104, 105]
        );
        // The sidecar held up to 103; a new stream replays 104 and 105.
        outbox.ack(103);
        assert_eq!(outbox.acked(), 103);
        assert_eq!(outbox.unacked(), 2);
        let replay: Vec<CacheUp> = outbox
            .clone()
            .stream_from(outbox.acked())
            .take(2)
            .collect()
            .await;
        assert_eq!(replay.iter().map(millis).collect::<Vec<_>>(), vec![4, 5]);
        // Old or duplicate acks change nothing; acks past the end are clamped.
        outbox.ack(101);
        assert_eq!(outbox.acked(), 103);
        outbox.ack(1_000);
        assert_eq!((outbox.acked(), outbox.unacked()), (105, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_lag_is_the_age_of_the_oldest_unacknowledged_message() {
        let outbox = Outbox::new(10, 0);
        assert_eq!(outbox.lag(), Duration::ZERO);
        outbox.push(beat(1)).await;
        tokio::time::advance(Duration::from_secs(3)).await;
        outbox.push(beat(2)).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(outbox.lag(), Duration::from_secs(5));
        outbox.ack(1);
        assert_eq!(outbox.lag(), Duration::from_secs(2));
        outbox.ack(2);
        assert_eq!(outbox.lag(), Duration::ZERO);
        outbox.push(beat(3)).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(outbox.start_term(1, 100));
        assert_eq!(outbox.lag(), Duration::ZERO, "a new term drops the window");
    }

    #[tokio::test]
    async fn a_new_leadership_term_numbers_from_the_clock() {
        let outbox = Arc::new(Outbox::new(2, 100));
        outbox.push(beat(1)).await;
        outbox.push(beat(2)).await;
        // The window is full; a new term drops it and frees its space.
        assert!(outbox.start_term(1, 5_000));
        assert_eq!((outbox.acked(), outbox.unacked()), (5_000, 0));
        assert_eq!(outbox.push(beat(3)).await, 5_001);
        assert_eq!(outbox.push(beat(4)).await, 5_002);
        // The same term again (the account moved connections): untouched.
        assert!(!outbox.start_term(1, 9_000));
        assert_eq!(outbox.unacked(), 2);
        // A clock behind the numbers never lowers them.
        outbox.ack(5_002);
        assert!(outbox.start_term(2, 10));
        assert_eq!(outbox.push(beat(5)).await, 5_003);
    }

    #[tokio::test]
    async fn a_stream_waits_for_new_messages() {
        let outbox = Arc::new(Outbox::new(10, 0));
        let mut stream = Box::pin(outbox.clone().stream_from(0));
        let pusher = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.push(beat(7)).await })
        };
        let m = stream.next().await.unwrap();
        assert_eq!((m.seq, millis(&m)), (1, 7));
        pusher.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_window_blocks_until_acked() {
        let outbox = Arc::new(Outbox::new(2, 0));
        outbox.push(beat(1)).await;
        outbox.push(beat(2)).await;
        let blocked = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.push(beat(3)).await })
        };
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(
            !blocked.is_finished(),
            "push must wait while the window is full"
        );
        assert_eq!(outbox.unacked(), 2);
        outbox.ack(1);
        assert_eq!(blocked.await.unwrap(), 3);
        assert_eq!(outbox.unacked(), 2);
    }

    #[tokio::test]
    async fn unfinished_listings_are_remembered() {
        let outbox = Outbox::new(10, 0);
        let kind = WatchedKind::new("", "v1", "pods", "Pod", true);
        outbox
            .push(cache_up::Msg::SyncStart(v1::SyncStart {
                kind: Some(kind.proto()),
            }))
            .await;
        assert!(outbox.listing(&kind));
        outbox
            .push(cache_up::Msg::SyncEnd(v1::SyncEnd {
                kind: Some(kind.proto()),
                resource_version: "5".into(),
            }))
            .await;
        assert!(!outbox.listing(&kind));
    }
}
