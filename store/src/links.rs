//! Chain links between blocks on different shards.
//!
//! A block stored with CHAIN names its parent, which may live on another
//! shard. Prefix-aware eviction needs, for every block, whether it has cached
//! children (an inner node of some prefix) and whether its parent is gone (an
//! orphan no lookup can reach). Each store records what happens to its own
//! keys as [`LinkEvent`]s. An event about a key of the same store is applied
//! at once (a chain within one shard is counted exactly, even between the
//! evictions of one write); the shard layer delivers the others to the store
//! that owns the key each names (every other store for
//! [`LinkEvent::ParentGone`], every store for [`LinkEvent::ReclaimSegment`]),
//! where [`super::Store::apply_link`] updates the counts. Across shards the
//! counts are eventually consistent: eviction only ranks by them.
//!
//! A parent's store remembers *which* children it counted, not only how
//! many: a child stored while its parent was absent (or before the parent
//! was deleted and written again) was never counted by the parent that is
//! there now, and its removal must not take a count away from a child that
//! was (that parent would look like a leaf and be evicted, stranding the
//! child).

use bytes::Bytes;

use crate::slot::{self, key_slot};

/// A change one store tells another about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// `child` was stored naming `parent`: the parent's store counts a
    /// child, or answers [`LinkEvent::Orphaned`] if it has no such key.
    ChildAdded {
        /// The parent's key (routes the event).
        parent: Bytes,
        /// The new child's key.
        child: Bytes,
    },
    /// `child`, which names `parent`, went away: one child fewer, if the
    /// parent counted it (it did not when it was absent at the time, or
    /// has been deleted and written again since).
    ChildRemoved {
        /// The parent's key (routes the event).
        parent: Bytes,
        /// The departed child's key.
        child: Bytes,
    },
    /// `parent`, which had children, went away or became an orphan itself:
    /// every store marks the children it holds as orphans (so an orphan's
    /// whole subtree is marked, however its blocks are spread).
    ParentGone {
        /// The departed parent's key.
        parent: Bytes,
    },
    /// `child`'s parent does not exist: mark it an orphan.
    Orphaned {
        /// The child's key (routes the event).
        child: Bytes,
    },
    /// Every store drops or rewrites its records in segment `seq`, so the
    /// segment can be deleted.
    ReclaimSegment {
        /// The segment.
        seq: u64,
    },
}

/// Where a [`LinkEvent`] goes.
pub enum Route<'a> {
    /// The store owning this key.
    Key(&'a Bytes),
    /// Every store but the one that recorded it (which applied it).
    Others,
    /// Every store.
    All,
}

impl LinkEvent {
    /// The store(s) that must apply the event.
    pub fn route(&self) -> Route<'_> {
        match self {
            LinkEvent::ChildAdded { parent, .. } | LinkEvent::ChildRemoved { parent, .. } => {
                Route::Key(parent)
            }
            LinkEvent::ParentGone { .. } => Route::Others,
            LinkEvent::ReclaimSegment { .. } => Route::All,
            LinkEvent::Orphaned { child } => Route::Key(child),
        }
    }

    /// Hands the event recorded by shard `from` to each shard (of
    /// `shards`, split as [`slot::shard_slots`]) that must apply it: a copy
    /// to each but the last, the event itself to the last.
    pub fn deliver(self, from: usize, shards: usize, mut to: impl FnMut(usize, LinkEvent)) {
        let skip = match self.route() {
            Route::Key(key) => return to(slot::slot_shard(key_slot(key), shards), self),
            Route::Others => Some(from),
            Route::All => None,
        };
        let mut targets = (0..shards).filter(|&t| Some(t) != skip).peekable();
        while let Some(t) = targets.next() {
            if targets.peek().is_none() {
                to(t, self);
                return;
            }
            to(t, self.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `event`, recorded by shard `from` of three, is delivered.
    fn delivered(event: LinkEvent, from: usize) -> Vec<(usize, LinkEvent)> {
        let mut got = Vec::new();
        event.deliver(from, 3, |t, e| got.push((t, e)));
        got
    }

    #[test]
    fn an_event_goes_to_the_shards_it_concerns_once_each() {
        let parent = Bytes::from_static(b"p");
        let owner = slot::slot_shard(key_slot(&parent), 3);
        let added = LinkEvent::ChildAdded {
            parent: parent.clone(),
            child: Bytes::from_static(b"c"),
        };
        assert_eq!(delivered(added.clone(), (owner + 1) % 3), [(owner, added)]);
        let gone = LinkEvent::ParentGone { parent };
        assert_eq!(
            delivered(gone.clone(), 1),
            [(0, gone.clone()), (2, gone.clone())]
        );
        let reclaim = LinkEvent::ReclaimSegment { seq: 7 };
        let all: Vec<_> = (0..3).map(|t| (t, reclaim.clone())).collect();
        assert_eq!(delivered(reclaim, 1), all);
    }
}
