//! `# Commandstats`, and the per-command metrics.

use super::metric::{Exporter, Metric};
use super::snapshot::{Info, ShardReport};
use crate::shared::Shared;

/// Executions, by command.
pub const CALLS: Metric = Metric::counter(
    "kvtier_commands_total",
    "Commands executed, by command name.",
);
/// Refusals and error replies, by command.
pub const ERRORS: Metric = Metric::counter(
    "kvtier_command_errors_total",
    "Commands that were refused or replied with an error, by command name.",
);
/// Execution time, by command.
pub const DURATION: Metric = Metric::histogram(
    "kvtier_command_duration_seconds",
    "Time to execute a command on its shard, by command name (sum approximated from bucket bounds).",
);

/// This section's metrics.
pub const METRICS: &[&Metric] = &[&CALLS, &ERRORS, &DURATION];

/// `# Commandstats`: every command that ran or was refused.
pub fn info(o: &mut Info, shared: &Shared, reports: &[ShardReport]) {
    for (id, name) in shared.catalog.names.iter().enumerate() {
        let (mut calls, mut nanos, mut rejected, mut failed) = (0, 0, 0, 0);
        for r in reports {
            let c = &r.stats.commands[id];
            calls += c.calls;
            nanos += c.nanos;
            rejected += c.rejected;
            failed += c.failed;
        }
        if calls + rejected + failed == 0 {
            continue;
        }
        let usec = nanos / 1000;
        let per_call = if calls == 0 {
            0.0
        } else {
            nanos as f64 / 1000.0 / calls as f64
        };
        o.field(
            format_args!("cmdstat_{name}"),
            format_args!(
                "calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls={rejected},failed_calls={failed}"
            ),
        );
    }
}

/// This shard's command counters and latencies.
pub fn export(e: &mut Exporter, shared: &Shared, r: &ShardReport) {
    for (id, c) in r.stats.commands.iter().enumerate() {
        if c.calls + c.rejected == 0 {
            continue;
        }
        let name = shared.catalog.names[id];
        let labels = || vec![("cmd", name.to_string())];
        e.counter(&CALLS, id as u64, labels, c.calls);
        e.counter(&ERRORS, id as u64, labels, c.failed + c.rejected);
        e.histogram(&DURATION, id as u64, labels, &c.latency);
    }
}
