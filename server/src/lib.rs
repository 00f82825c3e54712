//! kvtier-server: a thread-per-core RESP server that is the shared storage
//! tier for LLM KV-cache blocks.
//!
//! * [`shard`]: threads, slots and mailboxes.
//! * [`commands`]: the command table, by family.
//! * [`net`]: serving a connection.
//! * [`server`]: start-up, shutdown and background work.
//! * [`long_double`]: INCRBYFLOAT's x87 extended-precision arithmetic.

pub mod clients;
pub mod commands;
pub mod config;
pub mod coordination;
pub mod glob;
pub mod long_double;
pub mod net;
pub mod report;
pub mod server;
pub mod shard;
pub mod stats;

/// The Redis version kvtier reports (INFO, HELLO): the command set and
/// replies follow Redis 7.
pub const REDIS_VERSION: &str = "7.2.4";
