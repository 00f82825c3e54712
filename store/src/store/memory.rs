//! Staying within the budget: placing blocks in the slab arena, evicting by
//! policy (to the spill tier when it is on), and emptying a page when a new
//! block size needs one.

use bytes::Bytes;

use super::keyspace::Contents;
use super::Store;
use crate::entry::ADOPT_MIN;
use crate::errors::OutOfMemory;
use crate::policy::protect::Protect;
use crate::policy::EvictionPolicy;
use crate::slab::{self, NoRoom};
use crate::slot::key_slot;
use crate::stats::EvictReason;
use crate::tenants::Order;

impl Store {
    /// A slab slot holding `value`, evicting (never `protect`) until one is
    /// free or a page fits the budget, with `index_growth` bytes of index
    /// charge still to come for the write.
    pub(crate) fn place_in_slab(
        &mut self,
        value: Contents,
        protect: Protect,
        index_growth: usize,
    ) -> Result<slab::SlotRef, OutOfMemory> {
        // A value larger than the whole budget cannot fit however much is
        // evicted: refuse it before evicting anything.
        if !self.could_ever_fit(value.len() + index_growth) {
            return Err(OutOfMemory);
        }
        let adoptable = match value {
            Contents::Owned(b) if b.len() >= ADOPT_MIN && self.arena.takes_span(b.len()) => Some(b),
            _ => None,
        };
        let mut evictions = 0;
        loop {
            let fits = |store: &Store, growth: usize| {
                store.budget == 0 || store.used_memory() + growth + index_growth <= store.budget
            };
            let may_map = fits(self, self.arena.growth_for(value.len()));
            let stored = match (value, adoptable) {
                // Kept as it arrived when the budget has room for it; else
                // copied into a span the pool has (no new memory), or
                // evicted for.
                (_, Some(b)) if fits(self, b.len()) => Ok(self.arena.adopt(b.clone())),
                (Contents::Owned(b), _) => self.arena.store(b, may_map),
                (Contents::Bytes(b), _) => self.arena.store(b, may_map),
                (Contents::Unwritten(len), _) => self.arena.store_unwritten(len, may_map),
            };
            let class = match stored {
                Ok(slot) => return Ok(slot),
                Err(NoRoom::Mmap) => return Err(OutOfMemory),
                Err(NoRoom::Full { class }) => class,
            };
            if self.policy == EvictionPolicy::NoEviction {
                return Err(OutOfMemory);
            }
            // Evictions by policy free slots of whatever class the victims
            // were in; when that keeps missing this value's class, a whole
            // page is emptied for it (rebalancing).
            evictions += 1;
            if evictions <= 64 && self.evict_one(protect, true).is_some() {
                continue;
            }
            let keep = (class != usize::MAX).then_some(class);
            // No page of another class to empty (every page is this
            // class's already; what policy took were heap values or other
            // classes' slots): evicting by policy goes on, as Redis evicts
            // until a write fits or nothing may go. It ends: each eviction
            // takes a value out of DRAM, and held values are never chosen.
            if !self.empty_a_page(keep, protect)
                && self.evict_one(protect, true).is_none()
                && !self.break_holds()
            {
                return Err(OutOfMemory);
            }
            evictions = 0;
        }
    }

    /// Evicts every value in the page best suited to be emptied (fewest
    /// values, none held) and unmaps it when the value needs a span.
    /// Returns whether it evicted anything.
    pub(crate) fn empty_a_page(&mut self, keep: Option<usize>, protect: Protect) -> bool {
        // Slots whose last holder just let go are free, not in use.
        self.arena.reclaim();
        let Some((page, slots)) = self.arena.page_to_empty(keep) else {
            return false;
        };
        let keys: Vec<Bytes> = slots
            .iter()
            .filter_map(|s| self.meta.slot_keys.get(&(page, *s)).cloned())
            .collect();
        if keys.is_empty() || keys.iter().any(|k| protect.covers(k) || self.held(k)) {
            return false;
        }
        // Not a page whose keys would take another tenant below its share
        // (fairness first: the write evicts by policy instead, or is
        // refused).
        if self.meta.tenants.fair() && !self.may_empty(&keys, protect) {
            return false;
        }
        for key in keys {
            self.evict_key(key_slot(&key), &key, EvictReason::Rebalance);
        }
        self.arena.reclaim();
        if keep.is_none() {
            self.arena.unmap_empty(self.arena.page_size());
        }
        true
    }

    /// Whether evicting all of `keys` (a page's) for `protect`'s write
    /// leaves every tenant but the writer at or above its share.
    fn may_empty(&self, keys: &[Bytes], protect: Protect) -> bool {
        let mut lose = [0usize; crate::tenants::TENANT_SLOTS];
        for k in keys {
            if let Some(e) = self.maps[self.index(key_slot(k))].get(&k[..]) {
                lose[e.tenant as usize] += e.cost(k.len()).dram;
            }
        }
        let t = &self.meta.tenants;
        (0..t.slots()).all(|s| {
            lose[s] == 0 || protect.tenant == Some(s as u8) || lose[s] <= t.excess(s, self.budget)
        })
    }

    /// Counts an eviction of a key of tenant slot `tenant` for `reason`,
    /// in all and for its tenant.
    pub(crate) fn count_eviction(&mut self, tenant: usize, reason: EvictReason) {
        self.stats.evicted_keys += 1;
        self.stats.evicted_by[reason as usize] += 1;
        self.stats.tenants.evicted[tenant] += 1;
    }

    /// Whether a lookup holds `key` against eviction now.
    pub(crate) fn held(&self, key: &[u8]) -> bool {
        !self.holds.is_empty() && self.holds.covers(key, crate::clock::now_ms())
    }

    /// Evicts `key` for `reason`: to the spill tier when it is on and
    /// takes it (`Some(true)`: still indexed), else out of the index,
    /// remembered and counted for its tenant (`Some(false)`); None if it
    /// is not there.
    pub(crate) fn evict_key(&mut self, slot: u16, key: &[u8], reason: EvictReason) -> Option<bool> {
        if self.spill_out(slot, key, false) {
            return Some(true);
        }
        let gone = self.drop_entry(slot, key)?;
        let tenant = gone.tenant as usize;
        self.remember_evicted(key, gone);
        self.count_eviction(tenant, reason);
        Some(false)
    }

    /// Keeps tenant slot `tenant` within its cap with `extra` more bytes
    /// of its in DRAM, evicting its own keys (never `protect`) by policy;
    /// `Err` when they cannot make room.
    pub(crate) fn within_cap(
        &mut self,
        tenant: u8,
        extra: usize,
        protect: Protect,
    ) -> Result<(), OutOfMemory> {
        if self.budget == 0 || !self.meta.tenants.capped(tenant) {
            return Ok(());
        }
        let cap =
            crate::tenants::part_of(self.budget, self.meta.tenants.limits[tenant as usize].cap);
        let over = |store: &Store| store.meta.tenants.usage[tenant as usize].dram + extra > cap;
        if extra > cap || (self.policy == EvictionPolicy::NoEviction && over(self)) {
            return Err(OutOfMemory);
        }
        let own = Order::one(tenant as usize);
        let dram_only = self.spill.is_some();
        while over(self) {
            if self.evict_among(&own, protect, dram_only).is_none() {
                return Err(OutOfMemory);
            }
        }
        Ok(())
    }

    /// Evicts by policy until `extra` more bytes fit the budget. `protect`
    /// is never chosen (the key being written).
    pub fn ensure_room(&mut self, extra: usize, protect: Protect) -> Result<(), OutOfMemory> {
        if self.budget == 0 {
            return Ok(());
        }
        if extra > self.budget {
            // Evicting everything would not make room.
            return Err(OutOfMemory);
        }
        let mut misses = 0;
        while self.used_memory() + extra > self.budget {
            // Empty pages are the cheapest memory to give back.
            let over = self.used_memory() + extra - self.budget;
            if self.arena.unmap_empty(over) > 0 {
                continue;
            }
            if self.policy == EvictionPolicy::NoEviction {
                return Err(OutOfMemory);
            }
            // Evicting a block frees a slot, not always a whole page: after
            // a few tries, empty a page outright.
            // With the spill tier, only blocks in DRAM are worth evicting:
            // one only on disk frees no DRAM.
            let dram_only = self.spill.is_some();
            misses += 1;
            if misses <= 16 && self.evict_one(protect, dram_only).is_some() {
                continue;
            }
            if !self.empty_a_page(None, protect)
                && self.evict_one(protect, dram_only).is_none()
                && !self.break_holds()
            {
                return Err(OutOfMemory);
            }
            misses = 0;
        }
        Ok(())
    }

    /// Whether `len` bytes could be stored at all: not more than this
    /// shard's whole budget. A write that could not fit in an empty shard is
    /// refused before anything is evicted for it.
    pub fn could_ever_fit(&self, len: usize) -> bool {
        self.budget == 0 || len <= self.budget
    }

    /// Whether `extra` more bytes would fit without evicting.
    pub fn fits(&self, extra: usize) -> bool {
        self.budget == 0 || self.used_memory() + extra <= self.budget
    }

    /// The tenants eviction for `protect`'s write may take from, in the
    /// order it should ([`crate::tenants::Tenants::victims`]).
    pub(crate) fn victim_tenants(&self, protect: Protect) -> Order {
        self.meta
            .tenants
            .victims(self.budget, protect.tenant.map(usize::from))
    }

    /// Evicts one key by policy; `None` if nothing may go. With the spill
    /// tier on, a block in DRAM is written to disk and stays readable.
    /// `dram_only`: only keys whose value is in DRAM (a slot is needed).
    /// The tenant is chosen first: the one furthest above its share, else
    /// the writer ([`Store::victim_tenants`]); then the key, by policy,
    /// among that tenant's.
    pub(crate) fn evict_one(&mut self, protect: Protect, dram_only: bool) -> Option<EvictReason> {
        let tenants = self.victim_tenants(protect);
        self.evict_among(&tenants, protect, dram_only)
    }

    /// [`Store::evict_one`] among the keys of `tenants`, tried in order.
    pub(crate) fn evict_among(
        &mut self,
        tenants: &Order,
        protect: Protect,
        dram_only: bool,
    ) -> Option<EvictReason> {
        let queued = match self.policy {
            EvictionPolicy::AllKeysLru => tenants
                .iter()
                .find_map(|t| self.lru_victim(t as u8, protect, dram_only)),
            EvictionPolicy::Prefix => tenants
                .iter()
                .find_map(|t| self.prefix_victim(t as u8, protect, dram_only)),
            _ => None,
        };
        let (slot, key, reason) = match queued {
            Some(found) => found,
            // The sampling policies; and keys the queues do not know yet
            // (written before the policy changed).
            None => {
                let (slot, key) = match self.meta.tenants.fair() {
                    false => self.pick_victim(protect, dram_only, None)?,
                    true => tenants
                        .iter()
                        .find_map(|t| self.pick_victim(protect, dram_only, Some(t)))?,
                };
                let reason = match self.policy {
                    EvictionPolicy::Prefix => EvictReason::Leaf,
                    _ => EvictReason::Policy,
                };
                (slot, key, reason)
            }
        };
        self.evict_key(slot, &key, reason)?;
        // Its parent may be a leaf now, its children orphans.
        self.settle_links();
        self.arena.reclaim();
        Some(reason)
    }
}
