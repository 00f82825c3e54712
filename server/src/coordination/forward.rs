//! Sending a command to another node: the one hop a forwarded command
//! takes, over the shard's pooled connection for the client's lane.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use kvtier_cluster::peer::{call_once, Lane};
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::reply::RemoteReply;
use kvtier_protocol::Reply;
use tokio::sync::oneshot;

use crate::commands::Client;
use crate::shard::Shard;

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
    Reply::Remote(RemoteReply::new(rx, target.name()))
}

/// The pooled connection `client`'s forwarded commands take.
pub fn lane(client: &Client) -> Lane {
    Lane {
        resp3: client.resp3,
        id: client.id(),
    }
}
