//! A shard's writer to the spill tier: records placed at the end of its
//! active segment, gathered into batches that an I/O thread writes with one
//! `pwritev`, each segment's footer written when it is sealed. The store's
//! side (what is demoted, and what happens when a batch lands) is in
//! `store/demote.rs`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::oneshot;

use super::dir::{aligned, IoPool, Segment, SpillDir, BATCH_SIZE};
use super::footer;

/// Reads of a spilled block after which it moves back to DRAM.
pub const PROMOTE_AFTER: u8 = 2;
/// Smaller values are not written to the spill tier: a record takes at
/// least 4 KiB on disk and a whole disk read to fetch, so a 100-byte value
/// would cost 40 times its size there. KV-cache blocks are far larger.
pub const SPILL_MIN: usize = 1024;

/// What the spill tier needs per shard; `J` is the work the I/O threads
/// hand back to the shard's thread (the store's `StoreJob`).
pub struct SpillConfig<J> {
    /// The directory (shared by all shards).
    pub dir: Arc<SpillDir>,
    /// The I/O threads (shared).
    pub pool: Arc<IoPool>,
    /// Posts work to this store's thread.
    pub post: Arc<dyn Fn(J) + Send + Sync>,
    /// This shard's index (segment ownership).
    pub shard: usize,
    /// Evicted blocks are written only if read at least this many times.
    pub admission: u8,
}

/// A write batch: records laid out for one `pwritev`.
pub(crate) struct Batch {
    pub(crate) segment: Arc<Segment>,
    pub(crate) offset: u64,
    /// Encoded records (each a multiple of 4096 bytes, 4096-aligned).
    pub(crate) records: Vec<Bytes>,
    pub(crate) bytes: usize,
    /// Keys whose entries point into this batch (key, record offset).
    pub(crate) keys: Vec<(Bytes, u64)>,
}

/// Per-shard state of the spill tier.
pub struct SpillState<J> {
    pub(crate) config: SpillConfig<J>,
    /// Makes the job that hands a written batch (and how its write went)
    /// back to the store.
    written: fn(Batch, std::io::Result<()>) -> J,
    pub(crate) active: Option<Arc<Segment>>,
    /// The active segment's footer so far: an entry per record appended
    /// ([`footer::note_record`]), and how many.
    pub(crate) footer: (bytes::BytesMut, u64),
    pub(crate) open: Option<Batch>,
    /// Disk reads in flight, by (segment, offset): their waiting readers.
    pub(crate) reading: HashMap<(u64, u64), Vec<oneshot::Sender<Option<Bytes>>>>,
    /// Keys needing a tombstone at the next flush.
    pub(crate) tombstones: Vec<Bytes>,
    /// Graceful shutdown: no queue limit.
    pub(crate) shutting_down: bool,
}

impl<J: Send + 'static> SpillState<J> {
    /// The tier for one shard.
    pub(crate) fn new(
        config: SpillConfig<J>,
        written: fn(Batch, std::io::Result<()>) -> J,
    ) -> Self {
        SpillState {
            config,
            written,
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
    pub(crate) fn place(&mut self, len: usize) -> Option<(Arc<Segment>, u64)> {
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
    pub(crate) fn append(
        &mut self,
        segment: Arc<Segment>,
        offset: u64,
        rec: Bytes,
        key: Option<Bytes>,
    ) {
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
    pub(crate) fn seal_active(&mut self) -> Bytes {
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
    pub(crate) fn flush(&mut self) {
        let Some(batch) = self.open.take() else {
            return;
        };
        let dir = Arc::clone(&self.config.dir);
        dir.queued(batch.bytes);
        let post = Arc::clone(&self.config.post);
        let written = self.written;
        dir.counters.queue_depth.fetch_add(1, Relaxed);
        self.config.pool.submit(Box::new(move || {
            let result = write_batch(&dir, &batch);
            dir.counters.queue_depth.fetch_sub(1, Relaxed);
            dir.written(batch.bytes);
            post(written(batch, result));
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
