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
mod forward;
mod handoff;
mod multi_node;

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
pub use copies::{flush_through, replicate_hot, uncopy, write_through};
use forward::{forward, lane};
pub use handoff::{handoff_read, handoff_write};
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;
pub use multi_node::coordinate;

use crate::commands::{flags, is, Args, Client, CommandSpec, LocalBoxFuture, Spread};

/// Where a command runs in a cluster, as the connection needs to know.
pub enum Routed {
    /// Here, as on a single server.
    Here(Args),
    /// Here, by one of the cluster's paths.
    Through(Through, Args),
    /// Answered without running here (MOVED, CROSSSLOT, or the owner's
    /// reply to the forwarded command).
    Done(Reply),
}

/// A cluster path a command runs by on this node (the connection starts
/// [`coordinate`], [`write_through`] or [`flush_through`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Through {
    /// Its keys live on several nodes: spread as its spec says.
    Coordinate,
    /// A write to keys with copies elsewhere: run, then drop the copies,
    /// then reply.
    WriteThrough,
    /// FLUSHALL / FLUSHDB: run, then drop every copy made and held.
    FlushThrough,
    /// A read of keys in slots handed off to this node: misses are read
    /// from the previous owner first.
    HandoffRead,
    /// A write of keys in slots handed off to this node: run, then delete
    /// them on the previous owner, then reply.
    HandoffWrite,
}

impl Through {
    /// Runs the command by this path.
    pub fn start<'a>(
        self,
        client: &'a mut Client,
        spec: &'static CommandSpec,
        args: Args,
    ) -> LocalBoxFuture<'a> {
        match self {
            Through::Coordinate => Box::pin(coordinate(client, spec, args)),
            Through::WriteThrough => Box::pin(write_through(client, spec, args)),
            Through::FlushThrough => Box::pin(flush_through(client, spec, args)),
            Through::HandoffRead => Box::pin(handoff_read(client, spec, args)),
            Through::HandoffWrite => Box::pin(handoff_write(client, spec, args)),
        }
    }
}

/// Where a command runs: here (by its own handler or a cluster path), or
/// answered now. Reads run here are counted for hot-key detection.
pub fn route(
    client: &mut Client,
    cluster: &Arc<Cluster>,
    spec: &'static CommandSpec,
    args: Args,
) -> Routed {
    let view = client.shard.view();
    let decision = if client.peer {
        Decision::Local
    } else {
        decide(client, cluster, &view, spec, &args)
    };
    match decision {
        Decision::Local => here(client, cluster, &view, spec, args),
        Decision::Reply(reply) => Routed::Done(reply),
        _ if client.multi.is_some() => Routed::Done(Reply::error(
            "CROSSSLOT a transaction can only use keys of the node it runs on",
        )),
        Decision::Forward(node) => {
            Routed::Done(forward_to(client, cluster, &view, node, spec, args))
        }
        Decision::Coordinate => Routed::Through(Through::Coordinate, args),
    }
}

/// Forwards a command whose keys are all on node `node`.
fn forward_to(
    client: &Client,
    cluster: &Cluster,
    view: &View,
    node: usize,
    spec: &CommandSpec,
    args: Args,
) -> Reply {
    if spec.has(flags::WRITE) {
        // A read later in this pipeline must not answer from the copy this
        // write is about to replace.
        let mut copies = client.shard.copies.borrow_mut();
        if !copies.is_empty() {
            for (i, _) in args.key_slots() {
                copies.invalidate(&args[i]);
            }
        }
    }
    let blocking = blocks(spec, &args);
    forward(
        &client.shard,
        cluster,
        view,
        node,
        lane(client),
        args.into_vec(),
        blocking,
    )
}

/// A command that runs on this node: reads are counted for hot-key
/// detection; reads and writes of slots handed off to this node, flushes,
/// and writes to keys with copies elsewhere take their cluster path.
fn here(
    client: &Client,
    cluster: &Arc<Cluster>,
    view: &Rc<View>,
    spec: &'static CommandSpec,
    args: Args,
) -> Routed {
    let in_multi = client.multi.is_some();
    let handed = handoff::handoff_keys(cluster, view, &args);
    let handoff = !handed.is_empty();
    if handoff && in_multi && spec.has(flags::WRITE) {
        // Queued in MULTI: the previous owner's old values go now, ahead of
        // EXEC (dropping them early only costs a pull, never a wrong value;
        // reads in MULTI do not pull).
        for (_, slot, _) in &handed {
            cluster.handoff_write_started(*slot);
        }
        let (shard, cluster, lane) = (Rc::clone(&client.shard), Arc::clone(cluster), lane(client));
        let view = Rc::clone(view);
        tokio::task::spawn_local(async move {
            handoff::delete_on_previous(&shard, &cluster, &view, lane, handed).await;
        });
    }
    if spec.has(flags::READONLY) {
        copies::count_reads(client, cluster, &args);
        if handoff && !in_multi {
            return Routed::Through(Through::HandoffRead, args);
        }
    } else if spec.has(flags::FLUSH) {
        return Routed::Through(Through::FlushThrough, args);
    } else if spec.has(flags::WRITE) && handoff && !in_multi {
        return Routed::Through(Through::HandoffWrite, args);
    } else if spec.has(flags::WRITE)
        && cluster.has_replicated()
        && args
            .key_slots()
            .any(|(i, _)| cluster.is_replicated(&args[i]))
    {
        if !in_multi {
            return Routed::Through(Through::WriteThrough, args);
        }
        // Queued in MULTI: the copies go now, ahead of EXEC.
        let keys: Vec<usize> = args.key_slots().map(|(i, _)| i).collect();
        let taken = copies::take_replicated(cluster, &args, &keys);
        let (shard, cluster) = (Rc::clone(&client.shard), Arc::clone(cluster));
        tokio::task::spawn_local(async move {
            uncopy(&shard, &cluster, taken).await;
        });
    }
    Routed::Here(args)
}

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

/// Decides where `args` (for `spec`, keys at `keys`) runs.
pub fn decide(
    client: &Client,
    cluster: &Cluster,
    view: &View,
    spec: &CommandSpec,
    args: &Args,
) -> Decision {
    if spec.keys.first <= 0 || spec.has(flags::HERE) {
        return Decision::Local;
    }
    // No keys found (none, or a bad key count: the command's own error to
    // report).
    let mut keys = args.key_slots();
    let Some((_, slot)) = keys.next() else {
        return Decision::Local;
    };
    let owner = view.owner(slot);
    let mut one_slot = true;
    let mut one_node = true;
    let mut all_mine = view.me == Some(owner);
    for (_, s) in keys {
        one_slot &= s == slot;
        let o = view.owner(s);
        one_node &= o == owner;
        all_mine &= view.me == Some(o);
    }
    if all_mine {
        return Decision::Local;
    }
    if spec.from_copies.is_some() && client.multi.is_none() {
        let copies = client.shard.copies.borrow();
        if !copies.is_empty() {
            if let Some(reply) = copies::answer_from_copies(&copies, spec, args) {
                cluster.stats.replica_hits.fetch_add(1, Relaxed);
                return Decision::Reply(reply);
            }
            // (A command spread over nodes tries the copies again part by
            // part: not a miss yet.)
            let spread = !one_node && spec.spread != Spread::No;
            if !spread
                && args
                    .key_slots()
                    .any(|(i, _)| copies.get(&args[i]).is_some())
            {
                cluster.stats.replica_misses.fetch_add(1, Relaxed);
            }
        }
    }
    if one_node {
        // A READONLY client reading from a replica of the slot: read
        // through from the owner rather than redirecting.
        let replica_read = cluster.replica_reads
            && client.readonly
            && spec.has(flags::READONLY)
            && view
                .me
                .is_some_and(|me| view.replicas(slot, cluster.hot_replicas).contains(&me));
        if cluster.redirect && one_slot && !replica_read {
            cluster.stats.moved.fetch_add(1, Relaxed);
            return Decision::Reply(moved(cluster, view, slot));
        }
        return Decision::Forward(owner);
    }
    if spec.spread != Spread::No {
        return Decision::Coordinate;
    }
    Decision::Reply(Reply::error(
        "CROSSSLOT Keys in request don't hash to the same slot",
    ))
}

/// `MOVED slot endpoint:port`, naming the owner as topology replies do.
pub fn moved(cluster: &Cluster, view: &View, slot: u16) -> Reply {
    let e = &view.endpoints[view.owner(slot)];
    Reply::error(format!(
        "MOVED {slot} {}:{}",
        e.preferred(cluster.hostname_first),
        e.port
    ))
}

/// Whether a call blocks (MGETPREFIX ... BLOCK).
pub fn blocks(spec: &CommandSpec, args: &[Bytes]) -> bool {
    spec.has(flags::BLOCKING) && args.iter().any(|a| is(a, "block"))
}
