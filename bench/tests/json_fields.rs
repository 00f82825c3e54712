//! The `--json` of every scenario has exactly the fields docs/bench.md
//! documents: each "JSON fields: <scenario>" table lists the top-level
//! fields, and the `latency.<op>` and `client_cpu` tables the fields of
//! those objects. A field added to the code without its documentation, or
//! documented but gone, fails here.

mod common;

use std::collections::BTreeSet;

use common::{bench, read_json, trace_path, Server, TempDir};
use serde_json::Value as Json;

/// The field names (first column, in backticks) of the markdown table that
/// follows the first line starting with `heading` in docs/bench.md.
fn documented(heading: &str) -> BTreeSet<String> {
    let path = common::workspace_root().join("docs/bench.md");
    let text = std::fs::read_to_string(&path).expect("docs/bench.md");
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(1)
        .skip_while(|l| !l.starts_with('|'));
    let mut fields = BTreeSet::new();
    for line in lines.by_ref() {
        if !line.starts_with('|') {
            break;
        }
        let first = line.trim_start_matches('|').split('|').next().unwrap_or("");
        if let Some(name) = first
            .trim()
            .strip_prefix('`')
            .and_then(|s| s.strip_suffix('`'))
        {
            fields.insert(name.to_string());
        }
    }
    assert!(
        !fields.is_empty(),
        "no field table after '{heading}' in docs/bench.md"
    );
    fields
}

fn keys(v: &Json) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// Checks a report against its scenario's table and the shared objects.
fn check(scenario: &str, report: &Json) {
    assert_eq!(
        keys(report),
        documented(&format!("### JSON fields: {scenario}")),
        "top-level fields of {scenario} (left: the JSON, right: docs/bench.md)"
    );
    if let Some(latency) = report.get("latency") {
        let ops = latency.as_object().expect("latency is an object");
        assert!(!ops.is_empty(), "{scenario}: no latency recorded");
        for (op, h) in ops {
            assert_eq!(
                keys(h),
                documented("`latency.<op>`"),
                "{scenario}: latency.{op}"
            );
        }
    }
    if let Some(cpu) = report.get("client_cpu") {
        assert_eq!(
            keys(cpu),
            documented("`client_cpu`"),
            "{scenario}: client_cpu"
        );
    }
}

#[test]
fn every_scenario_reports_exactly_the_documented_fields() {
    let server = Server::kvtier(&[]);
    let dir = TempDir::new("fields");
    let mut runs: Vec<(&str, Vec<String>)> = vec![
        (
            "kv",
            [
                "kv",
                "--ratio",
                "1:4:1",
                "--keys",
                "50",
                "--value-size",
                "1KiB",
                "--requests",
                "300",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "pd",
            [
                "pd",
                "--chains",
                "4",
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
                "20",
                "--block-size",
                "1KiB",
                "--connections",
                "2",
                "--duration",
                "0.3",
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
                "30".into(),
                "--block-bytes".into(),
                "1KiB".into(),
            ],
        ));
    }
    for (scenario, mut args) in runs {
        let json = dir.file(&format!("{scenario}.json"));
        args.extend([
            "--target".into(),
            server.addr.clone(),
            "--json".into(),
            json.display().to_string(),
        ]);
        bench(&args).assert_ok();
        let report = read_json(&json);
        assert_eq!(report["scenario"], scenario);
        check(scenario, &report);
        if scenario == "skew" {
            check("kv", &report["kv"]);
        }
    }
}
