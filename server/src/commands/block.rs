//! The block dialect: MSETBLOCK, MGETPREFIX, PREFIXLEN, MEXISTS.
//!
//! An LLM serving stack stores a prompt's KV cache as a chain of blocks whose
//! keys hash the token prefix; a lookup walks the chain and stops at the
//! first miss. These commands do each step of that in one round trip, with
//! the keys on any shard:
//!
//! * `PREFIXLEN numkeys key...`: how many leading blocks are cached.
//! * `MGETPREFIX numkeys key... [MAXBYTES n] [BLOCK ms [MIN count]]`: the
//!   values of the leading present blocks; with BLOCK, waits for a prefill
//!   worker's writes to complete the prefix.
//! * `MSETBLOCK numblocks key value... [EX s|PX ms] [CHAIN [PARENT key]
//!   [PARTIAL]] [REPLACE]`: stores blocks (immutable unless REPLACE); CHAIN records the
//!   parent links and publishes in chain order.
//! * `MEXISTS numkeys key...`: 0/1 per key.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvtier_protocol::Reply;
use kvtier_store::{
    now_ms, partial_tail, BlockWrite, Fetched, InPrefix, PrefixStep, Store, Waiter, WriteClass,
};
use tokio::sync::{oneshot, Notify};

use super::flags::*;
use super::value_reply;
use super::{
    always, is, not_integer, parse_int, syntax_error, Args, Client, CommandSpec, Handler, KeyOp,
    KeySpec, LocalBoxFuture, OneShard, Spread, DEFAULTS,
};
use super::{expire_at_from, fan_out};
use crate::acl::{category, KeyUse};
use crate::config::Num;
use crate::shard::links::AllStores;
use crate::shard::Access;
use crate::shard::{AfterLinks, Shard, ShardGone};

const BASE: CommandSpec = CommandSpec {
    arity: -3,
    flags: READONLY,
    keys: KeySpec::counted(1, 1),
    group: "string",
    since: "7.2.4",
    complexity: "O(N) where N is the number of keys.",
    syntax: "numkeys key...",
    categories: category::BLOCK,
    ..DEFAULTS
};

/// The block family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "msetblock",
        key_use: KeyUse::Write,
        option_key: Some(parent_key),
        arity: -4,
        flags: WRITE | DENYOOM | OOM_PER_KEY,
        keys: KeySpec::counted(1, 2),
        summary: "Stores KV-cache blocks; with CHAIN, records parent links and publishes in chain order.",
        complexity: "O(N) where N is the number of blocks.",
        syntax: "numblocks (key value)... [EX seconds|PX milliseconds] [CHAIN [PARENT parentkey] [PARTIAL]] [REPLACE]",
        handler: Handler::Async(msetblock),
        one_shard: Some(OneShard {
            run: msetblock_one,
            applies: few_blocks,
        }),
        spread: Spread::Blocks,
        ..BASE
    },
    CommandSpec {
        name: "mgetprefix",
        flags: READONLY | BLOCKING,
        summary: "Returns the values of the longest run of leading keys that are all present, optionally waiting for them.",
        syntax: "numkeys key... [MAXBYTES bytes:integer] [BLOCK milliseconds [MIN count]]",
        handler: Handler::Async(mgetprefix),
        one_shard: Some(OneShard {
            run: mgetprefix_one,
            applies: no_block,
        }),
        spread: Spread::PrefixValues,
        from_copies: Some(copy_mgetprefix),
        ..BASE
    },
    CommandSpec {
        name: "prefixlen",
        key_use: KeyUse::Exists,
        summary: "Returns how many leading keys are present, without touching them; with HOLD, keeps the counted keys from eviction until read or for ms.",
        syntax: "numkeys key... [HOLD milliseconds]",
        handler: Handler::Async(prefixlen),
        one_shard: Some(OneShard {
            run: prefixlen_one,
            applies: no_hold,
        }),
        spread: Spread::PrefixCount,
        from_copies: Some(copy_prefixlen),
        ..BASE
    },
    CommandSpec {
        name: "mexists",
        key_use: KeyUse::Exists,
        summary: "Returns 1 or 0 for each key: whether it exists.",
        handler: Handler::Async(mexists),
        one_shard: Some(OneShard {
            run: mexists_one,
            applies: always,
        }),
        spread: Spread::ByPosition,
        from_copies: Some(copy_mexists),
        ..BASE
    },
];

/// Reads `numkeys` (args[1]) and checks that `numkeys * step` arguments
/// follow. Returns the count and the index of the first option.
pub(crate) fn parse_count(
    args: &[Bytes],
    step: usize,
    what: &str,
) -> Result<(usize, usize), Reply> {
    let n = parse_int(&args[1]).ok_or_else(not_integer)?;
    if n < 1 {
        return Err(Reply::error(format!("ERR {what} should be greater than 0")));
    }
    let n = n as usize;
    let end = n
        .checked_mul(step)
        .and_then(|k| k.checked_add(2))
        .filter(|&end| end <= args.len())
        .ok_or_else(syntax_error)?;
    Ok((n, end))
}

// ---- MSETBLOCK ---------------------------------------------------------------

/// MSETBLOCK's options.
pub(crate) struct SetOptions {
    pub(crate) expire_at: u64,
    pub(crate) chain: bool,
    pub(crate) parent: Option<Bytes>,
    pub(crate) replace: bool,
    /// The chain's last block is a request's final, partial block.
    pub(crate) partial: bool,
}

/// Where MSETBLOCK's `CHAIN PARENT key` names its parent, if it does.
fn parent_key(args: &[Bytes]) -> Option<usize> {
    let n = parse_int(args.get(1)?).filter(|&n| n > 0)? as usize;
    let from = n.checked_mul(2)?.checked_add(2)?;
    let i = (from..args.len().saturating_sub(1))
        .find(|&i| is(&args[i], "chain") && is(&args[i + 1], "parent"))?;
    (i + 2 < args.len()).then_some(i + 2)
}

/// Parses MSETBLOCK's options from `args[from..]`.
pub(crate) fn parse_set_options(args: &[Bytes], from: usize) -> Result<SetOptions, Reply> {
    let mut opts = SetOptions {
        expire_at: 0,
        chain: false,
        parent: None,
        replace: false,
        partial: false,
    };
    let mut has_expiry = false;
    let mut i = from;
    while i < args.len() {
        let a = &args[i];
        if (is(a, "ex") || is(a, "px")) && !has_expiry && i + 1 < args.len() {
            opts.expire_at = expire_at_from(a, &args[i + 1], "msetblock", now_ms())?;
            has_expiry = true;
            i += 2;
        } else if is(a, "chain") && !opts.chain {
            opts.chain = true;
            i += 1;
            if i + 1 < args.len() && is(&args[i], "parent") {
                opts.parent = Some(args[i + 1].clone());
                i += 2;
            }
        } else if is(a, "replace") && !opts.replace {
            opts.replace = true;
            i += 1;
        } else if is(a, "partial") && !opts.partial {
            opts.partial = true;
            i += 1;
        } else {
            return Err(syntax_error());
        }
    }
    // PARTIAL names the last block of a chain, as PARENT its first.
    if opts.partial && !opts.chain {
        return Err(syntax_error());
    }
    Ok(opts)
}

impl SetOptions {
    /// Whether block `i` of a chain of `n` (`len` bytes, after one of
    /// `previous_len`) is a request's final partial block, queued to be
    /// evicted first: the chain's last, flagged PARTIAL or shorter than the
    /// block before it ([`partial_tail`]).
    fn cold(&self, i: usize, n: usize, len: usize, previous_len: Option<usize>) -> bool {
        self.chain && i + 1 == n && (self.partial || partial_tail(i, n, len, previous_len))
    }

    /// The eviction policy's class of a write of `n` blocks.
    fn class(&self, n: usize) -> WriteClass {
        match self.chain {
            true => WriteClass::chain(n, self.parent.is_some()),
            false => WriteClass::default(),
        }
    }
}

fn msetblock(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = Arc::new(args);
        let (n, end) = match parse_count(&args, 2, "numblocks") {
            Ok(found) => found,
            Err(e) => return e,
        };
        let opts = match parse_set_options(&args, end) {
            Ok(o) => o,
            Err(e) => return e,
        };
        let key_indexes: Vec<usize> = (0..n).map(|i| 2 + 2 * i).collect();
        let (at, replace) = (opts.expire_at, opts.replace);
        if !opts.chain {
            let stored = fan_out(
                client,
                &args,
                &key_indexes,
                Access::Write,
                move |store, slot, key, value, now| {
                    let value = value.cloned().unwrap_or_default();
                    let write = BlockWrite {
                        expire_at: at,
                        replace,
                        ..BlockWrite::default()
                    };
                    store.insert_block(slot, key, value, write, now)
                },
            )
            .await;
            return match stored {
                Ok(codes) => Reply::Array(codes.into_iter().map(Reply::Int).collect()),
                Err(_) => Reply::from(ShardGone),
            };
        }
        match store_chain(&client.shard, &args, &key_indexes, &opts).await {
            Some(codes) => Reply::Array(codes.into_iter().map(Reply::Int).collect()),
            None => Reply::from(ShardGone),
        }
    })
}

/// Most blocks one MSETBLOCK stores in one step on a shard: a longer call
/// is stored in steps of this many, in order, and the shard serves its
/// other clients in between (a 100k-block chain must not stall them).
const BLOCKS_PER_STEP: usize = 256;

/// Whether an MSETBLOCK is short enough to run in one step on its shard
/// (the `one_shard` form); longer ones go through [`store_chain`] or the
/// fan-out in steps.
fn few_blocks(args: &[Bytes]) -> bool {
    args.get(1)
        .and_then(|n| parse_int(n))
        .is_some_and(|n| (0..=BLOCKS_PER_STEP as i64).contains(&n))
}

/// One block of a chain being stored: key, its slot, value, parent key,
/// and whether it is the request's final partial block
/// ([`SetOptions::cold`]).
type ChainBlock = (Bytes, u16, Bytes, Option<Bytes>, bool);

/// A chain being stored, run by run (see [`store_chain`]).
struct Chain {
    /// Runs of consecutive blocks owned by one shard, in chain order.
    runs: VecDeque<(usize, Vec<ChainBlock>)>,
    codes: Vec<i64>,
    total: usize,
    expire_at: u64,
    replace: bool,
    class: WriteClass,
    /// How the eviction policy decided the call so far (passed from run
    /// to run: the call is stored cold or not as a whole).
    decided: Option<bool>,
}

/// A chain on its way through the shards' mailboxes, and where its codes go.
struct ChainRelay {
    chain: Chain,
    done: oneshot::Sender<Vec<i64>>,
}

impl Chain {
    /// Stores one run in its owner's `store`, the call's eviction decision
    /// carried in and out; false if a block could not be stored (the rest
    /// of the run gets -1).
    fn store_run(&mut self, store: &mut Store, run: Vec<ChainBlock>) -> bool {
        let mut failed = false;
        let now = now_ms();
        store.begin_chain(self.decided);
        for (key, slot, value, parent, cold) in run {
            let code = if failed {
                -1
            } else {
                let write = BlockWrite {
                    expire_at: self.expire_at,
                    parent,
                    replace: self.replace,
                    cold,
                    class: self.class,
                };
                store.insert_block(slot, &key, value, write, now)
            };
            failed |= code < 0;
            self.codes.push(code);
        }
        self.decided = store.chain_decision();
        !failed
    }

    /// Stores the whole chain on this thread with every store held: each
    /// run's link events and their cascades are applied before the next
    /// run, as the relay's rounds are, without a hop.
    fn store_all(mut self, stores: &mut AllStores<'_>) -> Vec<i64> {
        while let Some((owner, run)) = self.runs.pop_front() {
            let stored = self.store_run(stores.get(owner), run);
            stores.deliver_links();
            if !stored {
                break;
            }
        }
        self.finish()
    }

    /// The codes, in chain order: -1 for the blocks never reached (after
    /// one that could not be stored: they would be unreachable).
    fn finish(mut self) -> Vec<i64> {
        self.codes.resize(self.total, -1);
        self.codes
    }
}

impl ChainRelay {
    /// Stores the first run on this shard, then hands the rest to the
    /// owner of the next run directly (or finishes).
    fn step(mut self, shard: &Shard) {
        let chain = &mut self.chain;
        let Some((_, run)) = chain.runs.pop_front() else {
            let _ = self.done.send(self.chain.finish());
            return;
        };
        let failed = !chain.store_run(&mut shard.store.lock(), run);
        // The run's link events, and what they cascade into on any shard,
        // are applied before the rest of the chain is stored (the next
        // run's owner learns that its blocks have children here before it
        // stores, and may evict for, the blocks that follow) and before the
        // reply (the client's next request meets them applied): the next
        // step waits for the round, as the next run does in the policy
        // simulator (bench/src/sim.rs).
        let then = match chain.runs.front() {
            // Through the mailbox even when the next step is this shard's:
            // what is queued meanwhile runs in between. If the next shard
            // is gone, dropping the relay drops `done` and the caller sees
            // the shutdown.
            Some(&(next, _)) if !failed => {
                if chain.total > BLOCKS_PER_STEP {
                    // A long chain: this shard's connections go before
                    // whatever it runs next (the chain's next step too).
                    shard.give_turn();
                }
                AfterLinks::Post(next, Box::new(move |s: &Shard| self.step(s)))
            }
            _ => {
                // A block that could not be stored ends the chain.
                let (done, codes) = (self.done, self.chain.finish());
                AfterLinks::Run(Box::new(move || {
                    let _ = done.send(codes);
                }))
            }
        };
        shard.deliver_links_then(then);
    }
}

/// Stores a chain in order: each run of consecutive blocks owned by one
/// shard is stored in one step, and that shard passes the rest of the chain
/// straight to the next run's owner, so a reader can never see block i
/// without block i-1, at the cost of one one-way hop per change of shard.
/// A chain of one step's size whose owners are all idle is stored here
/// instead, every store held, in the same order and with no hop. (A chain
/// of one step wholly on one shard never comes here: the command runs on
/// that shard in one piece.)
async fn store_chain(
    shard: &Rc<Shard>,
    args: &Args,
    key_indexes: &[usize],
    opts: &SetOptions,
) -> Option<Vec<i64>> {
    let mut runs: VecDeque<(usize, Vec<ChainBlock>)> = VecDeque::new();
    for (i, &k) in key_indexes.iter().enumerate() {
        let slot = args.slot(k);
        let owner = shard.owner_of(slot);
        let parent = if i == 0 {
            opts.parent.clone()
        } else {
            Some(args[key_indexes[i - 1]].clone())
        };
        let previous_len = i.checked_sub(1).map(|p| args[key_indexes[p] + 1].len());
        let cold = opts.cold(i, key_indexes.len(), args[k + 1].len(), previous_len);
        let block = (args[k].clone(), slot, args[k + 1].clone(), parent, cold);
        match runs.back_mut() {
            Some((o, run)) if *o == owner && run.len() < BLOCKS_PER_STEP => run.push(block),
            _ => runs.push_back((owner, vec![block])),
        }
    }
    let first = runs.front()?.0;
    let chain = Chain {
        runs,
        codes: Vec::with_capacity(key_indexes.len()),
        total: key_indexes.len(),
        expire_at: opts.expire_at,
        replace: opts.replace,
        class: opts.class(key_indexes.len()),
        decided: None,
    };
    if chain.runs.len() > 1 && chain.total <= BLOCKS_PER_STEP {
        if let Some(mut stores) = shard.lock_all_stores() {
            shard.stats.borrow_mut().direct_writes += 1;
            return Some(chain.store_all(&mut stores));
        }
    }
    let (done, result) = oneshot::channel();
    let relay = ChainRelay { chain, done };
    if first == shard.id {
        relay.step(shard);
    } else {
        shard
            .post(first, Box::new(move |s: &Shard| relay.step(s)))
            .ok()?;
    }
    result.await.ok()
}

// ---- reading a prefix -------------------------------------------------------------

/// How a prefix read treats the keys it finds missing.
#[derive(Clone)]
enum Watch {
    /// Stop at the first miss on each shard.
    No,
    /// Read everything; wake `waiter` when a missing key at a position below
    /// `below` is written.
    Register { waiter: Waiter, below: usize },
}

/// The keys of a prefix read: arguments `first..end` of a shared argument
/// list, so the shard jobs read the keys where they are (no per-key clone).
#[derive(Clone)]
struct PrefixKeys {
    args: Arc<Args>,
    first: usize,
    end: usize,
}

impl PrefixKeys {
    fn len(&self) -> usize {
        self.end - self.first
    }

    /// Key positions (from 0) with their argument index, grouped by shard.
    fn per_shard(&self, shard: &Shard, count: usize) -> Vec<Vec<(usize, usize)>> {
        let mut per_shard: Vec<Vec<(usize, usize)>> =
            (0..shard.count()).map(|_| Vec::new()).collect();
        for (pos, i) in (self.first..self.first + count).enumerate() {
            per_shard[shard.owner_of(self.args.slot(i))].push((pos, i));
        }
        per_shard
    }
}

/// Values of the keys (None where absent), read in parallel on their shards
/// without touching them. Each shard stops at its own first miss: nothing
/// after it can be part of the prefix.
async fn read_values(
    shard: &Rc<Shard>,
    keys: &PrefixKeys,
    watch: Watch,
) -> Option<Vec<Option<Fetched>>> {
    let mut pending = Vec::new();
    for (target, work) in keys.per_shard(shard, keys.len()).into_iter().enumerate() {
        if work.is_empty() {
            continue;
        }
        let (watch, args) = (watch.clone(), Arc::clone(&keys.args));
        // Read where the caller runs when the owner is free (no wake-up).
        pending.push(shard.with_store(target, Access::Read, move |store| {
            let now = now_ms();
            let mut out = Vec::with_capacity(work.len());
            for (pos, i) in work {
                // A spilled block's disk read starts here; the reply
                // awaits it.
                let value = store.fetch(args.slot(i), &args[i], now);
                let missing = value.is_none();
                out.push((pos, value));
                match &watch {
                    Watch::No if missing => break,
                    Watch::Register { waiter, below } if missing && pos < *below => {
                        store.watch(&args[i], waiter.clone());
                    }
                    _ => {}
                }
            }
            out
        }));
    }
    let mut values: Vec<Option<Fetched>> = (0..keys.len()).map(|_| None).collect();
    for p in pending {
        for (pos, value) in p.await.ok()? {
            values[pos] = value;
        }
    }
    Some(values)
}

/// The leading present values, at most `max_bytes` in total.
fn leading(values: Vec<Option<Fetched>>, max_bytes: Option<u64>) -> Vec<Fetched> {
    let mut total = 0u64;
    let mut out = Vec::new();
    for v in values {
        let Some(v) = v else { break };
        total += v.len() as u64;
        if max_bytes.is_some_and(|m| total > m) {
            break;
        }
        out.push(v);
    }
    out
}

/// Counts the first `count` blocks, returned, as keyspace hits and, unless
/// `touch` is false (CLIENT NO-TOUCH), as accessed: on their shards,
/// without waiting.
fn touch_returned(shard: &Rc<Shard>, keys: &PrefixKeys, count: usize, touch: bool) {
    for (target, work) in keys.per_shard(shard, count).into_iter().enumerate() {
        if work.is_empty() {
            continue;
        }
        let (args, first) = (Arc::clone(&keys.args), keys.first);
        let job = move |store: &mut Store| {
            let now = now_ms();
            for (_, i) in work {
                // Each block with the one returned before it.
                let step = PrefixStep {
                    previous: (i > first).then(|| &args[i - 1][..]),
                    room: u64::MAX,
                    touch,
                };
                store.count_prefix_hit(args.slot(i), &args[i], now, &step);
            }
        };
        if target == shard.id {
            job(&mut shard.store.lock());
        } else if let Err(job) = shard.read_now(target, job) {
            let _ = shard.post(target, Box::new(move |s: &Shard| job(&mut s.store.lock())));
        }
    }
}

/// Unregisters a blocked reader's watches when dropped: on wake-up, on
/// timeout, and when the client disconnects mid-wait.
struct WatchGuard {
    shard: Rc<Shard>,
    keys: PrefixKeys,
    /// How many leading keys have watches.
    count: usize,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let id = self.id;
        let per_shard = self.keys.per_shard(&self.shard, self.count);
        for (target, work) in per_shard.into_iter().enumerate() {
            if work.is_empty() {
                continue;
            }
            let args = Arc::clone(&self.keys.args);
            let _ = self.shard.post(
                target,
                Box::new(move |s: &Shard| {
                    let mut store = s.store.lock();
                    for (_, i) in work {
                        store.unwatch(&args[i], id);
                    }
                }),
            );
        }
    }
}

/// Source of blocked-reader ids (unique across shards).
static NEXT_WAITER: AtomicU64 = AtomicU64::new(1);

/// MGETPREFIX's arguments.
/// MGETPREFIX's arguments.
pub(crate) struct PrefixRead {
    pub(crate) end: usize,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) block_ms: Option<u64>,
    pub(crate) min: usize,
}

/// Parses MGETPREFIX's count and options.
pub(crate) fn parse_prefix_read(args: &[Bytes]) -> Result<PrefixRead, Reply> {
    let (n, end) = parse_count(args, 1, "numkeys")?;
    let mut read = PrefixRead {
        end,
        max_bytes: None,
        block_ms: None,
        min: n,
    };
    let mut i = end;
    while i < args.len() {
        let value = args.get(i + 1);
        if is(&args[i], "maxbytes") && value.is_some() && read.max_bytes.is_none() {
            match value.and_then(|v| parse_int(v)) {
                Some(b) if b >= 0 => read.max_bytes = Some(b as u64),
                Some(_) => return Err(Reply::error("ERR MAXBYTES must not be negative")),
                None => return Err(not_integer()),
            }
            i += 2;
        } else if is(&args[i], "block") && value.is_some() && read.block_ms.is_none() {
            match value.and_then(|v| parse_int(v)) {
                Some(ms) if ms > 0 => read.block_ms = Some(ms as u64),
                Some(_) => return Err(Reply::error("ERR timeout must be greater than 0")),
                None => {
                    return Err(Reply::error(
                        "ERR timeout is not an integer or out of range",
                    ))
                }
            }
            i += 2;
            if i + 1 < args.len() && is(&args[i], "min") {
                match parse_int(&args[i + 1]) {
                    Some(m) if m >= 1 && m as usize <= n => read.min = m as usize,
                    Some(_) => return Err(Reply::error("ERR MIN must be between 1 and numkeys")),
                    None => return Err(not_integer()),
                }
                i += 2;
            }
        } else {
            return Err(syntax_error());
        }
    }
    Ok(read)
}

fn mgetprefix(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let PrefixRead {
            end,
            max_bytes,
            block_ms,
            min,
        } = match parse_prefix_read(&args) {
            Ok(read) => read,
            Err(e) => return e,
        };
        let keys = PrefixKeys {
            args: Arc::new(args),
            first: 2,
            end,
        };
        let shard = Rc::clone(&client.shard);
        let values = match block_ms {
            None => read_values(&shard, &keys, Watch::No).await,
            Some(ms) => {
                let Some(_seat) = BlockedSeat::take(&shard.shared) else {
                    shard.stats.borrow_mut().blocked_clients_refused += 1;
                    return Reply::error(
                        "ERR max number of blocked clients reached (max-blocked-clients)",
                    );
                };
                let cap = shard.shared.config.num(Num::MaxBlockMs).max(1);
                blocking_read(&shard, &keys, min, Duration::from_millis(ms.min(cap))).await
            }
        };
        let Some(values) = values else {
            return Reply::from(ShardGone);
        };
        let found = leading(values, max_bytes);
        touch_returned(&shard, &keys, found.len(), !client.no_touch);
        // Blocks still on disk are awaited by the connection; one that
        // fails its checksum ends the prefix there.
        Reply::PrefixOf(found.into_iter().map(value_reply).collect())
    })
}

/// MGETPREFIX BLOCK: reads, and while fewer than `min` leading keys are
/// present, waits (up to `timeout`) for writes of the missing ones.
async fn blocking_read(
    shard: &Rc<Shard>,
    keys: &PrefixKeys,
    min: usize,
    timeout: Duration,
) -> Option<Vec<Option<Fetched>>> {
    let deadline = kvtier_timer::deadline_after(timeout);
    let waiter = Waiter {
        id: NEXT_WAITER.fetch_add(1, Relaxed),
        wake: Arc::new(Notify::new()),
    };
    let present = |values: &[Option<Fetched>]| values.iter().take_while(|v| v.is_some()).count();
    // The guard exists before any shard is asked to register: if the client
    // goes away while the registering read is in flight, this future is
    // dropped mid-read, and the guard's unwatch jobs, queued behind the
    // register jobs in each shard's mailbox, still remove them.
    let _guard = WatchGuard {
        shard: Rc::clone(shard),
        keys: keys.clone(),
        count: min,
        id: waiter.id,
    };
    // Reading and registering happen in one step on each shard, so a write
    // landing in between cannot be missed.
    let register = Watch::Register {
        waiter: waiter.clone(),
        below: min,
    };
    let mut values = read_values(shard, keys, register).await?;
    if present(&values) >= min {
        return Some(values);
    }
    shard.stats.borrow_mut().blocked_clients += 1;
    let _unblocked = BlockedCount(Rc::clone(shard));
    loop {
        let woke = kvtier_timer::timeout_at(deadline, waiter.wake.notified()).await;
        values = read_values(shard, keys, Watch::No).await?;
        if present(&values) >= min || woke.is_err() {
            return Some(values);
        }
    }
}

/// One of the `max-blocked-clients` seats, held while a client may block.
struct BlockedSeat(Arc<crate::shared::Shared>);

impl BlockedSeat {
    /// A seat, unless every one is taken.
    fn take(shared: &Arc<crate::shared::Shared>) -> Option<BlockedSeat> {
        let max = shared.config.num(Num::MaxBlockedClients);
        let before = shared.blocked.fetch_add(1, Relaxed);
        if max > 0 && before >= max {
            shared.blocked.fetch_sub(1, Relaxed);
            return None;
        }
        Some(BlockedSeat(Arc::clone(shared)))
    }
}

impl Drop for BlockedSeat {
    fn drop(&mut self) {
        self.0.blocked.fetch_sub(1, Relaxed);
    }
}

/// Keeps INFO's blocked_clients right however the wait ends.
struct BlockedCount(Rc<Shard>);

impl Drop for BlockedCount {
    fn drop(&mut self) {
        self.0.stats.borrow_mut().blocked_clients -= 1;
    }
}

// ---- PREFIXLEN and MEXISTS -------------------------------------------------------

/// PREFIXLEN's `numkeys` and its `HOLD ms` (capped at `max-hold-ms`).
pub(crate) fn parse_prefixlen(args: &[Bytes]) -> Result<(usize, Option<u64>), Reply> {
    let (n, end) = parse_count(args, 1, "numkeys")?;
    match &args[end..] {
        [] => Ok((n, None)),
        [hold, ms] if is(hold, "hold") => match parse_int(ms) {
            Some(ms) if ms > 0 => Ok((n, Some(ms as u64))),
            Some(_) => Err(Reply::error("ERR HOLD must be greater than 0")),
            None => Err(not_integer()),
        },
        _ => Err(syntax_error()),
    }
}

/// For [`OneShard::applies`]: PREFIXLEN without HOLD (a hold needs the
/// client and the limits).
fn no_hold(args: &[Bytes]) -> bool {
    !args.iter().skip(2).any(|a| is(a, "hold"))
}

fn prefixlen(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let (n, hold_ms) = match parse_prefixlen(&args) {
            Ok(found) => found,
            Err(e) => return e,
        };
        let shard = &client.shard;
        let config = &shard.shared.config;
        let hold = hold_ms.map(|ms| {
            let ms = ms.min(config.num(Num::MaxHoldMs).max(1));
            (now_ms() + ms, config.hold_limits(shard.count()))
        });
        let holder = client.id();
        let keys = PrefixKeys {
            args: Arc::new(args),
            first: 2,
            end: 2 + n,
        };
        let mut pending = Vec::new();
        for (target, work) in keys.per_shard(shard, n).into_iter().enumerate() {
            if work.is_empty() {
                continue;
            }
            let args = Arc::clone(&keys.args);
            // Each shard reports its first missing position (side-effect
            // free but for HOLD: no recency, no hit/miss counting). With
            // HOLD, a key present but past a hold limit counts as missing:
            // the count covers only what is held.
            pending.push(shard.with_store(target, Access::Read, move |store| {
                let now = now_ms();
                work.into_iter()
                    .find(|&(_, i)| match hold {
                        None => store.peek(args.slot(i), &args[i], now).is_none(),
                        Some((until, limits)) => {
                            !store.hold(args.slot(i), &args[i], holder, until, now, limits)
                        }
                    })
                    .map(|(pos, _)| pos)
            }));
        }
        let mut prefix = n;
        for p in pending {
            match p.await {
                Ok(Some(first_missing)) => prefix = prefix.min(first_missing),
                Ok(None) => {}
                Err(_) => return Reply::from(ShardGone),
            }
        }
        Reply::Int(prefix as i64)
    })
}

fn mexists(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = Arc::new(args);
        let (n, end) = match parse_count(&args, 1, "numkeys") {
            Ok(found) => found,
            Err(e) => return e,
        };
        if end != args.len() {
            return syntax_error();
        }
        let keys: Vec<usize> = (2..2 + n).collect();
        let Ok(mut present) = fan_out(
            client,
            &args,
            &keys,
            Access::Read,
            |store, slot, key, _, now| store.read(slot, key, now, false).is_some(),
        )
        .await
        else {
            return Reply::from(ShardGone);
        };
        // The shards are read in parallel, so block i-1 may have been read a
        // moment before a chain writer stored it and block i a moment after:
        // a gap the writer never let exist. Absent keys that come before a
        // present one are read again once every first read is done; by then
        // any predecessor of a block seen present has been published.
        let last_present = present.iter().rposition(|&p| p).unwrap_or(0);
        let recheck: Vec<usize> = (0..last_present)
            .filter(|&i| !present[i])
            .map(|i| 2 + i)
            .collect();
        if !recheck.is_empty() {
            let again = fan_out(
                client,
                &args,
                &recheck,
                Access::Read,
                |store, slot, key, _, now| store.peek(slot, key, now).is_some(),
            )
            .await;
            let Ok(again) = again else {
                return Reply::from(ShardGone);
            };
            for (i, p) in recheck.into_iter().zip(again) {
                present[i - 2] = p;
            }
        }
        Reply::Array(present.into_iter().map(|p| Reply::Int(p as i64)).collect())
    })
}

// ---- single-shard forms ---------------------------------------------------
//
// When every key of a call lives on one shard, the connection runs these on
// that shard's store directly (batched with the rest of a pipeline, inline
// when the shard is its own): no fan-out, and the whole call is one atomic
// step.

/// MGETPREFIX without BLOCK may run on one shard.
fn no_block(args: &[Bytes]) -> bool {
    !args.iter().skip(2).any(|a| is(a, "block"))
}

fn mgetprefix_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let read = match parse_prefix_read(&op.args) {
        Ok(read) => read,
        Err(e) => return e,
    };
    let mut room = read.max_bytes.unwrap_or(u64::MAX);
    let mut out = Vec::new();
    let mut previous: Option<&[u8]> = None;
    for i in 2..read.end {
        let (key, slot) = (&op.args[i], op.args.slot(i));
        // Counted (and, unless NO-TOUCH, touched) as accessed: one lookup.
        let step = PrefixStep {
            previous,
            room,
            touch: op.touch,
        };
        let InPrefix::Value(value) = store.read_in_prefix(slot, key, now, &step) else {
            break;
        };
        room -= value.len() as u64;
        out.push(value_reply(value));
        previous = Some(key);
    }
    Reply::PrefixOf(out)
}

fn prefixlen_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let (_, end) = match parse_count(&op.args, 1, "numkeys") {
        Ok(found) => found,
        Err(e) => return e,
    };
    if end != op.args.len() {
        return syntax_error();
    }
    let present = (2..end)
        .take_while(|&i| store.contains(op.args.slot(i), &op.args[i], now))
        .count();
    Reply::Int(present as i64)
}

fn mexists_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let (_, end) = match parse_count(&op.args, 1, "numkeys") {
        Ok(found) => found,
        Err(e) => return e,
    };
    if end != op.args.len() {
        return syntax_error();
    }
    Reply::Array(
        (2..end)
            .map(|i| {
                let found = store.read(op.args.slot(i), &op.args[i], now, false);
                Reply::Int(found.is_some() as i64)
            })
            .collect(),
    )
}

fn msetblock_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    let (n, end) = match parse_count(args, 2, "numblocks") {
        Ok(found) => found,
        Err(e) => return e,
    };
    let opts = match parse_set_options(args, end) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let mut codes = Vec::with_capacity(n);
    let mut failed = false;
    let class = opts.class(n);
    if opts.chain {
        store.begin_chain(None);
    }
    for i in 0..n {
        let (key, value) = (&args[2 + 2 * i], &args[3 + 2 * i]);
        let parent = match (opts.chain, i) {
            (false, _) => None,
            (true, 0) => opts.parent.clone(),
            (true, _) => Some(args[2 * i].clone()),
        };
        let code = if failed {
            -1
        } else {
            let previous_len = i.checked_sub(1).map(|p| args[3 + 2 * p].len());
            let write = BlockWrite {
                expire_at: opts.expire_at,
                parent,
                replace: opts.replace,
                cold: opts.cold(i, n, value.len(), previous_len),
                class,
            };
            store.insert_block(args.slot(2 + 2 * i), key, value.clone(), write, now)
        };
        // In a chain, nothing after a block that could not be stored.
        failed |= opts.chain && code < 0;
        codes.push(Reply::Int(code));
    }
    Reply::Array(codes)
}

// ---- answered from copies of hot keys (cluster) -----------------------------

fn copy_mexists(values: &[&Bytes], _args: &[Bytes]) -> Option<Reply> {
    Some(Reply::Array(values.iter().map(|_| Reply::Int(1)).collect()))
}

/// A hold is taken on the owner: copies answer PREFIXLEN without HOLD only.
fn copy_prefixlen(values: &[&Bytes], args: &[Bytes]) -> Option<Reply> {
    no_hold(args).then(|| Reply::Int(values.len() as i64))
}

/// Every key has a copy, so BLOCK has nothing to wait for; MAXBYTES cuts
/// the prefix as the owner would.
fn copy_mgetprefix(values: &[&Bytes], args: &[Bytes]) -> Option<Reply> {
    let read = parse_prefix_read(args).ok()?;
    let mut total = 0u64;
    let items = values
        .iter()
        .take_while(|v| {
            total += v.len() as u64;
            read.max_bytes.is_none_or(|m| total <= m)
        })
        .map(|v| Reply::Bulk((*v).clone()))
        .collect();
    Some(Reply::Array(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ').map(|w| Bytes::from(w.to_string())).collect()
    }

    #[test]
    fn counts_and_options() {
        assert_eq!(
            parse_count(&args("mgetprefix 2 a b"), 1, "numkeys").unwrap(),
            (2, 4)
        );
        assert_eq!(
            parse_count(&args("msetblock 1 a 1 CHAIN"), 2, "numblocks").unwrap(),
            (1, 4)
        );
        assert_eq!(
            parse_count(&args("mgetprefix 3 a b"), 1, "numkeys").unwrap_err(),
            syntax_error()
        );
        assert_eq!(
            parse_count(&args("mgetprefix 0 a"), 1, "numkeys").unwrap_err(),
            Reply::error("ERR numkeys should be greater than 0")
        );
        assert_eq!(
            parse_count(&args("mgetprefix x a"), 1, "numkeys").unwrap_err(),
            not_integer()
        );
        let o = parse_set_options(&args("msetblock 1 a 1 CHAIN PARENT p REPLACE"), 4)
            .ok()
            .unwrap();
        assert!(o.chain && o.replace);
        assert_eq!(o.parent.as_deref(), Some(&b"p"[..]));
        assert!(parse_set_options(&args("msetblock 1 a 1 PARENT p"), 4).is_err());
        assert!(parse_set_options(&args("msetblock 1 a 1 EX 1 PX 1"), 4).is_err());
        assert!(parse_set_options(&args("msetblock 1 a 1 bogus"), 4).is_err());
        let o = parse_set_options(&args("msetblock 1 a 1 partial CHAIN"), 4)
            .ok()
            .unwrap();
        assert!(o.partial && o.chain && o.parent.is_none());
        assert!(parse_set_options(&args("msetblock 1 a 1 CHAIN PARTIAL PARTIAL"), 4).is_err());
        assert!(
            parse_set_options(&args("msetblock 1 a 1 PARTIAL"), 4).is_err(),
            "PARTIAL without CHAIN"
        );
        // Only the last block of a call is cold: flagged, or (in a chain)
        // shorter than the one before it.
        assert!(o.cold(2, 3, 100, Some(100)) && !o.cold(1, 3, 100, Some(100)));
        let o = parse_set_options(&args("msetblock 1 a 1 CHAIN"), 4)
            .ok()
            .unwrap();
        assert!(o.cold(2, 3, 50, Some(100)) && !o.cold(2, 3, 100, Some(100)));
        assert!(!o.cold(0, 1, 50, None));
        let o = parse_set_options(&args("msetblock 1 a 1"), 4).ok().unwrap();
        assert!(!o.cold(2, 3, 50, Some(100)), "no chain: no last block");
    }

    #[test]
    fn leading_respects_gaps_and_max_bytes() {
        let v = |s: &str| Some(Fetched::Now(Bytes::from(s.to_string())));
        let values = || vec![v("aa"), v("bb"), None, v("cc")];
        assert_eq!(leading(values(), None).len(), 2);
        assert_eq!(leading(values(), Some(3)).len(), 1);
        assert_eq!(leading(values(), Some(0)).len(), 0);
    }
}
