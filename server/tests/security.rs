//! A shared tier's defaults: DEBUG refused unless enabled (it can stall a
//! shard for every client on it), and protected mode turning away clients
//! from other hosts while no password is set.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, UdpSocket};
use std::time::Duration;

use common::*;

const DEBUG_REFUSED: &str = "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.";

#[test]
fn debug_is_refused_unless_enabled() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("DEBUG SLEEP 1"), err(DEBUG_REFUSED));
    assert_eq!(c.run("DEBUG SET-ACTIVE-EXPIRE 0"), err(DEBUG_REFUSED));
    assert_eq!(
        c.run("CONFIG GET enable-debug-command"),
        array(vec![bulk("enable-debug-command"), bulk("no")])
    );
    // It is fixed at start, as in Redis.
    assert!(c.run("CONFIG SET enable-debug-command yes").is_error());
    for mode in ["local", "yes"] {
        let server = Server::start(&["--enable-debug-command", mode]);
        let mut c = server.raw();
        assert_eq!(c.run("DEBUG SLEEP 0"), ok(), "{mode}");
    }
}

/// A non-loopback address of this machine, if it has one.
fn outside_address() -> Option<IpAddr> {
    let probe = UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("10.255.255.255:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn protected_mode_turns_away_other_hosts_without_a_password() {
    let server = Server::start(&["--bind", "0.0.0.0"]);
    let mut local = server.raw();
    assert_eq!(local.run("PING"), status("PONG"));
    assert_eq!(
        local.run("CONFIG GET protected-mode"),
        array(vec![bulk("protected-mode"), bulk("yes")])
    );
    let Some(ip) = outside_address() else {
        eprintln!(
            "no non-loopback address here: the cross-host part is in tests/python/test_netns.py"
        );
        return;
    };
    let denied = |port: u16| -> String {
        let mut s = TcpStream::connect((ip, port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"PING\r\nQUIT\r\n").unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        String::from_utf8_lossy(&got).into_owned()
    };
    let got = denied(server.port);
    assert!(
        got.starts_with("-DENIED Redis is running in protected mode"),
        "{got}"
    );
    assert!(got.ends_with("\r\n"));
    // A password, or protected mode off, lets them in.
    assert_eq!(local.run("CONFIG SET requirepass secret"), ok());
    assert!(
        denied(server.port).starts_with("-NOAUTH"),
        "with a password"
    );
    assert_eq!(local.run("AUTH secret"), ok());
    assert_eq!(local.cmd(&[b"CONFIG", b"SET", b"requirepass", b""]), ok());
    assert_eq!(local.run("CONFIG SET protected-mode no"), ok());
    assert_eq!(denied(server.port), "+PONG\r\n+OK\r\n");
}

#[test]
fn a_write_that_cannot_fit_is_refused_before_anything_is_evicted() {
    // Two shards of 8 MiB each.
    let server = Server::start(&["--threads", "2", "--maxmemory", "16mb"]);
    let mut c = server.raw();
    let value = "v".repeat(1024);
    for i in 0..200 {
        assert_eq!(c.run(&format!("SET key:{i} {value}")), ok());
    }
    const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
    // Forty bytes that would build a 400 MB or 512 MB string.
    assert_eq!(c.run("SETRANGE big 400000000 x"), err(OOM));
    assert_eq!(c.run("SETBIT big 4294967295 1"), err(OOM));
    // A value larger than a shard's share, sent whole: the error says so.
    let huge = vec![b'x'; 9 << 20];
    let too_large = "OOM a value of 9437184 bytes is larger than one shard's share of \
                     maxmemory (8.00M: maxmemory 16.00M over 2 shards); raise maxmemory";
    assert_eq!(c.cmd(&[b"SET", b"big", &huge]), err(too_large));
    assert_eq!(c.cmd(&[b"APPEND", b"key:0", &huge]), err(too_large));
    assert_eq!(
        c.cmd(&[b"MSET", b"small", b"v", b"big", &huge]),
        err(too_large)
    );
    // MSETBLOCK says so per block: -1, not stored.
    assert_eq!(
        c.cmd(&[b"MSETBLOCK", b"1", b"block:huge", &huge]),
        array(vec![int(-1)])
    );
    // Nothing was evicted for them, and nothing half-written is left.
    assert_eq!(c.run("DBSIZE"), int(200));
    let info = c.run("INFO stats").text();
    assert!(info.contains("\r\nevicted_keys:0\r\n"), "{info}");
    assert_eq!(c.run("EXISTS big"), int(0));
    assert_eq!(c.run("STRLEN key:0"), int(1024));
}

/// Sends an endless `SET` (`*2147483647`, arguments of `arg` bytes) until
/// the server closes the connection or `most` bytes went out; the bytes
/// sent, and whether it was closed.
fn endless_request(port: u16, arg: usize, most: usize) -> (usize, bool) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = b"*2147483647\r\n$3\r\nSET\r\n".to_vec();
    let chunk: Vec<u8> = {
        let mut one = format!("${arg}\r\n").into_bytes();
        one.extend(std::iter::repeat_n(b'x', arg));
        one.extend_from_slice(b"\r\n");
        one.repeat((64 * 1024 / one.len()).max(1))
    };
    let mut sent = 0;
    loop {
        if s.write_all(&frame).is_err() {
            return (sent, true);
        }
        sent += frame.len();
        if sent >= most {
            return (sent, false);
        }
        frame.clone_from(&chunk);
    }
}

#[test]
fn a_request_that_never_ends_is_cut_off_at_the_query_buffer_limit() {
    let server = Server::start(&["--client-query-buffer-limit", "8mb"]);
    let mut c = server.raw();
    for arg in [16 * 1024, 1] {
        let (sent, closed) = endless_request(server.port, arg, 256 << 20);
        assert!(
            closed,
            "{arg}-byte arguments: not closed after {sent} bytes"
        );
        // Closed once it held the limit: well before 256 MiB went out (the
        // socket buffers hold a few MiB more).
        assert!(
            sent < 64 << 20,
            "{arg}-byte arguments: closed after {sent} bytes"
        );
    }
    let info = c.run("INFO stats").text();
    assert!(
        info.contains("client_query_buffer_limit_disconnections:2\r\n"),
        "{info}"
    );
    // Other clients are served meanwhile and after.
    assert_eq!(c.run("PING"), status("PONG"));
    assert_eq!(
        c.run("CONFIG GET client-query-buffer-limit"),
        array(vec![bulk("client-query-buffer-limit"), bulk("8388608")])
    );
    assert!(c
        .run("CONFIG SET client-query-buffer-limit 1000")
        .is_error());
}

#[test]
fn maxmemory_clients_closes_the_client_taking_the_total_over() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("CONFIG SET maxmemory-clients 16mb"), ok());
    // A client holding a big request still arriving...
    let (_, closed) = endless_request(server.port, 16 * 1024, 256 << 20);
    assert!(closed);
    let info = c.run("INFO stats").text();
    assert!(info.contains("evicted_clients:1\r\n"), "{info}");
    assert!(info.contains("client_query_buffer_limit_disconnections:0\r\n"));
    // CLIENT NO-EVICT exempts a client, as in Redis.
    let mut exempt = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    exempt.write_all(b"CLIENT NO-EVICT on\r\n").unwrap();
    let mut ok_reply = [0u8; 5];
    exempt.read_exact(&mut ok_reply).unwrap();
    assert_eq!(&ok_reply, b"+OK\r\n");
    let mut frame = b"*2147483647\r\n$3\r\nSET\r\n".to_vec();
    frame.extend(
        format!("$16384\r\n{}\r\n", "x".repeat(16384))
            .repeat(1500)
            .into_bytes(),
    );
    exempt.write_all(&frame).unwrap();
    let info = c.run("INFO stats").text();
    assert!(info.contains("evicted_clients:1\r\n"), "{info}");
    drop(exempt);
    // ...and once they are gone, the total is back to nothing held.
    assert_eq!(c.run("SET after ok"), ok());
    assert_eq!(c.run("GET after"), bulk("ok"));
}

/// A client that asks for `gets` copies of `key` and never reads.
fn stalled_reader(port: u16, key: &str, gets: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A small receive buffer: the replies back up at once.
    let requests = format!("GET {key}\r\n").repeat(gets);
    s.write_all(requests.as_bytes()).unwrap();
    s
}

fn connected_clients(c: &mut RawConn) -> i64 {
    let info = c.run("INFO clients").text();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[test]
fn a_client_that_stopped_reading_is_closed_by_timeout() {
    let server = Server::start(&["--timeout", "1"]);
    let mut c = server.raw();
    let big = vec![b'v'; 8 << 20];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), ok());
    let _stalled = stalled_reader(server.port, "big", 16);
    assert!(eventually(Duration::from_secs(2), || connected_clients(
        &mut c
    ) == 2));
    // No byte taken for 1 s: closed, its replies (and the values they
    // pin) let go, while this client, which reads, stays.
    assert!(eventually(Duration::from_secs(10), || connected_clients(
        &mut c
    ) == 1));
    assert_eq!(c.run("PING"), status("PONG"));
}

#[test]
fn client_output_buffer_limit_closes_a_client_over_it() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(
        c.run("CONFIG GET client-output-buffer-limit"),
        array(vec![
            bulk("client-output-buffer-limit"),
            bulk("normal 0 0 0 replica 268435456 67108864 60 pubsub 33554432 8388608 60")
        ])
    );
    let big = vec![b'v'; 8 << 20];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), ok());
    // Hard: one 8 MiB reply over a 4 MiB limit closes the client.
    assert_eq!(
        c.cmd(&[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"normal 4mb 0 0"
        ]),
        ok()
    );
    let mut other = server.raw();
    other.send(b"GET big\r\n");
    other.assert_closed();
    // Soft: over 2 MiB for 1 s (a reader that stalled) closes it too.
    assert_eq!(
        c.cmd(&[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"normal 0 2mb 1"
        ]),
        ok()
    );
    let _stalled = stalled_reader(server.port, "big", 16);
    assert!(eventually(Duration::from_secs(10), || {
        c.run("INFO stats")
            .text()
            .contains("client_output_buffer_limit_disconnections:2\r\n")
    }));
    assert!(eventually(Duration::from_secs(5), || connected_clients(
        &mut c
    ) == 1));
    // This client's own replies are small: untouched.
    assert_eq!(c.run("STRLEN big"), int(8 << 20));
    assert!(c
        .cmd(&[
            b"CONFIG",
            b"SET",
            b"client-output-buffer-limit",
            b"normal 1 2"
        ])
        .is_error());
}

#[test]
fn blocked_waiters_are_capped() {
    let server = Server::start(&["--max-blocked-clients", "2"]);
    let mut admin = server.raw();
    let wait = encode(&[b"MGETPREFIX", b"1", b"absent", b"BLOCK", b"10000"]);
    let mut waiters: Vec<RawConn> = (0..2).map(|_| server.raw()).collect();
    for w in &mut waiters {
        w.send(&wait);
    }
    assert!(eventually(Duration::from_secs(10), || info_int(
        &mut admin,
        "clients",
        "blocked_clients"
    ) == 2));
    // A third is refused at once, and counted.
    let mut third = server.raw();
    assert_eq!(
        third.cmd(&[b"MGETPREFIX", b"1", b"absent", b"BLOCK", b"10000"]),
        err("ERR max number of blocked clients reached (max-blocked-clients)")
    );
    assert_eq!(
        info_int(&mut admin, "clients", "blocked_clients_refused"),
        1
    );
    // Reads that do not block are not limited.
    assert_eq!(third.run("MGETPREFIX 1 absent"), array(vec![]));
    // The write they wait for frees both seats.
    assert_eq!(admin.run("SET absent v"), ok());
    for w in &mut waiters {
        assert_eq!(w.read(), array(vec![bulk("v")]));
    }
    assert_eq!(
        third.run("MGETPREFIX 1 absent BLOCK 100"),
        array(vec![bulk("v")])
    );
    // A waiter that leaves gives its seat back.
    let mut leaver = server.raw();
    leaver.send(&encode(&[b"MGETPREFIX", b"1", b"gone", b"BLOCK", b"10000"]));
    assert!(eventually(Duration::from_secs(10), || info_int(
        &mut admin,
        "clients",
        "blocked_clients"
    ) == 1));
    drop(leaver);
    assert!(eventually(Duration::from_secs(10), || info_int(
        &mut admin,
        "clients",
        "blocked_clients"
    ) == 0));
    assert_eq!(admin.run("CONFIG SET max-blocked-clients 0"), ok());
    let mut many: Vec<RawConn> = (0..4).map(|_| server.raw()).collect();
    for w in &mut many {
        w.send(&encode(&[
            b"MGETPREFIX",
            b"1",
            b"other",
            b"BLOCK",
            b"10000",
        ]));
    }
    assert!(eventually(Duration::from_secs(10), || info_int(
        &mut admin,
        "clients",
        "blocked_clients"
    ) == 4));
}
