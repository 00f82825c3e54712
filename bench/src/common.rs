//! Options and checks every scenario shares.

use std::path::PathBuf;

use bytes::Bytes;
use clap::Args;
use kvtier_protocol::Reply;

use crate::report::{self, Recorder};
use crate::resp::Client;

/// Where to send load and where to put the results.
#[derive(Args, Debug, Clone)]
pub struct Output {
    /// Server to measure: `redis://host:port` or `host:port` (any RESP
    /// server). Several, comma-separated (the nodes of a cluster): the
    /// connections are spread over them in turn.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub target: String,
    /// Write every figure of the run as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency CDFs and throughput over time to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

impl Output {
    /// The end of a scenario's run: prints the latency table and the
    /// client's CPU, completes `summary` (a JSON object of the scenario's
    /// own figures) with the scenario's name, the latency percentiles by
    /// operation, throughput over time and the client's CPU, and writes it
    /// to --json and the plot to --plot.
    pub fn publish(
        &self,
        scenario: &str,
        rec: &Recorder,
        cpu: serde_json::Value,
        mut summary: serde_json::Value,
    ) -> std::io::Result<serde_json::Value> {
        report::print_latency_table(rec);
        report::print_client_cpu(&cpu);
        let latency: serde_json::Map<String, serde_json::Value> = rec
            .latency
            .iter()
            .map(|(op, h)| (op.to_string(), report::percentiles(h)))
            .collect();
        summary["scenario"] = scenario.into();
        summary["latency"] = latency.into();
        summary["throughput_per_second"] = serde_json::json!(&rec.timeline);
        summary["client_cpu"] = cpu;
        if let Some(path) = &self.json {
            report::write_json(path, &summary)?;
        }
        if let Some(path) = &self.plot {
            report::plot(path, scenario, rec).map_err(std::io::Error::other)?;
        }
        Ok(summary)
    }

    /// `host:port` of the (first) target.
    pub fn addr(&self) -> String {
        self.addrs().swap_remove(0)
    }

    /// `host:port` of every target.
    pub fn addrs(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .target
            .split(',')
            .map(|t| {
                let t = t.trim();
                let t = t
                    .strip_prefix("redis://")
                    .or_else(|| t.strip_prefix("tcp://"))
                    .unwrap_or(t);
                t.trim_end_matches('/').to_string()
            })
            .filter(|t| !t.is_empty())
            .collect();
        if out.is_empty() {
            out.push("127.0.0.1:6379".into());
        }
        out
    }

    /// The target connection `i` uses (round robin over the targets).
    pub fn addr_for(&self, i: usize) -> String {
        let all = self.addrs();
        all[i % all.len()].clone()
    }
}

/// Refuses a server without kvtier's block dialect, with a clear message.
pub async fn require_dialect(addr: &str) -> std::io::Result<()> {
    let mut c = Client::connect(addr).await?;
    let reply = c
        .call(&[
            Bytes::from("COMMAND"),
            Bytes::from("INFO"),
            Bytes::from("PREFIXLEN"),
            Bytes::from("MGETPREFIX"),
            Bytes::from("MSETBLOCK"),
        ])
        .await?;
    let known = match reply {
        Reply::Array(items) => items.len() == 3 && items.iter().all(|i| *i != Reply::Nil),
        _ => false,
    };
    if known {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "the server at {addr} does not implement kvtier's block dialect (PREFIXLEN, MGETPREFIX, MSETBLOCK); \
             use --protocol redis-sequential or --protocol redis-pipelined to measure a plain Redis"
        )))
    }
}

/// A reply that is an error, as an I/O error.
pub fn fail_on_error(v: &Reply, what: &str) -> std::io::Result<()> {
    if let Reply::Error(e) = v {
        return Err(std::io::Error::other(format!("{what}: {e}")));
    }
    Ok(())
}

/// The command-line spelling of an option value (`redis-sequential`, not
/// `RedisSequential`), for reports.
pub fn flag_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// Fails a finished run whose report counts values that came back wrong
/// (after its --json and --plot were written), so a script cannot miss it.
pub fn check_verified(report: &serde_json::Value) -> std::io::Result<()> {
    match report["verification_failures"].as_u64() {
        Some(n) if n > 0 => Err(std::io::Error::other(format!(
            "{n} verification failures: the server returned wrong bytes for a value"
        ))),
        _ => Ok(()),
    }
}
