//! Membership traffic: one task per peer pings it every node_timeout/5
//! with `CLUSTER PING id epoch list`; the answer carries the peer's epoch
//! and list, so the highest epoch (CLUSTER SETNODES) spreads. A peer that
//! stays silent for the node timeout is marked failed by
//! [`Cluster::refresh`], and its slots pass to live nodes
//! ([`crate::topology`]) until it answers again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::reply::encode_command;
use kvtier_protocol::{Reply, ReplyParser};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tracing::warn;

use crate::membership::{parse_announce, Cluster};
use crate::peer::{dial, PeerStream};
use crate::topology::{Endpoint, Node};

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
    let mut conn: Option<(PeerStream, BytesMut)> = None;
    loop {
        let (epoch, list) = cluster.list_text();
        let mut ping = vec![
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"PING"),
            Bytes::from(cluster.me.clone()),
            Bytes::from(epoch.to_string()),
            Bytes::from(list),
        ];
        ping.extend(cluster.announce_args());
        let ping = encode_command(&ping);
        let exchange = async {
            if conn.is_none() {
                let mut stream = dial(node.addr(), &cluster.identity).await?;
                let mut buf = BytesMut::new();
                for hello in cluster.identity.handshake(false) {
                    stream.write_all(&encode_command(&hello)).await?;
                    stream.flush().await?; // TLS keeps records until flushed
                    read_reply(&mut stream, &mut buf).await?;
                }
                conn = Some((stream, buf));
            }
            let (stream, buf) = conn.as_mut().expect("connected above");
            stream.write_all(&ping).await?;
            stream.flush().await?;
            read_reply(stream, buf).await
        };
        // Half the node timeout: a slow link (a WAN's round trips, the
        // handshake of a new connection) is not a dead peer.
        let patience = (cluster.node_timeout / 2).max(Duration::from_millis(200));
        let answer = tokio::time::timeout(patience, exchange).await;
        match answer {
            Ok(Ok(Reply::Array(items))) => {
                cluster.heard_from(&node.id);
                if let Some((epoch, list, endpoint)) = pong_fields(&items) {
                    cluster.gossip(&node.id, epoch, &list, endpoint);
                }
            }
            _ => conn = None,
        }
        tokio::time::sleep(interval).await;
    }
}

/// A ping's answer: `[epoch, list]` and, when the peer announces an
/// endpoint, `ip port hostname`.
fn pong_fields(items: &[Reply]) -> Option<(u64, String, Option<Endpoint>)> {
    let (epoch, list, rest) = match items {
        [Reply::Int(e), Reply::Bulk(l), rest @ ..] => (*e, l, rest),
        _ => return None,
    };
    let endpoint = match rest {
        [Reply::Bulk(ip), Reply::Bulk(port), Reply::Bulk(host)] => parse_announce(ip, port, host),
        _ => None,
    };
    Some((
        epoch.max(0) as u64,
        String::from_utf8_lossy(list).into_owned(),
        endpoint,
    ))
}

async fn read_reply(stream: &mut PeerStream, buf: &mut BytesMut) -> std::io::Result<Reply> {
    ReplyParser::<Reply>::new().read_from(stream, buf).await
}
