//! kvtier-bench: measures kvtier and any RESP server (redis-server) with the
//! same client, so their numbers compare.

mod common;
mod incast;
mod kv;
mod latency;
mod pd;
mod prefix;
mod report;
mod resp;
mod sim;
mod skew;
mod spill_index;
mod trace;
mod workload;

use clap::{Parser, Subcommand};

/// Load generator for kvtier and any RESP server.
#[derive(Parser, Debug)]
#[command(name = "kvtier-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Client threads (default: 2).
    #[arg(long, global = true, default_value_t = 2)]
    client_threads: usize,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// memtier-style GET/SET/MGET load.
    Kv(kv::KvArgs),
    /// Replay a Mooncake-format trace as a KV-cache connector would.
    Trace(trace::TraceArgs),
    /// Prefill → decode hand-off latency with blocking reads.
    Pd(pd::PdArgs),
    /// Zipf-skewed reads of hot blocks; load per shard.
    Skew(skew::SkewArgs),
    /// Many clients fetching the same hot prefix with MGETPREFIX, plain
    /// or cluster-aware: GB/s and latency.
    Incast(incast::IncastArgs),
    /// The block dialect versus a Redis connector: chain lookup latency
    /// (PREFIXLEN vs sequential EXISTS) and prefix fetch throughput
    /// (MGETPREFIX vs MGET).
    Prefix(prefix::PrefixArgs),
    /// Hit rates of eviction policies on a trace, on the store's own code
    /// (no network, block sizes only), beside exact LRU, prefix-aware LRU
    /// and Belady's MIN.
    Sim(sim::SimArgs),
    /// One client's unpipelined round trip (and eight clients'): p50, p99,
    /// p99.9 of GET, EXISTS, PREFIXLEN and MGETPREFIX against redis-server,
    /// targets alternated round by round.
    Latency(latency::LatencyArgs),
    /// Writes a spill directory of sparse segments whose footers list
    /// many small blocks: restart time and DRAM per block on disk at a
    /// scale the disk could not hold.
    SpillIndex(spill_index::SpillIndexArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.client_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let threads = cli.client_threads.max(1);
        match cli.command {
            Command::Kv(a) => common::check_verified(&kv::run(a, threads).await?),
            Command::Trace(a) => trace::run(a, threads).await,
            Command::Pd(a) => pd::run(a, threads).await,
            Command::Skew(a) => skew::run(a, threads).await,
            Command::Prefix(a) => prefix::run(a).await,
            Command::Incast(a) => incast::run(a).await,
            Command::Sim(a) => sim::run(a),
            Command::Latency(a) => latency::run(a),
            Command::SpillIndex(a) => spill_index::run(a),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtier-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
