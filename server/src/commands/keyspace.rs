//! Generic key commands (Redis's "generic" group): DEL, EXISTS, EXPIRE and
//! TTL, RENAME, COPY, KEYS, SCAN, RANDOMKEY, TYPE, OBJECT. Also the fan-out
//! helper multi-key commands use.

use std::sync::Arc;

use bytes::Bytes;
use kvtier_protocol::Reply;
use kvtier_store::Store;

use super::flags::*;
use super::{
    always, is, not_integer, oom_error, parse_int, syntax_error, unknown_subcommand, Args, Client,
    CommandSpec, Handler, KeyOp, KeySpec, LocalBoxFuture, OneShard, Spread, ALL_KEYS, DEFAULTS,
    KEY1, NO_KEYS,
};
use super::{fan_out, help_reply, object_encoding};
use crate::acl::{category, perm, KeyUse};
use crate::glob::glob_match;
use crate::shard::slot::{key_slot, shard_slots, slot_shard, SLOTS};
use crate::shard::{Access, ShardGone};

const BASE: CommandSpec = CommandSpec {
    arity: 2,
    flags: READONLY | FAST,
    keys: KEY1,
    group: "generic",
    syntax: "key",
    categories: category::KEYSPACE,
    ..DEFAULTS
};

const TWO_KEYS: KeySpec = KeySpec::range(1, 2, 1);

const OBJECT_SUB: CommandSpec = CommandSpec {
    arity: 3,
    flags: READONLY,
    keys: KeySpec::range(2, 2, 1),
    since: "2.2.3",
    key_use: KeyUse::Exists,
    ..BASE
};

/// The generic (keyspace) family.
/// DEL (UNLINK is the same command under another name).
const DEL: CommandSpec = CommandSpec {
    name: "del",
    key_use: KeyUse::Write,
    arity: -2,
    flags: WRITE,
    keys: ALL_KEYS,
    summary: "Deletes one or more keys.",
    complexity: "O(N) where N is the number of keys that will be removed.",
    syntax: "key...",
    handler: Handler::Async(del),
    one_shard: Some(OneShard {
        run: del_one,
        applies: always,
    }),
    spread: Spread::Sum,
    ..BASE
};

pub const COMMANDS: &[CommandSpec] = &[
    DEL,
    // As in Redis, UNLINK is DEL (values are freed at once either way).
    CommandSpec {
        name: "unlink",
        flags: WRITE | FAST,
        since: "4.0.0",
        summary: "Asynchronously deletes one or more keys.",
        complexity: "O(1) for each key removed regardless of its size.",
        ..DEL
    },
    CommandSpec {
        name: "exists",
        key_use: KeyUse::Exists,
        arity: -2,
        keys: ALL_KEYS,
        summary: "Determines whether one or more keys exist.",
        complexity: "O(N) where N is the number of keys to check.",
        syntax: "key...",
        handler: Handler::Async(exists),
        one_shard: Some(OneShard {
            run: exists_one,
            applies: always,
        }),
        spread: Spread::Sum,
        from_copies: Some(copy_exists),
        ..BASE
    },
    CommandSpec {
        name: "touch",
        key_use: KeyUse::Exists,
        arity: -2,
        keys: ALL_KEYS,
        since: "3.2.1",
        summary: "Returns the number of existing keys out of those specified after updating the time they were last accessed.",
        complexity: "O(N) where N is the number of keys that will be touched.",
        syntax: "key...",
        handler: Handler::Async(touch),
        one_shard: Some(OneShard {
            run: touch_one,
            applies: always,
        }),
        spread: Spread::Sum,
        ..BASE
    },
    CommandSpec {
        name: "type",
        key_use: KeyUse::Exists,
        summary: "Determines the type of value stored at a key.",
        handler: Handler::Key(key_type),
        ..BASE
    },
    CommandSpec {
        name: "keys",
        flags: READONLY | DANGEROUS,
        keys: NO_KEYS,
        summary: "Returns all key names that match a pattern.",
        complexity: "O(N) with N being the number of keys in the database.",
        syntax: "pattern",
        handler: Handler::Async(keys),
        ..BASE
    },
    CommandSpec {
        name: "scan",
        arity: -2,
        flags: READONLY,
        keys: NO_KEYS,
        since: "2.8.0",
        summary: "Iterates over the key names in the database.",
        complexity: "O(1) for every call. O(N) for a complete iteration.",
        syntax: "cursor:integer [MATCH pattern] [COUNT count] [TYPE type]",
        handler: Handler::Async(scan),
        ..BASE
    },
    CommandSpec {
        name: "randomkey",
        arity: 1,
        flags: READONLY | RANDOM,
        keys: NO_KEYS,
        summary: "Returns a random key name from the database.",
        syntax: "",
        handler: Handler::Async(randomkey),
        ..BASE
    },
    CommandSpec {
        name: "rename",
        // Reads and deletes the source, writes the destination.
        key_use: KeyUse::OneDiffers {
            at: 1,
            that: perm::ALL,
            rest: perm::WRITE,
        },
        arity: 3,
        flags: WRITE,
        keys: TWO_KEYS,
        summary: "Renames a key and overwrites the destination.",
        syntax: "key newkey",
        handler: Handler::Async(rename),
        ..BASE
    },
    CommandSpec {
        name: "renamenx",
        // Reads and deletes the source, writes the destination.
        key_use: KeyUse::OneDiffers {
            at: 1,
            that: perm::ALL,
            rest: perm::WRITE,
        },
        arity: 3,
        flags: WRITE | FAST,
        keys: TWO_KEYS,
        summary: "Renames a key only when the target key name doesn't exist.",
        syntax: "key newkey",
        handler: Handler::Async(renamenx),
        ..BASE
    },
    CommandSpec {
        name: "copy",
        // Reads the source, writes the destination.
        key_use: KeyUse::OneDiffers {
            at: 1,
            that: perm::READ,
            rest: perm::WRITE,
        },
        arity: -3,
        flags: WRITE | DENYOOM,
        keys: TWO_KEYS,
        since: "6.2.0",
        summary: "Copies the value of a key to a new key.",
        complexity: "O(N) worst case for collections, where N is the number of nested items. O(1) for string values.",
        syntax: "source destination [DB destination-db:integer] [REPLACE]",
        handler: Handler::Async(copy),
        ..BASE
    },
    CommandSpec {
        name: "expire",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | FAST,
        summary: "Sets the expiration time of a key in seconds.",
        syntax: "key seconds [NX|XX|GT|LT]",
        handler: Handler::Key(expire),
        ..BASE
    },
    CommandSpec {
        name: "pexpire",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | FAST,
        since: "2.6.0",
        summary: "Sets the expiration time of a key in milliseconds.",
        syntax: "key milliseconds [NX|XX|GT|LT]",
        handler: Handler::Key(expire),
        ..BASE
    },
    CommandSpec {
        name: "expireat",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | FAST,
        since: "1.2.0",
        summary: "Sets the expiration time of a key to a Unix timestamp.",
        syntax: "key unix-time-seconds [NX|XX|GT|LT]",
        handler: Handler::Key(expire),
        ..BASE
    },
    CommandSpec {
        name: "pexpireat",
        key_use: KeyUse::Write,
        arity: -3,
        flags: WRITE | FAST,
        since: "2.6.0",
        summary: "Sets the expiration time of a key to a Unix milliseconds timestamp.",
        syntax: "key unix-time-milliseconds [NX|XX|GT|LT]",
        handler: Handler::Key(expire),
        ..BASE
    },
    CommandSpec {
        name: "ttl",
        summary: "Returns the expiration time in seconds of a key.",
        handler: Handler::Key(ttl),
        ..BASE
    },
    CommandSpec {
        name: "pttl",
        since: "2.6.0",
        summary: "Returns the expiration time in milliseconds of a key.",
        handler: Handler::Key(ttl),
        ..BASE
    },
    CommandSpec {
        name: "expiretime",
        since: "7.0.0",
        summary: "Returns the expiration time of a key as a Unix timestamp.",
        handler: Handler::Key(ttl),
        ..BASE
    },
    CommandSpec {
        name: "pexpiretime",
        since: "7.0.0",
        summary: "Returns the expiration time of a key as a Unix milliseconds timestamp.",
        handler: Handler::Key(ttl),
        ..BASE
    },
    CommandSpec {
        name: "persist",
        key_use: KeyUse::Write,
        flags: WRITE | FAST,
        since: "2.2.0",
        summary: "Removes the expiration time of a key.",
        handler: Handler::Key(persist),
        ..BASE
    },
    CommandSpec {
        name: "object",
        categories: 0,
        arity: -2,
        flags: 0,
        keys: NO_KEYS,
        since: "2.2.3",
        summary: "A container for object introspection commands.",
        complexity: "Depends on subcommand.",
        syntax: "",
        subcommands: &[
            CommandSpec {
                name: "object|encoding",
                summary: "Returns the internal encoding of a Redis object.",
                handler: Handler::Key(object),
                ..OBJECT_SUB
            },
            CommandSpec {
                name: "object|freq",
                since: "4.0.0",
                summary: "Returns the logarithmic access frequency counter of a Redis object.",
                handler: Handler::Key(object),
                ..OBJECT_SUB
            },
            CommandSpec {
                name: "object|idletime",
                summary: "Returns the time since the last access to a Redis object.",
                handler: Handler::Key(object),
                ..OBJECT_SUB
            },
            CommandSpec {
                name: "object|refcount",
                summary: "Returns the reference count of a value of a key.",
                handler: Handler::Key(object),
                ..OBJECT_SUB
            },
            CommandSpec {
                name: "object|help",
                arity: 2,
                flags: LOADING | STALE,
                keys: NO_KEYS,
                since: "6.2.0",
                summary: "Returns helpful text about the different subcommands.",
                syntax: "",
                handler: Handler::Sync(object_help),
                ..OBJECT_SUB
            },
        ],
        ..BASE
    },
];

/// How many of the command's keys `f` says yes for, each asked on the
/// shard that owns it (DEL, EXISTS, TOUCH).
async fn count_keys_where(
    client: &Client,
    args: Args,
    access: Access,
    f: fn(&mut Store, u16, &[u8], u64) -> bool,
) -> Reply {
    let args = Arc::new(args);
    let keys: Vec<usize> = (1..args.len()).collect();
    let found = fan_out(
        client,
        &args,
        &keys,
        access,
        move |store, slot, key, _, now| f(store, slot, key, now),
    )
    .await;
    match found {
        Ok(r) => Reply::Int(r.into_iter().filter(|&b| b).count() as i64),
        Err(e) => Reply::from(e),
    }
}

fn del(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(count_keys_where(
        client,
        args,
        Access::Write,
        |store, slot, key, now| {
            store.peek(slot, key, now).is_some() && store.remove(slot, key).is_some()
        },
    ))
}

fn exists(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(count_keys_where(
        client,
        args,
        Access::Read,
        |store, slot, key, now| store.read(slot, key, now, false).is_some(),
    ))
}

fn touch(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(count_keys_where(
        client,
        args,
        Access::Write,
        |store, slot, key, now| store.touch(slot, key, now),
    ))
}

fn count_keys(op: &KeyOp, mut f: impl FnMut(u16, &[u8]) -> bool) -> Reply {
    Reply::Int(
        op.args[1..]
            .iter()
            .filter(|key| f(key_slot(key), key))
            .count() as i64,
    )
}

fn del_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    count_keys(op, |slot, key| {
        store.peek(slot, key, now).is_some() && store.remove(slot, key).is_some()
    })
}

fn exists_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    count_keys(op, |slot, key| store.read(slot, key, now, false).is_some())
}

fn touch_one(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    count_keys(op, |slot, key| store.touch(slot, key, now))
}

fn key_type(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    match store.peek(op.slot, op.key(), now) {
        Some(_) => Reply::status("string"),
        None => Reply::status("none"),
    }
}

/// Keys KEYS visits per step on a shard: between steps the shard serves
/// its other clients, so a KEYS over a large keyspace cannot stall them.
const KEYS_STEP: usize = 4096;

fn keys(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let pattern = args[1].clone();
        let shards = client.shard.count();
        let mut out = Vec::new();
        for owner in 0..shards {
            let mut slot = Some(shard_slots(owner, shards).start);
            while let Some(from) = slot {
                let pattern = pattern.clone();
                let step = client
                    .shard
                    .call(owner, move |s| {
                        s.store.lock().scan(
                            from,
                            KEYS_STEP,
                            |k| glob_match(&pattern, k, false),
                            kvtier_store::now_ms(),
                        )
                    })
                    .await;
                let (keys, next, _) = match step {
                    Ok(step) => step,
                    Err(e) => return Reply::from(e),
                };
                out.extend(keys.into_iter().map(Reply::Bulk));
                slot = next;
                // A step on this very shard runs inline: let the others in.
                tokio::task::yield_now().await;
            }
        }
        Reply::Array(out)
    })
}

fn scan(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let Some(cursor) = parse_cursor(&args[1]) else {
            return Reply::error("ERR invalid cursor");
        };
        let mut count = 10usize;
        let mut pattern: Option<Bytes> = None;
        let mut type_filter: Option<Bytes> = None;
        let mut i = 2;
        while i < args.len() {
            if i + 1 >= args.len() {
                return syntax_error();
            }
            let (opt, value) = (&args[i], &args[i + 1]);
            if is(opt, "count") {
                match parse_int(value) {
                    Some(n) if n >= 1 => count = n as usize,
                    Some(_) => return syntax_error(),
                    None => return not_integer(),
                }
            } else if is(opt, "match") {
                pattern = Some(value.clone());
            } else if is(opt, "type") {
                type_filter = Some(value.clone());
            } else {
                return syntax_error();
            }
            i += 2;
        }
        // Every value is a string: any other TYPE matches nothing.
        let only_strings = type_filter.as_ref().is_none_or(|t| is(t, "string"));
        let mut found: Vec<Reply> = Vec::new();
        let mut slot = cursor as usize;
        let shards = client.shard.count();
        // As Redis: COUNT is the work of one call; a selective MATCH may
        // return fewer keys (even none) with a cursor to go on from.
        let mut visited = 0;
        while slot < SLOTS && found.len() < count && visited < count.saturating_mul(10) {
            let owner = slot_shard(slot as u16, shards);
            let want = count - found.len();
            let pattern = pattern.clone();
            let step = client
                .shard
                .call(owner, move |s| {
                    let now = kvtier_store::now_ms();
                    s.store.lock().scan(
                        slot,
                        want,
                        |k| {
                            only_strings && pattern.as_ref().is_none_or(|p| glob_match(p, k, false))
                        },
                        now,
                    )
                })
                .await;
            let (keys, next, seen) = match step {
                Ok(step) => step,
                Err(e) => return Reply::from(e),
            };
            visited += seen;
            found.extend(keys.into_iter().map(Reply::Bulk));
            slot = next.unwrap_or(shard_slots(owner, shards).end);
        }
        let next_cursor = if slot >= SLOTS { 0 } else { slot };
        Reply::Array(vec![
            Reply::bulk(next_cursor.to_string()),
            Reply::Array(found),
        ])
    })
}

/// A SCAN cursor, read as Redis reads it with `strtoul`: an optional sign
/// (`-1` wraps around), decimal digits, nothing else; the empty string is 0.
pub fn parse_cursor(arg: &[u8]) -> Option<u64> {
    let (negative, digits) = match arg.first() {
        Some(b'-') => (true, &arg[1..]),
        Some(b'+') => (false, &arg[1..]),
        _ => (false, arg),
    };
    if digits.is_empty() {
        // strtoul reads nothing: fine for "", not for a lone sign.
        return arg.is_empty().then_some(0);
    }
    let mut value: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

fn randomkey(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let sizes = match client.shard.call_all(|s| s.store.lock().len()).await {
            Ok(sizes) => sizes,
            Err(e) => return Reply::from(e),
        };
        let total: usize = sizes.iter().sum();
        if total == 0 {
            return Reply::Nil;
        }
        // Pick a shard in proportion to its keys, then a key in it; a shard
        // whose keys all turned out expired passes to the next.
        let mut pick = (kvtier_store::now_ms() as usize).wrapping_mul(2654435761) % total;
        let mut start = 0;
        for (i, &n) in sizes.iter().enumerate() {
            if pick < n {
                start = i;
                break;
            }
            pick -= n;
        }
        for k in 0..sizes.len() {
            let target = (start + k) % sizes.len();
            if sizes[target] == 0 {
                continue;
            }
            let found = client
                .shard
                .call(target, |s| {
                    s.store.lock().random_key(kvtier_store::now_ms())
                })
                .await;
            match found {
                Ok(Some(key)) => return Reply::Bulk(key),
                Ok(None) => continue,
                Err(e) => return Reply::from(e),
            }
        }
        Reply::Nil
    })
}

/// What RENAME-like commands take from the source key.
type Moved = (Bytes, u64, kvtier_store::Encoding, Option<Bytes>);

/// Moves or copies `src` to `dst`. `remove_src`: RENAME (else COPY);
/// `replace`: overwrite an existing destination. Returns `Ok(None)` when the
/// source is missing, `Ok(Some(false))` when the destination exists and may
/// not be replaced.
async fn transfer(
    client: &Client,
    src: Bytes,
    dst: Bytes,
    remove_src: bool,
    replace: bool,
) -> Result<Result<Option<bool>, Reply>, ShardGone> {
    let shard = &client.shard;
    let (src_slot, dst_slot) = (key_slot(&src), key_slot(&dst));
    let (src_owner, dst_owner) = (shard.owner_of(src_slot), shard.owner_of(dst_slot));
    if src_owner == dst_owner {
        // One shard: the whole move is one atomic step.
        return shard
            .call(src_owner, move |s| {
                let mut store = s.store.lock();
                let now = kvtier_store::now_ms();
                // A spilled source is read back first (rare: blocks are
                // written once and read, not renamed).
                store.materialize(src_slot, &src, now);
                let Some(e) = store.peek(src_slot, &src, now) else {
                    return Ok(None);
                };
                let Some(value) = e.value.bytes() else {
                    return Ok(None);
                };
                let (at, enc, parent) = (e.expire_at, e.encoding, e.parent.clone());
                if src == dst {
                    return Ok(Some(!replace || remove_src));
                }
                if !replace && store.peek(dst_slot, &dst, now).is_some() {
                    return Ok(Some(false));
                }
                if remove_src {
                    store.remove(src_slot, &src);
                }
                match store.insert_entry(
                    dst_slot,
                    &dst,
                    value.clone(),
                    at,
                    enc,
                    parent.clone(),
                    now,
                ) {
                    Ok(_) => Ok(Some(true)),
                    Err(_) => {
                        if remove_src {
                            let _ = store.insert_entry(src_slot, &src, value, at, enc, parent, now);
                        }
                        Err(oom_error())
                    }
                }
            })
            .await;
    }
    let taken: Option<Moved> = shard
        .call(src_owner, {
            let src = src.clone();
            move |s| {
                let mut store = s.store.lock();
                let now = kvtier_store::now_ms();
                store.materialize(src_slot, &src, now);
                let e = store.peek(src_slot, &src, now)?;
                Some((e.value.bytes()?, e.expire_at, e.encoding, e.parent.clone()))
            }
        })
        .await?;
    let Some((value, at, enc, parent)) = taken else {
        return Ok(Ok(None));
    };
    let written = shard
        .call(dst_owner, move |s| {
            let mut store = s.store.lock();
            let now = kvtier_store::now_ms();
            if !replace && store.peek(dst_slot, &dst, now).is_some() {
                return Ok(false);
            }
            store
                .insert_entry(dst_slot, &dst, value, at, enc, parent, now)
                .map(|_| true)
                .map_err(|_| oom_error())
        })
        .await?;
    match written {
        Ok(true) if remove_src => {
            shard
                .call(src_owner, move |s| {
                    s.store.lock().remove(src_slot, &src);
                })
                .await?;
            Ok(Ok(Some(true)))
        }
        Ok(done) => Ok(Ok(Some(done))),
        Err(e) => Ok(Err(e)),
    }
}

fn rename(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        match transfer(client, args[1].clone(), args[2].clone(), true, true).await {
            Ok(Ok(Some(_))) => Reply::ok(),
            Ok(Ok(None)) => Reply::error("ERR no such key"),
            Ok(Err(e)) => e,
            Err(e) => Reply::from(e),
        }
    })
}

fn renamenx(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if args[1] == args[2] {
            // Redis answers 0 for a rename onto itself, if the key exists.
            let key = args[1].clone();
            let slot = key_slot(&key);
            let owner = client.shard.owner_of(slot);
            return match client
                .shard
                .call(owner, move |s| {
                    s.store
                        .lock()
                        .peek(slot, &key, kvtier_store::now_ms())
                        .is_some()
                })
                .await
            {
                Ok(true) => Reply::Int(0),
                Ok(false) => Reply::error("ERR no such key"),
                Err(e) => Reply::from(e),
            };
        }
        match transfer(client, args[1].clone(), args[2].clone(), true, false).await {
            Ok(Ok(Some(done))) => Reply::Int(done as i64),
            Ok(Ok(None)) => Reply::error("ERR no such key"),
            Ok(Err(e)) => e,
            Err(e) => Reply::from(e),
        }
    })
}

fn copy(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let mut replace = false;
        let mut i = 3;
        while i < args.len() {
            if is(&args[i], "replace") {
                replace = true;
            } else if is(&args[i], "db") && i + 1 < args.len() {
                match super::parse_db_index(&args[i + 1]) {
                    Ok(0) => {}
                    Ok(_) => return Reply::error("ERR DB index is out of range"),
                    Err(e) => return e,
                }
                i += 1;
            } else {
                return syntax_error();
            }
            i += 1;
        }
        if args[1] == args[2] {
            return Reply::error("ERR source and destination objects are the same");
        }
        match transfer(client, args[1].clone(), args[2].clone(), false, replace).await {
            Ok(Ok(Some(done))) => Reply::Int(done as i64),
            Ok(Ok(None)) => Reply::Int(0),
            Ok(Err(e)) => e,
            Err(e) => Reply::from(e),
        }
    })
}

fn expire(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let name = op.args[0].to_ascii_lowercase();
    let name = String::from_utf8_lossy(&name).into_owned();
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &op.args[3..] {
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            return Reply::error(format!(
                "ERR Unsupported option {}",
                super::sanitize(opt, usize::MAX)
            ));
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::error("ERR GT and LT options at the same time are not compatible");
    }
    // Like Redis, the options are checked before the time.
    let Some(n) = parse_int(&op.args[2]) else {
        return not_integer();
    };
    let invalid = || Reply::error(format!("ERR invalid expire time in '{name}' command"));
    let seconds = name == "expire" || name == "expireat";
    let relative = name == "expire" || name == "pexpire";
    let ms = if seconds {
        match n.checked_mul(1000) {
            Some(ms) => ms,
            None => return invalid(),
        }
    } else {
        n
    };
    let at = if relative {
        match ms.checked_add(now as i64) {
            Some(at) => at,
            None => return invalid(),
        }
    } else {
        ms
    };
    let (slot, key) = (op.slot, op.key());
    let Some(current) = store.peek(slot, key, now).map(|e| e.expire_at) else {
        return Reply::Int(0);
    };
    // A key without TTL counts as expiring never (infinitely late).
    let current_cmp = if current == 0 {
        i128::MAX
    } else {
        current as i128
    };
    let allowed = !(nx && current != 0
        || xx && current == 0
        || gt && (at as i128) <= current_cmp
        || lt && (at as i128) >= current_cmp);
    if !allowed {
        return Reply::Int(0);
    }
    if at <= now as i64 {
        store.remove(slot, key);
        store.stats.expired_keys += 1;
        return Reply::Int(1);
    }
    store.set_expire(slot, key, at as u64, now);
    Reply::Int(1)
}

fn ttl(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let name = op.args[0].to_ascii_lowercase();
    let Some(at) = store
        .read(op.slot, op.key(), now, false)
        .map(|e| e.expire_at)
    else {
        return Reply::Int(-2);
    };
    if at == 0 {
        return Reply::Int(-1);
    }
    let left = at.saturating_sub(now) as i64;
    // Seconds are rounded to the nearest, for TTL and EXPIRETIME alike.
    Reply::Int(match &name[..] {
        b"ttl" => (left + 500) / 1000,
        b"pttl" => left,
        b"expiretime" => (at as i64 + 500) / 1000,
        _ => at as i64,
    })
}

fn persist(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    match store.peek(op.slot, op.key(), now).map(|e| e.expire_at) {
        Some(at) if at != 0 => {
            store.set_expire(op.slot, op.key(), 0, now);
            Reply::Int(1)
        }
        _ => Reply::Int(0),
    }
}

/// EXISTS answered from copies of hot keys (cluster): every key has one.
fn copy_exists(values: &[&Bytes], _args: &[Bytes]) -> Option<Reply> {
    Some(Reply::Int(values.len() as i64))
}

fn object(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let sub = op.args[1].to_ascii_lowercase();
    let policy = store.policy();
    let Some(entry) = store.peek(op.slot, op.key(), now) else {
        return Reply::Nil;
    };
    match &sub[..] {
        b"encoding" => Reply::bulk(object_encoding(entry)),
        b"refcount" => Reply::Int(1),
        b"freq" if policy.is_lfu() => Reply::Int(entry.frequency(now) as i64),
        b"freq" => Reply::error(
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ),
        b"idletime" if policy.is_lfu() => Reply::error(
            "ERR An LFU maxmemory policy is selected, idle time not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ),
        b"idletime" => Reply::Int(entry.idle_seconds(now) as i64),
        _ => unknown_subcommand("object", &op.args[1]),
    }
}

fn object_help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "OBJECT",
        &[
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>.",
            "FREQ <key>",
            "    Return the access frequency index of the <key>. The returned integer is",
            "    proportional to the logarithm of the recent access frequency of the key.",
            "IDLETIME <key>",
            "    Return the idle time of the <key>, that is the approximated number of",
            "    seconds elapsed since the last access to the key.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_like_strtoul() {
        assert_eq!(parse_cursor(b"0"), Some(0));
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"+12"), Some(12));
        assert_eq!(parse_cursor(b"007"), Some(7));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b"18446744073709551616"[..],
            b"-",
            b"+",
            b" 1",
            b"1 ",
            b"1.5",
            b"x",
        ] {
            assert_eq!(
                parse_cursor(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
