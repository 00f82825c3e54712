//! One admission step between a connection and the commands. Every request
//! passes it once ([`admit`]), in Redis's order: the session refreshed (a
//! deleted user's connection closes), the command looked up (and its
//! subcommand), its arity, AUTH, the user's permission, its arguments
//! parsed (their keys' slots found once, for routing, fan-out and the
//! store), and in a cluster the path it runs by: here, through another
//! node, or answered already (forwarded, redirected). What comes out runs
//! as its spec says (`commands::Plan`); net only carries it.

use bytes::Bytes;
use kvtier_protocol::Reply;

use crate::commands::registry::table;
use crate::commands::{
    arity_error, flags, session, unknown_command, unknown_subcommand, Args, Client, CommandSpec,
    Handler,
};
use crate::coordination::{self, Routed, Through};

/// What admission decided for one request.
pub enum Admitted {
    /// Runs: the command (its statistics id and spec), its arguments and,
    /// in a cluster, the path it takes through other nodes.
    Run {
        /// The command's statistics id.
        id: usize,
        /// The command (the subcommand, for a container).
        spec: &'static CommandSpec,
        /// Its arguments, keys' slots found.
        args: Args,
        /// Its path through other nodes, if not here.
        through: Option<Through>,
    },
    /// Answered at admission: refused (lookup, arity, AUTH, permission;
    /// `ran` is `None`), or done by a cluster path (forwarded, redirected;
    /// `ran` is the command's id, counted as having run). Inside MULTI
    /// either dooms the transaction.
    Answered {
        /// The reply to send.
        reply: Reply,
        /// The command that ran, if one did.
        ran: Option<usize>,
    },
    /// The client's user was deleted (ACL DELUSER, ACL LOAD): the
    /// connection closes.
    Close,
}

/// The last command a connection looked up: pipelines repeat one, so the
/// name as sent is compared with it before it is hashed.
#[derive(Default)]
pub struct LastLookup(Option<(Bytes, usize, &'static CommandSpec)>);

/// Admits one request of `client` (see the module's comment).
#[inline(always)]
pub fn admit(client: &mut Client, last: &mut LastLookup, request: Vec<Bytes>) -> Admitted {
    if !session::refresh(client) {
        return Admitted::Close;
    }
    let (id, spec) = match resolve(client, last, &request) {
        Ok(found) => found,
        Err(reply) => return Admitted::Answered { reply, ran: None },
    };
    let args = Args::of(spec, request);
    // A peer's commands were checked on the node that took them.
    if !client.peer {
        if let Err(refusal) = session::check(client, id, spec, &args) {
            reject(client, id);
            return Admitted::Answered {
                reply: refusal,
                ran: None,
            };
        }
    }
    // In a cluster, keys of other nodes are forwarded, redirected or
    // coordinated; writes to keys with copies elsewhere drop the copies
    // before they reply (see `coordination`).
    let Some(cluster) = client.shard.shared.cluster.clone() else {
        return Admitted::Run {
            id,
            spec,
            args,
            through: None,
        };
    };
    match coordination::route(client, &cluster, spec, args) {
        Routed::Here(args) => Admitted::Run {
            id,
            spec,
            args,
            through: None,
        },
        Routed::Through(t, args) => Admitted::Run {
            id,
            spec,
            args,
            through: Some(t),
        },
        Routed::Done(reply) => Admitted::Answered {
            reply,
            ran: Some(id),
        },
    }
}

/// Finds the command (or subcommand) and checks arity and AUTH, with
/// Redis's errors in Redis's order (the user's permission is checked next,
/// on the parsed arguments).
#[inline(always)]
fn resolve(
    client: &mut Client,
    last: &mut LastLookup,
    args: &[Bytes],
) -> Result<(usize, &'static CommandSpec), Reply> {
    let table = table();
    let cached = match &last.0 {
        Some((name, id, spec)) if *name == args[0] => Some((*id, *spec)),
        _ => None,
    };
    let (mut id, mut spec) = match cached.or_else(|| table.lookup(&args[0])) {
        Some(found) => found,
        None => return Err(unknown_command(args)),
    };
    if cached.is_none() {
        last.0 = Some((Bytes::copy_from_slice(&args[0]), id, spec));
    }
    if !spec.subcommands.is_empty() && (args.len() >= 2 || matches!(spec.handler, Handler::Parent))
    {
        match args.get(1).and_then(|sub| table.lookup_sub(id, sub)) {
            Some(found) => (id, spec) = found,
            None if args.len() < 2 => return Err(arity_error(spec.name)),
            None => {
                reject(client, id);
                return Err(unknown_subcommand(spec.name, &args[1]));
            }
        }
    }
    if !spec.arity_ok(args.len()) {
        reject(client, id);
        return Err(arity_error(spec.name));
    }
    // As in Redis, unknown commands and wrong arities are reported before
    // a missing AUTH, and that before a missing permission.
    if !client.authenticated && !spec.has(flags::NO_AUTH) {
        reject(client, id);
        return Err(Reply::error("NOAUTH Authentication required."));
    }
    Ok((id, spec))
}

/// Counts a refused call of command `id` (INFO commandstats'
/// `rejected_calls`).
fn reject(client: &Client, id: usize) {
    client.shard.stats.borrow_mut().reject(Some(id));
}
