//! `kvtier-bench kv`, `pd` and `skew` against a live kvtier-server, each with
//! `--json` (and `--plot` where it matters): the figures they report are
//! consistent with the work they were asked to do.

mod common;

use common::{bench, f, read_json, trace_path, u, Server, TempDir};
use serde_json::Value as Json;

/// Runs `kvtier-bench <args> --json F` against `server`, asserts success,
/// returns the JSON.
fn run_json(server: &Server, args: &[&str], dir: &TempDir, name: &str) -> Json {
    let json = dir.file(&format!("{name}.json"));
    let json_s = json.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--target", &server.addr, "--json", &json_s]);
    bench(&all).assert_ok();
    read_json(&json)
}

/// Sum of an array of counts.
fn total(v: &Json) -> u64 {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("count"))
        .sum()
}

#[test]
fn kv_mix_of_set_get_mget_with_zipf_keys() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("kv-mix");
    let r = run_json(
        &server,
        &[
            "kv",
            "--ratio",
            "1:8:1",
            "--mget-keys",
            "5",
            "--zipf",
            "0.99",
            "--keys",
            "500",
            "--value-size",
            "4KiB",
            "--connections",
            "4",
            "--pipeline",
            "4",
            "--requests",
            "2000",
            "--prefill",
        ],
        &dir,
        "kv",
    );
    assert_eq!(r["scenario"], "kv");
    assert!(r["key_distribution"].as_str().unwrap().starts_with("zipf"));
    assert_eq!(u(&r, "ops"), 2000);
    let lat = &r["latency"];
    let (sets, gets, mgets) = (
        u(&lat["set"], "count"),
        u(&lat["get"], "count"),
        u(&lat["mget"], "count"),
    );
    assert_eq!(sets + gets + mgets, 2000);
    assert!(sets > 0 && gets > 0 && mgets > 0, "{lat}");
    // Everything was prefilled: every key read is a hit, of 4 KiB.
    assert_eq!(u(&r, "get_misses"), 0);
    assert_eq!(u(&r, "get_hits"), gets + 5 * mgets);
    assert_eq!(f(&r, "hit_rate"), 1.0);
    assert_eq!(u(&r, "bytes_read"), u(&r, "get_hits") * 4096);
    assert_eq!(u(&r, "bytes_written"), sets * 4096);
    assert_eq!(u(&r, "verification_failures"), 0);
    assert_eq!(u(&r, "errors"), 0);
    assert_eq!(total(&r["throughput_per_second"]), 2000);
    for op in ["set", "get", "mget"] {
        let h = &lat[op];
        assert!(f(h, "p50_us") > 0.0 && f(h, "p50_us") <= f(h, "p99_us"));
        assert!(f(h, "p99_us") <= f(h, "p999_us") && f(h, "p999_us") <= f(h, "max_us"));
    }
}

#[test]
fn kv_gaussian_keys_ranged_sizes_for_a_duration() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("kv-gauss");
    let r = run_json(
        &server,
        &[
            "kv",
            "--ratio",
            "1:4",
            "--gaussian",
            "0.1",
            "--keys",
            "1000",
            "--value-size",
            "1KiB-8KiB",
            "--connections",
            "4",
            "--duration",
            "1",
        ],
        &dir,
        "kv",
    );
    assert!(r["key_distribution"]
        .as_str()
        .unwrap()
        .starts_with("gaussian"));
    assert!(f(&r, "seconds") >= 1.0);
    let hits = u(&r, "get_hits");
    // No prefill: reads of keys not yet written miss.
    assert_eq!(hits + u(&r, "get_misses"), u(&r["latency"]["get"], "count"));
    assert!((1024 * hits..=8192 * hits).contains(&u(&r, "bytes_read")));
    assert_eq!(u(&r, "verification_failures"), 0);
    assert_eq!(u(&r, "errors"), 0);
    assert_eq!(total(&r["throughput_per_second"]), u(&r, "ops"));
    let cpu = &r["client_cpu"];
    assert!(f(cpu, "user_s") + f(cpu, "sys_s") > 0.0);
    assert!(cpu["saturated"].is_boolean());
}

#[test]
fn kv_verification_catches_a_corrupted_value() {
    let server = Server::kvtier(&[]);
    // kv:0 holds wrong bytes of the right length; every GET reads it.
    let wrong = vec![b'z'; 2048];
    assert_eq!(
        common::resp(&server.addr, &[b"SET", b"kv:0", &wrong]).unwrap(),
        "+OK"
    );
    let dir = TempDir::new("kv-corrupt");
    let json = dir.file("kv.json");
    let json_s = json.display().to_string();
    let run = bench(&[
        "kv",
        "--target",
        &server.addr,
        "--ratio",
        "0:1",
        "--keys",
        "1",
        "--value-size",
        "2KiB",
        "--connections",
        "2",
        "--requests",
        "50",
        "--json",
        &json_s,
    ]);
    assert!(!run.success(), "{}", run.stdout());
    assert!(
        run.stderr().contains("verification failures"),
        "{}",
        run.stderr()
    );
    assert_eq!(u(&read_json(&json), "verification_failures"), 50);
}

#[test]
fn pd_hands_off_every_chain_without_timeouts() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("pd");
    for (name, per_write) in [("one", "1"), ("two", "2")] {
        let r = run_json(
            &server,
            &[
                "pd",
                "--chains",
                "24",
                "--chain-blocks",
                "4",
                "--block-size",
                "16KiB",
                "--blocks-per-write",
                per_write,
                "--prefill-workers",
                "3",
                "--decode-workers",
                "2",
            ],
            &dir,
            name,
        );
        assert_eq!(r["wait"], "block");
        assert_eq!(u(&r, "complete"), 24);
        assert_eq!(u(&r, "timeouts"), 0);
        assert_eq!(u(&r, "verification_failures"), 0);
        assert_eq!(u(&r, "bytes_read"), 24 * 4 * 16 * 1024);
        let handoff = &r["latency"]["handoff"];
        assert_eq!(u(handoff, "count"), 24);
        assert!(f(handoff, "p50_us") > 0.0);
        assert!(f(handoff, "max_us") < 5_000_000.0, "under --block-ms");
        assert_eq!(total(&r["throughput_per_second"]), 24);
    }
}

#[test]
fn skew_reports_per_shard_shares_of_the_reads() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("skew");
    let r = run_json(
        &server,
        &[
            "skew",
            "--keys",
            "100",
            "--block-size",
            "4KiB",
            "--connections",
            "4",
            "--duration",
            "1",
        ],
        &dir,
        "skew",
    );
    assert_eq!(u(&r, "shards"), 4, "the test server runs 4 shards");
    let reads: Vec<u64> = r["shard_reads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(reads.len(), 4);
    // Every GET of the measured run, and nothing else (not the load phase),
    // is one read on the shard owning its key.
    let gets = u(&r["kv"], "ops");
    assert!(gets > 0);
    assert_eq!(reads.iter().sum::<u64>(), gets);
    let shares: Vec<f64> = r["shard_read_shares"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    let hottest = f(&r, "hottest_shard_share");
    assert!(hottest >= 0.25 && shares.contains(&hottest));
    assert_eq!(u(&r["kv"], "get_misses"), 0, "the blocks were loaded first");
    assert_eq!(r["shard_commands"].as_array().unwrap().len(), 4);
}

#[test]
fn plot_draws_an_svg_for_each_scenario() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("plot");
    let mut runs: Vec<(&str, Vec<String>)> = vec![
        (
            "kv",
            [
                "kv",
                "--keys",
                "100",
                "--value-size",
                "1KiB",
                "--requests",
                "500",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "pd",
            [
                "pd",
                "--chains",
                "8",
                "--chain-blocks",
                "2",
                "--block-size",
                "4KiB",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "skew",
            [
                "skew",
                "--keys",
                "50",
                "--block-size",
                "1KiB",
                "--connections",
                "2",
                "--duration",
                "0.5",
            ]
            .map(String::from)
            .to_vec(),
        ),
    ];
    if let Some(trace) = trace_path() {
        runs.push((
            "trace",
            vec![
                "trace".into(),
                trace.display().to_string(),
                "--limit".into(),
                "20".into(),
                "--block-bytes".into(),
                "1KiB".into(),
            ],
        ));
    }
    for (name, mut args) in runs {
        let svg = dir.file(&format!("{name}.svg"));
        args.extend([
            "--target".into(),
            server.addr.clone(),
            "--plot".into(),
            svg.display().to_string(),
        ]);
        bench(&args).assert_ok();
        let text = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            text.starts_with("<svg"),
            "{name}: {}",
            &text[..80.min(text.len())]
        );
        assert!(text.contains("latency CDF"), "{name}");
        assert!(text.contains("throughput over time"), "{name}");
        assert!(text.contains("<polyline"), "{name}: lines are drawn");
    }
}
