//! ACL and the permission check every command passes: ACL SETUSER /
//! GETUSER / DELUSER / LIST / USERS / WHOAMI / CAT / LOG / SAVE / LOAD /
//! DRYRUN / GENPASS, and logging in (AUTH, HELLO ... AUTH). The users and
//! their rules are [`crate::acl`]'s; this family is how clients reach them.

use bytes::Bytes;
use kvtier_protocol::Reply;

use super::flags::*;
use super::help_reply;
use super::session::{permits, Denied};
use super::{parse_int, sanitize, Args, Client, CommandSpec, Handler, LocalBoxFuture, DEFAULTS};
use crate::acl::category;

const SUB: CommandSpec = CommandSpec {
    arity: 2,
    flags: ADMIN | NOSCRIPT | LOADING | STALE,
    group: "server",
    since: "6.0.0",
    ..DEFAULTS
};

/// ACL.
pub const COMMANDS: &[CommandSpec] = &[CommandSpec {
    name: "acl",
    arity: -2,
    flags: 0,
    summary: "A container for Access List Control commands.",
    complexity: "Depends on subcommand.",
    subcommands: &[
        CommandSpec {
            name: "acl|cat",
            arity: -2,
            flags: NOSCRIPT | LOADING | STALE,
            summary: "Lists the ACL categories, or the commands inside a category.",
            syntax: "[category]",
            handler: Handler::Sync(cat),
            ..SUB
        },
        CommandSpec {
            name: "acl|deluser",
            arity: -3,
            summary: "Deletes ACL users, and terminates their connections.",
            complexity: "O(1) amortized time considering the typical user.",
            syntax: "username [username ...]",
            handler: Handler::Async(deluser),
            ..SUB
        },
        CommandSpec {
            name: "acl|dryrun",
            arity: -4,
            since: "7.0.0",
            summary: "Simulates the execution of a command by a user, without executing the command.",
            syntax: "username command [arg [arg ...]]",
            handler: Handler::Sync(dryrun),
            ..SUB
        },
        CommandSpec {
            name: "acl|genpass",
            arity: -2,
            flags: NOSCRIPT | LOADING | STALE,
            summary: "Generates a pseudorandom, secure password that can be used to identify ACL users.",
            syntax: "[bits:integer]",
            handler: Handler::Sync(genpass),
            ..SUB
        },
        CommandSpec {
            name: "acl|getuser",
            arity: 3,
            summary: "Lists the ACL rules of a user.",
            complexity: "O(N). Where N is the number of password, command and pattern rules that the user has.",
            syntax: "username",
            handler: Handler::Sync(getuser),
            ..SUB
        },
        CommandSpec {
            name: "acl|list",
            summary: "Dumps the effective rules in ACL file format.",
            complexity: "O(N). Where N is the number of configured users.",
            handler: Handler::Sync(list),
            ..SUB
        },
        CommandSpec {
            name: "acl|load",
            summary: "Reloads the rules from the configured ACL file.",
            complexity: "O(N). Where N is the number of configured users.",
            handler: Handler::Async(load),
            ..SUB
        },
        CommandSpec {
            name: "acl|log",
            arity: -2,
            summary: "Lists recent security events generated due to ACL rules.",
            complexity: "O(N) with N being the number of entries shown.",
            syntax: "[count:integer|RESET]",
            handler: Handler::Sync(log),
            ..SUB
        },
        CommandSpec {
            name: "acl|save",
            summary: "Saves the effective ACL rules in the configured ACL file.",
            complexity: "O(N). Where N is the number of configured users.",
            handler: Handler::Sync(save),
            ..SUB
        },
        CommandSpec {
            name: "acl|setuser",
            arity: -3,
            summary: "Creates and modifies an ACL user and its rules.",
            complexity: "O(N). Where N is the number of rules provided.",
            syntax: "username [rule [rule ...]]",
            handler: Handler::Sync(setuser),
            ..SUB
        },
        CommandSpec {
            name: "acl|users",
            summary: "Lists all ACL users.",
            complexity: "O(N). Where N is the number of configured users.",
            handler: Handler::Sync(users),
            ..SUB
        },
        CommandSpec {
            name: "acl|whoami",
            flags: NOSCRIPT | LOADING | STALE,
            summary: "Returns the authenticated username of the current connection.",
            handler: Handler::Sync(whoami),
            ..SUB
        },
        CommandSpec {
            name: "acl|help",
            flags: LOADING | STALE,
            summary: "Returns helpful text about the different subcommands.",
            handler: Handler::Sync(help),
            ..SUB
        },
    ],
    ..SUB
}];

fn text(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).into_owned()
}

fn cat(client: &mut Client, args: &[Bytes]) -> Reply {
    let catalog = client.shard.shared.catalog;
    match args.get(2) {
        None => Reply::Array(
            category::NAMES
                .iter()
                .map(|(_, name)| Reply::bulk(*name))
                .collect(),
        ),
        Some(name) => match category::by_name(name) {
            Some(bits) => Reply::Array(
                catalog
                    .in_category(bits)
                    .map(|id| Reply::bulk(catalog.names[id]))
                    .collect(),
            ),
            None => Reply::error(format!("ERR Unknown category '{}'", sanitize(name, 128))),
        },
    }
}

fn deluser(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let names: Vec<String> = args[2..].iter().map(|a| text(a)).collect();
        let removed = match client.acl().delete(&names) {
            Ok(n) => n,
            Err(e) => return Reply::error(e),
        };
        if names.contains(&client.user.name) {
            // Its own user: closed once this reply is written.
            client.close_after_reply = true;
        }
        super::session::kill_users(client, names).await;
        Reply::Int(removed as i64)
    })
}

fn dryrun(client: &mut Client, args: &[Bytes]) -> Reply {
    let Some(user) = client.acl().user(&text(&args[2])) else {
        return Reply::error(format!("ERR User '{}' not found", sanitize(&args[2], 128)));
    };
    let command = &args[3..];
    let t = client.commands;
    let Some((mut id, mut spec)) = t.lookup(&command[0]) else {
        return Reply::error(format!(
            "ERR Command '{}' not found",
            sanitize(&command[0], 128)
        ));
    };
    if !spec.subcommands.is_empty() && command.len() >= 2 {
        match t.lookup_sub(id, &command[1]) {
            Some(found) => (id, spec) = found,
            None => {
                return Reply::error(format!(
                    "ERR Command '{}' not found",
                    sanitize(&command[0], 128)
                ))
            }
        }
    }
    if !spec.arity_ok(command.len()) {
        return Reply::error(format!(
            "ERR wrong number of arguments for '{}' command",
            spec.name
        ));
    }
    let command = Args::of(spec, command.to_vec());
    match permits(client.shard.shared.catalog, &user, id, spec, &command) {
        Ok(()) => Reply::ok(),
        Err(Denied::Command) => Reply::bulk(format!(
            "This user has no permissions to run the '{}' command",
            spec.name
        )),
        Err(Denied::Key(i)) => Reply::bulk(format!(
            "This user has no permissions to access the '{}' key",
            text(&command[i])
        )),
    }
}

fn genpass(_client: &mut Client, args: &[Bytes]) -> Reply {
    let bits = match args.get(2) {
        None => 256,
        Some(a) => match parse_int(a) {
            None => return super::not_integer(),
            Some(n @ 1..=4096) => n as usize,
            Some(_) => {
                return Reply::error(
                    "ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096",
                )
            }
        },
    };
    let chars = bits.div_ceil(4);
    let mut random = vec![0u8; chars.div_ceil(2)];
    if let Err(e) = fill_random(&mut random) {
        return Reply::error(format!("ERR no random source: {e}"));
    }
    Reply::bulk(&crate::acl::user::hex(&random)[..chars])
}

/// Fills `out` from the kernel's random source.
fn fill_random(out: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(out)
}

fn getuser(client: &mut Client, args: &[Bytes]) -> Reply {
    let Some(user) = client.acl().user(&text(&args[2])) else {
        return Reply::Nil;
    };
    let catalog = client.shard.shared.catalog;
    let selector_map = |s: &crate::acl::user::Selector| {
        vec![
            (
                Reply::bulk("commands"),
                Reply::bulk(s.describe_commands(catalog)),
            ),
            (Reply::bulk("keys"), Reply::bulk(s.describe_keys())),
            (Reply::bulk("channels"), Reply::bulk(s.describe_channels())),
        ]
    };
    let mut map = vec![
        (
            Reply::bulk("flags"),
            Reply::Array(user.flags().into_iter().map(Reply::bulk).collect()),
        ),
        (
            Reply::bulk("passwords"),
            Reply::Array(
                user.passwords
                    .iter()
                    .map(|h| Reply::bulk(crate::acl::user::hex(h)))
                    .collect(),
            ),
        ),
    ];
    map.extend(selector_map(&user.root));
    map.push((
        Reply::bulk("selectors"),
        Reply::Array(
            user.selectors
                .iter()
                .map(|s| Reply::Map(selector_map(s)))
                .collect(),
        ),
    ));
    Reply::Map(map)
}

fn list(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Array(client.acl().list().into_iter().map(Reply::bulk).collect())
}

fn load(client: &mut Client, _args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let requirepass = client.shard.shared.config.requirepass_text();
        let before = client.acl().names();
        if let Err(e) = client.acl().load(&requirepass) {
            return Reply::error(format!("ERR {e}"));
        }
        // The connections of users the file no longer has are closed.
        let now = client.acl().names();
        let removed: Vec<String> = before.into_iter().filter(|n| !now.contains(n)).collect();
        if removed.contains(&client.user.name) {
            client.close_after_reply = true;
        }
        if !removed.is_empty() {
            super::session::kill_users(client, removed).await;
        }
        Reply::ok()
    })
}

fn save(client: &mut Client, _args: &[Bytes]) -> Reply {
    match client.acl().save() {
        Ok(()) => Reply::ok(),
        Err(e) => Reply::error(format!("ERR {e}")),
    }
}

fn log(client: &mut Client, args: &[Bytes]) -> Reply {
    let count = match args.get(2) {
        None => 10,
        Some(a) if super::is(a, "reset") => {
            client.acl().reset_log();
            return Reply::ok();
        }
        Some(a) => match parse_int(a) {
            Some(n) => n.max(0) as usize,
            None => return super::not_integer(),
        },
    };
    Reply::Array(
        client
            .acl()
            .log_entries(count)
            .into_iter()
            .map(|e| {
                let d = e.denial;
                Reply::Map(vec![
                    (Reply::bulk("count"), Reply::Int(e.count as i64)),
                    (Reply::bulk("reason"), Reply::bulk(d.reason)),
                    (Reply::bulk("context"), Reply::bulk(d.context)),
                    (Reply::bulk("object"), Reply::bulk(d.object)),
                    (Reply::bulk("username"), Reply::bulk(d.username)),
                    (
                        Reply::bulk("age-seconds"),
                        Reply::Double(e.at.elapsed().as_millis() as f64 / 1000.0),
                    ),
                    (Reply::bulk("client-info"), Reply::bulk(d.client_info)),
                ])
            })
            .collect(),
    )
}

fn setuser(client: &mut Client, args: &[Bytes]) -> Reply {
    let name = &args[2];
    if name.is_empty() || !crate::acl::user::fits_a_line(name) {
        return Reply::error("ERR Usernames can't contain spaces or null characters");
    }
    let ops: Vec<Vec<u8>> = args[3..].iter().map(|a| a.to_vec()).collect();
    match client.acl().set_user(&text(name), &ops) {
        Ok(()) => Reply::ok(),
        Err(why) => Reply::error(format!("ERR {}", sanitize(why.as_bytes(), 512))),
    }
}

fn users(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::Array(client.acl().names().into_iter().map(Reply::bulk).collect())
}

fn whoami(client: &mut Client, _args: &[Bytes]) -> Reply {
    Reply::bulk(client.user.name.clone())
}

fn help(_client: &mut Client, _args: &[Bytes]) -> Reply {
    help_reply(
        "ACL",
        &[
            "CAT [<category>]",
            "    List all commands that belong to <category>, or all command categories",
            "    when no category is specified.",
            "DELUSER <username> [<username> ...]",
            "    Delete a list of users.",
            "DRYRUN <username> <command> [<arg> ...]",
            "    Returns whether the user can execute the given command without executing the command.",
            "GETUSER <username>",
            "    Get the user's details.",
            "GENPASS [<bits>]",
            "    Generate a secure 256-bit user password. The optional `bits` argument can",
            "    be used to specify a different size.",
            "LIST",
            "    Show users details in config file format.",
            "LOAD",
            "    Reload users from the ACL file.",
            "LOG [<count> | RESET]",
            "    Show the ACL log entries.",
            "SAVE",
            "    Save the current config to the ACL file.",
            "SETUSER <username> <attribute> [<attribute> ...]",
            "    Create or modify a user with the specified attributes.",
            "USERS",
            "    List all the registered usernames.",
            "WHOAMI",
            "    Return the current connection username.",
        ],
    )
}
