//! The lookup path's shortcuts: reads of another shard's keys taken on the
//! connection's own thread, chain writes over several shards stored whole
//! there, and idle polling before a shard sleeps. All must be invisible to
//! clients except in INFO: same replies, same order.

mod common;

use common::*;

fn stat(c: &mut RawConn, field: &str) -> u64 {
    info_num(&c.run("INFO stats").text(), field)
}

/// A key on each shard, numbered.
fn spread_keys(prefix: &str, per_shard: usize) -> Vec<String> {
    (0..SHARDS)
        .flat_map(|s| keys_on_shard(prefix, s, per_shard))
        .collect()
}

#[test]
fn reads_of_other_shards_run_on_the_connections_thread() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = spread_keys("direct", 4);
    for k in &keys {
        assert_eq!(c.cmd(&[b"SET", k.as_bytes(), k.as_bytes()]), ok());
    }
    let before = stat(&mut c, "cross_shard_direct_reads");
    // One at a time: three shards of four are another shard's.
    for k in &keys {
        assert_eq!(c.cmd(&[b"GET", k.as_bytes()]), bulk(k));
        assert_eq!(c.cmd(&[b"EXISTS", k.as_bytes()]), int(1));
    }
    let mut prefixlen: Vec<&[u8]> = vec![b"PREFIXLEN", b"16"];
    prefixlen.extend(keys.iter().map(|k| k.as_bytes()));
    assert_eq!(c.cmd(&prefixlen), int(16));
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(|k| k.as_bytes()));
    assert_eq!(
        c.cmd(&mget),
        Resp::Array(Some(keys.iter().map(bulk).collect()))
    );
    let direct = stat(&mut c, "cross_shard_direct_reads") - before;
    // Every owner was idle: none of these reads needed its thread.
    assert!(direct >= 24, "{direct} direct reads");
}

#[test]
fn a_read_never_overtakes_the_same_pipelines_write() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = spread_keys("order", 3);
    for round in 0..20 {
        let mut pipeline = Vec::new();
        let mut want = Vec::new();
        for k in &keys {
            let (a, b) = (format!("{k}:{round}:a"), format!("{k}:{round}:b"));
            for args in [
                vec![b"SET".as_slice(), k.as_bytes(), a.as_bytes()],
                vec![b"GET", k.as_bytes()],
                vec![b"APPEND", k.as_bytes(), b"+"],
                vec![b"GET", k.as_bytes()],
                vec![b"SET", k.as_bytes(), b.as_bytes()],
                vec![b"EXISTS", k.as_bytes()],
                vec![b"GET", k.as_bytes()],
                vec![b"DEL", k.as_bytes()],
                vec![b"GET", k.as_bytes()],
            ] {
                pipeline.extend(encode(&args));
            }
            want.extend([
                ok(),
                bulk(&a),
                int(a.len() as i64 + 1),
                bulk(format!("{a}+")),
                ok(),
                int(1),
                bulk(&b),
                int(1),
                nil(),
            ]);
        }
        c.send(&pipeline);
        let got: Vec<Resp> = want.iter().map(|_| c.read()).collect();
        assert_eq!(got, want, "round {round}");
    }
}

/// MSETBLOCK CHAIN of `chain` (each key its own value) and MGETPREFIX of
/// it in one pipeline, then the same write again without REPLACE: every
/// block stored, read back, then present and kept.
fn write_read_chain(c: &mut RawConn, chain: &[String]) {
    let n = chain.len().to_string();
    let mut write: Vec<&[u8]> = vec![b"MSETBLOCK", n.as_bytes()];
    for k in chain {
        write.extend([k.as_bytes(), k.as_bytes()]);
    }
    write.push(b"CHAIN");
    let mut read: Vec<&[u8]> = vec![b"MGETPREFIX", n.as_bytes()];
    read.extend(chain.iter().map(|k| k.as_bytes()));
    let mut pipeline = encode(&write);
    pipeline.extend(encode(&read));
    c.send(&pipeline);
    assert_eq!(c.read(), Resp::Array(Some(vec![int(1); chain.len()])));
    assert_eq!(
        c.read(),
        Resp::Array(Some(chain.iter().map(bulk).collect()))
    );
    assert_eq!(c.cmd(&write), Resp::Array(Some(vec![int(0); chain.len()])));
}

#[test]
fn chain_writes_over_idle_shards_run_on_the_connections_thread() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let before = stat(&mut c, "cross_shard_direct_writes");
    // Chains whose blocks go round every shard.
    for round in 0..10 {
        let per_shard: Vec<Vec<String>> = (0..SHARDS)
            .map(|s| keys_on_shard(&format!("dw{round}"), s, 4))
            .collect();
        let chain: Vec<String> = (0..4)
            .flat_map(|i| per_shard.iter().map(move |k| k[i].clone()))
            .collect();
        write_read_chain(&mut c, &chain);
    }
    let direct = stat(&mut c, "cross_shard_direct_writes") - before;
    // Every owner was idle: the chains needed no hop.
    assert!(direct >= 10, "{direct} direct chain writes");
}

#[test]
fn idle_polling_serves_a_lone_client_and_can_be_turned_off() {
    let server = Server::start(&["--idle-poll-us", "0"]);
    let mut c = server.raw();
    assert_eq!(
        c.run("CONFIG GET idle-poll-us").items(),
        vec![bulk("idle-poll-us"), bulk("0")]
    );
    assert!(c.run("CONFIG SET idle-poll-us 10001").is_error());
    let hits = |c: &mut RawConn| stat(c, "idle_poll_hits");
    let start = hits(&mut c);
    for i in 0..100 {
        assert_eq!(c.run(&format!("SET idle:{i} v")), ok());
    }
    assert_eq!(hits(&mut c), start, "polling while off");
    // A window far longer than this client's think time: nearly every next
    // request arrives while its connection polls.
    assert_eq!(c.run("CONFIG SET idle-poll-us 10000"), ok());
    let before = hits(&mut c);
    for i in 0..100 {
        assert_eq!(c.run(&format!("GET idle:{i}")), bulk("v"));
    }
    assert!(hits(&mut c) > before, "no request was caught while polling");
    assert!(stat(&mut c, "idle_poll_us") > 0);
    // Another client is served meanwhile, whichever shard it is on.
    let mut other = server.raw();
    for i in 0..20 {
        assert_eq!(other.run(&format!("GET idle:{i}")), bulk("v"));
        assert_eq!(c.run(&format!("GET idle:{i}")), bulk("v"));
    }
    // The connection that polls still sees its client leave.
    drop(c);
    assert_eq!(other.run("PING"), status("PONG"));
}

#[test]
fn a_paced_client_is_not_polled_for() {
    // A client that waits 2 ms between requests (a scheduler's lookups):
    // polling cannot bring its requests sooner, so after a trial whose
    // first poll misses, its connection rests (longer each time) instead of
    // spinning a window after every reply.
    let window_us = 200;
    let server = Server::start(&["--idle-poll-us", &window_us.to_string()]);
    let mut c = server.raw();
    for i in 0..300 {
        assert_eq!(c.run(&format!("SET paced:{i} v")), ok());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Trials start after 32, 96 and 224 requests here: three missed polls,
    // where a fixed window would have spun after all 300 replies.
    let polled = stat(&mut c, "idle_poll_us");
    assert!(
        polled <= 10 * window_us,
        "{polled} µs of polling for 300 paced requests"
    );
}

#[test]
fn pinning_is_a_choice() {
    for (flag, shown) in [("yes", "yes"), ("no", "no")] {
        let server = Server::start(&["--pin-threads", flag]);
        let mut c = server.raw();
        assert_eq!(
            c.run("CONFIG GET pin-threads").items(),
            vec![bulk("pin-threads"), bulk(shown)]
        );
        assert_eq!(c.run("SET k v"), ok());
        assert_eq!(c.run("GET k"), bulk("v"));
    }
}

#[test]
fn an_idle_poll_window_out_of_range_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
        .args([
            "--port",
            "0",
            "--metrics-addr",
            "none",
            "--idle-poll-us",
            "10001",
        ])
        .output()
        .expect("run kvtier-server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("idle-poll-us"), "{stderr}");
}
