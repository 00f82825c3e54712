//! Membership: the node list and its epoch, which nodes answer, and the
//! view ([`crate::topology::View`]) built from them; the [`Cluster`] a node
//! keeps of all of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::info;

use crate::peer::{self, Identity};
use crate::topology::{format_list, parse_list, parse_nodes, Endpoint, Left, NodeList, View};
use crate::{hot, topology};

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
    /// List replicas in the topology and let READONLY clients read from
    /// them (`--cluster-replica-reads`).
    pub replica_reads: bool,
    /// `--cluster-announce-ip`.
    pub announce_ip: Option<String>,
    /// `--cluster-announce-port`.
    pub announce_port: Option<u16>,
    /// `--cluster-announce-hostname`.
    pub announce_hostname: Option<String>,
    /// `--cluster-preferred-endpoint-type hostname`: name nodes by hostname.
    pub hostname_first: bool,
    /// Milliseconds a slot's new owner reads its misses from the previous
    /// owner (`--cluster-handoff-ms`; 0: no hand-off).
    pub handoff_ms: u64,
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
    /// Keys of handed-off slots read from their previous owner and kept.
    pub handoff_fetched: AtomicU64,
    /// Keys of handed-off slots the previous owner did not have either.
    pub handoff_missed: AtomicU64,
    /// Keys written here whose old copy was deleted on the previous owner.
    pub handoff_deleted: AtomicU64,
}

/// The node list of an epoch and when each member was last heard from.
struct Members {
    epoch: u64,
    nodes: Vec<topology::Node>,
    /// Members that left (the map replays their stay).
    left: Vec<Left>,
    /// The list as pings carry it ([`format_list`]), formed once per list.
    text: String,
    last_seen: HashMap<String, Instant>,
    /// Endpoints announced by peers (and this node's own), by id.
    announced: HashMap<String, Endpoint>,
    /// When liveness was last recomputed: a gap longer than the node
    /// timeout means this process was paused (SIGSTOP, a frozen VM).
    last_refresh: Instant,
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
    /// Replicas listed in the topology, READONLY clients read from them.
    pub replica_reads: bool,
    /// Topology replies and MOVED name nodes by hostname (when announced).
    pub hostname_first: bool,
    /// What this node announces to its peers.
    pub announce: Option<Endpoint>,
    /// How long a slot's new owner reads misses from the previous owner.
    pub handoff_window_ms: u64,
    /// Hand-offs that began before this time (Unix ms) are over (FLUSHALL).
    handoff_floor: AtomicU64,
    /// Writes to handed-off keys so far, by slot: a pull that sees the
    /// count of a key's slot change while it is under way does not keep
    /// what it read for that key (the write may be deleting it).
    handoff_writes: Box<[std::sync::atomic::AtomicU32]>,
    /// When this node last lost slots (Unix ms): keys of slots it does not
    /// own are dropped once the hand-off window after that has passed.
    last_loss_ms: AtomicU64,
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
    /// node list). Peers are logged in to with what `login` returns, over
    /// TLS when `tls` returns a configuration, when a connection to one
    /// opens.
    pub fn new(
        settings: &Settings,
        login: impl Fn() -> peer::Login + Send + Sync + 'static,
        tls: impl Fn() -> peer::PeerTls + Send + Sync + 'static,
    ) -> Result<Option<Cluster>, String> {
        let list = settings.nodes.trim();
        if list.is_empty() {
            return Ok(None);
        }
        let list = parse_list(list)?;
        let text = format_list(&list);
        let NodeList { nodes, left } = list;
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
        let announce = (settings.announce_ip.is_some()
            || settings.announce_port.is_some()
            || settings.announce_hostname.is_some())
        .then(|| {
            let mine = nodes.iter().find(|n| n.id == me).expect("checked above");
            let default = Endpoint::of(mine);
            Endpoint {
                ip: settings.announce_ip.clone().unwrap_or(default.ip),
                port: settings.announce_port.unwrap_or(default.port),
                hostname: settings.announce_hostname.clone().unwrap_or_default(),
            }
        });
        if let Some(e) = &announce {
            // What peers will accept from this node's pings.
            if parse_announce(
                e.ip.as_bytes(),
                e.port.to_string().as_bytes(),
                e.hostname.as_bytes(),
            )
            .is_none()
            {
                return Err(
                    "--cluster-announce-ip / -hostname: at most 255 printable ASCII characters, no spaces"
                        .into(),
                );
            }
        }
        let members = Members {
            epoch: settings.epoch,
            text,
            last_seen: nodes.iter().map(|n| (n.id.clone(), started)).collect(),
            nodes,
            left,
            announced: announce.iter().map(|e| (me.clone(), e.clone())).collect(),
            last_refresh: started,
        };
        // Before this node (re)joined, the others held its slots: the map
        // without it is where its hand-off reads from.
        let mut view = build_view(&members, &me, started, Duration::MAX, None, 0, false);
        let without_me = view.without_me();
        view.carry_handoff(&without_me, kvtier_store::now_ms(), settings.handoff_ms);
        let view = Arc::new(view);
        Ok(Some(Cluster {
            identity: Identity::new(&me, login, tls),
            me,
            redirect: settings.redirect,
            node_timeout: Duration::from_millis(settings.node_timeout_ms.max(1)),
            hot_threshold: settings.hot_threshold,
            hot_replicas: settings.hot_replicas,
            replica_reads: settings.replica_reads,
            hostname_first: settings.hostname_first,
            announce,
            handoff_window_ms: settings.handoff_ms,
            handoff_floor: AtomicU64::new(0),
            handoff_writes: (0..kvtier_store::slot::SLOTS)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
            last_loss_ms: AtomicU64::new(0),
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

    /// CLUSTER SETNODES: a new member list, taken if its epoch is higher.
    /// Members new to the list join at `epoch`, members missing from it
    /// leave at `epoch` ([`NodeList::succeeded_by`]).
    pub fn set_nodes(&self, list: &str, epoch: u64) -> Result<(), String> {
        let given = NodeList {
            nodes: parse_nodes(list)?,
            left: Vec::new(),
        };
        let mut m = self.lock();
        if epoch <= m.epoch {
            return Err(format!(
                "the epoch must be greater than the current one ({})",
                m.epoch
            ));
        }
        let list = m.list().succeeded_by(given, epoch);
        self.adopt(&mut m, epoch, list);
        Ok(())
    }

    /// A peer's ping (or the answer to ours): it is alive, it announces
    /// `endpoint` (`None`: its list address), and its list wins if its
    /// epoch is higher, or at the same epoch if it takes precedence
    /// ([`NodeList::precedence`]: a node started with a plain list takes
    /// the history the others recorded). A plain list (no joins after the
    /// start, no departures) of a higher epoch, from a newcomer started
    /// with it, succeeds this node's list as CLUSTER SETNODES would.
    /// Returns this node's epoch and list after the
    /// exchange. A sender that is not a member is not recorded.
    pub fn gossip(
        &self,
        from: &str,
        epoch: u64,
        list: &str,
        endpoint: Option<Endpoint>,
    ) -> (u64, String) {
        let mut m = self.lock();
        if m.nodes.iter().any(|n| n.id == from) {
            m.last_seen.insert(from.to_string(), Instant::now());
            match endpoint {
                Some(e) => m.announced.insert(from.to_string(), e),
                None => m.announced.remove(from),
            };
        }
        // The same list (every ping of a settled cluster) is one compare.
        if epoch > m.epoch || (epoch == m.epoch && list != m.text) {
            if let Ok(theirs) = parse_list(list) {
                let plain = theirs.left.is_empty() && theirs.nodes.iter().all(|n| n.since == 0);
                if epoch > m.epoch && plain {
                    let list = m.list().succeeded_by(theirs, epoch);
                    self.adopt(&mut m, epoch, list);
                } else if epoch > m.epoch || theirs.precedence() > m.list().precedence() {
                    self.adopt(&mut m, epoch, theirs);
                }
            }
        }
        let out = (m.epoch, m.text.clone());
        drop(m);
        self.refresh();
        out
    }

    /// What this node's pings and ping answers add after the list:
    /// `ip port hostname` when it announces an endpoint, else nothing.
    pub fn announce_args(&self) -> Vec<Bytes> {
        match &self.announce {
            Some(e) => vec![
                Bytes::from(e.ip.clone()),
                Bytes::from(e.port.to_string()),
                Bytes::from(e.hostname.clone()),
            ],
            None => Vec::new(),
        }
    }

    /// The node `slot`'s misses are read from now (`now_ms`), if this node
    /// gained the slot from a live node within the hand-off window.
    pub fn handoff_source(&self, view: &View, slot: u16, now_ms: u64) -> Option<usize> {
        let (prev, since) = view.handoff_from(slot)?;
        (since >= self.handoff_floor.load(Relaxed)
            && now_ms < since.saturating_add(self.handoff_window_ms))
        .then_some(prev)
    }

    /// Notes a write to a key of `slot` in a hand-off (before it runs).
    pub fn handoff_write_started(&self, slot: u16) {
        self.handoff_writes[slot as usize].fetch_add(1, Relaxed);
    }

    /// The write count of `slot`, to compare before keeping a pulled value.
    pub fn handoff_write_count(&self, slot: u16) -> u32 {
        self.handoff_writes[slot as usize].load(Relaxed)
    }

    /// When the keys of slots this node no longer owns may be dropped:
    /// once every new owner's hand-off window since the last loss has
    /// passed (with a margin for clocks and late pulls). `None`: never lost
    /// any.
    pub fn purge_after_ms(&self) -> Option<u64> {
        let lost = self.last_loss_ms.load(Relaxed);
        let margin = (self.handoff_window_ms / 2).min(10_000);
        (lost > 0).then(|| lost + self.handoff_window_ms + margin)
    }

    /// Ends every hand-off under way (FLUSHALL: nothing is to be read back).
    pub fn end_handoff(&self) {
        self.handoff_floor
            .store(kvtier_store::now_ms().saturating_add(1), Relaxed);
    }

    /// Slots handed off to this node now.
    pub fn handoff_slots(&self, view: &View) -> usize {
        if !view.has_handoff() {
            return 0;
        }
        let now = kvtier_store::now_ms();
        (0..kvtier_store::slot::SLOTS as u16)
            .filter(|&s| self.handoff_source(view, s, now).is_some())
            .count()
    }

    /// A peer answered a ping.
    pub(crate) fn heard_from(&self, id: &str) {
        self.lock().last_seen.insert(id.to_string(), Instant::now());
    }

    /// The epoch and the members.
    pub fn members(&self) -> (u64, Vec<topology::Node>) {
        let m = self.lock();
        (m.epoch, m.nodes.clone())
    }

    /// The epoch and the list with its history, as pings carry it (formed
    /// once per list).
    pub fn list_text(&self) -> (u64, String) {
        let m = self.lock();
        (m.epoch, m.text.clone())
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
        let mut m = self.lock();
        let current = self.view();
        let now = Instant::now();
        // Paused longer than the node timeout: the others have counted this
        // node failed and held its slots meanwhile.
        let paused = now.saturating_duration_since(m.last_refresh) > self.node_timeout;
        m.last_refresh = now;
        if !paused
            && current.epoch == m.epoch
            && current.nodes == m.nodes
            && current.left == m.left
            && current.alive == alive_flags(&m, &self.me, now, self.grace())
            && current.endpoints == endpoints(&m)
        {
            return;
        }
        let view = build_view(
            &m,
            &self.me,
            now,
            self.grace(),
            Some(&current),
            self.handoff_window_ms,
            paused,
        );
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
            self.note_loss(&current, &view);
            *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
            self.version.fetch_add(1, Relaxed);
        }
    }

    /// Records when this node lost slots between two views.
    fn note_loss(&self, before: &View, after: &View) {
        if after.loses(before) {
            self.last_loss_ms.store(kvtier_store::now_ms(), Relaxed);
        }
    }

    /// Silence allowed before a node counts as failed; at start-up every
    /// peer gets a full timeout to be heard from.
    fn grace(&self) -> Duration {
        self.node_timeout
    }

    fn adopt(&self, m: &mut Members, epoch: u64, list: NodeList) {
        let text = format_list(&list);
        info!("cluster epoch {epoch}: {text}");
        let NodeList { nodes, left } = list;
        let now = Instant::now();
        for n in &nodes {
            // A newcomer gets a full timeout to answer.
            m.last_seen.entry(n.id.clone()).or_insert(now);
        }
        m.last_seen
            .retain(|id, _| nodes.iter().any(|n| &n.id == id));
        m.announced
            .retain(|id, _| nodes.iter().any(|n| &n.id == id));
        m.epoch = epoch;
        m.text = text;
        m.nodes = nodes;
        m.left = left;
        let before = self.view();
        let view = build_view(
            m,
            &self.me,
            now,
            self.grace(),
            Some(&before),
            self.handoff_window_ms,
            false,
        );
        self.note_loss(&before, &view);
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

impl Members {
    fn list(&self) -> NodeList {
        NodeList {
            nodes: self.nodes.clone(),
            left: self.left.clone(),
        }
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

/// Each member's endpoint: announced, else its list address.
fn endpoints(m: &Members) -> Vec<Endpoint> {
    m.nodes
        .iter()
        .map(|n| {
            m.announced
                .get(&n.id)
                .cloned()
                .unwrap_or_else(|| Endpoint::of(n))
        })
        .collect()
}

/// The view of `m` now; slots gained since `before` (and, when this node
/// was cut off or `paused` and hears the others again, its own slots) are
/// handed off for `handoff_ms`.
fn build_view(
    m: &Members,
    me: &str,
    now: Instant,
    timeout: Duration,
    before: Option<&View>,
    handoff_ms: u64,
    paused: bool,
) -> View {
    let alive = alive_flags(m, me, now, timeout);
    let me = m.nodes.iter().position(|n| n.id == me);
    let mut view = View::with_list(m.epoch, m.list(), alive, me, endpoints(m));
    if let Some(before) = before {
        let now_ms = kvtier_store::now_ms();
        let rejoining =
            before.rejoined_at > 0 && now_ms < before.rejoined_at.saturating_add(handoff_ms);
        if paused || (view.revives(before) && (before.was_cut_off() || rejoining)) {
            // This node was cut off (a partition, a pause) and hears the
            // others again: meanwhile they held its slots, so its misses are
            // read from where its slots go without it among the nodes live
            // now (nodes come back one at a time: each revival starts this
            // afresh). A node of the side that stayed whole hands off only
            // the slots it gains, as on any change.
            let without_me = view.without_me();
            view.carry_handoff(&without_me, now_ms, handoff_ms);
            view.rejoined_at = if rejoining {
                before.rejoined_at
            } else {
                now_ms
            };
        } else {
            view.carry_handoff(before, now_ms, handoff_ms);
            if rejoining {
                view.rejoined_at = before.rejoined_at;
            }
        }
    }
    view
}

/// The endpoint a ping or its answer announces after the list (`ip port
/// hostname`), if it is there and well formed.
pub fn parse_announce(ip: &[u8], port: &[u8], hostname: &[u8]) -> Option<Endpoint> {
    let port = std::str::from_utf8(port).ok()?.parse::<u16>().ok()?;
    let ip = std::str::from_utf8(ip).ok()?;
    let hostname = std::str::from_utf8(hostname).ok()?;
    let fits = |s: &str| s.len() <= 255 && s.bytes().all(|b| b.is_ascii_graphic());
    (port != 0 && !ip.is_empty() && fits(ip) && fits(hostname)).then(|| Endpoint {
        ip: ip.to_string(),
        port,
        hostname: hostname.to_string(),
    })
}

fn is_local(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(me: &str, list: &str, epoch: u64) -> Cluster {
        let settings = Settings {
            nodes: list.into(),
            node_id: Some(me.into()),
            epoch,
            node_timeout_ms: 60_000,
            ..Settings::default()
        };
        Cluster::new(&settings, || None, || None)
            .unwrap()
            .expect("a cluster")
    }

    const THREE: &str = "n1@127.0.0.1:7001,n2@127.0.0.1:7002,n3@127.0.0.1:7003";
    const FOUR: &str = "n1@127.0.0.1:7001,n2@127.0.0.1:7002,n3@127.0.0.1:7003,n4@127.0.0.1:7004";

    #[test]
    fn setnodes_records_joins_and_departures_and_pings_spread_them() {
        let old = node("n1", THREE, 0);
        old.set_nodes(FOUR, 1).unwrap();
        old.set_nodes("n1@127.0.0.1:7001,n3@127.0.0.1:7003,n4@127.0.0.1:7004", 2)
            .unwrap();
        let history = old.list_text().1;
        assert_eq!(history, format_list(&old.lock().list()));
        assert_eq!(
            history,
            "n1@127.0.0.1:7001,n3@127.0.0.1:7003,n4@127.0.0.1:7004#1,~n2#0-2"
        );
        assert!(old.set_nodes(FOUR, 2).is_err(), "the epoch must rise");
        // A newcomer started with a plain list of the same epoch takes the
        // history from a ping, and answers with it.
        let newcomer = node(
            "n4",
            "n1@127.0.0.1:7001,n3@127.0.0.1:7003,n4@127.0.0.1:7004",
            2,
        );
        assert_eq!(
            newcomer.gossip("n1", 2, &history, None),
            (2, history.clone())
        );
        // The node with history keeps it when the plain list comes back.
        let plain = "n1@127.0.0.1:7001,n3@127.0.0.1:7003,n4@127.0.0.1:7004";
        assert_eq!(old.gossip("n4", 2, plain, None), (2, history.clone()));
        // Both compute the same map.
        let (a, b) = (old.view(), newcomer.view());
        assert!((0..SLOTS_U16).all(|s| a.nodes[a.owner(s)].id == b.nodes[b.owner(s)].id));
    }

    #[test]
    fn a_plain_list_of_a_higher_epoch_succeeds_the_current_one() {
        // A newcomer started with the grown list at a higher epoch, before
        // any SETNODES: the others take it as SETNODES would, so it joins
        // last wherever its id sorts.
        let old = node("n2", "n2@127.0.0.1:7002,n3@127.0.0.1:7003", 0);
        let grown = "a0@127.0.0.1:7000,n2@127.0.0.1:7002,n3@127.0.0.1:7003";
        let (epoch, list) = old.gossip("a0", 1, grown, None);
        assert_eq!(epoch, 1);
        assert_eq!(
            list,
            "a0@127.0.0.1:7000#1,n2@127.0.0.1:7002,n3@127.0.0.1:7003"
        );
    }

    #[test]
    fn a_newcomer_at_the_clusters_epoch_waits_for_setnodes() {
        // Started with the grown plain list at the cluster's epoch, the
        // newcomer's ping reaches an old node before any SETNODES: the old
        // node keeps its list (a plain four-node list would be replayed as
        // if all four had been there from the start), and the newcomer
        // takes the cluster's from the answer.
        let old = node("n2", THREE, 0);
        let newcomer = node("n4", FOUR, 0);
        let before = old.view();
        assert_eq!(old.gossip("n4", 0, FOUR, None), (0, THREE.to_string()));
        assert_eq!(
            newcomer.gossip("n2", 0, THREE, None),
            (0, THREE.to_string())
        );
        assert_eq!(newcomer.view().me, None, "outside the list until it joins");
        // SETNODES then records the join, and the ping carries it.
        old.set_nodes(FOUR, 1).unwrap();
        let (epoch, history) = old.list_text();
        assert_eq!(history, format!("{FOUR}#1"));
        assert_eq!(newcomer.gossip("n2", epoch, &history, None), (1, history));
        // The newcomer takes its fair share; nothing moves between the others.
        let (a, b) = (old.view(), newcomer.view());
        let mut moved = 0;
        for s in 0..SLOTS_U16 {
            let now = &a.nodes[a.owner(s)].id;
            assert_eq!(now, &b.nodes[b.owner(s)].id);
            if now != &before.nodes[before.owner(s)].id {
                assert_eq!(now, "n4", "slot {s} moved between old nodes");
                moved += 1;
            }
        }
        assert_eq!(moved, 4096);
    }

    const SLOTS_U16: u16 = kvtier_store::slot::SLOTS as u16;
}
