//! The block dialect (MSETBLOCK, MGETPREFIX, PREFIXLEN, MEXISTS) against the
//! real binary with 4 shards, so every chain crosses shards: each option and
//! error, RESP2 and RESP3 through raw sockets and the `redis` crate, COMMAND
//! introspection, commandstats and metrics, chains published while readers
//! poll them, and blocking reads (wake-up, timeout, MIN, many waiters,
//! disconnects, CLIENT KILL, `--max-block-ms`).
//!
//! Timing is only ever checked loosely: a blocked read must end well before
//! its timeout once its prefix is written, and must not end before it
//! otherwise.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

// ---- helpers ------------------------------------------------------------------

/// Shards of consecutive chain positions: hops between shards and runs of
/// two blocks on one shard.
const SHARD_PATTERN: [usize; 12] = [0, 1, 1, 2, 3, 0, 0, 3, 2, 1, 2, 3];

/// `n` keys `prefix:i:j`, block i owned by shard `SHARD_PATTERN[i % 12]`.
fn chain(prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let want = SHARD_PATTERN[i % SHARD_PATTERN.len()];
            (0..)
                .map(|j| format!("{prefix}:{i}:{j}"))
                .find(|k| shard_of(k.as_bytes(), SHARDS) == want)
                .unwrap()
        })
        .collect()
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A block's value, derived from its key so any reader can verify it:
/// 256..2303 bytes of a pattern seeded by the key's hash.
fn block_value(key: &str) -> Vec<u8> {
    let h = fnv64(key.as_bytes());
    let len = 256 + (h % 2048) as usize;
    (0..len)
        .map(|i| (h >> ((i % 8) * 8)) as u8 ^ (i / 8) as u8)
        .collect()
}

/// `MSETBLOCK n key value ... extra...` with explicit values.
fn msetblock_pairs(pairs: &[(&str, &[u8])], extra: &[&str]) -> Vec<Vec<u8>> {
    let mut args = vec![b"MSETBLOCK".to_vec(), pairs.len().to_string().into_bytes()];
    for (k, v) in pairs {
        args.push(k.as_bytes().to_vec());
        args.push(v.to_vec());
    }
    args.extend(extra.iter().map(|e| e.as_bytes().to_vec()));
    args
}

/// `MSETBLOCK` of `keys` with their derived values.
fn msetblock(keys: &[String], extra: &[&str]) -> Vec<Vec<u8>> {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| block_value(k)).collect();
    let pairs: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    msetblock_pairs(&pairs, extra)
}

/// `NAME numkeys key... extra...`.
fn keys_cmd(name: &str, keys: &[String], extra: &[&str]) -> Vec<Vec<u8>> {
    let mut args = vec![
        name.as_bytes().to_vec(),
        keys.len().to_string().into_bytes(),
    ];
    args.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    args.extend(extra.iter().map(|e| e.as_bytes().to_vec()));
    args
}

/// Sends a command given as owned arguments and reads its reply.
fn call(c: &mut RawConn, args: &[Vec<u8>]) -> Resp {
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    c.cmd(&refs)
}

/// Sends a command without reading its reply.
fn send(c: &mut RawConn, args: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    c.send(&encode(&refs));
}

/// `*n` of integers.
fn ints(v: &[i64]) -> Resp {
    array(v.iter().map(|&n| int(n)).collect())
}

/// The reply MGETPREFIX gives when exactly `keys` are the present prefix.
fn values_of(keys: &[String]) -> Resp {
    array(keys.iter().map(|k| bulk(block_value(k))).collect())
}

fn info(c: &mut RawConn, section: &str) -> String {
    c.run(&format!("INFO {section}")).text()
}

/// INFO clients' `blocked_clients` and `total_blocking_keys`.
fn blocking_state(c: &mut RawConn) -> (u64, u64) {
    let text = info(c, "clients");
    (
        info_num(&text, "blocked_clients"),
        info_num(&text, "total_blocking_keys"),
    )
}

/// Waits until INFO clients shows `want` (blocked clients, blocking keys).
fn wait_blocking_state(c: &mut RawConn, want: (u64, u64)) {
    let mut seen = (0, 0);
    let reached = eventually(Duration::from_secs(15), || {
        seen = blocking_state(c);
        seen == want
    });
    assert!(
        reached,
        "INFO clients stayed at {seen:?}, expected {want:?}"
    );
}

/// `OBJECT <sub> key` as an integer.
fn object_int(c: &mut RawConn, sub: &str, key: &str) -> i64 {
    c.cmd(&[b"OBJECT", sub.as_bytes(), key.as_bytes()]).int()
}

// ---- MSETBLOCK -------------------------------------------------------------------

#[test]
fn msetblock_codes_immutability_and_replace() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("imm", 6);
    let shards: BTreeSet<usize> = keys
        .iter()
        .map(|k| shard_of(k.as_bytes(), SHARDS))
        .collect();
    assert_eq!(shards.len(), SHARDS, "the chain spans every shard");

    assert_eq!(call(&mut c, &msetblock(&keys[..3], &[])), ints(&[1, 1, 1]));
    // Present blocks are left as they are; new ones are stored.
    let other: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &b"other"[..])).collect();
    assert_eq!(
        call(&mut c, &msetblock_pairs(&other, &[])),
        ints(&[0, 0, 0, 1, 1, 1])
    );
    for k in &keys[..3] {
        assert_eq!(c.cmd(&[b"GET", k.as_bytes()]), bulk(block_value(k)));
    }
    for k in &keys[3..] {
        assert_eq!(c.cmd(&[b"GET", k.as_bytes()]), bulk("other"));
    }
    // REPLACE overwrites, present or not.
    let replaced: Vec<(&str, &[u8])> = vec![(&keys[0], b"new0"), ("imm:fresh", b"new1")];
    assert_eq!(
        call(&mut c, &msetblock_pairs(&replaced, &["REPLACE"])),
        ints(&[1, 1])
    );
    assert_eq!(c.cmd(&[b"GET", keys[0].as_bytes()]), bulk("new0"));
    assert_eq!(c.run("GET imm:fresh"), bulk("new1"));
    // A key twice in one call: the first write wins, unless REPLACE.
    assert_eq!(c.run("MSETBLOCK 2 imm:d x imm:d y"), ints(&[1, 0]));
    assert_eq!(c.run("GET imm:d"), bulk("x"));
    assert_eq!(c.run("msetblock 2 imm:d x imm:d y replace"), ints(&[1, 1]));
    assert_eq!(c.run("GET imm:d"), bulk("y"));
    // Blocks are plain strings for every other command.
    assert_eq!(c.cmd(&[b"TYPE", keys[1].as_bytes()]), status("string"));
    assert_eq!(
        c.cmd(&[b"STRLEN", keys[1].as_bytes()]),
        int(block_value(&keys[1]).len() as i64)
    );
    assert_eq!(c.run("DEL imm:d"), int(1));
    assert_eq!(c.run("MSETBLOCK 1 imm:d z"), ints(&[1]));
    // A plain SET key is a present block too.
    assert_eq!(c.run("SET imm:plain v"), ok());
    assert_eq!(c.run("MSETBLOCK 1 imm:plain w"), ints(&[0]));
    assert_eq!(c.run("GET imm:plain"), bulk("v"));
    // Binary keys and values, and an empty value.
    let key = b"imm:\x00\r\nbin";
    let value = b"\x00\xff\r\n$3\r\n";
    assert_eq!(
        c.cmd(&[b"MSETBLOCK", b"2", key, value, b"imm:empty", b""]),
        ints(&[1, 1])
    );
    assert_eq!(c.cmd(&[b"GET", key]), bulk(value));
    assert_eq!(
        c.cmd(&[b"MGETPREFIX", b"2", b"imm:empty", key]),
        array(vec![bulk(""), bulk(value)])
    );
    assert_eq!(c.run("DBSIZE"), int(11));
}

#[test]
fn msetblock_expiry_applies_to_every_stored_block() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("ttl", 8);
    assert_eq!(
        call(&mut c, &msetblock(&keys[..4], &["EX", "100"])),
        ints(&[1; 4])
    );
    for k in &keys[..4] {
        let ttl = c.cmd(&[b"TTL", k.as_bytes()]).int();
        assert!((1..=100).contains(&ttl), "TTL {k}: {ttl}");
    }
    assert_eq!(
        call(&mut c, &msetblock(&keys[4..], &["PX", "50000", "CHAIN"])),
        ints(&[1; 4])
    );
    for k in &keys[4..] {
        let pttl = c.cmd(&[b"PTTL", k.as_bytes()]).int();
        assert!((1..=50000).contains(&pttl), "PTTL {k}: {pttl}");
    }
    // A block left unchanged keeps its own expiry (here: none).
    assert_eq!(c.run("SET ttl:plain v"), ok());
    assert_eq!(
        c.run("MSETBLOCK 2 ttl:plain x ttl:fresh y EX 100"),
        ints(&[0, 1])
    );
    assert_eq!(c.run("TTL ttl:plain"), int(-1));
    assert!(c.run("TTL ttl:fresh").int() > 0);
    // REPLACE stores a new block: its expiry is the call's (none clears it).
    assert_eq!(
        call(&mut c, &msetblock(&keys[..1], &["REPLACE"])),
        ints(&[1])
    );
    assert_eq!(c.cmd(&[b"TTL", keys[0].as_bytes()]), int(-1));
    assert_eq!(
        call(
            &mut c,
            &msetblock(&keys[1..2], &["REPLACE", "PX", "100000"])
        ),
        ints(&[1])
    );
    assert!(c.cmd(&[b"PTTL", keys[1].as_bytes()]).int() > 50000);
    // The expiry really removes the blocks.
    let short = chain("ttl:short", 4);
    assert_eq!(
        call(&mut c, &msetblock(&short, &["CHAIN", "PX", "150"])),
        ints(&[1; 4])
    );
    let gone = eventually(Duration::from_secs(10), || {
        call(&mut c, &keys_cmd("PREFIXLEN", &short, &[])) == int(0)
    });
    assert!(gone, "blocks stored with PX 150 never expired");
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &short, &[])),
        array(vec![])
    );
    assert_eq!(
        call(&mut c, &keys_cmd("MEXISTS", &short, &[])),
        ints(&[0; 4])
    );
}

#[test]
fn msetblock_errors() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let syntax = err("ERR syntax error");
    let not_int = err("ERR value is not an integer or out of range");
    let expire = err("ERR invalid expire time in 'msetblock' command");
    let count = err("ERR numblocks should be greater than 0");
    let cases: Vec<(&str, Resp)> = vec![
        ("MSETBLOCK", arity("msetblock")),
        ("MSETBLOCK 1", arity("msetblock")),
        ("MSETBLOCK 1 a", arity("msetblock")),
        ("MSETBLOCK x a 1", not_int.clone()),
        ("MSETBLOCK 99999999999999999999 a 1", not_int.clone()),
        ("MSETBLOCK 0 a 1", count.clone()),
        ("MSETBLOCK -1 a 1", count),
        // Odd pairs and wrong counts.
        ("MSETBLOCK 2 a 1 b", syntax.clone()),
        ("MSETBLOCK 2 a 1", syntax.clone()),
        ("MSETBLOCK 3 a 1 b 2", syntax.clone()),
        ("MSETBLOCK 1 a 1 b", syntax.clone()),
        ("MSETBLOCK 1 a 1 b 2", syntax.clone()),
        // Unknown, repeated and misplaced options.
        ("MSETBLOCK 1 a 1 BOGUS", syntax.clone()),
        ("MSETBLOCK 1 a 1 NX", syntax.clone()),
        ("MSETBLOCK 1 a 1 PARENT p", syntax.clone()),
        ("MSETBLOCK 1 a 1 PARENT p CHAIN", syntax.clone()),
        ("MSETBLOCK 1 a 1 CHAIN PARENT", syntax.clone()),
        ("MSETBLOCK 1 a 1 CHAIN CHAIN", syntax.clone()),
        ("MSETBLOCK 1 a 1 CHAIN PARENT p PARENT q", syntax.clone()),
        ("MSETBLOCK 1 a 1 REPLACE REPLACE", syntax.clone()),
        ("MSETBLOCK 1 a 1 PARTIAL", syntax.clone()),
        ("MSETBLOCK 1 a 1 CHAIN PARTIAL PARTIAL", syntax.clone()),
        ("MSETBLOCK 1 a 1 EX 10 PX 10", syntax.clone()),
        ("MSETBLOCK 1 a 1 EX 10 EX 10", syntax.clone()),
        ("MSETBLOCK 1 a 1 EX", syntax.clone()),
        ("MSETBLOCK 1 a 1 PX", syntax),
        // Bad expiry values.
        ("MSETBLOCK 1 a 1 EX 0", expire.clone()),
        ("MSETBLOCK 1 a 1 EX -5", expire.clone()),
        ("MSETBLOCK 1 a 1 PX 0", expire.clone()),
        ("MSETBLOCK 1 a 1 EX 99999999999999999", expire),
        ("MSETBLOCK 1 a 1 EX abc", not_int.clone()),
        ("MSETBLOCK 1 a 1 PX 1.5", not_int),
    ];
    for (line, want) in &cases {
        assert_eq!(&c.run(line), want, "{line}");
    }
    // Nothing of a rejected call is stored, whatever came before the error.
    assert_eq!(
        c.run("MSETBLOCK 2 a 1 b 2 CHAIN BOGUS"),
        err("ERR syntax error")
    );
    assert_eq!(c.run("DBSIZE"), int(0));
    // Options in any order and any case.
    assert_eq!(
        c.run("MSETBLOCK 2 a 1 b 2 replace ex 100 chain parent p"),
        ints(&[1, 1])
    );
    assert_eq!(
        c.run("MSETBLOCK 2 e 1 f 2 partial CHAIN PARENT b"),
        ints(&[1, 1])
    );
    assert_eq!(c.run("MSETBLOCK 1 c 3 CHAIN REPLACE Px 5000"), ints(&[1]));
    assert_eq!(c.run("MSETBLOCK 1 d 4 CHAIN PARENT c"), ints(&[1]));
}

#[test]
fn chain_records_parent_links() {
    // No command shows a block's parent, but the link is part of what the
    // block costs: MEMORY USAGE of a chained block exceeds that of the same
    // block stored without CHAIN by exactly the length of its parent's key.
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("link", 6);
    let parent = "p".repeat(1000);
    let usage = |c: &mut RawConn| -> Vec<i64> {
        keys.iter()
            .map(|k| c.cmd(&[b"MEMORY", b"USAGE", k.as_bytes()]).int())
            .collect()
    };
    assert_eq!(call(&mut c, &msetblock(&keys, &[])), ints(&[1; 6]));
    let plain = usage(&mut c);
    let used_plain = info_num(&info(&mut c, "memory"), "used_memory");

    let mut del = vec![b"DEL".to_vec()];
    del.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    assert_eq!(call(&mut c, &del), int(6));
    assert_eq!(
        call(&mut c, &msetblock(&keys, &["CHAIN", "PARENT", &parent])),
        ints(&[1; 6])
    );
    let chained = usage(&mut c);
    let used_chained = info_num(&info(&mut c, "memory"), "used_memory");
    let mut links = vec![parent.len() as i64];
    links.extend(keys[..5].iter().map(|k| k.len() as i64));
    for i in 0..6 {
        assert_eq!(
            chained[i] - plain[i],
            links[i],
            "block {i}: MEMORY USAGE {} with CHAIN, {} without",
            chained[i],
            plain[i]
        );
    }
    assert_eq!(
        used_chained - used_plain,
        links.iter().sum::<i64>() as u64,
        "used_memory grows by the recorded links"
    );

    // CHAIN without PARENT: the first block has no link.
    assert_eq!(call(&mut c, &del), int(6));
    assert_eq!(call(&mut c, &msetblock(&keys, &["CHAIN"])), ints(&[1; 6]));
    let chained = usage(&mut c);
    assert_eq!(chained[0], plain[0]);
    for i in 1..6 {
        assert_eq!(chained[i] - plain[i], links[i], "block {i}");
    }
    // Links survive RENAME.
    let renamed = format!("{}:renamed", keys[3]);
    assert_eq!(
        c.cmd(&[b"RENAME", keys[3].as_bytes(), renamed.as_bytes()]),
        ok()
    );
    let after = c.cmd(&[b"MEMORY", b"USAGE", renamed.as_bytes()]).int();
    assert_eq!(after - chained[3], (renamed.len() - keys[3].len()) as i64);
}

#[test]
fn msetblock_out_of_memory_under_noeviction() {
    // 4 shards share 4 MiB: 1 MiB each.
    let server = Server::start(&["--maxmemory", "4194304", "--maxmemory-policy", "noeviction"]);
    let mut c = server.raw();
    let value = vec![b'v'; 100 * 1024];
    // Fill shard 1 until a block does not fit.
    let fill = keys_on_shard("oom:fill", 1, 20);
    let mut stored = 0;
    for k in &fill {
        match c.cmd(&[b"MSETBLOCK", b"1", k.as_bytes(), &value]) {
            r if r == ints(&[1]) => stored += 1,
            r if r == ints(&[-1]) => break,
            other => panic!("MSETBLOCK while filling: {other:?}"),
        }
    }
    assert!(
        (5..20).contains(&stored),
        "stored {stored} blocks of 100 KiB"
    );
    let on = |shard: usize, name: &str| keys_on_shard(&format!("oom:{name}"), shard, 1).remove(0);
    let (a, b, d) = (on(0, "a"), on(1, "b"), on(2, "d"));
    // Without CHAIN each block stands alone.
    let pairs: Vec<(&str, &[u8])> = vec![(&a, &value), (&b, &value), (&d, &value)];
    assert_eq!(
        call(&mut c, &msetblock_pairs(&pairs, &[])),
        ints(&[1, -1, 1])
    );
    assert_eq!(c.cmd(&[b"EXISTS", b.as_bytes()]), int(0));
    // With CHAIN, the blocks after a failed one are not stored either.
    let (e, f, g) = (on(0, "e"), on(1, "f"), on(2, "g"));
    let pairs: Vec<(&str, &[u8])> = vec![(&e, &value), (&f, &value), (&g, &value)];
    assert_eq!(
        call(&mut c, &msetblock_pairs(&pairs, &["CHAIN"])),
        ints(&[1, -1, -1])
    );
    assert_eq!(c.cmd(&[b"EXISTS", e.as_bytes()]), int(1));
    assert_eq!(c.cmd(&[b"EXISTS", g.as_bytes()]), int(0));
    let (h, i) = (on(1, "h"), on(3, "i"));
    let pairs: Vec<(&str, &[u8])> = vec![(&h, &value), (&i, &value)];
    assert_eq!(
        call(&mut c, &msetblock_pairs(&pairs, &["CHAIN", "PARENT", &e])),
        ints(&[-1, -1])
    );
    assert_eq!(c.cmd(&[b"EXISTS", i.as_bytes()]), int(0));
    // A present block is still `0` when memory is full.
    assert_eq!(
        c.cmd(&[b"MSETBLOCK", b"1", fill[0].as_bytes(), b"x"]),
        ints(&[0])
    );
    // A small block still fits where a big one did not; the prefix reads
    // see exactly what was stored.
    assert_eq!(
        c.cmd(&[
            b"MSETBLOCK",
            b"2",
            e.as_bytes(),
            b"x",
            b"oom:small",
            b"y",
            b"CHAIN"
        ]),
        ints(&[0, 1])
    );
    assert_eq!(
        c.cmd(&[b"PREFIXLEN", b"3", e.as_bytes(), f.as_bytes(), g.as_bytes()]),
        int(1)
    );
    // Larger than a shard's whole share: -1 even when eviction could run.
    assert_eq!(c.run("CONFIG SET maxmemory-policy allkeys-lru"), ok());
    let huge = vec![b'h'; 2 * 1024 * 1024];
    let j = on(3, "j");
    assert_eq!(
        c.cmd(&[b"MSETBLOCK", b"1", j.as_bytes(), &huge]),
        ints(&[-1])
    );
    // ... while a block that fits after evicting is stored.
    assert_eq!(
        c.cmd(&[b"MSETBLOCK", b"1", b.as_bytes(), &value]),
        ints(&[1])
    );
    assert!(info_num(&info(&mut c, "stats"), "evicted_keys") >= 1);
}

// ---- MGETPREFIX, PREFIXLEN, MEXISTS ---------------------------------------------------

#[test]
fn prefix_reads_across_shards() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("pre", 12);
    // Blocks 0..7 and 8..12: block 7 is missing.
    assert_eq!(
        call(&mut c, &msetblock(&keys[..7], &["CHAIN"])),
        ints(&[1; 7])
    );
    assert_eq!(
        call(
            &mut c,
            &msetblock(&keys[8..], &["CHAIN", "PARENT", &keys[7]])
        ),
        ints(&[1; 4])
    );
    let shards: BTreeSet<usize> = keys[..7]
        .iter()
        .map(|k| shard_of(k.as_bytes(), SHARDS))
        .collect();
    assert_eq!(shards.len(), SHARDS);

    let mget = |c: &mut RawConn, keys: &[String], extra: &[&str]| {
        call(c, &keys_cmd("MGETPREFIX", keys, extra))
    };
    assert_eq!(mget(&mut c, &keys, &[]), values_of(&keys[..7]));
    assert_eq!(mget(&mut c, &keys[..7], &[]), values_of(&keys[..7]));
    assert_eq!(mget(&mut c, &keys[..3], &[]), values_of(&keys[..3]));
    assert_eq!(mget(&mut c, &keys[8..], &[]), values_of(&keys[8..]));
    assert_eq!(mget(&mut c, &keys[7..], &[]), array(vec![]));
    let missing_first = vec!["pre:nope".to_string(), keys[0].clone()];
    assert_eq!(mget(&mut c, &missing_first, &[]), array(vec![]));
    let doubled = vec![keys[0].clone(), keys[0].clone(), keys[1].clone()];
    assert_eq!(
        mget(&mut c, &doubled, &[]),
        array(doubled.iter().map(|k| bulk(block_value(k))).collect())
    );

    // MAXBYTES: the longest prefix whose values fit.
    let size = |i: usize| block_value(&keys[i]).len();
    let three = (size(0) + size(1) + size(2)).to_string();
    let just_under = (size(0) + size(1) + size(2) - 1).to_string();
    assert_eq!(
        mget(&mut c, &keys, &["MAXBYTES", &three]),
        values_of(&keys[..3])
    );
    assert_eq!(
        mget(&mut c, &keys, &["maxbytes", &just_under]),
        values_of(&keys[..2])
    );
    assert_eq!(mget(&mut c, &keys, &["MAXBYTES", "0"]), array(vec![]));
    let first_too_big = (size(0) - 1).to_string();
    assert_eq!(
        mget(&mut c, &keys, &["MAXBYTES", &first_too_big]),
        array(vec![])
    );
    assert_eq!(
        mget(&mut c, &keys, &["MAXBYTES", "1000000000000"]),
        values_of(&keys[..7])
    );
    // MAXBYTES combined with BLOCK when the prefix is complete.
    assert_eq!(
        mget(&mut c, &keys[..7], &["MAXBYTES", &three, "BLOCK", "60000"]),
        values_of(&keys[..3])
    );

    // PREFIXLEN and MEXISTS see the same keyspace.
    let plen = |c: &mut RawConn, keys: &[String]| call(c, &keys_cmd("PREFIXLEN", keys, &[]));
    assert_eq!(plen(&mut c, &keys), int(7));
    assert_eq!(plen(&mut c, &keys[..5]), int(5));
    assert_eq!(plen(&mut c, &keys[7..]), int(0));
    assert_eq!(plen(&mut c, &keys[8..]), int(4));
    assert_eq!(plen(&mut c, &missing_first), int(0));
    let mut flags = vec![1; 12];
    flags[7] = 0;
    assert_eq!(call(&mut c, &keys_cmd("MEXISTS", &keys, &[])), ints(&flags));
    assert_eq!(
        call(&mut c, &keys_cmd("mexists", &missing_first, &[])),
        ints(&[0, 1])
    );
    // Keys sharing a hash tag live on one shard.
    assert_eq!(
        c.run("MSETBLOCK 3 {t}a 1 {t}b 2 {t}c 3 CHAIN"),
        ints(&[1, 1, 1])
    );
    assert_eq!(
        c.run("MGETPREFIX 4 {t}a {t}b {t}c {t}d"),
        bulks(&["1", "2", "3"])
    );
    assert_eq!(c.run("PREFIXLEN 4 {t}a {t}b {t}c {t}d"), int(3));
    assert_eq!(c.run("MEXISTS 4 {t}a {t}b {t}d {t}c"), ints(&[1, 1, 0, 1]));
}

#[test]
fn prefix_read_errors() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET a 1"), ok());
    let syntax = err("ERR syntax error");
    let not_int = err("ERR value is not an integer or out of range");
    let count = err("ERR numkeys should be greater than 0");
    let min = err("ERR MIN must be between 1 and numkeys");
    let timeout = err("ERR timeout must be greater than 0");
    let cases: Vec<(&str, Resp)> = vec![
        ("MGETPREFIX", arity("mgetprefix")),
        ("MGETPREFIX 1", arity("mgetprefix")),
        ("MGETPREFIX 0 a", count.clone()),
        ("MGETPREFIX -1 a", count.clone()),
        ("MGETPREFIX x a", not_int.clone()),
        ("MGETPREFIX 3 a b", syntax.clone()),
        ("MGETPREFIX 1 a b", syntax.clone()),
        ("MGETPREFIX 1 a BOGUS 1", syntax.clone()),
        ("MGETPREFIX 1 a MAXBYTES", syntax.clone()),
        (
            "MGETPREFIX 1 a MAXBYTES -1",
            err("ERR MAXBYTES must not be negative"),
        ),
        ("MGETPREFIX 1 a MAXBYTES x", not_int.clone()),
        ("MGETPREFIX 1 a MAXBYTES 1 MAXBYTES 2", syntax.clone()),
        ("MGETPREFIX 1 a BLOCK", syntax.clone()),
        ("MGETPREFIX 1 a BLOCK 0", timeout.clone()),
        ("MGETPREFIX 1 a BLOCK -5", timeout),
        (
            "MGETPREFIX 1 a BLOCK x",
            err("ERR timeout is not an integer or out of range"),
        ),
        ("MGETPREFIX 1 a BLOCK 10 BLOCK 10", syntax.clone()),
        ("MGETPREFIX 1 a MIN 1", syntax.clone()),
        ("MGETPREFIX 1 a BLOCK 10 MIN 0", min.clone()),
        ("MGETPREFIX 1 a BLOCK 10 MIN 2", min.clone()),
        ("MGETPREFIX 2 a b BLOCK 10 MIN -1", min),
        ("MGETPREFIX 1 a BLOCK 10 MIN x", not_int.clone()),
        ("MGETPREFIX 1 a BLOCK 10 MIN", syntax.clone()),
        ("MGETPREFIX 2 a b BLOCK 10 MIN 1 MIN 1", syntax.clone()),
        // A bad call is refused at once, not after waiting.
        ("MGETPREFIX 1 nokey BLOCK 60000 BOGUS", syntax.clone()),
        ("PREFIXLEN", arity("prefixlen")),
        ("PREFIXLEN 1", arity("prefixlen")),
        ("PREFIXLEN 0 a", count.clone()),
        ("PREFIXLEN x a", not_int.clone()),
        ("PREFIXLEN 2 a", syntax.clone()),
        ("PREFIXLEN 1 a b", syntax.clone()),
        ("PREFIXLEN 1 a MAXBYTES 10", syntax.clone()),
        ("PREFIXLEN 1 a HOLD", syntax.clone()),
        ("PREFIXLEN 1 a HOLD 10 HOLD 10", syntax.clone()),
        (
            "PREFIXLEN 1 a HOLD 0",
            err("ERR HOLD must be greater than 0"),
        ),
        (
            "PREFIXLEN 1 a HOLD -1",
            err("ERR HOLD must be greater than 0"),
        ),
        ("PREFIXLEN 1 a HOLD x", not_int.clone()),
        ("MEXISTS", arity("mexists")),
        ("MEXISTS 1", arity("mexists")),
        ("MEXISTS 0 a", count),
        ("MEXISTS x a", not_int),
        ("MEXISTS 2 a", syntax.clone()),
        ("MEXISTS 1 a b", syntax),
    ];
    for (line, want) in &cases {
        assert_eq!(&c.run(line), want, "{line}");
    }
    assert_eq!(blocking_state(&mut c), (0, 0));
}

/// `MSETBLOCK` of `keys`, each value 64 KiB, as one chain.
fn msetblock_64k(keys: &[String]) -> Vec<Vec<u8>> {
    let value = vec![7u8; 64 * 1024];
    let pairs: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &value[..])).collect();
    msetblock_pairs(&pairs, &["CHAIN"])
}

/// INFO stats' `lookup_holds_<outcome>` and `lookup_held_keys`.
fn holds(c: &mut RawConn, outcome: &str) -> u64 {
    info_num(&info(c, "stats"), &format!("lookup_{outcome}"))
}

#[test]
fn a_held_prefix_survives_eviction_until_it_is_read() {
    // Two shards, 4 MiB each; 64 KiB blocks. The holds may cover a
    // quarter of maxmemory (2 MiB, 1 MiB a shard), this client half of it.
    let server = Server::start(&[
        "--threads",
        "2",
        "--maxmemory",
        "8mb",
        // Exact LRU, so that the blocks are the first to go once their
        // hold ends (the store's tests cover every policy).
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    let mut c = server.raw();
    let held = chain("held", 4);
    assert_eq!(call(&mut c, &msetblock_64k(&held)), ints(&[1; 4]));
    assert_eq!(
        call(&mut c, &keys_cmd("PREFIXLEN", &held, &["HOLD", "60000"])),
        int(4)
    );
    assert_eq!(holds(&mut c, "held_keys"), 4);
    assert_eq!(holds(&mut c, "holds_granted"), 4);
    // A writer floods the tier many times over: nothing it writes fails,
    // and the held blocks stay.
    let mut w = server.raw();
    for i in 0..20 {
        let flood = chain(&format!("flood{i}"), 32);
        let codes = call(&mut w, &msetblock_64k(&flood));
        assert_eq!(codes, ints(&[1; 32]), "round {i}");
    }
    assert!(info_num(&info(&mut c, "stats"), "evicted_keys") > 400);
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &held, &[])), int(4));
    assert_eq!(holds(&mut c, "holds_broken"), 0);
    // The load reads them: the holds end, and the next flood takes them.
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &held, &[]))
            .items()
            .len(),
        4
    );
    assert_eq!(holds(&mut c, "holds_released"), 4);
    assert_eq!(holds(&mut c, "held_keys"), 0);
    for i in 0..20 {
        call(&mut w, &msetblock_64k(&chain(&format!("again{i}"), 32)));
    }
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &held, &[])), int(0));
}

#[test]
fn holds_end_by_time_and_stop_at_the_limits() {
    let server = Server::start(&[
        "--threads",
        "1",
        "--maxmemory",
        "8mb",
        "--hold-max-memory",
        "819200",
        "--hold-client-max-memory",
        "204800",
    ]);
    let mut c = server.raw();
    // A client may hold 200 KiB: three 64 KiB blocks.
    let keys = chain("lim", 6);
    assert_eq!(call(&mut c, &msetblock_64k(&keys)), ints(&[1; 6]));
    assert_eq!(
        call(&mut c, &keys_cmd("PREFIXLEN", &keys, &["HOLD", "60000"])),
        int(3),
        "the count stops where the client's limit does"
    );
    assert_eq!(holds(&mut c, "holds_refused"), 1);
    // Another client has room of its own, and a held key costs it nothing.
    let mut d = server.raw();
    assert_eq!(
        call(&mut d, &keys_cmd("PREFIXLEN", &keys, &["HOLD", "60000"])),
        int(6)
    );
    assert_eq!(holds(&mut c, "held_keys"), 6);
    // The node's limit (0.8 MiB: twelve blocks) stops a client with room
    // of its own; a larger limit does not.
    let more = chain("more", 12);
    assert_eq!(call(&mut c, &msetblock_64k(&more)), ints(&[1; 12]));
    let counts: Vec<i64> = (0..3)
        .map(|_| {
            let mut e = server.raw();
            call(&mut e, &keys_cmd("PREFIXLEN", &more, &["HOLD", "60000"])).int()
        })
        .collect();
    assert_eq!(counts, [3, 6, 6], "six held before, six more fit");
    assert_eq!(holds(&mut c, "held_keys"), 12);
    assert_eq!(c.run("CONFIG SET hold-max-memory 4mb"), ok());
    assert_eq!(c.run("CONFIG SET hold-client-max-memory 4mb"), ok());
    assert_eq!(
        c.run("CONFIG GET hold-max-memory"),
        bulks(&["hold-max-memory", "4194304"])
    );
    let mut g = server.raw();
    assert_eq!(
        call(&mut g, &keys_cmd("PREFIXLEN", &more, &["HOLD", "60000"])),
        int(12),
        "4 MiB is 64 blocks: the last six fit"
    );
    // Without HOLD nothing is held; a short hold ends by itself.
    assert_eq!(c.run("FLUSHALL"), ok());
    let short = chain("short", 2);
    assert_eq!(call(&mut c, &msetblock_64k(&short)), ints(&[1; 2]));
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &short, &[])), int(2));
    let granted = holds(&mut c, "holds_granted");
    assert_eq!(
        call(&mut c, &keys_cmd("PREFIXLEN", &short, &["HOLD", "50"])),
        int(2)
    );
    assert_eq!(holds(&mut c, "holds_granted"), granted + 2);
    assert!(eventually(Duration::from_secs(10), || holds(
        &mut c,
        "held_keys"
    ) == 0));
    assert!(holds(&mut c, "holds_expired") >= 2);
}

#[test]
fn mgetprefix_counts_returned_blocks_as_accessed_prefixlen_does_not() {
    let server = Server::start(&["--maxmemory-policy", "allkeys-lfu"]);
    let mut c = server.raw();
    let keys = chain("acc", 6);
    // Blocks 0..4 and 5 are present, 4 is not; `control` is never read.
    assert_eq!(
        call(&mut c, &msetblock(&keys[..4], &["CHAIN"])),
        ints(&[1; 4])
    );
    assert_eq!(call(&mut c, &msetblock(&keys[5..], &[])), ints(&[1]));
    assert_eq!(c.run("SET acc:control v"), ok());
    let stats = |c: &mut RawConn| {
        let text = info(c, "stats");
        (
            info_num(&text, "keyspace_hits"),
            info_num(&text, "keyspace_misses"),
        )
    };
    // Frequencies are compared with the control key read at the same
    // moment, so a minute of LFU decay in between cannot matter.
    let freqs = |c: &mut RawConn| -> (Vec<i64>, i64) {
        let control = object_int(c, "FREQ", "acc:control");
        let f = [0, 1, 2, 3, 5]
            .iter()
            .map(|&i| object_int(c, "FREQ", &keys[i]))
            .collect();
        (f, control)
    };
    let before = stats(&mut c);

    for _ in 0..3 {
        assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(4));
    }
    let (f, control) = freqs(&mut c);
    assert!(
        f.iter().all(|&x| x == control),
        "PREFIXLEN touched: {f:?} vs {control}"
    );
    assert_eq!(stats(&mut c), before, "PREFIXLEN counted hits or misses");

    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys, &[])),
        values_of(&keys[..4])
    );
    // The returned blocks count as hits (their shards are told without
    // waiting, so this may show a moment later).
    let mut hits = 0;
    let counted = eventually(Duration::from_secs(10), || {
        hits = stats(&mut c).0;
        hits == before.0 + 4
    });
    assert!(counted, "keyspace_hits went from {} to {hits}", before.0);
    let (f, control) = freqs(&mut c);
    assert!(f[..4].iter().all(|&x| x > control), "{f:?} vs {control}");
    assert_eq!(f[4], control, "a block after the prefix was touched");

    // Under CLIENT NO-TOUCH the blocks are still hits (as in Redis); that
    // they are not touched is checked with OBJECT IDLETIME below, where
    // the answer does not depend on LFU's random increments.
    let mut quiet = server.raw();
    assert_eq!(quiet.run("CLIENT NO-TOUCH ON"), ok());
    assert_eq!(
        call(&mut quiet, &keys_cmd("MGETPREFIX", &keys, &[])),
        values_of(&keys[..4])
    );
    let counted = eventually(Duration::from_secs(10), || {
        hits = stats(&mut c).0;
        hits == before.0 + 8
    });
    assert!(counted, "keyspace_hits went from {} to {hits}", before.0);
}

#[test]
fn mgetprefix_resets_idle_time_prefixlen_and_mexists_do_not() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("idle", 4);
    assert_eq!(
        call(&mut c, &msetblock(&keys[..3], &["CHAIN"])),
        ints(&[1; 3])
    );
    assert_eq!(c.run("SET idle:control v"), ok());
    // OBJECT IDLETIME counts whole seconds.
    thread::sleep(Duration::from_millis(2100));
    let idle = |c: &mut RawConn| -> Vec<i64> {
        keys[..3]
            .iter()
            .map(|k| object_int(c, "IDLETIME", k))
            .collect()
    };
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(3));
    assert_eq!(
        call(&mut c, &keys_cmd("MEXISTS", &keys, &[])),
        ints(&[1, 1, 1, 0])
    );
    let after = idle(&mut c);
    assert!(
        after.iter().all(|&s| s >= 2),
        "PREFIXLEN/MEXISTS touched: {after:?}"
    );

    let mut quiet = server.raw();
    assert_eq!(quiet.run("CLIENT NO-TOUCH ON"), ok());
    assert_eq!(
        call(&mut quiet, &keys_cmd("MGETPREFIX", &keys, &[])),
        values_of(&keys[..3])
    );
    assert_eq!(quiet.run("PING"), status("PONG"));
    let after = idle(&mut c);
    assert!(
        after.iter().all(|&s| s >= 2),
        "NO-TOUCH MGETPREFIX touched: {after:?}"
    );

    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys[..2], &[])),
        values_of(&keys[..2])
    );
    let after = idle(&mut c);
    assert!(after[0] <= 1 && after[1] <= 1, "not touched: {after:?}");
    assert!(after[2] >= 2, "a block not returned was touched: {after:?}");
    assert!(object_int(&mut c, "IDLETIME", "idle:control") >= 2);
}

// ---- protocols and clients -------------------------------------------------------------

#[test]
fn raw_replies_are_the_same_in_resp2_and_resp3() {
    let server = Server::start(&[]);
    for resp3 in [false, true] {
        let mut c = server.raw();
        if resp3 {
            assert!(matches!(c.run("HELLO 3"), Resp::Map(_)));
        }
        let keys = chain(&format!("proto{resp3}"), 5);
        assert_eq!(
            call(&mut c, &msetblock(&keys[..3], &["CHAIN", "EX", "100"])),
            ints(&[1, 1, 1])
        );
        assert_eq!(call(&mut c, &msetblock(&keys[..1], &[])), ints(&[0]));
        assert_eq!(
            call(&mut c, &keys_cmd("MGETPREFIX", &keys, &[])),
            values_of(&keys[..3])
        );
        // An empty prefix is an empty array, not a null.
        assert_eq!(
            call(&mut c, &keys_cmd("MGETPREFIX", &keys[3..], &[])),
            Resp::Array(Some(vec![]))
        );
        assert_eq!(
            call(
                &mut c,
                &keys_cmd("MGETPREFIX", &keys[3..], &["BLOCK", "50"])
            ),
            Resp::Array(Some(vec![]))
        );
        assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(3));
        assert_eq!(
            call(&mut c, &keys_cmd("MEXISTS", &keys, &[])),
            ints(&[1, 1, 1, 0, 0])
        );
        assert_eq!(
            c.run("MGETPREFIX 0 a"),
            err("ERR numkeys should be greater than 0")
        );
        // Pipelined: replies in order, across shards.
        let mut pipeline = Vec::new();
        pipeline.extend(encode(&[b"MSETBLOCK", b"1", keys[3].as_bytes(), b"x"]));
        pipeline.extend(encode(&[
            b"PREFIXLEN",
            b"5",
            keys[0].as_bytes(),
            keys[1].as_bytes(),
            keys[2].as_bytes(),
            keys[3].as_bytes(),
            keys[4].as_bytes(),
        ]));
        pipeline.extend(encode(&[
            b"MGETPREFIX",
            b"2",
            keys[3].as_bytes(),
            keys[4].as_bytes(),
        ]));
        pipeline.extend(encode(&[b"MEXISTS", b"1", keys[4].as_bytes()]));
        c.send(&pipeline);
        assert_eq!(c.read(), ints(&[1]));
        assert_eq!(c.read(), int(4));
        assert_eq!(c.read(), bulks(&["x"]));
        assert_eq!(c.read(), ints(&[0]));
    }
}

#[test]
fn redis_crate_parses_every_reply() {
    let server = Server::start(&[]);
    for (name, mut con) in [("resp2", server.redis()), ("resp3", server.redis3())] {
        let keys = chain(&format!("crate{name}"), 6);
        let mut store = redis::cmd("MSETBLOCK");
        store.arg(4);
        for k in &keys[..4] {
            store.arg(k).arg(block_value(k));
        }
        store
            .arg("CHAIN")
            .arg("PARENT")
            .arg("root")
            .arg("EX")
            .arg(600);
        let codes: Vec<i64> = store.query(&mut con).unwrap();
        assert_eq!(codes, vec![1; 4], "{name}");
        let again: Vec<i64> = store.query(&mut con).unwrap();
        assert_eq!(again, vec![0; 4], "{name}");

        let got: Vec<Vec<u8>> = redis::cmd("MGETPREFIX")
            .arg(keys.len())
            .arg(&keys)
            .query(&mut con)
            .unwrap();
        let want: Vec<Vec<u8>> = keys[..4].iter().map(|k| block_value(k)).collect();
        assert_eq!(got, want, "{name}");
        let limited: Vec<Vec<u8>> = redis::cmd("MGETPREFIX")
            .arg(keys.len())
            .arg(&keys)
            .arg("MAXBYTES")
            .arg(want[0].len() + want[1].len())
            .query(&mut con)
            .unwrap();
        assert_eq!(limited, want[..2].to_vec(), "{name}");
        let none: Vec<Vec<u8>> = redis::cmd("MGETPREFIX")
            .arg(2)
            .arg(&keys[4..])
            .query(&mut con)
            .unwrap();
        assert!(none.is_empty(), "{name}");
        let raw: redis::Value = redis::cmd("MGETPREFIX")
            .arg(2)
            .arg(&keys[3..5])
            .query(&mut con)
            .unwrap();
        assert_eq!(
            raw,
            redis::Value::Array(vec![redis::Value::BulkString(want[3].clone())]),
            "{name}"
        );
        let n: usize = redis::cmd("PREFIXLEN")
            .arg(keys.len())
            .arg(&keys)
            .query(&mut con)
            .unwrap();
        assert_eq!(n, 4, "{name}");
        let flags: Vec<bool> = redis::cmd("MEXISTS")
            .arg(keys.len())
            .arg(&keys)
            .query(&mut con)
            .unwrap();
        assert_eq!(flags, vec![true, true, true, true, false, false], "{name}");
        let ttl: i64 = redis::cmd("TTL").arg(&keys[2]).query(&mut con).unwrap();
        assert!((1..=600).contains(&ttl), "{name}: {ttl}");

        let e = redis::cmd("MSETBLOCK")
            .arg(1)
            .arg("a")
            .arg("b")
            .arg("PARENT")
            .arg("p")
            .query::<Vec<i64>>(&mut con)
            .unwrap_err();
        assert_eq!(err_text(&e), "ERR syntax error", "{name}");
        let e = redis::cmd("MGETPREFIX")
            .arg(1)
            .arg("a")
            .arg("BLOCK")
            .arg(0)
            .query::<Vec<Vec<u8>>>(&mut con)
            .unwrap_err();
        assert_eq!(err_text(&e), "ERR timeout must be greater than 0", "{name}");

        // A pipeline mixing the dialect with plain commands.
        let (codes, prefix, len, flags): (Vec<i64>, Vec<Vec<u8>>, i64, Vec<i64>) = redis::pipe()
            .cmd("MSETBLOCK")
            .arg(1)
            .arg(&keys[4])
            .arg(block_value(&keys[4]))
            .cmd("MGETPREFIX")
            .arg(6)
            .arg(&keys)
            .cmd("PREFIXLEN")
            .arg(6)
            .arg(&keys)
            .cmd("MEXISTS")
            .arg(2)
            .arg(&keys[4..])
            .query(&mut con)
            .unwrap();
        assert_eq!(codes, vec![1], "{name}");
        assert_eq!(prefix.len(), 5, "{name}");
        assert_eq!(len, 5, "{name}");
        assert_eq!(flags, vec![1, 0], "{name}");
    }
}

#[test]
fn redis_crate_async_blocking_read() {
    let server = Server::start(&[]);
    let keys = chain("async", 4);
    // Worker threads run the waiting task while this thread polls INFO.
    let runtime = runtime(true);
    runtime.block_on(async {
        for url in [server.url(), server.url_resp3()] {
            let mut reader = connect_async(&url).await;
            let mut writer = connect_async(&url).await;
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut writer)
                .await
                .unwrap();
            let mut wait = redis::cmd("MGETPREFIX");
            wait.arg(4).arg(&keys).arg("BLOCK").arg(15000);
            let waiting = tokio::spawn(async move {
                let got: Vec<Vec<u8>> = wait.query_async(&mut reader).await.unwrap();
                (got, Instant::now())
            });
            let mut probe = server.raw();
            wait_blocking_state(&mut probe, (1, 4));
            let mut store = redis::cmd("MSETBLOCK");
            store.arg(4);
            for k in &keys {
                store.arg(k).arg(block_value(k));
            }
            store.arg("CHAIN");
            let codes: Vec<i64> = store.query_async(&mut writer).await.unwrap();
            let written = Instant::now();
            assert_eq!(codes, vec![1; 4]);
            let (got, at) = tokio::time::timeout(READ_TIMEOUT, waiting)
                .await
                .expect("the waiter returned")
                .unwrap();
            let want: Vec<Vec<u8>> = keys.iter().map(|k| block_value(k)).collect();
            assert_eq!(got, want);
            let took = at.saturating_duration_since(written);
            assert!(
                took < Duration::from_secs(5),
                "woke {took:?} after the write"
            );
        }
    });
}

// ---- COMMAND, commandstats, metrics ------------------------------------------------------

/// The value under `name` in a RESP3 map reply.
fn field(map: &Resp, name: &str) -> Resp {
    match map {
        Resp::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| k.text() == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {map:?}")),
        other => panic!("not a map: {other:?}"),
    }
}

/// The names of a set or array of status strings.
fn names(r: &Resp) -> Vec<String> {
    r.items().iter().map(Resp::text).collect()
}

/// Every `token` in a COMMAND DOCS argument tree.
fn tokens(args: &Resp, out: &mut Vec<String>) {
    for arg in args.items() {
        if let Resp::Map(pairs) = &arg {
            for (k, v) in pairs {
                match k.text().as_str() {
                    "token" => out.push(v.text()),
                    "arguments" => tokens(v, out),
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn command_info_docs_and_getkeys() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert!(matches!(c.run("HELLO 3"), Resp::Map(_)));
    let expected = [
        ("msetblock", -4, vec!["write", "denyoom"], 2, "RW"),
        ("mgetprefix", -3, vec!["readonly", "blocking"], 1, "RO"),
        ("prefixlen", -3, vec!["readonly"], 1, "RO"),
        ("mexists", -3, vec!["readonly"], 1, "RO"),
    ];
    let infos = c
        .run("COMMAND INFO msetblock MGETPREFIX prefixlen mexists")
        .items();
    assert_eq!(infos.len(), 4);
    for ((name, arity, flags, step, access), info) in expected.iter().zip(&infos) {
        let f = info.items();
        assert_eq!(f[0].text(), *name);
        assert_eq!(f[1], int(*arity), "{name}");
        let got = names(&f[2]);
        for flag in flags.iter().chain(&["movablekeys"]) {
            assert!(
                got.iter().any(|g| g == flag),
                "{name} lacks {flag}: {got:?}"
            );
        }
        if *name != "msetblock" {
            assert!(!got.iter().any(|g| g == "write"), "{name}: {got:?}");
        }
        if *name != "mgetprefix" {
            assert!(!got.iter().any(|g| g == "blocking"), "{name}: {got:?}");
        }
        assert_eq!((&f[3], &f[4], &f[5]), (&int(0), &int(0), &int(0)), "{name}");
        let specs = f[8].items();
        assert_eq!(specs.len(), 1, "{name}");
        let spec = &specs[0];
        assert!(
            names(&field(spec, "flags")).contains(&access.to_string()),
            "{name}"
        );
        let begin = field(spec, "begin_search");
        assert_eq!(field(&begin, "type"), bulk("index"));
        assert_eq!(field(&field(&begin, "spec"), "index"), int(1));
        let find = field(spec, "find_keys");
        assert_eq!(field(&find, "type"), bulk("keynum"), "{name}");
        let find = field(&find, "spec");
        assert_eq!(field(&find, "keynumidx"), int(0));
        assert_eq!(field(&find, "firstkey"), int(1));
        assert_eq!(field(&find, "keystep"), int(*step), "{name}");
    }
    // The acl categories show a blocking command as one.
    assert!(names(&infos[1].items()[6]).contains(&"@blocking".to_string()));

    // COMMAND DOCS: summary, complexity and arguments for redis-cli hints.
    let docs = c.run("COMMAND DOCS msetblock mgetprefix prefixlen mexists");
    let Resp::Map(entries) = &docs else {
        panic!("COMMAND DOCS: {docs:?}")
    };
    assert_eq!(entries.len(), 4);
    for (name, doc) in entries {
        let name = name.text();
        assert!(!field(doc, "summary").text().is_empty(), "{name}");
        assert!(!field(doc, "complexity").text().is_empty(), "{name}");
        let args = field(doc, "arguments");
        let first = &args.items()[0];
        let count = if name == "msetblock" {
            "numblocks"
        } else {
            "numkeys"
        };
        assert_eq!(field(first, "name"), bulk(count), "{name}");
        assert_eq!(field(first, "type"), bulk("integer"), "{name}");
        let mut toks = Vec::new();
        tokens(&args, &mut toks);
        let want: &[&str] = match name.as_str() {
            "msetblock" => &["EX", "PX", "CHAIN", "PARENT", "REPLACE"],
            "mgetprefix" => &["MAXBYTES", "BLOCK", "MIN"],
            _ => &[],
        };
        for t in want {
            assert!(
                toks.iter().any(|x| x == t),
                "{name} docs lack {t}: {toks:?}"
            );
        }
        // The keys are documented as keys that may repeat.
        let keys_arg = &args.items()[1];
        let key = if name == "msetblock" {
            field(keys_arg, "arguments").items()[0].clone()
        } else {
            keys_arg.clone()
        };
        assert_eq!(field(&key, "type"), bulk("key"), "{name}");
        assert!(names(&field(keys_arg, "flags")).contains(&"multiple".to_string()));
    }

    // COMMAND GETKEYS follows numkeys, skipping values and options.
    let getkeys = |c: &mut RawConn, line: &str| c.run(&format!("COMMAND GETKEYS {line}"));
    assert_eq!(
        getkeys(&mut c, "MSETBLOCK 2 a 1 b 2 CHAIN PARENT p EX 10"),
        bulks(&["a", "b"])
    );
    assert_eq!(
        getkeys(&mut c, "MGETPREFIX 3 a b c MAXBYTES 10 BLOCK 5 MIN 1"),
        bulks(&["a", "b", "c"])
    );
    assert_eq!(getkeys(&mut c, "PREFIXLEN 2 a b"), bulks(&["a", "b"]));
    assert_eq!(getkeys(&mut c, "MEXISTS 1 MEXISTS"), bulks(&["MEXISTS"]));
    let flagged = c.run("COMMAND GETKEYSANDFLAGS MSETBLOCK 1 a 1");
    assert_eq!(flagged.items()[0].items()[0], bulk("a"));
    let flagged = c.run("COMMAND GETKEYSANDFLAGS MGETPREFIX 1 a");
    assert!(names(&flagged.items()[0].items()[1]).contains(&"RO".to_string()));
    // Counts that do not match the arguments are refused, as Redis does.
    let invalid = err("ERR Invalid arguments specified for command");
    for line in [
        "MGETPREFIX 5 a b",
        "MGETPREFIX 0 a",
        "MGETPREFIX x a",
        "MSETBLOCK 3 a 1 b 2",
        "PREFIXLEN -1 a",
    ] {
        assert_eq!(getkeys(&mut c, line), invalid, "{line}");
    }

    // COMMAND LIST and COMMAND know them.
    let list = names(&c.run("COMMAND LIST"));
    for name in ["msetblock", "mgetprefix", "prefixlen", "mexists"] {
        assert!(list.iter().any(|n| n == name), "COMMAND LIST lacks {name}");
    }
    let all = c.run("COMMAND").items();
    assert_eq!(all.len() as i64, c.run("COMMAND COUNT").int());
    assert!(all.iter().any(|e| e.items()[0].text() == "mgetprefix"));
}

/// `cmdstat_<name>` fields of INFO commandstats.
fn cmdstat(c: &mut RawConn, name: &str) -> Option<(u64, u64, u64)> {
    let text = info(c, "commandstats");
    let line = info_field(&text, &format!("cmdstat_{name}"))?;
    let get = |f: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
            .unwrap_or_else(|| panic!("{f} missing in {line}"))
            .parse()
            .unwrap()
    };
    Some((get("calls"), get("rejected_calls"), get("failed_calls")))
}

#[test]
fn commandstats_and_metrics_count_the_dialect() {
    let metrics_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{metrics_port}");
    let server = Server::start(&["--metrics-addr", &addr]);
    let mut c = server.raw();
    let keys = chain("stat", 4);
    assert_eq!(call(&mut c, &msetblock(&keys, &["CHAIN"])), ints(&[1; 4]));
    assert_eq!(call(&mut c, &msetblock(&keys[..1], &[])), ints(&[0]));
    for _ in 0..3 {
        assert_eq!(
            call(&mut c, &keys_cmd("MGETPREFIX", &keys, &[])),
            values_of(&keys)
        );
    }
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "10"])),
        values_of(&keys)
    );
    assert_eq!(c.run("MGETPREFIX 1 a BOGUS"), err("ERR syntax error"));
    assert_eq!(c.run("MGETPREFIX 1"), arity("mgetprefix"));
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(4));
    assert_eq!(
        call(&mut c, &keys_cmd("MEXISTS", &keys, &[])),
        ints(&[1; 4])
    );
    assert_eq!(c.run("MEXISTS 2 a"), err("ERR syntax error"));

    // calls include failed ones; arity errors are rejected, not called.
    assert_eq!(cmdstat(&mut c, "msetblock"), Some((2, 0, 0)));
    assert_eq!(cmdstat(&mut c, "mgetprefix"), Some((5, 1, 1)));
    assert_eq!(cmdstat(&mut c, "prefixlen"), Some((1, 0, 0)));
    assert_eq!(cmdstat(&mut c, "mexists"), Some((2, 0, 1)));

    let mut body = String::new();
    let complete = eventually(Duration::from_secs(20), || {
        body = scrape(metrics_port);
        let count = |cmd: &str| sample(&body, &format!(r#"kvtier_commands_total{{cmd="{cmd}"}}"#));
        count("msetblock") == Some(2.0)
            && count("mgetprefix") == Some(5.0)
            && count("prefixlen") == Some(1.0)
            && count("mexists") == Some(2.0)
            && sample(&body, r#"kvtier_command_errors_total{cmd="mgetprefix"}"#) == Some(2.0)
    });
    assert!(complete, "metrics never showed the dialect:\n{body}");
    assert!(
        body.contains(r#"kvtier_command_duration_seconds_bucket{cmd="mgetprefix",le="#),
        "{body}"
    );
}

// ---- concurrency --------------------------------------------------------------------------

/// One reader's view: the longest prefix it has seen of each chain, which
/// may never shrink (blocks are only ever added in these tests).
struct ChainReader {
    conn: RawConn,
    seen: Vec<usize>,
    partial: usize,
}

impl ChainReader {
    fn observe(&mut self, chain: usize, prefix: usize, what: &str) {
        assert!(
            prefix >= self.seen[chain],
            "{what} of chain {chain}: {prefix} after {} had been seen",
            self.seen[chain]
        );
        self.seen[chain] = prefix;
    }

    /// Reads chain `i` with one of the three commands and checks it.
    fn check(&mut self, i: usize, keys: &[String], op: usize) {
        match op % 3 {
            0 => {
                let got = call(&mut self.conn, &keys_cmd("MGETPREFIX", keys, &[])).items();
                for (k, v) in keys.iter().zip(&got) {
                    assert_eq!(v.bytes(), block_value(k), "value of {k}");
                }
                self.partial += (!got.is_empty() && got.len() < keys.len()) as usize;
                self.observe(i, got.len(), "MGETPREFIX");
            }
            1 => {
                let n = call(&mut self.conn, &keys_cmd("PREFIXLEN", keys, &[])).int();
                self.observe(i, n as usize, "PREFIXLEN");
            }
            _ => {
                let flags: Vec<i64> = call(&mut self.conn, &keys_cmd("MEXISTS", keys, &[]))
                    .items()
                    .iter()
                    .map(Resp::int)
                    .collect();
                let present = flags.iter().take_while(|&&f| f == 1).count();
                assert!(
                    flags[present..].iter().all(|&f| f == 0),
                    "MEXISTS of chain {i} shows a gap: {flags:?}"
                );
                self.observe(i, present, "MEXISTS");
            }
        }
    }
}

#[test]
fn concurrent_chains_are_seen_without_gaps() {
    const WRITERS: usize = 3;
    const READERS: usize = 3;
    const CHAINS_PER_WRITER: usize = 60;
    const BLOCKS: usize = 12;
    const PER_CALL: usize = 4;
    let server = Server::start(&[]);
    let chains: Arc<Vec<Vec<String>>> = Arc::new(
        (0..WRITERS * CHAINS_PER_WRITER)
            .map(|i| chain(&format!("cc{i}"), BLOCKS))
            .collect(),
    );
    // The chain each writer is publishing now: readers poll it.
    let current: Arc<Vec<AtomicUsize>> = Arc::new(
        (0..WRITERS)
            .map(|w| AtomicUsize::new(w * CHAINS_PER_WRITER))
            .collect(),
    );
    let writers_done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));

    let mut readers = Vec::new();
    for r in 0..READERS {
        let (chains, current, writers_done, failed) = (
            Arc::clone(&chains),
            Arc::clone(&current),
            Arc::clone(&writers_done),
            Arc::clone(&failed),
        );
        let port = server.port;
        readers.push(thread::spawn(move || {
            let mut reader = ChainReader {
                conn: RawConn::connect(port),
                seen: vec![0; chains.len()],
                partial: 0,
            };
            let mut rounds = 0usize;
            // Bounded: the writers finish long before this many rounds (each
            // round is four round trips); a writer that fails stops it too.
            while rounds < 100_000 && !failed.load(Ordering::Relaxed) {
                let finished = writers_done.load(Ordering::Acquire) == WRITERS;
                rounds += 1;
                // The chain a writer is on, with all three commands, and one
                // chain anywhere (published, unpublished or in progress).
                let hot = current[(rounds + r) % WRITERS].load(Ordering::Relaxed);
                for op in 0..3 {
                    reader.check(hot, &chains[hot], op + rounds + r);
                }
                let any = (rounds * 7 + r) % chains.len();
                reader.check(any, &chains[any], rounds);
                if finished {
                    break;
                }
            }
            // Everything is published now: every chain reads back whole.
            for (i, keys) in chains.iter().enumerate() {
                for op in 0..3 {
                    reader.check(i, keys, op);
                }
                assert_eq!(
                    reader.seen[i], BLOCKS,
                    "chain {i} after the writers finished"
                );
            }
            (rounds, reader.partial)
        }));
    }

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (chains, current, writers_done, failed) = (
            Arc::clone(&chains),
            Arc::clone(&current),
            Arc::clone(&writers_done),
            Arc::clone(&failed),
        );
        let port = server.port;
        writers.push(thread::spawn(move || {
            let mut c = RawConn::connect(port);
            for i in w * CHAINS_PER_WRITER..(w + 1) * CHAINS_PER_WRITER {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                current[w].store(i, Ordering::Relaxed);
                let keys = &chains[i];
                // A chain is published in several calls, each continuing the
                // previous one through PARENT.
                for start in (0..BLOCKS).step_by(PER_CALL) {
                    let part = &keys[start..start + PER_CALL];
                    let args = if start == 0 {
                        msetblock(part, &["CHAIN"])
                    } else {
                        msetblock(part, &["CHAIN", "PARENT", &keys[start - 1]])
                    };
                    assert_eq!(call(&mut c, &args), ints(&[1; PER_CALL]));
                }
            }
            writers_done.fetch_add(1, Ordering::Release);
        }));
    }
    let mut panic = None;
    for handle in writers {
        if let Err(e) = handle.join() {
            failed.store(true, Ordering::Relaxed);
            panic.get_or_insert(e);
        }
    }
    for handle in readers {
        match handle.join() {
            Ok((rounds, partial)) => {
                eprintln!("reader: {rounds} rounds, {partial} partial prefixes read")
            }
            Err(e) => {
                failed.store(true, Ordering::Relaxed);
                panic.get_or_insert(e);
            }
        }
    }
    if let Some(e) = panic {
        std::panic::resume_unwind(e);
    }
}

// ---- BLOCK ----------------------------------------------------------------------------------

#[test]
fn block_returns_once_the_prefix_is_written() {
    let server = Server::start(&[]);
    let mut waiter = server.raw();
    let mut writer = server.raw();
    let keys = chain("wake", 3);
    send(
        &mut waiter,
        &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "10000"]),
    );
    wait_blocking_state(&mut writer, (1, 3));
    // Two of three blocks: still waiting.
    assert_eq!(
        call(&mut writer, &msetblock(&keys[..2], &["CHAIN"])),
        ints(&[1, 1])
    );
    waiter.assert_silent(Duration::from_millis(200));
    assert_eq!(blocking_state(&mut writer).0, 1);
    // Any write completes it, here a plain SET.
    assert_eq!(
        writer.cmd(&[b"SET", keys[2].as_bytes(), &block_value(&keys[2])]),
        ok()
    );
    let written = Instant::now();
    let reply = waiter.read();
    let took = written.elapsed();
    assert_eq!(reply, values_of(&keys));
    assert!(
        took < Duration::from_secs(5),
        "woke {took:?} after the write"
    );
    wait_blocking_state(&mut writer, (0, 0));
    // The connection goes on serving.
    assert_eq!(waiter.run("PING"), status("PONG"));

    // Already complete: no wait at all.
    let started = Instant::now();
    assert_eq!(
        call(
            &mut waiter,
            &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "60000"])
        ),
        values_of(&keys)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(blocking_state(&mut writer), (0, 0));
}

#[test]
fn block_timeout_returns_the_partial_prefix() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(
        c.run("CONFIG GET max-block-ms"),
        bulks(&["max-block-ms", "60000"]),
        "the default cap"
    );
    let keys = chain("partial", 3);
    assert_eq!(call(&mut c, &msetblock(&keys[..1], &[])), ints(&[1]));
    let started = Instant::now();
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "300"])),
        values_of(&keys[..1])
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "returned after {took:?}"
    );
    assert!(took < Duration::from_secs(10), "returned after {took:?}");
    assert_eq!(
        call(
            &mut c,
            &keys_cmd("MGETPREFIX", &keys[1..], &["BLOCK", "100"])
        ),
        array(vec![])
    );
    // MAXBYTES still applies to what the wait found.
    assert_eq!(
        call(
            &mut c,
            &keys_cmd("MGETPREFIX", &keys, &["MAXBYTES", "1", "BLOCK", "100"])
        ),
        array(vec![])
    );
    // A timed-out wait leaves nothing behind.
    assert_eq!(blocking_state(&mut c).0, 0);
    wait_blocking_state(&mut c, (0, 0));
    let stats = cmdstat(&mut c, "mgetprefix").unwrap();
    assert_eq!(stats, (3, 0, 0), "a timeout is not a failed call");
}

#[test]
fn block_min_waits_for_that_many_leading_blocks() {
    let server = Server::start(&[]);
    let mut waiter = server.raw();
    let mut writer = server.raw();
    let keys = chain("min", 4);
    send(
        &mut waiter,
        &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "10000", "MIN", "2"]),
    );
    // Only the first MIN keys are waited for.
    wait_blocking_state(&mut writer, (1, 2));
    assert_eq!(call(&mut writer, &msetblock(&keys[..1], &[])), ints(&[1]));
    waiter.assert_silent(Duration::from_millis(200));
    assert_eq!(call(&mut writer, &msetblock(&keys[1..2], &[])), ints(&[1]));
    assert_eq!(waiter.read(), values_of(&keys[..2]));
    wait_blocking_state(&mut writer, (0, 0));

    // MIN already reached: at once, with the whole present prefix.
    assert_eq!(
        call(
            &mut waiter,
            &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "60000", "MIN", "1"])
        ),
        values_of(&keys[..2])
    );
    // Blocks beyond MIN that are present when it wakes are returned too.
    let more = chain("min:more", 3);
    assert_eq!(
        call(&mut writer, &msetblock(&more[1..], &[])),
        ints(&[1, 1])
    );
    send(
        &mut waiter,
        &keys_cmd("MGETPREFIX", &more, &["BLOCK", "10000", "MIN", "1"]),
    );
    wait_blocking_state(&mut writer, (1, 1));
    assert_eq!(call(&mut writer, &msetblock(&more[..1], &[])), ints(&[1]));
    assert_eq!(waiter.read(), values_of(&more));
    wait_blocking_state(&mut writer, (0, 0));
}

#[test]
fn many_waiters_on_one_chain_all_wake() {
    const WAITERS: usize = 20;
    let server = Server::start(&[]);
    let mut writer = server.raw();
    let keys = chain("many", 4);
    let mut waiters: Vec<RawConn> = (0..WAITERS).map(|_| server.raw()).collect();
    for w in &mut waiters {
        send(w, &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "15000"]));
    }
    wait_blocking_state(&mut writer, (WAITERS as u64, 4));
    assert_eq!(
        call(&mut writer, &msetblock(&keys, &["CHAIN"])),
        ints(&[1; 4])
    );
    let written = Instant::now();
    for w in &mut waiters {
        assert_eq!(w.read(), values_of(&keys));
    }
    let took = written.elapsed();
    assert!(took < Duration::from_secs(10), "all woke within {took:?}");
    wait_blocking_state(&mut writer, (0, 0));
    for w in &mut waiters {
        assert_eq!(w.run("PING"), status("PONG"));
    }
}

#[test]
fn a_waiter_that_disconnects_leaves_nothing_behind() {
    let server = Server::start(&[]);
    let mut probe = server.raw();
    let keys = chain("gone", 4);
    // Closed while waiting.
    {
        let mut waiter = server.raw();
        send(
            &mut waiter,
            &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "30000"]),
        );
        wait_blocking_state(&mut probe, (1, 4));
    }
    wait_blocking_state(&mut probe, (0, 0));
    // Closed right after sending, while the server may still be registering
    // the wait on the other shards.
    for _ in 0..40 {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let args = keys_cmd("MGETPREFIX", &keys, &["BLOCK", "30000"]);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        s.write_all(&encode(&refs)).unwrap();
        let _ = s.shutdown(Shutdown::Both);
    }
    wait_blocking_state(&mut probe, (0, 0));
    // Writes to the keys wake nobody and work; a new waiter still works.
    let mut waiter = server.raw();
    send(
        &mut waiter,
        &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "10000"]),
    );
    wait_blocking_state(&mut probe, (1, 4));
    assert_eq!(
        call(&mut probe, &msetblock(&keys, &["CHAIN"])),
        ints(&[1; 4])
    );
    assert_eq!(waiter.read(), values_of(&keys));
    wait_blocking_state(&mut probe, (0, 0));
}

#[test]
fn client_kill_ends_a_blocked_read() {
    let server = Server::start(&[]);
    let mut probe = server.raw();
    let mut waiter = server.raw();
    let id = waiter.run("CLIENT ID").int();
    let keys = chain("kill", 3);
    send(
        &mut waiter,
        &keys_cmd("MGETPREFIX", &keys, &["BLOCK", "30000"]),
    );
    wait_blocking_state(&mut probe, (1, 3));
    assert_eq!(probe.run(&format!("CLIENT KILL ID {id}")), int(1));
    waiter.assert_closed();
    wait_blocking_state(&mut probe, (0, 0));
    let list = probe.run("CLIENT LIST").text();
    assert!(!list.contains(&format!("id={id} ")), "{list}");
}

#[test]
fn a_waiting_client_does_not_hold_its_shard() {
    const WAITERS: usize = 16;
    let server = Server::start(&[]);
    let mut probe = server.raw();
    // Waiters spread over every shard's connections (the kernel spreads
    // connections over the shards' listeners) and wait for keys on every
    // shard.
    let missing = one_key_per_shard("hold:missing");
    let mut waiters: Vec<RawConn> = (0..WAITERS).map(|_| server.raw()).collect();
    for (i, w) in waiters.iter_mut().enumerate() {
        let key = missing[i % SHARDS].clone();
        send(w, &keys_cmd("MGETPREFIX", &[key], &["BLOCK", "20000"]));
    }
    wait_blocking_state(&mut probe, (WAITERS as u64, SHARDS as u64));
    // Fresh connections are served, on every shard's keys, while they wait.
    let keys = one_key_per_shard("hold:served");
    for _ in 0..8 {
        let mut c = server.raw();
        for k in &keys {
            assert_eq!(c.cmd(&[b"SET", k.as_bytes(), b"v"]), ok());
            assert_eq!(c.cmd(&[b"GET", k.as_bytes()]), bulk("v"));
        }
        assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(4));
        let code = c.run("MSETBLOCK 1 hold:x v").items()[0].int();
        assert!(code == 0 || code == 1, "{code}");
    }
    // A command pipelined behind a blocked one waits its turn.
    let mut piped = server.raw();
    let mut bytes = encode(&[b"MGETPREFIX", b"1", b"hold:late", b"BLOCK", b"20000"]);
    bytes.extend(encode(&[b"PING"]));
    piped.send(&bytes);
    wait_blocking_state(&mut probe, (WAITERS as u64 + 1, SHARDS as u64 + 1));
    piped.assert_silent(Duration::from_millis(200));
    assert_eq!(probe.run("SET hold:late v"), ok());
    assert_eq!(piped.read(), bulks(&["v"]));
    assert_eq!(piped.read(), status("PONG"));
    // Every waiter wakes when its key appears.
    for k in &missing {
        assert_eq!(probe.cmd(&[b"SET", k.as_bytes(), b"m"]), ok());
    }
    for w in &mut waiters {
        assert_eq!(w.read(), bulks(&["m"]));
    }
    wait_blocking_state(&mut probe, (0, 0));
}

#[test]
fn block_is_capped_by_max_block_ms() {
    let server = Server::start(&["--max-block-ms", "300"]);
    let mut c = server.raw();
    assert_eq!(
        c.run("CONFIG GET max-block-ms"),
        bulks(&["max-block-ms", "300"])
    );
    let started = Instant::now();
    assert_eq!(c.run("MGETPREFIX 1 cap:missing BLOCK 60000"), array(vec![]));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "returned after {took:?}"
    );
    assert!(took < Duration::from_secs(30), "not capped: {took:?}");
    // The cap is live configuration.
    assert_eq!(c.run("CONFIG SET max-block-ms 100"), ok());
    let started = Instant::now();
    assert_eq!(c.run("MGETPREFIX 1 cap:missing BLOCK 60000"), array(vec![]));
    assert!(started.elapsed() < Duration::from_secs(30));
    wait_blocking_state(&mut c, (0, 0));
}

#[test]
fn any_write_completes_a_waiting_prefix() {
    let server = Server::start(&[]);
    let mut probe = server.raw();
    // One waiter per way of creating a key; the keys are on all shards.
    let keys = chain("anywrite", 6);
    let mut waiters: Vec<RawConn> = keys
        .iter()
        .map(|k| {
            let mut w = server.raw();
            send(
                &mut w,
                &keys_cmd("MGETPREFIX", std::slice::from_ref(k), &["BLOCK", "15000"]),
            );
            w
        })
        .collect();
    wait_blocking_state(&mut probe, (6, 6));
    let k = |i: usize| keys[i].as_bytes();
    assert_eq!(probe.cmd(&[b"SET", k(0), b"set"]), ok());
    assert_eq!(
        probe.cmd(&[b"MSET", k(1), b"mset", b"anywrite:other", b"x"]),
        ok()
    );
    assert_eq!(probe.cmd(&[b"APPEND", k(2), b"append"]), int(6));
    assert_eq!(probe.cmd(&[b"INCR", k(3)]), int(1));
    assert_eq!(probe.run("SET anywrite:src renamed"), ok());
    assert_eq!(probe.cmd(&[b"RENAME", b"anywrite:src", k(4)]), ok());
    assert_eq!(probe.run("SET anywrite:orig copied"), ok());
    assert_eq!(probe.cmd(&[b"COPY", b"anywrite:orig", k(5)]), int(1));
    let want = ["set", "mset", "append", "1", "renamed", "copied"];
    for (w, value) in waiters.iter_mut().zip(want) {
        assert_eq!(w.read(), bulks(&[value]));
    }
    wait_blocking_state(&mut probe, (0, 0));
}

#[test]
fn a_reply_being_sent_is_not_changed_by_deletes_or_replaces() {
    // 4 blocks of 4 MiB: far more than the socket buffers hold, so the
    // server is still sending when the blocks are deleted and rewritten.
    let server = Server::start(&[]);
    let mut writer = server.raw();
    let keys = chain("held", 4);
    let big = |k: &str, fill: u8| -> Vec<u8> {
        let mut v = vec![fill; 4 * 1024 * 1024];
        v[..k.len()].copy_from_slice(k.as_bytes());
        v
    };
    for k in &keys {
        assert_eq!(
            writer.cmd(&[b"MSETBLOCK", b"1", k.as_bytes(), &big(k, b'a')]),
            ints(&[1])
        );
    }
    let mut reader = server.raw();
    send(&mut reader, &keys_cmd("MGETPREFIX", &keys, &[]));
    // Give the server time to start the reply, then change every block.
    thread::sleep(Duration::from_millis(100));
    for k in &keys {
        assert_eq!(writer.cmd(&[b"DEL", k.as_bytes()]), int(1));
        assert_eq!(
            writer.cmd(&[b"MSETBLOCK", b"1", k.as_bytes(), &big(k, b'b'), b"REPLACE"]),
            ints(&[1])
        );
    }
    let got = reader.read().items();
    assert_eq!(got.len(), 4);
    for (k, v) in keys.iter().zip(&got) {
        assert!(
            v.bytes() == big(k, b'a'),
            "{k}: the reply changed while sent"
        );
    }
    // The next read sees the new blocks.
    let got = call(&mut reader, &keys_cmd("MGETPREFIX", &keys, &[])).items();
    assert!(got
        .iter()
        .zip(&keys)
        .all(|(v, k)| v.bytes() == big(k, b'b')));
}

#[test]
fn a_long_chain_in_one_call() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = chain("long", 300);
    assert_eq!(
        call(&mut c, &msetblock(&keys, &["CHAIN", "PARENT", "long:root"])),
        ints(&[1; 300])
    );
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(300));
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys, &[])),
        values_of(&keys)
    );
    assert_eq!(c.cmd(&[b"DEL", keys[150].as_bytes()]), int(1));
    assert_eq!(call(&mut c, &keys_cmd("PREFIXLEN", &keys, &[])), int(150));
    assert_eq!(
        call(&mut c, &keys_cmd("MGETPREFIX", &keys, &[])),
        values_of(&keys[..150])
    );
    let flags = call(&mut c, &keys_cmd("MEXISTS", &keys, &[])).items();
    assert_eq!(flags.iter().filter(|f| f.int() == 1).count(), 299);
    assert_eq!(flags[150], int(0));
}

#[test]
fn a_long_chain_is_stored_in_steps_and_in_order() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    // Longer than one step (256 blocks), on one shard ({tag}) and spread.
    for (tag, n) in [("{one}", 1000usize), ("spread", 1500)] {
        let keys: Vec<String> = (0..n).map(|i| format!("{tag}:b{i}")).collect();
        let mut args: Vec<Vec<u8>> = vec![b"MSETBLOCK".to_vec(), n.to_string().into_bytes()];
        for (i, k) in keys.iter().enumerate() {
            args.push(k.clone().into_bytes());
            args.push(format!("v{i}").into_bytes());
        }
        args.push(b"CHAIN".to_vec());
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        assert_eq!(c.cmd(&refs), array(vec![int(1); n]), "{tag}");
        let mut lookup: Vec<Vec<u8>> = vec![b"PREFIXLEN".to_vec(), n.to_string().into_bytes()];
        lookup.extend(keys.iter().map(|k| k.clone().into_bytes()));
        let refs: Vec<&[u8]> = lookup.iter().map(Vec::as_slice).collect();
        assert_eq!(c.cmd(&refs), int(n as i64), "{tag}");
        assert_eq!(
            c.run(&format!("GET {}", keys[n - 1])),
            bulk(format!("v{}", n - 1))
        );
    }
}
