//! The spill directory's segments, shared by every shard ([`SpillDir`]),
//! where a record lives ([`DiskLoc`]), and the I/O threads ([`IoPool`]).
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;

use super::record::{self, ALIGN};

use crate::latency::SharedLatency;

/// Segment files grow to this size before a new one starts (see
/// docs/decisions/0021-spill-tier-checksummed-log.md: large enough that
/// reclaim is rare and batches stay sequential, small enough that
/// reclaiming one frees space quickly).
pub const SEGMENT_SIZE: u64 = 64 << 20;
/// A shard flushes its write batch when it reaches this size.
pub const BATCH_SIZE: usize = 1 << 20;
/// Bytes of write batches in flight (all shards) above which commands that
/// add data wait for the disk: back-pressure on writers, never on readers.
pub const QUEUE_SOFT: usize = 64 << 20;
/// Bytes in flight above which eviction drops blocks instead of writing
/// them (writers already in progress when the soft limit was reached).
pub const QUEUE_HARD: usize = 256 << 20;

/// One segment file.
pub struct Segment {
    /// Creation order (its file name); oldest first when reclaiming.
    pub seq: u64,
    /// The shard that appends to it (and reclaims it).
    pub owner: usize,
    path: PathBuf,
    pub(super) file: File,
    /// Bytes allocated in the file so far (records and reserved batches).
    pub size: AtomicU64,
    /// Records the index still points to.
    pub live: AtomicI64,
    /// No more appends: deleted when `live` reaches zero and every older
    /// segment is gone.
    pub sealed: AtomicBool,
}

impl Segment {
    /// The open file's descriptor (for `pwritev`).
    pub fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }

    fn path_for(dir: &Path, seq: u64, owner: usize) -> PathBuf {
        dir.join(format!("{seq:016x}-{owner}.seg"))
    }
}

/// Where a spilled record lives.
#[derive(Clone)]
pub struct DiskLoc {
    /// Its segment.
    pub segment: Arc<Segment>,
    /// Byte offset of the record in the segment (a multiple of 4096).
    pub offset: u64,
    /// The record's length on disk.
    pub len: u32,
    /// Where the value starts inside the record.
    pub value_at: u32,
    /// The value's length.
    pub value_len: u32,
}

impl std::fmt::Debug for DiskLoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DiskLoc(segment {}, offset {}, {} bytes)",
            self.segment.seq, self.offset, self.len
        )
    }
}

/// Why a block evicted from DRAM was not kept on disk (it is gone: the
/// next read misses). Each is counted (INFO `spill_dropped_<cause>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillDrop {
    /// Not read enough since it was written (`--spill-admission`), or, under
    /// `prefix`, no prefix lookup reaches it (an orphan) or a request's
    /// final partial block never read.
    Admission,
    /// The write queue was over its hard limit (the disk cannot keep up
    /// and writers were already slowed down).
    QueueFull,
    /// A key or parent key longer than a record holds (64 KiB).
    KeyTooLong,
    /// No room within the disk budget (an old segment is being reclaimed).
    NoSpace,
    /// The write failed (an I/O error, the disk full).
    WriteFailed,
    /// Its segment was reclaimed to free disk space and it was not read
    /// since it was written (blocks read since are rewritten).
    Reclaimed,
    /// Its tenant holds its cap of the spill tier.
    TenantCap,
}

impl SpillDrop {
    /// Every cause, in counter order.
    pub const ALL: [SpillDrop; 7] = [
        SpillDrop::Admission,
        SpillDrop::QueueFull,
        SpillDrop::KeyTooLong,
        SpillDrop::NoSpace,
        SpillDrop::WriteFailed,
        SpillDrop::Reclaimed,
        SpillDrop::TenantCap,
    ];

    /// INFO suffix and metric name part.
    pub fn name(self) -> &'static str {
        match self {
            SpillDrop::Admission => "admission",
            SpillDrop::QueueFull => "queue_full",
            SpillDrop::KeyTooLong => "key_too_long",
            SpillDrop::NoSpace => "no_space",
            SpillDrop::WriteFailed => "write_failed",
            SpillDrop::Reclaimed => "reclaimed",
            SpillDrop::TenantCap => "tenant_cap",
        }
    }
}

/// Counters of the tier (INFO spill, metrics), shared by all shards.
#[derive(Default)]
pub struct SpillCounters {
    /// Records written.
    pub writes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Records read back.
    pub reads: AtomicU64,
    /// Bytes read back.
    pub read_bytes: AtomicU64,
    /// Reads of a spilled block (a DRAM miss, a disk hit).
    pub hits: AtomicU64,
    /// Blocks moved back to DRAM.
    pub promotions: AtomicU64,
    /// Segments reclaimed to stay within the disk budget.
    pub reclaims: AtomicU64,
    /// Records rewritten by reclaim.
    pub rewrites: AtomicU64,
    /// Blocks dropped instead of kept on disk, by [`SpillDrop`] (same order
    /// as `SpillDrop::ALL`); [`SpillCounters::dropped`] is their sum.
    pub dropped_by: [AtomicU64; 7],
    /// Records that failed their checksum.
    pub checksum_failures: AtomicU64,
    /// Failed reads and writes.
    pub io_errors: AtomicU64,
    /// Writes refused because the disk was full.
    pub disk_full: AtomicU64,
    /// I/O requests queued or running.
    pub queue_depth: AtomicUsize,
    /// Total read latency, microseconds.
    pub read_us: AtomicU64,
    /// Total write latency, microseconds.
    pub write_us: AtomicU64,
    /// Write calls (a batch is one, or a few when very large).
    pub write_calls: AtomicU64,
    /// Latency of each disk read.
    pub read_latency: SharedLatency,
    /// Latency of each write call.
    pub write_latency: SharedLatency,
    /// Reads done on a shard thread (commands that change a spilled value
    /// in place, or move it: APPEND, SETRANGE, INCR, RENAME...).
    pub sync_reads: AtomicU64,
    /// Records recovered at start.
    pub recovered: AtomicU64,
    /// Records the warm-restart scan skipped (torn tail, flipped bytes).
    pub recovery_skipped: AtomicU64,
    /// Segments whose index came from their footer at the warm restart.
    pub footers_read: AtomicU64,
    /// Segments scanned record by record (no footer, or a damaged one).
    pub segments_scanned: AtomicU64,
    /// Segments left to index at the warm restart.
    pub load_pending: AtomicU64,
    /// How long the warm restart took to index every segment, ms.
    pub load_ms: AtomicU64,
}

impl SpillCounters {
    /// Counts a block dropped for `cause`.
    pub fn drop_for(&self, cause: SpillDrop) {
        self.dropped_by[cause as usize].fetch_add(1, Relaxed);
    }

    /// Blocks dropped, all causes.
    pub fn dropped(&self) -> u64 {
        self.dropped_by.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// The spill directory: its segments and budget.
pub struct SpillDir {
    dir: PathBuf,
    max_bytes: AtomicU64,
    direct: bool,
    segments: Mutex<BTreeMap<u64, Arc<Segment>>>,
    next_seq: AtomicU64,
    used: AtomicU64,
    /// The newest segment a reclaim was asked for, and when.
    reclaim_mark: Mutex<(u64, Instant)>,
    /// Counters.
    pub counters: SpillCounters,
    /// The last I/O error, for INFO.
    pub last_error: Mutex<String>,
    /// Bytes of write batches queued or being written.
    in_flight: AtomicUsize,
    /// Woken when `in_flight` drops below [`QUEUE_SOFT`].
    drained: tokio::sync::Notify,
    /// The warm restart is still indexing segments: none is deleted or
    /// reclaimed until it is done (their live counts are not known yet).
    loading: AtomicBool,
}

impl SpillDir {
    /// Opens (creating it if needed) a spill directory of at most
    /// `max_bytes` (0: no limit).
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<SpillDir> {
        std::fs::create_dir_all(dir)?;
        let direct = probe_direct(dir);
        Ok(SpillDir {
            dir: dir.to_path_buf(),
            max_bytes: AtomicU64::new(max_bytes),
            direct,
            segments: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(1),
            used: AtomicU64::new(0),
            reclaim_mark: Mutex::new((0, Instant::now())),
            counters: SpillCounters::default(),
            last_error: Mutex::new(String::new()),
            in_flight: AtomicUsize::new(0),
            drained: tokio::sync::Notify::new(),
            loading: AtomicBool::new(false),
        })
    }

    /// Registers the segments an earlier run left (sealed, nothing live
    /// yet) without reading them, oldest first, and, if there are any,
    /// marks the directory loading: nothing is deleted until
    /// [`SpillDir::finish_loading`].
    pub fn open_segments(&self) -> io::Result<Vec<Arc<Segment>>> {
        let mut files: Vec<(u64, usize, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".seg") else {
                continue;
            };
            let Some((seq, owner)) = stem.split_once('-') else {
                continue;
            };
            if let (Ok(seq), Ok(owner)) = (u64::from_str_radix(seq, 16), owner.parse::<usize>()) {
                files.push((seq, owner, path));
            }
        }
        files.sort();
        let mut out = Vec::with_capacity(files.len());
        for (seq, owner, path) in files {
            let file = self.open_file(&path, false)?;
            let len = file.metadata()?.len();
            let segment = Arc::new(Segment {
                seq,
                owner,
                path,
                file,
                size: AtomicU64::new(len),
                live: AtomicI64::new(0),
                sealed: AtomicBool::new(true),
            });
            self.used.fetch_add(len, Relaxed);
            self.next_seq.fetch_max(seq + 1, Relaxed);
            if let Ok(mut all) = self.segments.lock() {
                all.insert(seq, Arc::clone(&segment));
            }
            out.push(segment);
        }
        self.counters.load_pending.store(out.len() as u64, Relaxed);
        self.loading.store(!out.is_empty(), Relaxed);
        Ok(out)
    }

    /// Segment `seq`, if it is still there.
    pub fn segment(&self, seq: u64) -> Option<Arc<Segment>> {
        self.segments.lock().ok()?.get(&seq).cloned()
    }

    /// Whether the warm restart is still indexing segments.
    pub fn loading(&self) -> bool {
        self.loading.load(Relaxed)
    }

    /// The warm restart indexed every segment (and every shard took its
    /// records): segments with nothing live go now.
    pub fn finish_loading(&self) {
        self.loading.store(false, Relaxed);
        self.collect();
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether files are opened with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Disk budget (0: none).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.load(Relaxed)
    }

    /// Sets the disk budget (0: none).
    pub fn set_max_bytes(&self, max: u64) {
        self.max_bytes.store(max, Relaxed);
    }

    /// Bytes free on the directory's filesystem.
    pub fn free_bytes(&self) -> io::Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: statvfs writes into the zeroed struct we own; `path` is a
        // valid NUL-terminated string for the call.
        unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::statvfs(path.as_ptr(), &mut st) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(st.f_bavail as u64 * st.f_frsize as u64)
        }
    }

    /// Bytes the segments take.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Segments on disk.
    pub fn segment_count(&self) -> usize {
        self.segments.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// How large a segment grows: [`SEGMENT_SIZE`], or a sixteenth of a
    /// small budget (at least 1 MiB) so reclaim frees space in small steps.
    pub fn segment_size(&self) -> u64 {
        match self.max_bytes() {
            0 => SEGMENT_SIZE,
            max => (max / 16).clamp(1 << 20, SEGMENT_SIZE) / ALIGN as u64 * ALIGN as u64,
        }
    }

    /// Whether `bytes` more fit the budget.
    pub fn has_room(&self, bytes: u64) -> bool {
        let max = self.max_bytes();
        max == 0 || self.used.load(Relaxed) + bytes <= max
    }

    fn open_file(&self, path: &Path, create: bool) -> io::Result<File> {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(create);
        if self.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    }

    /// Starts a new segment for `owner`.
    pub fn new_segment(&self, owner: usize) -> io::Result<Arc<Segment>> {
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let path = Segment::path_for(&self.dir, seq, owner);
        let file = self.open_file(&path, true)?;
        let segment = Arc::new(Segment {
            seq,
            owner,
            path,
            file,
            size: AtomicU64::new(0),
            live: AtomicI64::new(0),
            sealed: AtomicBool::new(false),
        });
        if let Ok(mut all) = self.segments.lock() {
            all.insert(seq, Arc::clone(&segment));
        }
        Ok(segment)
    }

    /// Reserves `len` bytes at the end of `segment` if the budget allows;
    /// returns the offset.
    pub fn reserve(&self, segment: &Segment, len: u64) -> Option<u64> {
        if !self.has_room(len) {
            return None;
        }
        self.used.fetch_add(len, Relaxed);
        Some(segment.size.fetch_add(len, Relaxed))
    }

    /// Gives back a reservation that was never written (write failed).
    pub fn unreserve(&self, len: u64) {
        self.used.fetch_sub(len, Relaxed);
    }

    /// `n` more records of `segment` are live.
    pub fn add_live(&self, segment: &Segment, n: i64) {
        segment.live.fetch_add(n, Relaxed);
    }

    /// `n` records of `segment` are no longer pointed to (a sealed
    /// segment with none left goes).
    pub fn drop_live(&self, segment: &Arc<Segment>, n: i64) {
        if segment.live.fetch_sub(n, Relaxed) == n && segment.sealed.load(Relaxed) {
            self.collect();
        }
    }

    /// No more appends to `segment`.
    pub fn seal(&self, segment: &Arc<Segment>) {
        segment.sealed.store(true, Relaxed);
        if segment.live.load(Relaxed) <= 0 {
            self.collect();
        }
    }

    /// Deletes segments oldest first while the oldest is sealed with
    /// nothing live. Never out of order: a newer segment may hold the
    /// tombstone (or the newer record) that keeps an older segment's dead
    /// record from coming back at the next warm restart.
    fn collect(&self) {
        if self.loading() {
            return;
        }
        let Ok(mut all) = self.segments.lock() else {
            return;
        };
        while let Some(entry) = all.first_entry() {
            let s = entry.get();
            if !s.sealed.load(Relaxed) || s.live.load(Relaxed) > 0 {
                break;
            }
            let s = entry.remove();
            let _ = std::fs::remove_file(&s.path);
            self.used.fetch_sub(s.size.load(Relaxed), Relaxed);
        }
    }

    /// The oldest segment, if a reclaim of it was not asked for yet: the
    /// caller asks every shard to drop or rewrite its records there (and
    /// its owner to seal it).
    /// A claim that has not freed its segment after a second is made
    /// again (a record still being written when it was asked).
    pub fn claim_oldest(&self) -> Option<u64> {
        if self.loading() {
            return None;
        }
        let seq = *self.segments.lock().ok()?.first_key_value()?.0;
        let mut mark = self.reclaim_mark.lock().ok()?;
        let fresh = mark.0 < seq || (mark.0 == seq && mark.1.elapsed().as_secs() >= 1);
        if fresh {
            *mark = (seq, Instant::now());
        }
        fresh.then_some(seq)
    }

    /// Whether the segments fill more than 90% of the budget (reclaim
    /// starts then, so rewrites still have room).
    pub fn nearly_full(&self) -> bool {
        let max = self.max_bytes();
        max != 0 && self.used.load(Relaxed) > max / 10 * 9
    }

    /// Bytes of write batches in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Relaxed)
    }

    /// A batch of `bytes` was handed to the I/O threads.
    pub fn queued(&self, bytes: usize) {
        self.in_flight.fetch_add(bytes, Relaxed);
    }

    /// A batch of `bytes` was written (or failed).
    pub fn written(&self, bytes: usize) {
        let before = self.in_flight.fetch_sub(bytes, Relaxed);
        if before >= QUEUE_SOFT && before - bytes < QUEUE_SOFT {
            self.drained.notify_waiters();
        }
    }

    /// Whether writers should wait for the disk.
    pub fn congested(&self) -> bool {
        self.in_flight() >= QUEUE_SOFT
    }

    /// Waits until the write queue is below the soft limit, or until
    /// `give_up` completes (the caller's deadline: the store sets no
    /// timers of its own).
    pub async fn drain(&self, give_up: impl std::future::Future<Output = ()>) {
        use std::future::Future;
        let mut give_up = std::pin::pin!(give_up);
        loop {
            // Made before the check: a notification between the two is
            // not missed.
            let mut notified = std::pin::pin!(self.drained.notified());
            if !self.congested() {
                return;
            }
            let gave_up = std::future::poll_fn(|cx| {
                if notified.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(false);
                }
                give_up.as_mut().poll(cx).map(|()| true)
            })
            .await;
            if gave_up {
                return;
            }
        }
    }

    /// Records an I/O error for INFO.
    pub fn note_error(&self, e: &io::Error) {
        self.counters.io_errors.fetch_add(1, Relaxed);
        if e.raw_os_error() == Some(libc::ENOSPC) {
            self.counters.disk_full.fetch_add(1, Relaxed);
        }
        if let Ok(mut last) = self.last_error.lock() {
            *last = e.to_string();
        }
        tracing::warn!("spill tier I/O error: {e}");
    }

    /// Writes `buf` (a multiple of 4096 bytes) at `offset` of `segment`.
    pub fn write(&self, segment: &Segment, offset: u64, buf: &[u8]) -> io::Result<()> {
        let started = Instant::now();
        let result = segment.file.write_all_at(buf, offset);
        let c = &self.counters;
        c.write_us
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        if result.is_ok() {
            c.write_bytes.fetch_add(buf.len() as u64, Relaxed);
        }
        result
    }

    /// Reads the record at `loc`, checks its CRC and that it is `key`'s,
    /// and returns it. `Ok(None)`: the record failed its checksum (or is
    /// not the one the index expects).
    pub fn read(&self, loc: &DiskLoc, key: &[u8]) -> io::Result<Option<record::Record>> {
        let started = Instant::now();
        let mut buf = aligned(loc.len as usize);
        loc.segment.file.read_exact_at(&mut buf, loc.offset)?;
        let c = &self.counters;
        let took = started.elapsed();
        c.reads.fetch_add(1, Relaxed);
        c.read_bytes.fetch_add(loc.len as u64, Relaxed);
        c.read_us.fetch_add(took.as_micros() as u64, Relaxed);
        c.read_latency.record(took);
        match record::decode(buf.freeze()) {
            Some(r) if !r.tombstone && r.value.len() == loc.value_len as usize && r.key == key => {
                Ok(Some(r))
            }
            _ => {
                c.checksum_failures.fetch_add(1, Relaxed);
                tracing::warn!(
                    "spill tier: checksum failure in {} at offset {}",
                    loc.segment.path.display(),
                    loc.offset
                );
                Ok(None)
            }
        }
    }
}

/// A zeroed buffer of `len` bytes whose start is 4096-aligned (O_DIRECT).
pub fn aligned(len: usize) -> BytesMut {
    let mut buf = BytesMut::with_capacity(len + ALIGN);
    let misalign = buf.as_ptr() as usize % ALIGN;
    let skip = if misalign == 0 { 0 } else { ALIGN - misalign };
    buf.resize(skip + len, 0);
    let _ = buf.split_to(skip);
    buf
}

/// Whether the filesystem of `dir` accepts O_DIRECT (tmpfs does not).
fn probe_direct(dir: &Path) -> bool {
    let path = dir.join(".o_direct_probe");
    let ok = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .and_then(|f| f.write_all_at(&aligned(ALIGN), 0))
        .is_ok();
    let _ = std::fs::remove_file(&path);
    ok
}

/// A job for an I/O thread.
pub type IoJob = Box<dyn FnOnce() + Send>;

/// Dedicated threads for disk I/O, shared by all shards.
pub struct IoPool {
    tx: Mutex<mpsc::Sender<IoJob>>,
    threads: usize,
}

impl IoPool {
    /// Starts `threads` I/O threads.
    pub fn start(threads: usize) -> IoPool {
        let (tx, rx) = mpsc::channel::<IoJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let _ = std::thread::Builder::new()
                .name(format!("kvtier-io-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
        }
        IoPool {
            tx: Mutex::new(tx),
            threads,
        }
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Queues a job.
    pub fn submit(&self, job: IoJob) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(job);
        }
    }
}

/// Whether two places are the same record.
pub fn same_loc(a: &DiskLoc, b: &DiskLoc) -> bool {
    a.segment.seq == b.segment.seq && a.offset == b.offset
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvtier-spill-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn segments_go_oldest_first_so_tombstones_outlive_what_they_kill() {
        let path = dir("order");
        let d = SpillDir::open(&path, 0).unwrap();
        let old = d.new_segment(0).unwrap();
        d.add_live(&old, 1);
        d.seal(&old);
        // A newer segment holding only a tombstone: nothing live in it, but
        // it must stay while the older segment (with the dead record the
        // tombstone stands for) is there.
        let newer = d.new_segment(1).unwrap();
        d.reserve(&newer, 4096).unwrap();
        d.seal(&newer);
        assert_eq!(d.segment_count(), 2);
        d.drop_live(&old, 1);
        assert_eq!(d.segment_count(), 0, "both go once the oldest is empty");
        assert_eq!(d.used_bytes(), 0);
        // A reclaim claims the oldest segment once, and again only after a
        // second without progress.
        let s = d.new_segment(0).unwrap();
        assert_eq!(d.claim_oldest(), Some(s.seq));
        assert_eq!(d.claim_oldest(), None);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn budget_and_live_counts_delete_segments() {
        let path = dir("budget");
        let d = SpillDir::open(&path, 3 * 4096).unwrap();
        let seg = d.new_segment(0).unwrap();
        assert_eq!(d.reserve(&seg, 8192), Some(0));
        assert_eq!(d.reserve(&seg, 8192), None, "over the disk budget");
        d.add_live(&seg, 1);
        d.seal(&seg);
        assert_eq!(d.segment_count(), 1);
        d.drop_live(&seg, 1);
        assert_eq!(d.segment_count(), 0);
        assert_eq!(d.used_bytes(), 0);
        let _ = std::fs::remove_dir_all(&path);
    }
}
