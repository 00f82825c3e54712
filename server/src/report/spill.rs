//! `# Spill`, and the spill tier's metrics: each counter is one row, read
//! by INFO and the exporter alike.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use kvtier_store::spill::{SpillCounters, SpillDrop};

use super::metric::{CounterRow, Exporter, Metric};
use super::snapshot::{Info, ShardReport};
use crate::config::Num;
use crate::config::{admission_name, human_bytes};
use crate::shared::Shared;

/// Bytes of segment files.
pub const USED: Metric = Metric::gauge(
    "kvtier_spill_used_bytes",
    "Bytes of segment files the spill tier holds.",
)
.bytes();
/// The disk budget.
pub const MAX: Metric = Metric::gauge(
    "kvtier_spill_max_bytes",
    "Disk budget of the spill tier (--spill-max-bytes).",
)
.bytes();
/// Segment files.
pub const SEGMENTS: Metric = Metric::gauge(
    "kvtier_spill_segments",
    "Segment files in the spill directory.",
);
/// Disk requests waiting or running.
pub const QUEUE_DEPTH: Metric = Metric::gauge(
    "kvtier_spill_queue_depth",
    "Spill tier disk requests queued or running.",
);
/// Whether the warm restart is still indexing segments.
pub const LOADING: Metric = Metric::gauge(
    "kvtier_spill_loading",
    "1 while the warm restart indexes the spill tier's segments (keys not indexed yet read as misses), else 0.",
);
/// Bytes of write batches waiting.
pub const QUEUE_BYTES: Metric = Metric::gauge(
    "kvtier_spill_queue_bytes",
    "Bytes of spill write batches waiting for the disk.",
)
.bytes();
/// Disk read latency.
pub const READ_SECONDS: Metric = Metric::histogram(
    "kvtier_spill_read_seconds",
    "Latency of one spill tier disk read (sum approximated from bucket bounds).",
);
/// Disk write latency.
pub const WRITE_SECONDS: Metric = Metric::histogram(
    "kvtier_spill_write_seconds",
    "Latency of one spill tier batch write (sum approximated from bucket bounds).",
);

/// Blocks not kept on disk, by cause.
pub const DROPPED: Metric = Metric::counter(
    "kvtier_spill_dropped_total",
    "Blocks evicted from DRAM and not kept on disk, by cause (admission, queue_full, key_too_long, no_space, write_failed, reclaimed).",
);
/// DRAM of the disk index.
pub const INDEX_BYTES: Metric = Metric::gauge(
    "kvtier_spill_index_bytes",
    "DRAM the index of the blocks that are only on disk takes (outside maxmemory), by shard.",
)
.bytes();

/// The tier's counters: INFO field, metric, where the count is.
pub static COUNTERS: [CounterRow<SpillCounters>; 11] = [
    (
        "spill_writes",
        Metric::counter(
            "kvtier_spill_writes_total",
            "Records written to the spill tier.",
        ),
        |c| &c.writes,
    ),
    (
        "spill_write_bytes",
        Metric::counter(
            "kvtier_spill_write_bytes_total",
            "Bytes written to the spill tier.",
        )
        .bytes(),
        |c| &c.write_bytes,
    ),
    (
        "spill_reads",
        Metric::counter(
            "kvtier_spill_reads_total",
            "Records read back from the spill tier.",
        ),
        |c| &c.reads,
    ),
    (
        "spill_read_bytes",
        Metric::counter(
            "kvtier_spill_read_bytes_total",
            "Bytes read from the spill tier.",
        )
        .bytes(),
        |c| &c.read_bytes,
    ),
    (
        "spill_hits",
        Metric::counter(
            "kvtier_spill_hits_total",
            "Reads served from the spill tier.",
        ),
        |c| &c.hits,
    ),
    (
        "spill_promotions",
        Metric::counter(
            "kvtier_spill_promotions_total",
            "Blocks moved back from the spill tier to DRAM.",
        ),
        |c| &c.promotions,
    ),
    (
        "spill_reclaims",
        Metric::counter(
            "kvtier_spill_reclaims_total",
            "Spill segments reclaimed to stay within the budget.",
        ),
        |c| &c.reclaims,
    ),
    (
        "spill_rewrites",
        Metric::counter(
            "kvtier_spill_rewrites_total",
            "Live records rewritten by reclaim.",
        ),
        |c| &c.rewrites,
    ),
    (
        "spill_checksum_failures",
        Metric::counter(
            "kvtier_spill_checksum_failures_total",
            "Spill records that failed their CRC32C (served as misses).",
        ),
        |c| &c.checksum_failures,
    ),
    (
        "spill_io_errors",
        Metric::counter(
            "kvtier_spill_io_errors_total",
            "Spill tier reads or writes that failed.",
        ),
        |c| &c.io_errors,
    ),
    (
        "spill_disk_full",
        Metric::counter(
            "kvtier_spill_disk_full_total",
            "Spill writes refused because the disk was full.",
        ),
        |c| &c.disk_full,
    ),
];

/// This section's metrics, besides [`COUNTERS`].
pub const METRICS: &[&Metric] = &[
    &USED,
    &MAX,
    &SEGMENTS,
    &QUEUE_DEPTH,
    &LOADING,
    &QUEUE_BYTES,
    &READ_SECONDS,
    &WRITE_SECONDS,
    &DROPPED,
    &INDEX_BYTES,
];

/// `# Spill`
pub fn info(o: &mut Info, shared: &Shared, reports: &[ShardReport]) {
    let Some(tier) = &shared.spill else {
        o.field("spill_enabled", 0);
        return;
    };
    let dir = &tier.dir;
    let c = &dir.counters;
    let get = |a: &AtomicU64| a.load(Relaxed);
    let avg = |total: u64, n: u64| total.checked_div(n).unwrap_or(0);
    o.field("spill_enabled", 1);
    o.field("spill_dir", dir.path().display());
    o.field("spill_direct_io", dir.direct() as u8);
    o.field("spill_io_threads", tier.pool.threads());
    // Reads and writes are pread/pwritev on the I/O threads; io_uring was
    // measured and did not beat them
    // (docs/decisions/0025-spill-reads-on-pread-threads.md).
    o.field("spill_io_engine", "pread");
    o.field(
        "spill_admission",
        admission_name(shared.config.num(Num::SpillAdmission)),
    );
    o.field("spill_max_bytes", dir.max_bytes());
    o.field("spill_used_bytes", dir.used_bytes());
    o.field("spill_used_bytes_human", human_bytes(dir.used_bytes()));
    o.field("spill_segments", dir.segment_count());
    o.field(
        "spill_keys",
        reports.iter().map(|r| r.spill_keys).sum::<usize>(),
    );
    o.field(
        "spill_index_bytes",
        reports.iter().map(|r| r.spill_index_bytes).sum::<usize>(),
    );
    o.field(
        "spill_compact_keys",
        reports.iter().map(|r| r.spill_compact_keys).sum::<usize>(),
    );
    for (name, _, count) in COUNTERS.iter() {
        o.field(name, get(count(c)));
    }
    o.field("spill_dropped", c.dropped());
    for cause in SpillDrop::ALL {
        o.field(
            format_args!("spill_dropped_{}", cause.name()),
            get(&c.dropped_by[cause as usize]),
        );
    }
    o.field("spill_queue_depth", c.queue_depth.load(Relaxed));
    o.field("spill_queue_bytes", dir.in_flight());
    o.field("spill_avg_read_usec", avg(get(&c.read_us), get(&c.reads)));
    o.field(
        "spill_avg_write_usec",
        avg(get(&c.write_us), get(&c.write_calls)),
    );
    o.field("spill_sync_reads", get(&c.sync_reads));
    o.field("spill_loading", dir.loading() as u64);
    o.field("spill_load_segments_pending", get(&c.load_pending));
    o.field("spill_recovered", get(&c.recovered));
    o.field("spill_recovery_skipped", get(&c.recovery_skipped));
    o.field("spill_footers_read", get(&c.footers_read));
    o.field("spill_segments_scanned", get(&c.segments_scanned));
    o.field("spill_load_ms", get(&c.load_ms));
    let last = dir.last_error.lock().map(|e| e.clone()).unwrap_or_default();
    o.field("spill_last_error", last.replace(['\r', '\n'], " "));
}

/// This shard's disk index.
pub fn export_shard(e: &mut Exporter, r: &ShardReport) {
    let labels = vec![("shard", r.id.to_string())];
    e.gauge(&INDEX_BYTES, labels, r.spill_index_bytes as f64);
}

/// The tier's figures (shared by the shards: from shard 0).
pub fn export(e: &mut Exporter, shared: &Shared) {
    let Some(tier) = &shared.spill else {
        return;
    };
    let dir = &tier.dir;
    let c = &dir.counters;
    e.gauge(&USED, Vec::new(), dir.used_bytes() as f64);
    e.gauge(&MAX, Vec::new(), dir.max_bytes() as f64);
    e.gauge(&SEGMENTS, Vec::new(), dir.segment_count() as f64);
    e.gauge(&QUEUE_DEPTH, Vec::new(), c.queue_depth.load(Relaxed) as f64);
    e.gauge(&LOADING, Vec::new(), tier.dir.loading() as u8 as f64);
    e.gauge(&QUEUE_BYTES, Vec::new(), dir.in_flight() as f64);
    for (_, metric, count) in COUNTERS.iter() {
        e.counter(metric, 0, Vec::new, count(c).load(Relaxed));
    }
    for cause in SpillDrop::ALL {
        let labels = || vec![("cause", cause.name().to_string())];
        e.counter(
            &DROPPED,
            cause as u64,
            labels,
            c.dropped_by[cause as usize].load(Relaxed),
        );
    }
    e.histogram(&READ_SECONDS, 0, Vec::new, &c.read_latency.counts());
    e.histogram(&WRITE_SECONDS, 0, Vec::new, &c.write_latency.counts());
}
