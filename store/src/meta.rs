//! The counts and indexes a store keeps beside its maps (keys, charged
//! bytes, the expiry set, WATCHed keys, which key holds each slab slot,
//! chain links, spill-tier records), updated on every insert and removal.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::hash_map::EntryRef;
use hashbrown::HashMap;

use crate::entry::{Entry, Queue};
use crate::links::LinkEvent;
use crate::spill;
use crate::stats::StoreStats;
use crate::tenants::{Cost, Tenants};

/// Counts and indexes kept beside the maps, updated on every insert and
/// removal (a separate struct so they can be borrowed beside a map entry).
#[derive(Default)]
pub(crate) struct Meta {
    /// Keys with a TTL, ordered by expiry.
    pub(crate) expires: BTreeSet<(u64, Bytes)>,
    /// Sum of `expire_at` over `expires` (for avg_ttl).
    pub(crate) expire_sum: u128,
    pub(crate) keys: usize,
    /// Bytes charged to the index (keys, overhead, small values, links).
    pub(crate) used: usize,
    /// Bytes of the disk index: entries whose block is only on disk
    /// ([`Entry::disk_index_charge`]).
    pub(crate) disk_index: usize,
    /// WATCHed keys: the flags of the clients watching each (set on any
    /// change of the key, EXEC then fails).
    pub(crate) watched: HashMap<Bytes, Vec<(u64, Arc<AtomicBool>)>>,
    /// Which key holds each slab slot (page, slot): to empty a page.
    pub(crate) slot_keys: HashMap<(u32, u32), Bytes>,
    /// Parent key → children of it stored here.
    pub(crate) children_of: HashMap<Bytes, Vec<Bytes>>,
    /// Key stored here → the children (on any shard) its `children` count
    /// counts.
    pub(crate) counted: HashMap<Bytes, HashSet<Bytes>>,
    /// Link changes for other stores.
    pub(crate) outbox: Vec<LinkEvent>,
    /// Link changes for other stores, once the store applied its own (`Store::settle_links`).
    pub(crate) remote: Vec<LinkEvent>,
    /// Entries in the `prefix` policy's DRAM queues.
    pub(crate) queued: usize,
    /// The spill directory, when the tier is on (live record counts).
    pub(crate) disk: Option<Arc<spill::SpillDir>>,
    /// Keys of this store whose entry points to a record in the spill
    /// tier (reclaim finds a segment's keys in its footer).
    pub(crate) disk_entries: usize,
    /// While the warm restart loads: the keys written or deleted since.
    pub(crate) loading: Option<Loading>,
    /// Who owns each key, and what each tenant holds.
    pub(crate) tenants: Tenants,
}

/// What a store remembers while the warm restart brings its records.
#[derive(Default)]
pub(crate) struct Loading {
    /// Keys written or deleted since the start: older records of them on
    /// disk are dead.
    pub(crate) touched: HashSet<Bytes>,
    /// Touched keys not yet given a tombstone.
    pub(crate) pending: Vec<Bytes>,
    /// FLUSHALL ran: nothing loaded is kept.
    pub(crate) flushed: bool,
}

impl Meta {
    /// While the warm restart loads, `key` is written or deleted: no older
    /// record of it may come back.
    fn touched(&mut self, key: &Bytes) {
        if let Some(loading) = &mut self.loading {
            if loading.touched.insert(key.clone()) {
                loading.pending.push(key.clone());
            }
        }
    }

    pub(crate) fn modified(&self, key: &[u8]) {
        if !self.watched.is_empty() {
            if let Some(flags) = self.watched.get(key) {
                for (_, dirty) in flags {
                    dirty.store(true, Ordering::Release);
                }
            }
        }
    }

    pub(crate) fn index_expiry(&mut self, key: &Bytes, at: u64) {
        if at != 0 {
            self.expires.insert((at, key.clone()));
            self.expire_sum += at as u128;
        }
    }

    pub(crate) fn unindex_expiry(&mut self, key: &Bytes, at: u64) {
        if at != 0 && self.expires.remove(&(at, key.clone())) {
            self.expire_sum -= at as u128;
        }
    }

    pub(crate) fn track_disk(&mut self) {
        self.disk_entries += 1;
    }

    /// An entry no longer points to the record at `loc`.
    pub(crate) fn untrack_disk(&mut self, loc: &spill::DiskLoc) {
        self.disk_entries -= 1;
        if let Some(dir) = &self.disk {
            dir.drop_live(&loc.segment, 1);
        }
    }

    pub(crate) fn added(&mut self, key: &Bytes, entry: &Entry) {
        let cost = self.index_added(key, entry);
        self.tenants
            .shift_slot(entry.tenant as usize, Cost::default(), cost, 1);
    }

    /// `key`'s entry `old` gave way to `new` (an overwrite): [`Meta::removed`]
    /// and [`Meta::added`] at once (a key's tenant is its key's, so the
    /// two entries have the same).
    pub(crate) fn replaced(&mut self, key: &Bytes, old: &Entry, new: &Entry) {
        let before = self.index_removed(key, old, true);
        let after = self.index_added(key, new);
        self.tenants
            .shift_slot(new.tenant as usize, before, after, 0);
    }

    /// Everything [`Meta::added`] counts but the tenant; the entry's cost.
    fn index_added(&mut self, key: &Bytes, entry: &Entry) -> Cost {
        self.modified(key);
        self.touched(key);
        if entry.value.disk().is_some() {
            self.track_disk();
        }
        self.index_expiry(key, entry.expire_at);
        let cost = entry.cost(key.len());
        self.used += cost.index;
        self.disk_index += cost.disk_index;
        self.keys += 1;
        if let Some(slot) = entry.value.slot().and_then(|s| s.page_location()) {
            self.slot_keys.insert(slot, key.clone());
        }
        if let Some(parent) = &entry.parent {
            self.note_child(parent, key);
            self.outbox.push(LinkEvent::ChildAdded {
                parent: parent.clone(),
                child: key.clone(),
            });
        }
        if entry.queue != Queue::OUT {
            self.queued += 1;
        }
        cost
    }

    /// An entry of tenant slot `tenant` changed its cost from `before` to
    /// `after` ([`Entry::cost`]).
    pub(crate) fn recharge(&mut self, tenant: u8, before: Cost, after: Cost) {
        self.used = self.used - before.index + after.index;
        self.disk_index = self.disk_index - before.disk_index + after.disk_index;
        self.tenants.shift_slot(tenant as usize, before, after, 0);
    }

    /// `key`, stored here, names `parent` (a `ParentGone` reaches it).
    pub(crate) fn note_child(&mut self, parent: &Bytes, key: &Bytes) {
        match self.children_of.get_mut(parent) {
            Some(children) => children.push(key.clone()),
            None => {
                self.children_of.insert(parent.clone(), vec![key.clone()]);
            }
        }
    }

    /// `key` is no longer one of `parent`'s children stored here.
    pub(crate) fn forget_child(&mut self, parent: &Bytes, key: &Bytes) {
        if let Some(children) = self.children_of.get_mut(parent) {
            children.retain(|c| c != key);
            if children.is_empty() {
                self.children_of.remove(parent);
            }
        }
    }

    /// A block living only on disk enters the compact index (the warm
    /// restart): charged `charge` bytes of the disk index.
    pub(crate) fn added_compact(&mut self, key: &[u8], expire_at: u64, cost: Cost) {
        self.modified(key);
        self.track_disk();
        if expire_at != 0 {
            self.index_expiry(&Bytes::copy_from_slice(key), expire_at);
        }
        self.disk_index += cost.disk_index;
        self.tenants.shift(key, Cost::default(), cost, 1);
        self.keys += 1;
    }

    /// A compact entry goes without its record being counted out (its
    /// segment is gone).
    pub(crate) fn removed_compact(&mut self, key: &Bytes, expire_at: u64, cost: Cost) {
        self.modified(key);
        self.touched(key);
        self.disk_entries -= 1;
        self.unindex_expiry(key, expire_at);
        self.disk_index -= cost.disk_index;
        self.tenants.shift(key, cost, Cost::default(), -1);
        self.keys -= 1;
    }

    /// `key`'s `entry` left the index; `replaced`: a new value takes the
    /// key's place at once (its children stay its children).
    pub(crate) fn removed(&mut self, key: &Bytes, entry: &Entry, replaced: bool) {
        let cost = self.index_removed(key, entry, replaced);
        self.tenants
            .shift_slot(entry.tenant as usize, cost, Cost::default(), -1);
    }

    /// Everything [`Meta::removed`] counts but the tenant; the entry's cost.
    fn index_removed(&mut self, key: &Bytes, entry: &Entry, replaced: bool) -> Cost {
        self.modified(key);
        self.touched(key);
        if let Some(loc) = entry.value.disk() {
            self.untrack_disk(loc);
        }
        self.unindex_expiry(key, entry.expire_at);
        let cost = entry.cost(key.len());
        self.used -= cost.index;
        self.disk_index -= cost.disk_index;
        self.keys -= 1;
        if let Some(slot) = entry.value.slot().and_then(|s| s.page_location()) {
            self.slot_keys.remove(&slot);
        }
        if let Some(parent) = &entry.parent {
            self.forget_child(parent, key);
            self.outbox.push(LinkEvent::ChildRemoved {
                parent: parent.clone(),
                child: key.clone(),
            });
        }
        if !replaced {
            // A key written here again starts counting from zero.
            self.counted.remove(key);
            if entry.children > 0 {
                self.outbox.push(LinkEvent::ParentGone {
                    parent: key.clone(),
                });
            }
        }
        if entry.queue != Queue::OUT {
            self.queued -= 1;
        }
        cost
    }
}

/// The live entry for `key` in `map`, removing it first if it expired.
pub(crate) fn live<'m>(
    map: &'m mut HashMap<Bytes, Entry>,
    meta: &mut Meta,
    stats: &mut StoreStats,
    key: &[u8],
    now: u64,
) -> Option<(&'m Bytes, &'m mut Entry)> {
    match map.entry_ref(key) {
        EntryRef::Occupied(o) if o.get().expired(now) => {
            let (key, entry) = o.remove_entry();
            meta.removed(&key, &entry, false);
            stats.expired_keys += 1;
            None
        }
        EntryRef::Occupied(o) => Some(o.into_entry()),
        EntryRef::Vacant(_) => None,
    }
}
