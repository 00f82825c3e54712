//! `kvtier-bench sim TRACE`: hit rates of eviction policies on a trace, with
//! no network and no value bytes.
//!
//! * The store's own policies run on the store's own code: one
//!   `kvtier_store::Store` per simulated shard (slots split as the server
//!   splits them, chain-link events delivered between them), each block
//!   stored by its size only (`Store::insert_block_of_len`: the index,
//!   the slab arena's accounting and the eviction code are the server's;
//!   the slot's memory is reserved and never written). The result agrees
//!   with `kvtier-bench trace --concurrency 1` against a server with the
//!   same `--threads`, `--maxmemory` and policy.
//! * References, on the same requests and capacity: exact LRU, prefix-aware
//!   LRU (the least recently used block that is a leaf or an orphan goes
//!   first), issue 42's MQ variant (`mq`) and Belady's MIN (the block used
//!   again farthest in the future goes first), each with room for
//!   `maxmemory / block bytes` blocks.
//!
//! The hit model is the dialect replay's: a request's hits are the leading
//! run of its blocks that are present (PREFIXLEN), those blocks are read
//! (MGETPREFIX), and the missing suffix is stored as one chain whose first
//! block names the last hit as its parent (MSETBLOCK CHAIN PARENT).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use kvtier_store::slot::{key_slot, shard_slots, slot_shard};
use kvtier_store::{
    BlockWrite, EvictReason, EvictionPolicy, InPrefix, PrefixStep, PrefixTuning, Store, WriteClass,
};
use serde_json::json;

use crate::trace::{self, TraceRequest};
use crate::workload::parse_size;

/// Options of `kvtier-bench sim`.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Mooncake-format JSONL trace.
    pub file: PathBuf,
    /// DRAM as fractions of the trace's unique bytes (comma-separated).
    #[arg(long, default_value = "0.05,0.1,0.25")]
    pub capacity: String,
    /// Policies, comma-separated: the store's (`prefix`, `allkeys-lru`, ...)
    /// and the references `lru`, `prefix-lru`, `mq`, `belady`; `all` for every
    /// one of the store's eviction policies that evicts plus the references.
    #[arg(long, default_value = "prefix,allkeys-lru,lru,prefix-lru,belady")]
    pub policy: String,
    /// Bytes of every block.
    #[arg(long, default_value = "64KiB")]
    pub block_bytes: String,
    /// Tokens per block (for the token hit rate).
    #[arg(long, default_value_t = 512)]
    pub block_tokens: usize,
    /// Shards simulated (as the server's `--threads`).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Key prefix (as `kvtier-bench trace --key-prefix`).
    #[arg(long, default_value = "kvt:")]
    pub key_prefix: String,
    /// Write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The `prefix` policy's parameters:
    /// `levels=N,lifetime=F,cold=0|1,ghosts=F,classes=F,probe=N,guard=F`
    /// (defaults: the store's; `classes=0` turns the write classes off, `guard=0` their guard).
    #[arg(long, default_value = "")]
    pub tune: String,
}

/// [`PrefixTuning`] with the `--tune` settings.
fn tuning(spec: &str) -> std::io::Result<PrefixTuning> {
    let mut t = PrefixTuning::default();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| std::io::Error::other(format!("--tune {item}: expected name=value")))?;
        let bad = || std::io::Error::other(format!("--tune {item}: bad value"));
        match k {
            "levels" => t.levels = v.parse().map_err(|_| bad())?,
            "lifetime" => t.lifetime_per_block = v.parse().map_err(|_| bad())?,
            "cold" => t.cold_partial = v == "1" || v == "true",
            "ghosts" => t.ghosts_per_block = v.parse().map_err(|_| bad())?,
            "classes" => t.class_threshold = v.parse().map_err(|_| bad())?,
            "probe" => t.class_probe = v.parse().map_err(|_| bad())?,
            "guard" => t.class_guard = v.parse().map_err(|_| bad())?,
            _ => return Err(std::io::Error::other(format!("--tune: unknown {k}"))),
        }
    }
    Ok(t)
}

/// What one policy at one capacity gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Policy name.
    pub policy: String,
    /// Fraction of unique bytes.
    pub capacity: f64,
    /// Hit blocks over looked-up blocks.
    pub block_hit_rate: f64,
    /// Hit tokens over prompt tokens.
    pub token_hit_rate: f64,
    /// Seconds the run took.
    pub seconds: f64,
    /// Blocks held at the end (the references hold `capacity_blocks`).
    pub resident: usize,
    /// The store's evictions by [`EvictReason`] (zero for the references).
    pub evicted: [u64; EvictReason::ALL.len()],
    /// The references' room, in blocks.
    pub capacity_blocks: usize,
    /// The store's memory (all shards): the `--maxmemory` a server replay
    /// of the same run takes.
    pub budget_bytes: usize,
}

/// The trace as the simulators need it.
pub struct Trace {
    /// Requests in order.
    pub requests: Vec<TraceRequest>,
    /// Distinct block ids.
    pub unique_blocks: usize,
}

impl Trace {
    /// Loads a trace.
    pub fn load(path: &PathBuf, limit: Option<usize>) -> std::io::Result<Trace> {
        let requests = trace::load(path, limit)?;
        let mut seen = std::collections::HashSet::new();
        for r in &requests {
            seen.extend(r.hash_ids.iter().copied());
        }
        Ok(Trace {
            unique_blocks: seen.len(),
            requests,
        })
    }
}

/// A cache the hit model drives.
trait Cache {
    /// Whether block `id` is present.
    fn present(&mut self, id: u64, req: usize) -> bool;
    /// Reads the leading run `ids` (all present); returns how many were
    /// returned.
    fn read(&mut self, ids: &[u64], req: usize) -> usize;
    /// Stores the missing suffix `ids`, the first naming `parent`; `partial`:
    /// the last is the request's final partial block (MSETBLOCK PARTIAL).
    fn store(&mut self, ids: &[u64], parent: Option<u64>, req: usize, partial: bool);
}

/// Replays `trace` through `cache`; (block hit rate, token hit rate).
fn replay(trace: &Trace, block_tokens: usize, cache: &mut dyn Cache) -> (f64, f64) {
    let (mut blocks, mut hits, mut tokens, mut hit_tokens) = (0u64, 0u64, 0u64, 0u64);
    for (i, r) in trace.requests.iter().enumerate() {
        let ids = &r.hash_ids;
        let found = ids.iter().take_while(|&&id| cache.present(id, i)).count();
        let got = if found > 0 {
            cache.read(&ids[..found], i)
        } else {
            0
        };
        if got < ids.len() {
            let parent = got.checked_sub(1).map(|p| ids[p]);
            cache.store(&ids[got..], parent, i, trace::ends_partial(r, block_tokens));
        }
        blocks += ids.len() as u64;
        hits += got as u64;
        tokens += r.input_length;
        hit_tokens += ((got * block_tokens) as u64).min(r.input_length);
    }
    (
        hits as f64 / blocks.max(1) as f64,
        hit_tokens as f64 / tokens.max(1) as f64,
    )
}

// ---- the store's own code ---------------------------------------------------

/// Simulated shards: the server's stores, with their slots and their share
/// of the budget, exchanging chain-link events as the shards do.
struct Shards {
    stores: Vec<Store>,
    keys: HashMap<u64, Bytes>,
    prefix: String,
    block_bytes: usize,
    /// Unix milliseconds of the current request.
    now: u64,
    started: u64,
}

impl Shards {
    fn new(
        shards: usize,
        budget: usize,
        policy: EvictionPolicy,
        a: &SimArgs,
    ) -> std::io::Result<Shards> {
        let block_bytes = parse_size(&a.block_bytes).unwrap_or(65536);
        let tuning = tuning(&a.tune)?;
        let stores = (0..shards)
            .map(|s| {
                let mut store = Store::new(shard_slots(s, shards), budget / shards, policy);
                store.set_prefix_tuning(tuning);
                store
            })
            .collect();
        Ok(Shards {
            stores,
            keys: HashMap::new(),
            prefix: a.key_prefix.clone(),
            block_bytes,
            now: 0,
            started: kvtier_store::now_ms(),
        })
    }

    fn key(&mut self, id: u64) -> (Bytes, u16) {
        let prefix = &self.prefix;
        let key = self
            .keys
            .entry(id)
            .or_insert_with(|| Bytes::from(format!("{prefix}{id}")))
            .clone();
        let slot = key_slot(&key);
        (key, slot)
    }

    fn shard_of(&self, slot: u16) -> usize {
        slot_shard(slot, self.stores.len())
    }

    fn at(&mut self, req: &TraceRequest) {
        // The trace's own clock, from the moment the simulation started.
        self.now = self.started + req.timestamp_ms;
    }

    /// Delivers the chain-link events every store recorded, as
    /// `Shard::deliver_links` does.
    fn deliver_links(&mut self) {
        let mut stores: Vec<&mut Store> = self.stores.iter_mut().collect();
        kvtier_store::deliver_all(&mut stores, |_| true);
    }
}

impl Cache for Shards {
    fn present(&mut self, id: u64, _req: usize) -> bool {
        let (key, slot) = self.key(id);
        let now = self.now;
        let s = self.shard_of(slot);
        self.stores[s].peek(slot, &key, now).is_some()
    }

    fn read(&mut self, ids: &[u64], _req: usize) -> usize {
        // One shard's MGETPREFIX is one read per block; over shards the
        // blocks are fetched, the prefix cut, then counted: the same
        // touches in the same order for a replay on one connection.
        let now = self.now;
        let mut previous: Option<Bytes> = None;
        let mut got = 0;
        for &id in ids {
            let (key, slot) = self.key(id);
            let s = self.shard_of(slot);
            let step = PrefixStep {
                previous: previous.as_deref(),
                room: u64::MAX,
                touch: true,
            };
            if !matches!(
                self.stores[s].read_in_prefix(slot, &key, now, &step),
                InPrefix::Value(_)
            ) {
                break;
            }
            got += 1;
            previous = Some(key);
        }
        self.deliver_links();
        got
    }

    fn store(&mut self, ids: &[u64], parent: Option<u64>, _req: usize, partial: bool) {
        let now = self.now;
        let class = WriteClass::chain(ids.len(), parent.is_some());
        let mut parent = parent.map(|p| self.key(p).0);
        let mut run_shard: Option<usize> = None;
        for (i, &id) in ids.iter().enumerate() {
            let (key, slot) = self.key(id);
            let s = self.shard_of(slot);
            // As the chain relay: one run of consecutive blocks per shard,
            // the link events delivered when the run is stored, the call's
            // decision passed on to the next run.
            if run_shard != Some(s) {
                let decided = run_shard.and_then(|r| self.stores[r].chain_decision());
                if run_shard.is_some() {
                    self.deliver_links();
                }
                self.stores[s].begin_chain(decided);
            }
            run_shard = Some(s);
            let write = BlockWrite {
                parent: parent.clone(),
                cold: partial && i + 1 == ids.len(),
                class,
                ..BlockWrite::default()
            };
            let code = self.stores[s].insert_block_of_len(slot, &key, self.block_bytes, write, now);
            // As MSETBLOCK CHAIN: nothing after a block that could not be
            // stored.
            if code < 0 {
                break;
            }
            parent = Some(key);
        }
        self.deliver_links();
    }
}

// ---- references -------------------------------------------------------------

/// Exact LRU over `capacity` blocks.
struct Lru {
    capacity: usize,
    stamp: u64,
    at: HashMap<u64, u64>,
    order: BTreeSet<(u64, u64)>,
}

impl Lru {
    fn new(capacity: usize) -> Lru {
        Lru {
            capacity,
            stamp: 0,
            at: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    fn touch(&mut self, id: u64) {
        self.stamp += 1;
        if let Some(old) = self.at.insert(id, self.stamp) {
            self.order.remove(&(old, id));
        }
        self.order.insert((self.stamp, id));
    }
}

impl Cache for Lru {
    fn present(&mut self, id: u64, _req: usize) -> bool {
        self.at.contains_key(&id)
    }

    fn read(&mut self, ids: &[u64], _req: usize) -> usize {
        ids.iter().for_each(|&id| self.touch(id));
        ids.len()
    }

    fn store(&mut self, ids: &[u64], _parent: Option<u64>, _req: usize, _partial: bool) {
        for &id in ids {
            if self.at.contains_key(&id) {
                continue;
            }
            while self.at.len() >= self.capacity {
                let Some((stamp, victim)) = self.order.pop_first() else {
                    break;
                };
                debug_assert_eq!(self.at.get(&victim), Some(&stamp));
                self.at.remove(&victim);
            }
            if self.capacity > 0 {
                self.touch(id);
            }
        }
    }
}

/// Prefix-aware LRU: the least recently used block among those no cached
/// block continues (leaves) and those whose parent is gone (orphans).
struct PrefixLru {
    capacity: usize,
    stamp: u64,
    /// Cached blocks: last use, cached children.
    cached: HashMap<u64, (u64, u32)>,
    /// Every block's parent (fixed: an id names its whole prefix).
    parent: HashMap<u64, u64>,
    children: HashMap<u64, Vec<u64>>,
    /// Leaves and orphans by last use.
    candidates: BTreeSet<(u64, u64)>,
}

impl PrefixLru {
    fn new(capacity: usize) -> PrefixLru {
        PrefixLru {
            capacity,
            stamp: 0,
            cached: HashMap::new(),
            parent: HashMap::new(),
            children: HashMap::new(),
            candidates: BTreeSet::new(),
        }
    }

    fn is_candidate(&self, id: u64) -> bool {
        let Some(&(_, kids)) = self.cached.get(&id) else {
            return false;
        };
        let orphan = self
            .parent
            .get(&id)
            .is_some_and(|p| !self.cached.contains_key(p));
        kids == 0 || orphan
    }

    /// Re-files `id` after its use or its links changed.
    fn refile(&mut self, id: u64, old_stamp: Option<u64>) {
        let Some(&(stamp, _)) = self.cached.get(&id) else {
            return;
        };
        if let Some(old) = old_stamp {
            self.candidates.remove(&(old, id));
        }
        self.candidates.remove(&(stamp, id));
        if self.is_candidate(id) {
            self.candidates.insert((stamp, id));
        }
    }

    fn touch(&mut self, id: u64) {
        self.stamp += 1;
        let stamp = self.stamp;
        let Some(entry) = self.cached.get_mut(&id) else {
            return;
        };
        let old = entry.0;
        entry.0 = stamp;
        self.refile(id, Some(old));
    }

    fn evict(&mut self) {
        let Some((_, victim)) = self.candidates.pop_first() else {
            return;
        };
        self.cached.remove(&victim);
        if let Some(&p) = self.parent.get(&victim) {
            if let Some(e) = self.cached.get_mut(&p) {
                e.1 -= 1;
            }
            self.refile(p, None);
        }
        for c in self.children.get(&victim).cloned().unwrap_or_default() {
            self.refile(c, None);
        }
    }
}

impl Cache for PrefixLru {
    fn present(&mut self, id: u64, _req: usize) -> bool {
        self.cached.contains_key(&id)
    }

    fn read(&mut self, ids: &[u64], _req: usize) -> usize {
        ids.iter().for_each(|&id| self.touch(id));
        ids.len()
    }

    fn store(&mut self, ids: &[u64], parent: Option<u64>, _req: usize, _partial: bool) {
        let mut parent = parent;
        for &id in ids {
            if let Some(p) = parent {
                if self.parent.insert(id, p).is_none() {
                    self.children.entry(p).or_default().push(id);
                }
            }
            parent = Some(id);
            if self.cached.contains_key(&id) || self.capacity == 0 {
                continue;
            }
            while self.cached.len() >= self.capacity && !self.candidates.is_empty() {
                self.evict();
            }
            self.stamp += 1;
            let kids = self.children.get(&id).map_or(0, |cs| {
                cs.iter().filter(|c| self.cached.contains_key(c)).count()
            });
            self.cached.insert(id, (self.stamp, kids as u32));
            self.refile(id, None);
            if let Some(&p) = self.parent.get(&id) {
                if let Some(e) = self.cached.get_mut(&p) {
                    e.1 += 1;
                }
                self.refile(p, None);
            }
            for c in self.children.get(&id).cloned().unwrap_or_default() {
                self.refile(c, None);
            }
        }
    }
}

/// Issue 42's MQ variant, as the issue describes it: eight LRU queues by
/// log2 of the use count; a block unused for `capacity` ticks (one tick a
/// block touched) drops a queue; a ghost list of 4× the blocks gives a
/// returning block its old count back; a request's blocks are touched
/// deepest first, so a chain leaves from its tail; the final partial block
/// is stored cold (first to go). Evicts from the lowest queue not empty.
struct Mq {
    capacity: usize,
    tick: i64,
    /// Cold stamps count down from far below any tick.
    cold: i64,
    cached: HashMap<u64, MqEntry>,
    queues: Vec<BTreeSet<(i64, u64)>>,
    /// Evicted blocks' counts, and the eviction that wrote each.
    ghosts: HashMap<u64, (u32, u64)>,
    ghost_order: VecDeque<(u64, u64)>,
    evictions: u64,
}

#[derive(Clone, Copy)]
struct MqEntry {
    count: u32,
    queue: usize,
    stamp: i64,
    expire: i64,
}

impl Mq {
    const QUEUES: usize = 8;

    fn new(capacity: usize) -> Mq {
        Mq {
            capacity,
            tick: 0,
            cold: i64::MIN / 2,
            cached: HashMap::new(),
            queues: vec![BTreeSet::new(); Mq::QUEUES],
            ghosts: HashMap::new(),
            ghost_order: VecDeque::new(),
            evictions: 0,
        }
    }

    /// Files `id` with `count` uses in its queue at `stamp`.
    fn place(&mut self, id: u64, count: u32, stamp: i64) {
        let entry = MqEntry {
            count,
            queue: (count.max(1).ilog2() as usize).min(Mq::QUEUES - 1),
            stamp,
            expire: self.tick + self.capacity as i64,
        };
        if let Some(old) = self.cached.insert(id, entry) {
            self.queues[old.queue].remove(&(old.stamp, id));
        }
        self.queues[entry.queue].insert((stamp, id));
    }

    /// One tick: each queue's least recent block drops a queue if expired.
    fn advance(&mut self) {
        self.tick += 1;
        for q in 1..Mq::QUEUES {
            let Some(&(stamp, id)) = self.queues[q].first() else {
                continue;
            };
            let mut e = self.cached[&id];
            if e.expire < self.tick {
                self.queues[q].remove(&(stamp, id));
                e.queue = q - 1;
                e.stamp = self.tick;
                e.expire = self.tick + self.capacity as i64;
                self.queues[e.queue].insert((e.stamp, id));
                self.cached.insert(id, e);
            }
        }
    }

    fn evict(&mut self) {
        let Some(q) = self.queues.iter().position(|q| !q.is_empty()) else {
            return;
        };
        let Some((_, victim)) = self.queues[q].pop_first() else {
            return;
        };
        let Some(e) = self.cached.remove(&victim) else {
            return;
        };
        self.evictions += 1;
        self.ghosts.insert(victim, (e.count, self.evictions));
        self.ghost_order.push_back((victim, self.evictions));
        while self.ghost_order.len() > 4 * self.capacity {
            if let Some((old, at)) = self.ghost_order.pop_front() {
                if self.ghosts.get(&old).is_some_and(|g| g.1 == at) {
                    self.ghosts.remove(&old);
                }
            }
        }
    }
}

impl Cache for Mq {
    fn present(&mut self, id: u64, _req: usize) -> bool {
        self.cached.contains_key(&id)
    }

    fn read(&mut self, ids: &[u64], _req: usize) -> usize {
        for &id in ids.iter().rev() {
            self.advance();
            let count = self.cached[&id].count.saturating_add(1);
            self.place(id, count, self.tick);
        }
        ids.len()
    }

    fn store(&mut self, ids: &[u64], _parent: Option<u64>, _req: usize, partial: bool) {
        if self.capacity == 0 {
            return;
        }
        for (i, &id) in ids.iter().enumerate().rev() {
            self.advance();
            if self.cached.contains_key(&id) {
                continue;
            }
            while self.cached.len() >= self.capacity {
                self.evict();
            }
            let count = self.ghosts.remove(&id).map_or(1, |g| g.0.saturating_add(1));
            let stamp = if partial && i + 1 == ids.len() {
                self.cold -= 1;
                self.cold
            } else {
                self.tick
            };
            self.place(id, count, stamp);
        }
    }
}

/// Belady's MIN: the block whose next use is farthest goes first.
struct Belady {
    capacity: usize,
    /// For request `i` and block `id`: the next request that names `id`.
    next_use: HashMap<(usize, u64), usize>,
    cached: HashMap<u64, usize>,
    by_next: BTreeSet<(usize, u64)>,
}

impl Belady {
    fn new(capacity: usize, trace: &Trace) -> Belady {
        let mut next_use = HashMap::new();
        let mut later: HashMap<u64, usize> = HashMap::new();
        for (i, r) in trace.requests.iter().enumerate().rev() {
            for &id in &r.hash_ids {
                next_use.insert((i, id), later.get(&id).copied().unwrap_or(usize::MAX));
            }
            for &id in &r.hash_ids {
                later.insert(id, i);
            }
        }
        Belady {
            capacity,
            next_use,
            cached: HashMap::new(),
            by_next: BTreeSet::new(),
        }
    }

    fn refile(&mut self, id: u64, req: usize) {
        let next = self.next_use.get(&(req, id)).copied().unwrap_or(usize::MAX);
        if let Some(old) = self.cached.insert(id, next) {
            self.by_next.remove(&(old, id));
        }
        self.by_next.insert((next, id));
    }
}

impl Cache for Belady {
    fn present(&mut self, id: u64, req: usize) -> bool {
        let here = self.cached.contains_key(&id);
        if here {
            // Named by this request: its next use is now a later one.
            self.refile(id, req);
        }
        here
    }

    fn read(&mut self, ids: &[u64], _req: usize) -> usize {
        ids.len()
    }

    fn store(&mut self, ids: &[u64], _parent: Option<u64>, req: usize, _partial: bool) {
        for &id in ids {
            if self.cached.contains_key(&id) {
                self.refile(id, req);
                continue;
            }
            if self.capacity == 0 {
                continue;
            }
            let next = self.next_use.get(&(req, id)).copied().unwrap_or(usize::MAX);
            if self.cached.len() >= self.capacity {
                let Some(&(far, victim)) = self.by_next.last() else {
                    continue;
                };
                if far <= next {
                    // Storing this one would evict a block needed sooner.
                    continue;
                }
                self.by_next.remove(&(far, victim));
                self.cached.remove(&victim);
            }
            self.refile(id, req);
        }
    }
}

/// The policies `all` stands for.
const ALL: [&str; 10] = [
    "prefix",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "lru",
    "prefix-lru",
    "mq",
    "belady",
    "ideal",
];

/// Runs `policy` on `trace` with DRAM at `fraction` of its unique bytes.
pub fn simulate(
    trace: &Trace,
    a: &SimArgs,
    policy: &str,
    fraction: f64,
) -> std::io::Result<Outcome> {
    let block_bytes = parse_size(&a.block_bytes).map_err(std::io::Error::other)?;
    let budget = (trace.unique_blocks as f64 * block_bytes as f64 * fraction) as usize;
    let blocks = budget / block_bytes.max(1);
    let started = Instant::now();
    let mut resident = blocks;
    let mut evicted = [0u64; EvictReason::ALL.len()];
    let (block_hit_rate, token_hit_rate) = match policy {
        "lru" => replay(trace, a.block_tokens, &mut Lru::new(blocks)),
        "prefix-lru" => replay(trace, a.block_tokens, &mut PrefixLru::new(blocks)),
        "belady" => replay(trace, a.block_tokens, &mut Belady::new(blocks, trace)),
        "mq" => replay(trace, a.block_tokens, &mut Mq::new(blocks)),
        "ideal" => replay(trace, a.block_tokens, &mut Lru::new(usize::MAX)),
        name => {
            let policy: EvictionPolicy = name.parse().map_err(std::io::Error::other)?;
            let mut shards = Shards::new(a.shards.max(1), budget, policy, a)?;
            let mut cache = Timed {
                shards: &mut shards,
                trace,
            };
            let rates = replay(trace, a.block_tokens, &mut cache);
            resident = shards.stores.iter().map(Store::len).sum();
            for store in &shards.stores {
                for (n, e) in evicted.iter_mut().zip(store.stats.evicted_by) {
                    *n += e;
                }
            }
            rates
        }
    };
    Ok(Outcome {
        policy: policy.to_string(),
        capacity: fraction,
        block_hit_rate,
        token_hit_rate,
        seconds: started.elapsed().as_secs_f64(),
        resident,
        evicted,
        capacity_blocks: blocks,
        budget_bytes: budget,
    })
}

/// The store-backed cache with the trace's clock set per request.
struct Timed<'a> {
    shards: &'a mut Shards,
    trace: &'a Trace,
}

impl Cache for Timed<'_> {
    fn present(&mut self, id: u64, req: usize) -> bool {
        self.shards.at(&self.trace.requests[req]);
        self.shards.present(id, req)
    }

    fn read(&mut self, ids: &[u64], req: usize) -> usize {
        self.shards.read(ids, req)
    }

    fn store(&mut self, ids: &[u64], parent: Option<u64>, req: usize, partial: bool) {
        self.shards.at(&self.trace.requests[req]);
        self.shards.store(ids, parent, req, partial)
    }
}

/// Runs every policy at every capacity and prints the table.
pub fn run(a: SimArgs) -> std::io::Result<()> {
    let trace = Trace::load(&a.file, a.limit)?;
    let policies: Vec<&str> = if a.policy == "all" {
        ALL.to_vec()
    } else {
        a.policy.split(',').map(str::trim).collect()
    };
    let fractions: Vec<f64> = a
        .capacity
        .split(',')
        .map(|f| f.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(std::io::Error::other)?;
    println!(
        "{}: {} requests, {} unique blocks of {}, {} shard(s)",
        a.file.display(),
        trace.requests.len(),
        trace.unique_blocks,
        a.block_bytes,
        a.shards
    );
    let mut header = String::from("| policy |");
    let mut rule = String::from("|---|");
    for f in &fractions {
        header += &format!(" {:.0}% |", f * 100.0);
        rule += "---|";
    }
    println!("{header}\n{rule}");
    let mut held = String::from("blocks held at the end (store) / room (references):");
    let mut all = Vec::new();
    for policy in &policies {
        let mut row = format!("| {policy} |");
        for &f in &fractions {
            let o = simulate(&trace, &a, policy, f)?;
            row += &format!(" {:.4} |", o.block_hit_rate);
            if !matches!(
                o.policy.as_str(),
                "lru" | "prefix-lru" | "mq" | "belady" | "ideal"
            ) {
                held += &format!(
                    " {} {:.0}%: {}/{}",
                    o.policy,
                    f * 100.0,
                    o.resident,
                    o.capacity_blocks
                );
                let reasons = EvictReason::ALL.iter().zip(o.evicted);
                let reasons: Vec<String> = reasons
                    .filter(|(_, n)| *n > 0)
                    .map(|(r, n)| format!("{} {n}", r.name()))
                    .collect();
                held += &format!(" (evicted: {});", reasons.join(", "));
            }
            all.push(o);
        }
        println!("{row}");
    }
    println!("{held}");
    if let Some(path) = &a.json {
        let rows: Vec<_> = all
            .iter()
            .map(|o| {
                json!({
                    "policy": o.policy,
                    "capacity": o.capacity,
                    "block_hit_rate": o.block_hit_rate,
                    "token_hit_rate": o.token_hit_rate,
                    "seconds": o.seconds,
                    "resident_blocks": o.resident,
                    "capacity_blocks": o.capacity_blocks,
                    "budget_bytes": o.budget_bytes,
                })
            })
            .collect();
        let out = json!({
            "trace": a.file.display().to_string(),
            "requests": trace.requests.len(),
            "unique_blocks": trace.unique_blocks,
            "block_bytes": a.block_bytes,
            "shards": a.shards,
            "results": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mq_evicts_chain_tails_cold_blocks_first_and_remembers_counts() {
        let mut mq = Mq::new(3);
        mq.store(&[1, 2, 3], None, 0, false);
        mq.read(&[1], 1);
        assert_eq!(mq.cached[&1].queue, 1, "read once: two uses");
        // The chain leaves from its tail.
        mq.store(&[4], Some(1), 2, false);
        assert!(!mq.present(3, 3) && mq.present(2, 3) && mq.present(1, 3));
        // A final partial block is stored cold: the next to go.
        mq.store(&[5], None, 3, true);
        assert!(!mq.present(2, 4) && mq.present(5, 4));
        mq.store(&[3], None, 4, false);
        assert!(!mq.present(5, 5) && mq.present(4, 5));
        // The ghost gave 3 its count back: a second use.
        assert_eq!(mq.cached[&3].queue, 1);
        // Unused for a capacity of ticks, a block drops a queue.
        let tick = mq.tick;
        while mq.tick < tick + 4 {
            mq.advance();
        }
        assert_eq!(mq.cached[&1].queue, 0);
    }
}
