//! The lookup path's shortcuts: reads of another shard's keys taken on the
//! connection's own thread, chain writes over several shards stored whole
//! there, and idle polling before a shard sleeps. All must be invisible to
//! clients except in INFO: same replies, same order.

mod common;

use std::time::Duration;

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

/// INFO clients' `connections_packed_on_shard` (-1: spread).
fn packed_on(c: &mut RawConn) -> i64 {
    info_field(&c.run("INFO clients").text(), "connections_packed_on_shard")
        .expect("connections_packed_on_shard")
        .parse()
        .unwrap()
}

/// Packs every connection that can move on one shard (`--pack-below
/// 1000`: whatever the load), lets them run packed a moment, and turns
/// packing off: from the next tick they spread out again.
fn pack_then_unpack(admin: &mut RawConn) {
    assert_eq!(admin.run("CONFIG SET pack-below 1000"), ok());
    assert!(eventually(Duration::from_secs(15), || packed_on(admin) >= 0));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(admin.run("CONFIG SET pack-below 0"), ok());
}

#[test]
fn light_load_packs_connections_on_one_shard_and_they_keep_their_sessions() {
    let server = Server::start(&["--requirepass", "pw"]);
    let mut admin = server.raw();
    assert_eq!(admin.run("AUTH pw"), ok());
    assert_eq!(
        admin.run("ACL SETUSER reader on >rpw ~* +get +ping +client"),
        ok()
    );
    // Eight clients with something set each: a name, RESP3, another user,
    // NO-TOUCH, an open MULTI and a WATCH (the last two may not move).
    let mut cs: Vec<RawConn> = (0..8).map(|_| server.raw()).collect();
    for (i, c) in cs.iter_mut().enumerate() {
        assert_eq!(c.run("AUTH pw"), ok());
        assert_eq!(c.run(&format!("CLIENT SETNAME c{i}")), ok());
        assert_eq!(c.run(&format!("SET pack:{i} v{i}")), ok());
    }
    let ids: Vec<i64> = cs.iter_mut().map(|c| c.run("CLIENT ID").int()).collect();
    assert!(matches!(cs[1].run("HELLO 3"), Resp::Map(_)));
    assert_eq!(cs[2].run("AUTH reader rpw"), ok());
    assert_eq!(cs[3].run("CLIENT NO-TOUCH on"), ok());
    assert_eq!(cs[4].run("MULTI"), ok());
    assert_eq!(cs[4].run("SET pack:multi 1"), status("QUEUED"));
    assert_eq!(cs[5].run("WATCH pack:watched"), ok());

    // Nothing else runs here: the load is light, so the ticker packs.
    assert!(
        eventually(Duration::from_secs(15), || packed_on(&mut admin) >= 0),
        "never packed"
    );
    // Each connection moves after its next reply; a pipeline on the way
    // comes back whole and in order.
    for round in 0..3 {
        for (i, c) in cs.iter_mut().enumerate() {
            if i == 4 {
                continue;
            }
            let mut pipeline = Vec::new();
            for j in 0..50 {
                pipeline.extend(encode(&[
                    b"GET",
                    format!("pack:{}", (i + j) % 8).as_bytes(),
                ]));
            }
            c.send(&pipeline);
            for j in 0..50 {
                let k = (i + j) % 8;
                assert_eq!(c.read(), bulk(format!("v{k}")), "round {round} client {i}");
            }
        }
    }
    let moved = info_num(&admin.run("INFO clients").text(), "connections_moved");
    // Nine connections over four shards: six are not on the home, and
    // four of them (not the MULTI and WATCH ones) have had replies since.
    assert!(moved >= 4, "{moved} connections moved");
    // RESP3 stays RESP3, the user stays the user.
    assert!(matches!(cs[1].run("CONFIG GET maxclients"), Resp::Map(_)));
    assert!(matches!(cs[0].run("CONFIG GET maxclients"), Resp::Array(_)));
    let refused = cs[2].run("SET pack:x 1");
    assert!(
        matches!(&refused, Resp::Error(e) if e.starts_with("NOPERM")),
        "{refused:?}"
    );
    assert_eq!(cs[2].run("GET pack:2"), bulk("v2"));
    // The transaction and the watch still hold.
    assert_eq!(cs[4].run("SET pack:multi 2"), status("QUEUED"));
    assert_eq!(cs[4].run("EXEC").items(), vec![ok(), ok()]);
    assert_eq!(admin.run("SET pack:watched changed"), ok());
    assert_eq!(cs[5].run("MULTI"), ok());
    assert_eq!(cs[5].run("SET pack:y 1"), status("QUEUED"));
    assert_eq!(
        cs[5].run("EXEC"),
        Resp::Array(None),
        "a watched key changed"
    );
    for (i, c) in cs.iter_mut().enumerate() {
        assert_eq!(c.run("CLIENT GETNAME"), bulk(format!("c{i}")));
        assert_eq!(c.run("CLIENT ID").int(), ids[i]);
    }
    // CLIENT LIST sees every connection once; CLIENT KILL finds a moved
    // one.
    let list = admin.run("CLIENT LIST").text();
    for id in &ids {
        assert_eq!(list.matches(&format!("id={id} ")).count(), 1, "{list}");
    }
    assert_eq!(admin.run(&format!("CLIENT KILL ID {}", ids[6])), int(1));
    cs[6].assert_closed();

    // Packing off: spread out again, every connection still served.
    assert_eq!(admin.run("CONFIG SET pack-below 0"), ok());
    assert!(eventually(Duration::from_secs(5), || packed_on(&mut admin) == -1));
    for _ in 0..3 {
        for (i, c) in cs.iter_mut().enumerate() {
            if i != 6 {
                assert_eq!(c.run("PING"), status("PONG"));
            }
        }
    }
    assert!(info_num(&admin.run("INFO clients").text(), "connections_moved") > moved);
    assert!(admin.run("CONFIG SET pack-below 1001").is_error());
}

#[test]
fn connections_moving_under_traffic_lose_and_reorder_nothing() {
    let server = Server::start(&["--pack-below", "0"]);
    let mut admin = server.raw();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Eight paced clients (a pipeline of SETs and GETs every two
    // milliseconds, every reply checked), while packing is turned on
    // (1000: whatever the load) and off.
    let clients: Vec<_> = (0..8)
        .map(|t| {
            let mut c = server.raw();
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut round = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut pipeline = Vec::new();
                    for i in 0..10 {
                        let (k, v) = (format!("mv:{t}:{i}"), format!("{round}:{i}"));
                        pipeline.extend(encode(&[b"SET", k.as_bytes(), v.as_bytes()]));
                        pipeline.extend(encode(&[b"GET", k.as_bytes()]));
                    }
                    c.send(&pipeline);
                    for i in 0..10 {
                        assert_eq!(c.read(), ok(), "client {t} round {round}");
                        assert_eq!(c.read(), bulk(format!("{round}:{i}")), "client {t}");
                    }
                    round += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                round
            })
        })
        .collect();
    let moved = |c: &mut RawConn| info_num(&c.run("INFO clients").text(), "connections_moved");
    for _ in 0..2 {
        pack_then_unpack(&mut admin);
        assert!(eventually(Duration::from_secs(5), || packed_on(&mut admin) == -1));
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        assert!(c.join().expect("a client saw a wrong reply") > 10);
    }
    // Packed twice (most of nine connections to one shard of four), spread
    // twice.
    assert!(moved(&mut admin) >= 8, "{} moves", moved(&mut admin));
}

#[test]
fn client_kill_finds_connections_while_they_move() {
    use std::io::{Read, Write};
    let server = Server::start(&["--pack-below", "0"]);
    let mut admin = server.raw();
    // Clients pinging every millisecond until their connection ends, each
    // reporting its id first.
    let (ids_tx, ids_rx) = std::sync::mpsc::channel();
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let port = server.port;
            let ids_tx = ids_tx.clone();
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut buf = [0u8; 64];
                s.write_all(b"CLIENT ID\r\n").unwrap();
                let n = s.read(&mut buf).unwrap();
                let id: u64 = std::str::from_utf8(&buf[1..n - 2])
                    .unwrap()
                    .parse()
                    .unwrap();
                ids_tx.send(id).unwrap();
                loop {
                    if s.write_all(b"PING\r\n").is_err() {
                        return true;
                    }
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return true,
                        Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })
        })
        .collect();
    let ids: Vec<u64> = ids_rx.iter().take(24).collect();
    // Three times: packed (1000: whatever the load), then spread while a
    // third of the clients are killed one by one, 10 ms apart, across the
    // tick that moves them. Each kill finds its client, moving or not, and
    // every client sees its connection end.
    for round in ids.chunks(8) {
        pack_then_unpack(&mut admin);
        for id in round {
            assert_eq!(
                admin.run(&format!("CLIENT KILL ID {id}")),
                int(1),
                "client {id}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for c in clients {
        assert!(c.join().unwrap(), "a killed client went on being served");
    }
    let moved = info_num(&admin.run("INFO clients").text(), "connections_moved");
    assert!(moved >= 24, "{moved} moves");
}
