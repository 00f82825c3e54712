//! `kvtier-bench prefix`: the block dialect against what a Redis connector
//! does today, on the same data, alternating servers round by round.
//!
//! * lookup: how long it takes to learn that a 64-block chain is cached —
//!   kvtier `PREFIXLEN` (one round trip) versus one `EXISTS` per block in
//!   sequence on redis-server (LMCache's Redis connector).
//! * fetch: throughput of loading 32 blocks of 2 MiB — kvtier `MGETPREFIX`
//!   versus redis-server `MGET` of the same keys.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use kvtier_protocol::Reply;

use crate::resp::{args, Client};
use crate::workload::value_size;

/// Options of `kvtier-bench prefix`.
#[derive(Args, Debug, Clone)]
pub struct PrefixArgs {
    /// kvtier server.
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub kvtier: String,
    /// redis-server to compare with.
    #[arg(long, default_value = "127.0.0.1:6380")]
    pub redis: String,
    /// Another kvtier (an earlier build) to run the dialect's cells on too,
    /// alternated with `--kvtier`: a change against its base, in one run.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Blocks in the looked-up chain.
    #[arg(long, default_value_t = 64)]
    pub chain: usize,
    /// Value size of the looked-up blocks.
    #[arg(long, default_value_t = 4096)]
    pub lookup_value_bytes: usize,
    /// Lookups per server.
    #[arg(long, default_value_t = 3000)]
    pub lookups: usize,
    /// Blocks per fetch.
    #[arg(long, default_value_t = 32)]
    pub fetch_blocks: usize,
    /// Size of each fetched block.
    #[arg(long, default_value_t = 2 * 1024 * 1024)]
    pub block_bytes: usize,
    /// Fetches per server.
    #[arg(long, default_value_t = 200)]
    pub fetches: usize,
    /// Concurrent connections fetching.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Alternating rounds (each server gets 1/rounds of the work per round).
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
}

/// Deterministic content of block `i` (checked on every fetch).
pub fn block(i: usize, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    Bytes::from(v)
}

fn check(v: &Reply, what: &str) -> std::io::Result<()> {
    if let Reply::Error(e) = v {
        return Err(std::io::Error::other(format!("{what}: {e}")));
    }
    Ok(())
}

/// Runs both scenarios and prints the table.
pub async fn run(a: PrefixArgs) -> std::io::Result<()> {
    value_size(a.block_bytes, "--block-bytes").map_err(std::io::Error::other)?;
    value_size(a.lookup_value_bytes, "--lookup-value-bytes").map_err(std::io::Error::other)?;
    let chain_keys: Vec<Bytes> = (0..a.chain)
        .map(|i| Bytes::from(format!("bench:lookup:{i:04}:{:016x}", i * 7919)))
        .collect();
    let fetch_keys: Vec<Bytes> = (0..a.fetch_blocks)
        .map(|i| Bytes::from(format!("bench:fetch:{i:04}")))
        .collect();
    let fetch_values: Vec<Bytes> = (0..a.fetch_blocks)
        .map(|i| block(i, a.block_bytes))
        .collect();

    // Same data on every server.
    let mut servers = vec![(&a.kvtier, true), (&a.redis, false)];
    if let Some(base) = &a.baseline {
        servers.push((base, true));
    }
    for (addr, dialect) in servers {
        let mut c = Client::connect(addr).await?;
        let mut cmd = if dialect {
            args(["MSETBLOCK".to_string(), a.chain.to_string()])
        } else {
            args(["MSET".to_string()])
        };
        for (i, k) in chain_keys.iter().enumerate() {
            cmd.push(k.clone());
            cmd.push(block(i, a.lookup_value_bytes));
        }
        if dialect {
            cmd.push(Bytes::from("CHAIN"));
        }
        check(&c.call(&cmd).await?, "store chain")?;
        for (k, v) in fetch_keys.iter().zip(&fetch_values) {
            check(
                &c.call(&[Bytes::from("SET"), k.clone(), v.clone()]).await?,
                "store block",
            )?;
        }
    }

    let mut kv_lookup = Histogram::<u64>::new(3).map_err(std::io::Error::other)?;
    let mut redis_lookup = kv_lookup.clone();
    let mut kv_seq_lookup = kv_lookup.clone();
    let mut base_lookup = kv_lookup.clone();
    let (mut kv_fetch, mut redis_fetch) = (Duration::ZERO, Duration::ZERO);
    let mut base_fetch = Duration::ZERO;
    let per_round_lookups = a.lookups.div_ceil(a.rounds);
    let per_round_fetches = a.fetches.div_ceil(a.rounds);
    for round in 0..a.rounds {
        // The baseline goes first every other round, so the order a round
        // runs in never favours one build.
        let order = if round % 2 == 1 {
            [true, false]
        } else {
            [false, true]
        };
        for baseline_now in order {
            if baseline_now {
                if let Some(base) = &a.baseline {
                    lookup(base, &chain_keys, per_round_lookups, true, &mut base_lookup).await?;
                    base_fetch += fetch(
                        &a,
                        base,
                        &fetch_keys,
                        &fetch_values,
                        per_round_fetches,
                        true,
                    )
                    .await?;
                }
                continue;
            }
            lookup(
                &a.kvtier,
                &chain_keys,
                per_round_lookups,
                true,
                &mut kv_lookup,
            )
            .await?;
            lookup(
                &a.redis,
                &chain_keys,
                per_round_lookups,
                false,
                &mut redis_lookup,
            )
            .await?;
            lookup(
                &a.kvtier,
                &chain_keys,
                per_round_lookups / 4,
                false,
                &mut kv_seq_lookup,
            )
            .await?;
            kv_fetch += fetch(
                &a,
                &a.kvtier,
                &fetch_keys,
                &fetch_values,
                per_round_fetches,
                true,
            )
            .await?;
            redis_fetch += fetch(
                &a,
                &a.redis,
                &fetch_keys,
                &fetch_values,
                per_round_fetches,
                false,
            )
            .await?;
        }
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "lookup of a {}-block chain ({} lookups per server)",
        a.chain, a.lookups
    );
    println!("| client | p50 µs | p99 µs | mean µs |");
    println!("|---|---|---|---|");
    let mut rows = vec![
        ("redis-server: sequential EXISTS", &redis_lookup),
        ("kvtier: sequential EXISTS", &kv_seq_lookup),
        ("kvtier: PREFIXLEN", &kv_lookup),
    ];
    if a.baseline.is_some() {
        rows.push(("baseline kvtier: PREFIXLEN", &base_lookup));
    }
    for (name, h) in rows {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} |",
            us(h, 0.5),
            us(h, 0.99),
            h.mean() / 1000.0
        );
    }
    println!(
        "lookup latency ratio (redis sequential EXISTS / kvtier PREFIXLEN): p50 {:.1}x, mean {:.1}x",
        us(&redis_lookup, 0.5) / us(&kv_lookup, 0.5),
        redis_lookup.mean() / kv_lookup.mean()
    );
    let total = (a.fetch_blocks * a.block_bytes * per_round_fetches * a.rounds) as f64;
    let kv_gbs = total / kv_fetch.as_secs_f64() / 1e9;
    let redis_gbs = total / redis_fetch.as_secs_f64() / 1e9;
    println!();
    println!(
        "fetch of {} blocks of {} bytes ({} fetches per server, {} connections)",
        a.fetch_blocks,
        a.block_bytes,
        per_round_fetches * a.rounds,
        a.connections
    );
    println!("| client | GB/s | fetches/s |");
    println!("|---|---|---|");
    let per_fetch = (a.fetch_blocks * a.block_bytes) as f64;
    println!(
        "| redis-server: MGET | {redis_gbs:.2} | {:.0} |",
        redis_gbs * 1e9 / per_fetch
    );
    println!(
        "| kvtier: MGETPREFIX | {kv_gbs:.2} | {:.0} |",
        kv_gbs * 1e9 / per_fetch
    );
    if a.baseline.is_some() {
        let base_gbs = total / base_fetch.as_secs_f64() / 1e9;
        println!(
            "| baseline kvtier: MGETPREFIX | {base_gbs:.2} | {:.0} |",
            base_gbs * 1e9 / per_fetch
        );
    }
    println!(
        "fetch throughput ratio (kvtier MGETPREFIX / redis MGET): {:.2}x",
        kv_gbs / redis_gbs
    );
    if a.baseline.is_some() {
        let base_gbs = total / base_fetch.as_secs_f64() / 1e9;
        println!(
            "against the baseline: PREFIXLEN p50 {:.3}x, mean {:.3}x (below 1: faster); MGETPREFIX GB/s {:.3}x (above 1: faster)",
            us(&kv_lookup, 0.5) / us(&base_lookup, 0.5),
            kv_lookup.mean() / base_lookup.mean(),
            kv_gbs / base_gbs
        );
    }
    Ok(())
}

/// `count` lookups of the whole chain on one connection.
async fn lookup(
    addr: &str,
    keys: &[Bytes],
    count: usize,
    dialect: bool,
    hist: &mut Histogram<u64>,
) -> std::io::Result<()> {
    let mut c = Client::connect(addr).await?;
    let mut prefixlen = args(["PREFIXLEN".to_string(), keys.len().to_string()]);
    prefixlen.extend(keys.iter().cloned());
    let exists = Bytes::from("EXISTS");
    for _ in 0..count {
        let start = Instant::now();
        let found = if dialect {
            c.call(&prefixlen).await?.as_int().unwrap_or(-1) as usize
        } else {
            let mut n = 0;
            for k in keys {
                if c.call(&[exists.clone(), k.clone()]).await?.as_int() != Some(1) {
                    break;
                }
                n += 1;
            }
            n
        };
        let _ = hist.record(start.elapsed().as_nanos() as u64);
        if found != keys.len() {
            return Err(std::io::Error::other(format!(
                "lookup found {found} of {} blocks on {addr}",
                keys.len()
            )));
        }
    }
    Ok(())
}

/// `count` fetches spread over the connections; returns the elapsed time.
async fn fetch(
    a: &PrefixArgs,
    addr: &str,
    keys: &[Bytes],
    values: &[Bytes],
    count: usize,
    dialect: bool,
) -> std::io::Result<Duration> {
    let mut cmd = if dialect {
        args(["MGETPREFIX".to_string(), keys.len().to_string()])
    } else {
        args(["MGET".to_string()])
    };
    cmd.extend(keys.iter().cloned());
    let mut clients = Vec::new();
    for _ in 0..a.connections {
        clients.push(Client::connect(addr).await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut c) in clients.into_iter().enumerate() {
        let cmd = cmd.clone();
        let values = values.to_vec();
        let share = count / a.connections + usize::from(i < count % a.connections);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                let reply = c.call(&cmd).await?;
                let items = reply
                    .into_array()
                    .ok_or_else(|| std::io::Error::other("fetch: not an array"))?;
                if items.len() != values.len() {
                    return Err(std::io::Error::other("fetch: short reply"));
                }
                for (got, want) in items.iter().zip(&values) {
                    let Reply::Bulk(got) = got else {
                        return Err(std::io::Error::other("fetch: missing block"));
                    };
                    // Length and both ends: cheap, and catches misplaced data.
                    let ok = got.len() == want.len()
                        && got[..64] == want[..64]
                        && got[got.len() - 64..] == want[want.len() - 64..];
                    if !ok {
                        return Err(std::io::Error::other("fetch: wrong bytes"));
                    }
                }
                // Checked: its buffers take the next reply, as an engine's
                // pre-allocated KV buffers would (no page faults per fetch).
                c.recycle(Reply::Array(items));
            }
            Ok::<(), std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(std::io::Error::other)??;
    }
    Ok(start.elapsed())
}
