//! Shared helpers for kvtier-bench's integration tests: start a real
//! `kvtier-server` (and a `redis-server` when one is installed) on an
//! ephemeral port, run the real `kvtier-bench` binary against it with a time
//! limit, read its `--json`, and compute what a trace must give straight from
//! the file.

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// How long one kvtier-bench run may take before the test fails.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// The root of the workspace (the directory above `bench/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ has a parent")
        .to_path_buf()
}

/// The `kvtier-server` binary: `$KVTIER_BIN`, else the one built beside
/// `kvtier-bench` (`cargo test --workspace` builds both).
pub fn server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KVTIER_BIN") {
        return PathBuf::from(p);
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_kvtier-bench")).with_file_name("kvtier-server");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p kvtier-server` (or `cargo test --workspace`), or set KVTIER_BIN",
        bin.display()
    );
    bin
}

/// The Mooncake trace: `$KVTIER_TRACE`, else the copy the repository ships,
/// `bench/traces/mooncake_synthetic_trace.jsonl`. `None` (and a message)
/// only when the file is absent.
pub fn trace_path() -> Option<PathBuf> {
    let path = match std::env::var_os("KVTIER_TRACE") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("bench/traces/mooncake_synthetic_trace.jsonl"),
    };
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: no trace at {} (set KVTIER_TRACE to the Mooncake synthetic trace)",
            path.display()
        );
        None
    }
}

/// One request of the trace, as the test reads it (independently of the
/// bench's own parser).
pub struct TraceRequest {
    pub input_length: u64,
    pub hash_ids: Vec<u64>,
}

/// Reads the first `limit` requests of the trace (all with `None`).
pub fn read_trace(path: &Path, limit: Option<usize>) -> Vec<TraceRequest> {
    let text = std::fs::read_to_string(path).expect("read trace");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(limit.unwrap_or(usize::MAX))
        .map(|l| {
            let v: Json = serde_json::from_str(l).expect("trace line is JSON");
            TraceRequest {
                input_length: v["input_length"].as_u64().expect("input_length"),
                hash_ids: v["hash_ids"]
                    .as_array()
                    .expect("hash_ids")
                    .iter()
                    .map(|x| x.as_u64().expect("integer hash id"))
                    .collect(),
            }
        })
        .collect()
}

/// What a replay in order with unlimited memory must report.
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    pub requests: u64,
    pub blocks: u64,
    pub hit_blocks: u64,
    pub tokens: u64,
    pub hit_tokens: u64,
    pub distinct_blocks: u64,
}

/// Walks the requests in order: a block is a hit when it and every block
/// before it in its request were stored by an earlier request.
pub fn expected(requests: &[TraceRequest], block_tokens: u64) -> Expected {
    let mut stored = HashSet::new();
    let mut e = Expected {
        requests: requests.len() as u64,
        blocks: 0,
        hit_blocks: 0,
        tokens: 0,
        hit_tokens: 0,
        distinct_blocks: 0,
    };
    for r in requests {
        let hits = r
            .hash_ids
            .iter()
            .position(|id| !stored.contains(id))
            .unwrap_or(r.hash_ids.len()) as u64;
        e.blocks += r.hash_ids.len() as u64;
        e.hit_blocks += hits;
        e.tokens += r.input_length;
        e.hit_tokens += (hits * block_tokens).min(r.input_length);
        stored.extend(r.hash_ids.iter().copied());
    }
    e.distinct_blocks = stored.len() as u64;
    e
}

/// Kills the child if the test process dies first (no orphaned servers).
fn kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A server process killed when dropped.
pub struct Server {
    child: Child,
    /// `127.0.0.1:port`
    pub addr: String,
}

impl Server {
    /// Starts `kvtier-server --port 0 --metrics-addr none --threads 4`
    /// plus `extra`, and waits for its `kvtier listening on ...` line.
    pub fn kvtier(extra: &[&str]) -> Server {
        let mut command = Command::new(server_bin());
        command
            .args(["--port", "0", "--metrics-addr", "none", "--threads", "4"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        kill_with_parent(&mut command);
        let mut child = command.spawn().expect("spawn kvtier-server");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(addr) = line.strip_prefix("kvtier listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("kvtier-server did not print its address within 30 s");
            }
        };
        Server { child, addr }
    }

    /// Starts a `redis-server` with no persistence on a free port, or
    /// returns `None` (with a message) when none is installed.
    pub fn redis() -> Option<Server> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            eprintln!("SKIPPED: redis-server is not on PATH");
            return None;
        }
        let port = free_port();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        kill_with_parent(&mut command);
        let child = command.spawn().expect("spawn redis-server");
        let server = Server {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while resp(&server.addr, &[b"PING"]).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// Sends one command and returns the raw reply's first line (the tests only
/// need SET / PING, whose replies are one line).
pub fn resp(addr: &str, args: &[&[u8]]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let args: Vec<bytes::Bytes> = args
        .iter()
        .map(|a| bytes::Bytes::copy_from_slice(a))
        .collect();
    s.write_all(&kvtier_protocol::reply::encode_command(&args))?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        if s.read(&mut byte)? == 0 {
            break;
        }
        reply.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&reply).trim_end().to_string())
}

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kvtier-bench-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The result of one kvtier-bench run.
pub struct Run {
    pub output: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn success(&self) -> bool {
        self.output.status.success()
    }

    /// Panics with the run's output unless it exited 0.
    pub fn assert_ok(&self) -> &Run {
        assert!(
            self.success(),
            "kvtier-bench failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.output.status,
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// Runs `kvtier-bench args...` and waits for it (at most [`RUN_TIMEOUT`]).
pub fn bench<S: AsRef<str>>(args: &[S]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvtier-bench"));
    command
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    kill_with_parent(&mut command);
    let mut child = command.spawn().expect("spawn kvtier-bench");
    // Drain both pipes on threads so a chatty run cannot block on them.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for kvtier-bench") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let line: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
            panic!(
                "kvtier-bench {} took longer than {RUN_TIMEOUT:?}",
                line.join(" ")
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    Run {
        output: Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        },
    }
}

/// Reads a `--json` file.
pub fn read_json(path: &Path) -> Json {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An unsigned integer field of a report.
pub fn u(json: &Json, field: &str) -> u64 {
    json[field]
        .as_u64()
        .unwrap_or_else(|| panic!("'{field}' is not an unsigned integer in {json}"))
}

/// A number field of a report.
pub fn f(json: &Json, field: &str) -> f64 {
    json[field]
        .as_f64()
        .unwrap_or_else(|| panic!("'{field}' is not a number in {json}"))
}
