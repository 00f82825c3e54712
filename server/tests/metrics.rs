//! The Prometheus endpoint: start with a free `--metrics-addr`, run a few
//! commands, and read `/metrics` over plain HTTP.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
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

/// A tenant's series of `metric`, summed over the shards.
fn tenant_total(body: &str, metric: &str, tenant: &str) -> f64 {
    (0..SHARDS)
        .filter_map(|s| {
            sample(
                body,
                &format!(r#"{metric}{{shard="{s}",tenant="{tenant}"}}"#),
            )
        })
        .sum()
}

#[test]
fn tenants_are_counted_in_info_and_metrics() {
    let metrics_port = free_port();
    let addr = format!("127.0.0.1:{metrics_port}");
    let server = Server::start(&[
        "--metrics-addr",
        &addr,
        "--maxmemory",
        "8mb",
        "--tenant",
        "name=llama,keys=llama@*",
        "--tenant",
        "name=mistral,keys=mistral@*",
    ]);
    let mut c = server.raw();
    let block = "b".repeat(8192);
    for k in ["llama@1", "llama@2", "llama@3", "mistral@1", "other"] {
        assert_eq!(c.cmd(&[b"SET", k.as_bytes(), block.as_bytes()]), ok());
    }
    assert_eq!(c.run("GET llama@1"), bulk(&block));
    assert_eq!(c.run("GET llama@nope"), nil());
    assert_eq!(c.run("GET mistral@1"), bulk(&block));
    assert_eq!(c.run("DEL llama@3"), int(1));
    let t = tenants_info(&mut c);
    assert_eq!(t.len(), 3, "{t:?}");
    assert_eq!(
        (t["llama"]["keys"], t["llama"]["hits"], t["llama"]["misses"]),
        (2, 1, 1)
    );
    assert_eq!((t["mistral"]["keys"], t["mistral"]["hits"]), (1, 1));
    assert_eq!((t["default"]["keys"], t["default"]["hits"]), (1, 0));
    // Two 8 KiB values in slab slots, and their keys' index charges.
    assert!((16384..20000).contains(&t["llama"]["dram_bytes"]), "{t:?}");
    assert_eq!(t["llama"]["disk_bytes"], 0);

    // mistral floods the 8 MB tier: its keys are the ones evicted.
    for i in 0..2000 {
        let key = format!("mistral@flood{i}");
        assert_eq!(c.cmd(&[b"SET", key.as_bytes(), block.as_bytes()]), ok());
    }
    let t = tenants_info(&mut c);
    let Resp::Bulk(Some(stats)) = c.run("INFO stats") else {
        panic!()
    };
    let stats = String::from_utf8(stats).unwrap();
    let evicted: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(t["mistral"]["evicted_keys"] > 0, "{t:?}");
    let per_tenant: u64 = t.values().map(|f| f["evicted_keys"]).sum();
    assert_eq!(per_tenant, evicted, "{t:?}");
    let dram: u64 = t.values().map(|f| f["dram_bytes"]).sum();
    assert!(dram <= 8 << 20, "tenants hold {dram} bytes in an 8 MB tier");

    // The metrics: one series per shard and tenant, the same figures.
    let llama_keys = t["llama"]["keys"] as f64;
    let mut body = String::new();
    let complete = eventually(Duration::from_secs(20), || {
        body = scrape(metrics_port);
        let keys = tenant_total(&body, "kvtier_tenant_keys", "llama");
        let hits = tenant_total(&body, "kvtier_tenant_hits_total", "mistral");
        // Every shard has exported its series (each reports in its turn).
        let every_shard = (0..SHARDS).all(|s| {
            body.contains(&format!(
                r#"kvtier_tenant_used_bytes{{shard="{s}",tenant="default",tier="dram"}}"#
            ))
        });
        keys == llama_keys && hits == 1.0 && every_shard
    });
    assert!(complete, "no tenant series:\n{body}");
    assert!(
        body.contains("# TYPE kvtier_tenant_used_bytes gauge"),
        "{body}"
    );
    assert!(
        body.contains(r#"kvtier_tenant_used_bytes{shard="0",tenant="default",tier="dram"}"#),
        "{body}"
    );
    // Prometheus's own checker, where it is installed (scripts/test.sh
    // installs it).
    if let Ok(mut promtool) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = promtool.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // FLUSHALL empties every tenant; the list stays.
    assert_eq!(c.run("FLUSHALL"), ok());
    let t = tenants_info(&mut c);
    assert_eq!(t.len(), 3);
    assert!(
        t.values().all(|f| f["keys"] == 0 && f["dram_bytes"] == 0),
        "{t:?}"
    );
}

#[test]
fn bad_tenants_are_refused_at_start() {
    for (args, says) in [
        (
            vec!["--tenant", "name=a,keys=a*b*"],
            "only 'prefix*' or an exact key",
        ),
        (vec!["--tenant", "name=default,keys=a@*"], "not 'default'"),
        (
            vec!["--tenant", "keys=a@*"],
            "expected name=NAME,keys=PATTERN",
        ),
        (
            vec!["--tenant", "name=a,keys=a@*", "--tenant", "name=a,keys=b@*"],
            "tenant 'a' is named twice",
        ),
        (vec!["--tenant", "name=a"], "user=USER"),
        (
            vec!["--tenant", "name=a,user=nobody"],
            "no ACL user 'nobody'",
        ),
        (
            vec![
                "--tenant",
                "name=a,keys=a@*,share=60%",
                "--tenant",
                "name=b,keys=b@*,share=50%",
            ],
            "add up to 110%",
        ),
        (
            vec!["--tenant", "name=a,keys=a@*,share=50%,cap=40%"],
            "a share above its cap",
        ),
        (
            vec!["--tenant", "name=a,keys=a@*,cap=1.234%"],
            "a percentage",
        ),
        (
            vec!["--tenant", "name=a,keys=a@*,disk-cap=-1%"],
            "a percentage",
        ),
        (vec!["--tenant", "name=a,keys=a b*"], "no whitespace"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
            .args(["--port", "0", "--metrics-addr", "none"])
            .args(&args)
            .output()
            .expect("run kvtier-server");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let many: Vec<String> = (0..16)
        .flat_map(|i| ["--tenant".to_string(), format!("name=t{i},keys=t{i}@*")])
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
        .args(["--port", "0", "--metrics-addr", "none"])
        .args(&many)
        .output()
        .expect("run kvtier-server");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 15"));
}

/// A tenant named by an ACL user: its keys are those the user may write
/// (its key fences at start), whoever writes them; a user whose fences are
/// not prefixes cannot name a tenant.
#[test]
fn a_tenant_named_by_an_acl_user_owns_the_keys_it_may_write() {
    let (dir, path) = acl_file(
        "tenant",
        "user default on nopass ~* &* +@all\n\
         user alice on >pw ~llama@* %R~shared@* +@all\n\
         user globber on >pw ~a?c +@all\n",
    );
    let server = Server::start(&[
        "--aclfile",
        &path,
        "--tenant",
        "name=team,user=alice,keys=team@*,share=25%",
    ]);
    let mut c = server.raw();
    assert_eq!(c.run("AUTH alice pw"), ok());
    for k in ["llama@1", "llama@2"] {
        assert_eq!(c.run(&format!("SET {k} v")), ok());
    }
    let mut d = server.raw();
    // The default user's writes of alice's keys count for her tenant too;
    // keys she may only read, or not touch, are the default tenant's.
    for k in ["team@1", "shared@1", "other"] {
        assert_eq!(d.run(&format!("SET {k} v")), ok());
    }
    let t = tenants_info(&mut d);
    assert_eq!((t["team"]["keys"], t["default"]["keys"]), (3, 2), "{t:?}");
    let spec = d.run("CONFIG GET tenant").items()[1].text();
    assert!(
        spec.starts_with("name=team,keys=team@*,user=alice,share=25%"),
        "{spec}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
        .args(["--port", "0", "--metrics-addr", "none", "--aclfile", &path])
        .args(["--tenant", "name=g,user=globber"])
        .output()
        .expect("run kvtier-server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ACL user 'globber'") && stderr.contains("only 'prefix*'"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A free port on 127.0.0.1 whose port + 3000 (its default metrics port)
/// is free too.
fn free_pair() -> u16 {
    loop {
        let port = free_port();
        if port < 62000 && TcpListener::bind(("127.0.0.1", port + 3000)).is_ok() {
            return port;
        }
    }
}

/// Runs kvtier-server with `args` until it exits (at most 20 s; a server
/// still running then is killed and the test fails): its exit status and
/// output.
fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kvtier-server");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("kvtier-server {args:?} is still running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (status, out)
}

#[test]
fn servers_on_one_host_each_serve_metrics_at_their_port_plus_3000() {
    let (a, b) = (free_pair(), free_pair());
    let servers: Vec<Server> = [a, b]
        .iter()
        .map(|p| Server::start_with_args(&["--port", &p.to_string(), "--threads", "2"]))
        .collect();
    for (server, port) in servers.iter().zip([a, b]) {
        assert_eq!(server.raw().run("PING"), status("PONG"));
        let mut body = String::new();
        assert!(
            eventually(Duration::from_secs(10), || {
                body = scrape(port + 3000);
                body.contains("kvtier_")
            }),
            "no metrics on {}: {body:?}",
            port + 3000
        );
    }
}

#[test]
fn a_taken_default_metrics_port_is_a_warning_a_given_one_an_exit() {
    let port = free_pair();
    let _taken = TcpListener::bind(("127.0.0.1", port + 3000)).unwrap();
    let server = Server::start_with_args(&["--port", &port.to_string(), "--threads", "2"]);
    assert_eq!(server.raw().run("PING"), status("PONG"));
    server.assert_log_shows("metrics not served");
    let given = format!("127.0.0.1:{}", port + 3000);
    let (exit, out) = run_to_exit(&["--port", "0", "--metrics-addr", &given]);
    assert!(!exit.success(), "{out}");
    assert!(out.contains("cannot serve metrics"), "{out}");
}

#[test]
fn a_second_server_on_a_port_in_use_refuses_to_start() {
    let first = Server::start(&[]);
    let port = first.port.to_string();
    let (exit, out) = run_to_exit(&["--port", &port, "--metrics-addr", "none"]);
    assert!(!exit.success(), "{out}");
    assert!(out.contains("address already in use"), "{out}");
    // The first one still has every connection.
    for _ in 0..8 {
        assert_eq!(first.raw().run("PING"), status("PONG"));
    }
}
