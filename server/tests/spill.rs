//! The NVMe spill tier, end to end with the real binary: blocks evicted
//! from DRAM come back byte-exact from disk, survive graceful restarts and
//! `kill -9`, a damaged record is a miss (never wrong bytes), a full
//! filesystem leaves the server serving from DRAM, and the disk budget holds.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis::Commands;

/// A fresh directory for one test's segments.
fn spill_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-it-spill-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create spill dir");
    dir
}

/// The block stored under `blk:<i>`: `len` bytes from a generator seeded by
/// `i`, so every block differs from every other.
fn block(i: u64, len: usize) -> Vec<u8> {
    pattern(i, len)
}

/// Block sizes vary: 32 KiB to 96 KiB.
fn block_len(i: u64) -> usize {
    (32 + (i % 5) * 16) as usize * 1024
}

fn key(i: u64) -> String {
    format!("blk:{i}")
}

/// Writes blocks `range` with pipelined SETs.
fn write_blocks(con: &mut redis::Connection, range: std::ops::Range<u64>) {
    let ids: Vec<u64> = range.collect();
    for chunk in ids.chunks(16) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.set(key(i), block(i, block_len(i))).ignore();
        }
        pipe.query::<()>(con).expect("pipelined SET");
    }
}

/// Reads every block of `range`: (present and exact, missing). Panics on a
/// single wrong byte.
fn check_blocks(con: &mut redis::Connection, range: std::ops::Range<u64>) -> (u64, u64) {
    let (mut exact, mut missing) = (0, 0);
    for i in range {
        let got: Option<Vec<u8>> = con.get(key(i)).expect("GET");
        match got {
            Some(v) => {
                assert!(
                    v == block(i, block_len(i)),
                    "block {i} came back with wrong bytes"
                );
                exact += 1;
            }
            None => missing += 1,
        }
    }
    (exact, missing)
}

fn spill_info(con: &mut redis::Connection) -> String {
    redis::cmd("INFO")
        .arg("spill")
        .query(con)
        .expect("INFO spill")
}

/// INFO spill once the warm restart has indexed every segment (the server
/// answers from its first second; blocks not indexed yet are misses).
fn loaded(con: &mut redis::Connection) -> String {
    let mut info = spill_info(con);
    let deadline = Instant::now() + Duration::from_secs(60);
    while info_num(&info, "spill_loading") == 1 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
        info = spill_info(con);
    }
    assert_eq!(info_num(&info, "spill_loading"), 0, "{info}");
    info
}

/// The segment files of a spill directory, oldest first.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    segments
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Waits until no write batch is in flight.
fn settle(con: &mut redis::Connection) {
    assert!(
        eventually(Duration::from_secs(30), || {
            let info = spill_info(con);
            info_num(&info, "spill_queue_depth") == 0 && info_num(&info, "spill_queue_bytes") == 0
        }),
        "the spill tier's write queue did not drain"
    );
}

/// Whether `key`'s value is in DRAM (MEMORY USAGE counts its bytes there).
fn in_dram(con: &mut redis::Connection, key: &str) -> bool {
    let usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(con)
        .unwrap();
    usage > 4096
}

#[test]
fn three_times_maxmemory_reads_back_byte_exact() {
    let dir = spill_dir("3x");
    let server = Server::start(&["--maxmemory", "8mb", "--spill-dir", dir.to_str().unwrap()]);
    let mut con = server.redis();
    // About 24 MiB of blocks into 8 MiB of DRAM.
    let n = 400;
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    let info = spill_info(&mut con);
    assert!(
        info_num(&info, "spill_writes") > 0,
        "nothing was spilled:\n{info}"
    );
    assert_eq!(info_num(&info, "spill_dropped"), 0, "{info}");
    // Blocks only on disk are in the compact index (INFO's per-shard
    // figures are refreshed by each shard's cron).
    assert!(
        eventually(Duration::from_secs(10), || {
            let info = spill_info(&mut con);
            let compact = info_num(&info, "spill_compact_keys");
            compact > 0 && compact <= info_num(&info, "spill_keys")
        }),
        "{}",
        spill_info(&mut con)
    );
    let memory: String = redis::cmd("INFO").arg("memory").query(&mut con).unwrap();
    assert!(info_num(&memory, "used_memory") <= 8 << 20, "{memory}");
    // Every walk sees them.
    let mut cursor = 0u64;
    let mut scanned = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(100)
            .query(&mut con)
            .unwrap();
        scanned += keys.len();
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(scanned as u64, n);
    let all: Vec<String> = con.keys("blk:*").unwrap();
    assert_eq!(all.len() as u64, n);
    // A TTL on a block only on disk: kept, changed, removed.
    let on_disk = (0..n)
        .find(|&i| !in_dram(&mut con, &key(i)))
        .expect("a block only on disk");
    let _: () = con.expire(key(on_disk), 3600).unwrap();
    settle(&mut con);
    let ttl: i64 = con.ttl(key(on_disk)).unwrap();
    assert!(ttl > 3500, "ttl {ttl}");
    let _: () = con.persist(key(on_disk)).unwrap();
    let ttl: i64 = con.ttl(key(on_disk)).unwrap();
    assert_eq!(ttl, -1);

    // Every block is still there and exact, whichever tier serves it.
    assert_eq!(check_blocks(&mut con, 0..n), (n, 0));
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, n);
    let info = spill_info(&mut con);
    assert!(info_num(&info, "spill_reads") > 0, "{info}");
    assert_eq!(info_num(&info, "spill_checksum_failures"), 0);

    // The block dialect and the other readers see spilled blocks too.
    let keys: Vec<String> = (0..40).map(key).collect();
    let mut mexists = redis::cmd("MEXISTS");
    let mut prefixlen = redis::cmd("PREFIXLEN");
    let mut mgetprefix = redis::cmd("MGETPREFIX");
    mexists.arg(keys.len());
    prefixlen.arg(keys.len());
    mgetprefix.arg(keys.len());
    for k in &keys {
        mexists.arg(k);
        prefixlen.arg(k);
        mgetprefix.arg(k);
    }
    let present: Vec<i64> = mexists.query(&mut con).unwrap();
    assert!(present.iter().all(|&p| p == 1));
    let len: i64 = prefixlen.query(&mut con).unwrap();
    assert_eq!(len, 40);
    let values: Vec<Vec<u8>> = mgetprefix.query(&mut con).unwrap();
    assert_eq!(values.len(), 40);
    for (i, v) in values.iter().enumerate() {
        assert!(
            *v == block(i as u64, block_len(i as u64)),
            "MGETPREFIX block {i}"
        );
    }
    let mget: Vec<Option<Vec<u8>>> = con.mget(&keys[..10]).unwrap();
    for (i, v) in mget.into_iter().enumerate() {
        assert_eq!(v, Some(block(i as u64, block_len(i as u64))));
    }
    // Blocks read again and again come back to DRAM.
    for _ in 0..3 {
        let _: Option<Vec<u8>> = con.get(key(1)).unwrap();
    }
    // Changing a spilled value in place reads it back first.
    let len: usize = con.append(key(2), b"tail").unwrap();
    assert_eq!(len, block_len(2) + 4);
    let v: Vec<u8> = con.get(key(2)).unwrap();
    assert!(v.ends_with(b"tail") && v[..block_len(2)] == block(2, block_len(2))[..]);
    let _: () = con.rename(key(3), "renamed").unwrap();
    let v: Vec<u8> = con.get("renamed").unwrap();
    assert!(v == block(3, block_len(3)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn graceful_restart_brings_every_block_back_with_other_thread_counts() {
    let dir = spill_dir("restart");
    let d = dir.to_str().unwrap();
    let n = 300;
    {
        let mut server = Server::start(&["--maxmemory", "8mb", "--spill-dir", d]);
        let mut con = server.redis();
        write_blocks(&mut con, 0..n);
        // Deleted and overwritten keys must stay that way after a restart.
        let _: () = con.del(&[key(0), key(1)]).unwrap();
        let _: () = con.set(key(2), b"small now").unwrap();
        let _: () = con.expire(key(4), 3600).unwrap();
        drop(con);
        assert!(server.stop().is_some_and(|s| s.success()), "graceful exit");
    }
    for threads in ["2", "3"] {
        let mut server =
            Server::start(&["--maxmemory", "8mb", "--spill-dir", d, "--threads", threads]);
        let mut con = server.redis();
        let info = loaded(&mut con);
        assert!(info_num(&info, "spill_recovered") >= n - 4, "{info}");
        // A graceful stop leaves a footer on every segment: nothing is
        // scanned record by record.
        assert_eq!(info_num(&info, "spill_segments_scanned"), 0, "{info}");
        assert!(info_num(&info, "spill_footers_read") >= 1, "{info}");
        // What the restart loaded went to the compact index (INFO's
        // per-shard figures are refreshed by each shard's cron).
        assert!(
            eventually(Duration::from_secs(10), || {
                info_num(&spill_info(&mut con), "spill_compact_keys") >= n - 5
            }),
            "{}",
            spill_info(&mut con)
        );
        let (exact, missing) = check_blocks(&mut con, 5..n);
        assert_eq!((exact, missing), (n - 5, 0), "with --threads {threads}");
        let gone: i64 = con.exists(&[key(0), key(1)]).unwrap();
        assert_eq!(gone, 0, "deleted keys stay deleted");
        // Small values are not written to disk, so the overwrite is not
        // there; the old block must not come back either.
        let two: Option<Vec<u8>> = con.get(key(2)).unwrap();
        assert!(two.is_none() || two.as_deref() == Some(&b"small now"[..]));
        let three: Vec<u8> = con.get(key(3)).unwrap();
        assert!(three == block(3, block_len(3)));
        // The TTL set after the block was written is not lost in a way
        // that would outlive it: either gone or still expiring.
        let ttl: i64 = con.ttl(key(4)).unwrap();
        assert!(ttl == -2 || ttl > 0, "ttl {ttl}");
        drop(con);
        assert!(server.stop().is_some_and(|s| s.success()));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kill_9_during_heavy_writes_then_every_block_served_is_exact() {
    let dir = spill_dir("kill9");
    let d = dir.to_str().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    {
        // Segments of 16 MiB: sealed ones (with footers) and the open ones
        // the kill leaves without.
        let mut server = Server::start(&[
            "--maxmemory",
            "8mb",
            "--spill-dir",
            d,
            "--spill-max-bytes",
            "256mb",
        ]);
        let url = server.url();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (written, stop) = (Arc::clone(&written), Arc::clone(&stop));
            thread::spawn(move || {
                let mut con = connect_redis(&url);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 20_000 {
                    let mut pipe = redis::pipe();
                    for j in i..i + 8 {
                        pipe.set(key(j), block(j, block_len(j))).ignore();
                    }
                    if pipe.query::<()>(&mut con).is_err() {
                        break;
                    }
                    i += 8;
                    written.store(i, Ordering::Relaxed);
                }
            })
        };
        // Let the writes run well past DRAM, then pull the plug.
        assert!(eventually(Duration::from_secs(60), || written
            .load(Ordering::Relaxed)
            >= 600));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        let _ = writer.join();
    }
    // A torn record at the end of the newest segment, as a crash mid-write
    // leaves: a header that promises more than is there.
    let segments = segment_files(&dir);
    let newest = segments.last().expect("segments were written").clone();
    let first = std::fs::read(&segments[0]).unwrap();
    let mut torn = std::fs::read(&newest).unwrap();
    torn.extend_from_slice(&first[..4096 + 100]);
    std::fs::write(&newest, &torn).unwrap();

    let server = Server::start(&[
        "--maxmemory",
        "8mb",
        "--spill-dir",
        d,
        "--spill-max-bytes",
        "256mb",
    ]);
    let mut con = server.redis();
    let info = loaded(&mut con);
    assert!(info_num(&info, "spill_recovered") > 0, "{info}");
    assert!(info_num(&info, "spill_segments_scanned") >= 1, "{info}");
    assert!(
        info_num(&info, "spill_recovery_skipped") >= 1,
        "the torn tail is skipped:\n{info}"
    );
    let n = written.load(Ordering::Relaxed) + 8;
    let (exact, _missing) = check_blocks(&mut con, 0..n);
    assert!(
        exact >= info_num(&info, "spill_recovered") / 2,
        "{exact} blocks served"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_footers_fall_back_to_the_scan_and_serve_no_wrong_byte() {
    let dir = spill_dir("footers");
    let d = dir.to_str().unwrap();
    let args = [
        "--maxmemory",
        "8mb",
        "--spill-dir",
        d,
        "--spill-max-bytes",
        "64mb",
    ];
    let n = 400;
    {
        let mut server = Server::start(&args);
        let mut con = server.redis();
        write_blocks(&mut con, 0..n);
        drop(con);
        assert!(server.stop().is_some_and(|s| s.success()), "graceful exit");
    }
    let segments = segment_files(&dir);
    assert!(segments.len() >= 3, "{segments:?}");
    // One trailer flipped, one footer body flipped, one footer cut off.
    let flip = |path: &PathBuf, from_end: usize| {
        let mut bytes = std::fs::read(path).unwrap();
        let at = bytes.len() - from_end;
        bytes[at] ^= 0x40;
        std::fs::write(path, &bytes).unwrap();
    };
    flip(&segments[0], 4096 - 20);
    flip(&segments[1], 4096 + 4096 - 40);
    let len = std::fs::metadata(&segments[2]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&segments[2])
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let server = Server::start(&args);
    let mut con = server.redis();
    let info = loaded(&mut con);
    assert_eq!(info_num(&info, "spill_segments_scanned"), 3, "{info}");
    let (exact, missing) = check_blocks(&mut con, 0..n);
    assert_eq!((exact, missing), (n, 0), "{info}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finds the record of a key in the segment files: (file, offset of the
/// value's first byte).
fn find_record(dir: &Path, wanted: &[u8]) -> Option<(PathBuf, usize)> {
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        let data = std::fs::read(&path).ok()?;
        let mut at = 0;
        while at + 32 <= data.len() {
            if &data[at..at + 4] == b"KVTS" {
                let key_len = u16::from_le_bytes([data[at + 6], data[at + 7]]) as usize;
                let parent_len = u16::from_le_bytes([data[at + 8], data[at + 9]]) as usize;
                if data.get(at + 32..at + 32 + key_len) == Some(wanted) {
                    return Some((path, at + 32 + key_len + parent_len));
                }
            }
            at += 4096;
        }
    }
    None
}

#[test]
fn a_flipped_byte_is_a_miss_counted_and_the_rest_is_served() {
    let dir = spill_dir("flip");
    let server = Server::start(&["--maxmemory", "4mb", "--spill-dir", dir.to_str().unwrap()]);
    let mut con = server.redis();
    let n = 200;
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    // The earliest blocks were evicted first: find one on disk.
    let victim = (0..n)
        .find_map(|i| find_record(&dir, key(i).as_bytes()).map(|found| (i, found)))
        .expect("a spilled block");
    let (i, (path, value_at)) = victim;
    let mut data = std::fs::read(&path).unwrap();
    data[value_at + 1000] ^= 0x40;
    std::fs::write(&path, &data).unwrap();

    let got: Option<Vec<u8>> = con.get(key(i)).unwrap();
    assert_eq!(got, None, "a block failing its checksum is a miss");
    let exists: i64 = con.exists(key(i)).unwrap();
    assert_eq!(exists, 0, "and is removed");
    let info = spill_info(&mut con);
    assert_eq!(info_num(&info, "spill_checksum_failures"), 1, "{info}");
    // A prefix read stops at the damaged block... which is now simply
    // missing, as in any other prefix.
    if i > 0 {
        let len: i64 = redis::cmd("PREFIXLEN")
            .arg(2)
            .arg(key(i - 1))
            .arg(key(i))
            .query(&mut con)
            .unwrap();
        assert_eq!(len, 1);
    }
    let (exact, missing) = check_blocks(&mut con, 0..n);
    assert_eq!((exact, missing), (n - 1, 1));
    assert!(
        server.log().contains("checksum failure"),
        "the failure is logged"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mgetprefix_ends_at_a_damaged_block() {
    let dir = spill_dir("flip-prefix");
    let server = Server::start(&["--maxmemory", "4mb", "--spill-dir", dir.to_str().unwrap()]);
    let mut con = server.redis();
    let n = 200;
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    // Three consecutive blocks all on disk, the middle one damaged.
    let (i, (path, value_at)) = (1..n - 1)
        .find_map(|i| {
            let all = [i - 1, i, i + 1]
                .iter()
                .all(|&j| find_record(&dir, key(j).as_bytes()).is_some());
            all.then(|| (i, find_record(&dir, key(i).as_bytes()).unwrap()))
        })
        .expect("three spilled blocks in a row");
    let mut data = std::fs::read(&path).unwrap();
    data[value_at] ^= 1;
    std::fs::write(&path, &data).unwrap();
    let values: Vec<Vec<u8>> = redis::cmd("MGETPREFIX")
        .arg(3)
        .arg(key(i - 1))
        .arg(key(i))
        .arg(key(i + 1))
        .query(&mut con)
        .unwrap();
    assert_eq!(values.len(), 1, "the prefix ends before the damaged block");
    assert!(values[0] == block(i - 1, block_len(i - 1)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_filesystem_leaves_the_server_serving_from_dram() {
    // A 6 MiB tmpfs in a private mount namespace, with a disk budget far
    // larger than it: the writes themselves hit ENOSPC.
    let dir = spill_dir("full");
    let d = dir.to_str().unwrap().to_string();
    let bin = env!("CARGO_BIN_EXE_kvtier-server");
    let mut command = Command::new("unshare");
    command.args([
        "-Urm",
        "sh",
        "-c",
        &format!(
            "mount -t tmpfs -o size=6m tmpfs {d} && exec {bin} --port 0 --threads 4 \
             --metrics-addr none --maxmemory 8mb --spill-dir {d} --spill-max-bytes 1gb"
        ),
    ]);
    let server = Server::start_command(command);
    let mut con = server.redis();
    let n = 500;
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    let info = spill_info(&mut con);
    assert!(info_num(&info, "spill_disk_full") > 0, "{info}");
    assert!(info_num(&info, "spill_io_errors") > 0, "{info}");
    assert!(
        info_field(&info, "spill_last_error").is_some_and(|e| e.contains("space")),
        "{info}"
    );
    // Writes still succeed, and what is served is exact.
    let _: () = con.set("after", b"still writable").unwrap();
    let v: Vec<u8> = con.get("after").unwrap();
    assert_eq!(v, b"still writable");
    let (exact, missing) = check_blocks(&mut con, 0..n);
    assert!(exact > 0 && missing > 0, "{exact} exact, {missing} missing");
    // The most recent blocks are in DRAM.
    assert_eq!(check_blocks(&mut con, n - 20..n), (20, 0));
}

#[test]
fn the_disk_budget_is_never_exceeded() {
    let dir = spill_dir("budget");
    let budget: u64 = 8 << 20;
    let server = Server::start(&[
        "--maxmemory",
        "4mb",
        "--spill-dir",
        dir.to_str().unwrap(),
        "--spill-max-bytes",
        "8mb",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let largest = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (dir, stop, largest) = (dir.clone(), Arc::clone(&stop), Arc::clone(&largest));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                largest.fetch_max(dir_bytes(&dir), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let mut con = server.redis();
    let n = 800; // about 48 MiB: six times the budget
    let started = Instant::now();
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    // Read what is left a few times, so reclaim has recently-read blocks
    // to rewrite as well as cold ones to drop.
    let (exact, _) = check_blocks(&mut con, 0..n);
    write_blocks(&mut con, n..n + 200);
    settle(&mut con);
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let info = spill_info(&mut con);
    assert!(info_num(&info, "spill_used_bytes") <= budget, "{info}");
    assert!(
        largest.load(Ordering::Relaxed) <= budget,
        "segment files reached {} bytes (budget {budget}) in {:?}",
        largest.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(info_num(&info, "spill_reclaims") > 0, "{info}");
    // Reclaim found the segments' keys (in their footers) and let them go.
    assert!(info_num(&info, "spill_dropped_reclaimed") > 0, "{info}");
    assert!(exact > 0);
    // Still exact after all the reclaiming.
    check_blocks(&mut con, 0..n + 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_reads_of_a_block_share_one_disk_read_and_replies_keep_their_order() {
    let dir = spill_dir("share");
    let server = Server::start(&["--maxmemory", "4mb", "--spill-dir", dir.to_str().unwrap()]);
    let mut con = server.redis();
    let n = 200;
    write_blocks(&mut con, 0..n);
    settle(&mut con);
    let spilled: Vec<u64> = (0..n)
        .filter(|&i| find_record(&dir, key(i).as_bytes()).is_some())
        .take(2)
        .collect();
    let (a, b) = (spilled[0], spilled[1]);
    // Read `a` once first: a block read once stays on disk, so otherwise a
    // loaded machine that answers the pipeline's first read before its
    // second is dispatched would read it from disk twice. Read twice, the
    // first answer brings it back to DRAM whenever that answer comes.
    let first: Vec<u8> = con.get(key(a)).unwrap();
    assert!(first == block(a, block_len(a)));
    let before = spill_info(&mut con);
    // One pipeline: ten reads of one block on disk, mixed with other
    // replies. They are all dispatched before the disk answers.
    let mut pipe = redis::pipe();
    for _ in 0..10 {
        pipe.get(key(a));
    }
    pipe.cmd("PING")
        .set("small", "v")
        .get("small")
        .get(key(b))
        .get("absent");
    type Replies = (Vec<Vec<u8>>, (String, (), String, Vec<u8>, Option<Vec<u8>>));
    let values: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    let replies: Replies = (
        values[..10]
            .iter()
            .map(|v| redis::from_redis_value(v.clone()).unwrap())
            .collect(),
        redis::from_redis_value(redis::Value::Array(values[10..].to_vec())).unwrap(),
    );
    for v in &replies.0 {
        assert!(*v == block(a, block_len(a)));
    }
    assert_eq!(replies.1 .0, "PONG");
    assert_eq!(replies.1 .2, "v");
    assert!(replies.1 .3 == block(b, block_len(b)));
    assert_eq!(replies.1 .4, None);
    let after = spill_info(&mut con);
    let reads = info_num(&after, "spill_reads") - info_num(&before, "spill_reads");
    let hits = info_num(&after, "spill_hits") - info_num(&before, "spill_hits");
    // Reads dispatched after the disk answered find the block back in
    // DRAM (a loaded machine can answer that early): served, not counted
    // as disk hits, and no second disk read either way.
    assert!((2..=11).contains(&hits), "{hits} reads served from disk");
    assert_eq!(reads, 2, "ten of them shared one disk read:\n{after}");
    // Read twice or more: it moved back to DRAM.
    assert!(info_num(&after, "spill_promotions") >= 1);

    // The settings are in CONFIG, and admission can change at run time.
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("spill-*")
        .query(&mut con)
        .unwrap();
    for name in [
        "spill-dir",
        "spill-max-bytes",
        "spill-admission",
        "spill-on-shutdown",
        "spill-io-threads",
    ] {
        assert!(got.iter().any(|g| g == name), "{name} missing from {got:?}");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("spill-admission")
        .arg("2")
        .query(&mut con)
        .unwrap();
    let admission: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("spill-admission")
        .query(&mut con)
        .unwrap();
    assert_eq!(admission[1], "2");
    let bad = redis::cmd("CONFIG")
        .arg("SET")
        .arg("spill-admission")
        .arg("some")
        .query::<()>(&mut con)
        .unwrap_err();
    assert!(
        err_text(&bad).contains("spill-admission"),
        "{}",
        err_text(&bad)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Many small blocks through a small DRAM tier: the index of the blocks
/// that went to disk is not charged to `maxmemory` (it is the disk index,
/// INFO `spill_index_bytes`), so ingest never fills the DRAM tier with
/// index entries and refuses writes; every block is stored, none refused.
#[test]
fn small_blocks_past_maxmemory_are_all_stored_and_refusals_are_counted() {
    let dir = spill_dir("small");
    let server = Server::start(&[
        "--maxmemory",
        "2mb",
        "--threads",
        "1",
        "--spill-dir",
        dir.to_str().unwrap(),
        "--spill-admission",
        "0",
    ]);
    let mut con = server.redis();
    let value = vec![7u8; 4096];
    // 12,800 blocks of 4 KiB: 50 MiB, with keys like LMCache's; their index
    // alone would be 2.2 MiB at the DRAM tier's charge per key, more than
    // the whole DRAM tier.
    for call in 0..50u64 {
        let mut cmd = redis::cmd("MSETBLOCK");
        cmd.arg(256);
        for i in 0..256u64 {
            cmd.arg(format!("model@1@0@{:040x}@bf16", call * 256 + i))
                .arg(&value[..]);
        }
        let codes: Vec<i64> = cmd.query(&mut con).expect("MSETBLOCK");
        assert!(codes.iter().all(|&c| c == 1), "call {call}: {codes:?}");
    }
    settle(&mut con);
    let stats: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
    assert_eq!(info_num(&stats, "refused_writes"), 0, "{stats}");
    let info = spill_info(&mut con);
    assert!(info_num(&info, "spill_index_bytes") > 0, "{info}");
    assert_eq!(info_num(&info, "spill_dropped"), 0, "{info}");
    let memory: String = redis::cmd("INFO").arg("memory").query(&mut con).unwrap();
    assert!(info_num(&memory, "used_memory") <= 2 << 20, "{memory}");
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, 12_800);
    // A block larger than the shard's share of maxmemory: refused, counted.
    let big = vec![1u8; 3 << 20];
    let codes: Vec<i64> = redis::cmd("MSETBLOCK")
        .arg(1)
        .arg("too-big")
        .arg(&big[..])
        .query(&mut con)
        .unwrap();
    assert_eq!(codes, vec![-1]);
    let stats: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
    assert_eq!(info_num(&stats, "refused_writes_too_large"), 1, "{stats}");
    assert_eq!(info_num(&stats, "refused_writes"), 1, "{stats}");
    let _ = std::fs::remove_dir_all(&dir);
}
