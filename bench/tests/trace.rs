//! `kvtier-bench trace` against a live kvtier-server on the Mooncake
//! synthetic trace: the counts it reports add up and match what the file
//! says, it catches a corrupted block, and all three protocols agree.

mod common;

use common::{bench, expected, f, read_json, read_trace, trace_path, u, Server, TempDir};

/// Requests of the slice most tests replay.
const SLICE: usize = 150;
/// Small blocks keep the runs fast; the counts do not depend on the size.
const BLOCK_BYTES: u64 = 1024;

/// Runs the trace (first `limit` requests) with `extra` options and returns
/// the run and its JSON.
fn replay(
    server: &Server,
    trace: &std::path::Path,
    limit: Option<usize>,
    extra: &[&str],
) -> (common::Run, serde_json::Value) {
    let dir = TempDir::new("trace");
    let json = dir.file("trace.json");
    let mut args: Vec<String> = vec![
        "trace".into(),
        trace.display().to_string(),
        "--target".into(),
        server.addr.clone(),
        "--block-bytes".into(),
        "1KiB".into(),
        "--json".into(),
        json.display().to_string(),
    ];
    if let Some(n) = limit {
        args.extend(["--limit".into(), n.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let run = bench(&args);
    let report = if json.exists() {
        read_json(&json)
    } else {
        serde_json::Value::Null
    };
    (run, report)
}

/// The invariants every replay must satisfy, whatever the concurrency.
fn assert_consistent(r: &serde_json::Value, requests: &[common::TraceRequest]) {
    let blocks: u64 = requests.iter().map(|q| q.hash_ids.len() as u64).sum();
    let tokens: u64 = requests.iter().map(|q| q.input_length).sum();
    assert_eq!(u(r, "requests"), requests.len() as u64, "{r}");
    assert_eq!(u(r, "blocks"), blocks, "blocks = sum of hash_ids lengths");
    assert_eq!(u(r, "tokens"), tokens, "tokens = sum of input_length");
    let hits = u(r, "hit_blocks");
    assert!(hits <= blocks);
    assert_eq!(u(r, "block_bytes"), BLOCK_BYTES);
    assert_eq!(u(r, "bytes_read"), hits * BLOCK_BYTES);
    assert_eq!(u(r, "blocks_written"), blocks - hits);
    assert_eq!(u(r, "bytes_written"), (blocks - hits) * BLOCK_BYTES);
    assert!(u(r, "blocks_stored") <= u(r, "blocks_written"));
    assert!(u(r, "hit_tokens") <= tokens.min(hits * u(r, "block_tokens")));
    assert!((f(r, "block_hit_rate") - hits as f64 / blocks as f64).abs() < 1e-12);
    assert!((f(r, "token_hit_rate") - u(r, "hit_tokens") as f64 / tokens as f64).abs() < 1e-12);
    assert!(
        (f(r, "prefill_seconds_saved") - u(r, "hit_tokens") as f64 / f(r, "prefill_tokens_per_s"))
            .abs()
            < 1e-9
    );
    assert_eq!(u(r, "verification_failures"), 0);
    assert_eq!(u(r, "errors"), 0);
    let latency = &r["latency"];
    assert_eq!(u(&latency["request"], "count"), requests.len() as u64);
    assert_eq!(u(&latency["lookup"], "count"), requests.len() as u64);
    // The timeline counts requests, once each.
    let timeline: u64 = r["throughput_per_second"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|v| v.as_u64().expect("count"))
        .sum();
    assert_eq!(timeline, requests.len() as u64);
}

#[test]
fn counts_add_up_on_a_slice() {
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, Some(SLICE));
    let want = expected(&requests, 512);
    let server = Server::kvtier(&[]);

    // Concurrency 1: the replay is in trace order, so every count is exact.
    let (run, r) = replay(&server, &trace, Some(SLICE), &["--concurrency", "1"]);
    run.assert_ok();
    assert_consistent(&r, &requests);
    assert_eq!(u(&r, "hit_blocks"), want.hit_blocks);
    assert_eq!(u(&r, "hit_tokens"), want.hit_tokens);
    // MSETBLOCK leaves present blocks alone: each distinct block stored once.
    assert_eq!(u(&r, "blocks_stored"), want.distinct_blocks);
    assert_eq!(
        f(&r, "ideal_block_hit_rate"),
        want.hit_blocks as f64 / want.blocks as f64
    );
    assert_eq!(u(&r["latency"]["store"], "count"), {
        // Requests with at least one missing block store once.
        let mut seen = std::collections::HashSet::new();
        requests
            .iter()
            .filter(|q| {
                let all_hit = q.hash_ids.iter().all(|id| seen.contains(id));
                seen.extend(q.hash_ids.iter().copied());
                !all_hit
            })
            .count() as u64
    });

    // The same slice again, 4 in flight: everything is now cached.
    let (run, again) = replay(&server, &trace, Some(SLICE), &["--concurrency", "4"]);
    run.assert_ok();
    assert_consistent(&again, &requests);
    assert_eq!(u(&again, "hit_blocks"), want.blocks);
    assert_eq!(u(&again, "blocks_stored"), 0);

    // A fresh key space with 4 in flight: racing requests may miss blocks
    // another is storing, never more than the unlimited-memory maximum.
    let (run, racing) = replay(
        &server,
        &trace,
        Some(SLICE),
        &["--concurrency", "4", "--key-prefix", "race:"],
    );
    run.assert_ok();
    assert_consistent(&racing, &requests);
    assert!(u(&racing, "hit_blocks") <= want.hit_blocks);
}

#[test]
fn verification_catches_a_corrupted_block() {
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, Some(5));
    let first = requests[0].hash_ids[0];
    let server = Server::kvtier(&[]);
    for protocol in ["dialect", "redis-sequential", "redis-pipelined"] {
        // The first block of the first request holds wrong bytes of the
        // right length before the replay starts: its lookup finds it and the
        // fetch must flag it.
        let prefix = format!("corrupt-{protocol}:");
        let key = format!("{prefix}{first}");
        let wrong = vec![b'z'; BLOCK_BYTES as usize];
        assert_eq!(
            common::resp(&server.addr, &[b"SET", key.as_bytes(), &wrong]).unwrap(),
            "+OK"
        );
        let (run, r) = replay(
            &server,
            &trace,
            Some(5),
            &[
                "--concurrency",
                "1",
                "--protocol",
                protocol,
                "--key-prefix",
                &prefix,
            ],
        );
        assert!(
            !run.success(),
            "{protocol}: a verification failure must fail the run\n{}",
            run.stdout()
        );
        assert!(
            run.stderr().contains("verification failures"),
            "{protocol}: {}",
            run.stderr()
        );
        assert!(
            run.stdout().contains("verification failures 1"),
            "{}",
            run.stdout()
        );
        // The report is still written, with the failure in it.
        assert_eq!(u(&r, "verification_failures"), 1, "{protocol}: {r}");
        assert_eq!(u(&r, "hit_blocks"), 1, "{protocol}");
    }
}

#[test]
fn unlimited_memory_hit_rate_on_the_whole_trace_matches_the_file() {
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, None);
    let want = expected(&requests, 512);
    let server = Server::kvtier(&[]);
    let (run, r) = replay(&server, &trace, None, &["--concurrency", "1"]);
    run.assert_ok();
    assert_consistent(&r, &requests);
    assert_eq!(u(&r, "blocks"), want.blocks);
    assert_eq!(u(&r, "hit_blocks"), want.hit_blocks);
    assert_eq!(u(&r, "hit_tokens"), want.hit_tokens);
    let rate = want.hit_blocks as f64 / want.blocks as f64;
    assert_eq!(f(&r, "block_hit_rate"), rate);
    assert_eq!(f(&r, "ideal_block_hit_rate"), rate);
    eprintln!(
        "whole trace: {} requests, {} blocks, {} prefix hits: {:.4}",
        want.requests, want.blocks, want.hit_blocks, rate
    );
}

#[test]
fn three_protocols_agree_on_a_slice() {
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, Some(SLICE));
    let want = expected(&requests, 512);
    let server = Server::kvtier(&[]);
    for protocol in ["dialect", "redis-sequential", "redis-pipelined"] {
        let prefix = format!("{protocol}:");
        let (run, r) = replay(
            &server,
            &trace,
            Some(SLICE),
            &[
                "--concurrency",
                "1",
                "--protocol",
                protocol,
                "--key-prefix",
                &prefix,
            ],
        );
        run.assert_ok();
        assert_eq!(r["protocol"], protocol);
        assert_consistent(&r, &requests);
        assert_eq!(u(&r, "hit_blocks"), want.hit_blocks, "{protocol}");
        assert_eq!(u(&r, "hit_tokens"), want.hit_tokens, "{protocol}");
        assert!(u(&r["latency"]["fetch"], "count") > 0, "{protocol}");
    }
}

#[test]
fn timestamps_honoured_with_speed() {
    let Some(trace) = trace_path() else { return };
    let requests = read_trace(&trace, Some(20));
    let server = Server::kvtier(&[]);
    let (run, r) = replay(
        &server,
        &trace,
        Some(20),
        &["--speed", "1000", "--concurrency", "2"],
    );
    run.assert_ok();
    assert_consistent(&r, &requests);
    assert_eq!(f(&r, "speed"), 1000.0);
}
