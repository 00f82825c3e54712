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

pub mod entry;
pub mod eviction;
pub mod links;
#[cfg(test)]
mod proptests;
pub mod slab;
pub mod spill;
mod spilling;

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hashbrown::hash_map::{Entry as MapEntry, EntryRef};
use hashbrown::HashMap;
use tokio::sync::Notify;

pub use entry::{Encoding, Entry, Queue, Value};
pub use eviction::EvictionPolicy;
pub use links::LinkEvent;
use slab::{ArenaStats, NoRoom, SlabArena};
use spilling::SpillState;
pub use spilling::{Fetched, PostToShard, SpillConfig};

use crate::shard::slot::key_slot;
use kvtier_protocol::request::BIG_BULK;

/// Index bytes charged per key besides the key and value themselves: the
/// hash-table slot (key handle + entry), control byte and allocator headers.
pub const ENTRY_OVERHEAD: usize = 128;
/// Extra bytes charged per key that has a time to live (expiry-set node).
pub const EXPIRE_OVERHEAD: usize = 48;
/// Values at least this long are stored in the slab arena.
pub const SLAB_MIN: usize = 4096;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A blocked reader (MGETPREFIX BLOCK) waiting for a key to be written.
#[derive(Clone)]
pub struct Waiter {
    /// Identifies the waiter when it unregisters.
    pub id: u64,
    /// Woken on every write of a watched key.
    pub wake: Arc<Notify>,
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
}

/// Counts and indexes kept beside the maps, updated on every insert and
/// removal (a separate struct so they can be borrowed beside a map entry).
#[derive(Default)]
struct Meta {
    /// Keys with a TTL, ordered by expiry.
    expires: BTreeSet<(u64, Bytes)>,
    /// Sum of `expire_at` over `expires` (for avg_ttl).
    expire_sum: u128,
    keys: usize,
    /// Bytes charged to the index (keys, overhead, small values, links).
    used: usize,
    /// WATCHed keys: the flags of the clients watching each (set on any
    /// change of the key, EXEC then fails).
    watched: HashMap<Bytes, Vec<(u64, Arc<AtomicBool>)>>,
    /// Which key holds each slab slot (page, slot): to empty a page.
    slot_keys: HashMap<(u32, u32), Bytes>,
    /// Parent key → children of it stored here.
    children_of: HashMap<Bytes, Vec<Bytes>>,
    /// Key stored here → the children (on any shard) its `children` count
    /// counts.
    counted: HashMap<Bytes, HashSet<Bytes>>,
    /// Link changes for other stores.
    outbox: Vec<LinkEvent>,
    /// Live entries in each S3-FIFO queue.
    small_live: usize,
    main_live: usize,
    /// The spill directory, when the tier is on (live record counts).
    disk: Option<Arc<spill::SpillDir>>,
    /// Keys of this store with a record in each segment (for reclaim).
    disk_keys: HashMap<u64, HashSet<Bytes>>,
}

impl Meta {
    fn modified(&self, key: &[u8]) {
        if !self.watched.is_empty() {
            if let Some(flags) = self.watched.get(key) {
                for (_, dirty) in flags {
                    dirty.store(true, Ordering::Release);
                }
            }
        }
    }

    fn index_expiry(&mut self, key: &Bytes, at: u64) {
        if at != 0 {
            self.expires.insert((at, key.clone()));
            self.expire_sum += at as u128;
        }
    }

    fn unindex_expiry(&mut self, key: &Bytes, at: u64) {
        if at != 0 && self.expires.remove(&(at, key.clone())) {
            self.expire_sum -= at as u128;
        }
    }

    fn track_disk(&mut self, key: &Bytes, loc: &spill::DiskLoc) {
        match self.disk_keys.get_mut(&loc.segment.seq) {
            Some(keys) => {
                keys.insert(key.clone());
            }
            None => {
                self.disk_keys
                    .insert(loc.segment.seq, HashSet::from([key.clone()]));
            }
        }
    }

    /// `key` no longer points to the record at `loc`.
    fn untrack_disk(&mut self, key: &[u8], loc: &spill::DiskLoc) {
        if let Some(keys) = self.disk_keys.get_mut(&loc.segment.seq) {
            keys.remove(key);
            if keys.is_empty() {
                self.disk_keys.remove(&loc.segment.seq);
            }
        }
        if let Some(dir) = &self.disk {
            dir.drop_live(&loc.segment);
        }
    }

    fn added(&mut self, key: &Bytes, entry: &Entry) {
        self.modified(key);
        if let Some(loc) = entry.value.disk() {
            self.track_disk(key, loc);
        }
        self.index_expiry(key, entry.expire_at);
        self.used += entry.charge(key.len());
        self.keys += 1;
        if let Some(slot) = entry.value.slot().and_then(|s| s.page_location()) {
            self.slot_keys.insert(slot, key.clone());
        }
        if let Some(parent) = &entry.parent {
            match self.children_of.get_mut(parent) {
                Some(children) => children.push(key.clone()),
                None => {
                    self.children_of.insert(parent.clone(), vec![key.clone()]);
                }
            }
            self.outbox.push(LinkEvent::ChildAdded {
                parent: parent.clone(),
                child: key.clone(),
            });
        }
        match entry.queue {
            Queue::Small => self.small_live += 1,
            Queue::Main => self.main_live += 1,
            Queue::Out => {}
        }
    }

    /// `replaced`: a new value takes the key's place at once (its children
    /// stay its children).
    fn removed(&mut self, key: &Bytes, entry: &Entry, replaced: bool) {
        self.modified(key);
        if let Some(loc) = entry.value.disk() {
            self.untrack_disk(key, loc);
        }
        self.unindex_expiry(key, entry.expire_at);
        self.used -= entry.charge(key.len());
        self.keys -= 1;
        if let Some(slot) = entry.value.slot().and_then(|s| s.page_location()) {
            self.slot_keys.remove(&slot);
        }
        if let Some(parent) = &entry.parent {
            if let Some(children) = self.children_of.get_mut(parent) {
                children.retain(|c| c != key);
                if children.is_empty() {
                    self.children_of.remove(parent);
                }
            }
            self.outbox.push(LinkEvent::ChildRemoved {
                parent: parent.clone(),
                child: key.clone(),
            });
        }
        if !replaced {
            // A key written here again starts counting from zero.
            self.counted.remove(key);
            if entry.children > 0 {
                self.outbox.push(LinkEvent::ParentGone {
                    parent: key.clone(),
                });
            }
        }
        match entry.queue {
            Queue::Small => self.small_live -= 1,
            Queue::Main => self.main_live -= 1,
            Queue::Out => {}
        }
    }
}

/// The live entry for `key` in `map`, removing it first if it expired.
fn live<'m>(
    map: &'m mut HashMap<Bytes, Entry>,
    meta: &mut Meta,
    stats: &mut StoreStats,
    key: &[u8],
    now: u64,
) -> Option<&'m mut Entry> {
    match map.entry_ref(key) {
        EntryRef::Occupied(o) if o.get().expired(now) => {
            let (key, entry) = o.remove_entry();
            meta.removed(&key, &entry, false);
            stats.expired_keys += 1;
            None
        }
        EntryRef::Occupied(o) => Some(o.into_mut()),
        EntryRef::Vacant(_) => None,
    }
}

/// Recently evicted keys (by hash), so a key that comes back soon enters
/// the main queue directly (S3-FIFO's ghost queue).
#[derive(Default)]
struct Ghost {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Ghost {
    fn insert(&mut self, hash: u64, capacity: usize) {
        if self.set.insert(hash) {
            self.order.push_back(hash);
        }
        while self.order.len() > capacity.max(64) {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn take(&mut self, hash: u64) -> bool {
        self.set.remove(&hash)
    }
}

/// The eviction queues of the `prefix` policy.
#[derive(Default)]
struct PrefixQueues {
    small: VecDeque<(Bytes, u32)>,
    main: VecDeque<(Bytes, u32)>,
    orphans: VecDeque<(Bytes, u32)>,
    ghost: Ghost,
}

fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
    slots: Range<usize>,
    meta: Meta,
    arena: SlabArena,
    queues: PrefixQueues,
    next_gen: u32,
    budget: usize,
    policy: EvictionPolicy,
    samples: usize,
    max_value_len: usize,
    rng: u64,
    /// Blocked readers waiting for keys to be written.
    watchers: HashMap<Bytes, Vec<Waiter>>,
    /// The spill tier, when configured.
    spill: Option<SpillState>,
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
        if memory.prealloc && budget > 0 {
            // Best effort: a refused mapping only means pages come later.
            let _ = arena.reserve(budget * 9 / 10 / page_size);
        }
        Store {
            maps: (0..slots.len()).map(|_| HashMap::new()).collect(),
            rng: 0x9e37_79b9_7f4a_7c15 ^ slots.start as u64,
            slots,
            meta: Meta::default(),
            arena,
            queues: PrefixQueues::default(),
            next_gen: 0,
            budget,
            policy,
            samples: 5,
            max_value_len: 512 * 1024 * 1024,
            watchers: HashMap::new(),
            spill: None,
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

    /// Bytes in use: the arena's mapped pages and spans, plus the index.
    pub fn used_memory(&self) -> usize {
        self.meta.used + self.arena.mapped_bytes()
    }

    /// Bytes charged to the index: keys, overhead, small values, links.
    pub fn index_memory(&self) -> usize {
        self.meta.used
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
        self.budget = budget;
        let _ = self.ensure_room(0, None);
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Changes the eviction policy.
    pub fn set_policy(&mut self, policy: EvictionPolicy) {
        self.policy = policy;
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

    /// A live entry for reading: counts a hit or miss and, unless `touch` is
    /// false (CLIENT NO-TOUCH, side-effect-free commands), marks it used.
    pub fn read(&mut self, slot: u16, key: &[u8], now: u64, touch: bool) -> Option<&Entry> {
        let index = self.index(slot);
        let policy = self.policy;
        let found = live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        );
        match found {
            Some(entry) => {
                self.stats.keyspace_hits += 1;
                if touch {
                    eviction::touch(entry, policy, now);
                    entry.reads = entry.reads.saturating_add(1);
                }
                Some(entry)
            }
            None => {
                self.stats.keyspace_misses += 1;
                None
            }
        }
    }

    /// A live entry without counting or touching (writes, EXISTS-like peeks).
    pub fn peek(&mut self, slot: u16, key: &[u8], now: u64) -> Option<&Entry> {
        let index = self.index(slot);
        live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        )
        .map(|e| &*e)
    }

    /// Marks a key as used (TOUCH); false if absent.
    pub fn touch(&mut self, slot: u16, key: &[u8], now: u64) -> bool {
        let index = self.index(slot);
        let policy = self.policy;
        match live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        ) {
            Some(entry) => {
                eviction::touch(entry, policy, now);
                true
            }
            None => false,
        }
    }

    /// A block read as part of a prefix right after `previous`: if that is
    /// its parent, it is reachable whatever the link events said. (A
    /// request listing keys that are not its chain proves nothing.)
    pub fn mark_reachable(&mut self, slot: u16, key: &[u8], previous: &[u8]) {
        let index = self.index(slot);
        if let Some(e) = self.maps[index].get_mut(key) {
            if e.parent.as_deref() == Some(previous) {
                e.orphan = false;
            }
        }
    }

    /// Stores `value` under `key` with expiry `expire_at` (0: none),
    /// replacing any old value.
    pub fn insert(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        self.insert_with(slot, key, value, expire_at, Encoding::Auto, now)
    }

    /// [`Store::insert`] with an explicit OBJECT ENCODING.
    pub fn insert_with(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        encoding: Encoding,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        self.insert_entry(slot, key, value, expire_at, encoding, None, now)
    }

    /// Stores a value with every attribute given: the general write. Small
    /// values get memory of their own; blocks are copied into a slab slot
    /// (evicting by policy when the shard's budget is reached).
    #[allow(clippy::too_many_arguments)]
    pub fn insert_entry(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        encoding: Encoding,
        parent: Option<Bytes>,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        let index = self.index(slot);
        let parent = parent.map(|p| Bytes::copy_from_slice(&p));
        let heap_len = if value.len() < SLAB_MIN {
            value.len()
        } else {
            0
        };
        // What the index will be charged beyond what the key costs now.
        let mut index_growth = 0;
        if self.budget != 0 {
            let new_charge = Self::charge(key.len(), heap_len, expire_at != 0)
                + parent.as_ref().map_or(0, |p| p.len());
            let old_charge = self.maps[index].get(key).map_or(0, |e| e.charge(key.len()));
            index_growth = new_charge.saturating_sub(old_charge);
            if index_growth > 0 {
                self.ensure_room(index_growth, Some(key))?;
            }
        }
        let stored = if value.len() < SLAB_MIN {
            // Always copied: a slice would pin the request's read buffer.
            Value::Heap(if value.len() < BIG_BULK {
                Bytes::copy_from_slice(&value)
            } else {
                value
            })
        } else {
            Value::Slab(self.place_in_slab(&value, key, index_growth)?)
        };
        let mut entry = Entry::new(stored, expire_at, now);
        entry.encoding = encoding;
        entry.parent = parent;
        let track = self.policy == EvictionPolicy::Prefix;
        if track {
            self.next_gen = self.next_gen.wrapping_add(1);
            entry.gen = self.next_gen;
            if self.queues.ghost.take(key_hash(key)) {
                entry.queue = Queue::Main;
            }
        }
        let (queue, gen) = (entry.queue, entry.gen);
        let (stored_key, old) = match self.maps[index].entry(Bytes::copy_from_slice(key)) {
            MapEntry::Occupied(mut o) => {
                let old = std::mem::replace(o.get_mut(), entry);
                // Children name the key, not the value: they stay.
                o.get_mut().children = old.children;
                // A restart must not bring the old value back from disk.
                o.get_mut().on_disk = old.on_disk;
                self.meta.removed(o.key(), &old, true);
                self.meta.added(o.key(), o.get());
                (o.key().clone(), Some(old))
            }
            MapEntry::Vacant(v) => {
                let key = v.key().clone();
                let entry = v.insert(entry);
                self.meta.added(&key, entry);
                (key, None)
            }
        };
        if old.as_ref().is_some_and(|o| o.on_disk) {
            self.tombstone(key);
        }
        if track {
            match queue {
                Queue::Small => self.queues.small.push_back((stored_key, gen)),
                Queue::Main => self.queues.main.push_back((stored_key, gen)),
                Queue::Out => {}
            }
        }
        if !self.watchers.is_empty() {
            if let Some(waiters) = self.watchers.get(key) {
                for w in waiters {
                    w.wake.notify_one();
                }
            }
        }
        Ok(old)
    }

    /// A slab slot holding `value`, evicting (never `protect`) until one is
    /// free or a page fits the budget, with `index_growth` bytes of index
    /// charge still to come for the write.
    fn place_in_slab(
        &mut self,
        value: &[u8],
        protect: &[u8],
        index_growth: usize,
    ) -> Result<slab::SlotRef, OutOfMemory> {
        let mut evictions = 0;
        loop {
            let growth = self.arena.growth_for(value.len()) + index_growth;
            let may_map = self.budget == 0 || self.used_memory() + growth <= self.budget;
            let class = match self.arena.store(value, may_map) {
                Ok(slot) => return Ok(slot),
                Err(NoRoom::Mmap) => return Err(OutOfMemory),
                Err(NoRoom::Full { class }) => class,
            };
            if self.policy == EvictionPolicy::NoEviction {
                return Err(OutOfMemory);
            }
            // Evictions by policy free slots of whatever class the victims
            // were in; when that keeps missing this value's class, a whole
            // page is emptied for it (rebalancing).
            evictions += 1;
            if evictions <= 64 && self.evict_one(Some(protect), true).is_some() {
                continue;
            }
            let keep = (class != usize::MAX).then_some(class);
            if !self.empty_a_page(keep, Some(protect)) {
                return Err(OutOfMemory);
            }
            evictions = 0;
        }
    }

    /// Evicts every value in the page best suited to be emptied (fewest
    /// values, none held) and unmaps it when the value needs a span.
    /// Returns whether it evicted anything.
    fn empty_a_page(&mut self, keep: Option<usize>, protect: Option<&[u8]>) -> bool {
        // Slots whose last holder just let go are free, not in use.
        self.arena.reclaim();
        let Some((page, slots)) = self.arena.page_to_empty(keep) else {
            return false;
        };
        let keys: Vec<Bytes> = slots
            .iter()
            .filter_map(|s| self.meta.slot_keys.get(&(page, *s)).cloned())
            .collect();
        if keys.is_empty() || keys.iter().any(|k| Some(&k[..]) == protect) {
            return false;
        }
        for key in keys {
            let slot = key_slot(&key);
            if !self.evict_key(slot, &key) {
                self.stats.evicted_keys += 1;
                self.stats.evicted_by[EvictReason::Rebalance as usize] += 1;
            }
        }
        self.arena.reclaim();
        if keep.is_none() {
            self.arena.unmap_empty(self.arena.page_size());
        }
        true
    }

    /// MSETBLOCK's write of one block: `1` stored, `0` already present and
    /// left unchanged (unless `replace`), `-1` not stored (no memory, or
    /// larger than this shard's whole budget).
    #[allow(clippy::too_many_arguments)]
    pub fn insert_block(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        parent: Option<Bytes>,
        replace: bool,
        now: u64,
    ) -> i64 {
        if !replace && self.peek(slot, key, now).is_some() {
            return 0;
        }
        if self.budget != 0 && Self::charge(key.len(), value.len(), expire_at != 0) > self.budget {
            return -1;
        }
        match self.insert_entry(slot, key, value, expire_at, Encoding::Auto, parent, now) {
            Ok(_) => 1,
            Err(OutOfMemory) => -1,
        }
    }

    /// Wakes `waiter` whenever `key` is written, until [`Store::unwatch`].
    pub fn watch(&mut self, key: &[u8], waiter: Waiter) {
        match self.watchers.get_mut(key) {
            Some(waiters) => waiters.push(waiter),
            None => {
                self.watchers
                    .insert(Bytes::copy_from_slice(key), vec![waiter]);
            }
        }
    }

    /// Forgets waiter `id` on `key`.
    pub fn unwatch(&mut self, key: &[u8], id: u64) {
        if let Some(waiters) = self.watchers.get_mut(key) {
            waiters.retain(|w| w.id != id);
            if waiters.is_empty() {
                self.watchers.remove(key);
            }
        }
    }

    /// Number of keys readers are waiting for.
    pub fn watched_keys(&self) -> usize {
        self.watchers.len()
    }

    /// Deletes `key` (DEL and the like), returning its entry. A key that
    /// had a record in the spill tier leaves a tombstone there.
    pub fn remove(&mut self, slot: u16, key: &[u8]) -> Option<Entry> {
        let entry = self.drop_entry(slot, key)?;
        if entry.on_disk {
            self.tombstone(key);
        }
        Some(entry)
    }

    /// Removes `key` from the index without a tombstone (eviction, reclaim,
    /// a record that failed its checksum).
    fn drop_entry(&mut self, slot: u16, key: &[u8]) -> Option<Entry> {
        let index = self.index(slot);
        let (key, entry) = self.maps[index].remove_entry(key)?;
        self.meta.removed(&key, &entry, false);
        Some(entry)
    }

    /// Evicts `key`: to the spill tier when it is on and takes it, out of
    /// the index otherwise. Whether the key is still indexed.
    fn evict_key(&mut self, slot: u16, key: &[u8]) -> bool {
        if self.spill_out(slot, key, false) {
            return true;
        }
        self.drop_entry(slot, key);
        false
    }

    /// Sets (or with 0 clears) the expiry of a live key; false if absent.
    pub fn set_expire(&mut self, slot: u16, key: &[u8], expire_at: u64, now: u64) -> bool {
        let index = self.index(slot);
        if live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        )
        .is_none()
        {
            return false;
        }
        let gains_ttl =
            expire_at != 0 && self.maps[index].get(key).is_some_and(|e| e.expire_at == 0);
        if gains_ttl && self.budget != 0 {
            // The expiry-set node is charged: make room for it like any
            // write. EXPIRE never fails for memory (as in Redis), so when
            // nothing can be evicted the budget is overdrawn by the node.
            let _ = self.ensure_room(EXPIRE_OVERHEAD, Some(key));
        }
        let Some((stored, entry)) = self.maps[index].get_key_value_mut(key) else {
            return false;
        };
        let old = entry.expire_at;
        if old != expire_at {
            let before = entry.charge(stored.len());
            entry.expire_at = expire_at;
            let after = entry.charge(stored.len());
            let on_disk = entry.on_disk;
            let stored = stored.clone();
            self.meta.modified(&stored);
            self.meta.unindex_expiry(&stored, old);
            self.meta.index_expiry(&stored, expire_at);
            self.meta.used = self.meta.used - before + after;
            // The record on disk has the old expiry: a warm restart must
            // not bring the key back with it (a miss is fine, a key that
            // outlives its TTL is not).
            if on_disk {
                self.tombstone(key);
            }
        }
        true
    }

    /// Deletes every key.
    pub fn clear(&mut self) {
        // Records in the spill tier die with their keys: drop their live
        // counts so the segments go, and start a fresh segment.
        if let Some(dir) = self.meta.disk.clone() {
            for map in &self.maps {
                for e in map.values() {
                    if let Some(loc) = e.value.disk() {
                        dir.drop_live(&loc.segment);
                    }
                }
            }
        }
        for map in &mut self.maps {
            *map = HashMap::new();
        }
        // FLUSHALL/FLUSHDB change every watched key (as in Redis).
        let watched = std::mem::take(&mut self.meta.watched);
        for (_, dirty) in watched.values().flatten() {
            dirty.store(true, Ordering::Release);
        }
        let disk = self.meta.disk.take();
        self.meta = Meta {
            watched,
            disk,
            ..Meta::default()
        };
        self.queues = PrefixQueues::default();
        self.arena.reclaim();
        self.spill_cleared();
    }

    /// WATCH: sets `dirty` whenever `key` changes, until unwatched.
    pub fn watch_changes(&mut self, key: &[u8], client: u64, dirty: Arc<AtomicBool>) {
        match self.meta.watched.get_mut(key) {
            Some(flags) => flags.push((client, dirty)),
            None => {
                self.meta
                    .watched
                    .insert(Bytes::copy_from_slice(key), vec![(client, dirty)]);
            }
        }
    }

    /// UNWATCH of one key for one client.
    pub fn unwatch_changes(&mut self, key: &[u8], client: u64) {
        if let Some(flags) = self.meta.watched.get_mut(key) {
            flags.retain(|(id, _)| *id != client);
            if flags.is_empty() {
                self.meta.watched.remove(key);
            }
        }
    }

    /// Link changes to deliver to other stores (see [`links`]).
    pub fn take_link_events(&mut self) -> Vec<LinkEvent> {
        std::mem::take(&mut self.meta.outbox)
    }

    /// Applies a link change that names a key of this store (or, for
    /// `ParentGone`, any store).
    pub fn apply_link(&mut self, event: LinkEvent) {
        match event {
            LinkEvent::ChildAdded { parent, child } => {
                let index = self.index(key_slot(&parent));
                match self.maps[index].get_key_value_mut(&parent[..]) {
                    Some((key, p)) => {
                        if p.orphan {
                            // A child of an unreachable block is unreachable.
                            self.meta.outbox.push(LinkEvent::Orphaned {
                                child: child.clone(),
                            });
                        }
                        let counted = self.meta.counted.entry(key.clone()).or_default();
                        if counted.insert(child) {
                            p.children += 1;
                        }
                    }
                    None => self.meta.outbox.push(LinkEvent::Orphaned { child }),
                }
            }
            LinkEvent::ChildRemoved { parent, child } => {
                let index = self.index(key_slot(&parent));
                let Some(p) = self.maps[index].get_mut(&parent[..]) else {
                    return;
                };
                let Some(counted) = self.meta.counted.get_mut(&parent[..]) else {
                    return;
                };
                if counted.remove(&child) {
                    p.children -= 1;
                    if counted.is_empty() {
                        self.meta.counted.remove(&parent[..]);
                    }
                }
            }
            LinkEvent::ParentGone { parent } => {
                let children = self.meta.children_of.get(&parent[..]).cloned();
                for child in children.into_iter().flatten() {
                    self.mark_orphan(&child);
                }
            }
            LinkEvent::Orphaned { child } => self.mark_orphan(&child),
            LinkEvent::ReclaimSegment { seq } => self.reclaim_segment(seq),
        }
    }

    /// Marks `key` unreachable; its descendants are then unreachable too,
    /// and are told so (on whichever shard they live).
    fn mark_orphan(&mut self, key: &[u8]) {
        let index = self.index(key_slot(key));
        if let Some((k, e)) = self.maps[index].get_key_value_mut(key) {
            if !e.orphan {
                e.orphan = true;
                if self.policy == EvictionPolicy::Prefix {
                    self.queues.orphans.push_back((k.clone(), e.gen));
                }
                if e.children > 0 {
                    self.meta
                        .outbox
                        .push(LinkEvent::ParentGone { parent: k.clone() });
                }
            }
        }
    }

    /// Active expiry: removes up to `limit` keys whose time has come.
    /// Returns how many it removed.
    pub fn expire_due(&mut self, now: u64, limit: usize) -> usize {
        let mut removed = 0;
        while removed < limit {
            let Some((at, key)) = self.meta.expires.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            let slot = key_slot(&key);
            if self.remove(slot, &key).is_none() {
                // Not in the map (cannot happen): drop the stale node.
                self.meta.expires.remove(&(at, key));
                self.meta.expire_sum -= at as u128;
            }
            self.stats.expired_keys += 1;
            removed += 1;
        }
        if removed > 0 {
            self.arena.reclaim();
        }
        removed
    }

    /// Evicts by policy until `extra` more bytes fit the budget. `protect`
    /// is never chosen (the key being written).
    pub fn ensure_room(&mut self, extra: usize, protect: Option<&[u8]>) -> Result<(), OutOfMemory> {
        if self.budget == 0 {
            return Ok(());
        }
        if extra > self.budget {
            // Evicting everything would not make room.
            return Err(OutOfMemory);
        }
        let mut misses = 0;
        while self.used_memory() + extra > self.budget {
            // Empty pages are the cheapest memory to give back.
            let over = self.used_memory() + extra - self.budget;
            if self.arena.unmap_empty(over) > 0 {
                continue;
            }
            if self.policy == EvictionPolicy::NoEviction {
                return Err(OutOfMemory);
            }
            // Evicting a block frees a slot, not always a whole page: after
            // a few tries, empty a page outright.
            misses += 1;
            if misses <= 16 && self.evict_one(protect, false).is_some() {
                continue;
            }
            if !self.empty_a_page(None, protect) && self.evict_one(protect, false).is_none() {
                return Err(OutOfMemory);
            }
            misses = 0;
        }
        Ok(())
    }

    /// Whether `extra` more bytes would fit without evicting.
    pub fn fits(&self, extra: usize) -> bool {
        self.budget == 0 || self.used_memory() + extra <= self.budget
    }

    /// Evicts one key by policy; `None` if nothing may go.
    /// Evicts one key by policy; `None` if nothing may go. With the spill
    /// tier on, a block in DRAM is written to disk and stays readable.
    /// `dram_only`: only keys whose value is in DRAM (a slot is needed).
    fn evict_one(&mut self, protect: Option<&[u8]>, dram_only: bool) -> Option<EvictReason> {
        let (slot, key, reason) = if self.policy == EvictionPolicy::Prefix {
            match self.prefix_victim(protect, dram_only) {
                Some(found) => found,
                // Keys written before the policy changed are not queued.
                None => {
                    let (slot, key) = self.pick_victim(protect, dram_only)?;
                    (slot, key, EvictReason::Leaf)
                }
            }
        } else {
            let (slot, key) = self.pick_victim(protect, dram_only)?;
            (slot, key, EvictReason::Policy)
        };
        let in_dram = self.maps[self.index(slot)]
            .get(&key[..])
            .is_some_and(|e| e.value.in_dram());
        let kept = in_dram && self.spill_out(slot, &key, false);
        if !kept {
            self.drop_entry(slot, &key)?;
            if self.policy == EvictionPolicy::Prefix {
                let capacity = self.meta.main_live;
                self.queues.ghost.insert(key_hash(&key), capacity);
            }
            self.stats.evicted_keys += 1;
            self.stats.evicted_by[reason as usize] += 1;
        }
        self.arena.reclaim();
        Some(reason)
    }

    /// The `prefix` policy's victim: an orphan if there is one, else a leaf
    /// chosen by S3-FIFO (a small probationary FIFO and a main FIFO with
    /// reinsertion of reused keys), else, when nothing but inner blocks is
    /// left, an inner block. Held values are never chosen.
    fn prefix_victim(
        &mut self,
        protect: Option<&[u8]>,
        dram_only: bool,
    ) -> Option<(u16, Bytes, EvictReason)> {
        // 1. Orphans: unreachable by any prefix lookup. Held ones (and the
        // key being written, and blocks on disk when a slot is needed) stay
        // queued: they go first once free.
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some((key, gen)) = self.queues.orphans.pop_front() {
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get(&key[..]) else {
                continue;
            };
            if e.gen != gen || !e.orphan {
                continue;
            }
            if e.value.is_held() || Some(&key[..]) == protect || (dram_only && !e.value.in_dram()) {
                skipped.push((key, gen));
                continue;
            }
            found = Some((slot, key, EvictReason::Orphan));
            break;
        }
        for entry in skipped.into_iter().rev() {
            self.queues.orphans.push_front(entry);
        }
        if found.is_some() {
            return found;
        }
        // 2. S3-FIFO over the leaves; inner blocks are passed over.
        let mut budget = 2 * (self.queues.small.len() + self.queues.main.len()) + 8;
        let mut inner: Option<(u16, Bytes)> = None;
        while budget > 0 {
            budget -= 1;
            let live = self.meta.small_live + self.meta.main_live;
            let from_small = !self.queues.small.is_empty()
                && (self.meta.small_live * 10 > live || self.queues.main.is_empty());
            let popped = if from_small {
                self.queues.small.pop_front()
            } else {
                self.queues.main.pop_front()
            };
            let Some((key, gen)) = popped else { break };
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get_mut(&key[..]) else {
                continue;
            };
            if e.gen != gen {
                continue;
            }
            if !e.value.in_dram() {
                // Spilled: it left DRAM, and the queues with it.
                match e.queue {
                    Queue::Small => self.meta.small_live -= 1,
                    Queue::Main => self.meta.main_live -= 1,
                    Queue::Out => {}
                }
                e.queue = Queue::Out;
                e.gen = 0;
                if dram_only {
                    continue;
                }
                return Some((slot, key, EvictReason::Leaf));
            }
            let keep = e.value.is_held() || Some(&key[..]) == protect;
            if from_small {
                if e.freq > 1 || e.children > 0 || keep {
                    // Reused (or an inner node, or held): promote.
                    e.queue = Queue::Main;
                    e.freq = 0;
                    self.meta.small_live -= 1;
                    self.meta.main_live += 1;
                    self.queues.main.push_back((key, gen));
                    continue;
                }
                return Some((slot, key, EvictReason::Leaf));
            }
            if e.freq > 0 || keep {
                e.freq = e.freq.saturating_sub(1);
                self.queues.main.push_back((key, gen));
                continue;
            }
            if e.children > 0 {
                if inner.is_none() {
                    inner = Some((slot, key.clone()));
                }
                self.queues.main.push_back((key, gen));
                continue;
            }
            return Some((slot, key, EvictReason::Leaf));
        }
        // 3. Only inner blocks left: its descendants become orphans.
        inner.map(|(slot, key)| (slot, key, EvictReason::Inner))
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: cheap and good enough for sampling.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniformly chosen slot that holds keys, if any.
    fn random_nonempty_slot(&mut self) -> Option<usize> {
        if self.meta.keys == 0 {
            return None;
        }
        let n = self.maps.len();
        for _ in 0..64 {
            let i = (self.next_random() % n as u64) as usize;
            if !self.maps[i].is_empty() {
                return Some(i);
            }
        }
        let start = (self.next_random() % n as u64) as usize;
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.maps[i].is_empty())
    }

    /// One random key of the store (its slot index and key).
    fn random_entry(&mut self) -> Option<(usize, Bytes)> {
        let index = self.random_nonempty_slot()?;
        let len = self.maps[index].len() as u64;
        let nth = (self.next_random() % len) as usize;
        let (key, _) = self.maps[index].iter().nth(nth)?;
        Some((index, key.clone()))
    }

    /// A random live key (RANDOMKEY); expired keys met on the way are removed.
    pub fn random_key(&mut self, now: u64) -> Option<Bytes> {
        for _ in 0..100 {
            let (index, key) = self.random_entry()?;
            if !self.maps[index][&key].expired(now) {
                return Some(key);
            }
            let slot = (self.slots.start + index) as u16;
            self.remove(slot, &key);
            self.stats.expired_keys += 1;
        }
        None
    }

    /// Redis-style sampled choice for the classic policies (held values and
    /// `protect` are skipped).
    fn pick_victim(&mut self, protect: Option<&[u8]>, dram_only: bool) -> Option<(u16, Bytes)> {
        let now = now_ms();
        let policy = match self.policy {
            // Keys the prefix queues do not know yet: rank by recency.
            EvictionPolicy::Prefix => EvictionPolicy::AllKeysLru,
            p => p,
        };
        if policy == EvictionPolicy::VolatileTtl {
            let (_, key) = self
                .meta
                .expires
                .iter()
                .find(|(_, k)| Some(&k[..]) != protect)?
                .clone();
            return Some((key_slot(&key), key));
        }
        let volatile_only = policy.volatile_only();
        if volatile_only && self.meta.expires.is_empty() {
            return None;
        }
        let mut best: Option<(u64, usize, Bytes)> = None;
        let mut found = 0;
        for _ in 0..self.samples * 8 {
            if found >= self.samples {
                break;
            }
            let Some((index, key)) = self.random_entry() else {
                break;
            };
            if Some(&key[..]) == protect {
                continue;
            }
            let entry = &self.maps[index][&key];
            if (volatile_only && entry.expire_at == 0)
                || entry.value.is_held()
                || (dram_only && !entry.value.in_dram())
            {
                continue;
            }
            found += 1;
            let score = eviction::score(entry, policy, now);
            if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, index, key));
            }
        }
        match best {
            Some((_, index, key)) => Some(((self.slots.start + index) as u16, key)),
            // Volatile keys too sparse to sample: take the soonest to expire.
            None if volatile_only => self
                .meta
                .expires
                .iter()
                .find(|(_, k)| Some(&k[..]) != protect)
                .map(|(_, k)| (key_slot(k), k.clone())),
            None => None,
        }
    }

    /// SCAN step: keys of the slots from `from` on (within this store),
    /// whole slots at a time, until at least `count` keys were collected.
    /// Returns the keys and the next slot to visit (`None`: store finished).
    pub fn scan(
        &mut self,
        from: usize,
        count: usize,
        mut keep: impl FnMut(&[u8], &Entry) -> bool,
        now: u64,
    ) -> (Vec<Bytes>, Option<usize>) {
        let mut out = Vec::new();
        let mut slot = from.max(self.slots.start);
        while slot < self.slots.end {
            let map = &self.maps[slot - self.slots.start];
            out.extend(
                map.iter()
                    .filter(|(k, e)| !e.expired(now) && keep(k, e))
                    .map(|(k, _)| k.clone()),
            );
            slot += 1;
            if out.len() >= count {
                break;
            }
        }
        let next = (slot < self.slots.end).then_some(slot);
        (out, next)
    }

    /// Number of live keys in `slot`.
    pub fn count_in_slot(&self, slot: usize, now: u64) -> usize {
        if !self.slots.contains(&slot) {
            return 0;
        }
        self.maps[slot - self.slots.start]
            .values()
            .filter(|e| !e.expired(now))
            .count()
    }

    /// Up to `count` live keys of `slot` (CLUSTER GETKEYSINSLOT).
    pub fn keys_in_slot(&self, slot: usize, count: usize, now: u64) -> Vec<Bytes> {
        if !self.slots.contains(&slot) {
            return Vec::new();
        }
        self.maps[slot - self.slots.start]
            .iter()
            .filter(|(_, e)| !e.expired(now))
            .map(|(k, _)| k.clone())
            .take(count)
            .collect()
    }

    /// Iterates all live keys (KEYS).
    pub fn for_each_live(&self, now: u64, mut f: impl FnMut(&Bytes, &Entry)) {
        for map in &self.maps {
            for (k, e) in map {
                if !e.expired(now) {
                    f(k, e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::slot::{key_slot, SLOTS};

    fn store(budget: usize, policy: EvictionPolicy) -> Store {
        Store::new(0..SLOTS, budget, policy)
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
            let (keys, next) = s.scan(from, 10, |_, _| true, 1000);
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
    use crate::shard::slot::{key_slot, SLOTS};

    fn block(i: u32, len: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|j| (j as u32 ^ i.wrapping_mul(2654435761)) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    fn put(s: &mut Store, key: &str, value: Bytes, parent: Option<&str>) -> i64 {
        let parent = parent.map(|p| Bytes::copy_from_slice(p.as_bytes()));
        let code = s.insert_block(
            key_slot(key.as_bytes()),
            key.as_bytes(),
            value,
            0,
            parent,
            false,
            1000,
        );
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
            for e in events {
                s.apply_link(e);
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
    fn prefix_policy_evicts_orphans_then_leaves_before_inner_blocks() {
        // Room for about 24 blocks of 64 KiB (pages of 256 KiB).
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
        // A chain a0 <- a1 <- ... <- a9.
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
        // Keep writing: leaves go, the chain's inner blocks stay.
        for j in 0..40 {
            put(&mut s, &format!("y{j}"), block(2000 + j, 64 * 1024), None);
        }
        for k in 0..9 {
            assert!(has(&mut s, &format!("a{k}")), "inner block a{k} kept");
        }
        assert_eq!(s.stats.evicted_by[EvictReason::Inner as usize], 0);
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
                0,
                None,
                false,
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
