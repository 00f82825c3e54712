//! Lookup holds: `PREFIXLEN ... HOLD ms` keeps the blocks it counted from
//! being evicted until they are read or `ms` passes, so what a scheduler's
//! lookup counted is still there when its workers load it a few
//! milliseconds later.
//!
//! A hold is advisory and bounded, never a lease that can starve writers
//! (Mooncake's existence checks that renewed leases left eviction nothing
//! to evict):
//!
//! * in time: each hold ends at its deadline (the command caps `ms`);
//! * in bytes: a shard holds at most [`HoldLimits::shard`] bytes and one
//!   client at most [`HoldLimits::client`] of them; a block past either is
//!   not held, and the lookup's count stops before it;
//! * for writers: when a write finds nothing else to evict, every hold of
//!   the shard is broken ([`Holds::break_all`], counted) and eviction goes
//!   on as if there were none.
//!
//! A key has at most one holder: a second lookup of a held key extends the
//! deadline and charges nobody new. Any read of the key ends its hold (the
//! load the lookup was for, or another reader that just made it recent).
//!
//! Cost: nothing while no hold is active (one `is_empty` per eviction
//! candidate and per read); with holds, one hash lookup per candidate and
//! per read, and a map entry plus a heap entry per held key.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;
use hashbrown::HashMap;

/// How many bytes holds may cover on one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldLimits {
    /// All holds of the shard together.
    pub shard: usize,
    /// One client's holds on the shard.
    pub client: usize,
}

impl HoldLimits {
    /// No limit (a store with no memory budget evicts nothing anyway).
    pub const NONE: HoldLimits = HoldLimits {
        shard: usize::MAX,
        client: usize::MAX,
    };
}

/// Counters of the holds (INFO `# Stats`; kept in [`crate::stats::StoreStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// Keys a lookup held (or whose hold it extended).
    pub granted: u64,
    /// Keys a lookup found present but could not hold (a limit): its count
    /// stopped there.
    pub refused: u64,
    /// Holds ended by a read of the key.
    pub released: u64,
    /// Holds ended by their deadline.
    pub expired: u64,
    /// Holds broken because a write found nothing else to evict.
    pub broken: u64,
}

/// One held key.
#[derive(Debug)]
struct Hold {
    until: u64,
    client: u64,
    bytes: usize,
}

/// The holds of one shard.
#[derive(Debug, Default)]
pub struct Holds {
    held: HashMap<Bytes, Hold>,
    /// Deadlines, soonest first; an entry whose key's hold ended or moved
    /// is skipped when it comes up.
    due: BinaryHeap<Reverse<(u64, Bytes)>>,
    bytes: usize,
    by_client: HashMap<u64, usize>,
}

impl Holds {
    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Keys held now (some may be past their deadline until the next
    /// sweep).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `key` (a value of `bytes` bytes) for `client` until `until`
    /// (Unix ms). False when a limit leaves no room: the key is not held.
    /// (Sweep first: holds past their deadline still take room.)
    pub fn hold(
        &mut self,
        key: &Bytes,
        bytes: usize,
        client: u64,
        until: u64,
        limits: HoldLimits,
    ) -> bool {
        if let Some(h) = self.held.get_mut(&key[..]) {
            if until > h.until {
                h.until = until;
                self.due.push(Reverse((until, key.clone())));
            }
            return true;
        }
        let mine = self.by_client.get(&client).copied().unwrap_or(0);
        let fits = |used: usize, limit: usize| used.checked_add(bytes).is_some_and(|t| t <= limit);
        if !fits(self.bytes, limits.shard) || !fits(mine, limits.client) {
            return false;
        }
        self.held.insert(
            key.clone(),
            Hold {
                until,
                client,
                bytes,
            },
        );
        self.due.push(Reverse((until, key.clone())));
        self.bytes += bytes;
        *self.by_client.entry(client).or_insert(0) += bytes;
        true
    }

    /// Whether `key` is held at `now`.
    pub fn covers(&self, key: &[u8], now: u64) -> bool {
        !self.held.is_empty() && self.held.get(key).is_some_and(|h| h.until > now)
    }

    /// Ends the hold of `key`, if it has one, because it was read. Whether
    /// it had one.
    pub fn release(&mut self, key: &[u8]) -> bool {
        !self.held.is_empty() && self.end(key)
    }

    /// Ends the holds whose deadline passed. How many ended.
    pub fn sweep(&mut self, now: u64) -> usize {
        let mut ended = 0;
        while let Some(Reverse((until, _))) = self.due.peek() {
            if *until > now {
                break;
            }
            let Some(Reverse((until, key))) = self.due.pop() else {
                break;
            };
            if self.held.get(&key[..]).is_some_and(|h| h.until == until) && self.end(&key) {
                ended += 1;
            }
        }
        if self.held.is_empty() && !self.due.is_empty() {
            self.due.clear();
        }
        ended
    }

    /// Ends every hold (a write found nothing else to evict). How many
    /// ended.
    pub fn break_all(&mut self) -> usize {
        let n = self.held.len();
        self.held.clear();
        self.due.clear();
        self.by_client.clear();
        self.bytes = 0;
        n
    }

    fn end(&mut self, key: &[u8]) -> bool {
        let Some(h) = self.held.remove(key) else {
            return false;
        };
        self.bytes -= h.bytes;
        if let Some(mine) = self.by_client.get_mut(&h.client) {
            *mine -= h.bytes;
            if *mine == 0 {
                self.by_client.remove(&h.client);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::from(s.to_string())
    }

    const ROOM: HoldLimits = HoldLimits {
        shard: 300,
        client: 200,
    };

    #[test]
    fn a_hold_ends_at_its_deadline_or_at_a_read() {
        let mut h = Holds::default();
        assert!(h.hold(&key("a"), 10, 1, 100, ROOM));
        assert!(h.hold(&key("b"), 10, 1, 100, ROOM));
        assert!(h.covers(b"a", 99) && !h.covers(b"a", 100));
        assert!(h.release(b"a"));
        assert!(!h.release(b"a"));
        assert!(!h.covers(b"a", 50));
        assert_eq!((h.len(), h.bytes()), (1, 10));
        assert_eq!(h.sweep(99), 0);
        assert_eq!(h.sweep(100), 1);
        assert!(h.is_empty());
        assert_eq!(h.bytes(), 0);
    }

    #[test]
    fn limits_per_client_and_per_shard() {
        let mut h = Holds::default();
        assert!(h.hold(&key("a"), 150, 1, 100, ROOM));
        // Client 1 would pass its 200.
        assert!(!h.hold(&key("b"), 60, 1, 100, ROOM));
        assert!(h.hold(&key("b"), 60, 2, 100, ROOM));
        // The shard's 300 would be passed.
        assert!(!h.hold(&key("c"), 100, 3, 100, ROOM));
        // A held key held again costs nothing and moves its deadline.
        assert!(h.hold(&key("a"), 150, 3, 500, ROOM));
        assert_eq!(h.sweep(200), 1);
        assert!(h.covers(b"a", 200) && !h.covers(b"b", 200));
        assert_eq!(h.bytes(), 150);
        // The first deadline of "a" passed, its hold did not.
        assert_eq!(h.len(), 1);
        // Once released, the room is back.
        assert!(h.release(b"a"));
        assert!(h.hold(&key("c"), 200, 1, 900, ROOM));
    }

    #[test]
    fn breaking_ends_every_hold() {
        let mut h = Holds::default();
        for k in ["a", "b", "c"] {
            assert!(h.hold(&key(k), 1, 1, 100, ROOM));
        }
        assert_eq!(h.break_all(), 3);
        assert!(!h.covers(b"a", 0));
        assert_eq!(h.bytes(), 0);
        assert!(h.hold(&key("a"), 200, 1, 100, ROOM));
    }
}
