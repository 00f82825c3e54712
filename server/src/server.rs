//! Starting and stopping the server: one thread per shard, each with its own
//! current-thread tokio runtime, `SO_REUSEPORT` listener, mailbox and cron.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvtier_cluster::Cluster;
use kvtier_store::{MemoryOptions, SpillConfig, Store, StoreJob};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::LocalSet;
use tracing::{info, warn};

use crate::acl::Acl;
use crate::config::Config;
use crate::config::Num;
use crate::net::connection::accept;
use crate::net::handover::send_socket;
use crate::net::packing::Packer;
use crate::report::{Exporter, ShardReport};
use crate::shard::{self, slot::shard_slots, Shard, ShardSet};
use crate::shared::{ShardSeat, Shared, SpillTier};

/// The users `config` names (`--requirepass`, `--aclfile`), over the
/// command table's catalog, and the tenants they name: checked first,
/// before the TLS settings and the listeners.
pub fn users(config: &Config) -> io::Result<Acl> {
    let acl = Acl::new(
        &crate::commands::registry::table().catalog,
        &config.requirepass,
        config.aclfile.clone(),
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // Tenants named by ACL users: the users exist, their key fences are
    // prefixes.
    crate::config::tenant_patterns(&config.tenants, &acl)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(acl)
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
        // SO_REUSEPORT would let this server share a port another process
        // listens on (each taking some of its connections): refuse it.
        ensure_free(addr)?;
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
            Some(path) => Some(SpillTier::open(config, path).map_err(|e| {
                io::Error::new(e.kind(), format!("spill dir {}: {e}", path.display()))
            })?),
            None => None,
        };
        let mut config = config.clone();
        if let Some(tier) = &spill {
            config.spill_max_bytes = tier.dir.max_bytes();
        }
        let config = &config;
        let acl = users(config)?;
        let tls = crate::tls::Tls::new(&config.tls_settings())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .map(Arc::new);
        let tls_listeners = match tls.as_ref().filter(|t| t.port != 0) {
            Some(t) => {
                let tls_addr = SocketAddr::new(addr.ip(), t.port);
                ensure_free(tls_addr)?;
                (0..shards)
                    .map(|_| reuseport_listener(tls_addr).map(Some))
                    .collect::<io::Result<Vec<_>>>()?
            }
            None => (0..shards).map(|_| None).collect(),
        };
        let shared = Shared::new(config, addr.port(), shards, spill, tls, acl)?;
        let set = ShardSet::new(senders);
        let cpus = allowed_cpus();
        let mut threads = Vec::with_capacity(shards);
        // The shards' timers run there (their runtimes have no time driver).
        kvtier_timer::start()?;
        let listeners = listeners.into_iter().zip(tls_listeners);
        for (id, ((listener, tls_listener), rx)) in listeners.zip(receivers).enumerate() {
            let shared = Arc::clone(&shared);
            let set = Arc::clone(&set);
            // Pin only when asked and there is a core for every shard.
            let cpu = (config.pin_threads && cpus.len() >= shards).then(|| cpus[id]);
            let handle = std::thread::Builder::new()
                .name(format!("kvtier-shard-{id}"))
                .spawn(move || run_shard(id, shared, set, listener, tls_listener, rx, cpu))?;
            threads.push(handle);
        }
        if let Some(tier) = shared.spill.as_ref().filter(|t| t.dir.loading()) {
            threads.push(start_loader(
                Arc::clone(&shared),
                Arc::clone(&set),
                tier.take_segments(),
            )?);
        }
        threads.push(start_ticker(Arc::clone(&shared), set)?);
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

/// An error naming `addr` when a socket there is already listening (a
/// port of 0 is always free). The shards' listeners share their port
/// through SO_REUSEPORT, which would otherwise let a second server start
/// on a port in use and split its connections with the first.
fn ensure_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into()).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                e.kind(),
                format!("{addr}: address already in use (another kvtier or Redis listens there?)"),
            )
        } else {
            e
        }
    })
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
    set: Arc<ShardSet>,
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
        let budget = shard::shard_budget(&shared.config, n);
        let memory = MemoryOptions {
            hugepages: shared.config.hugepages,
            prealloc: shared.config.prealloc,
        };
        let mut store =
            Store::with_memory(shard_slots(id, n), budget, shared.config.policy(), memory);
        store.set_tenants(&shared.config.tenant_patterns());
        shard::configure_store(&mut store, &shared.config, n);
        if let Some(tier) = &shared.spill {
            let mailbox = set.mailboxes[id].clone();
            store.enable_spill(SpillConfig {
                dir: Arc::clone(&tier.dir),
                pool: Arc::clone(&tier.pool),
                post: Arc::new(move |job: StoreJob| {
                    let _ =
                        mailbox.send(Box::new(move |shard: &Shard| job(&mut shard.store.lock())));
                }),
                shard: id,
                admission: shard::spill_admission(&shared.config),
            });
            if tier.dir.loading() {
                store.begin_loading();
            }
        }
        let commands = crate::commands::registry::table().len();
        let shard = Rc::new_cyclic(|me| {
            Shard::new(id, Arc::clone(&shared), set, store, commands, me.clone())
        });
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
        } else if shared.spill.is_some() {
            shard.store.lock().close_spill();
        }
    });
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
                    let max = shared.config.num(Num::Maxclients) as usize;
                    let before = shared.connected.fetch_add(1, Relaxed);
                    if before >= max {
                        shared.connected.fetch_sub(1, Relaxed);
                        shard.stats.borrow_mut().rejected_connections += 1;
                        let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
                        continue;
                    }
                    if before == 0 {
                        shared.wake_ticker(); // back to `hz` ticks a second
                    }
                    let seat = shared.seat_for(shard.id);
                    if seat.shard == shard.id {
                        tokio::task::spawn_local(accept(
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
    let target = seat.shard;
    match stream.into_std() {
        Ok(stream) => send_socket(shard, target, stream, move |me, stream| {
            accept(me, stream, peer, tls, seat)
        }),
        Err(e) => warn!("moving a connection from {peer} to shard {target}: {e}"),
    }
}

/// Rings every shard's cron tick `hz` times a second until shutdown, and
/// once a second while no connection (client or peer) is open: then the
/// cron has only expiry and the once-a-second export to do, so an idle
/// server's threads wake once a second instead of `hz` times. The first
/// connection and shutdown wake it ([`Shared::wake_ticker`]).
fn start_ticker(shared: Arc<Shared>, set: Arc<ShardSet>) -> io::Result<JoinHandle<()>> {
    let handle = std::thread::Builder::new()
        .name("kvtier-ticker".into())
        .spawn({
            let shared = Arc::clone(&shared);
            move || {
                let (mut packer, mut seated) = (Packer::default(), Vec::new());
                while !shared.shutting_down() {
                    let hz = shared.config.num(Num::Hz).clamp(1, 500);
                    let period = if shared.connected.load(Relaxed) == 0 {
                        Duration::from_secs(1)
                    } else {
                        Duration::from_millis(1000 / hz)
                    };
                    // A wake-up ends the sleep early (parks may also end
                    // spuriously: a tick early is harmless).
                    std::thread::park_timeout(period);
                    for tick in &set.ticks {
                        tick.notify_one();
                    }
                    place_connections(&shared, &mut packer, &mut seated);
                }
            }
        })?;
    let _ = shared.ticker.set(handle.thread().clone());
    if shared.shutting_down() {
        shared.wake_ticker();
    }
    Ok(handle)
}

/// The ticker's look at the load: packs the connections on one shard while
/// it is light, spreads them while it is not (`net::packing`).
fn place_connections(shared: &Shared, packer: &mut Packer, seated: &mut Vec<usize>) {
    let cpu = shared.shard_cpu_ns.iter().map(|c| c.load(Relaxed)).sum();
    seated.clear();
    seated.extend(shared.seated.iter().map(|n| n.load(Relaxed)));
    let now = packer.tick(
        kvtier_store::mono_ns(),
        cpu,
        seated,
        shared.config.num(Num::PackBelow),
        shared.placement(),
    );
    shared.set_placement(now);
}

/// Records the loader hands a shard per mailbox job, and jobs in flight
/// per shard: a shard takes a batch between its clients' requests, and the
/// loader's memory stays bounded whatever the tier's size.
const LOAD_BATCH: usize = 4096;
const LOAD_IN_FLIGHT: usize = 4;

/// The warm restart's loader: indexes `segments` newest first (from their
/// footers; scanned when they have none) and hands each shard the records
/// of its keys, while the shards already serve clients. A read of a key
/// not loaded yet misses (a miss costs a recompute; waiting would hold
/// every client of the shard until the load ends). Once every shard took
/// its records, segments with nothing live go.
fn start_loader(
    shared: Arc<Shared>,
    set: Arc<ShardSet>,
    segments: Vec<Arc<kvtier_store::spill::Segment>>,
) -> io::Result<JoinHandle<()>> {
    use kvtier_store::slot::{key_slot, slot_shard};
    use kvtier_store::spill::{Loader, Recovered};
    std::thread::Builder::new()
        .name("kvtier-loader".into())
        .spawn(move || {
            let Some(tier) = &shared.spill else {
                return;
            };
            let dir = &tier.dir;
            let started = Instant::now();
            let n = set.mailboxes.len();
            let (ack, acks) = std::sync::mpsc::channel::<()>();
            let mut in_flight = 0usize;
            // Hands `job` to shard `id` once fewer than LOAD_IN_FLIGHT
            // jobs per shard wait; false when the server is stopping.
            let mut post = |id: usize, job: Box<dyn FnOnce(&mut Store) + Send>| -> bool {
                while in_flight >= LOAD_IN_FLIGHT * n {
                    if shared.shutting_down() {
                        return false;
                    }
                    if acks.recv_timeout(Duration::from_millis(100)).is_ok() {
                        in_flight -= 1;
                    }
                }
                let ack = ack.clone();
                let sent = set.mailboxes[id].send(Box::new(move |shard: &Shard| {
                    job(&mut shard.store.lock());
                    let _ = ack.send(());
                }));
                in_flight += sent.is_ok() as usize;
                sent.is_ok()
            };
            let mut loader = Loader::new(segments);
            let mut batches: Vec<Vec<Recovered>> = (0..n).map(|_| Vec::new()).collect();
            let mut running = true;
            while running {
                let Some(found) = loader.next(dir, kvtier_store::now_ms()) else {
                    break;
                };
                let records = match found {
                    Ok(records) => records,
                    Err(e) => {
                        dir.note_error(&e);
                        continue;
                    }
                };
                for r in records {
                    let id = slot_shard(key_slot(&r.key), n);
                    batches[id].push(r);
                    if batches[id].len() >= LOAD_BATCH {
                        let batch = std::mem::take(&mut batches[id]);
                        running &= post(
                            id,
                            Box::new(move |store| {
                                store.insert_loaded(batch, kvtier_store::now_ms());
                            }),
                        );
                    }
                }
                running &= !shared.shutting_down();
            }
            for (id, batch) in batches.into_iter().enumerate() {
                running = running
                    && post(
                        id,
                        Box::new(move |store| {
                            store.insert_loaded(batch, kvtier_store::now_ms());
                            store.loading_done();
                        }),
                    );
            }
            if !running {
                return;
            }
            while in_flight > 0 && !shared.shutting_down() {
                if acks.recv_timeout(Duration::from_millis(100)).is_ok() {
                    in_flight -= 1;
                }
            }
            if shared.shutting_down() {
                return;
            }
            dir.finish_loading();
            let took = started.elapsed();
            let c = &dir.counters;
            c.load_ms.store(took.as_millis() as u64, Relaxed);
            info!(
                "spill tier: {} block(s) indexed from {} footer(s) and {} scanned segment(s) in {:.1?} ({} damaged record(s) skipped)",
                c.recovered.load(Relaxed),
                c.footers_read.load(Relaxed),
                c.segments_scanned.load(Relaxed),
                took,
                c.recovery_skipped.load(Relaxed),
            );
        })
}

/// Background work of a shard: active expiry `hz` times a second, and once
/// a second the rate sample and the metrics export.
async fn cron(shard: Rc<Shard>) {
    let shared = Arc::clone(&shard.shared);
    let mut last_export = Instant::now();
    let (mut exporter, mut node_exporter) = (Exporter::default(), Exporter::default());
    let tick = Arc::clone(&shard.set.ticks[shard.id]);
    loop {
        tick.notified().await;
        if shard.id == 0 {
            kvtier_store::resync_clock();
        }
        shard.deliver_links();
        shared.shard_cpu_ns[shard.id].store(kvtier_store::thread_cpu_ns(), Relaxed);
        let timeout = shared.config.num(Num::Timeout);
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
