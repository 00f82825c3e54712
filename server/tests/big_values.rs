//! 64 MiB values (an LMCache chunk is up to 32 MiB) stored and read back
//! byte-exact, through the redis crate and through raw sockets, including a
//! value whose bytes trickle in slowly in uneven pieces.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

const BIG: usize = 64 << 20;

/// `len` bytes of a pattern that differs per seed and per position, so a
/// dropped, duplicated or shifted chunk cannot go unnoticed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    common::pattern(seed, len)
}

/// Compares without printing 64 MiB on failure.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}

#[test]
fn big_value_through_redis_crate_resp2_and_resp3() {
    let server = Server::start(&[]);
    for (i, mut con) in [server.redis(), server.redis3()].into_iter().enumerate() {
        let value = pattern(BIG, i as u64 + 1);
        let key = format!("big:{i}");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .query(&mut con)
            .unwrap();
        let len: usize = redis::cmd("STRLEN").arg(&key).query(&mut con).unwrap();
        assert_eq!(len, BIG);
        let got: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
        assert_same(&got, &value, "GET");
        let tail: Vec<u8> = redis::cmd("GETRANGE")
            .arg(&key)
            .arg(BIG - 10)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_same(&tail, &value[BIG - 10..], "GETRANGE");
        let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
    }
}

#[test]
fn big_values_async_pipeline() {
    let server = Server::start(&[]);
    let runtime = runtime(false);
    runtime.block_on(async {
        let mut con = connect_async(&server.url()).await;
        // Two 16 MiB values on different shards in one pipeline.
        let keys = one_key_per_shard("bigp");
        let values = [pattern(16 << 20, 7), pattern(16 << 20, 8)];
        let mut pipe = redis::pipe();
        pipe.set(&keys[0], &values[0][..])
            .ignore()
            .set(&keys[3], &values[1][..])
            .ignore()
            .get(&keys[3])
            .get(&keys[0]);
        let (b, a): (Vec<u8>, Vec<u8>) =
            tokio::time::timeout(Duration::from_secs(120), pipe.query_async(&mut con))
                .await
                .expect("pipeline in time")
                .unwrap();
        assert_same(&a, &values[0], "first");
        assert_same(&b, &values[1], "second");
    });
}

#[test]
fn big_value_raw_in_one_write_with_pipelined_get() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let value = pattern(BIG, 3);
    let mut request = encode(&[b"SET", b"raw:big", &value]);
    request.extend(encode(&[b"GET", b"raw:big"]));
    request.extend(encode(&[b"STRLEN", b"raw:big"]));
    c.send(&request);
    assert_eq!(c.read(), ok());
    assert_same(&c.read().bytes(), &value, "GET");
    assert_eq!(c.read(), int(BIG as i64));
}

#[test]
fn big_value_trickled_slowly() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut other = server.raw();
    let value = pattern(BIG, 4);
    let header = format!("*3\r\n$3\r\nSET\r\n$7\r\nslowbig\r\n${BIG}\r\n");
    // The header a byte at a time, then the payload in uneven pieces with
    // pauses, the CRLF split across two writes.
    for b in header.as_bytes() {
        c.send(std::slice::from_ref(b));
    }
    let mut sent = 0;
    let mut piece = 1;
    while sent < BIG {
        let n = piece.min(BIG - sent);
        c.send(&value[sent..sent + n]);
        sent += n;
        piece = (piece * 3 + 7) % (3 << 20) + 1;
        if sent % 7 == 0 || piece % 5 == 0 {
            sleep(Duration::from_millis(2));
        }
        if sent > BIG / 2 && sent - n <= BIG / 2 {
            // Half-way: the server has not answered and still serves others.
            c.assert_silent(Duration::from_millis(50));
            assert_eq!(other.run("PING"), status("PONG"));
        }
    }
    c.send(b"\r");
    sleep(Duration::from_millis(20));
    c.send(b"\n");
    assert_eq!(c.read(), ok());
    assert_eq!(other.run("STRLEN slowbig"), int(BIG as i64));
    c.send(&encode(&[b"GET", b"slowbig"]));
    assert_same(&c.read().bytes(), &value, "GET");
    // Many big values in a row on one connection.
    for i in 0..3u64 {
        let v = pattern(8 << 20, 10 + i);
        let key = format!("seq:{i}");
        assert_eq!(c.cmd(&[b"SET", key.as_bytes(), &v]), ok());
        assert_same(&c.cmd(&[b"GET", key.as_bytes()]).bytes(), &v, "seq");
    }
}

#[test]
fn client_reading_slowly_gets_every_byte() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let value = pattern(32 << 20, 5);
    assert_eq!(c.cmd(&[b"SET", b"slowread", &value]), ok());
    // Ask for it three times and read only after a pause: the replies wait
    // in socket buffers and the server's queue.
    let get = encode(&[b"GET", b"slowread"]);
    c.send(&[get.clone(), get.clone(), get].concat());
    sleep(Duration::from_millis(300));
    for i in 0..3 {
        assert_same(&c.read().bytes(), &value, &format!("reply {i}"));
    }
}
