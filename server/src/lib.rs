//! kvtier-server: a thread-per-core RESP server that is the shared storage
//! tier for LLM KV-cache blocks. The wire is kvtier-protocol's, the
//! keyspace kvtier-store's, the cluster's membership and peer links
//! kvtier-cluster's; this crate puts them to work.
//!
//! * [`server`]: start-up, the shard threads, their cron, shutdown.
//! * [`shard`]: one shard's state, its mailbox, slot → shard.
//! * [`net`]: serving a connection: read, parse, dispatch, reply.
//! * [`commands`]: the command table and one file per family; a command's
//!   behaviour is declared once, in its `CommandSpec`.
//! * [`coordination`]: what a command needs across cluster nodes
//!   (forward, redirect, spread, hot-key copies).
//! * [`report`]: INFO and the metrics, from one snapshot; [`stats`]: the
//!   per-shard counters behind them.
//! * [`acl`]: users, what they may run and touch, the ACL file; [`tls`]:
//!   rustls for clients and peer links.
//! * [`config`], [`clients`] (CLIENT LIST/KILL), [`glob`] (Redis's
//!   patterns), [`logging`] (text or JSON on stderr, its level at run time).

pub mod about;
pub mod acl;
pub mod admission;
pub mod clients;
pub mod commands;
pub mod config;
pub mod coordination;
pub mod glob;
pub mod logging;
pub mod net;
pub mod report;
pub mod server;
pub mod shard;
pub mod shared;
pub mod stats;
pub mod tls;
