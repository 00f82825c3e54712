//! kvtier cluster: slots placed over nodes by rendezvous hashing, a
//! Redis Cluster–compatible topology, forwarding between nodes, and copies
//! of hot blocks on extra nodes.
//!
//! * [`topology`]: the slot map every node computes from the node list.
//! * Membership (here): the node list and its epoch, which nodes answer,
//!   kept by a gossip thread that pings every peer with `CLUSTER PING`,
//!   carrying the list so the highest epoch (CLUSTER SETNODES) spreads.
//! * [`peer`]: pooled, pipelined connections that carry forwarded commands.
//! * [`route`]: what a node does with a command for slots it does not own
//!   (run, forward, redirect, or coordinate across nodes).
//! * [`hot`]: read counting and the copies of hot keys.

pub mod hot;
pub mod peer;
pub mod route;
pub mod topology;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kvtier_protocol::reply::encode_command;
use kvtier_protocol::{Reply, ReplyParser};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use topology::{format_nodes, parse_nodes, Node, View};
use tracing::{info, warn};

use crate::config::Config;
use crate::server::Shared;

/// Counters for INFO and metrics.
#[derive(Default)]
pub struct ClusterStats {
    /// Commands sent to their owner on a client's behalf.
    pub forwarded: AtomicU64,
    /// MOVED redirections answered.
    pub moved: AtomicU64,
    /// Multi-key commands spread over several nodes.
    pub coordinated: AtomicU64,
    /// Reads answered from a copy of a hot key.
    pub replica_hits: AtomicU64,
    /// Reads of a replicated slot that the copy lacked (read through).
    pub replica_misses: AtomicU64,
    /// Copies of hot keys written to replicas.
    pub copies_sent: AtomicU64,
    /// Copies of hot keys received from owners.
    pub copies_received: AtomicU64,
}

/// The node list of an epoch and when each member was last heard from.
struct Members {
    epoch: u64,
    nodes: Vec<Node>,
    last_seen: HashMap<String, Instant>,
}

/// A node's view of the cluster, shared by its shards.
pub struct Cluster {
    /// This node's id.
    pub me: String,
    /// Answer MOVED instead of forwarding.
    pub redirect: bool,
    /// Silence after which a peer counts as failed.
    pub node_timeout: Duration,
    /// Reads per second that make a key hot (0: no replication).
    pub hot_threshold: u64,
    /// Extra nodes a hot key is copied to.
    pub hot_replicas: usize,
    /// Counters.
    pub stats: ClusterStats,
    /// Hot keys: the shards' counts and what is copied where.
    pub hot: Mutex<hot::HotState>,
    /// Number of this node's keys with copies (checked on every write).
    pub replicated_count: AtomicUsize,
    members: Mutex<Members>,
    view: RwLock<Arc<View>>,
    version: AtomicU64,
    started: Instant,
}

impl Cluster {
    /// The cluster of `config`, or `None` for a plain single server.
    pub fn from_config(config: &Config) -> Result<Option<Cluster>, String> {
        let Some(list) = config.cluster_nodes.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let nodes = parse_nodes(list)?;
        let me = match &config.node_id {
            Some(id) => id.clone(),
            None => nodes
                .iter()
                .find(|n| n.port == config.port && is_local(&n.host))
                .map(|n| n.id.clone())
                .ok_or(
                    "--cluster-nodes needs --node-id (no member has this port on a local host)",
                )?,
        };
        if !nodes.iter().any(|n| n.id == me) {
            return Err(format!("--node-id {me} is not in --cluster-nodes"));
        }
        let started = Instant::now();
        let members = Members {
            epoch: config.cluster_epoch,
            last_seen: nodes.iter().map(|n| (n.id.clone(), started)).collect(),
            nodes,
        };
        let view = Arc::new(build_view(&members, &me, started, Duration::MAX));
        Ok(Some(Cluster {
            me,
            redirect: config.cluster_redirect,
            node_timeout: Duration::from_millis(config.cluster_node_timeout.max(1)),
            hot_threshold: config.hot_key_threshold,
            hot_replicas: config.hot_key_replicas,
            stats: ClusterStats::default(),
            hot: Mutex::default(),
            replicated_count: AtomicUsize::new(0),
            members: Mutex::new(members),
            view: RwLock::new(view),
            version: AtomicU64::new(1),
            started,
        }))
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Changes whenever the view does (shards cache the view by it).
    pub fn version(&self) -> u64 {
        self.version.load(Relaxed)
    }

    /// CLUSTER SETNODES: a new node list, taken if its epoch is higher.
    pub fn set_nodes(&self, list: &str, epoch: u64) -> Result<(), String> {
        let nodes = parse_nodes(list)?;
        let mut m = self.lock();
        if epoch <= m.epoch {
            return Err(format!(
                "the epoch must be greater than the current one ({})",
                m.epoch
            ));
        }
        self.adopt(&mut m, epoch, nodes);
        Ok(())
    }

    /// A peer's ping: it is alive, and its list wins if its epoch is
    /// higher. Returns this node's epoch and list after the exchange.
    pub fn gossip(&self, from: &str, epoch: u64, list: &str) -> (u64, String) {
        let mut m = self.lock();
        m.last_seen.insert(from.to_string(), Instant::now());
        if epoch > m.epoch {
            if let Ok(nodes) = parse_nodes(list) {
                self.adopt(&mut m, epoch, nodes);
            }
        }
        let out = (m.epoch, format_nodes(&m.nodes));
        drop(m);
        self.refresh();
        out
    }

    /// A peer answered a ping.
    fn heard_from(&self, id: &str) {
        self.lock().last_seen.insert(id.to_string(), Instant::now());
    }

    /// The epoch and node list.
    pub fn members(&self) -> (u64, Vec<Node>) {
        let m = self.lock();
        (m.epoch, m.nodes.clone())
    }

    /// Milliseconds since each node was last heard from.
    pub fn last_seen(&self) -> HashMap<String, Duration> {
        let m = self.lock();
        m.last_seen
            .iter()
            .map(|(id, at)| (id.clone(), at.elapsed()))
            .collect()
    }

    /// Recomputes liveness; publishes a new view if anything changed.
    pub fn refresh(&self) {
        let m = self.lock();
        let current = self.view();
        let now = Instant::now();
        if current.epoch == m.epoch
            && current.nodes == m.nodes
            && current.alive == alive_flags(&m, &self.me, now, self.grace())
        {
            return;
        }
        let view = build_view(&m, &self.me, now, self.grace());
        {
            let lost: Vec<&str> = view
                .nodes
                .iter()
                .zip(&view.alive)
                .filter(|(_, a)| !**a)
                .map(|(n, _)| n.id.as_str())
                .collect();
            info!(
                "cluster view: epoch {}, {} node(s), failed: {:?}",
                view.epoch,
                view.nodes.len(),
                lost
            );
            *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
            self.version.fetch_add(1, Relaxed);
        }
    }

    /// Silence allowed before a node counts as failed; at start-up every
    /// peer gets a full timeout to be heard from.
    fn grace(&self) -> Duration {
        self.node_timeout
    }

    fn adopt(&self, m: &mut Members, epoch: u64, nodes: Vec<Node>) {
        info!("cluster epoch {epoch}: {}", format_nodes(&nodes));
        let now = Instant::now();
        for n in &nodes {
            // A newcomer gets a full timeout to answer.
            m.last_seen.entry(n.id.clone()).or_insert(now);
        }
        m.last_seen
            .retain(|id, _| nodes.iter().any(|n| &n.id == id));
        m.epoch = epoch;
        m.nodes = nodes;
        let view = build_view(m, &self.me, now, self.grace());
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        self.version.fetch_add(1, Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seconds since this node started (CLUSTER INFO).
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

fn alive_flags(m: &Members, me: &str, now: Instant, timeout: Duration) -> Vec<bool> {
    m.nodes
        .iter()
        .map(|n| {
            n.id == me
                || m.last_seen
                    .get(&n.id)
                    .is_some_and(|at| now.saturating_duration_since(*at) <= timeout)
        })
        .collect()
}

fn build_view(m: &Members, me: &str, now: Instant, timeout: Duration) -> View {
    let alive = alive_flags(m, me, now, timeout);
    let me = m.nodes.iter().position(|n| n.id == me);
    View::new(m.epoch, m.nodes.clone(), alive, me)
}

fn is_local(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// Starts the gossip thread: every peer is pinged a few times per node
/// timeout, each by its own task with its own connection, and liveness is
/// recomputed after every round. Ends at shutdown.
pub fn start_gossip(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
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
            runtime.block_on(gossip_loop(shared));
        })
}

async fn gossip_loop(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
    let interval =
        (cluster.node_timeout / 5).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut shutdown = shared.shutdown_signal();
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
                .or_insert_with(|| tokio::spawn(ping_peer(Arc::clone(&shared), node, interval)));
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
async fn ping_peer(shared: Arc<Shared>, node: Node, interval: Duration) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
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
        let password = shared.config.password();
        let exchange = async {
            if conn.is_none() {
                let mut stream = TcpStream::connect(node.addr()).await?;
                let _ = stream.set_nodelay(true);
                if let Some(pass) = &password {
                    let auth =
                        encode_command(&[Bytes::from_static(b"AUTH"), Bytes::from(pass.clone())]);
                    stream.write_all(&auth).await?;
                    read_reply(&mut stream, &mut BytesMut::new()).await?;
                }
                let hello = encode_command(&[
                    Bytes::from_static(b"CLUSTER"),
                    Bytes::from_static(b"PEER"),
                    Bytes::from(cluster.me.clone()),
                ]);
                stream.write_all(&hello).await?;
                read_reply(&mut stream, &mut BytesMut::new()).await?;
                conn = Some((stream, BytesMut::new()));
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
