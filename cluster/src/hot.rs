//! Hot keys: counted in bounded memory, copied to extra nodes, served there.
//!
//! * Counting. Each shard counts the reads it executes in a count-min
//!   sketch (4 rows × 4096 counters) and keeps the top [`TOP_K`] keys by
//!   estimate, over one-second windows. At the end of a window each shard
//!   publishes its top keys; the node adds the shards' counts up, and a key
//!   at or above `--hot-key-threshold` reads/s is hot.
//! * Copying. For a hot key it owns, the node sends `CLUSTER COPY key value
//!   pttl lease` to the next `--hot-key-replicas` nodes of the slot's
//!   rendezvous order, then renews the lease every window while the key
//!   stays hot (`CLUSTER LEASE`; a replica that lost the copy answers 0
//!   and gets the value again). Once a key is replicated, the replicas take
//!   their share of its reads, so it stays hot down to a lower rate (the
//!   threshold divided by the nodes that serve it), with no flapping.
//! * Serving. A node asked for a key it does not own serves its copy (if
//!   it has a live one) instead of forwarding: GET, MGET, EXISTS, STRLEN,
//!   GETRANGE and the read dialect, when every key has a copy; a read
//!   spread over nodes answers each other node's part from copies the same
//!   way.
//! * Invalidation. A write to a replicated key (DEL, SET, REPLACE, EXPIRE,
//!   ...) runs, then `CLUSTER UNCOPY` reaches every copy, and only then is
//!   the reply sent: once DEL returns, no node serves the key. A replica
//!   keeps a short tombstone so a copy already on its way cannot come back.
//!   FLUSHALL drops what the node copied out and what it holds. Copies
//!   carry the owner's expiry and a lease, so a copy never outlives either.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// One read in this many is counted.
pub const SAMPLE: u64 = 16;
/// Keys each shard tracks per window.
pub const TOP_K: usize = 256;
const ROWS: usize = 4;
const WIDTH: usize = 4096;
/// How long a copy lives without a renewal.
pub const LEASE: Duration = Duration::from_secs(5);
/// How long an invalidated key refuses new copies.
const TOMBSTONE: Duration = Duration::from_secs(2);
/// Bounds of one shard's copies.
const MAX_COPIES: usize = 4096;
const MAX_COPY_BYTES: usize = 512 << 20;

fn row_hash(key: &[u8], row: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 29;
    (h as usize) % WIDTH
}

/// Read counts of one shard for the current window.
pub struct HotCounter {
    sketch: Vec<u32>,
    top: HashMap<Bytes, u32>,
    /// The smallest count in `top` (recomputed when it may have changed).
    min: Option<(Bytes, u32)>,
    /// A xorshift state drawing which reads are counted: one in [`SAMPLE`]
    /// at random (a fixed stride would count the same positions of every
    /// request whose key count it divides: keys 15, 31, 47 and 63 of a
    /// 64-block MGETPREFIX, never the others).
    draw: u64,
    started: Instant,
}

impl Default for HotCounter {
    fn default() -> HotCounter {
        HotCounter {
            sketch: vec![0; ROWS * WIDTH],
            top: HashMap::new(),
            min: None,
            draw: 0x9e37_79b9_7f4a_7c15,
            started: Instant::now(),
        }
    }
}

impl HotCounter {
    /// Counts one read of `key` (one read in [`SAMPLE`], in fact: a hot key
    /// is read thousands of times a second, so the sample finds it at a
    /// sixteenth of the cost).
    pub fn record(&mut self, key: &Bytes) {
        let mut x = self.draw;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.draw = x;
        if !(x >> 32).is_multiple_of(SAMPLE) {
            return;
        }
        let mut estimate = u32::MAX;
        for row in 0..ROWS {
            let c = &mut self.sketch[row * WIDTH + row_hash(key, row)];
            *c = c.saturating_add(1);
            estimate = estimate.min(*c);
        }
        if let Some(count) = self.top.get_mut(key) {
            *count = estimate;
            if self.min.as_ref().is_some_and(|(k, _)| k == key) {
                self.min = None;
            }
            return;
        }
        if self.top.len() < TOP_K {
            self.top.insert(key.clone(), estimate);
            self.min = None;
            return;
        }
        // Replace the smallest candidate if this key now beats it.
        if self.min.is_none() {
            self.min = self
                .top
                .iter()
                .min_by_key(|(_, c)| **c)
                .map(|(k, c)| (k.clone(), *c));
        }
        if let Some((min_key, min)) = &self.min {
            if estimate > *min {
                self.top.remove(min_key);
                self.top.insert(key.clone(), estimate);
                self.min = None;
            }
        }
    }

    /// Ends the window: the top keys with their reads per second.
    pub fn rotate(&mut self) -> Vec<(Bytes, f64)> {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let out = self
            .top
            .drain()
            .map(|(k, c)| (k, (c as u64 * SAMPLE) as f64 / secs))
            .collect();
        self.sketch.iter_mut().for_each(|c| *c = 0);
        self.min = None;
        self.started = Instant::now();
        out
    }
}

/// A copy of another node's hot key.
struct Copy {
    value: Bytes,
    /// CRC32C of the value: a lease renews only a copy of the current one.
    digest: u32,
    /// Unix ms of the owner's expiry (0: none).
    expire_at: u64,
    lease_until: Instant,
}

/// One shard's copies of other nodes' hot keys.
#[derive(Default)]
pub struct Copies {
    map: HashMap<Bytes, Copy>,
    tombstones: HashMap<Bytes, Instant>,
    bytes: usize,
}

impl Copies {
    /// Stores a copy unless the key was just invalidated or the bounds are
    /// reached.
    pub fn insert(&mut self, key: Bytes, value: Bytes, expire_at: u64, lease: Duration) -> bool {
        let now = Instant::now();
        if self.tombstones.get(&key).is_some_and(|t| *t > now) {
            return false;
        }
        self.remove(&key);
        if self.map.len() >= MAX_COPIES || self.bytes + value.len() > MAX_COPY_BYTES {
            self.purge(now);
            if self.map.len() >= MAX_COPIES || self.bytes + value.len() > MAX_COPY_BYTES {
                return false;
            }
        }
        self.bytes += value.len();
        let digest = crc32c::crc32c(&value);
        self.map.insert(
            key,
            Copy {
                digest,
                value,
                expire_at,
                lease_until: now + lease,
            },
        );
        true
    }

    /// Extends a copy's lease; false if there is no live copy.
    /// Extends the lease of a copy of the value with `digest`; a copy of
    /// another value (the key was written meanwhile) is dropped instead.
    pub fn renew(&mut self, key: &[u8], lease: Duration, digest: u32) -> bool {
        match self.map.get_mut(key) {
            Some(c) if c.digest == digest => {
                c.lease_until = Instant::now() + lease.min(LEASE);
                true
            }
            Some(_) => {
                self.remove(key);
                false
            }
            None => false,
        }
    }

    /// Drops a copy and refuses new ones for a moment.
    pub fn invalidate(&mut self, key: &Bytes) {
        self.remove(key);
        let now = Instant::now();
        self.tombstones.retain(|_, t| *t > now);
        self.tombstones.insert(key.clone(), now + TOMBSTONE);
    }

    /// Drops every copy.
    pub fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(c) = self.map.remove(key) {
            self.bytes -= c.value.len();
        }
    }

    /// Drops expired copies and lapsed leases.
    pub fn purge(&mut self, now: Instant) {
        let unix = kvtier_store::now_ms();
        let mut freed = 0;
        self.map.retain(|_, c| {
            let live = c.lease_until > now && (c.expire_at == 0 || c.expire_at > unix);
            if !live {
                freed += c.value.len();
            }
            live
        });
        self.bytes -= freed;
    }

    /// The live copy of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Bytes> {
        let c = self.map.get(key)?;
        let live = c.lease_until > Instant::now()
            && (c.expire_at == 0 || c.expire_at > kvtier_store::now_ms());
        live.then_some(&c.value)
    }

    /// Number of copies held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no copy is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes of values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Where a key of this node is copied, and when its lease was last given.
#[derive(Debug, Clone)]
pub struct Replicated {
    /// Ids of the nodes holding (or being sent) a copy.
    pub nodes: Vec<String>,
    /// When the owner last sent a copy or renewed the lease.
    pub renewed: Instant,
}

/// What the node knows of hot keys: the shards' latest counts, and which of
/// its keys are copied where.
#[derive(Default)]
pub struct HotState {
    /// Each shard's top keys of its last window.
    pub(crate) reports: Vec<Vec<(Bytes, f64)>>,
    /// Hot keys and their rates, from the last aggregation.
    pub hot: Vec<(Bytes, f64)>,
    /// Keys this node owns that have copies, and the nodes holding them.
    /// Copies can outlive the key's heat by a lease, so a key is forgotten
    /// only once its last lease has run out.
    pub replicated: HashMap<Bytes, Replicated>,
}

/// What the owner holds for a replicated key this window.
pub enum Current {
    /// The value and its expiry (Unix ms, 0: none).
    Value(Bytes, u64),
    /// The key is gone: its copies must go too.
    Absent,
    /// Not known now (the value is on disk): copies lapse with their lease.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_heaviest_keys_in_bounded_memory() {
        let mut c = HotCounter::default();
        // Key i is read 20000 / (i + 1) times, among 60000 one-off keys.
        for round in 0..20_000u32 {
            for i in 0..20u32 {
                if round % (i + 1) == 0 {
                    c.record(&Bytes::from(format!("hot:{i}")));
                }
            }
            for j in 0..3 {
                c.record(&Bytes::from(format!("cold:{round}:{j}")));
            }
        }
        let top = c.rotate();
        assert!(top.len() <= TOP_K);
        for i in 0..20 {
            let key = Bytes::from(format!("hot:{i}"));
            assert!(top.iter().any(|(k, _)| *k == key), "hot:{i} missing");
        }
        assert!(c.rotate().is_empty(), "a new window starts empty");
    }

    #[test]
    fn every_key_of_a_repeated_multi_key_read_is_counted() {
        // 64 keys read together (a hot prefix), again and again: each is
        // estimated near its true count, whatever its position.
        let mut c = HotCounter::default();
        let keys: Vec<Bytes> = (0..64).map(|i| Bytes::from(format!("p:{i}"))).collect();
        for _ in 0..4_000 {
            for k in &keys {
                c.record(k);
            }
        }
        let secs = c.started.elapsed().as_secs_f64();
        let top: HashMap<Bytes, f64> = c.rotate().into_iter().collect();
        for k in &keys {
            let reads = top.get(k).copied().unwrap_or(0.0) * secs.max(0.001);
            assert!(
                (2_800.0..5_200.0).contains(&reads),
                "{k:?}: {reads:.0} reads counted of 4000"
            );
        }
    }

    #[test]
    fn copies_expire_with_their_lease_and_refuse_after_invalidation() {
        let mut c = Copies::default();
        let k = Bytes::from_static(b"k");
        assert!(c.insert(
            k.clone(),
            Bytes::from_static(b"v"),
            0,
            Duration::from_secs(5)
        ));
        assert_eq!(c.get(b"k"), Some(&Bytes::from_static(b"v")));
        assert!(
            !c.renew(b"k", LEASE, crc32c::crc32c(b"other")),
            "another value"
        );
        assert_eq!(c.get(b"k"), None, "dropped: it was a copy of another value");
        assert!(c.insert(
            k.clone(),
            Bytes::from_static(b"v"),
            0,
            Duration::from_secs(5)
        ));
        assert!(c.renew(b"k", Duration::from_millis(0), crc32c::crc32c(b"v")));
        assert_eq!(c.get(b"k"), None, "lapsed lease");
        c.invalidate(&k);
        assert!(
            !c.insert(k.clone(), Bytes::from_static(b"v"), 0, LEASE),
            "tombstoned"
        );
        assert_eq!(c.bytes(), 0);
        // The owner's expiry bounds the copy too.
        let past = kvtier_store::now_ms() - 1;
        assert!(c.insert(
            Bytes::from_static(b"e"),
            Bytes::from_static(b"x"),
            past,
            LEASE
        ));
        assert_eq!(c.get(b"e"), None);
        c.purge(Instant::now());
        assert!(c.is_empty());
    }
}
