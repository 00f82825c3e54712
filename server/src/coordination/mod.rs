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
mod place;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use copies::ByCopies;
pub use copies::{flush_through, replicate_hot, uncopy, write_through};
use forward::{forward, lane};
pub use handoff::{handoff_read, handoff_write};
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;
pub use multi_node::coordinate;
use place::{place, Place};

use crate::commands::{flags, is, Args, Client, CommandSpec, LocalBoxFuture};

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
/// answered now. One pass, each part of the cluster asked once, in order:
/// where the keys live ([`place`]), the slots handed off to this node
/// ([`handoff`], for a command run here), the hot-key copies ([`copies`]:
/// a read they answer, reads counted, copies a write drops), and the one
/// hop to the owner ([`forward`]).
pub fn route(
    client: &mut Client,
    cluster: &Arc<Cluster>,
    spec: &'static CommandSpec,
    args: Args,
) -> Routed {
    let view = client.shard.view();
    let in_multi = client.multi.is_some();
    let place = if client.peer {
        Place::Here
    } else {
        place(client, cluster, &view, spec, &args)
    };
    let handed =
        place == Place::Here && handoff::route_handoff(client, cluster, &view, spec, &args);
    match copies::route_copies(client, cluster, spec, &args, place) {
        ByCopies::Answered(reply) => return Routed::Done(reply),
        ByCopies::WriteThrough if !handed => {
            return Routed::Through(Through::WriteThrough, args);
        }
        _ => {}
    }
    match place {
        // Reads and writes of slots handed off to this node and flushes
        // take their paths (writes to keys with copies elsewhere were sent
        // on theirs above).
        Place::Here if spec.has(flags::READONLY) && handed && !in_multi => {
            Routed::Through(Through::HandoffRead, args)
        }
        Place::Here if spec.has(flags::FLUSH) && !spec.has(flags::READONLY) => {
            Routed::Through(Through::FlushThrough, args)
        }
        Place::Here
            if spec.has(flags::WRITE) && !spec.has(flags::READONLY) && handed && !in_multi =>
        {
            Routed::Through(Through::HandoffWrite, args)
        }
        Place::Here => Routed::Here(args),
        Place::Moved(slot) => {
            cluster.stats.moved.fetch_add(1, Relaxed);
            Routed::Done(moved(cluster, &view, slot))
        }
        Place::CrossSlot => Routed::Done(Reply::error(
            "CROSSSLOT Keys in request don't hash to the same slot",
        )),
        _ if in_multi => Routed::Done(Reply::error(
            "CROSSSLOT a transaction can only use keys of the node it runs on",
        )),
        Place::Forward(node) => {
            let blocking = blocks(spec, &args);
            Routed::Done(forward(
                &client.shard,
                cluster,
                &view,
                node,
                lane(client),
                args.into_vec(),
                blocking,
            ))
        }
        Place::Coordinate => Routed::Through(Through::Coordinate, args),
    }
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
