//! Exponential backoff with full jitter for reconnects and Hello retries.
//!
//! Each delay is drawn uniformly from `[0, cap]`, where the cap starts at the
//! initial value and doubles per attempt up to the maximum ("full jitter", so a
//! fleet of agents cut off at once does not come back at once).

use std::time::Duration;

use rand::Rng;

use crate::config::ReconnectConfig;

/// Exponential backoff with full jitter. Call [`Backoff::next_delay`] before
/// each retry and [`Backoff::reset`] after a success that lasted.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    cap: Duration,
}

impl Backoff {
    /// A backoff whose cap starts at `initial` and doubles up to `max`
    /// (`max` is raised to `initial` if smaller).
    pub fn new(initial: Duration, max: Duration) -> Self {
        let max = max.max(initial);
        Self {
            initial,
            max,
            cap: initial,
        }
    }

    /// A backoff from the `reconnect:` configuration.
    pub fn from_config(config: &ReconnectConfig) -> Self {
        Self::new(config.initial(), config.max())
    }

    /// The cap the next delay is drawn under.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The next delay, uniformly in `[0, cap]`; the cap then doubles.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(&mut rand::rng())
    }

    /// [`Backoff::next_delay`] with a given random source (for tests).
    pub fn next_delay_with<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let cap = self.cap;
        self.cap = cap.saturating_mul(2).min(self.max);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.random_range(0..=nanos))
    }

    /// Starts over from the initial cap.
    pub fn reset(&mut self) {
        self.cap = self.initial;
    }
}

/// How long to wait before following a `Reconnect` whose deadline is
/// `grace` away: uniform in `[0, min(grace / 2, max)]`, `max` being
/// `reconnect.moveSpreadMaxMillis` (10 s by default). A draining gateway
/// tells all its agents at once; spread out, they reach the other replicas
/// at a rate their handshake admission takes, instead of as one storm (750
/// agents over 10 s is 75 handshakes/s), and each still has half its grace
/// or more to make the move.
pub fn move_spread(grace: Duration, max: Duration) -> Duration {
    move_spread_with(grace, max, &mut rand::rng())
}

/// [`move_spread`] with a given random source (for tests).
pub fn move_spread_with<R: Rng + ?Sized>(grace: Duration, max: Duration, rng: &mut R) -> Duration {
    let max = (grace / 2).min(max);
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn cap_grows_by_doubling_up_to_max() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let mut caps = Vec::new();
        for _ in 0..7 {
            caps.push(b.cap().as_millis());
            b.next_delay();
        }
        assert_eq!(caps, vec![100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn delays_stay_within_zero_and_cap() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        let mut below_half = 0;
        let mut above_half = 0;
        for _ in 0..2000 {
            let cap = b.cap();
            let d = b.next_delay_with(&mut rng);
            assert!(d <= cap, "{d:?} > {cap:?}");
            if d < cap / 2 {
                below_half += 1;
            } else {
                above_half += 1;
            }
        }
        // Full jitter: the whole range is used, not just the top of it.
        assert!(
            below_half > 500 && above_half > 500,
            "{below_half} {above_half}"
        );
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_secs(30));
        for _ in 0..10 {
            b.next_delay();
        }
        assert_eq!(b.cap(), Duration::from_secs(30));
        b.reset();
        assert_eq!(b.cap(), Duration::from_millis(50));
    }

    #[test]
    fn max_below_initial_is_raised() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(10));
        b.next_delay();
        assert_eq!(b.cap(), Duration::from_millis(50));
    }

    #[test]
    fn from_config_uses_defaults() {
        let b = Backoff::from_config(&ReconnectConfig::default());
        assert_eq!(
            b.cap(),
            Duration::from_millis(crate::config::DEFAULT_INITIAL_BACKOFF_MILLIS)
        );
    }

    #[test]
    fn moves_spread_over_half_the_grace_at_most() {
        let mut rng = StdRng::seed_from_u64(11);
        let secs = Duration::from_secs;
        let spreads: Vec<Duration> = (0..1000)
            .map(|_| move_spread_with(secs(30), secs(10), &mut rng))
            .collect();
        assert!(spreads.iter().all(|d| *d <= secs(10)));
        // Spread over the whole range, not bunched at one end.
        assert!(spreads.iter().any(|d| *d < secs(1)));
        assert!(spreads.iter().any(|d| *d > secs(9)));
        // A short grace keeps half of it for the move.
        assert!((0..100).all(|_| move_spread_with(secs(4), secs(10), &mut rng) <= secs(2)));
        assert_eq!(
            move_spread_with(Duration::ZERO, secs(10), &mut rng),
            Duration::ZERO
        );
        // A configured maximum of zero moves at once.
        assert_eq!(
            move_spread_with(secs(30), Duration::ZERO, &mut rng),
            Duration::ZERO
        );
    }
}
