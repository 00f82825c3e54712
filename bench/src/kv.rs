//! `kvtier-bench kv`: memtier-style GET/SET/MGET load with uniform, Zipf or
//! Gaussian key choice, fixed or ranged value sizes, pipelining, and every
//! value read back verified byte for byte.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use kvtier_protocol::Reply;
use serde_json::json;

use crate::common::{fail_on_error, Output};
use crate::report::{self, Recorder};
use crate::resp::Client;
use crate::workload::{KeyChooser, Rng, SizeRange, ValuePool, Zipf};

/// Options of `kvtier-bench kv`.
#[derive(Args, Debug, Clone)]
pub struct KvArgs {
    #[command(flatten)]
    pub out: Output,
    /// Operation mix SET:GET[:MGET], e.g. 1:10 or 1:8:1.
    #[arg(long, default_value = "1:10")]
    pub ratio: String,
    /// Keys per MGET.
    #[arg(long, default_value_t = 10)]
    pub mget_keys: usize,
    /// Size of the key space.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Zipf key choice with this exponent (e.g. 0.99) instead of uniform.
    #[arg(long, conflicts_with = "gaussian")]
    pub zipf: Option<f64>,
    /// Gaussian key choice around the middle, sigma = this fraction of the key space.
    #[arg(long)]
    pub gaussian: Option<f64>,
    /// Value size, fixed (64KiB) or a range (1KiB-64KiB, fixed per key).
    #[arg(long, default_value = "64KiB")]
    pub value_size: String,
    /// Connections.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Run this many seconds...
    #[arg(long)]
    pub duration: Option<f64>,
    /// ...or this many requests (default: 100000).
    #[arg(long)]
    pub requests: Option<u64>,
    /// SET every key once before measuring.
    #[arg(long)]
    pub prefill: bool,
    /// Key name prefix.
    #[arg(long, default_value = "kv:")]
    pub key_prefix: String,
    /// Pace the load to this many requests per second in all (0: as fast
    /// as the server answers), e.g. for a steady background load.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

#[derive(Clone, Copy)]
enum Op {
    Set,
    Get,
    Mget,
}

struct Plan {
    keys: Vec<Bytes>,
    chooser: KeyChooser,
    sizes: SizeRange,
    pool: ValuePool,
    weights: [u64; 3],
    mget_keys: usize,
    pipeline: usize,
    /// Time between two requests of one connection, when paced.
    interval: Option<Duration>,
}

impl Plan {
    fn pick_op(&self, rng: &mut Rng) -> Op {
        let total: u64 = self.weights.iter().sum();
        let r = rng.below(total);
        if r < self.weights[0] {
            Op::Set
        } else if r < self.weights[0] + self.weights[1] {
            Op::Get
        } else {
            Op::Mget
        }
    }
}

fn parse_ratio(s: &str) -> Result<[u64; 3], String> {
    let parts: Vec<u64> = s
        .split(':')
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .map_err(|_| format!("bad --ratio '{s}'"))
        })
        .collect::<Result<_, _>>()?;
    let w = match parts.as_slice() {
        [s, g] => [*s, *g, 0],
        [s, g, m] => [*s, *g, *m],
        _ => return Err(format!("--ratio is SET:GET or SET:GET:MGET, not '{s}'")),
    };
    if w.iter().sum::<u64>() == 0 {
        return Err("--ratio must not be all zero".into());
    }
    Ok(w)
}

impl Plan {
    /// The plan of a run from its options.
    fn new(a: &KvArgs) -> std::io::Result<Plan> {
        let sizes = SizeRange::parse(&a.value_size).map_err(std::io::Error::other)?;
        let weights = parse_ratio(&a.ratio).map_err(std::io::Error::other)?;
        let chooser = match (a.zipf, a.gaussian) {
            (Some(s), _) => KeyChooser::Zipf(Zipf::new(a.keys, s)),
            (None, Some(f)) => KeyChooser::Gaussian {
                keys: a.keys,
                sigma: a.keys as f64 * f,
            },
            _ => KeyChooser::Uniform { keys: a.keys },
        };
        Ok(Plan {
            keys: (0..a.keys)
                .map(|i| Bytes::from(format!("{}{i}", a.key_prefix)))
                .collect(),
            chooser,
            sizes,
            pool: ValuePool::new(sizes.max, "--value-size").map_err(std::io::Error::other)?,
            weights,
            mget_keys: a.mget_keys.max(1),
            pipeline: a.pipeline.max(1),
            interval: (a.rate > 0.0)
                .then(|| Duration::from_secs_f64(a.connections.max(1) as f64 / a.rate)),
        })
    }
}

/// SETs every key of `a`'s key space once (what `--prefill` does), so a
/// caller can load the key space outside its own measurement.
pub async fn prefill_keys(a: &KvArgs) -> std::io::Result<()> {
    let plan = Arc::new(Plan::new(a)?);
    let mut clients = Vec::new();
    for i in 0..a.connections.clamp(1, 16) {
        clients.push(Client::connect(&a.out.addr_for(i)).await?);
    }
    prefill(&plan, &mut clients).await
}

/// Runs the scenario; returns the JSON summary (also written to --json).
/// Verification failures are in the summary, not an error: the caller
/// decides (`common::check_verified`).
pub async fn run(a: KvArgs, client_threads: usize) -> std::io::Result<serde_json::Value> {
    let addr = a.out.target.clone();
    let plan = Arc::new(Plan::new(&a)?);
    let mut clients = Vec::with_capacity(a.connections);
    for i in 0..a.connections.max(1) {
        clients.push(Client::connect(&a.out.addr_for(i)).await?);
    }
    if a.prefill {
        prefill(&plan, &mut clients).await?;
    }
    let budget = match (a.duration, a.requests) {
        (Some(_), None) => u64::MAX,
        (_, Some(n)) => n,
        (None, None) => 100_000,
    };
    let remaining = Arc::new(AtomicU64::new(budget));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let cpu_before = report::cpu_time();
    let shared = Arc::new(Mutex::new(Recorder::new(start)));
    let expected_secs = a.duration.unwrap_or(budget as f64 / 50_000.0);
    let bar = report::Progress::new(
        "ops",
        if a.duration.is_some() {
            expected_secs as u64
        } else {
            budget
        },
        expected_secs,
    );
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (plan, remaining, stop, shared) = (
            Arc::clone(&plan),
            Arc::clone(&remaining),
            Arc::clone(&stop),
            Arc::clone(&shared),
        );
        tasks.push(tokio::spawn(async move {
            worker(i as u64, client, plan, remaining, stop, shared, start).await
        }));
    }
    if let Some(secs) = a.duration {
        let deadline = start + Duration::from_secs_f64(secs);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            bar.set(start.elapsed().as_secs(), budget - remaining.load(Relaxed));
        }
        stop.store(true, Relaxed);
    } else {
        while !tasks.iter().all(|t| t.is_finished()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let done = budget - remaining.load(Relaxed).min(budget);
            bar.set(done, done);
        }
    }
    let (rec, wall, cpu) =
        report::finish_run(tasks, &bar, shared, cpu_before, client_threads).await?;
    let secs = wall.as_secs_f64();
    let ops: u64 = rec.latency.values().map(|h| h.len()).sum();
    let (hits, misses) = (rec.count("get_hits"), rec.count("get_misses"));
    let (read, written) = (rec.count("bytes_read"), rec.count("bytes_written"));
    println!(
        "kv: {} against {addr}, {} connections, pipeline {}, values {}, ratio {}",
        plan.chooser.describe(),
        a.connections,
        plan.pipeline,
        a.value_size,
        a.ratio
    );
    println!(
        "{:.0} ops/s, {:.3} GB/s read, {:.3} GB/s written, hit rate {:.3}, verification failures {}",
        ops as f64 / secs,
        read as f64 / secs / 1e9,
        written as f64 / secs / 1e9,
        hits as f64 / (hits + misses).max(1) as f64,
        rec.count("verify_failures")
    );
    let summary = json!({
        "target": addr,
        "keys": a.keys,
        "key_distribution": plan.chooser.describe(),
        "value_size": a.value_size,
        "ratio": a.ratio,
        "mget_keys": plan.mget_keys,
        "connections": a.connections,
        "pipeline": plan.pipeline,
        "seconds": secs,
        "ops": ops,
        "ops_per_sec": ops as f64 / secs,
        "get_hits": hits,
        "get_misses": misses,
        "hit_rate": hits as f64 / (hits + misses).max(1) as f64,
        "bytes_read": read,
        "bytes_written": written,
        "read_gb_per_sec": read as f64 / secs / 1e9,
        "write_gb_per_sec": written as f64 / secs / 1e9,
        "verification_failures": rec.count("verify_failures"),
        "errors": rec.count("errors"),
    });
    let summary = a.out.publish("kv", &rec, cpu, summary)?;
    Ok(summary)
}

async fn prefill(plan: &Arc<Plan>, clients: &mut [Client]) -> std::io::Result<()> {
    let set = Bytes::from_static(b"SET");
    let per = plan.keys.len().div_ceil(clients.len());
    for (chunk, client) in plan.keys.chunks(per.max(1)).zip(clients.iter_mut()) {
        for group in chunk.chunks(64) {
            for key in group {
                let len = plan.sizes.for_key(key);
                client.send(&[set.clone(), key.clone(), plan.pool.value(key, len)]);
            }
            client.flush().await?;
            for _ in group {
                fail_on_error(&client.recv().await?, "prefill")?;
            }
        }
    }
    Ok(())
}

async fn worker(
    id: u64,
    mut client: Client,
    plan: Arc<Plan>,
    remaining: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    shared: report::Shared,
    start: Instant,
) -> std::io::Result<()> {
    let mut rng = Rng::new(0x5eed ^ (id << 20));
    let mut rec = Recorder::new(start);
    let (set, get, mget) = (
        Bytes::from_static(b"SET"),
        Bytes::from_static(b"GET"),
        Bytes::from_static(b"MGET"),
    );
    // (op, first key index in `keys`, key count) per request of the pipeline.
    let mut inflight: Vec<(Op, usize, usize)> = Vec::with_capacity(plan.pipeline);
    let mut keys: Vec<usize> = Vec::new();
    let mut cmd: Vec<Bytes> = Vec::new();
    // Paced connections start spread over one interval.
    let mut next = tokio::time::Instant::now()
        + plan
            .interval
            .map_or(Duration::ZERO, |i| i.mul_f64((id % 97) as f64 / 97.0));
    loop {
        if stop.load(Relaxed) {
            break;
        }
        if let Some(interval) = plan.interval {
            tokio::time::sleep_until(next).await;
            next += interval * plan.pipeline as u32;
        }
        let granted = remaining
            .fetch_update(Relaxed, Relaxed, |r| r.checked_sub(1))
            .is_ok();
        if !granted {
            break;
        }
        inflight.clear();
        keys.clear();
        for n in 0..plan.pipeline {
            if n > 0
                && remaining
                    .fetch_update(Relaxed, Relaxed, |r| r.checked_sub(1))
                    .is_err()
            {
                break;
            }
            let op = plan.pick_op(&mut rng);
            let first = keys.len();
            let count = if matches!(op, Op::Mget) {
                plan.mget_keys
            } else {
                1
            };
            for _ in 0..count {
                keys.push(plan.chooser.next(&mut rng) as usize);
            }
            cmd.clear();
            match op {
                Op::Set => {
                    let key = &plan.keys[keys[first]];
                    let value = plan.pool.value(key, plan.sizes.for_key(key));
                    rec.add("bytes_written", value.len() as u64);
                    cmd.extend([set.clone(), key.clone(), value]);
                }
                Op::Get => cmd.extend([get.clone(), plan.keys[keys[first]].clone()]),
                Op::Mget => {
                    cmd.push(mget.clone());
                    cmd.extend(keys[first..].iter().map(|&k| plan.keys[k].clone()));
                }
            }
            client.send(&cmd);
            inflight.push((op, first, count));
        }
        let sent = Instant::now();
        client.flush().await?;
        for &(op, first, count) in &inflight {
            let reply = client.recv().await?;
            let took = sent.elapsed();
            match (op, reply) {
                (Op::Set, Reply::Status(_)) => rec.op("set", took),
                (Op::Get, v) => {
                    rec.op("get", took);
                    check_value(&plan, &mut rec, keys[first], &v);
                    client.recycle(v);
                }
                (Op::Mget, Reply::Array(values)) if values.len() == count => {
                    rec.op("mget", took);
                    for (k, v) in keys[first..first + count].iter().zip(&values) {
                        check_value(&plan, &mut rec, *k, v);
                    }
                    client.recycle(Reply::Array(values));
                }
                _ => rec.add("errors", 1),
            }
        }
    }
    if let Ok(mut all) = shared.lock() {
        all.merge(rec);
    }
    Ok(())
}

fn check_value(plan: &Plan, rec: &mut Recorder, key: usize, v: &Reply) {
    match v {
        Reply::Nil => rec.add("get_misses", 1),
        Reply::Bulk(got) => {
            rec.add("get_hits", 1);
            rec.add("bytes_read", got.len() as u64);
            let key = &plan.keys[key];
            if !plan.pool.verify(key, plan.sizes.for_key(key), got) {
                rec.add("verify_failures", 1);
            }
        }
        _ => rec.add("errors", 1),
    }
}
