//! Process and connection limits: SIGTERM stops the server cleanly,
//! `--maxclients` refuses extra connections with Redis's error, and
//! `--timeout` closes idle clients.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn sigterm_stops_gracefully() {
    let mut server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET k v"), ok());
    // SAFETY: sends a signal to the child process this test started.
    let sent = unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    c.assert_closed();
}

#[test]
fn maxclients_refuses_extra_connections() {
    let server = Server::start(&["--maxclients", "2"]);
    let mut a = server.raw();
    let mut b = server.raw();
    assert_eq!(a.run("PING"), status("PONG"));
    assert_eq!(b.run("PING"), status("PONG"));
    let mut c = server.raw();
    assert_eq!(c.read(), err("ERR max number of clients reached"));
    c.assert_closed();
    let info = a.run("INFO stats").text();
    assert_eq!(info_num(&info, "rejected_connections"), 1);
    drop(b);
    // The slot frees once the server has seen the close.
    assert!(eventually(Duration::from_secs(10), || {
        let mut d = server.raw();
        d.send(b"PING\r\n");
        d.read() == status("PONG")
    }));
}

#[test]
fn idle_clients_are_closed_after_timeout() {
    let server = Server::start(&["--timeout", "1"]);
    let mut idle = server.raw();
    assert_eq!(idle.run("PING"), status("PONG"));
    std::thread::sleep(Duration::from_millis(1500));
    idle.assert_closed();
    let mut c = server.raw();
    assert_eq!(c.run("CONFIG SET timeout 0"), ok());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.run("PING"), status("PONG"));
}

/// Sends a request that is not RESP: an error, then the server closes.
fn protocol_error(c: &mut RawConn) {
    c.send(b"*abc\r\n");
    assert_eq!(
        c.read(),
        err("ERR Protocol error: invalid multibulk length")
    );
    c.assert_closed();
}

/// Waits up to 20 s for the server's log to contain `text`.
fn wait_for_log(server: &Server, text: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = server.log();
        if log.contains(text) {
            return log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {text:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_redirected_text_log_has_no_escape_codes() {
    let server = Server::start(&[]);
    let log = wait_for_log(&server, "listening on");
    assert!(log.contains(" INFO "), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log:\n{log}"
    );
}

#[test]
fn json_logs_parse_line_by_line_and_loglevel_changes_at_run_time() {
    let server = Server::start(&["--log-format", "json", "--loglevel", "notice"]);
    wait_for_log(&server, "listening on");
    // A protocol error is logged at debug level ("verbose"): not yet.
    let mut c = server.raw();
    protocol_error(&mut c);
    let mut admin = server.raw();
    assert_eq!(
        admin.run("CONFIG GET loglevel"),
        bulks(&["loglevel", "notice"])
    );
    assert_eq!(
        admin.run("CONFIG SET loglevel loud"),
        err("ERR CONFIG SET failed (possibly related to argument 'loglevel') - argument(s) must be one of the following: debug, verbose, notice, warning, nothing")
    );
    assert_eq!(admin.run("CONFIG SET loglevel VERBOSE"), ok());
    assert_eq!(
        admin.run("CONFIG GET loglevel"),
        bulks(&["loglevel", "verbose"])
    );
    let mut c = server.raw();
    protocol_error(&mut c);
    let log = wait_for_log(&server, "protocol error");
    assert_eq!(log.matches("protocol error").count(), 1, "{log}");
    let mut levels = Vec::new();
    for line in log.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        let time = v["time"].as_str().expect("time");
        assert!(time.contains('T') && time.ends_with('Z'), "{line}");
        assert!(
            v["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("kvtier")),
            "{line}"
        );
        assert!(v["message"].as_str().is_some(), "{line}");
        assert!(v["fields"].is_object(), "{line}");
        levels.push(v["level"].as_str().expect("level").to_string());
    }
    assert!(levels.contains(&"INFO".to_string()), "{levels:?}");
    assert!(levels.contains(&"DEBUG".to_string()), "{levels:?}");
    // "warning": the next protocol error is not logged.
    assert_eq!(admin.run("CONFIG SET loglevel warning"), ok());
    let mut c = server.raw();
    protocol_error(&mut c);
    assert_eq!(admin.run("PING"), status("PONG"));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.log().matches("protocol error").count(), 1);
}

#[test]
fn an_unknown_loglevel_or_log_format_is_refused_at_start() {
    for args in [["--loglevel", "loud"], ["--log-format", "xml"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
            .args(["--port", "0", "--metrics-addr", "none"])
            .args(args)
            .output()
            .expect("run kvtier-server");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(args[1]), "{stderr}");
    }
}

#[test]
fn the_default_memory_limit_is_sized_from_the_machine_and_said_at_start() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let reply = c.run("CONFIG GET maxmemory");
    let limit: u64 = format!("{reply:?}")
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .max()
        .expect("a number");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse().ok())
        .unwrap();
    assert!(limit > 0 && limit <= total_kb * 1024 / 4 * 3, "{limit}");
    server.assert_log_shows("(auto: 3/4");
    for line in [
        "policy prefix",
        "no spill tier",
        "no TLS port",
        "protected mode yes",
        "metrics off",
    ] {
        assert!(server.log().contains(line), "{line}: {}", server.log());
    }
    // 0 still means no limit.
    let none = Server::start(&["--maxmemory", "0"]);
    none.assert_log_shows("no memory limit");
}

#[test]
fn config_rewrite_writes_what_config_set_changed_into_the_config_file() {
    let dir = std::env::temp_dir().join(format!("kvtier-rewrite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvtier.conf");
    std::fs::write(
        &path,
        "# my settings\nmaxmemory 64mb\n\nmaxmemory-policy allkeys-lru\n",
    )
    .unwrap();
    let file = path.display().to_string();
    {
        let server = Server::start(&[&file]);
        let mut c = server.raw();
        assert_eq!(c.run("CONFIG SET maxmemory 100mb timeout 30"), ok());
        assert_eq!(c.run("CONFIG REWRITE"), ok());
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "# my settings\nmaxmemory 104857600\n\nmaxmemory-policy allkeys-lru\ntimeout 30\n"
    );
    // The file starts the next server with them.
    let server = Server::start(&[&file]);
    let mut c = server.raw();
    assert_eq!(
        c.run("CONFIG GET maxmemory"),
        bulks(&["maxmemory", "104857600"])
    );
    assert_eq!(c.run("CONFIG GET timeout"), bulks(&["timeout", "30"]));
    // Nothing changed: the file stays as it is.
    assert_eq!(c.run("CONFIG REWRITE"), ok());
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .ends_with("timeout 30\n"));
    let _ = std::fs::remove_dir_all(&dir);
    // Without a config file, Redis's answer.
    assert_eq!(
        Server::start(&[]).raw().run("CONFIG REWRITE"),
        err("ERR The server is running without a config file")
    );
}

#[test]
fn a_config_file_error_names_the_file_the_line_and_the_setting() {
    let dir = std::env::temp_dir().join(format!("kvtier-conf-error-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("redis.conf");
    std::fs::write(&path, "port 7000\nappendonly no\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier-server"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{} line 2: `appendonly` is a Redis setting that kvtier does not have",
            path.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
