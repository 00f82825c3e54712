//! What a node does with a command whose keys it does not own.
//!
//! * Every key on this node: the command runs here, as on a single server.
//! * Every key on one other node: forwarded to it over the shard's pooled
//!   connection (one hop), or, with `--cluster-redirect yes` and a single
//!   slot, answered `-MOVED slot host:port` as Redis Cluster does.
//! * Keys on several nodes: the multi-key commands and the block dialect
//!   are coordinated here ([`coordinate`]): one sub-command per node, sent
//!   in parallel, merged in key order; prefix commands stop at the first
//!   miss of any node. Any other command gets Redis's CROSSSLOT error.
//! * Commands a peer forwarded (its connection said `CLUSTER PEER`) always
//!   run here: a disagreement between views costs at most one hop.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_protocol::reply::RemoteReply;
use kvtier_protocol::Reply;
use tokio::sync::oneshot;

use super::peer::Lane;
use super::topology::View;
use super::Cluster;
use super::{hot, peer};
use crate::commands::{
    block, flags, is, parse_int, table, Client, CommandSpec, Handler, KeyOp, LocalBoxFuture,
};
use crate::shard::slot::key_slot;
use crate::shard::Shard;

/// Where a command goes.
pub enum Decision {
    /// Run it here.
    Local,
    /// Answer this without running it (MOVED, CROSSSLOT).
    Reply(Reply),
    /// Send it to this node (index into the view) and relay the reply.
    Forward(usize),
    /// Spread it over the nodes that own its keys.
    Coordinate,
}

/// Multi-key commands a node coordinates across nodes.
const COORDINATED: &[&str] = &[
    "mget",
    "mset",
    "del",
    "unlink",
    "exists",
    "touch",
    "mexists",
    "prefixlen",
    "mgetprefix",
    "msetblock",
];

/// Decides where `args` (for `spec`, keys at `keys`) runs.
pub fn decide(
    client: &Client,
    cluster: &Cluster,
    view: &View,
    spec: &CommandSpec,
    args: &[Bytes],
    keys: Option<&[usize]>,
) -> Decision {
    if spec.keys.first <= 0 || spec.name == "watch" {
        return Decision::Local;
    }
    // A bad key count is the command's own error to report.
    let Some(keys) = keys else {
        return Decision::Local;
    };
    let Some(&first) = keys.first() else {
        return Decision::Local;
    };
    let slot = key_slot(&args[first]);
    let owner = view.owner(slot);
    let mut one_slot = true;
    let mut one_node = true;
    let mut all_mine = view.me == Some(owner);
    for &i in &keys[1..] {
        let s = key_slot(&args[i]);
        one_slot &= s == slot;
        let o = view.owner(s);
        one_node &= o == owner;
        all_mine &= view.me == Some(o);
    }
    if all_mine {
        return Decision::Local;
    }
    if hot::served_by_copies(spec.name) && client.multi.is_none() {
        let copies = client.shard.copies.borrow();
        if !copies.is_empty() {
            if let Some(reply) = hot::answer_from_copies(&copies, spec.name, args, keys) {
                cluster.stats.replica_hits.fetch_add(1, Relaxed);
                return Decision::Reply(reply);
            }
            if keys.iter().any(|&i| copies.get(&args[i]).is_some()) {
                cluster.stats.replica_misses.fetch_add(1, Relaxed);
            }
        }
    }
    if one_node {
        // A READONLY client reading from a replica of the slot: read
        // through from the owner rather than redirecting.
        let replica_read = client.readonly
            && spec.has(flags::READONLY)
            && view
                .me
                .is_some_and(|me| view.replicas(slot, cluster.hot_replicas).contains(&me));
        if cluster.redirect && one_slot && !replica_read {
            cluster.stats.moved.fetch_add(1, Relaxed);
            return Decision::Reply(moved(view, slot));
        }
        return Decision::Forward(owner);
    }
    if COORDINATED.contains(&spec.name) {
        return Decision::Coordinate;
    }
    Decision::Reply(Reply::error(
        "CROSSSLOT Keys in request don't hash to the same slot",
    ))
}

/// `MOVED slot host:port`.
pub fn moved(view: &View, slot: u16) -> Reply {
    Reply::error(format!(
        "MOVED {slot} {}",
        view.nodes[view.owner(slot)].addr()
    ))
}

/// Sends `args` to node `node` and returns the pending reply. Commands that
/// block get a connection of their own.
pub fn forward(
    shard: &Rc<Shard>,
    cluster: &Cluster,
    view: &View,
    node: usize,
    lane: Lane,
    args: Vec<Bytes>,
    blocking: bool,
) -> Reply {
    let resp3 = lane.resp3;
    let target = &view.nodes[node];
    cluster.stats.forwarded.fetch_add(1, Relaxed);
    let password = shard.shared.config.password();
    let rx = if blocking {
        let (tx, rx) = oneshot::channel();
        let addr = target.addr();
        let me = cluster.me.clone();
        tokio::task::spawn_local(async move {
            if let Ok(reply) = peer::call_once(&addr, resp3, password.as_deref(), &me, &args).await
            {
                let _ = tx.send(reply);
            }
        });
        rx
    } else {
        shard
            .peers
            .send(&target.addr(), lane, password, &cluster.me, &args)
    };
    Reply::Remote(RemoteReply::new(rx, target.id.clone()))
}

/// The pooled connection `client`'s forwarded commands take.
pub fn lane(client: &Client) -> Lane {
    Lane {
        resp3: client.resp3,
        id: client.id(),
    }
}

/// Whether a call blocks (MGETPREFIX ... BLOCK).
pub fn blocks(spec: &CommandSpec, args: &[Bytes]) -> bool {
    spec.has(flags::BLOCKING) && args.iter().any(|a| is(a, "block"))
}

/// The coordinator of a multi-key command over several nodes, in the shape
/// of an async command body.
pub fn coordinate(client: &mut Client, args: Vec<Bytes>) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let Some(cluster) = client.shard.shared.cluster.clone() else {
            return Reply::error("ERR This instance has cluster support disabled");
        };
        cluster.stats.coordinated.fetch_add(1, Relaxed);
        let view = client.shard.view();
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        match name.as_str() {
            "mget" => positional(client, &cluster, &view, &args).await,
            "mset" => all_ok(client, &cluster, &view, &args).await,
            "del" | "unlink" | "exists" | "touch" => sum(client, &cluster, &view, &args).await,
            "mexists" => mexists(client, &cluster, &view, &args).await,
            "prefixlen" => prefix_len(client, &cluster, &view, &args).await,
            "mgetprefix" => mget_prefix(client, &cluster, &view, &args).await,
            "msetblock" => mset_block(client, &cluster, &view, &args).await,
            _ => Reply::error("CROSSSLOT Keys in request don't hash to the same slot"),
        }
    })
}

/// One node's share of a command: which of the command's keys (by their
/// position among the keys) it holds, and the sub-command it gets.
struct Part {
    node: usize,
    positions: Vec<usize>,
    args: Vec<Bytes>,
}

/// Groups key positions `0..count` by owner, in order of first appearance.
fn group<'a>(
    view: &View,
    count: usize,
    key: impl Fn(usize) -> &'a [u8],
) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for p in 0..count {
        let node = view.owner(key_slot(key(p)));
        match groups.iter_mut().find(|(n, _)| *n == node) {
            Some((_, ps)) => ps.push(p),
            None => groups.push((node, vec![p])),
        }
    }
    groups
}

/// Runs the parts: remote ones sent first (in parallel), then local ones
/// here, then the remote replies collected. Replies in part order.
async fn run_parts(
    client: &mut Client,
    cluster: &Cluster,
    view: &View,
    parts: &[Part],
    blocking: bool,
) -> Vec<Reply> {
    let mut pending: Vec<Option<Reply>> = parts
        .iter()
        .map(|p| {
            (view.me != Some(p.node)).then(|| {
                forward(
                    &client.shard,
                    cluster,
                    view,
                    p.node,
                    lane(client),
                    p.args.clone(),
                    blocking,
                )
            })
        })
        .collect();
    let mut out = Vec::with_capacity(parts.len());
    for (part, remote) in parts.iter().zip(pending.iter_mut()) {
        let reply = match remote.take() {
            Some(r) => r,
            None if writes(&part.args) && cluster.has_replicated() => {
                write_through(client, part.args.clone()).await
            }
            None => run_local(client, part.args.clone()).await,
        };
        out.push(reply);
    }
    let mut resolved = Vec::with_capacity(out.len());
    for r in out {
        resolved.push(if r.has_pending() {
            r.resolve().await
        } else {
            r
        });
    }
    resolved
}

/// Whether `args` is a write command.
fn writes(args: &[Bytes]) -> bool {
    table()
        .lookup(&args[0])
        .is_some_and(|(_, spec)| spec.has(flags::WRITE))
}

/// Runs a command on this node, whatever shards its keys live on.
pub async fn run_local(client: &mut Client, args: Vec<Bytes>) -> Reply {
    let Some((_, spec)) = table().lookup(&args[0]) else {
        return Reply::error("ERR unknown command");
    };
    match spec.handler {
        Handler::Async(f) => f(client, args).await,
        Handler::Sync(f) => f(client, &args),
        Handler::Key(f) => {
            let key_index = spec.keys.first as usize;
            let slot = key_slot(&args[key_index]);
            let owner = client.shard.owner_of(slot);
            let op = KeyOp {
                args,
                key_index,
                slot,
                touch: !client.no_touch,
            };
            let now = kvtier_store::now_ms();
            client
                .shard
                .call(owner, move |s| f(&mut s.store.borrow_mut(), &op, now))
                .await
                .unwrap_or_else(|_| Reply::error("ERR server is shutting down"))
        }
        Handler::Parent => Reply::error("ERR unknown subcommand"),
    }
}

fn first_error(replies: &[Reply]) -> Option<Reply> {
    replies.iter().find(|r| r.is_error()).cloned()
}

/// The parts of `NAME key [key ...]` (`step` 1) or `NAME key value [key
/// value ...]` (`step` 2): each node gets the name and its own keys (with
/// their values), in order.
fn split(view: &View, args: &[Bytes], step: usize) -> Vec<Part> {
    let count = (args.len() - 1) / step;
    group(view, count, |p| &args[1 + p * step])
        .into_iter()
        .map(|(node, positions)| {
            let mut sub = Vec::with_capacity(1 + positions.len() * step);
            sub.push(args[0].clone());
            for &p in &positions {
                sub.extend_from_slice(&args[1 + p * step..1 + (p + 1) * step]);
            }
            Part {
                node,
                positions,
                args: sub,
            }
        })
        .collect()
}

/// MGET: values placed back by key position.
async fn positional(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    let parts = split(view, args, 1);
    let replies = run_parts(client, cluster, view, &parts, false).await;
    merge_positions(args.len() - 1, &parts, replies)
}

/// Places each part's array items at their key positions.
fn merge_positions(count: usize, parts: &[Part], replies: Vec<Reply>) -> Reply {
    if let Some(e) = first_error(&replies) {
        return e;
    }
    let mut out = vec![Reply::Nil; count];
    for (part, reply) in parts.iter().zip(replies) {
        let Reply::Array(items) = reply else {
            return Reply::error("ERR cluster: unexpected reply from a peer");
        };
        for (&p, item) in part.positions.iter().zip(items) {
            out[p] = item;
        }
    }
    Reply::Array(out)
}

/// MSET over several nodes: OK when every node stored its pairs.
async fn all_ok(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    if args.len().is_multiple_of(2) {
        return crate::commands::arity_error("mset");
    }
    let parts = split(view, args, 2);
    let replies = run_parts(client, cluster, view, &parts, false).await;
    first_error(&replies).unwrap_or(Reply::status("OK"))
}

/// DEL, UNLINK, EXISTS, TOUCH: the nodes' counts added up.
async fn sum(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    let parts = split(view, args, 1);
    let replies = run_parts(client, cluster, view, &parts, false).await;
    if let Some(e) = first_error(&replies) {
        return e;
    }
    Reply::Int(
        replies
            .iter()
            .map(|r| if let Reply::Int(n) = r { *n } else { 0 })
            .sum(),
    )
}

/// The parts of a `NAME numkeys key [key ...] [options]` command; `opts`
/// gives each node's options from its key positions.
fn counted_parts(
    view: &View,
    args: &[Bytes],
    step: usize,
    opts: impl Fn(&[usize]) -> Vec<Bytes>,
) -> (usize, Vec<Part>) {
    let n = parse_int(&args[1]).unwrap_or(0).max(0) as usize;
    let parts = group(view, n, |p| &args[2 + p * step])
        .into_iter()
        .map(|(node, positions)| {
            let mut sub = vec![args[0].clone(), Bytes::from(positions.len().to_string())];
            for &p in &positions {
                sub.extend_from_slice(&args[2 + p * step..2 + p * step + step]);
            }
            sub.extend(opts(&positions));
            Part {
                node,
                positions,
                args: sub,
            }
        })
        .collect();
    (n, parts)
}

/// `numkeys` keys and nothing after them, with the single-node errors.
fn exact_count(args: &[Bytes]) -> Result<(), Reply> {
    let (_, end) = block::parse_count(args, 1, "numkeys")?;
    if end != args.len() {
        return Err(crate::commands::syntax_error());
    }
    Ok(())
}

/// MEXISTS: per-key answers placed by position.
async fn mexists(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    if let Err(e) = exact_count(args) {
        return e;
    }
    let (n, parts) = counted_parts(view, args, 1, |_| Vec::new());
    let replies = run_parts(client, cluster, view, &parts, false).await;
    merge_positions(n, &parts, replies)
}

/// The first key position (of `n`) that some node lacks: each node knows
/// how many of its own keys, in order, are present.
fn first_miss(n: usize, parts: &[Part], present: impl Fn(usize) -> usize) -> usize {
    parts
        .iter()
        .enumerate()
        .filter_map(|(i, part)| part.positions.get(present(i)).copied())
        .min()
        .unwrap_or(n)
}

/// PREFIXLEN: each node's own leading run, the earliest miss wins.
async fn prefix_len(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    if let Err(e) = exact_count(args) {
        return e;
    }
    let (n, parts) = counted_parts(view, args, 1, |_| Vec::new());
    let replies = run_parts(client, cluster, view, &parts, false).await;
    if let Some(e) = first_error(&replies) {
        return e;
    }
    let counts: Vec<usize> = replies
        .iter()
        .map(|r| {
            if let Reply::Int(c) = r {
                (*c).max(0) as usize
            } else {
                0
            }
        })
        .collect();
    Reply::Int(first_miss(n, &parts, |i| counts[i]) as i64)
}

/// MGETPREFIX: each node returns its own leading run (waiting, with BLOCK,
/// for its share of the first MIN keys); the prefix ends at the earliest
/// miss of any node, and MAXBYTES is applied to the merged prefix.
async fn mget_prefix(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    let read = match block::parse_prefix_read(args) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let n = read.end - 2;
    let max_bytes = read.max_bytes;
    let block = read.block_ms.map(|ms| Bytes::from(ms.to_string()));
    let wanted = read.min;
    let node_opts = |positions: &[usize]| {
        let mut o = Vec::new();
        if let Some(b) = max_bytes {
            o.push(Bytes::from_static(b"MAXBYTES"));
            o.push(Bytes::from(b.to_string()));
        }
        if let Some(ms) = &block {
            let share = positions.iter().filter(|&&p| p < wanted).count();
            if share > 0 {
                o.push(Bytes::from_static(b"BLOCK"));
                o.push(ms.clone());
                o.push(Bytes::from_static(b"MIN"));
                o.push(Bytes::from(share.to_string()));
            }
        }
        o
    };
    let (_, parts) = counted_parts(view, args, 1, node_opts);
    let replies = run_parts(client, cluster, view, &parts, block.is_some()).await;
    if let Some(e) = first_error(&replies) {
        return e;
    }
    let runs: Vec<Vec<Reply>> = replies
        .into_iter()
        .map(|r| {
            if let Reply::Array(items) = r {
                items
            } else {
                Vec::new()
            }
        })
        .collect();
    let end = first_miss(n, &parts, |i| runs[i].len());
    let mut out = vec![Reply::Nil; end];
    for (part, run) in parts.iter().zip(runs) {
        for (&p, item) in part.positions.iter().zip(run) {
            if p < end {
                out[p] = item;
            }
        }
    }
    if let Some(limit) = max_bytes {
        let mut total = 0u64;
        let keep = out
            .iter()
            .take_while(|r| {
                total += if let Reply::Bulk(b) = r {
                    b.len() as u64
                } else {
                    0
                };
                total <= limit
            })
            .count();
        out.truncate(keep);
    }
    Reply::Array(out)
}

/// MSETBLOCK: without CHAIN, every node stores its blocks in parallel; with
/// CHAIN, runs of consecutive blocks of one node are stored one run after
/// another, each naming the previous run's last block as its parent, so
/// the chain is published in order across nodes too.
async fn mset_block(client: &mut Client, cluster: &Cluster, view: &View, args: &[Bytes]) -> Reply {
    let (n, end) = match block::parse_count(args, 2, "numblocks") {
        Ok(found) => found,
        Err(e) => return e,
    };
    let parsed = match block::parse_set_options(args, end) {
        Ok(o) => o,
        Err(e) => return e,
    };
    // The options every node gets: expiry and REPLACE as sent.
    let opts = &args[end..];
    let mut common = Vec::new();
    let mut i = 0;
    while i < opts.len() {
        if is(&opts[i], "ex") || is(&opts[i], "px") {
            common.extend_from_slice(&opts[i..i + 2]);
            i += 2;
        } else if is(&opts[i], "chain") {
            let named = opts.get(i + 1).is_some_and(|w| is(w, "parent")) && i + 2 < opts.len();
            i += if named { 3 } else { 1 };
        } else {
            common.push(opts[i].clone()); // REPLACE
            i += 1;
        }
    }
    let (chain, mut parent) = (parsed.chain, parsed.parent);
    if !chain {
        let (_, parts) = counted_parts(view, args, 2, |_| common.clone());
        let replies = run_parts(client, cluster, view, &parts, false).await;
        return merge_positions(n, &parts, replies);
    }
    // Runs of consecutive blocks on one node, stored in chain order.
    let mut out = vec![Reply::Nil; n];
    let mut start = 0;
    while start < n {
        let key = |p: usize| &args[2 + 2 * p];
        let node = view.owner(key_slot(key(start)));
        let mut end = start + 1;
        while end < n && view.owner(key_slot(key(end))) == node {
            end += 1;
        }
        let mut sub = vec![args[0].clone(), Bytes::from((end - start).to_string())];
        sub.extend_from_slice(&args[2 + 2 * start..2 + 2 * end]);
        sub.extend_from_slice(&common);
        sub.push(Bytes::from_static(b"CHAIN"));
        if let Some(p) = &parent {
            sub.push(Bytes::from_static(b"PARENT"));
            sub.push(p.clone());
        }
        let part = Part {
            node,
            positions: (start..end).collect(),
            args: sub,
        };
        let reply = run_parts(client, cluster, view, std::slice::from_ref(&part), false)
            .await
            .pop()
            .unwrap_or(Reply::Nil);
        if reply.is_error() {
            return reply;
        }
        let Reply::Array(items) = reply else {
            return Reply::error("ERR cluster: unexpected reply from a peer");
        };
        let failed = items.iter().any(|r| matches!(r, Reply::Int(n) if *n < 0));
        for (p, item) in (start..end).zip(items) {
            out[p] = item;
        }
        if failed {
            // As on one node: a chain is not stored past a block that
            // could not be stored.
            for slot in out.iter_mut().skip(end) {
                *slot = Reply::Int(-1);
            }
            return Reply::Array(out);
        }
        parent = Some(key(end - 1).clone());
        start = end;
    }
    Reply::Array(out)
}

/// The view a shard uses, refreshed when the cluster's changes.
///
/// Each shard keeps its own copy (an `Rc`), taken when the version changes:
/// the per-command handle is then a plain counter on this thread, not an
/// atomic on a cache line every shard writes.
pub fn shard_view(shard: &Shard, cluster: &Arc<Cluster>) -> Rc<View> {
    let version = cluster.version();
    let mut cached = shard.view_cache.borrow_mut();
    match &*cached {
        Some((v, view)) if *v == version => Rc::clone(view),
        _ => {
            let view = Rc::new(View::clone(&cluster.view()));
            // Connections to nodes now failed (or no longer members) go.
            for (node, alive) in view.nodes.iter().zip(&view.alive) {
                if !alive {
                    shard.peers.forget(&node.addr());
                }
            }
            *cached = Some((version, Rc::clone(&view)));
            view
        }
    }
}

/// A write to keys that have copies elsewhere: run it here, then drop the
/// copies, and only then reply (once DEL returns, no node serves the key).
pub fn write_through(client: &mut Client, args: Vec<Bytes>) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let reply = run_local(client, args.clone()).await;
        if let Some(cluster) = client.shard.shared.cluster.clone() {
            let keys = table()
                .lookup(&args[0])
                .and_then(|(_, spec)| spec.key_indexes(&args))
                .unwrap_or_default();
            let taken: Vec<(Bytes, Vec<String>)> = keys
                .iter()
                .filter_map(|&i| {
                    cluster
                        .take_replicated(&args[i])
                        .map(|n| (args[i].clone(), n))
                })
                .collect();
            hot::uncopy(&client.shard, &cluster, taken).await;
        }
        reply
    })
}

/// FLUSHALL / FLUSHDB in a cluster: also drops every copy this node made
/// elsewhere and every copy it holds.
pub fn flush_through(client: &mut Client, args: Vec<Bytes>) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let reply = run_local(client, args).await;
        if let Some(cluster) = client.shard.shared.cluster.clone() {
            let taken = cluster.take_all_replicated().into_iter().collect();
            hot::uncopy(&client.shard, &cluster, taken).await;
            hot::on_all_copies(&client.shard, |c| {
                c.clear();
                true
            })
            .await;
        }
        reply
    })
}
