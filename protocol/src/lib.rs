//! kvtier-protocol: the wire, and nothing else.
//!
//! * [`request`] (with [`inline`]): bytes from a client → commands
//!   (`Vec<Bytes>` of arguments), big arguments read into exact-size
//!   buffers, Redis's protocol errors.
//! * [`reply`]: [`Reply`], what a command answers, and its RESP2/RESP3
//!   encoding into a [`ReplyBuf`] written with vectored writes (big values
//!   by reference). A `ReplyBuf` also encodes commands, for the server's
//!   links to its peers and for clients.
//! * [`reply_parser`]: the one reply parser, for everything in the project
//!   that reads replies (peer links, kvtier-bench, the tests).
//! * [`integer`]: integers parsed as Redis parses them.
//!
//! This crate depends on no other kvtier crate: it never sees the store, and
//! the store never sees bytes on the wire.

pub mod inline;
pub mod integer;
pub mod reply;
pub mod reply_parser;
pub mod request;
pub mod stream;

pub use integer::parse_i64_strict;
pub use reply::{PendingValue, RemoteReply, Reply, ReplyBuf};
pub use reply_parser::{BuildReply, ReplyError, ReplyParser};
pub use request::{ProtocolError, Request, RequestParser};
