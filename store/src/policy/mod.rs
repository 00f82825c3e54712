//! Eviction policies and the per-key recency/frequency they rank by.
//!
//! Victims are chosen Redis-style: sample a few random keys, evict the one
//! the policy ranks worst (highest [`score`]). LFU uses Redis's logarithmic
//! 8-bit counter with one decrement per idle minute. The `prefix` policy's
//! queues, ghosts and write classes are in [`prefix`]; the store's side of
//! eviction (choosing and removing victims) in `store/eviction.rs`.

pub mod prefix;
pub mod protect;

pub use prefix::{PrefixTuning, WriteClass};

use std::fmt;
use std::str::FromStr;

use crate::entry::{decayed, minutes, Entry, LFU_INIT};

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
    /// Prefix-aware (the default): orphaned blocks first, then cold final
    /// partial blocks, then leaves of chains by LRU over two levels of
    /// reuse, blocks with cached children last.
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

    /// Whether every key is queued in recency order (the `prefix` policy's
    /// levels, `allkeys-lru`'s one exact LRU queue); the other policies
    /// sample.
    pub fn queues(self) -> bool {
        matches!(self, EvictionPolicy::Prefix | EvictionPolicy::AllKeysLru)
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

const LFU_LOG_FACTOR: f64 = 10.0;

/// Records an access at logical time `tick`: recency always (the store's
/// clock, exact, for LRU; seconds for OBJECT IDLETIME), the use count the
/// `prefix` policy ranks by, frequency under LFU policies.
pub fn touch(entry: &mut Entry, policy: EvictionPolicy, now_ms: u64, tick: u32) {
    entry.atime = (now_ms / 1000) as u32;
    entry.tick = tick;
    entry.uses = entry.uses.saturating_add(1);
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
/// `tick` is the store's logical clock (LRU ranks by the ticks since the
/// last access: exact, where Redis's clock has a resolution of seconds).
pub fn score(entry: &Entry, policy: EvictionPolicy, now_ms: u64, tick: u32) -> u64 {
    match policy {
        EvictionPolicy::AllKeysLfu | EvictionPolicy::VolatileLfu => {
            255 - decayed(entry.lfu, entry.lfu_minutes, now_ms) as u64
        }
        EvictionPolicy::AllKeysRandom | EvictionPolicy::VolatileRandom => 0,
        EvictionPolicy::VolatileTtl => u64::MAX - entry.expire_at,
        _ => tick.wrapping_sub(entry.tick) as u64,
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
