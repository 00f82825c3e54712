//! `# Cluster`, and the cluster's metrics: each counter is one row, read by
//! INFO and the exporter alike.

use std::sync::atomic::Ordering::Relaxed;

use kvtier_cluster::ClusterStats;

use super::metric::{CounterRow, Exporter, Metric};
use super::snapshot::{Info, ShardReport};
use crate::shared::Shared;

/// The node list's epoch.
pub const EPOCH: Metric = Metric::gauge(
    "kvtier_cluster_epoch",
    "Configuration epoch of the cluster's node list.",
);
/// This node's keys with copies elsewhere.
pub const REPLICATED: Metric = Metric::gauge(
    "kvtier_cluster_replicated_keys",
    "Keys of this node that have copies on other nodes.",
);
/// Hot keys now.
pub const HOT: Metric = Metric::gauge(
    "kvtier_cluster_hot_keys",
    "Keys read above --hot-key-threshold in the last window.",
);
/// Each node's health.
pub const NODE_UP: Metric = Metric::gauge(
    "kvtier_cluster_node_up",
    "1 while a cluster node answers pings, 0 once it is marked failed, by node.",
);

/// The cluster's counters: INFO field, metric, where the count is.
pub static COUNTERS: [CounterRow<ClusterStats>; 10] = [
    (
        "cluster_forwarded",
        Metric::counter(
            "kvtier_cluster_forwarded_total",
            "Commands forwarded to the node owning their keys.",
        ),
        |s| &s.forwarded,
    ),
    (
        "cluster_moved",
        Metric::counter(
            "kvtier_cluster_moved_total",
            "MOVED redirections answered (--cluster-redirect yes).",
        ),
        |s| &s.moved,
    ),
    (
        "cluster_coordinated",
        Metric::counter(
            "kvtier_cluster_coordinated_total",
            "Multi-key commands spread over several nodes by this node.",
        ),
        |s| &s.coordinated,
    ),
    (
        "cluster_replica_hits",
        Metric::counter(
            "kvtier_cluster_replica_hits_total",
            "Reads answered from this node's copies of other nodes' hot keys.",
        ),
        |s| &s.replica_hits,
    ),
    (
        "cluster_replica_misses",
        Metric::counter(
            "kvtier_cluster_replica_misses_total",
            "Reads of keys with copies here that had to read through to the owner.",
        ),
        |s| &s.replica_misses,
    ),
    (
        "cluster_copies_sent",
        Metric::counter(
            "kvtier_cluster_copies_sent_total",
            "Copies of this node's hot keys sent to replicas.",
        ),
        |s| &s.copies_sent,
    ),
    (
        "cluster_copies_received",
        Metric::counter(
            "kvtier_cluster_copies_received_total",
            "Copies of other nodes' hot keys stored here.",
        ),
        |s| &s.copies_received,
    ),
    (
        "cluster_handoff_fetched",
        Metric::counter(
            "kvtier_cluster_handoff_fetched_total",
            "Keys of slots handed off to this node read from their previous owner and kept.",
        ),
        |s| &s.handoff_fetched,
    ),
    (
        "cluster_handoff_missed",
        Metric::counter(
            "kvtier_cluster_handoff_missed_total",
            "Keys of handed-off slots that their previous owner did not have either.",
        ),
        |s| &s.handoff_missed,
    ),
    (
        "cluster_handoff_deleted",
        Metric::counter(
            "kvtier_cluster_handoff_deleted_total",
            "Keys written here whose old value was deleted on the slot's previous owner.",
        ),
        |s| &s.handoff_deleted,
    ),
];

/// Slots handed off to this node now.
pub const HANDOFF_SLOTS: Metric = Metric::gauge(
    "kvtier_cluster_handoff_slots",
    "Slots this node gained whose misses it still reads from their previous owner.",
);

/// This section's metrics, besides [`COUNTERS`].
pub const METRICS: &[&Metric] = &[&EPOCH, &REPLICATED, &HOT, &NODE_UP, &HANDOFF_SLOTS];

/// `# Cluster`
pub fn info(o: &mut Info, shared: &Shared, _reports: &[ShardReport]) {
    let Some(cluster) = &shared.cluster else {
        o.field("cluster_enabled", 0);
        return;
    };
    let view = cluster.view();
    o.field("cluster_enabled", 1);
    o.field("cluster_node_id", &cluster.me);
    o.field("cluster_epoch", view.epoch);
    o.field("cluster_known_nodes", view.nodes.len());
    // The list with its history (`#EPOCH` joins, `~` departures): what a
    // restart with `--cluster-nodes` should be given to keep the map.
    o.field("cluster_node_list", cluster.list_text().1);
    o.field(
        "cluster_live_nodes",
        view.alive.iter().filter(|a| **a).count(),
    );
    o.field(
        "cluster_mode",
        if cluster.redirect {
            "redirect"
        } else {
            "forward"
        },
    );
    for (name, _, count) in COUNTERS.iter() {
        o.field(name, count(&cluster.stats).load(Relaxed));
    }
    o.field(
        "cluster_replicated_keys",
        cluster.replicated_count.load(Relaxed),
    );
    o.field("cluster_handoff_slots", cluster.handoff_slots(&view));
}

/// The cluster's figures (once per node: from shard 0).
pub fn export(e: &mut Exporter, shared: &Shared) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    for (_, metric, count) in COUNTERS.iter() {
        e.counter(metric, 0, Vec::new, count(&cluster.stats).load(Relaxed));
    }
    let view = cluster.view();
    e.gauge(&EPOCH, Vec::new(), view.epoch as f64);
    e.gauge(
        &HANDOFF_SLOTS,
        Vec::new(),
        cluster.handoff_slots(&view) as f64,
    );
    e.gauge(
        &REPLICATED,
        Vec::new(),
        cluster.replicated_count.load(Relaxed) as f64,
    );
    e.gauge(&HOT, Vec::new(), cluster.hot_keys().len() as f64);
    for (node, alive) in view.nodes.iter().zip(&view.alive) {
        e.gauge(
            &NODE_UP,
            vec![("node", node.id.clone())],
            *alive as u8 as f64,
        );
    }
}
