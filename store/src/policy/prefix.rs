//! The `prefix` policy's memory: blocks queued by level of use per tenant
//! lane, the ghosts of blocks evicted lately, and the classes of chain
//! writes with how often each was read before it left.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use bytes::Bytes;

use crate::entry::{Entry, Queue};

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
    pub(crate) returns: u32,
    /// A whole window was measured (before, the first evictions, of the
    /// blocks stored first, say little).
    warm: bool,
    /// Whether the chain write being stored is stored cold (None: not
    /// decided yet).
    pub(crate) run: Option<bool>,
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
    pub(crate) fn decide(&mut self, class: u8, tuning: &PrefixTuning) -> bool {
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
    pub(crate) fn left(&mut self, window: usize) {
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
    pub(crate) fn lane_index(&self, lane: u8) -> usize {
        if (lane as usize) < self.lanes.len() {
            lane as usize
        } else {
            0
        }
    }

    #[inline]
    pub(crate) fn queue(
        &mut self,
        lane: u8,
        level: u8,
        parked: bool,
    ) -> &mut VecDeque<(Bytes, u32)> {
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
pub(crate) fn current(entry: &Entry, tick: u32, parked: bool) -> bool {
    entry.tick == tick && entry.parked == parked
}

#[cfg(test)]
mod tests {
    use super::*;

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
