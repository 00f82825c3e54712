//! The store's side of parent/child links: the link events its writes and
//! removals record, applied by the stores they concern
//! ([`crate::links::LinkEvent`]), and orphans marked.

use super::Store;
use crate::links::{LinkEvent, Route};
use crate::policy::EvictionPolicy;
use crate::slot::key_slot;

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

    /// Link changes to deliver to other stores (see [`links`](crate::links)).
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
                        if matches!(p.value, crate::entry::Value::Spilled(_)) {
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
