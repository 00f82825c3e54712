//! A kvtier cluster of real processes on loopback ports: topology replies,
//! forwarding and MOVED, cross-node multi-key commands and the dialect, the
//! `redis` crate's cluster client and `redis-cli -c`, node loss and rejoin,
//! CLUSTER SETNODES, and hot-key copies.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use redis::Commands;

/// Nodes of a test cluster, `n1`..`nN` on free loopback ports.
struct Cluster {
    ports: Vec<u16>,
    nodes: Vec<Option<Server>>,
    extra: Vec<String>,
    /// Slot maps read from CLUSTER SLOTS, by the node asked.
    maps: RefCell<HashMap<usize, Vec<usize>>>,
}

fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn node_list(ports: &[u16]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("n{}@127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

impl Cluster {
    fn start(n: usize, extra: &[&str]) -> Cluster {
        let ports = free_ports(n);
        let mut c = Cluster {
            nodes: (0..n).map(|_| None).collect(),
            ports,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            maps: RefCell::default(),
        };
        for i in 0..n {
            c.start_node(i, &node_list(&c.ports.clone()));
        }
        c
    }

    fn start_node(&mut self, i: usize, list: &str) {
        let port = self.ports[i].to_string();
        let id = format!("n{}", i + 1);
        let mut args = vec![
            "--port",
            &port,
            "--threads",
            "2",
            "--metrics-addr",
            "none",
            "--cluster-nodes",
            list,
            "--node-id",
            &id,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        self.nodes[i] = Some(Server::start_with_args(&args));
    }

    /// Starts one more node with the grown list and spreads it with
    /// CLUSTER SETNODES (epoch 1); returns every node's port.
    fn join_a_node(&mut self) -> Vec<u16> {
        let mut ports = self.ports.clone();
        ports.extend(free_ports(1));
        self.ports = ports.clone();
        self.nodes.push(None);
        let list = node_list(&ports);
        self.start_node(ports.len() - 1, &list);
        assert_eq!(self.raw(0).run(&format!("CLUSTER SETNODES {list} 1")), ok());
        ports
    }

    fn raw(&self, i: usize) -> RawConn {
        RawConn::connect(self.ports[i])
    }

    /// Whether, within 10 s, every node's reply to `command` contains `text`.
    fn every_node_shows(&self, command: &str, text: &str) -> bool {
        eventually(Duration::from_secs(10), || {
            (0..self.ports.len()).all(|i| self.raw(i).run(command).text().contains(text))
        })
    }

    fn redis(&self, i: usize) -> redis::Connection {
        connect_redis(&format!("redis://127.0.0.1:{}/", self.ports[i]))
    }

    /// Node index owning `key`, by CLUSTER SLOTS as node `asked` tells it
    /// (the map is read once per node and kept).
    fn owner_by_slots(&self, asked: usize, key: &str) -> usize {
        let slot = kvtier_server::shard::slot::key_slot(key.as_bytes()) as usize;
        let mut maps = self.maps.borrow_mut();
        let map = maps
            .entry(asked)
            .or_insert_with(|| slot_owners(&mut self.raw(asked), &self.ports));
        map[slot]
    }
}

#[test]
fn topology_and_plain_clients_on_every_node() {
    let c = Cluster::start(3, &[]);
    let mut n0 = c.raw(0);
    assert_eq!(info_int(&mut n0, "cluster", "cluster_enabled"), 1);
    let info = n0.run("CLUSTER INFO").text();
    assert!(info.contains("cluster_state:ok"), "{info}");
    assert!(info.contains("cluster_known_nodes:3"), "{info}");
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    assert_eq!(n0.run("CLUSTER MYID"), bulk("n1"));
    assert_eq!(c.raw(2).run("CLUSTER MYID"), bulk("n3"));
    // Every node describes the same map.
    let slots = n0.run("CLUSTER SLOTS");
    for i in 1..3 {
        assert_eq!(c.raw(i).run("CLUSTER SLOTS"), slots);
    }
    // A plain client on each node in turn writes, and reads every key back
    // through every node.
    let keys: Vec<String> = (0..300).map(|i| format!("key:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let mut con = c.redis(i % 3);
        let _: () = con.set(k, format!("v{i}")).unwrap();
    }
    for node in 0..3 {
        let mut con = c.redis(node);
        for (i, k) in keys.iter().enumerate().step_by(7) {
            let v: String = con.get(k).unwrap();
            assert_eq!(v, format!("v{i}"));
        }
    }
    // Each key lives where CLUSTER SLOTS says, and nowhere else.
    let mut per_node = [0; 3];
    for k in keys.iter().take(60) {
        let owner = c.owner_by_slots(1, k);
        per_node[owner] += 1;
        let slot = n0.run(&format!("CLUSTER KEYSLOT {k}")).int();
        for node in 0..3 {
            let mut conn = c.raw(node);
            let count = conn.run(&format!("CLUSTER COUNTKEYSINSLOT {slot}")).int();
            let listed = conn
                .run(&format!("CLUSTER GETKEYSINSLOT {slot} 100"))
                .items();
            if node == owner {
                assert!(count >= 1, "{k} not counted on its owner");
                assert!(listed.contains(&bulk(k)), "{k} not listed on its owner");
            } else {
                assert_eq!(count, 0, "{k}'s slot has keys on node {node}");
            }
        }
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    // One role per node: every range has its owner and nobody else, in
    // few contiguous ranges; CLUSTER NODES and SHARDS name every node as a
    // master.
    let ranges = slots.items();
    assert!(ranges.len() <= 64, "{} ranges", ranges.len());
    assert!(ranges.iter().all(|r| r.items().len() == 3), "{slots:?}");
    let nodes = n0.run("CLUSTER NODES").text();
    assert_eq!(nodes.lines().count(), 3, "{nodes}");
    assert!(nodes
        .lines()
        .any(|l| l.starts_with("n1 ") && l.contains("myself,master")));
    assert!(nodes
        .lines()
        .all(|l| l.contains("master") && !l.contains("slave")));
    let shards = n0.run("CLUSTER SHARDS").items();
    assert_eq!(shards.len(), 3);
    for shard in &shards {
        let fields = shard.items();
        let nodes = fields
            .chunks(2)
            .find(|kv| kv[0] == bulk("nodes"))
            .map(|kv| kv[1].items())
            .unwrap();
        assert_eq!(nodes.len(), 1, "{shard:?}");
    }

    // Multi-key commands across nodes, from any node.
    let mut con = c.redis(1);
    let got: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys[0])
        .arg("missing")
        .arg(&keys[1])
        .arg(&keys[2])
        .query(&mut con)
        .unwrap();
    assert_eq!(
        got,
        vec![
            Some("v0".into()),
            None,
            Some("v1".into()),
            Some("v2".into())
        ]
    );
    let _: () = redis::cmd("MSET")
        .arg("m1")
        .arg("a")
        .arg("m2")
        .arg("b")
        .arg("m3")
        .arg("c")
        .query(&mut con)
        .unwrap();
    let n: i64 = redis::cmd("EXISTS")
        .arg("m1")
        .arg("m2")
        .arg("m3")
        .arg("nope")
        .query(&mut c.redis(2))
        .unwrap();
    assert_eq!(n, 3);
    let n: i64 = redis::cmd("DEL")
        .arg("m1")
        .arg("m2")
        .arg("m3")
        .query(&mut c.redis(0))
        .unwrap();
    assert_eq!(n, 3);
    let apart = keys
        .iter()
        .find(|k| c.owner_by_slots(0, k) != c.owner_by_slots(0, &keys[0]))
        .unwrap();
    assert_eq!(
        c.raw(0).run(&format!("RENAME {} {apart}", keys[0])),
        err("CROSSSLOT Keys in request don't hash to the same slot")
    );
    // A transaction may only use this node's keys.
    let mine = keys.iter().find(|k| c.owner_by_slots(0, k) == 0).unwrap();
    let theirs = keys.iter().find(|k| c.owner_by_slots(0, k) != 0).unwrap();
    let mut t = c.raw(0);
    assert_eq!(t.run("MULTI"), ok());
    assert_eq!(t.run(&format!("SET {mine} tx")), status("QUEUED"));
    assert!(t.run(&format!("SET {theirs} tx")).is_error());
    assert!(t.run("EXEC").is_error(), "EXECABORT");
    assert_eq!(t.run("MULTI"), ok());
    assert_eq!(t.run(&format!("SET {mine} tx")), status("QUEUED"));
    assert_eq!(t.run("EXEC"), array(vec![ok()]));
    assert_eq!(c.raw(2).run(&format!("GET {mine}")), bulk("tx"));
}

/// Blocks with chain keys spread over every node.
fn chain(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{tag}:block:{i}")).collect()
}

#[test]
fn the_dialect_across_nodes() {
    let c = Cluster::start(3, &[]);
    let keys = chain(24, "prompt");
    let owners: Vec<usize> = keys.iter().map(|k| c.owner_by_slots(0, k)).collect();
    assert!(
        (0..3).all(|n| owners.contains(&n)),
        "chain not spread: {owners:?}"
    );
    let mut writer = c.raw(0);
    let mut args: Vec<Vec<u8>> = vec![b"MSETBLOCK".to_vec(), b"24".to_vec()];
    for (i, k) in keys.iter().enumerate() {
        args.push(k.clone().into_bytes());
        args.push(format!("value-{i}").into_bytes());
    }
    args.push(b"CHAIN".to_vec());
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(writer.cmd(&refs), array(vec![int(1); 24]));
    // Stored again: left as they are.
    assert_eq!(writer.cmd(&refs), array(vec![int(0); 24]));

    let list = keys.join(" ");
    for node in 0..3 {
        let mut r = c.raw(node);
        assert_eq!(r.run(&format!("PREFIXLEN 24 {list}")), int(24));
        let values = r.run(&format!("MGETPREFIX 24 {list}")).items();
        assert_eq!(values.len(), 24);
        for (i, v) in values.iter().enumerate() {
            assert_eq!(v, &bulk(format!("value-{i}")));
        }
        let flags = r.run(&format!("MEXISTS 25 {list} absent")).items();
        assert_eq!(flags.len(), 25);
        assert_eq!(flags[24], int(0));
        // MAXBYTES applies to the merged prefix (each value is 7-8 bytes).
        let capped = r.run(&format!("MGETPREFIX 24 {list} MAXBYTES 40")).items();
        assert_eq!(capped.len(), 5);
    }
    // A hole in the middle, on whichever node holds block 9: every node
    // stops there.
    assert_eq!(c.raw(1).run(&format!("DEL {}", keys[9])), int(1));
    for node in 0..3 {
        let mut r = c.raw(node);
        assert_eq!(r.run(&format!("PREFIXLEN 24 {list}")), int(9));
        assert_eq!(r.run(&format!("MGETPREFIX 24 {list}")).items().len(), 9);
    }
    // HOLD reaches every owner: each holds its own keys of the prefix (the hold
    // limits are far above a few keys) until they are read.
    assert_eq!(
        c.raw(0)
            .run(&format!("PREFIXLEN 9 {} HOLD 60000", keys[..9].join(" "))),
        int(9)
    );
    let held: i64 = (0..3)
        .map(|n| info_num(&c.raw(n).run("INFO stats").text(), "lookup_held_keys") as i64)
        .sum();
    assert_eq!(held, 9);
    assert_eq!(
        c.raw(1)
            .run(&format!("MGETPREFIX 9 {}", keys[..9].join(" ")))
            .items()
            .len(),
        9
    );
    let held: i64 = (0..3)
        .map(|n| info_num(&c.raw(n).run("INFO stats").text(), "lookup_held_keys") as i64)
        .sum();
    assert_eq!(held, 0);

    // BLOCK: a reader on one node waits for a chain written through another.
    let next = chain(12, "handoff");
    let next_list = next.join(" ");
    let port = c.ports[1];
    let reader = std::thread::spawn(move || {
        let mut r = RawConn::connect(port);
        r.run(&format!("MGETPREFIX 12 {next_list} BLOCK 10000"))
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut args: Vec<Vec<u8>> = vec![b"MSETBLOCK".to_vec(), b"12".to_vec()];
    for k in &next {
        args.push(k.clone().into_bytes());
        args.push(b"kv".to_vec());
    }
    args.push(b"CHAIN".to_vec());
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(c.raw(2).cmd(&refs), array(vec![int(1); 12]));
    let got = reader.join().unwrap();
    assert_eq!(got.items().len(), 12, "{got:?}");
    // BLOCK with MIN on a prefix that never completes times out with what
    // is there.
    let started = Instant::now();
    let partial = c.raw(0).run(&format!(
        "MGETPREFIX 3 {} {} never BLOCK 300 MIN 3",
        next[0], next[1]
    ));
    assert_eq!(partial.items().len(), 2);
    assert!(started.elapsed() >= Duration::from_millis(250));
    // Errors are the command's own, also when the keys span nodes.
    assert_eq!(c.raw(0).run("MSETBLOCK 2 a 1 b"), err("ERR syntax error"));
    let spread = format!("{} {}", keys[0], keys[1]);
    assert_eq!(
        c.raw(0).run(&format!("PREFIXLEN 2 {spread} junk")),
        err("ERR syntax error")
    );
    assert_eq!(
        c.raw(0).run(&format!("MEXISTS 2 {spread} junk")),
        err("ERR syntax error")
    );
    let far: Vec<&String> = keys
        .iter()
        .filter(|k| c.owner_by_slots(0, k) != 0)
        .collect();
    let near = keys.iter().find(|k| c.owner_by_slots(0, k) == 0).unwrap();
    assert_eq!(
        c.raw(0).run(&format!("MSET {near} 1 {}", far[0])),
        err("ERR wrong number of arguments for 'mset' command")
    );
    // The nodes' internal messages are refused on client connections.
    assert!(c.raw(1).run("CLUSTER PING n9 99 n9@127.0.0.1:1").is_error());
    assert!(c.raw(1).run("CLUSTER COPY k v 0 1000").is_error());
    assert!(c.raw(1).run("CLUSTER UNCOPY k").is_error());
    assert_eq!(
        c.raw(0)
            .run(&format!("MGETPREFIX 2 {} {} BOGUS", next[0], next[5])),
        err("ERR syntax error")
    );
}

#[test]
fn redis_crate_cluster_client() {
    let c = Cluster::start(3, &[]);
    let urls: Vec<String> = c
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let client = redis::cluster::ClusterClient::new(urls).expect("cluster client");
    let mut con = client.get_connection().expect("cluster connection");
    for i in 0..200 {
        let _: () = con.set(format!("rc:{i}"), i).unwrap();
    }
    for i in 0..200 {
        let v: i64 = con.get(format!("rc:{i}")).unwrap();
        assert_eq!(v, i);
    }
    let n: i64 = con.incr("rc:counter", 5).unwrap();
    assert_eq!(n, 5);
    let _: () = con.expire("rc:1", 100).unwrap();
    let ttl: i64 = con.ttl("rc:1").unwrap();
    assert!(ttl > 0 && ttl <= 100);
    // The dialect through the cluster client: the node it lands on
    // coordinates the keys of every other node.
    let keys = chain(10, "rc");
    let mut cmd = redis::cmd("MSETBLOCK");
    cmd.arg(10);
    for k in &keys {
        cmd.arg(k).arg("x");
    }
    cmd.arg("CHAIN");
    let stored: Vec<i64> = cmd.query(&mut con).unwrap();
    assert_eq!(stored, vec![1; 10]);
    let mut cmd = redis::cmd("PREFIXLEN");
    cmd.arg(10).arg(&keys);
    let n: i64 = cmd.query(&mut con).unwrap();
    assert_eq!(n, 10);
    // Keys really are spread: each node holds some of them.
    let mut counts = [0; 3];
    for i in 0..200 {
        counts[c.owner_by_slots(0, &format!("rc:{i}"))] += 1;
    }
    assert!(counts.iter().all(|&n| n > 30), "{counts:?}");
    // The client runs DBSIZE, KEYS and FLUSHALL on every primary: all three
    // nodes, so they cover every key.
    let total: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(total, 200 + 1 + 10);
    let listed: Vec<String> = redis::cmd("KEYS").arg("rc:*").query(&mut con).unwrap();
    assert_eq!(listed.len(), 200 + 1 + 10);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    for i in 0..3 {
        assert_eq!(c.raw(i).run("DBSIZE"), int(0), "node {i}");
    }
}

#[test]
fn redirect_mode_answers_moved_and_redis_cli_follows() {
    let c = Cluster::start(3, &["--cluster-redirect", "yes"]);
    let key = "redirected";
    let owner = c.owner_by_slots(0, key);
    let other = (owner + 1) % 3;
    let slot = c.raw(0).run(&format!("CLUSTER KEYSLOT {key}")).int();
    assert_eq!(
        c.raw(other).run(&format!("SET {key} v")),
        err(&format!("MOVED {slot} 127.0.0.1:{}", c.ports[owner]))
    );
    assert_eq!(c.raw(owner).run(&format!("SET {key} v")), ok());
    // redis-cli -c follows the redirection.
    let out = Command::new("redis-cli")
        .args(["-c", "-p", &c.ports[other].to_string(), "GET", key])
        .output()
        .expect("redis-cli (apt-get install redis-tools)");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v");
    let out = Command::new("redis-cli")
        .args([
            "-c",
            "-p",
            &c.ports[other].to_string(),
            "SET",
            "cli-key",
            "w",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    let cli_owner = c.owner_by_slots(1, "cli-key");
    assert_eq!(c.raw(cli_owner).run("GET cli-key"), bulk("w"));
    // redis-cli's cluster tooling reads the topology and finds it whole.
    let out = Command::new("redis-cli")
        .args(["--cluster", "check", &format!("127.0.0.1:{}", c.ports[0])])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("All nodes agree about slots configuration"),
        "{text}"
    );
    assert!(text.contains("All 16384 slots covered"), "{text}");
    // redis-benchmark in cluster mode finds the three masters and runs.
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &c.ports[1].to_string(),
            "--cluster",
            "-t",
            "set,get",
            "-n",
            "2000",
            "-c",
            "4",
            "-q",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Master 2:"), "{text}");
    assert!(
        text.contains("GET: ") && text.contains("requests per second"),
        "{text}"
    );
    // Multi-key commands spanning nodes are still coordinated.
    assert_eq!(
        c.raw(other).run(&format!("MGET {key} cli-key nope")),
        array(vec![bulk("v"), bulk("w"), nil()])
    );
    // Replica reads are off by default: READONLY does not change where a
    // read goes.
    let mut r = c.raw(other);
    assert_eq!(r.run("READONLY"), ok());
    assert_eq!(
        r.run(&format!("GET {key}")),
        err(&format!("MOVED {slot} 127.0.0.1:{}", c.ports[owner]))
    );
}

#[test]
fn replica_reads_are_opt_in() {
    let c = Cluster::start(
        3,
        &[
            "--cluster-redirect",
            "yes",
            "--cluster-replica-reads",
            "yes",
        ],
    );
    let key = "replica-read";
    let owner = c.owner_by_slots(0, key);
    let slot = c.raw(0).run(&format!("CLUSTER KEYSLOT {key}")).int();
    assert_eq!(c.raw(owner).run(&format!("SET {key} v")), ok());
    // The topology lists the hot-key replicas after each owner.
    let slots = c.raw(0).run("CLUSTER SLOTS");
    let range = slots
        .items()
        .into_iter()
        .find(|r| r.items()[0].int() <= slot && slot <= r.items()[1].int())
        .unwrap();
    assert_eq!(range.items().len(), 2 + 3, "owner and two replicas");
    let replica_port = range.items()[3].items()[1].int() as u16;
    let replica = c.ports.iter().position(|&p| p == replica_port).unwrap();
    assert_ne!(replica, owner);
    // READONLY on a replica of the slot reads through instead of MOVED.
    let mut r = c.raw(replica);
    assert_eq!(r.run("READONLY"), ok());
    assert_eq!(r.run(&format!("GET {key}")), bulk("v"));
    assert_eq!(r.run("READWRITE"), ok());
    assert_eq!(
        r.run(&format!("GET {key}")),
        err(&format!("MOVED {slot} 127.0.0.1:{}", c.ports[owner]))
    );
    assert_eq!(
        c.raw(0).run("CONFIG GET cluster-replica-reads"),
        array(vec![bulk("cluster-replica-reads"), bulk("yes")])
    );
}

#[test]
fn node_loss_and_rejoin() {
    let mut c = Cluster::start(3, &["--cluster-node-timeout", "500"]);
    let keys: Vec<String> = (0..90).map(|i| format!("loss:{i}")).collect();
    for k in &keys {
        assert_eq!(c.raw(0).run(&format!("SET {k} before")), ok());
    }
    let before = c.raw(0).run("CLUSTER SLOTS");
    let lost: Vec<&String> = keys
        .iter()
        .filter(|k| c.owner_by_slots(0, k) == 2)
        .collect();
    assert!(!lost.is_empty());
    c.nodes[2].take().unwrap().kill9();
    let killed = Instant::now();
    // Within node-timeout + 1 s every command against the survivors
    // succeeds (the lost node's keys are misses).
    std::thread::sleep(Duration::from_millis(1500));
    for node in 0..2 {
        let mut r = c.raw(node);
        for k in &keys {
            let got = r.run(&format!("GET {k}"));
            assert!(!got.is_error(), "GET {k} on node {node}: {got:?}");
            assert_eq!(r.run(&format!("SET {k} after")), ok());
        }
        assert_eq!(r.run(&format!("MGET {}", keys.join(" "))).items().len(), 90);
        let info = r.run("CLUSTER INFO").text();
        assert!(info.contains("cluster_live_nodes:2"), "{info}");
    }
    assert!(killed.elapsed() < Duration::from_secs(30));
    // Restarted, it rejoins and owns its slots again.
    let list = node_list(&c.ports);
    c.start_node(2, &list);
    assert!(
        eventually(Duration::from_secs(10), || {
            c.raw(0).run("CLUSTER SLOTS") == before && c.raw(1).run("CLUSTER SLOTS") == before
        }),
        "the node did not rejoin"
    );
    let mut r = c.raw(2);
    for k in &lost {
        // Its keys were written to the survivors meanwhile and are its own
        // again now: a fresh node has none of them.
        assert_eq!(r.run(&format!("SET {k} back")), ok());
        assert_eq!(c.raw(0).run(&format!("GET {k}")), bulk("back"));
    }
    let slot = r.run(&format!("CLUSTER KEYSLOT {}", lost[0])).int();
    assert!(r.run(&format!("CLUSTER COUNTKEYSINSLOT {slot}")).int() >= 1);
}

#[test]
fn setnodes_adds_a_fourth_node() {
    let ports = free_ports(4);
    let three = node_list(&ports[..3]);
    let four = node_list(&ports);
    let mut c = Cluster {
        ports: ports.clone(),
        nodes: (0..4).map(|_| None).collect(),
        extra: Vec::new(),
        maps: RefCell::default(),
    };
    for i in 0..3 {
        c.start_node(i, &three);
    }
    let owners_before: Vec<usize> = slot_owners(&mut c.raw(0), &ports);
    c.start_node(3, &four);
    // Its list is plain and of the cluster's epoch: its pings do not impose
    // it (all four replayed from the start would move most slots); it takes
    // the cluster's and waits outside it for SETNODES.
    assert!(
        c.every_node_shows("INFO cluster", &format!("cluster_node_list:{three}\r\n")),
        "the newcomer's list won"
    );
    assert_eq!(slot_owners(&mut c.raw(3), &ports), owners_before);
    assert_eq!(c.raw(1).run(&format!("CLUSTER SETNODES {four} 1")), ok());
    assert!(
        c.raw(1)
            .run(&format!("CLUSTER SETNODES {three} 1"))
            .is_error(),
        "an epoch that is not higher is refused"
    );
    assert!(
        c.every_node_shows("CLUSTER INFO", "cluster_current_epoch:1"),
        "the epoch did not spread"
    );
    // Every node carries the history SETNODES recorded (the newcomer,
    // started with the plain list, took it from a ping).
    assert!(
        c.every_node_shows("INFO cluster", &format!("n4@127.0.0.1:{}#1", ports[3])),
        "the history did not spread"
    );
    let after = slot_owners(&mut c.raw(0), &ports);
    for i in 1..4 {
        assert_eq!(
            slot_owners(&mut c.raw(i), &ports),
            after,
            "node {i} disagrees"
        );
    }
    let (mut moved, mut between_old) = (0, 0);
    for (&b, &a) in owners_before.iter().zip(&after) {
        if a != b {
            moved += 1;
            between_old += (a != 3) as usize;
        }
    }
    // The newcomer's fair share moves to it (a quarter of each of the four
    // stripes of 4096 slots), and nothing moves between the old nodes.
    assert_eq!(moved, 4096, "{moved} slots moved");
    assert_eq!(
        between_old, 0,
        "{between_old} slots moved between old nodes"
    );
}

/// The owner (index into `ports`) of every slot, from CLUSTER SLOTS.
fn slot_owners(conn: &mut RawConn, ports: &[u16]) -> Vec<usize> {
    let mut owners = vec![usize::MAX; 16384];
    for range in conn.run("CLUSTER SLOTS").items() {
        let r = range.items();
        let port = r[2].items()[1].int() as u16;
        let owner = ports.iter().position(|&p| p == port).unwrap();
        for s in r[0].int()..=r[1].int() {
            owners[s as usize] = owner;
        }
    }
    assert!(owners.iter().all(|&o| o != usize::MAX));
    owners
}

#[test]
fn hot_keys_are_copied_served_and_invalidated() {
    let c = Cluster::start(
        3,
        &["--hot-key-threshold", "300", "--hot-key-replicas", "2"],
    );
    let key = "system-prompt:block:0";
    assert_eq!(c.raw(0).run(&format!("SET {key} shared-prefix")), ok());
    let owner = c.owner_by_slots(0, key);
    let copied = read_until_copied(&c, owner, key, "shared-prefix", 1);
    assert!(
        copied,
        "no copies made: {:?}",
        c.raw(owner).run("CLUSTER HOTKEYS")
    );
    let listed = c.raw(owner).run("CLUSTER HOTKEYS").items().iter().any(|h| {
        h.items()[0] == bulk(key) && h.items()[1].int() > 0 && h.items()[2].items().len() == 2
    });
    assert!(listed, "{:?}", c.raw(owner).run("CLUSTER HOTKEYS"));
    // Replicas answer from their copy, counted.
    let replica = (owner + 1) % 3;
    let hits = info_int(&mut c.raw(replica), "cluster", "cluster_replica_hits");
    for _ in 0..10 {
        assert_eq!(
            c.raw(replica).run(&format!("GET {key}")),
            bulk("shared-prefix")
        );
    }
    assert!(info_int(&mut c.raw(replica), "cluster", "cluster_replica_hits") >= hits + 10);
    // After DEL returns, no node serves it.
    assert_eq!(c.raw(replica).run(&format!("DEL {key}")), int(1));
    for i in 0..3 {
        assert_eq!(c.raw(i).run(&format!("GET {key}")), nil(), "node {i}");
    }
    // A write replaces the value everywhere too.
    assert_eq!(c.raw(0).run(&format!("SET {key} v2")), ok());
    for i in 0..3 {
        assert_eq!(c.raw(i).run(&format!("GET {key}")), bulk("v2"), "node {i}");
    }
    // Hot again, then deleted by a DEL whose keys span nodes: the owner's
    // share of a coordinated write drops the copies too.
    assert!(
        read_until_copied(&c, owner, key, "v2", 2),
        "no copies of the new value"
    );
    let elsewhere = (0..100)
        .map(|i| format!("other:{i}"))
        .find(|k| c.owner_by_slots(0, k) != owner)
        .unwrap();
    assert_eq!(c.raw(0).run(&format!("SET {elsewhere} x")), ok());
    assert_eq!(c.raw(owner).run(&format!("DEL {key} {elsewhere}")), int(2));
    for i in 0..3 {
        assert_eq!(
            c.raw(i).run(&format!("GET {key}")),
            nil(),
            "node {i} after DEL"
        );
    }
}

/// Reads `key` hard through every node (each read must return `value`)
/// until both nodes other than `owner` have received `copies` copies in
/// all; false if that does not happen within 15 s.
fn read_until_copied(c: &Cluster, owner: usize, key: &str, value: &str, copies: i64) -> bool {
    let mut readers: Vec<RawConn> = (0..3).map(|i| c.raw(i)).collect();
    let get = encode(&[b"GET", key.as_bytes()]);
    let batch: Vec<u8> = get.iter().copied().cycle().take(get.len() * 200).collect();
    eventually(Duration::from_secs(15), || {
        for r in readers.iter_mut() {
            r.send(&batch);
            for _ in 0..200 {
                assert_eq!(r.read(), bulk(value));
            }
        }
        (0..3)
            .filter(|&i| i != owner)
            .all(|i| info_int(&mut c.raw(i), "cluster", "cluster_copies_received") >= copies)
    })
}

#[test]
fn no_read_after_a_write_returns_the_old_copy() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::{Arc, OnceLock};
    let c = Cluster::start(
        3,
        &["--hot-key-threshold", "300", "--hot-key-replicas", "2"],
    );
    let key = "hot:race";
    let owner = c.owner_by_slots(0, key);
    // Each round copies a value to both other nodes, then overwrites or
    // deletes it (through the owner or through a node holding a copy)
    // while every node is read in a loop: a read that starts after the
    // write has replied never returns the old value.
    for round in 0..4i64 {
        let old = format!("v{round}");
        assert_eq!(c.raw(0).run(&format!("SET {key} {old}")), ok());
        assert!(
            read_until_copied(&c, owner, key, &old, round + 1),
            "round {round}: no copies"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let written_at = Arc::new(OnceLock::<Instant>::new());
        let readers: Vec<_> = (0..3)
            .map(|i| {
                let (mut conn, stop, written_at) = (c.raw(i), stop.clone(), written_at.clone());
                let old = bulk(&old);
                std::thread::spawn(move || {
                    let (mut after, mut stale) = (0, 0);
                    while !stop.load(Relaxed) {
                        let start = Instant::now();
                        let reply = conn.cmd(&[b"GET", key.as_bytes()]);
                        if written_at.get().is_some_and(|&t| start > t) {
                            after += 1;
                            stale += (reply == old) as usize;
                        }
                    }
                    (after, stale)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let through = if round < 2 { owner } else { (owner + 1) % 3 };
        let mut writer = c.raw(through);
        if round % 2 == 0 {
            assert_eq!(writer.run(&format!("DEL {key}")), int(1));
        } else {
            assert_eq!(writer.run(&format!("SET {key} new")), ok());
        }
        written_at.set(Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Relaxed);
        for (i, r) in readers.into_iter().enumerate() {
            let (after, stale) = r.join().unwrap();
            assert!(
                after > 0,
                "round {round}: node {i} read nothing after the write"
            );
            assert_eq!(
                stale, 0,
                "round {round}: node {i} answered the old value {stale} times"
            );
        }
    }
}

#[test]
fn a_hot_prefix_over_nodes_is_read_from_copies_and_never_stale() {
    let c = Cluster::start(
        3,
        &["--hot-key-threshold", "300", "--hot-key-replicas", "2"],
    );
    // A 12-block prefix whose blocks live on every node.
    let keys: Vec<String> = (0..12).map(|i| format!("prefix:{i}")).collect();
    let owners: Vec<usize> = keys.iter().map(|k| c.owner_by_slots(0, k)).collect();
    assert!((0..3).all(|n| owners.contains(&n)), "{owners:?}");
    for k in &keys {
        assert_eq!(c.raw(0).run(&format!("SET {k} v-{k}")), ok());
    }
    let fetch = encode(
        &[&b"MGETPREFIX"[..], b"12"]
            .into_iter()
            .chain(keys.iter().map(|k| k.as_bytes()))
            .collect::<Vec<_>>(),
    );
    let whole = array(keys.iter().map(|k| bulk(format!("v-{k}"))).collect());
    // Plain clients on every node read the whole prefix until each node
    // holds copies of the other nodes' blocks and answers them itself.
    let mut readers: Vec<RawConn> = (0..3).map(|i| c.raw(i)).collect();
    let batch: Vec<u8> = fetch
        .iter()
        .copied()
        .cycle()
        .take(fetch.len() * 100)
        .collect();
    let from_copies = eventually(Duration::from_secs(20), || {
        for r in readers.iter_mut() {
            r.send(&batch);
            for _ in 0..100 {
                assert_eq!(r.read(), whole);
            }
        }
        (0..3).all(|n| {
            let mut conn = c.raw(n);
            let forwarded = info_int(&mut conn, "cluster", "cluster_forwarded");
            let hits = info_int(&mut conn, "cluster", "cluster_replica_hits");
            readers[n].send(&batch);
            for _ in 0..100 {
                assert_eq!(readers[n].read(), whole);
            }
            info_int(&mut conn, "cluster", "cluster_forwarded") == forwarded
                && info_int(&mut conn, "cluster", "cluster_replica_hits") >= hits + 100
        })
    });
    assert!(from_copies, "the prefix is still read from its owners");
    // A block deleted in the middle: every node's prefix ends before it at
    // once, whichever node the DEL went through.
    let cut = 5;
    assert_eq!(
        c.raw(owners[cut]).run(&format!("DEL {}", keys[cut])),
        int(1)
    );
    let before_cut = array(keys[..cut].iter().map(|k| bulk(format!("v-{k}"))).collect());
    for r in readers.iter_mut() {
        r.send(&fetch);
        assert_eq!(r.read(), before_cut);
    }
    // Overwritten through another node: every node reads the new value.
    let other = (owners[2] + 1) % 3;
    assert_eq!(c.raw(other).run(&format!("SET {} new", keys[2])), ok());
    for r in readers.iter_mut() {
        r.send(&fetch);
        let got = r.read().items();
        assert_eq!(got.len(), cut);
        assert_eq!(got[2], bulk("new"));
    }
}

/// A TCP forwarder from a port of its own to `target` (what a published
/// container port or a NAT gives a node), counting the connections it took.
struct Forwarder {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Forwarder {
    fn start(target: u16) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = std::sync::Arc::clone(&accepted);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Forwarder { port, accepted }
    }
}

#[test]
fn announced_endpoints_are_what_clients_see() {
    let ports = free_ports(3);
    // Node n1 is reached by clients through a forwarder on another port;
    // peers use the list's `localhost` addresses, clients are told
    // 127.0.0.1 and a hostname.
    let forwarder = Forwarder::start(ports[0]);
    let list = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("n{}@localhost:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let _nodes: Vec<Server> = (0..3)
        .map(|i| {
            let (port, id) = (ports[i].to_string(), format!("n{}", i + 1));
            let hostname = format!("node-{}.kv", i + 1);
            let announce_port = forwarder.port.to_string();
            let mut args = vec![
                "--port",
                &port,
                "--metrics-addr",
                "none",
                "--cluster-nodes",
                &list,
                "--node-id",
                &id,
                "--cluster-redirect",
                "yes",
                "--cluster-announce-ip",
                "127.0.0.1",
                "--cluster-announce-hostname",
                &hostname,
            ];
            if i == 0 {
                args.extend(["--cluster-announce-port", &announce_port]);
            }
            Server::start_with_args(&args)
        })
        .collect();
    let endpoint = |i: usize| {
        let port = if i == 0 { forwarder.port } else { ports[i] };
        format!("n{} 127.0.0.1:{port}@0,node-{}.kv ", i + 1, i + 1)
    };
    // Every node learns every other's endpoint from the pings.
    let learned = eventually(Duration::from_secs(10), || {
        (0..3).all(|asked| {
            let text = RawConn::connect(ports[asked]).run("CLUSTER NODES").text();
            (0..3).all(|i| text.contains(&endpoint(i)))
        })
    });
    assert!(
        learned,
        "{}",
        RawConn::connect(ports[2]).run("CLUSTER NODES").text()
    );
    let mut n3 = RawConn::connect(ports[2]);
    for range in n3.run("CLUSTER SLOTS").items() {
        let node = range.items()[2].items();
        let i = ports
            .iter()
            .position(|&p| p as i64 == node[1].int())
            .unwrap_or(0);
        let port = if i == 0 { forwarder.port } else { ports[i] };
        assert_eq!(node[0], bulk("127.0.0.1"));
        assert_eq!(node[1].int(), port as i64);
        assert_eq!(
            node[3].items(),
            vec![bulk("hostname"), bulk(format!("node-{}.kv", i + 1))]
        );
    }
    let shard_nodes: Vec<Vec<Resp>> = n3
        .run("CLUSTER SHARDS")
        .items()
        .iter()
        .flat_map(|shard| {
            let fields = shard.items();
            let nodes = fields.chunks(2).find(|kv| kv[0] == bulk("nodes")).unwrap()[1].items();
            nodes.into_iter().map(|n| n.items())
        })
        .collect();
    assert_eq!(shard_nodes.len(), 3);
    let n1 = shard_nodes
        .iter()
        .find(|n| n.contains(&bulk("n1")))
        .unwrap();
    for (field, value) in [
        (bulk("hostname"), bulk("node-1.kv")),
        (bulk("ip"), bulk("127.0.0.1")),
        (bulk("port"), int(forwarder.port as i64)),
    ] {
        let at = n1.iter().position(|v| *v == field).unwrap();
        assert_eq!(n1[at + 1], value, "{n1:?}");
    }
    // MOVED names the announced endpoint.
    let key = (0..1000)
        .map(|i| format!("announced:{i}"))
        .find(|k| {
            let slot = kvtier_server::shard::slot::key_slot(k.as_bytes());
            let moved = n3.run(&format!("GET {k}"));
            moved == err(&format!("MOVED {slot} 127.0.0.1:{}", forwarder.port))
        })
        .expect("a key of n1's");
    // A cluster client that knows only n3 reaches n1 through the announced
    // port.
    let client =
        redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}/", ports[2])])
            .unwrap();
    let mut con = client.get_connection().unwrap();
    let _: () = con.set(&key, "through the forwarder").unwrap();
    let v: String = con.get(&key).unwrap();
    assert_eq!(v, "through the forwarder");
    assert!(
        forwarder
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    assert_eq!(
        RawConn::connect(ports[0]).run(&format!("GET {key}")),
        bulk("through the forwarder")
    );
}

#[test]
fn a_joining_node_reads_its_new_slots_from_their_previous_owners() {
    let mut c = Cluster::start(3, &[]);
    let keys: Vec<String> = (0..400).map(|i| format!("handoff:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let cmd = if i % 10 == 0 {
            format!("SET {k} v{i} PX 600000")
        } else {
            format!("SET {k} v{i}")
        };
        assert_eq!(c.raw(i % 3).run(&cmd), ok());
    }
    // A fourth node joins (started with the new list, then SETNODES).
    let ports = c.join_a_node();
    assert!(c.every_node_shows("CLUSTER INFO", "cluster_current_epoch:1"));
    let owners = slot_owners(&mut c.raw(3), &ports);
    let theirs: Vec<(usize, &String)> = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| owners[kvtier_server::shard::slot::key_slot(k.as_bytes()) as usize] == 3)
        .collect();
    assert!(theirs.len() > 20, "{} keys moved", theirs.len());
    let slots = info_int(&mut c.raw(3), "cluster", "cluster_handoff_slots");
    assert!(slots > 0);
    // Reads through any node hit: the newcomer reads each miss from the
    // previous owner and keeps it.
    let (deleted, read) = theirs.split_at(5);
    for (n, (i, k)) in read.iter().enumerate() {
        assert_eq!(
            c.raw(n % 4).run(&format!("GET {k}")),
            bulk(format!("v{i}")),
            "{k}"
        );
    }
    let fetched = info_int(&mut c.raw(3), "cluster", "cluster_handoff_fetched");
    assert_eq!(fetched as usize, read.len());
    let kept = c.raw(3).run("DBSIZE").int() as usize;
    assert_eq!(kept, read.len());
    // Expiry comes along.
    if let Some((_, k)) = read.iter().find(|(i, _)| i % 10 == 0) {
        let pttl = c.raw(3).run(&format!("PTTL {k}")).int();
        assert!(pttl > 0 && pttl <= 600_000, "{pttl}");
    }
    // A second read is local.
    assert_eq!(
        c.raw(3).run(&format!("GET {}", read[0].1)),
        bulk(format!("v{}", read[0].0))
    );
    assert_eq!(
        info_int(&mut c.raw(3), "cluster", "cluster_handoff_fetched"),
        fetched
    );
    // Writes carry deletes: a key deleted here never comes back from the
    // previous owner, and DEL counts it.
    for (_, k) in deleted {
        assert_eq!(c.raw(3).run(&format!("DEL {k}")), int(1), "{k}");
        assert_eq!(c.raw(1).run(&format!("GET {k}")), nil(), "{k}");
    }
    assert!(info_int(&mut c.raw(3), "cluster", "cluster_handoff_deleted") >= 5);
    // A key nobody has is a miss, counted.
    let nowhere = (0..1000)
        .map(|i| format!("handoff:nowhere:{i}"))
        .find(|k| owners[kvtier_server::shard::slot::key_slot(k.as_bytes()) as usize] == 3)
        .unwrap();
    let missed = info_int(&mut c.raw(3), "cluster", "cluster_handoff_missed");
    assert_eq!(c.raw(3).run(&format!("GET {nowhere}")), nil());
    assert_eq!(
        info_int(&mut c.raw(3), "cluster", "cluster_handoff_missed"),
        missed + 1
    );
    // FLUSHALL ends the hand-off.
    assert_eq!(c.raw(3).run("FLUSHALL"), ok());
    assert_eq!(
        info_int(&mut c.raw(3), "cluster", "cluster_handoff_slots"),
        0
    );
    assert_eq!(c.raw(3).run(&format!("GET {}", read[1].1)), nil());
}

#[test]
fn old_owners_drop_the_slots_they_lost_after_the_hand_off_window() {
    let mut c = Cluster::start(3, &["--cluster-handoff-ms", "1000"]);
    let keys: Vec<String> = (0..300).map(|i| format!("purge:{i}")).collect();
    for k in &keys {
        assert_eq!(c.raw(0).run(&format!("SET {k} v")), ok());
    }
    let ports = c.join_a_node();
    // Node 0 took the four-node list with SETNODES; the newcomer takes it once
    // SETNODES reaches it (before that it may report its own start-up list,
    // then the three nodes' map).
    let owners = slot_owners(&mut c.raw(0), &ports);
    assert!(owners.contains(&3));
    assert!(eventually(Duration::from_secs(10), || {
        slot_owners(&mut c.raw(3), &ports) == owners
    }));
    let moved: Vec<u16> = keys
        .iter()
        .map(|k| kvtier_server::shard::slot::key_slot(k.as_bytes()))
        .filter(|&s| owners[s as usize] == 3)
        .collect();
    assert!(!moved.is_empty());
    let held = |node: usize| -> i64 {
        moved
            .iter()
            .map(|s| {
                c.raw(node)
                    .run(&format!("CLUSTER COUNTKEYSINSLOT {s}"))
                    .int()
            })
            .sum()
    };
    assert!(
        (0..3).map(held).sum::<i64>() > 0,
        "the old owners hold them at first"
    );
    // Window 1 s plus half of it: then the old owners drop them (once a
    // second), so no later hand-off can pull an old value back.
    assert!(eventually(Duration::from_secs(10), || (0..3)
        .map(held)
        .sum::<i64>()
        == 0));
    // What they still own is untouched.
    let kept = keys
        .iter()
        .filter(|k| owners[kvtier_server::shard::slot::key_slot(k.as_bytes()) as usize] != 3)
        .count() as i64;
    let dbsize: i64 = (0..3).map(|i| c.raw(i).run("DBSIZE").int()).sum();
    assert_eq!(dbsize, kept);
}

/// With ACL users, nodes log in to each other as the peer user
/// (`--masteruser`/`--masterauth`) even when the default user is off, a
/// client's command is checked once, on the node it reached, and a fenced
/// client stays fenced whichever node owns the key.
#[test]
fn peers_log_in_as_their_user_and_clients_stay_fenced() {
    let (dir, path) = acl_file(
        "cluster",
        "user default off\n\
         user peer on >peerpass -@all +cluster|peer\n\
         user admin on >adminpass ~* &* +@all\n\
         user tenant on >tpass ~t1:* -@all +@read +@write +@block +@connection -@dangerous\n",
    );
    let c = Cluster::start(
        3,
        &[
            "--aclfile",
            &path,
            "--masteruser",
            "peer",
            "--masterauth",
            "peerpass",
        ],
    );
    let login = |i: usize, user: &str, pass: &str| {
        let mut conn = c.raw(i);
        assert_eq!(conn.run(&format!("AUTH {user} {pass}")), ok());
        conn
    };
    let mut admin = login(0, "admin", "adminpass");
    let keys: Vec<String> = (0..30).map(|i| format!("t1:{i}")).collect();
    let others: Vec<String> = (0..30).map(|i| format!("t2:{i}")).collect();
    // Keys on every node, written through node 0 (forwarded over the peer
    // links, which logged in as `peer`).
    let map = slot_owners(&mut admin, &c.ports);
    let owners: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| map[kvtier_server::shard::slot::key_slot(k.as_bytes()) as usize])
        .collect();
    assert_eq!(owners.len(), 3, "the keys live on every node");
    for k in keys.iter().chain(&others) {
        assert_eq!(admin.run(&format!("SET {k} v-{k}")), ok(), "{k}");
    }
    for i in 0..3 {
        let mut tenant = login(i, "tenant", "tpass");
        for k in &keys {
            assert_eq!(tenant.run(&format!("GET {k}")), bulk(format!("v-{k}")));
        }
        let nokey =
            err("NOPERM this user has no permissions to access one of the keys used as arguments");
        for k in &others {
            assert_eq!(tenant.run(&format!("GET {k}")), nokey, "{k} via node {i}");
        }
        assert_eq!(
            tenant.run(&format!("MGET {} {}", keys[0], others[0])),
            nokey
        );
        assert_eq!(
            tenant.run("FLUSHALL"),
            err("NOPERM this user has no permissions to run the 'flushall' command")
        );
        let blocks: Vec<String> = (0..3).map(|j| format!("t1:b{i}-{j}")).collect();
        let chain = format!(
            "MSETBLOCK 3 {} a {} b {} c CHAIN",
            blocks[0], blocks[1], blocks[2]
        );
        assert_eq!(tenant.run(&chain), array(vec![int(1), int(1), int(1)]));
        assert_eq!(
            tenant.run(&format!("PREFIXLEN 3 {}", blocks.join(" "))),
            int(3)
        );
    }
    // A user allowed CLUSTER's subcommands cannot pose as a peer to run
    // unchecked: only the peer user (or one allowed everything) may.
    assert_eq!(
        admin.run("ACL SETUSER sneaky on >s ~t1:* +get +cluster"),
        ok()
    );
    let mut sneaky = login(0, "sneaky", "s");
    assert_eq!(
        sneaky.run("CLUSTER PEER n9"),
        err("NOPERM only the cluster's peer user (masteruser) may say CLUSTER PEER")
    );
    assert_eq!(
        sneaky.run("FLUSHALL"),
        err("NOPERM this user has no permissions to run the 'flushall' command")
    );
    // The peer user itself can do nothing but be a peer.
    let mut peer = login(1, "peer", "peerpass");
    assert_eq!(
        peer.run("GET t1:0"),
        err("NOPERM this user has no permissions to run the 'get' command")
    );
    // Without a login a client gets nowhere (the default user is off).
    assert_eq!(
        c.raw(2).run("GET t1:0"),
        err("NOAUTH Authentication required.")
    );
    std::fs::remove_dir_all(&dir).ok();
}
