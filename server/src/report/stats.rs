//! `# Stats` and `# Errorstats`, and the traffic, expiry, eviction and hit
//! metrics.

use std::collections::BTreeMap;

use kvtier_store::{EvictReason, Refusal};

use super::metric::{Exporter, Metric};
use super::snapshot::{sum, Info, ShardReport};
use crate::shared::Shared;

/// Bytes read from clients.
pub const NET_INPUT: Metric =
    Metric::counter("kvtier_net_input_bytes_total", "Bytes read from clients.").bytes();
/// Bytes written to clients.
pub const NET_OUTPUT: Metric =
    Metric::counter("kvtier_net_output_bytes_total", "Bytes written to clients.").bytes();
/// Keys expired, by shard.
pub const EXPIRED: Metric = Metric::counter(
    "kvtier_expired_keys_total",
    "Keys removed because their TTL passed, by shard.",
);
/// Keys evicted, by shard and reason.
pub const EVICTED: Metric = Metric::counter(
    "kvtier_evicted_keys_total",
    "Keys evicted to stay under maxmemory, by shard and reason (orphan, leaf, inner, policy, rebalance).",
);
/// Writes refused, by shard and cause.
pub const REFUSED: Metric = Metric::counter(
    "kvtier_refused_writes_total",
    "Writes not stored for lack of memory (MSETBLOCK -1, SET OOM), by shard and cause (too_large, noeviction, no_room).",
);
/// Lookups that found their key, by shard.
pub const HITS: Metric = Metric::counter(
    "kvtier_keyspace_hits_total",
    "Key lookups that found the key, by shard.",
);
/// Lookups that missed, by shard.
pub const MISSES: Metric = Metric::counter(
    "kvtier_keyspace_misses_total",
    "Key lookups that missed, by shard.",
);

/// Reads of another shard's keys taken on the caller's thread.
pub const DIRECT_READS: Metric = Metric::counter(
    "kvtier_cross_shard_direct_reads_total",
    "Reads of another shard's keys run on the connection's own thread (no wake-up of the owner), by shard.",
);
/// Chain writes over shards stored whole on the caller's thread.
pub const DIRECT_WRITES: Metric = Metric::counter(
    "kvtier_cross_shard_direct_writes_total",
    "MSETBLOCK CHAIN calls over several shards stored whole on the connection's own thread (no hop), by shard.",
);
/// Jobs sent to another shard's mailbox and awaited.
pub const MAILBOX_CALLS: Metric = Metric::counter(
    "kvtier_cross_shard_calls_total",
    "Jobs sent to another shard's mailbox and awaited (one thread wake-up each way), by shard.",
);

/// Requests caught by polling.
pub const IDLE_POLL_HITS: Metric = Metric::counter(
    "kvtier_idle_poll_hits_total",
    "Requests read while their connection was polling (--idle-poll-us; INFO idle_poll_us has the time spent), each a thread wake-up saved, by shard.",
);

/// Keys lookups hold.
pub const HELD_KEYS: Metric = Metric::gauge(
    "kvtier_lookup_held_keys",
    "Keys that lookups (PREFIXLEN ... HOLD) hold against eviction now, by shard.",
);
/// Bytes lookups hold.
pub const HELD_BYTES: Metric = Metric::gauge(
    "kvtier_lookup_held_bytes",
    "Bytes of the values lookups (PREFIXLEN ... HOLD) hold against eviction now, by shard.",
)
.bytes();
/// What became of lookup holds.
pub const HOLDS: Metric = Metric::counter(
    "kvtier_lookup_holds_total",
    "Lookup holds by outcome (granted, refused: past a hold limit; released: read; expired; broken: a write found nothing else to evict), by shard.",
);

/// This section's metrics.
pub const METRICS: &[&Metric] = &[
    &HELD_KEYS,
    &HELD_BYTES,
    &HOLDS,
    &NET_INPUT,
    &NET_OUTPUT,
    &EXPIRED,
    &EVICTED,
    &REFUSED,
    &HITS,
    &MISSES,
    &DIRECT_READS,
    &DIRECT_WRITES,
    &MAILBOX_CALLS,
    &IDLE_POLL_HITS,
];

/// A line (or family of lines) of `# Stats`.
enum Row {
    /// A field summed over the shards.
    Sum(&'static str, fn(&ShardReport) -> u64),
    /// A field Redis has and kvtier never counts (no pub/sub): 0.
    Zero(&'static str),
    /// `evicted_<reason>_keys`, one per reason.
    EvictedBy,
    /// `refused_writes` and `refused_writes_<cause>`, one per cause.
    RefusedBy,
    /// `lookup_holds_<outcome>`, one per outcome.
    HoldsBy,
}

/// `# Stats`, in Redis's order, kvtier's own fields after Redis's kin.
const ROWS: &[Row] = &[
    Row::Sum("total_connections_received", |r| {
        r.stats.connections_received
    }),
    Row::Sum("total_commands_processed", |r| r.stats.total_commands),
    Row::Sum("instantaneous_ops_per_sec", |r| r.stats.ops_per_sec()),
    Row::Sum("total_net_input_bytes", |r| r.stats.net_input_bytes),
    Row::Sum("total_net_output_bytes", |r| r.stats.net_output_bytes),
    Row::Sum("rejected_connections", |r| r.stats.rejected_connections),
    Row::Sum("evicted_clients", |r| r.stats.evicted_clients),
    Row::Sum("client_query_buffer_limit_disconnections", |r| {
        r.stats.query_buffer_closed
    }),
    Row::Sum("client_output_buffer_limit_disconnections", |r| {
        r.stats.output_buffer_closed
    }),
    Row::Sum("expired_keys", |r| r.store.expired_keys),
    Row::Sum("evicted_keys", |r| r.store.evicted_keys),
    Row::EvictedBy,
    Row::RefusedBy,
    Row::Sum("keyspace_hits", |r| r.store.keyspace_hits),
    Row::Sum("keyspace_misses", |r| r.store.keyspace_misses),
    Row::Sum("lookup_held_keys", |r| r.holds.0 as u64),
    Row::Sum("lookup_held_bytes", |r| r.holds.1 as u64),
    Row::HoldsBy,
    Row::Zero("pubsub_channels"),
    Row::Zero("pubsub_patterns"),
    Row::Sum("total_error_replies", |r| r.stats.total_error_replies),
    Row::Sum("total_reads_processed", |r| r.stats.total_commands),
    Row::Sum("cross_shard_direct_reads", |r| r.stats.direct_reads),
    Row::Sum("cross_shard_direct_writes", |r| r.stats.direct_writes),
    Row::Sum("cross_shard_calls", |r| r.stats.mailbox_calls),
    Row::Sum("idle_poll_us", |r| r.stats.idle_poll_us),
    Row::Sum("idle_poll_hits", |r| r.stats.idle_poll_hits),
];

/// `# Stats`
pub fn info(o: &mut Info, _shared: &Shared, reports: &[ShardReport]) {
    for row in ROWS {
        match row {
            Row::Sum(name, f) => o.field(name, sum(reports, f)),
            Row::Zero(name) => o.field(name, 0),
            Row::EvictedBy => {
                for (i, reason) in EvictReason::ALL.iter().enumerate() {
                    o.field(
                        format_args!("evicted_{}_keys", reason.name()),
                        sum(reports, |r| r.store.evicted_by[i]),
                    );
                }
            }
            Row::RefusedBy => {
                o.field(
                    "refused_writes",
                    sum(reports, |r| r.store.refused_by.iter().sum()),
                );
                for (i, cause) in Refusal::ALL.iter().enumerate() {
                    o.field(
                        format_args!("refused_writes_{}", cause.name()),
                        sum(reports, |r| r.store.refused_by[i]),
                    );
                }
            }
            Row::HoldsBy => {
                for (i, (name, _)) in hold_outcomes(&Default::default()).iter().enumerate() {
                    let count = sum(reports, |r| hold_outcomes(&r.store.holds)[i].1);
                    o.field(format_args!("lookup_holds_{name}"), count);
                }
            }
        }
    }
}

/// A shard's lookup holds by outcome (INFO `lookup_holds_<outcome>`, the
/// metric's `outcome` label).
fn hold_outcomes(h: &kvtier_store::HoldStats) -> [(&'static str, u64); 5] {
    [
        ("granted", h.granted),
        ("refused", h.refused),
        ("released", h.released),
        ("expired", h.expired),
        ("broken", h.broken),
    ]
}

/// `# Errorstats`: error replies by code, every shard's added up.
pub fn errorstats(o: &mut Info, _shared: &Shared, reports: &[ShardReport]) {
    let mut merged: BTreeMap<&str, u64> = BTreeMap::new();
    for r in reports {
        for (code, n) in &r.stats.errors {
            *merged.entry(code).or_insert(0) += n;
        }
    }
    for (code, n) in merged {
        o.field(format_args!("errorstat_{code}"), format_args!("count={n}"));
    }
}

/// This shard's traffic and keyspace counters.
pub fn export(e: &mut Exporter, r: &ShardReport) {
    e.counter(&NET_INPUT, 0, Vec::new, r.stats.net_input_bytes);
    e.counter(&NET_OUTPUT, 0, Vec::new, r.stats.net_output_bytes);
    let shard = || vec![("shard", r.id.to_string())];
    e.counter(&EXPIRED, 0, shard, r.store.expired_keys);
    e.counter(&HITS, 0, shard, r.store.keyspace_hits);
    e.counter(&MISSES, 0, shard, r.store.keyspace_misses);
    e.counter(&DIRECT_READS, 0, shard, r.stats.direct_reads);
    e.counter(&DIRECT_WRITES, 0, shard, r.stats.direct_writes);
    e.counter(&MAILBOX_CALLS, 0, shard, r.stats.mailbox_calls);
    e.counter(&IDLE_POLL_HITS, 0, shard, r.stats.idle_poll_hits);
    e.gauge(&HELD_KEYS, shard(), r.holds.0 as f64);
    e.gauge(&HELD_BYTES, shard(), r.holds.1 as f64);
    for (i, (outcome, count)) in hold_outcomes(&r.store.holds).into_iter().enumerate() {
        let labels = || {
            vec![
                ("shard", r.id.to_string()),
                ("outcome", outcome.to_string()),
            ]
        };
        e.counter(&HOLDS, i as u64, labels, count);
    }
    for (i, reason) in EvictReason::ALL.iter().enumerate() {
        let labels = || {
            vec![
                ("shard", r.id.to_string()),
                ("reason", reason.name().to_string()),
            ]
        };
        e.counter(&EVICTED, i as u64, labels, r.store.evicted_by[i]);
    }
    for (i, cause) in Refusal::ALL.iter().enumerate() {
        let labels = || {
            vec![
                ("shard", r.id.to_string()),
                ("cause", cause.name().to_string()),
            ]
        };
        e.counter(&REFUSED, i as u64, labels, r.store.refused_by[i]);
    }
}
