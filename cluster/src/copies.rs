//! The hot-key exchange on a node ([`Cluster`]'s side of [`crate::hot`]):
//! the shards' counts added up, copies sent, leased, renewed and
//! invalidated, and the copies other nodes sent served.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_protocol::Reply;

use crate::hot::{Current, Replicated, LEASE};
use crate::membership::Cluster;
use crate::peer::{call_once, PeerPool, CONTROL};
use crate::topology::View;

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
