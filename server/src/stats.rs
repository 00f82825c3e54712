//! Per-shard counters (INFO stats, commandstats, errorstats) and their
//! export as Prometheus metrics.
//!
//! Counting happens in plain integers owned by the shard's thread: no atomics
//! and no shared cache lines on the data path. The shard's cron publishes the
//! deltas to the `metrics` recorder a few times a second; latencies are kept
//! in fixed buckets (the same bounds the exporter uses) and handed over with
//! `record_many`, so a histogram costs the data path one comparison loop.

use std::collections::HashMap;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
use metrics::{Counter, Histogram};

use crate::commands::CommandTable;

/// Upper bounds (seconds) of the command latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// One command's counters (INFO commandstats).
#[derive(Clone, Default)]
pub struct CommandStat {
    /// Executions.
    pub calls: u64,
    /// Total execution time, microseconds.
    pub usec: u64,
    /// Refused before running (arity, auth, OOM).
    pub rejected: u64,
    /// Ran and replied with an error.
    pub failed: u64,
    /// Latency bucket counts not yet exported.
    latency: [u32; LATENCY_BUCKETS.len() + 1],
    /// Calls not yet exported.
    unexported_calls: u64,
    /// Errors not yet exported.
    unexported_errors: u64,
}

/// A shard's counters.
pub struct ShardStats {
    /// Per command id (see [`CommandTable::id`]).
    pub commands: Vec<CommandStat>,
    /// Commands executed on this shard.
    pub total_commands: u64,
    /// Connections accepted.
    pub connections_received: u64,
    /// Connections refused (maxclients).
    pub rejected_connections: u64,
    /// Bytes read from clients.
    pub net_input_bytes: u64,
    /// Bytes written to clients.
    pub net_output_bytes: u64,
    /// Error replies by error code (errorstats).
    pub errors: HashMap<String, u64>,
    /// Error replies in all.
    pub total_error_replies: u64,
    /// Clients waiting in a blocking command (MGETPREFIX BLOCK).
    pub blocked_clients: u64,
    /// Recent commands-per-second samples (instantaneous_ops_per_sec).
    ops_samples: [u64; 16],
    ops_sample_at: usize,
    ops_last_total: u64,
    exported: Exported,
    handles: Vec<Option<(Counter, Counter, Histogram)>>,
}

/// Totals already handed to the metrics recorder.
#[derive(Default)]
struct Exported {
    connections: u64,
    input: u64,
    output: u64,
}

impl ShardStats {
    /// Zeroed counters for `commands` commands.
    pub fn new(commands: usize) -> ShardStats {
        ShardStats {
            commands: vec![CommandStat::default(); commands],
            total_commands: 0,
            connections_received: 0,
            rejected_connections: 0,
            net_input_bytes: 0,
            net_output_bytes: 0,
            errors: HashMap::new(),
            total_error_replies: 0,
            blocked_clients: 0,
            ops_samples: [0; 16],
            ops_sample_at: 0,
            ops_last_total: 0,
            exported: Exported::default(),
            handles: (0..commands).map(|_| None).collect(),
        }
    }

    /// Records one execution of command `id`.
    pub fn record(&mut self, id: usize, took: Duration, failed: bool) {
        let stat = &mut self.commands[id];
        stat.calls += 1;
        stat.unexported_calls += 1;
        stat.usec += took.as_micros() as u64;
        if failed {
            stat.failed += 1;
            stat.unexported_errors += 1;
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        stat.latency[bucket] += 1;
        self.total_commands += 1;
    }

    /// Records a command refused before it ran.
    pub fn reject(&mut self, id: Option<usize>) {
        if let Some(id) = id {
            self.commands[id].rejected += 1;
            self.commands[id].unexported_errors += 1;
        }
    }

    /// Counts an error reply under its code (`ERR`, `WRONGTYPE`, ...).
    pub fn error_reply(&mut self, message: &str) {
        let code = message.split(' ').next().unwrap_or("ERR");
        *self.errors.entry(code.to_string()).or_insert(0) += 1;
        self.total_error_replies += 1;
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&mut self) {
        for c in &mut self.commands {
            c.calls = 0;
            c.usec = 0;
            c.rejected = 0;
            c.failed = 0;
        }
        self.total_commands = 0;
        self.connections_received = 0;
        self.rejected_connections = 0;
        self.net_input_bytes = 0;
        self.net_output_bytes = 0;
        self.errors.clear();
        self.total_error_replies = 0;
        self.ops_last_total = 0;
        self.exported = Exported::default();
    }

    /// Samples the command rate; call every `interval`.
    pub fn sample_ops(&mut self, interval: Duration) {
        let done = self.total_commands.saturating_sub(self.ops_last_total);
        self.ops_last_total = self.total_commands;
        let per_sec = (done as f64 / interval.as_secs_f64().max(1e-3)) as u64;
        self.ops_samples[self.ops_sample_at % self.ops_samples.len()] = per_sec;
        self.ops_sample_at += 1;
    }

    /// Mean of the recent rate samples.
    pub fn ops_per_sec(&self) -> u64 {
        let n = self.ops_sample_at.min(self.ops_samples.len()).max(1);
        self.ops_samples.iter().sum::<u64>() / n as u64
    }

    /// Hands what was counted since the last call to the metrics recorder.
    pub fn export(&mut self, table: &CommandTable) {
        for (id, stat) in self.commands.iter_mut().enumerate() {
            if stat.unexported_calls == 0 && stat.unexported_errors == 0 {
                continue;
            }
            let name = table.all[id].name;
            let (calls, errors, latency) = self.handles[id].get_or_insert_with(|| {
                (
                    counter!("kvtier_commands_total", "cmd" => name),
                    counter!("kvtier_command_errors_total", "cmd" => name),
                    metrics::histogram!("kvtier_command_duration_seconds", "cmd" => name),
                )
            });
            calls.increment(stat.unexported_calls);
            errors.increment(stat.unexported_errors);
            for (bucket, count) in stat.latency.iter_mut().enumerate() {
                if *count > 0 {
                    let value = LATENCY_BUCKETS
                        .get(bucket)
                        .copied()
                        .unwrap_or(LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1] * 2.0);
                    latency.record_many(value, *count as usize);
                    *count = 0;
                }
            }
            stat.unexported_calls = 0;
            stat.unexported_errors = 0;
        }
        let e = &mut self.exported;
        counter!("kvtier_connections_total")
            .increment(self.connections_received.saturating_sub(e.connections));
        counter!("kvtier_net_input_bytes_total")
            .increment(self.net_input_bytes.saturating_sub(e.input));
        counter!("kvtier_net_output_bytes_total")
            .increment(self.net_output_bytes.saturating_sub(e.output));
        e.connections = self.connections_received;
        e.input = self.net_input_bytes;
        e.output = self.net_output_bytes;
    }
}

/// Publishes a shard's store figures as gauges labelled by shard.
pub fn export_store(shard: usize, store: &kvtier_store::Store, clients: usize) {
    let label = shard.to_string();
    gauge!("kvtier_keys", "shard" => label.clone()).set(store.len() as f64);
    gauge!("kvtier_used_memory_bytes", "shard" => label.clone()).set(store.used_memory() as f64);
    gauge!("kvtier_connected_clients", "shard" => label.clone()).set(clients as f64);
    let s = store.stats;
    counter!("kvtier_expired_keys_total", "shard" => label.clone()).absolute(s.expired_keys);
    for (i, reason) in kvtier_store::EvictReason::ALL.iter().enumerate() {
        counter!("kvtier_evicted_keys_total", "shard" => label.clone(), "reason" => reason.name())
            .absolute(s.evicted_by[i]);
    }
    let arena = store.arena_stats();
    gauge!("kvtier_slab_mapped_bytes", "shard" => label.clone())
        .set((arena.page_bytes + arena.span_bytes) as f64);
    for class in &arena.classes {
        let size = class.slot_size.to_string();
        gauge!("kvtier_slab_class_pages", "shard" => label.clone(), "slot_size" => size.clone())
            .set(class.pages as f64);
        gauge!("kvtier_slab_class_used_slots", "shard" => label.clone(), "slot_size" => size.clone())
            .set(class.used as f64);
        gauge!("kvtier_slab_class_free_slots", "shard" => label.clone(), "slot_size" => size)
            .set(class.free as f64);
    }
    counter!("kvtier_keyspace_hits_total", "shard" => label.clone()).absolute(s.keyspace_hits);
    counter!("kvtier_keyspace_misses_total", "shard" => label).absolute(s.keyspace_misses);
}

/// Exports the spill tier's figures (shared by the shards: once, from shard 0).
pub fn export_spill(dir: &kvtier_store::spill::SpillDir) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &dir.counters;
    gauge!("kvtier_spill_used_bytes").set(dir.used_bytes() as f64);
    gauge!("kvtier_spill_max_bytes").set(dir.max_bytes() as f64);
    gauge!("kvtier_spill_segments").set(dir.segment_count() as f64);
    gauge!("kvtier_spill_queue_depth").set(c.queue_depth.load(Relaxed) as f64);
    gauge!("kvtier_spill_queue_bytes").set(dir.in_flight() as f64);
    let counters = [
        ("kvtier_spill_writes_total", &c.writes),
        ("kvtier_spill_write_bytes_total", &c.write_bytes),
        ("kvtier_spill_reads_total", &c.reads),
        ("kvtier_spill_read_bytes_total", &c.read_bytes),
        ("kvtier_spill_hits_total", &c.hits),
        ("kvtier_spill_promotions_total", &c.promotions),
        ("kvtier_spill_reclaims_total", &c.reclaims),
        ("kvtier_spill_rewrites_total", &c.rewrites),
        ("kvtier_spill_dropped_total", &c.dropped),
        ("kvtier_spill_checksum_failures_total", &c.checksum_failures),
        ("kvtier_spill_io_errors_total", &c.io_errors),
        ("kvtier_spill_disk_full_total", &c.disk_full),
    ];
    for (name, value) in counters {
        counter!(name).absolute(value.load(Relaxed));
    }
    for (name, latency) in [
        ("kvtier_spill_read_seconds", &c.read_latency),
        ("kvtier_spill_write_seconds", &c.write_latency),
    ] {
        let histogram = metrics::histogram!(name);
        for (bucket, n) in latency.take().into_iter().enumerate() {
            if n > 0 {
                histogram.record_many(kvtier_store::latency::bucket_value(bucket), n as usize);
            }
        }
    }
}

/// Exports the cluster's counters and node health (shard 0, once a second).
pub fn export_cluster(cluster: &kvtier_cluster::Cluster) {
    use std::sync::atomic::Ordering::Relaxed;
    let st = &cluster.stats;
    let counters = [
        ("kvtier_cluster_forwarded_total", &st.forwarded),
        ("kvtier_cluster_moved_total", &st.moved),
        ("kvtier_cluster_coordinated_total", &st.coordinated),
        ("kvtier_cluster_replica_hits_total", &st.replica_hits),
        ("kvtier_cluster_replica_misses_total", &st.replica_misses),
        ("kvtier_cluster_copies_sent_total", &st.copies_sent),
        ("kvtier_cluster_copies_received_total", &st.copies_received),
    ];
    for (name, value) in counters {
        counter!(name).absolute(value.load(Relaxed));
    }
    let view = cluster.view();
    gauge!("kvtier_cluster_epoch").set(view.epoch as f64);
    gauge!("kvtier_cluster_replicated_keys").set(cluster.replicated_count.load(Relaxed) as f64);
    gauge!("kvtier_cluster_hot_keys").set(cluster.hot_keys().len() as f64);
    for (node, alive) in view.nodes.iter().zip(&view.alive) {
        gauge!("kvtier_cluster_node_up", "node" => node.id.clone()).set(*alive as u8 as f64);
    }
}

/// Declares every metric once, with its unit and help text.
pub fn describe_metrics() {
    describe_counter!(
        "kvtier_commands_total",
        "Commands executed, by command name."
    );
    describe_counter!(
        "kvtier_command_errors_total",
        "Commands that were refused or replied with an error, by command name."
    );
    describe_histogram!(
        "kvtier_command_duration_seconds",
        Unit::Seconds,
        "Time to execute a command on its shard, by command name (sum approximated from bucket bounds)."
    );
    describe_counter!("kvtier_connections_total", "Client connections accepted.");
    describe_gauge!(
        "kvtier_connected_clients",
        "Client connections open, by shard."
    );
    describe_counter!(
        "kvtier_net_input_bytes_total",
        Unit::Bytes,
        "Bytes read from clients."
    );
    describe_counter!(
        "kvtier_net_output_bytes_total",
        Unit::Bytes,
        "Bytes written to clients."
    );
    describe_gauge!("kvtier_keys", "Keys stored, by shard.");
    describe_gauge!(
        "kvtier_used_memory_bytes",
        Unit::Bytes,
        "Memory charged for keys, values and index, by shard."
    );
    describe_gauge!(
        "kvtier_maxmemory_bytes",
        Unit::Bytes,
        "The configured memory limit (0: none)."
    );
    describe_gauge!(
        "kvtier_process_resident_memory_bytes",
        Unit::Bytes,
        "Resident set size of the server process."
    );
    describe_counter!(
        "kvtier_expired_keys_total",
        "Keys removed because their TTL passed, by shard."
    );
    describe_counter!(
        "kvtier_evicted_keys_total",
        "Keys evicted to stay under maxmemory, by shard and reason (orphan, leaf, inner, policy, rebalance)."
    );
    describe_gauge!(
        "kvtier_slab_mapped_bytes",
        Unit::Bytes,
        "Memory the slab arena has mapped (pages and spans), by shard."
    );
    describe_gauge!(
        "kvtier_slab_class_pages",
        "Slab pages carved into each size class, by shard."
    );
    describe_gauge!(
        "kvtier_slab_class_used_slots",
        "Slots holding a value (or still read by a reply), by shard and size class."
    );
    describe_gauge!(
        "kvtier_slab_class_free_slots",
        "Free slots, by shard and size class."
    );
    describe_counter!(
        "kvtier_keyspace_hits_total",
        "Key lookups that found the key, by shard."
    );
    describe_counter!(
        "kvtier_keyspace_misses_total",
        "Key lookups that missed, by shard."
    );
    for (name, help) in [
        (
            "kvtier_spill_used_bytes",
            "Bytes of segment files the spill tier holds.",
        ),
        (
            "kvtier_spill_max_bytes",
            "Disk budget of the spill tier (--spill-max-bytes).",
        ),
        (
            "kvtier_spill_queue_bytes",
            "Bytes of spill write batches waiting for the disk.",
        ),
    ] {
        describe_gauge!(name, Unit::Bytes, help);
    }
    describe_gauge!(
        "kvtier_spill_segments",
        "Segment files in the spill directory."
    );
    describe_gauge!(
        "kvtier_spill_queue_depth",
        "Spill tier disk requests queued or running."
    );
    for (name, help) in [
        (
            "kvtier_spill_writes_total",
            "Records written to the spill tier.",
        ),
        (
            "kvtier_spill_reads_total",
            "Records read back from the spill tier.",
        ),
        (
            "kvtier_spill_hits_total",
            "Reads served from the spill tier.",
        ),
        (
            "kvtier_spill_promotions_total",
            "Blocks moved back from the spill tier to DRAM.",
        ),
        (
            "kvtier_spill_reclaims_total",
            "Spill segments reclaimed to stay within the budget.",
        ),
        (
            "kvtier_spill_rewrites_total",
            "Live records rewritten by reclaim.",
        ),
        (
            "kvtier_spill_dropped_total",
            "Blocks the spill tier dropped (reclaim, full queue or full disk).",
        ),
        (
            "kvtier_spill_checksum_failures_total",
            "Spill records that failed their CRC32C (served as misses).",
        ),
        (
            "kvtier_spill_io_errors_total",
            "Spill tier reads or writes that failed.",
        ),
        (
            "kvtier_spill_disk_full_total",
            "Spill writes refused because the disk was full.",
        ),
    ] {
        describe_counter!(name, help);
    }
    for (name, help) in [
        (
            "kvtier_spill_write_bytes_total",
            "Bytes written to the spill tier.",
        ),
        (
            "kvtier_spill_read_bytes_total",
            "Bytes read from the spill tier.",
        ),
    ] {
        describe_counter!(name, Unit::Bytes, help);
    }
    describe_histogram!(
        "kvtier_spill_read_seconds",
        Unit::Seconds,
        "Latency of one spill tier disk read."
    );
    describe_histogram!(
        "kvtier_spill_write_seconds",
        Unit::Seconds,
        "Latency of one spill tier batch write."
    );
    describe_counter!(
        "kvtier_cluster_forwarded_total",
        "Commands forwarded to the node owning their keys."
    );
    describe_counter!(
        "kvtier_cluster_moved_total",
        "MOVED redirections answered (--cluster-redirect yes)."
    );
    describe_counter!(
        "kvtier_cluster_coordinated_total",
        "Multi-key commands spread over several nodes by this node."
    );
    describe_counter!(
        "kvtier_cluster_replica_hits_total",
        "Reads answered from this node's copies of other nodes' hot keys."
    );
    describe_counter!(
        "kvtier_cluster_replica_misses_total",
        "Reads of keys with copies here that had to read through to the owner."
    );
    describe_counter!(
        "kvtier_cluster_copies_sent_total",
        "Copies of this node's hot keys sent to replicas."
    );
    describe_counter!(
        "kvtier_cluster_copies_received_total",
        "Copies of other nodes' hot keys stored here."
    );
    describe_gauge!(
        "kvtier_cluster_epoch",
        "Configuration epoch of the cluster's node list."
    );
    describe_gauge!(
        "kvtier_cluster_replicated_keys",
        "Keys of this node that have copies on other nodes."
    );
    describe_gauge!(
        "kvtier_cluster_hot_keys",
        "Keys read above --hot-key-threshold in the last window."
    );
    describe_gauge!(
        "kvtier_cluster_node_up",
        "1 while a cluster node answers pings, 0 once it is marked failed, by node."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_calls_failures_and_buckets() {
        let mut s = ShardStats::new(3);
        s.record(1, Duration::from_micros(3), false);
        s.record(1, Duration::from_millis(2), true);
        s.record(1, Duration::from_secs(5), false);
        s.reject(Some(2));
        let c = &s.commands[1];
        assert_eq!((c.calls, c.failed), (3, 1));
        assert_eq!(c.latency[0], 1);
        assert_eq!(c.latency[8], 1);
        assert_eq!(c.latency[LATENCY_BUCKETS.len()], 1);
        assert_eq!(s.commands[2].rejected, 1);
        s.error_reply("WRONGTYPE Operation against a key");
        assert_eq!(s.errors["WRONGTYPE"], 1);
    }
}
