//! Reading and writing keys: lookups (counted or not), inserts of every
//! kind, deletes, expiry, and the walks over the keyspace (SCAN, KEYS,
//! per-slot listings, RANDOMKEY).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use hashbrown::hash_map::Entry as MapEntry;
use hashbrown::HashMap;

use super::Store;
use crate::entry::{charge, EXPIRE_OVERHEAD, SLAB_MIN};
use crate::entry::{Encoding, Entry, Queue, Value};
use crate::errors::{OutOfMemory, Refusal};
use crate::holds::{HoldLimits, Holds};
use crate::links::LinkEvent;
use crate::meta::{live, Meta};
use crate::policy::prefix::Recency;
use crate::policy::protect::Protect;
use crate::policy::{self as eviction, EvictionPolicy, WriteClass};
use crate::slot::key_slot;
use crate::spill::fetch::InPrefix;
use crate::stats::StoreStats;
use crate::tenants::Tenants;

/// A value to store: its bytes, or (the policy simulator) only its size.
#[derive(Clone, Copy)]
pub(crate) enum Contents<'a> {
    /// Copied in.
    Bytes(&'a [u8]),
    /// Copied in, or, when it is large enough for a span of its own and at
    /// least [`ADOPT_MIN`] long, kept as it is (see
    /// [`crate::slab::SlabArena::adopt`]).
    Owned(&'a Bytes),
    /// `len` bytes reserved, none written.
    Unwritten(usize),
}

impl Contents<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Contents::Bytes(b) => b.len(),
            Contents::Owned(b) => b.len(),
            Contents::Unwritten(len) => *len,
        }
    }
}

/// The attributes of a write besides the key and the value.
struct Write {
    expire_at: u64,
    encoding: Encoding,
    parent: Option<Bytes>,
    now: u64,
    /// Not expected to be read again: queued to be evicted first.
    cold: bool,
    /// The chain write it is part of.
    class: WriteClass,
}

/// How MSETBLOCK stores one block.
#[derive(Clone, Debug, Default)]
pub struct BlockWrite {
    /// Unix ms of its expiry (0: none).
    pub expire_at: u64,
    /// The block it continues (CHAIN).
    pub parent: Option<Bytes>,
    /// Overwrite a block already there.
    pub replace: bool,
    /// Not expected to be read again (see [`partial_tail`]): under the
    /// `prefix` policy it is queued to go first.
    pub cold: bool,
    /// The chain write it is part of (its run of blocks on this store
    /// starts with [`Store::begin_chain`]).
    pub class: WriteClass,
}

/// Whether the block at `index` of a chain of `count` blocks looks like a
/// request's final, partial block: the last of the chain and shorter than
/// the one before it. Nearly every request ends in one (its prompt is not a
/// whole number of blocks), and the next turn's longer prompt fills that
/// block differently, so few are ever read again.
pub fn partial_tail(index: usize, count: usize, len: usize, previous_len: Option<usize>) -> bool {
    index + 1 == count && previous_len.is_some_and(|p| len < p)
}

/// Where a block stands in a prefix read.
pub struct PrefixStep<'a> {
    /// The block read just before it (its parent, in a chain).
    pub previous: Option<&'a [u8]>,
    /// Bytes the read may still return (MAXBYTES).
    pub room: u64,
    /// Whether the read counts as a use (false under CLIENT NO-TOUCH).
    pub touch: bool,
}

impl Store {
    /// The live entry for `key` (an expired one is removed on the way), with
    /// the counters and the eviction order beside it (the counters alone
    /// when the key is absent): one lookup, every read's path.
    #[inline]
    fn live_entry(
        &mut self,
        slot: u16,
        key: &[u8],
        now: u64,
    ) -> Result<Found<'_>, (&mut StoreStats, &Tenants)> {
        let index = self.index(slot);
        // A block living only on disk is in the compact table: moved into
        // the map for this batch of work.
        self.ensure_mapped(index, key);
        match live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        ) {
            Some((key, entry)) => Ok(Found {
                key,
                entry,
                stats: &mut self.stats,
                recency: &mut self.recency,
                policy: self.policy,
            }),
            None => Err((&mut self.stats, &self.meta.tenants)),
        }
    }

    /// A live entry for reading: counts a hit or miss and, unless `touch` is
    /// false (CLIENT NO-TOUCH, side-effect-free commands), marks it used.
    pub fn read(&mut self, slot: u16, key: &[u8], now: u64, touch: bool) -> Option<&Entry> {
        // A use queues the block again: reads alone must not grow the queues.
        self.compact_queues_if_stale();
        self.release_hold(key);
        match self.live_entry(slot, key, now) {
            Ok(found) => Some(found.hit(now, touch)),
            Err((stats, tenants)) => {
                stats.keyspace_misses += 1;
                stats.tenants.misses[tenants.of(key)] += 1;
                None
            }
        }
    }

    /// A live entry without counting or touching (writes, EXISTS-like peeks).
    pub fn peek(&mut self, slot: u16, key: &[u8], now: u64) -> Option<&Entry> {
        self.live_entry(slot, key, now).ok().map(|f| &*f.entry)
    }

    /// Holds a live key against eviction for `client` until `until` (Unix
    /// ms): see [`crate::holds`]. False when the key is absent or a limit
    /// leaves no room for it.
    pub fn hold(
        &mut self,
        slot: u16,
        key: &Bytes,
        client: u64,
        until: u64,
        now: u64,
        limits: HoldLimits,
    ) -> bool {
        let Ok(found) = self.live_entry(slot, key, now) else {
            return false;
        };
        let bytes = found.entry.value.len();
        self.sweep_holds(now);
        let held = self.holds.hold(key, bytes, client, until, limits);
        if held {
            self.stats.holds.granted += 1;
        } else {
            self.stats.holds.refused += 1;
        }
        held
    }

    /// The lookup holds (INFO).
    pub fn holds(&self) -> &Holds {
        &self.holds
    }

    /// Ends the holds whose deadline passed (also the shard's cron).
    pub fn sweep_holds(&mut self, now: u64) {
        if !self.holds.is_empty() {
            self.stats.holds.expired += self.holds.sweep(now) as u64;
        }
    }

    /// A read ends the hold of `key`.
    fn release_hold(&mut self, key: &[u8]) {
        if self.holds.release(key) {
            self.stats.holds.released += 1;
        }
    }

    /// Ends every hold: a write found nothing else to evict. Whether there
    /// was one.
    pub(crate) fn break_holds(&mut self) -> bool {
        let broken = self.holds.break_all();
        self.stats.holds.broken += broken as u64;
        broken > 0
    }

    /// Marks a key as used (TOUCH); false if absent.
    pub fn touch(&mut self, slot: u16, key: &[u8], now: u64) -> bool {
        self.compact_queues_if_stale();
        match self.live_entry(slot, key, now) {
            Ok(found) => {
                found.used(now);
                true
            }
            Err(_) => false,
        }
    }

    /// A block of a prefix read (MGETPREFIX), with one lookup: when it is
    /// present and no longer than `step.room` bytes, it is counted as a
    /// hit, marked used unless `step.touch` is false, and, when it was read
    /// right after `step.previous` and that is its parent, reachable
    /// whatever the link events said. Nothing is counted for a block that is absent
    /// (`Err(InPrefix::Absent)`) or too long (`Err(InPrefix::TooLong)`).
    pub(crate) fn prefix_hit(
        &mut self,
        slot: u16,
        key: &[u8],
        now: u64,
        step: &PrefixStep,
    ) -> Result<&mut Entry, InPrefix> {
        self.compact_queues_if_stale();
        self.release_hold(key);
        let found = self
            .live_entry(slot, key, now)
            .map_err(|_| InPrefix::Absent)?;
        if found.entry.value.len() as u64 > step.room {
            return Err(InPrefix::TooLong);
        }
        let reachable = step.previous.is_some() && found.entry.parent.as_deref() == step.previous;
        let entry = found.hit(now, step.touch);
        if reachable {
            entry.orphan = false;
        }
        Ok(entry)
    }

    /// Counts a block of a prefix already returned, as [`Store::prefix_hit`]
    /// does (the reads of a prefix spread over shards are counted once the
    /// prefix is known).
    pub fn count_prefix_hit(&mut self, slot: u16, key: &[u8], now: u64, step: &PrefixStep) {
        let _ = self.prefix_hit(slot, key, now, step);
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
        self.insert_entry(slot, key, value, expire_at, Encoding::Auto, None, now)
    }

    /// Stores a value with every attribute given (an OBJECT ENCODING, a
    /// parent block): the general write. Small
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
        let write = Write {
            expire_at,
            encoding,
            parent,
            now,
            cold: false,
            class: WriteClass::default(),
        };
        self.insert_contents(slot, key, Contents::Owned(&value), write)
    }

    /// The general write, for a value given by its bytes or by its size.
    fn insert_contents(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Contents,
        write: Write,
    ) -> Result<Option<Entry>, OutOfMemory> {
        let Write {
            expire_at,
            encoding,
            parent,
            now,
            cold,
            class,
        } = write;
        let index = self.index(slot);
        self.ensure_mapped(index, key);
        let parent = parent.map(|p| Bytes::copy_from_slice(&p));
        let heap_len = if value.len() < SLAB_MIN {
            value.len()
        } else {
            0
        };
        // Not evicted for this write: the key, and under `prefix` its parent.
        let parent_kept = parent
            .as_deref()
            .filter(|_| self.policy == EvictionPolicy::Prefix);
        let tenant = self.meta.tenants.of(key) as u8;
        let protect = Protect::write(key, parent_kept, tenant);
        // What the index will be charged beyond what the key costs now.
        let mut index_growth = 0;
        if self.budget != 0 {
            let new_charge = charge(key.len(), heap_len, expire_at != 0)
                + parent.as_ref().map_or(0, |p| p.len());
            let old_charge = self.maps[index].get(key).map_or(0, |e| e.charge(key.len()));
            index_growth = new_charge.saturating_sub(old_charge);
            if self.meta.tenants.capped(tenant) {
                let value_growth = match heap_len {
                    0 => self.arena.footprint_for(value.len()),
                    _ => 0,
                };
                // An overwrite gives its old value's slot back.
                let old_value = self.maps[index].get(key).map_or(0, |e| match &e.value {
                    Value::Heap(_) => 0,
                    v => v.footprint(),
                });
                let growth = index_growth + value_growth.saturating_sub(old_value);
                self.within_cap(tenant, growth, protect)
                    .map_err(|_| self.refused(tenant, index_growth + value.len()))?;
            }
            if index_growth > 0 {
                self.ensure_room(index_growth, protect)
                    .map_err(|_| self.refused(tenant, index_growth + value.len()))?;
            }
        }
        let stored = match value {
            // Always copied: a slice would pin the request's read buffer.
            Contents::Bytes(b) if b.len() < SLAB_MIN => Value::Heap(Bytes::copy_from_slice(b)),
            Contents::Owned(b) if b.len() < SLAB_MIN => Value::Heap(Bytes::copy_from_slice(b)),
            Contents::Unwritten(len) if len < SLAB_MIN => Value::Heap(Bytes::from(vec![0; len])),
            _ => {
                let len = value.len();
                match self.place_in_slab(value, protect, index_growth) {
                    Ok(slot) => Value::Slab(slot),
                    Err(_) => return Err(self.refused(tenant, index_growth + len)),
                }
            }
        };
        let mut entry = Entry::new(stored, expire_at, now);
        entry.tenant = tenant;
        entry.encoding = encoding;
        entry.parent = parent;
        entry.tick = self.recency.tick();
        let cold =
            cold && self.policy == EvictionPolicy::Prefix && self.recency.tuning.cold_partial;
        // The write is a use, a cold block's not (0 marks a cold block
        // never read); a block evicted lately comes back with its uses; a
        // block of a chain write of a class seldom read is stored cold.
        let new = self.new_block(key, cold, class);
        let cold = new.cold;
        entry.uses = new.uses;
        entry.class = new.class;
        // Its place in the queues, set before the index counts it (a cold
        // block that was remembered with uses goes to the front of level 1:
        // last of level 0's turn, first of level 1's;
        // docs/research/eviction-study.md).
        let level = self.queues_on().then(|| self.recency.place(&mut entry));
        let tick = entry.tick;
        let (stored_key, old) = match self.maps[index].entry(Bytes::copy_from_slice(key)) {
            MapEntry::Occupied(mut o) => {
                let old = std::mem::replace(o.get_mut(), entry);
                // Children name the key, not the value: they stay.
                o.get_mut().children = old.children;
                // A restart must not bring the old value back from disk.
                o.get_mut().on_disk = old.on_disk;
                self.meta.replaced(o.key(), &old, o.get());
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
        if let Some(level) = level {
            self.recency
                .push(tenant, level, false, cold, stored_key, tick);
            self.compact_queues_if_stale();
        }
        self.settle_links();
        self.waiters.wake(key);
        Ok(old)
    }

    /// MSETBLOCK's write of one block: `1` stored, `0` already present and
    /// left unchanged (unless `write.replace`), `-1` not stored (no memory,
    /// or larger than this shard's whole budget).
    pub fn insert_block(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        write: BlockWrite,
        now: u64,
    ) -> i64 {
        self.insert_block_contents(slot, key, Contents::Owned(&value), write, now)
    }

    fn insert_block_contents(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Contents,
        write: BlockWrite,
        now: u64,
    ) -> i64 {
        if !write.replace && self.peek(slot, key, now).is_some() {
            self.relink(slot, key, write.parent.as_deref());
            return 0;
        }
        let charge = charge(key.len(), value.len(), write.expire_at != 0);
        if self.budget != 0 && charge > self.budget {
            self.refused(self.meta.tenants.of(key) as u8, charge);
            return -1;
        }
        let write = Write {
            expire_at: write.expire_at,
            encoding: Encoding::Auto,
            parent: write.parent,
            now,
            cold: write.cold,
            class: write.class,
        };
        match self.insert_contents(slot, key, value, write) {
            Ok(_) => 1,
            Err(OutOfMemory) => -1,
        }
    }

    /// Counts a write of tenant slot `tenant` refused for lack of memory
    /// (needing `needed` bytes) by its cause and its tenant, and gives the
    /// error back.
    fn refused(&mut self, tenant: u8, needed: usize) -> OutOfMemory {
        self.stats.tenants.refused[tenant as usize] += 1;
        let cause = if self.budget != 0 && needed > self.budget {
            Refusal::TooLarge
        } else if self.policy == EvictionPolicy::NoEviction {
            Refusal::NoEviction
        } else {
            Refusal::NoRoom
        };
        self.stats.refused_by[cause as usize] += 1;
        OutOfMemory
    }

    /// A block written again under the parent it has, while it is marked
    /// an orphan (its parent was evicted, and has just been written back
    /// before it): reachable again, and counted by the parent (which
    /// answers with an orphan mark if it is unreachable itself).
    fn relink(&mut self, slot: u16, key: &[u8], parent: Option<&[u8]>) {
        let index = self.index(slot);
        let Some((key, e)) = self.maps[index].get_key_value_mut(key) else {
            return;
        };
        if !e.orphan || parent.is_none() || e.parent.as_deref() != parent {
            return;
        }
        e.orphan = false;
        if let Some(parent) = e.parent.clone() {
            let child = key.clone();
            self.meta
                .outbox
                .push(LinkEvent::ChildAdded { parent, child });
            self.settle_links();
        }
    }

    /// [`Store::insert_block`] of a block given by its size only, for the
    /// policy simulator: the same index, memory accounting and eviction,
    /// with a slab slot reserved and nothing written in it (so a simulated
    /// shard of gigabytes costs address space, not memory). Reads of it
    /// return its slot's unwritten bytes.
    pub fn insert_block_of_len(
        &mut self,
        slot: u16,
        key: &[u8],
        len: usize,
        write: BlockWrite,
        now: u64,
    ) -> i64 {
        self.insert_block_contents(slot, key, Contents::Unwritten(len), write, now)
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
    pub(crate) fn drop_entry(&mut self, slot: u16, key: &[u8]) -> Option<Entry> {
        let index = self.index(slot);
        let (key, entry) = match self.maps[index].remove_entry(key) {
            Some(found) => found,
            None if self.fault_in(index, key) => self.maps[index].remove_entry(key)?,
            None => return None,
        };
        self.meta.removed(&key, &entry, false);
        // A hold is on a stored value: it ends with it.
        self.holds.release(&key);
        Some(entry)
    }

    /// Sets (or with 0 clears) the expiry of a live key; false if absent.
    pub fn set_expire(&mut self, slot: u16, key: &[u8], expire_at: u64, now: u64) -> bool {
        if self.live_entry(slot, key, now).is_err() {
            return false;
        }
        let index = self.index(slot);
        let gains_ttl =
            expire_at != 0 && self.maps[index].get(key).is_some_and(|e| e.expire_at == 0);
        if gains_ttl && self.budget != 0 {
            // The expiry-set node is charged: make room for it like any
            // write. EXPIRE never fails for memory (as in Redis), so when
            // nothing can be evicted the budget is overdrawn by the node.
            let tenant = self.meta.tenants.of(key) as u8;
            let _ = self.ensure_room(EXPIRE_OVERHEAD, Protect::key(key).by(tenant));
        }
        let Some((stored, entry)) = self.maps[index].get_key_value_mut(key) else {
            return false;
        };
        let old = entry.expire_at;
        if old != expire_at {
            let before = entry.cost(stored.len());
            entry.expire_at = expire_at;
            let after = entry.cost(stored.len());
            let (on_disk, tenant) = (entry.on_disk, entry.tenant);
            let stored = stored.clone();
            self.meta.modified(&stored);
            self.meta.unindex_expiry(&stored, old);
            self.meta.index_expiry(&stored, expire_at);
            self.meta.recharge(tenant, before, after);
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
        self.holds.break_all();
        // Records in the spill tier die with their keys: drop their live
        // counts so the segments go, and start a fresh segment.
        if let Some(dir) = self.meta.disk.clone() {
            for map in &self.maps {
                for e in map.values() {
                    if let Some(loc) = e.value.disk() {
                        dir.drop_live(&loc.segment, 1);
                    }
                }
            }
            let mut per_segment: HashMap<u64, i64> = HashMap::new();
            for d in self.disk.all() {
                *per_segment.entry(d.segment()).or_default() += 1;
            }
            for (seq, n) in per_segment {
                if let Some(segment) = dir.segment(seq) {
                    dir.drop_live(&segment, n);
                }
            }
        }
        self.disk.clear();
        self.faulted.clear();
        for map in &mut self.maps {
            *map = HashMap::new();
        }
        // FLUSHALL/FLUSHDB change every watched key (as in Redis).
        let watched = std::mem::take(&mut self.meta.watched);
        for (_, dirty) in watched.values().flatten() {
            dirty.store(true, Ordering::Release);
        }
        let disk = self.meta.disk.take();
        // Records still loading belong to the keys just flushed.
        let loading = self.meta.loading.take().map(|_| crate::meta::Loading {
            flushed: true,
            ..Default::default()
        });
        let tenants = self.meta.tenants.emptied();
        self.meta = Meta {
            watched,
            disk,
            loading,
            tenants,
            ..Meta::default()
        };
        // Empty queues (the index is empty).
        self.reset_queues();
        self.arena.reclaim();
        self.spill_cleared();
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

    /// A random live key (RANDOMKEY); expired keys met on the way are removed.
    pub fn random_key(&mut self, now: u64) -> Option<Bytes> {
        for _ in 0..100 {
            let (index, key) = self.random_key_anywhere()?;
            let expired = match self.maps[index].get(&key) {
                Some(e) => e.expired(now),
                None => self
                    .disk
                    .get(index, &key)
                    .is_none_or(|d| self.disk.expired(d, now)),
            };
            if !expired {
                return Some(key);
            }
            let slot = (self.slots.start + index) as u16;
            self.remove(slot, &key);
            self.stats.expired_keys += 1;
        }
        None
    }

    /// A random key of the maps or, as often as their share of the keys,
    /// of the compact index.
    fn random_key_anywhere(&mut self) -> Option<(usize, Bytes)> {
        let compact = self.disk.len() as u64;
        if compact == 0 || self.next_random() % self.meta.keys.max(1) as u64 >= compact {
            return self.random_entry();
        }
        let n = self.maps.len();
        let start = (self.next_random() % n as u64) as usize;
        let index = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.disk.slot_is_empty(i))?;
        let nth = (self.next_random() % self.disk.slot_len(index) as u64) as usize;
        let d = self.disk.nth(index, nth)?;
        Some((index, Bytes::copy_from_slice(d.key())))
    }

    /// SCAN step: the kept keys of the slots from `from` on (within this
    /// store), whole slots at a time, until at least `count` keys were
    /// visited (kept or not: a selective pattern does not make one step
    /// walk the whole store). Returns the keys, the next slot to visit
    /// (`None`: store finished) and the keys visited.
    pub fn scan(
        &mut self,
        from: usize,
        count: usize,
        mut keep: impl FnMut(&[u8]) -> bool,
        now: u64,
    ) -> (Vec<Bytes>, Option<usize>, usize) {
        let mut out = Vec::new();
        let mut visited = 0;
        let mut slot = from.max(self.slots.start);
        while slot < self.slots.end {
            let index = slot - self.slots.start;
            let map = &self.maps[index];
            visited += map.len() + self.disk.slot_len(index);
            out.extend(
                map.iter()
                    .filter(|(k, e)| !e.expired(now) && keep(k))
                    .map(|(k, _)| k.clone()),
            );
            out.extend(
                self.disk
                    .live(index, now)
                    .filter(|d| keep(d.key()))
                    .map(|d| Bytes::copy_from_slice(d.key())),
            );
            slot += 1;
            if visited >= count {
                break;
            }
        }
        let next = (slot < self.slots.end).then_some(slot);
        (out, next, visited)
    }

    /// Number of live keys in `slot`.
    pub fn count_in_slot(&self, slot: usize, now: u64) -> usize {
        if !self.slots.contains(&slot) {
            return 0;
        }
        let index = slot - self.slots.start;
        let in_dram = self.maps[index].values().filter(|e| !e.expired(now));
        let on_disk = self.disk.live(index, now);
        in_dram.count() + on_disk.count()
    }

    /// Up to `count` live keys of `slot` (CLUSTER GETKEYSINSLOT).
    pub fn keys_in_slot(&self, slot: usize, count: usize, now: u64) -> Vec<Bytes> {
        if !self.slots.contains(&slot) {
            return Vec::new();
        }
        let index = slot - self.slots.start;
        let in_dram = self.maps[index]
            .iter()
            .filter(|(_, e)| !e.expired(now))
            .map(|(k, _)| k.clone());
        let on_disk = self
            .disk
            .live(index, now)
            .map(|d| Bytes::copy_from_slice(d.key()));
        in_dram.chain(on_disk).take(count).collect()
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
        // Blocks on disk only, as the full entries they fault in as.
        let Some(dir) = &self.meta.disk else {
            return;
        };
        for d in self.disk.all_live(now) {
            if let Some(segment) = dir.segment(d.segment()) {
                let entry = d.to_entry(segment, self.disk.expire_at(d), now);
                f(&Bytes::copy_from_slice(d.key()), &entry);
            }
        }
    }
}

/// A live entry found by [`Store::live_entry`], with what a use of it
/// updates.
struct Found<'a> {
    key: &'a Bytes,
    entry: &'a mut Entry,
    stats: &'a mut StoreStats,
    recency: &'a mut Recency,
    policy: EvictionPolicy,
}

impl<'a> Found<'a> {
    /// A read that found its key: a keyspace hit, and (unless `touch` is
    /// false) a use for eviction and a read toward promotion from the spill
    /// tier.
    fn hit(self, now: u64, touch: bool) -> &'a mut Entry {
        self.stats.keyspace_hits += 1;
        self.stats.tenants.hits[self.entry.tenant as usize] += 1;
        if touch {
            self.entry.reads = self.entry.reads.saturating_add(1);
            return self.used(now);
        }
        self.entry
    }

    /// A use: recency and frequency, and a queued block moves to the back
    /// of its (new) level.
    fn used(self, now: u64) -> &'a mut Entry {
        let tick = self.recency.tick();
        eviction::touch(self.entry, self.policy, now, tick);
        if self.entry.queue != Queue::OUT {
            self.recency.requeue(self.key, self.entry, false);
        }
        self.entry
    }
}
