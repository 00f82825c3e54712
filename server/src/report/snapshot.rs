//! The snapshot every INFO section and metric is rendered from: one
//! shard's figures taken on its own thread ([`ShardReport`]), every shard's
//! ([`gather`]), and the INFO text being built ([`Info`]).

use std::fmt::{Display, Write};

use kvtier_store::slab::ArenaStats;
use kvtier_store::StoreStats;

use crate::shard::{Shard, ShardGone};
use crate::stats::ShardStats;

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
    /// Keys blocked clients wait for.
    pub blocking_keys: u64,
    /// The shard's own counters, whole (commands, connections, bytes,
    /// errors, blocked clients, polling, resets).
    pub stats: ShardStats,
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
            blocking_keys: store.watched_keys() as u64,
            stats: (*stats).clone(),
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
