//! `kvtier-bench incast`: many clients fetching the same hot prefix at once
//! (a popular system prompt's blocks, read by every worker that admits a
//! request using it). Each connection loops `MGETPREFIX` over the whole
//! prefix and verifies every byte.
//!
//! * Plain (the default): connection `i` talks to target `i mod n`, which
//!   answers the whole prefix (from its own blocks, its copies of hot
//!   blocks, or by asking the owners).
//! * `--cluster-aware`: each connection learns the owners from CLUSTER
//!   SLOTS and sends each owner its part of the prefix, all parts at once,
//!   merged in order (what the kvtier Python client does).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use kvtier_protocol::Reply;
use serde_json::json;

use crate::common::{fail_on_error, Output};
use crate::prefix::block;
use crate::report::{self, Recorder};
use crate::resp::Client;
use crate::workload::{parse_size, value_size};

/// Options of `kvtier-bench incast`.
#[derive(Args, Debug, Clone)]
pub struct IncastArgs {
    #[command(flatten)]
    pub out: Output,
    /// Blocks in the shared prefix.
    #[arg(long, default_value_t = 64)]
    pub blocks: usize,
    /// Size of each block.
    #[arg(long, default_value = "64KiB")]
    pub block_size: String,
    /// Connections fetching the prefix.
    #[arg(long, default_value_t = 48)]
    pub connections: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Send each owner its part of the prefix (from CLUSTER SLOTS) instead
    /// of the whole prefix to one node.
    #[arg(long)]
    pub cluster_aware: bool,
}

/// Where one fetch's parts go: `(node address, indices of the blocks)`, in
/// prefix order within each part.
type Route = Vec<(String, Vec<usize>)>;

/// The owner's address of every slot, from CLUSTER SLOTS.
async fn slot_owners(addr: &str) -> std::io::Result<Vec<String>> {
    let mut c = Client::connect(addr).await?;
    let reply = c
        .call(&[Bytes::from("CLUSTER"), Bytes::from("SLOTS")])
        .await?;
    fail_on_error(&reply, "CLUSTER SLOTS")?;
    let mut owners = vec![String::new(); kvtier_store::slot::SLOTS];
    let Reply::Array(ranges) = reply else {
        return Err(std::io::Error::other("CLUSTER SLOTS: not an array"));
    };
    for range in ranges {
        let parsed = match &range {
            Reply::Array(r) if r.len() >= 3 => match (&r[0], &r[1], &r[2]) {
                (Reply::Int(a), Reply::Int(b), Reply::Array(node)) if node.len() >= 2 => {
                    match (&node[0], &node[1]) {
                        (Reply::Bulk(ip), Reply::Int(port)) => Some((
                            *a as usize,
                            *b as usize,
                            format!("{}:{port}", String::from_utf8_lossy(ip)),
                        )),
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        };
        let (first, last, owner) =
            parsed.ok_or_else(|| std::io::Error::other("CLUSTER SLOTS: bad range"))?;
        for slot in owners.iter_mut().take(last + 1).skip(first) {
            *slot = owner.clone();
        }
    }
    Ok(owners)
}

/// Where connection `i` sends its fetch: the whole prefix to its target,
/// or (given the slot owners) each owner its part.
fn route(a: &IncastArgs, keys: &[Bytes], owners: Option<&[String]>, i: usize) -> Route {
    let Some(owners) = owners else {
        return vec![(a.out.addr_for(i), (0..keys.len()).collect())];
    };
    let mut parts: Route = Vec::new();
    for (b, key) in keys.iter().enumerate() {
        let owner = &owners[kvtier_store::slot::key_slot(key) as usize];
        match parts.iter_mut().find(|(o, _)| o == owner) {
            Some((_, blocks)) => blocks.push(b),
            None => parts.push((owner.clone(), vec![b])),
        }
    }
    parts
}

/// Fetches the prefix over `route` until `stop`, verifying every value.
async fn fetcher(
    route: Route,
    keys: Arc<Vec<Bytes>>,
    values: Arc<Vec<Bytes>>,
    stop: Arc<AtomicBool>,
    start: Instant,
) -> std::io::Result<Recorder> {
    let mut conns = Vec::with_capacity(route.len());
    let mut commands = Vec::with_capacity(route.len());
    for (addr, blocks) in &route {
        conns.push(Client::connect(addr).await?);
        let mut cmd = vec![
            Bytes::from_static(b"MGETPREFIX"),
            Bytes::from(blocks.len().to_string()),
        ];
        cmd.extend(blocks.iter().map(|&i| keys[i].clone()));
        commands.push(cmd);
    }
    let mut rec = Recorder::new(start);
    while !stop.load(Relaxed) {
        let began = Instant::now();
        for (conn, cmd) in conns.iter_mut().zip(&commands) {
            conn.send(cmd);
            conn.flush().await?;
        }
        for (conn, (_, blocks)) in conns.iter_mut().zip(&route) {
            let reply = conn.recv().await?;
            fail_on_error(&reply, "MGETPREFIX")?;
            let Reply::Array(got) = reply else {
                return Err(std::io::Error::other("MGETPREFIX: not an array"));
            };
            if got.len() != blocks.len() {
                return Err(std::io::Error::other(format!(
                    "MGETPREFIX: {} of {} blocks (was the prefix evicted?)",
                    got.len(),
                    blocks.len()
                )));
            }
            for (v, &i) in got.into_iter().zip(blocks) {
                match v {
                    Reply::Bulk(b) => {
                        rec.add("bytes", b.len() as u64);
                        rec.add("wrong", (b != values[i]) as u64);
                        conn.recycle_bytes(b);
                    }
                    _ => rec.add("wrong", 1),
                }
            }
        }
        rec.op("fetch", began.elapsed());
    }
    Ok(rec)
}

/// Runs the scenario.
pub async fn run(a: IncastArgs) -> std::io::Result<()> {
    let size = parse_size(&a.block_size)
        .and_then(|n| value_size(n, "--block-size"))
        .map_err(std::io::Error::other)?;
    let keys: Arc<Vec<Bytes>> = Arc::new(
        (0..a.blocks)
            .map(|i| Bytes::from(format!("incast:{i}")))
            .collect(),
    );
    let values: Arc<Vec<Bytes>> = Arc::new((0..a.blocks).map(|i| block(i, size)).collect());
    let nodes = a.out.addrs();
    // Store the prefix through the first target (a cluster forwards),
    // unless a run before this one did: any write, even SET NX, drops the
    // blocks' copies on other nodes.
    let mut loader = Client::connect(&nodes[0]).await?;
    let mut exists = vec![Bytes::from_static(b"EXISTS")];
    exists.extend(keys.iter().cloned());
    if loader.call(&exists).await? != Reply::Int(a.blocks as i64) {
        for (k, v) in keys.iter().zip(values.iter()) {
            loader.send(&[Bytes::from_static(b"SET"), k.clone(), v.clone()]);
        }
        loader.flush().await?;
        for _ in 0..a.blocks {
            fail_on_error(&loader.recv().await?, "SET")?;
        }
    }
    let owners = if a.cluster_aware {
        Some(slot_owners(&nodes[0]).await?)
    } else {
        None
    };
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.connections.max(1) {
        let r = route(&a, &keys, owners.as_deref(), i);
        let (keys, values, stop) = (keys.clone(), values.clone(), stop.clone());
        tasks.push(tokio::spawn(fetcher(r, keys, values, stop, start)));
    }
    tokio::time::sleep(Duration::from_secs_f64(a.duration)).await;
    stop.store(true, Relaxed);
    let mut all = Recorder::new(start);
    for t in tasks {
        all.merge(t.await.map_err(std::io::Error::other)??);
    }
    let secs = all.wall().as_secs_f64();
    let fetches = all.latency.get("fetch").map_or(0, |h| h.len());
    let (bytes, wrong) = (all.count("bytes"), all.count("wrong"));
    let lat = all
        .latency
        .get("fetch")
        .map_or(serde_json::Value::Null, report::percentiles);
    println!(
        "incast: {} connections fetching {} blocks of {} ({}), {:.1} s",
        a.connections,
        a.blocks,
        a.block_size,
        if a.cluster_aware {
            "each owner its part"
        } else {
            "whole prefix per node"
        },
        secs
    );
    println!(
        "{:.0} fetches/s, {:.3} GB/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, wrong values {}",
        fetches as f64 / secs,
        bytes as f64 / secs / 1e9,
        lat["p50_us"].as_f64().unwrap_or(0.0),
        lat["p99_us"].as_f64().unwrap_or(0.0),
        lat["p999_us"].as_f64().unwrap_or(0.0),
        wrong
    );
    if let Some(path) = &a.out.json {
        let report = json!({
            "scenario": "incast",
            "target": a.out.target,
            "blocks": a.blocks,
            "block_size": a.block_size,
            "connections": a.connections,
            "cluster_aware": a.cluster_aware,
            "seconds": secs,
            "fetches_per_sec": fetches as f64 / secs,
            "gb_per_sec": bytes as f64 / secs / 1e9,
            "latency": lat,
            "verification_failures": wrong,
        });
        report::write_json(path, &report)?;
    }
    if wrong > 0 {
        return Err(std::io::Error::other(format!(
            "{} wrong values: the server returned wrong bytes",
            wrong
        )));
    }
    Ok(())
}
