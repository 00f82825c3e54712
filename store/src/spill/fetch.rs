//! What a read of the store hands back: the value now, or a disk read in
//! flight that yields it once read and checksummed.

use bytes::Bytes;
use tokio::sync::oneshot;

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

/// The next block of a prefix read (`Store::read_in_prefix`).
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
pub struct DiskRead(pub(crate) oneshot::Receiver<Option<Bytes>>);

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
