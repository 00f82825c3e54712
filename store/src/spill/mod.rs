//! The NVMe spill tier: blocks evicted from DRAM are appended to segment
//! files and read back (checksummed) on demand.
//!
//! * [`record`]: the on-disk record (ASCII box there).
//! * [`SpillDir`]: the directory's segments, shared by every shard: disk
//!   budget, live-record counts (segments are deleted oldest first once
//!   nothing in them is live), counters for INFO and metrics.
//! * [`IoPool`]: dedicated I/O threads doing `pread`/`pwrite` (O_DIRECT when
//!   the filesystem allows it); a shard's event loop never waits on disk.
//! * [`footer`]: what a sealed segment lists of its records, so a restart
//!   reads no payload.
//! * [`load`]: the warm restart: segments newest first, each from its
//!   footer (or scanned when it has none), while the server already answers.

//! * [`writer`]: a shard's write batches and segment footers; [`fetch`]:
//!   what a read hands back.
//!
//! This file only declares and re-exports ([`dir`] holds the directory).

pub mod dir;
pub mod fetch;
pub mod footer;
pub mod load;
pub mod record;
pub mod writer;

pub use dir::{
    aligned, same_loc, DiskLoc, IoJob, IoPool, Segment, SpillCounters, SpillDir, SpillDrop,
    BATCH_SIZE, QUEUE_HARD, QUEUE_SOFT, SEGMENT_SIZE,
};
pub use load::{recover, Loader, Recovered, Recovery};
