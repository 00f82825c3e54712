//! The spill tier's life in a store: turned on, its counts, and the
//! shutdown paths (everything written out, the active segment sealed).

use super::SpillConfig;
use super::Store;
use crate::slot::key_slot;
use crate::spill::writer::SpillState;
use crate::spill::SpillDir;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Store {
    /// Turns the spill tier on for this store.
    pub fn enable_spill(&mut self, config: SpillConfig) {
        self.meta.disk = Some(Arc::clone(&config.dir));
        self.spill = Some(SpillState::new(config, |batch, result| {
            Box::new(move |store: &mut Store| store.batch_written(batch, result))
        }));
    }

    /// After FLUSHALL: no segment of the old keys stays in use.
    pub(super) fn spill_cleared(&mut self) {
        if let Some(spill) = &mut self.spill {
            spill.tombstones.clear();
            spill.seal_active();
        }
    }

    /// Whether a spill tier is configured.
    pub fn spill_enabled(&self) -> bool {
        self.spill.is_some()
    }

    /// Graceful shutdown: writes every block still in DRAM (and waits for
    /// the writes), so a restart loses nothing that fits on disk.
    pub fn spill_everything(&mut self) {
        if self.spill.is_none() {
            return;
        }
        let keys: Vec<(u16, Bytes)> = self
            .maps
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(_, e)| e.value.in_dram())
            .map(|(k, _)| (key_slot(k), k.clone()))
            .collect();
        if let Some(spill) = &mut self.spill {
            spill.shutting_down = true;
        }
        for (slot, key) in keys {
            if let Some(e) = self.maps[self.index(slot)].get(&key[..]) {
                if e.value.is_held() {
                    continue;
                }
            }
            self.spill_out(slot, &key, true);
        }
        self.close_spill();
    }

    /// Graceful shutdown: writes what waits (tombstones, the open batch)
    /// and the active segment's footer, and waits for the I/O threads, so
    /// the next start reads every segment's index from its footer.
    pub fn close_spill(&mut self) {
        self.flush_spill();
        let Some(spill) = &mut self.spill else {
            return;
        };
        spill.seal_active();
        // The batches report through the mailbox, which is not polled any
        // more: watch the queue instead.
        let dir = Arc::clone(&spill.config.dir);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while dir.counters.queue_depth.load(Relaxed) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// This shard's keys with a record in the spill tier (INFO).
    pub fn spill_keys(&self) -> usize {
        self.meta.disk_entries
    }

    /// Sets the spill admission (0: every evicted block).
    pub fn set_spill_admission(&mut self, reads: u8) {
        if let Some(spill) = &mut self.spill {
            spill.config.admission = reads;
        }
    }

    /// The shared spill directory, if the tier is on.
    pub fn spill_dir(&self) -> Option<&Arc<SpillDir>> {
        self.spill.as_ref().map(|s| s.dir())
    }
}
