//! Eviction policies and the per-key recency/frequency they rank by.
//!
//! Victims are chosen Redis-style: sample a few random keys, evict the one
//! the policy ranks worst (highest [`score`]). LFU uses Redis's logarithmic
//! 8-bit counter with one decrement per idle minute.

use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;

use std::collections::VecDeque;

use bytes::Bytes;

use crate::entry::{decayed, minutes, Queue, LFU_INIT};
use crate::slot::key_slot;
use crate::{now_ms, Entry, EvictReason, Protect, Store};

/// `maxmemory-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Writes that need memory fail with OOM.
    NoEviction,
    /// Least recently used among all keys.
    AllKeysLru,
    /// Least frequently used among all keys.
    AllKeysLfu,
    /// Any key.
    AllKeysRandom,
    /// Least recently used among keys with a TTL.
    VolatileLru,
    /// Least frequently used among keys with a TTL.
    VolatileLfu,
    /// Any key with a TTL.
    VolatileRandom,
    /// The key with the nearest expiry.
    VolatileTtl,
    /// Prefix-aware (the default): orphaned blocks first, then cold final
    /// partial blocks, then leaves of chains by LRU over two levels of
    /// reuse, blocks with cached children last.
    Prefix,
}

impl EvictionPolicy {
    /// Every policy, in the order CONFIG documents them.
    pub const ALL: [EvictionPolicy; 9] = [
        EvictionPolicy::NoEviction,
        EvictionPolicy::AllKeysLru,
        EvictionPolicy::AllKeysLfu,
        EvictionPolicy::AllKeysRandom,
        EvictionPolicy::VolatileLru,
        EvictionPolicy::VolatileLfu,
        EvictionPolicy::VolatileRandom,
        EvictionPolicy::VolatileTtl,
        EvictionPolicy::Prefix,
    ];

    /// The name used in configuration.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::NoEviction => "noeviction",
            EvictionPolicy::AllKeysLru => "allkeys-lru",
            EvictionPolicy::AllKeysLfu => "allkeys-lfu",
            EvictionPolicy::AllKeysRandom => "allkeys-random",
            EvictionPolicy::VolatileLru => "volatile-lru",
            EvictionPolicy::VolatileLfu => "volatile-lfu",
            EvictionPolicy::VolatileRandom => "volatile-random",
            EvictionPolicy::VolatileTtl => "volatile-ttl",
            EvictionPolicy::Prefix => "prefix",
        }
    }

    /// Whether only keys with a TTL may be evicted.
    pub fn volatile_only(self) -> bool {
        matches!(
            self,
            EvictionPolicy::VolatileLru
                | EvictionPolicy::VolatileLfu
                | EvictionPolicy::VolatileRandom
                | EvictionPolicy::VolatileTtl
        )
    }

    /// Whether every key is queued in recency order (the `prefix` policy's
    /// levels, `allkeys-lru`'s one exact LRU queue); the other policies
    /// sample.
    pub fn queues(self) -> bool {
        matches!(self, EvictionPolicy::Prefix | EvictionPolicy::AllKeysLru)
    }

    /// Whether the policy tracks frequency (OBJECT FREQ works, IDLETIME not).
    pub fn is_lfu(self) -> bool {
        matches!(
            self,
            EvictionPolicy::AllKeysLfu | EvictionPolicy::VolatileLfu
        )
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvictionPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("invalid maxmemory-policy '{s}'"))
    }
}

const LFU_LOG_FACTOR: f64 = 10.0;

/// Records an access at logical time `tick`: recency always (the store's
/// clock, exact, for LRU; seconds for OBJECT IDLETIME), the use count the
/// `prefix` policy ranks by, frequency under LFU policies.
pub fn touch(entry: &mut Entry, policy: EvictionPolicy, now_ms: u64, tick: u32) {
    entry.atime = (now_ms / 1000) as u32;
    entry.tick = tick;
    entry.uses = entry.uses.saturating_add(1);
    if policy.is_lfu() {
        let counter = decayed(entry.lfu, entry.lfu_minutes, now_ms);
        entry.lfu = log_increment(counter, now_ms);
        entry.lfu_minutes = minutes(now_ms);
    }
}

/// Redis's probabilistic logarithmic increment: the higher the counter, the
/// less likely one access raises it.
fn log_increment(counter: u8, seed: u64) -> u8 {
    if counter == 255 {
        return 255;
    }
    // A cheap pseudo-random number in [0, 1) from the clock and counter.
    let mut x = seed ^ ((counter as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    let r = (x >> 11) as f64 / (1u64 << 53) as f64;
    let base = counter.saturating_sub(LFU_INIT) as f64;
    let p = 1.0 / (base * LFU_LOG_FACTOR + 1.0);
    if r < p {
        counter + 1
    } else {
        counter
    }
}

/// How strongly the policy wants to evict `entry`: higher goes first.
/// `tick` is the store's logical clock (LRU ranks by the ticks since the
/// last access: exact, where Redis's clock has a resolution of seconds).
pub fn score(entry: &Entry, policy: EvictionPolicy, now_ms: u64, tick: u32) -> u64 {
    match policy {
        EvictionPolicy::AllKeysLfu | EvictionPolicy::VolatileLfu => {
            255 - decayed(entry.lfu, entry.lfu_minutes, now_ms) as u64
        }
        EvictionPolicy::AllKeysRandom | EvictionPolicy::VolatileRandom => 0,
        EvictionPolicy::VolatileTtl => u64::MAX - entry.expire_at,
        _ => tick.wrapping_sub(entry.tick) as u64,
    }
}

/// Levels of the `prefix` policy: a block is queued at level log2(uses).
pub(crate) const LEVELS: usize = 8;

/// The `prefix` policy's parameters (the defaults are what the policy
/// study in docs/research/eviction-study.md chose; the policy simulator,
/// bench/src/sim.rs, varies them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixTuning {
    /// Levels in use (1..=8): a block's level is min(log2(uses), levels-1).
    pub levels: u8,
    /// Ticks without a use after which a block moves down a level, per
    /// block in DRAM.
    pub lifetime_per_block: f32,
    /// A chain's last block, when shorter than the block before it (a
    /// request's final partial block), is queued to go first.
    pub cold_partial: bool,
    /// Evicted keys remembered (their uses), per block in DRAM: a block
    /// written again while remembered starts from the uses it had, plus
    /// this write. 0: none.
    pub ghosts_per_block: f32,
    /// Blocks of a class of chain writes ([`WriteClass`]) are stored cold
    /// (queued to go first) while the share of them read before eviction
    /// is below this × the share of evicted blocks that are written again
    /// while the ghost list remembers them (why one half: [`Classes`]).
    /// 0: off.
    pub class_threshold: f32,
    /// One chain write in this many of a cold class is stored as usual, so
    /// the class's rate stays measured.
    pub class_probe: u32,
    /// A class is stored cold only while it is also read less often than
    /// this × the blocks of all classes measured (0: off): when evicted
    /// blocks come back more often than any class is read, only the
    /// classes read least go cold, not all of them.
    pub class_guard: f32,
}

impl Default for PrefixTuning {
    fn default() -> Self {
        PrefixTuning {
            levels: 2,
            lifetime_per_block: 0.5,
            cold_partial: true,
            ghosts_per_block: 4.0,
            class_threshold: 0.5,
            class_probe: 16,
            class_guard: 1.0,
        }
    }
}

impl PrefixTuning {
    /// The level a block of `uses` uses is queued at.
    pub(crate) fn level_of(&self, uses: u8) -> u8 {
        (uses.max(1).ilog2() as u8).min(self.levels.clamp(1, LEVELS as u8) - 1)
    }
}

/// The `prefix` policy's memory of blocks it evicted from DRAM (MQ's
/// "Qout"): for each, a tag of its key's hash and the uses it had. A block
/// written again while remembered was evicted too soon: it comes back with
/// its uses plus this write (so a block read before, or returning for the
/// second time, is queued at level 1) instead of as a new block. On RAG's
/// repeated chunk lists and the synthetic trace's repeated prompts this is
/// what tells a block that returns from one that does not.
///
/// A table of 4-byte slots (a 24-bit tag and the uses) in sets of
/// [`GHOST_WAYS`], its size the power of two at or above `ghosts_per_block`
/// × the blocks in DRAM. Each set is a little FIFO: a newer eviction goes
/// first in its key's set and the set's oldest is forgotten, so a key is
/// remembered for about as many evictions as there are slots. A set is 16
/// bytes of one cache line: one memory access per eviction and per write
/// of a new key (why a set and not a map or one slot per key:
/// docs/research/eviction-study.md, "Why the ghost list"). The hash has a
/// fixed seed, so a replay through the server makes the policy
/// simulator's (bench/src/sim.rs) choices; keys crafted
/// to meet in one set can only make the policy forget other ghosts. A tag
/// collision (about one in 16 million lookups that meet a filled slot)
/// gives a block the uses of another.
pub(crate) struct Ghosts {
    hasher: foldhash::fast::FixedState,
    /// Sets of `tag << 8 | uses`, newest first, the set of a hash at
    /// `hash & (len - 1)` rounded down to [`GHOST_WAYS`]; 0 is an empty slot.
    slots: Vec<u32>,
}

/// Slots in a set of [`Ghosts`].
const GHOST_WAYS: usize = 4;

impl Default for Ghosts {
    fn default() -> Self {
        Ghosts {
            hasher: foldhash::fast::FixedState::with_seed(0x6b76_7469_6572),
            slots: Vec::new(),
        }
    }
}

impl Ghosts {
    /// The first slot of `key`'s set and the tag stored for it (never 0,
    /// so an empty slot matches no key).
    fn place(&self, key: &[u8]) -> (usize, u32) {
        let hash = self.hasher.hash_one(key);
        let index = hash as usize & (self.slots.len() - 1) & !(GHOST_WAYS - 1);
        let tag = ((hash >> 40) as u32) | 1;
        (index, tag)
    }

    /// Remembers that `key` was evicted with `uses`, in a table sized for
    /// `room` keys (resized, and so emptied, when `room` left its size far
    /// behind: as the store first fills, or after it shrank a lot).
    pub(crate) fn remember(&mut self, key: &[u8], uses: u8, room: usize) {
        if room == 0 {
            return;
        }
        let size = room.next_power_of_two().max(GHOST_WAYS);
        if self.slots.len() < size || self.slots.len() > 4 * size {
            self.slots = vec![0; size];
        }
        let (index, tag) = self.place(key);
        let set = &mut self.slots[index..index + GHOST_WAYS];
        // Newest first: the key's own older slot, or else the oldest, goes.
        let end = set
            .iter()
            .position(|&s| s >> 8 == tag)
            .unwrap_or(GHOST_WAYS - 1);
        set.copy_within(0..end, 1);
        set[0] = tag << 8 | uses as u32;
    }

    /// The uses `key` had when it was evicted, if it is remembered (it is
    /// forgotten: it is back).
    pub(crate) fn recall(&mut self, key: &[u8]) -> Option<u8> {
        if self.slots.is_empty() {
            return None;
        }
        let (index, tag) = self.place(key);
        let set = &mut self.slots[index..index + GHOST_WAYS];
        let at = set.iter().position(|&s| s >> 8 == tag)?;
        let uses = set[at] as u8;
        set[at] = 0;
        Some(uses)
    }

    /// Keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().filter(|&&s| s != 0).count()
    }

    /// Slots in the table.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes charged for the table.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u32>()
    }
}

/// The eviction queues of the `prefix` policy (a multi-queue, MQ): per
/// level, one LRU queue of the blocks in DRAM; a block moves up a level each
/// time its uses double and down one when it has not been used for a
/// lifetime. A block met at the front of its queue while cached blocks
/// continue it (an inner block of a chain) is parked, in that order, in its
/// level's parked queue; when its last cached child goes it returns to the
/// front of its queue, so a chain no one reads is evicted from its tail,
/// each block in its turn by recency. Orphans are apart. Queues hold
/// `(key, tick)`; an entry whose tick moved on (used, demoted, removed) is
/// skipped when met.
///
/// The queues exist only while there is a budget to evict for (a store
/// with no maxmemory never evicts: its reads and writes queue nothing, and
/// setting a budget builds the queues from the index, in recency order).
///
/// Each tenant has queues of its own (a [`Lane`]): eviction picks the
/// tenant first ([`crate::tenants::Tenants::victims`]), then the block by
/// the policy among that tenant's. Without tenants there is one lane.
///
/// With them, the store's logical clock (one tick per read or write of a
/// key, kept with or without queues: exact recency for LRU and the
/// lifetimes here, and the stamp that tells current queue entries from
/// stale ones).
pub(crate) struct Recency {
    pub(crate) clock: u32,
    /// Per tenant slot in use (at least one).
    pub(crate) lanes: Vec<Lane>,
    /// Slots pushed since the queues were last counted.
    pub(crate) pushed: usize,
    /// `allkeys-lru`: one queue (level 0) in exact recency order, nothing
    /// parked.
    pub(crate) lru_only: bool,
    pub(crate) tuning: PrefixTuning,
    /// Blocks evicted lately, with their uses (`prefix` only).
    pub(crate) ghosts: Ghosts,
    /// How often each class of chain writes was read before eviction.
    pub(crate) classes: Classes,
}

/// What a chain write (MSETBLOCK CHAIN) is, for the `prefix` policy: how
/// many blocks it stores (log2 buckets: 1, 2–3, ..., 128+) and whether it
/// continues a stored chain (PARENT). 0: not a chain write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteClass(u8);

impl WriteClass {
    /// The class of a chain write of `blocks` blocks, continuing a stored
    /// chain if `rooted`.
    pub fn chain(blocks: usize, rooted: bool) -> WriteClass {
        let bucket = (usize::BITS - blocks.max(1).leading_zeros()).min(8) as u8 - 1;
        WriteClass(1 + (bucket << 1 | u8::from(rooted)))
    }
}

/// Classes of blocks measured: [`WriteClass`]es × written again while
/// remembered by the ghost list or not.
const CLASSES: usize = 32;

/// Per class of blocks, how many of those stored as usual were evicted and
/// how many of them had been read first (halved every DRAM's worth of
/// them, so the rates follow the workload); and how many evicted blocks
/// were written again while remembered (halved every four DRAMs' worth of
/// evictions, the ghost list's memory). A class read less than half as
/// often as evicted blocks come back is worth less than the room it
/// takes: what would be kept in its place returns more often (at once as
/// often, the rule fed on itself where turns come back about a DRAM's
/// lifetime later: a first turn stored cold is written again when its
/// session continues, and that return keeps its class cold). On system prompts that
/// is the user's suffix after a shared prompt (3% read); on conversations
/// no class once warm (each turn's suffix is read by the next turn, 45–75%,
/// and 4% of evicted blocks return at 25% DRAM); on the synthetic trace at
/// 10% every class (73% of evicted blocks return, no class is read above
/// 42%), so a class also has to be read less often than the blocks of all
/// classes measured (the guard): there only the classes read least go
/// cold. The decision is made once per chain write (the blocks of one call
/// are read together or not at all): its first new block decides, and the
/// chain relay carries the decision from shard to shard with the rest of
/// the chain (the class of the first block decides, remembered or not, for
/// all of them; across cluster nodes each node's part is a call of its
/// own); one write in [`PrefixTuning::class_probe`] of a cold class is
/// stored as usual, so its rate stays measured.
#[derive(Default)]
pub(crate) struct Classes {
    evicted: [u32; CLASSES],
    read: [u32; CLASSES],
    /// The sums of `evicted` and `read`.
    total: u32,
    total_read: u32,
    /// Chain writes of cold classes stored cold since the last probe.
    skipped: u32,
    /// Blocks evicted, and blocks written again while the ghost list
    /// remembered them (halved with the rest).
    evictions: u32,
    returns: u32,
    /// A whole window was measured (before, the first evictions, of the
    /// blocks stored first, say little).
    warm: bool,
    /// Whether the chain write being stored is stored cold (None: not
    /// decided yet).
    run: Option<bool>,
}

impl Classes {
    /// The measured class (1-based: 0 is none) of a block written with
    /// `class`, remembered or not.
    pub(crate) fn of(class: WriteClass, remembered: bool) -> u8 {
        match class.0 {
            0 => 0,
            c => 1 + ((c - 1) << 1 | u8::from(remembered)),
        }
    }

    /// Whether blocks of `class` (from [`Classes::of`]) are read so rarely
    /// that they should be stored cold.
    pub(crate) fn cold(&self, class: u8, tuning: &PrefixTuning) -> bool {
        let (threshold, guard) = (tuning.class_threshold, tuning.class_guard);
        let c = class as usize - 1;
        if threshold <= 0.0 || !self.warm || self.evicted[c] < 32 {
            return false;
        }
        let rate = self.read[c] as f32 / self.evicted[c] as f32;
        // (When no measured block was read, none is read less than the
        // rest: the guard has nothing to say.)
        let all = self.total_read as f32 / self.total.max(1) as f32;
        if guard > 0.0 && self.total_read > 0 && rate >= guard * all {
            return false;
        }
        rate < threshold * self.returns as f32 / self.evictions.max(1) as f32
    }

    /// Whether a chain write of blocks of `class` is stored cold: its class
    /// is [`Classes::cold`], and the write is not one of the probes.
    fn decide(&mut self, class: u8, tuning: &PrefixTuning) -> bool {
        if !self.cold(class, tuning) {
            return false;
        }
        self.skipped += 1;
        if self.skipped < tuning.class_probe.max(1) {
            return true;
        }
        self.skipped = 0;
        false
    }

    /// A measured block of `class` was evicted, read or not.
    fn evicted(&mut self, class: u8, read: bool, window: usize) {
        let c = class as usize - 1;
        self.evicted[c] += 1;
        self.read[c] += u32::from(read);
        self.total += 1;
        self.total_read += u32::from(read);
        if self.total as usize > window.max(1024) {
            for (e, r) in self.evicted.iter_mut().zip(&mut self.read) {
                *e /= 2;
                *r /= 2;
            }
            self.total = self.evicted.iter().sum();
            self.total_read = self.read.iter().sum();
            self.warm = true;
        }
    }

    /// `entry` leaves DRAM, for good or to the spill tier: if it is a
    /// measured block, its class counts it, read or not, once (a block
    /// dropped from disk later is not counted again).
    pub(crate) fn left_dram(&mut self, entry: &mut Entry, window: usize) {
        if entry.class != 0 {
            self.evicted(entry.class, entry.reads > 0, window);
            entry.class = 0;
        }
    }

    /// A block was evicted (measured or not).
    fn left(&mut self, window: usize) {
        self.evictions += 1;
        if self.evictions as usize > 4 * window.max(1024) {
            self.evictions /= 2;
            self.returns /= 2;
        }
    }
}

/// One tenant's queues (see [`Recency`]).
#[derive(Default)]
pub(crate) struct Lane {
    pub(crate) queues: [VecDeque<(Bytes, u32)>; LEVELS],
    pub(crate) parked: [VecDeque<(Bytes, u32)>; LEVELS],
    pub(crate) orphans: VecDeque<(Bytes, u32)>,
}

impl Default for Recency {
    fn default() -> Self {
        Recency {
            clock: 0,
            lanes: vec![Lane::default()],
            pushed: 0,
            lru_only: false,
            tuning: PrefixTuning::default(),
            ghosts: Ghosts::default(),
            classes: Classes::default(),
        }
    }
}

impl Recency {
    /// One more tick of the logical clock; its new time.
    pub(crate) fn tick(&mut self) -> u32 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    /// The level a block of `uses` is queued at.
    fn level_of(&self, uses: u8) -> u8 {
        match self.lru_only {
            true => 0,
            false => self.tuning.level_of(uses),
        }
    }

    /// The queue `entry` (of `uses`) goes to: its level (set in the
    /// entry), not parked.
    pub(crate) fn place(&self, entry: &mut Entry) -> u8 {
        let level = self.level_of(entry.uses);
        entry.queue = Queue::at(level);
        entry.parked = false;
        level
    }

    /// Pushes `key` (of tenant slot `lane`), stamped `tick`, on level
    /// `level`'s queue (its parked queue if `parked`), at the front if
    /// `front`.
    pub(crate) fn push(
        &mut self,
        lane: u8,
        level: u8,
        parked: bool,
        front: bool,
        key: Bytes,
        tick: u32,
    ) {
        self.pushed += 1;
        let q = self.queue(lane, level, parked);
        if front {
            q.push_front((key, tick));
        } else {
            q.push_back((key, tick));
        }
    }

    /// Queues `entry` (of `key`) at the back of its level, stamped with its
    /// tick (after a use, which gave it a new one). `cold` puts it at the
    /// front instead (a block the writer does not expect read again).
    pub(crate) fn requeue(&mut self, key: &Bytes, entry: &mut Entry, cold: bool) {
        let level = self.place(entry);
        self.push(entry.tenant, level, false, cold, key.clone(), entry.tick);
    }

    /// A parked block that lost its last cached child: back to the front of
    /// its level, where it waited (it is older than anything queued since).
    pub(crate) fn unpark(&mut self, key: &Bytes, entry: &mut Entry) {
        if let (true, Some(level)) = (entry.parked, entry.queue.level()) {
            entry.parked = false;
            self.push(entry.tenant, level, false, true, key.clone(), entry.tick);
        }
    }

    /// A block that became an orphan: queued to go first.
    pub(crate) fn orphaned(&mut self, key: &Bytes, entry: &Entry) {
        self.pushed += 1;
        self.lane(entry.tenant)
            .orphans
            .push_back((key.clone(), entry.tick));
    }

    /// Slots (live or stale) in all queues: what compaction bounds, beside
    /// the blocks queued (`Meta::queued`).
    pub(crate) fn slots(&self) -> usize {
        self.lanes
            .iter()
            .flat_map(|l| l.queues.iter().chain(&l.parked).chain([&l.orphans]))
            .map(VecDeque::len)
            .sum()
    }

    /// Tenant slot `lane`'s queues (lane 0 for any slot past the lanes:
    /// without per-tenant eviction there is one lane, for every key).
    #[inline]
    pub(crate) fn lane(&mut self, lane: u8) -> &mut Lane {
        let at = self.lane_index(lane);
        &mut self.lanes[at]
    }

    /// The index in `lanes` of tenant slot `lane`'s queues.
    #[inline]
    fn lane_index(&self, lane: u8) -> usize {
        if (lane as usize) < self.lanes.len() {
            lane as usize
        } else {
            0
        }
    }

    #[inline]
    fn queue(&mut self, lane: u8, level: u8, parked: bool) -> &mut VecDeque<(Bytes, u32)> {
        let lane = self.lane(lane);
        if parked {
            &mut lane.parked[level as usize]
        } else {
            &mut lane.queues[level as usize]
        }
    }
}

/// Whether a queue entry stamped `tick` (in a parked queue or not) is
/// `entry`'s current place.
fn current(entry: &Entry, tick: u32, parked: bool) -> bool {
    entry.tick == tick && entry.parked == parked
}

impl Store {
    /// Whether reads and writes keep the queues: a policy that queues, and
    /// a budget to evict for.
    pub(crate) fn queues_on(&self) -> bool {
        self.budget != 0 && self.policy.queues()
    }

    /// Builds the queues anew from the index (after a change of policy or
    /// of whether there is a budget): empty unless [`Store::queues_on`];
    /// else every block in DRAM in recency order (oldest first, on its
    /// level) and every orphan. O(n log n), once per change.
    pub(crate) fn reset_queues(&mut self) {
        self.recency = Recency {
            clock: self.recency.clock,
            lanes: (0..self.meta.tenants.lanes())
                .map(|_| Lane::default())
                .collect(),
            lru_only: self.policy == EvictionPolicy::AllKeysLru,
            tuning: self.recency.tuning,
            ..Recency::default()
        };
        self.meta.queued = 0;
        let on = self.queues_on();
        let clock = self.recency.clock;
        let mut order = Vec::new();
        for map in &mut self.maps {
            for (key, e) in map.iter_mut() {
                e.queue = Queue::OUT;
                e.parked = false;
                if on && e.value.in_dram() {
                    order.push((clock.wrapping_sub(e.tick), key.clone()));
                }
            }
        }
        // Oldest (most ticks ago) first.
        order.sort_unstable_by_key(|(age, _)| std::cmp::Reverse(*age));
        for (_, key) in order {
            let index = self.index(key_slot(&key));
            let Some(e) = self.maps[index].get_mut(&key[..]) else {
                continue;
            };
            self.meta.queued += 1;
            self.recency.requeue(&key, e, false);
            if e.orphan && self.policy == EvictionPolicy::Prefix {
                self.recency.orphaned(&key, e);
            }
        }
    }

    /// Drops the stale queue slots (used or removed blocks' old places)
    /// once the queues hold more than four slots per block queued, plus
    /// 1024. They are counted once more than `queued + 1024` slots were
    /// pushed since the last count, so they never hold more than five
    /// slots per block, plus 2049. Amortised O(1): a count (17 lengths)
    /// follows at least one push per block queued, a compaction at least
    /// three; a compare on every read and write. (Compacting after every
    /// `3 × queued` pushes, stale or not, walked all the queues once per
    /// three DRAMs' worth of writes to random keys, about one cache miss
    /// per write: docs/research/eviction-study.md.)
    pub(crate) fn compact_queues_if_stale(&mut self) {
        if self.recency.pushed > self.meta.queued + 1024 {
            self.recency.pushed = 0;
            if self.recency.slots() > 4 * self.meta.queued + 1024 {
                self.compact_queues();
            }
        }
    }

    fn compact_queues(&mut self) {
        let mut lanes = std::mem::take(&mut self.recency.lanes);
        for lane in &mut lanes {
            lane.orphans.retain(|(key, _)| {
                let index = self.index(key_slot(key));
                self.maps[index].get(&key[..]).is_some_and(|e| e.orphan)
            });
            for (parked, queues) in [(false, &mut lane.queues), (true, &mut lane.parked)] {
                for q in queues {
                    q.retain(|(key, tick)| {
                        let index = self.index(key_slot(key));
                        let e = self.maps[index].get(&key[..]);
                        e.is_some_and(|e| current(e, *tick, parked))
                    });
                }
            }
        }
        self.recency.lanes = lanes;
    }

    /// Records that `key` (its entry `gone`) left the index by eviction
    /// (not to the spill tier, where it keeps its uses): in the `prefix`
    /// policy's ghost list with its uses, and in its class's counts (unless
    /// it was counted as it moved to disk).
    pub(crate) fn remember_evicted(&mut self, key: &[u8], mut gone: Entry) {
        if self.policy != EvictionPolicy::Prefix || !self.queues_on() {
            return;
        }
        let room = (self.meta.queued as f32 * self.recency.tuning.ghosts_per_block) as usize;
        self.recency.ghosts.remember(key, gone.uses, room);
        self.recency.classes.left(self.meta.queued);
        self.recency.classes.left_dram(&mut gone, self.meta.queued);
    }

    /// How a block written now starts. Its uses: this write (0 for a cold
    /// one, which is not a use), plus the uses it had if the `prefix`
    /// policy evicted it lately. Under `prefix`, a chain write whose
    /// class of blocks is read rarely ([`Classes::cold`]) is stored cold,
    /// but for one in [`PrefixTuning::class_probe`], which is stored as
    /// usual and measured; the blocks after the first new block of a chain
    /// write are stored as it was ([`Store::begin_chain`]).
    pub(crate) fn new_block(&mut self, key: &[u8], cold: bool, class: WriteClass) -> NewBlock {
        let remembered = match self.policy {
            EvictionPolicy::Prefix => self.recency.ghosts.recall(key),
            _ => None,
        };
        let uses = match remembered {
            Some(uses) => uses.saturating_add(1),
            None => u8::from(!cold),
        };
        let mut block = NewBlock {
            uses,
            cold,
            class: 0,
        };
        if cold || self.policy != EvictionPolicy::Prefix {
            return block;
        }
        if remembered.is_some() {
            self.recency.classes.returns += 1;
        }
        let class = Classes::of(class, remembered.is_some());
        if class == 0 {
            return block;
        }
        let tuning = &self.recency.tuning;
        let classes = &mut self.recency.classes;
        let stored_cold = match classes.run {
            Some(run) => run,
            None => {
                let decided = classes.decide(class, tuning);
                classes.run = Some(decided);
                decided
            }
        };
        if stored_cold {
            block.cold = true;
            return block;
        }
        block.class = class;
        block
    }

    /// Starts storing a run of a chain write's blocks (MSETBLOCK CHAIN: the
    /// blocks the call stores on this store, one after another): as
    /// `decided` by the call's earlier runs on other stores, or (None) by
    /// the run's first new block of a measured class ([`Store::new_block`]).
    pub fn begin_chain(&mut self, decided: Option<bool>) {
        self.recency.classes.run = decided;
    }

    /// How the chain write being stored was decided so far: passed to
    /// [`Store::begin_chain`] of the store of its next run.
    pub fn chain_decision(&self) -> Option<bool> {
        self.recency.classes.run
    }
}

/// How a new block starts (see [`Store::new_block`]).
pub(crate) struct NewBlock {
    pub(crate) uses: u8,
    /// Queued to go first.
    pub(crate) cold: bool,
    /// Its measured class (0: not measured).
    pub(crate) class: u8,
}

impl Store {
    /// The lifetime of a use, in ticks: a block unused this long moves down
    /// a level.
    fn lifetime(&self) -> u32 {
        ((self.meta.queued as f32 * self.recency.tuning.lifetime_per_block) as u32).max(64)
    }

    /// Moves the blocks at the front of tenant `lane`'s levels 1.. whose
    /// lifetime ran out to the back of the level below, their uses halved
    /// (a few per call: O(1)).
    fn demote_expired(&mut self, lane: u8) {
        let (now, lifetime) = (self.recency.clock, self.lifetime());
        let at = self.recency.lane_index(lane);
        for level in 1..LEVELS as u8 {
            let mut budget = 8;
            while budget > 0 {
                let queue = &mut self.recency.lanes[at].queues[level as usize];
                let Some((key, tick)) = queue.front().cloned() else {
                    break;
                };
                let index = self.index(key_slot(&key));
                let e = self.maps[index].get_mut(&key[..]);
                let Some(e) = e.filter(|e| current(e, tick, false)) else {
                    self.recency.lanes[at].queues[level as usize].pop_front();
                    continue;
                };
                if (now.wrapping_sub(e.tick) as i32) < lifetime as i32 {
                    break;
                }
                budget -= 1;
                self.recency.lanes[at].queues[level as usize].pop_front();
                e.uses /= 2;
                e.tick = self.recency.tick();
                let down = level - 1;
                e.queue = Queue::at(down);
                self.recency.push(lane, down, false, false, key, e.tick);
            }
        }
    }

    /// The `prefix` policy's victim: an orphan if there is one; else, from
    /// the lowest level up, the least recently used block no cached block
    /// continues (a leaf); else, when nothing but blocks with cached
    /// children is left, the least recently used of those; all among
    /// tenant `lane`'s blocks. Held values and `protect` are never chosen.
    pub(crate) fn prefix_victim(
        &mut self,
        lane: u8,
        protect: Protect,
        dram_only: bool,
    ) -> Option<(u16, Bytes, EvictReason)> {
        // 1. Orphans: unreachable by any prefix lookup. Held ones (and the
        // key being written, and blocks on disk when a slot is needed) stay
        // queued: they go first once free.
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some((key, tick)) = self.recency.lane(lane).orphans.pop_front() {
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get(&key[..]) else {
                continue;
            };
            // Any queue entry of a block that is an orphan now will do (a
            // use re-queues the block in its level, not here).
            if !e.orphan {
                continue;
            }
            if e.value.is_held()
                || protect.covers(&key)
                || (dram_only && !e.value.in_dram())
                || self.held(&key)
            {
                skipped.push((key, tick));
                continue;
            }
            found = Some((slot, key, EvictReason::Orphan));
            break;
        }
        for entry in skipped.into_iter().rev() {
            self.recency.lane(lane).orphans.push_front(entry);
        }
        if found.is_some() {
            return found;
        }
        // 2. Blocks unused for a lifetime go down a level first.
        self.demote_expired(lane);
        // 3. From the lowest level up, the least recently used block that
        // no cached block continues (those that are, met first, are
        // parked); 4. when there is none at any level, the lowest level's
        // first parked block (its descendants become orphans). Held blocks
        // and `protect` are passed over and put back in their place.
        for parked in [false, true] {
            for level in 0..LEVELS as u8 {
                if let Some(victim) = self.queue_victim(lane, level, parked, protect, dram_only) {
                    return Some(victim);
                }
            }
        }
        None
    }

    /// `allkeys-lru`'s victim: tenant `lane`'s least recently used key,
    /// exactly (its one queue is in recency order).
    pub(crate) fn lru_victim(
        &mut self,
        lane: u8,
        protect: Protect,
        dram_only: bool,
    ) -> Option<(u16, Bytes, EvictReason)> {
        self.queue_victim(lane, 0, false, protect, dram_only)
            .map(|(slot, key, _)| (slot, key, EvictReason::Policy))
    }

    /// The least recently used block of one of tenant `lane`'s queues (a
    /// level's, or its parked blocks') that may go.
    fn queue_victim(
        &mut self,
        lane: u8,
        level: u8,
        parked: bool,
        protect: Protect,
        dram_only: bool,
    ) -> Option<(u16, Bytes, EvictReason)> {
        let mut passed = Vec::new();
        let mut victim = None;
        let lru_only = self.recency.lru_only;
        let now = if self.holds.is_empty() { 0 } else { now_ms() };
        while let Some((key, tick)) = self.recency.queue(lane, level, parked).pop_front() {
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get_mut(&key[..]) else {
                continue;
            };
            if !current(e, tick, parked) {
                continue;
            }
            if !parked && !lru_only && e.children > 0 {
                // An inner block: waits until its children are gone.
                e.parked = true;
                self.recency.push(lane, level, true, false, key, tick);
                continue;
            }
            if !e.value.in_dram() {
                // Spilled: it left DRAM, and the queues with it.
                if e.queue != Queue::OUT {
                    self.meta.queued -= 1;
                }
                e.queue = Queue::OUT;
                if dram_only {
                    continue;
                }
                victim = Some((slot, key, EvictReason::Leaf));
                break;
            }
            if e.value.is_held() || protect.covers(&key) || self.holds.covers(&key, now) {
                passed.push((key, tick));
                if passed.len() > 64 {
                    break;
                }
                continue;
            }
            let reason = if parked {
                EvictReason::Inner
            } else {
                EvictReason::Leaf
            };
            victim = Some((slot, key, reason));
            break;
        }
        for entry in passed.into_iter().rev() {
            self.recency.queue(lane, level, parked).push_front(entry);
        }
        victim
    }

    pub(crate) fn next_random(&mut self) -> u64 {
        // xorshift64*: cheap and good enough for sampling.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniformly chosen slot that holds keys, if any.
    pub(crate) fn random_nonempty_slot(&mut self) -> Option<usize> {
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
    pub(crate) fn random_entry(&mut self) -> Option<(usize, Bytes)> {
        let index = self.random_nonempty_slot()?;
        let len = self.maps[index].len() as u64;
        let nth = (self.next_random() % len) as usize;
        let (key, _) = self.maps[index].iter().nth(nth)?;
        Some((index, key.clone()))
    }

    /// Redis-style sampled choice for the classic policies among the keys
    /// of tenant slot `tenant` (None: any key); held values and `protect`
    /// are skipped. A tenant with too few keys to meet in the samples (a
    /// small one beside a large one) is looked for by a walk of the index
    /// from a random slot, keeping the best of the first few of its keys
    /// met: O(keys) at worst, only when sampling missed.
    pub(crate) fn pick_victim(
        &mut self,
        protect: Protect,
        dram_only: bool,
        tenant: Option<usize>,
    ) -> Option<(u16, Bytes)> {
        let now = now_ms();
        let policy = match self.policy {
            // Keys the prefix queues do not know yet: rank by recency.
            EvictionPolicy::Prefix => EvictionPolicy::AllKeysLru,
            p => p,
        };
        let ours = |store: &Store, k: &[u8]| tenant.is_none_or(|t| store.meta.tenants.of(k) == t);
        if policy == EvictionPolicy::VolatileTtl {
            let (_, key) = self
                .meta
                .expires
                .iter()
                .find(|(_, k)| !protect.covers(k) && !self.holds.covers(k, now) && ours(self, k))?
                .clone();
            return Some((key_slot(&key), key));
        }
        let volatile_only = policy.volatile_only();
        if volatile_only && self.meta.expires.is_empty() {
            return None;
        }
        let may_go = |store: &Store, key: &Bytes, entry: &Entry| {
            !((volatile_only && entry.expire_at == 0)
                || tenant.is_some_and(|t| entry.tenant as usize != t)
                || protect.covers(key)
                || entry.value.is_held()
                || (dram_only && !entry.value.in_dram())
                || store.holds.covers(key, now))
        };
        let clock = self.recency.clock;
        let mut best: Option<(u64, usize, Bytes)> = None;
        let mut found = 0;
        let mut consider =
            |best: &mut Option<(u64, usize, Bytes)>, index: usize, key: Bytes, entry: &Entry| {
                found += 1;
                let score = score(entry, policy, now, clock);
                if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                    *best = Some((score, index, key));
                }
                found
            };
        for _ in 0..self.samples * 8 {
            let Some((index, key)) = self.random_entry() else {
                break;
            };
            let entry = &self.maps[index][&key];
            if may_go(self, &key, entry) && consider(&mut best, index, key, entry) >= self.samples {
                break;
            }
        }
        if best.is_none() && tenant.is_some() && !volatile_only {
            let n = self.maps.len();
            let start = (self.next_random() % n.max(1) as u64) as usize;
            'walk: for i in (0..n).map(|k| (start + k) % n) {
                for (key, entry) in &self.maps[i] {
                    if may_go(self, key, entry)
                        && consider(&mut best, i, key.clone(), entry) >= self.samples
                    {
                        break 'walk;
                    }
                }
            }
        }
        match best {
            Some((_, index, key)) => Some(((self.slots.start + index) as u16, key)),
            // Volatile keys too sparse to sample: take the soonest to expire.
            None if volatile_only => self
                .meta
                .expires
                .iter()
                .find(|(_, k)| !protect.covers(k) && !self.holds.covers(k, now) && ours(self, k))
                .map(|(_, k)| (key_slot(k), k.clone())),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.name().parse::<EvictionPolicy>().unwrap(), p);
        }
        assert!("ALLKEYS-LRU".parse::<EvictionPolicy>().is_ok());
        assert!("bogus".parse::<EvictionPolicy>().is_err());
    }

    #[test]
    fn lfu_counter_grows_slowly_and_decays() {
        let mut counter = LFU_INIT;
        for i in 0..1000u64 {
            counter = log_increment(counter, i * 7919);
        }
        assert!(counter > LFU_INIT && counter < 60, "{counter}");
        assert_eq!(decayed(10, minutes(0), 3 * 60_000), 7);
        assert_eq!(decayed(2, minutes(0), 10 * 60_000), 0);
    }

    #[test]
    fn a_ghost_set_forgets_its_oldest() {
        // Room for one set: every key meets in it.
        let mut g = Ghosts::default();
        for (i, k) in [b"k0", b"k1", b"k2", b"k3"].iter().enumerate() {
            g.remember(*k, i as u8 + 1, GHOST_WAYS);
        }
        assert_eq!(g.len(), GHOST_WAYS);
        // Remembered again: its own slot moves to the front, nothing lost.
        g.remember(b"k0", 9, GHOST_WAYS);
        assert_eq!(g.len(), GHOST_WAYS);
        // A fifth key: the oldest (now k1) goes.
        g.remember(b"k4", 5, GHOST_WAYS);
        assert_eq!(g.recall(b"k1"), None);
        assert_eq!(g.recall(b"k0"), Some(9));
        assert_eq!(g.recall(b"k2"), Some(3));
        assert_eq!(g.recall(b"k2"), None, "recalled keys are forgotten");
        assert_eq!((g.recall(b"k3"), g.recall(b"k4")), (Some(4), Some(5)));
        assert_eq!(g.len(), 0);
        assert_eq!(g.bytes(), 4 * GHOST_WAYS);
    }

    #[test]
    fn when_evicted_blocks_return_more_often_than_any_class_is_read_only_the_least_read_go_cold() {
        let class = |n| Classes::of(WriteClass::chain(n, false), false);
        let (often, seldom) = (class(64), class(4));
        let mut c = Classes::default();
        for i in 0..3000 {
            // Read 30% and 10% of the time; 70% of evicted blocks return.
            c.evicted(often, i % 10 < 3, 1024);
            c.evicted(seldom, i % 10 < 1, 1024);
            for _ in 0..2 {
                c.left(1024);
            }
            c.returns += u32::from(i % 10 < 7) * 2;
        }
        let guard = |class_guard| PrefixTuning {
            class_threshold: 1.0,
            class_guard,
            ..PrefixTuning::default()
        };
        assert!(c.cold(often, &guard(0.0)) && c.cold(seldom, &guard(0.0)));
        assert!(!c.cold(often, &guard(1.0)), "read more than the average");
        assert!(c.cold(seldom, &guard(1.0)));
        // Nothing measured is read: the guard does not keep a class warm.
        let mut none = Classes::default();
        for _ in 0..3000 {
            none.evicted(often, false, 1024);
            none.left(1024);
            none.returns += 1;
        }
        assert!(none.cold(often, &guard(1.0)));
    }
}
