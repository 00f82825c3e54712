//! Choosing and removing victims: the sampled policies and the `prefix`
//! policy's queues ([`crate::policy`] holds their types).

use bytes::Bytes;

use super::Store;
use crate::clock::now_ms;
use crate::entry::{Entry, Queue};
use crate::policy::prefix::{current, Classes, Lane, Recency, LEVELS};
use crate::policy::protect::Protect;
use crate::policy::{score, EvictionPolicy, WriteClass};
use crate::slot::key_slot;
use crate::stats::EvictReason;

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
