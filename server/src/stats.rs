//! Per-shard counters: INFO stats, commandstats and errorstats, and the
//! command latencies behind `kvtier_command_duration_seconds`.
//!
//! Counting happens in plain integers owned by the shard's thread: no atomics
//! and no shared cache lines on the data path. Latencies are counted in the
//! fixed buckets the exporter uses ([`kvtier_store::latency`]), so a
//! histogram costs the data path one comparison loop. What is counted here
//! is reported by the `report` layer, INFO and metrics alike.

use std::collections::HashMap;
use std::time::Duration;

use kvtier_store::latency::{self, BUCKETS};

/// One command's counters (INFO commandstats, and the command metrics).
#[derive(Clone, Default)]
pub struct CommandStat {
    /// Executions.
    pub calls: u64,
    /// Total execution time, nanoseconds (INFO shows microseconds).
    pub nanos: u64,
    /// Refused before running (arity, auth, OOM).
    pub rejected: u64,
    /// Ran and replied with an error.
    pub failed: u64,
    /// Executions by latency bucket.
    pub latency: [u64; BUCKETS],
}

/// A shard's counters.
#[derive(Clone)]
pub struct ShardStats {
    /// Per command id (the ids of the command catalog, `Shared::catalog`).
    pub commands: Vec<CommandStat>,
    /// Commands executed on this shard.
    pub total_commands: u64,
    /// Connections accepted.
    pub connections_received: u64,
    /// Connections handed to another shard (`net::packing`).
    pub connections_moved: u64,
    /// Connections refused (maxclients).
    pub rejected_connections: u64,
    /// Clients closed because their request outgrew
    /// client-query-buffer-limit.
    pub query_buffer_closed: u64,
    /// Clients closed because all arriving requests outgrew
    /// maxmemory-clients.
    pub evicted_clients: u64,
    /// Clients closed by client-output-buffer-limit.
    pub output_buffer_closed: u64,
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
    /// MGETPREFIX ... BLOCK refused: every `max-blocked-clients` seat taken.
    pub blocked_clients_refused: u64,
    /// Reads of another shard's keys run on this thread, without waking
    /// the owner (see `Shard::with_store`).
    pub direct_reads: u64,
    /// Chain writes over several shards stored whole on this thread, every
    /// store held, instead of relayed (see `Shard::lock_all_stores`).
    pub direct_writes: u64,
    /// Jobs this shard sent to another shard's mailbox and awaited.
    pub mailbox_calls: u64,
    /// Microseconds connections spent polling before the thread slept
    /// (`--idle-poll-us`).
    pub idle_poll_us: u64,
    /// Requests read while their connection was polling.
    pub idle_poll_hits: u64,
    /// CONFIG RESETSTAT calls so far (the metrics exporter starts its
    /// counts again from zero when this changes).
    pub resets: u64,
    /// Recent commands-per-second samples (instantaneous_ops_per_sec).
    ops_samples: [u64; 16],
    ops_sample_at: usize,
    ops_last_total: u64,
}

impl ShardStats {
    /// Zeroed counters for `commands` commands.
    pub fn new(commands: usize) -> ShardStats {
        ShardStats {
            commands: vec![CommandStat::default(); commands],
            total_commands: 0,
            connections_received: 0,
            connections_moved: 0,
            rejected_connections: 0,
            query_buffer_closed: 0,
            evicted_clients: 0,
            output_buffer_closed: 0,
            net_input_bytes: 0,
            net_output_bytes: 0,
            errors: HashMap::new(),
            total_error_replies: 0,
            blocked_clients: 0,
            blocked_clients_refused: 0,
            direct_reads: 0,
            direct_writes: 0,
            mailbox_calls: 0,
            idle_poll_us: 0,
            idle_poll_hits: 0,
            resets: 0,
            ops_samples: [0; 16],
            ops_sample_at: 0,
            ops_last_total: 0,
        }
    }

    /// Records one execution of command `id` that took `nanos`.
    pub fn record(&mut self, id: usize, nanos: u64, failed: bool) {
        let stat = &mut self.commands[id];
        stat.calls += 1;
        stat.nanos += nanos;
        if failed {
            stat.failed += 1;
        }
        stat.latency[latency::bucket_ns(nanos)] += 1;
        self.total_commands += 1;
    }

    /// Records a command refused before it ran.
    pub fn reject(&mut self, id: Option<usize>) {
        if let Some(id) = id {
            self.commands[id].rejected += 1;
        }
    }

    /// Counts an error reply under its code (`ERR`, `WRONGTYPE`, ...).
    pub fn error_reply(&mut self, message: &str) {
        let code = message.split(' ').next().unwrap_or("ERR");
        match self.errors.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                self.errors.insert(code.to_string(), 1);
            }
        }
        self.total_error_replies += 1;
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&mut self) {
        for c in &mut self.commands {
            *c = CommandStat::default();
        }
        self.total_commands = 0;
        self.connections_received = 0;
        self.connections_moved = 0;
        self.rejected_connections = 0;
        self.query_buffer_closed = 0;
        self.evicted_clients = 0;
        self.blocked_clients_refused = 0;
        self.output_buffer_closed = 0;
        self.net_input_bytes = 0;
        self.net_output_bytes = 0;
        self.errors.clear();
        self.total_error_replies = 0;
        self.direct_reads = 0;
        self.direct_writes = 0;
        self.mailbox_calls = 0;
        self.idle_poll_us = 0;
        self.idle_poll_hits = 0;
        self.ops_last_total = 0;
        self.resets += 1;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_calls_failures_and_buckets() {
        let mut s = ShardStats::new(3);
        s.record(1, 3_000, false);
        s.record(1, 2_000_000, true);
        s.record(1, 5_000_000_000, false);
        s.reject(Some(2));
        let c = &s.commands[1];
        assert_eq!((c.calls, c.failed), (3, 1));
        assert_eq!(c.latency[0], 1);
        assert_eq!(c.latency[8], 1);
        assert_eq!(c.latency[BUCKETS - 1], 1);
        assert_eq!(s.commands[2].rejected, 1);
        s.error_reply("WRONGTYPE Operation against a key");
        assert_eq!(s.errors["WRONGTYPE"], 1);
    }
}
