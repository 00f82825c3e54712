//! kvtier-cluster: what a node knows and does as one of several, with no
//! knowledge of commands (the server decides what a command needs; see
//! its `coordination` module).
//!
//! * [`topology`]: the slot map every node computes from the node list.
//! * Membership (here): the node list and its epoch, which nodes answer,
//!   kept by a gossip thread ([`gossip`]) that pings every peer with
//!   `CLUSTER PING`, carrying the list so the highest epoch (CLUSTER
//!   SETNODES) spreads.
//! * [`peer`]: pooled, pipelined connections that carry forwarded commands,
//!   and who this node is to its peers ([`peer::Identity`]).
//! * [`hot`]: read counting, the copies of other nodes' hot keys, and the
//!   copy / lease / invalidation exchange.
//!
//! Depends on kvtier-protocol (the wire to peers) and kvtier-store (the
//! slot function) only.

pub mod gossip;
pub mod hot;
pub mod peer;
pub mod topology;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tracing::info;

use peer::Identity;
use topology::{format_nodes, parse_nodes, Node, View};

/// How a node is set up as a member (flags `--cluster-*`, `--node-id`,
/// `--hot-key-*`).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `ID@HOST:PORT,...`: the members (empty: not a cluster).
    pub nodes: String,
    /// This node's id; `None`: the member with `port` on a local address.
    pub node_id: Option<String>,
    /// The port this node serves.
    pub port: u16,
    /// Epoch of the list.
    pub epoch: u64,
    /// Answer MOVED instead of forwarding.
    pub redirect: bool,
    /// Milliseconds of silence after which a peer counts as failed.
    pub node_timeout_ms: u64,
    /// Reads per second that make a key hot (0: no copies).
    pub hot_threshold: u64,
    /// Extra nodes a hot key is copied to.
    pub hot_replicas: usize,
}

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
    /// Who this node is to its peers.
    pub identity: Identity,
    members: Mutex<Members>,
    view: RwLock<Arc<View>>,
    version: AtomicU64,
    started: Instant,
}

impl Cluster {
    /// The cluster of `settings`, or `None` for a plain single server (no
    /// node list). Peers are authenticated with what `password` returns
    /// when a connection to one opens.
    pub fn new(
        settings: &Settings,
        password: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Result<Option<Cluster>, String> {
        let list = settings.nodes.trim();
        if list.is_empty() {
            return Ok(None);
        }
        let nodes = parse_nodes(list)?;
        let me = match &settings.node_id {
            Some(id) => id.clone(),
            None => nodes
                .iter()
                .find(|n| n.port == settings.port && is_local(&n.host))
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
            epoch: settings.epoch,
            last_seen: nodes.iter().map(|n| (n.id.clone(), started)).collect(),
            nodes,
        };
        let view = Arc::new(build_view(&members, &me, started, Duration::MAX));
        Ok(Some(Cluster {
            identity: Identity::new(&me, password),
            me,
            redirect: settings.redirect,
            node_timeout: Duration::from_millis(settings.node_timeout_ms.max(1)),
            hot_threshold: settings.hot_threshold,
            hot_replicas: settings.hot_replicas,
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
    pub(crate) fn heard_from(&self, id: &str) {
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
