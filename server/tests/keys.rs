//! Generic key commands, with keys spread over the 4 shards so multi-key
//! commands and RENAME/COPY really cross shards. Expected replies are Redis
//! 7's.

mod common;

use std::collections::HashSet;

use common::*;

#[test]
fn del_unlink_exists_touch_type() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = one_key_per_shard("d");
    for k in &keys {
        assert_eq!(c.run(&format!("SET {k} v")), ok());
    }
    let all = keys.join(" ");
    assert_eq!(c.run(&format!("EXISTS {all} {} nokey", keys[0])), int(5));
    assert_eq!(c.run(&format!("TOUCH {all} nokey")), int(4));
    assert_eq!(c.run(&format!("TYPE {}", keys[2])), status("string"));
    assert_eq!(c.run("TYPE nokey"), status("none"));
    assert_eq!(c.run(&format!("DEL {} {} nokey", keys[0], keys[1])), int(2));
    assert_eq!(
        c.run(&format!("UNLINK {} {} {}", keys[1], keys[2], keys[3])),
        int(2)
    );
    assert_eq!(c.run(&format!("EXISTS {all}")), int(0));
    assert_eq!(c.run("DBSIZE"), int(0));
    for (line, name) in [
        ("DEL", "del"),
        ("UNLINK", "unlink"),
        ("EXISTS", "exists"),
        ("TOUCH", "touch"),
        ("TYPE", "type"),
        ("TYPE a b", "type"),
    ] {
        assert_eq!(c.run(line), arity(name), "{line}");
    }
}

#[test]
fn keys_and_randomkey() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("RANDOMKEY"), nil());
    assert_eq!(c.run("KEYS *"), array(vec![]));
    for k in ["k1", "k2", "k10", "other", "a*b", "h{x}llo"] {
        assert_eq!(c.cmd(&[b"SET", k.as_bytes(), b"v"]), ok());
    }
    let mut sorted = |pattern: &str| {
        let mut got: Vec<String> = c
            .cmd(&[b"KEYS", pattern.as_bytes()])
            .items()
            .iter()
            .map(Resp::text)
            .collect();
        got.sort();
        got
    };
    assert_eq!(sorted("*"), ["a*b", "h{x}llo", "k1", "k10", "k2", "other"]);
    assert_eq!(sorted("k?"), ["k1", "k2"]);
    assert_eq!(sorted("k*"), ["k1", "k10", "k2"]);
    assert_eq!(sorted("[k]1*"), ["k1", "k10"]);
    assert_eq!(sorted("k[^1]"), ["k2"]);
    assert_eq!(sorted("a\\*b"), ["a*b"]);
    assert_eq!(sorted("h{x}*"), ["h{x}llo"]);
    assert_eq!(sorted("nomatch*"), Vec::<String>::new());
    let all: HashSet<String> = sorted("*").into_iter().collect();
    assert_eq!(c.run("KEYS"), arity("keys"));
    assert_eq!(c.run("KEYS a b"), arity("keys"));
    for _ in 0..20 {
        let k = c.run("RANDOMKEY").text();
        assert!(all.contains(&k), "RANDOMKEY gave {k}");
    }
    assert_eq!(c.run("RANDOMKEY x"), arity("randomkey"));
}

#[test]
fn scan_options_and_errors() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    for i in 0..50 {
        assert_eq!(c.run(&format!("SET user:{i} v")), ok());
        assert_eq!(c.run(&format!("SET item:{i} v")), ok());
    }
    let scan_all = |c: &mut RawConn, extra: &str| {
        let mut cursor = "0".to_string();
        let mut keys = Vec::new();
        for _ in 0..10_000 {
            let reply = c.run(&format!("SCAN {cursor} {extra}")).items();
            cursor = reply[0].text();
            keys.extend(reply[1].items().iter().map(Resp::text));
            if cursor == "0" {
                return keys;
            }
        }
        panic!("SCAN did not finish");
    };
    let users = scan_all(&mut c, "MATCH user:* COUNT 7");
    assert_eq!(users.len(), 50);
    assert!(users.iter().all(|k| k.starts_with("user:")));
    assert_eq!(scan_all(&mut c, "TYPE string COUNT 1000").len(), 100);
    assert_eq!(scan_all(&mut c, "TYPE list").len(), 0);
    assert_eq!(scan_all(&mut c, "MATCH nope*").len(), 0);
    let syntax = err("ERR syntax error");
    for bad in [
        "SCAN 0 COUNT 0",
        "SCAN 0 COUNT -1",
        "SCAN 0 MATCH",
        "SCAN 0 foo bar",
        "SCAN 0 TYPE",
    ] {
        assert_eq!(c.run(bad), syntax, "{bad}");
    }
    assert_eq!(
        c.run("SCAN 0 COUNT abc"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.run("SCAN abc"), err("ERR invalid cursor"));
    assert_eq!(
        c.run("SCAN 18446744073709551616"),
        err("ERR invalid cursor")
    );
    assert_eq!(c.run("SCAN"), arity("scan"));
    assert_eq!(c.run("FLUSHALL"), ok());
    assert_eq!(c.run("SCAN 0"), array(vec![bulk("0"), array(vec![])]));
}

/// A full SCAN returns every key that exists for the whole iteration
/// exactly once, even while other keys are being added, and never returns a
/// key twice.
#[test]
fn scan_full_iteration_while_adding_keys() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut writer = server.raw();
    let original: HashSet<String> = (0..2000).map(|i| format!("orig:{i}")).collect();
    let mut pipeline = Vec::new();
    for k in &original {
        pipeline.extend(encode(&[b"SET", k.as_bytes(), b"v"]));
    }
    c.send(&pipeline);
    for _ in &original {
        assert_eq!(c.read(), ok());
    }
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    let mut added = 0;
    for round in 0.. {
        assert!(round < 100_000, "SCAN did not finish");
        let reply = c.run(&format!("SCAN {cursor} COUNT 25")).items();
        cursor = reply[0].text();
        for k in reply[1].items() {
            let k = k.text();
            assert!(seen.insert(k.clone()), "SCAN returned {k} twice");
        }
        if cursor == "0" {
            break;
        }
        // New keys on every shard between the calls.
        for k in one_key_per_shard(&format!("new{added}")) {
            assert_eq!(writer.run(&format!("SET {k} v")), ok());
        }
        added += 1;
    }
    let missing: Vec<&String> = original.difference(&seen).collect();
    assert!(missing.is_empty(), "SCAN missed {} keys", missing.len());
    assert!(added > 10, "the iteration took several calls");
}

#[test]
fn rename_renamenx_across_shards() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let [a, b, x, y]: [String; 4] = one_key_per_shard("r").try_into().unwrap();
    assert_eq!(c.run(&format!("SET {a} va EX 1000")), ok());
    assert_eq!(c.run(&format!("RENAME {a} {b}")), ok());
    assert_eq!(c.run(&format!("EXISTS {a}")), int(0));
    assert_eq!(c.run(&format!("GET {b}")), bulk("va"));
    assert!(
        c.run(&format!("TTL {b}")).int() > 990,
        "RENAME keeps the TTL"
    );
    assert_eq!(c.run(&format!("SET {x} vx")), ok());
    assert_eq!(c.run(&format!("RENAME {x} {b}")), ok(), "overwrites");
    assert_eq!(c.run(&format!("GET {b}")), bulk("vx"));
    assert_eq!(
        c.run(&format!("TTL {b}")),
        int(-1),
        "and takes the source TTL"
    );
    assert_eq!(c.run(&format!("RENAME {b} {b}")), ok());
    assert_eq!(c.run(&format!("GET {b}")), bulk("vx"));
    let no_such = err("ERR no such key");
    assert_eq!(c.run(&format!("RENAME nokey {y}")), no_such);
    assert_eq!(c.run("RENAME nokey nokey"), no_such);
    assert_eq!(c.run("RENAME a"), arity("rename"));

    assert_eq!(c.run(&format!("SET {a} va")), ok());
    assert_eq!(c.run(&format!("RENAMENX {a} {b}")), int(0));
    assert_eq!(c.run(&format!("GET {a}")), bulk("va"));
    assert_eq!(c.run(&format!("RENAMENX {a} {y}")), int(1));
    assert_eq!(c.run(&format!("GET {y}")), bulk("va"));
    assert_eq!(c.run(&format!("EXISTS {a}")), int(0));
    assert_eq!(c.run(&format!("RENAMENX {y} {y}")), int(0));
    assert_eq!(c.run(&format!("RENAMENX nokey {a}")), no_such);
    assert_eq!(c.run("RENAMENX nokey nokey"), no_such);
    assert_eq!(c.run("RENAMENX a"), arity("renamenx"));
}

#[test]
fn copy_across_shards() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let [a, b, x, y]: [String; 4] = one_key_per_shard("c").try_into().unwrap();
    assert_eq!(c.run(&format!("SET {a} va PX 1000000")), ok());
    assert_eq!(c.run(&format!("COPY {a} {b}")), int(1));
    assert_eq!(c.run(&format!("GET {b}")), bulk("va"));
    assert_eq!(c.run(&format!("GET {a}")), bulk("va"));
    assert!(
        c.run(&format!("PTTL {b}")).int() > 990_000,
        "COPY copies the TTL"
    );
    assert_eq!(c.run(&format!("SET {x} vx")), ok());
    assert_eq!(c.run(&format!("COPY {x} {b}")), int(0));
    assert_eq!(c.run(&format!("GET {b}")), bulk("va"));
    assert_eq!(c.run(&format!("COPY {x} {b} REPLACE")), int(1));
    assert_eq!(c.run(&format!("GET {b}")), bulk("vx"));
    assert_eq!(c.run(&format!("TTL {b}")), int(-1));
    assert_eq!(c.run(&format!("COPY nokey {y}")), int(0));
    assert_eq!(c.run(&format!("COPY {a} {y} DB 0")), int(1));
    assert_eq!(
        c.run(&format!("COPY {a} {a}")),
        err("ERR source and destination objects are the same")
    );
    assert_eq!(
        c.run(&format!("COPY {a} {y} DB abc")),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.run(&format!("COPY {a} {y} foo")), err("ERR syntax error"));
    assert_eq!(c.run(&format!("COPY {a} {y} DB")), err("ERR syntax error"));
    // kvtier has one database.
    assert_eq!(
        c.run(&format!("COPY {a} {y} DB 1")),
        err("ERR DB index is out of range")
    );
    assert_eq!(c.run("COPY a"), arity("copy"));
}

#[test]
fn expire_family_and_flags() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET e v"), ok());
    assert_eq!(c.run("EXPIRE e 100"), int(1));
    assert!((99..=100).contains(&c.run("TTL e").int()));
    assert_eq!(c.run("EXPIRE e 100 NX"), int(0));
    assert_eq!(c.run("EXPIRE e 200 XX"), int(1));
    assert_eq!(c.run("EXPIRE e 50 GT"), int(0));
    assert_eq!(c.run("EXPIRE e 500 GT"), int(1));
    assert!((499..=500).contains(&c.run("TTL e").int()));
    assert_eq!(c.run("EXPIRE e 50 LT"), int(1));
    assert!((49..=50).contains(&c.run("TTL e").int()));
    assert_eq!(c.run("EXPIRE e 5000 LT"), int(0));
    assert_eq!(c.run("EXPIRE e 100 nx nx"), int(0), "flags may repeat");
    let nx_conflict = err("ERR NX and XX, GT or LT options at the same time are not compatible");
    assert_eq!(c.run("EXPIRE e 10 NX XX"), nx_conflict);
    assert_eq!(c.run("EXPIRE e 10 xx nx"), nx_conflict);
    assert_eq!(c.run("EXPIRE e 10 NX GT"), nx_conflict);
    assert_eq!(
        c.run("EXPIRE e 10 GT LT"),
        err("ERR GT and LT options at the same time are not compatible")
    );
    assert_eq!(c.run("EXPIRE e 10 foo"), err("ERR Unsupported option foo"));
    assert_eq!(c.run("EXPIRE e abc foo"), err("ERR Unsupported option foo"));
    assert_eq!(
        c.run("EXPIRE e abc"),
        err("ERR value is not an integer or out of range")
    );
    // Without a TTL: XX and GT fail (no TTL counts as infinite), LT succeeds.
    assert_eq!(c.run("PERSIST e"), int(1));
    assert_eq!(c.run("PERSIST e"), int(0));
    assert_eq!(c.run("TTL e"), int(-1));
    assert_eq!(c.run("EXPIRE e 100 XX"), int(0));
    assert_eq!(c.run("EXPIRE e 100 GT"), int(0));
    assert_eq!(c.run("EXPIRE e 100 LT"), int(1));
    assert_eq!(c.run("EXPIRE nokey 10"), int(0));
    assert_eq!(c.run("PERSIST nokey"), int(0));
    for (cmd, name) in [
        ("EXPIRE e 9223372036854775807", "expire"),
        ("EXPIRE e -9223372036854775808", "expire"),
        ("PEXPIRE e 9223372036854775807", "pexpire"),
        ("EXPIREAT e 9223372036854775807", "expireat"),
    ] {
        assert_eq!(
            c.run(cmd),
            err(&format!("ERR invalid expire time in '{name}' command")),
            "{cmd}"
        );
    }
    assert_eq!(c.run("PEXPIRE e 100000"), int(1));
    assert!((99_000..=100_000).contains(&c.run("PTTL e").int()));
    assert_eq!(c.run("PEXPIREAT e 99999999999999"), int(1));
    assert_eq!(c.run("PEXPIRETIME e"), int(99999999999999));
    assert_eq!(c.run("EXPIRETIME e"), int(100000000000), "rounded");
    assert_eq!(c.run("EXPIREAT e 99999999999"), int(1));
    assert_eq!(c.run("EXPIRETIME e"), int(99999999999));
    assert_eq!(c.run("PEXPIRETIME e"), int(99999999999000));
    assert_eq!(c.run("SET noe v"), ok());
    for cmd in ["TTL", "PTTL", "EXPIRETIME", "PEXPIRETIME"] {
        assert_eq!(c.run(&format!("{cmd} noe")), int(-1), "{cmd}");
        assert_eq!(c.run(&format!("{cmd} nokey")), int(-2), "{cmd}");
    }
    // A time in the past deletes the key and still answers 1.
    for past in [
        "EXPIRE e -1",
        "PEXPIRE e 0",
        "EXPIREAT e 1",
        "PEXPIREAT e 1",
    ] {
        assert_eq!(c.run("SET e v"), ok());
        assert_eq!(c.run(past), int(1), "{past}");
        assert_eq!(c.run("EXISTS e"), int(0), "{past}");
    }
    assert_eq!(c.run("EXPIRE e"), arity("expire"));
    assert_eq!(c.run("TTL"), arity("ttl"));
    assert_eq!(c.run("PERSIST a b"), arity("persist"));
}

#[test]
fn object_and_memory_usage() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET i 123"), ok());
    assert_eq!(c.run("SET neg -5"), ok());
    assert_eq!(
        c.run("SET s44 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        ok()
    );
    assert_eq!(
        c.run("SET s45 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        ok()
    );
    assert_eq!(c.run("SET longint 12345678901234567890"), ok());
    for (key, enc) in [
        ("i", "int"),
        ("neg", "int"),
        ("s44", "embstr"),
        ("s45", "raw"),
        ("longint", "embstr"),
    ] {
        assert_eq!(c.run(&format!("OBJECT ENCODING {key}")), bulk(enc), "{key}");
    }
    assert_eq!(c.run("APPEND i 4"), int(4));
    assert_eq!(c.run("OBJECT ENCODING i"), bulk("raw"));
    assert_eq!(c.run("OBJECT ENCODING nokey"), nil());
    assert_eq!(c.run("OBJECT REFCOUNT i"), int(1));
    let idle = c.run("OBJECT IDLETIME i").int();
    assert!((0..5).contains(&idle));
    assert_eq!(c.run("OBJECT IDLETIME nokey"), nil());
    assert_eq!(
        c.run("OBJECT FREQ i"),
        err("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.")
    );
    assert_eq!(c.run("CONFIG SET maxmemory-policy allkeys-lfu"), ok());
    for _ in 0..10 {
        assert_eq!(c.run("GET i"), bulk("1234"));
    }
    assert!(c.run("OBJECT FREQ i").int() >= 1);
    assert_eq!(
        c.run("OBJECT IDLETIME i"),
        err("ERR An LFU maxmemory policy is selected, idle time not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.")
    );
    assert_eq!(c.run("CONFIG SET maxmemory-policy noeviction"), ok());
    assert_eq!(
        c.run("OBJECT foo i"),
        err("ERR unknown subcommand 'foo'. Try OBJECT HELP.")
    );
    assert_eq!(c.run("OBJECT"), arity("object"));
    assert_eq!(c.run("OBJECT ENCODING"), arity("object|encoding"));
    assert_eq!(c.run("OBJECT ENCODING a b"), arity("object|encoding"));
    let help = c.run("OBJECT HELP").items();
    assert!(help[0].text().starts_with("OBJECT <subcommand>"));

    let usage = c.run("MEMORY USAGE s45").int();
    assert!(
        usage >= 45 + 3,
        "MEMORY USAGE counts key and value: {usage}"
    );
    assert_eq!(c.run("MEMORY USAGE s45 SAMPLES 5").int(), usage);
    assert_eq!(c.run("MEMORY USAGE nokey"), nil());
    assert_eq!(c.run("MEMORY USAGE i SAMPLES"), err("ERR syntax error"));
    assert_eq!(c.run("MEMORY USAGE i SAMPLES -1"), err("ERR syntax error"));
    assert_eq!(
        c.run("MEMORY USAGE i SAMPLES abc"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.run("MEMORY USAGE"), arity("memory|usage"));
    let big = vec![b'x'; 100_000];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), ok());
    assert!(c.run("MEMORY USAGE big").int() >= 100_000);
}

/// OBJECT FREQ/IDLETIME through CLIENT NO-TOUCH: reads leave the access
/// time alone.
#[test]
fn no_touch_keeps_idle_time() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET k v"), ok());
    assert_eq!(c.run("CLIENT NO-TOUCH on"), ok());
    std::thread::sleep(std::time::Duration::from_millis(2100));
    assert_eq!(c.run("GET k"), bulk("v"));
    assert!(c.run("OBJECT IDLETIME k").int() >= 2, "GET under NO-TOUCH");
    assert_eq!(c.run("CLIENT NO-TOUCH off"), ok());
    assert_eq!(c.run("GET k"), bulk("v"));
    assert!(c.run("OBJECT IDLETIME k").int() < 2);
}
