//! Limit primitives shared by the listener and the tunnel: token buckets
//! ([`TokenBucket`], one per key in [`KeyedBuckets`]) and counts of open
//! things with a ceiling ([`Slots`]). A leaf: it names no other module of
//! the crate.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens per second up to `burst`, starting full.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: rate.max(0.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes the next token, now or when the bucket will have earned it:
    /// how long to wait for it (zero when there is one now), or `None` when
    /// that would be longer than `max_wait` (nothing is taken then). Tokens
    /// promised to earlier callers are counted, so each caller waits its
    /// turn: a burst of `n` past the bucket is spread over `n / rate`.
    pub fn reserve(&mut self, now: Instant, max_wait: Duration) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        // Below zero: tokens promised to waiting callers, paid back by the refill.
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Some(Duration::ZERO);
        }
        if self.rate <= 0.0 {
            return None;
        }
        let wait = (1.0 - self.tokens) / self.rate;
        if wait > max_wait.as_secs_f64() {
            return None;
        }
        self.tokens -= 1.0;
        Some(Duration::from_secs_f64(wait))
    }

    fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * self.rate >= self.burst
    }
}

/// Most keys [`KeyedBuckets`] holds before it forgets the full (idle) ones.
const KEYED_PRUNE_AT: usize = 4096;

/// One token bucket per key (per identity, per client network), created
/// full on first use.
#[derive(Debug)]
pub struct KeyedBuckets<K> {
    rate: f64,
    burst: u32,
    buckets: Mutex<Keyed<K>>,
}

#[derive(Debug)]
struct Keyed<K> {
    map: HashMap<K, TokenBucket>,
    /// Size at which the full buckets are next forgotten: twice what the
    /// last pruning left, so many busy keys cost a scan now and then, not
    /// one per call.
    prune_at: usize,
}

impl<K: Eq + Hash + Clone> KeyedBuckets<K> {
    /// Buckets of `rate` per second up to `burst`.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            rate,
            burst,
            buckets: Mutex::new(Keyed {
                map: HashMap::new(),
                prune_at: KEYED_PRUNE_AT,
            }),
        }
    }

    /// Takes one token from `key`'s bucket if there is one.
    pub fn try_take(&self, key: &K, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.map.len() >= buckets.prune_at {
            // A full bucket is the same as a new one: forgetting it loses nothing.
            buckets.map.retain(|_, b| !b.is_full(now));
            buckets.prune_at = KEYED_PRUNE_AT.max(2 * buckets.map.len());
        }
        buckets
            .map
            .entry(key.clone())
            .or_insert_with(|| TokenBucket::new(self.rate, self.burst, now))
            .try_take(now)
    }
}

/// Counts of open things per key, each with the same ceiling.
#[derive(Debug)]
pub struct Slots<K: Eq + Hash> {
    max: usize,
    // Every carried stream takes and gives back a slot of its identity.
    open: Mutex<HashMap<K, usize, foldhash::fast::RandomState>>,
}

/// One taken slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct Slot<K: Eq + Hash + Clone> {
    slots: Arc<Slots<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Slots<K> {
    /// Slots with `max` per key.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::new(HashMap::default()),
        })
    }

    /// Takes a slot for `key`, or `None` when `max` are taken.
    pub fn try_take(self: &Arc<Self>, key: K) -> Option<Slot<K>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            slots: self.clone(),
            key,
        })
    }

    /// Slots taken for `key`.
    pub fn taken(&self, key: &K) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(key).copied().unwrap_or(0)
    }
}

impl<K: Eq + Hash + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_allows_burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 3, t0);
        assert!(b.try_take(t0) && b.try_take(t0) && b.try_take(t0));
        assert!(!b.try_take(t0));
        assert!(!b.try_take(t0 + Duration::from_millis(400)));
        assert!(b.try_take(t0 + Duration::from_millis(500)));
        // Never more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(3600);
        assert!((0..3).all(|_| b.try_take(later)));
        assert!(!b.try_take(later));
    }

    #[test]
    fn reserve_spreads_a_burst_over_the_rate_within_the_wait() {
        let t0 = Instant::now();
        let max = Duration::from_secs(2);
        let mut b = TokenBucket::new(2.0, 2, t0);
        // The burst at once, then one every half second, each its own turn.
        let waits: Vec<_> = (0..6).map(|_| b.reserve(t0, max)).collect();
        let ms = |w: Option<Duration>| w.map(|d| d.as_millis());
        assert_eq!(
            waits.into_iter().map(ms).collect::<Vec<_>>(),
            [
                Some(0),
                Some(0),
                Some(500),
                Some(1000),
                Some(1500),
                Some(2000)
            ]
        );
        // The next would wait 2.5 s: refused, and nothing taken.
        assert_eq!(b.reserve(t0, max), None);
        assert!(!b.try_take(t0 + Duration::from_millis(2000)));
        // Once the promised tokens are paid back, the bucket admits again.
        assert_eq!(
            ms(b.reserve(t0 + Duration::from_millis(2500), max)),
            Some(0)
        );
        // No waiting allowed: a plain refusal, as `try_take`.
        let mut c = TokenBucket::new(2.0, 1, t0);
        assert_eq!(c.reserve(t0, Duration::ZERO), Some(Duration::ZERO));
        assert_eq!(c.reserve(t0, Duration::ZERO), None);
    }

    #[test]
    fn keyed_buckets_are_independent() {
        let t0 = Instant::now();
        let k = KeyedBuckets::new(0.001, 1);
        assert!(k.try_take(&"a", t0));
        assert!(!k.try_take(&"a", t0));
        assert!(k.try_take(&"b", t0));
    }

    #[test]
    fn keyed_buckets_forget_idle_keys_without_a_scan_per_call() {
        let t0 = Instant::now();
        let k = KeyedBuckets::new(1.0, 1);
        for i in 0..(3 * KEYED_PRUNE_AT) {
            assert!(k.try_take(&i, t0));
        }
        // All still busy: nothing forgotten, and the next scan is further off.
        let prune_at = k.buckets.lock().unwrap().prune_at;
        assert!(prune_at > 2 * KEYED_PRUNE_AT, "{prune_at}");
        // Once idle (full again), they go at the next scan.
        let later = t0 + Duration::from_secs(5);
        let fresh = prune_at - 3 * KEYED_PRUNE_AT + 1;
        for i in 0..fresh {
            k.try_take(&(usize::MAX - i), later);
        }
        assert_eq!(k.buckets.lock().unwrap().map.len(), fresh);
    }

    #[test]
    fn slots_give_back_on_drop() {
        let s = Slots::new(2);
        let a = s.try_take("x").unwrap();
        let _b = s.try_take("x").unwrap();
        assert!(s.try_take("x").is_none());
        assert!(s.try_take("y").is_some());
        drop(a);
        assert_eq!(s.taken(&"x"), 1);
        assert!(s.try_take("x").is_some());
    }
}
