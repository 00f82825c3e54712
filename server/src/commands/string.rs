//! String commands: GET, SET and friends, counters, ranges, MGET/MSET.
//!
//! Blocks are plain strings, so these are also the commands an unmodified
//! Redis client uses on kvtier's blocks.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::Reply;
use kvtier_store::{Encoding, OutOfMemory, Store};

use super::flags::*;
use super::long_double::LongDouble;
use super::value_reply;
use super::{
    always, arity_error, clamp, is, not_integer, oom_error, parse_int, store_raw, syntax_error,
    Args, Client, CommandSpec, Handler, KeyOp, LocalBoxFuture, OneShard, Spread, DEFAULTS, KEY1,
    KEY_VALUE_PAIRS,
};
use super::{expire_at_from, fan_out, Fanned};
use crate::acl::{category, perm, KeyUse};
use crate::shard::{Access, ShardGone};

const BASE: CommandSpec = CommandSpec {
    arity: 2,
    flags: READONLY | FAST,
    keys: KEY1,
    group: "string",
    syntax: "key",
    categories: category::STRING,
    ..DEFAULTS
};

/// The string family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "get",
        summary: "Returns the string value of a key.",
        handler: Handler::Key(get),
        from_copies: Some(copy_get),
        ..BASE
    },
    CommandSpec {
        name: "set",
        key_use: KeyUse::ByArgs(set_key_use),
        arity: -3,
        flags: WRITE | DENYOOM,
        summary: "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.",
        syntax: "key value [NX|XX] [GET] [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|KEEPTTL]",
        handler: Handler::Key(set),
        ..BASE
    },
    CommandSpec {
        name: "setnx",
        key_use: KeyUse::Write,
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        summary: "Set the string value of a key only when the key doesn't exist.",
        syntax: "key value",
        handler: Handler::Key(setnx),
        ..BASE
    },
    CommandSpec {
        name: "setex",
        key_use: KeyUse::Write,
        arity: 4,
        flags: WRITE | DENYOOM,
        since: "2.0.0",
        summary: "Sets the string value and expiration time of a key. Creates the key if it doesn't exist.",
        syntax: "key seconds value",
        handler: Handler::Key(setex),
        ..BASE
    },
    CommandSpec {
        name: "psetex",
        key_use: KeyUse::Write,
        arity: 4,
        flags: WRITE | DENYOOM,
        since: "2.6.0",
        summary: "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist.",
        syntax: "key milliseconds value",
        handler: Handler::Key(psetex),
        ..BASE
    },
    CommandSpec {
        name: "getex",
        arity: -2,
        flags: WRITE | FAST,
        since: "6.2.0",
        summary: "Returns the string value of a key after setting its expiration time.",
        syntax: "key [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|PERSIST]",
        handler: Handler::Key(getex),
        ..BASE
    },
    CommandSpec {
        name: "getdel",
        flags: WRITE | FAST,
        since: "6.2.0",
        summary: "Returns the string value of a key after deleting the key.",
        handler: Handler::Key(getdel),
        ..BASE
    },
    CommandSpec {
        name: "getset",
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        summary: "Returns the previous string value of a key after setting it to a new value.",
        syntax: "key value",
        handler: Handler::Key(getset),
        ..BASE
    },
    CommandSpec {
        name: "mget",
        arity: -2,
        flags: READONLY | FAST,
        keys: super::ALL_KEYS,
        summary: "Atomically returns the string values of one or more keys.",
        complexity: "O(N) where N is the number of keys to retrieve.",
        syntax: "key...",
        handler: Handler::Async(mget),
        one_shard: Some(OneShard {
            run: mget_one,
            applies: always,
        }),
        spread: Spread::ByPosition,
        from_copies: Some(copy_mget),
        ..BASE
    },
    CommandSpec {
        name: "mset",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | DENYOOM,
        keys: KEY_VALUE_PAIRS,
        since: "1.0.1",
        summary: "Atomically creates or modifies the string values of one or more keys.",
        complexity: "O(N) where N is the number of keys to set.",
        syntax: "(key value)...",
        handler: Handler::Async(mset),
        one_shard: Some(OneShard {
            run: mset_one,
            applies: always,
        }),
        spread: Spread::AllOk,
        ..BASE
    },
    CommandSpec {
        name: "msetnx",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | DENYOOM,
        keys: KEY_VALUE_PAIRS,
        since: "1.0.1",
        summary: "Atomically modifies the string values of one or more keys only when all keys don't exist.",
        complexity: "O(N) where N is the number of keys to set.",
        syntax: "(key value)...",
        handler: Handler::Async(msetnx),
        one_shard: Some(OneShard {
            run: msetnx_one,
            applies: always,
        }),
        ..BASE
    },
    CommandSpec {
        name: "append",
        key_use: KeyUse::Write,
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        since: "2.0.0",
        summary: "Appends a string to the value of a key. Creates the key if it doesn't exist.",
        syntax: "key value",
        handler: Handler::Key(append),
        ..BASE
    },
    CommandSpec {
        name: "strlen",
        key_use: KeyUse::Exists,
        since: "2.2.0",
        summary: "Returns the length of a string value.",
        handler: Handler::Key(strlen),
        from_copies: Some(copy_strlen),
        ..BASE
    },
    CommandSpec {
        name: "getrange",
        arity: 4,
        flags: READONLY,
        since: "2.4.0",
        summary: "Returns a substring of the string stored at a key.",
        complexity: "O(N) where N is the length of the returned string.",
        syntax: "key start end",
        handler: Handler::Key(getrange),
        from_copies: Some(copy_getrange),
        ..BASE
    },
    CommandSpec {
        name: "substr",
        arity: 4,
        flags: READONLY,
        summary: "Returns a substring from a string value.",
        complexity: "O(N) where N is the length of the returned string.",
        syntax: "key start end",
        handler: Handler::Key(getrange),
        from_copies: Some(copy_getrange),
        ..BASE
    },
    CommandSpec {
        name: "setrange",
        key_use: KeyUse::Write,
        arity: 4,
        flags: WRITE | DENYOOM,
        since: "2.2.0",
        summary: "Overwrites a part of a string value with another by an offset. Creates the key if it doesn't exist.",
        complexity: "O(1), not counting the time taken to copy the new string in place.",
        syntax: "key offset value",
        handler: Handler::Key(setrange),
        ..BASE
    },
    CommandSpec {
        name: "incr",
        flags: WRITE | DENYOOM | FAST,
        summary: "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.",
        handler: Handler::Key(incr),
        ..BASE
    },
    CommandSpec {
        name: "decr",
        flags: WRITE | DENYOOM | FAST,
        summary: "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.",
        handler: Handler::Key(decr),
        ..BASE
    },
    CommandSpec {
        name: "incrby",
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        summary: "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.",
        syntax: "key increment",
        handler: Handler::Key(incrby),
        ..BASE
    },
    CommandSpec {
        name: "decrby",
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        summary: "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.",
        syntax: "key decrement",
        handler: Handler::Key(decrby),
        ..BASE
    },
    CommandSpec {
        name: "incrbyfloat",
        arity: 3,
        flags: WRITE | DENYOOM | FAST,
        since: "2.6.0",
        summary: "Increment the floating point value of a key by a number. Uses 0 as initial value if the key doesn't exist.",
        syntax: "key increment:double",
        handler: Handler::Key(incrbyfloat),
        ..BASE
    },
    CommandSpec {
        name: "lcs",
        arity: -3,
        flags: READONLY,
        keys: super::KeySpec::range(1, 2, 1),
        since: "7.0.0",
        summary: "Finds the longest common substring.",
        complexity: "O(N*M) where N and M are the lengths of s1 and s2, respectively",
        syntax: "key1:string key2:string [LEN] [IDX] [MINMATCHLEN min-match-len:integer] [WITHMATCHLEN]",
        handler: Handler::Async(lcs),
        ..BASE
    },
];

/// Which command [`ExtendedOptions::parse`] reads options for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OptionsOf {
    Set,
    GetEx,
}

/// The options of SET and GETEX, read as Redis's
/// `parseExtendedStringArgumentsOrReply` reads them: a flag may be repeated,
/// a repeated expiry option replaces the earlier value, options that exclude
/// each other are a syntax error, and the expiry value is only checked once
/// the whole line has parsed (so `EX abc FOO` is a syntax error).
#[derive(Default)]
struct ExtendedOptions<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keep_ttl: bool,
    persist: bool,
    /// The expiry option (`EX`, `PX`, `EXAT` or `PXAT`) and its value.
    expire: Option<(&'a [u8], &'a [u8])>,
}

impl<'a> ExtendedOptions<'a> {
    fn parse(args: &'a [Bytes], from: usize, of: OptionsOf) -> Result<Self, Reply> {
        let mut o = ExtendedOptions::default();
        let set = of == OptionsOf::Set;
        let mut i = from;
        while i < args.len() {
            let a = &args[i][..];
            let next = args.get(i + 1);
            if set && is(a, "nx") && !o.xx {
                o.nx = true;
            } else if set && is(a, "xx") && !o.nx {
                o.xx = true;
            } else if set && is(a, "get") {
                o.get = true;
            } else if set && is(a, "keepttl") && !o.persist && o.expire.is_none() {
                o.keep_ttl = true;
            } else if !set && is(a, "persist") && !o.keep_ttl && o.expire.is_none() {
                o.persist = true;
            } else if ["ex", "px", "exat", "pxat"].iter().any(|u| is(a, u))
                && !o.keep_ttl
                && !o.persist
                && o.expire
                    .is_none_or(|(unit, _)| unit.eq_ignore_ascii_case(a))
                && next.is_some()
            {
                o.expire = next.map(|v| (a, &v[..]));
                i += 1;
            } else {
                return Err(syntax_error());
            }
            i += 1;
        }
        Ok(o)
    }

    /// The absolute expiry the options ask for, if any, checked as Redis's
    /// `getExpireMillisecondsOrReply` checks it.
    fn expire_at(&self, command: &str, now: u64) -> Result<Option<u64>, Reply> {
        self.expire
            .map(|(unit, value)| expire_at_from(unit, value, command, now))
            .transpose()
    }
}

/// OOM, or the error a write that exceeds the budget gets.
fn stored(result: Result<Option<kvtier_store::Entry>, OutOfMemory>) -> Result<(), Reply> {
    result.map(|_| ()).map_err(|_| oom_error())
}

fn get(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    store
        .read_value(op.slot, op.key(), now, op.touch)
        .map_or(Reply::Nil, value_reply)
}

#[derive(PartialEq)]
enum Condition {
    Always,
    IfAbsent,
    IfPresent,
}

fn set(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    let options = match ExtendedOptions::parse(args, 3, OptionsOf::Set) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let expire = match options.expire_at("set", now) {
        Ok(at) => at,
        Err(e) => return e,
    };
    let (want_old, keep_ttl) = (options.get, options.keep_ttl);
    let condition = if options.nx {
        Condition::IfAbsent
    } else if options.xx {
        Condition::IfPresent
    } else {
        Condition::Always
    };
    let (slot, key) = (op.slot, op.key());
    let old = store.peek(slot, key, now).map(|e| e.expire_at);
    // SET ... GET: the old value (a spilled one is read before it goes).
    let old_reply = if want_old {
        store.fetch(slot, key, now).map(value_reply)
    } else {
        None
    };
    let old_value = || old_reply.clone().unwrap_or(Reply::Nil);
    let blocked = match condition {
        Condition::IfAbsent => old.is_some(),
        Condition::IfPresent => old.is_none(),
        Condition::Always => false,
    };
    if blocked {
        return if want_old { old_value() } else { Reply::Nil };
    }
    let expire_at = match (expire, keep_ttl) {
        (Some(at), _) => at,
        (None, true) => old.unwrap_or(0),
        (None, false) => 0,
    };
    if expire_at != 0 && expire_at <= now {
        // Already expired: the key ends up absent, as in Redis.
        if store.remove(slot, key).is_some() {
            store.stats.expired_keys += 1;
        }
    } else if let Err(e) = stored(store.insert(slot, key, args[2].clone(), expire_at, now)) {
        return e;
    }
    if want_old {
        old_value()
    } else {
        Reply::ok()
    }
}

fn setnx(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    if store.peek(op.slot, op.key(), now).is_some() {
        return Reply::Int(0);
    }
    match stored(store.insert(op.slot, op.key(), op.args[2].clone(), 0, now)) {
        Ok(()) => Reply::Int(1),
        Err(e) => e,
    }
}

fn set_with_ttl(store: &mut Store, op: &KeyOp, now: u64, unit: &str, name: &str) -> Reply {
    let at = match expire_at_from(unit.as_bytes(), &op.args[2], name, now) {
        Ok(at) => at,
        Err(e) => return e,
    };
    match stored(store.insert(op.slot, op.key(), op.args[3].clone(), at, now)) {
        Ok(()) => Reply::ok(),
        Err(e) => e,
    }
}

fn setex(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    set_with_ttl(store, op, now, "ex", "setex")
}

fn psetex(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    set_with_ttl(store, op, now, "px", "psetex")
}

fn getex(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let options = match ExtendedOptions::parse(&op.args, 2, OptionsOf::GetEx) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let (slot, key) = (op.slot, op.key());
    let Some(value) = store.read_value(slot, key, now, op.touch) else {
        return Reply::Nil;
    };
    // Like Redis, the expiry is checked only once the key is known to exist.
    // None: leave the TTL; Some(0): persist; Some(t): expire at t.
    let new_expiry = match options.expire_at("getex", now) {
        Ok(Some(at)) => Some(at),
        Ok(None) if options.persist => Some(0),
        Ok(None) => None,
        Err(e) => return e,
    };
    match new_expiry {
        Some(at) if at != 0 && at <= now => {
            store.remove(slot, key);
            store.stats.expired_keys += 1;
        }
        Some(at) => {
            store.set_expire(slot, key, at, now);
        }
        None => {}
    }
    value_reply(value)
}

fn getdel(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let Some(value) = store.read_value(op.slot, op.key(), now, op.touch) else {
        return Reply::Nil;
    };
    store.remove(op.slot, op.key());
    value_reply(value)
}

fn getset(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let old = store.read_value(op.slot, op.key(), now, op.touch);
    match stored(store.insert(op.slot, op.key(), op.args[2].clone(), 0, now)) {
        Ok(()) => old.map_or(Reply::Nil, value_reply),
        Err(e) => e,
    }
}

fn mget_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    Reply::Array(
        (1..op.args.len())
            .map(|i| {
                store
                    .read_value(op.args.slot(i), &op.args[i], now, op.touch)
                    .map_or(Reply::Nil, value_reply)
            })
            .collect(),
    )
}

fn mset_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    if args.len().is_multiple_of(2) {
        return arity_error("mset");
    }
    for i in (1..args.len()).step_by(2) {
        if store
            .insert(args.slot(i), &args[i], args[i + 1].clone(), 0, now)
            .is_err()
        {
            return oom_error();
        }
    }
    Reply::ok()
}

fn msetnx_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    if args.len().is_multiple_of(2) {
        return arity_error("msetnx");
    }
    // One shard: check and set in one step, atomically.
    let present = (1..args.len())
        .step_by(2)
        .any(|i| store.peek(args.slot(i), &args[i], now).is_some());
    if present {
        return Reply::Int(0);
    }
    for i in (1..args.len()).step_by(2) {
        if store
            .insert(args.slot(i), &args[i], args[i + 1].clone(), 0, now)
            .is_err()
        {
            return oom_error();
        }
    }
    Reply::Int(1)
}

fn mget(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = Arc::new(args);
        let touch = !client.no_touch;
        let keys: Vec<usize> = (1..args.len()).collect();
        let result = fan_out(
            client,
            &args,
            &keys,
            Access::Read,
            move |store, slot, key, _, now| {
                store
                    .read_value(slot, key, now, touch)
                    .map_or(Reply::Nil, value_reply)
            },
        )
        .await;
        match result {
            Ok(values) => Reply::Array(values),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

/// MSET's and MSETNX's arguments: `key value` pairs, or Redis's arity
/// error.
fn pairs(args: Args, name: &str) -> Result<Arc<Args>, Reply> {
    if args.len().is_multiple_of(2) {
        return Err(arity_error(name));
    }
    Ok(Arc::new(args))
}

/// MSET's and MSETNX's write of one pair: `key` set to `value`, no expiry.
fn set_pair(store: &mut Store, slot: u16, key: &[u8], value: Option<&Bytes>, now: u64) -> bool {
    let value = value.cloned().unwrap_or_default();
    store.insert(slot, key, value, 0, now).is_ok()
}

fn mset(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = match pairs(args, "mset") {
            Ok(args) => args,
            Err(e) => return e,
        };
        let keys: Vec<usize> = (1..args.len()).step_by(2).collect();
        let result = fan_out(client, &args, &keys, Access::Write, set_pair).await;
        match result {
            Ok(done) if done.iter().all(|&ok| ok) => Reply::ok(),
            Ok(_) => oom_error(),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

fn msetnx(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = match pairs(args, "msetnx") {
            Ok(args) => args,
            Err(e) => return e,
        };
        // A key named twice is set once, to its last value (as MSET leaves
        // it), and does not count as already present.
        let mut keys: Vec<usize> = Vec::new();
        for i in (1..args.len()).step_by(2).rev() {
            if !keys.iter().any(|&k| args[k] == args[i]) {
                keys.push(i);
            }
        }
        keys.reverse();
        // All keys on one shard: check and set in one step, atomically.
        let result = fan_out(
            client,
            &args,
            &keys,
            Access::Write,
            |store, slot, key, _, now| store.peek(slot, key, now).is_some(),
        )
        .await;
        match result {
            Ok(present) if present.iter().any(|&p| p) => return Reply::Int(0),
            Ok(_) => {}
            Err(_) => return Reply::from(ShardGone),
        }
        let result = fan_out(
            client,
            &args,
            &keys,
            Access::Write,
            |store, slot, key, value, now| {
                if store.peek(slot, key, now).is_some() {
                    Fanned::Skipped
                } else if set_pair(store, slot, key, value, now) {
                    Fanned::Done
                } else {
                    Fanned::Oom
                }
            },
        )
        .await;
        match result {
            Ok(r) if r.contains(&Fanned::Oom) => oom_error(),
            Ok(r) if r.contains(&Fanned::Skipped) => Reply::Int(0),
            Ok(_) => Reply::Int(1),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

/// A string a command is about to build of `len` bytes: within
/// proto-max-bulk-len, and not larger than the shard's whole memory budget
/// (refused with OOM before it is allocated or anything is evicted).
fn check_length(store: &Store, len: u64) -> Result<(), Reply> {
    if len > store.max_value_len() as u64 {
        Err(Reply::error(
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        ))
    } else if !store.could_ever_fit(len as usize) {
        Err(oom_error())
    } else {
        Ok(())
    }
}

fn append(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let (slot, key, tail) = (op.slot, op.key(), &op.args[2]);
    // Changing a value in place needs its bytes: a spilled one is read
    // back first (rare for blocks, which are written once).
    store.materialize(slot, key, now);
    let existing = store
        .peek(slot, key, now)
        .map(|e| (e.value.bytes().unwrap_or_default(), e.expire_at));
    // A new key holds the argument as SET would store it (Redis's
    // tryObjectEncoding: `int` or `embstr` when it can); a grown one is `raw`.
    let (value, expire_at, encoding) = match existing {
        None => (tail.clone(), 0, Encoding::Auto),
        Some((old, at)) => {
            if let Err(e) = check_length(store, (old.len() + tail.len()) as u64) {
                return e;
            }
            let mut joined = BytesMut::with_capacity(old.len() + tail.len());
            joined.extend_from_slice(&old);
            joined.extend_from_slice(tail);
            (joined.freeze(), at, Encoding::Raw)
        }
    };
    let len = value.len() as i64;
    match stored(store.insert_entry(slot, key, value, expire_at, encoding, None, now)) {
        Ok(()) => Reply::Int(len),
        Err(e) => e,
    }
}

fn strlen(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    Reply::Int(
        store
            .read(op.slot, op.key(), now, op.touch)
            .map_or(0, |e| e.value.len() as i64),
    )
}

fn getrange(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let (Some(start), Some(end)) = (parse_int(&op.args[2]), parse_int(&op.args[3])) else {
        return not_integer();
    };
    store.materialize(op.slot, op.key(), now);
    let Some(value) = store
        .read(op.slot, op.key(), now, op.touch)
        .map(|e| e.value.bytes().unwrap_or_default())
    else {
        return Reply::bulk("");
    };
    range(&value, start, end)
}

/// GETRANGE's answer for `value`: Redis's index arithmetic (negative
/// indexes from the end, clamped to the string).
fn range(value: &Bytes, start: i64, end: i64) -> Reply {
    if start < 0 && end < 0 && start > end {
        return Reply::bulk("");
    }
    match clamp(start, end, value.len() as i64) {
        Some((start, end)) => Reply::Bulk(value.slice(start as usize..=end as usize)),
        None => Reply::bulk(""),
    }
}

// ---- answered from copies of hot keys (cluster) -----------------------------

fn copy_get(values: &[&Bytes], _args: &[Bytes]) -> Option<Reply> {
    Some(Reply::Bulk(values[0].clone()))
}

fn copy_mget(values: &[&Bytes], _args: &[Bytes]) -> Option<Reply> {
    Some(Reply::Array(
        values.iter().map(|v| Reply::Bulk((*v).clone())).collect(),
    ))
}

fn copy_strlen(values: &[&Bytes], _args: &[Bytes]) -> Option<Reply> {
    Some(Reply::Int(values[0].len() as i64))
}

fn copy_getrange(values: &[&Bytes], args: &[Bytes]) -> Option<Reply> {
    let (Some(start), Some(end)) = (parse_int(&args[2]), parse_int(&args[3])) else {
        // The error is the owner's to give.
        return None;
    };
    Some(range(values[0], start, end))
}

fn setrange(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let Some(offset) = parse_int(&op.args[2]) else {
        return not_integer();
    };
    if offset < 0 {
        return Reply::error("ERR offset is out of range");
    }
    let (slot, key, patch) = (op.slot, op.key(), &op.args[3]);
    store.materialize(slot, key, now);
    let existing = store
        .peek(slot, key, now)
        .map(|e| (e.value.bytes().unwrap_or_default(), e.expire_at));
    if patch.is_empty() {
        return Reply::Int(existing.map_or(0, |(v, _)| v.len() as i64));
    }
    let offset = offset as u64;
    if let Err(e) = check_length(store, offset + patch.len() as u64) {
        return e;
    }
    let (old, expire_at) = existing.unwrap_or_default();
    let offset = offset as usize;
    let new_len = old.len().max(offset + patch.len());
    let mut value = BytesMut::zeroed(new_len);
    value[..old.len()].copy_from_slice(&old);
    value[offset..offset + patch.len()].copy_from_slice(patch);
    match store_raw(store, slot, key, value, expire_at, now) {
        Ok(()) => Reply::Int(new_len as i64),
        Err(e) => e,
    }
}

/// Adds `delta` to the integer at the key, creating it from 0.
fn add_integer(store: &mut Store, op: &KeyOp, now: u64, delta: i64) -> Reply {
    let (slot, key) = (op.slot, op.key());
    store.materialize(slot, key, now);
    let (current, expire_at) = match store.peek(slot, key, now) {
        None => (0, 0),
        Some(e) => match parse_int(&e.value) {
            Some(n) => (n, e.expire_at),
            None => return not_integer(),
        },
    };
    let Some(next) = current.checked_add(delta) else {
        return Reply::error("ERR increment or decrement would overflow");
    };
    let text = Bytes::from(next.to_string());
    match stored(store.insert(slot, key, text, expire_at, now)) {
        Ok(()) => Reply::Int(next),
        Err(e) => e,
    }
}

fn incr(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    add_integer(store, op, now, 1)
}

fn decr(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    add_integer(store, op, now, -1)
}

fn incrby(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    match parse_int(&op.args[2]) {
        Some(delta) => add_integer(store, op, now, delta),
        None => not_integer(),
    }
}

fn decrby(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    match parse_int(&op.args[2]) {
        Some(i64::MIN) => Reply::error("ERR decrement would overflow"),
        Some(delta) => add_integer(store, op, now, -delta),
        None => not_integer(),
    }
}

fn incrbyfloat(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    // Redis adds as C `long double` and prints with `%.17Lf`; see
    // [`LongDouble`] for why an f64 would answer different digits.
    let invalid = || Reply::error("ERR value is not a valid float");
    let (slot, key) = (op.slot, op.key());
    store.materialize(slot, key, now);
    let (current, expire_at) = match store.peek(slot, key, now) {
        None => (LongDouble::parse(b"0").ok(), 0),
        Some(e) => (LongDouble::parse(&e.value).ok(), e.expire_at),
    };
    let (Some(current), Ok(delta)) = (current, LongDouble::parse(&op.args[2])) else {
        return invalid();
    };
    let next = current + delta;
    if next.is_infinite() {
        return Reply::error("ERR increment would produce NaN or Infinity");
    }
    let text = Bytes::from(next.to_human_string());
    match stored(store.insert_entry(
        slot,
        key,
        text.clone(),
        expire_at,
        Encoding::NoInt,
        None,
        now,
    )) {
        Ok(()) => Reply::Bulk(text),
        Err(e) => e,
    }
}

fn lcs(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = Arc::new(args);
        let (mut want_len, mut want_idx, mut with_match_len, mut min_len) =
            (false, false, false, 0);
        let mut i = 3;
        while i < args.len() {
            let a = &args[i];
            if is(a, "len") {
                want_len = true;
            } else if is(a, "idx") {
                want_idx = true;
            } else if is(a, "withmatchlen") {
                with_match_len = true;
            } else if is(a, "minmatchlen") && i + 1 < args.len() {
                match parse_int(&args[i + 1]) {
                    Some(n) => min_len = n.max(0) as usize,
                    None => return not_integer(),
                }
                i += 1;
            } else {
                return syntax_error();
            }
            i += 1;
        }
        if want_len && want_idx {
            return Reply::error(
                "ERR If you want both the length and indexes, please just use IDX.",
            );
        }
        let touch = !client.no_touch;
        let values = fan_out(
            client,
            &args,
            &[1, 2],
            Access::Write,
            move |store, slot, key, _, now| {
                store.materialize(slot, key, now);
                store
                    .read(slot, key, now, touch)
                    .and_then(|e| e.value.bytes())
                    .unwrap_or_default()
            },
        )
        .await;
        let Ok(values) = values else {
            return Reply::from(ShardGone);
        };
        lcs_reply(
            &values[0],
            &values[1],
            want_len,
            want_idx,
            with_match_len,
            min_len,
        )
    })
}

/// SET reads its key only with GET (Redis's key spec: OW UPDATE, or RW
/// ACCESS UPDATE with GET).
fn set_key_use(args: &[Bytes], _key: usize) -> u8 {
    if args.iter().skip(3).any(|a| is(a, "get")) {
        perm::ALL
    } else {
        perm::WRITE
    }
}

/// The LCS reply (`LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]`),
/// computed and walked back exactly as Redis does.
pub fn lcs_reply(
    a: &[u8],
    b: &[u8],
    want_len: bool,
    want_idx: bool,
    with_match_len: bool,
    min_len: usize,
) -> Reply {
    let (alen, blen) = (a.len(), b.len());
    let cells = (alen as u128 + 1) * (blen as u128 + 1) * 4;
    if cells > 512 * 1024 * 1024 {
        return Reply::error(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        );
    }
    let width = blen + 1;
    let mut table = vec![0u32; (alen + 1) * width];
    for i in 1..=alen {
        for j in 1..=blen {
            table[i * width + j] = if a[i - 1] == b[j - 1] {
                table[(i - 1) * width + j - 1] + 1
            } else {
                table[(i - 1) * width + j].max(table[i * width + j - 1])
            };
        }
    }
    let lcs_len = table[alen * width + blen] as usize;
    if want_len {
        return Reply::Int(lcs_len as i64);
    }
    let mut result = vec![0u8; lcs_len];
    let mut matches = Vec::new();
    let (mut i, mut j, mut idx) = (alen, blen, lcs_len);
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (alen, 0, 0, 0);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[idx - 1] = a[i - 1];
            if a_start == alen {
                (a_start, a_end, b_start, b_end) = (i - 1, i - 1, j - 1, j - 1);
            } else if a_start == i && b_start == j {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            j -= 1;
        } else {
            if table[(i - 1) * width + j] > table[i * width + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if a_start != alen {
                emit = true;
            }
        }
        if emit {
            let match_len = a_end - a_start + 1;
            if min_len == 0 || match_len >= min_len {
                let mut m = vec![
                    Reply::Array(vec![Reply::Int(a_start as i64), Reply::Int(a_end as i64)]),
                    Reply::Array(vec![Reply::Int(b_start as i64), Reply::Int(b_end as i64)]),
                ];
                if with_match_len {
                    m.push(Reply::Int(match_len as i64));
                }
                matches.push(Reply::Array(m));
            }
            a_start = alen;
        }
    }
    if want_idx {
        Reply::Map(vec![
            (Reply::bulk("matches"), Reply::Array(matches)),
            (Reply::bulk("len"), Reply::Int(lcs_len as i64)),
        ])
    } else {
        Reply::Bulk(Bytes::from(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expire_options() {
        let now = 1_000_000;
        assert_eq!(expire_at_from(b"EX", b"10", "set", now), Ok(now + 10_000));
        assert_eq!(expire_at_from(b"px", b"10", "set", now), Ok(now + 10));
        assert_eq!(expire_at_from(b"exat", b"10", "set", now), Ok(10_000));
        assert_eq!(expire_at_from(b"pxat", b"10", "set", now), Ok(10));
        assert_eq!(expire_at_from(b"ex", b"x", "set", now), Err(not_integer()));
        assert_eq!(
            expire_at_from(b"ex", b"0", "set", now),
            Err(Reply::error("ERR invalid expire time in 'set' command"))
        );
        assert!(expire_at_from(b"ex", b"9223372036854775807", "set", now).is_err());
    }

    fn options(line: &str, of: OptionsOf) -> Result<(bool, bool, bool, Option<String>), Reply> {
        let args: Vec<Bytes> = line
            .split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        ExtendedOptions::parse(&args, 0, of).map(|o| {
            let expire = o.expire.map(|(u, v)| {
                format!(
                    "{} {}",
                    String::from_utf8_lossy(u),
                    String::from_utf8_lossy(v)
                )
            });
            (o.nx, o.get, o.keep_ttl || o.persist, expire)
        })
    }

    #[test]
    fn set_options_like_redis() {
        use OptionsOf::{GetEx, Set};
        assert_eq!(options("NX NX GET GET", Set), Ok((true, true, false, None)));
        assert_eq!(
            options("EX 10 ex 20", Set),
            Ok((false, false, false, Some("ex 20".into())))
        );
        assert_eq!(
            options("KEEPTTL KEEPTTL", Set),
            Ok((false, false, true, None))
        );
        // The value is only checked after parsing: a bad one is no syntax error.
        assert_eq!(
            options("EX abc", Set),
            Ok((false, false, false, Some("EX abc".into())))
        );
        for bad in [
            "NX XX",
            "EX 1 PX 1",
            "EX 1 KEEPTTL",
            "KEEPTTL EX 1",
            "EX",
            "PERSIST",
        ] {
            assert_eq!(options(bad, Set), Err(syntax_error()), "{bad}");
        }
        assert_eq!(
            options("PERSIST PERSIST", GetEx),
            Ok((false, false, true, None))
        );
        for bad in ["NX", "GET", "KEEPTTL", "PERSIST EX 1", "EX 1 PERSIST"] {
            assert_eq!(options(bad, GetEx), Err(syntax_error()), "{bad}");
        }
    }

    #[test]
    fn lcs_matches_redis_example() {
        let (a, b) = (b"ohmytext", b"mynewtext");
        assert_eq!(
            lcs_reply(a, b, false, false, false, 0),
            Reply::bulk("mytext")
        );
        assert_eq!(lcs_reply(a, b, true, false, false, 0), Reply::Int(6));
        let Reply::Map(fields) = lcs_reply(a, b, false, true, true, 0) else {
            panic!("map expected")
        };
        let Reply::Array(matches) = &fields[0].1 else {
            panic!("array expected")
        };
        // Redis: 1) [[4,7],[5,8],4]  2) [[2,3],[0,1],2]
        assert_eq!(
            matches[0],
            Reply::Array(vec![
                Reply::Array(vec![Reply::Int(4), Reply::Int(7)]),
                Reply::Array(vec![Reply::Int(5), Reply::Int(8)]),
                Reply::Int(4),
            ])
        );
        assert_eq!(matches.len(), 2);
    }
}
