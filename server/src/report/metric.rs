//! A metric's declaration ([`Metric`]: name, type, unit, help), and the
//! [`Exporter`] that hands figures to the `metrics` recorder.
//!
//! Figures are counted as plain totals, which CONFIG RESETSTAT zeroes. The
//! exporter remembers what it handed over last and passes counters on as
//! increments and latency buckets as new counts; told that a reset
//! happened ([`Exporter::counting_since`]), it counts every total again
//! from zero. So a Prometheus counter never runs backwards, and a reset
//! loses at most the counts of the second before it.

use std::collections::HashMap;

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Histogram, Unit};

use kvtier_store::latency::{bucket_value, BUCKETS};

/// What kind of series a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// A value now.
    Gauge,
    /// Latencies in the fixed buckets.
    Histogram,
}

/// A metric as `/metrics` describes it.
#[derive(Debug)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its unit, when it has one.
    pub unit: Option<Unit>,
    /// What it counts (the `# HELP` line).
    pub help: &'static str,
}

impl Metric {
    /// A counter.
    pub const fn counter(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Counter,
            unit: None,
            help,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Gauge,
            unit: None,
            help,
        }
    }

    /// A latency histogram, in seconds.
    pub const fn histogram(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Histogram,
            unit: Some(Unit::Seconds),
            help,
        }
    }

    /// The same metric, in bytes.
    pub const fn bytes(self) -> Metric {
        Metric {
            unit: Some(Unit::Bytes),
            ..self
        }
    }

    /// Declares this metric to the recorder (its `# HELP` and `# TYPE`).
    pub fn describe(&self) {
        let (name, help) = (self.name, self.help);
        match (self.kind, self.unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(name, unit, help),
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
            (Kind::Histogram, Some(unit)) => describe_histogram!(name, unit, help),
            (Kind::Histogram, None) => describe_histogram!(name, help),
        }
    }
}

/// A counter shown by INFO and exported alike: its INFO field, its
/// metric, and where the count lives in `S`.
pub type CounterRow<S> = (
    &'static str,
    Metric,
    fn(&S) -> &std::sync::atomic::AtomicU64,
);

/// A series' labels.
pub type Labels = Vec<(&'static str, String)>;

/// Which series of a metric: its labels told apart by a number the caller
/// picks (a command id, an eviction reason, a slot size), so finding a
/// series once a second allocates nothing.
type SeriesKey = (&'static str, u64);

/// Hands figures to the `metrics` recorder (one per shard thread).
#[derive(Default)]
pub struct Exporter {
    counters: HashMap<SeriesKey, (Counter, u64)>,
    histograms: HashMap<SeriesKey, (Histogram, [u64; BUCKETS])>,
    resets: u64,
}

impl Exporter {
    /// The totals to come are counted from the `resets`-th reset on: when
    /// that is a new one, what was handed over before is forgotten.
    pub fn counting_since(&mut self, resets: u64) {
        if resets == self.resets {
            return;
        }
        self.resets = resets;
        for (_, last) in self.counters.values_mut() {
            *last = 0;
        }
        for (_, last) in self.histograms.values_mut() {
            *last = [0; BUCKETS];
        }
    }

    /// A counter's series now totals `value`: the increase since the last
    /// call is handed on (all of `value` after a reset).
    pub fn counter(
        &mut self,
        metric: &'static Metric,
        series: u64,
        labels: impl FnOnce() -> Labels,
        value: u64,
    ) {
        debug_assert_eq!(metric.kind, Kind::Counter, "{}", metric.name);
        let (counter, last) = self
            .counters
            .entry((metric.name, series))
            .or_insert_with(|| (metrics::counter!(metric.name, &labels()), 0));
        let increase = if value >= *last { value - *last } else { value };
        if increase > 0 {
            counter.increment(increase);
        }
        *last = value;
    }

    /// A gauge's series is `value` now.
    pub fn gauge(&mut self, metric: &'static Metric, labels: Labels, value: f64) {
        debug_assert_eq!(metric.kind, Kind::Gauge, "{}", metric.name);
        metrics::gauge!(metric.name, &labels).set(value);
    }

    /// A latency series' buckets now total `counts`.
    pub fn histogram(
        &mut self,
        metric: &'static Metric,
        series: u64,
        labels: impl FnOnce() -> Labels,
        counts: &[u64; BUCKETS],
    ) {
        debug_assert_eq!(metric.kind, Kind::Histogram, "{}", metric.name);
        let (histogram, last) = self
            .histograms
            .entry((metric.name, series))
            .or_insert_with(|| (metrics::histogram!(metric.name, &labels()), [0; BUCKETS]));
        for (bucket, (&now, before)) in counts.iter().zip(last.iter_mut()).enumerate() {
            let new = if now >= *before { now - *before } else { now };
            if new > 0 {
                histogram.record_many(bucket_value(bucket), new as usize);
            }
            *before = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST: Metric = Metric::counter("kvtier_test_total", "A test counter.");

    #[test]
    fn a_reset_counts_the_totals_again_from_zero() {
        let mut e = Exporter::default();
        e.counter(&TEST, 0, Vec::new, 10);
        e.counter(&TEST, 0, Vec::new, 12);
        assert_eq!(e.counters[&(TEST.name, 0)].1, 12);
        // CONFIG RESETSTAT: the next total (3) is all new.
        e.counting_since(1);
        assert_eq!(e.counters[&(TEST.name, 0)].1, 0);
        e.counter(&TEST, 0, Vec::new, 3);
        assert_eq!(e.counters[&(TEST.name, 0)].1, 3);
        // The same reset seen again changes nothing.
        e.counting_since(1);
        assert_eq!(e.counters[&(TEST.name, 0)].1, 3);
    }
}
