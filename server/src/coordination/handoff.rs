//! Warm slot hand-off: for a while after this node gains slots from a node
//! that is still live (it joined, came back, or the list changed), a read of
//! a key of such a slot that misses here is read from the previous owner
//! (one hop, over the peer pool) and kept here, and a write here also
//! deletes the previous owner's copy, so that a later miss cannot bring an
//! old value back. Blocks are immutable, so that is all the coherence the
//! hand-off needs. Which slots, from whom and until when is the view's
//! ([`kvtier_cluster::topology::View::carry_handoff`]).
//!
//! The traffic to the previous owner is `CLUSTER HANDOFF GET|DEL`, which
//! names no keys: it runs there as it is, never forwarded or handed off
//! again, so two nodes whose views differ cannot pull from each other in a
//! loop.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_cluster::peer::Lane;
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use super::copies::write_through;
use super::forward::lane;
use crate::commands::{execute, flags, Args, Client, CommandSpec};
use crate::shard::Shard;

/// A key of a handed-off slot: the key, its slot, the node (index into the
/// view) it is handed off from.
type Handed = (Bytes, u16, usize);

/// The hand-off's part in routing a command that runs here: whether any of
/// its keys is in a slot handed off to this node. A write queued in MULTI
/// deletes the previous owner's old values now, ahead of EXEC (dropping
/// them early only costs a pull, never a wrong value; reads in MULTI do
/// not pull).
pub fn route_handoff(
    client: &Client,
    cluster: &Arc<Cluster>,
    view: &Rc<View>,
    spec: &CommandSpec,
    args: &Args,
) -> bool {
    let handed = handoff_keys(cluster, view, args);
    if handed.is_empty() {
        return false;
    }
    if client.multi.is_some() && spec.has(flags::WRITE) {
        for (_, slot, _) in &handed {
            cluster.handoff_write_started(*slot);
        }
        let (shard, cluster, lane) = (Rc::clone(&client.shard), Arc::clone(cluster), lane(client));
        let view = Rc::clone(view);
        tokio::task::spawn_local(async move {
            delete_on_previous(&shard, &cluster, &view, lane, handed).await;
        });
    }
    true
}

/// The keys of `args` in slots handed off to this node now, with the node
/// each is handed off from.
pub fn handoff_keys(cluster: &Cluster, view: &View, args: &Args) -> Vec<Handed> {
    if !view.has_handoff() {
        return Vec::new();
    }
    let now = kvtier_store::now_ms();
    args.keys
        .iter()
        .filter_map(|&(i, slot)| {
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
    // From here on, a pull under way for these keys keeps nothing.
    for (_, slot, _) in &keys {
        cluster.handoff_write_started(*slot);
    }
    let reply = write_through(client, spec, args).await;
    delete_on_previous(&client.shard, &cluster, &view, lane(client), keys).await;
    reply
}

/// Deletes `keys` on the nodes (of `view`) they are handed off from, and
/// waits (at most the node timeout: a previous owner that does not answer
/// is failing, and is no longer read from once it is marked failed).
async fn delete_on_previous(
    shard: &Rc<Shard>,
    cluster: &Arc<Cluster>,
    view: &View,
    lane: Lane,
    keys: Vec<Handed>,
) {
    let mut pending = Vec::new();
    for node in distinct(keys.iter().map(|k| k.2)) {
        let mut del = vec![
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"HANDOFF"),
            Bytes::from_static(b"DEL"),
        ];
        del.extend(keys.iter().filter(|k| k.2 == node).map(|k| k.0.clone()));
        let n = del.len() as u64 - 3;
        pending.push((
            n,
            shard
                .peers
                .send(&cluster.identity, &view.nodes[node], lane, del),
        ));
    }
    for (n, rx) in pending {
        if let Ok(Ok(_)) = kvtier_timer::timeout(cluster.node_timeout, rx).await {
            cluster.stats.handoff_deleted.fetch_add(n, Relaxed);
        }
    }
}

/// Reads the keys missing here from their previous owners and stores what
/// they have (with its expiry). A key whose slot saw a write start since
/// the pull began is not kept: checked on the shard that owns the key, in
/// the same step as the store, so a DEL cannot slip in between.
async fn pull(client: &mut Client, cluster: &Arc<Cluster>, view: &View, keys: Vec<Handed>) {
    if keys.is_empty() {
        return;
    }
    let writes: Vec<u32> = keys
        .iter()
        .map(|k| cluster.handoff_write_count(k.1))
        .collect();
    let keys: Vec<(Handed, u32)> = keys.into_iter().zip(writes).collect();
    let missing = missing_here(&client.shard, keys).await;
    if missing.is_empty() {
        return;
    }
    let lane = lane(client);
    let mut asked = Vec::new();
    for node in distinct(missing.iter().map(|k| k.0 .2)) {
        let mine: Vec<(Handed, u32)> = missing.iter().filter(|k| k.0 .2 == node).cloned().collect();
        let mut get = vec![
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"HANDOFF"),
            Bytes::from_static(b"GET"),
        ];
        get.extend(mine.iter().map(|k| k.0 .0.clone()));
        let rx = client
            .shard
            .peers
            .send(&cluster.identity, &view.nodes[node], lane, get);
        asked.push((mine, rx));
    }
    let now = kvtier_store::now_ms();
    let mut found = Vec::new();
    for (mine, rx) in asked {
        let Ok(Ok(Reply::Array(items))) = kvtier_timer::timeout(cluster.node_timeout, rx).await
        else {
            continue;
        };
        for ((handed, writes), item) in mine.into_iter().zip(items) {
            match item.into_array().as_deref() {
                // PTTL -1: no expiry; > 0: this many ms; 0 or -2: expired
                // between the two reads there.
                Some([Reply::Bulk(v), Reply::Int(ttl)]) if *ttl == -1 || *ttl > 0 => {
                    let expire_at = if *ttl > 0 { now + *ttl as u64 } else { 0 };
                    found.push((handed, writes, v.clone(), expire_at));
                }
                _ => {
                    cluster.stats.handoff_missed.fetch_add(1, Relaxed);
                }
            }
        }
    }
    let shard = &client.shard;
    for owner in distinct(found.iter().map(|f| shard.owner_of(f.0 .1))) {
        let theirs: Vec<_> = found
            .iter()
            .filter(|f| shard.owner_of(f.0 .1) == owner)
            .cloned()
            .collect();
        let cluster_for_shard = Arc::clone(cluster);
        let kept = shard
            .call(owner, move |s| {
                let now = kvtier_store::now_ms();
                let mut store = s.store.lock();
                let mut kept = 0;
                for ((key, slot, _), writes, value, expire_at) in theirs {
                    let unchanged = cluster_for_shard.handoff_write_count(slot) == writes;
                    if unchanged
                        && store.peek(slot, &key, now).is_none()
                        && store.insert(slot, &key, value, expire_at, now).is_ok()
                    {
                        kept += 1;
                    }
                }
                kept
            })
            .await
            .unwrap_or(0);
        cluster.stats.handoff_fetched.fetch_add(kept, Relaxed);
    }
}

/// The entries of `keys` that this node does not hold (looked up on the
/// shards owning them, one call per shard).
async fn missing_here(shard: &Rc<Shard>, keys: Vec<(Handed, u32)>) -> Vec<(Handed, u32)> {
    let now = kvtier_store::now_ms();
    let mut missing = Vec::new();
    for owner in distinct(keys.iter().map(|k| shard.owner_of(k.0 .1))) {
        let theirs: Vec<(Handed, u32)> = keys
            .iter()
            .filter(|k| shard.owner_of(k.0 .1) == owner)
            .cloned()
            .collect();
        let absent = shard
            .call(owner, move |s| {
                let mut store = s.store.lock();
                theirs
                    .into_iter()
                    .filter(|((key, slot, _), _)| store.peek(*slot, key, now).is_none())
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
