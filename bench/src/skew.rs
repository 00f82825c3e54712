//! `kvtier-bench skew`: many connections reading a Zipf-skewed set of hot
//! blocks (10% of blocks get most reuses in real traces). Reports throughput
//! and, from `INFO shards`, how the load spread over kvtier's shards.

use bytes::Bytes;
use clap::Args;
use serde_json::json;

use crate::common::Output;
use crate::kv::{self, KvArgs};
use crate::report;
use crate::resp::{Client, Value};

/// Options of `kvtier-bench skew`.
#[derive(Args, Debug, Clone)]
pub struct SkewArgs {
    #[command(flatten)]
    pub out: Output,
    /// Hot blocks.
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// Zipf exponent of block popularity.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Block size.
    #[arg(long, default_value = "256KiB")]
    pub block_size: String,
    /// Connections reading.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
}

/// Commands executed per shard so far, from `INFO shards` (kvtier), or the
/// server's total as one shard (any other server).
async fn shard_commands(addr: &str) -> std::io::Result<Vec<u64>> {
    let mut c = Client::connect(addr).await?;
    let text = match c.call(&[Bytes::from("INFO"), Bytes::from("all")]).await? {
        Value::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split([',', ':'])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.trim().parse().ok())
    };
    let shards: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("shard"))
        .filter_map(|l| field(l, "commands"))
        .collect();
    if !shards.is_empty() {
        return Ok(shards);
    }
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok(vec![total])
}

/// Runs the scenario.
pub async fn run(a: SkewArgs, client_threads: usize) -> std::io::Result<()> {
    let addr = a.out.addr();
    let before = shard_commands(&addr).await?;
    let kv_args = KvArgs {
        out: Output {
            target: a.out.target.clone(),
            json: None,
            plot: a.out.plot.clone(),
        },
        ratio: "0:1".into(),
        mget_keys: 1,
        keys: a.keys,
        zipf: Some(a.zipf),
        gaussian: None,
        value_size: a.block_size.clone(),
        connections: a.connections,
        pipeline: a.pipeline,
        duration: Some(a.duration),
        requests: None,
        prefill: true,
        key_prefix: "skew:".into(),
    };
    let summary = kv::run(kv_args, client_threads).await?;
    let after = shard_commands(&addr).await?;
    let deltas: Vec<u64> = after
        .iter()
        .zip(before.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let total: u64 = deltas.iter().sum::<u64>().max(1);
    println!("load per shard (commands executed during the run):");
    println!("| shard | commands | share |");
    println!("|---|---|---|");
    for (i, d) in deltas.iter().enumerate() {
        println!("| {i} | {d} | {:.1}% |", *d as f64 * 100.0 / total as f64);
    }
    let max_share = *deltas.iter().max().unwrap_or(&0) as f64 / total as f64;
    println!(
        "hottest shard carries {:.1}% (even split: {:.1}%)",
        max_share * 100.0,
        100.0 / deltas.len() as f64
    );
    if let Some(path) = &a.out.json {
        let report = json!({
            "scenario": "skew",
            "target": addr,
            "zipf": a.zipf,
            "keys": a.keys,
            "block_size": a.block_size,
            "kv": summary,
            "shard_commands": deltas,
            "hottest_shard_share": max_share,
        });
        report::write_json(path, &report)?;
    }
    Ok(())
}
