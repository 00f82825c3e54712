//! `# Clients`, and the connection metrics.

use super::metric::{Exporter, Metric};
use super::snapshot::{sum, Info, ShardReport};
use crate::config::Num;
use crate::shared::{Placement, Shared};

/// Connections accepted.
pub const CONNECTIONS: Metric =
    Metric::counter("kvtier_connections_total", "Client connections accepted.");
/// Connections open, by shard.
pub const CONNECTED: Metric = Metric::gauge(
    "kvtier_connected_clients",
    "Client connections open, by shard.",
);

/// This section's metrics.
pub const METRICS: &[&Metric] = &[&CONNECTIONS, &CONNECTED];

/// `# Clients`
pub fn info(o: &mut Info, shared: &Shared, reports: &[ShardReport]) {
    o.field("connected_clients", sum(reports, |r| r.clients as u64));
    o.field("cluster_connections", 0);
    o.field("maxclients", shared.config.num(Num::Maxclients));
    o.field("client_recent_max_input_buffer", 0);
    o.field("client_recent_max_output_buffer", 0);
    o.field("blocked_clients", sum(reports, |r| r.stats.blocked_clients));
    o.field(
        "max_blocked_clients",
        shared.config.num(Num::MaxBlockedClients),
    );
    o.field(
        "blocked_clients_refused",
        sum(reports, |r| r.stats.blocked_clients_refused),
    );
    o.field("total_blocking_keys", sum(reports, |r| r.blocking_keys));
    o.field("tracking_clients", 0);
    o.field(
        "connections_packed_on_shard",
        match shared.placement() {
            Placement::On(shard) => shard as i64,
            Placement::Stay | Placement::Spread => -1,
        },
    );
    o.field(
        "connections_moved",
        sum(reports, |r| r.stats.connections_moved),
    );
    o.field("clients_in_timeout_table", 0);
}

/// This shard's connection figures.
pub fn export(e: &mut Exporter, r: &ShardReport) {
    e.counter(&CONNECTIONS, 0, Vec::new, r.stats.connections_received);
    e.gauge(
        &CONNECTED,
        vec![("shard", r.id.to_string())],
        r.clients as f64,
    );
}
