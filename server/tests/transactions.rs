//! MULTI / EXEC / DISCARD / WATCH / UNWATCH, on one shard and across shards,
//! and through redis-py-style pipelines of the `redis` crate.

mod common;

use common::*;

#[test]
fn multi_exec_queues_and_runs_in_order() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = one_key_per_shard("tx");
    assert_eq!(c.run("MULTI"), ok());
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c.run(&format!("SET {k} {i}")), status("QUEUED"));
    }
    assert_eq!(c.run(&format!("INCR {}", keys[0])), status("QUEUED"));
    let mget = format!("MGET {}", keys.join(" "));
    assert_eq!(c.run(&mget), status("QUEUED"));
    let reply = c.run("EXEC").items();
    assert_eq!(reply.len(), keys.len() + 2);
    assert_eq!(reply[keys.len()], int(1));
    let mut want: Vec<String> = (0..keys.len()).map(|i| i.to_string()).collect();
    want[0] = "1".into();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(reply[keys.len() + 1], bulks(&want));
}

#[test]
fn errors_while_queueing_abort_exec() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("SET a 1"), status("QUEUED"));
    assert!(c.run("NOSUCH x").is_error());
    assert_eq!(c.run("GET"), arity("get"));
    assert_eq!(
        c.run("EXEC"),
        err("EXECABORT Transaction discarded because of previous errors.")
    );
    assert_eq!(
        c.run("GET a"),
        nil(),
        "nothing of an aborted transaction runs"
    );
    // Runtime errors do not abort: each command answers for itself.
    assert_eq!(c.run("SET s notanumber"), ok());
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("INCR s"), status("QUEUED"));
    assert_eq!(c.run("SET t 1"), status("QUEUED"));
    let reply = c.run("EXEC").items();
    assert!(reply[0].is_error());
    assert_eq!(reply[1], ok());
}

#[test]
fn misuse_errors_match_redis() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("EXEC"), err("ERR EXEC without MULTI"));
    assert_eq!(c.run("DISCARD"), err("ERR DISCARD without MULTI"));
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("MULTI"), err("ERR MULTI calls can not be nested"));
    assert_eq!(
        c.run("WATCH k"),
        err("ERR WATCH inside MULTI is not allowed")
    );
    assert_eq!(c.run("SET k 1"), status("QUEUED"));
    assert_eq!(c.run("DISCARD"), ok());
    assert_eq!(c.run("GET k"), nil());
}

#[test]
fn watch_aborts_when_a_watched_key_changes() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut other = server.raw();
    for key in one_key_per_shard("w") {
        assert_eq!(c.run(&format!("SET {key} 1")), ok());
        assert_eq!(c.run(&format!("WATCH {key}")), ok());
        assert_eq!(other.run(&format!("SET {key} 2")), ok());
        assert_eq!(c.run("MULTI"), ok());
        assert_eq!(c.run(&format!("SET {key} 3")), status("QUEUED"));
        assert_eq!(c.run("EXEC"), Resp::Array(None), "changed key aborts");
        assert_eq!(c.run(&format!("GET {key}")), bulk("2"));
        // Without interference the same transaction runs.
        assert_eq!(c.run(&format!("WATCH {key}")), ok());
        assert_eq!(c.run("MULTI"), ok());
        assert_eq!(c.run(&format!("SET {key} 3")), status("QUEUED"));
        assert_eq!(c.run("EXEC").items(), vec![ok()]);
    }
    // Deletion, expiry and FLUSHALL count as changes; UNWATCH forgets.
    assert_eq!(c.run("SET d 1"), ok());
    assert_eq!(c.run("WATCH d"), ok());
    assert_eq!(other.run("DEL d"), int(1));
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("PING"), status("QUEUED"));
    assert_eq!(c.run("EXEC"), Resp::Array(None));
    assert_eq!(c.run("SET f 1"), ok());
    assert_eq!(c.run("WATCH f"), ok());
    assert_eq!(other.run("FLUSHALL"), ok());
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("EXEC"), Resp::Array(None));
    assert_eq!(c.run("WATCH u"), ok());
    assert_eq!(c.run("UNWATCH"), ok());
    assert_eq!(other.run("SET u 1"), ok());
    assert_eq!(c.run("MULTI"), ok());
    assert_eq!(c.run("GET u"), status("QUEUED"));
    assert_eq!(c.run("EXEC").items(), vec![bulk("1")]);
}

#[test]
fn redis_crate_atomic_pipeline() {
    let server = Server::start(&[]);
    let mut con = server.redis();
    let keys = one_key_per_shard("p");
    let mut pipe = redis::pipe();
    pipe.atomic();
    for k in &keys {
        pipe.cmd("SET").arg(k).arg("v").ignore();
    }
    pipe.cmd("MGET").arg(&keys);
    let (values,): (Vec<String>,) = pipe.query(&mut con).expect("atomic pipeline");
    assert!(values.iter().all(|v| v == "v"));
}
