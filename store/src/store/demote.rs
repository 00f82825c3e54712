//! Demoting blocks to the spill tier. A block moves DRAM →
//! `Value::Writing` (its record is in the shard's open write batch; reads
//! are served from there) → `Value::Spilled` once the I/O thread reports
//! the batch written; deletes and overwrites leave tombstones.

use super::Store;
use crate::entry::{InFlight, Value};
use crate::links::LinkEvent;
use crate::policy::EvictionPolicy;
use crate::slot::key_slot;
use crate::spill::record::Record;
use crate::spill::writer::{Batch, SPILL_MIN};
use crate::spill::{aligned, record, same_loc, DiskLoc, SpillDrop, BATCH_SIZE, QUEUE_HARD};
use bytes::Bytes;
use std::sync::Arc;

impl Store {
    /// Swaps an entry's value in place, keeping its key, links and queue
    /// position, and keeping the counts right. Under the `prefix` policy a
    /// block that leaves DRAM (or comes back) is a child fewer (or more) of
    /// its parent: the order of DRAM counts children in DRAM, so a parent
    /// whose children are all on disk is a leaf of DRAM, not parked behind
    /// them.
    pub(super) fn replace_value(&mut self, slot: u16, key: &[u8], value: Value) {
        let index = self.index(slot);
        let Some((stored, entry)) = self.maps[index].get_key_value_mut(key) else {
            return;
        };
        let stored = stored.clone();
        let before = entry.cost(stored.len());
        if let Some(old) = entry.value.slot().and_then(|s| s.page_location()) {
            self.meta.slot_keys.remove(&old);
        }
        if let Some(new) = value.slot().and_then(|s| s.page_location()) {
            self.meta.slot_keys.insert(new, stored.clone());
        }
        let old_disk = entry.value.disk().cloned();
        let new_disk = value.disk().cloned();
        if new_disk.is_some() {
            entry.on_disk = true;
        }
        let moved = entry.value.in_dram() != value.in_dram();
        if let (true, true, Some(parent)) = (
            moved,
            self.policy == EvictionPolicy::Prefix,
            entry.parent.clone(),
        ) {
            let child = stored.clone();
            self.meta.outbox.push(match value.in_dram() {
                true => LinkEvent::ChildAdded { parent, child },
                false => LinkEvent::ChildRemoved { parent, child },
            });
        }
        if matches!(value, Value::Spilled(_)) {
            // On disk only: to the compact index after this batch.
            self.faulted.push(stored.clone());
        }
        entry.value = value;
        let after = entry.cost(stored.len());
        self.meta.recharge(entry.tenant, before, after);
        let same = matches!((&old_disk, &new_disk), (Some(o), Some(n)) if same_loc(o, n));
        if !same {
            if let Some(old) = &old_disk {
                self.meta.untrack_disk(old);
            }
            if new_disk.is_some() {
                self.meta.track_disk();
            }
        }
    }

    /// Eviction's alternative to deleting: write the block to the spill
    /// tier and keep it in the index. `false` when the tier is off, the
    /// block not admitted (too few reads; an orphan or an unread cold block
    /// under `prefix`), the write queue full, or the disk
    /// budget exhausted: the caller deletes it then.
    /// `admit`: skip the admission check (reclaim rewrites, shutdown).
    pub(super) fn spill_out(&mut self, slot: u16, key: &[u8], admit: bool) -> bool {
        let index = self.index(slot);
        let Some(spill) = &self.spill else {
            return false;
        };
        let Some((stored, entry)) = self.maps[index].get_key_value(key) else {
            return false;
        };
        if !entry.value.in_dram() || entry.value.is_held() || entry.value.len() < SPILL_MIN {
            return false;
        }
        if let Value::Cached(c) = &entry.value {
            // Its record is still good: evicting it costs no write.
            let loc = c.loc.clone();
            self.replace_value(slot, key, Value::Spilled(loc));
            if let Some(e) = self.maps[index].get_mut(key) {
                self.recency.classes.left_dram(e, self.meta.queued);
                e.reads = 0;
            }
            return true;
        }
        let dir = Arc::clone(&spill.config.dir);
        // The record stores key lengths in 16 bits.
        let too_long = stored.len() > u16::MAX as usize
            || entry
                .parent
                .as_ref()
                .is_some_and(|p| p.len() > u16::MAX as usize);
        // Under the `prefix` policy the signal that orders DRAM also
        // decides the disk: an orphan (no prefix lookup reaches it) and a
        // cold partial block never read are dropped.
        let unwanted = self.policy == EvictionPolicy::Prefix && (entry.orphan || entry.uses == 0);
        // Its tenant's part of the tier: past its cap it is not written;
        // above its share, not into the room reclaim keeps for rewrites
        // (the tier nearly full), which the tenants under their share get.
        let (over_share, over_cap) = self
            .disk_limits(entry.tenant as usize, &dir)
            .map(|(share, cap)| {
                let held = self.meta.tenants.usage[entry.tenant as usize].disk + entry.value.len();
                (held > share, held > cap)
            })
            .unwrap_or_default();
        let dropped = if (entry.reads < spill.config.admission || unwanted) && !admit {
            Some(SpillDrop::Admission)
        } else if over_cap {
            Some(SpillDrop::TenantCap)
        } else if over_share && !admit && dir.nearly_full() {
            Some(SpillDrop::NoSpace)
        } else if dir.in_flight() >= QUEUE_HARD && !spill.shutting_down {
            Some(SpillDrop::QueueFull)
        } else if too_long {
            Some(SpillDrop::KeyTooLong)
        } else {
            None
        };
        if let Some(cause) = dropped {
            dir.counters.drop_for(cause);
            if matches!(cause, SpillDrop::NoSpace) {
                self.reclaim_disk();
            }
            return false;
        }
        let value = match entry.value.bytes() {
            Some(v) => v,
            None => return false,
        };
        let rec = Record {
            key: stored.clone(),
            parent: entry.parent.clone(),
            value,
            expire_at: entry.expire_at,
            tombstone: false,
        };
        let parent_len = rec.parent.as_ref().map_or(0, |p| p.len());
        let len = record::record_len(rec.key.len(), parent_len, rec.value.len());
        let stored = stored.clone();
        let Some(spill) = &mut self.spill else {
            return false;
        };
        let Some((segment, offset)) = spill.place(len) else {
            dir.counters.drop_for(SpillDrop::NoSpace);
            self.reclaim_disk();
            return false;
        };
        let mut buf = aligned(len);
        buf.clear();
        record::encode(&mut buf, &rec);
        let buf = buf.freeze();
        let value_at = record::value_offset(rec.key.len(), parent_len);
        let loc = DiskLoc {
            segment: Arc::clone(&segment),
            offset,
            len: len as u32,
            value_at: value_at as u32,
            value_len: rec.value.len() as u32,
        };
        dir.add_live(&segment, 1);
        let data = buf.slice(value_at..value_at + rec.value.len());
        spill.append(segment, offset, buf, Some(stored.clone()));
        self.replace_value(slot, key, Value::Writing(Box::new(InFlight { data, loc })));
        if let Some(e) = self.maps[index].get_mut(key) {
            // Its class counts it as it leaves DRAM; from here on, reads
            // count toward promotion and reclaim's second chance.
            self.recency.classes.left_dram(e, self.meta.queued);
            e.reads = 0;
        }
        if dir.nearly_full() {
            self.reclaim_disk();
        }
        true
    }

    /// The I/O thread finished a batch: its blocks are on disk now (or, on
    /// failure, dropped: the tier reports the condition and DRAM keeps
    /// serving everything else).
    pub(super) fn batch_written(&mut self, batch: Batch, result: std::io::Result<()>) {
        if let Some(spill) = &mut self.spill {
            if let Err(e) = &result {
                spill.config.dir.note_error(e);
            }
        }
        for (key, offset) in batch.keys {
            let slot = key_slot(&key);
            let index = self.index(slot);
            let loc = match self.maps[index].get(&key[..]).map(|e| &e.value) {
                Some(Value::Writing(w))
                    if Arc::ptr_eq(&w.loc.segment, &batch.segment) && w.loc.offset == offset =>
                {
                    w.loc.clone()
                }
                _ => continue,
            };
            if result.is_ok() {
                self.replace_value(slot, &key, Value::Spilled(loc));
            } else {
                if let Some(spill) = &self.spill {
                    spill.config.dir.counters.drop_for(SpillDrop::WriteFailed);
                }
                self.drop_entry(slot, &key);
            }
        }
    }

    /// Writes what is waiting: tombstones of deleted or overwritten keys
    /// that had records, and the open batch. Called by the shard after each
    /// batch of work.
    pub fn flush_spill(&mut self) {
        if !self.faulted.is_empty() {
            self.settle_faulted();
        }
        let Some(spill) = &mut self.spill else {
            return;
        };
        if let Some(loading) = &mut self.meta.loading {
            spill.tombstones.append(&mut loading.pending);
        }
        let tombstones = std::mem::take(&mut spill.tombstones);
        // Packed: one record lists up to ~1 MiB of keys.
        let mut start = 0;
        while start < tombstones.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < tombstones.len()
                && (end == start || bytes + tombstones[end].len() + 2 <= BATCH_SIZE)
            {
                bytes += tombstones[end].len() + 2;
                end += 1;
            }
            let rec = Record {
                key: Bytes::new(),
                parent: None,
                value: record::key_list(&tombstones[start..end]),
                expire_at: 0,
                tombstone: true,
            };
            start = end;
            let len = record::record_len(0, 0, rec.value.len());
            let Some((segment, offset)) = spill.place(len) else {
                continue;
            };
            let mut out = aligned(len);
            out.clear();
            record::encode(&mut out, &rec);
            spill.append(segment, offset, out.freeze(), None);
        }
        spill.flush();
    }

    /// Notes that `key` (which had a record) was deleted or overwritten.
    pub(super) fn tombstone(&mut self, key: &[u8]) {
        if let Some(spill) = &mut self.spill {
            spill.tombstones.push(Bytes::copy_from_slice(key));
        }
    }
}
