//! The snapshot every INFO section and metric is rendered from: one
//! shard's figures taken on its own thread ([`ShardReport`]), every shard's
//! ([`gather`]), and the INFO text being built ([`Info`]).

use std::fmt::{Display, Write};

use kvtier_store::slab::ArenaStats;
use kvtier_store::StoreStats;

use crate::shard::{Shard, ShardGone};
use crate::stats::CommandStat;

/// One shard's figures at one moment.
pub struct ShardReport {
    /// The shard.
    pub id: usize,
    /// Keys (including expired ones not yet collected).
    pub keys: usize,
    /// Keys with a TTL.
    pub volatile: usize,
    /// Mean TTL of volatile keys, ms.
    pub avg_ttl: u64,
    /// Bytes charged.
    pub used_memory: usize,
    /// Bytes charged to the index (keys, overhead, small values).
    pub index_memory: usize,
    /// Store counters.
    pub store: StoreStats,
    /// The slab arena's figures.
    pub arena: ArenaStats,
    /// Keys with a record in the spill tier.
    pub spill_keys: usize,
    /// DRAM of the index of blocks only on disk.
    pub spill_index_bytes: usize,
    /// Of the keys with a record, those in the compact disk index.
    pub spill_compact_keys: usize,
    /// Keys lookups hold against eviction, and their bytes.
    pub holds: (usize, usize),
    /// Connections.
    pub clients: usize,
    /// Clients in a blocking wait.
    pub blocked_clients: u64,
    /// Blocking reads refused by `max-blocked-clients`.
    pub blocked_clients_refused: u64,
    /// Keys blocked clients wait for.
    pub blocking_keys: u64,
    /// Commands executed.
    pub commands: u64,
    /// Connections accepted.
    pub connections_received: u64,
    /// Connections handed to another shard.
    pub connections_moved: u64,
    /// Connections refused.
    pub rejected_connections: u64,
    /// Clients closed by client-query-buffer-limit.
    pub query_buffer_closed: u64,
    /// Clients closed by maxmemory-clients.
    pub evicted_clients: u64,
    /// Clients closed by client-output-buffer-limit.
    pub output_buffer_closed: u64,
    /// Bytes in.
    pub net_input: u64,
    /// Bytes out.
    pub net_output: u64,
    /// Commands per second, recent.
    pub ops_per_sec: u64,
    /// Error replies by code.
    pub errors: Vec<(String, u64)>,
    /// Error replies.
    pub error_replies: u64,
    /// Per command (by statistics id).
    pub command_stats: Vec<CommandStat>,
    /// Reads of other shards' keys taken without waking their thread.
    pub direct_reads: u64,
    /// Chain writes over shards stored whole on this thread.
    pub direct_writes: u64,
    /// Jobs sent to other shards' mailboxes and awaited.
    pub mailbox_calls: u64,
    /// Microseconds connections spent polling before the thread slept.
    pub idle_poll_us: u64,
    /// Requests read while their connection was polling.
    pub idle_poll_hits: u64,
    /// CONFIG RESETSTAT calls so far (they zero the counts above).
    pub resets: u64,
    /// What each tenant slot holds in this shard.
    pub tenants: [kvtier_store::tenants::TenantUse; kvtier_store::tenants::TENANT_SLOTS],
}

impl ShardReport {
    /// `shard`'s figures now (on its own thread).
    pub fn of(shard: &Shard) -> ShardReport {
        let store = shard.store.lock();
        let stats = shard.stats.borrow();
        let now = kvtier_store::now_ms();
        ShardReport {
            id: shard.id,
            keys: store.len(),
            volatile: store.volatile_len(),
            avg_ttl: store.avg_ttl(now),
            used_memory: store.used_memory(),
            index_memory: store.index_memory(),
            store: store.stats,
            arena: store.arena_stats(),
            spill_keys: store.spill_keys(),
            spill_index_bytes: store.disk_index_memory(),
            spill_compact_keys: store.compact_disk_keys(),
            holds: (store.holds().len(), store.holds().bytes()),
            clients: shard.clients.borrow().len(),
            blocked_clients: stats.blocked_clients,
            blocked_clients_refused: stats.blocked_clients_refused,
            blocking_keys: store.watched_keys() as u64,
            commands: stats.total_commands,
            connections_received: stats.connections_received,
            connections_moved: stats.connections_moved,
            rejected_connections: stats.rejected_connections,
            query_buffer_closed: stats.query_buffer_closed,
            evicted_clients: stats.evicted_clients,
            output_buffer_closed: stats.output_buffer_closed,
            net_input: stats.net_input_bytes,
            net_output: stats.net_output_bytes,
            ops_per_sec: stats.ops_per_sec(),
            errors: stats.errors.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            error_replies: stats.total_error_replies,
            command_stats: stats.commands.clone(),
            direct_reads: stats.direct_reads,
            direct_writes: stats.direct_writes,
            mailbox_calls: stats.mailbox_calls,
            idle_poll_us: stats.idle_poll_us,
            idle_poll_hits: stats.idle_poll_hits,
            resets: stats.resets,
            tenants: store.tenant_usage(),
        }
    }
}

/// Every shard's report, in shard order.
pub async fn gather(shard: &Shard) -> Result<Vec<ShardReport>, ShardGone> {
    shard.call_all(ShardReport::of).await
}

/// The sum of `f` over the shards.
pub fn sum(reports: &[ShardReport], f: impl Fn(&ShardReport) -> u64) -> u64 {
    reports.iter().map(f).sum()
}

/// INFO text being built: `# Title` headers and `name:value` lines.
#[derive(Default)]
pub struct Info {
    /// The text so far.
    pub text: String,
}

impl Info {
    /// Starts a `# Title` section.
    pub fn section(&mut self, title: &str) {
        if !self.text.is_empty() {
            self.text.push_str("\r\n");
        }
        let _ = write!(self.text, "# {title}\r\n");
    }

    /// One `name:value` line.
    pub fn field(&mut self, name: impl Display, value: impl Display) {
        let _ = write!(self.text, "{name}:{value}\r\n");
    }
}

/// Resident set size of this process in bytes (from /proc).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
