//! One shard's keyspace: the index from key to value, expiry, memory
//! accounting and eviction.
//!
//! The index is one hash map per hash slot the shard owns, so a SCAN cursor
//! is a slot number (stable across inserts and deletes: every key present for
//! a whole SCAN is returned exactly once), and per-slot counts and listings
//! (for cluster commands) cost nothing extra.
//!
//! Keys with a time to live are also kept in a set ordered by expiry time:
//! active expiry pops exactly the keys that are due instead of sampling.

pub mod eviction;
pub mod slab;

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hashbrown::hash_map::{Entry as MapEntry, EntryRef};
use hashbrown::HashMap;
use tokio::sync::Notify;

pub use eviction::EvictionPolicy;

use crate::protocol::request::BIG_BULK;

/// Index bytes charged per key besides the key and value themselves: the
/// hash-table slot (key handle + entry), control byte and allocator headers.
pub const ENTRY_OVERHEAD: usize = 96;
/// Extra bytes charged per key that has a time to live (expiry-set node).
pub const EXPIRE_OVERHEAD: usize = 48;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How a string is reported by OBJECT ENCODING.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `int` when the value is an integer, else `embstr`/`raw` by length.
    Auto,
    /// `embstr`/`raw` by length, never `int` (INCRBYFLOAT results).
    NoInt,
    /// Always `raw` (values APPEND and SETRANGE built).
    Raw,
}

/// One key's value and bookkeeping.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The value, in memory this entry owns (never a slice of a read buffer).
    pub value: Bytes,
    /// Absolute expiry in Unix milliseconds; 0 means none.
    pub expire_at: u64,
    /// Last access, Unix seconds (truncated); drives LRU and OBJECT IDLETIME.
    pub(crate) atime: u32,
    /// Logarithmic access counter (LFU, OBJECT FREQ).
    pub(crate) lfu: u8,
    /// Minutes clock of the last LFU decrement.
    pub(crate) lfu_minutes: u16,
    /// OBJECT ENCODING.
    pub encoding: Encoding,
    /// The block this one continues (MSETBLOCK CHAIN), if the writer said.
    pub parent: Option<Bytes>,
}

impl Entry {
    fn new(value: Bytes, expire_at: u64, now: u64) -> Entry {
        Entry {
            value,
            expire_at,
            atime: (now / 1000) as u32,
            lfu: eviction::LFU_INIT,
            lfu_minutes: eviction::minutes(now),
            encoding: Encoding::Auto,
            parent: None,
        }
    }

    /// Whether the entry is past its expiry at `now`.
    pub fn expired(&self, now: u64) -> bool {
        self.expire_at != 0 && self.expire_at <= now
    }

    /// OBJECT ENCODING's answer.
    pub fn encoding_name(&self) -> &'static str {
        let v = &self.value;
        if self.encoding == Encoding::Auto
            && v.len() <= 20
            && crate::protocol::parse_i64_strict(v).is_some()
        {
            "int"
        } else if self.encoding != Encoding::Raw && v.len() <= 44 {
            "embstr"
        } else {
            "raw"
        }
    }

    /// Bytes charged for this entry under `key_len`.
    pub fn charge(&self, key_len: usize) -> usize {
        Store::charge(key_len, self.value.len(), self.expire_at != 0)
            + self.parent.as_ref().map_or(0, |p| p.len())
    }

    /// Seconds since the last access.
    pub fn idle_seconds(&self, now: u64) -> u64 {
        ((now / 1000) as u32).saturating_sub(self.atime) as u64
    }

    /// The LFU counter after decay, as OBJECT FREQ reports it.
    pub fn frequency(&self, now: u64) -> u8 {
        eviction::decayed(self.lfu, self.lfu_minutes, now)
    }
}

/// A blocked reader (MGETPREFIX BLOCK) waiting for a key to be written.
#[derive(Clone)]
pub struct Waiter {
    /// Identifies the waiter when it unregisters.
    pub id: u64,
    /// Woken on every write of a watched key.
    pub wake: Arc<Notify>,
}

/// The write did not fit in memory and nothing could be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// Counters a shard reports in INFO stats.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// Keys removed because their TTL passed.
    pub expired_keys: u64,
    /// Keys removed to make room.
    pub evicted_keys: u64,
    /// Reads that found their key.
    pub keyspace_hits: u64,
    /// Reads that did not.
    pub keyspace_misses: u64,
}

/// Counts and indexes kept beside the maps, updated on every insert and
/// removal (a separate struct so they can be borrowed beside a map entry).
#[derive(Default)]
struct Meta {
    /// Keys with a TTL, ordered by expiry.
    expires: BTreeSet<(u64, Bytes)>,
    /// Sum of `expire_at` over `expires` (for avg_ttl).
    expire_sum: u128,
    keys: usize,
    used: usize,
    /// WATCHed keys: the flags of the clients watching each (set on any
    /// change of the key, EXEC then fails).
    watched: HashMap<Bytes, Vec<(u64, Arc<AtomicBool>)>>,
}

impl Meta {
    fn modified(&self, key: &[u8]) {
        if !self.watched.is_empty() {
            if let Some(flags) = self.watched.get(key) {
                for (_, dirty) in flags {
                    dirty.store(true, Ordering::Release);
                }
            }
        }
    }

    fn added(&mut self, key: &Bytes, entry: &Entry) {
        self.modified(key);
        if entry.expire_at != 0 {
            self.expires.insert((entry.expire_at, key.clone()));
            self.expire_sum += entry.expire_at as u128;
        }
        self.used += entry.charge(key.len());
        self.keys += 1;
    }

    fn removed(&mut self, key: &Bytes, entry: &Entry) {
        self.modified(key);
        if entry.expire_at != 0 && self.expires.remove(&(entry.expire_at, key.clone())) {
            self.expire_sum -= entry.expire_at as u128;
        }
        self.used -= entry.charge(key.len());
        self.keys -= 1;
    }
}

/// The live entry for `key` in `map`, removing it first if it expired.
fn live<'m>(
    map: &'m mut HashMap<Bytes, Entry>,
    meta: &mut Meta,
    stats: &mut StoreStats,
    key: &[u8],
    now: u64,
) -> Option<&'m mut Entry> {
    match map.entry_ref(key) {
        EntryRef::Occupied(o) if o.get().expired(now) => {
            let (key, entry) = o.remove_entry();
            meta.removed(&key, &entry);
            stats.expired_keys += 1;
            None
        }
        EntryRef::Occupied(o) => Some(o.into_mut()),
        EntryRef::Vacant(_) => None,
    }
}

/// One shard's keyspace.
pub struct Store {
    /// One map per owned slot, indexed by `slot - slots.start`.
    maps: Vec<HashMap<Bytes, Entry>>,
    slots: Range<usize>,
    meta: Meta,
    budget: usize,
    policy: EvictionPolicy,
    samples: usize,
    max_value_len: usize,
    rng: u64,
    /// Blocked readers waiting for keys to be written.
    watchers: HashMap<Bytes, Vec<Waiter>>,
    /// Counters for INFO.
    pub stats: StoreStats,
}

impl Store {
    /// A store for `slots`, holding at most `budget` bytes (0: unbounded).
    pub fn new(slots: Range<usize>, budget: usize, policy: EvictionPolicy) -> Store {
        Store {
            maps: (0..slots.len()).map(|_| HashMap::new()).collect(),
            rng: 0x9e37_79b9_7f4a_7c15 ^ slots.start as u64,
            slots,
            meta: Meta::default(),
            budget,
            policy,
            samples: 5,
            max_value_len: 512 * 1024 * 1024,
            watchers: HashMap::new(),
            stats: StoreStats::default(),
        }
    }

    /// The slots this store owns.
    pub fn slots(&self) -> Range<usize> {
        self.slots.clone()
    }

    /// Number of keys (including expired ones not yet collected).
    pub fn len(&self) -> usize {
        self.meta.keys
    }

    /// Whether the store has no keys.
    pub fn is_empty(&self) -> bool {
        self.meta.keys == 0
    }

    /// Number of keys with a TTL.
    pub fn volatile_len(&self) -> usize {
        self.meta.expires.len()
    }

    /// Mean remaining TTL of volatile keys in milliseconds (0 if none).
    pub fn avg_ttl(&self, now: u64) -> u64 {
        if self.meta.expires.is_empty() {
            return 0;
        }
        let mean = (self.meta.expire_sum / self.meta.expires.len() as u128) as u64;
        mean.saturating_sub(now)
    }

    /// Bytes charged for keys, values and index.
    pub fn used_memory(&self) -> usize {
        self.meta.used
    }

    /// This shard's share of `maxmemory` (0: unbounded).
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Changes the memory budget; evicts now if the store is over it.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        let _ = self.ensure_room(0, None);
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Changes the eviction policy.
    pub fn set_policy(&mut self, policy: EvictionPolicy) {
        self.policy = policy;
    }

    /// Sets how many keys eviction samples per choice (maxmemory-samples).
    pub fn set_samples(&mut self, samples: usize) {
        self.samples = samples.clamp(1, 64);
    }

    /// Longest string a command may build (proto-max-bulk-len).
    pub fn max_value_len(&self) -> usize {
        self.max_value_len
    }

    /// Sets the longest string a command may build.
    pub fn set_max_value_len(&mut self, len: usize) {
        self.max_value_len = len;
    }

    /// Bytes charged for one key.
    pub fn charge(key_len: usize, value_len: usize, volatile: bool) -> usize {
        key_len + value_len + ENTRY_OVERHEAD + if volatile { EXPIRE_OVERHEAD } else { 0 }
    }

    fn index(&self, slot: u16) -> usize {
        slot as usize - self.slots.start
    }

    /// A live entry for reading: counts a hit or miss and, unless `touch` is
    /// false (CLIENT NO-TOUCH, side-effect-free commands), marks it used.
    pub fn read(&mut self, slot: u16, key: &[u8], now: u64, touch: bool) -> Option<&Entry> {
        let index = self.index(slot);
        let policy = self.policy;
        let found = live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        );
        match found {
            Some(entry) => {
                self.stats.keyspace_hits += 1;
                if touch {
                    eviction::touch(entry, policy, now);
                }
                Some(entry)
            }
            None => {
                self.stats.keyspace_misses += 1;
                None
            }
        }
    }

    /// A live entry without counting or touching (writes, EXISTS-like peeks).
    pub fn peek(&mut self, slot: u16, key: &[u8], now: u64) -> Option<&Entry> {
        let index = self.index(slot);
        live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        )
        .map(|e| &*e)
    }

    /// Marks a key as used (TOUCH); false if absent.
    pub fn touch(&mut self, slot: u16, key: &[u8], now: u64) -> bool {
        let index = self.index(slot);
        let policy = self.policy;
        match live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        ) {
            Some(entry) => {
                eviction::touch(entry, policy, now);
                true
            }
            None => false,
        }
    }

    /// Stores `value` under `key` with expiry `expire_at` (0: none), replacing
    /// any old value. Small values are copied into memory of their own; big
    /// ones (read into exact-size buffers) are kept as they are.
    pub fn insert(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        self.insert_with(slot, key, value, expire_at, Encoding::Auto, now)
    }

    /// [`Store::insert`] with an explicit OBJECT ENCODING.
    pub fn insert_with(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        encoding: Encoding,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        self.insert_entry(slot, key, value, expire_at, encoding, None, now)
    }

    /// Stores a value with every attribute given: the general write.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_entry(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        encoding: Encoding,
        parent: Option<Bytes>,
        now: u64,
    ) -> Result<Option<Entry>, OutOfMemory> {
        let index = self.index(slot);
        if self.budget != 0 {
            let new_charge = Self::charge(key.len(), value.len(), expire_at != 0)
                + parent.as_ref().map_or(0, |p| p.len());
            let old_charge = self.maps[index].get(key).map_or(0, |e| e.charge(key.len()));
            if new_charge > old_charge {
                self.ensure_room(new_charge - old_charge, Some(key))?;
            }
        }
        let value = if value.len() < BIG_BULK {
            Bytes::copy_from_slice(&value)
        } else {
            value
        };
        let mut entry = Entry::new(value, expire_at, now);
        entry.encoding = encoding;
        entry.parent = parent.map(|p| Bytes::copy_from_slice(&p));
        let old = match self.maps[index].entry(Bytes::copy_from_slice(key)) {
            MapEntry::Occupied(mut o) => {
                let old = std::mem::replace(o.get_mut(), entry);
                self.meta.removed(o.key(), &old);
                self.meta.added(o.key(), o.get());
                Some(old)
            }
            MapEntry::Vacant(v) => {
                let key = v.key().clone();
                let entry = v.insert(entry);
                self.meta.added(&key, entry);
                None
            }
        };
        if !self.watchers.is_empty() {
            if let Some(waiters) = self.watchers.get(key) {
                for w in waiters {
                    w.wake.notify_one();
                }
            }
        }
        Ok(old)
    }

    /// MSETBLOCK's write of one block: `1` stored, `0` already present and
    /// left unchanged (unless `replace`), `-1` not stored (no memory, or
    /// larger than this shard's whole budget).
    #[allow(clippy::too_many_arguments)]
    pub fn insert_block(
        &mut self,
        slot: u16,
        key: &[u8],
        value: Bytes,
        expire_at: u64,
        parent: Option<Bytes>,
        replace: bool,
        now: u64,
    ) -> i64 {
        if !replace && self.peek(slot, key, now).is_some() {
            return 0;
        }
        if self.budget != 0 && Self::charge(key.len(), value.len(), expire_at != 0) > self.budget {
            return -1;
        }
        match self.insert_entry(slot, key, value, expire_at, Encoding::Auto, parent, now) {
            Ok(_) => 1,
            Err(OutOfMemory) => -1,
        }
    }

    /// Wakes `waiter` whenever `key` is written, until [`Store::unwatch`].
    pub fn watch(&mut self, key: &[u8], waiter: Waiter) {
        match self.watchers.get_mut(key) {
            Some(waiters) => waiters.push(waiter),
            None => {
                self.watchers
                    .insert(Bytes::copy_from_slice(key), vec![waiter]);
            }
        }
    }

    /// Forgets waiter `id` on `key`.
    pub fn unwatch(&mut self, key: &[u8], id: u64) {
        if let Some(waiters) = self.watchers.get_mut(key) {
            waiters.retain(|w| w.id != id);
            if waiters.is_empty() {
                self.watchers.remove(key);
            }
        }
    }

    /// Number of keys readers are waiting for.
    pub fn watched_keys(&self) -> usize {
        self.watchers.len()
    }

    /// Deletes `key`, returning its entry.
    pub fn remove(&mut self, slot: u16, key: &[u8]) -> Option<Entry> {
        let index = self.index(slot);
        let (key, entry) = self.maps[index].remove_entry(key)?;
        self.meta.removed(&key, &entry);
        Some(entry)
    }

    /// Sets (or with 0 clears) the expiry of a live key; false if absent.
    pub fn set_expire(&mut self, slot: u16, key: &[u8], expire_at: u64, now: u64) -> bool {
        let index = self.index(slot);
        if live(
            &mut self.maps[index],
            &mut self.meta,
            &mut self.stats,
            key,
            now,
        )
        .is_none()
        {
            return false;
        }
        let Some((stored, entry)) = self.maps[index].get_key_value_mut(key) else {
            return false;
        };
        if entry.expire_at != expire_at {
            self.meta.removed(stored, entry);
            entry.expire_at = expire_at;
            self.meta.added(stored, entry);
        }
        true
    }

    /// Deletes every key.
    pub fn clear(&mut self) {
        for map in &mut self.maps {
            *map = HashMap::new();
        }
        // FLUSHALL/FLUSHDB change every watched key (as in Redis).
        let watched = std::mem::take(&mut self.meta.watched);
        for (_, dirty) in watched.values().flatten() {
            dirty.store(true, Ordering::Release);
        }
        self.meta = Meta {
            watched,
            ..Meta::default()
        };
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

    /// Active expiry: removes up to `limit` keys whose time has come.
    /// Returns how many it removed.
    pub fn expire_due(&mut self, now: u64, limit: usize) -> usize {
        let mut removed = 0;
        while removed < limit {
            let Some((at, key)) = self.meta.expires.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            let slot = crate::shard::slot::key_slot(&key);
            if self.remove(slot, &key).is_none() {
                // Not in the map (cannot happen): drop the stale node.
                self.meta.expires.remove(&(at, key));
                self.meta.expire_sum -= at as u128;
            }
            self.stats.expired_keys += 1;
            removed += 1;
        }
        removed
    }

    /// Evicts by policy until `extra` more bytes fit the budget. `protect`
    /// is never chosen (the key being written).
    pub fn ensure_room(&mut self, extra: usize, protect: Option<&[u8]>) -> Result<(), OutOfMemory> {
        if self.budget == 0 {
            return Ok(());
        }
        while self.meta.used + extra > self.budget {
            if self.policy == EvictionPolicy::NoEviction {
                return Err(OutOfMemory);
            }
            let Some((slot, key)) = self.pick_victim(protect) else {
                return Err(OutOfMemory);
            };
            self.remove(slot, &key);
            self.stats.evicted_keys += 1;
        }
        Ok(())
    }

    /// Whether `extra` more bytes would fit without evicting.
    pub fn fits(&self, extra: usize) -> bool {
        self.budget == 0 || self.meta.used + extra <= self.budget
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: cheap and good enough for sampling.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniformly chosen slot that holds keys, if any.
    fn random_nonempty_slot(&mut self) -> Option<usize> {
        if self.meta.keys == 0 {
            return None;
        }
        let n = self.maps.len();
        for _ in 0..64 {
            let i = (self.next_random() % n as u64) as usize;
            if !self.maps[i].is_empty() {
                return Some(i);
            }
        }
        let start = (self.next_random() % n as u64) as usize;
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.maps[i].is_empty())
    }

    /// One random key of the store (its slot index and key).
    fn random_entry(&mut self) -> Option<(usize, Bytes)> {
        let index = self.random_nonempty_slot()?;
        let len = self.maps[index].len() as u64;
        let nth = (self.next_random() % len) as usize;
        let (key, _) = self.maps[index].iter().nth(nth)?;
        Some((index, key.clone()))
    }

    /// A random live key (RANDOMKEY); expired keys met on the way are removed.
    pub fn random_key(&mut self, now: u64) -> Option<Bytes> {
        for _ in 0..100 {
            let (index, key) = self.random_entry()?;
            if !self.maps[index][&key].expired(now) {
                return Some(key);
            }
            let slot = (self.slots.start + index) as u16;
            self.remove(slot, &key);
            self.stats.expired_keys += 1;
        }
        None
    }

    fn pick_victim(&mut self, protect: Option<&[u8]>) -> Option<(u16, Bytes)> {
        let now = now_ms();
        if self.policy == EvictionPolicy::VolatileTtl {
            let (_, key) = self
                .meta
                .expires
                .iter()
                .find(|(_, k)| Some(&k[..]) != protect)?
                .clone();
            return Some((crate::shard::slot::key_slot(&key), key));
        }
        let volatile_only = self.policy.volatile_only();
        if volatile_only && self.meta.expires.is_empty() {
            return None;
        }
        let mut best: Option<(u64, usize, Bytes)> = None;
        let mut found = 0;
        for _ in 0..self.samples * 8 {
            if found >= self.samples {
                break;
            }
            let Some((index, key)) = self.random_entry() else {
                break;
            };
            if Some(&key[..]) == protect {
                continue;
            }
            let entry = &self.maps[index][&key];
            if volatile_only && entry.expire_at == 0 {
                continue;
            }
            found += 1;
            let score = eviction::score(entry, self.policy, now);
            if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, index, key));
            }
        }
        match best {
            Some((_, index, key)) => Some(((self.slots.start + index) as u16, key)),
            // Volatile keys too sparse to sample: take the soonest to expire.
            None if volatile_only => self
                .meta
                .expires
                .iter()
                .find(|(_, k)| Some(&k[..]) != protect)
                .map(|(_, k)| (crate::shard::slot::key_slot(k), k.clone())),
            None => None,
        }
    }

    /// SCAN step: keys of the slots from `from` on (within this store),
    /// whole slots at a time, until at least `count` keys were collected.
    /// Returns the keys and the next slot to visit (`None`: store finished).
    pub fn scan(
        &mut self,
        from: usize,
        count: usize,
        mut keep: impl FnMut(&[u8], &Entry) -> bool,
        now: u64,
    ) -> (Vec<Bytes>, Option<usize>) {
        let mut out = Vec::new();
        let mut slot = from.max(self.slots.start);
        while slot < self.slots.end {
            let map = &self.maps[slot - self.slots.start];
            out.extend(
                map.iter()
                    .filter(|(k, e)| !e.expired(now) && keep(k, e))
                    .map(|(k, _)| k.clone()),
            );
            slot += 1;
            if out.len() >= count {
                break;
            }
        }
        let next = (slot < self.slots.end).then_some(slot);
        (out, next)
    }

    /// Number of live keys in `slot`.
    pub fn count_in_slot(&self, slot: usize, now: u64) -> usize {
        if !self.slots.contains(&slot) {
            return 0;
        }
        self.maps[slot - self.slots.start]
            .values()
            .filter(|e| !e.expired(now))
            .count()
    }

    /// Iterates all live keys (KEYS).
    pub fn for_each_live(&self, now: u64, mut f: impl FnMut(&Bytes, &Entry)) {
        for map in &self.maps {
            for (k, e) in map {
                if !e.expired(now) {
                    f(k, e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::slot::{key_slot, SLOTS};

    fn store(budget: usize, policy: EvictionPolicy) -> Store {
        Store::new(0..SLOTS, budget, policy)
    }

    fn put(s: &mut Store, key: &str, value: &str, expire_at: u64) -> Result<(), OutOfMemory> {
        s.insert(
            key_slot(key.as_bytes()),
            key.as_bytes(),
            Bytes::from(value.to_owned()),
            expire_at,
            1000,
        )
        .map(|_| ())
    }

    fn get(s: &mut Store, key: &str, now: u64) -> Option<Bytes> {
        s.read(key_slot(key.as_bytes()), key.as_bytes(), now, true)
            .map(|e| e.value.clone())
    }

    #[test]
    fn insert_read_remove_and_accounting() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        put(&mut s, "a", "1", 0).unwrap();
        put(&mut s, "b", "22", 5000).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.volatile_len(), 1);
        assert_eq!(
            s.used_memory(),
            Store::charge(1, 1, false) + Store::charge(1, 2, true)
        );
        assert_eq!(get(&mut s, "a", 1000).unwrap(), "1");
        assert_eq!(get(&mut s, "b", 4999).unwrap(), "22");
        assert_eq!(get(&mut s, "b", 5000), None, "expired lazily");
        assert_eq!(s.stats.expired_keys, 1);
        assert_eq!(s.volatile_len(), 0);
        s.remove(key_slot(b"a"), b"a").unwrap();
        assert_eq!(s.used_memory(), 0);
        assert!(s.is_empty());
    }

    #[test]
    fn active_expiry_pops_due_keys_only() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        for i in 0..100 {
            put(&mut s, &format!("k{i}"), "v", 2000 + i).unwrap();
        }
        assert_eq!(s.expire_due(2049, 1000), 50);
        assert_eq!(s.len(), 50);
        assert_eq!(s.avg_ttl(2049), (2050 + 2099) / 2 - 2049);
    }

    #[test]
    fn set_expire_updates_index_and_charge() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        put(&mut s, "k", "v", 0).unwrap();
        assert!(s.set_expire(key_slot(b"k"), b"k", 9000, 1000));
        assert_eq!(s.used_memory(), Store::charge(1, 1, true));
        assert!(s.set_expire(key_slot(b"k"), b"k", 0, 1000));
        assert_eq!(s.used_memory(), Store::charge(1, 1, false));
        assert_eq!(s.volatile_len(), 0);
        assert!(!s.set_expire(key_slot(b"x"), b"x", 5, 1000));
    }

    #[test]
    fn noeviction_refuses_and_lru_evicts() {
        let each = Store::charge(4, 100, false);
        let mut s = store(each * 10, EvictionPolicy::NoEviction);
        let v = "x".repeat(100);
        for i in 0..10 {
            put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
        }
        assert_eq!(put(&mut s, "k999", &v, 0), Err(OutOfMemory));
        s.set_policy(EvictionPolicy::AllKeysLru);
        for i in 10..1000 {
            put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
            assert!(s.used_memory() <= each * 10);
        }
        assert_eq!(s.len(), 10);
        assert_eq!(s.stats.evicted_keys, 990);
    }

    #[test]
    fn scan_visits_every_key_once() {
        let mut s = store(0, EvictionPolicy::NoEviction);
        for i in 0..1000 {
            put(&mut s, &format!("key:{i}"), "v", 0).unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let mut cursor = Some(0);
        while let Some(from) = cursor {
            let (keys, next) = s.scan(from, 10, |_, _| true, 1000);
            for k in keys {
                assert!(seen.insert(k));
            }
            cursor = next;
        }
        assert_eq!(seen.len(), 1000);
    }
}
