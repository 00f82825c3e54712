//! One batch of a connection's requests: the replies in order, the commands
//! waiting to run on other shards, and how the batch ended.

use kvtier_protocol::Reply;

use crate::commands::ShardOp;

/// A reply slot of the current batch, encoded in the protocol that was in
/// force when its command ran.
pub(super) struct Entry {
    pub(super) reply: Option<Reply>,
    pub(super) resp3: bool,
}

/// A command waiting to run on another shard.
pub(super) struct Remote {
    pub(super) entry: usize,
    pub(super) id: usize,
    pub(super) op: ShardOp,
}

/// The commands of one read, in order.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) entries: Vec<Entry>,
    pub(super) remote: Vec<Vec<Remote>>,
    pub(super) remote_count: usize,
    /// The shard's round mark when the batch began (see `finish`).
    pub(super) rounds_from: u64,
}

/// How a batch of requests ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchEnd {
    /// Every complete request in the read buffer was taken.
    Drained,
    /// The batch is full (or so are the replies): the rest is taken right
    /// after these replies go out, before any read.
    CutShort,
    /// A command asked for the connection to close (QUIT, a deleted user).
    Closing,
    /// The request could not be parsed: its error
    /// ([`Connection::protocol_error`]) is the last reply.
    Fatal,
}
