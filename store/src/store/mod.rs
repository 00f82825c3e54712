//! The `Store` type: one shard's keyspace, its fields, and its settings.
//! The files beside this one each add one job of its methods.

mod demote;
mod eviction;
mod faults;
pub(crate) mod keyspace;
pub(crate) mod linking;
mod memory;
mod read;
mod reclaim;
mod restart;
mod tier;
mod watches;

#[cfg(test)]
mod faults_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod slab_tests;
#[cfg(test)]
mod spill_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;

use crate::disk_index;
use crate::entry::Entry;
use crate::holds::Holds;
use crate::meta::Meta;
use crate::policy::prefix::Recency;
use crate::policy::protect::Protect;
use crate::policy::{EvictionPolicy, PrefixTuning};
use crate::slab::{self, ArenaStats, SlabArena};
use crate::spill::writer::{self, SpillState};
use crate::stats::StoreStats;
use crate::tenants;
use crate::waiters::Waiters;

/// Work for a store, run on its own thread with the store borrowed: how
/// the I/O threads hand their results back.
pub type StoreJob = Box<dyn FnOnce(&mut Store) + Send>;

/// How a store's work reaches its thread (the shard wraps it in a job for
/// its own mailbox).
pub type PostToStore = Arc<dyn Fn(StoreJob) + Send + Sync>;

/// What the spill tier needs per shard ([`writer::SpillConfig`]).
pub type SpillConfig = writer::SpillConfig<StoreJob>;

/// How the store's memory is set up (flags `--hugepages`, `--prealloc`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryOptions {
    /// Ask for transparent huge pages on arena pages.
    pub hugepages: bool,
    /// Map, touch and lock the arena's pages up to the budget at start.
    pub prealloc: bool,
}

/// One shard's keyspace.
pub struct Store {
    /// One map per owned slot, indexed by `slot - slots.start`.
    maps: Vec<HashMap<Bytes, Entry>>,
    /// Blocks that live only on disk, compact, one table per owned slot
    /// beside its map (a key is in one or the other): `disk_index`.
    disk: disk_index::DiskIndex,
    /// Keys moved from `disk` into the maps during this batch of work, to
    /// go back at its end.
    faulted: Vec<Bytes>,
    slots: Range<usize>,
    meta: Meta,
    arena: SlabArena,
    /// The logical clock and the `prefix` policy's queues.
    recency: Recency,
    budget: usize,
    policy: EvictionPolicy,
    samples: usize,
    max_value_len: usize,
    rng: u64,
    /// Blocked readers waiting for keys to be written.
    waiters: Waiters,
    /// The spill tier, when configured.
    spill: Option<SpillState<StoreJob>>,
    /// Keys a lookup holds against eviction (`PREFIXLEN ... HOLD`).
    holds: Holds,
    /// Counters for INFO.
    pub stats: StoreStats,
}

impl Store {
    /// A store for `slots`, holding at most `budget` bytes (0: unbounded).
    pub fn new(slots: Range<usize>, budget: usize, policy: EvictionPolicy) -> Store {
        Self::with_memory(slots, budget, policy, MemoryOptions::default())
    }

    /// [`Store::new`] with memory options.
    pub fn with_memory(
        slots: Range<usize>,
        budget: usize,
        policy: EvictionPolicy,
        memory: MemoryOptions,
    ) -> Store {
        // Pages of 8 MiB, smaller when the budget is small so that a shard
        // still has several pages to rebalance between.
        let page_size = if budget == 0 {
            slab::DEFAULT_PAGE_SIZE
        } else {
            (budget / 16).clamp(64 * 1024, slab::DEFAULT_PAGE_SIZE) / (64 * 1024) * (64 * 1024)
        };
        let mut arena = SlabArena::new(page_size, memory.hugepages, memory.prealloc);
        arena.set_span_pool_limit(budget);
        if memory.prealloc && budget > 0 {
            // Best effort: a refused mapping only means pages come later.
            let _ = arena.reserve(budget * 9 / 10 / page_size);
        }
        Store {
            maps: (0..slots.len()).map(|_| HashMap::new()).collect(),
            disk: disk_index::DiskIndex::new(slots.len()),
            faulted: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15 ^ slots.start as u64,
            slots,
            meta: Meta::default(),
            arena,
            recency: Recency {
                lru_only: policy == EvictionPolicy::AllKeysLru,
                ..Recency::default()
            },
            budget,
            policy,
            samples: 5,
            max_value_len: 512 * 1024 * 1024,
            waiters: Waiters::default(),
            spill: None,
            holds: Holds::default(),
            stats: StoreStats::default(),
        }
    }

    /// The slots this store owns.
    pub fn slots(&self) -> Range<usize> {
        self.slots.clone()
    }

    /// Number of keys (including expired ones not yet collected).
    pub fn len(&self) -> usize {
        self.meta.keys
    }

    /// Whether the store has no keys.
    pub fn is_empty(&self) -> bool {
        self.meta.keys == 0
    }

    /// Number of keys with a TTL.
    pub fn volatile_len(&self) -> usize {
        self.meta.expires.len()
    }

    /// Mean remaining TTL of volatile keys in milliseconds (0 if none).
    pub fn avg_ttl(&self, now: u64) -> u64 {
        if self.meta.expires.is_empty() {
            return 0;
        }
        let mean = (self.meta.expire_sum / self.meta.expires.len() as u128) as u64;
        mean.saturating_sub(now)
    }

    /// Bytes in use: the arena's mapped pages and spans, plus the index
    /// and the `prefix` policy's memory of evicted keys.
    pub fn used_memory(&self) -> usize {
        self.meta.used + self.arena.mapped_bytes() + self.recency.ghosts.bytes()
    }

    /// Bytes charged to the index: keys, overhead, small values, links.
    pub fn index_memory(&self) -> usize {
        self.meta.used
    }

    /// Bytes of the disk index: what the keys whose blocks are only on disk
    /// cost in DRAM (outside `maxmemory`, which bounds the DRAM tier).
    pub fn disk_index_memory(&self) -> usize {
        self.meta.disk_index
    }

    /// Names tenants by key patterns (slot `i + 1` for the patterns of
    /// `tenants[i]`, tried in order; keys no pattern names are the default
    /// tenant's, slot 0) and counts what each holds now: a scan of the
    /// index, for start-up.
    pub fn set_tenants(&mut self, tenants: &[Vec<tenants::KeyPattern>]) {
        let mut t = tenants::Tenants::grouped(tenants);
        for map in &mut self.maps {
            for (k, e) in map.iter_mut() {
                e.tenant = t.of(k) as u8;
                t.shift_slot(e.tenant as usize, Default::default(), e.cost(k.len()), 1);
            }
        }
        for d in self.disk.all() {
            t.shift(d.key(), Default::default(), d.cost(), 1);
        }
        self.meta.tenants = t;
        // A queue per tenant.
        self.reset_queues();
    }

    /// Sets the named tenants' shares and caps (slot `i + 1` takes
    /// `named[i]`; the default tenant gets the shares they leave). A cap
    /// lowered below what a tenant holds evicts its keys now, by policy.
    pub fn set_tenant_limits(&mut self, named: &[tenants::Limits]) {
        let lanes = self.meta.tenants.lanes();
        self.meta.tenants.set_limits(named);
        if lanes != self.meta.tenants.lanes() {
            self.reset_queues();
        }
        for t in 0..self.meta.tenants.slots() {
            let _ = self.within_cap(t as u8, 0, Protect::NONE);
        }
        self.settle_links();
    }

    /// Each tenant slot's limits.
    pub fn tenant_limits(&self) -> [tenants::Limits; tenants::TENANT_SLOTS] {
        self.meta.tenants.limits
    }

    /// What each tenant slot holds in this store.
    pub fn tenant_usage(&self) -> [tenants::TenantUse; tenants::TENANT_SLOTS] {
        self.meta.tenants.usage
    }

    /// The arena's figures (INFO slabs, MEMORY STATS).
    pub fn arena_stats(&self) -> ArenaStats {
        self.arena.stats()
    }

    /// This shard's share of `maxmemory` (0: unbounded).
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Changes the memory budget; evicts now if the store is over it.
    pub fn set_budget(&mut self, budget: usize) {
        let queued = self.queues_on();
        self.budget = budget;
        self.arena.set_span_pool_limit(budget);
        if queued != self.queues_on() {
            self.reset_queues();
        }
        let _ = self.ensure_room(0, Protect::NONE);
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Changes the eviction policy.
    pub fn set_policy(&mut self, policy: EvictionPolicy) {
        if policy != self.policy {
            self.policy = policy;
            self.reset_queues();
        }
    }

    /// Sets the `prefix` policy's parameters.
    pub fn set_prefix_tuning(&mut self, tuning: PrefixTuning) {
        self.recency.tuning = tuning;
    }

    /// Sets how many keys eviction samples per choice (maxmemory-samples).
    pub fn set_samples(&mut self, samples: usize) {
        self.samples = samples.clamp(1, 64);
    }

    /// Longest string a command may build (proto-max-bulk-len).
    pub fn max_value_len(&self) -> usize {
        self.max_value_len
    }

    /// Sets the longest string a command may build.
    pub fn set_max_value_len(&mut self, len: usize) {
        self.max_value_len = len;
    }

    fn index(&self, slot: u16) -> usize {
        slot as usize - self.slots.start
    }
}
