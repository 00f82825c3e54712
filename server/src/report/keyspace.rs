//! `# Keyspace` and `# Shards`, and the keys metric.

use super::metric::{Exporter, Metric};
use super::snapshot::{sum, Info, ShardReport};
use crate::shared::Shared;

/// Keys, by shard.
pub const KEYS: Metric = Metric::gauge("kvtier_keys", "Keys stored, by shard.");

/// This section's metrics.
pub const METRICS: &[&Metric] = &[&KEYS];

/// `# Keyspace`: one database.
pub fn info(o: &mut Info, _shared: &Shared, reports: &[ShardReport]) {
    let keys = sum(reports, |r| r.keys as u64);
    if keys == 0 {
        return;
    }
    let volatile = sum(reports, |r| r.volatile as u64);
    let ttl_sum = sum(reports, |r| r.avg_ttl * r.volatile as u64);
    let avg = ttl_sum.checked_div(volatile).unwrap_or(0);
    o.field(
        "db0",
        format_args!("keys={keys},expires={volatile},avg_ttl={avg}"),
    );
}

/// `# Shards`: each shard's load (the skew key placement puts on them).
pub fn shards(o: &mut Info, _shared: &Shared, reports: &[ShardReport]) {
    for r in reports {
        o.field(
            format_args!("shard{}", r.id),
            format_args!(
                "keys={},used_memory={},commands={},ops_per_sec={},clients={},net_input_bytes={},net_output_bytes={},keyspace_hits={},keyspace_misses={}",
                r.keys,
                r.used_memory,
                r.stats.total_commands,
                r.stats.ops_per_sec(),
                r.clients,
                r.stats.net_input_bytes,
                r.stats.net_output_bytes,
                r.store.keyspace_hits,
                r.store.keyspace_misses
            ),
        );
    }
}

/// This shard's key count.
pub fn export(e: &mut Exporter, r: &ShardReport) {
    e.gauge(&KEYS, vec![("shard", r.id.to_string())], r.keys as f64);
}
