//! Connection commands: PING, ECHO, HELLO, AUTH, QUIT, RESET, SELECT.

use bytes::Bytes;
use kvtier_protocol::Reply;

use super::flags::*;
use super::valid_name;
use super::{is, parse_int, Client, CommandSpec, Handler, DEFAULTS};
use crate::acl::category;

const BASE: CommandSpec = CommandSpec {
    flags: FAST | LOADING | STALE,
    group: "connection",
    categories: category::CONNECTION,
    ..DEFAULTS
};

/// The connection family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "ping",
        arity: -1,
        summary: "Returns the server's liveliness response.",
        syntax: "[message]",
        handler: Handler::Sync(ping),
        ..BASE
    },
    CommandSpec {
        name: "echo",
        arity: 2,
        summary: "Returns the given string.",
        syntax: "message",
        handler: Handler::Sync(echo),
        ..BASE
    },
    CommandSpec {
        name: "hello",
        arity: -1,
        flags: FAST | LOADING | STALE | NO_AUTH | NOSCRIPT,
        since: "6.0.0",
        summary: "Handshakes with the Redis server.",
        syntax: "[protover [AUTH username password] [SETNAME clientname]]",
        handler: Handler::Sync(hello),
        ..BASE
    },
    CommandSpec {
        name: "auth",
        arity: -2,
        flags: FAST | LOADING | STALE | NO_AUTH | NOSCRIPT,
        summary: "Authenticates the connection.",
        complexity: "O(N) where N is the number of passwords defined for the user",
        syntax: "[username] password",
        handler: Handler::Sync(auth),
        ..BASE
    },
    CommandSpec {
        name: "quit",
        arity: -1,
        flags: FAST | LOADING | STALE | NO_AUTH | NOSCRIPT | TX_NOW,
        summary: "Closes the connection.",
        handler: Handler::Sync(quit),
        ..BASE
    },
    CommandSpec {
        name: "reset",
        flags: FAST | LOADING | STALE | NO_AUTH | NOSCRIPT | TX_NOW,
        since: "6.2.0",
        summary: "Resets the connection.",
        handler: Handler::Sync(reset),
        ..BASE
    },
    CommandSpec {
        name: "select",
        arity: 2,
        summary: "Changes the selected database.",
        syntax: "index:integer",
        handler: Handler::Sync(select),
        ..BASE
    },
];

fn ping(_client: &mut Client, args: &[Bytes]) -> Reply {
    match args {
        [_] => Reply::status("PONG"),
        [_, msg] => Reply::Bulk(msg.clone()),
        // The table's arity is -1 (as in Redis), which lets this through.
        _ => super::arity_error("ping"),
    }
}

fn echo(_client: &mut Client, args: &[Bytes]) -> Reply {
    Reply::Bulk(args[1].clone())
}

fn auth(client: &mut Client, args: &[Bytes]) -> Reply {
    let (user, pass): (&[u8], &[u8]) = match args.len() {
        2 => (b"default", &args[1]),
        3 => (&args[1], &args[2]),
        _ => return super::syntax_error(),
    };
    if args.len() == 2 && client.shard.shared.config.acl.default_user().nopass {
        return Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    match super::session::log_in(client, &args[0], user, pass) {
        Ok(()) => Reply::ok(),
        Err(e) => e,
    }
}

fn hello(client: &mut Client, args: &[Bytes]) -> Reply {
    let mut proto = None;
    let mut i = 1;
    if args.len() > 1 {
        match parse_int(&args[1]) {
            Some(v @ (2 | 3)) => proto = Some(v as u8),
            Some(_) => return Reply::error("NOPROTO unsupported protocol version"),
            None => return Reply::error("ERR Protocol version is not an integer or out of range"),
        }
        i = 2;
    }
    let mut credentials = None;
    let mut setname = None;
    while i < args.len() {
        let more = args.len() - i - 1;
        if is(&args[i], "auth") && more >= 2 {
            credentials = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 3;
        } else if is(&args[i], "setname") && more >= 1 {
            setname = Some(args[i + 1].clone());
            i += 2;
        } else {
            return Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                super::sanitize(&args[i], 128)
            ));
        }
    }
    if let Some((user, pass)) = &credentials {
        if let Err(e) = super::session::log_in(client, &args[0], user, pass) {
            return e;
        }
    }
    if !client.authenticated {
        return Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    if let Some(name) = &setname {
        if !valid_name(name) {
            return Reply::error(
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
        }
        client.info.borrow_mut().name = String::from_utf8_lossy(name).into_owned();
    }
    if let Some(p) = proto {
        client.resp3 = p == 3;
        client.info.borrow_mut().resp = p;
    }
    let id = client.id();
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("redis")),
        (
            Reply::bulk("version"),
            Reply::bulk(crate::about::REDIS_VERSION),
        ),
        (
            Reply::bulk("proto"),
            Reply::Int(if client.resp3 { 3 } else { 2 }),
        ),
        (Reply::bulk("id"), Reply::Int(id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(Vec::new())),
    ])
}

fn quit(client: &mut Client, _args: &[Bytes]) -> Reply {
    client.close_after_reply = true;
    Reply::ok()
}

fn reset(client: &mut Client, _args: &[Bytes]) -> Reply {
    client.resp3 = false;
    client.no_touch = false;
    client.readonly = false;
    client.multi = None;
    client.watching.clear();
    super::session::log_out(client);
    let mut info = client.info.borrow_mut();
    info.name.clear();
    info.resp = 2;
    info.no_touch = false;
    info.no_evict = false;
    Reply::status("RESET")
}

fn select(_client: &mut Client, args: &[Bytes]) -> Reply {
    // Only db 0 exists.
    match super::parse_db_index(&args[1]) {
        Ok(0) => Reply::ok(),
        Ok(_) => Reply::error("ERR DB index is out of range"),
        Err(e) => e,
    }
}
