//! CLUSTER and its subcommands, READONLY, READWRITE and ASKING: the
//! topology cluster-aware clients read (SLOTS, SHARDS, NODES, ...), the
//! administration of the node list (SETNODES), hot keys (HOTKEYS), and the
//! internal messages between nodes (PING, PEER, COPY, LEASE, UNCOPY).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_cluster::hot;
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use super::flags::*;
use super::help_reply;
use super::{parse_int, Args, Client, CommandSpec, Handler, LocalBoxFuture, DEFAULTS};
use crate::acl::category;
use crate::shard::slot::{key_slot, SLOTS};
use crate::shard::ShardGone;

const SUB: CommandSpec = CommandSpec {
    arity: 2,
    flags: STALE,
    group: "cluster",
    since: "3.0.0",
    ..DEFAULTS
};

/// CLUSTER, READONLY, READWRITE, ASKING.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "cluster",
        arity: -2,
        flags: 0,
        summary: "A container for Redis Cluster commands.",
        complexity: "Depends on subcommand.",
        subcommands: &[
            CommandSpec {
                name: "cluster|slots",
                since: "3.0.0",
                summary: "Returns the mapping of cluster slots to nodes.",
                complexity: "O(N) where N is the total number of Cluster nodes",
                handler: Handler::Sync(slots),
                ..SUB
            },
            CommandSpec {
                name: "cluster|shards",
                since: "7.0.0",
                summary: "Returns the mapping of cluster slots to shards.",
                complexity: "O(N) where N is the total number of cluster nodes",
                handler: Handler::Sync(shards),
                ..SUB
            },
            CommandSpec {
                name: "cluster|nodes",
                summary: "Returns the cluster configuration for a node.",
                complexity: "O(N) where N is the total number of Cluster nodes",
                handler: Handler::Sync(nodes),
                ..SUB
            },
            CommandSpec {
                name: "cluster|myid",
                summary: "Returns the ID of a node.",
                handler: Handler::Sync(myid),
                ..SUB
            },
            CommandSpec {
                name: "cluster|myshardid",
                since: "7.2.0",
                summary: "Returns the shard ID of a node.",
                handler: Handler::Sync(myid),
                ..SUB
            },
            CommandSpec {
                name: "cluster|info",
                summary: "Returns information about the state of a node.",
                handler: Handler::Sync(info),
                ..SUB
            },
            CommandSpec {
                name: "cluster|keyslot",
                arity: 3,
                summary: "Returns the hash slot for a key.",
                complexity: "O(N) where N is the number of bytes in the key",
                syntax: "key",
                handler: Handler::Sync(keyslot),
                ..SUB
            },
            CommandSpec {
                name: "cluster|countkeysinslot",
                arity: 3,
                summary: "Returns the number of keys in a hash slot.",
                syntax: "slot:integer",
                handler: Handler::Async(countkeysinslot),
                ..SUB
            },
            CommandSpec {
                name: "cluster|getkeysinslot",
                arity: 4,
                summary: "Returns the key names in a hash slot.",
                complexity: "O(N) where N is the number of requested keys",
                syntax: "slot:integer count:integer",
                handler: Handler::Async(getkeysinslot),
                ..SUB
            },
            CommandSpec {
                name: "cluster|setnodes",
                arity: 4,
                flags: ADMIN | STALE,
                since: "0.1.0",
                summary: "Sets the cluster's node list (ID@HOST:PORT,...) under a higher epoch; it spreads to every node.",
                syntax: "nodes epoch:integer",
                handler: Handler::Sync(setnodes),
                ..SUB
            },
            CommandSpec {
                name: "cluster|hotkeys",
                // It names keys whatever the caller's key fences.
                flags: ADMIN | STALE,
                since: "0.1.0",
                summary: "Lists the hot keys this node counted, with reads per second and the nodes holding copies.",
                handler: Handler::Sync(hotkeys),
                ..SUB
            },
            CommandSpec {
                name: "cluster|ping",
                arity: -5,
                flags: ADMIN | STALE | FAST,
                since: "0.1.0",
                summary: "Internal: a peer's liveness ping carrying its epoch and node list.",
                syntax: "node-id epoch:integer nodes [ip port:integer hostname]",
                handler: Handler::Sync(ping),
                ..SUB
            },
            CommandSpec {
                name: "cluster|handoff",
                flags: ADMIN | STALE,
                arity: -4,
                since: "0.1.0",
                summary: "Internal: a slot's new owner reads (GET: value and PTTL of each key) or deletes (DEL) keys here during a hand-off; never handed off again.",
                syntax: "GET|DEL key [key ...]",
                handler: Handler::Async(handoff),
                ..SUB
            },
            CommandSpec {
                name: "cluster|peer",
                // Internal: @admin, so ACL users cannot pose as a peer.
                flags: ADMIN | STALE,
                arity: 3,
                since: "0.1.0",
                summary: "Internal: marks the connection as a peer's (its commands run here, never forwarded).",
                syntax: "node-id",
                handler: Handler::Sync(peer),
                ..SUB
            },
            CommandSpec {
                name: "cluster|copy",
                flags: ADMIN | STALE,
                arity: 6,
                since: "0.1.0",
                summary: "Internal: stores a copy of an owner's hot key.",
                syntax: "key value expire-at-ms:integer lease-ms:integer",
                handler: Handler::Async(copy),
                ..SUB
            },
            CommandSpec {
                name: "cluster|lease",
                flags: ADMIN | STALE,
                arity: 5,
                since: "0.1.0",
                summary: "Internal: renews the lease of a hot key's copy if it is a copy of the value with this CRC32C.",
                syntax: "key lease-ms:integer digest:integer",
                handler: Handler::Async(lease),
                ..SUB
            },
            CommandSpec {
                name: "cluster|uncopy",
                flags: ADMIN | STALE,
                arity: -3,
                since: "0.1.0",
                summary: "Internal: drops copies of keys that were written or deleted.",
                syntax: "key [key ...]",
                handler: Handler::Async(uncopy),
                ..SUB
            },
            CommandSpec {
                name: "cluster|help",
                since: "5.0.0",
                summary: "Returns helpful text about the different subcommands.",
                handler: Handler::Sync(help),
                ..SUB
            },
        ],
        ..SUB
    },
    CommandSpec {
        name: "readonly",
        categories: category::CONNECTION,
        arity: 1,
        flags: FAST | LOADING | STALE,
        group: "cluster",
        summary: "Enables read-only queries for a connection to a Redis Cluster replica node.",
        handler: Handler::Sync(readonly),
        ..SUB
    },
    CommandSpec {
        name: "readwrite",
        categories: category::CONNECTION,
        arity: 1,
        flags: FAST | LOADING | STALE,
        group: "cluster",
        summary: "Enables read-write queries for a connection to a Redis Cluster replica node.",
        handler: Handler::Sync(readwrite),
        ..SUB
    },
    CommandSpec {
        name: "asking",
        categories: category::CONNECTION,
        arity: 1,
        flags: FAST,
        group: "cluster",
        summary: "Signals that a cluster client is following an -ASK redirect.",
        handler: Handler::Sync(asking),
        ..SUB
    },
];

/// The cluster, for the internal messages: accepted only on connections
/// that said `CLUSTER PEER`.
fn peer_only(client: &Client) -> Result<Arc<Cluster>, Reply> {
    let cluster = cluster(client).ok_or_else(disabled)?;
    if !client.peer {
        return Err(Reply::error(
            "ERR this CLUSTER subcommand is for cluster peers",
        ));
    }
    Ok(cluster)
}

fn disabled() -> Reply {
    Reply::error("ERR This instance has cluster support disabled")
}

fn cluster(client: &Client) -> Option<Arc<Cluster>> {
    client.shard.shared.cluster.clone()
}

macro_rules! with_cluster {
    ($client:expr) => {
        match cluster($client) {
            Some(c) => (c, $client.shard.view()),
            None => return disabled(),
        }
    };
}

/// How many replicas the topology lists per slot: the hot-key replicas
/// when replica reads are on, else none (every node is a primary of its own
/// slots and of nothing else).
fn listed_replicas(cluster: &Cluster) -> usize {
    if cluster.replica_reads {
        cluster.hot_replicas
    } else {
        0
    }
}

/// `[endpoint, port, id, {hostname | ip}]` as CLUSTER SLOTS lists a node
/// (Redis 7: the map has the name the endpoint is not).
fn node_entry(view: &View, i: usize, hostname_first: bool) -> Reply {
    let e = &view.endpoints[i];
    let mut extra = Vec::new();
    if hostname_first && !e.hostname.is_empty() {
        extra.push((Reply::bulk("ip"), Reply::bulk(&e.ip)));
    } else if !e.hostname.is_empty() {
        extra.push((Reply::bulk("hostname"), Reply::bulk(&e.hostname)));
    }
    Reply::Array(vec![
        Reply::bulk(e.preferred(hostname_first)),
        Reply::Int(e.port as i64),
        Reply::bulk(&view.nodes[i].id),
        Reply::Map(extra),
    ])
}

/// The CLUSTER SLOTS reply of `view`, listing `replicas` per range.
pub fn slots_reply(view: &View, replicas: usize, hostname_first: bool) -> Reply {
    Reply::Array(
        view.ranges(replicas)
            .into_iter()
            .map(|(first, last, holders)| {
                let mut entry = vec![Reply::Int(first as i64), Reply::Int(last as i64)];
                entry.extend(holders.iter().map(|&i| node_entry(view, i, hostname_first)));
                Reply::Array(entry)
            })
            .collect(),
    )
}

fn slots(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, view) = with_cluster!(client);
    slots_reply(&view, listed_replicas(&cluster), cluster.hostname_first)
}

/// One owner's slot ranges and the nodes replicating some of them.
type Holdings = (Vec<(u16, u16)>, Vec<usize>);

fn by_owner(view: &View, replicas: usize) -> Vec<Holdings> {
    let mut out: Vec<Holdings> = vec![(Vec::new(), Vec::new()); view.nodes.len()];
    for (first, last, holders) in view.ranges(replicas) {
        let Some(&owner) = holders.first() else {
            continue;
        };
        let (ranges, replicas) = &mut out[owner];
        match ranges.last_mut() {
            Some((_, l)) if *l + 1 == first => *l = last,
            _ => ranges.push((first, last)),
        }
        for &r in &holders[1..] {
            if !replicas.contains(&r) {
                replicas.push(r);
            }
        }
    }
    out
}

/// The CLUSTER SHARDS reply of `view`.
pub fn shards_reply(view: &View, replicas: usize, hostname_first: bool) -> Reply {
    let node = |i: usize, role: &'static str| {
        let e = &view.endpoints[i];
        let mut fields = vec![
            (Reply::bulk("id"), Reply::bulk(&view.nodes[i].id)),
            (Reply::bulk("port"), Reply::Int(e.port as i64)),
            (Reply::bulk("ip"), Reply::bulk(&e.ip)),
            (
                Reply::bulk("endpoint"),
                Reply::bulk(e.preferred(hostname_first)),
            ),
        ];
        if !e.hostname.is_empty() {
            fields.push((Reply::bulk("hostname"), Reply::bulk(&e.hostname)));
        }
        fields.extend([
            (Reply::bulk("role"), Reply::bulk(role)),
            (Reply::bulk("replication-offset"), Reply::Int(0)),
            (
                Reply::bulk("health"),
                Reply::bulk(if view.alive[i] { "online" } else { "failed" }),
            ),
        ]);
        Reply::Map(fields)
    };
    Reply::Array(
        by_owner(view, replicas)
            .into_iter()
            .enumerate()
            .filter(|(_, (ranges, _))| !ranges.is_empty())
            .map(|(owner, (ranges, replicas))| {
                let slots = ranges
                    .iter()
                    .flat_map(|&(f, l)| [Reply::Int(f as i64), Reply::Int(l as i64)])
                    .collect();
                let mut nodes = vec![node(owner, "master")];
                nodes.extend(replicas.into_iter().map(|r| node(r, "replica")));
                Reply::Map(vec![
                    (Reply::bulk("slots"), Reply::Array(slots)),
                    (Reply::bulk("nodes"), Reply::Array(nodes)),
                ])
            })
            .collect(),
    )
}

fn shards(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, view) = with_cluster!(client);
    shards_reply(&view, listed_replicas(&cluster), cluster.hostname_first)
}

/// The CLUSTER NODES text of `view`; `pong_ms` gives the time a node was
/// last heard from (Unix milliseconds, Redis's `pong-recv`).
pub fn nodes_text(view: &View, pong_ms: impl Fn(&str) -> u64) -> String {
    let mut out = String::new();
    for (i, (ranges, _)) in by_owner(view, 0).into_iter().enumerate() {
        let (n, e) = (&view.nodes[i], &view.endpoints[i]);
        let mut flags = Vec::new();
        if view.me == Some(i) {
            flags.push("myself");
        }
        flags.push("master");
        if !view.alive[i] {
            flags.push("fail");
        }
        let hostname = if e.hostname.is_empty() {
            String::new()
        } else {
            format!(",{}", e.hostname)
        };
        let mut line = format!(
            "{} {}:{}@0{hostname} {} - 0 {} {} {}",
            n.id,
            e.ip,
            e.port,
            flags.join(","),
            if view.me == Some(i) {
                0
            } else {
                pong_ms(&n.id)
            },
            view.epoch,
            if view.alive[i] {
                "connected"
            } else {
                "disconnected"
            }
        );
        for (f, l) in ranges {
            if f == l {
                line.push_str(&format!(" {f}"));
            } else {
                line.push_str(&format!(" {f}-{l}"));
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn nodes(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, view) = with_cluster!(client);
    let seen = cluster.last_seen();
    let now_ms = kvtier_store::now_ms();
    let text = nodes_text(&view, |id| {
        seen.get(id)
            .map_or(0, |d| now_ms.saturating_sub(d.as_millis() as u64))
    });
    Reply::Verbatim(Bytes::from(text))
}

fn myid(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, _) = with_cluster!(client);
    Reply::bulk(&cluster.me)
}

fn info(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, view) = with_cluster!(client);
    let live = view.alive.iter().filter(|a| **a).count();
    let owners = view.slot_counts().iter().filter(|&&c| c > 0).count();
    let failed = view.alive.iter().filter(|a| !**a).count();
    let text = format!(
        "cluster_state:ok\r\n\
         cluster_slots_assigned:{SLOTS}\r\n\
         cluster_slots_ok:{SLOTS}\r\n\
         cluster_slots_pfail:0\r\n\
         cluster_slots_fail:0\r\n\
         cluster_known_nodes:{}\r\n\
         cluster_live_nodes:{live}\r\n\
         cluster_failed_nodes:{failed}\r\n\
         cluster_size:{owners}\r\n\
         cluster_current_epoch:{}\r\n\
         cluster_my_epoch:{}\r\n\
         cluster_placement:ranges\r\n\
         cluster_mode:{}\r\n\
         cluster_node_timeout:{}\r\n\
         cluster_uptime_in_seconds:{}\r\n",
        view.nodes.len(),
        view.epoch,
        view.epoch,
        if cluster.redirect {
            "redirect"
        } else {
            "forward"
        },
        cluster.node_timeout.as_millis(),
        cluster.uptime().as_secs(),
    );
    Reply::Verbatim(Bytes::from(text))
}

fn keyslot(client: &mut Client, args: &[Bytes]) -> Reply {
    let _ = with_cluster!(client);
    Reply::Int(key_slot(&args[2]) as i64)
}

fn parse_slot(arg: &Bytes) -> Result<u16, Reply> {
    match parse_int(arg) {
        Some(s) if (0..SLOTS as i64).contains(&s) => Ok(s as u16),
        Some(_) => Err(Reply::error("ERR Invalid slot")),
        None => Err(Reply::error("ERR Invalid slot")),
    }
}

/// The slot argument of a per-slot command, in cluster mode.
fn slot_here(client: &Client, arg: &Bytes) -> Result<u16, Reply> {
    if cluster(client).is_none() {
        return Err(disabled());
    }
    parse_slot(arg)
}

fn countkeysinslot(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let slot = match slot_here(client, &args[2]) {
            Ok(s) => s,
            Err(e) => return e,
        };
        let owner = client.shard.owner_of(slot);
        let now = kvtier_store::now_ms();
        client
            .shard
            .call(owner, move |s| {
                s.store.lock().count_in_slot(slot as usize, now) as i64
            })
            .await
            .map_or_else(|_| Reply::from(ShardGone), Reply::Int)
    })
}

fn getkeysinslot(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let slot = match slot_here(client, &args[2]) {
            Ok(s) => s,
            Err(e) => return e,
        };
        let count = match parse_int(&args[3]) {
            Some(c) if c >= 0 => c as usize,
            _ => return Reply::error("ERR Invalid number of keys"),
        };
        let owner = client.shard.owner_of(slot);
        let now = kvtier_store::now_ms();
        client
            .shard
            .call(owner, move |s| {
                s.store
                    .lock()
                    .keys_in_slot(slot as usize, count, now)
                    .into_iter()
                    .map(Reply::Bulk)
                    .collect::<Vec<_>>()
            })
            .await
            .map_or_else(|_| Reply::from(ShardGone), Reply::Array)
    })
}

fn setnodes(client: &mut Client, args: &[Bytes]) -> Reply {
    let (cluster, _) = with_cluster!(client);
    let Some(epoch) = parse_int(&args[3]).filter(|&e| e >= 0) else {
        return Reply::error("ERR Invalid epoch");
    };
    match cluster.set_nodes(&String::from_utf8_lossy(&args[2]), epoch as u64) {
        Ok(()) => Reply::ok(),
        Err(e) => Reply::error(format!("ERR {e}")),
    }
}

fn hotkeys(client: &mut Client, _: &[Bytes]) -> Reply {
    let (cluster, _) = with_cluster!(client);
    Reply::Array(
        cluster
            .hot_keys()
            .into_iter()
            .map(|(key, rate, copies)| {
                Reply::Array(vec![
                    Reply::Bulk(key),
                    Reply::Int(rate.round() as i64),
                    Reply::Array(copies.iter().map(Reply::bulk).collect()),
                ])
            })
            .collect(),
    )
}

fn ping(client: &mut Client, args: &[Bytes]) -> Reply {
    let cluster = match peer_only(client) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let Some(epoch) = parse_int(&args[3]).filter(|&e| e >= 0) else {
        return Reply::error("ERR Invalid epoch");
    };
    let endpoint = match &args[5..] {
        [] => None,
        [ip, port, hostname] => match kvtier_cluster::parse_announce(ip, port, hostname) {
            Some(e) => Some(e),
            None => return Reply::error("ERR Invalid announced endpoint"),
        },
        _ => return Reply::error("ERR wrong number of arguments for 'cluster|ping' command"),
    };
    let (epoch, list) = cluster.gossip(
        &String::from_utf8_lossy(&args[2]),
        epoch as u64,
        &String::from_utf8_lossy(&args[4]),
        endpoint,
    );
    let mut answer = vec![Reply::Int(epoch as i64), Reply::bulk(list)];
    answer.extend(cluster.announce_args().into_iter().map(Reply::Bulk));
    Reply::Array(answer)
}

/// `CLUSTER HANDOFF GET|DEL key...`, from a slot's new owner: runs here
/// as it is (it names no keys, so it is never forwarded nor handed off
/// again: a hand-off cannot loop between two nodes whose views differ).
/// GET answers `[value or nil, pttl]` per key.
fn handoff(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if let Err(e) = peer_only(client) {
            return e;
        }
        let keys = args[3..].to_vec();
        let run = |name: &'static str, list: Vec<Bytes>| {
            let spec = client.commands.get(name.as_bytes()).expect("in the table");
            (spec, Args::of(spec, list))
        };
        match args[2].to_ascii_lowercase().as_slice() {
            b"del" => {
                let mut list = vec![Bytes::from_static(b"DEL")];
                list.extend(keys);
                let (spec, args) = run("del", list);
                super::execute(client, spec, args).await
            }
            b"get" => {
                let mut list = vec![Bytes::from_static(b"MGET")];
                list.extend(keys.iter().cloned());
                let (spec, mget) = run("mget", list);
                let values = super::execute(client, spec, mget)
                    .await
                    .resolve()
                    .await
                    .into_array()
                    .unwrap_or_default();
                let mut out = Vec::with_capacity(keys.len());
                for (key, value) in keys.into_iter().zip(values) {
                    let (spec, pttl) = run("pttl", vec![Bytes::from_static(b"PTTL"), key]);
                    let ttl = super::execute(client, spec, pttl).await;
                    out.push(Reply::Array(vec![value, ttl]));
                }
                Reply::Array(out)
            }
            _ => super::syntax_error(),
        }
    })
}

fn peer(client: &mut Client, _: &[Bytes]) -> Reply {
    let _ = with_cluster!(client);
    // A peer's commands are not checked again: only the user peers log in
    // as (masteruser) or one allowed everything may become one.
    let config = &client.shard.shared.config;
    let is_masteruser = config
        .masteruser
        .read()
        .is_ok_and(|m| *m == client.user.name);
    if !client.user.unrestricted() && !is_masteruser {
        return Reply::error(
            "NOPERM only the cluster's peer user (masteruser) may say CLUSTER PEER",
        );
    }
    client.peer = true;
    Reply::ok()
}

fn copy(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let cluster = match peer_only(client) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let (Some(expire_at), Some(lease)) = (
            parse_int(&args[4]).filter(|&n| n >= 0),
            parse_int(&args[5]).filter(|&n| n > 0),
        ) else {
            return Reply::error("ERR value is not an integer or out of range");
        };
        let (key, value) = (args[2].clone(), args[3].clone());
        let lease = Duration::from_millis(lease as u64).min(hot::LEASE);
        let stored = client
            .shard
            .on_all_copies(move |c| c.insert(key.clone(), value.clone(), expire_at as u64, lease))
            .await;
        if stored {
            cluster.stats.copies_received.fetch_add(1, Relaxed);
        }
        Reply::Int(stored as i64)
    })
}

fn lease(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if let Err(e) = peer_only(client) {
            return e;
        }
        let (Some(lease), Some(digest)) = (
            parse_int(&args[3]).filter(|&n| n > 0),
            parse_int(&args[4]).filter(|&n| (0..=u32::MAX as i64).contains(&n)),
        ) else {
            return Reply::error("ERR value is not an integer or out of range");
        };
        let key = args[2].clone();
        let lease = Duration::from_millis(lease as u64);
        let renewed = client
            .shard
            .on_all_copies(move |c| c.renew(&key, lease, digest as u32))
            .await;
        Reply::Int(renewed as i64)
    })
}

fn uncopy(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if let Err(e) = peer_only(client) {
            return e;
        }
        let keys: Vec<Bytes> = args[2..].to_vec();
        let n = keys.len() as i64;
        client
            .shard
            .on_all_copies(move |c| {
                keys.iter().for_each(|k| c.invalidate(k));
                true
            })
            .await;
        Reply::Int(n)
    })
}

fn help(_: &mut Client, _: &[Bytes]) -> Reply {
    help_reply(
        "CLUSTER",
        &[
            "SLOTS",
            "    Return information about slots range mappings.",
            "SHARDS",
            "    Return information about slot ranges and the nodes holding them.",
            "NODES",
            "    Return cluster configuration seen by node.",
            "MYID",
            "    Return the node id.",
            "INFO",
            "    Return information about the cluster.",
            "KEYSLOT <key>",
            "    Return the hash slot for <key>.",
            "COUNTKEYSINSLOT <slot>",
            "    Return the number of keys in <slot>.",
            "GETKEYSINSLOT <slot> <count>",
            "    Return key names stored by current node in a slot.",
            "SETNODES <id@host:port,...> <epoch>",
            "    Set the node list for the whole cluster (the highest epoch wins); new",
            "    members join and missing ones leave at <epoch>.",
            "HOTKEYS",
            "    List hot keys with their reads per second and the nodes holding copies.",
        ],
    )
}

fn readonly(client: &mut Client, _: &[Bytes]) -> Reply {
    let _ = with_cluster!(client);
    client.readonly = true;
    Reply::ok()
}

fn readwrite(client: &mut Client, _: &[Bytes]) -> Reply {
    let _ = with_cluster!(client);
    client.readonly = false;
    Reply::ok()
}

fn asking(client: &mut Client, _: &[Bytes]) -> Reply {
    let _ = with_cluster!(client);
    Reply::ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_cluster::topology::{parse_nodes, Endpoint, Node};
    use kvtier_protocol::ReplyBuf;

    fn view(n: usize, alive: impl Fn(usize) -> bool) -> View {
        let list: Vec<String> = (1..=n)
            .map(|i| format!("n{i}@10.0.{}.{}:6379", i / 250, i % 250))
            .collect();
        let nodes = parse_nodes(&list.join(",")).unwrap();
        let alive = (0..n).map(alive).collect();
        View::new(1, nodes, alive, Some(0))
    }

    fn bytes(reply: &Reply) -> usize {
        let mut buf = ReplyBuf::new();
        buf.push(reply, false);
        buf.pending()
    }

    fn owners(v: &View) -> Vec<&str> {
        (0..SLOTS as u16)
            .map(|s| v.nodes[v.owner(s)].id.as_str())
            .collect()
    }

    /// The members of `v` after a CLUSTER SETNODES at epoch 2 that adds
    /// `add` (ids) and drops `drop` (indices).
    fn set_nodes(v: &View, add: &[&str], drop: &[usize]) -> View {
        let mut given = v.list();
        given.left.clear();
        given.nodes = (0..v.nodes.len())
            .filter(|i| !drop.contains(i))
            .map(|i| v.nodes[i].clone())
            .collect();
        given
            .nodes
            .extend(add.iter().map(|id| Node::new(id, "10.1.0.1", 6379)));
        let list = v.list().succeeded_by(given, 2);
        let endpoints = list.nodes.iter().map(Endpoint::of).collect();
        let alive = vec![true; list.nodes.len()];
        View::with_list(2, list, alive, Some(0), endpoints)
    }

    /// The placement table of docs/cluster.md (`cargo test -p kvtier-server
    /// placement_table -- --nocapture` prints it), with the goals
    /// asserted: the least-loaded node ≥ 0.85 of the mean, a join, a
    /// departure or a failure moving ≤ 1.3× the ideal share (a join over
    /// five newcomers' names, a departure or failure over five members).
    #[test]
    fn placement_table() {
        println!("| nodes | ranges | CLUSTER SLOTS | CLUSTER SHARDS | CLUSTER NODES | min / mean | max / mean | join (× 1/(N+1)) | departure (× its share) | failure (× its share) |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for n in [3, 10, 100] {
            let v = view(n, |_| true);
            let ranges = v.ranges(0).len();
            let slots = bytes(&slots_reply(&v, 0, false));
            let shards = bytes(&shards_reply(&v, 0, false));
            let nodes = nodes_text(&v, |_| 0).len();
            let counts = v.slot_counts();
            let mean = SLOTS as f64 / n as f64;
            let max = *counts.iter().max().unwrap() as f64 / mean;
            let min = *counts.iter().min().unwrap() as f64 / mean;
            let moved = |a: &View, b: &View| {
                owners(a)
                    .iter()
                    .zip(owners(b))
                    .filter(|(x, y)| **x != *y)
                    .count() as f64
            };
            let names = ["x1", "m5", "a0", "zz", "n0"];
            let join = names
                .iter()
                .map(|id| moved(&v, &set_nodes(&v, &[id], &[])) * (n + 1) as f64 / SLOTS as f64)
                .fold(0.0, f64::max);
            let members: Vec<usize> = (0..5).map(|k| k * (n - 1) / 4).collect();
            let departure = members
                .iter()
                .map(|&i| moved(&v, &set_nodes(&v, &[], &[i])) / counts[i] as f64)
                .fold(0.0, f64::max);
            let failure = members
                .iter()
                .map(|&i| moved(&v, &view(n, |j| j != i)) / counts[i] as f64)
                .fold(0.0, f64::max);
            println!(
                "| {n} | {ranges} | {slots} B | {shards} B | {nodes} B | {min:.2} | {max:.2} | {join:.2} | {departure:.2} | {failure:.2} |",
            );
            let most = [64, 200, 2000][[3, 10, 100].iter().position(|&m| m == n).unwrap()];
            assert!(ranges <= most, "{n} nodes: {ranges} ranges");
            assert!(min >= 0.85 && max <= 1.25, "{n} nodes: {min}..{max}");
            for m in [join, departure, failure] {
                assert!(m <= 1.3, "{n} nodes: moved {m} × the ideal");
            }
        }
    }

    #[test]
    fn topology_replies_name_announced_endpoints() {
        let mut v = view(3, |_| true);
        v.endpoints[1] = Endpoint {
            ip: "203.0.113.7".into(),
            port: 17001,
            hostname: "kv-2.example".into(),
        };
        let text = nodes_text(&v, |_| 0);
        assert!(
            text.contains("n2 203.0.113.7:17001@0,kv-2.example master"),
            "{text}"
        );
        assert!(text.contains("n1 10.0.0.1:6379@0 myself,master"), "{text}");
        for (hostname_first, first, extra) in [
            (false, "203.0.113.7", ("hostname", "kv-2.example")),
            (true, "kv-2.example", ("ip", "203.0.113.7")),
        ] {
            let entry = node_entry(&v, 1, hostname_first);
            assert_eq!(
                entry,
                Reply::Array(vec![
                    Reply::bulk(first),
                    Reply::Int(17001),
                    Reply::bulk("n2"),
                    Reply::Map(vec![(Reply::bulk(extra.0), Reply::bulk(extra.1))]),
                ])
            );
        }
        // A node announcing nothing has an empty map, as in Redis.
        assert_eq!(
            node_entry(&v, 0, true),
            Reply::Array(vec![
                Reply::bulk("10.0.0.1"),
                Reply::Int(6379),
                Reply::bulk("n1"),
                Reply::Map(Vec::new()),
            ])
        );
    }
}
