//! Cross-node coordination: what a node does with a command whose keys it
//! does not own. (What a node knows of the cluster — the view, its peers,
//! hot keys — is kvtier-cluster's; what a command needs is its spec's.)
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

mod copies;
mod multi_node;

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
pub use copies::{flush_through, on_all_copies, replicate_hot, uncopy, write_through};
use kvtier_cluster::peer::{call_once, Lane};
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::reply::RemoteReply;
use kvtier_protocol::Reply;
pub use multi_node::coordinate;
use tokio::sync::oneshot;

use crate::commands::{flags, is, table, Client, CommandSpec, Handler, KeyOp};
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
    if copies::served_by_copies(spec.name) && client.multi.is_none() {
        let copies = client.shard.copies.borrow();
        if !copies.is_empty() {
            if let Some(reply) = copies::answer_from_copies(&copies, spec.name, args, keys) {
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
    let target = &view.nodes[node];
    cluster.stats.forwarded.fetch_add(1, Relaxed);
    let rx = if blocking {
        let (tx, rx) = oneshot::channel();
        let (identity, addr) = (cluster.identity.clone(), target.addr().to_string());
        tokio::task::spawn_local(async move {
            if let Ok(reply) = call_once(&identity, &addr, lane.resp3, &args).await {
                let _ = tx.send(reply);
            }
        });
        rx
    } else {
        shard.peers.send(&cluster.identity, target, lane, args)
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
                    shard.peers.forget(node.addr());
                }
            }
            *cached = Some((version, Rc::clone(&view)));
            view
        }
    }
}
