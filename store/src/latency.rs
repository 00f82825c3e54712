//! Latency in fixed buckets: counted where the work happens, with no
//! allocation and no lock, and published by the server as Prometheus
//! histograms with the same bounds (each bucket's count handed over at its
//! upper bound).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the buckets; one more bucket holds the rest.
pub const BOUNDS: [f64; 16] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Number of buckets (the bounds and one for everything above).
pub const BUCKETS: usize = BOUNDS.len() + 1;

/// [`BOUNDS`] in nanoseconds.
const BOUNDS_NS: [u64; BOUNDS.len()] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];

/// The bucket `took` falls in.
pub fn bucket(took: Duration) -> usize {
    bucket_ns(took.as_nanos().min(u64::MAX as u128) as u64)
}

/// The bucket of a time in nanoseconds (what connections measure).
pub fn bucket_ns(took: u64) -> usize {
    BOUNDS_NS
        .iter()
        .position(|&b| took <= b)
        .unwrap_or(BOUNDS.len())
}

/// The value a bucket's counts are published at (its upper bound; twice the
/// last bound for the overflow bucket).
pub fn bucket_value(bucket: usize) -> f64 {
    BOUNDS
        .get(bucket)
        .copied()
        .unwrap_or(BOUNDS[BOUNDS.len() - 1] * 2.0)
}

/// Bucket counts several threads add to (the spill tier's I/O threads).
#[derive(Default)]
pub struct SharedLatency {
    counts: [AtomicU64; BUCKETS],
}

impl SharedLatency {
    /// Counts one operation that took `took`.
    pub fn record(&self, took: Duration) {
        self.counts[bucket(took)].fetch_add(1, Relaxed);
    }

    /// The counts so far.
    pub fn counts(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.counts[i].load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_upper_bound() {
        assert_eq!(bucket(Duration::from_micros(3)), 0);
        assert_eq!(bucket(Duration::from_micros(5)), 0);
        assert_eq!(bucket(Duration::from_millis(2)), 8);
        assert_eq!(bucket(Duration::from_secs(5)), BOUNDS.len());
        let l = SharedLatency::default();
        l.record(Duration::from_millis(2));
        l.record(Duration::from_millis(2));
        assert_eq!(l.counts()[8], 2);
        l.record(Duration::from_secs(5));
        assert_eq!(l.counts()[BOUNDS.len()], 1);
        assert_eq!(bucket_value(8), 0.002_5);
        for (i, (&secs, &ns)) in BOUNDS.iter().zip(&BOUNDS_NS).enumerate() {
            assert_eq!((secs * 1e9).round() as u64, ns);
            assert_eq!(bucket_ns(ns), i);
            assert_eq!(bucket_ns(ns + 1), i + 1);
        }
    }
}
