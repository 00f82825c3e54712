//! Reporting: what the shards and the node count, taken as one snapshot and
//! rendered two ways — INFO sections and Prometheus metrics — so the two
//! always show the same figures.
//!
//! * [`ShardReport`]: one shard's figures, taken on its own thread
//!   ([`ShardReport::of`]). INFO gathers every shard's ([`gather`]) and
//!   adds them up; each shard's cron hands its own to an [`Exporter`] once
//!   a second, and shard 0 adds the node's (spill tier, cluster, process).
//! * One file per INFO section (two for close pairs): its lines, and the
//!   metrics it declares next to them ([`Metric`]: name, type, help), both
//!   from the same snapshot.
//!
//! | file | INFO sections | metrics |
//! |---|---|---|
//! | `server_info.rs` | server, persistence, replication, cpu, modules | — |
//! | `clients.rs` | clients | connections, connected clients |
//! | `memory.rs` | memory, slabs | used memory, maxmemory, RSS, slab classes |
//! | `stats.rs` | stats, errorstats | net bytes, expiries, evictions, hits |
//! | `commands.rs` | commandstats | calls, errors, latency per command |
//! | `keyspace.rs` | keyspace, shards | keys per shard |
//! | `spill.rs` | spill | the spill tier's |
//! | `cluster.rs` | cluster | the cluster's |

mod clients;
mod cluster;
mod commands;
mod keyspace;
mod memory;
pub mod metric;
mod server_info;
mod spill;
mod stats;

use std::fmt::{Display, Write};

use kvtier_store::slab::ArenaStats;
use kvtier_store::StoreStats;

pub use metric::{describe_metrics, Exporter, Metric};

use crate::shard::{Shard, ShardGone};
use crate::shared::Shared;
use crate::stats::CommandStat;

/// One shard's figures at one moment.
pub struct ShardReport {
    /// The shard.
    pub id: usize,
    /// Keys (including expired ones not yet collected).
    pub keys: usize,
    /// Keys with a TTL.
    pub volatile: usize,
    /// Mean TTL of volatile keys, ms.
    pub avg_ttl: u64,
    /// Bytes charged.
    pub used_memory: usize,
    /// Bytes charged to the index (keys, overhead, small values).
    pub index_memory: usize,
    /// Store counters.
    pub store: StoreStats,
    /// The slab arena's figures.
    pub arena: ArenaStats,
    /// Keys with a record in the spill tier.
    pub spill_keys: usize,
    /// Keys lookups hold against eviction, and their bytes.
    pub holds: (usize, usize),
    /// Connections.
    pub clients: usize,
    /// Clients in a blocking wait.
    pub blocked_clients: u64,
    /// Blocking reads refused by `max-blocked-clients`.
    pub blocked_clients_refused: u64,
    /// Keys blocked clients wait for.
    pub blocking_keys: u64,
    /// Commands executed.
    pub commands: u64,
    /// Connections accepted.
    pub connections_received: u64,
    /// Connections refused.
    pub rejected_connections: u64,
    /// Clients closed by client-query-buffer-limit.
    pub query_buffer_closed: u64,
    /// Clients closed by maxmemory-clients.
    pub evicted_clients: u64,
    /// Clients closed by client-output-buffer-limit.
    pub output_buffer_closed: u64,
    /// Bytes in.
    pub net_input: u64,
    /// Bytes out.
    pub net_output: u64,
    /// Commands per second, recent.
    pub ops_per_sec: u64,
    /// Error replies by code.
    pub errors: Vec<(String, u64)>,
    /// Error replies.
    pub error_replies: u64,
    /// Per command (by statistics id).
    pub command_stats: Vec<CommandStat>,
    /// Reads of other shards' keys taken without waking their thread.
    pub direct_reads: u64,
    /// Chain writes over shards stored whole on this thread.
    pub direct_writes: u64,
    /// Jobs sent to other shards' mailboxes and awaited.
    pub mailbox_calls: u64,
    /// Microseconds connections spent polling before the thread slept.
    pub idle_poll_us: u64,
    /// Requests read while their connection was polling.
    pub idle_poll_hits: u64,
    /// CONFIG RESETSTAT calls so far (they zero the counts above).
    pub resets: u64,
}

impl ShardReport {
    /// `shard`'s figures now (on its own thread).
    pub fn of(shard: &Shard) -> ShardReport {
        let store = shard.store.lock();
        let stats = shard.stats.borrow();
        let now = kvtier_store::now_ms();
        ShardReport {
            id: shard.id,
            keys: store.len(),
            volatile: store.volatile_len(),
            avg_ttl: store.avg_ttl(now),
            used_memory: store.used_memory(),
            index_memory: store.index_memory(),
            store: store.stats,
            arena: store.arena_stats(),
            spill_keys: store.spill_keys(),
            holds: (store.holds().len(), store.holds().bytes()),
            clients: shard.clients.borrow().len(),
            blocked_clients: stats.blocked_clients,
            blocked_clients_refused: stats.blocked_clients_refused,
            blocking_keys: store.watched_keys() as u64,
            commands: stats.total_commands,
            connections_received: stats.connections_received,
            rejected_connections: stats.rejected_connections,
            query_buffer_closed: stats.query_buffer_closed,
            evicted_clients: stats.evicted_clients,
            output_buffer_closed: stats.output_buffer_closed,
            net_input: stats.net_input_bytes,
            net_output: stats.net_output_bytes,
            ops_per_sec: stats.ops_per_sec(),
            errors: stats.errors.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            error_replies: stats.total_error_replies,
            command_stats: stats.commands.clone(),
            direct_reads: stats.direct_reads,
            direct_writes: stats.direct_writes,
            mailbox_calls: stats.mailbox_calls,
            idle_poll_us: stats.idle_poll_us,
            idle_poll_hits: stats.idle_poll_hits,
            resets: stats.resets,
        }
    }
}

/// Every shard's report, in shard order.
pub async fn gather(shard: &Shard) -> Result<Vec<ShardReport>, ShardGone> {
    shard.call_all(ShardReport::of).await
}

/// The sum of `f` over the shards.
pub fn sum(reports: &[ShardReport], f: impl Fn(&ShardReport) -> u64) -> u64 {
    reports.iter().map(f).sum()
}

/// INFO text being built: `# Title` headers and `name:value` lines.
#[derive(Default)]
pub struct Info {
    text: String,
}

impl Info {
    fn section(&mut self, title: &str) {
        if !self.text.is_empty() {
            self.text.push_str("\r\n");
        }
        let _ = write!(self.text, "# {title}\r\n");
    }

    /// One `name:value` line.
    pub fn field(&mut self, name: impl Display, value: impl Display) {
        let _ = write!(self.text, "{name}:{value}\r\n");
    }
}

/// Renders one INFO section from the snapshot.
type Render = fn(&mut Info, &Shared, &[ShardReport]);

/// Every INFO section: name, title, renderer.
const SECTIONS: &[(&str, &str, Render)] = &[
    ("server", "Server", server_info::server),
    ("clients", "Clients", clients::info),
    ("memory", "Memory", memory::info),
    ("persistence", "Persistence", server_info::persistence),
    ("stats", "Stats", stats::info),
    ("replication", "Replication", server_info::replication),
    ("cpu", "CPU", server_info::cpu),
    ("modules", "Modules", server_info::modules),
    ("errorstats", "Errorstats", stats::errorstats),
    ("cluster", "Cluster", cluster::info),
    ("keyspace", "Keyspace", keyspace::info),
    ("spill", "Spill", spill::info),
    ("commandstats", "Commandstats", commands::info),
    ("slabs", "Slabs", memory::slabs),
    ("shards", "Shards", keyspace::shards),
];

/// Sections INFO shows with no argument (or `default`): the first twelve.
const DEFAULT_SECTIONS: usize = 12;

/// The sections an INFO call asks for, in the order asked, each once.
pub fn info_sections(args: &[bytes::Bytes]) -> Vec<&'static str> {
    let mut wanted: Vec<&'static str> = Vec::new();
    let mut add = |name: &'static str| {
        if !wanted.contains(&name) {
            wanted.push(name);
        }
    };
    let defaults = || SECTIONS[..DEFAULT_SECTIONS].iter().map(|s| s.0);
    for a in args {
        let asked = String::from_utf8_lossy(a).to_ascii_lowercase();
        match asked.as_str() {
            "default" => defaults().for_each(&mut add),
            "all" | "everything" => SECTIONS.iter().for_each(|s| add(s.0)),
            _ => {
                if let Some(s) = SECTIONS.iter().find(|s| s.0 == asked) {
                    add(s.0);
                }
            }
        }
    }
    if args.is_empty() {
        defaults().for_each(&mut add);
    }
    wanted
}

/// The INFO text of `sections` (names from [`info_sections`]).
pub fn render_info(shared: &Shared, sections: &[&str], reports: &[ShardReport]) -> String {
    let mut out = Info::default();
    for name in sections {
        if let Some((_, title, render)) = SECTIONS.iter().find(|s| s.0 == *name) {
            out.section(title);
            render(&mut out, shared, reports);
        }
    }
    out.text
}

/// Hands one shard's figures to the metrics recorder (`shard`, whose
/// counts CONFIG RESETSTAT zeroes); shard 0 also hands the node's (`node`:
/// the spill tier's and the cluster's counts, never reset).
pub fn export(shard: &mut Exporter, node: &mut Exporter, shared: &Shared, report: &ShardReport) {
    shard.counting_since(report.resets);
    clients::export(shard, report);
    memory::export(shard, report);
    stats::export(shard, report);
    commands::export(shard, shared, report);
    keyspace::export(shard, report);
    if report.id == 0 {
        memory::export_node(node, shared);
        spill::export(node, shared);
        cluster::export(node, shared);
    }
}

/// Every metric kvtier exports, each declared once beside its section.
pub fn all_metrics() -> impl Iterator<Item = &'static Metric> {
    [
        clients::METRICS,
        memory::METRICS,
        stats::METRICS,
        commands::METRICS,
        keyspace::METRICS,
        spill::METRICS,
        cluster::METRICS,
    ]
    .into_iter()
    .flatten()
    .copied()
    .chain(spill::COUNTERS.iter().map(|c| &c.1))
    .chain(cluster::COUNTERS.iter().map(|c| &c.1))
}

/// Latency histograms take these bucket bounds (the Prometheus exporter is
/// set up with them for these names and prefixes).
pub const LATENCY_HISTOGRAMS: [&str; 2] = [commands::DURATION.name, "kvtier_spill_"];

/// Resident set size of this process in bytes (from /proc).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_declared_once() {
        let mut names: Vec<&str> = all_metrics().map(|m| m.name).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a metric is declared twice");
        for m in all_metrics() {
            assert!(m.name.starts_with("kvtier_"), "{}", m.name);
            assert!(!m.help.is_empty(), "{}", m.name);
        }
    }

    #[test]
    fn sections_are_asked_for_by_name() {
        let args = |s: &[&str]| -> Vec<bytes::Bytes> {
            s.iter()
                .map(|a| bytes::Bytes::from(a.to_string()))
                .collect()
        };
        assert_eq!(info_sections(&[]).len(), DEFAULT_SECTIONS);
        assert_eq!(info_sections(&args(&["ALL"])).len(), SECTIONS.len());
        assert_eq!(
            info_sections(&args(&["memory", "Server", "memory", "nope"])),
            vec!["memory", "server"]
        );
    }
}
