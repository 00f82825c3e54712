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
use crate::{EvictionPolicy, Store};

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

/// Delivers the link events every store of `stores` (shard `i` at index
/// `i`) recorded, and what they cascade into, until none is left: each
/// store's events in turn, applied by the stores they concern at once. What
/// the shards' rounds of mailbox jobs do, on one thread, for a caller that
/// holds every store (the policy simulator, bench/src/sim.rs; a chain write
/// stored directly).
/// `keep` filters the events (a parent on another node is not tracked).
pub fn deliver_all<S>(stores: &mut [S], keep: impl Fn(&LinkEvent) -> bool)
where
    S: std::ops::DerefMut<Target = Store>,
{
    loop {
        let mut moved = false;
        for from in 0..stores.len() {
            for event in stores[from].take_link_events() {
                moved = true;
                if !keep(&event) {
                    continue;
                }
                event.deliver(from, stores.len(), |t, e| stores[t].apply_link(e));
            }
        }
        if !moved {
            return;
        }
    }
}

impl Store {
    /// Whether the order in which link events are applied can move a
    /// victim: only the `prefix` policy ranks by child counts and orphan
    /// marks, and only with a budget to evict for.
    pub fn ranks_by_links(&self) -> bool {
        self.policy == EvictionPolicy::Prefix && self.budget != 0
    }

    /// Whether something waits for the owner shard's next
    /// `take_link_events` / `flush_spill`: link changes to deliver or spill
    /// writes to send. A read run from another thread checks this and
    /// hands that work to the owner.
    pub fn has_deferred_work(&self) -> bool {
        !self.meta.outbox.is_empty()
            || !self.meta.remote.is_empty()
            || !self.faulted.is_empty()
            || self.spill.as_ref().is_some_and(|s| s.has_unflushed())
    }

    /// Link changes to deliver to other stores (see [`links`]).
    pub fn take_link_events(&mut self) -> Vec<LinkEvent> {
        self.settle_links();
        std::mem::take(&mut self.meta.remote)
    }

    /// Applies the recorded events that concern this store (keys it owns;
    /// a parent's departure, for its children here) and keeps the rest for
    /// [`Store::take_link_events`]. Called after each write and eviction:
    /// O(events).
    pub(crate) fn settle_links(&mut self) {
        while !self.meta.outbox.is_empty() {
            let mut fresh = std::mem::take(&mut self.meta.outbox);
            for event in fresh.drain(..) {
                match event.route() {
                    Route::Key(key) if self.slots.contains(&(key_slot(key) as usize)) => {
                        self.apply_link(event)
                    }
                    Route::Others => {
                        self.apply_link(event.clone());
                        self.meta.remote.push(event);
                    }
                    _ => self.meta.remote.push(event),
                }
            }
            // Keep the buffer (events applied above may have recorded more).
            if self.meta.outbox.is_empty() {
                self.meta.outbox = fresh;
            }
        }
    }

    /// Applies a link change that names a key of this store (or, for
    /// `ParentGone`, any store).
    pub fn apply_link(&mut self, event: LinkEvent) {
        match event {
            LinkEvent::ChildAdded { parent, child } => {
                let index = self.index(key_slot(&parent));
                // A parent living only on disk counts its children too.
                self.ensure_mapped(index, &parent);
                match self.maps[index].get_key_value_mut(&parent[..]) {
                    Some((key, p)) => {
                        if p.orphan {
                            // A child of an unreachable block is unreachable.
                            self.meta.outbox.push(LinkEvent::Orphaned {
                                child: child.clone(),
                            });
                        }
                        let counted = self.meta.counted.entry(key.clone()).or_default();
                        if counted.insert(child) {
                            // Parked when met at the front of its level.
                            p.children += 1;
                        }
                    }
                    None => self.meta.outbox.push(LinkEvent::Orphaned { child }),
                }
            }
            LinkEvent::ChildRemoved { parent, child } => {
                let index = self.index(key_slot(&parent));
                let Some((key, p)) = self.maps[index].get_key_value_mut(&parent[..]) else {
                    return;
                };
                let Some(counted) = self.meta.counted.get_mut(&parent[..]) else {
                    return;
                };
                if counted.remove(&child) {
                    p.children -= 1;
                    if p.children == 0 {
                        // A leaf again: evicted in its turn (or, on disk
                        // only, back to the compact index).
                        self.recency.unpark(key, p);
                        if matches!(p.value, crate::Value::Spilled(_)) {
                            self.faulted.push(key.clone());
                        }
                    }
                    if counted.is_empty() {
                        self.meta.counted.remove(&parent[..]);
                    }
                }
            }
            LinkEvent::ParentGone { parent } => {
                let children = self.meta.children_of.get(&parent[..]).cloned();
                for child in children.into_iter().flatten() {
                    self.mark_orphan(&child);
                }
            }
            LinkEvent::Orphaned { child } => self.mark_orphan(&child),
            LinkEvent::ReclaimSegment { seq } => self.reclaim_segment(seq),
        }
    }

    /// Marks `key` unreachable; its descendants are then unreachable too,
    /// and are told so (on whichever shard they live).
    pub(crate) fn mark_orphan(&mut self, key: &[u8]) {
        let index = self.index(key_slot(key));
        if let Some((k, e)) = self.maps[index].get_key_value_mut(key) {
            if !e.orphan {
                e.orphan = true;
                if self.policy == EvictionPolicy::Prefix && self.budget != 0 {
                    self.recency.orphaned(k, e);
                }
                if e.children > 0 {
                    self.meta
                        .outbox
                        .push(LinkEvent::ParentGone { parent: k.clone() });
                }
            }
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
