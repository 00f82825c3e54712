//! One shard's keyspace: the index from key to value, expiry, memory
//! accounting and eviction.
//!
//! The index is one hash map per hash slot the shard owns, so a SCAN cursor
//! is a slot number (stable across inserts and deletes: every key present for
//! a whole SCAN is returned exactly once), and per-slot counts and listings
//! (for cluster commands) cost nothing extra.
//!
//! Values of [`SLAB_MIN`] bytes or more (KV-cache blocks) live in the shard's
//! slab arena ([`slab`]); smaller ones in memory of their own. Memory used is
//! the arena's mapped pages plus the index and small values, and stays under
//! the shard's share of `maxmemory`.
//!
//! Keys with a time to live are also kept in a set ordered by expiry time:
//! active expiry pops exactly the keys that are due instead of sampling.

mod disk_index;
pub mod entry;
pub mod eviction;
pub mod holds;
mod keyspace;
pub mod latency;
pub mod links;
mod memory;
mod meta;
#[cfg(test)]
mod proptests;
pub mod slab;
pub mod slot;
pub mod spill;
mod spilling;
pub mod tenants;
mod watches;

use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hashbrown::HashMap;

pub use disk_index::DISK_ENTRY_OVERHEAD;
pub use entry::{Encoding, Entry, Queue, Value};
use eviction::Recency;
pub use eviction::{EvictionPolicy, PrefixTuning, WriteClass};
pub use holds::{HoldLimits, HoldStats, Holds};
use keyspace::Contents;
pub use keyspace::{partial_tail, BlockWrite, PrefixStep};
pub use links::LinkEvent;
pub use memory::Protect;
use meta::Meta;
use slab::{ArenaStats, SlabArena};
use spilling::SpillState;
pub use spilling::{DiskRead, Fetched, InPrefix, PostToStore, SpillConfig, StoreJob};
pub use watches::Waiter;

/// Index bytes charged per key besides the key and value themselves: the
/// hash-table slot (key handle + entry), control byte and allocator headers.
pub const ENTRY_OVERHEAD: usize = 128;
/// Extra bytes charged per key that has a time to live (expiry-set node).
pub const EXPIRE_OVERHEAD: usize = 48;
/// Values at least this long are stored in the slab arena.
pub const SLAB_MIN: usize = 4096;
/// Values at least this long that get a span of their own are kept in the
/// buffer they arrived in rather than copied (the protocol reads every
/// argument of 32 KiB or more into a buffer of its exact size: nothing else
/// shares that allocation).
pub const ADOPT_MIN: usize = 32 * 1024;

/// Milliseconds since the Unix epoch: every expiry, TTL and idle time.
///
/// One clock for every thread: the monotonic clock plus an offset to the
/// wall clock ([`resync_clock`] re-reads it once a second). A caller that
/// already read the monotonic clock ([`mono_ns`]) converts that reading
/// ([`ms_at`]) instead of reading a second clock; a later reading never
/// gives an earlier time, except across a resync that follows a step of
/// the system clock.
pub fn now_ms() -> u64 {
    ms_at(mono_ns())
}

/// The monotonic clock (`CLOCK_MONOTONIC`, the clock `Instant` reads), in
/// nanoseconds since an arbitrary start. Connections read it twice per
/// batch of commands (the batch's time, and how long its commands took):
/// read directly and kept as a plain integer, a reading and a difference
/// cost a third of the instructions of `Instant::now()` and its checked
/// subtraction (callgrind, per GET).
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPU time the calling thread has used, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`: a system call, unlike [`mono_ns`]).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[inline(always)]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a
    // local that outlives the call; both clocks used exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// [`now_ms`] at the [`mono_ns`] reading `at`.
pub fn ms_at(at: u64) -> u64 {
    let offset = wall_offset_us().load(std::sync::atomic::Ordering::Relaxed);
    ((at / 1000) as i64 + offset).max(0) as u64 / 1000
}

/// Re-reads the wall clock for [`now_ms`] (NTP slews it against the
/// monotonic clock by up to 0.05%).
pub fn resync_clock() {
    wall_offset_us().store(wall_offset(), std::sync::atomic::Ordering::Relaxed);
}

/// Microseconds from the monotonic clock's start to the Unix epoch.
fn wall_offset_us() -> &'static std::sync::atomic::AtomicI64 {
    static OFFSET: std::sync::OnceLock<std::sync::atomic::AtomicI64> = std::sync::OnceLock::new();
    OFFSET.get_or_init(|| std::sync::atomic::AtomicI64::new(wall_offset()))
}

fn wall_offset() -> i64 {
    let mono = mono_ns();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    wall - (mono / 1000) as i64
}

/// The write did not fit in memory and nothing could be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

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

/// Why a write was not stored: each one is counted (INFO
/// `refused_writes_<cause>`, metric `kvtier_refused_writes_total{cause}`),
/// and MSETBLOCK answers `-1` for the block, SET an `OOM` error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Larger than the shard's whole share of `maxmemory`.
    TooLarge,
    /// `maxmemory-policy noeviction`, and no room.
    NoEviction,
    /// Nothing could be evicted to make room (every block held by a lookup
    /// or a reply being written, or protected by the write itself).
    NoRoom,
}

impl Refusal {
    /// Every cause, in metric order.
    pub const ALL: [Refusal; 3] = [Refusal::TooLarge, Refusal::NoEviction, Refusal::NoRoom];

    /// Metric label and INFO suffix.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::TooLarge => "too_large",
            Refusal::NoEviction => "noeviction",
            Refusal::NoRoom => "no_room",
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
    /// Writes not stored, by [`Refusal`] (same order as `Refusal::ALL`).
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
    /// beside its map (a key is in one or the other): [`disk_index`].
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
    watchers: HashMap<Bytes, Vec<Waiter>>,
    /// The spill tier, when configured.
    spill: Option<SpillState>,
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
            watchers: HashMap::new(),
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

    /// Index bytes charged for one key (values in the slab are charged
    /// through the arena).
    pub fn charge(key_len: usize, value_len: usize, volatile: bool) -> usize {
        key_len + value_len + ENTRY_OVERHEAD + if volatile { EXPIRE_OVERHEAD } else { 0 }
    }

    fn index(&self, slot: u16) -> usize {
        slot as usize - self.slots.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::{key_slot, SLOTS};

    fn store(budget: usize, policy: EvictionPolicy) -> Store {
        Store::new(0..SLOTS, budget, policy)
    }

    /// A store of `budget` bytes under `policy` whose keys `a@*` are
    /// tenant slot 1's and `b@*` slot 2's.
    fn tenants_ab(budget: usize, policy: EvictionPolicy) -> Store {
        let mut s = store(budget, policy);
        s.set_tenants(&[
            vec![tenants::KeyPattern::parse("a@*").unwrap()],
            vec![tenants::KeyPattern::parse("b@*").unwrap()],
        ]);
        s
    }

    /// A guaranteed DRAM share of `share` basis points, nothing else.
    fn share(share: u16) -> tenants::Limits {
        tenants::Limits {
            share,
            ..tenants::Limits::default()
        }
    }

    /// Writes `value` under `key`.
    fn put_bytes(s: &mut Store, key: &str, value: &Bytes) -> Result<(), OutOfMemory> {
        let slot = key_slot(key.as_bytes());
        s.insert(slot, key.as_bytes(), value.clone(), 0, 0)
            .map(|_| ())
    }

    /// A tenant within its share keeps all it holds through another's
    /// flood; shares changed later take effect at the next writes, and the
    /// tenant above its share is brought to it, not below it by more than
    /// a block.
    #[test]
    fn shares_hold_against_a_flood_and_change_at_run_time() {
        for policy in [
            EvictionPolicy::Prefix,
            EvictionPolicy::AllKeysLru,
            EvictionPolicy::AllKeysLfu,
        ] {
            let budget = 4 << 20;
            let mut s = tenants_ab(budget, policy);
            s.set_tenant_limits(&[share(0), share(5000)]);
            let block = Bytes::from(vec![7u8; 16384]);
            for i in 0..75 {
                put_bytes(&mut s, &format!("b@{i}"), &block).unwrap();
            }
            for i in 0..2500 {
                put_bytes(&mut s, &format!("a@{i}"), &block).unwrap();
            }
            assert_eq!(s.stats.tenants.evicted[2], 0, "{policy}");
            s.set_tenant_limits(&[share(9000), share(1000)]);
            for i in 0..2500 {
                put_bytes(&mut s, &format!("a@again{i}"), &block).unwrap();
            }
            let share = tenants::part_of(budget, 1000);
            let held = s.tenant_usage()[2].dram;
            assert!(s.stats.tenants.evicted[2] > 0, "{policy}");
            assert!(held <= share, "{policy}: {held} > {share}");
            assert!(held + 16384 + 200 > share, "{policy}: {held} of {share}");
        }
    }

    /// Sampling policies: a tenant above its share with few keys beside a
    /// tenant with many is found (by a walk when the samples miss it), and
    /// the tenant under its share loses nothing.
    #[test]
    fn sampling_policies_take_from_a_small_tenant_above_its_share() {
        for policy in [EvictionPolicy::AllKeysRandom, EvictionPolicy::AllKeysLfu] {
            let mut s = tenants_ab(4 << 20, policy);
            s.set_tenant_limits(&[share(0), share(9500)]);
            let (big, small) = (Bytes::from(vec![2u8; 200_000]), Bytes::from(vec![1u8; 100]));
            for i in 0..8 {
                put_bytes(&mut s, &format!("a@{i}"), &big).unwrap();
            }
            let mut i = 0;
            while s.stats.tenants.evicted[1] < 8 {
                put_bytes(&mut s, &format!("b@{i}"), &small).unwrap();
                i += 1;
                assert!(i < 100_000, "{policy}: a's blocks never went");
            }
            assert_eq!(
                s.stats.tenants.evicted[2], 0,
                "{policy}: b is within its share"
            );
        }
    }

    /// With caps alone, nobody is guaranteed anything: a capped tenant's
    /// writes take from the unnamed keys that fill the tier, and its
    /// overwrite of a block at its cap fits (the old block's room counts).
    #[test]
    fn caps_alone_guarantee_nothing_and_an_overwrite_fits_its_cap() {
        let budget = 4 << 20;
        let mut s = tenants_ab(budget, EvictionPolicy::Prefix);
        s.set_tenant_limits(&[
            tenants::Limits {
                cap: 1000,
                ..tenants::Limits::default()
            },
            tenants::Limits::default(),
        ]);
        let block = Bytes::from(vec![3u8; 16384]);
        for i in 0..400 {
            put_bytes(&mut s, &format!("other@{i}"), &block).unwrap();
        }
        for i in 0..10 {
            put_bytes(&mut s, &format!("a@{i}"), &block).unwrap();
        }
        assert_eq!(s.tenant_usage()[1].keys, 10);
        let big = Bytes::from(vec![4u8; 300_000]);
        put_bytes(&mut s, "a@big", &big).unwrap();
        put_bytes(&mut s, "a@big", &big).expect("an overwrite gives its old room back");
        assert!(s.tenant_usage()[1].dram <= tenants::part_of(budget, 1000));
    }

    fn put(s: &mut Store, key: &str, value: &str, expire_at: u64) -> Result<(), OutOfMemory> {
        s.insert(
            key_slot(key.as_bytes()),
            key.as_bytes(),
            Bytes::from(value.to_owned()),
            expire_at,
            1000,
        )
        .map(|_| ())
    }

    fn get(s: &mut Store, key: &str, now: u64) -> Option<Bytes> {
        s.read(key_slot(key.as_bytes()), key.as_bytes(), now, true)
            .and_then(|e| e.value.bytes())
    }

    #[test]
    fn insert_read_remove_and_accounting() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        put(&mut s, "a", "1", 0).unwrap();
        put(&mut s, "b", "22", 5000).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.volatile_len(), 1);
        assert_eq!(
            s.used_memory(),
            Store::charge(1, 1, false) + Store::charge(1, 2, true)
        );
        assert_eq!(get(&mut s, "a", 1000).unwrap(), "1");
        assert_eq!(get(&mut s, "b", 4999).unwrap(), "22");
        assert_eq!(get(&mut s, "b", 5000), None, "expired lazily");
        assert_eq!(s.stats.expired_keys, 1);
        assert_eq!(s.volatile_len(), 0);
        s.remove(key_slot(b"a"), b"a").unwrap();
        assert_eq!(s.used_memory(), 0);
        assert!(s.is_empty());
    }

    #[test]
    fn active_expiry_pops_due_keys_only() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        for i in 0..100 {
            put(&mut s, &format!("k{i}"), "v", 2000 + i).unwrap();
        }
        assert_eq!(s.expire_due(2049, 1000), 50);
        assert_eq!(s.len(), 50);
        assert_eq!(s.avg_ttl(2049), (2050 + 2099) / 2 - 2049);
    }

    #[test]
    fn set_expire_updates_index_and_charge() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        put(&mut s, "k", "v", 0).unwrap();
        assert!(s.set_expire(key_slot(b"k"), b"k", 9000, 1000));
        assert_eq!(s.used_memory(), Store::charge(1, 1, true));
        assert!(s.set_expire(key_slot(b"k"), b"k", 0, 1000));
        assert_eq!(s.used_memory(), Store::charge(1, 1, false));
        assert_eq!(s.volatile_len(), 0);
        assert!(!s.set_expire(key_slot(b"x"), b"x", 5, 1000));
    }

    #[test]
    fn noeviction_refuses_and_lru_evicts() {
        let each = Store::charge(4, 100, false);
        let mut s = store(each * 10, EvictionPolicy::NoEviction);
        let v = "x".repeat(100);
        for i in 0..10 {
            put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
        }
        assert_eq!(put(&mut s, "k999", &v, 0), Err(OutOfMemory));
        s.set_policy(EvictionPolicy::AllKeysLru);
        for i in 10..1000 {
            put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
            assert!(s.used_memory() <= each * 10);
        }
        assert_eq!(s.len(), 10);
        assert_eq!(s.stats.evicted_keys, 990);
    }

    #[test]
    fn a_new_ttl_makes_room_for_its_charge() {
        let each = Store::charge(4, 100, false);
        let mut s = store(each * 10, EvictionPolicy::AllKeysLru);
        let v = "x".repeat(100);
        for i in 0..10 {
            put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
        }
        assert_eq!(s.used_memory(), each * 10, "exactly full");
        assert!(s.set_expire(key_slot(b"k005"), b"k005", 9000, 1000));
        assert!(s.used_memory() <= each * 10, "{}", s.used_memory());
        assert_eq!(s.stats.evicted_keys, 1);
    }

    #[test]
    fn scan_visits_every_key_once() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        for i in 0..1000 {
            put(&mut s, &format!("key:{i}"), "v", 0).unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let mut cursor = Some(0);
        while let Some(from) = cursor {
            let (keys, next, visited) = s.scan(from, 10, |_| true, 1000);
            assert!(visited >= keys.len());
            for k in keys {
                assert!(seen.insert(k));
            }
            cursor = next;
        }
        assert_eq!(seen.len(), 1000);
    }
}

#[cfg(test)]
mod slab_tests {
    use super::*;
    use crate::eviction::Classes;
    use crate::links::Route;
    use crate::slot::{key_slot, SLOTS};

    fn block(i: u32, len: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|j| (j as u32 ^ i.wrapping_mul(2654435761)) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    fn put(s: &mut Store, key: &str, value: Bytes, parent: Option<&str>) -> i64 {
        let parent = parent.map(|p| Bytes::copy_from_slice(p.as_bytes()));
        let write = BlockWrite {
            parent,
            ..BlockWrite::default()
        };
        let code = s.insert_block(key_slot(key.as_bytes()), key.as_bytes(), value, write, 1000);
        settle(s);
        code
    }

    /// Delivers link events within one store (every key is local here).
    fn settle(s: &mut Store) {
        loop {
            let events = s.take_link_events();
            if events.is_empty() {
                return;
            }
            // The store applied its own; a parent's departure has no
            // other store to reach.
            for e in events {
                if !matches!(e.route(), Route::Others) {
                    s.apply_link(e);
                }
            }
        }
    }

    fn has(s: &mut Store, key: &str) -> bool {
        s.peek(key_slot(key.as_bytes()), key.as_bytes(), 1000)
            .is_some()
    }

    #[test]
    fn blocks_live_in_the_slab_and_read_back_exactly() {
        let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
        for i in 0..40 {
            assert_eq!(put(&mut s, &format!("b{i}"), block(i, 64 * 1024), None), 1);
        }
        for i in 0..40 {
            let key = format!("b{i}");
            let e = s
                .peek(key_slot(key.as_bytes()), key.as_bytes(), 1000)
                .unwrap();
            assert!(e.value.slot().is_some());
            assert_eq!(e.value.bytes(), Some(block(i, 64 * 1024)));
        }
        let stats = s.arena_stats();
        assert_eq!(stats.classes[0].slot_size, 64 * 1024);
        assert_eq!(stats.classes[0].used, 40);
        assert_eq!(s.used_memory(), s.index_memory() + stats.page_bytes);
    }

    #[test]
    fn used_memory_stays_under_the_budget_and_held_blocks_survive() {
        let budget = 4 << 20;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
        assert_eq!(put(&mut s, "held", block(7, 64 * 1024), None), 1);
        let held = s
            .read(key_slot(b"held"), b"held", 1000, true)
            .unwrap()
            .value
            .bytes();
        for i in 0..500 {
            assert_eq!(put(&mut s, &format!("k{i}"), block(i, 64 * 1024), None), 1);
            assert!(s.used_memory() <= budget, "{} > {budget}", s.used_memory());
        }
        assert!(
            has(&mut s, "held"),
            "a block a reply holds is never evicted"
        );
        assert_eq!(held, Some(block(7, 64 * 1024)));
        assert!(s.stats.evicted_keys > 400);
    }

    #[test]
    fn prefix_policy_evicts_orphans_then_chains_from_their_tails() {
        // Room for about 24 blocks of 64 KiB (pages of 256 KiB).
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        // A chain a0 <- a1 <- ... <- a9, the oldest blocks.
        for i in 0..10 {
            let parent = (i > 0).then(|| format!("a{}", i - 1));
            assert_eq!(
                put(
                    &mut s,
                    &format!("a{i}"),
                    block(i, 64 * 1024),
                    parent.as_deref()
                ),
                1
            );
        }
        // An orphan: its parent was never stored.
        assert_eq!(
            put(&mut s, "orphan", block(99, 64 * 1024), Some("missing")),
            1
        );
        // Fill the rest with unchained blocks (leaves) until eviction starts.
        let mut i = 0;
        while s.stats.evicted_keys == 0 {
            put(&mut s, &format!("x{i}"), block(1000 + i, 64 * 1024), None);
            i += 1;
        }
        assert!(!has(&mut s, "orphan"), "the orphan goes first");
        assert_eq!(s.stats.evicted_by[EvictReason::Orphan as usize], 1);
        // Keep writing: the chain, least recently used, goes from its tail
        // (what is left of it is always a prefix), each inner block once it
        // is a leaf; then the leaves written after it.
        let mut left = 10;
        for j in 0..40 {
            put(&mut s, &format!("y{j}"), block(2000 + j, 64 * 1024), None);
            let present: Vec<bool> = (0..10).map(|k| has(&mut s, &format!("a{k}"))).collect();
            let now_left = present.iter().take_while(|&&p| p).count();
            assert!(
                present[now_left..].iter().all(|&p| !p),
                "a chain loses its tail first: {present:?}"
            );
            assert!(now_left <= left);
            left = now_left;
            if left > 0 {
                assert!(has(&mut s, "x0"), "x0 is newer than the chain");
            }
        }
        assert_eq!(left, 0, "the unread chain is evicted");
        assert_eq!(s.stats.evicted_by[EvictReason::Inner as usize], 0);
    }

    #[test]
    fn large_blocks_are_stored_in_the_buffer_they_arrived_in() {
        let budget = 16 << 20;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        // Pages of 1 MiB here: 2 MiB blocks get spans.
        let big = block(1, 2 << 20);
        assert_eq!(put(&mut s, "big", big.clone(), None), 1);
        let got = s
            .read(key_slot(b"big"), b"big", 1000, true)
            .unwrap()
            .value
            .bytes();
        assert_eq!(got.unwrap().as_ptr(), big.as_ptr(), "copied");
        // Smaller blocks are copied into their class's pages.
        let small = block(2, 64 * 1024);
        assert_eq!(put(&mut s, "small", small.clone(), None), 1);
        let got = s
            .read(key_slot(b"small"), b"small", 1000, true)
            .unwrap()
            .value
            .bytes();
        assert_ne!(got.unwrap().as_ptr(), small.as_ptr());
        // The budget holds with kept buffers: writes past it evict.
        for i in 0..40 {
            assert_eq!(put(&mut s, &format!("b{i}"), block(i, 2 << 20), None), 1);
        }
        assert!(s.stats.evicted_keys > 30);
        assert!(s.used_memory() <= budget, "{} > {budget}", s.used_memory());
    }

    #[test]
    fn held_blocks_are_not_evicted_and_writers_never_fail_for_them() {
        for policy in [
            EvictionPolicy::Prefix,
            EvictionPolicy::AllKeysLru,
            EvictionPolicy::AllKeysLfu,
            EvictionPolicy::AllKeysRandom,
        ] {
            let budget = 24 * 64 * 1024 + 64 * 1024;
            let mut s = Store::new(0..SLOTS, budget, policy);
            for i in 0..8 {
                put(&mut s, &format!("h{i}"), block(i, 64 * 1024), None);
            }
            let until = now_ms() + 60_000;
            for i in 0..8 {
                let key = Bytes::from(format!("h{i}"));
                let held = s.hold(key_slot(&key), &key, 7, until, 1000, HoldLimits::NONE);
                assert!(held, "{policy:?}");
            }
            assert!(!s.hold(
                key_slot(b"absent"),
                &Bytes::from_static(b"absent"),
                7,
                until,
                1000,
                HoldLimits::NONE
            ));
            // Write past the budget many times over: the held eight stay.
            for i in 0..200 {
                assert_eq!(put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None), 1);
            }
            assert!(s.stats.evicted_keys > 150, "{policy:?}");
            for i in 0..8 {
                assert!(
                    has(&mut s, &format!("h{i}")),
                    "{policy:?}: h{i} was evicted"
                );
            }
            assert_eq!(s.stats.holds.broken, 0);
            // A read ends a hold: the block may go again.
            assert!(s.read(key_slot(b"h0"), b"h0", 1000, true).is_some());
            assert_eq!(s.holds().len(), 7);

            // Everything held and nothing else to evict: the write still
            // succeeds, by breaking the holds.
            let mut t = Store::new(0..SLOTS, budget, policy);
            let mut n = 0;
            while t.stats.evicted_keys == 0 {
                let key = format!("k{n}");
                put(&mut t, &key, block(n, 64 * 1024), None);
                let key = Bytes::from(key);
                t.hold(key_slot(&key), &key, 1, until, 1000, HoldLimits::NONE);
                n += 1;
            }
            // The first write past the budget broke them (nothing else
            // could go); only the block written last is held again.
            assert_eq!(t.stats.holds.broken, n as u64 - 1, "{policy:?}");
            assert_eq!(t.holds().len(), 1);
        }
    }

    #[test]
    fn a_cold_partial_block_goes_before_older_leaves() {
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        let mut i = 0;
        while s.len() < 8 {
            put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None);
            i += 1;
        }
        let write = BlockWrite {
            cold: true,
            ..BlockWrite::default()
        };
        let slot = key_slot(b"tail");
        assert_eq!(
            s.insert_block(slot, b"tail", block(7, 64 * 1024), write, 1000),
            1
        );
        while s.stats.evicted_keys == 0 {
            put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None);
            i += 1;
        }
        assert!(!has(&mut s, "tail"), "the cold block is the first victim");
        assert!(has(&mut s, "x0"), "older leaves stay");
    }

    /// Stores `keys` as one chain write of `class` (each block continues
    /// the one before it).
    fn put_chain(s: &mut Store, keys: &[String], class: WriteClass) {
        put_run(s, keys, class, None);
    }

    /// Stores `keys` as a run of a chain write of `class`, `decided` on
    /// another shard (None: the write starts here).
    fn put_run(s: &mut Store, keys: &[String], class: WriteClass, decided: Option<bool>) {
        let mut parent: Option<Bytes> = None;
        s.begin_chain(decided);
        for (i, k) in keys.iter().enumerate() {
            let write = BlockWrite {
                parent: parent.take(),
                class,
                ..BlockWrite::default()
            };
            let slot = key_slot(k.as_bytes());
            s.insert_block(slot, k.as_bytes(), block(i as u32, 64 * 1024), write, 1000);
            settle(s);
            parent = Some(Bytes::from(k.clone()));
        }
    }

    #[test]
    fn a_class_of_chain_writes_seldom_read_is_stored_cold() {
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        let (unread, read, back) = (
            WriteClass::chain(4, false),
            WriteClass::chain(2, false),
            WriteClass::chain(1, true),
        );
        // Chains of four never read; chains of two read once each; single
        // blocks that are evicted and written again while remembered (a
        // fifth of the evictions come back).
        for i in 0..3000 {
            put_chain(
                &mut s,
                &(0..4).map(|j| format!("u{i}-{j}")).collect::<Vec<_>>(),
                unread,
            );
            let pair: Vec<String> = (0..2).map(|j| format!("r{i}-{j}")).collect();
            put_chain(&mut s, &pair, read);
            for k in &pair {
                s.read(key_slot(k.as_bytes()), k.as_bytes(), 1000, true);
            }
            put_chain(&mut s, &[format!("back{}", i % 16)], back);
        }
        let classes = &s.recency.classes;
        let t = s.recency.tuning;
        assert!(classes.cold(Classes::of(unread, false), &t));
        assert!(!classes.cold(Classes::of(read, false), &t));
        // One chain write in `class_probe` of a cold class is stored as
        // usual and measured, all its blocks; the others, none.
        let mut measured = 0;
        for i in 0..16 {
            let keys: Vec<String> = (0..4).map(|j| format!("probe{i}-{j}")).collect();
            put_chain(&mut s, &keys, unread);
            assert!(keys.iter().all(|k| has(&mut s, k)));
            let of_class = keys
                .iter()
                .filter(|k| {
                    s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
                        .is_some_and(|e| e.class != 0)
                })
                .count();
            assert!(of_class == 0 || of_class == 4, "one decision per call");
            measured += of_class / 4;
        }
        assert_eq!(measured, 16 / t.class_probe as usize);
        // A run that continues a chain write decided on another shard is
        // stored as decided there, whatever its class here.
        for (decided, class, measured) in [(Some(true), read, false), (Some(false), unread, true)] {
            let keys: Vec<String> = (0..3).map(|j| format!("{decided:?}{j}")).collect();
            put_run(&mut s, &keys, class, decided);
            assert!(keys.iter().all(|k| {
                s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
                    .is_some_and(|e| (e.class != 0) == measured)
            }));
            assert_eq!(s.chain_decision(), decided);
        }
        // Without probes: a new chain of the unread class goes before older
        // blocks, from its tail.
        s.set_prefix_tuning(PrefixTuning {
            class_probe: u32::MAX,
            ..s.recency.tuning
        });
        for j in 0..8 {
            put(&mut s, &format!("p{j}"), block(j, 64 * 1024), None);
        }
        let chain: Vec<String> = (0..4).map(|j| format!("c{j}")).collect();
        put_chain(&mut s, &chain, unread);
        assert!(
            chain.iter().all(|k| has(&mut s, k)),
            "a chain being written keeps its blocks"
        );
        let mut j = 100;
        for left in (0..4).rev() {
            while chain.iter().filter(|k| has(&mut s, k)).count() > left {
                put(&mut s, &format!("p{j}"), block(j, 64 * 1024), None);
                j += 1;
            }
            let present: Vec<bool> = chain.iter().map(|k| has(&mut s, k)).collect();
            assert!(
                present[..left].iter().all(|&p| p),
                "tail first: {present:?}"
            );
        }
        assert!(
            (0..8).all(|j| has(&mut s, &format!("p{j}"))),
            "older blocks stay"
        );
        // Off: the same class is stored as usual again, every block
        // measured (with the rule on and no probes, none would be).
        s.set_prefix_tuning(PrefixTuning {
            class_threshold: 0.0,
            ..s.recency.tuning
        });
        let keys: Vec<String> = (0..4).map(|j| format!("off{j}")).collect();
        put_chain(&mut s, &keys, unread);
        assert!(keys.iter().all(|k| {
            s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
                .is_some_and(|e| e.class != 0)
        }));
    }

    #[test]
    fn write_classes_bucket_chains_by_length() {
        let c = WriteClass::chain;
        assert_ne!(c(1, false), c(2, false));
        assert_eq!(c(2, false), c(3, false));
        assert_ne!(c(3, false), c(4, false));
        assert_eq!(c(128, false), c(100_000, false));
        assert_ne!(c(4, false), c(4, true));
        assert_eq!(c(0, false), c(1, false));
        assert_ne!(c(1, false), WriteClass::default());
        let all: std::collections::HashSet<u8> = (1..300)
            .flat_map(|n| [false, true].map(|r| Classes::of(c(n, r), true)))
            .chain((1..300).flat_map(|n| [false, true].map(|r| Classes::of(c(n, r), false))))
            .collect();
        assert_eq!(all.len(), 32, "8 lengths x rooted x remembered");
        assert!(all.iter().all(|&m| (1..=32).contains(&m)));
    }

    #[test]
    fn an_evicted_block_written_again_comes_back_with_its_uses() {
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        put(&mut s, "r", block(1, 64 * 1024), None);
        let mut i = 0;
        while has(&mut s, "r") {
            put(&mut s, &format!("x{i}"), block(100 + i, 64 * 1024), None);
            i += 1;
        }
        // Each eviction remembered (a set met by more than four forgets
        // its oldest).
        let evicted = s.stats.evicted_keys as usize;
        assert!(s.recency.ghosts.len() <= evicted && s.recency.ghosts.len() + 2 >= evicted);
        assert_eq!(
            s.used_memory(),
            s.index_memory() + s.arena.mapped_bytes() + s.recency.ghosts.bytes(),
            "the ghost list is charged"
        );
        // Written once before, written again: two uses, level 1.
        put(&mut s, "r", block(1, 64 * 1024), None);
        let e = s.peek(key_slot(b"r"), b"r", 1000).unwrap();
        assert_eq!((e.uses, e.queue), (2, Queue::at(1)));
        // A key never seen starts from its write.
        put(&mut s, "new", block(2, 64 * 1024), None);
        let e = s.peek(key_slot(b"new"), b"new", 1000).unwrap();
        assert_eq!((e.uses, e.queue), (1, Queue::at(0)));
        // The table has room for `ghosts_per_block` x blocks in DRAM (the
        // power of two at or above), and newer evictions take the place of
        // older ones: it stays that size however many go.
        for j in 0..2000 {
            put(&mut s, &format!("y{j}"), block(5000 + j, 64 * 1024), None);
        }
        let room = (s.meta.queued as f32 * s.recency.tuning.ghosts_per_block) as usize;
        let size = s.recency.ghosts.capacity();
        assert_eq!(size, room.next_power_of_two());
        assert!(s.recency.ghosts.len() <= size && s.recency.ghosts.len() >= size / 2);
        assert_eq!(s.recency.ghosts.bytes(), 4 * size);
        // The last ones evicted are there: written again, they come back
        // with their uses.
        let gone = (0..2000)
            .rev()
            .map(|j| format!("y{j}"))
            .find(|k| !has(&mut s, k))
            .unwrap();
        put(&mut s, &gone, block(1, 64 * 1024), None);
        let e = s
            .peek(key_slot(gone.as_bytes()), gone.as_bytes(), 1000)
            .unwrap();
        assert_eq!(e.uses, 2, "{gone}");
        // Other policies remember nothing.
        let mut lru = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
        for j in 0..100 {
            put(&mut lru, &format!("y{j}"), block(j, 64 * 1024), None);
        }
        assert!(lru.stats.evicted_keys > 0);
        assert_eq!(lru.recency.ghosts.len(), 0);
    }

    #[test]
    fn reads_alone_keep_the_queues_bounded() {
        for policy in [EvictionPolicy::Prefix, EvictionPolicy::AllKeysLru] {
            let mut s = Store::new(0..SLOTS, 1 << 30, policy);
            put(&mut s, "b", block(1, 8192), None);
            let slot = key_slot(b"b");
            for _ in 0..20_000 {
                assert!(s.read(slot, b"b", 1000, true).is_some());
            }
            assert_eq!(s.meta.queued, 1);
            // Counted once more than `queued + 1024` slots were pushed,
            // compacted above four slots a block plus 1024.
            assert!(s.recency.slots() <= 5 * s.meta.queued + 2049, "{policy}");
        }
    }

    #[test]
    fn queues_are_built_when_a_budget_is_set() {
        // No budget: nothing is queued, whatever is written or read.
        let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
        for k in ["a", "b", "c"] {
            put(&mut s, k, block(1, 8192), None);
        }
        assert!(s.read(key_slot(b"a"), b"a", 1000, true).is_some());
        assert_eq!((s.recency.slots(), s.meta.queued), (0, 0));
        // A budget: every block queued in recency order on its level (a,
        // written and read, has two uses: level 1).
        s.set_budget(1 << 30);
        let keys = |q: &std::collections::VecDeque<(Bytes, u32)>| -> Vec<Bytes> {
            q.iter().map(|(k, _)| k.clone()).collect()
        };
        assert_eq!(keys(&s.recency.lanes[0].queues[0]), ["b", "c"]);
        assert_eq!(keys(&s.recency.lanes[0].queues[1]), ["a"]);
        assert_eq!(s.meta.queued, 3);
        // No budget again: the queues go.
        s.set_budget(0);
        assert_eq!((s.recency.slots(), s.meta.queued), (0, 0));

        // Eviction on the rebuilt queues: the unread chain goes first, from
        // its tail, before the newer blocks.
        let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
        for i in 0..10 {
            let parent = (i > 0).then(|| format!("a{}", i - 1));
            put(
                &mut s,
                &format!("a{i}"),
                block(i, 1 << 20),
                parent.as_deref(),
            );
        }
        for i in 0..30 {
            put(&mut s, &format!("x{i}"), block(100 + i, 1 << 20), None);
        }
        s.set_budget(25 << 20);
        assert!(s.stats.evicted_keys > 0);
        assert_eq!(s.stats.evicted_by[EvictReason::Inner as usize], 0);
        let present: Vec<bool> = (0..10).map(|k| has(&mut s, &format!("a{k}"))).collect();
        let left = present.iter().take_while(|&&p| p).count();
        assert!(present[left..].iter().all(|&p| !p), "{present:?}");
        assert_eq!(left, 0, "the oldest blocks, the chain, go first");
        assert!(has(&mut s, "x29"), "the newest block stays");
    }

    #[test]
    fn a_departed_parent_orphans_its_children() {
        let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
        put(&mut s, "p", block(1, 8192), None);
        put(&mut s, "c1", block(2, 8192), Some("p"));
        put(&mut s, "c2", block(3, 8192), Some("p"));
        let slot = key_slot(b"p");
        assert_eq!(s.peek(slot, b"p", 1000).unwrap().children, 2);
        s.remove(slot, b"p");
        settle(&mut s);
        for c in ["c1", "c2"] {
            assert!(
                s.peek(key_slot(c.as_bytes()), c.as_bytes(), 1000)
                    .unwrap()
                    .orphan
            );
        }
    }

    #[test]
    fn heap_values_evicted_first_do_not_refuse_blocks() {
        // Small values (on the heap, below the slab's minimum), then chains
        // of 4 KiB blocks past the budget: a block write's first evictions
        // take the small values, the least recently used, which free too
        // little for a new page, and every page is the blocks' class
        // already (none of another class to empty): eviction must go on
        // to the blocks rather than refuse the write.
        let budget = 32 << 20;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        for i in 0..200 {
            assert_eq!(put(&mut s, &format!("one{i}"), block(i, 64), None), 1);
        }
        for c in 0..200 {
            let mut parent: Option<String> = None;
            for i in 0..64 {
                let key = format!("w{c}:{i}");
                let code = put(&mut s, &key, block(i, 4096), parent.as_deref());
                assert_eq!(code, 1, "chain {c}, block {i}");
                parent = Some(key);
            }
            assert!(s.used_memory() <= budget);
        }
    }

    #[test]
    fn pages_move_to_a_new_block_size() {
        let budget = 16 << 20;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
        // One write per second, so LRU knows the 64 KiB blocks are older.
        let mut now = 1_000_000;
        let mut write = |s: &mut Store, key: String, value: Bytes| {
            now += 1000;
            s.insert_block(
                key_slot(key.as_bytes()),
                key.as_bytes(),
                value,
                BlockWrite::default(),
                now,
            )
        };
        for i in 0..400 {
            assert_eq!(write(&mut s, format!("small{i}"), block(i, 64 * 1024)), 1);
        }
        for i in 0..80 {
            assert_eq!(write(&mut s, format!("big{i}"), block(i, 256 * 1024)), 1);
            assert!(s.used_memory() <= budget);
        }
        let stats = s.arena_stats();
        let big = stats
            .classes
            .iter()
            .find(|c| c.slot_size == 256 * 1024)
            .unwrap();
        assert!(stats.rebalanced_pages > 0, "pages changed class");
        assert!(big.pages >= 10, "the new size got most pages: {stats:?}");
        let mut present = 0;
        for i in 0..80 {
            let key = format!("big{i}");
            if let Some(e) = s.peek(key_slot(key.as_bytes()), key.as_bytes(), now) {
                assert_eq!(e.value.bytes(), Some(block(i, 256 * 1024)));
                present += 1;
            }
        }
        assert!(present >= 40, "{present} big blocks kept");
    }
}
