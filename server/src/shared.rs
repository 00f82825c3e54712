//! The node's state: what every shard thread reads — the settings, the
//! users, the counters of the whole node, the spill tier, the cluster —
//! and nothing of how the shards reach each other (that is
//! [`crate::shard::ShardSet`]'s). Every layer above reads it; it reads
//! only the leaves and the configuration (mini-redis's `Db` is the model:
//! the context type at the bottom, the file that starts the server at the
//! top).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use kvtier_cluster::Cluster;
use kvtier_store::spill::{IoPool, Segment, SpillDir};
use tokio::sync::watch;
use tracing::info;

use crate::acl::{Acl, Catalog};
use crate::config::{human_bytes, Config, LiveConfig};
use crate::tls::Tls;

/// State shared by every shard thread. Read on the data path only through
/// atomics; nothing here is locked per command.
pub struct Shared {
    /// Number of shards.
    pub shards: usize,
    /// The command table as data: names and ACL categories by command id
    /// (the ids of the per-command statistics).
    pub catalog: &'static Catalog,
    /// Settings CONFIG SET can change.
    pub config: LiveConfig,
    /// When the server started.
    pub started: Instant,
    /// Unix seconds at start.
    pub started_unix: u64,
    /// Random id of this run (INFO run_id).
    pub run_id: String,
    /// The port clients connect to.
    pub port: u16,
    /// Path of the executable.
    pub executable: String,
    /// Path of the config file, if any.
    pub config_file: String,
    /// Source of client ids.
    pub next_client_id: AtomicU64,
    /// Open client connections.
    pub connected: AtomicUsize,
    /// The cron's ticker thread, once started ([`Shared::wake_ticker`]).
    pub ticker: std::sync::OnceLock<std::thread::Thread>,
    /// Open connections by the shard serving them: an accepted connection
    /// goes to the shard with the fewest ([`Shared::seat_for`]).
    pub seated: Vec<AtomicUsize>,
    /// Where connections should be served, as the ticker last decided
    /// ([`Placement`], encoded; `net::packing` decides).
    placement: AtomicUsize,
    /// Each shard thread's CPU time (ns), as its cron last read it.
    pub shard_cpu_ns: Vec<AtomicU64>,
    /// Bytes held by the requests still arriving on every connection
    /// (`maxmemory-clients` bounds it).
    pub client_query_bytes: AtomicU64,
    /// Clients waiting in a blocking read, on every shard
    /// (`max-blocked-clients` bounds it).
    pub blocked: AtomicU64,
    /// Highest used_memory seen.
    pub memory_peak: AtomicU64,
    /// Whether the cron expires keys (DEBUG SET-ACTIVE-EXPIRE).
    pub active_expire: AtomicBool,
    /// The NVMe spill tier, when configured.
    pub spill: Option<SpillTier>,
    /// The cluster this node belongs to (`--cluster-nodes`).
    pub cluster: Option<Arc<Cluster>>,
    shutdown: watch::Sender<bool>,
}

/// The spill tier's shared parts.
pub struct SpillTier {
    /// The segment directory.
    pub dir: Arc<SpillDir>,
    /// The I/O threads.
    pub pool: Arc<IoPool>,
    /// The segments an earlier run left, oldest first, until the loader
    /// takes them.
    segments: std::sync::Mutex<Vec<Arc<Segment>>>,
}

impl SpillTier {
    /// Opens the directory, applies the budget and registers the segments
    /// an earlier run left, without reading them: their index loads in the
    /// background once the shards run (`server::start_loader`).
    pub fn open(config: &Config, path: &std::path::Path) -> io::Result<SpillTier> {
        let dir = SpillDir::open(path, config.spill_max_bytes)?;
        let segments = dir.open_segments()?;
        if config.spill_max_bytes == 0 {
            // The default: 90% of what the filesystem has, counting what
            // the tier already holds.
            let room = dir.free_bytes()? + dir.used_bytes();
            dir.set_max_bytes(room / 10 * 9);
        }
        info!(
            "spill tier at {}: {} segment(s), {} on disk, budget {}, O_DIRECT {}",
            path.display(),
            segments.len(),
            human_bytes(dir.used_bytes()),
            human_bytes(dir.max_bytes()),
            if dir.direct() {
                "on"
            } else {
                "off (filesystem does not support it)"
            },
        );
        Ok(SpillTier {
            dir: Arc::new(dir),
            pool: Arc::new(IoPool::start(config.spill_io_threads.max(1))),
            segments: std::sync::Mutex::new(segments),
        })
    }

    /// The segments to load (once).
    pub fn take_segments(&self) -> Vec<Arc<Segment>> {
        self.segments
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

impl Shared {
    /// The state `shards` shards share, for a server on `port`: the live
    /// settings and cluster membership built from `config`, with `acl`
    /// (whose catalog is the command table's).
    pub fn new(
        config: &Config,
        port: u16,
        shards: usize,
        spill: Option<SpillTier>,
        tls: Option<Arc<Tls>>,
        acl: Acl,
    ) -> io::Result<Arc<Shared>> {
        let peer_tls = {
            let tls = tls.clone().filter(|t| t.cluster);
            move || tls.as_ref().and_then(|t| t.peer_config())
        };
        let catalog = acl.catalog();
        let live = LiveConfig::new(config, acl, tls, shards, port);
        let cluster = Cluster::new(&cluster_settings(config), live.peer_login(), peer_tls)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .map(Arc::new);
        let (shutdown, _) = watch::channel(false);
        Ok(Arc::new(Shared {
            shards,
            catalog,
            config: live,
            started: Instant::now(),
            started_unix: kvtier_store::now_ms() / 1000,
            run_id: run_id(),
            port,
            executable: std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            config_file: config
                .config_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            next_client_id: AtomicU64::new(1),
            connected: AtomicUsize::new(0),
            ticker: std::sync::OnceLock::new(),
            seated: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            placement: AtomicUsize::new(Placement::Stay.encode()),
            shard_cpu_ns: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            client_query_bytes: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            memory_peak: AtomicU64::new(0),
            active_expire: AtomicBool::new(true),
            spill,
            cluster,
            shutdown,
        }))
    }

    /// Starts a graceful shutdown of every shard.
    pub fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
        self.wake_ticker();
    }

    /// Wakes the cron's ticker (it sleeps a whole second while no
    /// connection is open): shutdown, or the first connection.
    pub fn wake_ticker(&self) {
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
    }

    /// Where client connections are to be served now.
    #[inline]
    pub fn placement(&self) -> Placement {
        Placement::decode(self.placement.load(Relaxed))
    }

    /// Sets where client connections are to be served.
    pub fn set_placement(&self, placement: Placement) {
        self.placement.store(placement.encode(), Relaxed);
    }

    /// A receiver that sees `true` once shutdown is requested.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Whether shutdown was requested.
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Where client connections are to be served, as the ticker decides from
/// the load (`net::packing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Where they are.
    Stay,
    /// Moved until the shards' counts differ by at most one.
    Spread,
    /// Every connection that can move on this shard.
    On(usize),
}

impl Placement {
    fn encode(self) -> usize {
        match self {
            Placement::Stay => 0,
            Placement::Spread => 1,
            Placement::On(shard) => 2 + shard,
        }
    }

    #[inline]
    fn decode(v: usize) -> Placement {
        match v {
            0 => Placement::Stay,
            1 => Placement::Spread,
            shard => Placement::On(shard - 2),
        }
    }
}

/// One open connection, counted in [`Shared::connected`] and, for the shard
/// serving it, in [`Shared::seated`], from its accept until it ends (or is
/// dropped on the way: the counts cannot leak).
pub struct ShardSeat {
    shared: Arc<Shared>,
    /// The shard serving the connection.
    pub shard: usize,
}

impl ShardSeat {
    /// The connection is now served by shard `to`.
    pub fn move_to(&mut self, to: usize) {
        self.shared.seated[to].fetch_add(1, Relaxed);
        self.shared.seated[self.shard].fetch_sub(1, Relaxed);
        self.shard = to;
    }
}

impl Drop for ShardSeat {
    fn drop(&mut self) {
        self.shared.seated[self.shard].fetch_sub(1, Relaxed);
        self.shared.connected.fetch_sub(1, Relaxed);
    }
}

impl Shared {
    /// Where a connection that shard `here` accepted is served: the shard
    /// serving the fewest connections, `here` on a tie. SO_REUSEPORT
    /// spreads connections by a hash of their addresses, so a client's
    /// four connections all land on one of two shards one time in eight,
    /// and on three to one half the time; placed by count, they are two
    /// and two, as Dragonfly's acceptor deals them out. (Connections are
    /// counted in [`Shared::connected`] before this is asked.)
    pub fn seat_for(self: &Arc<Shared>, here: usize) -> ShardSeat {
        let mut best = (self.seated[here].load(Relaxed), here);
        for (shard, n) in self.seated.iter().enumerate() {
            best = best.min((n.load(Relaxed), shard));
            if best.0 == 0 {
                break;
            }
        }
        let shard = if self.seated[here].load(Relaxed) <= best.0 {
            here
        } else {
            best.1
        };
        self.seated[shard].fetch_add(1, Relaxed);
        ShardSeat {
            shared: Arc::clone(self),
            shard,
        }
    }
}

fn run_id() -> String {
    let seed = kvtier_store::now_ms() ^ ((std::process::id() as u64) << 32);
    let mut x = seed | 1;
    (0..40)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            std::char::from_digit((x % 16) as u32, 16).unwrap_or('0')
        })
        .collect()
}

/// The cluster part of the configuration.
fn cluster_settings(config: &Config) -> kvtier_cluster::Settings {
    kvtier_cluster::Settings {
        nodes: config.cluster_nodes.clone().unwrap_or_default(),
        node_id: config.node_id.clone(),
        port: config.port,
        epoch: config.cluster_epoch,
        redirect: config.cluster_redirect,
        node_timeout_ms: config.cluster_node_timeout,
        hot_threshold: config.hot_key_threshold,
        hot_replicas: config.hot_key_replicas,
        replica_reads: config.cluster_replica_reads,
        announce_ip: config.cluster_announce_ip.clone(),
        announce_port: config.cluster_announce_port,
        announce_hostname: config.cluster_announce_hostname.clone(),
        hostname_first: config.cluster_preferred_endpoint_type == "hostname",
        handoff_ms: config.cluster_handoff_ms,
    }
}
