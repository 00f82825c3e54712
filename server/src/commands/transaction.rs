//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH.
//!
//! Between MULTI and EXEC the connection queues commands (replying `QUEUED`;
//! see `net::connection`). EXEC runs them in order and replies with the array
//! of their replies. When every queued command is a single-key command of one
//! shard, EXEC runs them — and checks WATCH — in one job on that shard, so no
//! other client's command can come in between, as in Redis. A transaction
//! whose keys span shards runs command by command: each command is atomic,
//! the whole is not (documented in docs/commands.md).
//!
//! WATCH registers the client's "dirty" flag on each key's shard; any change
//! to the key (write, delete, expiry, flush) sets it, and EXEC then replies
//! with a null array without running anything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use kvtier_protocol::Reply;
use kvtier_store::{mono_ns, now_ms};

use super::flags::*;
use super::Transaction;
use super::{
    execute, Args, Client, CommandSpec, Handler, LocalBoxFuture, ShardOp, ALL_KEYS, DEFAULTS,
};
use crate::acl::{category, KeyUse};
use crate::shard::slot::key_slot;
use crate::shard::ShardGone;

const BASE: CommandSpec = CommandSpec {
    flags: NOSCRIPT | LOADING | STALE | FAST,
    group: "transactions",
    since: "1.2.0",
    categories: category::TRANSACTION,
    ..DEFAULTS
};

/// The transactions family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "multi",
        summary: "Starts a transaction.",
        handler: Handler::Sync(multi),
        flags: BASE.flags | TX_NOW,
        ..BASE
    },
    CommandSpec {
        name: "exec",
        flags: NOSCRIPT | LOADING | STALE | TX_NOW,
        summary: "Executes all commands in a transaction.",
        complexity: "Depends on commands in the transaction",
        handler: Handler::Async(exec),
        ..BASE
    },
    CommandSpec {
        name: "discard",
        since: "2.0.0",
        summary: "Discards a transaction.",
        complexity: "O(N), when N is the number of queued commands",
        handler: Handler::Sync(discard),
        flags: BASE.flags | TX_NOW,
        ..BASE
    },
    CommandSpec {
        name: "watch",
        key_use: KeyUse::Exists,
        arity: -2,
        keys: ALL_KEYS,
        since: "2.2.0",
        summary: "Monitors changes to keys to determine the execution of a transaction.",
        complexity: "O(1) for every key.",
        syntax: "key...",
        handler: Handler::Async(watch),
        flags: BASE.flags | TX_NOW | HERE,
        ..BASE
    },
    CommandSpec {
        name: "unwatch",
        since: "2.2.0",
        summary: "Forgets about watched keys of a transaction.",
        handler: Handler::Sync(unwatch),
        ..BASE
    },
];

fn multi(client: &mut Client, _args: &[Bytes]) -> Reply {
    if client.multi.is_some() {
        return Reply::error("ERR MULTI calls can not be nested");
    }
    client.multi = Some(Transaction::default());
    Reply::ok()
}

fn discard(client: &mut Client, _args: &[Bytes]) -> Reply {
    if client.multi.take().is_none() {
        return Reply::error("ERR DISCARD without MULTI");
    }
    client.watching.clear();
    Reply::ok()
}

fn unwatch(client: &mut Client, _args: &[Bytes]) -> Reply {
    client.watching.clear();
    Reply::ok()
}

fn watch(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if client.multi.is_some() {
            return Reply::error("ERR WATCH inside MULTI is not allowed");
        }
        let id = client.id();
        for key in &args[1..] {
            let slot = key_slot(key);
            let owner = client.shard.owner_of(slot);
            let (key, dirty) = (key.clone(), Arc::clone(&client.watching.dirty));
            let registered = client
                .shard
                .call(owner, {
                    let key = key.clone();
                    move |s| s.store.lock().watch_changes(&key, id, dirty)
                })
                .await;
            if registered.is_err() {
                return Reply::from(ShardGone);
            }
            client.watching.noted(key);
        }
        Reply::ok()
    })
}

fn exec(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let Some(tx) = client.multi.take() else {
            return Reply::error("ERR EXEC without MULTI");
        };
        let dirty = Arc::clone(&client.watching.dirty);
        if tx.failed {
            client.watching.clear();
            return Reply::error("EXECABORT Transaction discarded because of previous errors.");
        }
        // Permissions are checked again: the user's rules may have changed
        // since the commands were queued (as Redis does). Nothing to check
        // (no list) for a user allowed everything.
        let mut refused: Vec<Option<Reply>> = Vec::new();
        if !client.user.unrestricted() {
            refused = tx
                .queued
                .iter()
                .map(|(id, spec, args)| super::session::recheck(client, *id, spec, args))
                .collect();
        }
        let reply = if let Some(owner) =
            single_shard(client, &tx).filter(|_| refused.iter().all(Option::is_none))
        {
            run_on_one_shard(client, owner, tx, Arc::clone(&dirty)).await
        } else if dirty.load(Ordering::Acquire) {
            Reply::NilArray
        } else {
            let mut replies = Vec::with_capacity(tx.queued.len());
            for (i, (id, spec, args)) in tx.queued.into_iter().enumerate() {
                replies.push(match refused.get_mut(i).and_then(Option::take) {
                    Some(e) => e,
                    None => run_one(client, id, spec, args).await,
                });
            }
            Reply::Array(replies)
        };
        client.watching.clear();
        reply
    })
}

/// The shard every queued command runs on, when all are single-key commands
/// of one shard.
fn single_shard(client: &Client, tx: &Transaction) -> Option<usize> {
    let mut owner = None;
    for (_, spec, args) in &tx.queued {
        if !matches!(spec.handler, Handler::Key(_)) {
            return None;
        }
        let shard = client.shard.owner_of(args.slot(spec.keys.first as usize));
        if owner.is_some_and(|o| o != shard) {
            return None;
        }
        owner = Some(shard);
    }
    owner
}

/// Runs the whole transaction in one job on `owner`: atomic, WATCH checked
/// in the same step.
async fn run_on_one_shard(
    client: &Client,
    owner: usize,
    tx: Transaction,
    dirty: Arc<AtomicBool>,
) -> Reply {
    let ops: Vec<(usize, ShardOp)> = tx
        .queued
        .into_iter()
        .filter_map(|(id, spec, args)| match spec.handler {
            Handler::Key(f) => Some((
                id,
                ShardOp::new(client, spec, f, args, spec.keys.first as usize),
            )),
            _ => None,
        })
        .collect();
    let done = client
        .shard
        .call(owner, move |s| {
            if dirty.load(Ordering::Acquire) {
                return Reply::NilArray;
            }
            let mut store = s.store.lock();
            let mut stats = s.stats.borrow_mut();
            let now = now_ms();
            let replies = ops
                .into_iter()
                .map(|(id, op)| {
                    let started = mono_ns();
                    let reply = op.run(&mut store, now);
                    stats.record(id, mono_ns() - started, reply.is_error());
                    reply
                })
                .collect();
            Reply::Array(replies)
        })
        .await;
    done.unwrap_or_else(|_| Reply::from(ShardGone))
}

/// Runs one queued command outside the connection's batching.
async fn run_one(client: &mut Client, id: usize, spec: &'static CommandSpec, args: Args) -> Reply {
    let started = mono_ns();
    let reply = execute(client, spec, args).await;
    client
        .shard
        .stats
        .borrow_mut()
        .record(id, mono_ns() - started, reply.is_error());
    reply
}
