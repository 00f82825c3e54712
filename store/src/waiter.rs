//! A blocked reader (`MGETPREFIX ... BLOCK`) as the store knows it.

use std::sync::Arc;

use tokio::sync::Notify;

/// A blocked reader (MGETPREFIX BLOCK) waiting for a key to be written.
#[derive(Clone)]
pub struct Waiter {
    /// Identifies the waiter when it unregisters.
    pub id: u64,
    /// Woken on every write of a watched key.
    pub wake: Arc<Notify>,
}
