//! Eviction policies and the per-key recency/frequency they rank by.
//!
//! Victims are chosen Redis-style: sample a few random keys, evict the one
//! the policy ranks worst (highest [`score`]). LFU uses Redis's logarithmic
//! 8-bit counter with one decrement per idle minute.

use std::fmt;
use std::str::FromStr;

use std::collections::{HashSet, VecDeque};

use bytes::Bytes;

use crate::entry::Queue;
use crate::slot::key_slot;
use crate::{now_ms, Entry, EvictReason, Store};

/// `maxmemory-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Writes that need memory fail with OOM.
    NoEviction,
    /// Least recently used among all keys.
    AllKeysLru,
    /// Least frequently used among all keys.
    AllKeysLfu,
    /// Any key.
    AllKeysRandom,
    /// Least recently used among keys with a TTL.
    VolatileLru,
    /// Least frequently used among keys with a TTL.
    VolatileLfu,
    /// Any key with a TTL.
    VolatileRandom,
    /// The key with the nearest expiry.
    VolatileTtl,
    /// Prefix-aware (the default): orphaned blocks first, then leaves of
    /// chains by S3-FIFO, blocks with cached children last.
    Prefix,
}

impl EvictionPolicy {
    /// Every policy, in the order CONFIG documents them.
    pub const ALL: [EvictionPolicy; 9] = [
        EvictionPolicy::NoEviction,
        EvictionPolicy::AllKeysLru,
        EvictionPolicy::AllKeysLfu,
        EvictionPolicy::AllKeysRandom,
        EvictionPolicy::VolatileLru,
        EvictionPolicy::VolatileLfu,
        EvictionPolicy::VolatileRandom,
        EvictionPolicy::VolatileTtl,
        EvictionPolicy::Prefix,
    ];

    /// The name used in configuration.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::NoEviction => "noeviction",
            EvictionPolicy::AllKeysLru => "allkeys-lru",
            EvictionPolicy::AllKeysLfu => "allkeys-lfu",
            EvictionPolicy::AllKeysRandom => "allkeys-random",
            EvictionPolicy::VolatileLru => "volatile-lru",
            EvictionPolicy::VolatileLfu => "volatile-lfu",
            EvictionPolicy::VolatileRandom => "volatile-random",
            EvictionPolicy::VolatileTtl => "volatile-ttl",
            EvictionPolicy::Prefix => "prefix",
        }
    }

    /// Whether only keys with a TTL may be evicted.
    pub fn volatile_only(self) -> bool {
        matches!(
            self,
            EvictionPolicy::VolatileLru
                | EvictionPolicy::VolatileLfu
                | EvictionPolicy::VolatileRandom
                | EvictionPolicy::VolatileTtl
        )
    }

    /// Whether the policy tracks frequency (OBJECT FREQ works, IDLETIME not).
    pub fn is_lfu(self) -> bool {
        matches!(
            self,
            EvictionPolicy::AllKeysLfu | EvictionPolicy::VolatileLfu
        )
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvictionPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("invalid maxmemory-policy '{s}'"))
    }
}

/// Initial LFU counter of a new key (so it is not evicted at once).
pub const LFU_INIT: u8 = 5;
const LFU_LOG_FACTOR: f64 = 10.0;

/// A 16-bit minutes clock for LFU decay.
pub fn minutes(now_ms: u64) -> u16 {
    ((now_ms / 60_000) & 0xffff) as u16
}

/// The LFU counter after one decrement per minute idle since `since`.
pub fn decayed(counter: u8, since: u16, now_ms: u64) -> u8 {
    let elapsed = minutes(now_ms).wrapping_sub(since);
    counter.saturating_sub(elapsed.min(255) as u8)
}

/// Records an access: recency always, S3-FIFO reuse under `prefix`,
/// frequency under LFU policies.
pub fn touch(entry: &mut Entry, policy: EvictionPolicy, now_ms: u64) {
    entry.atime = (now_ms / 1000) as u32;
    entry.freq = (entry.freq + 1).min(3);
    if policy.is_lfu() {
        let counter = decayed(entry.lfu, entry.lfu_minutes, now_ms);
        entry.lfu = log_increment(counter, now_ms);
        entry.lfu_minutes = minutes(now_ms);
    }
}

/// Redis's probabilistic logarithmic increment: the higher the counter, the
/// less likely one access raises it.
fn log_increment(counter: u8, seed: u64) -> u8 {
    if counter == 255 {
        return 255;
    }
    // A cheap pseudo-random number in [0, 1) from the clock and counter.
    let mut x = seed ^ ((counter as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    let r = (x >> 11) as f64 / (1u64 << 53) as f64;
    let base = counter.saturating_sub(LFU_INIT) as f64;
    let p = 1.0 / (base * LFU_LOG_FACTOR + 1.0);
    if r < p {
        counter + 1
    } else {
        counter
    }
}

/// How strongly the policy wants to evict `entry`: higher goes first.
pub fn score(entry: &Entry, policy: EvictionPolicy, now_ms: u64) -> u64 {
    match policy {
        EvictionPolicy::AllKeysLfu | EvictionPolicy::VolatileLfu => {
            255 - decayed(entry.lfu, entry.lfu_minutes, now_ms) as u64
        }
        EvictionPolicy::AllKeysRandom | EvictionPolicy::VolatileRandom => 0,
        EvictionPolicy::VolatileTtl => u64::MAX - entry.expire_at,
        _ => entry.idle_seconds(now_ms),
    }
}

/// Recently evicted keys (by hash), so a key that comes back soon enters
/// the main queue directly (S3-FIFO's ghost queue).
#[derive(Default)]
pub(crate) struct Ghost {
    pub(crate) set: HashSet<u64>,
    pub(crate) order: VecDeque<u64>,
}

impl Ghost {
    pub(crate) fn insert(&mut self, hash: u64, capacity: usize) {
        if self.set.insert(hash) {
            self.order.push_back(hash);
        }
        while self.order.len() > capacity.max(64) {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(crate) fn take(&mut self, hash: u64) -> bool {
        self.set.remove(&hash)
    }
}

/// The eviction queues of the `prefix` policy.
#[derive(Default)]
pub(crate) struct PrefixQueues {
    pub(crate) small: VecDeque<(Bytes, u32)>,
    pub(crate) main: VecDeque<(Bytes, u32)>,
    pub(crate) orphans: VecDeque<(Bytes, u32)>,
    pub(crate) ghost: Ghost,
}

pub(crate) fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Store {
    /// The `prefix` policy's victim: an orphan if there is one, else a leaf
    /// chosen by S3-FIFO (a small probationary FIFO and a main FIFO with
    /// reinsertion of reused keys), else, when nothing but inner blocks is
    /// left, an inner block. Held values are never chosen.
    pub(crate) fn prefix_victim(
        &mut self,
        protect: Option<&[u8]>,
        dram_only: bool,
    ) -> Option<(u16, Bytes, EvictReason)> {
        // 1. Orphans: unreachable by any prefix lookup. Held ones (and the
        // key being written, and blocks on disk when a slot is needed) stay
        // queued: they go first once free.
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some((key, gen)) = self.queues.orphans.pop_front() {
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get(&key[..]) else {
                continue;
            };
            if e.gen != gen || !e.orphan {
                continue;
            }
            if e.value.is_held() || Some(&key[..]) == protect || (dram_only && !e.value.in_dram()) {
                skipped.push((key, gen));
                continue;
            }
            found = Some((slot, key, EvictReason::Orphan));
            break;
        }
        for entry in skipped.into_iter().rev() {
            self.queues.orphans.push_front(entry);
        }
        if found.is_some() {
            return found;
        }
        // 2. S3-FIFO over the leaves; inner blocks are passed over.
        let mut budget = 2 * (self.queues.small.len() + self.queues.main.len()) + 8;
        let mut inner: Option<(u16, Bytes)> = None;
        while budget > 0 {
            budget -= 1;
            let live = self.meta.small_live + self.meta.main_live;
            let from_small = !self.queues.small.is_empty()
                && (self.meta.small_live * 10 > live || self.queues.main.is_empty());
            let popped = if from_small {
                self.queues.small.pop_front()
            } else {
                self.queues.main.pop_front()
            };
            let Some((key, gen)) = popped else { break };
            let slot = key_slot(&key);
            let index = self.index(slot);
            let Some(e) = self.maps[index].get_mut(&key[..]) else {
                continue;
            };
            if e.gen != gen {
                continue;
            }
            if !e.value.in_dram() {
                // Spilled: it left DRAM, and the queues with it.
                match e.queue {
                    Queue::Small => self.meta.small_live -= 1,
                    Queue::Main => self.meta.main_live -= 1,
                    Queue::Out => {}
                }
                e.queue = Queue::Out;
                e.gen = 0;
                if dram_only {
                    continue;
                }
                return Some((slot, key, EvictReason::Leaf));
            }
            let keep = e.value.is_held() || Some(&key[..]) == protect;
            if from_small {
                if e.freq > 1 || e.children > 0 || keep {
                    // Reused (or an inner node, or held): promote.
                    e.queue = Queue::Main;
                    e.freq = 0;
                    self.meta.small_live -= 1;
                    self.meta.main_live += 1;
                    self.queues.main.push_back((key, gen));
                    continue;
                }
                return Some((slot, key, EvictReason::Leaf));
            }
            if e.freq > 0 || keep {
                e.freq = e.freq.saturating_sub(1);
                self.queues.main.push_back((key, gen));
                continue;
            }
            if e.children > 0 {
                if inner.is_none() {
                    inner = Some((slot, key.clone()));
                }
                self.queues.main.push_back((key, gen));
                continue;
            }
            return Some((slot, key, EvictReason::Leaf));
        }
        // 3. Only inner blocks left: its descendants become orphans.
        inner.map(|(slot, key)| (slot, key, EvictReason::Inner))
    }

    pub(crate) fn next_random(&mut self) -> u64 {
        // xorshift64*: cheap and good enough for sampling.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniformly chosen slot that holds keys, if any.
    pub(crate) fn random_nonempty_slot(&mut self) -> Option<usize> {
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
    pub(crate) fn random_entry(&mut self) -> Option<(usize, Bytes)> {
        let index = self.random_nonempty_slot()?;
        let len = self.maps[index].len() as u64;
        let nth = (self.next_random() % len) as usize;
        let (key, _) = self.maps[index].iter().nth(nth)?;
        Some((index, key.clone()))
    }

    /// Redis-style sampled choice for the classic policies (held values and
    /// `protect` are skipped).
    pub(crate) fn pick_victim(
        &mut self,
        protect: Option<&[u8]>,
        dram_only: bool,
    ) -> Option<(u16, Bytes)> {
        let now = now_ms();
        let policy = match self.policy {
            // Keys the prefix queues do not know yet: rank by recency.
            EvictionPolicy::Prefix => EvictionPolicy::AllKeysLru,
            p => p,
        };
        if policy == EvictionPolicy::VolatileTtl {
            let (_, key) = self
                .meta
                .expires
                .iter()
                .find(|(_, k)| Some(&k[..]) != protect)?
                .clone();
            return Some((key_slot(&key), key));
        }
        let volatile_only = policy.volatile_only();
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
            if (volatile_only && entry.expire_at == 0)
                || entry.value.is_held()
                || (dram_only && !entry.value.in_dram())
            {
                continue;
            }
            found += 1;
            let score = score(entry, policy, now);
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
                .map(|(_, k)| (key_slot(k), k.clone())),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.name().parse::<EvictionPolicy>().unwrap(), p);
        }
        assert!("ALLKEYS-LRU".parse::<EvictionPolicy>().is_ok());
        assert!("bogus".parse::<EvictionPolicy>().is_err());
    }

    #[test]
    fn lfu_counter_grows_slowly_and_decays() {
        let mut counter = LFU_INIT;
        for i in 0..1000u64 {
            counter = log_increment(counter, i * 7919);
        }
        assert!(counter > LFU_INIT && counter < 60, "{counter}");
        assert_eq!(decayed(10, minutes(0), 3 * 60_000), 7);
        assert_eq!(decayed(2, minutes(0), 10 * 60_000), 0);
    }
}
