//! What the index holds per key: the value (on the heap when small, in the
//! slab arena when a block) and the bookkeeping expiry, eviction and the
//! chain links need.

use std::ops::Deref;

use bytes::Bytes;

use super::eviction;
use super::slab::SlotRef;

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
}

impl Value {
    /// The value as `Bytes` for a reply or another shard: a clone of the
    /// heap handle, or a lease on the slab slot (no copy either way).
    pub fn bytes(&self) -> Bytes {
        match self {
            Value::Heap(b) => b.clone(),
            Value::Slab(r) => r.bytes(),
        }
    }

    /// Whether a reply or waiter still reads the value (slab values only;
    /// a heap value's memory is freed by its last handle either way).
    pub fn is_held(&self) -> bool {
        match self {
            Value::Heap(_) => false,
            Value::Slab(r) => r.is_held(),
        }
    }

    /// Bytes of memory the value occupies (its slot or span for blocks).
    pub fn footprint(&self) -> usize {
        match self {
            Value::Heap(b) => b.len(),
            Value::Slab(r) => r.footprint(),
        }
    }

    /// The slab slot, if the value lives there.
    pub fn slot(&self) -> Option<&SlotRef> {
        match self {
            Value::Heap(_) => None,
            Value::Slab(r) => Some(r),
        }
    }
}

impl Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Value::Heap(b) => b,
            Value::Slab(r) => r.as_slice(),
        }
    }
}

/// Which S3-FIFO queue an entry is in (prefix policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The small probationary queue new keys enter.
    Small,
    /// The main queue of keys that were reused.
    Main,
}

/// One key's value and bookkeeping.
#[derive(Debug)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Absolute expiry in Unix milliseconds; 0 means none.
    pub expire_at: u64,
    /// Last access, Unix seconds (truncated); drives LRU and OBJECT IDLETIME.
    pub(crate) atime: u32,
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
    /// S3-FIFO reuse counter (0..=3).
    pub(crate) freq: u8,
    /// S3-FIFO queue.
    pub(crate) queue: Queue,
    /// Identifies this version of the entry in the eviction queues.
    pub(crate) gen: u32,
}

impl Entry {
    /// A fresh entry.
    pub fn new(value: Value, expire_at: u64, now: u64) -> Entry {
        Entry {
            value,
            expire_at,
            atime: (now / 1000) as u32,
            lfu: eviction::LFU_INIT,
            lfu_minutes: eviction::minutes(now),
            encoding: Encoding::Auto,
            parent: None,
            children: 0,
            orphan: false,
            freq: 0,
            queue: Queue::Small,
            gen: 0,
        }
    }

    /// Whether the entry is past its expiry at `now`.
    pub fn expired(&self, now: u64) -> bool {
        self.expire_at != 0 && self.expire_at <= now
    }

    /// OBJECT ENCODING's answer.
    pub fn encoding_name(&self) -> &'static str {
        let v = &self.value;
        if self.encoding == Encoding::Auto
            && v.len() <= 20
            && crate::protocol::parse_i64_strict(v).is_some()
        {
            "int"
        } else if self.encoding != Encoding::Raw && v.len() <= 44 {
            "embstr"
        } else {
            "raw"
        }
    }

    /// Bytes charged to the index for this entry under `key_len`: the key,
    /// index overhead, a heap value and the parent link. Slab values are
    /// charged through the arena's mapped pages instead.
    pub fn charge(&self, key_len: usize) -> usize {
        let value = match &self.value {
            Value::Heap(b) => b.len(),
            Value::Slab(_) => 0,
        };
        super::Store::charge(key_len, value, self.expire_at != 0)
            + self.parent.as_ref().map_or(0, |p| p.len())
    }

    /// What MEMORY USAGE reports: everything this key costs.
    pub fn memory_usage(&self, key_len: usize) -> usize {
        self.charge(key_len)
            + match &self.value {
                Value::Heap(_) => 0,
                Value::Slab(r) => r.footprint(),
            }
    }

    /// Seconds since the last access.
    pub fn idle_seconds(&self, now: u64) -> u64 {
        ((now / 1000) as u32).saturating_sub(self.atime) as u64
    }

    /// The LFU counter after decay, as OBJECT FREQ reports it.
    pub fn frequency(&self, now: u64) -> u8 {
        eviction::decayed(self.lfu, self.lfu_minutes, now)
    }
}
