//! CLIENT and its subcommands. LIST and KILL ask every shard, since each
//! shard keeps the registry of its own connections.

use bytes::Bytes;
use kvtier_protocol::Reply;

use super::flags::*;
use super::{help_reply, valid_name};
use super::{
    is, not_integer, parse_int, syntax_error, Args, Client, CommandSpec, Handler, LocalBoxFuture,
    DEFAULTS,
};
use crate::acl::category;
use crate::clients::ClientInfo;
use crate::shard::ShardGone;

const SUB: CommandSpec = CommandSpec {
    arity: 2,
    flags: NOSCRIPT | LOADING | STALE,
    group: "connection",
    since: "5.0.0",
    categories: category::CONNECTION,
    ..DEFAULTS
};

/// CLIENT.
pub const COMMANDS: &[CommandSpec] = &[CommandSpec {
    name: "client",
    categories: 0,
    arity: -2,
    flags: 0,
    since: "2.4.0",
    summary: "A container for client connection commands.",
    complexity: "Depends on subcommand.",
    subcommands: &[
        CommandSpec {
            name: "client|id",
            summary: "Returns the unique client ID of the connection.",
            handler: Handler::Sync(id),
            ..SUB
        },
        CommandSpec {
            name: "client|setname",
            arity: 3,
            since: "2.6.9",
            summary: "Sets the connection name.",
            syntax: "connection-name",
            handler: Handler::Sync(setname),
            ..SUB
        },
        CommandSpec {
            name: "client|getname",
            since: "2.6.9",
            summary: "Returns the name of the connection.",
            handler: Handler::Sync(getname),
            ..SUB
        },
        CommandSpec {
            name: "client|setinfo",
            arity: 4,
            since: "7.2.0",
            summary: "Sets information specific to the client or connection.",
            syntax: "LIB-NAME libname|LIB-VER libver",
            handler: Handler::Sync(setinfo),
            ..SUB
        },
        CommandSpec {
            name: "client|info",
            since: "6.2.0",
            summary: "Returns information about the connection.",
            handler: Handler::Sync(info),
            ..SUB
        },
        CommandSpec {
            name: "client|list",
            arity: -2,
            flags: NOSCRIPT | LOADING | STALE | ADMIN,
            since: "2.4.0",
            summary: "Lists open connections.",
            complexity: "O(N) where N is the number of client connections",
            syntax: "[TYPE NORMAL|MASTER|REPLICA|PUBSUB] [ID client-id...]",
            handler: Handler::Async(list),
            ..SUB
        },
        CommandSpec {
            name: "client|kill",
            arity: -3,
            flags: NOSCRIPT | LOADING | STALE | ADMIN,
            since: "2.4.0",
            summary: "Terminates open connections.",
            complexity: "O(N) where N is the number of client connections",
            syntax: "ip:port|([ID client-id] [TYPE NORMAL|MASTER|SLAVE|REPLICA|PUBSUB] [USER username] [ADDR ip:port] [LADDR ip:port] [SKIPME YES|NO] [MAXAGE max-age])",
            handler: Handler::Async(kill),
            ..SUB
        },
        CommandSpec {
            name: "client|no-evict",
            arity: 3,
            flags: NOSCRIPT | LOADING | STALE | ADMIN,
            since: "7.0.0",
            summary: "Sets the client eviction mode of the connection.",
            syntax: "ON|OFF",
            handler: Handler::Sync(no_evict),
            ..SUB
        },
        CommandSpec {
            name: "client|no-touch",
            arity: 3,
            since: "7.2.0",
            summary: "Controls whether commands sent by the client affect the LRU/LFU of accessed keys.",
            syntax: "ON|OFF",
            handler: Handler::Sync(no_touch),
            ..SUB
        },
        CommandSpec {
            name: "client|help",
            summary: "Returns helpful text about the different subcommands.",
            handler: Handler::Sync(help),
            ..SUB
        },
    ],
    ..SUB
}];

fn id(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Int(client.id() as i64)
}

fn setname(client: &mut Client, args: &[Bytes]) -> Reply {
    if !valid_name(&args[2]) {
        return Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        );
    }
    client.info.borrow_mut().name = String::from_utf8_lossy(&args[2]).into_owned();
    Reply::ok()
}

fn getname(client: &mut Client, _args: &[Bytes]) -> Reply {
    let info = client.info.borrow();
    if info.name.is_empty() {
        Reply::Nil
    } else {
        Reply::bulk(&info.name)
    }
}

fn setinfo(client: &mut Client, args: &[Bytes]) -> Reply {
    let (attr, value) = (&args[2], &args[3]);
    let is_name = is(attr, "lib-name");
    if !is_name && !is(attr, "lib-ver") {
        return Reply::error(format!(
            "ERR Unrecognized option '{}'",
            super::sanitize(attr, 128)
        ));
    }
    if !valid_name(value) {
        return Reply::error(format!(
            "ERR {} cannot contain spaces, newlines or special characters.",
            if is_name { "lib-name" } else { "lib-ver" }
        ));
    }
    let value = String::from_utf8_lossy(value).into_owned();
    let mut info = client.info.borrow_mut();
    if is_name {
        info.lib_name = value;
    } else {
        info.lib_ver = value;
    }
    Reply::ok()
}

fn info(client: &mut Client, _args: &[Bytes]) -> Reply {
    let line = client.info.borrow().line();
    Reply::Verbatim(Bytes::from(line + "\n"))
}

fn list(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let mut ids: Option<Vec<u64>> = None;
        let mut i = 2;
        while i < args.len() {
            if is(&args[i], "type") && i + 1 < args.len() {
                let t = &args[i + 1];
                if !["normal", "master", "replica", "slave", "pubsub"]
                    .iter()
                    .any(|n| is(t, n))
                {
                    return Reply::error(format!(
                        "ERR Unknown client type '{}'",
                        super::sanitize(t, 64)
                    ));
                }
                if !is(t, "normal") {
                    // Every kvtier client is a normal one.
                    ids = Some(Vec::new());
                }
                i += 2;
            } else if is(&args[i], "id") && i + 1 < args.len() {
                let mut wanted = Vec::new();
                for a in &args[i + 1..] {
                    match parse_int(a) {
                        Some(n) if n > 0 => wanted.push(n as u64),
                        _ => return Reply::error("ERR Invalid client ID"),
                    }
                }
                ids = Some(wanted);
                i = args.len();
            } else {
                return syntax_error();
            }
        }
        let lines = client
            .shard
            .call_all(move |s| {
                let ids = ids.clone();
                s.clients
                    .borrow()
                    .lines(|c| ids.as_ref().is_none_or(|ids| ids.contains(&c.id)))
            })
            .await;
        let Ok(lines) = lines else {
            return Reply::from(ShardGone);
        };
        let mut lines: Vec<(u64, String)> = lines.into_iter().flatten().collect();
        lines.sort();
        let mut text = String::new();
        for (_, line) in lines {
            text.push_str(&line);
            text.push('\n');
        }
        Reply::Verbatim(Bytes::from(text))
    })
}

/// How many shards CLIENT KILL follows connections that moved while it
/// looked (each hop is a move made in the meantime).
const MAX_KILL_HOPS: usize = 16;

/// CLIENT KILL filters (all given ones must match).
#[derive(Clone, Default)]
struct KillFilter {
    id: Option<u64>,
    addr: Option<String>,
    laddr: Option<String>,
    user: Option<String>,
    max_age: Option<u64>,
    no_type_match: bool,
    skip: Option<u64>,
}

impl KillFilter {
    fn matches(&self, c: &ClientInfo) -> bool {
        !self.no_type_match
            && self.id.is_none_or(|id| c.id == id)
            && self.addr.as_ref().is_none_or(|a| c.addr.to_string() == *a)
            && self
                .laddr
                .as_ref()
                .is_none_or(|a| c.laddr.to_string() == *a)
            && self.user.as_ref().is_none_or(|u| c.user == *u)
            && self
                .max_age
                .is_none_or(|age| c.created.elapsed().as_secs() >= age)
            && self.skip != Some(c.id)
    }
}

fn kill(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let me = client.id();
        let mut filter = KillFilter {
            skip: Some(me),
            ..KillFilter::default()
        };
        let old_form = args.len() == 3;
        if old_form {
            filter.addr = Some(String::from_utf8_lossy(&args[2]).into_owned());
            filter.skip = None;
        } else {
            let mut i = 2;
            while i < args.len() {
                if i + 1 >= args.len() {
                    return syntax_error();
                }
                let (opt, value) = (&args[i], &args[i + 1]);
                let text = String::from_utf8_lossy(value).into_owned();
                if is(opt, "id") {
                    match parse_int(value) {
                        Some(n) if n > 0 => filter.id = Some(n as u64),
                        _ => return Reply::error("ERR client-id should be greater than 0"),
                    }
                } else if is(opt, "addr") {
                    filter.addr = Some(text);
                } else if is(opt, "laddr") {
                    filter.laddr = Some(text);
                } else if is(opt, "user") {
                    if client.shard.shared.config.acl.user(&text).is_none() {
                        return Reply::error(format!("ERR No such user '{text}'"));
                    }
                    filter.user = Some(text);
                } else if is(opt, "type") {
                    if !["normal", "master", "replica", "slave", "pubsub"]
                        .iter()
                        .any(|n| is(value, n))
                    {
                        return Reply::error(format!("ERR Unknown client type '{text}'"));
                    }
                    filter.no_type_match = !is(value, "normal");
                } else if is(opt, "skipme") {
                    if is(value, "yes") {
                        filter.skip = Some(me);
                    } else if is(value, "no") {
                        filter.skip = None;
                    } else {
                        return syntax_error();
                    }
                } else if is(opt, "maxage") {
                    match parse_int(value) {
                        Some(n) if n >= 0 => filter.max_age = Some(n as u64),
                        _ => return not_integer(),
                    }
                } else {
                    return syntax_error();
                }
                i += 2;
            }
        }
        let found = client
            .shard
            .call_all(move |s| {
                let clients = s.clients.borrow();
                let killed = clients.kill(|c| filter.matches(c), Some(me));
                (killed, clients.departed_matching(|c| filter.matches(c)))
            })
            .await;
        let Ok(found) = found else {
            return Reply::from(ShardGone);
        };
        let mut total: usize = found.iter().map(|(killed, _)| killed).sum();
        // A connection moving between shards was in no registry when asked:
        // the shard it left sends the kill after it, to where it went
        // (which counts it unless it already did), and on if it moved again.
        let mut after: Vec<(usize, u64)> = found.into_iter().flat_map(|(_, moved)| moved).collect();
        let mut hops = 0;
        while let Some((to, id)) = after.pop() {
            hops += 1;
            let Ok(there) = client
                .shard
                .call(to, move |s| s.clients.borrow().kill_moved(id))
                .await
            else {
                continue;
            };
            match there {
                Ok(killed) => total += killed,
                Err(moved) if hops < MAX_KILL_HOPS => after.extend(moved),
                Err(_) => {}
            }
        }
        if client.info.borrow().killed {
            // Killed itself: reply first, then close.
            client.close_after_reply = true;
        }
        if old_form {
            if total == 0 {
                Reply::error("ERR No such client")
            } else {
                Reply::ok()
            }
        } else {
            Reply::Int(total as i64)
        }
    })
}

fn on_off(arg: &[u8]) -> Option<bool> {
    if is(arg, "on") {
        Some(true)
    } else if is(arg, "off") {
        Some(false)
    } else {
        None
    }
}

fn no_evict(client: &mut Client, args: &[Bytes]) -> Reply {
    match on_off(&args[2]) {
        Some(on) => {
            client.info.borrow_mut().no_evict = on;
            Reply::ok()
        }
        None => syntax_error(),
    }
}

fn no_touch(client: &mut Client, args: &[Bytes]) -> Reply {
    match on_off(&args[2]) {
        Some(on) => {
            client.no_touch = on;
            client.info.borrow_mut().no_touch = on;
            Reply::ok()
        }
        None => syntax_error(),
    }
}

fn help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "CLIENT",
        &[
            "GETNAME",
            "    Return the name of the current connection.",
            "ID",
            "    Return the ID of the current connection.",
            "INFO",
            "    Return information about the current client connection.",
            "KILL <ip:port>",
            "    Kill connection made from <ip:port>.",
            "KILL <option> <value> [<option> <value> [...]]",
            "    Kill connections. Options are: ID, TYPE, USER, ADDR, LADDR, SKIPME, MAXAGE.",
            "LIST [options ...]",
            "    Return information about client connections. Options: TYPE, ID.",
            "NO-EVICT (ON|OFF)",
            "    Protect current client connection from eviction.",
            "NO-TOUCH (ON|OFF)",
            "    Will not touch LRU/LFU stats when this mode is on.",
            "SETINFO <option> <value>",
            "    Set client meta attr. Options are: LIB-NAME, LIB-VER.",
            "SETNAME <name>",
            "    Assign the name <name> to the current connection.",
        ],
    )
}
