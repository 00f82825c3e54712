//! `kvtier-bench pd`: the disaggregated prefill → decode hand-off. Prefill
//! workers store chains block by block; decode workers are told a chain's
//! keys the moment its prefill starts and fetch it with `MGETPREFIX ...
//! BLOCK ms` (or, against a plain Redis, by polling MGET). Reports the
//! hand-off latency (write start → read complete), timeouts and bytes/s.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use kvtier_protocol::Reply;
use serde_json::json;
use tokio::sync::mpsc;

use crate::common::{check_verified, fail_on_error, flag_name, require_dialect, Output};
use crate::report::{self, Recorder};
use crate::resp::Client;
use crate::workload::{parse_size, ValuePool};

/// How decode workers wait for the blocks.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `MGETPREFIX n keys BLOCK ms` (kvtier).
    Block,
    /// `MGET` every `--poll-ms` until all blocks are there (any Redis).
    Poll,
}

/// Options of `kvtier-bench pd`.
#[derive(Args, Debug, Clone)]
pub struct PdArgs {
    #[command(flatten)]
    pub out: Output,
    /// Chains to hand off.
    #[arg(long, default_value_t = 200)]
    pub chains: usize,
    /// Blocks per chain.
    #[arg(long, default_value_t = 16)]
    pub chain_blocks: usize,
    /// Block size.
    #[arg(long, default_value = "256KiB")]
    pub block_size: String,
    /// Blocks per write of a prefill worker (its layer/block granularity).
    #[arg(long, default_value_t = 1)]
    pub blocks_per_write: usize,
    /// Prefill workers (connections writing).
    #[arg(long, default_value_t = 4)]
    pub prefill_workers: usize,
    /// Decode workers (connections reading).
    #[arg(long, default_value_t = 4)]
    pub decode_workers: usize,
    /// How decode workers wait.
    #[arg(long, value_enum, default_value = "block")]
    pub wait: Wait,
    /// Longest wait for one chain, ms.
    #[arg(long, default_value_t = 5000)]
    pub block_ms: u64,
    /// Polling interval with --wait poll, ms.
    #[arg(long, default_value_t = 1)]
    pub poll_ms: u64,
}

struct Handoff {
    keys: Vec<Bytes>,
    started: Instant,
    /// A decode worker's slot, held until the chain has been read.
    _decoder: tokio::sync::OwnedSemaphorePermit,
}

/// Runs the scenario.
pub async fn run(a: PdArgs, client_threads: usize) -> std::io::Result<()> {
    let addr = a.out.addr();
    if a.wait == Wait::Block {
        require_dialect(&addr).await?;
    }
    let block = parse_size(&a.block_size).map_err(std::io::Error::other)?;
    let pool = Arc::new(ValuePool::new(block, "--block-size").map_err(std::io::Error::other)?);
    let run_id =
        std::process::id() as u64 * 1_000_003 + crate::workload::hash(addr.as_bytes()) % 1000;
    let start = Instant::now();
    let cpu_before = report::cpu_time();
    let shared = Arc::new(Mutex::new(Recorder::new(start)));
    let next_chain = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel::<Handoff>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    // A prefill starts a chain only when a decode worker is free to wait
    // for it, as a decode instance is assigned before its prefill runs:
    // the hand-off latency then never includes time a chain spent queued
    // behind other chains on the client.
    let idle_decoders = Arc::new(tokio::sync::Semaphore::new(a.decode_workers.max(1)));
    let bar = report::Progress::new("hand-offs", a.chains as u64, a.chains as f64 / 50.0);
    let mut decoders = Vec::new();
    for _ in 0..a.decode_workers.max(1) {
        let mut client = Client::connect(&addr).await?;
        let (rx, pool, shared, a, bar) = (
            Arc::clone(&rx),
            Arc::clone(&pool),
            Arc::clone(&shared),
            a.clone(),
            Arc::clone(&bar),
        );
        decoders.push(tokio::spawn(async move {
            let mut rec = Recorder::new(start);
            loop {
                let job = rx.lock().await.recv().await;
                let Some(job) = job else { break };
                decode(&mut client, &a, &pool, block, &job, &mut rec).await?;
                drop(job);
                bar.inc(1);
            }
            if let Ok(mut all) = shared.lock() {
                all.merge(rec);
            }
            Ok::<(), std::io::Error>(())
        }));
    }
    let mut prefills = Vec::new();
    for _ in 0..a.prefill_workers.max(1) {
        let mut client = Client::connect(&addr).await?;
        let (tx, pool, next_chain, a, idle_decoders) = (
            tx.clone(),
            Arc::clone(&pool),
            Arc::clone(&next_chain),
            a.clone(),
            Arc::clone(&idle_decoders),
        );
        prefills.push(tokio::spawn(async move {
            loop {
                let chain = next_chain.fetch_add(1, Relaxed);
                if chain >= a.chains {
                    break;
                }
                let keys: Vec<Bytes> = (0..a.chain_blocks)
                    .map(|j| Bytes::from(format!("pd:{run_id}:{chain}:{j}")))
                    .collect();
                let decoder = Arc::clone(&idle_decoders)
                    .acquire_owned()
                    .await
                    .map_err(std::io::Error::other)?;
                let started = Instant::now();
                // The decode side learns the keys as the prefill starts.
                let _ = tx.send(Handoff {
                    keys: keys.clone(),
                    started,
                    _decoder: decoder,
                });
                for (g, group) in keys.chunks(a.blocks_per_write.max(1)).enumerate() {
                    let mut cmd = vec![
                        Bytes::from_static(b"MSETBLOCK"),
                        Bytes::from(group.len().to_string()),
                    ];
                    if a.wait == Wait::Poll {
                        cmd = vec![Bytes::from_static(b"MSET")];
                    }
                    for k in group {
                        cmd.push(k.clone());
                        cmd.push(pool.value(k, block));
                    }
                    if a.wait == Wait::Block {
                        cmd.push(Bytes::from_static(b"CHAIN"));
                        if g > 0 {
                            let parent = &keys[g * a.blocks_per_write.max(1) - 1];
                            cmd.extend([Bytes::from_static(b"PARENT"), parent.clone()]);
                        }
                    }
                    fail_on_error(&client.call(&cmd).await?, "prefill write")?;
                }
            }
            Ok::<(), std::io::Error>(())
        }));
    }
    drop(tx);
    let tasks = prefills.into_iter().chain(decoders);
    let (rec, wall, cpu) =
        report::finish_run(tasks, &bar, shared, cpu_before, client_threads).await?;
    let secs = wall.as_secs_f64();
    let bytes = rec.count("bytes_read");
    println!(
        "pd: {} chains of {} × {} bytes, {} prefill / {} decode workers, wait {}, against {addr}",
        a.chains,
        a.chain_blocks,
        block,
        a.prefill_workers,
        a.decode_workers,
        flag_name(&a.wait)
    );
    println!(
        "handed off {}, timeouts {}, verification failures {}, {:.3} GB/s read",
        rec.count("complete"),
        rec.count("timeouts"),
        rec.count("verify_failures"),
        bytes as f64 / secs / 1e9
    );
    let summary = json!({
        "target": addr,
        "wait": flag_name(&a.wait),
        "chains": a.chains,
        "chain_blocks": a.chain_blocks,
        "block_bytes": block,
        "blocks_per_write": a.blocks_per_write.max(1),
        "prefill_workers": a.prefill_workers.max(1),
        "decode_workers": a.decode_workers.max(1),
        "handoffs_per_sec": rec.count("complete") as f64 / secs,
        "complete": rec.count("complete"),
        "timeouts": rec.count("timeouts"),
        "verification_failures": rec.count("verify_failures"),
        "bytes_read": bytes,
        "seconds": secs,
        "gb_per_sec": bytes as f64 / secs / 1e9,
    });
    let summary = a.out.publish("pd", &rec, cpu, summary)?;
    check_verified(&summary)
}

async fn decode(
    client: &mut Client,
    a: &PdArgs,
    pool: &ValuePool,
    block: usize,
    job: &Handoff,
    rec: &mut Recorder,
) -> std::io::Result<()> {
    let n = job.keys.len();
    let deadline = job.started + Duration::from_millis(a.block_ms);
    let values = match a.wait {
        Wait::Block => {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .as_millis()
                .max(1);
            let mut cmd = vec![
                Bytes::from_static(b"MGETPREFIX"),
                Bytes::from(n.to_string()),
            ];
            cmd.extend(job.keys.iter().cloned());
            cmd.extend([Bytes::from_static(b"BLOCK"), Bytes::from(left.to_string())]);
            let v = client.call(&cmd).await?;
            fail_on_error(&v, "MGETPREFIX")?;
            v.into_array().unwrap_or_default()
        }
        Wait::Poll => loop {
            let mut cmd = vec![Bytes::from_static(b"MGET")];
            cmd.extend(job.keys.iter().cloned());
            let v = client.call(&cmd).await?;
            fail_on_error(&v, "MGET")?;
            let values = v.into_array().unwrap_or_default();
            let present = values
                .iter()
                .take_while(|v| matches!(v, Reply::Bulk(_)))
                .count();
            if present == n || Instant::now() >= deadline {
                break values.into_iter().take(present).collect();
            }
            client.recycle(Reply::Array(values));
            tokio::time::sleep(Duration::from_millis(a.poll_ms)).await;
        },
    };
    let took = job.started.elapsed();
    for (k, v) in job.keys.iter().zip(&values) {
        if let Reply::Bulk(got) = v {
            rec.add("bytes_read", got.len() as u64);
            if !pool.verify(k, block, got) {
                rec.add("verify_failures", 1);
            }
        }
    }
    let complete = values.len() == n;
    client.recycle(Reply::Array(values));
    if complete {
        rec.add("complete", 1);
        rec.op("handoff", took);
    } else {
        rec.add("timeouts", 1);
    }
    Ok(())
}
