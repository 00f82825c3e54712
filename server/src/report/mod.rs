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
//! | `tenants.rs` | tenants | keys, bytes, hits, misses, evictions, refusals per tenant |

mod clients;
mod cluster;
mod commands;
mod keyspace;
mod memory;
pub mod metric;
mod server_info;
pub mod snapshot;
mod spill;
mod stats;
mod tenants;

pub use metric::{Exporter, Metric};
pub use snapshot::{gather, rss_bytes, Info, ShardReport};

use crate::shared::Shared;

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
    ("tenants", "Tenants", tenants::info),
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
    shard.counting_since(report.stats.resets);
    clients::export(shard, report);
    memory::export(shard, report);
    stats::export(shard, report);
    commands::export(shard, shared, report);
    keyspace::export(shard, report);
    spill::export_shard(shard, report);
    tenants::export(shard, shared, report);
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
        tenants::METRICS,
    ]
    .into_iter()
    .flatten()
    .copied()
    .chain(spill::COUNTERS.iter().map(|c| &c.1))
    .chain(cluster::COUNTERS.iter().map(|c| &c.1))
}

/// Declares every metric to the recorder (its `# HELP` and `# TYPE`).
pub fn describe_metrics() {
    for m in all_metrics() {
        m.describe();
    }
}

/// Latency histograms take these bucket bounds (the Prometheus exporter is
/// set up with them for these names and prefixes).
pub const LATENCY_HISTOGRAMS: [&str; 2] = [commands::DURATION.name, "kvtier_spill_"];

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
    fn the_readme_metrics_table_names_exactly_the_declared_metrics() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("\n## Metrics")
            .expect("README has a Metrics section");
        let section = &readme[start + 1..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let mut documented: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with("| `kvtier_"))
            .flat_map(|l| l.split('|').nth(1).unwrap_or_default().split('`'))
            .filter(|w| w.starts_with("kvtier_"))
            .collect();
        documented.sort_unstable();
        let mut declared: Vec<&str> = all_metrics().map(|m| m.name).collect();
        declared.sort_unstable();
        let missing: Vec<&&str> = declared
            .iter()
            .filter(|d| !documented.contains(d))
            .collect();
        let unknown: Vec<&&str> = documented
            .iter()
            .filter(|d| !declared.contains(d))
            .collect();
        assert!(
            missing.is_empty(),
            "declared but not in README's table: {missing:?}"
        );
        assert!(
            unknown.is_empty(),
            "in README's table but not declared: {unknown:?}"
        );
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
