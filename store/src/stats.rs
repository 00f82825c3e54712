//! What a store counts for INFO and the metrics: evictions by reason,
//! hits and misses, refusals, per tenant.

use crate::holds::HoldStats;
use crate::tenants;

/// Why a key was evicted (metrics: evictions by reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// `prefix`: its parent was gone, no lookup could reach it.
    Orphan,
    /// `prefix`: a block with no cached child (or no chain at all).
    Leaf,
    /// `prefix`: a block with cached children, when nothing else could go.
    Inner,
    /// One of Redis's policies chose it.
    Policy,
    /// Its page was emptied for a size class that had no room.
    Rebalance,
}

impl EvictReason {
    /// Every reason, in metric order.
    pub const ALL: [EvictReason; 5] = [
        EvictReason::Orphan,
        EvictReason::Leaf,
        EvictReason::Inner,
        EvictReason::Policy,
        EvictReason::Rebalance,
    ];

    /// Metric label.
    pub fn name(self) -> &'static str {
        match self {
            EvictReason::Orphan => "orphan",
            EvictReason::Leaf => "leaf",
            EvictReason::Inner => "inner",
            EvictReason::Policy => "policy",
            EvictReason::Rebalance => "rebalance",
        }
    }
}

/// Counters a shard reports in INFO stats.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// Keys removed because their TTL passed.
    pub expired_keys: u64,
    /// Keys removed to make room.
    pub evicted_keys: u64,
    /// Evictions by [`EvictReason`] (same order as `EvictReason::ALL`).
    pub evicted_by: [u64; 5],
    /// Reads that found their key.
    pub keyspace_hits: u64,
    /// Reads that did not.
    pub keyspace_misses: u64,
    /// Lookup holds (`PREFIXLEN ... HOLD`).
    pub holds: HoldStats,
    /// Writes not stored, by [`Refusal`](crate::errors::Refusal) (same order as `Refusal::ALL`).
    pub refused_by: [u64; 3],
    /// The same counts per tenant.
    pub tenants: TenantStats,
}

/// Counters per tenant slot ([`tenants::TENANT_SLOTS`]; 0 the default
/// tenant).
#[derive(Debug, Clone, Copy, Default)]
pub struct TenantStats {
    /// Reads that found their key.
    pub hits: [u64; tenants::TENANT_SLOTS],
    /// Reads that did not.
    pub misses: [u64; tenants::TENANT_SLOTS],
    /// Keys removed to make room.
    pub evicted: [u64; tenants::TENANT_SLOTS],
    /// Writes not stored for lack of memory.
    pub refused: [u64; tenants::TENANT_SLOTS],
}
