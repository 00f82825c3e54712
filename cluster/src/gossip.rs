//! Membership traffic: one task per peer pings it every node_timeout/5
//! with `CLUSTER PING id epoch list`; the answer carries the peer's epoch
//! and list, so the highest epoch (CLUSTER SETNODES) spreads. A peer that
//! stays silent for the node timeout is marked failed by
//! [`Cluster::refresh`], and its slots pass to the next node in rendezvous
//! order until it answers again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::reply::encode_command;
use kvtier_protocol::{Reply, ReplyParser};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::warn;

use crate::topology::{format_nodes, Node};
use crate::Cluster;

/// Starts the gossip thread: every peer is pinged a few times per node
/// timeout, each by its own task with its own connection, and liveness is
/// recomputed after every round. Ends at shutdown.
pub fn start(
    cluster: Arc<Cluster>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvtier-cluster".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    warn!("cluster gossip: cannot start its runtime: {e}");
                    return;
                }
            };
            runtime.block_on(gossip_loop(cluster, shutdown));
        })
}

async fn gossip_loop(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let interval =
        (cluster.node_timeout / 5).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut pingers: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        let (_, nodes) = cluster.members();
        pingers.retain(|key, task| {
            // A member's pinger that ended (it should not) is started again.
            let keep = nodes.iter().any(|n| &n.to_string() == key) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for node in nodes.into_iter().filter(|n| n.id != cluster.me) {
            let key = node.to_string();
            pingers
                .entry(key)
                .or_insert_with(|| tokio::spawn(ping_peer(Arc::clone(&cluster), node, interval)));
        }
        cluster.refresh();
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => break,
        }
    }
    for task in pingers.values() {
        task.abort();
    }
}

/// Pings one peer every `interval` for as long as it is a member.
async fn ping_peer(cluster: Arc<Cluster>, node: Node, interval: Duration) {
    let mut conn: Option<(TcpStream, BytesMut)> = None;
    loop {
        let (epoch, nodes) = cluster.members();
        let ping = encode_command(&[
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"PING"),
            Bytes::from(cluster.me.clone()),
            Bytes::from(epoch.to_string()),
            Bytes::from(format_nodes(&nodes)),
        ]);
        let exchange = async {
            if conn.is_none() {
                let mut stream = TcpStream::connect(node.addr()).await?;
                let _ = stream.set_nodelay(true);
                let mut buf = BytesMut::new();
                for hello in cluster.identity.handshake(false) {
                    stream.write_all(&encode_command(&hello)).await?;
                    read_reply(&mut stream, &mut buf).await?;
                }
                conn = Some((stream, buf));
            }
            let (stream, buf) = conn.as_mut().expect("connected above");
            stream.write_all(&ping).await?;
            read_reply(stream, buf).await
        };
        let answer = tokio::time::timeout(interval.max(Duration::from_millis(200)), exchange).await;
        match answer {
            Ok(Ok(Reply::Array(items))) => {
                cluster.heard_from(&node.id);
                if let [Reply::Int(epoch), Reply::Bulk(list)] = items.as_slice() {
                    cluster.gossip(&node.id, *epoch as u64, &String::from_utf8_lossy(list));
                }
            }
            _ => conn = None,
        }
        tokio::time::sleep(interval).await;
    }
}

async fn read_reply(stream: &mut TcpStream, buf: &mut BytesMut) -> std::io::Result<Reply> {
    ReplyParser::<Reply>::new().read_from(stream, buf).await
}
