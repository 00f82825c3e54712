//! kvtier-bench against a real redis-server (skipped when none is on PATH):
//! the dialect modes refuse it with a clear message, the Redis protocols
//! replay the trace with the same counts as against kvtier, and pd and kv
//! work in their plain-Redis modes.

mod common;

use common::{bench, expected, read_json, read_trace, trace_path, u, Server, TempDir};

const REFUSAL: &str = "does not implement kvtier's block dialect";

#[test]
fn dialect_modes_refuse_a_server_without_the_dialect() {
    let Some(redis) = Server::redis() else { return };
    let Some(trace) = trace_path() else { return };
    let trace_s = trace.display().to_string();
    let dir = TempDir::new("refuse");
    let json = dir.file("r.json");
    let json_s = json.display().to_string();
    let run = bench(&[
        "trace",
        &trace_s,
        "--target",
        &redis.addr,
        "--limit",
        "5",
        "--json",
        &json_s,
    ]);
    assert!(!run.success(), "dialect against redis-server must fail");
    assert!(run.stderr().contains(REFUSAL), "{}", run.stderr());
    assert!(
        run.stderr().contains("--protocol redis-sequential"),
        "the message says what to use instead: {}",
        run.stderr()
    );
    assert!(!json.exists(), "nothing measured, nothing reported");

    let run = bench(&["pd", "--target", &redis.addr, "--chains", "2"]);
    assert!(
        !run.success(),
        "pd --wait block against redis-server must fail"
    );
    assert!(run.stderr().contains(REFUSAL), "{}", run.stderr());
}

#[test]
fn redis_protocols_replay_a_slice_exactly() {
    let Some(redis) = Server::redis() else { return };
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, Some(100));
    let want = expected(&requests, 512);
    let trace_s = trace.display().to_string();
    let dir = TempDir::new("redis-trace");
    for protocol in ["redis-sequential", "redis-pipelined"] {
        let json = dir.file(&format!("{protocol}.json"));
        let json_s = json.display().to_string();
        let prefix = format!("{protocol}:");
        bench(&[
            "trace",
            &trace_s,
            "--target",
            &redis.addr,
            "--limit",
            "100",
            "--block-bytes",
            "1KiB",
            "--concurrency",
            "1",
            "--protocol",
            protocol,
            "--key-prefix",
            &prefix,
            "--json",
            &json_s,
        ])
        .assert_ok();
        let r = read_json(&json);
        assert_eq!(u(&r, "requests"), want.requests, "{protocol}");
        assert_eq!(u(&r, "blocks"), want.blocks, "{protocol}");
        assert_eq!(u(&r, "hit_blocks"), want.hit_blocks, "{protocol}");
        assert_eq!(u(&r, "hit_tokens"), want.hit_tokens, "{protocol}");
        assert_eq!(u(&r, "bytes_read"), want.hit_blocks * 1024, "{protocol}");
        assert_eq!(
            u(&r, "blocks_stored"),
            want.blocks - want.hit_blocks,
            "{protocol}: every SET / MSET stores"
        );
        assert_eq!(u(&r, "verification_failures"), 0, "{protocol}");
        assert_eq!(u(&r, "errors"), 0, "{protocol}");
    }
}

#[test]
fn pd_polls_and_kv_runs_against_redis() {
    let Some(redis) = Server::redis() else { return };
    let dir = TempDir::new("redis-pd");
    let json = dir.file("pd.json");
    let json_s = json.display().to_string();
    bench(&[
        "pd",
        "--target",
        &redis.addr,
        "--wait",
        "poll",
        "--chains",
        "20",
        "--chain-blocks",
        "4",
        "--block-size",
        "16KiB",
        "--json",
        &json_s,
    ])
    .assert_ok();
    let r = read_json(&json);
    assert_eq!(r["wait"], "poll");
    assert_eq!(u(&r, "complete"), 20);
    assert_eq!(u(&r, "timeouts"), 0);
    assert_eq!(u(&r, "bytes_read"), 20 * 4 * 16 * 1024);

    let json = dir.file("kv.json");
    let json_s = json.display().to_string();
    bench(&[
        "kv",
        "--target",
        &format!("redis://{}", redis.addr),
        "--ratio",
        "1:8:1",
        "--keys",
        "200",
        "--value-size",
        "2KiB",
        "--connections",
        "4",
        "--requests",
        "1000",
        "--prefill",
        "--json",
        &json_s,
    ])
    .assert_ok();
    let r = read_json(&json);
    assert_eq!(u(&r, "ops"), 1000);
    assert_eq!(u(&r, "get_misses"), 0);
    assert_eq!(u(&r, "verification_failures"), 0);
    assert_eq!(u(&r, "errors"), 0);
}
