//! Medians and percentiles of measured durations.

use std::time::Duration;

/// The `p`-th percentile (0–100) of `samples` by the nearest-rank method
/// (p99 of 1,000 samples is the 990th smallest). `None` when empty.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median (p50 by nearest rank).
pub fn median(samples: &[Duration]) -> Option<Duration> {
    percentile(samples, 50.0)
}

/// Milliseconds with two decimals, for reports.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&s, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(median(&s), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&s[..1], 99.0), Some(Duration::from_millis(1)));
        assert_eq!(median(&[]), None);
    }
}
