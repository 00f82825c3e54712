//! What a user sees from `kvtier-bench` besides its figures: progress while
//! a run goes on when its output goes to a log, and errors that name the
//! address, the file or the size that is wrong.

mod common;

use common::{bench, free_port, Server, TempDir};

#[test]
fn a_run_whose_output_is_not_a_terminal_prints_progress_lines() {
    let server = Server::kvtier(&[]);
    let run = bench(&[
        "kv",
        "--target",
        &server.addr,
        "--keys",
        "100",
        "--duration",
        "6",
        "--rate",
        "2000",
    ]);
    run.assert_ok();
    let stderr = run.stderr();
    let line = stderr
        .lines()
        .find(|l| l.starts_with("progress: "))
        .unwrap_or_else(|| panic!("no progress line in:\n{stderr}"));
    // "progress: 5 s, 9876 ops, 1975/s, 0 errors"
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[2..3], ["s,"], "{line}");
    assert_eq!(words[4], "ops,", "{line}");
    assert!(words[3].parse::<u64>().is_ok_and(|n| n > 0), "{line}");
    assert!(
        words[5].trim_end_matches("/s,").parse::<f64>().is_ok(),
        "{line}"
    );
    assert_eq!(words[6..], ["0", "errors"], "{line}");
}

#[test]
fn errors_name_the_address_the_file_and_the_size() {
    let port = free_port();
    let refused = bench(&["kv", "--target", &format!("127.0.0.1:{port}")]);
    assert!(!refused.success());
    assert!(
        refused.stderr().contains(&format!(
            "cannot connect to 127.0.0.1:{port}: Connection refused"
        )),
        "{}",
        refused.stderr()
    );

    let server = Server::kvtier(&[]);
    let dir = TempDir::new("usability");
    let missing = dir.file("no-such-trace.jsonl");
    let run = bench(&["trace", missing.to_str().unwrap(), "--target", &server.addr]);
    assert!(!run.success());
    assert!(
        run.stderr().contains(&format!(
            "cannot read trace {}: No such file or directory",
            missing.display()
        )),
        "{}",
        run.stderr()
    );

    // Sizes no server takes are refused before anything is allocated.
    let trace = dir.file("one.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    let run = bench(&[
        "trace",
        trace.to_str().unwrap(),
        "--target",
        &server.addr,
        "--bytes-per-token",
        "1000000000",
    ]);
    assert!(!run.success());
    assert!(
        run.stderr().contains(
            "--block-tokens × --bytes-per-token (or --block-bytes): a value of 512000000000 \
             bytes is over 512 MiB"
        ),
        "{}",
        run.stderr()
    );
    let run = bench(&["kv", "--target", &server.addr, "--value-size", "2GiB"]);
    assert!(!run.success());
    assert!(
        run.stderr()
            .contains("--value-size: a value of 2147483648 bytes is over 512 MiB"),
        "{}",
        run.stderr()
    );
}
