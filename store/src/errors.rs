//! Why a write was not stored.

/// The write did not fit in memory and nothing could be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// Why a write was not stored: each one is counted (INFO
/// `refused_writes_<cause>`, metric `kvtier_refused_writes_total{cause}`),
/// and MSETBLOCK answers `-1` for the block, SET an `OOM` error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Larger than the shard's whole share of `maxmemory`.
    TooLarge,
    /// `maxmemory-policy noeviction`, and no room.
    NoEviction,
    /// Nothing could be evicted to make room (every block held by a lookup
    /// or a reply being written, or protected by the write itself).
    NoRoom,
}

impl Refusal {
    /// Every cause, in metric order.
    pub const ALL: [Refusal; 3] = [Refusal::TooLarge, Refusal::NoEviction, Refusal::NoRoom];

    /// Metric label and INFO suffix.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::TooLarge => "too_large",
            Refusal::NoEviction => "noeviction",
            Refusal::NoRoom => "no_room",
        }
    }
}
