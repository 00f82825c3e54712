//! The `prefix` eviction policy through the real binary, with chains whose
//! blocks live on different shards (link events cross shards
//! asynchronously): under memory pressure orphans go first, then leaves,
//! and a block with a cached child is not evicted while leaves remain, so
//! a chain only ever shrinks from its tail; a block a slow reader holds is
//! never evicted.
//!
//! 16 MB over 4 shards: 4 MiB per shard in 256 KiB pages, so a shard holds
//! about 60 blocks of 64 KiB.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::*;

const BLOCK: usize = 64 << 10;

/// The content of block `key`, derived from the key.
fn block(key: &str) -> Vec<u8> {
    let seed = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    pattern(seed, BLOCK)
}

/// MSETBLOCK of `keys` with their contents and `options`; the codes.
fn msetblock(c: &mut RawConn, keys: &[String], options: &[&str]) -> Vec<i64> {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| block(k)).collect();
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"MSETBLOCK", n.as_bytes()];
    for (k, v) in keys.iter().zip(&values) {
        args.push(k.as_bytes());
        args.push(v);
    }
    args.extend(options.iter().map(|o| o.as_bytes()));
    c.cmd(&args).items().iter().map(Resp::int).collect()
}

/// MEXISTS of `keys`: which are present.
fn present(c: &mut RawConn, keys: &[String]) -> Vec<bool> {
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"MEXISTS", n.as_bytes()];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    c.cmd(&args).items().iter().map(|r| r.int() == 1).collect()
}

fn prefixlen(c: &mut RawConn, keys: &[String]) -> usize {
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"PREFIXLEN", n.as_bytes()];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    c.cmd(&args).int() as usize
}

/// MGETPREFIX of `keys` (touches them); how many came back.
fn read_prefix(c: &mut RawConn, keys: &[String]) -> usize {
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"MGETPREFIX", n.as_bytes()];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    let values = c.cmd(&args).items();
    for (v, k) in values.iter().zip(keys) {
        assert!(
            v.bytes() == block(k),
            "{k}: bytes differ from what was stored"
        );
    }
    values.len()
}

/// Eviction counters by reason: (orphan, leaf, inner, rebalance, total).
fn evictions(c: &mut RawConn) -> (u64, u64, u64, u64, u64) {
    let info = c.run("INFO stats").text();
    (
        info_num(&info, "evicted_orphan_keys"),
        info_num(&info, "evicted_leaf_keys"),
        info_num(&info, "evicted_inner_keys"),
        info_num(&info, "evicted_rebalance_keys"),
        info_num(&info, "evicted_keys"),
    )
}

/// Link events are delivered after each batch, mailbox job and cron tick
/// (hz 10): a few ticks and a round trip to every shard let them land.
fn let_links_settle(c: &mut RawConn) {
    thread::sleep(Duration::from_millis(400));
    for k in one_key_per_shard("settle") {
        c.cmd(&[b"EXISTS", k.as_bytes()]);
    }
}

fn chain(name: &str, len: usize) -> Vec<String> {
    (0..len).map(|i| format!("{name}:{i}")).collect()
}

/// The shards `keys` are on.
fn shards(keys: &[String]) -> Vec<usize> {
    keys.iter()
        .map(|k| shard_of(k.as_bytes(), SHARDS))
        .collect()
}

#[test]
fn orphans_then_leaves_go_first_and_chains_shrink_from_the_tail() {
    let server = Server::start(&["--maxmemory", "16mb", "--maxmemory-policy", "prefix"]);
    let mut c = server.raw();

    // Chains of 8 blocks (each spread over the shards): two read every
    // round (hot), two never read again (cold).
    let hot: Vec<Vec<String>> = (0..2).map(|j| chain(&format!("hot{j}"), 8)).collect();
    let cold: Vec<Vec<String>> = (0..2).map(|j| chain(&format!("cold{j}"), 8)).collect();
    for ch in hot.iter().chain(&cold) {
        assert!(
            shards(ch).iter().any(|&s| s != shards(ch)[0]),
            "a chain crosses shards"
        );
        assert_eq!(msetblock(&mut c, ch, &["CHAIN"]), vec![1; 8]);
    }
    // Orphans: a chain whose root is deleted, and blocks whose PARENT was
    // never stored.
    let lost = chain("lost", 6);
    assert_eq!(msetblock(&mut c, &lost, &["CHAIN"]), vec![1; 6]);
    assert_eq!(c.cmd(&[b"DEL", lost[0].as_bytes()]), int(1));
    let mut orphans: Vec<String> = lost[1..].to_vec();
    for i in 0..4 {
        let key = format!("stray:{i}");
        let parent = format!("never-stored:{i}");
        assert_eq!(
            msetblock(
                &mut c,
                std::slice::from_ref(&key),
                &["CHAIN", "PARENT", &parent]
            ),
            vec![1]
        );
        orphans.push(key);
    }
    let_links_settle(&mut c);
    assert_eq!(evictions(&mut c).4, 0, "nothing evicted yet");

    // Unchained filler blocks (leaves) until about three times the memory
    // was written.
    let mut fillers: Vec<String> = Vec::new();
    let mut first_leaf_seen = false;
    for round in 0..160 {
        let batch: Vec<String> = (0..4).map(|i| format!("fill:{round}:{i}")).collect();
        assert_eq!(msetblock(&mut c, &batch, &[]), vec![1; 4], "round {round}");
        fillers.extend(batch);
        for ch in &hot {
            read_prefix(&mut c, ch);
        }

        // Per shard: no leaf goes while an orphan of that shard is present.
        let orphan_here = present(&mut c, &orphans);
        let filler_here = present(&mut c, &fillers);
        for s in 0..SHARDS {
            let leaf_gone = fillers
                .iter()
                .zip(&filler_here)
                .any(|(k, &p)| !p && shard_of(k.as_bytes(), SHARDS) == s);
            if !leaf_gone {
                continue;
            }
            first_leaf_seen = true;
            for (k, &p) in orphans.iter().zip(&orphan_here) {
                assert!(
                    !(p && shard_of(k.as_bytes(), SHARDS) == s),
                    "round {round}: a leaf on shard {s} was evicted while orphan {k} is there"
                );
            }
        }
        // Chains have no holes: what is present is a prefix.
        for ch in hot.iter().chain(&cold) {
            let p = present(&mut c, ch);
            let len = prefixlen(&mut c, ch);
            assert!(
                p[..len].iter().all(|&x| x) && p[len..].iter().all(|&x| !x),
                "round {round}: {} has a hole: {p:?}",
                ch[0]
            );
        }
        let (_, _, inner, _, _) = evictions(&mut c);
        assert_eq!(
            inner, 0,
            "round {round}: an inner block went while leaves remain"
        );
    }
    assert!(first_leaf_seen, "memory pressure evicted leaves");

    let (orphan, leaf, inner, rebalance, total) = evictions(&mut c);
    assert_eq!(
        orphan,
        orphans.len() as u64,
        "every orphan was evicted as one"
    );
    assert!(present(&mut c, &orphans).iter().all(|&p| !p));
    assert!(leaf > 100, "{leaf} leaves evicted");
    assert_eq!((inner, rebalance), (0, 0));
    assert_eq!(total, orphan + leaf);
    // Hot chains were kept whole; the filler went instead.
    for ch in &hot {
        assert_eq!(prefixlen(&mut c, ch), 8, "{} kept whole", ch[0]);
    }
    let kept = present(&mut c, &fillers).iter().filter(|&&p| p).count();
    assert!(
        kept < fillers.len() / 2,
        "{kept} of {} fillers kept",
        fillers.len()
    );
}

/// Connects with a tiny receive buffer and sends `request` without reading
/// the reply: the server is left holding most of it.
fn slow_reader(port: u16, request: &[u8]) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    socket.connect(&addr.into()).unwrap();
    let mut stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream.write_all(request).unwrap();
    stream
}

fn held_block_survives(policy: &str) {
    let server = Server::start(&["--maxmemory", "16mb", "--maxmemory-policy", policy]);
    let mut c = server.raw();
    // The held block is an orphan (its parent was never stored): under
    // `prefix` the first candidate for eviction.
    let held = keys_on_shard("held", 0, 1).remove(0);
    assert_eq!(
        msetblock(
            &mut c,
            std::slice::from_ref(&held),
            &["CHAIN", "PARENT", "gone"]
        ),
        vec![1]
    );
    let_links_settle(&mut c);
    // 128 copies of it in one reply: 8 MiB, far more than the sockets
    // buffer, so the server holds the block until the reader reads.
    let copies = 128;
    let n = copies.to_string();
    let mut args: Vec<&[u8]> = vec![b"MGETPREFIX", n.as_bytes()];
    args.extend(std::iter::repeat_n(held.as_bytes(), copies));
    let hits_before = info_num(&c.run("INFO stats").text(), "keyspace_hits");
    let mut reader = slow_reader(server.port, &encode(&args));
    assert!(
        eventually(Duration::from_secs(20), || {
            info_num(&c.run("INFO stats").text(), "keyspace_hits") >= hits_before + copies as u64
        }),
        "the slow reader's MGETPREFIX ran"
    );

    // Three times shard 0's memory in blocks on shard 0.
    let fillers = keys_on_shard("fill", 0, 180);
    for (i, batch) in fillers.chunks(4).enumerate() {
        assert_eq!(
            msetblock(&mut c, batch, &[]),
            vec![1; batch.len()],
            "batch {i}"
        );
        assert_eq!(
            c.cmd(&[b"EXISTS", held.as_bytes()]),
            int(1),
            "batch {i}: the held block was evicted"
        );
    }
    let (orphan, _, _, _, total) = evictions(&mut c);
    assert!(total > 100, "{total} evicted: the shard was under pressure");
    assert_eq!(orphan, 0, "the held orphan was not evicted");

    // The reader reads on: every copy is the stored block.
    let item = [
        format!("${BLOCK}\r\n").into_bytes(),
        block(&held),
        b"\r\n".to_vec(),
    ]
    .concat();
    let mut want = format!("*{copies}\r\n").into_bytes();
    for _ in 0..copies {
        want.extend_from_slice(&item);
    }
    let mut got = vec![0u8; want.len()];
    reader.read_exact(&mut got).expect("the held reply");
    assert!(got == want, "the held block's bytes changed");
    reader.write_all(&encode(&[b"PING"])).unwrap();
    let mut pong = [0u8; 7];
    reader.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    drop(reader);

    // Released, it is evictable again; under `prefix`, as an orphan, first.
    if policy == "prefix" {
        let more = keys_on_shard("more", 0, 4);
        assert_eq!(msetblock(&mut c, &more[..1], &[]), vec![1]);
        assert_eq!(
            c.cmd(&[b"EXISTS", held.as_bytes()]),
            int(0),
            "the orphan went first"
        );
        assert_eq!(evictions(&mut c).0, 1);
    }
}

#[test]
fn a_block_held_by_a_slow_reader_survives_prefix() {
    held_block_survives("prefix");
}

#[test]
fn a_block_held_by_a_slow_reader_survives_allkeys_lru() {
    held_block_survives("allkeys-lru");
}
