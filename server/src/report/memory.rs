//! `# Memory` and `# Slabs`, and the memory metrics.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use super::metric::{Exporter, Metric};
use super::snapshot::{rss_bytes, sum, Info, ShardReport};
use crate::config::Num;
use crate::config::{human_bytes, total_system_memory};
use crate::shared::Shared;

/// Memory charged, by shard.
pub const USED: Metric = Metric::gauge(
    "kvtier_used_memory_bytes",
    "Memory charged for keys, values and index, by shard.",
)
.bytes();
/// The limit.
pub const MAXMEMORY: Metric = Metric::gauge(
    "kvtier_maxmemory_bytes",
    "The configured memory limit (0: none).",
)
.bytes();
/// The process's RSS.
pub const RSS: Metric = Metric::gauge(
    "kvtier_process_resident_memory_bytes",
    "Resident set size of the server process.",
)
.bytes();
/// The arena's mapped memory, by shard.
pub const SLAB_MAPPED: Metric = Metric::gauge(
    "kvtier_slab_mapped_bytes",
    "Memory the slab arena has mapped (pages and spans), by shard.",
)
.bytes();
/// Pages per size class.
pub const CLASS_PAGES: Metric = Metric::gauge(
    "kvtier_slab_class_pages",
    "Slab pages carved into each size class, by shard.",
);
/// Used slots per size class.
pub const CLASS_USED: Metric = Metric::gauge(
    "kvtier_slab_class_used_slots",
    "Slots holding a value (or still read by a reply), by shard and size class.",
);
/// Free slots per size class.
pub const CLASS_FREE: Metric = Metric::gauge(
    "kvtier_slab_class_free_slots",
    "Free slots, by shard and size class.",
);

/// This section's metrics.
pub const METRICS: &[&Metric] = &[
    &USED,
    &MAXMEMORY,
    &RSS,
    &SLAB_MAPPED,
    &CLASS_PAGES,
    &CLASS_USED,
    &CLASS_FREE,
];

/// `# Memory`
pub fn info(o: &mut Info, shared: &Shared, reports: &[ShardReport]) {
    let config = &shared.config;
    let used = sum(reports, |r| r.used_memory as u64);
    let peak = shared.memory_peak.fetch_max(used, Relaxed).max(used);
    let rss = rss_bytes();
    let maxmemory = config.num(Num::Maxmemory);
    let keys = sum(reports, |r| r.keys as u64);
    let overhead = keys * kvtier_store::ENTRY_OVERHEAD as u64;
    let dataset = used.saturating_sub(overhead);
    let total_mem = total_system_memory();
    let percent = |part: u64, whole: u64, empty: f64| {
        if whole == 0 {
            empty
        } else {
            part as f64 * 100.0 / whole as f64
        }
    };
    o.field("used_memory", used);
    o.field("used_memory_human", human_bytes(used));
    o.field("used_memory_rss", rss);
    o.field("used_memory_rss_human", human_bytes(rss));
    o.field("used_memory_peak", peak);
    o.field("used_memory_peak_human", human_bytes(peak));
    o.field(
        "used_memory_peak_perc",
        format_args!("{:.2}%", percent(used, peak, 100.0)),
    );
    o.field("used_memory_overhead", overhead);
    o.field("used_memory_index", sum(reports, |r| r.index_memory as u64));
    o.field(
        "used_memory_slab",
        sum(reports, |r| {
            (r.arena.page_bytes + r.arena.span_bytes) as u64
        }),
    );
    o.field("used_memory_startup", 0);
    o.field("used_memory_dataset", dataset);
    o.field(
        "used_memory_dataset_perc",
        format_args!("{:.2}%", percent(dataset, used, 0.0)),
    );
    o.field("total_system_memory", total_mem);
    o.field("total_system_memory_human", human_bytes(total_mem));
    o.field("maxmemory", maxmemory);
    o.field("maxmemory_human", human_bytes(maxmemory));
    o.field("maxmemory_policy", config.policy());
    o.field(
        "mem_fragmentation_ratio",
        format_args!(
            "{:.2}",
            if used == 0 {
                1.0
            } else {
                rss as f64 / used as f64
            }
        ),
    );
    o.field("mem_allocator", crate::about::mem_allocator());
    o.field("lazyfree_pending_objects", 0);
}

/// `# Slabs`: every shard's size classes, merged by slot size.
pub fn slabs(o: &mut Info, _shared: &Shared, reports: &[ShardReport]) {
    o.field("slab_pages", sum(reports, |r| r.arena.pages as u64));
    o.field(
        "slab_page_bytes",
        sum(reports, |r| r.arena.page_bytes as u64),
    );
    o.field(
        "slab_span_bytes",
        sum(reports, |r| r.arena.span_bytes as u64),
    );
    o.field(
        "slab_rebalanced_pages",
        sum(reports, |r| r.arena.rebalanced_pages),
    );
    let mut classes: BTreeMap<usize, (usize, usize, usize)> = BTreeMap::new();
    for r in reports {
        for c in &r.arena.classes {
            let e = classes.entry(c.slot_size).or_default();
            e.0 += c.pages;
            e.1 += c.used;
            e.2 += c.free;
        }
    }
    for (i, (size, (pages, used, free))) in classes.into_iter().enumerate() {
        o.field(
            format_args!("slab_class_{i}"),
            format_args!("slot_size={size},pages={pages},used={used},free={free}"),
        );
    }
}

/// This shard's memory figures.
pub fn export(e: &mut Exporter, r: &ShardReport) {
    let shard = || vec![("shard", r.id.to_string())];
    e.gauge(&USED, shard(), r.used_memory as f64);
    e.gauge(
        &SLAB_MAPPED,
        shard(),
        (r.arena.page_bytes + r.arena.span_bytes) as f64,
    );
    for class in &r.arena.classes {
        let labels = || {
            vec![
                ("shard", r.id.to_string()),
                ("slot_size", class.slot_size.to_string()),
            ]
        };
        e.gauge(&CLASS_PAGES, labels(), class.pages as f64);
        e.gauge(&CLASS_USED, labels(), class.used as f64);
        e.gauge(&CLASS_FREE, labels(), class.free as f64);
    }
}

/// The node's memory figures (from shard 0).
pub fn export_node(e: &mut Exporter, shared: &Shared) {
    e.gauge(
        &MAXMEMORY,
        Vec::new(),
        shared.config.num(Num::Maxmemory) as f64,
    );
    e.gauge(&RSS, Vec::new(), rss_bytes() as f64);
}
