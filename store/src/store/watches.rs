//! Who waits for a key: blocked readers (`MGETPREFIX ... BLOCK`) woken by
//! any write of a key they miss, and WATCH flags set by any change.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;

use super::Store;
use crate::waiters::Waiter;

impl Store {
    /// Wakes `waiter` whenever `key` is written, until [`Store::unwatch`].
    pub fn watch(&mut self, key: &[u8], waiter: Waiter) {
        self.waiters.add(key, waiter);
    }

    /// Forgets waiter `id` on `key`.
    pub fn unwatch(&mut self, key: &[u8], id: u64) {
        self.waiters.remove(key, id);
    }

    /// Number of keys readers are waiting for.
    pub fn watched_keys(&self) -> usize {
        self.waiters.keys()
    }

    /// WATCH: sets `dirty` whenever `key` changes, until unwatched.
    pub fn watch_changes(&mut self, key: &[u8], client: u64, dirty: Arc<AtomicBool>) {
        match self.meta.watched.get_mut(key) {
            Some(flags) => flags.push((client, dirty)),
            None => {
                self.meta
                    .watched
                    .insert(Bytes::copy_from_slice(key), vec![(client, dirty)]);
            }
        }
    }

    /// UNWATCH of one key for one client.
    pub fn unwatch_changes(&mut self, key: &[u8], client: u64) {
        if let Some(flags) = self.meta.watched.get_mut(key) {
            flags.retain(|(id, _)| *id != client);
            if flags.is_empty() {
                self.meta.watched.remove(key);
            }
        }
    }
}
