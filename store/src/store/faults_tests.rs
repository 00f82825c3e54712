use std::sync::Mutex;

use super::keyspace::BlockWrite;
use super::{SpillConfig, Store, StoreJob};
use crate::disk_index::DISK_ENTRY_OVERHEAD;
use crate::policy::EvictionPolicy;
use crate::slot::key_slot;
use crate::spill::fetch::Fetched;
use crate::spill::{IoPool, SpillDir};
use bytes::Bytes;

use super::*;
use crate::disk_index::{DiskEntry, TTL};

type Jobs = Arc<Mutex<Vec<StoreJob>>>;

/// A store with the tier on over a fresh directory; the I/O threads'
/// reports wait in the returned queue until [`settle_io`].
fn store(
    name: &str,
    budget: usize,
    policy: EvictionPolicy,
) -> (Store, Jobs, Arc<SpillDir>, std::path::PathBuf) {
    let path =
        std::env::temp_dir().join(format!("kvtier-disk-index-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let d = Arc::new(SpillDir::open(&path, 0).unwrap());
    let jobs: Jobs = Arc::default();
    let queue = Arc::clone(&jobs);
    let mut s = Store::new(0..crate::slot::SLOTS, budget, policy);
    s.enable_spill(SpillConfig {
        dir: Arc::clone(&d),
        pool: Arc::new(IoPool::start(1)),
        post: Arc::new(move |job| queue.lock().unwrap().push(job)),
        shard: 0,
        admission: 0,
    });
    (s, jobs, d, path)
}

/// Runs the I/O threads' reports until nothing is in flight, with
/// the end of each batch of work the shard would run.
fn settle_io(s: &mut Store, jobs: &Jobs, d: &SpillDir) {
    loop {
        // The shard's round: link events, then the spill's work.
        s.take_link_events();
        s.flush_spill();
        while d
            .counters
            .queue_depth
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let ready = std::mem::take(&mut *jobs.lock().unwrap());
        if ready.is_empty() && !s.has_deferred_work() {
            return;
        }
        ready.into_iter().for_each(|job| job(s));
    }
}

fn block(i: u8) -> Bytes {
    Bytes::from(vec![i; 5000])
}

fn in_maps(s: &Store) -> usize {
    s.maps.iter().map(|m| m.len()).sum()
}

/// A read of `key` (a disk read when it is on disk only), its bytes.
fn get(s: &mut Store, jobs: &Jobs, d: &SpillDir, key: &str) -> Option<Bytes> {
    let now = crate::clock::now_ms();
    match s.read_value(key_slot(key.as_bytes()), key.as_bytes(), now, true)? {
        Fetched::Now(b) => Some(b),
        Fetched::Later { read, .. } => {
            let mut rx = read.into_receiver();
            settle_io(s, jobs, d);
            rx.try_recv().ok().flatten()
        }
    }
}

#[test]
fn blocks_on_disk_only_live_in_the_compact_index_and_serve_every_command() {
    let (mut s, jobs, d, path) = store("commands", 64 << 20, EvictionPolicy::AllKeysLru);
    let now = crate::clock::now_ms();
    let keys = ["p", "c", "x", "y"];
    for (i, k) in keys.iter().enumerate() {
        let write = BlockWrite {
            parent: (*k == "c").then(|| Bytes::from_static(b"p")),
            ..BlockWrite::default()
        };
        let slot = key_slot(k.as_bytes());
        assert_eq!(
            s.insert_block(slot, k.as_bytes(), block(i as u8), write, now),
            1
        );
    }
    s.spill_everything();
    settle_io(&mut s, &jobs, &d);
    assert_eq!((s.compact_disk_keys(), in_maps(&s), s.len()), (4, 0, 4));
    let charged = s.disk_index_memory();
    assert_eq!(charged, keys.len() * (1 + DISK_ENTRY_OVERHEAD));

    // A read goes to the disk and leaves the block compact.
    assert_eq!(get(&mut s, &jobs, &d, "x"), Some(block(2)));
    assert_eq!((s.compact_disk_keys(), in_maps(&s)), (4, 0));
    // Walks see every key.
    let (mut seen, _, _) = s.scan(0, usize::MAX, |_| true, now);
    seen.sort();
    assert_eq!(seen, ["c", "p", "x", "y"]);
    let slot = key_slot(b"y") as usize;
    assert_eq!(s.count_in_slot(slot, now), 1);
    assert_eq!(s.keys_in_slot(slot, 10, now), ["y"]);
    assert!(s.random_key(now).is_some());
    let mut walked = 0;
    s.for_each_live(now, |_, e| walked += e.value.len());
    assert_eq!(walked, 4 * 5000);
    assert!(s.contains(slot as u16, b"y", now));
    assert!(!s.contains(slot as u16, b"absent", now));

    // EXPIRE changes it in the map; it goes back with its expiry.
    let at = now + 3_600_000;
    assert!(s.set_expire(slot as u16, b"y", at, now));
    settle_io(&mut s, &jobs, &d);
    assert_eq!((s.compact_disk_keys(), in_maps(&s)), (4, 0));
    let slot = slot as u16;
    assert_eq!(s.peek(slot, b"y", now).map(|e| e.expire_at), Some(at));
    // Past its expiry it is a miss.
    assert!(s.peek(slot, b"y", at).is_none());
    assert_eq!((s.len(), s.compact_disk_keys()), (3, 3));

    // Read often enough, a block comes back into DRAM with the
    // parent its record names, and the parent counts it again.
    for _ in 0..3 {
        assert_eq!(get(&mut s, &jobs, &d, "c"), Some(block(1)));
    }
    // c is in DRAM; p, counting a child, is a full entry again.
    assert_eq!(s.compact_disk_keys(), 1, "only x");
    let c = s.peek(key_slot(b"c"), b"c", now).unwrap();
    assert!(c.value.in_dram());
    assert_eq!(c.parent.as_deref(), Some(&b"p"[..]));
    s.settle_links();
    assert!(s
        .meta
        .counted
        .get(&b"p"[..])
        .is_some_and(|c| c.contains(&b"c"[..])));
    settle_io(&mut s, &jobs, &d);
    assert_eq!(
        s.compact_disk_keys(),
        1,
        "a parent with children stays a full entry"
    );
    // Once its child is gone, the parent goes back.
    assert!(s.remove(key_slot(b"c"), b"c").is_some());
    settle_io(&mut s, &jobs, &d);
    assert_eq!(s.compact_disk_keys(), 2, "p and x");

    // DEL of a compact key leaves a tombstone.
    assert!(s.remove(key_slot(b"x"), b"x").is_some());
    assert_eq!((s.len(), s.compact_disk_keys()), (1, 1));
    assert_eq!(get(&mut s, &jobs, &d, "x"), None);

    // FLUSHALL lets every record go.
    s.clear();
    settle_io(&mut s, &jobs, &d);
    assert_eq!(
        (s.len(), s.compact_disk_keys(), s.disk_index_memory()),
        (0, 0, 0)
    );
    let _ = std::fs::remove_dir_all(&path);
}

/// One operation of [`random_operations_keep_values_and_counts`]:
/// on key `k` of a few, (0, 6) write a new version (chained to key
/// `k - 1` when odd), (1) delete, (2) read, (3) set a TTL an hour
/// away, (4) remove the TTL, (5) let the I/O threads report, (7)
/// write every block in DRAM to disk.
type Op = (u8, u8);

fn check_counts(s: &Store) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let maps: usize = s.maps.iter().map(|m| m.len()).sum();
    prop_assert_eq!(s.len(), maps + s.disk.len(), "keys");
    let mut index = s.disk.all().map(DiskEntry::charge).sum::<usize>();
    let mut with_record = s.disk.len();
    for (k, e) in s.maps.iter().flatten() {
        index += e.disk_index_charge(k.len());
        with_record += e.value.disk().is_some() as usize;
        prop_assert_eq!(
            s.disk.get(s.index(key_slot(k)), k).is_some(),
            false,
            "in both"
        );
    }
    prop_assert_eq!(s.disk_index_memory(), index, "disk index bytes");
    let mut tenants = [crate::tenants::TenantUse::default(); crate::tenants::TENANT_SLOTS];
    let costs = s.disk.all().map(|d| (d.key(), d.cost())).chain(
        s.maps
            .iter()
            .flatten()
            .map(|(k, e)| (&k[..], e.cost(k.len()))),
    );
    for (k, cost) in costs {
        let t = &mut tenants[s.meta.tenants.of(k)];
        t.dram += cost.dram;
        t.disk += cost.disk;
        t.keys += 1;
    }
    prop_assert_eq!(s.tenant_usage(), tenants, "what each tenant holds");
    prop_assert_eq!(s.spill_keys(), with_record, "keys with a record");
    let volatile = s
        .maps
        .iter()
        .flatten()
        .filter(|(_, e)| e.expire_at != 0)
        .count()
        + s.disk.all().filter(|d| d.flags & TTL != 0).count();
    prop_assert_eq!(s.volatile_len(), volatile, "keys with a TTL");
    prop_assert_eq!(
        s.disk.expiries.len(),
        s.disk.all().filter(|d| d.flags & TTL != 0).count()
    );
    Ok(())
}

fn random_operations(
    ops: &[Op],
    policy: EvictionPolicy,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    // A small DRAM tier: most blocks live on disk only.
    let name = format!("prop-{}-{}", policy.name(), ops.len());
    let (mut s, jobs, d, path) = store(&name, 128 << 10, policy);
    // Two named tenants and the default: blocks moving between
    // DRAM, the disk and the compact table stay counted for theirs.
    s.set_tenants(&[
        vec![crate::tenants::KeyPattern::parse("k1*").unwrap()],
        vec![crate::tenants::KeyPattern::parse("k2*").unwrap()],
    ]);
    let mut model: std::collections::HashMap<String, (Bytes, u64)> = Default::default();
    let mut version = 0u8;
    for &(op, k) in ops {
        let now = crate::clock::now_ms();
        let key = format!("k{k}");
        let slot = key_slot(key.as_bytes());
        match op {
            0 | 6 => {
                version = version.wrapping_add(1);
                let value = Bytes::from(vec![version; 5000 + (k as usize % 3) * 4096]);
                let parent = (k % 2 == 1).then(|| Bytes::from(format!("k{}", k - 1)));
                let write = BlockWrite {
                    parent,
                    replace: true,
                    ..BlockWrite::default()
                };
                if s.insert_block(slot, key.as_bytes(), value.clone(), write, now) == 1 {
                    model.insert(key, (value, 0));
                }
            }
            1 => {
                s.remove(slot, key.as_bytes());
                model.remove(&key);
            }
            2 => {
                let got = get(&mut s, &jobs, &d, &key);
                match (got, model.get(&key)) {
                    (Some(v), Some((m, _))) => prop_assert_eq!(&v, m, "{} read", key),
                    (Some(_), None) => prop_assert_eq!(true, false, "{} came back", key),
                    // Evicted (the tier dropped it): the model lets it go.
                    (None, _) => {
                        model.remove(&key);
                    }
                }
            }
            3 | 4 => {
                let at = if op == 3 { now + 3_600_000 } else { 0 };
                if s.set_expire(slot, key.as_bytes(), at, now) {
                    if let Some(m) = model.get_mut(&key) {
                        m.1 = at;
                    }
                }
            }
            5 => settle_io(&mut s, &jobs, &d),
            _ => {
                s.spill_everything();
                settle_io(&mut s, &jobs, &d);
            }
        }
        check_counts(&s)?;
    }
    settle_io(&mut s, &jobs, &d);
    check_counts(&s)?;
    // Every key the store has is the model's, with its bytes and TTL.
    let now = crate::clock::now_ms();
    for (key, (value, at)) in &model {
        let slot = key_slot(key.as_bytes());
        let Some(e) = s.peek(slot, key.as_bytes(), now) else {
            continue;
        };
        prop_assert_eq!(e.expire_at, *at, "{} TTL", key);
        if let Some(got) = get(&mut s, &jobs, &d, key) {
            prop_assert_eq!(&got, value, "{} at the end", key);
        }
    }
    let mut keys = s.scan(0, usize::MAX, |_| true, now).0;
    keys.retain(|k| !model.contains_key(std::str::from_utf8(k).unwrap_or("")));
    prop_assert_eq!(keys.len(), 0, "keys the model does not have");
    s.clear();
    settle_io(&mut s, &jobs, &d);
    check_counts(&s)?;
    let _ = std::fs::remove_dir_all(&path);
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(16),
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_values_and_counts(
        ops in proptest::collection::vec((0u8..8, 0u8..24), 1..120),
        prefix in proptest::prelude::any::<bool>(),
    ) {
        let policy = if prefix { EvictionPolicy::Prefix } else { EvictionPolicy::AllKeysLru };
        random_operations(&ops, policy)?;
    }
}
