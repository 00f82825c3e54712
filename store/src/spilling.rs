//! The store's side of the spill tier: demoting evicted blocks to disk,
//! reading them back (checksummed, one disk read shared by concurrent
//! readers), promoting blocks that are read again, tombstones, reclaim of
//! old segments, and the warm-restart / shutdown paths.
//!
//! A block moves DRAM → `Value::Writing` (its record is in the shard's open
//! write batch; reads are served from there) → `Value::Spilled` once the
//! I/O thread reports the batch written. The shard's event loop never
//! waits on the disk: writes and reads run on the I/O threads and report
//! back through the shard's mailbox.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::oneshot;

use super::disk_index::DiskEntry;
use super::entry::{Cached, InFlight};
use super::spill::record::{self, Record};
use super::spill::{
    aligned, footer, DiskLoc, IoPool, Recovered, Segment, SpillDir, SpillDrop, BATCH_SIZE,
    QUEUE_HARD,
};
use super::{
    Contents, Entry, EvictReason, EvictionPolicy, LinkEvent, PrefixStep, Protect, Store, Value,
    SLAB_MIN,
};
use crate::slot::key_slot;

/// Reads of a spilled block after which it moves back to DRAM.
pub const PROMOTE_AFTER: u8 = 2;
/// Smaller values are not written to the spill tier: a record takes at
/// least 4 KiB on disk and a whole disk read to fetch, so a 100-byte value
/// would cost 40 times its size there. KV-cache blocks are far larger.
pub const SPILL_MIN: usize = 1024;

/// Work for a store, run on its own thread with the store borrowed: how
/// the I/O threads hand their results back.
pub type StoreJob = Box<dyn FnOnce(&mut Store) + Send>;

/// How a store's work reaches its thread (the shard wraps it in a job for
/// its own mailbox).
pub type PostToStore = Arc<dyn Fn(StoreJob) + Send + Sync>;

/// What the spill tier needs per shard.
pub struct SpillConfig {
    /// The directory (shared by all shards).
    pub dir: Arc<SpillDir>,
    /// The I/O threads (shared).
    pub pool: Arc<IoPool>,
    /// Posts work to this store's thread.
    pub post: PostToStore,
    /// This shard's index (segment ownership).
    pub shard: usize,
    /// Evicted blocks are written only if read at least this many times.
    pub admission: u8,
}

/// A value read from the store: in memory now, or on its way from disk.
pub enum Fetched {
    /// In memory.
    Now(Bytes),
    /// Being read from the spill tier.
    Later {
        /// The read.
        read: DiskRead,
        /// The value's length (known from the index).
        len: usize,
    },
}

/// The next block of a prefix read ([`Store::read_in_prefix`]).
pub enum InPrefix {
    /// Present and within the byte budget.
    Value(Fetched),
    /// Absent (or expired): the prefix ends here.
    Absent,
    /// Longer than the bytes left: the prefix ends here.
    TooLong,
}

/// A disk read in flight: the value once read and checksummed, or `None`
/// when it failed its checksum or could not be read (the block is then
/// gone: wrong bytes are never returned).
pub struct DiskRead(oneshot::Receiver<Option<Bytes>>);

impl DiskRead {
    /// The value, once read.
    pub async fn wait(self) -> Option<Bytes> {
        self.0.await.ok().flatten()
    }

    /// The channel the value arrives on.
    pub fn into_receiver(self) -> oneshot::Receiver<Option<Bytes>> {
        self.0
    }
}

impl Fetched {
    /// The value's length.
    pub fn len(&self) -> usize {
        match self {
            Fetched::Now(b) => b.len(),
            Fetched::Later { len, .. } => *len,
        }
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A write batch: records laid out for one `pwritev`.
struct Batch {
    segment: Arc<Segment>,
    offset: u64,
    /// Encoded records (each a multiple of 4096 bytes, 4096-aligned).
    records: Vec<Bytes>,
    bytes: usize,
    /// Keys whose entries point into this batch (key, record offset).
    keys: Vec<(Bytes, u64)>,
}

/// Per-shard state of the spill tier.
pub struct SpillState {
    config: SpillConfig,
    active: Option<Arc<Segment>>,
    /// The active segment's footer so far: an entry per record appended
    /// ([`footer::note_record`]), and how many.
    footer: (bytes::BytesMut, u64),
    open: Option<Batch>,
    /// Disk reads in flight, by (segment, offset): their waiting readers.
    reading: HashMap<(u64, u64), Vec<oneshot::Sender<Option<Bytes>>>>,
    /// Keys needing a tombstone at the next flush.
    tombstones: Vec<Bytes>,
    /// Graceful shutdown: no queue limit.
    shutting_down: bool,
}

impl SpillState {
    /// The tier for one shard.
    pub fn new(config: SpillConfig) -> SpillState {
        SpillState {
            config,
            active: None,
            footer: (bytes::BytesMut::new(), 0),
            open: None,
            reading: HashMap::new(),
            tombstones: Vec::new(),
            shutting_down: false,
        }
    }

    /// The shared directory.
    pub fn dir(&self) -> &Arc<SpillDir> {
        &self.config.dir
    }

    /// Places a record of `len` bytes at the end of this shard's active
    /// segment (starting a new segment when it is full, flushing the open
    /// batch first). `None` when the disk budget has no room.
    fn place(&mut self, len: usize) -> Option<(Arc<Segment>, u64)> {
        let dir = Arc::clone(&self.config.dir);
        let needs_new = match &self.active {
            Some(s) => {
                s.size.load(Relaxed) + len as u64 > dir.segment_size() && s.size.load(Relaxed) > 0
            }
            None => true,
        };
        if needs_new {
            self.seal_active();
            match dir.new_segment(self.config.shard) {
                Ok(s) => self.active = Some(s),
                Err(e) => {
                    dir.note_error(&e);
                    return None;
                }
            }
        }
        let segment = Arc::clone(self.active.as_ref()?);
        let offset = dir.reserve(&segment, len as u64)?;
        Some((segment, offset))
    }

    /// Appends an encoded record to the open batch (starting one if
    /// needed); the record must already be placed at `offset` of `segment`.
    fn append(&mut self, segment: Arc<Segment>, offset: u64, rec: Bytes, key: Option<Bytes>) {
        let contiguous = matches!(&self.open, Some(b) if Arc::ptr_eq(&b.segment, &segment)
            && b.offset + b.bytes as u64 == offset
            && b.bytes + rec.len() <= BATCH_SIZE.max(rec.len()));
        if !contiguous {
            self.flush();
            self.open = Some(Batch {
                segment,
                offset,
                records: Vec::new(),
                bytes: 0,
                keys: Vec::new(),
            });
        }
        let (body, entries) = &mut self.footer;
        *entries += footer::note_record(body, offset, &rec);
        if let Some(batch) = &mut self.open {
            batch.bytes += rec.len();
            batch.records.push(rec);
            if let Some(key) = key {
                batch.keys.push((key, offset));
            }
        }
        if self.open.as_ref().is_some_and(|b| b.bytes >= BATCH_SIZE) {
            self.flush();
        }
    }

    /// Whether tombstones or an open write batch wait for `flush_spill`.
    pub(crate) fn has_unflushed(&self) -> bool {
        self.open.is_some() || !self.tombstones.is_empty()
    }

    /// No more appends to the active segment: its open batch goes to the
    /// disk, then its footer (after the last record, if the budget has
    /// room; without one the next restart scans the segment). Returns the
    /// footer's body (reclaim reads the segment's keys there).
    fn seal_active(&mut self) -> Bytes {
        self.flush();
        let (body, entries) = std::mem::take(&mut self.footer);
        let body = body.freeze();
        let Some(segment) = self.active.take() else {
            return body;
        };
        let dir = Arc::clone(&self.config.dir);
        let len = footer::footer_len(body.len());
        if let Some(at) = (entries > 0)
            .then(|| dir.reserve(&segment, len as u64))
            .flatten()
        {
            let buf = footer::encode(at, &body, entries);
            let on_disk = Arc::clone(&segment);
            let io = Arc::clone(&dir);
            dir.counters.queue_depth.fetch_add(1, Relaxed);
            self.config.pool.submit(Box::new(move || {
                if let Err(e) = io.write(&on_disk, at, &buf) {
                    io.note_error(&e);
                }
                io.counters.queue_depth.fetch_sub(1, Relaxed);
            }));
        }
        dir.seal(&segment);
        body
    }

    /// Hands the open batch to an I/O thread.
    fn flush(&mut self) {
        let Some(batch) = self.open.take() else {
            return;
        };
        let dir = Arc::clone(&self.config.dir);
        dir.queued(batch.bytes);
        let post = Arc::clone(&self.config.post);
        dir.counters.queue_depth.fetch_add(1, Relaxed);
        self.config.pool.submit(Box::new(move || {
            let result = write_batch(&dir, &batch);
            dir.counters.queue_depth.fetch_sub(1, Relaxed);
            dir.written(batch.bytes);
            post(Box::new(move |store| store.batch_written(batch, result)));
        }));
    }
}

/// Writes a batch's records with one `pwritev`.
fn write_batch(dir: &SpillDir, batch: &Batch) -> std::io::Result<()> {
    let mut offset = batch.offset;
    // At most IOV_MAX buffers per call.
    for chunk in batch.records.chunks(512) {
        let iov: Vec<libc::iovec> = chunk
            .iter()
            .map(|r| libc::iovec {
                iov_base: r.as_ptr() as *mut libc::c_void,
                iov_len: r.len(),
            })
            .collect();
        let total: usize = chunk.iter().map(|r| r.len()).sum();
        let started = std::time::Instant::now();
        let mut done = 0usize;
        while done == 0 {
            // SAFETY: every iovec points into a `Bytes` record owned by
            // `batch` for the whole call; the segment's file descriptor is
            // open (the batch holds the segment's Arc).
            let n = unsafe {
                libc::pwritev(
                    batch.segment.fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    offset as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            done = n as usize;
        }
        if done < total {
            // A short write: finish with plain writes of what remains
            // (aligned: records are whole 4 KiB blocks, so is `done`
            // unless the disk is failing, and then the write errs).
            let rest: Vec<u8> = chunk
                .iter()
                .flat_map(|r| r.iter().copied())
                .skip(done)
                .collect();
            let mut buf = aligned(rest.len());
            buf.copy_from_slice(&rest);
            dir.write(&batch.segment, offset + done as u64, &buf)?;
        }
        let took = started.elapsed();
        dir.counters
            .write_us
            .fetch_add(took.as_micros() as u64, Relaxed);
        dir.counters.write_calls.fetch_add(1, Relaxed);
        dir.counters.write_latency.record(took);
        dir.counters.writes.fetch_add(chunk.len() as u64, Relaxed);
        dir.counters
            .write_bytes
            .fetch_add(done.min(total) as u64, Relaxed);
        offset += total as u64;
    }
    Ok(())
}

impl Store {
    /// Turns the spill tier on for this store.
    pub fn enable_spill(&mut self, config: SpillConfig) {
        self.meta.disk = Some(Arc::clone(&config.dir));
        self.spill = Some(SpillState::new(config));
    }

    /// After FLUSHALL: no segment of the old keys stays in use.
    pub(super) fn spill_cleared(&mut self) {
        if let Some(spill) = &mut self.spill {
            spill.tombstones.clear();
            spill.seal_active();
        }
    }

    /// Whether a spill tier is configured.
    pub fn spill_enabled(&self) -> bool {
        self.spill.is_some()
    }

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
    fn restore_parent(&mut self, slot: u16, key: &[u8], parent: Option<Bytes>) {
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
                if e.queue == super::Queue::OUT {
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
    fn batch_written(&mut self, batch: Batch, result: std::io::Result<()>) {
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

    /// Frees disk space: asks every shard to drop (or, for blocks read
    /// since they were spilled, rewrite) its records in the oldest segment,
    /// so that segment is deleted. Orphaned blocks are always dropped.
    fn reclaim_disk(&mut self) {
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
    fn disk_limits(&self, tenant: usize, dir: &SpillDir) -> Option<(usize, usize)> {
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
            let keys = match super::spill::load::segment_keys(&segment) {
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
            let keep =
                (entry.reads > 0 || share_kept) && !entry.orphan && !entry.expired(super::now_ms());
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

    /// Graceful shutdown: writes every block still in DRAM (and waits for
    /// the writes), so a restart loses nothing that fits on disk.
    pub fn spill_everything(&mut self) {
        if self.spill.is_none() {
            return;
        }
        let keys: Vec<(u16, Bytes)> = self
            .maps
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(_, e)| e.value.in_dram())
            .map(|(k, _)| (key_slot(k), k.clone()))
            .collect();
        if let Some(spill) = &mut self.spill {
            spill.shutting_down = true;
        }
        for (slot, key) in keys {
            if let Some(e) = self.maps[self.index(slot)].get(&key[..]) {
                if e.value.is_held() {
                    continue;
                }
            }
            self.spill_out(slot, &key, true);
        }
        self.close_spill();
    }

    /// Graceful shutdown: writes what waits (tombstones, the open batch)
    /// and the active segment's footer, and waits for the I/O threads, so
    /// the next start reads every segment's index from its footer.
    pub fn close_spill(&mut self) {
        self.flush_spill();
        let Some(spill) = &mut self.spill else {
            return;
        };
        spill.seal_active();
        // The batches report through the mailbox, which is not polled any
        // more: watch the queue instead.
        let dir = Arc::clone(&spill.config.dir);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while dir.counters.queue_depth.load(Relaxed) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The warm restart starts: until [`Store::loading_done`], every key
    /// written or deleted here is remembered (and gets a tombstone, so an
    /// older record of it cannot come back at a later restart either), and
    /// records loaded later never take its place.
    pub fn begin_loading(&mut self) {
        self.meta.loading = Some(super::meta::Loading::default());
    }

    /// Whether the warm restart is still bringing this store's records.
    pub fn loading(&self) -> bool {
        self.meta.loading.is_some()
    }

    /// The warm restart is done: nothing more comes.
    pub fn loading_done(&mut self) {
        self.meta.loading = None;
    }

    /// Index entries for records the warm restart found, newest first: a
    /// record is kept only if its key is not in the index (a newer record
    /// of it came first) and was not written or deleted since the start
    /// (nor everything flushed). Returns how many were kept.
    pub fn insert_loaded(&mut self, records: Vec<Recovered>, now: u64) -> usize {
        let Some(loading) = self.meta.loading.take() else {
            return 0;
        };
        let mut kept = 0;
        // Live records per segment, added once per run of one segment: the
        // count is shared with the other shards and the loader, and a batch
        // comes from one or two segments.
        let mut live: Option<(Arc<Segment>, i64)> = None;
        for r in records {
            if loading.flushed || loading.touched.contains(&r.key[..]) {
                continue;
            }
            if r.expire_at != 0 && r.expire_at <= now {
                continue;
            }
            let index = self.index(key_slot(&r.key));
            if self.maps[index].contains_key(&r.key[..]) {
                continue;
            }
            let Recovered {
                key,
                loc,
                expire_at,
            } = r;
            // Into the compact index (unless a newer record of the key came
            // first); a record whose fields do not fit it gets a full entry
            // (its parent comes back when it is read).
            let added = match DiskEntry::loaded(key, &loc) {
                Ok(d) => match self.disk.insert(index, d, expire_at) {
                    Some(d) => {
                        let cost = d.cost();
                        self.meta.added_compact(d.key(), expire_at, cost);
                        true
                    }
                    None => false,
                },
                Err(key) => {
                    let mut entry = Entry::on_disk(loc.clone(), expire_at, now);
                    entry.tenant = self.meta.tenants.of(&key) as u8;
                    let key = Bytes::from(key);
                    self.meta.added(&key, &entry);
                    self.maps[index].insert(key, entry);
                    true
                }
            };
            if !added {
                continue;
            }
            kept += 1;
            match &mut live {
                Some((segment, n)) if Arc::ptr_eq(segment, &loc.segment) => *n += 1,
                _ => {
                    if let (Some((segment, n)), Some(dir)) = (live.take(), &self.meta.disk) {
                        dir.add_live(&segment, n);
                    }
                    live = Some((Arc::clone(&loc.segment), 1));
                }
            }
        }
        if let (Some((segment, n)), Some(dir)) = (live, &self.meta.disk) {
            dir.add_live(&segment, n);
        }
        if let Some(dir) = &self.meta.disk {
            dir.counters.recovered.fetch_add(kept as u64, Relaxed);
        }
        self.meta.loading = Some(loading);
        kept
    }

    /// This shard's keys with a record in the spill tier (INFO).
    pub fn spill_keys(&self) -> usize {
        self.meta.disk_entries
    }

    /// Sets the spill admission (0: every evicted block).
    pub fn set_spill_admission(&mut self, reads: u8) {
        if let Some(spill) = &mut self.spill {
            spill.config.admission = reads;
        }
    }

    /// The shared spill directory, if the tier is on.
    pub fn spill_dir(&self) -> Option<&Arc<SpillDir>> {
        self.spill.as_ref().map(|s| s.dir())
    }
}

fn same_loc(a: &DiskLoc, b: &DiskLoc) -> bool {
    a.segment.seq == b.segment.seq && a.offset == b.offset
}

/// Reads the record at `loc` on an I/O thread and hands its value to `done`
/// on the shard (`None`: damaged or unreadable, the error noted).
fn submit_read(
    spill: &SpillState,
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

#[cfg(test)]
mod loading_tests {
    use std::sync::Mutex;

    use super::*;
    use crate::spill::record::encode;
    use crate::spill::{footer, Loader};

    type Jobs = Arc<Mutex<Vec<StoreJob>>>;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kvtier-loading-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A store with the tier on over `d`; the I/O threads' reports wait in
    /// the returned queue until [`run`].
    fn store(d: &Arc<SpillDir>) -> (Store, Jobs) {
        let jobs: Jobs = Arc::default();
        let queue = Arc::clone(&jobs);
        let mut s = Store::new(0..crate::slot::SLOTS, 64 << 20, EvictionPolicy::AllKeysLru);
        s.enable_spill(SpillConfig {
            dir: Arc::clone(d),
            pool: Arc::new(IoPool::start(1)),
            post: Arc::new(move |job| queue.lock().unwrap().push(job)),
            shard: 0,
            admission: 0,
        });
        (s, jobs)
    }

    /// One segment with a footer holding `keys` (each a 5000-byte block).
    fn old_segment(d: &SpillDir, keys: &[&str]) {
        let seg = d.new_segment(0).unwrap();
        let mut batch = aligned(0);
        let (mut body, mut entries) = (bytes::BytesMut::new(), 0);
        for k in keys {
            let at = batch.len();
            let r = Record {
                key: Bytes::copy_from_slice(k.as_bytes()),
                parent: None,
                value: Bytes::from(vec![1u8; 5000]),
                expire_at: 0,
                tombstone: false,
            };
            encode(&mut batch, &r);
            entries += footer::note_record(&mut body, at as u64, &batch[at..]);
        }
        let off = d.reserve(&seg, batch.len() as u64).unwrap();
        let mut out = aligned(batch.len());
        out.copy_from_slice(&batch);
        d.write(&seg, off, &out).unwrap();
        let at = d
            .reserve(&seg, footer::footer_len(body.len()) as u64)
            .unwrap();
        d.write(&seg, at, &footer::encode(at, &body, entries))
            .unwrap();
    }

    /// A store over a fresh tier of `max` bytes, 16 MiB of DRAM, and two
    /// named tenants, `a@*` (slot 1) and `b@*` (slot 2), with `limits`.
    fn two_tenants(
        name: &str,
        max: u64,
        limits: [crate::tenants::Limits; 2],
    ) -> (Store, Jobs, Arc<SpillDir>, std::path::PathBuf) {
        let path = dir(name);
        let d = Arc::new(SpillDir::open(&path, max).unwrap());
        let (mut s, jobs) = store(&d);
        s.set_budget(16 << 20);
        s.set_tenants(&[
            vec![crate::tenants::KeyPattern::parse("a@*").unwrap()],
            vec![crate::tenants::KeyPattern::parse("b@*").unwrap()],
        ]);
        s.set_tenant_limits(&limits);
        (s, jobs, d, path)
    }

    /// What the shard does after a batch: runs the I/O threads' reports
    /// and delivers the store's own link events (reclaim).
    fn settle(s: &mut Store, jobs: &Jobs) {
        let ready: Vec<StoreJob> = jobs.lock().unwrap().drain(..).collect();
        for job in ready {
            job(s);
        }
        for e in s.take_link_events() {
            s.apply_link(e);
        }
    }

    /// Writes a 16 KiB block under `key`, then [`settle`]s.
    fn write_block(s: &mut Store, jobs: &Jobs, key: &str) {
        let block = Bytes::from(vec![3u8; 16384]);
        s.insert(
            key_slot(key.as_bytes()),
            key.as_bytes(),
            block,
            0,
            crate::now_ms(),
        )
        .unwrap();
        settle(s, jobs);
    }

    /// A tenant at its disk cap: its evicted blocks are dropped, not
    /// written, and counted; the other tenant's are written as before.
    #[test]
    fn a_tenant_at_its_disk_cap_is_not_written_to_disk() {
        let capped = crate::tenants::Limits {
            disk_cap: 1000,
            ..crate::tenants::Limits::default()
        };
        let (mut s, jobs, d, path) = two_tenants(
            "disk-cap",
            64 << 20,
            [capped, crate::tenants::Limits::default()],
        );
        for i in 0..1500 {
            for t in ["a", "b"] {
                write_block(&mut s, &jobs, &format!("{t}@{i}"));
            }
        }
        let cap = crate::tenants::part_of(64 << 20, 1000);
        let usage = s.tenant_usage();
        assert!(usage[1].disk <= cap, "{} > {cap}", usage[1].disk);
        assert!(
            usage[1].disk + 16384 > cap,
            "a fills its cap: {}",
            usage[1].disk
        );
        assert!(
            usage[2].disk > 2 * cap,
            "b is not capped: {}",
            usage[2].disk
        );
        let dropped = d.counters.dropped_by[SpillDrop::TenantCap as usize].load(Relaxed);
        assert!(dropped > 100, "{dropped}");
        let _ = std::fs::remove_dir_all(&path);
    }

    /// Reclaim keeps the blocks of a tenant under its disk share while
    /// another tenant's flood fills the tier: without the share they are
    /// the oldest, never read, and would all go.
    #[test]
    fn reclaim_keeps_a_tenant_within_its_disk_share() {
        for share in [0, 5000] {
            let a = crate::tenants::Limits {
                disk_share: share,
                ..crate::tenants::Limits::default()
            };
            // Per tenant even without a share (a cap of all but 0.01%).
            let b = crate::tenants::Limits {
                cap: 9999,
                ..crate::tenants::Limits::default()
            };
            let (mut s, jobs, _d, path) =
                two_tenants(&format!("disk-share-{share}"), 32 << 20, [a, b]);
            for i in 0..1500 {
                write_block(&mut s, &jobs, &format!("a@{i}"));
            }
            s.flush_spill();
            let before = s.tenant_usage()[1].disk;
            assert!(before > 4 << 20, "a spilled {before}");
            for i in 0..8000 {
                write_block(&mut s, &jobs, &format!("b@{i}"));
            }
            s.flush_spill();
            for _ in 0..100 {
                settle(&mut s, &jobs);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let after = s.tenant_usage()[1].disk;
            match share {
                0 => assert!(
                    after < before / 4,
                    "a kept {after} of {before} with no share"
                ),
                _ => assert!(
                    after > before * 3 / 4,
                    "a kept {after} of {before} under its share"
                ),
            }
            let _ = std::fs::remove_dir_all(&path);
        }
    }

    #[test]
    fn keys_written_or_deleted_while_loading_win_over_older_records() {
        let path = dir("touched");
        {
            let d = SpillDir::open(&path, 0).unwrap();
            old_segment(&d, &["kept", "overwritten", "deleted", "flushed"]);
        }
        let d = Arc::new(SpillDir::open(&path, 0).unwrap());
        let segments = d.open_segments().unwrap();
        let (mut s, _jobs) = store(&d);
        s.begin_loading();
        let now = crate::now_ms();
        let slot = |k: &str| key_slot(k.as_bytes());
        // Before the loader reaches them: one key written, one deleted
        // (it is not in the index yet: DEL finds nothing, and still counts).
        s.insert(
            slot("overwritten"),
            b"overwritten",
            Bytes::from("new"),
            0,
            now,
        )
        .unwrap();
        s.insert(slot("deleted"), b"deleted", Bytes::from("tmp"), 0, now)
            .unwrap();
        s.remove(slot("deleted"), b"deleted");
        let mut loader = Loader::new(segments);
        let records = loader.next(&d, now).unwrap().unwrap();
        assert_eq!(records.len(), 4);
        assert_eq!(s.insert_loaded(records.clone(), now), 2, "kept and flushed");
        let value = |s: &mut Store, k: &str| match s.fetch(slot(k), k.as_bytes(), now) {
            Some(Fetched::Now(b)) => Some(b),
            Some(Fetched::Later { len, .. }) => Some(Bytes::from(vec![0u8; len])),
            None => None,
        };
        assert_eq!(value(&mut s, "overwritten"), Some(Bytes::from("new")));
        assert_eq!(value(&mut s, "deleted"), None);
        assert_eq!(value(&mut s, "kept").map(|v| v.len()), Some(5000));
        // The touched keys get tombstones: a later restart does not bring
        // their old records back either.
        s.flush_spill();
        let tombstones: usize = s.spill.as_ref().map_or(0, |sp| sp.footer.1 as usize);
        assert_eq!(tombstones, 2, "overwritten, deleted");
        // A second copy of the same records (an older segment's) adds
        // nothing: the keys are there.
        assert_eq!(s.insert_loaded(records.clone(), now), 0);
        // FLUSHALL while loading: nothing loaded afterwards is kept.
        s.clear();
        assert_eq!(s.insert_loaded(records, now), 0);
        assert_eq!(value(&mut s, "flushed"), None);
        s.loading_done();
        assert!(!s.loading());
        let _ = std::fs::remove_dir_all(&path);
    }
}
