//! kvtier-bench: measures kvtier and any RESP server (redis-server) with the
//! same client, so their numbers compare.

mod prefix;
mod resp;

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
    /// The block dialect versus a Redis connector: chain lookup latency
    /// (PREFIXLEN vs sequential EXISTS) and prefix fetch throughput
    /// (MGETPREFIX vs MGET).
    Prefix(prefix::PrefixArgs),
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
        match cli.command {
            Command::Prefix(a) => prefix::run(a).await,
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
