//! The index of blocks that live only on disk: 32 bytes and the key per
//! block, so a node holds the index of 64M blocks (a terabyte of 16 KiB
//! pages) in about 7 GB of DRAM instead of the 18 GB a full [`Entry`]
//! costs.
//!
//! A block the spill tier holds and DRAM does not is kept here, in one
//! table per hash slot beside the slot's map, and nowhere else: its
//! record's place (segment, 4 KiB page, value length, the parent's length
//! that fixes where the value starts) and the few counts the policies keep
//! across a stay on disk (reads toward promotion and reclaim's second
//! chance, the `prefix` policy's level, the orphan mark). A block with a
//! TTL keeps its expiry in a side map (blocks rarely have one). Its
//! parent's key, its recency and LFU counter are not kept: the parent
//! comes back from the record when the block is read back into DRAM, the
//! others start afresh, as they would for a block written again.
//!
//! Every path that changes an entry works on the slot's map: a lookup that
//! misses the map tries the table and, on a hit, moves the block into the
//! map as a full [`Entry`] ("faults it in"). The store moves it back at the
//! end of the batch of work it came in with ([`crate::Store::flush_spill`]),
//! and a block moves here at the end of the batch its disk write finished
//! in. A key is in at most one of the two.

use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::hash_table::Entry as TableEntry;
use hashbrown::{HashMap, HashTable};

use crate::entry::{Entry, Queue, Value};
use crate::links::LinkEvent;
use crate::slot::key_slot;
use crate::spill::{record, DiskLoc, Segment};
use crate::tenants::Cost;
use crate::{EvictionPolicy, Store};

/// The disk index's unit of placement: records start on 4 KiB pages.
const PAGE: u64 = 4096;
/// `flags`: the block is an orphan (no prefix lookup reaches it).
const ORPHAN: u8 = 1;
/// `flags`: the block has a TTL, in the side map.
const TTL: u8 = 2;
/// `flags`: the `prefix` policy's level (log2 of its uses, plus one; 0
/// for a block stored cold and never read) in the high four bits.
const LEVEL_SHIFT: u8 = 4;

/// Bytes charged to the disk index per entry besides its key: the entry
/// (32), its control byte, the table's free slots at its usual load, and
/// the key's allocation rounding.
pub const DISK_ENTRY_OVERHEAD: usize = 48;

/// One block that lives only on disk. 32 bytes: the key's handle 16, the
/// segment 4, the page of the record in it 4, the value's length 4, the
/// parent's length 2, the reads 1, the flags 1.
pub(crate) struct DiskEntry {
    key: Box<[u8]>,
    /// The segment's sequence number.
    segment: u32,
    /// The record's offset in the segment, in 4 KiB pages.
    page: u32,
    value_len: u32,
    /// The CHAIN parent's length: where the value starts in the record.
    parent_len: u16,
    /// Reads since it was stored (promotion, reclaim's second chance).
    reads: u8,
    /// [`ORPHAN`], [`TTL`], the level.
    flags: u8,
}

impl DiskEntry {
    /// The compact form of `key`'s entry, when it lives only on disk and
    /// every field fits; `None` otherwise (it stays a full entry).
    pub(crate) fn compact(key: &[u8], e: &Entry) -> Option<DiskEntry> {
        let Value::Spilled(loc) = &e.value else {
            return None;
        };
        if e.children > 0 || e.parked {
            return None;
        }
        let mut d = DiskEntry::loaded(key.into(), loc).ok()?;
        d.reads = e.reads;
        let level = match e.uses {
            0 => 0,
            u => 1 + u.ilog2() as u8,
        };
        d.flags = level << LEVEL_SHIFT | if e.orphan { ORPHAN } else { 0 };
        Some(d)
    }

    /// A block whose record is at `loc` (one the warm restart found, or
    /// one that just left the map), with the counts of a fresh block:
    /// the key back if a field does not fit.
    pub(crate) fn loaded(key: Box<[u8]>, loc: &DiskLoc) -> Result<DiskEntry, Box<[u8]>> {
        let Some(parent_len) =
            (loc.value_at as usize).checked_sub(record::value_offset(key.len(), 0))
        else {
            return Err(key);
        };
        let fits = loc.offset.is_multiple_of(PAGE)
            && loc.offset / PAGE <= u32::MAX as u64
            && loc.segment.seq <= u32::MAX as u64
            && parent_len <= u16::MAX as usize
            && loc.len as usize
                == record::record_len(key.len(), parent_len, loc.value_len as usize);
        if !fits {
            return Err(key);
        }
        Ok(DiskEntry {
            key,
            segment: loc.segment.seq as u32,
            page: (loc.offset / PAGE) as u32,
            value_len: loc.value_len,
            parent_len: parent_len as u16,
            reads: 0,
            flags: 1 << LEVEL_SHIFT,
        })
    }

    /// The key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// The segment's sequence number.
    pub(crate) fn segment(&self) -> u64 {
        self.segment as u64
    }

    /// Bytes charged to the disk index for it.
    pub(crate) fn charge(&self) -> usize {
        charge(self.key.len(), self.flags & TTL != 0)
    }

    /// What it costs the counters beside the maps: its disk index charge,
    /// and its block's bytes on disk for its tenant.
    pub(crate) fn cost(&self) -> Cost {
        Cost {
            disk_index: self.charge(),
            disk: self.value_len as usize,
            ..Cost::default()
        }
    }

    /// Where its record is, in `segment` (the one [`DiskEntry::segment`]
    /// names).
    pub(crate) fn loc(&self, segment: Arc<Segment>) -> DiskLoc {
        let parent_len = self.parent_len as usize;
        DiskLoc {
            segment,
            offset: self.page as u64 * PAGE,
            len: record::record_len(self.key.len(), parent_len, self.value_len as usize) as u32,
            value_at: record::value_offset(self.key.len(), parent_len) as u32,
            value_len: self.value_len,
        }
    }

    /// The full entry, its record in `segment`, expiring at `expire_at`:
    /// what was kept, with recency and LFU starting at `now` (the parent
    /// comes back when the block is read into DRAM).
    pub(crate) fn to_entry(&self, segment: Arc<Segment>, expire_at: u64, now: u64) -> Entry {
        let mut e = Entry::on_disk(self.loc(segment), expire_at, now);
        e.reads = self.reads;
        e.uses = match self.flags >> LEVEL_SHIFT {
            0 => 0,
            l => 1u16
                .checked_shl(l as u32 - 1)
                .map_or(u8::MAX, |u| u.min(255) as u8),
        };
        e.orphan = self.flags & ORPHAN != 0;
        e
    }
}

/// Bytes charged to the disk index for a compact entry under a key of
/// `key_len` bytes (with a TTL, its side-map entry and expiry-set node too).
pub(crate) fn charge(key_len: usize, volatile: bool) -> usize {
    key_len
        + DISK_ENTRY_OVERHEAD
        + if volatile {
            2 * crate::EXPIRE_OVERHEAD
        } else {
            0
        }
}

/// One table of compact entries per owned hash slot, and the expiries of
/// those that have one.
pub(crate) struct DiskIndex {
    tables: Vec<HashTable<DiskEntry>>,
    expiries: HashMap<Bytes, u64>,
    hasher: foldhash::fast::RandomState,
    len: usize,
}

impl DiskIndex {
    /// Empty tables for `slots` slots.
    pub(crate) fn new(slots: usize) -> DiskIndex {
        DiskIndex {
            tables: (0..slots).map(|_| HashTable::new()).collect(),
            expiries: HashMap::new(),
            hasher: foldhash::fast::RandomState::default(),
            len: 0,
        }
    }

    /// Compact entries in all tables.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Compact entries of slot index `index`.
    pub(crate) fn slot_len(&self, index: usize) -> usize {
        self.tables[index].len()
    }

    /// Whether slot index `index` has none (the common case of a lookup
    /// with the tier off or empty: no hashing).
    pub(crate) fn slot_is_empty(&self, index: usize) -> bool {
        self.tables[index].is_empty()
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// `key`'s entry in slot index `index`.
    pub(crate) fn get(&self, index: usize, key: &[u8]) -> Option<&DiskEntry> {
        if self.tables[index].is_empty() {
            return None;
        }
        self.tables[index].find(self.hash(key), |e| *e.key == *key)
    }

    /// Unix ms of `d`'s expiry (0: none).
    pub(crate) fn expire_at(&self, d: &DiskEntry) -> u64 {
        match d.flags & TTL {
            0 => 0,
            _ => self.expiries.get(&d.key[..]).copied().unwrap_or(0),
        }
    }

    /// Whether `d` is past its expiry at `now`.
    pub(crate) fn expired(&self, d: &DiskEntry, now: u64) -> bool {
        let at = self.expire_at(d);
        at != 0 && at <= now
    }

    /// Takes `key`'s entry out of slot index `index`, with its expiry.
    pub(crate) fn take(&mut self, index: usize, key: &[u8]) -> Option<(DiskEntry, u64)> {
        if self.tables[index].is_empty() {
            return None;
        }
        let hash = self.hash(key);
        let found = self.tables[index]
            .find_entry(hash, |e| *e.key == *key)
            .ok()?;
        let d = found.remove().0;
        self.len -= 1;
        let at = match d.flags & TTL {
            0 => 0,
            _ => self.expiries.remove(key).unwrap_or(0),
        };
        Some((d, at))
    }

    /// Adds `d`, expiring at `expire_at` (0: never), unless its key has an
    /// entry already: the entry added, if it was.
    pub(crate) fn insert(
        &mut self,
        index: usize,
        mut d: DiskEntry,
        expire_at: u64,
    ) -> Option<&DiskEntry> {
        let hash = self.hash(&d.key);
        let hasher = &self.hasher;
        let table = &mut self.tables[index];
        let TableEntry::Vacant(slot) =
            table.entry(hash, |e| e.key == d.key, |e| hasher.hash_one(&*e.key))
        else {
            return None;
        };
        if expire_at != 0 {
            d.flags |= TTL;
            self.expiries
                .insert(Bytes::copy_from_slice(&d.key), expire_at);
        }
        self.len += 1;
        Some(slot.insert(d).into_mut())
    }

    /// The live entries of slot index `index` at `now`.
    pub(crate) fn live(&self, index: usize, now: u64) -> impl Iterator<Item = &DiskEntry> {
        self.tables[index]
            .iter()
            .filter(move |d| !self.expired(d, now))
    }

    /// Every live entry at `now`.
    pub(crate) fn all_live(&self, now: u64) -> impl Iterator<Item = &DiskEntry> {
        let tables = self.tables.iter().flatten();
        tables.filter(move |d| !self.expired(d, now))
    }

    /// Every entry.
    pub(crate) fn all(&self) -> impl Iterator<Item = &DiskEntry> {
        self.tables.iter().flatten()
    }

    /// The `nth` entry of slot index `index` (RANDOMKEY).
    pub(crate) fn nth(&self, index: usize, nth: usize) -> Option<&DiskEntry> {
        self.tables[index].iter().nth(nth)
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        for t in &mut self.tables {
            *t = HashTable::new();
        }
        self.expiries = HashMap::new();
        self.len = 0;
    }
}

impl Store {
    /// Moves `key`'s compact entry (if slot index `index` has one) into
    /// the slot's map as a full entry, and notes it to go back after this
    /// batch of work. Whether it did. A compact entry whose segment is gone
    /// (which reclaim never leaves behind) is dropped.
    pub(crate) fn fault_in(&mut self, index: usize, key: &[u8]) -> bool {
        let Some((d, expire_at)) = self.disk.take(index, key) else {
            return false;
        };
        let before = d.cost();
        let segment = self
            .meta
            .disk
            .as_ref()
            .and_then(|dir| dir.segment(d.segment()));
        let Some(segment) = segment else {
            let key = Bytes::copy_from_slice(key);
            self.meta.removed_compact(&key, expire_at, before);
            return false;
        };
        let mut entry = d.to_entry(segment, expire_at, crate::now_ms());
        entry.tenant = self.meta.tenants.of(&d.key) as u8;
        let key = Bytes::from(d.key);
        self.meta
            .recharge(entry.tenant, before, entry.cost(key.len()));
        self.faulted.push(key.clone());
        self.maps[index].insert(key, entry);
        true
    }

    /// Makes sure `key`, if present, is in the slot's map: what every path
    /// that reads, changes or links an entry does first. Nothing when the
    /// slot has no compact entries; else one more probe of the map (the
    /// lookup that follows cannot tell, as it borrows the map for its
    /// answer) and, on a miss, [`Store::fault_in`].
    #[inline]
    pub(crate) fn ensure_mapped(&mut self, index: usize, key: &[u8]) {
        if !self.disk.slot_is_empty(index) {
            self.fault_in_unless_mapped(index, key);
        }
    }

    // Out of line: lookups of keys in DRAM only test whether to call it.
    #[inline(never)]
    fn fault_in_unless_mapped(&mut self, index: usize, key: &[u8]) {
        if !self.maps[index].contains_key(key) {
            self.fault_in(index, key);
        }
    }

    /// Moves `key`'s entry from the slot's map to the compact table if its
    /// block lives only on disk, nothing links to it, and its fields fit.
    /// Its parent forgets it as a child (it is counted again when the
    /// block comes back into DRAM with its parent read from the record).
    pub(crate) fn settle(&mut self, index: usize, key: &[u8]) {
        let Some(e) = self.maps[index].get(key) else {
            return;
        };
        if self.meta.counted.contains_key(key) {
            return;
        }
        let Some(d) = DiskEntry::compact(key, e) else {
            return;
        };
        let Some((key, entry)) = self.maps[index].remove_entry(key) else {
            return;
        };
        if let Some(parent) = entry.parent.clone() {
            self.meta.forget_child(&parent, &key);
            // Under `prefix` the parent stopped counting it when it left
            // DRAM; the other policies count children wherever they are.
            if self.policy != EvictionPolicy::Prefix {
                self.meta.outbox.push(LinkEvent::ChildRemoved {
                    parent,
                    child: key.clone(),
                });
            }
        }
        if entry.queue != Queue::OUT {
            // Its slots in the queues are stale now: eviction skips them.
            self.meta.queued -= 1;
        }
        // Charged as it will be once in the table (with its TTL flag).
        let after = Cost {
            disk_index: charge(key.len(), entry.expire_at != 0),
            ..d.cost()
        };
        self.meta
            .recharge(entry.tenant, entry.cost(key.len()), after);
        self.disk.insert(index, d, entry.expire_at);
    }

    /// Moves the entries faulted in during the last batch of work back to
    /// the compact tables (those still only on disk).
    pub(crate) fn settle_faulted(&mut self) {
        // Taken (and given back, to keep its buffer) only to borrow the
        // store meanwhile: settling adds nothing to it.
        let mut faulted = std::mem::take(&mut self.faulted);
        for key in faulted.drain(..) {
            let index = self.index(key_slot(&key));
            self.settle(index, &key);
        }
        self.faulted = faulted;
        self.settle_links();
    }

    /// Whether a live key is present, without moving a block that lives
    /// only on disk (PREFIXLEN's walk over a long prefix on disk): one
    /// lookup in the map, one in the compact table on a miss (none when
    /// the slot has no compact entries).
    pub fn contains(&mut self, slot: u16, key: &[u8], now: u64) -> bool {
        let index = self.index(slot);
        match self.maps[index].get(key) {
            Some(e) if !e.expired(now) => return true,
            // Expired: the lookup removes it.
            Some(_) => return self.peek(slot, key, now).is_some(),
            None => {}
        }
        match self.disk.get(index, key) {
            Some(d) if !self.disk.expired(d, now) => true,
            Some(_) => self.peek(slot, key, now).is_some(),
            None => false,
        }
    }

    /// Keys living only on disk, held in the compact tables (INFO).
    pub fn compact_disk_keys(&self) -> usize {
        self.disk.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_only_block_costs_thirty_two_bytes_and_its_key() {
        assert_eq!(std::mem::size_of::<DiskEntry>(), 32);
    }

    #[test]
    fn the_level_of_uses_survives_a_stay_on_disk() {
        let path = std::env::temp_dir().join(format!("kvtier-level-{}", std::process::id()));
        let dir = crate::spill::SpillDir::open(&path, 0).unwrap();
        let seg = dir.new_segment(0).unwrap();
        let loc = DiskLoc {
            segment: Arc::clone(&seg),
            offset: 3 * PAGE,
            len: record::record_len(1, 0, 5000) as u32,
            value_at: record::value_offset(1, 0) as u32,
            value_len: 5000,
        };
        for uses in [0u8, 1, 2, 3, 4, 100, 255] {
            let mut e = Entry::new(Value::Spilled(loc.clone()), 0, 0);
            e.uses = uses;
            e.reads = 9;
            let d = DiskEntry::compact(b"k", &e).unwrap();
            let back = d.to_entry(Arc::clone(&seg), 0, 0);
            let level = |u: u8| u.checked_ilog2();
            assert_eq!(level(back.uses), level(uses), "uses {uses}");
            assert_eq!(back.reads, 9);
            assert_eq!(
                back.value.disk().map(|l| (l.offset, l.len)),
                Some((loc.offset, loc.len))
            );
        }
        let _ = std::fs::remove_dir_all(&path);
    }

    mod in_a_store {
        use std::sync::Mutex;

        use crate::slot::key_slot;
        use crate::spill::{IoPool, SpillDir};
        use crate::{BlockWrite, EvictionPolicy, Fetched, SpillConfig, Store, StoreJob};
        use bytes::Bytes;

        use super::*;

        type Jobs = Arc<Mutex<Vec<StoreJob>>>;

        /// A store with the tier on over a fresh directory; the I/O threads'
        /// reports wait in the returned queue until [`settle_io`].
        fn store(
            name: &str,
            budget: usize,
            policy: EvictionPolicy,
        ) -> (Store, Jobs, Arc<SpillDir>, std::path::PathBuf) {
            let path = std::env::temp_dir()
                .join(format!("kvtier-disk-index-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            let d = Arc::new(SpillDir::open(&path, 0).unwrap());
            let jobs: Jobs = Arc::default();
            let queue = Arc::clone(&jobs);
            let mut s = Store::new(0..crate::slot::SLOTS, budget, policy);
            s.enable_spill(SpillConfig {
                dir: Arc::clone(&d),
                pool: Arc::new(IoPool::start(1)),
                post: Arc::new(move |job| queue.lock().unwrap().push(job)),
                shard: 0,
                admission: 0,
            });
            (s, jobs, d, path)
        }

        /// Runs the I/O threads' reports until nothing is in flight, with
        /// the end of each batch of work the shard would run.
        fn settle_io(s: &mut Store, jobs: &Jobs, d: &SpillDir) {
            loop {
                // The shard's round: link events, then the spill's work.
                s.take_link_events();
                s.flush_spill();
                while d
                    .counters
                    .queue_depth
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let ready = std::mem::take(&mut *jobs.lock().unwrap());
                if ready.is_empty() && !s.has_deferred_work() {
                    return;
                }
                ready.into_iter().for_each(|job| job(s));
            }
        }

        fn block(i: u8) -> Bytes {
            Bytes::from(vec![i; 5000])
        }

        fn in_maps(s: &Store) -> usize {
            s.maps.iter().map(|m| m.len()).sum()
        }

        /// A read of `key` (a disk read when it is on disk only), its bytes.
        fn get(s: &mut Store, jobs: &Jobs, d: &SpillDir, key: &str) -> Option<Bytes> {
            let now = crate::now_ms();
            match s.read_value(key_slot(key.as_bytes()), key.as_bytes(), now, true)? {
                Fetched::Now(b) => Some(b),
                Fetched::Later { read, .. } => {
                    let mut rx = read.into_receiver();
                    settle_io(s, jobs, d);
                    rx.try_recv().ok().flatten()
                }
            }
        }

        #[test]
        fn blocks_on_disk_only_live_in_the_compact_index_and_serve_every_command() {
            let (mut s, jobs, d, path) = store("commands", 64 << 20, EvictionPolicy::AllKeysLru);
            let now = crate::now_ms();
            let keys = ["p", "c", "x", "y"];
            for (i, k) in keys.iter().enumerate() {
                let write = BlockWrite {
                    parent: (*k == "c").then(|| Bytes::from_static(b"p")),
                    ..BlockWrite::default()
                };
                let slot = key_slot(k.as_bytes());
                assert_eq!(
                    s.insert_block(slot, k.as_bytes(), block(i as u8), write, now),
                    1
                );
            }
            s.spill_everything();
            settle_io(&mut s, &jobs, &d);
            assert_eq!((s.compact_disk_keys(), in_maps(&s), s.len()), (4, 0, 4));
            let charged = s.disk_index_memory();
            assert_eq!(charged, keys.len() * (1 + DISK_ENTRY_OVERHEAD));

            // A read goes to the disk and leaves the block compact.
            assert_eq!(get(&mut s, &jobs, &d, "x"), Some(block(2)));
            assert_eq!((s.compact_disk_keys(), in_maps(&s)), (4, 0));
            // Walks see every key.
            let (mut seen, _, _) = s.scan(0, usize::MAX, |_| true, now);
            seen.sort();
            assert_eq!(seen, ["c", "p", "x", "y"]);
            let slot = key_slot(b"y") as usize;
            assert_eq!(s.count_in_slot(slot, now), 1);
            assert_eq!(s.keys_in_slot(slot, 10, now), ["y"]);
            assert!(s.random_key(now).is_some());
            let mut walked = 0;
            s.for_each_live(now, |_, e| walked += e.value.len());
            assert_eq!(walked, 4 * 5000);
            assert!(s.contains(slot as u16, b"y", now));
            assert!(!s.contains(slot as u16, b"absent", now));

            // EXPIRE changes it in the map; it goes back with its expiry.
            let at = now + 3_600_000;
            assert!(s.set_expire(slot as u16, b"y", at, now));
            settle_io(&mut s, &jobs, &d);
            assert_eq!((s.compact_disk_keys(), in_maps(&s)), (4, 0));
            let slot = slot as u16;
            assert_eq!(s.peek(slot, b"y", now).map(|e| e.expire_at), Some(at));
            // Past its expiry it is a miss.
            assert!(s.peek(slot, b"y", at).is_none());
            assert_eq!((s.len(), s.compact_disk_keys()), (3, 3));

            // Read often enough, a block comes back into DRAM with the
            // parent its record names, and the parent counts it again.
            for _ in 0..3 {
                assert_eq!(get(&mut s, &jobs, &d, "c"), Some(block(1)));
            }
            // c is in DRAM; p, counting a child, is a full entry again.
            assert_eq!(s.compact_disk_keys(), 1, "only x");
            let c = s.peek(key_slot(b"c"), b"c", now).unwrap();
            assert!(c.value.in_dram());
            assert_eq!(c.parent.as_deref(), Some(&b"p"[..]));
            s.settle_links();
            assert!(s
                .meta
                .counted
                .get(&b"p"[..])
                .is_some_and(|c| c.contains(&b"c"[..])));
            settle_io(&mut s, &jobs, &d);
            assert_eq!(
                s.compact_disk_keys(),
                1,
                "a parent with children stays a full entry"
            );
            // Once its child is gone, the parent goes back.
            assert!(s.remove(key_slot(b"c"), b"c").is_some());
            settle_io(&mut s, &jobs, &d);
            assert_eq!(s.compact_disk_keys(), 2, "p and x");

            // DEL of a compact key leaves a tombstone.
            assert!(s.remove(key_slot(b"x"), b"x").is_some());
            assert_eq!((s.len(), s.compact_disk_keys()), (1, 1));
            assert_eq!(get(&mut s, &jobs, &d, "x"), None);

            // FLUSHALL lets every record go.
            s.clear();
            settle_io(&mut s, &jobs, &d);
            assert_eq!(
                (s.len(), s.compact_disk_keys(), s.disk_index_memory()),
                (0, 0, 0)
            );
            let _ = std::fs::remove_dir_all(&path);
        }

        /// One operation of [`random_operations_keep_values_and_counts`]:
        /// on key `k` of a few, (0, 6) write a new version (chained to key
        /// `k - 1` when odd), (1) delete, (2) read, (3) set a TTL an hour
        /// away, (4) remove the TTL, (5) let the I/O threads report, (7)
        /// write every block in DRAM to disk.
        type Op = (u8, u8);

        fn check_counts(s: &Store) -> Result<(), proptest::test_runner::TestCaseError> {
            use proptest::prop_assert_eq;
            let maps: usize = s.maps.iter().map(|m| m.len()).sum();
            prop_assert_eq!(s.len(), maps + s.disk.len(), "keys");
            let mut index = s.disk.all().map(DiskEntry::charge).sum::<usize>();
            let mut with_record = s.disk.len();
            for (k, e) in s.maps.iter().flatten() {
                index += e.disk_index_charge(k.len());
                with_record += e.value.disk().is_some() as usize;
                prop_assert_eq!(
                    s.disk.get(s.index(key_slot(k)), k).is_some(),
                    false,
                    "in both"
                );
            }
            prop_assert_eq!(s.disk_index_memory(), index, "disk index bytes");
            let mut tenants = [crate::tenants::TenantUse::default(); crate::tenants::TENANT_SLOTS];
            let costs = s.disk.all().map(|d| (d.key(), d.cost())).chain(
                s.maps
                    .iter()
                    .flatten()
                    .map(|(k, e)| (&k[..], e.cost(k.len()))),
            );
            for (k, cost) in costs {
                let t = &mut tenants[s.meta.tenants.of(k)];
                t.dram += cost.dram;
                t.disk += cost.disk;
                t.keys += 1;
            }
            prop_assert_eq!(s.tenant_usage(), tenants, "what each tenant holds");
            prop_assert_eq!(s.spill_keys(), with_record, "keys with a record");
            let volatile = s
                .maps
                .iter()
                .flatten()
                .filter(|(_, e)| e.expire_at != 0)
                .count()
                + s.disk.all().filter(|d| d.flags & TTL != 0).count();
            prop_assert_eq!(s.volatile_len(), volatile, "keys with a TTL");
            prop_assert_eq!(
                s.disk.expiries.len(),
                s.disk.all().filter(|d| d.flags & TTL != 0).count()
            );
            Ok(())
        }

        fn random_operations(
            ops: &[Op],
            policy: EvictionPolicy,
        ) -> Result<(), proptest::test_runner::TestCaseError> {
            use proptest::prop_assert_eq;
            // A small DRAM tier: most blocks live on disk only.
            let name = format!("prop-{}-{}", policy.name(), ops.len());
            let (mut s, jobs, d, path) = store(&name, 128 << 10, policy);
            // Two named tenants and the default: blocks moving between
            // DRAM, the disk and the compact table stay counted for theirs.
            s.set_tenants(&[
                vec![crate::tenants::KeyPattern::parse("k1*").unwrap()],
                vec![crate::tenants::KeyPattern::parse("k2*").unwrap()],
            ]);
            let mut model: std::collections::HashMap<String, (Bytes, u64)> = Default::default();
            let mut version = 0u8;
            for &(op, k) in ops {
                let now = crate::now_ms();
                let key = format!("k{k}");
                let slot = key_slot(key.as_bytes());
                match op {
                    0 | 6 => {
                        version = version.wrapping_add(1);
                        let value = Bytes::from(vec![version; 5000 + (k as usize % 3) * 4096]);
                        let parent = (k % 2 == 1).then(|| Bytes::from(format!("k{}", k - 1)));
                        let write = BlockWrite {
                            parent,
                            replace: true,
                            ..BlockWrite::default()
                        };
                        if s.insert_block(slot, key.as_bytes(), value.clone(), write, now) == 1 {
                            model.insert(key, (value, 0));
                        }
                    }
                    1 => {
                        s.remove(slot, key.as_bytes());
                        model.remove(&key);
                    }
                    2 => {
                        let got = get(&mut s, &jobs, &d, &key);
                        match (got, model.get(&key)) {
                            (Some(v), Some((m, _))) => prop_assert_eq!(&v, m, "{} read", key),
                            (Some(_), None) => prop_assert_eq!(true, false, "{} came back", key),
                            // Evicted (the tier dropped it): the model lets it go.
                            (None, _) => {
                                model.remove(&key);
                            }
                        }
                    }
                    3 | 4 => {
                        let at = if op == 3 { now + 3_600_000 } else { 0 };
                        if s.set_expire(slot, key.as_bytes(), at, now) {
                            if let Some(m) = model.get_mut(&key) {
                                m.1 = at;
                            }
                        }
                    }
                    5 => settle_io(&mut s, &jobs, &d),
                    _ => {
                        s.spill_everything();
                        settle_io(&mut s, &jobs, &d);
                    }
                }
                check_counts(&s)?;
            }
            settle_io(&mut s, &jobs, &d);
            check_counts(&s)?;
            // Every key the store has is the model's, with its bytes and TTL.
            let now = crate::now_ms();
            for (key, (value, at)) in &model {
                let slot = key_slot(key.as_bytes());
                let Some(e) = s.peek(slot, key.as_bytes(), now) else {
                    continue;
                };
                prop_assert_eq!(e.expire_at, *at, "{} TTL", key);
                if let Some(got) = get(&mut s, &jobs, &d, key) {
                    prop_assert_eq!(&got, value, "{} at the end", key);
                }
            }
            let mut keys = s.scan(0, usize::MAX, |_| true, now).0;
            keys.retain(|k| !model.contains_key(std::str::from_utf8(k).unwrap_or("")));
            prop_assert_eq!(keys.len(), 0, "keys the model does not have");
            s.clear();
            settle_io(&mut s, &jobs, &d);
            check_counts(&s)?;
            let _ = std::fs::remove_dir_all(&path);
            Ok(())
        }

        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig {
                cases: std::env::var("PROPTEST_CASES")
                    .ok()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(16),
                failure_persistence: None,
                ..proptest::prelude::ProptestConfig::default()
            })]

            #[test]
            fn random_operations_keep_values_and_counts(
                ops in proptest::collection::vec((0u8..8, 0u8..24), 1..120),
                prefix in proptest::prelude::any::<bool>(),
            ) {
                let policy = if prefix { EvictionPolicy::Prefix } else { EvictionPolicy::AllKeysLru };
                random_operations(&ops, policy)?;
            }
        }
    }
}
