//! Server commands: COMMAND, CONFIG, INFO, DBSIZE, FLUSHDB/FLUSHALL, TIME,
//! LASTSAVE, SHUTDOWN, WAIT, MEMORY, DEBUG, ROLE and the FUNCTION/SCRIPT
//! flushes clients send on start-up.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use kvtier_protocol::Reply;
use kvtier_store::{now_ms, Store, StoreStats};

use super::docs::{docs_reply, info_reply};
use super::flags::*;
use super::help_reply;
use super::CommandTable;
use super::{
    is, not_integer, parse_int, syntax_error, unknown_subcommand, Args, Client, CommandSpec,
    Handler, KeyOp, KeySpec, LocalBoxFuture, DEFAULTS,
};
use crate::acl::{category, KeyUse};
use crate::report;
use crate::shard::ShardGone;

const BASE: CommandSpec = CommandSpec {
    group: "server",
    ..DEFAULTS
};

const SUB: CommandSpec = CommandSpec {
    arity: 2,
    flags: LOADING | STALE,
    ..BASE
};

/// The server family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "command",
        categories: category::CONNECTION,
        arity: -1,
        flags: LOADING | STALE,
        since: "2.8.13",
        summary: "Returns detailed information about all commands.",
        complexity: "O(N) where N is the total number of Redis commands",
        handler: Handler::Sync(command_all),
        subcommands: &[
            CommandSpec {
                name: "command|count",
                categories: category::CONNECTION,
                summary: "Returns a count of commands.",
                handler: Handler::Sync(command_count),
                ..SUB
            },
            CommandSpec {
                name: "command|info",
                categories: category::CONNECTION,
                arity: -2,
                since: "2.8.13",
                summary: "Returns information about one, multiple or all commands.",
                complexity: "O(N) where N is the number of commands to look up",
                syntax: "[command-name...]",
                handler: Handler::Sync(command_info),
                ..SUB
            },
            CommandSpec {
                name: "command|docs",
                categories: category::CONNECTION,
                arity: -2,
                since: "7.0.0",
                summary: "Returns documentary information about one, multiple or all commands.",
                complexity: "O(N) where N is the number of commands to look up",
                syntax: "[command-name...]",
                handler: Handler::Sync(command_docs),
                ..SUB
            },
            CommandSpec {
                name: "command|list",
                categories: category::CONNECTION,
                arity: -2,
                since: "7.0.0",
                summary: "Returns a list of command names.",
                complexity: "O(N) where N is the total number of Redis commands",
                syntax: "[FILTERBY (MODULE module-name|ACLCAT category|PATTERN pattern)]",
                handler: Handler::Sync(command_list),
                ..SUB
            },
            CommandSpec {
                name: "command|getkeys",
                categories: category::CONNECTION,
                arity: -3,
                since: "2.8.13",
                summary: "Extracts the key names from an arbitrary command.",
                complexity: "O(N) where N is the number of arguments to the command",
                syntax: "command arg...",
                handler: Handler::Sync(command_getkeys),
                ..SUB
            },
            CommandSpec {
                name: "command|getkeysandflags",
                categories: category::CONNECTION,
                arity: -3,
                since: "7.0.0",
                summary: "Extracts the key names and access flags for an arbitrary command.",
                complexity: "O(N) where N is the number of arguments to the command",
                syntax: "command arg...",
                handler: Handler::Sync(command_getkeys),
                ..SUB
            },
            CommandSpec {
                name: "command|help",
                categories: category::CONNECTION,
                since: "5.0.0",
                summary: "Returns helpful text about the different subcommands.",
                handler: Handler::Sync(command_help),
                ..SUB
            },
        ],
        ..BASE
    },
    CommandSpec {
        name: "config",
        arity: -2,
        since: "2.0.0",
        summary: "A container for server configuration commands.",
        complexity: "Depends on subcommand.",
        subcommands: &[
            CommandSpec {
                name: "config|get",
                arity: -3,
                flags: ADMIN | NOSCRIPT | LOADING | STALE,
                summary: "Returns the effective values of configuration parameters.",
                complexity: "O(N) when N is the number of configuration parameters provided",
                syntax: "parameter...",
                handler: Handler::Sync(config_get),
                ..SUB
            },
            CommandSpec {
                name: "config|set",
                arity: -4,
                flags: ADMIN | NOSCRIPT | LOADING | STALE,
                summary: "Sets configuration parameters in-flight.",
                complexity: "O(N) when N is the number of configuration parameters provided",
                syntax: "(parameter value)...",
                handler: Handler::Async(config_set),
                ..SUB
            },
            CommandSpec {
                name: "config|resetstat",
                flags: ADMIN | NOSCRIPT | LOADING | STALE,
                summary: "Resets the server's statistics.",
                handler: Handler::Async(config_resetstat),
                ..SUB
            },
            CommandSpec {
                name: "config|rewrite",
                since: "2.8.0",
                flags: ADMIN | NOSCRIPT | LOADING | STALE,
                summary: "Persists the effective configuration to file.",
                handler: Handler::Sync(config_rewrite),
                ..SUB
            },
            CommandSpec {
                name: "config|help",
                since: "5.0.0",
                summary: "Returns helpful text about the different subcommands.",
                handler: Handler::Sync(config_help),
                ..SUB
            },
        ],
        ..BASE
    },
    CommandSpec {
        name: "info",
        categories: category::DANGEROUS,
        arity: -1,
        flags: LOADING | STALE,
        summary: "Returns information and statistics about the server.",
        syntax: "[section...]",
        handler: Handler::Async(info),
        ..BASE
    },
    CommandSpec {
        name: "dbsize",
        categories: category::KEYSPACE,
        flags: READONLY | FAST,
        group: "server",
        summary: "Returns the number of keys in the database.",
        handler: Handler::Async(dbsize),
        ..BASE
    },
    CommandSpec {
        name: "flushdb",
        categories: category::KEYSPACE,
        arity: -1,
        flags: WRITE | DANGEROUS | FLUSH,
        summary: "Removes all keys from the current database.",
        complexity: "O(N) where N is the number of keys in the selected database",
        syntax: "[ASYNC|SYNC]",
        handler: Handler::Async(flush),
        ..BASE
    },
    CommandSpec {
        name: "flushall",
        categories: category::KEYSPACE,
        arity: -1,
        flags: WRITE | DANGEROUS | FLUSH,
        summary: "Removes all keys from all databases.",
        complexity: "O(N) where N is the total number of keys in all databases",
        syntax: "[ASYNC|SYNC]",
        handler: Handler::Async(flush),
        ..BASE
    },
    CommandSpec {
        name: "time",
        flags: LOADING | STALE | FAST | RANDOM,
        since: "2.6.0",
        summary: "Returns the server time.",
        handler: Handler::Sync(time),
        ..BASE
    },
    CommandSpec {
        name: "lastsave",
        categories: category::ADMIN | category::DANGEROUS,
        flags: LOADING | STALE | FAST | RANDOM,
        summary: "Returns the Unix timestamp of the last successful save to disk.",
        handler: Handler::Sync(lastsave),
        ..BASE
    },
    CommandSpec {
        name: "shutdown",
        arity: -1,
        flags: ADMIN | NOSCRIPT | LOADING | STALE,
        summary: "Synchronously saves the database(s) to disk and shuts down the Redis server.",
        complexity: "O(N) when saving, where N is the total number of keys in all databases when saving data, otherwise O(1)",
        syntax: "[NOSAVE|SAVE] [NOW] [FORCE] [ABORT]",
        handler: Handler::Sync(shutdown),
        ..BASE
    },
    CommandSpec {
        name: "wait",
        categories: category::CONNECTION,
        arity: 3,
        flags: NOSCRIPT,
        group: "generic",
        since: "3.0.0",
        summary: "Blocks until the asynchronous replication of all preceding write commands sent by the connection is completed.",
        syntax: "numreplicas timeout",
        handler: Handler::Sync(wait),
        ..BASE
    },
    CommandSpec {
        name: "role",
        categories: category::ADMIN | category::DANGEROUS,
        flags: NOSCRIPT | LOADING | STALE | FAST,
        since: "2.8.12",
        summary: "Returns the replication role.",
        handler: Handler::Sync(role),
        ..BASE
    },
    CommandSpec {
        name: "function",
        arity: -2,
        group: "scripting",
        since: "7.0.0",
        summary: "A container for function commands.",
        complexity: "Depends on subcommand.",
        subcommands: &[
            CommandSpec {
                name: "function|flush",
        categories: category::SCRIPTING,
                arity: -2,
                flags: WRITE | NOSCRIPT,
                group: "scripting",
                since: "7.0.0",
                summary: "Deletes all libraries and functions.",
                syntax: "[ASYNC|SYNC]",
                handler: Handler::Sync(flush_scripts),
                ..SUB
            },
            CommandSpec {
                name: "function|list",
        categories: category::SCRIPTING,
                arity: -2,
                flags: NOSCRIPT,
                group: "scripting",
                since: "7.0.0",
                summary: "Returns information about all libraries.",
                syntax: "[LIBRARYNAME library-name-pattern] [WITHCODE]",
                handler: Handler::Sync(empty_list),
                ..SUB
            },
        ],
        ..BASE
    },
    CommandSpec {
        name: "script",
        arity: -2,
        group: "scripting",
        since: "2.6.0",
        summary: "A container for Lua scripts management commands.",
        complexity: "Depends on subcommand.",
        subcommands: &[
            CommandSpec {
                name: "script|flush",
        categories: category::SCRIPTING,
                arity: -2,
                flags: NOSCRIPT,
                group: "scripting",
                since: "2.6.0",
                summary: "Removes all server-side Lua scripts from the script cache.",
                syntax: "[ASYNC|SYNC]",
                handler: Handler::Sync(flush_scripts),
                ..SUB
            },
            CommandSpec {
                name: "script|exists",
        categories: category::SCRIPTING,
                arity: -3,
                flags: NOSCRIPT,
                group: "scripting",
                since: "2.6.0",
                summary: "Determines whether server-side Lua scripts exist in the script cache.",
                syntax: "sha1...",
                handler: Handler::Sync(script_exists),
                ..SUB
            },
        ],
        ..BASE
    },
    CommandSpec {
        name: "memory",
        arity: -2,
        since: "4.0.0",
        summary: "A container for memory diagnostics commands.",
        complexity: "Depends on subcommand.",
        subcommands: &[
            CommandSpec {
                name: "memory|usage",
        key_use: KeyUse::Exists,
                arity: -3,
                flags: READONLY,
                keys: KeySpec::range(2, 2, 1),
                since: "4.0.0",
                summary: "Estimates the memory usage of a key.",
                syntax: "key [SAMPLES count]",
                handler: Handler::Key(memory_usage),
                ..SUB
            },
            CommandSpec {
                name: "memory|stats",
                since: "4.0.0",
                summary: "Returns details about memory usage.",
                handler: Handler::Async(memory_stats),
                ..SUB
            },
            CommandSpec {
                name: "memory|doctor",
                since: "4.0.0",
                summary: "Outputs a memory problems report.",
                handler: Handler::Sync(memory_doctor),
                ..SUB
            },
            CommandSpec {
                name: "memory|purge",
                since: "4.0.0",
                summary: "Asks the allocator to release memory.",
                handler: Handler::Sync(memory_purge),
                ..SUB
            },
            CommandSpec {
                name: "memory|malloc-stats",
                since: "4.0.0",
                summary: "Returns the allocator statistics.",
                handler: Handler::Sync(memory_malloc_stats),
                ..SUB
            },
            CommandSpec {
                name: "memory|help",
                since: "4.0.0",
                summary: "Returns helpful text about the different subcommands.",
                handler: Handler::Sync(memory_help),
                ..SUB
            },
        ],
        ..BASE
    },
    CommandSpec {
        name: "debug",
        arity: -2,
        flags: ADMIN | NOSCRIPT | LOADING | STALE,
        summary: "A container for debugging commands.",
        complexity: "Depends on subcommand.",
        syntax: "subcommand [arg...]",
        handler: Handler::Async(debug),
        ..BASE
    },
];

// ---- COMMAND ---------------------------------------------------------------

fn command_all(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Array(
        client
            .commands
            .commands
            .iter()
            .map(|c| info_reply(c))
            .collect(),
    )
}

fn command_count(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Int(client.commands.commands.len() as i64)
}

/// A command or `parent|sub` by name.
fn find_command(t: &CommandTable, name: &[u8]) -> Option<&'static CommandSpec> {
    match name.iter().position(|&b| b == b'|') {
        Some(bar) => t.get(&name[..bar]).and_then(|p| t.sub(p, &name[bar + 1..])),
        None => t.get(name),
    }
}

fn command_info(client: &mut Client, args: &[Bytes]) -> Reply {
    if args.len() == 2 {
        return command_all(client, args);
    }
    Reply::Array(
        args[2..]
            .iter()
            .map(|n| find_command(client.commands, n).map_or(Reply::NilArray, info_reply))
            .collect(),
    )
}

fn command_docs(client: &mut Client, args: &[Bytes]) -> Reply {
    let t = client.commands;
    let entries = if args.len() == 2 {
        t.commands.iter().map(|c| docs_reply(c)).collect()
    } else {
        args[2..]
            .iter()
            .filter_map(|n| find_command(client.commands, n))
            .map(docs_reply)
            .collect()
    };
    Reply::Map(entries)
}

fn command_list(client: &mut Client, args: &[Bytes]) -> Reply {
    let t = client.commands;
    let names = t.commands.iter().map(|c| c.name);
    let chosen: Vec<&str> = match args.len() {
        2 => names.collect(),
        5 if is(&args[2], "filterby") => {
            let (kind, value) = (&args[3], &args[4]);
            if is(kind, "pattern") {
                let mut all: Vec<&str> = Vec::new();
                for c in &t.commands {
                    all.push(c.name);
                    all.extend(c.subcommands.iter().map(|s| s.name));
                }
                all.into_iter()
                    .filter(|n| crate::glob::glob_match(value, n.as_bytes(), true))
                    .collect()
            } else if is(kind, "aclcat") {
                let wanted = format!("@{}", String::from_utf8_lossy(value).to_ascii_lowercase());
                t.commands
                    .iter()
                    .filter(|c| super::docs::acl_categories(c).contains(&wanted.as_str()))
                    .map(|c| c.name)
                    .collect()
            } else if is(kind, "module") {
                Vec::new()
            } else {
                return syntax_error();
            }
        }
        _ => return syntax_error(),
    };
    Reply::Array(chosen.into_iter().map(Reply::bulk).collect())
}

fn command_getkeys(client: &mut Client, args: &[Bytes]) -> Reply {
    let with_flags = is(&args[1], "getkeysandflags");
    let call = &args[2..];
    let Some(mut spec) = client.commands.get(&call[0]) else {
        return Reply::error("ERR Invalid command specified");
    };
    if matches!(spec.handler, Handler::Parent) && call.len() > 1 {
        match client.commands.sub(spec, &call[1]) {
            Some(sub) => spec = sub,
            None => return Reply::error("ERR Invalid command specified"),
        }
    }
    if !spec.arity_ok(call.len()) {
        return Reply::error("ERR Invalid number of arguments specified for command");
    }
    let Some(keys) = spec.key_indexes(call) else {
        return Reply::error("ERR Invalid arguments specified for command");
    };
    if keys.is_empty() {
        return Reply::error("ERR The command has no key arguments");
    }
    let flags = super::docs::key_spec_flags(spec);
    Reply::Array(
        keys.into_iter()
            .map(|i| {
                let key = Reply::Bulk(call[i].clone());
                if with_flags {
                    Reply::Array(vec![
                        key,
                        Reply::Set(flags.iter().map(|f| Reply::status(f)).collect()),
                    ])
                } else {
                    key
                }
            })
            .collect(),
    )
}

fn command_help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "COMMAND",
        &[
            "(no subcommand)",
            "    Return details about all Redis commands.",
            "COUNT",
            "    Return the total number of commands in this Redis server.",
            "LIST",
            "    Return a list of all commands in this Redis server.",
            "INFO [<command-name> ...]",
            "    Return details about multiple Redis commands.",
            "DOCS [<command-name> ...]",
            "    Return documentation details about multiple Redis commands.",
            "GETKEYS <full-command>",
            "    Return the keys from a full Redis command.",
            "GETKEYSANDFLAGS <full-command>",
            "    Return the keys and the access flags from a full Redis command.",
        ],
    )
}

// ---- CONFIG ----------------------------------------------------------------

fn config_get(client: &mut Client, args: &[Bytes]) -> Reply {
    let config = &client.shard.shared.config;
    let mut seen = std::collections::BTreeMap::new();
    for pattern in &args[2..] {
        for (name, value) in config.get(pattern) {
            seen.insert(name, value);
        }
    }
    Reply::Map(
        seen.into_iter()
            .map(|(k, v)| (Reply::bulk(k), Reply::bulk(v)))
            .collect(),
    )
}

fn config_set(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        if !args.len().is_multiple_of(2) {
            return super::arity_error("config|set");
        }
        let config = &client.shard.shared.config;
        let pairs: Vec<(String, String)> = args[2..]
            .chunks(2)
            .map(|p| {
                (
                    String::from_utf8_lossy(&p[0]).to_ascii_lowercase(),
                    String::from_utf8_lossy(&p[1]).into_owned(),
                )
            })
            .collect();
        for (i, (name, value)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Reply::error(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{name}') - duplicate parameter"
                ));
            }
            match config.check(name, value) {
                Ok(()) => {}
                Err(e) if e == "unknown" => {
                    return Reply::error(format!(
                        "ERR Unknown option or number of arguments for CONFIG SET - '{name}'"
                    ))
                }
                Err(e) => {
                    return Reply::error(format!(
                        "ERR CONFIG SET failed (possibly related to argument '{name}') - {e}"
                    ))
                }
            }
        }
        if let Err((name, e)) = config.set_all(&pairs) {
            return Reply::error(format!(
                "ERR CONFIG SET failed (possibly related to argument '{name}') - {e}"
            ));
        }
        client.shard.apply_live_config().await;
        Reply::ok()
    })
}

fn config_resetstat(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let done = client
            .shard
            .call_all(|s| {
                s.stats.borrow_mut().reset();
                s.store.lock().stats = StoreStats::default();
            })
            .await;
        match done {
            Ok(_) => Reply::ok(),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

fn config_rewrite(client: &mut Client, _args: &[Bytes]) -> Reply {
    match client.shard.shared.config.rewrite() {
        Ok(()) => Reply::ok(),
        Err(e) => Reply::error(format!("ERR {e}")),
    }
}

fn config_help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "CONFIG",
        &[
            "GET <pattern>",
            "    Return parameters matching the glob-like <pattern> and their values.",
            "SET <directive> <value>",
            "    Set the configuration <directive> to <value>.",
            "RESETSTAT",
            "    Reset statistics reported by the INFO command.",
            "REWRITE",
            "    Rewrite the configuration file.",
        ],
    )
}

// ---- INFO ------------------------------------------------------------------

fn info(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let sections = report::info_sections(&args[1..]);
        let Ok(reports) = report::gather(&client.shard).await else {
            return Reply::from(ShardGone);
        };
        let text = report::render_info(&client.shard.shared, &sections, &reports);
        Reply::Verbatim(Bytes::from(text))
    })
}

// ---- keyspace-wide ---------------------------------------------------------

fn dbsize(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        match client.shard.call_all(|s| s.store.lock().len()).await {
            Ok(sizes) => Reply::Int(sizes.into_iter().sum::<usize>() as i64),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

fn flush(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        match args.len() {
            1 => {}
            2 if is(&args[1], "async") || is(&args[1], "sync") => {}
            _ => return syntax_error(),
        }
        match client.shard.call_all(|s| s.store.lock().clear()).await {
            Ok(_) => Reply::ok(),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

fn time(_client: &mut Client, _args: &[Bytes]) -> Reply {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::bulk(now.as_secs().to_string()),
        Reply::bulk(now.subsec_micros().to_string()),
    ])
}

fn lastsave(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Int(client.shard.shared.started_unix as i64)
}

fn shutdown(client: &mut Client, args: &[Bytes]) -> Reply {
    for a in &args[1..] {
        if is(a, "abort") {
            return Reply::error("ERR No shutdown in progress.");
        }
        if !(is(a, "nosave") || is(a, "save") || is(a, "now") || is(a, "force")) {
            return syntax_error();
        }
    }
    // NOSAVE / SAVE decide whether DRAM blocks go to the spill tier first.
    let spill = &client.shard.shared.config.spill_on_shutdown;
    if args[1..].iter().any(|a| is(a, "nosave")) {
        spill.store(false, Relaxed);
    } else if args[1..].iter().any(|a| is(a, "save")) {
        spill.store(true, Relaxed);
    }
    tracing::info!("SHUTDOWN requested by client {}", client.id());
    client.shard.shared.request_shutdown();
    // Redis closes the connection without a reply when it shuts down.
    client.close_after_reply = true;
    Reply::Silent
}

fn wait(_client: &mut Client, args: &[Bytes]) -> Reply {
    match (parse_int(&args[1]), parse_int(&args[2])) {
        (None, _) => not_integer(),
        (Some(_), None) => Reply::error("ERR timeout is not an integer or out of range"),
        (Some(_), Some(t)) if t < 0 => Reply::error("ERR timeout is negative"),
        (Some(_), Some(_)) => Reply::Int(0),
    }
}

fn role(_client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Array(vec![
        Reply::bulk("master"),
        Reply::Int(0),
        Reply::Array(Vec::new()),
    ])
}

/// FUNCTION FLUSH and SCRIPT FLUSH: nothing is cached, so only the
/// arguments are checked, with Redis's (differing) error texts.
fn flush_scripts(_client: &mut Client, args: &[Bytes]) -> Reply {
    let function = is(&args[0], "function");
    match args.len() {
        2 => Reply::ok(),
        3 if is(&args[2], "async") || is(&args[2], "sync") => Reply::ok(),
        3 if function => Reply::error("ERR FUNCTION FLUSH only supports SYNC|ASYNC option"),
        _ if function => Reply::error(
            "ERR unknown subcommand or wrong number of arguments for 'flush'. Try FUNCTION HELP.",
        ),
        _ => Reply::error("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
    }
}

fn empty_list(_client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Array(Vec::new())
}

fn script_exists(_client: &mut Client, args: &[Bytes]) -> Reply {
    // kvtier runs no scripts, so no script is cached.
    Reply::Array(args[2..].iter().map(|_| Reply::Int(0)).collect())
}

// ---- MEMORY ----------------------------------------------------------------

fn memory_usage(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    if args.len() > 3 {
        if args.len() != 5 || !is(&args[3], "samples") {
            return syntax_error();
        }
        match parse_int(&args[4]) {
            Some(n) if n < 0 => return syntax_error(),
            Some(_) => {}
            None => return not_integer(),
        }
    }
    match store.peek(op.slot, op.key(), now) {
        // Everything the key costs: index, parent link, and the value's
        // slab slot (its size class) or heap bytes.
        Some(e) => Reply::Int(e.memory_usage(op.key().len()) as i64),
        None => Reply::Nil,
    }
}

fn memory_stats(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let Ok(reports) = report::gather(&client.shard).await else {
            return Reply::from(ShardGone);
        };
        let used: u64 = reports.iter().map(|r| r.used_memory as u64).sum();
        let keys: u64 = reports.iter().map(|r| r.keys as u64).sum();
        let peak = client
            .shard
            .shared
            .memory_peak
            .fetch_max(used, Relaxed)
            .max(used);
        let overhead = keys * kvtier_store::ENTRY_OVERHEAD as u64;
        let dataset = used.saturating_sub(overhead);
        let rss = report::rss_bytes();
        let int = |n: u64| Reply::Int(n as i64);
        Reply::Map(vec![
            (Reply::bulk("peak.allocated"), int(peak)),
            (Reply::bulk("total.allocated"), int(used)),
            (Reply::bulk("startup.allocated"), int(0)),
            (Reply::bulk("replication.backlog"), int(0)),
            (Reply::bulk("clients.slaves"), int(0)),
            (Reply::bulk("clients.normal"), int(0)),
            (Reply::bulk("aof.buffer"), int(0)),
            (Reply::bulk("lua.caches"), int(0)),
            (
                Reply::bulk("db.0"),
                Reply::Map(vec![
                    (Reply::bulk("overhead.hashtable.main"), int(overhead)),
                    (Reply::bulk("overhead.hashtable.expires"), int(0)),
                ]),
            ),
            (Reply::bulk("overhead.total"), int(overhead)),
            (Reply::bulk("keys.count"), int(keys)),
            (
                Reply::bulk("keys.bytes-per-key"),
                int(used.checked_div(keys).unwrap_or(0)),
            ),
            (Reply::bulk("dataset.bytes"), int(dataset)),
            (
                Reply::bulk("dataset.percentage"),
                Reply::Double(if used == 0 {
                    0.0
                } else {
                    dataset as f64 * 100.0 / used as f64
                }),
            ),
            (
                Reply::bulk("peak.percentage"),
                Reply::Double(if peak == 0 {
                    100.0
                } else {
                    used as f64 * 100.0 / peak as f64
                }),
            ),
            (Reply::bulk("allocator.resident"), int(rss)),
            (
                Reply::bulk("slab.pages"),
                int(reports.iter().map(|r| r.arena.pages as u64).sum()),
            ),
            (
                Reply::bulk("slab.page.bytes"),
                int(reports.iter().map(|r| r.arena.page_bytes as u64).sum()),
            ),
            (
                Reply::bulk("slab.span.bytes"),
                int(reports.iter().map(|r| r.arena.span_bytes as u64).sum()),
            ),
            (
                Reply::bulk("index.bytes"),
                int(reports.iter().map(|r| r.index_memory as u64).sum()),
            ),
            (
                Reply::bulk("fragmentation"),
                Reply::Double(if used == 0 {
                    1.0
                } else {
                    rss as f64 / used as f64
                }),
            ),
        ])
    })
}

fn memory_doctor(_client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Verbatim(Bytes::from_static(
        b"Hi Sam, I can't find any memory issue in your instance. I can only account for what occurs on this base.",
    ))
}

fn memory_purge(_client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::ok()
}

fn memory_malloc_stats(_client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Verbatim(Bytes::from_static(
        b"Stats not supported for the current allocator",
    ))
}

fn memory_help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "MEMORY",
        &[
            "DOCTOR",
            "    Return memory problems reports.",
            "MALLOC-STATS",
            "    Return internal statistics report from the memory allocator.",
            "PURGE",
            "    Attempt to purge dirty pages for reclamation by the allocator.",
            "STATS",
            "    Return information about the memory usage of the server.",
            "USAGE <key> [SAMPLES <count>]",
            "    Return memory in bytes used by <key> and its value. Nested values are",
            "    sampled up to <count> times (default: 5, 0 means sample all).",
        ],
    )
}

// ---- DEBUG -----------------------------------------------------------------

fn debug(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let peer = client.info.borrow().addr.ip();
        if !client.shard.shared.config.debug_allowed(peer) {
            return Reply::error(
                "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", \
                 you can run it from a local connection, otherwise you need to set this option in the \
                 configuration file, and then restart the server.",
            );
        }
        let sub = args[1].to_ascii_lowercase();
        match &sub[..] {
            b"sleep" if args.len() == 3 => {
                let secs = super::parse_float(&args[2]).unwrap_or(0.0).max(0.0);
                // Like Redis, DEBUG SLEEP stalls the thread (this shard).
                std::thread::sleep(std::time::Duration::from_secs_f64(secs.min(3600.0)));
                Reply::ok()
            }
            b"set-active-expire" if args.len() == 3 => {
                let on = parse_int(&args[2]).unwrap_or(1) != 0;
                client.shard.shared.active_expire.store(on, Relaxed);
                Reply::ok()
            }
            // There is no snapshot to reload from: the dataset after a
            // "reload" is the dataset before it.
            b"reload" => Reply::ok(),
            b"object" if args.len() == 3 => debug_object(client, args[2].clone()).await,
            b"digest" => debug_digest(client, None).await,
            b"digest-value" => debug_digest(client, Some(args[2..].to_vec())).await,
            b"help" => help_reply("DEBUG", DEBUG_HELP),
            _ => unknown_subcommand("debug", &args[1]),
        }
    })
}

/// DEBUG HELP's lines.
const DEBUG_HELP: &[&str] = &[
    "DIGEST",
    "    Output a hex signature representing the current DB content.",
    "DIGEST-VALUE <key> [<key> ...]",
    "    Output a hex signature of the values of all the specified keys.",
    "OBJECT <key>",
    "    Show low level info about the key and associated value.",
    "RELOAD",
    "    Nothing to reload: kvtier keeps no snapshot; replies OK.",
    "SET-ACTIVE-EXPIRE <0|1>",
    "    Setting it to 0 disables expiring keys in background.",
    "SLEEP <seconds>",
    "    Stop the server's shard thread for <seconds>.",
];

/// DEBUG OBJECT key: Redis's line about the key's value.
async fn debug_object(client: &Client, key: Bytes) -> Reply {
    let slot = crate::shard::slot::key_slot(&key);
    let owner = client.shard.owner_of(slot);
    let found = client
        .shard
        .call(owner, move |s| {
            let now = now_ms();
            let mut store = s.store.lock();
            store.peek(slot, &key, now).map(|e| {
                format!(
                    "Value at:0x0 refcount:1 encoding:{} serializedlength:{} lru:{} lru_seconds_idle:{}",
                    super::object_encoding(e),
                    e.value.len(),
                    (now / 1000) & 0xff_ffff,
                    e.idle_seconds(now)
                )
            })
        })
        .await;
    match found {
        Ok(Some(text)) => Reply::status_owned(text),
        Ok(None) => Reply::error("ERR no such key"),
        Err(gone) => Reply::from(gone),
    }
}

/// DEBUG DIGEST (`keys` None: the whole dataset, one digest) or DEBUG
/// DIGEST-VALUE keys (one digest per key, zeros for a missing one).
async fn debug_digest(client: &Client, keys: Option<Vec<Bytes>>) -> Reply {
    let (whole, count) = (keys.is_none(), keys.as_ref().map_or(0, Vec::len));
    let parts = client
        .shard
        .call_all(move |s| {
            let store = s.store.lock();
            let now = now_ms();
            let mut acc = [0u8; 20];
            let mut per_key = Vec::new();
            store.for_each_live(now, |k, e| match &keys {
                None => {
                    let d = entry_digest(k, &e.value, e.expire_at);
                    acc.iter_mut().zip(d).for_each(|(a, b)| *a ^= b);
                }
                Some(keys) => {
                    if let Some(i) = keys.iter().position(|x| x == k) {
                        per_key.push((i, value_digest(&e.value)));
                    }
                }
            });
            (acc, per_key)
        })
        .await;
    let parts = match parts {
        Ok(parts) => parts,
        Err(gone) => return Reply::from(gone),
    };
    if whole {
        let mut acc = [0u8; 20];
        for (d, _) in &parts {
            acc.iter_mut().zip(d).for_each(|(a, b)| *a ^= b);
        }
        return Reply::status_owned(hex(&acc));
    }
    let mut out = vec![Reply::status_owned(hex(&[0u8; 20])); count];
    for (_, per_key) in parts {
        for (i, d) in per_key {
            out[i] = Reply::status_owned(hex(&d));
        }
    }
    Reply::Array(out)
}

/// A 160-bit digest (five 32-bit FNV-1a lanes with different seeds).
fn digest(parts: &[&[u8]]) -> [u8; 20] {
    let mut out = [0u8; 20];
    for lane in 0..5u32 {
        let mut h: u32 = 0x811c_9dc5 ^ lane.wrapping_mul(0x9e37_79b9);
        for part in parts {
            for &b in *part {
                h ^= b as u32;
                h = h.wrapping_mul(0x0100_0193);
            }
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0193);
        }
        out[lane as usize * 4..lane as usize * 4 + 4].copy_from_slice(&h.to_be_bytes());
    }
    out
}

fn entry_digest(key: &[u8], value: &[u8], expire_at: u64) -> [u8; 20] {
    digest(&[key, value, &expire_at.to_be_bytes()])
}

fn value_digest(value: &[u8]) -> [u8; 20] {
    digest(&[value])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
