//! `kvtier-store-writes` runs, evicts, and refuses what it does not know.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier-store-writes"))
        .args(args)
        .output()
        .expect("kvtier-store-writes runs")
}

#[test]
fn writes_past_the_budget_evict() {
    let out = run(&[
        "--writes",
        "20000",
        "--warm",
        "5000",
        "--maxmemory",
        "4194304",
        "--chunks",
        "4",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields[..2], ["ns/write", "median"], "{text}");
    assert!(fields[2].parse::<f64>().unwrap() > 0.0, "{text}");
    let keys: usize = fields.last().unwrap().parse().unwrap();
    // 4 MiB holds well under a thousand 4 KiB values: most writes evicted.
    assert!(keys > 0 && keys < 1024, "{text}");
}

#[test]
fn an_unknown_flag_or_policy_is_refused() {
    for args in [&["--bogus", "1"][..], &["--policy", "mru"], &["--writes"]] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}
