//! A connection's session with the users: logging in and out (AUTH, HELLO
//! ... AUTH, RESET), the permission check every command passes (and EXEC's
//! second look), and closing the connections of deleted users. The users
//! and their rules are [`crate::acl`]'s; the ACL command family and the
//! connection family both reach them through here.

use std::sync::Arc;

use kvtier_protocol::Reply;

use super::flags::*;
use super::{Args, Client, CommandSpec};
use crate::acl::{Acl, Catalog, Denial, User};

/// Why a user may not run a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The command itself.
    Command,
    /// The key at this argument.
    Key(usize),
}

/// Whether `user` may run `spec` (table id `id`) with `args`: some selector
/// allows the command and every key as the command uses it. When none
/// does, the refusal reported is Redis's: a key if some selector allowed
/// the command (the latest such key), else the command.
pub fn permits(
    catalog: &Catalog,
    user: &User,
    id: usize,
    spec: &CommandSpec,
    args: &Args,
) -> Result<(), Denied> {
    let write = spec.has(WRITE);
    let first = args
        .get(if catalog.is_sub[id] { 2 } else { 1 })
        .map(|a| &a[..]);
    let mut worst = Denied::Command;
    for selector in user.all_selectors() {
        if !spec.has(NO_AUTH) && !selector.may_run(id, first) {
            continue;
        }
        let refused = args
            .keys
            .iter()
            .map(|&(i, _)| i)
            .find(|&i| !selector.may_touch(&args[i], spec.key_use.needs(write, args, i)))
            .or_else(|| {
                spec.option_key
                    .and_then(|f| f(args))
                    .filter(|&i| !selector.may_touch(&args[i], 0))
            });
        match refused {
            None => return Ok(()),
            Some(i) => {
                if !matches!(worst, Denied::Key(j) if j >= i) {
                    worst = Denied::Key(i);
                }
            }
        }
    }
    Err(worst)
}

/// The check before a command runs: `Err` is the NOPERM reply, and the
/// refusal goes to ACL LOG. Users allowed everything skip it.
pub fn check(client: &Client, id: usize, spec: &CommandSpec, args: &Args) -> Result<(), Reply> {
    if client.user.unrestricted() {
        return Ok(());
    }
    let denied = match permits(client.shard.shared.catalog, &client.user, id, spec, args) {
        Ok(()) => return Ok(()),
        Err(denied) => denied,
    };
    let (reason, object, reply) = match denied {
        Denied::Command => (
            "command",
            spec.name.to_string(),
            format!(
                "NOPERM this user has no permissions to run the '{}' command",
                spec.name
            ),
        ),
        Denied::Key(i) => (
            "key",
            String::from_utf8_lossy(&args[i]).into_owned(),
            "NOPERM this user has no permissions to access one of the keys used as arguments"
                .to_string(),
        ),
    };
    client
        .acl()
        .log(denial(client, reason, object, client.user.name.clone()));
    Err(Reply::error(reply))
}

/// EXEC's second look: a queued command the user may no longer run (its
/// rules changed after MULTI) gets Redis's error in its place, logged.
pub fn recheck(client: &Client, id: usize, spec: &CommandSpec, args: &Args) -> Option<Reply> {
    if client.user.unrestricted() || client.peer {
        return None;
    }
    let denied = permits(client.shard.shared.catalog, &client.user, id, spec, args).err()?;
    let (reason, object, why) = match denied {
        Denied::Command => (
            "command",
            spec.name.to_string(),
            "no permission to execute the command or subcommand",
        ),
        Denied::Key(i) => (
            "key",
            String::from_utf8_lossy(&args[i]).into_owned(),
            "no permission to touch the specified keys",
        ),
    };
    let mut entry = denial(client, reason, object, client.user.name.clone());
    entry.context = "multi";
    client.acl().log(entry);
    Some(Reply::error(format!(
        "NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following reason: {why}"
    )))
}

fn denial(client: &Client, reason: &'static str, object: String, username: String) -> Denial {
    Denial {
        reason,
        context: if client.multi.is_some() {
            "multi"
        } else {
            "toplevel"
        },
        object,
        username,
        client_info: client.info.borrow().line(),
    }
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Logs the connection in as `user` with `password` (AUTH, HELLO ...
/// AUTH); `command` is the name the client sent, for ACL LOG.
pub fn log_in(
    client: &mut Client,
    command: &[u8],
    user: &[u8],
    password: &[u8],
) -> Result<(), Reply> {
    // The epoch first: a change landing between the two reads is then seen
    // at the next command.
    let epoch = client.acl().epoch();
    match client.acl().authenticate(user, password) {
        Some(found) => {
            client.info.borrow_mut().user = found.name.clone();
            client.user = found;
            client.acl_epoch = epoch;
            client.authenticated = true;
            // Logged in anew: no longer a peer's connection.
            client.peer = false;
            Ok(())
        }
        None => {
            let name = String::from_utf8_lossy(user).into_owned();
            let object = String::from_utf8_lossy(command).into_owned();
            client.acl().log(denial(client, "auth", object, name));
            Err(Reply::error(WRONGPASS))
        }
    }
}

/// Before each command: a connection whose user changed takes the new
/// rules; `false` if the user was deleted (the connection is closed, as
/// ACL DELUSER closes it).
pub fn refresh(client: &mut Client) -> bool {
    let acl = &client.shard.shared.config.acl;
    let epoch = acl.epoch();
    if epoch == client.acl_epoch {
        return true;
    }
    match acl.user(&client.user.name) {
        Some(user) => {
            client.user = user;
            client.acl_epoch = epoch;
            // The default user lost its password (`CONFIG SET requirepass
            // ""`): a client waiting to AUTH is in, as Redis lets it.
            if !client.authenticated && client.user.name == "default" && acl.open() {
                client.authenticated = true;
            }
            true
        }
        None => false,
    }
}

/// Logs a connection out: back to the default user, logged in only if
/// that needs no password (RESET).
pub fn log_out(client: &mut Client) {
    let acl = client.acl();
    let epoch = acl.epoch();
    let (user, open) = (acl.default_user(), acl.open());
    client.user = user;
    client.acl_epoch = epoch;
    client.authenticated = open;
    client.peer = false;
    client.info.borrow_mut().user = "default".into();
}

/// The default user, for a connection that has not logged in.
pub fn initial_user(acl: &Acl) -> (Arc<User>, u64) {
    let epoch = acl.epoch();
    (acl.default_user(), epoch)
}

/// Closes every connection logged in as one of `users` (ACL DELUSER), the
/// caller's after its reply.
pub async fn kill_users(client: &Client, users: Vec<String>) {
    let me = client.id();
    let users = std::sync::Arc::new(users);
    let _ = client
        .shard
        .call_all(move |s| {
            s.clients
                .borrow()
                .kill(|c| users.contains(&c.user), Some(me))
        })
        .await;
}
