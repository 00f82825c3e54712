//! `kvtier-bench trace FILE`: replays a Mooncake-format request trace the
//! way a KV-cache connector would: look up the request's block chain, fetch
//! the cached prefix, store the missing suffix. Three ways to talk to the
//! server: kvtier's dialect, the sequential EXISTS/GET/SET of LMCache's Redis
//! connector, and pipelined EXISTS/MGET/MSET.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use kvtier_protocol::Reply;
use serde_json::json;

use crate::common::{check_verified, fail_on_error, flag_name, require_dialect, Output};
use crate::report::{self, Recorder};
use crate::resp::Client;
use crate::workload::{parse_size, value_size, ValuePool};

/// How the client talks to the server.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// PREFIXLEN, MGETPREFIX, MSETBLOCK CHAIN (kvtier).
    Dialect,
    /// One EXISTS per block in order, then GETs, then SETs (LMCache's Redis connector).
    RedisSequential,
    /// Pipelined EXISTS, one MGET, one MSET.
    RedisPipelined,
}

/// Published KV-cache sizes per token (fp16 K and V, all layers).
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Model {
    /// 32 layers × 8 KV heads × 128 dims × 2 (K,V) × 2 bytes = 128 KiB.
    Llama3_8b,
    /// 80 layers × 8 KV heads × 128 × 2 × 2 = 320 KiB.
    Llama3_70b,
    /// 32 layers × 8 KV heads × 128 × 2 × 2 = 128 KiB.
    Mistral7b,
    /// 28 layers × 4 KV heads × 128 × 2 × 2 = 56 KiB.
    Qwen2_7b,
}

impl Model {
    fn bytes_per_token(self) -> usize {
        match self {
            Model::Llama3_8b | Model::Mistral7b => 131_072,
            Model::Llama3_70b => 327_680,
            Model::Qwen2_7b => 57_344,
        }
    }
}

/// Options of `kvtier-bench trace`.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    #[command(flatten)]
    pub out: Output,
    /// Mooncake-format JSONL trace (timestamp ms, input_length, output_length, hash_ids).
    pub file: PathBuf,
    /// How to talk to the server.
    #[arg(long, value_enum, default_value = "dialect")]
    pub protocol: Protocol,
    /// Tokens per block (the trace's hash_ids are 512-token blocks).
    #[arg(long, default_value_t = 512)]
    pub block_tokens: usize,
    /// KV-cache bytes per token (default 128: 64 KiB blocks, small enough to
    /// replay the whole trace on a laptop).
    #[arg(long)]
    pub bytes_per_token: Option<usize>,
    /// Bytes per token from a model preset.
    #[arg(long, value_enum, conflicts_with = "bytes_per_token")]
    pub model: Option<Model>,
    /// Block size, overriding the two options above (e.g. 2MiB).
    #[arg(long)]
    pub block_bytes: Option<String>,
    /// Honour the trace's timestamps, sped up this many times.
    #[arg(long, conflicts_with = "as_fast_as_possible")]
    pub speed: Option<f64>,
    /// Ignore timestamps (the default when --speed is not given).
    #[arg(long)]
    pub as_fast_as_possible: bool,
    /// Requests in flight (one connection each).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Prefill speed used to turn hit tokens into saved time.
    #[arg(long, default_value_t = 10_000.0)]
    pub prefill_tokens_per_s: f64,
    /// Key prefix for blocks (equal hash ids give equal keys).
    #[arg(long, default_value = "kvt:")]
    pub key_prefix: String,
    /// TTL in seconds for stored blocks (none by default).
    #[arg(long)]
    pub ttl: Option<u64>,
    /// Do not flag a request's final partial block with MSETBLOCK PARTIAL
    /// (for servers older than the option).
    #[arg(long)]
    pub no_partial_hint: bool,
    /// Another tenant's flood: after each request, its connection writes
    /// this many times the bytes the request stored, as chains of blocks
    /// that are never read again (keys under --flood-prefix). A tenant of
    /// unique prompts at a fixed multiple of this one's byte rate, the same
    /// whatever the timing (scripts/bench-tenants.sh). 0: none.
    #[arg(long, default_value_t = 0.0)]
    pub flood_ratio: f64,
    /// Key prefix of the flood's blocks.
    #[arg(long, default_value = "flood:")]
    pub flood_prefix: String,
}

/// One request of the trace.
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// Arrival, milliseconds from the start.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Chain of block ids (each id stands for its whole prefix).
    pub hash_ids: Vec<u64>,
}

/// Whether the request's last block is partial: its prompt is not a whole
/// number of blocks (nearly every request). Stored with MSETBLOCK PARTIAL,
/// as a connector does for a request's final, partial chunk.
pub fn ends_partial(r: &TraceRequest, block_tokens: usize) -> bool {
    !r.input_length.is_multiple_of(block_tokens.max(1) as u64)
}

/// Reads a Mooncake JSONL trace.
pub fn load(path: &PathBuf, limit: Option<usize>) -> std::io::Result<Vec<TraceRequest>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot read trace {}: {e}", path.display()),
        )
    })?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| std::io::Error::other(format!("{}:{}: {e}", path.display(), n + 1)))?;
        let field = |name: &str| {
            v.get(name).ok_or_else(|| {
                std::io::Error::other(format!("{}:{}: no '{name}'", path.display(), n + 1))
            })
        };
        let hash_ids = field("hash_ids")?
            .as_array()
            .ok_or_else(|| std::io::Error::other("hash_ids is not an array"))?
            .iter()
            .filter_map(|x| x.as_u64())
            .collect();
        out.push(TraceRequest {
            timestamp_ms: field("timestamp")?.as_f64().unwrap_or(0.0) as u64,
            input_length: field("input_length")?.as_u64().unwrap_or(0),
            hash_ids,
        });
    }
    Ok(out)
}

/// Block-level prefix hit rate with unlimited memory and requests served in
/// order: the best any cache can do on this trace.
pub fn ideal_hit_rate(requests: &[TraceRequest]) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let (mut hits, mut total) = (0u64, 0u64);
    for r in requests {
        total += r.hash_ids.len() as u64;
        hits += r
            .hash_ids
            .iter()
            .take_while(|id| seen.contains(*id))
            .count() as u64;
        seen.extend(r.hash_ids.iter().copied());
    }
    hits as f64 / total.max(1) as f64
}

struct Replay {
    requests: Vec<TraceRequest>,
    /// Each request's block keys, built once (equal ids share one key).
    keys: Vec<Vec<Bytes>>,
    /// Decimal `0..=longest chain`, for the `numkeys` arguments.
    numbers: Vec<Bytes>,
    protocol: Protocol,
    block_bytes: usize,
    block_tokens: usize,
    /// Send MSETBLOCK PARTIAL for a request's final partial block.
    partial_hint: bool,
    pool: ValuePool,
    ttl: Option<Bytes>,
    speed: Option<f64>,
    next: AtomicUsize,
    flood_ratio: f64,
    flood_prefix: String,
}

/// Blocks of the flood (--flood-ratio) per MSETBLOCK: one unique prompt.
const FLOOD_CHAIN: usize = 16;

/// One worker's flood: bytes it still owes and the next key's number.
struct Flood {
    worker: usize,
    owed: f64,
    next: u64,
}

impl Replay {
    fn new(
        a: &TraceArgs,
        requests: Vec<TraceRequest>,
        block_bytes: usize,
    ) -> Result<Replay, String> {
        let mut interned: std::collections::HashMap<u64, Bytes> = Default::default();
        let keys = requests
            .iter()
            .map(|r| {
                r.hash_ids
                    .iter()
                    .map(|&id| {
                        interned
                            .entry(id)
                            .or_insert_with(|| Bytes::from(format!("{}{id}", a.key_prefix)))
                            .clone()
                    })
                    .collect()
            })
            .collect();
        let longest = requests.iter().map(|r| r.hash_ids.len()).max().unwrap_or(0);
        Ok(Replay {
            pool: ValuePool::new(block_bytes, "the trace's block size")?,
            keys,
            numbers: (0..=longest.max(FLOOD_CHAIN))
                .map(|n| Bytes::from(n.to_string()))
                .collect(),
            requests,
            protocol: a.protocol,
            block_bytes,
            block_tokens: a.block_tokens,
            partial_hint: !a.no_partial_hint,
            ttl: a.ttl.map(|s| Bytes::from(s.to_string())),
            speed: if a.as_fast_as_possible { None } else { a.speed },
            next: AtomicUsize::new(0),
            flood_ratio: a.flood_ratio.max(0.0),
            flood_prefix: a.flood_prefix.clone(),
        })
    }
}

/// Runs the replay and reports.
pub async fn run(a: TraceArgs, client_threads: usize) -> std::io::Result<()> {
    let addr = a.out.addr();
    if a.protocol == Protocol::Dialect {
        require_dialect(&addr).await?;
    }
    let requests = load(&a.file, a.limit)?;
    let block_bytes = match &a.block_bytes {
        Some(s) => parse_size(s).map_err(std::io::Error::other)?,
        None => {
            let per_token = a
                .model
                .map(Model::bytes_per_token)
                .or(a.bytes_per_token)
                .unwrap_or(128);
            a.block_tokens.saturating_mul(per_token)
        }
    };
    value_size(
        block_bytes,
        "--block-tokens × --bytes-per-token (or --block-bytes)",
    )
    .map_err(std::io::Error::other)?;
    let ideal = ideal_hit_rate(&requests);
    let replay = Arc::new(Replay::new(&a, requests, block_bytes).map_err(std::io::Error::other)?);
    let start = Instant::now();
    let cpu_before = report::cpu_time();
    let shared = Arc::new(Mutex::new(Recorder::new(start)));
    let total = replay.requests.len() as u64;
    let bar = report::Progress::new("requests", total, total as f64 / 200.0);
    let mut tasks = Vec::new();
    for i in 0..a.concurrency.max(1) {
        let client = Client::connect(&a.out.addr_for(i)).await?;
        let (replay, shared) = (Arc::clone(&replay), Arc::clone(&shared));
        tasks.push(tokio::spawn(async move {
            worker(client, replay, shared, start, i).await
        }));
    }
    while !tasks.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = replay.next.load(Relaxed).min(total as usize) as u64;
        bar.set(started, started);
    }
    let (rec, wall, cpu) =
        report::finish_run(tasks, &bar, shared, cpu_before, client_threads).await?;
    let secs = wall.as_secs_f64();
    let c = |name| rec.count(name);
    let hit_rate = c("hit_blocks") as f64 / c("blocks").max(1) as f64;
    let token_rate = c("hit_tokens") as f64 / c("tokens").max(1) as f64;
    let moved = c("bytes_read") + c("bytes_written");
    let saved = c("hit_tokens") as f64 / a.prefill_tokens_per_s;
    println!(
        "trace: {} requests, {} blocks of {} bytes, protocol {}, concurrency {}, against {addr}",
        c("requests"),
        c("blocks"),
        block_bytes,
        flag_name(&a.protocol),
        a.concurrency
    );
    println!(
        "block hit rate {hit_rate:.3} (unlimited-memory maximum {ideal:.3}), token hit rate {token_rate:.3}"
    );
    println!(
        "{:.1} requests/s, {:.3} GB/s moved ({} read, {} written), verification failures {}, errors {}",
        c("requests") as f64 / secs,
        moved as f64 / secs / 1e9,
        c("bytes_read"),
        c("bytes_written"),
        c("verify_failures"),
        c("errors")
    );
    println!(
        "estimated prefill time saved: {saved:.1} s at {} tokens/s",
        a.prefill_tokens_per_s
    );
    let summary = json!({
        "target": addr,
        "trace": a.file.display().to_string(),
        "protocol": flag_name(&a.protocol),
        "concurrency": a.concurrency,
        "speed": a.speed,
        "block_tokens": a.block_tokens,
        "block_bytes": block_bytes,
        "requests": c("requests"),
        "blocks": c("blocks"),
        "hit_blocks": c("hit_blocks"),
        "block_hit_rate": hit_rate,
        "ideal_block_hit_rate": ideal,
        "tokens": c("tokens"),
        "hit_tokens": c("hit_tokens"),
        "token_hit_rate": token_rate,
        "blocks_written": c("blocks_written"),
        "blocks_stored": c("blocks_stored"),
        "flood_ratio": a.flood_ratio,
        "flood_bytes_written": c("flood_bytes_written"),
        "flood_blocks_stored": c("flood_blocks_stored"),
        "bytes_read": c("bytes_read"),
        "bytes_written": c("bytes_written"),
        "seconds": secs,
        "requests_per_sec": c("requests") as f64 / secs,
        "gb_per_sec": moved as f64 / secs / 1e9,
        "read_gb_per_sec": c("bytes_read") as f64 / secs / 1e9,
        "write_gb_per_sec": c("bytes_written") as f64 / secs / 1e9,
        "verification_failures": c("verify_failures"),
        "errors": c("errors"),
        "prefill_tokens_per_s": a.prefill_tokens_per_s,
        "prefill_seconds_saved": saved,
        "blocks_per_second": rec.series.get("blocks"),
        "hit_blocks_per_second": rec.series.get("hit_blocks"),
    });
    let summary = a.out.publish("trace", &rec, cpu, summary)?;
    check_verified(&summary)
}

async fn worker(
    mut client: Client,
    replay: Arc<Replay>,
    shared: report::Shared,
    start: Instant,
    id: usize,
) -> std::io::Result<()> {
    let mut rec = Recorder::new(start);
    let mut cmd = Vec::new();
    let mut flood = Flood {
        worker: id,
        owed: 0.0,
        next: 0,
    };
    loop {
        let i = replay.next.fetch_add(1, Relaxed);
        let Some(req) = replay.requests.get(i) else {
            break;
        };
        // With timestamps honoured, a request's latency runs from when it
        // was due, not from when a connection got free to send it: a slow
        // server must not hide the queueing it causes (coordinated omission).
        let began = match replay.speed {
            Some(speed) => {
                let due = start + Duration::from_secs_f64(req.timestamp_ms as f64 / 1000.0 / speed);
                tokio::time::sleep_until(due.into()).await;
                due
            }
            None => Instant::now(),
        };
        let stored = serve(&mut client, &replay, i, &mut cmd, &mut rec).await?;
        rec.op("request", began.elapsed());
        if replay.flood_ratio > 0.0 {
            flood.owed += stored as f64 * replay.flood_ratio;
            write_flood(&mut client, &replay, &mut flood, &mut cmd, &mut rec).await?;
        }
    }
    if let Ok(mut all) = shared.lock() {
        all.merge(rec);
    }
    Ok(())
}

/// An error reply to a lookup or fetch, as an error: never a miss.
fn reply_or_fail(v: Reply, what: &str) -> std::io::Result<Reply> {
    fail_on_error(&v, what)?;
    Ok(v)
}

/// The flood's blocks that `flood` owes, as chains of [`FLOOD_CHAIN`]
/// unique blocks (the last one possibly shorter), stored like any prompt's.
async fn write_flood(
    client: &mut Client,
    replay: &Replay,
    flood: &mut Flood,
    cmd: &mut Vec<Bytes>,
    rec: &mut Recorder,
) -> std::io::Result<()> {
    let block = replay.block_bytes as f64;
    while flood.owed >= block {
        let n = ((flood.owed / block) as usize).min(FLOOD_CHAIN);
        let dialect = replay.protocol == Protocol::Dialect;
        cmd.clear();
        if dialect {
            cmd.extend([Bytes::from_static(b"MSETBLOCK"), replay.numbers[n].clone()]);
        } else {
            cmd.push(Bytes::from_static(b"MSET"));
        }
        for _ in 0..n {
            let key = Bytes::from(format!(
                "{}{}-{}",
                replay.flood_prefix, flood.worker, flood.next
            ));
            flood.next += 1;
            let value = replay.pool.value(&key, replay.block_bytes);
            cmd.extend([key, value]);
        }
        if dialect {
            cmd.push(Bytes::from_static(b"CHAIN"));
        }
        let v = client.call(cmd).await?;
        fail_on_error(&v, "flood")?;
        let stored = match v {
            Reply::Array(codes) => codes.iter().filter(|c| c.as_int() == Some(1)).count(),
            _ => n,
        };
        rec.add("flood_bytes_written", (n * replay.block_bytes) as u64);
        rec.add("flood_blocks_stored", stored as u64);
        flood.owed -= n as f64 * block;
    }
    Ok(())
}

/// One request (index `i`): lookup, fetch the hit prefix, store the
/// missing suffix; the bytes it wrote. `cmd` is the worker's reusable
/// argument list.
async fn serve(
    client: &mut Client,
    replay: &Replay,
    i: usize,
    cmd: &mut Vec<Bytes>,
    rec: &mut Recorder,
) -> std::io::Result<usize> {
    let req = &replay.requests[i];
    let keys = &replay.keys[i][..];
    let n = keys.len();
    let count = |n: usize| replay.numbers[n].clone();

    // Lookup.
    let t = Instant::now();
    let found = match replay.protocol {
        Protocol::Dialect => {
            cmd.clear();
            cmd.extend([Bytes::from_static(b"PREFIXLEN"), count(n)]);
            cmd.extend(keys.iter().cloned());
            let v = reply_or_fail(client.call(cmd).await?, "PREFIXLEN")?;
            v.as_int().unwrap_or(0).max(0) as usize
        }
        Protocol::RedisSequential => {
            let mut h = 0;
            for k in keys {
                let v = client
                    .call(&[Bytes::from_static(b"EXISTS"), k.clone()])
                    .await?;
                if reply_or_fail(v, "EXISTS")?.as_int() != Some(1) {
                    break;
                }
                h += 1;
            }
            h
        }
        Protocol::RedisPipelined => {
            for k in keys {
                client.send(&[Bytes::from_static(b"EXISTS"), k.clone()]);
            }
            client.flush().await?;
            let mut h = None;
            for i in 0..n {
                let v = reply_or_fail(client.recv().await?, "EXISTS")?;
                if h.is_none() && v.as_int() != Some(1) {
                    h = Some(i);
                }
            }
            h.unwrap_or(n)
        }
    };
    rec.latency("lookup", t.elapsed());

    // Fetch the hit prefix, verifying every block.
    let mut hits = 0;
    if found > 0 {
        let t = Instant::now();
        let values: Vec<Reply> = match replay.protocol {
            Protocol::Dialect => {
                cmd.clear();
                cmd.extend([Bytes::from_static(b"MGETPREFIX"), count(found)]);
                cmd.extend(keys[..found].iter().cloned());
                let v = reply_or_fail(client.call(cmd).await?, "MGETPREFIX")?;
                v.into_array().unwrap_or_default()
            }
            Protocol::RedisSequential => {
                let mut out = Vec::with_capacity(found);
                for k in &keys[..found] {
                    let v = client
                        .call(&[Bytes::from_static(b"GET"), k.clone()])
                        .await?;
                    let v = reply_or_fail(v, "GET")?;
                    let miss = v == Reply::Nil;
                    out.push(v);
                    if miss {
                        break;
                    }
                }
                out
            }
            Protocol::RedisPipelined => {
                cmd.clear();
                cmd.push(Bytes::from_static(b"MGET"));
                cmd.extend(keys[..found].iter().cloned());
                let v = reply_or_fail(client.call(cmd).await?, "MGET")?;
                v.into_array().unwrap_or_default()
            }
        };
        rec.latency("fetch", t.elapsed());
        for (k, v) in keys.iter().zip(&values) {
            let Reply::Bulk(got) = v else { break };
            hits += 1;
            rec.add("bytes_read", got.len() as u64);
            if !replay.pool.verify(k, replay.block_bytes, got) {
                rec.add("verify_failures", 1);
            }
        }
        client.recycle(Reply::Array(values));
    }
    rec.add("requests", 1);
    rec.tally("blocks", n as u64);
    rec.tally("hit_blocks", hits as u64);
    rec.add("tokens", req.input_length);
    rec.add(
        "hit_tokens",
        ((hits * replay.block_tokens) as u64).min(req.input_length),
    );

    // Store the missing suffix.
    if hits < n {
        let t = Instant::now();
        let suffix = &keys[hits..];
        let value = |k: &Bytes| replay.pool.value(k, replay.block_bytes);
        let ttl = &replay.ttl;
        let stored = match replay.protocol {
            Protocol::Dialect => {
                cmd.clear();
                cmd.extend([Bytes::from_static(b"MSETBLOCK"), count(suffix.len())]);
                for k in suffix {
                    cmd.push(k.clone());
                    cmd.push(value(k));
                }
                if let Some(ttl) = ttl {
                    cmd.extend([Bytes::from_static(b"EX"), ttl.clone()]);
                }
                cmd.push(Bytes::from_static(b"CHAIN"));
                if hits > 0 {
                    cmd.extend([Bytes::from_static(b"PARENT"), keys[hits - 1].clone()]);
                }
                if replay.partial_hint && ends_partial(req, replay.block_tokens) {
                    cmd.push(Bytes::from_static(b"PARTIAL"));
                }
                let v = client.call(cmd).await?;
                fail_on_error(&v, "MSETBLOCK")?;
                let codes = v.into_array().unwrap_or_default();
                codes.iter().filter(|c| c.as_int() == Some(1)).count()
            }
            Protocol::RedisSequential => {
                let mut ok = 0;
                for k in suffix {
                    cmd.clear();
                    cmd.extend([Bytes::from_static(b"SET"), k.clone(), value(k)]);
                    if let Some(ttl) = ttl {
                        cmd.extend([Bytes::from_static(b"EX"), ttl.clone()]);
                    }
                    match client.call(cmd).await? {
                        Reply::Error(_) => rec.add("errors", 1),
                        _ => ok += 1,
                    }
                }
                ok
            }
            Protocol::RedisPipelined => {
                cmd.clear();
                cmd.push(Bytes::from_static(b"MSET"));
                for k in suffix {
                    cmd.push(k.clone());
                    cmd.push(value(k));
                }
                client.send(cmd);
                if let Some(ttl) = ttl {
                    for k in suffix {
                        client.send(&[Bytes::from_static(b"EXPIRE"), k.clone(), ttl.clone()]);
                    }
                }
                client.flush().await?;
                let ok = match client.recv().await? {
                    Reply::Error(_) => {
                        rec.add("errors", 1);
                        0
                    }
                    _ => suffix.len(),
                };
                if ttl.is_some() {
                    for _ in suffix {
                        client.recv().await?;
                    }
                }
                ok
            }
        };
        rec.latency("store", t.elapsed());
        rec.add("blocks_written", suffix.len() as u64);
        rec.add("blocks_stored", stored as u64);
        rec.add("bytes_written", (suffix.len() * replay.block_bytes) as u64);
        return Ok(suffix.len() * replay.block_bytes);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_rate_counts_leading_seen_ids() {
        let r = |ids: &[u64]| TraceRequest {
            timestamp_ms: 0,
            input_length: 512 * ids.len() as u64,
            hash_ids: ids.to_vec(),
        };
        // 0 of 3, then 2 of 3 (0,1 seen; 9 new), then 1 of 2 (0 seen; 5 new).
        let reqs = vec![r(&[0, 1, 2]), r(&[0, 1, 9]), r(&[0, 5])];
        assert!((ideal_hit_rate(&reqs) - 3.0 / 8.0).abs() < 1e-9);
    }
}
