//! The Prometheus endpoint: start with a free `--metrics-addr`, run a few
//! commands, and read `/metrics` over plain HTTP.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::*;

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics`, body only (empty if the endpoint is not up yet).
fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = Vec::new();
    let _ = s.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    assert!(
        response.is_empty() || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// The value of the sample `name{labels}` in a scrape.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn metrics_endpoint_counts_commands() {
    let metrics_port = free_port();
    let addr = format!("127.0.0.1:{metrics_port}");
    let server = Server::start(&["--metrics-addr", &addr]);
    let mut c = server.raw();
    let keys = one_key_per_shard("m");
    for k in &keys {
        assert_eq!(c.run(&format!("SET {k} v")), ok());
    }
    for k in &keys[..3] {
        assert_eq!(c.run(&format!("GET {k}")), bulk("v"));
    }
    assert_eq!(c.run("GET nokey"), nil());
    assert_eq!(
        c.run("INCR m:0"),
        err("ERR value is not an integer or out of range")
    );
    // Shards publish their counters about once a second.
    let mut body = String::new();
    let complete = eventually(Duration::from_secs(20), || {
        body = scrape(metrics_port);
        sample(&body, r#"kvtier_commands_total{cmd="get"}"#) == Some(4.0)
            && sample(&body, r#"kvtier_commands_total{cmd="set"}"#) == Some(4.0)
            && sample(&body, r#"kvtier_command_errors_total{cmd="incr"}"#) == Some(1.0)
            && (0..SHARDS)
                .all(|s| sample(&body, &format!(r#"kvtier_keys{{shard="{s}"}}"#)) == Some(1.0))
    });
    assert!(complete, "metrics never showed the commands:\n{body}");
    assert!(body.contains("# HELP kvtier_commands_total"), "{body}");
    assert!(
        body.contains("# TYPE kvtier_commands_total counter"),
        "{body}"
    );
    assert!(
        body.contains(r#"kvtier_command_duration_seconds_bucket{cmd="get",le="#),
        "{body}"
    );
    assert!(sample(&body, "kvtier_connections_total").unwrap_or(0.0) >= 1.0);
    assert!(sample(&body, "kvtier_net_input_bytes_total").unwrap_or(0.0) > 0.0);
    let hits: f64 = (0..SHARDS)
        .filter_map(|s| {
            sample(
                &body,
                &format!(r#"kvtier_keyspace_hits_total{{shard="{s}"}}"#),
            )
        })
        .sum();
    assert_eq!(hits, 3.0);
}

#[test]
fn metrics_can_be_disabled() {
    // The harness passes `--metrics-addr none`; the server starts and
    // serves without an endpoint.
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("PING"), status("PONG"));
    let info = c.run("CONFIG GET metrics-addr");
    assert_eq!(info, bulks(&["metrics-addr", "none"]));
}

#[test]
fn spill_tier_metrics_are_exported() {
    let metrics_port = free_port();
    let addr = format!("127.0.0.1:{metrics_port}");
    let dir = std::env::temp_dir().join(format!("kvtier-it-metrics-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = Server::start(&[
        "--metrics-addr",
        &addr,
        "--maxmemory",
        "2mb",
        "--spill-dir",
        dir.to_str().unwrap(),
    ]);
    let mut c = server.raw();
    let block = "x".repeat(64 * 1024);
    for i in 0..80 {
        assert_eq!(
            c.cmd(&[b"SET", format!("b{i}").as_bytes(), block.as_bytes()]),
            ok()
        );
    }
    let mut body = String::new();
    let exported = eventually(Duration::from_secs(20), || {
        body = scrape(metrics_port);
        sample(&body, "kvtier_spill_writes_total").unwrap_or(0.0) > 0.0
            && sample(&body, "kvtier_spill_used_bytes").unwrap_or(0.0) > 0.0
    });
    assert!(exported, "no spill metrics:\n{body}");
    assert!(body.contains("kvtier_spill_write_seconds"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
