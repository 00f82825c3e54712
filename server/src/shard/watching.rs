//! WATCH's registry on the client's side: the keys a connection watches and
//! the flag their shards set when one changes (the shards' side is the
//! store's `watch_changes`).

use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;

use super::slot::key_slot;
use super::Shard;

/// The keys a client WATCHes and the flag their shards set on any change.
pub struct Watching {
    shard: Rc<Shard>,
    client: u64,
    /// Set when a watched key changed.
    pub dirty: Arc<AtomicBool>,
    keys: Vec<Bytes>,
}

impl Watching {
    /// Nothing watched yet.
    pub fn new(shard: Rc<Shard>, client: u64) -> Watching {
        Watching {
            shard,
            client,
            dirty: Arc::new(AtomicBool::new(false)),
            keys: Vec::new(),
        }
    }

    /// Notes that `key` is watched (its shard has registered `dirty` for
    /// it): [`Watching::clear`] unregisters it.
    pub fn noted(&mut self, key: Bytes) {
        self.keys.push(key);
    }

    /// Whether no key is watched.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets every watched key (posting the removals to their shards).
    pub fn clear(&mut self) {
        let client = self.client;
        for key in self.keys.drain(..) {
            let slot = key_slot(&key);
            let owner = self.shard.owner_of(slot);
            let _ = self.shard.post(
                owner,
                Box::new(move |s: &Shard| s.store.lock().unwatch_changes(&key, client)),
            );
        }
        self.dirty = Arc::new(AtomicBool::new(false));
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.clear();
    }
}
