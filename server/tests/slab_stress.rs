//! Stress of the slab DRAM tier through the real binary (4 shards, 64 MB):
//! writers fill memory with 64 KiB blocks, then switch to 256 KiB and
//! 2 MiB blocks, then back to 64 KiB, while slow readers fetch several
//! blocks per MGETPREFIX and read the reply a little at a time, holding the
//! blocks in the server meanwhile. Every value returned must be exactly
//! what was stored (checked by hash against the key-derived content),
//! INFO's used_memory never exceeds maxmemory, and pages were rebalanced.
//!
//! With 16 MiB per shard the arena's pages are 1 MiB, so 256 KiB blocks
//! (a quarter page) get a size class whose pages are re-carved from the
//! 64 KiB class (`slab_rebalanced_pages`), and 2 MiB blocks get dedicated
//! spans, whose memory comes from 64 KiB pages emptied and unmapped.
//!
//! Counts are bounded; nothing is timed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;

const MAXMEMORY: u64 = 64 << 20;
const SMALL: usize = 64 << 10;
const MEDIUM: usize = 256 << 10;
const LARGE: usize = 2 << 20;

/// 64-bit FNV-1a over 8-byte words (fast enough in a debug build).
fn word_hash(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x0000_0100_0000_01b3);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ bytes.len() as u64
}

/// The content of block `key`: `len` bytes derived from the key alone.
fn block(key: &str, len: usize) -> Vec<u8> {
    pattern(word_hash(key.as_bytes()), len)
}

/// The blocks written so far: key, length, hash of the content.
#[derive(Default)]
struct Written {
    blocks: Mutex<Vec<(String, usize, u64)>>,
}

impl Written {
    fn push(&self, key: String, len: usize, hash: u64) {
        self.blocks.lock().unwrap().push((key, len, hash));
    }

    /// Up to `n` consecutive recently written blocks, starting `back` from
    /// the end.
    fn recent(&self, n: usize, back: usize) -> Vec<(String, usize, u64)> {
        let blocks = self.blocks.lock().unwrap();
        let end = blocks.len().saturating_sub(back);
        blocks[end.saturating_sub(n)..end].to_vec()
    }
}

/// A connection that reads replies a little at a time, so the server holds
/// the values it is sending for a while (replies parsed by kvtier-protocol's
/// reply parser, as RawConn's are).
struct SlowReader {
    stream: TcpStream,
    buf: bytes::BytesMut,
    parser: kvtier_protocol::ReplyParser<Resp>,
}

impl SlowReader {
    fn connect(port: u16) -> SlowReader {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        SlowReader {
            stream,
            buf: bytes::BytesMut::new(),
            parser: kvtier_protocol::ReplyParser::new(),
        }
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).expect("read a reply");
        assert!(n > 0, "server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
        // A slow consumer: the rest waits in the server's socket buffer and
        // in the reply it is still writing (holding the blocks).
        thread::sleep(Duration::from_micros(300));
    }

    fn read(&mut self) -> Resp {
        loop {
            if let Some(reply) = self.parser.parse(&mut self.buf).expect("a valid reply") {
                return reply;
            }
            self.fill();
        }
    }

    /// MGETPREFIX of `keys`; returns the values of the leading present ones.
    fn mgetprefix(&mut self, keys: &[&str]) -> Vec<Vec<u8>> {
        let n = keys.len().to_string();
        let mut args: Vec<&[u8]> = vec![b"MGETPREFIX", n.as_bytes()];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        self.stream.write_all(&encode(&args)).expect("send");
        match self.read() {
            Resp::Array(Some(items)) => items.iter().map(Resp::bytes).collect(),
            other => panic!("MGETPREFIX reply {other:?}"),
        }
    }
}

/// MSETBLOCK of `keys`, each with its content of `len` bytes; returns the
/// codes and records the stored blocks.
fn write_blocks(c: &mut RawConn, written: &Written, keys: &[String], len: usize) -> Vec<i64> {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| block(k, len)).collect();
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"MSETBLOCK", n.as_bytes()];
    for (k, v) in keys.iter().zip(&values) {
        args.push(k.as_bytes());
        args.push(v);
    }
    let codes: Vec<i64> = c.cmd(&args).items().iter().map(Resp::int).collect();
    for ((k, v), code) in keys.iter().zip(&values).zip(&codes) {
        assert!(matches!(code, 1 | -1), "MSETBLOCK {k}: {code}");
        if *code == 1 {
            written.push(k.clone(), len, word_hash(v));
        }
    }
    codes
}

fn used_memory(c: &mut RawConn) -> u64 {
    info_num(&c.run("INFO memory").text(), "used_memory")
}

fn stress(policy: &str) {
    let server = Server::start(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
    let port = server.port;
    let written = Arc::new(Written::default());
    let writers_done = Arc::new(AtomicBool::new(false));
    let values_checked = Arc::new(AtomicU64::new(0));
    let bytes_checked = Arc::new(AtomicU64::new(0));

    // Readers: 4 consecutive recent blocks per MGETPREFIX, read slowly.
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let written = Arc::clone(&written);
            let done = Arc::clone(&writers_done);
            let values_checked = Arc::clone(&values_checked);
            let bytes_checked = Arc::clone(&bytes_checked);
            thread::spawn(move || {
                let mut c = SlowReader::connect(port);
                let mut round = 0usize;
                while !done.load(Ordering::Acquire) {
                    round += 1;
                    let blocks = written.recent(4, (round * 3 + r * 5) % 12);
                    if blocks.is_empty() {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let keys: Vec<&str> = blocks.iter().map(|(k, _, _)| k.as_str()).collect();
                    let values = c.mgetprefix(&keys);
                    for (value, (key, len, hash)) in values.iter().zip(&blocks) {
                        assert_eq!(value.len(), *len, "{key}: length");
                        assert_eq!(
                            word_hash(value),
                            *hash,
                            "{key}: bytes differ from what was stored"
                        );
                        values_checked.fetch_add(1, Ordering::Relaxed);
                        bytes_checked.fetch_add(*len as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    // Memory watcher: used_memory within maxmemory all along.
    let watcher = {
        let done = Arc::clone(&writers_done);
        thread::spawn(move || {
            let mut c = RawConn::connect(port);
            let mut samples = 0;
            while !done.load(Ordering::Acquire) {
                let used = used_memory(&mut c);
                assert!(
                    used <= MAXMEMORY,
                    "used_memory {used} > maxmemory {MAXMEMORY}"
                );
                samples += 1;
                thread::sleep(Duration::from_millis(20));
            }
            samples
        })
    };

    // Writers: phase 1 fills memory 1.5 times over with 64 KiB blocks,
    // phase 2 writes 256 KiB and 2 MiB blocks (about as much again).
    let mut c = server.raw();
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let written = Arc::clone(&written);
            thread::spawn(move || {
                let mut c = RawConn::connect(port);
                let mut stored = [0u64; 4];
                for i in 0..96 {
                    let keys: Vec<String> = (0..8).map(|j| format!("s:{w}:{i}:{j}")).collect();
                    let codes = write_blocks(&mut c, &written, &keys, SMALL);
                    stored[0] += codes.iter().filter(|&&c| c == 1).count() as u64;
                }
                for i in 0..24 {
                    let keys: Vec<String> = (0..2).map(|j| format!("m:{w}:{i}:{j}")).collect();
                    let codes = write_blocks(&mut c, &written, &keys, MEDIUM);
                    stored[1] += codes.iter().filter(|&&c| c == 1).count() as u64;
                    let key = vec![format!("l:{w}:{i}")];
                    let codes = write_blocks(&mut c, &written, &key, LARGE);
                    stored[2] += codes.iter().filter(|&&c| c == 1).count() as u64;
                }
                // And back: spans and 256 KiB pages give memory back to
                // 64 KiB blocks.
                for i in 0..32 {
                    let keys: Vec<String> = (0..8).map(|j| format!("t:{w}:{i}:{j}")).collect();
                    let codes = write_blocks(&mut c, &written, &keys, SMALL);
                    stored[3] += codes.iter().filter(|&&c| c == 1).count() as u64;
                }
                stored
            })
        })
        .collect();
    let mut stored = [0u64; 4];
    for w in writers {
        let s = w.join().expect("writer");
        for (total, s) in stored.iter_mut().zip(s) {
            *total += s;
        }
    }
    writers_done.store(true, Ordering::Release);
    for r in readers {
        r.join().expect("reader");
    }
    let samples = watcher.join().expect("memory watcher");

    let info = c.run("INFO").text();
    let used = info_num(&info, "used_memory");
    assert!(
        used <= MAXMEMORY,
        "used_memory {used} > maxmemory {MAXMEMORY}"
    );
    let evicted = info_num(&info, "evicted_keys");
    let slabs = c.run("INFO slabs").text();
    let rebalanced = info_num(&slabs, "slab_rebalanced_pages");
    eprintln!(
        "{policy}: stored {stored:?} (64K, 256K, 2M, 64K again), evicted {evicted}, rebalanced pages \
         {rebalanced}, {} values / {} MiB verified, {samples} memory samples\n{slabs}",
        values_checked.load(Ordering::Relaxed),
        bytes_checked.load(Ordering::Relaxed) >> 20
    );
    assert!(
        evicted > 0,
        "the writes exceeded maxmemory: something was evicted"
    );
    assert!(rebalanced > 0, "pages moved to the 256 KiB class:\n{slabs}");
    // The new sizes were not starved: most of them were stored.
    assert!(
        stored[1] >= 48 * 3 / 4,
        "256 KiB blocks stored: {}",
        stored[1]
    );
    assert!(stored[2] >= 48 / 2, "2 MiB blocks stored: {}", stored[2]);
    assert!(
        stored[3] >= 512 * 3 / 4,
        "64 KiB blocks stored again: {}",
        stored[3]
    );
    assert!(
        values_checked.load(Ordering::Relaxed) > 0,
        "the readers read blocks"
    );

    // Whatever is still stored reads back exactly.
    let recent = written.recent(64, 0);
    for (key, len, hash) in recent {
        match c.cmd(&[b"GET", key.as_bytes()]) {
            Resp::Bulk(Some(v)) => {
                assert_eq!(v.len(), len, "{key}: length");
                assert_eq!(word_hash(&v), hash, "{key}: bytes differ");
            }
            Resp::Bulk(None) => {}
            other => panic!("GET {key}: {other:?}"),
        }
    }
}

#[test]
fn slow_readers_hold_blocks_while_allkeys_lru_evicts_and_rebalances() {
    stress("allkeys-lru");
}

#[test]
fn slow_readers_hold_blocks_while_prefix_evicts_and_rebalances() {
    stress("prefix");
}
