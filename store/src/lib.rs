//! One shard's keyspace: the index from key to value, expiry, memory
//! accounting and eviction.
//!
//! The index is one hash map per hash slot the shard owns, so a SCAN cursor
//! is a slot number (stable across inserts and deletes: every key present for
//! a whole SCAN is returned exactly once), and per-slot counts and listings
//! (for cluster commands) cost nothing extra.
//!
//! Values of [`SLAB_MIN`] bytes or more (KV-cache blocks) live in the shard's
//! slab arena ([`slab`]); smaller ones in memory of their own. Memory used is
//! the arena's mapped pages plus the index and small values, and stays under
//! the shard's share of `maxmemory`.
//!
//! Keys with a time to live are also kept in a set ordered by expiry time:
//! active expiry pops exactly the keys that are due instead of sampling.
//!
//! The crate is in layers, bottom to top (scripts/check-layers.py checks
//! them): the leaves ([`clock`], [`errors`], [`stats`], [`slot`], [`slab`],
//! [`entry`], [`tenants`], [`holds`], [`latency`], [`spill`] — the disk
//! format and I/O); the parts a store owns ([`links`], [`policy`],
//! `meta`, `disk_index`, [`waiters`]); and [`store`], the `Store` type with
//! one file per job of its methods. This file only declares and re-exports.

pub mod clock;
mod disk_index;
pub mod entry;
pub mod errors;
pub mod holds;
pub mod latency;
pub mod links;
mod meta;
pub mod policy;
pub mod slab;
pub mod slot;
pub mod spill;
pub mod stats;
pub mod store;
pub mod tenants;
pub mod waiters;

pub use clock::{mono_ns, ms_at, now_ms, resync_clock, thread_cpu_ns};
pub use disk_index::DISK_ENTRY_OVERHEAD;
pub use entry::{
    Encoding, Entry, Queue, Value, ADOPT_MIN, ENTRY_OVERHEAD, EXPIRE_OVERHEAD, SLAB_MIN,
};
pub use errors::{OutOfMemory, Refusal};
pub use holds::{HoldLimits, HoldStats, Holds};
pub use links::LinkEvent;
pub use policy::protect::Protect;
pub use policy::{EvictionPolicy, PrefixTuning, WriteClass};
pub use spill::fetch::{DiskRead, Fetched, InPrefix};
pub use stats::{EvictReason, StoreStats, TenantStats};
pub use store::keyspace::{partial_tail, BlockWrite, PrefixStep};
pub use store::linking::deliver_all;
pub use store::{MemoryOptions, PostToStore, SpillConfig, Store, StoreJob};
pub use waiters::Waiter;
