//! Expiry: lazy (an expired key is gone when accessed) and active (the
//! background cycle removes keys nobody touches). TTLs are short and checks
//! poll with a bounded deadline; nothing asserts how fast the server is.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

const DEADLINE: Duration = Duration::from_secs(15);

fn dbsize(c: &mut RawConn) -> i64 {
    c.run("DBSIZE").int()
}

#[test]
fn lazy_expiry_on_access() {
    let server = Server::start(&["--enable-debug-command", "local"]);
    let mut c = server.raw();
    // Only lazy expiry from here on.
    assert_eq!(c.run("DEBUG SET-ACTIVE-EXPIRE 0"), ok());
    let keys: Vec<String> = (0..SHARDS)
        .flat_map(|s| keys_on_shard("lazy", s, 3))
        .collect();
    for k in &keys {
        assert_eq!(c.run(&format!("SET {k} v PX 100")), ok());
    }
    assert_eq!(c.run("SET keep v"), ok());
    assert_eq!(c.run("SET keep2 v EX 1000"), ok());
    sleep(Duration::from_millis(300));
    // Not yet collected: still counted, as in Redis.
    assert_eq!(dbsize(&mut c), keys.len() as i64 + 2);
    // But invisible to every read.
    assert_eq!(c.run(&format!("GET {}", keys[0])), nil());
    assert_eq!(c.run(&format!("EXISTS {}", keys[1])), int(0));
    assert_eq!(c.run(&format!("TTL {}", keys[2])), int(-2));
    assert_eq!(c.run(&format!("PTTL {}", keys[3])), int(-2));
    assert_eq!(c.run(&format!("STRLEN {}", keys[4])), int(0));
    assert_eq!(c.run(&format!("TYPE {}", keys[5])), status("none"));
    assert_eq!(c.run(&format!("GETEX {} PERSIST", keys[6])), nil());
    assert_eq!(c.run(&format!("INCR {}", keys[7])), int(1), "starts from 0");
    assert_eq!(c.run(&format!("TTL {}", keys[7])), int(-1));
    assert_eq!(c.run(&format!("SET {} new NX", keys[8])), ok());
    assert_eq!(c.run(&format!("APPEND {} x", keys[9])), int(1));
    let mut listed: Vec<String> = c.run("KEYS *").items().iter().map(Resp::text).collect();
    listed.sort();
    let mut want = vec![
        keys[7].clone(),
        keys[8].clone(),
        keys[9].clone(),
        "keep".to_string(),
        "keep2".to_string(),
    ];
    want.sort();
    assert_eq!(listed, want, "KEYS skips expired keys");
    let scan = c.run("SCAN 0 COUNT 1000").items();
    assert_eq!(scan[1].items().len(), 5, "SCAN skips expired keys");
    let all = keys.join(" ");
    assert_eq!(
        c.run(&format!("MGET {all}"))
            .items()
            .iter()
            .filter(|r| **r != nil())
            .count(),
        3
    );
    // Every access removed its key.
    assert_eq!(dbsize(&mut c), 5);
    let stats = c.run("INFO stats").text();
    assert!(info_num(&stats, "expired_keys") >= 7, "{stats}");
}

#[test]
fn active_expiry_without_access() {
    let server = Server::start(&["--hz", "50"]);
    let mut c = server.raw();
    let mut pipeline = Vec::new();
    let n = 400;
    for i in 0..n {
        let key = format!("active:{i}");
        pipeline.extend(encode(&[b"SET", key.as_bytes(), b"v", b"PX", b"150"]));
    }
    for i in 0..20 {
        pipeline.extend(encode(&[b"SET", format!("stay:{i}").as_bytes(), b"v"]));
    }
    c.send(&pipeline);
    for _ in 0..n + 20 {
        assert_eq!(c.read(), ok());
    }
    // Only DBSIZE (which reads no key) until the cycle has removed them all.
    assert!(
        eventually(DEADLINE, || dbsize(&mut c) == 20),
        "DBSIZE stayed at {}",
        dbsize(&mut c)
    );
    let stats = c.run("INFO stats").text();
    assert_eq!(info_num(&stats, "expired_keys"), n as u64);
    assert_eq!(
        info_num(&stats, "keyspace_hits") + info_num(&stats, "keyspace_misses"),
        0
    );
    let keyspace = c.run("INFO keyspace").text();
    assert_eq!(
        info_field(&keyspace, "db0").as_deref(),
        Some("keys=20,expires=0,avg_ttl=0")
    );
}

#[test]
fn persist_and_overwrite_cancel_expiry() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let [a, b, d, e]: [String; 4] = one_key_per_shard("p").try_into().unwrap();
    for k in [&a, &b, &d, &e] {
        assert_eq!(c.run(&format!("SET {k} v PX 200")), ok());
    }
    assert_eq!(c.run(&format!("PERSIST {a}")), int(1));
    assert_eq!(c.run(&format!("SET {b} v2")), ok());
    assert_eq!(c.run(&format!("GETSET {d} v3")), bulk("v"));
    assert_eq!(c.run(&format!("PEXPIRE {e} 100000")), int(1));
    sleep(Duration::from_millis(400));
    assert!(eventually(DEADLINE, || dbsize(&mut c) == 4));
    assert_eq!(
        c.run(&format!("MGET {a} {b} {d} {e}")),
        array(vec![bulk("v"), bulk("v2"), bulk("v3"), bulk("v")])
    );
    // RENAME and COPY carry the deadline with them.
    assert_eq!(c.run(&format!("PEXPIRE {a} 200")), int(1));
    assert_eq!(c.run(&format!("COPY {a} copied")), int(1));
    assert_eq!(c.run(&format!("RENAME {a} renamed")), ok());
    sleep(Duration::from_millis(300));
    assert_eq!(c.run("EXISTS copied renamed"), int(0));
}

#[test]
fn expiry_through_the_redis_crate() {
    let server = Server::start(&[]);
    let mut con = server.redis();
    let _: () = redis::cmd("SET")
        .arg("rk")
        .arg("v")
        .arg("PX")
        .arg(100)
        .query(&mut con)
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg("rk").query(&mut con).unwrap();
    assert!((0..=100).contains(&ttl));
    assert!(eventually(DEADLINE, || {
        let v: Option<String> = redis::cmd("GET").arg("rk").query(&mut con).unwrap();
        v.is_none()
    }));
}
