//! Chain links between blocks on different shards.
//!
//! A block stored with CHAIN names its parent, which may live on another
//! shard. Prefix-aware eviction needs, for every block, whether it has cached
//! children (an inner node of some prefix) and whether its parent is gone (an
//! orphan no lookup can reach). Each store records what happens to its own
//! keys as [`LinkEvent`]s; the shard layer delivers each event to the store
//! that owns the key it names (all stores for [`LinkEvent::ParentGone`]),
//! where [`super::Store::apply_link`] updates the counts. The counts are
//! eventually consistent: eviction only ranks by them.
//!
//! A parent's store remembers *which* children it counted, not only how
//! many: a child stored while its parent was absent (or before the parent
//! was deleted and written again) was never counted by the parent that is
//! there now, and its removal must not take a count away from a child that
//! was (that parent would look like a leaf and be evicted, stranding the
//! child).

use bytes::Bytes;

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
            LinkEvent::ParentGone { .. } | LinkEvent::ReclaimSegment { .. } => Route::All,
            LinkEvent::Orphaned { child } => Route::Key(child),
        }
    }
}
