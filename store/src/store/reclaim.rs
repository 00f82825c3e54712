//! Reclaiming the spill tier's space: old segments rewritten or dropped,
//! each tenant kept within its disk share and cap.

use super::read::submit_read;
use super::Store;
use crate::entry::{Cached, Value};
use crate::links::LinkEvent;
use crate::slot::key_slot;
use crate::spill::record::Record;
use crate::spill::{footer, same_loc, DiskLoc, SpillDir, SpillDrop};
use crate::stats::EvictReason;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Store {
    /// Frees disk space: asks every shard to drop (or, for blocks read
    /// since they were spilled, rewrite) its records in the oldest segment,
    /// so that segment is deleted. Orphaned blocks are always dropped.
    pub(super) fn reclaim_disk(&mut self) {
        let Some(spill) = &self.spill else {
            return;
        };
        let dir = Arc::clone(&spill.config.dir);
        if let Some(seq) = dir.claim_oldest() {
            dir.counters.reclaims.fetch_add(1, Relaxed);
            self.meta.outbox.push(LinkEvent::ReclaimSegment { seq });
        }
    }

    /// Tenant slot `tenant`'s disk share and disk cap in bytes of this
    /// shard's part of the spill tier (`spill-max-bytes` by the shard's
    /// share of the slots, as keys spread over slots evenly; no cap:
    /// `usize::MAX`); None without per-tenant limits or a disk budget.
    pub(super) fn disk_limits(&self, tenant: usize, dir: &SpillDir) -> Option<(usize, usize)> {
        let t = &self.meta.tenants;
        let max = dir.max_bytes() as u128;
        if !t.fair() || max == 0 {
            return None;
        }
        let budget = (max * self.slots.len() as u128 / crate::slot::SLOTS as u128) as usize;
        let l = t.limits[tenant];
        let cap = match l.disk_cap {
            crate::tenants::WHOLE => usize::MAX,
            cap => crate::tenants::part_of(budget, cap),
        };
        Some((crate::tenants::part_of(budget, l.disk_share), cap))
    }

    /// Tenants whose blocks reclaim keeps though they were not read since
    /// they were written: those under their share of the spill tier, while
    /// another tenant is above its own (the tier is full because of it).
    /// None without per-tenant limits or a disk budget.
    fn kept_by_share(&self, dir: &SpillDir) -> Option<crate::tenants::Order> {
        let mut under = [false; crate::tenants::TENANT_SLOTS];
        let slots = self.meta.tenants.slots();
        for (slot, under) in under.iter_mut().enumerate().take(slots) {
            let (share, _) = self.disk_limits(slot, dir)?;
            *under = self.meta.tenants.usage[slot].disk <= share;
        }
        let under = &under[..slots];
        (!under.iter().all(|&u| u))
            .then(|| crate::tenants::Order::of((0..slots).filter(|&s| under[s])))
    }

    /// This shard's part of reclaiming segment `seq`: seal it if it is the
    /// shard's active segment, then drop or rewrite every record of it the
    /// shard's keys point to. The segment's keys come from its footer: from
    /// memory for the segment the shard was writing, else read (or, with
    /// no valid footer, scanned) on an I/O thread.
    pub(super) fn reclaim_segment(&mut self, seq: u64) {
        let Some(spill) = &mut self.spill else {
            return;
        };
        if spill.active.as_ref().is_some_and(|a| a.seq == seq) {
            let body = spill.seal_active();
            let keys = footer::parse(&body)
                .unwrap_or_default()
                .into_iter()
                .filter(|e| !e.tombstone)
                .map(|e| body.slice_ref(e.key))
                .collect();
            self.reclaim_keys(seq, keys);
            return;
        }
        let dir = Arc::clone(&spill.config.dir);
        let Some(segment) = dir.segment(seq) else {
            return;
        };
        let post = Arc::clone(&spill.config.post);
        dir.counters.queue_depth.fetch_add(1, Relaxed);
        spill.config.pool.submit(Box::new(move || {
            let keys = match crate::spill::load::segment_keys(&segment) {
                Ok(keys) => keys,
                Err(e) => {
                    dir.note_error(&e);
                    Vec::new()
                }
            };
            dir.counters.queue_depth.fetch_sub(1, Relaxed);
            post(Box::new(move |store| store.reclaim_keys(seq, keys)));
        }));
    }

    /// Reclaim of segment `seq` on this shard, given the keys its footer
    /// lists: each key of this store whose entry points there is dropped,
    /// or rewritten at the log's head if it was read since it was written.
    fn reclaim_keys(&mut self, seq: u64, keys: Vec<Bytes>) {
        let Some(dir) = self.spill_dir().cloned() else {
            return;
        };
        let kept_by_share = self.kept_by_share(&dir);
        for key in keys {
            let slot = key_slot(&key);
            if !self.slots.contains(&(slot as usize)) {
                continue;
            }
            let index = self.index(slot);
            let on_disk_only = self.disk.get(index, &key).map(|d| d.segment());
            if on_disk_only.is_some_and(|s| s == seq) {
                self.fault_in(index, &key);
            }
            let Some(entry) = self.maps[index].get(&key[..]) else {
                continue;
            };
            if entry.value.disk().is_none_or(|l| l.segment.seq != seq) {
                continue;
            }
            // Second chance for blocks read since they were written here,
            // and for the blocks of a tenant under its share of the tier
            // while another is above its own; orphans (no prefix reaches
            // them) and expired keys go.
            let share_kept = kept_by_share
                .as_ref()
                .is_some_and(|k| k.has(entry.tenant as usize));
            let keep = (entry.reads > 0 || share_kept)
                && !entry.orphan
                && !entry.expired(crate::clock::now_ms());
            let value = match &entry.value {
                Value::Writing(w) if keep => Some(w.data.clone()),
                Value::Cached(_) => {
                    // In DRAM anyway: only its disk copy goes.
                    self.uncache(slot, &key);
                    continue;
                }
                Value::Spilled(loc) if keep && dir.has_room(loc.len as u64) => {
                    // Read on an I/O thread; rewritten when it is back.
                    let loc = loc.clone();
                    self.start_rewrite(key, loc);
                    continue;
                }
                _ => None,
            };
            if let Some(value) = value {
                self.replace_value(slot, &key, Value::Heap(value));
                // Admission already passed once: a rewrite keeps it.
                if self.spill_out(slot, &key, true) {
                    dir.counters.rewrites.fetch_add(1, Relaxed);
                    continue;
                }
            }
            self.drop_reclaimed(slot, &key, &dir);
        }
    }

    /// A block of a reclaimed segment that is not written again goes: out
    /// of the index, counted as a reclaim drop and as its tenant's eviction.
    fn drop_reclaimed(&mut self, slot: u16, key: &[u8], dir: &SpillDir) {
        dir.counters.drop_for(SpillDrop::Reclaimed);
        if let Some(gone) = self.drop_entry(slot, key) {
            self.count_eviction(gone.tenant as usize, EvictReason::Policy);
        }
    }

    /// A cached block loses its disk copy (reclaim): a plain slab value.
    fn uncache(&mut self, slot: u16, key: &[u8]) {
        let index = self.index(slot);
        let Some(entry) = self.maps[index].get_mut(key) else {
            return;
        };
        if !matches!(entry.value, Value::Cached(_)) {
            return;
        }
        // Same slot, same charge: only the record is let go.
        let Value::Cached(c) = std::mem::replace(&mut entry.value, Value::Heap(Bytes::new()))
        else {
            return;
        };
        let Cached {
            slot: slot_ref,
            loc,
        } = *c;
        let before = entry.cost(key.len());
        entry.value = Value::Slab(slot_ref);
        let after = entry.cost(key.len());
        self.meta.recharge(entry.tenant, before, after);
        self.meta.untrack_disk(&loc);
    }

    /// Reads a record reclaim keeps, to write it again at the log's head.
    fn start_rewrite(&mut self, key: Bytes, loc: DiskLoc) {
        if let Some(spill) = &self.spill {
            submit_read(spill, key, loc, Store::rewrite_done);
        }
    }

    /// A record reclaim keeps is read: write it again (unless the key
    /// changed meanwhile), or drop the key if it cannot be.
    fn rewrite_done(&mut self, key: Bytes, loc: DiskLoc, record: Option<Record>) {
        let slot = key_slot(&key);
        let index = self.index(slot);
        self.ensure_mapped(index, &key);
        let unchanged = self.maps[index]
            .get(&key[..])
            .is_some_and(|e| matches!(&e.value, Value::Spilled(l) if same_loc(l, &loc)));
        if !unchanged {
            return;
        }
        let Some(dir) = self.spill_dir().cloned() else {
            return;
        };
        if let Some(record) = record {
            self.restore_parent(slot, &key, record.parent);
            self.replace_value(slot, &key, Value::Heap(record.value));
            if self.spill_out(slot, &key, true) {
                dir.counters.rewrites.fetch_add(1, Relaxed);
                return;
            }
        }
        self.drop_reclaimed(slot, &key, &dir);
    }
}
