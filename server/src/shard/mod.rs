//! Thread-per-core shards.
//!
//! Each shard is an OS thread running its own single-threaded tokio runtime
//! (pinned to a core with `--pin-threads yes`), with its own `SO_REUSEPORT`
//! listener and its own [`Store`] holding a contiguous range of hash slots.
//! A connection's task executes keys of its own shard inline and sends work
//! for other shards to their mailbox as a closure, getting the answer
//! (values as `Bytes` handles, never copies) on a oneshot channel.
//!
//! One exception, for the lookup path: a read of another shard's keys
//! ([`Shard::with_store`] with [`Access::Read`]) runs on the caller's thread when the owner's store is
//! free at that moment (an uncontended `try_lock`), instead of waking the
//! owner's thread and waiting to be woken in turn — on a VM each of those
//! wake-ups costs tens of microseconds. When the owner is busy the read goes
//! through its mailbox as before, so a long command never stalls another
//! shard's thread. Writes always run on the owner.

pub mod links;
pub mod slot;
pub mod watching;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use kvtier_cluster::hot::{Copies, HotCounter};
use kvtier_cluster::peer::PeerPool;
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use kvtier_store::Store;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::clients::ClientRegistry;
use crate::config::LiveConfig;
use crate::config::Num;
use crate::shared::Shared;
use crate::stats::ShardStats;

/// Work sent to a shard: runs on that shard's thread with its state.
pub type ShardJob = Box<dyn FnOnce(&Shard) + Send>;

/// The sending half of a shard's mailbox.
pub type Mailbox = mpsc::UnboundedSender<ShardJob>;

/// How the shards of a node reach each other (Dragonfly's `EngineShardSet`):
/// each one's mailbox, its store for reads taken without waking it, the
/// link events queued for it and its cron tick.
pub struct ShardSet {
    /// Each shard's mailbox.
    pub mailboxes: Vec<Mailbox>,
    /// Each shard's store, filled in as each shard starts, for reads taken
    /// without waking its thread ([`Shard::with_store`]).
    pub stores: StoreCells,
    /// Link events posted to each shard and not yet applied there: a read
    /// of that shard's store from another thread waits behind them in the
    /// mailbox instead ([`Shard::read_now`]).
    pub links_queued: Vec<AtomicUsize>,
    /// Each shard's cron tick, rung `hz` times a second by the ticker
    /// thread: the shards' runtimes then hold no timer of their own, so a
    /// request's park does not walk a timer wheel.
    pub ticks: Vec<Arc<Notify>>,
}

impl ShardSet {
    /// The set of shards whose mailboxes these are.
    pub fn new(mailboxes: Vec<Mailbox>) -> Arc<ShardSet> {
        let n = mailboxes.len();
        Arc::new(ShardSet {
            mailboxes,
            stores: (0..n).map(|_| OnceLock::new()).collect(),
            links_queued: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            ticks: (0..n).map(|_| Arc::default()).collect(),
        })
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.mailboxes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.mailboxes.is_empty()
    }
}

/// What waits for a round of link events ([`LinkRound`]).
pub enum AfterLinks {
    /// A job for a shard's mailbox (a chain write's next run).
    Post(usize, ShardJob),
    /// Run where the round ends, on whichever thread that is (a reply sent
    /// on its channel: no mailbox hop in between).
    Run(Box<dyn FnOnce() + Send>),
}

impl AfterLinks {
    /// Runs or posts it now.
    fn go(self, set: &ShardSet) {
        match self {
            // A shard gone drops the job, and what waits with it.
            AfterLinks::Post(target, job) => {
                let _ = set.mailboxes[target].send(job);
            }
            AfterLinks::Run(f) => f(),
        }
    }
}

/// One round of link events in flight, and what waits for it (see
/// [`Shard::deliver_links_then`]): held by every job that applies the
/// round's events and by every job their cascades post, on any shard; the
/// last holder to drop it lets what waits go. A write's reply, and a chain
/// write's next run, wait so for the link events the write recorded to be
/// applied on every shard, as the policy simulator (bench/src/sim.rs)
/// applies them before the next request (and the next run): a replay
/// through the server then makes the simulator's choices. Every delivery under an order that matters
/// opens one, whoever asked for it (a mailbox job's aftermath, the cron):
/// the events it takes may be a connection's, which then joins it
/// ([`Shard::links_applied`]).
pub struct LinkRound {
    set: Arc<ShardSet>,
    /// What waits: the one it was opened for, then any that joined it.
    /// Locked only to join a round in flight; the last owner takes it with
    /// `get_mut`.
    then: Mutex<(Option<AfterLinks>, Vec<AfterLinks>)>,
}

impl LinkRound {
    /// A round after which `then` (if any) goes.
    pub fn new(set: Arc<ShardSet>, then: Option<AfterLinks>) -> Arc<LinkRound> {
        Arc::new(LinkRound {
            set,
            then: Mutex::new((then, Vec::new())),
        })
    }

    /// Makes `then` wait for this round too (the caller holds it, so it has
    /// not ended).
    pub fn join(&self, then: AfterLinks) {
        self.then
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .push(then);
    }

    /// What goes when `round` ends: it holds `round` until then (a round
    /// used as a latch over several others).
    fn hold(round: &Arc<LinkRound>) -> AfterLinks {
        let round = Arc::clone(round);
        AfterLinks::Run(Box::new(move || drop(round)))
    }
}

impl Drop for LinkRound {
    fn drop(&mut self) {
        let (first, joined) =
            std::mem::take(self.then.get_mut().unwrap_or_else(|e| e.into_inner()));
        for then in first.into_iter().chain(joined) {
            then.go(&self.set);
        }
    }
}

/// A shard's store, locked by whoever runs on it: its own thread for every
/// command, another shard's thread for a read taken without waking it
/// (see [`Shard::with_store`]). Uncontended on the owner's path: one atomic
/// exchange to lock, one to unlock.
pub struct StoreCell(Mutex<Store>);

impl StoreCell {
    /// Wraps `store`.
    pub fn new(store: Store) -> StoreCell {
        StoreCell(Mutex::new(store))
    }

    /// The store, for the owner's thread: waits for a reader from another
    /// thread to finish (it holds the lock for one read, never across an
    /// await). Not reentrant: one guard at a time per thread.
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves the store as consistent as
        // a RefCell would have: keep serving.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store if nobody holds it now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Store>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// What a job does to a store: whether another shard's thread may run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// It writes: it runs on the owner's thread.
    Write,
    /// It only reads: another shard's thread may run it when the store is
    /// free (see [`Shard::with_store`]).
    Read,
}

/// Every shard's store, filled in as each shard starts.
pub type StoreCells = Vec<OnceLock<Arc<StoreCell>>>;

/// A shard that is gone (the server is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGone;

/// The reply to a command that needed a shard which is gone.
pub const SHUTTING_DOWN: &str = "ERR server is shutting down";

impl From<ShardGone> for Reply {
    fn from(_: ShardGone) -> Reply {
        Reply::error(SHUTTING_DOWN)
    }
}

/// One shard's thread-local state.
pub struct Shard {
    /// Index of this shard, 0-based.
    pub id: usize,
    /// The node's state (configuration, users, counters, cluster).
    pub shared: Arc<Shared>,
    /// How this shard reaches the others.
    pub set: Arc<ShardSet>,
    /// The keyspace of this shard's slots.
    pub store: Arc<StoreCell>,
    /// Connections served by this shard.
    pub clients: RefCell<ClientRegistry>,
    /// Counters for INFO and metrics.
    pub stats: RefCell<ShardStats>,
    /// Connections to the other cluster nodes.
    pub peers: PeerPool,
    /// The cluster view last seen, by version.
    pub view_cache: RefCell<Option<(u64, Rc<View>)>>,
    /// Reads counted for hot-key detection.
    pub hot: RefCell<HotCounter>,
    /// Copies of other nodes' hot keys.
    pub copies: RefCell<Copies>,
    /// Whether a connection of this shard is polling its socket before
    /// the thread sleeps (`--idle-poll-us`; one at a time).
    pub polling: Cell<bool>,
    /// The connection that last read a request, and until when polling
    /// stays off because another one read (several active clients keep
    /// the thread busy anyway; polling for one of them would only delay
    /// the others).
    pub last_reader: Cell<(u64, u64)>,
    /// The cluster loss whose lost slots this shard has emptied (see
    /// `Cluster::purge_after_ms`).
    pub purged_loss: Cell<u64>,
    /// This shard itself, for a job that starts a task needing it (a
    /// connection handed over by another shard's accept loop).
    me: std::rc::Weak<Shard>,
    /// Rounds of link events that took events from this store and may be
    /// in flight, by [`Shard::round_mark`] (dead ones pruned as more come).
    rounds: RefCell<Vec<(u64, std::sync::Weak<LinkRound>)>>,
    /// Rounds noted in `rounds` so far.
    round_seq: Cell<u64>,
    /// A job asked for the connections to go before the next job
    /// ([`Shard::give_turn`]).
    turn_due: Cell<bool>,
}

impl Shard {
    /// Creates shard `id`'s state, counting `commands` command ids.
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        set: Arc<ShardSet>,
        store: Store,
        commands: usize,
        me: std::rc::Weak<Shard>,
    ) -> Shard {
        let store = Arc::new(StoreCell::new(store));
        if let Some(cell) = set.stores.get(id) {
            let _ = cell.set(Arc::clone(&store));
        }
        Shard {
            id,
            shared,
            set,
            store,
            clients: RefCell::new(ClientRegistry::default()),
            stats: RefCell::new(ShardStats::new(commands)),
            peers: PeerPool::default(),
            view_cache: RefCell::new(None),
            hot: RefCell::new(HotCounter::default()),
            copies: RefCell::new(Copies::default()),
            polling: Cell::new(false),
            last_reader: Cell::new((0, 0)),
            purged_loss: Cell::new(0),
            me,
            rounds: RefCell::new(Vec::new()),
            round_seq: Cell::new(0),
            turn_due: Cell::new(false),
        }
    }

    /// Asks the mailbox to let this shard's connections in before its next
    /// job: a long command's step calls it, so the steps that follow (its
    /// own next one among them) do not run back to back ([`run_mailbox`]).
    pub fn give_turn(&self) {
        self.turn_due.set(true);
    }

    /// The shared handle of this shard (`None` only while it is dropped).
    pub fn rc(&self) -> Option<Rc<Shard>> {
        self.me.upgrade()
    }

    /// The cluster view (a cached handle; cluster mode only).
    pub fn view(&self) -> Rc<View> {
        match &self.shared.cluster {
            Some(cluster) => self.view_of(cluster),
            None => Rc::new(View::new(0, Vec::new(), Vec::new(), None)),
        }
    }

    /// Whether this node owns `key` (always, outside a cluster).
    pub fn node_owns(&self, key: &[u8]) -> bool {
        match &self.shared.cluster {
            Some(cluster) => self.view_of(cluster).owns(slot::key_slot(key)),
            None => true,
        }
    }

    /// The view of `cluster` this shard uses, refreshed when the cluster's
    /// changes. Each shard keeps its own copy (an `Rc`), taken when the
    /// version changes: the per-command handle is then a plain counter on
    /// this thread, not an atomic on a cache line every shard writes.
    fn view_of(&self, cluster: &Cluster) -> Rc<View> {
        let version = cluster.version();
        let mut cached = self.view_cache.borrow_mut();
        match &*cached {
            Some((v, view)) if *v == version => Rc::clone(view),
            _ => {
                let view = Rc::new(View::clone(&cluster.view()));
                // Connections to nodes now failed (or no longer members) go.
                for (node, alive) in view.nodes.iter().zip(&view.alive) {
                    if !alive {
                        self.peers.forget(node.addr());
                    }
                }
                *cached = Some((version, Rc::clone(&view)));
                view
            }
        }
    }

    /// The shard owning `slot`.
    pub fn owner_of(&self, slot: u16) -> usize {
        slot::slot_shard(slot, self.shared.shards)
    }

    /// Number of shards.
    pub fn count(&self) -> usize {
        self.shared.shards
    }

    /// Sends `job` to shard `target`'s mailbox (never runs it inline).
    pub fn post(&self, target: usize, job: ShardJob) -> Result<(), ShardGone> {
        self.set.mailboxes[target].send(job).map_err(|_| ShardGone)
    }

    /// Runs `f` on shard `target` and returns its result: inline when the
    /// target is this shard, through its mailbox otherwise, once the link
    /// events `f` recorded there are applied on every shard
    /// ([`Shard::deliver_links_then`]).
    pub fn call<R, F>(&self, target: usize, f: F) -> impl Future<Output = Result<R, ShardGone>>
    where
        R: Send + 'static,
        F: FnOnce(&Shard) -> R + Send + 'static,
    {
        let pending = if target == self.id {
            Err(f(self))
        } else {
            self.stats.borrow_mut().mailbox_calls += 1;
            let (tx, rx) = oneshot::channel();
            let sent = self.post(
                target,
                Box::new(move |shard: &Shard| {
                    let result = f(shard);
                    shard.deliver_links_then(AfterLinks::Run(Box::new(move || {
                        let _ = tx.send(result);
                    })));
                }),
            );
            Ok(sent.map(|_| rx))
        };
        async move {
            match pending {
                Err(done) => Ok(done),
                Ok(Ok(rx)) => rx.await.map_err(|_| ShardGone),
                Ok(Err(gone)) => Err(gone),
            }
        }
    }

    /// Runs `f` against shard `target`'s store and returns its result:
    /// inline for this shard; for another shard through its mailbox, or,
    /// when `f` only reads ([`Access::Read`]) and that shard's store is
    /// free at this moment, on this thread (no wake-up of its thread, none
    /// of this one).
    ///
    /// A read must not write keys: what a read does to the store (recency,
    /// hit counts, a lazily expired key, a block promoted from disk) is
    /// fine, and whatever of that leaves work for the owner (link events,
    /// spill writes) is handed to the owner's thread afterwards.
    ///
    /// Order: a connection reads this way only when nothing it queued for
    /// `target` is still unanswered, so a read never overtakes the caller's
    /// own earlier writes.
    pub fn with_store<R, F>(
        &self,
        target: usize,
        access: Access,
        f: F,
    ) -> impl Future<Output = Result<R, ShardGone>>
    where
        R: Send + 'static,
        F: FnOnce(&mut Store) -> R + Send + 'static,
    {
        let direct = match access {
            Access::Read => self.read_now(target, f),
            Access::Write => Err(f),
        };
        let pending = match direct {
            Ok(done) => Err(done),
            Err(f) => Ok(self.call(target, move |s: &Shard| f(&mut s.store.lock()))),
        };
        async move {
            match pending {
                Err(done) => Ok(done),
                Ok(call) => call.await,
            }
        }
    }

    /// The direct half of [`Shard::with_store`]: runs `read` on this thread
    /// against another shard's store if that store is free now; gives
    /// `read` back otherwise (and for this shard's own store, which the
    /// caller runs inline).
    pub fn read_now<R, F>(&self, target: usize, read: F) -> Result<R, F>
    where
        F: FnOnce(&mut Store) -> R,
    {
        let cell = match self.set.stores.get(target).and_then(OnceLock::get) {
            Some(cell) if target != self.id => cell,
            _ => return Err(read),
        };
        // Link events already posted there come first (they were sent
        // before the reply of the write that made them, so the client's
        // next read must see them applied): through the mailbox, behind
        // them. A read that overtook them would move victims by timing.
        if self.links_queued_at(target) {
            return Err(read);
        }
        let Some(mut store) = cell.try_lock() else {
            return Err(read);
        };
        let result = read(&mut store);
        let deferred = store.has_deferred_work();
        drop(store);
        if deferred {
            let _ = self.post(target, Box::new(|s: &Shard| s.deliver_links()));
        }
        self.stats.borrow_mut().direct_reads += 1;
        Ok(result)
    }

    /// Applies `f` to every shard's copies of other nodes' hot keys (a copy
    /// is served by whichever shard the reading client is on); whether `f`
    /// said yes on any.
    pub async fn on_all_copies(
        &self,
        f: impl Fn(&mut Copies) -> bool + Send + Sync + 'static,
    ) -> bool {
        let results = self
            .call_all(move |s| f(&mut s.copies.borrow_mut()))
            .await
            .unwrap_or_default();
        results.into_iter().any(|r| r)
    }

    /// Puts the live settings into every shard's store, after CONFIG SET.
    pub async fn apply_live_config(&self) {
        let _ = self
            .call_all(|s| configure_store(&mut s.store.lock(), &s.shared.config, s.shared.shards))
            .await;
    }

    /// Runs `f` on every shard in parallel; results in shard order.
    pub async fn call_all<R, F>(&self, f: F) -> Result<Vec<R>, ShardGone>
    where
        R: Send + 'static,
        F: Fn(&Shard) -> R + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let pending: Vec<_> = (0..self.count())
            .map(|target| {
                let f = Arc::clone(&f);
                self.call(target, move |shard: &Shard| f(shard))
            })
            .collect();
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(p.await?);
        }
        Ok(out)
    }
}

/// Runs shard jobs as they arrive, until every sender is gone. Jobs run
/// back to back; after one that asked for it ([`Shard::give_turn`]: a
/// step of a long command), the shard's connections get a turn first if
/// more are queued. Not by time: on busy cores a stretch of short jobs is
/// often long only because the thread was preempted, and yielding then
/// costs writes throughput
/// (docs/decisions/0016-mailbox-yields-after-long-step.md).
pub async fn run_mailbox(shard: Rc<Shard>, mut rx: mpsc::UnboundedReceiver<ShardJob>) {
    while let Some(job) = rx.recv().await {
        job(&shard);
        shard.deliver_links();
        if shard.turn_due.replace(false) && !rx.is_empty() {
            tokio::task::yield_now().await;
        }
    }
}

/// Puts the live settings a store follows (CONFIG SET can change them)
/// into a shard's store: the policy, the sampling, the longest value, its
/// share of `maxmemory`, the spill tier's admission and the tenants'
/// shares and caps.
pub fn configure_store(store: &mut Store, config: &LiveConfig, shards: usize) {
    store.set_policy(config.policy());
    store.set_samples(config.num(Num::MaxmemorySamples) as usize);
    store.set_max_value_len(config.num(Num::ProtoMaxBulkLen) as usize);
    store.set_budget(shard_budget(config, shards));
    store.set_spill_admission(spill_admission(config));
    store.set_tenant_limits(&config.tenant_limits());
}

/// A shard's share of `maxmemory`.
pub fn shard_budget(config: &LiveConfig, shards: usize) -> usize {
    (config.num(Num::Maxmemory) / shards as u64) as usize
}

/// Reads a block needs before the spill tier keeps it (`spill-admission`).
pub fn spill_admission(config: &LiveConfig) -> u8 {
    config.num(Num::SpillAdmission).min(u8::MAX as u64) as u8
}

/// Pins the calling thread to `core` (best effort: containers may forbid it).
pub fn pin_to_core(core: usize) {
    // SAFETY: `set` is a plain bit set on a zeroed cpu_set_t that lives on this
    // stack frame; sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Waker};

    use bytes::Bytes;
    use clap::Parser;
    use kvtier_store::{BlockWrite, EvictionPolicy};

    use super::*;
    use crate::config::Config;
    use crate::shard::slot::{key_slot, shard_slots, slot_shard};

    /// Two shards on this thread under `prefix` with a budget; their
    /// mailboxes are run by hand.
    fn two_shards() -> (Vec<Rc<Shard>>, Vec<mpsc::UnboundedReceiver<ShardJob>>) {
        let config = Config::parse_from(["kvtier-server"]);
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..2).map(|_| mpsc::unbounded_channel()).unzip();
        let catalog = Box::leak(Box::new(crate::acl::Catalog::new([("get", 0, 0)])));
        let acl = crate::acl::Acl::new(catalog, "", None).unwrap();
        let shared = Shared::new(&config, 0, 2, None, None, acl).unwrap();
        let set = ShardSet::new(senders);
        let shards = (0..2)
            .map(|id| {
                let store = Store::new(shard_slots(id, 2), 1 << 20, EvictionPolicy::Prefix);
                let set = Arc::clone(&set);
                Rc::new_cyclic(|me| Shard::new(id, Arc::clone(&shared), set, store, 1, me.clone()))
            })
            .collect();
        (shards, receivers)
    }

    /// A key of shard `shard` (of two).
    fn key_of(shard: usize, skip: usize) -> Bytes {
        (0..)
            .map(|i| Bytes::from(format!("k{i}")))
            .filter(|k| slot_shard(key_slot(k), 2) == shard)
            .nth(skip)
            .unwrap()
    }

    /// Stores `child` on `shard` naming `parent` (of the other shard,
    /// absent): a link event for the other shard, which answers with one
    /// back (the child is an orphan).
    fn store_child(shard: &Shard, child: &Bytes, parent: &Bytes) {
        let write = BlockWrite {
            parent: Some(parent.clone()),
            ..BlockWrite::default()
        };
        let value = Bytes::from_static(b"block");
        let code = shard
            .store
            .lock()
            .insert_block(key_slot(child), child, value, write, 0);
        assert!(code >= 0);
        assert!(shard.store.lock().has_deferred_work());
    }

    /// [`store_child`], then the cron's delivery: the event is posted to
    /// shard 1, nothing left here.
    fn taken_by_cron(shard: &Shard, n: usize) {
        store_child(shard, &key_of(0, n), &key_of(1, n));
        shard.deliver_links();
        assert!(!shard.store.lock().has_deferred_work());
    }

    /// Polls `f` once: whether it is done.
    fn ready<F: Future>(f: std::pin::Pin<&mut F>) -> bool {
        f.poll(&mut Context::from_waker(Waker::noop())).is_ready()
    }

    /// Runs the one job waiting on shard `on`; then whether `applied` is
    /// done.
    fn after_job<F: Future>(
        shards: &[Rc<Shard>],
        rx: &mut [mpsc::UnboundedReceiver<ShardJob>],
        on: usize,
        applied: std::pin::Pin<&mut F>,
    ) -> bool {
        assert_eq!(run_jobs(&shards[on], &mut rx[on]), 1);
        ready(applied)
    }

    fn run_jobs(shard: &Shard, rx: &mut mpsc::UnboundedReceiver<ShardJob>) -> usize {
        let mut ran = 0;
        while let Ok(job) = rx.try_recv() {
            job(shard);
            ran += 1;
        }
        ran
    }

    /// A write over both shards with every store held: its link events,
    /// and the answer they cascade into (the parent is absent: the child
    /// is an orphan), are applied before the stores are let go, with no
    /// job for either mailbox.
    #[test]
    fn all_stores_held_apply_a_writes_links_at_once() {
        let (shards, mut rx) = two_shards();
        {
            let mut stores = shards[0].lock_all_stores().expect("both stores free");
            let write = BlockWrite {
                parent: Some(key_of(1, 0)),
                ..BlockWrite::default()
            };
            let child = key_of(0, 0);
            let value = Bytes::from_static(b"block");
            let code = stores
                .get(0)
                .insert_block(key_slot(&child), &child, value, write, 0);
            assert!(code >= 0);
            assert!(stores.get(0).has_deferred_work());
            stores.deliver_links();
            assert!(!stores.get(0).has_deferred_work());
            assert!(!stores.get(1).has_deferred_work());
        }
        assert_eq!(run_jobs(&shards[0], &mut rx[0]), 0);
        assert_eq!(run_jobs(&shards[1], &mut rx[1]), 0);
    }

    /// The stores are only taken when every other owner is idle: not while
    /// another thread holds one, nor while link events posted earlier wait
    /// in a mailbox (they go first).
    #[test]
    fn all_stores_wait_for_a_busy_owner_and_queued_links() {
        let (shards, mut rx) = two_shards();
        let held = shards[1].store.lock();
        assert!(shards[0].lock_all_stores().is_none());
        drop(held);
        assert!(shards[0].lock_all_stores().is_some());
        taken_by_cron(&shards[0], 0);
        assert!(shards[0].lock_all_stores().is_none());
        assert_eq!(run_jobs(&shards[1], &mut rx[1]), 1);
        assert!(shards[0].lock_all_stores().is_some());
    }

    /// The review's case: a batch's own-shard write, whose link events a
    /// delivery that no reply waits for (the cron, a mailbox job's
    /// aftermath) takes while the batch waits for another shard. The
    /// batch's replies still wait for those events to be applied.
    #[test]
    fn a_batch_waits_for_its_events_taken_by_another_delivery() {
        let (shards, mut rx) = two_shards();
        let mark = shards[0].round_mark();
        taken_by_cron(&shards[0], 0);
        let mut applied = pin!(shards[0].links_applied(mark));
        assert!(!ready(applied.as_mut()));
        // What it cascaded into, back on shard 0, is waited for too.
        assert!(!after_job(&shards, &mut rx, 1, applied.as_mut()));
        assert!(after_job(&shards, &mut rx, 0, applied.as_mut()));
    }

    /// A round opened before the batch began holds none of its events:
    /// nothing to wait for.
    #[test]
    fn a_batch_does_not_wait_for_rounds_before_it() {
        let (shards, mut rx) = two_shards();
        taken_by_cron(&shards[0], 0);
        let mark = shards[0].round_mark();
        let mut applied = pin!(shards[0].links_applied(mark));
        assert!(ready(applied.as_mut()));
        assert_eq!(run_jobs(&shards[1], &mut rx[1]), 1);
        assert_eq!(run_jobs(&shards[0], &mut rx[0]), 1);
    }

    /// Events still here are delivered in the batch's own round, and those
    /// another delivery took are joined: the replies wait for both.
    #[test]
    fn a_batch_waits_for_its_own_round_and_the_rounds_it_joins() {
        let (shards, mut rx) = two_shards();
        let mark = shards[0].round_mark();
        taken_by_cron(&shards[0], 0);
        let taken = rx[1].try_recv().unwrap();
        store_child(&shards[0], &key_of(0, 1), &key_of(1, 1));
        let mut applied = pin!(shards[0].links_applied(mark));
        assert!(!ready(applied.as_mut()));
        // The round it joined, cascade included: applied; its own round
        // still in flight.
        taken(&shards[1]);
        assert!(!after_job(&shards, &mut rx, 0, applied.as_mut()));
        assert!(!after_job(&shards, &mut rx, 1, applied.as_mut()));
        assert!(after_job(&shards, &mut rx, 0, applied.as_mut()));
    }

    /// A batch on shard 1 whose events a cascade from shard 0's round
    /// takes: the cascade job sends them in a round of their own, noted on
    /// shard 1, which the batch joins; it does not wait for the cascade's
    /// own events.
    #[test]
    fn a_batch_joins_the_round_a_cascade_took_its_events_in() {
        let (shards, mut rx) = two_shards();
        let mark = shards[1].round_mark();
        // The batch's write on shard 1: a child whose parent is shard 0's.
        store_child(&shards[1], &key_of(1, 5), &key_of(0, 5));
        // Shard 0's round reaches shard 1 and takes the batch's event.
        taken_by_cron(&shards[0], 0);
        assert_eq!(run_jobs(&shards[1], &mut rx[1]), 1);
        assert!(!shards[1].store.lock().has_deferred_work());
        let mut applied = pin!(shards[1].links_applied(mark));
        assert!(!ready(applied.as_mut()));
        // Shard 0 holds two jobs: the batch's event (its own round), then
        // the cascade's answer (shard 0's round).
        let batch_job = rx[0].try_recv().unwrap();
        batch_job(&shards[0]);
        // The batch's event cascades too (its parent is absent: an orphan,
        // back on shard 1).
        assert!(!ready(applied.as_mut()));
        assert!(after_job(&shards, &mut rx, 1, applied.as_mut()));
        assert_eq!(run_jobs(&shards[0], &mut rx[0]), 1);
    }

    /// Under a policy whose order cannot move a victim nothing waits.
    #[test]
    fn nothing_waits_when_order_does_not_matter() {
        let (shards, mut rx) = two_shards();
        shards[0]
            .store
            .lock()
            .set_policy(EvictionPolicy::AllKeysLru);
        let mark = shards[0].round_mark();
        taken_by_cron(&shards[0], 0);
        let mut applied = pin!(shards[0].links_applied(mark));
        assert!(ready(applied.as_mut()));
        assert_eq!(run_jobs(&shards[1], &mut rx[1]), 1);
        assert_eq!(run_jobs(&shards[0], &mut rx[0]), 1);
    }
}
