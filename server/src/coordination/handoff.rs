//! Warm slot hand-off: for a while after this node gains slots from a node
//! that is still live (it joined, came back, or the list changed), a read of
//! a key of such a slot that misses here is read from the previous owner
//! (one hop, over the peer pool) and kept here, and a write here also
//! deletes the previous owner's copy, so that a later miss cannot bring an
//! old value back. Blocks are immutable, so that is all the coherence the
//! hand-off needs. Which slots, from whom and until when is the view's
//! ([`kvtier_cluster::topology::View::carry_handoff`]).

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use super::copies::write_through;
use super::lane;
use crate::commands::{execute, table, Args, Client, CommandSpec};
use crate::shard::Shard;

/// The keys of `args` in slots handed off to this node now, with the node
/// each is handed off from.
pub fn handoff_keys(cluster: &Cluster, view: &View, args: &Args) -> Vec<(Bytes, u16, usize)> {
    if !view.has_handoff() {
        return Vec::new();
    }
    let now = kvtier_store::now_ms();
    args.key_slots()
        .filter_map(|(i, slot)| {
            cluster
                .handoff_source(view, slot, now)
                .map(|prev| (args[i].clone(), slot, prev))
        })
        .collect()
}

/// A read of handed-off keys: those missing here are read from their
/// previous owner and kept, then the read runs here as usual.
pub async fn handoff_read(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    if let Some(cluster) = client.shard.shared.cluster.clone() {
        let view = client.shard.view();
        let keys = handoff_keys(&cluster, &view, &args);
        if !keys.is_empty() {
            pull(client, &cluster, &view, keys).await;
        }
    }
    execute(client, spec, args).await
}

/// A write of handed-off keys: their values are pulled first (so DEL
/// counts them, NX sees them, APPEND extends them), then it runs here
/// (dropping hot-key copies as any write does), then the keys are deleted
/// on their previous owner, then it replies.
pub async fn handoff_write(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    let Some(cluster) = client.shard.shared.cluster.clone() else {
        return execute(client, spec, args).await;
    };
    let view = client.shard.view();
    let keys = handoff_keys(&cluster, &view, &args);
    pull(client, &cluster, &view, keys.clone()).await;
    // A fetch under way must not keep what it read.
    cluster.handoff_writes.fetch_add(1, Relaxed);
    let reply = write_through(client, spec, args).await;
    delete_on_previous(&client.shard, &cluster, &view, lane(client), keys).await;
    reply
}

/// Deletes `keys` on the nodes they are handed off from, and waits (at most
/// the node timeout: a previous owner that does not answer is failing, and
/// its slots are no longer read from once it is marked failed).
pub async fn delete_on_previous(
    shard: &Rc<Shard>,
    cluster: &Arc<Cluster>,
    view: &View,
    lane: kvtier_cluster::peer::Lane,
    keys: Vec<(Bytes, u16, usize)>,
) {
    let mut pending = Vec::new();
    for node in distinct(keys.iter().map(|k| k.2)) {
        let mut del = vec![Bytes::from_static(b"DEL")];
        del.extend(keys.iter().filter(|k| k.2 == node).map(|k| k.0.clone()));
        let n = del.len() as u64 - 1;
        pending.push((
            n,
            shard
                .peers
                .send(&cluster.identity, &view.nodes[node], lane, del),
        ));
    }
    for (n, rx) in pending {
        if let Ok(Ok(_)) = tokio::time::timeout(cluster.node_timeout, rx).await {
            cluster.stats.handoff_deleted.fetch_add(n, Relaxed);
        }
    }
}

/// Reads the keys missing here from their previous owners and stores what
/// they have (with its expiry), unless a write to a handed-off key started
/// meanwhile.
async fn pull(
    client: &mut Client,
    cluster: &Arc<Cluster>,
    view: &View,
    keys: Vec<(Bytes, u16, usize)>,
) {
    let writes = cluster.handoff_writes.load(Relaxed);
    let missing = missing_here(&client.shard, keys).await;
    if missing.is_empty() {
        return;
    }
    let lane = lane(client);
    // Per previous owner: MGET of its keys, then each key's PTTL, pipelined
    // on the client's lane (in order).
    let mut asked = Vec::new();
    for node in distinct(missing.iter().map(|k| k.2)) {
        let mine: Vec<Bytes> = missing
            .iter()
            .filter(|k| k.2 == node)
            .map(|k| k.0.clone())
            .collect();
        let mut mget = vec![Bytes::from_static(b"MGET")];
        mget.extend(mine.iter().cloned());
        let target = &view.nodes[node];
        let values = client
            .shard
            .peers
            .send(&cluster.identity, target, lane, mget);
        let ttls: Vec<_> = mine
            .iter()
            .map(|k| {
                let pttl = vec![Bytes::from_static(b"PTTL"), k.clone()];
                client
                    .shard
                    .peers
                    .send(&cluster.identity, target, lane, pttl)
            })
            .collect();
        asked.push((mine, values, ttls));
    }
    let mut found = Vec::new();
    for (mine, values, ttls) in asked {
        let answer = async {
            let values = values.await.ok()?.into_array()?;
            let mut ttls_out = Vec::with_capacity(ttls.len());
            for rx in ttls {
                ttls_out.push(rx.await.ok()?.as_int()?);
            }
            Some((values, ttls_out))
        };
        let Ok(Some((values, ttls))) = tokio::time::timeout(cluster.node_timeout, answer).await
        else {
            continue;
        };
        for ((key, value), ttl) in mine.into_iter().zip(values).zip(ttls) {
            match value {
                // -2: expired between the two reads.
                Reply::Bulk(v) if ttl != -2 => found.push((key, v, ttl)),
                _ => {
                    cluster.stats.handoff_missed.fetch_add(1, Relaxed);
                }
            }
        }
    }
    if cluster.handoff_writes.load(Relaxed) != writes {
        return;
    }
    let set = table().get(b"set").expect("SET is in the table");
    for (key, value, ttl) in found {
        let mut list = vec![
            Bytes::from_static(b"SET"),
            key,
            value,
            Bytes::from_static(b"NX"),
        ];
        if ttl > 0 {
            list.push(Bytes::from_static(b"PX"));
            list.push(Bytes::from(ttl.to_string()));
        }
        if execute(client, set, Args::of(set, list)).await == Reply::ok() {
            cluster.stats.handoff_fetched.fetch_add(1, Relaxed);
        }
    }
}

/// The keys of `keys` that this node does not hold (looked up on the shards
/// owning them, one call per shard).
async fn missing_here(
    shard: &Rc<Shard>,
    keys: Vec<(Bytes, u16, usize)>,
) -> Vec<(Bytes, u16, usize)> {
    let now = kvtier_store::now_ms();
    let mut missing = Vec::new();
    for owner in distinct(keys.iter().map(|k| shard.owner_of(k.1))) {
        let theirs: Vec<(Bytes, u16, usize)> = keys
            .iter()
            .filter(|k| shard.owner_of(k.1) == owner)
            .cloned()
            .collect();
        let absent = shard
            .call(owner, move |s| {
                let mut store = s.store.lock();
                theirs
                    .into_iter()
                    .filter(|(key, slot, _)| store.peek(*slot, key, now).is_none())
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
        missing.extend(absent);
    }
    missing
}

/// The distinct values of `items`, in first-seen order.
fn distinct(items: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}
