//! Hot-key copies, as commands see them: which reads a copy may answer
//! and how, the writes that must drop copies before they reply, and the
//! once-a-window driver that copies this node's hot keys out (the exchange
//! with the replicas is kvtier-cluster's).

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_cluster::hot::{Copies, Current};
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use super::place::Place;
use crate::commands::{execute, flags, Args, Client, CommandSpec};
use crate::shard::slot::key_slot;
use crate::shard::Shard;

/// What the hot-key copies make of a command on its way
/// ([`super::route`]).
pub enum ByCopies {
    /// A read of keys elsewhere every one of which has a copy here: its
    /// reply.
    Answered(Reply),
    /// A write, outside MULTI, to keys with copies elsewhere: it runs by
    /// [`write_through`] (or by the hand-off's write path, which drops
    /// them too).
    WriteThrough,
    /// Nothing for the copies to change.
    Pass,
}

/// The copies' part in routing a command whose keys live at `place`: a
/// read of keys elsewhere is answered from the copies here when every key
/// has one (hits and misses counted); a read run here is counted for
/// hot-key detection; a write run here to keys with copies elsewhere goes
/// by [`write_through`] (queued in MULTI, the copies are dropped now,
/// ahead of EXEC); a write forwarded to the owner first drops this shard's
/// copies of its keys.
pub fn route_copies(
    client: &Client,
    cluster: &Arc<Cluster>,
    spec: &CommandSpec,
    args: &Args,
    place: Place,
) -> ByCopies {
    let in_multi = client.multi.is_some();
    if place == Place::Here {
        if spec.has(flags::READONLY) {
            count_reads(client, cluster, args);
        } else if spec.has(flags::WRITE)
            && !spec.has(flags::FLUSH)
            && cluster.has_replicated()
            && args
                .keys
                .iter()
                .any(|&(i, _)| cluster.is_replicated(&args[i]))
        {
            if !in_multi {
                return ByCopies::WriteThrough;
            }
            let taken = take_replicated(cluster, args);
            let (shard, cluster) = (Rc::clone(&client.shard), Arc::clone(cluster));
            tokio::task::spawn_local(async move {
                uncopy(&shard, &cluster, taken).await;
            });
        }
        return ByCopies::Pass;
    }
    if spec.from_copies.is_some() && !in_multi {
        let copies = client.shard.copies.borrow();
        if !copies.is_empty() {
            if let Some(reply) = answer_from_copies(&copies, spec, args) {
                cluster.stats.replica_hits.fetch_add(1, Relaxed);
                return ByCopies::Answered(reply);
            }
            // (A command spread over nodes tries the copies again part by
            // part: not a miss yet.)
            if place != Place::Coordinate
                && args
                    .keys
                    .iter()
                    .any(|&(i, _)| copies.get(&args[i]).is_some())
            {
                cluster.stats.replica_misses.fetch_add(1, Relaxed);
            }
        }
    }
    if matches!(place, Place::Forward(_)) && spec.has(flags::WRITE) && !in_multi {
        // A read later in this pipeline must not answer from the copy this
        // write is about to replace.
        let mut copies = client.shard.copies.borrow_mut();
        if !copies.is_empty() {
            for &(i, _) in args.keys.iter() {
                copies.invalidate(&args[i]);
            }
        }
    }
    ByCopies::Pass
}

/// Answers a read from this shard's copies, if the command can be (its
/// spec says how) and every key has one.
pub fn answer_from_copies(copies: &Copies, spec: &CommandSpec, args: &Args) -> Option<Reply> {
    let answer = spec.from_copies?;
    let values: Vec<&Bytes> = args
        .keys
        .iter()
        .map(|&(i, _)| copies.get(&args[i]))
        .collect::<Option<Vec<_>>>()?;
    answer(&values, args)
}

/// Counts a read of `args`' keys that runs on this node (whole, or as this
/// node's part of a command spread over nodes) for hot-key detection.
pub fn count_reads(client: &Client, cluster: &Cluster, args: &Args) {
    if cluster.hot_threshold > 0 {
        let mut hot = client.shard.hot.borrow_mut();
        for &(i, _) in args.keys.iter() {
            hot.record(&args[i]);
        }
    }
}

/// Once a window, on shard 0: copies the node's hot keys to their replicas
/// and renews the leases of those still hot.
pub async fn replicate_hot(shard: &Rc<Shard>, cluster: &Arc<Cluster>) {
    let hot = cluster.aggregate_hot();
    let view = shard.view();
    let mine: Vec<Bytes> = hot
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| view.owns(key_slot(k)))
        .collect();
    // Keys no longer hot: their copies lapse with the lease.
    cluster.forget_replicated(&mine);
    let mut read = Vec::with_capacity(mine.len());
    for key in mine {
        if cluster.start_copy(&view, &key) {
            let current = current_value(shard, key.clone()).await;
            read.push((key, current));
        }
    }
    cluster.finish_copies(&shard.peers, &view, read).await;
}

/// The owner's value of `key` now, read on the shard that holds it.
async fn current_value(shard: &Shard, key: Bytes) -> Current {
    let slot = key_slot(&key);
    let now = kvtier_store::now_ms();
    shard
        .call(shard.owner_of(slot), move |s| {
            let mut store = s.store.lock();
            let Some(expire_at) = store.peek(slot, &key, now).map(|e| e.expire_at) else {
                return Current::Absent;
            };
            match store.fetch(slot, &key, now) {
                Some(kvtier_store::Fetched::Now(v)) => Current::Value(v, expire_at),
                // On disk: copies lapse with their lease (the read promotes it).
                Some(_) => Current::Unknown,
                None => Current::Absent,
            }
        })
        .await
        .unwrap_or(Current::Unknown)
}

/// Tells every node holding a copy of one of `keys` to drop it, and waits.
pub async fn uncopy(shard: &Shard, cluster: &Cluster, keys: Vec<(Bytes, Vec<String>)>) {
    if keys.is_empty() {
        return;
    }
    let view = shard.view();
    cluster.uncopy(&shard.peers, &view, keys).await;
}

/// A write to keys that have copies elsewhere: run it here, then drop the
/// copies, and only then reply (once DEL returns, no node serves the key).
pub async fn write_through(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    let reply = execute(client, spec, args.clone()).await;
    if let Some(cluster) = client.shard.shared.cluster.clone() {
        let taken = take_replicated(&cluster, &args);
        uncopy(&client.shard, &cluster, taken).await;
    }
    reply
}

/// The keys of `args` that have copies, with the nodes holding them, taken
/// from the record (their copies are about to be dropped).
fn take_replicated(cluster: &Cluster, args: &Args) -> Vec<(Bytes, Vec<String>)> {
    args.keys
        .iter()
        .filter_map(|&(i, _)| {
            cluster
                .take_replicated(&args[i])
                .map(|n| (args[i].clone(), n))
        })
        .collect()
}

/// FLUSHALL / FLUSHDB in a cluster: also drops every copy this node made
/// elsewhere and every copy it holds.
pub async fn flush_through(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    let reply = execute(client, spec, args).await;
    if let Some(cluster) = client.shard.shared.cluster.clone() {
        // Nothing is to be read back from previous owners either.
        cluster.end_handoff();
        let taken = cluster.take_all_replicated().into_iter().collect();
        uncopy(&client.shard, &cluster, taken).await;
        client
            .shard
            .on_all_copies(|c| {
                c.clear();
                true
            })
            .await;
    }
    reply
}
