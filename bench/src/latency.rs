//! `kvtier-bench latency`: one client's round trip, unpipelined, the way a
//! scheduler asks "how much of this prompt is cached?" and waits.
//!
//! Every target (kvtier builds and configurations, redis-server) is measured
//! by the same blocking client — one OS thread per connection, one request
//! in flight, no event loop of its own — in rounds that alternate the
//! targets, so a noisy neighbour hits them alike. Each cell reports p50,
//! p99, p99.9 and ops/s over all rounds, and the ratio of its p50 to
//! redis-server's.
//!
//! Operations (redis-server gets the nearest Redis equivalent):
//! * `get`, `exists`: one key per request, rotating over 64 keys spread
//!   over every slot range (so over every shard);
//! * `prefixlen`: `PREFIXLEN` of a 64-key chain (Redis: `EXISTS k1..k64`);
//! * `mgetprefix-64`, `mgetprefix-64k`, `mgetprefix-2m`: `MGETPREFIX` of
//!   64 × 64 B, 64 × 64 KiB and 32 × 2 MiB (Redis: `MGET` of the same keys);
//! * `msetblock-chain`: a prefill worker's store of a 64-block chain,
//!   `MSETBLOCK 64 × 4 KiB ... CHAIN REPLACE`, rotating over 256 chains
//!   (64 MiB: with a smaller `--maxmemory` on the server every write
//!   evicts, and under `prefix` sends link events across shards; Redis:
//!   `MSET` of the same keys);
//! * `tcp`: no server — two raw loopback TCP streams inside this process,
//!   the wire's ceiling for the large fetches: one between two 4 MiB
//!   buffers used again and again (warm in the cache), one between 64 MiB
//!   of memory at each end, what a 32 × 2 MiB reply touches.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use kvtier_protocol::{Reply, ReplyBuf, ReplyParser};

/// Options of `kvtier-bench latency`.
#[derive(Args, Debug, Clone)]
pub struct LatencyArgs {
    /// A server to measure, NAME=HOST:PORT (repeat). A name starting with
    /// `redis` is spoken to as Redis (EXISTS and MGET for the dialect).
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    /// Client counts to run each cell with.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub clients: Vec<usize>,
    /// Operations to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [Op::Get, Op::Exists, Op::Prefixlen, Op::Mgetprefix64, Op::Mgetprefix64k, Op::Tcp])]
    pub ops: Vec<Op>,
    /// Rounds; each round runs every target once per cell, in turn.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds per cell per target per round.
    #[arg(long, default_value_t = 0.4)]
    pub seconds: f64,
    /// Write every cell as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// GET of one 64 B value.
    Get,
    /// EXISTS of one key.
    Exists,
    /// PREFIXLEN of 64 keys (Redis: EXISTS of the 64 keys).
    Prefixlen,
    /// MGETPREFIX of 64 × 64 B (Redis: MGET).
    #[value(name = "mgetprefix-64")]
    Mgetprefix64,
    /// MGETPREFIX of 64 × 64 KiB (Redis: MGET).
    #[value(name = "mgetprefix-64k")]
    Mgetprefix64k,
    /// MGETPREFIX of 32 × 2 MiB (Redis: MGET).
    #[value(name = "mgetprefix-2m")]
    Mgetprefix2m,
    /// MSETBLOCK of a 64 × 4 KiB chain, CHAIN REPLACE, over 256 chains
    /// (Redis: MSET).
    #[value(name = "msetblock-chain")]
    MsetblockChain,
    /// A raw loopback TCP stream, no server (GB/s only).
    Tcp,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        f.write_str(&name)
    }
}

/// Bytes a read may take at once: big replies arrive in few system calls,
/// as in the raw stream they are compared with.
const READ_AHEAD: usize = 1 << 20;

/// Keys the single-key operations rotate over.
const SINGLE_KEYS: usize = 64;

/// Chains `msetblock-chain` rotates over, of 64 blocks of 4 KiB.
const WRITE_CHAINS: usize = 256;
const WRITE_BLOCKS: usize = 64;
const WRITE_BLOCK_BYTES: usize = 4096;

impl Op {
    /// (blocks, bytes per block) of a multi-key operation.
    fn chain(self) -> Option<(usize, usize)> {
        match self {
            Op::Prefixlen | Op::Mgetprefix64 => Some((64, 64)),
            Op::Mgetprefix64k => Some((64, 64 * 1024)),
            Op::Mgetprefix2m => Some((32, 2 * 1024 * 1024)),
            _ => None,
        }
    }

    /// Bytes of value one request returns (for GB/s).
    fn reply_bytes(self) -> usize {
        match self {
            Op::Get => 64,
            Op::Mgetprefix64 | Op::Mgetprefix64k | Op::Mgetprefix2m => {
                self.chain().map_or(0, |(n, len)| n * len)
            }
            _ => 0,
        }
    }

    fn chain_keys(self) -> Vec<Bytes> {
        let (n, len) = self.chain().unwrap_or((0, 0));
        (0..n)
            .map(|i| Bytes::from(format!("lat:chain:{len}:{i}")))
            .collect()
    }
}

fn single_key(i: usize) -> Bytes {
    Bytes::from(format!("lat:one:{i}"))
}

/// A target: a name and an address; `redis` speaks plain Redis.
#[derive(Debug, Clone)]
struct Target {
    name: String,
    addr: String,
    redis: bool,
}

fn parse_target(s: &str) -> io::Result<Target> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| io::Error::other(format!("--target {s}: expected NAME=HOST:PORT")))?;
    Ok(Target {
        name: name.to_string(),
        addr: addr.to_string(),
        redis: name.starts_with("redis"),
    })
}

/// A blocking connection: one request in flight.
struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    parser: ReplyParser<Reply>,
}

impl Conn {
    fn open(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}")))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            stream,
            rbuf: BytesMut::with_capacity(READ_AHEAD),
            // Small values are cut out of the read buffer (reads of up to
            // READ_AHEAD each); from 64 KiB on a value is read into a buffer
            // of its own, recycled from earlier replies, as a connector
            // reads a block into its destination. Cut out of the read
            // buffer instead, a 4 MiB reply's values held every 1 MiB
            // chunk of it until the reply was dropped, so each reply got
            // fresh chunks from the allocator, which the kernel zeroed and
            // mapped again: ~190 page faults per 64 × 64 KiB reply, 2.2
            // against 3.3 GB/s.
            parser: ReplyParser::new(),
        })
    }

    fn call(&mut self, request: &[u8]) -> io::Result<Reply> {
        self.stream.write_all(request)?;
        self.recv()
    }

    fn recv(&mut self) -> io::Result<Reply> {
        loop {
            if let Some(reply) = self.parser.parse(&mut self.rbuf)? {
                return Ok(reply);
            }
            let n = match self.parser.big_bulk_buffer() {
                Some(mut own) => read_buf(&mut self.stream, &mut own)?,
                None => {
                    if self.rbuf.capacity() - self.rbuf.len() < READ_AHEAD / 4 {
                        self.rbuf.reserve(READ_AHEAD);
                    }
                    // Between the big values of one reply, only the next
                    // header (as the Python connector reads): a read ahead
                    // would take payload that is then copied.
                    let want = match self.parser.read_hint() {
                        n if n < READ_AHEAD / 16 => n,
                        _ => READ_AHEAD,
                    };
                    read_buf(&mut self.stream, &mut (&mut self.rbuf).limit(want))?
                }
            };
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// `read` into the spare capacity of `buf` (no zeroing, no copy).
fn read_buf<B: bytes::BufMut>(stream: &mut TcpStream, buf: &mut B) -> io::Result<usize> {
    let chunk = buf.chunk_mut();
    // SAFETY: `read` only writes into the slice, and only the `n` bytes it
    // reports are marked initialised by `advance_mut`.
    let slice = unsafe { std::slice::from_raw_parts_mut(chunk.as_mut_ptr(), chunk.len()) };
    let n = stream.read(slice)?;
    // SAFETY: `read` initialised the first `n` bytes of the chunk.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

fn encode(args: &[Bytes]) -> Vec<u8> {
    let mut out = ReplyBuf::new();
    out.push_command(args);
    out.take_bytes()
}

fn numbered(cmd: &str, keys: &[Bytes]) -> Vec<Bytes> {
    let mut args = vec![
        Bytes::from(cmd.to_string()),
        Bytes::from(keys.len().to_string()),
    ];
    args.extend(keys.iter().cloned());
    args
}

/// The request(s) one client sends for `op` on `target`, and a check of a
/// reply.
fn requests(op: Op, target: &Target) -> Vec<Vec<u8>> {
    let redis = target.redis;
    match op {
        Op::Get | Op::Exists => (0..SINGLE_KEYS)
            .map(|i| {
                let cmd = if op == Op::Get { "GET" } else { "EXISTS" };
                encode(&[Bytes::from(cmd), single_key(i)])
            })
            .collect(),
        Op::Prefixlen | Op::Mgetprefix64 | Op::Mgetprefix64k | Op::Mgetprefix2m => {
            let (redis_cmd, dialect) = if op == Op::Prefixlen {
                ("EXISTS", "PREFIXLEN")
            } else {
                ("MGET", "MGETPREFIX")
            };
            let keys = op.chain_keys();
            let args = if redis {
                std::iter::once(Bytes::from(redis_cmd))
                    .chain(keys)
                    .collect()
            } else {
                numbered(dialect, &keys)
            };
            vec![encode(&args)]
        }
        Op::MsetblockChain => {
            let value = Bytes::from(vec![b'w'; WRITE_BLOCK_BYTES]);
            (0..WRITE_CHAINS)
                .map(|c| {
                    let mut args = if redis {
                        vec![Bytes::from("MSET")]
                    } else {
                        vec![
                            Bytes::from("MSETBLOCK"),
                            Bytes::from(WRITE_BLOCKS.to_string()),
                        ]
                    };
                    for i in 0..WRITE_BLOCKS {
                        args.push(Bytes::from(format!("lat:w:{c}:{i}")));
                        args.push(value.clone());
                    }
                    if !redis {
                        args.extend([Bytes::from("CHAIN"), Bytes::from("REPLACE")]);
                    }
                    encode(&args)
                })
                .collect()
        }
        Op::Tcp => Vec::new(),
    }
}

fn check(op: Op, reply: &Reply) -> io::Result<()> {
    let ok = match (op, reply) {
        (Op::Get, Reply::Bulk(b)) => b.len() == 64,
        (Op::Exists, Reply::Int(1)) => true,
        (Op::Prefixlen, Reply::Int(n)) => *n == 64,
        (Op::Mgetprefix64 | Op::Mgetprefix64k | Op::Mgetprefix2m, Reply::Array(items)) => {
            let (n, len) = op.chain().unwrap_or((0, 0));
            items.len() == n
                && items
                    .iter()
                    .all(|v| matches!(v, Reply::Bulk(b) if b.len() == len))
        }
        (Op::MsetblockChain, Reply::Status(s)) => s == "OK",
        (Op::MsetblockChain, Reply::Array(codes)) => {
            codes.len() == WRITE_BLOCKS
                && codes.iter().all(|c| matches!(c, Reply::Int(n) if *n >= 0))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{op}: unexpected reply {reply:?}"
        )))
    }
}

/// Stores what the operations read.
fn load(target: &Target, ops: &[Op]) -> io::Result<()> {
    let mut c = Conn::open(&target.addr)?;
    let value = Bytes::from(vec![b'v'; 64]);
    for i in 0..SINGLE_KEYS {
        let r = c.call(&encode(&[Bytes::from("SET"), single_key(i), value.clone()]))?;
        if r.is_error() {
            return Err(io::Error::other(format!("{}: SET: {r:?}", target.name)));
        }
    }
    for op in ops {
        let Some((_, len)) = op.chain() else { continue };
        let value = Bytes::from(vec![b'b'; len]);
        for key in op.chain_keys() {
            let r = c.call(&encode(&[Bytes::from("SET"), key, value.clone()]))?;
            if r.is_error() {
                return Err(io::Error::other(format!("{}: SET: {r:?}", target.name)));
            }
        }
    }
    Ok(())
}

/// What one cell of one round measured.
struct Sample {
    hist: Histogram<u64>,
    ops: u64,
    elapsed: Duration,
}

/// Runs `clients` blocking clients against `target` for `seconds`.
fn run_cell(target: &Target, op: Op, clients: usize, seconds: f64) -> io::Result<Sample> {
    let requests = Arc::new(requests(op, target));
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Conn::open(&target.addr)?);
    }
    let run_for = Duration::from_secs_f64(seconds);
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, mut conn)| {
            let requests = Arc::clone(&requests);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> io::Result<(Histogram<u64>, u64)> {
                let mut hist = new_hist();
                // A warm-up request, outside the measurement.
                check(op, &conn.call(&requests[id % requests.len()])?)?;
                barrier.wait();
                let start = Instant::now();
                let mut n = 0u64;
                // Chain writes: clients spread over the chains, so each
                // writes chains the others wrote least recently.
                let mut next = match op {
                    Op::MsetblockChain => id * requests.len() / clients,
                    _ => id,
                };
                while start.elapsed() < run_for {
                    let request = &requests[next % requests.len()];
                    next += 1;
                    let t = Instant::now();
                    let reply = conn.call(request)?;
                    let _ = hist.record(t.elapsed().as_nanos() as u64);
                    check(op, &reply)?;
                    if let Reply::Array(items) = reply {
                        for item in items {
                            if let Reply::Bulk(b) = item {
                                conn.parser.recycle(b);
                            }
                        }
                    }
                    n += 1;
                }
                Ok((hist, n))
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut hist = new_hist();
    let mut ops = 0;
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok((one, n))) => {
                let _ = hist.add(&one);
                ops += n;
            }
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(io::Error::other("a client thread panicked")),
        }
    }
    if let Some(e) = failure {
        return Err(io::Error::other(format!("{} {op}: {e}", target.name)));
    }
    Ok(Sample {
        hist,
        ops,
        elapsed: start.elapsed(),
    })
}

fn new_hist() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant figures; nanosecond units.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|_| Histogram::new(3).unwrap())
}

/// GB/s of a raw loopback TCP stream: one thread writes 4 MiB at a time
/// for `seconds` from `room` bytes of memory in turn, this one reads it
/// into `room` bytes in turn. With `room` 4 MiB both ends use one buffer
/// again and again, warm in the cache: the wire's best case. With 64 MiB
/// both ends touch what a 32 × 2 MiB reply touches: a server sending values
/// from 64 MiB of its memory, a client placing them in 64 MiB of its own.
fn raw_tcp(seconds: f64, room: usize) -> io::Result<f64> {
    const CHUNK: usize = 4 * 1024 * 1024;
    let room = room.max(CHUNK);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let run_for = Duration::from_secs_f64(seconds.max(0.2));
    let writer = std::thread::spawn(move || -> io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let data = vec![7u8; room];
        let start = Instant::now();
        let mut at = 0;
        while start.elapsed() < run_for {
            if s.write_all(&data[at..at + CHUNK]).is_err() {
                break;
            }
            at = (at + CHUNK) % room;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}")))?;
    let mut buf = vec![0u8; room];
    let mut at = 0;
    let start = Instant::now();
    let mut got = 0u64;
    loop {
        let end = (at + CHUNK).min(buf.len());
        let n = s.read(&mut buf[at..end])?;
        if n == 0 {
            break;
        }
        got += n as u64;
        at = if at + n >= buf.len() { 0 } else { at + n };
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = writer.join();
    Ok(got as f64 / secs / 1e9)
}

/// Bytes each end of the second raw stream goes through in turn (a 32 ×
/// 2 MiB reply's worth; a multiple of the 4 MiB writes).
const SPREAD_ROOM: usize = 64 << 20;

/// One cell's totals over every round.
struct Cell {
    target: String,
    op: Op,
    clients: usize,
    hist: Histogram<u64>,
    ops_per_sec: Vec<f64>,
}

impl Cell {
    fn p(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }

    fn median_ops(&self) -> f64 {
        median(&self.ops_per_sec)
    }
}

/// Runs every cell and prints the tables.
pub fn run(a: LatencyArgs) -> io::Result<()> {
    let targets: Vec<Target> = a
        .targets
        .iter()
        .map(|s| parse_target(s))
        .collect::<io::Result<_>>()?;
    let server_ops: Vec<Op> = a.ops.iter().copied().filter(|&o| o != Op::Tcp).collect();
    for t in &targets {
        load(t, &server_ops)?;
    }
    let mut cells: Vec<Cell> = Vec::new();
    let (mut tcp, mut tcp_spread) = (Vec::new(), Vec::new());
    for round in 0..a.rounds.max(1) {
        for &op in &a.ops {
            if op == Op::Tcp {
                tcp.push(raw_tcp(a.seconds, 0)?);
                tcp_spread.push(raw_tcp(a.seconds, SPREAD_ROOM)?);
                continue;
            }
            for &clients in &a.clients {
                // Alternate the order each round so no target always runs
                // right after the same neighbour.
                let order: Vec<&Target> = if round % 2 == 0 {
                    targets.iter().collect()
                } else {
                    targets.iter().rev().collect()
                };
                for t in order {
                    let s = run_cell(t, op, clients, a.seconds)?;
                    let rate = s.ops as f64 / s.elapsed.as_secs_f64();
                    match cells
                        .iter_mut()
                        .find(|c| c.target == t.name && c.op == op && c.clients == clients)
                    {
                        Some(c) => {
                            let _ = c.hist.add(&s.hist);
                            c.ops_per_sec.push(rate);
                        }
                        None => cells.push(Cell {
                            target: t.name.clone(),
                            op,
                            clients,
                            hist: s.hist,
                            ops_per_sec: vec![rate],
                        }),
                    }
                }
            }
        }
        eprintln!("round {} of {} done", round + 1, a.rounds.max(1));
    }
    print_tables(&a, &cells, &tcp, &tcp_spread);
    if let Some(path) = &a.json {
        std::fs::write(path, to_json(&cells, &tcp, &tcp_spread).to_string())?;
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn print_tables(a: &LatencyArgs, cells: &[Cell], tcp: &[f64], tcp_spread: &[f64]) {
    let redis_of = |op: Op, clients: usize| {
        cells
            .iter()
            .find(|c| c.op == op && c.clients == clients && c.target.starts_with("redis"))
    };
    println!(
        "| op | clients | target | p50 µs | p99 µs | p99.9 µs | ops/s | GB/s | p50 / redis p50 | p50 / redis GET p50 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &op in a.ops.iter().filter(|&&o| o != Op::Tcp) {
        for &clients in &a.clients {
            let redis = redis_of(op, clients);
            let redis_get = redis_of(Op::Get, clients);
            for c in cells.iter().filter(|c| c.op == op && c.clients == clients) {
                let ratio = |r: Option<&Cell>| {
                    r.map(|r| format!("{:.2}x", c.p(0.5) / r.p(0.5)))
                        .unwrap_or_else(|| "-".into())
                };
                let gbs = c.median_ops() * op.reply_bytes() as f64 / 1e9;
                println!(
                    "| {op} | {clients} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {} | {} |",
                    c.target,
                    c.p(0.5),
                    c.p(0.99),
                    c.p(0.999),
                    c.median_ops(),
                    if op.reply_bytes() >= 4096 {
                        format!("{gbs:.2}")
                    } else {
                        "-".into()
                    },
                    ratio(redis),
                    ratio(redis_get),
                );
            }
        }
    }
    if !tcp.is_empty() {
        let (wire, spread) = (median(tcp), median(tcp_spread));
        println!();
        println!(
            "raw loopback TCP stream: {wire:.2} GB/s between 4 MiB buffers, {spread:.2} GB/s between 64 MiB of memory at each end (medians of {} runs)",
            tcp.len()
        );
        for c in cells
            .iter()
            .filter(|c| c.clients == 1 && c.op.reply_bytes() >= 1 << 20)
        {
            let gbs = c.median_ops() * c.op.reply_bytes() as f64 / 1e9;
            // This machine's stream speed drifts from minute to minute:
            // each round's cell against the same round's stream, too.
            let paired = |streams: &[f64]| -> Vec<f64> {
                c.ops_per_sec
                    .iter()
                    .zip(streams)
                    .map(|(ops, wire)| ops * c.op.reply_bytes() as f64 / 1e9 / wire)
                    .collect()
            };
            let (by_round, by_round_spread) = (paired(tcp), paired(tcp_spread));
            println!(
                "{} {} one connection: {gbs:.2} GB/s = {:.2} of the 4 MiB stream (per round: median {:.2}, range {:.2}-{:.2}), {:.2} of the 64 MiB one (per round: median {:.2})",
                c.target,
                c.op,
                gbs / wire,
                median(&by_round),
                by_round.iter().copied().fold(f64::INFINITY, f64::min),
                by_round.iter().copied().fold(0.0, f64::max),
                gbs / spread,
                median(&by_round_spread),
            );
        }
    }
}

fn to_json(cells: &[Cell], tcp: &[f64], tcp_spread: &[f64]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            serde_json::json!({
                "target": c.target,
                "op": c.op.to_string(),
                "clients": c.clients,
                "p50_us": c.p(0.5),
                "p99_us": c.p(0.99),
                "p999_us": c.p(0.999),
                "ops_per_sec": c.median_ops(),
                "ops_per_sec_rounds": c.ops_per_sec,
                "reply_bytes": c.op.reply_bytes(),
            })
        })
        .collect();
    serde_json::json!({ "cells": rows, "tcp_gbps": tcp, "tcp_spread_gbps": tcp_spread })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_targets_get_redis_commands() {
        let redis = parse_target("redis=127.0.0.1:1").unwrap();
        let kv = parse_target("kvtier=127.0.0.1:2").unwrap();
        assert!(redis.redis && !kv.redis);
        let r = String::from_utf8(requests(Op::Prefixlen, &redis).remove(0)).unwrap();
        let k = String::from_utf8(requests(Op::Prefixlen, &kv).remove(0)).unwrap();
        assert!(r.starts_with("*65\r\n$6\r\nEXISTS\r\n"), "{r}");
        assert!(
            k.starts_with("*66\r\n$9\r\nPREFIXLEN\r\n$2\r\n64\r\n"),
            "{k}"
        );
        let m = String::from_utf8(requests(Op::Mgetprefix64k, &redis).remove(0)).unwrap();
        assert!(m.starts_with("*65\r\n$4\r\nMGET\r\n"), "{m}");
        assert_eq!(requests(Op::Get, &kv).len(), SINGLE_KEYS);
        assert!(parse_target("nope").is_err());
    }

    #[test]
    fn checks_refuse_short_replies() {
        assert!(check(Op::Prefixlen, &Reply::Int(64)).is_ok());
        assert!(check(Op::Prefixlen, &Reply::Int(63)).is_err());
        let short = Reply::Array(vec![Reply::Bulk(Bytes::from(vec![0u8; 64])); 63]);
        assert!(check(Op::Mgetprefix64, &short).is_err());
        assert!(check(Op::Get, &Reply::Nil).is_err());
    }

    #[test]
    fn raw_tcp_moves_bytes() {
        assert!(raw_tcp(0.2, 0).unwrap() > 0.0);
        assert!(raw_tcp(0.2, SPREAD_ROOM).unwrap() > 0.0);
    }
}
