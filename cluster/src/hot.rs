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
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_protocol::Reply;

use crate::peer::{call_once, PeerPool, CONTROL};
use crate::topology::View;
use crate::Cluster;

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
    reports: Vec<Vec<(Bytes, f64)>>,
    /// Hot keys and their rates, from the last aggregation.
    pub hot: Vec<(Bytes, f64)>,
    /// Keys this node owns that have copies, and the nodes holding them.
    /// Copies can outlive the key's heat by a lease, so a key is forgotten
    /// only once its last lease has run out.
    pub replicated: HashMap<Bytes, Replicated>,
}

impl Cluster {
    /// A shard's counts for the window that ended.
    pub fn report_hot(&self, shard: usize, shards: usize, top: Vec<(Bytes, f64)>) {
        let mut hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        hot.reports.resize_with(shards, Vec::new);
        hot.reports[shard] = top;
    }

    /// Adds the shards' reports up into the hot set (keys at or above the
    /// threshold, or above the lower renewal threshold when already
    /// replicated), hottest first.
    pub fn aggregate_hot(&self) -> Vec<(Bytes, f64)> {
        let mut state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let mut rates: HashMap<Bytes, f64> = HashMap::new();
        for report in &state.reports {
            for (k, r) in report {
                *rates.entry(k.clone()).or_default() += r;
            }
        }
        let threshold = self.hot_threshold as f64;
        let keep = threshold / (1 + self.hot_replicas) as f64 / 2.0;
        let mut hot: Vec<(Bytes, f64)> = rates
            .into_iter()
            .filter(|(k, r)| *r >= threshold || (state.replicated.contains_key(k) && *r >= keep))
            .collect();
        hot.sort_by(|a, b| b.1.total_cmp(&a.1));
        state.hot = hot.clone();
        hot
    }

    /// The nodes holding copies of `key`, removed from the record.
    pub fn take_replicated(&self, key: &[u8]) -> Option<Vec<String>> {
        if self.replicated_count.load(Relaxed) == 0 {
            return None;
        }
        let mut state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let nodes = state.replicated.remove(key).map(|r| r.nodes);
        self.replicated_count.store(state.replicated.len(), Relaxed);
        nodes
    }

    /// Whether `key` has copies on other nodes.
    pub fn is_replicated(&self, key: &[u8]) -> bool {
        self.has_replicated()
            && self
                .hot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replicated
                .contains_key(key)
    }

    /// Whether any of this node's keys has copies.
    pub fn has_replicated(&self) -> bool {
        self.replicated_count.load(Relaxed) > 0
    }

    /// Everything replicated, removed from the record (FLUSHALL).
    pub fn take_all_replicated(&self) -> Vec<(Bytes, Vec<String>)> {
        let mut state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        self.replicated_count.store(0, Relaxed);
        std::mem::take(&mut state.replicated)
            .into_iter()
            .map(|(k, r)| (k, r.nodes))
            .collect()
    }

    fn note_replicated(&self, key: Bytes, nodes: Vec<String>) {
        let mut state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let renewed = Instant::now();
        state.replicated.insert(key, Replicated { nodes, renewed });
        self.replicated_count.store(state.replicated.len(), Relaxed);
    }

    /// Forgets keys no longer hot whose copies have all lapsed (a write to
    /// a key whose copy may still be live must still reach it).
    pub fn forget_replicated(&self, keep: &[Bytes]) {
        let mut state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let lapsed = LEASE + Duration::from_secs(1);
        state
            .replicated
            .retain(|k, r| keep.contains(k) || r.renewed.elapsed() < lapsed);
        self.replicated_count.store(state.replicated.len(), Relaxed);
    }

    /// The current hot keys with their rates (CLUSTER HOTKEYS).
    pub fn hot_keys(&self) -> Vec<(Bytes, f64, Vec<String>)> {
        let state = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        state
            .hot
            .iter()
            .map(|(k, r)| {
                let copies = state
                    .replicated
                    .get(k)
                    .map(|r| r.nodes.clone())
                    .unwrap_or_default();
                (k.clone(), *r, copies)
            })
            .collect()
    }
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

impl Cluster {
    /// The first half of copying a hot key: records which nodes will hold
    /// copies, before the value is read, so that a write from now on finds
    /// the key replicated and sends UNCOPY (which also stops a copy still
    /// in flight: the replica's tombstone refuses it, or UNCOPY removes
    /// it). `false` when the slot has no replicas.
    pub fn start_copy(&self, view: &View, key: &Bytes) -> bool {
        let targets = view.replicas(kvtier_store::slot::key_slot(key), self.hot_replicas);
        if targets.is_empty() {
            return false;
        }
        self.note_replicated(
            key.clone(),
            targets.iter().map(|&t| view.nodes[t].id.clone()).collect(),
        );
        true
    }

    /// The second half, with the owners' values read after
    /// [`Cluster::start_copy`]: copies are checked against them every
    /// window, so a copy of an older value (a write that raced the copy)
    /// lives one window at most, and a deleted key's copies go at once.
    /// Replicas holding the current value get their lease renewed; the
    /// others get the value. Every key's LEASE goes out at once, then
    /// every missing COPY (one round trip each, not one per key and
    /// replica: under load a pass key by key outlasted the lease).
    pub async fn finish_copies(&self, pool: &PeerPool, view: &View, keys: Vec<(Bytes, Current)>) {
        let lease = Bytes::from(LEASE.as_millis().to_string());
        let mut renewals = Vec::new();
        let mut gone = Vec::new();
        for (key, current) in keys {
            let (value, expire_at) = match current {
                Current::Value(v, e) => (v, e),
                Current::Unknown => continue,
                Current::Absent => {
                    if let Some(nodes) = self.take_replicated(&key) {
                        gone.push((key, nodes));
                    }
                    continue;
                }
            };
            let digest = Bytes::from(crc32c::crc32c(&value).to_string());
            for t in view.replicas(kvtier_store::slot::key_slot(&key), self.hot_replicas) {
                let args = vec![
                    Bytes::from_static(b"CLUSTER"),
                    Bytes::from_static(b"LEASE"),
                    key.clone(),
                    lease.clone(),
                    digest.clone(),
                ];
                let rx = pool.send(&self.identity, &view.nodes[t], CONTROL, args);
                renewals.push((rx, t, key.clone(), value.clone(), expire_at));
            }
        }
        if !gone.is_empty() {
            self.uncopy(pool, view, gone).await;
        }
        let mut copies = Vec::new();
        for (rx, t, key, value, expire_at) in renewals {
            if matches!(rx.await, Ok(Reply::Int(1))) {
                continue;
            }
            let args = vec![
                Bytes::from_static(b"CLUSTER"),
                Bytes::from_static(b"COPY"),
                key,
                value,
                Bytes::from(expire_at.to_string()),
                lease.clone(),
            ];
            copies.push(pool.send(&self.identity, &view.nodes[t], CONTROL, args));
        }
        for rx in copies {
            if matches!(rx.await, Ok(Reply::Int(1))) {
                self.stats.copies_sent.fetch_add(1, Relaxed);
            }
        }
    }

    /// Tells every node holding a copy of one of `keys` to drop it, and
    /// waits for their answers.
    pub async fn uncopy(&self, pool: &PeerPool, view: &View, keys: Vec<(Bytes, Vec<String>)>) {
        let mut waits = Vec::new();
        for (key, nodes) in keys {
            for id in nodes {
                let Some(i) = view.index_of(&id) else {
                    continue;
                };
                let args = vec![
                    Bytes::from_static(b"CLUSTER"),
                    Bytes::from_static(b"UNCOPY"),
                    key.clone(),
                ];
                let rx = pool.send(&self.identity, &view.nodes[i], CONTROL, args);
                waits.push((rx, i, key.clone()));
            }
        }
        for (w, i, key) in waits {
            if w.await.is_err() {
                // The pooled connection failed: once more on a fresh one
                // (UNCOPY can be repeated safely).
                let args = [
                    Bytes::from_static(b"CLUSTER"),
                    Bytes::from_static(b"UNCOPY"),
                    key,
                ];
                let _ = kvtier_timer::timeout(
                    Duration::from_secs(2),
                    call_once(&self.identity, view.nodes[i].addr(), false, &args),
                )
                .await;
            }
        }
    }
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
