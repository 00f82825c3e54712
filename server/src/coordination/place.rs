//! Where the keys of a command live, as routing needs to know: here, on
//! one other node (forwarded, or redirected with `-MOVED`), or on several
//! (coordinated, or refused with CROSSSLOT).

use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;

use crate::commands::{flags, Args, Client, CommandSpec, Spread};

/// Where the keys of a command live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Here (every key, or none, or a command that always runs here).
    Here,
    /// On one other node, answered `-MOVED slot` (`--cluster-redirect`).
    Moved(u16),
    /// On this node (index into the view): sent there, its reply relayed.
    Forward(usize),
    /// On several nodes: spread over them as its spec says.
    Coordinate,
    /// On several nodes, for a command that cannot be spread.
    CrossSlot,
}

/// Where `args` (for `spec`) runs, by the owners of its keys' slots.
pub fn place(
    client: &Client,
    cluster: &Cluster,
    view: &View,
    spec: &CommandSpec,
    args: &Args,
) -> Place {
    if spec.keys.first <= 0 || spec.has(flags::HERE) {
        return Place::Here;
    }
    // No keys found (none, or a bad key count: the command's own error to
    // report).
    let Some((&(_, slot), rest)) = args.keys.split_first() else {
        return Place::Here;
    };
    let owner = view.owner(slot);
    let mut one_slot = true;
    let mut one_node = true;
    let mut all_mine = view.me == Some(owner);
    for &(_, s) in rest {
        one_slot &= s == slot;
        let o = view.owner(s);
        one_node &= o == owner;
        all_mine &= view.me == Some(o);
    }
    if all_mine {
        return Place::Here;
    }
    if one_node {
        // A READONLY client reading from a replica of the slot: read
        // through from the owner rather than redirecting.
        let replica_read = cluster.replica_reads
            && client.readonly
            && spec.has(flags::READONLY)
            && view
                .me
                .is_some_and(|me| view.replicas(slot, cluster.hot_replicas).contains(&me));
        if cluster.redirect && one_slot && !replica_read {
            return Place::Moved(slot);
        }
        return Place::Forward(owner);
    }
    if spec.spread != Spread::No {
        Place::Coordinate
    } else {
        Place::CrossSlot
    }
}
