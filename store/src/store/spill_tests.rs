use std::sync::Mutex;

use super::*;
use crate::slot::key_slot;
use crate::spill::fetch::Fetched;
use crate::spill::record::encode;
use crate::spill::record::Record;
use crate::spill::{aligned, IoPool, SpillDir, SpillDrop};
use crate::spill::{footer, Loader};
use std::sync::atomic::Ordering::Relaxed;

type Jobs = Arc<Mutex<Vec<StoreJob>>>;

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kvtier-loading-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A store with the tier on over `d`; the I/O threads' reports wait in
/// the returned queue until [`run`].
fn store(d: &Arc<SpillDir>) -> (Store, Jobs) {
    let jobs: Jobs = Arc::default();
    let queue = Arc::clone(&jobs);
    let mut s = Store::new(0..crate::slot::SLOTS, 64 << 20, EvictionPolicy::AllKeysLru);
    s.enable_spill(SpillConfig {
        dir: Arc::clone(d),
        pool: Arc::new(IoPool::start(1)),
        post: Arc::new(move |job| queue.lock().unwrap().push(job)),
        shard: 0,
        admission: 0,
    });
    (s, jobs)
}

/// One segment with a footer holding `keys` (each a 5000-byte block).
fn old_segment(d: &SpillDir, keys: &[&str]) {
    let seg = d.new_segment(0).unwrap();
    let mut batch = aligned(0);
    let (mut body, mut entries) = (bytes::BytesMut::new(), 0);
    for k in keys {
        let at = batch.len();
        let r = Record {
            key: Bytes::copy_from_slice(k.as_bytes()),
            parent: None,
            value: Bytes::from(vec![1u8; 5000]),
            expire_at: 0,
            tombstone: false,
        };
        encode(&mut batch, &r);
        entries += footer::note_record(&mut body, at as u64, &batch[at..]);
    }
    let off = d.reserve(&seg, batch.len() as u64).unwrap();
    let mut out = aligned(batch.len());
    out.copy_from_slice(&batch);
    d.write(&seg, off, &out).unwrap();
    let at = d
        .reserve(&seg, footer::footer_len(body.len()) as u64)
        .unwrap();
    d.write(&seg, at, &footer::encode(at, &body, entries))
        .unwrap();
}

/// A store over a fresh tier of `max` bytes, 16 MiB of DRAM, and two
/// named tenants, `a@*` (slot 1) and `b@*` (slot 2), with `limits`.
fn two_tenants(
    name: &str,
    max: u64,
    limits: [crate::tenants::Limits; 2],
) -> (Store, Jobs, Arc<SpillDir>, std::path::PathBuf) {
    let path = dir(name);
    let d = Arc::new(SpillDir::open(&path, max).unwrap());
    let (mut s, jobs) = store(&d);
    s.set_budget(16 << 20);
    s.set_tenants(&[
        vec![crate::tenants::KeyPattern::parse("a@*").unwrap()],
        vec![crate::tenants::KeyPattern::parse("b@*").unwrap()],
    ]);
    s.set_tenant_limits(&limits);
    (s, jobs, d, path)
}

/// What the shard does after a batch: runs the I/O threads' reports
/// and delivers the store's own link events (reclaim).
fn settle(s: &mut Store, jobs: &Jobs) {
    let ready: Vec<StoreJob> = jobs.lock().unwrap().drain(..).collect();
    for job in ready {
        job(s);
    }
    for e in s.take_link_events() {
        s.apply_link(e);
    }
}

/// Writes a 16 KiB block under `key`, then [`settle`]s.
fn write_block(s: &mut Store, jobs: &Jobs, key: &str) {
    let block = Bytes::from(vec![3u8; 16384]);
    s.insert(
        key_slot(key.as_bytes()),
        key.as_bytes(),
        block,
        0,
        crate::clock::now_ms(),
    )
    .unwrap();
    settle(s, jobs);
}

/// A tenant at its disk cap: its evicted blocks are dropped, not
/// written, and counted; the other tenant's are written as before.
#[test]
fn a_tenant_at_its_disk_cap_is_not_written_to_disk() {
    let capped = crate::tenants::Limits {
        disk_cap: 1000,
        ..crate::tenants::Limits::default()
    };
    let (mut s, jobs, d, path) = two_tenants(
        "disk-cap",
        64 << 20,
        [capped, crate::tenants::Limits::default()],
    );
    for i in 0..1500 {
        for t in ["a", "b"] {
            write_block(&mut s, &jobs, &format!("{t}@{i}"));
        }
    }
    let cap = crate::tenants::part_of(64 << 20, 1000);
    let usage = s.tenant_usage();
    assert!(usage[1].disk <= cap, "{} > {cap}", usage[1].disk);
    assert!(
        usage[1].disk + 16384 > cap,
        "a fills its cap: {}",
        usage[1].disk
    );
    assert!(
        usage[2].disk > 2 * cap,
        "b is not capped: {}",
        usage[2].disk
    );
    let dropped = d.counters.dropped_by[SpillDrop::TenantCap as usize].load(Relaxed);
    assert!(dropped > 100, "{dropped}");
    let _ = std::fs::remove_dir_all(&path);
}

/// Reclaim keeps the blocks of a tenant under its disk share while
/// another tenant's flood fills the tier: without the share they are
/// the oldest, never read, and would all go.
#[test]
fn reclaim_keeps_a_tenant_within_its_disk_share() {
    for share in [0, 5000] {
        let a = crate::tenants::Limits {
            disk_share: share,
            ..crate::tenants::Limits::default()
        };
        // Per tenant even without a share (a cap of all but 0.01%).
        let b = crate::tenants::Limits {
            cap: 9999,
            ..crate::tenants::Limits::default()
        };
        let (mut s, jobs, _d, path) = two_tenants(&format!("disk-share-{share}"), 32 << 20, [a, b]);
        for i in 0..1500 {
            write_block(&mut s, &jobs, &format!("a@{i}"));
        }
        s.flush_spill();
        let before = s.tenant_usage()[1].disk;
        assert!(before > 4 << 20, "a spilled {before}");
        for i in 0..8000 {
            write_block(&mut s, &jobs, &format!("b@{i}"));
        }
        s.flush_spill();
        for _ in 0..100 {
            settle(&mut s, &jobs);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let after = s.tenant_usage()[1].disk;
        match share {
            0 => assert!(
                after < before / 4,
                "a kept {after} of {before} with no share"
            ),
            _ => assert!(
                after > before * 3 / 4,
                "a kept {after} of {before} under its share"
            ),
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

#[test]
fn keys_written_or_deleted_while_loading_win_over_older_records() {
    let path = dir("touched");
    {
        let d = SpillDir::open(&path, 0).unwrap();
        old_segment(&d, &["kept", "overwritten", "deleted", "flushed"]);
    }
    let d = Arc::new(SpillDir::open(&path, 0).unwrap());
    let segments = d.open_segments().unwrap();
    let (mut s, _jobs) = store(&d);
    s.begin_loading();
    let now = crate::clock::now_ms();
    let slot = |k: &str| key_slot(k.as_bytes());
    // Before the loader reaches them: one key written, one deleted
    // (it is not in the index yet: DEL finds nothing, and still counts).
    s.insert(
        slot("overwritten"),
        b"overwritten",
        Bytes::from("new"),
        0,
        now,
    )
    .unwrap();
    s.insert(slot("deleted"), b"deleted", Bytes::from("tmp"), 0, now)
        .unwrap();
    s.remove(slot("deleted"), b"deleted");
    let mut loader = Loader::new(segments);
    let records = loader.next(&d, now).unwrap().unwrap();
    assert_eq!(records.len(), 4);
    assert_eq!(s.insert_loaded(records.clone(), now), 2, "kept and flushed");
    let value = |s: &mut Store, k: &str| match s.fetch(slot(k), k.as_bytes(), now) {
        Some(Fetched::Now(b)) => Some(b),
        Some(Fetched::Later { len, .. }) => Some(Bytes::from(vec![0u8; len])),
        None => None,
    };
    assert_eq!(value(&mut s, "overwritten"), Some(Bytes::from("new")));
    assert_eq!(value(&mut s, "deleted"), None);
    assert_eq!(value(&mut s, "kept").map(|v| v.len()), Some(5000));
    // The touched keys get tombstones: a later restart does not bring
    // their old records back either.
    s.flush_spill();
    let tombstones: usize = s.spill.as_ref().map_or(0, |sp| sp.footer.1 as usize);
    assert_eq!(tombstones, 2, "overwritten, deleted");
    // A second copy of the same records (an older segment's) adds
    // nothing: the keys are there.
    assert_eq!(s.insert_loaded(records.clone(), now), 0);
    // FLUSHALL while loading: nothing loaded afterwards is kept.
    s.clear();
    assert_eq!(s.insert_loaded(records, now), 0);
    assert_eq!(value(&mut s, "flushed"), None);
    s.loading_done();
    assert!(!s.loading());
    let _ = std::fs::remove_dir_all(&path);
}
