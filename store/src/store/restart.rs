//! Warm restart: the records recovered from the spill tier loaded into the
//! index, while writes that arrive meanwhile win over older records.

use super::Store;
use crate::disk_index::DiskEntry;
use crate::entry::Entry;
use crate::slot::key_slot;
use crate::spill::{Recovered, Segment};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Store {
    /// The warm restart starts: until [`Store::loading_done`], every key
    /// written or deleted here is remembered (and gets a tombstone, so an
    /// older record of it cannot come back at a later restart either), and
    /// records loaded later never take its place.
    pub fn begin_loading(&mut self) {
        self.meta.loading = Some(crate::meta::Loading::default());
    }

    /// Whether the warm restart is still bringing this store's records.
    pub fn loading(&self) -> bool {
        self.meta.loading.is_some()
    }

    /// The warm restart is done: nothing more comes.
    pub fn loading_done(&mut self) {
        self.meta.loading = None;
    }

    /// Index entries for records the warm restart found, newest first: a
    /// record is kept only if its key is not in the index (a newer record
    /// of it came first) and was not written or deleted since the start
    /// (nor everything flushed). Returns how many were kept.
    pub fn insert_loaded(&mut self, records: Vec<Recovered>, now: u64) -> usize {
        let Some(loading) = self.meta.loading.take() else {
            return 0;
        };
        let mut kept = 0;
        // Live records per segment, added once per run of one segment: the
        // count is shared with the other shards and the loader, and a batch
        // comes from one or two segments.
        let mut live: Option<(Arc<Segment>, i64)> = None;
        for r in records {
            if loading.flushed || loading.touched.contains(&r.key[..]) {
                continue;
            }
            if r.expire_at != 0 && r.expire_at <= now {
                continue;
            }
            let index = self.index(key_slot(&r.key));
            if self.maps[index].contains_key(&r.key[..]) {
                continue;
            }
            let Recovered {
                key,
                loc,
                expire_at,
            } = r;
            // Into the compact index (unless a newer record of the key came
            // first); a record whose fields do not fit it gets a full entry
            // (its parent comes back when it is read).
            let added = match DiskEntry::loaded(key, &loc) {
                Ok(d) => match self.disk.insert(index, d, expire_at) {
                    Some(d) => {
                        let cost = d.cost();
                        self.meta.added_compact(d.key(), expire_at, cost);
                        true
                    }
                    None => false,
                },
                Err(key) => {
                    let mut entry = Entry::on_disk(loc.clone(), expire_at, now);
                    entry.tenant = self.meta.tenants.of(&key) as u8;
                    let key = Bytes::from(key);
                    self.meta.added(&key, &entry);
                    self.maps[index].insert(key, entry);
                    true
                }
            };
            if !added {
                continue;
            }
            kept += 1;
            match &mut live {
                Some((segment, n)) if Arc::ptr_eq(segment, &loc.segment) => *n += 1,
                _ => {
                    if let (Some((segment, n)), Some(dir)) = (live.take(), &self.meta.disk) {
                        dir.add_live(&segment, n);
                    }
                    live = Some((Arc::clone(&loc.segment), 1));
                }
            }
        }
        if let (Some((segment, n)), Some(dir)) = (live, &self.meta.disk) {
            dir.add_live(&segment, n);
        }
        if let Some(dir) = &self.meta.disk {
            dir.counters.recovered.fetch_add(kept as u64, Relaxed);
        }
        self.meta.loading = Some(loading);
        kept
    }
}
