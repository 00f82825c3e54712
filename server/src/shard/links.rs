//! A shard's part in link rounds: delivering the chain-link events its
//! store recorded to the stores they concern ([`LinkRound`] holds a round
//! open until every job that applies it has run), letting a connection's
//! replies wait for them, and locking every store at once for a write that
//! spans shards ([`AllStores`]).

use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, MutexGuard};

use kvtier_store::links::{LinkEvent, Route};
use kvtier_store::Store;
use tokio::sync::oneshot;

use super::{AfterLinks, LinkRound, Shard};

impl Shard {
    /// Lets this shard's mailbox apply the link events posted to it before
    /// a connection here runs its next commands: they were sent before the
    /// reply of the write that made them, so the client's next request must
    /// find them applied (whether the connection task or the mailbox task
    /// ran first would otherwise move victims by timing). Yields at most a
    /// few times: a shard whose mailbox is slow to drain still serves.
    pub async fn settle_links(&self) {
        for _ in 0..SETTLE_YIELDS {
            if !self.links_queued_here() {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Whether link events posted to this shard wait in its mailbox (the
    /// connection's check before [`Shard::settle_links`]: one load).
    #[inline]
    pub fn links_queued_here(&self) -> bool {
        self.links_queued_at(self.id)
    }

    /// Whether link events posted to shard `target` wait in its mailbox.
    #[inline]
    pub(super) fn links_queued_at(&self, target: usize) -> bool {
        self.set.links_queued[target].load(Acquire) > 0
    }

    /// Delivers the link changes this shard's store recorded (see
    /// [`kvtier_store::links`]) to the stores they concern: applied here
    /// when the key is this shard's, posted to the owner otherwise, to every
    /// shard for a departed parent. A round's events for one shard go in one
    /// mailbox job, in the order they were recorded. (The policy simulator,
    /// bench/src/sim.rs, applies all of a round's events before what they
    /// cascade into; here what another shard's job cascades into may reach
    /// a shard first, which moves no victim: eviction ranks by links only
    /// once a round is applied.)
    pub fn deliver_links(&self) {
        self.deliver_links_or_then(None);
    }

    /// Delivers this shard's link events; `then` goes once they, and what
    /// they cascade into on any shard, are applied ([`LinkRound`]: where
    /// the round's last job ends). At once, after one store lock, when
    /// there are none; right after posting them when their order cannot
    /// move a victim (any policy but `prefix`, or no budget to evict for).
    pub fn deliver_links_then(&self, then: AfterLinks) {
        self.deliver_links_or_then(Some(then));
    }

    fn deliver_links_or_then(&self, then: Option<AfterLinks>) {
        self.deliver_prepared(self.prepare_delivery(), then);
    }

    /// Delivers what [`Shard::prepare_delivery`] found (`ordered`), in a
    /// round noted here when the order can move a victim; `then` goes once
    /// it is applied.
    fn deliver_prepared(&self, ordered: Option<bool>, then: Option<AfterLinks>) {
        match ordered {
            Some(true) => {
                let round = LinkRound::new(Arc::clone(&self.set), then);
                self.note_round(&round);
                self.send_link_events(Some(&round));
            }
            Some(false) => {
                self.send_link_events(None);
                then.into_iter().for_each(|t| t.go(&self.set));
            }
            None => then.into_iter().for_each(|t| t.go(&self.set)),
        }
    }

    /// Where this shard's rounds stand: [`Shard::links_applied`] with this
    /// mark waits for every round opened here after it.
    pub fn round_mark(&self) -> u64 {
        self.round_seq.get()
    }

    /// For a connection of this shard: returns once the link events its
    /// commands recorded here since `mark` ([`Shard::round_mark`]) are
    /// applied everywhere, so its replies go out after them. Those still
    /// here are delivered in a round of their own; those another delivery
    /// took meanwhile (while the connection awaited another shard, the
    /// mailbox or the cron ran here) are in a round opened since `mark`,
    /// which it joins. (A batch with nothing to wait for costs one lock
    /// and no channel.)
    pub async fn links_applied(&self, mark: u64) {
        let joined: Vec<Arc<LinkRound>> = if self.round_seq.get() == mark {
            Vec::new()
        } else {
            let rounds = self.rounds.borrow();
            rounds
                .iter()
                .filter(|(seq, _)| *seq > mark)
                .filter_map(|(_, round)| round.upgrade())
                .collect()
        };
        let ordered = self.prepare_delivery();
        if joined.is_empty() && ordered != Some(true) {
            // Nothing to wait for: events whose order cannot move a
            // victim go without a round.
            return self.deliver_prepared(ordered, None);
        }
        let (tx, rx) = oneshot::channel();
        let mut then = AfterLinks::Run(Box::new(move || {
            let _ = tx.send(());
        }));
        if !joined.is_empty() {
            // A latch over the joined rounds and the batch's own.
            let all = LinkRound::new(Arc::clone(&self.set), Some(then));
            for round in joined {
                round.join(LinkRound::hold(&all));
            }
            then = LinkRound::hold(&all);
        }
        self.deliver_prepared(ordered, Some(then));
        let _ = rx.await;
    }

    /// [`prepare`] for this shard's store: one lock.
    fn prepare_delivery(&self) -> Option<bool> {
        prepare(&mut self.store.lock())
    }

    /// Sends the link events this shard's store holds to the stores they
    /// concern, each job posted (and each job its cascades post, on
    /// whichever shard) holding `round`.
    fn send_link_events(&self, round: Option<&Arc<LinkRound>>) {
        loop {
            let events = self.store.lock().take_link_events();
            if events.is_empty() {
                return;
            }
            let mut batches: Vec<Vec<LinkEvent>> = vec![Vec::new(); self.count()];
            for event in events.into_iter().filter(|e| self.tracks(e)) {
                event.deliver(self.id, self.count(), |t, e| batches[t].push(e));
            }
            for (target, batch) in batches.into_iter().enumerate() {
                if batch.is_empty() {
                    continue;
                }
                if target == self.id {
                    let mut store = self.store.lock();
                    batch.into_iter().for_each(|e| store.apply_link(e));
                    continue;
                }
                let queued = &self.set.links_queued[target];
                queued.fetch_add(1, Release);
                let round = round.cloned();
                let posted = self.post(
                    target,
                    Box::new(move |s: &Shard| {
                        let ordered = {
                            let mut store = s.store.lock();
                            // What was already waiting here (a connection's
                            // writes) goes in a round of its own: a batch
                            // that joins it does not wait for this round's
                            // cascades, which may go on from shard to shard.
                            if store.has_deferred_work() {
                                drop(store);
                                s.deliver_links();
                                store = s.store.lock();
                            }
                            batch.into_iter().for_each(|e| store.apply_link(e));
                            prepare(&mut store)
                        };
                        match (&round, ordered) {
                            (_, None) => {}
                            (Some(round), Some(_)) => s.send_link_events(Some(round)),
                            // Whether order matters is this shard's to say
                            // (a policy changed on one shard first).
                            (None, ordered) => s.deliver_prepared(ordered, None),
                        }
                        s.set.links_queued[s.id].fetch_sub(1, Release);
                        drop(round);
                    }),
                );
                if posted.is_err() {
                    queued.fetch_sub(1, Release);
                }
            }
        }
    }

    /// Whether this node delivers `event`: a parent on another node is not
    /// tracked (it is neither counted nor an orphan here).
    fn tracks(&self, event: &LinkEvent) -> bool {
        match event.route() {
            Route::Key(key) => self.node_owns(key),
            _ => true,
        }
    }

    /// Every store of this node locked for this thread, if each is free now
    /// and no link events wait in another shard's mailbox (they were sent
    /// first and go first): a write that spans shards runs here whole, with
    /// no hop, while the owners are idle. None otherwise (the caller goes
    /// through the mailboxes). This shard's own store is waited for (a
    /// reader from another thread holds it for one read); the others are
    /// only tried, so no two threads can wait for each other.
    pub fn lock_all_stores(&self) -> Option<AllStores<'_>> {
        let count = self.count();
        if (0..count).any(|t| t != self.id && self.links_queued_at(t)) {
            return None;
        }
        let own = self.store.lock();
        let mut guards = (0..count)
            .filter(|&t| t != self.id)
            .map(|t| self.set.stores.get(t)?.get()?.try_lock())
            .collect::<Option<Vec<_>>>()?;
        guards.insert(self.id, own);
        Some(AllStores {
            shard: self,
            guards,
        })
    }

    /// Notes that `round` takes the link events waiting in this shard's
    /// store, which may be a connection's (see [`Shard::links_applied`]).
    /// A cascade job's round is not noted where it runs: what was waiting
    /// there goes first, in a round of its own.
    fn note_round(&self, round: &Arc<LinkRound>) {
        let seq = self.round_seq.get() + 1;
        self.round_seq.set(seq);
        let mut rounds = self.rounds.borrow_mut();
        rounds.retain(|(_, r)| r.strong_count() > 0);
        rounds.push((seq, Arc::downgrade(round)));
    }
}

/// Every store of a node, locked by one shard's thread
/// ([`Shard::lock_all_stores`]); index `i` is shard `i`'s.
pub struct AllStores<'a> {
    shard: &'a Shard,
    guards: Vec<MutexGuard<'a, Store>>,
}

impl AllStores<'_> {
    /// Shard `target`'s store.
    pub fn get(&mut self, target: usize) -> &mut Store {
        &mut self.guards[target]
    }

    /// Applies every store's link events, and what they cascade into, at
    /// once: what a round of mailbox jobs and its cascades would do, in the
    /// policy simulator's order (bench/src/sim.rs).
    pub fn deliver_links(&mut self) {
        let shard = self.shard;
        kvtier_store::deliver_all(&mut self.guards, |e| shard.tracks(e));
    }
}

impl Drop for AllStores<'_> {
    /// What is left for another shard's thread (spill writes to send) is
    /// handed to it, as after a direct read.
    fn drop(&mut self) {
        let shard = self.shard;
        let left: Vec<usize> = self
            .guards
            .iter()
            .enumerate()
            .filter(|&(t, store)| t != shard.id && store.has_deferred_work())
            .map(|(t, _)| t)
            .collect();
        self.guards.clear();
        for t in left {
            let _ = shard.post(t, Box::new(|s: &Shard| s.deliver_links()));
        }
    }
}

/// Whether `store` has link events (or spill writes) to deliver, with the
/// spill writes flushed, and if so whether their order can move a victim
/// ([`Store::ranks_by_links`]).
fn prepare(store: &mut Store) -> Option<bool> {
    if !store.has_deferred_work() {
        return None;
    }
    store.flush_spill();
    Some(store.ranks_by_links())
}

/// Most turns a connection gives the mailbox to apply queued link events
/// ([`Shard::settle_links`]).
const SETTLE_YIELDS: usize = 16;
