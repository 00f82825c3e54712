//! kvtier-cluster: what a node knows and does as one of several, with no
//! knowledge of commands (the server decides what a command needs; see
//! its `coordination` module).
//!
//! * [`topology`]: the slot map every node computes from the node list.
//! * [`membership`]: the node list and its epoch, which nodes answer
//!   ([`Cluster`]), kept by a gossip thread ([`gossip`]) that pings every
//!   peer with `CLUSTER PING`, carrying the list so the highest epoch
//!   (CLUSTER SETNODES) spreads.
//! * [`peer`]: pooled, pipelined connections that carry forwarded commands,
//!   and who this node is to its peers ([`peer::Identity`]).
//! * [`hot`]: read counting and the copies of other nodes' hot keys;
//!   [`copies`]: the copy / lease / invalidation exchange.
//!
//! Depends on kvtier-protocol (the wire to peers) and kvtier-store (the
//! slot function) only.

pub mod copies;
pub mod gossip;
pub mod hot;
pub mod membership;
pub mod peer;
pub mod topology;

pub use membership::{parse_announce, Cluster, ClusterStats, Settings};
