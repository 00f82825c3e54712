//! What the index holds per key: the value (on the heap when small, in the
//! slab arena when a block) and the bookkeeping expiry, eviction and the
//! chain links need.

use std::ops::Deref;

use bytes::Bytes;

use crate::slab::SlotRef;
use crate::spill::DiskLoc;

/// Index bytes charged per key besides the key and value themselves: the
/// hash-table slot (key handle + entry), control byte and allocator headers.
pub const ENTRY_OVERHEAD: usize = 128;
/// Extra bytes charged per key that has a time to live (expiry-set node).
pub const EXPIRE_OVERHEAD: usize = 48;
/// Values at least this long are stored in the slab arena.
pub const SLAB_MIN: usize = 4096;
/// Values at least this long that get a span of their own are kept in the
/// buffer they arrived in rather than copied (the protocol reads every
/// argument of 32 KiB or more into a buffer of its exact size: nothing else
/// shares that allocation).
pub const ADOPT_MIN: usize = 32 * 1024;

/// Index bytes charged for one key (values in the slab are charged
/// through the arena).
pub fn charge(key_len: usize, value_len: usize, volatile: bool) -> usize {
    key_len + value_len + ENTRY_OVERHEAD + if volatile { EXPIRE_OVERHEAD } else { 0 }
}

/// How a string is reported by OBJECT ENCODING.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `int` when the value is an integer, else `embstr`/`raw` by length.
    Auto,
    /// `embstr`/`raw` by length, never `int` (INCRBYFLOAT results).
    NoInt,
    /// Always `raw` (values APPEND and SETRANGE built).
    Raw,
}

/// A stored value.
#[derive(Debug)]
pub enum Value {
    /// A small value in memory of its own.
    Heap(Bytes),
    /// A block in the slab arena.
    Slab(SlotRef),
    /// A block on its way to the spill tier: its record is in a write batch
    /// (reads are served from the batch), its place on disk reserved.
    Writing(Box<InFlight>),
    /// A block in the spill tier only: reading it takes a disk read.
    Spilled(DiskLoc),
    /// A block back in the slab arena whose record on disk is still good:
    /// evicting it again costs no write.
    Cached(Box<Cached>),
}

/// A block whose record is being written.
#[derive(Debug)]
pub struct InFlight {
    /// The value, inside the batch's record.
    pub data: Bytes,
    /// Where the record goes.
    pub loc: DiskLoc,
}

/// A block in DRAM with a clean copy on disk.
#[derive(Debug)]
pub struct Cached {
    /// The DRAM copy.
    pub slot: SlotRef,
    /// The disk copy.
    pub loc: DiskLoc,
}

impl Value {
    /// The value as `Bytes` for a reply or another shard: a clone of the
    /// heap handle, or a lease on the slab slot (no copy either way).
    /// `None` for a value that is only on disk: read it through the store
    /// (`Store::read_value`, or `Store::materialize` first).
    pub fn bytes(&self) -> Option<Bytes> {
        match self {
            Value::Heap(b) => Some(b.clone()),
            Value::Slab(r) => Some(r.bytes()),
            Value::Cached(c) => Some(c.slot.bytes()),
            Value::Writing(w) => Some(w.data.clone()),
            Value::Spilled(_) => None,
        }
    }

    /// The value's length (known without reading a spilled block).
    pub fn len(&self) -> usize {
        match self {
            Value::Heap(b) => b.len(),
            Value::Slab(r) => r.len(),
            Value::Cached(c) => c.slot.len(),
            Value::Writing(w) => w.data.len(),
            Value::Spilled(loc) => loc.value_len as usize,
        }
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the value is in DRAM (heap or slab), so evicting it frees
    /// memory.
    pub fn in_dram(&self) -> bool {
        matches!(self, Value::Heap(_) | Value::Slab(_) | Value::Cached(_))
    }

    /// The value's record in the spill tier, if it has one.
    pub fn disk(&self) -> Option<&DiskLoc> {
        match self {
            Value::Writing(w) => Some(&w.loc),
            Value::Cached(c) => Some(&c.loc),
            Value::Spilled(loc) => Some(loc),
            _ => None,
        }
    }

    /// Whether a reply or waiter still reads the value (slab values only;
    /// a heap value's memory is freed by its last handle either way).
    pub fn is_held(&self) -> bool {
        self.slot().is_some_and(|r| r.is_held())
    }

    /// Bytes of DRAM the value occupies (its slot or span for blocks; a
    /// spilled value none).
    pub fn footprint(&self) -> usize {
        match self {
            Value::Heap(b) => b.len(),
            Value::Slab(r) => r.footprint(),
            Value::Cached(c) => c.slot.footprint(),
            Value::Writing(_) | Value::Spilled(_) => 0,
        }
    }

    /// The slab slot, if the value lives there.
    pub fn slot(&self) -> Option<&SlotRef> {
        match self {
            Value::Slab(r) => Some(r),
            Value::Cached(c) => Some(&c.slot),
            _ => None,
        }
    }

    /// The bytes, if they are in memory (borrowed; `None` when on disk
    /// only).
    pub fn in_memory(&self) -> Option<&[u8]> {
        match self {
            Value::Heap(b) => Some(b),
            Value::Slab(r) => Some(r.as_slice()),
            Value::Cached(c) => Some(c.slot.as_slice()),
            Value::Writing(w) => Some(&w.data),
            Value::Spilled(_) => None,
        }
    }
}

impl Deref for Value {
    type Target = [u8];

    /// The bytes of a value in memory. Commands that need the bytes of any
    /// value call `Store::materialize` first, which brings a spilled block
    /// back; a spilled value derefs to nothing.
    fn deref(&self) -> &[u8] {
        self.in_memory().unwrap_or(&[])
    }
}

// -- the LFU counter an entry keeps (LFU policies) --

/// Initial LFU counter of a new key (so it is not evicted at once).
pub const LFU_INIT: u8 = 5;

/// A 16-bit minutes clock for LFU decay.
pub fn minutes(now_ms: u64) -> u16 {
    ((now_ms / 60_000) & 0xffff) as u16
}

/// The LFU counter after one decrement per minute idle since `since`.
pub fn decayed(counter: u8, since: u16, now_ms: u64) -> u8 {
    let elapsed = minutes(now_ms).wrapping_sub(since);
    counter.saturating_sub(elapsed.min(255) as u8)
}

/// Where an entry is queued for the `prefix` policy: in the queues of a
/// level (log2 of its uses), or in none ([`Queue::OUT`]: the value is on
/// disk, or another policy is in force). One byte (an enum with a level
/// would take two), so that the entry has room for its tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queue(u8);

impl Queue {
    /// In no queue.
    pub const OUT: Queue = Queue(u8::MAX);

    /// In the queues of `level`.
    pub fn at(level: u8) -> Queue {
        debug_assert!(level != u8::MAX);
        Queue(level)
    }

    /// Its level, if it is queued.
    pub fn level(self) -> Option<u8> {
        (self != Queue::OUT).then_some(self.0)
    }
}

/// One key's value and bookkeeping.
#[derive(Debug)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Absolute expiry in Unix milliseconds; 0 means none.
    pub expire_at: u64,
    /// Last access, Unix seconds (truncated): OBJECT IDLETIME.
    pub(crate) atime: u32,
    /// Last access (or re-queueing), on the store's logical clock: LRU and
    /// the `prefix` policy's lifetimes rank by it, and it tells the entry's
    /// current place in the `prefix` queues from stale ones.
    pub(crate) tick: u32,
    /// Logarithmic access counter (LFU, OBJECT FREQ).
    pub(crate) lfu: u8,
    /// Minutes clock of the last LFU decrement.
    pub(crate) lfu_minutes: u16,
    /// OBJECT ENCODING.
    pub encoding: Encoding,
    /// The block this one continues (MSETBLOCK CHAIN), if the writer said.
    pub parent: Option<Bytes>,
    /// Cached blocks that name this one as parent (eventually consistent
    /// across shards).
    pub(crate) children: u32,
    /// The parent is known to be absent: no prefix lookup reaches this block.
    pub(crate) orphan: bool,
    /// Met at the front of its level while it had cached children: waiting
    /// in the level's parked queue (`prefix` policy).
    pub(crate) parked: bool,
    /// Uses (the write and each read, saturating; halved on each demotion):
    /// the `prefix` policy's level is log2 of it. 0: stored cold (a
    /// request's final partial block) and not read since.
    pub(crate) uses: u8,
    /// The `prefix` policy's queue.
    pub(crate) queue: Queue,
    /// Reads since the value was stored (spill admission, promotion),
    /// saturating at 255: one byte, so the entry stays within 112 bytes.
    pub(crate) reads: u8,
    /// The key has (or had) a record in the spill tier: a delete or an
    /// overwrite must leave a tombstone there.
    pub(crate) on_disk: bool,
    /// The `prefix` policy's measured class of the block (0: none).
    pub(crate) class: u8,
    /// Its tenant's slot ([`crate::tenants`]): set as the entry is made,
    /// so that queueing and counting it need no pattern search.
    pub(crate) tenant: u8,
}

impl Entry {
    /// A fresh entry.
    pub fn new(value: Value, expire_at: u64, now: u64) -> Entry {
        Entry {
            value,
            expire_at,
            atime: (now / 1000) as u32,
            tick: 0,
            lfu: LFU_INIT,
            lfu_minutes: minutes(now),
            encoding: Encoding::Auto,
            parent: None,
            children: 0,
            orphan: false,
            parked: false,
            uses: 1,
            queue: Queue::OUT,
            reads: 0,
            on_disk: false,
            class: 0,
            tenant: 0,
        }
    }

    /// The entry of a block that lives only on disk, at `loc`: raw bytes,
    /// its record noted (a delete leaves a tombstone), in no queue.
    pub(crate) fn on_disk(loc: DiskLoc, expire_at: u64, now: u64) -> Entry {
        let mut e = Entry::new(Value::Spilled(loc), expire_at, now);
        e.encoding = Encoding::Raw;
        e.on_disk = true;
        e.queue = Queue::OUT;
        e
    }

    /// Whether the entry is past its expiry at `now`.
    pub fn expired(&self, now: u64) -> bool {
        self.expire_at != 0 && self.expire_at <= now
    }

    /// Bytes charged to the DRAM tier's index for this entry under
    /// `key_len`: the key, index overhead, a heap value and the parent link.
    /// Slab values are charged through the arena's mapped pages instead; an
    /// entry whose block is only on disk charges nothing here, its index is
    /// the disk index's ([`Entry::disk_index_charge`]).
    pub fn charge(&self, key_len: usize) -> usize {
        self.charges(key_len).0
    }

    /// Bytes of the disk index for an entry whose block is only on disk
    /// (0 for any other): outside `maxmemory`, which bounds the DRAM tier,
    /// reported as INFO `spill_index_bytes`.
    pub fn disk_index_charge(&self, key_len: usize) -> usize {
        self.charges(key_len).1
    }

    /// Both charges: `(DRAM tier, disk index)`.
    pub fn charges(&self, key_len: usize) -> (usize, usize) {
        match &self.value {
            Value::Spilled(_) => (0, self.index_charge(key_len, 0)),
            Value::Heap(b) => (self.index_charge(key_len, b.len()), 0),
            _ => (self.index_charge(key_len, 0), 0),
        }
    }

    /// What the entry costs the counters beside the maps: its charges,
    /// and its tenant's bytes in DRAM (the index charge and the value's
    /// slot) and on disk (the block's bytes in the spill tier).
    pub(crate) fn cost(&self, key_len: usize) -> crate::tenants::Cost {
        let (index, disk_index) = self.charges(key_len);
        crate::tenants::Cost {
            index,
            disk_index,
            dram: index
                + match &self.value {
                    Value::Heap(_) => 0,
                    v => v.footprint(),
                },
            disk: self.value.disk().map_or(0, |loc| loc.value_len as usize),
        }
    }

    fn index_charge(&self, key_len: usize, heap_value: usize) -> usize {
        charge(key_len, heap_value, self.expire_at != 0)
            + self.parent.as_ref().map_or(0, |p| p.len())
    }

    /// What MEMORY USAGE reports: everything this key costs.
    pub fn memory_usage(&self, key_len: usize) -> usize {
        let (dram, disk) = self.charges(key_len);
        dram + disk
            + match &self.value {
                Value::Heap(_) => 0,
                v => v.footprint(),
            }
    }

    /// Seconds since the last access.
    pub fn idle_seconds(&self, now: u64) -> u64 {
        ((now / 1000) as u32).saturating_sub(self.atime) as u64
    }

    /// The LFU counter after decay, as OBJECT FREQ reports it.
    pub fn frequency(&self, now: u64) -> u8 {
        decayed(self.lfu, self.lfu_minutes, now)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entries_stay_small() {
        // Every key pays for an Entry, and spilled keys outnumber DRAM ones
        // ten to one: the disk states are boxed or no larger than a slot.
        assert!(std::mem::size_of::<super::Value>() <= 48);
        assert!(std::mem::size_of::<super::Entry>() <= 112);
    }
}
