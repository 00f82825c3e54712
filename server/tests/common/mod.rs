//! Shared helpers for the integration tests: start the real `kvtier-server`
//! binary on an ephemeral port, talk to it with raw sockets (exact bytes and
//! exact error texts) or with the `redis` crate, and find keys that land on a
//! given shard.
//!
//! Every socket read has a timeout, and every server is killed when its
//! [`Server`] guard drops, so a server bug fails a test instead of hanging
//! the suite.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kvtier_protocol::{BuildReply, ReplyError, ReplyParser};
use kvtier_server::shard::slot::{key_slot, slot_shard};

/// Shards every test server runs with, so multi-key commands cross shards
/// even on a 2-core machine.
pub const SHARDS: usize = 4;

/// How long any single socket read may block before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the server may take to print its port line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `kvtier-server` process; killed when dropped.
pub struct Server {
    child: Option<Child>,
    /// The port it listens on.
    pub port: u16,
    /// What it wrote to stderr (its log), for diagnostics.
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server with `--threads 4 --metrics-addr none` and `extra`
    /// flags (later flags override earlier ones).
    pub fn start(extra: &[&str]) -> Server {
        let threads = SHARDS.to_string();
        let mut args = vec![
            "--port",
            "0",
            "--threads",
            &threads,
            "--metrics-addr",
            "none",
        ];
        args.extend_from_slice(extra);
        Self::start_with_args(&args)
    }

    /// Starts the server with exactly `args`.
    pub fn start_with_args(args: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvtier-server"));
        command.args(args);
        Self::start_command(command)
    }

    /// Starts `command` (which runs the server, perhaps through a wrapper
    /// that execs it) and waits for its port line.
    pub fn start_command(mut command: Command) -> Server {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        kill_with_parent(&mut command);
        let mut child = command.spawn().expect("spawn kvtier-server");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        {
            let log = Arc::clone(&log);
            thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !sent {
                    // `kvtier listening on ADDR`, alone or as a JSON log
                    // object's message (--log-format json).
                    if let Some((_, rest)) = line.split_once("kvtier listening on ") {
                        let addr = rest.split(['"', ' ']).next().unwrap_or_default();
                        let _ = tx.send(addr.trim().to_string());
                        sent = true;
                    }
                }
            }
        });
        let mut server = Server {
            child: Some(child),
            port: 0,
            log,
        };
        let addr = match rx.recv_timeout(START_TIMEOUT) {
            Ok(addr) => addr,
            Err(_) => panic!(
                "kvtier-server did not print its port line; log:\n{}",
                server.log()
            ),
        };
        let addr: SocketAddr = addr.parse().expect("listening address");
        server.port = addr.port();
        server
    }

    /// `redis://127.0.0.1:PORT/` (RESP2).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `redis://127.0.0.1:PORT/?protocol=resp3`.
    pub fn url_resp3(&self) -> String {
        format!("redis://127.0.0.1:{}/?protocol=resp3", self.port)
    }

    /// A raw RESP connection.
    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.port)
    }

    /// A synchronous `redis` crate connection (RESP2) with read timeouts.
    pub fn redis(&self) -> redis::Connection {
        connect_redis(&self.url())
    }

    /// A synchronous `redis` crate connection speaking RESP3.
    pub fn redis3(&self) -> redis::Connection {
        connect_redis(&self.url_resp3())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Panics with the log unless it shows `text` within 5 s.
    pub fn assert_log_shows(&self, text: &str) {
        assert!(
            eventually(Duration::from_secs(5), || self.log().contains(text)),
            "no {text:?} in the log:\n{}",
            self.log()
        );
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// SIGTERM, then waits for the graceful exit; the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        // SAFETY: kill(2) with our own child's pid.
        unsafe {
            libc::kill(self.pid() as libc::pid_t, libc::SIGTERM);
        }
        let status = self.wait_exit(Duration::from_secs(120));
        self.child = None;
        status
    }

    /// SIGKILL: no shutdown work at all.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!("---- kvtier-server log ----\n{}", self.log());
        }
    }
}

/// Makes the child die with the test thread that started it (Linux), so a
/// test process that is killed leaves no server behind.
fn kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent;
    // it is all the closure does between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A `redis` crate connection to `url` with connect and read timeouts.
pub fn connect_redis(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("redis url");
    let con = client
        .get_connection_with_timeout(Duration::from_secs(10))
        .expect("connect with the redis crate");
    con.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    con.set_write_timeout(Some(READ_TIMEOUT)).expect("timeout");
    con
}

/// A multiplexed async `redis` crate connection to `url`. The crate's
/// default response timeout (500 ms) is too short for big pipelines against
/// a debug build on a busy 2-core machine, so it is raised to
/// [`READ_TIMEOUT`].
pub async fn connect_async(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("redis url");
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(READ_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("async connect with the redis crate")
}

/// `CODE detail` of a server error from the `redis` crate, e.g.
/// `ERR syntax error`.
pub fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("not a server error: {e}"),
    }
}

/// The shard of `shards` that owns `key`.
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    slot_shard(key_slot(key), shards)
}

/// `count` keys `{prefix}:N` owned by `shard` (of [`SHARDS`]).
pub fn keys_on_shard(prefix: &str, shard: usize, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .filter(|k| shard_of(k.as_bytes(), SHARDS) == shard)
        .take(count)
        .collect()
}

/// One key on each shard: `{prefix}:N`, in shard order.
pub fn one_key_per_shard(prefix: &str) -> Vec<String> {
    (0..SHARDS)
        .map(|s| keys_on_shard(prefix, s, 1).remove(0))
        .collect()
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A reply, decoded exactly (RESP2 and RESP3).
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    /// `+text`
    Status(String),
    /// `-text`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n` (None: `$-1`)
    Bulk(Option<Vec<u8>>),
    /// `*n` (None: `*-1`)
    Array(Option<Vec<Resp>>),
    /// RESP3 `_`
    Null,
    /// RESP3 `%n`
    Map(Vec<(Resp, Resp)>),
    /// RESP3 `~n`
    Set(Vec<Resp>),
    /// RESP3 `,text`
    Double(String),
    /// RESP3 `#t` / `#f`
    Bool(bool),
    /// RESP3 `=n` with its 3-letter format
    Verbatim(String, Vec<u8>),
}

impl Resp {
    /// The bytes of a bulk or verbatim string (panics otherwise).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Resp::Bulk(Some(b)) | Resp::Verbatim(_, b) => b.clone(),
            Resp::Status(s) => s.as_bytes().to_vec(),
            other => panic!("not a string reply: {other:?}"),
        }
    }

    /// The text of a bulk, verbatim or status string.
    pub fn text(&self) -> String {
        String::from_utf8(self.bytes()).expect("utf-8 reply")
    }

    /// The integer of an integer reply.
    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(n) => *n,
            other => panic!("not an integer reply: {other:?}"),
        }
    }

    /// The elements of an array or set reply.
    pub fn items(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(v)) | Resp::Set(v) => v.clone(),
            other => panic!("not an array reply: {other:?}"),
        }
    }

    /// Whether it is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

/// `+OK`
pub fn ok() -> Resp {
    Resp::Status("OK".into())
}
/// `+text`
pub fn status(s: &str) -> Resp {
    Resp::Status(s.into())
}
/// `-text`
pub fn err(s: &str) -> Resp {
    Resp::Error(s.into())
}
/// `:n`
pub fn int(n: i64) -> Resp {
    Resp::Int(n)
}
/// `$n text`
pub fn bulk(s: impl AsRef<[u8]>) -> Resp {
    Resp::Bulk(Some(s.as_ref().to_vec()))
}
/// `$-1`
pub fn nil() -> Resp {
    Resp::Bulk(None)
}
/// `*n` of bulk strings.
pub fn bulks(items: &[&str]) -> Resp {
    Resp::Array(Some(items.iter().map(bulk).collect()))
}
/// `*n`
pub fn array(items: Vec<Resp>) -> Resp {
    Resp::Array(Some(items))
}

/// `ERR wrong number of arguments for '<cmd>' command`
pub fn arity(cmd: &str) -> Resp {
    err(&format!(
        "ERR wrong number of arguments for '{cmd}' command"
    ))
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A plain TCP connection speaking RESP, with a read timeout on every read.
/// Replies are read with kvtier-protocol's reply parser, built as [`Resp`]
/// (an exact picture of the wire).
pub struct RawConn {
    /// The socket.
    pub stream: TcpStream,
    buf: BytesMut,
    parser: ReplyParser<Resp>,
}

impl BuildReply for Resp {
    fn line(kind: u8, line: &[u8]) -> Result<Resp, ReplyError> {
        let text = String::from_utf8(line.to_vec()).map_err(|_| ReplyError("utf-8".into()))?;
        Ok(match kind {
            b'+' => Resp::Status(text),
            b'-' => Resp::Error(text),
            b':' => Resp::Int(text.parse().map_err(|_| ReplyError(text.clone()))?),
            b'_' => Resp::Null,
            b',' => Resp::Double(text),
            b'#' => Resp::Bool(text == "t"),
            _ => return Err(unexpected(kind)),
        })
    }

    fn blob(kind: u8, body: Bytes) -> Result<Resp, ReplyError> {
        Ok(match kind {
            b'$' => Resp::Bulk(Some(body.to_vec())),
            b'=' if body.len() >= 4 && body[3] == b':' => Resp::Verbatim(
                String::from_utf8_lossy(&body[..3]).into_owned(),
                body[4..].to_vec(),
            ),
            _ => return Err(unexpected(kind)),
        })
    }

    fn null(kind: u8) -> Result<Resp, ReplyError> {
        match kind {
            b'$' => Ok(Resp::Bulk(None)),
            b'*' => Ok(Resp::Array(None)),
            _ => Err(unexpected(kind)),
        }
    }

    fn aggregate(kind: u8, items: Vec<Resp>) -> Result<Resp, ReplyError> {
        Ok(match kind {
            b'*' => Resp::Array(Some(items)),
            b'~' => Resp::Set(items),
            b'%' => {
                let mut pairs = Vec::new();
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Resp::Map(pairs)
            }
            _ => return Err(unexpected(kind)),
        })
    }

    fn attribute(_items: Vec<Resp>) -> Result<(), ReplyError> {
        Err(unexpected(b'|'))
    }
}

/// kvtier never sends RESP3 pushes, attributes, blob errors or big numbers:
/// a test that receives one fails.
fn unexpected(kind: u8) -> ReplyError {
    ReplyError(format!("unexpected reply type {:?}", kind as char))
}

impl RawConn {
    /// Connects to 127.0.0.1:`port`.
    pub fn connect(port: u16) -> RawConn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        RawConn {
            stream,
            buf: BytesMut::new(),
            parser: ReplyParser::new(),
        }
    }

    /// Sends bytes as they are.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to server");
    }

    /// Sends a command given as separate arguments and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> Resp {
        self.send(&encode(args));
        self.read()
    }

    /// Sends a command written as space-separated words and reads its reply.
    pub fn run(&mut self, line: &str) -> Resp {
        let args: Vec<&[u8]> = line.split_whitespace().map(str::as_bytes).collect();
        self.cmd(&args)
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads one reply.
    pub fn read(&mut self) -> Resp {
        loop {
            match self.parser.parse(&mut self.buf) {
                Ok(Some(reply)) => return reply,
                Ok(None) => {}
                Err(e) => panic!("{e}"),
            }
            // A big payload goes straight into its own buffer.
            let got = match self.parser.big_bulk_buffer() {
                Some(mut own) => {
                    let mut chunk = vec![0u8; own.remaining_mut().min(1 << 20)];
                    self.stream
                        .read(&mut chunk)
                        .inspect(|&n| own.put_slice(&chunk[..n]))
                }
                None => self.fill(),
            };
            match got {
                Ok(0) => panic!("server closed the connection while a reply was expected"),
                Ok(_) => {}
                Err(e) => panic!("no reply from the server within {READ_TIMEOUT:?}: {e}"),
            }
        }
    }

    /// Asserts the server closes the connection (EOF) within the timeout,
    /// after any bytes still in flight.
    pub fn assert_closed(&mut self) {
        self.buf.clear();
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            match self.fill() {
                Ok(0) => return,
                Ok(_) => {
                    let junk = String::from_utf8_lossy(&self.buf).into_owned();
                    panic!("expected the connection to close, got {junk:?}");
                }
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) if Instant::now() >= deadline => panic!("connection still open: {e}"),
                Err(_) => {}
            }
        }
    }

    /// Asserts nothing arrives for `wait` and the connection stays open.
    pub fn assert_silent(&mut self, wait: Duration) {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let got = self.fill();
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        match got {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(0) => panic!("the server closed the connection"),
            Ok(_) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&self.buf)),
            Err(e) => panic!("read failed: {e}"),
        }
    }
}

/// The `field:value` lines of an INFO reply.
/// The integer `field` of `INFO section`, read on `conn` (panics if absent).
pub fn info_int(conn: &mut RawConn, section: &str, field: &str) -> i64 {
    let text = conn.run(&format!("INFO {section}")).text();
    info_field(&text, field)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} not in INFO {section}:\n{text}"))
}

pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// An INFO field parsed as a number (panics when absent).
pub fn info_num(info: &str, field: &str) -> u64 {
    info_field(info, field)
        .unwrap_or_else(|| panic!("INFO has no {field}:\n{info}"))
        .parse()
        .unwrap_or_else(|_| panic!("INFO {field} is not a number"))
}

/// `len` bytes of a xorshift stream seeded by `seed`: content that differs
/// per seed and per position, so a dropped, duplicated or shifted chunk
/// cannot go unnoticed, yet can be made again to verify.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `INFO tenants` as {tenant: {field: value}}.
pub fn tenants_info(
    c: &mut RawConn,
) -> std::collections::HashMap<String, std::collections::HashMap<String, u64>> {
    let Resp::Bulk(Some(text)) = c.run("INFO tenants") else {
        panic!("INFO tenants is not a bulk string");
    };
    String::from_utf8(text)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("tenant_"))
        .map(|l| {
            let (name, fields) = l.split_once(':').unwrap();
            let fields = fields
                .split(',')
                .map(|f| {
                    let (k, v) = f.split_once('=').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect();
            (name.to_string(), fields)
        })
        .collect()
}

/// Writes `text` as `users.acl` in a fresh directory named for `name`:
/// the directory (for the test to remove) and the file's path, as
/// `--aclfile` takes it.
pub fn acl_file(name: &str, text: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("kvtier-acl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("users.acl");
    std::fs::write(&file, text).unwrap();
    (dir, file.display().to_string())
}

/// `GET /metrics`, body only (empty if the endpoint is not up yet).
pub fn scrape(port: u16) -> String {
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
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A tokio runtime for a test's async clients: on this thread, or on two
/// worker threads (`threaded`: tasks run while this thread waits).
pub fn runtime(threaded: bool) -> tokio::runtime::Runtime {
    let mut builder = if threaded {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().unwrap()
}
