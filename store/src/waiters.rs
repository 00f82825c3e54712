//! Blocked readers (`MGETPREFIX ... BLOCK`) as the store knows them: who
//! waits for which key, woken by any write of it.

use std::sync::Arc;

use bytes::Bytes;
use hashbrown::HashMap;
use tokio::sync::Notify;

/// A blocked reader (MGETPREFIX BLOCK) waiting for a key to be written.
#[derive(Clone)]
pub struct Waiter {
    /// Identifies the waiter when it unregisters.
    pub id: u64,
    /// Woken on every write of a watched key.
    pub wake: Arc<Notify>,
}

/// The readers waiting for each key; a key is listed while one waits.
#[derive(Default)]
pub struct Waiters(HashMap<Bytes, Vec<Waiter>>);

impl Waiters {
    /// Wakes `waiter` whenever `key` is written, until [`Waiters::remove`].
    pub fn add(&mut self, key: &[u8], waiter: Waiter) {
        match self.0.get_mut(key) {
            Some(waiters) => waiters.push(waiter),
            None => {
                self.0.insert(Bytes::copy_from_slice(key), vec![waiter]);
            }
        }
    }

    /// Forgets waiter `id` on `key`.
    pub fn remove(&mut self, key: &[u8], id: u64) {
        if let Some(waiters) = self.0.get_mut(key) {
            waiters.retain(|w| w.id != id);
            if waiters.is_empty() {
                self.0.remove(key);
            }
        }
    }

    /// Number of keys readers are waiting for.
    pub fn keys(&self) -> usize {
        self.0.len()
    }

    /// Wakes every reader waiting for `key` (a write of it).
    #[inline(always)]
    pub fn wake(&self, key: &[u8]) {
        if self.0.is_empty() {
            return;
        }
        if let Some(waiters) = self.0.get(key) {
            for w in waiters {
                w.wake.notify_one();
            }
        }
    }
}
