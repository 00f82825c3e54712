//! `kvtier-bench skew`: many connections reading a Zipf-skewed set of hot
//! blocks (10% of blocks get most reuses in real traces). Reports throughput
//! and, from `INFO shards`, how the load spread over kvtier's shards.

use bytes::Bytes;
use clap::Args;
use kvtier_protocol::Reply;
use serde_json::json;

use crate::common::Output;
use crate::kv::{self, KvArgs};
use crate::report;
use crate::resp::Client;

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

/// Per-shard counters from `INFO all`.
struct ShardLoad {
    /// Reads of the keys each shard owns (keyspace hits + misses).
    reads: Vec<u64>,
    /// Commands issued by connections each shard's thread serves.
    commands: Vec<u64>,
    /// Reads a cluster node answered from its copies of hot keys.
    replica_hits: u64,
}

/// Reads a `name=value` field of an `INFO shards` line.
fn field(line: &str, name: &str) -> Option<u64> {
    line.split([',', ':'])
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok())
}

/// The load per shard so far, from `INFO shards` (kvtier); any other server
/// counts as one shard with its `INFO stats` totals.
async fn shard_load(addr: &str) -> std::io::Result<ShardLoad> {
    let mut c = Client::connect(addr).await?;
    let text = match c.call(&[Bytes::from("INFO"), Bytes::from("all")]).await? {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let shard_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("shard") && l.contains("keys="))
        .collect();
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let replica_hits = stat("cluster_replica_hits");
    if !shard_lines.is_empty() {
        return Ok(ShardLoad {
            replica_hits,
            reads: shard_lines
                .iter()
                .map(|l| {
                    field(l, "keyspace_hits").unwrap_or(0)
                        + field(l, "keyspace_misses").unwrap_or(0)
                })
                .collect(),
            commands: shard_lines
                .iter()
                .map(|l| field(l, "commands").unwrap_or(0))
                .collect(),
        });
    }
    Ok(ShardLoad {
        replica_hits,
        reads: vec![stat("keyspace_hits") + stat("keyspace_misses")],
        commands: vec![stat("total_commands_processed")],
    })
}

/// `after - before`, element by element.
fn delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after
        .iter()
        .zip(before.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect()
}

/// Runs the scenario.
pub async fn run(a: SkewArgs, client_threads: usize) -> std::io::Result<()> {
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
        prefill: false,
        key_prefix: "skew:".into(),
        rate: 0.0,
    };
    // Load the blocks first, outside the counters the shares come from.
    kv::prefill_keys(&kv_args).await?;
    let nodes = a.out.addrs();
    let mut before = Vec::new();
    for n in &nodes {
        before.push(shard_load(n).await?);
    }
    let summary = kv::run(kv_args, client_threads).await?;
    let mut after = Vec::new();
    for n in &nodes {
        after.push(shard_load(n).await?);
    }
    // One server: the load per shard. Several (a cluster): per node, the
    // reads it executed for keys it owns plus those its copies answered.
    let unit = if nodes.len() > 1 { "node" } else { "shard" };
    let (reads, commands) = if nodes.len() > 1 {
        let node_reads = |l: &ShardLoad| l.reads.iter().sum::<u64>() + l.replica_hits;
        let node_cmds = |l: &ShardLoad| l.commands.iter().sum::<u64>();
        (
            after
                .iter()
                .zip(&before)
                .map(|(x, y)| node_reads(x).saturating_sub(node_reads(y)))
                .collect::<Vec<u64>>(),
            after
                .iter()
                .zip(&before)
                .map(|(x, y)| node_cmds(x).saturating_sub(node_cmds(y)))
                .collect::<Vec<u64>>(),
        )
    } else {
        (
            delta(&after[0].reads, &before[0].reads),
            delta(&after[0].commands, &before[0].commands),
        )
    };
    let total: u64 = reads.iter().sum::<u64>().max(1);
    let shares: Vec<f64> = reads.iter().map(|&r| r as f64 / total as f64).collect();
    println!("load per {unit} (reads each {unit} served, during the run):");
    println!("| {unit} | reads | share | commands its connections issued |");
    println!("|---|---|---|---|");
    for (i, (r, share)) in reads.iter().zip(&shares).enumerate() {
        println!(
            "| {i} | {r} | {:.1}% | {} |",
            share * 100.0,
            commands.get(i).copied().unwrap_or(0)
        );
    }
    let max_share = shares.iter().copied().fold(0.0, f64::max);
    let busiest_over_mean = max_share * reads.len() as f64;
    println!(
        "hottest {unit} carries {:.1}% of the reads (even split: {:.1}%): {:.2}x the mean",
        max_share * 100.0,
        100.0 / reads.len() as f64,
        busiest_over_mean
    );
    if let Some(path) = &a.out.json {
        let report = json!({
            "scenario": "skew",
            "target": a.out.target,
            "zipf": a.zipf,
            "keys": a.keys,
            "block_size": a.block_size,
            "connections": a.connections,
            "duration": a.duration,
            "ops_per_sec": summary["ops_per_sec"],
            "kv": summary,
            "unit": unit,
            "shards": reads.len(),
            "shard_reads": reads,
            "shard_read_shares": shares,
            "shard_commands": commands,
            "hottest_shard_share": max_share,
            "busiest_over_mean": busiest_over_mean,
        });
        report::write_json(path, &report)?;
    }
    crate::common::check_verified(&summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_line_fields() {
        let line = "shard2:keys=5,used_memory=9,commands=70,ops_per_sec=0,clients=1,\
                    net_input_bytes=1,net_output_bytes=2,keyspace_hits=40,keyspace_misses=3";
        assert_eq!(field(line, "keys"), Some(5));
        assert_eq!(field(line, "commands"), Some(70));
        assert_eq!(field(line, "keyspace_hits"), Some(40));
        assert_eq!(field(line, "keyspace_misses"), Some(3));
        assert_eq!(field(line, "hits"), None);
        assert_eq!(delta(&[5, 9, 4], &[1, 9]), vec![4, 0, 4]);
    }
}
