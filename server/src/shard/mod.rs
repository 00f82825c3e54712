//! Thread-per-core shards.
//!
//! Each shard is an OS thread running its own single-threaded tokio runtime,
//! pinned to a core, with its own `SO_REUSEPORT` listener and its own
//! [`Store`] holding a contiguous range of hash slots. Nothing on the data path
//! is shared between threads: a connection's task executes keys of its own
//! shard inline and sends work for other shards to their mailbox as a closure,
//! getting the answer (values as `Bytes` handles, never copies) on a oneshot
//! channel.

pub mod slot;

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use kvtier_cluster::hot::{Copies, HotCounter};
use kvtier_cluster::peer::PeerPool;
use kvtier_cluster::topology::View;
use kvtier_store::links::Route;
use kvtier_store::Store;
use tokio::sync::{mpsc, oneshot};

use crate::clients::ClientRegistry;
use crate::server::Shared;
use crate::stats::ShardStats;

/// Work sent to a shard: runs on that shard's thread with its state.
pub type ShardJob = Box<dyn FnOnce(&Shard) + Send>;

/// The sending half of a shard's mailbox.
pub type Mailbox = mpsc::UnboundedSender<ShardJob>;

/// A shard that is gone (the server is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGone;

/// One shard's thread-local state.
pub struct Shard {
    /// Index of this shard, 0-based.
    pub id: usize,
    /// State shared by all shards (configuration, mailboxes, ...).
    pub shared: Arc<Shared>,
    /// The keyspace of this shard's slots.
    pub store: RefCell<Store>,
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
}

impl Shard {
    /// Creates shard `id`'s state.
    pub fn new(id: usize, shared: Arc<Shared>, store: Store) -> Shard {
        let commands = crate::commands::table().len();
        Shard {
            id,
            shared,
            store: RefCell::new(store),
            clients: RefCell::new(ClientRegistry::default()),
            stats: RefCell::new(ShardStats::new(commands)),
            peers: PeerPool::default(),
            view_cache: RefCell::new(None),
            hot: RefCell::new(HotCounter::default()),
            copies: RefCell::new(Copies::default()),
        }
    }

    /// The cluster view (a cached handle; cluster mode only).
    pub fn view(&self) -> Rc<View> {
        match &self.shared.cluster {
            Some(cluster) => crate::coordination::shard_view(self, cluster),
            None => Rc::new(View::new(0, Vec::new(), Vec::new(), None)),
        }
    }

    /// Whether this node owns `key` (always, outside a cluster).
    pub fn node_owns(&self, key: &[u8]) -> bool {
        match &self.shared.cluster {
            Some(cluster) => {
                crate::coordination::shard_view(self, cluster).owns(slot::key_slot(key))
            }
            None => true,
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
        self.shared.mailboxes[target]
            .send(job)
            .map_err(|_| ShardGone)
    }

    /// Runs `f` on shard `target` and returns its result: inline when the
    /// target is this shard, through its mailbox otherwise.
    pub fn call<R, F>(&self, target: usize, f: F) -> impl Future<Output = Result<R, ShardGone>>
    where
        R: Send + 'static,
        F: FnOnce(&Shard) -> R + Send + 'static,
    {
        let pending = if target == self.id {
            Err(f(self))
        } else {
            let (tx, rx) = oneshot::channel();
            let sent = self.post(
                target,
                Box::new(move |shard: &Shard| {
                    let _ = tx.send(f(shard));
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

    /// Delivers the link changes this shard's store recorded (see
    /// [`kvtier_store::links`]) to the stores they concern: applied here
    /// when the key is this shard's, posted to the owner otherwise, to every
    /// shard for a departed parent.
    pub fn deliver_links(&self) {
        self.store.borrow_mut().flush_spill();
        loop {
            let events = self.store.borrow_mut().take_link_events();
            if events.is_empty() {
                return;
            }
            for event in events {
                let targets = match event.route() {
                    // A parent on another node is not tracked (it is
                    // neither counted nor an orphan here).
                    Route::Key(key) if !self.node_owns(key) => Vec::new(),
                    _ => event.targets(self.id, self.count()),
                };
                for target in targets {
                    let event = event.clone();
                    if target == self.id {
                        self.store.borrow_mut().apply_link(event);
                    } else {
                        let _ = self.post(
                            target,
                            Box::new(move |s: &Shard| {
                                s.store.borrow_mut().apply_link(event);
                                s.deliver_links();
                            }),
                        );
                    }
                }
            }
        }
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

/// Runs shard jobs as they arrive, until every sender is gone.
pub async fn run_mailbox(shard: Rc<Shard>, mut rx: mpsc::UnboundedReceiver<ShardJob>) {
    while let Some(job) = rx.recv().await {
        job(&shard);
        shard.deliver_links();
    }
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
