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
//! end of the batch of work it came in with (`Store::flush_spill`),
//! and a block moves here at the end of the batch its disk write finished
//! in. A key is in at most one of the two.

use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::hash_table::Entry as TableEntry;
use hashbrown::{HashMap, HashTable};

use crate::entry::{Entry, Value};
use crate::spill::{record, DiskLoc, Segment};
use crate::tenants::Cost;

/// The disk index's unit of placement: records start on 4 KiB pages.
const PAGE: u64 = 4096;
/// `flags`: the block is an orphan (no prefix lookup reaches it).
const ORPHAN: u8 = 1;
/// `flags`: the block has a TTL, in the side map.
pub(crate) const TTL: u8 = 2;
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
    pub(crate) key: Box<[u8]>,
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
    pub(crate) flags: u8,
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
            2 * crate::entry::EXPIRE_OVERHEAD
        } else {
            0
        }
}

/// One table of compact entries per owned hash slot, and the expiries of
/// those that have one.
pub(crate) struct DiskIndex {
    tables: Vec<HashTable<DiskEntry>>,
    pub(crate) expiries: HashMap<Bytes, u64>,
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
}
