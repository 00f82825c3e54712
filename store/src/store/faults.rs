//! Blocks faulted in from the disk index (`disk_index`): a lookup
//! that misses a slot's map moves a disk-only block into it as a full entry
//! for the batch of work, and `Store::settle_faulted` moves it back.

use super::Store;
use crate::disk_index::charge;
use crate::disk_index::DiskEntry;
use crate::entry::Queue;
use crate::links::LinkEvent;
use crate::policy::EvictionPolicy;
use crate::slot::key_slot;
use crate::tenants::Cost;
use bytes::Bytes;

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
        let mut entry = d.to_entry(segment, expire_at, crate::clock::now_ms());
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
