//! Reading a value: GET's entry ([`Store::read_value`]), the next block of
//! a prefix, and blocks read back from the spill tier (checksummed, one
//! disk read shared by concurrent readers; a block read again moves back
//! to DRAM). The shard's event loop never waits on the disk: reads run on
//! the I/O threads and report back through the shard's mailbox.

use super::keyspace::{Contents, PrefixStep};
use super::Store;
use crate::entry::{Cached, Value, SLAB_MIN};
use crate::links::LinkEvent;
use crate::policy::protect::Protect;
use crate::policy::EvictionPolicy;
use crate::slot::key_slot;
use crate::spill::fetch::{DiskRead, Fetched, InPrefix};
use crate::spill::record::Record;
use crate::spill::writer::SpillState;
use crate::spill::{same_loc, DiskLoc};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Reads of a spilled block after which it moves back to DRAM.
pub const PROMOTE_AFTER: u8 = 2;

impl Store {
    /// A value for a reply: counts a hit or miss, marks it used (unless
    /// `touch` is false), and for a spilled block starts (or joins) the disk
    /// read.
    pub fn read_value(&mut self, slot: u16, key: &[u8], now: u64, touch: bool) -> Option<Fetched> {
        // One lookup: this is every GET's path.
        let loc = match &self.read(slot, key, now, touch)?.value {
            Value::Spilled(loc) => loc.clone(),
            v => return v.bytes().map(Fetched::Now),
        };
        Some(self.later(key, loc))
    }

    /// The next block of a prefix read on one shard (MGETPREFIX): its value
    /// when present and no longer than `step.room` bytes, counted and
    /// touched as [`Store::prefix_hit`] says; one lookup.
    pub fn read_in_prefix(
        &mut self,
        slot: u16,
        key: &[u8],
        now: u64,
        step: &PrefixStep,
    ) -> InPrefix {
        let loc = match self.prefix_hit(slot, key, now, step) {
            Err(end) => return end,
            Ok(entry) => match &entry.value {
                Value::Spilled(loc) => loc.clone(),
                v => {
                    return v
                        .bytes()
                        .map_or(InPrefix::Absent, |b| InPrefix::Value(Fetched::Now(b)))
                }
            },
        };
        InPrefix::Value(self.later(key, loc))
    }

    /// The value of a live key without counting or touching it (the caller
    /// counts what it returns): in memory, or a disk read started.
    pub fn fetch(&mut self, slot: u16, key: &[u8], now: u64) -> Option<Fetched> {
        let loc = match &self.peek(slot, key, now)?.value {
            Value::Spilled(loc) => loc.clone(),
            v => return v.bytes().map(Fetched::Now),
        };
        Some(self.later(key, loc))
    }

    fn later(&mut self, key: &[u8], loc: DiskLoc) -> Fetched {
        let len = loc.value_len as usize;
        Fetched::Later {
            read: self.start_read(key, loc),
            len,
        }
    }

    /// Joins the disk read of `loc` in flight, or starts one.
    fn start_read(&mut self, key: &[u8], loc: DiskLoc) -> DiskRead {
        let (tx, rx) = oneshot::channel();
        let pending = DiskRead(rx);
        let Some(spill) = &mut self.spill else {
            let _ = tx.send(None);
            return pending;
        };
        let id = (loc.segment.seq, loc.offset);
        spill.config.dir.counters.hits.fetch_add(1, Relaxed);
        if let Some(waiters) = spill.reading.get_mut(&id) {
            waiters.push(tx);
            return pending;
        }
        spill.reading.insert(id, vec![tx]);
        submit_read(spill, Bytes::copy_from_slice(key), loc, Store::read_done);
        pending
    }

    /// A disk read finished: answer every waiting reader; a block that
    /// failed its checksum (or could not be read) becomes a miss; a block
    /// read again and again moves back to DRAM.
    fn read_done(&mut self, key: Bytes, loc: DiskLoc, record: Option<Record>) {
        let (value, parent) = record.map_or((None, None), |r| (Some(r.value), r.parent));
        let id = (loc.segment.seq, loc.offset);
        let waiters = self
            .spill
            .as_mut()
            .and_then(|s| s.reading.remove(&id))
            .unwrap_or_default();
        for w in waiters {
            let _ = w.send(value.clone());
        }
        let slot = key_slot(&key);
        let index = self.index(slot);
        self.ensure_mapped(index, &key);
        let still_there = self.maps[index]
            .get(&key[..])
            .is_some_and(|e| matches!(&e.value, Value::Spilled(l) if same_loc(l, &loc)));
        if !still_there {
            return;
        }
        let Some(value) = value else {
            // Wrong bytes are never returned: the block is gone.
            self.drop_entry(slot, &key);
            return;
        };
        let reads = self.maps[index].get(&key[..]).map_or(0, |e| e.reads);
        if reads >= PROMOTE_AFTER {
            self.restore_parent(slot, &key, parent);
            self.promote(slot, &key, value, &loc, false);
        }
    }

    /// A block read from disk gets back the parent its record names (the
    /// compact index does not keep it): a child of it again.
    pub(super) fn restore_parent(&mut self, slot: u16, key: &[u8], parent: Option<Bytes>) {
        let index = self.index(slot);
        let Some(parent) = parent else {
            return;
        };
        let Some((stored, entry)) = self.maps[index].get_key_value_mut(key) else {
            return;
        };
        if entry.parent.is_some() {
            return;
        }
        let before = entry.cost(stored.len());
        entry.parent = Some(parent.clone());
        let after = entry.cost(stored.len());
        self.meta.recharge(entry.tenant, before, after);
        let child = stored.clone();
        self.meta.note_child(&parent, &child);
        // Under `prefix` the parent counts it once it is back in DRAM
        // (`replace_value`); the other policies count children anywhere.
        if self.policy != EvictionPolicy::Prefix {
            self.meta
                .outbox
                .push(LinkEvent::ChildAdded { parent, child });
        }
    }

    /// Brings a spilled block back into DRAM with `value` (already read).
    /// `must`: when no DRAM can be had, keep it on the heap anyway (the
    /// caller needs the bytes in memory).
    /// A block placed in the slab keeps its record (`Value::Cached`): if
    /// it is evicted again before it changes, nothing is written.
    fn promote(&mut self, slot: u16, key: &[u8], value: Bytes, loc: &DiskLoc, must: bool) -> bool {
        let placed = if value.len() < SLAB_MIN {
            Value::Heap(Bytes::copy_from_slice(&value))
        } else {
            let tenant = self.meta.tenants.of(key) as u8;
            let protect = Protect::key(key).by(tenant);
            let capped = self.meta.tenants.capped(tenant);
            let within = match capped {
                true => self.within_cap(tenant, self.arena.footprint_for(value.len()), protect),
                false => Ok(()),
            };
            let placed =
                within.and_then(|()| self.place_in_slab(Contents::Bytes(&value), protect, 0));
            match placed {
                Ok(slot_ref) => Value::Cached(Box::new(Cached {
                    slot: slot_ref,
                    loc: loc.clone(),
                })),
                Err(_) if must => Value::Heap(value),
                Err(_) => return false,
            }
        };
        if let Some(spill) = &self.spill {
            spill.config.dir.counters.promotions.fetch_add(1, Relaxed);
        }
        self.replace_value(slot, key, placed);
        // Back in DRAM: back in the eviction queues.
        if self.queues_on() {
            let index = self.index(slot);
            if let Some((k, e)) = self.maps[index].get_key_value_mut(key) {
                if e.queue == crate::entry::Queue::OUT {
                    self.meta.queued += 1;
                    e.tick = self.recency.tick();
                    self.recency.requeue(k, e, false);
                }
            }
        }
        true
    }

    /// Brings a spilled value into memory now, with a read on this thread:
    /// for the few commands that change a value in place (APPEND, SETRANGE,
    /// INCR...) or move it (RENAME, COPY). `false` if the key is gone or
    /// its record failed its checksum.
    pub fn materialize(&mut self, slot: u16, key: &[u8], now: u64) -> bool {
        let loc = match self.peek(slot, key, now).map(|e| &e.value) {
            Some(Value::Spilled(loc)) => loc.clone(),
            Some(_) => return true,
            None => return false,
        };
        let Some(spill) = &self.spill else {
            return false;
        };
        let dir = Arc::clone(&spill.config.dir);
        dir.counters.sync_reads.fetch_add(1, Relaxed);
        match dir.read(&loc, key) {
            Ok(Some(rec)) => {
                self.restore_parent(slot, key, rec.parent);
                self.promote(slot, key, rec.value, &loc, true)
            }
            Ok(None) => {
                self.drop_entry(slot, key);
                false
            }
            Err(e) => {
                dir.note_error(&e);
                self.drop_entry(slot, key);
                false
            }
        }
    }
}

/// Reads the record at `loc` on an I/O thread and hands its value to `done`
/// on the shard (`None`: damaged or unreadable, the error noted).
pub(super) fn submit_read(
    spill: &SpillState<super::StoreJob>,
    key: Bytes,
    loc: DiskLoc,
    done: fn(&mut Store, Bytes, DiskLoc, Option<Record>),
) {
    let dir = Arc::clone(&spill.config.dir);
    let post = Arc::clone(&spill.config.post);
    dir.counters.queue_depth.fetch_add(1, Relaxed);
    spill.config.pool.submit(Box::new(move || {
        let result = dir.read(&loc, &key);
        dir.counters.queue_depth.fetch_sub(1, Relaxed);
        if let Err(e) = &result {
            dir.note_error(e);
        }
        post(Box::new(move |store| {
            done(store, key, loc, result.ok().flatten())
        }));
    }));
}
