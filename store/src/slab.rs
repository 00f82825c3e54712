//! The DRAM tier's memory: a per-shard slab arena of large pages carved into
//! size classes fitted to the values actually stored.
//!
//! ```text
//!  page (8 MiB, one mmap, one size class at a time)
//!  ┌──────────┬──────────┬──────────┬──────────┐
//!  │ slot 0   │ slot 1   │ slot 2   │ slot 3   │   class 2 MiB: 4 slots, no waste
//!  └──────────┴──────────┴──────────┴──────────┘
//!  slot state (AtomicU32, one per slot):
//!  ┌───────┬──────────────────────────────────┐
//!  │ bit31 │ bits 0..30                       │
//!  │STORED │ leases: replies/waiters reading  │
//!  └───────┴──────────────────────────────────┘
//! ```
//!
//! * A value of `len` bytes goes to a class whose slot size is `len` rounded
//!   up to 512 bytes, or to an existing class at most 1/32 larger (so
//!   64 KiB, 256 KiB and 2 MiB blocks get exact classes and a page of them
//!   wastes nothing). Values above a quarter page get a dedicated span;
//!   a span whose value is gone stays mapped in a pool (up to the store's
//!   budget, or [`FREE_SPANS`] without one) for the next value of its
//!   size, so a tier full of large blocks does not pay an mmap, a fault per
//!   4 KiB and a munmap for every write (the pool's bytes count as mapped,
//!   as empty pages do, and are given back first when the budget needs
//!   room).
//! * Reads never copy: [`SlotRef::bytes`] takes a *lease* on the slot
//!   (`STORED` + one lease) and wraps it in `Bytes::from_owner`. The index
//!   holds the `STORED` bit. A slot returns to its class's free list only when
//!   the index dropped it **and** the last lease ended, whichever happens last
//!   (the last one reports it on the arena's release queue, from any thread).
//! * Pages are mapped lazily up to the budget the store allows. When a class
//!   needs a slot and no page can be mapped, an empty page of another class
//!   is re-carved for it (rebalancing); the store evicts to empty pages.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Bit of a slot state: the index holds the slot.
const STORED: u32 = 1 << 31;
/// Slot sizes are multiples of this (and values are placed at multiples).
pub const SLOT_ALIGN: usize = 512;
/// Default page size.
pub const DEFAULT_PAGE_SIZE: usize = 8 << 20;
/// Most size classes per arena.
const MAX_CLASSES: usize = 128;
/// Spans kept mapped for reuse after their value is gone, with no byte
/// limit set ([`SlabArena::set_span_pool_limit`]).
pub const FREE_SPANS: usize = 16;

/// An anonymous memory mapping.
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is plain memory; who may read or write which bytes is
// decided by the slot states, which are atomics.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// No memory: what a span's page holds once its mapping went back to
    /// the pool.
    fn none() -> Region {
        Region {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    fn map(len: usize, hugepages: bool, prealloc: bool) -> io::Result<Region> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched. The result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let region = Region {
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        };
        if hugepages {
            // SAFETY: advice on the mapping we own; failure only means no THP.
            unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        }
        if prealloc {
            // SAFETY: the mapping is ours and `len` long; touching one byte
            // per OS page faults it in. mlock failing (limits) is tolerated.
            unsafe {
                let base = region.ptr.as_ptr();
                for off in (0..len).step_by(4096) {
                    base.add(off).write_volatile(0);
                }
                libc::mlock(ptr, len);
            }
        }
        Ok(region)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: unmaps exactly the mapping created in `map`; no lease can
        // outlive it because leases hold the page's Arc.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The arena's dedicated spans: the bytes mapped for them (values and the
/// pool) and the pool of spans whose value is gone, shared with every
/// span's page (its last holder may let go on any thread).
struct SpanPool {
    bytes: AtomicUsize,
    free: Mutex<Vec<Region>>,
    /// Most bytes pooled (0: at most FREE_SPANS spans).
    limit: AtomicUsize,
}

impl SpanPool {
    /// A pooled span of at least `len` bytes and at most 1/32 more.
    fn take(&self, len: usize) -> Option<Region> {
        let mut free = self.free.lock().ok()?;
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, r)| r.len >= len && r.len <= len + len / 32)
            .min_by_key(|(_, r)| r.len)
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    fn fits(&self, len: usize) -> bool {
        self.free
            .lock()
            .is_ok_and(|f| f.iter().any(|r| r.len >= len && r.len <= len + len / 32))
    }

    /// Keeps `region` for reuse, or unmaps it when the pool is full.
    fn give_back(&self, region: Region) {
        let len = region.len;
        let limit = self.limit.load(Ordering::Relaxed);
        let kept = match self.free.lock() {
            Ok(mut free) => {
                let room = if limit == 0 {
                    free.len() < FREE_SPANS
                } else {
                    free.iter().map(|r| r.len).sum::<usize>() + len <= limit
                };
                if room {
                    free.push(region);
                }
                room
            }
            Err(_) => false,
        };
        if !kept {
            self.bytes.fetch_sub(len, Ordering::AcqRel);
        }
    }

    /// Unmaps pooled spans until `bytes` were given back (or none is
    /// left); returns the bytes given back.
    fn unmap(&self, bytes: usize) -> usize {
        let mut freed = 0;
        while freed < bytes {
            let Some(region) = self.free.lock().ok().and_then(|mut f| f.pop()) else {
                break;
            };
            freed += region.len;
            self.bytes.fetch_sub(region.len, Ordering::AcqRel);
        }
        freed
    }
}

/// The part of a page that readers share: its memory and slot states.
pub struct PageMem {
    region: Region,
    /// A span's value adopted as it arrived (its own allocation), instead
    /// of mapped memory: `region` is then empty.
    adopted: Option<Bytes>,
    states: Box<[AtomicU32]>,
    id: u32,
    released: Arc<Mutex<Vec<(u32, u32)>>>,
    /// For dedicated spans: the arena's spans, which take the mapping back
    /// once its value and every reader let go.
    spans: Option<Arc<SpanPool>>,
}

impl Drop for PageMem {
    fn drop(&mut self) {
        let Some(spans) = &self.spans else { return };
        match &self.adopted {
            Some(value) => {
                spans.bytes.fetch_sub(value.len(), Ordering::AcqRel);
            }
            None => spans.give_back(std::mem::replace(&mut self.region, Region::none())),
        }
    }
}

impl PageMem {
    /// The first byte of the page's memory.
    fn base(&self) -> *const u8 {
        match &self.adopted {
            Some(value) => value.as_ptr(),
            None => self.region.ptr.as_ptr(),
        }
    }

    fn report_free(&self, slot: u32) {
        if self.spans.is_none() {
            if let Ok(mut q) = self.released.lock() {
                q.push((self.id, slot));
            }
        }
    }
}

/// A reader's hold on a slot: keeps its bytes alive and unreusable.
struct Lease {
    page: Arc<PageMem>,
    slot: u32,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: offset + len lies inside the page's mapping (checked when
        // the slot was handed out); the lease keeps the slot from being
        // reused, so nobody writes these bytes while the slice lives.
        unsafe { std::slice::from_raw_parts(self.page.base().add(self.offset), self.len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let prev = self.page.states[self.slot as usize].fetch_sub(1, Ordering::AcqRel);
        if prev == 1 {
            // Last lease of a slot the index already dropped.
            self.page.report_free(self.slot);
        }
    }
}

/// The index's handle on a stored value (exactly one per slot in use).
pub struct SlotRef {
    page: Arc<PageMem>,
    slot: u32,
    offset: usize,
    len: usize,
    /// Bytes the slot (or span) occupies.
    capacity: usize,
}

impl SlotRef {
    /// The value, zero-copy: a `Bytes` that leases the slot until dropped.
    pub fn bytes(&self) -> Bytes {
        self.page.states[self.slot as usize].fetch_add(1, Ordering::AcqRel);
        Bytes::from_owner(Lease {
            page: Arc::clone(&self.page),
            slot: self.slot,
            offset: self.offset,
            len: self.len,
        })
    }

    /// Value length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value's bytes, borrowed: valid while this handle lives, since the
    /// index's hold keeps the slot from being reused.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: offset + len lies inside the page's mapping (checked when
        // the slot was handed out), and the STORED bit this handle owns keeps
        // the slot from being reused, so the bytes are not written while
        // borrowed from `self`.
        unsafe { std::slice::from_raw_parts(self.page.base().add(self.offset), self.len) }
    }

    /// Bytes of memory the value occupies: its slot, or its span.
    pub fn footprint(&self) -> usize {
        self.capacity
    }

    /// The (page, slot) of a value in a page; `None` for spans.
    pub fn page_location(&self) -> Option<(u32, u32)> {
        (self.page.spans.is_none()).then_some((self.page.id, self.slot))
    }

    /// Whether a reply or waiter currently holds the value.
    pub fn is_held(&self) -> bool {
        self.page.states[self.slot as usize].load(Ordering::Acquire) & !STORED != 0
    }

    /// The page and slot (for the arena's per-page key lists).
    pub fn location(&self) -> (u32, u32) {
        (self.page.id, self.slot)
    }

    /// Whether the value lives in a dedicated span.
    pub fn in_span(&self) -> bool {
        self.page.spans.is_some()
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let prev = self.page.states[self.slot as usize].fetch_and(!STORED, Ordering::AcqRel);
        if prev == STORED {
            // No reader: the slot is free now.
            self.page.report_free(self.slot);
        }
    }
}

impl std::fmt::Debug for SlotRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SlotRef(page {}, slot {}, {} bytes)",
            self.page.id, self.slot, self.len
        )
    }
}

struct Page {
    mem: Arc<PageMem>,
    class: Option<usize>,
    free: Vec<u32>,
    slots: u32,
}

/// One size class.
#[derive(Clone, Debug, Default)]
pub struct ClassStats {
    /// Slot size in bytes.
    pub slot_size: usize,
    /// Pages carved into this class.
    pub pages: usize,
    /// Slots holding values (or still leased after deletion).
    pub used: usize,
    /// Free slots in this class's pages.
    pub free: usize,
}

/// Figures for INFO slabs and MEMORY STATS.
#[derive(Clone, Debug, Default)]
pub struct ArenaStats {
    /// Bytes mapped for pages.
    pub page_bytes: usize,
    /// Bytes mapped for dedicated spans (with the pool of spans kept for
    /// reuse).
    pub span_bytes: usize,
    /// Spans kept mapped for the next value of their size.
    pub free_spans: usize,
    /// Their bytes (part of `span_bytes`).
    pub free_span_bytes: usize,
    /// Pages mapped.
    pub pages: usize,
    /// Pages re-carved for another class.
    pub rebalanced_pages: u64,
    /// Per class.
    pub classes: Vec<ClassStats>,
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// The class needs a page and the store's budget has none to give:
    /// evict (preferably in `class`) and retry.
    Full {
        /// The class that needs a slot.
        class: usize,
    },
    /// The system refused memory.
    Mmap,
}

/// A per-shard slab arena.
pub struct SlabArena {
    page_size: usize,
    hugepages: bool,
    prealloc: bool,
    /// Pages by id; `None` where a page was unmapped (its id is reused).
    pages: Vec<Option<Page>>,
    classes: Vec<ClassStats>,
    /// Pages with free slots, per class.
    partial: Vec<Vec<u32>>,
    released: Arc<Mutex<Vec<(u32, u32)>>>,
    spans: Arc<SpanPool>,
    rebalanced: u64,
}

impl SlabArena {
    /// An empty arena with pages of `page_size` bytes.
    pub fn new(page_size: usize, hugepages: bool, prealloc: bool) -> SlabArena {
        SlabArena {
            page_size: page_size.max(SLOT_ALIGN * 4),
            hugepages,
            prealloc,
            pages: Vec::new(),
            classes: Vec::new(),
            partial: Vec::new(),
            released: Arc::new(Mutex::new(Vec::new())),
            spans: Arc::new(SpanPool {
                bytes: AtomicUsize::new(0),
                free: Mutex::new(Vec::new()),
                limit: AtomicUsize::new(0),
            }),
            rebalanced: 0,
        }
    }

    /// How many bytes of spans whose value is gone stay mapped for reuse
    /// (the store's budget: they count against it and go first when it
    /// needs room); 0: at most [`FREE_SPANS`] spans.
    pub fn set_span_pool_limit(&mut self, bytes: usize) {
        self.spans.limit.store(bytes, Ordering::Relaxed);
    }

    /// Page size.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages mapped.
    fn page_count(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }

    /// Bytes mapped (pages plus spans still alive).
    pub fn mapped_bytes(&self) -> usize {
        self.page_count() * self.page_size + self.spans.bytes.load(Ordering::Acquire)
    }

    fn page(&self, id: u32) -> Option<&Page> {
        self.pages.get(id as usize).and_then(|p| p.as_ref())
    }

    fn page_mut(&mut self, id: u32) -> Option<&mut Page> {
        self.pages.get_mut(id as usize).and_then(|p| p.as_mut())
    }

    /// What a value of `len` bytes will cost in mapped memory if it needs
    /// new memory: a page, or its own span.
    pub fn growth_for(&self, len: usize) -> usize {
        if self.is_span(len) {
            if self.spans.fits(span_len(len)) {
                0
            } else {
                span_len(len)
            }
        } else {
            self.page_size
        }
    }

    fn is_span(&self, len: usize) -> bool {
        align(len.max(1)) > self.page_size / 4
    }

    /// The class a value of `len` bytes goes to (creating it if needed).
    fn class_for(&mut self, len: usize) -> usize {
        if let Some(i) = self.class_of_len(len) {
            return i;
        }
        self.classes.push(ClassStats {
            slot_size: align(len.max(1)),
            ..ClassStats::default()
        });
        self.partial.push(Vec::new());
        self.classes.len() - 1
    }

    /// Returns slots freed by dropped index handles and ended leases to
    /// their classes; empty pages become available to every class.
    pub fn reclaim(&mut self) {
        let released = match self.released.lock() {
            Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
            _ => return,
        };
        for (page_id, slot) in released {
            let Some(page) = self
                .pages
                .get_mut(page_id as usize)
                .and_then(|p| p.as_mut())
            else {
                continue;
            };
            let Some(class) = page.class else { continue };
            if page.free.is_empty() {
                self.partial[class].push(page_id);
            }
            page.free.push(slot);
            self.classes[class].used -= 1;
            self.classes[class].free += 1;
        }
    }

    /// Takes a slot for a value of `value.len()` bytes, copies the value in,
    /// and returns the index's handle. `may_map` says whether the store's
    /// budget allows mapping `growth_for(len)` more bytes.
    pub fn store(&mut self, value: &[u8], may_map: bool) -> Result<SlotRef, NoRoom> {
        self.store_contents(value.len(), Some(value), may_map)
    }

    /// Takes a slot for `len` bytes and writes nothing in it: a block the
    /// policy simulator accounts for by its size (the slot's memory is
    /// mapped but never touched, so it costs no resident memory).
    pub fn store_unwritten(&mut self, len: usize, may_map: bool) -> Result<SlotRef, NoRoom> {
        self.store_contents(len, None, may_map)
    }

    fn store_contents(
        &mut self,
        len: usize,
        value: Option<&[u8]>,
        may_map: bool,
    ) -> Result<SlotRef, NoRoom> {
        self.reclaim();
        if self.is_span(len) {
            return self.store_span(len, value, may_map);
        }
        let class = self.class_for(len);
        let page_id = match self.partial[class].last().copied() {
            Some(p) => p,
            None => self.page_for(class, may_map)?,
        };
        let slot_size = self.classes[class].slot_size;
        let page = self.page_mut(page_id).ok_or(NoRoom::Full { class })?;
        let slot = page.free.pop().ok_or(NoRoom::Full { class })?;
        let page_full = page.free.is_empty();
        let mem = Arc::clone(&page.mem);
        if page_full {
            self.partial[class].retain(|&p| p != page_id);
        }
        self.classes[class].used += 1;
        self.classes[class].free -= 1;
        let offset = slot as usize * slot_size;
        let prev = mem.states[slot as usize].swap(STORED, Ordering::AcqRel);
        debug_assert_eq!(prev, 0, "a free slot has no holder");
        if let Some(value) = value {
            // SAFETY: the slot was free (state 0: no index handle, no lease),
            // so nobody reads or writes these bytes; offset + len is inside
            // the page because slot < page_size / slot_size and
            // len = value.len() <= slot_size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    value.as_ptr(),
                    mem.region.ptr.as_ptr().add(offset),
                    len,
                );
            }
        }
        Ok(SlotRef {
            page: mem,
            slot,
            offset,
            len,
            capacity: slot_size,
        })
    }

    /// The bytes a value of `len` would take once stored: its span, or a
    /// slot of the class it would go to ([`SlabArena::class_of_len`], or
    /// a new class of its aligned size).
    pub fn footprint_for(&self, len: usize) -> usize {
        if self.is_span(len) {
            return span_len(len);
        }
        self.class_of_len(len)
            .map_or(align(len.max(1)), |i| self.classes[i].slot_size)
    }

    /// Whether a value of `len` bytes gets a span of its own rather than a
    /// slot.
    pub fn takes_span(&self, len: usize) -> bool {
        self.is_span(len)
    }

    /// Keeps `value` itself as a span: the value arrived in an allocation of
    /// its own (a request argument read into a buffer of its exact size), so
    /// it is stored without a copy, and counted as span memory until its
    /// last holder lets go. The caller checked that the budget has room.
    pub fn adopt(&mut self, value: Bytes) -> SlotRef {
        let len = value.len();
        self.spans.bytes.fetch_add(len, Ordering::AcqRel);
        let mem = Arc::new(PageMem {
            region: Region::none(),
            adopted: Some(value),
            states: vec![AtomicU32::new(STORED)].into_boxed_slice(),
            id: u32::MAX,
            released: Arc::clone(&self.released),
            spans: Some(Arc::clone(&self.spans)),
        });
        SlotRef {
            page: mem,
            slot: 0,
            offset: 0,
            len,
            capacity: len,
        }
    }

    /// A span for the value: a pooled one of its size, else a new mapping
    /// when `may_map`.
    fn store_span(
        &mut self,
        value_len: usize,
        value: Option<&[u8]>,
        may_map: bool,
    ) -> Result<SlotRef, NoRoom> {
        let len = span_len(value_len);
        let region = match self.spans.take(len) {
            Some(region) => region,
            None if may_map => {
                let region = Region::map(len, self.hugepages, false).map_err(|_| NoRoom::Mmap)?;
                self.spans.bytes.fetch_add(len, Ordering::AcqRel);
                region
            }
            None => return Err(NoRoom::Full { class: usize::MAX }),
        };
        if let Some(value) = value {
            // SAFETY: the span is `region.len >= len >= value.len()` bytes
            // long and nobody else can see it: just mapped, or taken from
            // the pool, where it went once its last holder let go.
            unsafe {
                std::ptr::copy_nonoverlapping(value.as_ptr(), region.ptr.as_ptr(), value.len());
            }
        }
        let capacity = region.len;
        let mem = Arc::new(PageMem {
            region,
            adopted: None,
            states: vec![AtomicU32::new(STORED)].into_boxed_slice(),
            id: u32::MAX,
            released: Arc::clone(&self.released),
            spans: Some(Arc::clone(&self.spans)),
        });
        Ok(SlotRef {
            page: mem,
            slot: 0,
            offset: 0,
            len: value_len,
            capacity,
        })
    }

    /// A page with a free slot for `class`: a new page if allowed, else an
    /// empty page of another class re-carved (rebalancing).
    fn page_for(&mut self, class: usize, may_map: bool) -> Result<u32, NoRoom> {
        let slot_size = self.classes[class].slot_size;
        let slots = (self.page_size / slot_size) as u32;
        // An empty page of another class (nothing stored, nothing leased,
        // so the arena holds the only reference to its memory).
        let reusable = self.pages.iter().position(|p| {
            p.as_ref().is_some_and(|p| {
                p.class
                    .is_none_or(|c| c != class && p.free.len() as u32 == p.slots)
                    && Arc::strong_count(&p.mem) == 1
            })
        });
        let page_id = match (reusable, may_map) {
            (Some(id), _) => {
                let id = id as u32;
                let (old_class, free) = self
                    .page(id)
                    .map(|p| (p.class, p.free.len()))
                    .unwrap_or((None, 0));
                if let Some(old) = old_class {
                    self.classes[old].pages -= 1;
                    self.classes[old].free -= free;
                    self.partial[old].retain(|&p| p != id);
                    self.rebalanced += 1;
                }
                id
            }
            (None, true) => self.map_page().map_err(|_| NoRoom::Mmap)?,
            (None, false) => return Err(NoRoom::Full { class }),
        };
        let page = self.page_mut(page_id).ok_or(NoRoom::Full { class })?;
        // One state per slot of the new carving.
        let mem = Arc::get_mut(&mut page.mem).ok_or(NoRoom::Full { class })?;
        mem.states = (0..slots).map(|_| AtomicU32::new(0)).collect();
        page.class = Some(class);
        page.slots = slots;
        page.free = (0..slots).rev().collect();
        self.classes[class].pages += 1;
        self.classes[class].free += slots as usize;
        self.partial[class].push(page_id);
        Ok(page_id)
    }

    /// Maps a new, uncarved page; returns its id.
    fn map_page(&mut self) -> io::Result<u32> {
        let region = Region::map(self.page_size, self.hugepages, self.prealloc)?;
        let id = self
            .pages
            .iter()
            .position(|p| p.is_none())
            .unwrap_or(self.pages.len()) as u32;
        let page = Page {
            mem: Arc::new(PageMem {
                region,
                adopted: None,
                states: Box::new([]),
                id,
                released: Arc::clone(&self.released),
                spans: None,
            }),
            class: None,
            free: Vec::new(),
            slots: 0,
        };
        if id as usize == self.pages.len() {
            self.pages.push(Some(page));
        } else {
            self.pages[id as usize] = Some(page);
        }
        Ok(id)
    }

    /// Maps `count` pages ahead of need (`--prealloc`).
    pub fn reserve(&mut self, count: usize) -> io::Result<()> {
        for _ in 0..count {
            self.map_page()?;
        }
        Ok(())
    }

    /// Unmaps pooled spans, then pages with nothing stored and nothing
    /// leased, up to `bytes` worth; returns the bytes given back.
    pub fn unmap_empty(&mut self, bytes: usize) -> usize {
        self.reclaim();
        let mut freed = self.spans.unmap(bytes);
        for i in 0..self.pages.len() {
            if freed >= bytes {
                break;
            }
            let empty = self.pages[i]
                .as_ref()
                .is_some_and(|p| p.free.len() as u32 == p.slots && Arc::strong_count(&p.mem) == 1);
            if !empty {
                continue;
            }
            if let Some(page) = self.pages[i].take() {
                if let Some(class) = page.class {
                    self.classes[class].pages -= 1;
                    self.classes[class].free -= page.free.len();
                    self.partial[class].retain(|&p| p != i as u32);
                }
                freed += self.page_size;
            }
        }
        freed
    }

    /// The best page to empty for another use: of a class other than
    /// `keep` (any class when `None`), with the fewest values in use and
    /// none of them leased (a page a reader holds cannot be reused however
    /// many keys are evicted from it); returns its id and the slots in use.
    pub fn page_to_empty(&self, keep: Option<usize>) -> Option<(u32, Vec<u32>)> {
        self.pages
            .iter()
            .flatten()
            .filter(|p| p.class.is_some() && p.class != keep)
            .filter(|p| (p.free.len() as u32) < p.slots)
            .filter(|p| {
                !p.mem
                    .states
                    .iter()
                    .any(|s| s.load(Ordering::Acquire) & !STORED != 0)
            })
            .min_by_key(|p| p.slots as usize - p.free.len())
            .map(|p| {
                let mut in_use = vec![true; p.slots as usize];
                for &f in &p.free {
                    in_use[f as usize] = false;
                }
                let used = (0..p.slots).filter(|&s| in_use[s as usize]).collect();
                (p.mem.id, used)
            })
    }

    /// The class a value of `len` bytes would use, if it exists (no span):
    /// the smallest within a 32nd above its aligned size, or, with every
    /// class in use, the smallest it fits.
    pub fn class_of_len(&self, len: usize) -> Option<usize> {
        let want = align(len.max(1));
        let fitting = || {
            self.classes
                .iter()
                .enumerate()
                .filter(move |(_, c)| c.slot_size >= want)
        };
        let near = fitting()
            .filter(|(_, c)| c.slot_size <= want + want / 32)
            .min_by_key(|(_, c)| c.slot_size);
        // Too many distinct sizes: the smallest class that fits.
        let any = || match self.classes.len() >= MAX_CLASSES {
            true => fitting().min_by_key(|(_, c)| c.slot_size),
            false => None,
        };
        near.or_else(any).map(|(i, _)| i)
    }

    /// The class of page `page` (None for spans and unassigned pages).
    pub fn class_of_page(&self, page: u32) -> Option<usize> {
        self.page(page).and_then(|p| p.class)
    }

    /// Figures for reporting.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            page_bytes: self.page_count() * self.page_size,
            span_bytes: self.spans.bytes.load(Ordering::Acquire),
            free_spans: self.spans.free.lock().map_or(0, |f| f.len()),
            free_span_bytes: self
                .spans
                .free
                .lock()
                .map_or(0, |f| f.iter().map(|r| r.len).sum()),
            pages: self.page_count(),
            rebalanced_pages: self.rebalanced,
            classes: self.classes.clone(),
        }
    }
}

fn align(len: usize) -> usize {
    len.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

fn span_len(len: usize) -> usize {
    len.div_ceil(4096) * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn power_of_two_blocks_fill_pages_exactly() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let refs: Vec<SlotRef> = (0..16)
            .map(|i| a.store(&value(64 * 1024, i), true).unwrap())
            .collect();
        let s = a.stats();
        assert_eq!(s.pages, 1, "16 × 64 KiB fill one 1 MiB page");
        assert_eq!(s.classes[0].slot_size, 64 * 1024);
        assert_eq!(s.classes[0].used, 16);
        for (i, r) in refs.iter().enumerate() {
            assert_eq!(&r.bytes()[..], &value(64 * 1024, i as u8)[..]);
        }
    }

    #[test]
    fn slots_are_reused_only_after_index_and_leases_let_go() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let r = a.store(&value(256 * 1024, 1), true).unwrap();
        let held = r.bytes();
        assert!(r.is_held());
        drop(r); // the index lets go; a reply still holds the value
        let _others: Vec<SlotRef> = (0..3)
            .map(|i| a.store(&value(256 * 1024, 10 + i), true).unwrap())
            .collect();
        // The page (4 slots) is full: the held slot is not reusable yet.
        assert_eq!(
            a.store(&value(256 * 1024, 20), false).unwrap_err(),
            NoRoom::Full { class: 0 }
        );
        assert_eq!(&held[..], &value(256 * 1024, 1)[..], "held bytes unchanged");
        drop(held);
        let again = a.store(&value(256 * 1024, 21), false).unwrap();
        assert_eq!(&again.bytes()[..], &value(256 * 1024, 21)[..]);
    }

    #[test]
    fn empty_pages_move_to_the_class_that_needs_them() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let small: Vec<SlotRef> = (0..16)
            .map(|i| a.store(&value(64 * 1024, i), true).unwrap())
            .collect();
        assert_eq!(
            a.store(&value(256 * 1024, 0), false).unwrap_err(),
            NoRoom::Full { class: 1 }
        );
        drop(small);
        let big = a.store(&value(256 * 1024, 7), false).unwrap();
        assert_eq!(&big.bytes()[..], &value(256 * 1024, 7)[..]);
        let s = a.stats();
        assert_eq!((s.pages, s.rebalanced_pages), (1, 1));
        assert_eq!(s.classes[1].pages, 1);
        assert_eq!(s.classes[0].pages, 0);
    }

    #[test]
    fn a_value_in_its_own_buffer_is_kept_without_a_copy() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let value = Bytes::from(value(700 * 1024, 5));
        let r = a.adopt(value.clone());
        assert!(r.in_span());
        assert_eq!(r.as_slice().as_ptr(), value.as_ptr(), "copied");
        assert_eq!(a.stats().span_bytes, 700 * 1024);
        let read = r.bytes();
        assert_eq!(read.as_ptr(), value.as_ptr());
        drop(r);
        drop(value);
        assert_eq!(a.stats().span_bytes, 700 * 1024, "still leased");
        assert_eq!(&read[..10], &super::tests::value(700 * 1024, 5)[..10]);
        drop(read);
        // Its memory goes back to the allocator, not to the span pool.
        assert_eq!((a.stats().span_bytes, a.stats().free_spans), (0, 0));
    }

    #[test]
    fn big_values_get_spans_reused_after_the_last_reader() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let r = a.store(&value(700 * 1024, 3), true).unwrap();
        assert!(r.in_span());
        assert_eq!(a.stats().span_bytes, 700 * 1024);
        let held = r.bytes();
        drop(r);
        assert_eq!(a.stats().free_spans, 0, "still leased");
        drop(held);
        // Pooled: still mapped, no growth needed for a value of its size.
        assert_eq!(
            (a.stats().span_bytes, a.stats().free_spans),
            (700 * 1024, 1)
        );
        assert_eq!(a.growth_for(700 * 1024 - 100), 0);
        assert_eq!(a.growth_for(900 * 1024), 900 * 1024);
        // A value of that size takes it, even with no room to map more; its
        // bytes are the new value's.
        let again = a.store(&value(700 * 1024 - 100, 9), false).unwrap();
        assert_eq!(again.as_slice(), &value(700 * 1024 - 100, 9)[..]);
        assert_eq!(
            (a.stats().span_bytes, a.stats().free_spans),
            (700 * 1024, 0)
        );
        assert_eq!(again.footprint(), 700 * 1024);
        // No pooled span of the size, no room: the store must evict.
        assert_eq!(
            a.store(&value(900 * 1024, 1), false).unwrap_err(),
            NoRoom::Full { class: usize::MAX }
        );
        drop(again);
        // The budget's need for room unmaps pooled spans first.
        assert_eq!(a.unmap_empty(1), 700 * 1024);
        assert_eq!((a.stats().span_bytes, a.stats().free_spans), (0, 0));
        // The pool keeps at most FREE_SPANS.
        let many: Vec<SlotRef> = (0..FREE_SPANS + 3)
            .map(|i| a.store(&value(600 * 1024, i as u8), true).unwrap())
            .collect();
        drop(many);
        assert_eq!(a.stats().free_spans, FREE_SPANS);
        assert_eq!(a.stats().span_bytes, FREE_SPANS * 600 * 1024);
    }

    #[test]
    fn leases_dropped_on_other_threads_come_back() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let r = a.store(&value(128 * 1024, 1), true).unwrap();
        let held = r.bytes();
        drop(r);
        std::thread::spawn(move || drop(held)).join().unwrap();
        a.reclaim();
        assert_eq!(a.stats().classes[0].used, 0);
    }

    #[test]
    fn odd_sizes_share_near_classes() {
        let mut a = SlabArena::new(1 << 20, false, false);
        let _x = a.store(&value(10_000, 1), true).unwrap();
        let _y = a.store(&value(10_100, 1), true).unwrap();
        assert_eq!(a.stats().classes.len(), 1, "10100 fits the 10240 class");
        let _z = a.store(&value(20_000, 1), true).unwrap();
        assert_eq!(a.stats().classes.len(), 2);
    }
}
