//! Starting and stopping the server: one thread per shard, each with its own
//! current-thread tokio runtime, `SO_REUSEPORT` listener, mailbox and cron.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvtier_cluster::Cluster;
use kvtier_store::spill::{self, IoPool, Recovered, SpillDir};
use kvtier_store::{MemoryOptions, SpillConfig, Store, StoreJob};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::LocalSet;
use tracing::{info, warn};

use crate::config::{Config, LiveConfig};
use crate::report::{Exporter, ShardReport};
use crate::shard::{self, slot::shard_slots, slot::slot_shard, Mailbox, Shard, StoreCells};

/// State shared by every shard thread. Read on the data path only through
/// atomics; nothing here is locked per command.
pub struct Shared {
    /// Number of shards.
    pub shards: usize,
    /// Each shard's mailbox.
    pub mailboxes: Vec<Mailbox>,
    /// Each shard's cron tick, rung `hz` times a second by the ticker
    /// thread: the shards' runtimes then hold no timer of their own, so a
    /// request's park does not walk a timer wheel.
    pub ticks: Vec<Arc<tokio::sync::Notify>>,
    /// Each shard's store, for reads taken without waking its thread
    /// ([`Shard::with_store`](crate::shard::Shard::with_store)).
    pub stores: StoreCells,
    /// Link events posted to each shard and not yet applied there: a read
    /// of that shard's store from another thread waits behind them in the
    /// mailbox instead ([`Shard::read_now`](crate::shard::Shard::read_now)).
    pub links_queued: Vec<AtomicUsize>,
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
    /// Open connections by the shard serving them: an accepted connection
    /// goes to the shard with the fewest ([`Shared::seat_for`]).
    pub seated: Vec<AtomicUsize>,
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
    /// What the warm-restart scan found, per shard, until the shard takes it.
    recovered: std::sync::Mutex<Vec<Vec<Recovered>>>,
}

impl SpillTier {
    /// Opens the directory, applies the budget and scans what an earlier
    /// run left (routing each record to the shard that owns its key now,
    /// whatever the shard count was then).
    fn open(config: &Config, path: &std::path::Path, shards: usize) -> io::Result<SpillTier> {
        let dir = SpillDir::open(path, config.spill_max_bytes)?;
        let started = Instant::now();
        let found = spill::recover(&dir)?;
        if config.spill_max_bytes == 0 {
            // The default: 90% of what the filesystem has, counting what
            // the tier already holds.
            let room = dir.free_bytes()? + dir.used_bytes();
            dir.set_max_bytes(room / 10 * 9);
        }
        info!(
            "spill tier at {}: {} block(s) recovered from {} segment(s) in {:.1?} ({} damaged record(s) skipped), budget {}, O_DIRECT {}",
            path.display(),
            found.records.len(),
            dir.segment_count(),
            started.elapsed(),
            found.skipped,
            crate::config::human_bytes(dir.max_bytes()),
            if dir.direct() { "on" } else { "off (filesystem does not support it)" },
        );
        let mut per_shard: Vec<Vec<Recovered>> = (0..shards).map(|_| Vec::new()).collect();
        for r in found.records {
            per_shard[slot_shard(crate::shard::slot::key_slot(&r.key), shards)].push(r);
        }
        Ok(SpillTier {
            dir: Arc::new(dir),
            pool: Arc::new(IoPool::start(config.spill_io_threads.max(1))),
            recovered: std::sync::Mutex::new(per_shard),
        })
    }

    fn take_recovered(&self, shard: usize) -> Vec<Recovered> {
        self.recovered
            .lock()
            .ok()
            .and_then(|mut all| all.get_mut(shard).map(std::mem::take))
            .unwrap_or_default()
    }
}

impl Shared {
    /// The users `config` names (`--requirepass`, `--aclfile`): checked
    /// first, before the TLS settings and the listeners.
    pub fn acl_of(config: &Config) -> io::Result<crate::acl::Acl> {
        let acl = crate::acl::Acl::new(
            &crate::commands::table().catalog,
            &config.requirepass,
            config.aclfile.clone(),
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        acl.log_max_len.store(config.acllog_max_len, Relaxed);
        Ok(acl)
    }

    /// The state `shards` shards share (one mailbox sender each), for a
    /// server on `port`: the live settings and cluster membership built
    /// from `config`, with `acl` ([`Shared::acl_of`]).
    pub fn new(
        config: &Config,
        port: u16,
        mailboxes: Vec<Mailbox>,
        spill: Option<SpillTier>,
        tls: Option<Arc<crate::tls::Tls>>,
        acl: crate::acl::Acl,
    ) -> io::Result<Arc<Shared>> {
        let shards = mailboxes.len();
        let peer_tls = {
            let tls = tls.clone().filter(|t| t.cluster);
            move || tls.as_ref().and_then(|t| t.peer_config())
        };
        let live = LiveConfig::new(config, acl, tls, shards, port);
        let cluster = Cluster::new(&cluster_settings(config), live.peer_login(), peer_tls)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .map(Arc::new);
        let (shutdown, _) = watch::channel(false);
        Ok(Arc::new(Shared {
            shards,
            mailboxes,
            stores: (0..shards).map(|_| std::sync::OnceLock::new()).collect(),
            links_queued: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            ticks: (0..shards).map(|_| Arc::default()).collect(),
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
            seated: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
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

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Server {
    /// Binds the listeners and starts every shard thread.
    pub fn start(config: &Config) -> io::Result<Server> {
        let shards = config.shard_count();
        let addr = (config.bind.as_str(), config.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind"))?;
        // The first listener fixes the port (when 0 asks for any free one);
        // the others share it through SO_REUSEPORT.
        let first = reuseport_listener(addr)?;
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..shards {
            listeners.push(reuseport_listener(addr)?);
        }
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..shards).map(|_| mpsc::unbounded_channel()).unzip();
        let spill = match &config.spill_dir {
            Some(path) => Some(SpillTier::open(config, path, shards).map_err(|e| {
                io::Error::new(e.kind(), format!("spill dir {}: {e}", path.display()))
            })?),
            None => None,
        };
        let mut config = config.clone();
        if let Some(tier) = &spill {
            config.spill_max_bytes = tier.dir.max_bytes();
        }
        let config = &config;
        let acl = Shared::acl_of(config)?;
        let tls = crate::tls::Tls::new(config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .map(Arc::new);
        let tls_listeners = match tls.as_ref().filter(|t| t.port != 0) {
            Some(t) => {
                let tls_addr = SocketAddr::new(addr.ip(), t.port);
                (0..shards)
                    .map(|_| reuseport_listener(tls_addr).map(Some))
                    .collect::<io::Result<Vec<_>>>()?
            }
            None => (0..shards).map(|_| None).collect(),
        };
        let shared = Shared::new(config, addr.port(), senders, spill, tls, acl)?;
        let cpus = allowed_cpus();
        let mut threads = Vec::with_capacity(shards);
        // The shards' timers run there (their runtimes have no time driver).
        kvtier_timer::start()?;
        let listeners = listeners.into_iter().zip(tls_listeners);
        for (id, ((listener, tls_listener), rx)) in listeners.zip(receivers).enumerate() {
            let shared = Arc::clone(&shared);
            // Pin only when asked and there is a core for every shard.
            let cpu = (config.pin_threads && cpus.len() >= shards).then(|| cpus[id]);
            let handle = std::thread::Builder::new()
                .name(format!("kvtier-shard-{id}"))
                .spawn(move || run_shard(id, shared, listener, tls_listener, rx, cpu))?;
            threads.push(handle);
        }
        threads.push(start_ticker(Arc::clone(&shared))?);
        if let Some(cluster) = &shared.cluster {
            threads.push(kvtier_cluster::gossip::start(
                Arc::clone(cluster),
                shared.shutdown_signal(),
            )?);
            let view = cluster.view();
            info!(
                "cluster node {} of {} ({}), {}",
                cluster.me,
                view.nodes.len(),
                kvtier_cluster::topology::format_nodes(&view.nodes),
                if cluster.redirect {
                    "answering MOVED"
                } else {
                    "forwarding"
                }
            );
        }
        info!(
            "kvtier {} listening on {addr} with {shards} shard(s)",
            env!("CARGO_PKG_VERSION")
        );
        Ok(Server {
            shared,
            threads,
            addr,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// State shared by the shards.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Asks every shard to stop.
    pub fn shutdown(&self) {
        self.shared.request_shutdown();
    }

    /// Waits until every shard thread has stopped.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
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

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn run_shard(
    id: usize,
    shared: Arc<Shared>,
    listener: StdListener,
    tls_listener: Option<StdListener>,
    rx: mpsc::UnboundedReceiver<shard::ShardJob>,
    cpu: Option<usize>,
) {
    if let Some(cpu) = cpu {
        shard::pin_to_core(cpu);
    }
    // No time driver: it would walk its wheel at every park, once per
    // request for a lone client; the shard's few timers are kvtier-timer's.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            warn!("shard {id}: cannot start its runtime: {e}");
            shared.request_shutdown();
            return;
        }
    };
    let local = LocalSet::new();
    local.block_on(&runtime, async move {
        let n = shared.shards;
        let budget = shard_budget(&shared.config, n);
        let memory = MemoryOptions {
            hugepages: shared.config.hugepages,
            prealloc: shared.config.prealloc,
        };
        let mut store =
            Store::with_memory(shard_slots(id, n), budget, shared.config.policy(), memory);
        store.set_samples(shared.config.maxmemory_samples.load(Relaxed) as usize);
        store.set_max_value_len(shared.config.proto_max_bulk_len.load(Relaxed) as usize);
        if let Some(tier) = &shared.spill {
            let mailbox = shared.mailboxes[id].clone();
            store.enable_spill(SpillConfig {
                dir: Arc::clone(&tier.dir),
                pool: Arc::clone(&tier.pool),
                post: Arc::new(move |job: StoreJob| {
                    let _ =
                        mailbox.send(Box::new(move |shard: &Shard| job(&mut shard.store.lock())));
                }),
                shard: id,
                admission: spill_admission(&shared.config),
            });
            store.insert_recovered(tier.take_recovered(id), kvtier_store::now_ms());
        }
        let shard = Rc::new_cyclic(|me| Shard::new(id, Arc::clone(&shared), store, me.clone()));
        tokio::task::spawn_local(shard::run_mailbox(Rc::clone(&shard), rx));
        tokio::task::spawn_local(cron(Rc::clone(&shard)));
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                warn!("shard {id}: listener: {e}");
                shared.request_shutdown();
                return;
            }
        };
        if let Some(tls) = tls_listener.map(TcpListener::from_std) {
            match tls {
                Ok(l) => {
                    tokio::task::spawn_local(accept_loop(Rc::clone(&shard), l, true));
                }
                Err(e) => warn!("shard {id}: TLS listener: {e}"),
            }
        }
        // The accepting runs as a task of its own: the future `block_on`
        // drives is polled again on every wake-up of the thread, so it
        // should cost nothing to poll (a join handle) rather than poll the
        // listener and the shutdown signal once per request.
        let _ = tokio::task::spawn_local(accept_loop(Rc::clone(&shard), listener, false)).await;
        shard.clients.borrow().kill_all();
        // Let connections see the kill and close their sockets.
        tokio::task::yield_now().await;
        if shared.spill.is_some() && shared.config.spill_on_shutdown.load(Relaxed) {
            let started = Instant::now();
            shard.store.lock().spill_everything();
            info!(
                "shard {id}: DRAM blocks written to the spill tier in {:.1?}",
                started.elapsed()
            );
        }
    });
}

fn spill_admission(config: &LiveConfig) -> u8 {
    config.spill_admission.load(Relaxed).min(u8::MAX as u64) as u8
}

fn shard_budget(config: &LiveConfig, shards: usize) -> usize {
    (config.maxmemory.load(Relaxed) / shards as u64) as usize
}

/// One open connection, counted in [`Shared::connected`] and, for the shard
/// serving it, in [`Shared::seated`], from its accept until it ends (or is
/// dropped on the way: the counts cannot leak).
pub struct ShardSeat {
    shared: Arc<Shared>,
    shard: usize,
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
    fn seat_for(self: &Arc<Shared>, here: usize) -> ShardSeat {
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

/// Accepts connections on `listener` (TLS ones when `tls`) until shutdown,
/// serving each here or on the shard [`Shared::seat_for`] picks.
async fn accept_loop(shard: Rc<Shard>, listener: TcpListener, tls: bool) {
    let shared = Arc::clone(&shard.shared);
    let mut shutdown = shared.shutdown_signal();
    if shared.shutting_down() {
        return;
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let max = shared.config.maxclients.load(Relaxed) as usize;
                    if shared.connected.fetch_add(1, Relaxed) >= max {
                        shared.connected.fetch_sub(1, Relaxed);
                        shard.stats.borrow_mut().rejected_connections += 1;
                        let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
                        continue;
                    }
                    let seat = shared.seat_for(shard.id);
                    if seat.shard == shard.id {
                        tokio::task::spawn_local(crate::net::connection::accept(
                            Rc::clone(&shard),
                            stream,
                            peer,
                            tls,
                            seat,
                        ));
                    } else {
                        hand_over(&shard, stream, peer, tls, seat);
                    }
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    kvtier_timer::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Sends a connection this shard accepted to the shard `seat` names, which
/// registers the socket with its own runtime and serves it from then on
/// (its TLS handshake included). A connection that cannot move is closed.
fn hand_over(shard: &Shard, stream: TcpStream, peer: SocketAddr, tls: bool, seat: ShardSeat) {
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(e) => {
            warn!(
                "moving a connection from {peer} to shard {}: {e}",
                seat.shard
            );
            return;
        }
    };
    let target = seat.shard;
    let _ = shard.post(
        target,
        Box::new(move |s: &Shard| {
            let Some(me) = s.rc() else {
                return;
            };
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    tokio::task::spawn_local(crate::net::connection::accept(
                        me, stream, peer, tls, seat,
                    ));
                }
                Err(e) => warn!("taking a connection from {peer}: {e}"),
            }
        }),
    );
}

/// Rings every shard's cron tick `hz` times a second until shutdown.
fn start_ticker(shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvtier-ticker".into())
        .spawn(move || {
            while !shared.shutting_down() {
                let hz = shared.config.hz.load(Relaxed).clamp(1, 500);
                std::thread::sleep(Duration::from_millis(1000 / hz));
                for tick in &shared.ticks {
                    tick.notify_one();
                }
            }
        })
}

/// Background work of a shard: active expiry `hz` times a second, and once
/// a second the rate sample and the metrics export.
async fn cron(shard: Rc<Shard>) {
    let shared = Arc::clone(&shard.shared);
    let mut last_export = Instant::now();
    let (mut exporter, mut node_exporter) = (Exporter::default(), Exporter::default());
    let tick = Arc::clone(&shared.ticks[shard.id]);
    loop {
        tick.notified().await;
        if shard.id == 0 {
            kvtier_store::resync_clock();
        }
        shard.deliver_links();
        let timeout = shared.config.timeout.load(Relaxed);
        if timeout > 0 {
            shard
                .clients
                .borrow()
                .kill_idle(Duration::from_secs(timeout));
        }
        // Lookup holds past their deadline give their room back.
        shard.store.lock().sweep_holds(kvtier_store::now_ms());
        if shared.active_expire.load(Relaxed) {
            // Bounded work per round so clients are not stalled; the next
            // round continues right after yielding.
            loop {
                let removed = shard.store.lock().expire_due(kvtier_store::now_ms(), 1000);
                if removed < 1000 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        let elapsed = last_export.elapsed();
        if elapsed >= Duration::from_secs(1) {
            last_export = Instant::now();
            shard.stats.borrow_mut().sample_ops(elapsed);
            let report = ShardReport::of(&shard);
            shared
                .memory_peak
                .fetch_max(report.used_memory as u64 * shared.shards as u64, Relaxed);
            crate::report::export(&mut exporter, &mut node_exporter, &shared, &report);
            if let Some(cluster) = &shared.cluster {
                hot_window(&shard, cluster);
                purge_lost_slots(&shard, cluster);
            }
        }
    }
}

/// Most keys of lost slots dropped per shard and second.
const PURGE_PER_ROUND: usize = 10_000;

/// Drops the keys of slots this node no longer owns once the new owners'
/// hand-off window has passed: nobody reads them any more, and an old value
/// left here must not be pulled back by a later hand-off.
fn purge_lost_slots(shard: &Shard, cluster: &Cluster) {
    let Some(after) = cluster.purge_after_ms() else {
        return;
    };
    let now = kvtier_store::now_ms();
    if now < after || shard.purged_loss.get() >= after {
        return;
    }
    let view = shard.view();
    let mut store = shard.store.lock();
    let mut left = PURGE_PER_ROUND;
    for slot in store.slots() {
        if view.owns(slot as u16) {
            continue;
        }
        let keys = store.keys_in_slot(slot, left, now);
        left -= keys.len();
        for key in keys {
            store.remove(slot as u16, &key);
        }
        if left == 0 {
            // The rest next second.
            return;
        }
    }
    shard.purged_loss.set(after);
}

/// Ends a hot-key window: this shard's counts go to the node; shard 0
/// then copies the hot keys out (in the background).
fn hot_window(shard: &Rc<Shard>, cluster: &Arc<Cluster>) {
    if cluster.hot_threshold == 0 {
        return;
    }
    let top = shard.hot.borrow_mut().rotate();
    cluster.report_hot(shard.id, shard.shared.shards, top);
    shard.copies.borrow_mut().purge(Instant::now());
    if shard.id == 0 {
        let (shard, cluster) = (Rc::clone(shard), Arc::clone(cluster));
        tokio::task::spawn_local(async move {
            crate::coordination::replicate_hot(&shard, &cluster).await;
        });
    }
}

/// Pushes the live configuration (memory budget, policy, limits) into every
/// shard's store, after CONFIG SET.
pub async fn apply_live_config(shard: &Shard) {
    let _ = shard
        .call_all(|s| {
            let config = &s.shared.config;
            let mut store = s.store.lock();
            store.set_policy(config.policy());
            store.set_samples(config.maxmemory_samples.load(Relaxed) as usize);
            store.set_max_value_len(config.proto_max_bulk_len.load(Relaxed) as usize);
            store.set_budget(shard_budget(config, s.shared.shards));
            store.set_spill_admission(spill_admission(config));
        })
        .await;
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
