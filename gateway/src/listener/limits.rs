//! Admission of TLS handshakes, decided before TLS starts: token buckets
//! ([`crate::limits::TokenBucket`]; a handshake may wait its turn,
//! [`TokenBucket::reserve`]) put together in [`Admission`] (a global rate, a
//! share of it kept for returning agents, one budget per client network).

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::limits::{KeyedBuckets, TokenBucket};

/// Why [`Admission`] turned a handshake away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its turn at the global rate (or the strangers' share of it) is
    /// further away than the queue allows.
    Rate,
    /// Its client network used up its own budget.
    Source,
}

/// Admission of TLS handshakes, decided before TLS starts:
///
/// - every handshake takes a token of the global bucket (`rate`, `burst`),
///   waiting its turn for at most `queue`;
/// - a stranger (no session ticket of ours) first takes one of its client
///   network's bucket, at once or not at all, and one of the strangers'
///   bucket, which refills at the share of `rate` not reserved: however
///   many strangers come, from however many networks, returning agents
///   keep the reserved share of the global rate.
#[derive(Debug)]
pub struct Admission {
    all: Mutex<TokenBucket>,
    /// `None` when the whole rate is reserved.
    strangers: Option<Mutex<TokenBucket>>,
    per_source: KeyedBuckets<IpAddr>,
    queue: Duration,
}

/// Handshake limits, as configured.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionLimits {
    /// Handshakes per second, all together.
    pub rate: f64,
    /// Handshakes at once, all together.
    pub burst: u32,
    /// Percent of `rate` (and `burst`) strangers may not use.
    pub reserved_percent: u32,
    /// Ticketless handshakes per second per client network.
    pub per_source_rate: f64,
    /// Ticketless handshakes at once per client network.
    pub per_source_burst: u32,
    /// Longest wait for a turn.
    pub queue: Duration,
}

impl Admission {
    /// Admission with `limits`, all buckets full at `now`.
    pub fn new(limits: AdmissionLimits, now: Instant) -> Self {
        let share = f64::from(100 - limits.reserved_percent.min(100)) / 100.0;
        let strangers = (share > 0.0).then(|| {
            let burst = (f64::from(limits.burst) * share).ceil() as u32;
            Mutex::new(TokenBucket::new(limits.rate * share, burst, now))
        });
        Self {
            all: Mutex::new(TokenBucket::new(limits.rate, limits.burst, now)),
            strangers,
            per_source: KeyedBuckets::new(limits.per_source_rate, limits.per_source_burst),
            queue: limits.queue,
        }
    }

    /// Admits a handshake from `client` (`returning`: it offered a session
    /// ticket of ours): how long it must wait for its turn, or why not.
    pub fn admit(
        &self,
        client: IpAddr,
        returning: bool,
        now: Instant,
    ) -> Result<Duration, Refused> {
        let mut wait = Duration::ZERO;
        if !returning {
            if !self
                .per_source
                .try_take(&crate::cidr::client_network(client), now)
            {
                return Err(Refused::Source);
            }
            let Some(strangers) = &self.strangers else {
                return Err(Refused::Rate);
            };
            wait = lock(strangers)
                .reserve(now, self.queue)
                .ok_or(Refused::Rate)?;
        }
        let turn = lock(&self.all)
            .reserve(now, self.queue)
            .ok_or(Refused::Rate)?;
        Ok(wait.max(turn))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn admission(now: Instant) -> Admission {
        Admission::new(
            AdmissionLimits {
                rate: 10.0,
                burst: 10,
                reserved_percent: 50,
                per_source_rate: 1.0,
                per_source_burst: 2,
                queue: Duration::ZERO,
            },
            now,
        )
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_network_cannot_take_the_strangers_share() {
        let t0 = Instant::now();
        let a = admission(t0);
        // One /24 gets its burst and no more, from any of its addresses.
        assert!(a.admit(ip("198.51.100.1"), false, t0).is_ok());
        assert!(a.admit(ip("198.51.100.2"), false, t0).is_ok());
        assert_eq!(a.admit(ip("198.51.100.3"), false, t0), Err(Refused::Source));
        // Other networks still get in: 5 strangers' tokens, 2 used.
        for i in 0..3 {
            assert!(a.admit(ip(&format!("203.0.{i}.7")), false, t0).is_ok());
        }
        // Strangers' share gone; IPv6 /64s are networks of their own but
        // share it too.
        assert_eq!(
            a.admit(ip("2001:db8:0:1::9"), false, t0),
            Err(Refused::Rate)
        );
        // Returning agents keep the reserved half of the burst.
        for _ in 0..5 {
            assert_eq!(a.admit(ip("198.51.100.3"), true, t0), Ok(Duration::ZERO));
        }
        assert_eq!(a.admit(ip("192.0.2.1"), true, t0), Err(Refused::Rate));
    }

    #[test]
    fn many_networks_of_strangers_leave_returning_agents_their_share() {
        let t0 = Instant::now();
        let a = admission(t0);
        // A flood from a thousand networks, a hundred a second for 10 s:
        // strangers never get more than their half of the rate, and a
        // returning agent every 200 ms is admitted each time.
        let mut strangers = 0;
        for ms in (0..10_000).step_by(10) {
            let now = t0 + Duration::from_millis(ms);
            let net = ms / 10;
            let client = ip(&format!("10.{}.{}.1", net / 256, net % 256));
            strangers += usize::from(a.admit(client, false, now).is_ok());
            if ms % 200 == 0 {
                assert!(a.admit(ip("192.0.2.1"), true, now).is_ok(), "at {ms} ms");
            }
        }
        assert!((45..=56).contains(&strangers), "{strangers}");
    }
}
