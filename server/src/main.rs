//! The `kvtier-server` binary: parse flags, start the shards, wait for
//! SIGINT, SIGTERM or SHUTDOWN, stop.

use std::process::ExitCode;

use kvtier_server::config::Config;
use kvtier_server::report::{describe_metrics, LATENCY_HISTOGRAMS};
use kvtier_server::server::Server;
use kvtier_store::latency::BOUNDS;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    kvtier_server::logging::init(&config.loglevel, config.log_format);
    // A --metrics-addr that cannot be parsed stops the start here.
    if let Err(e) = config.metrics_socket(config.port) {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    // Signal handlers go in before the server can be reached, so a SIGTERM
    // right after start-up is a graceful shutdown, not a kill.
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            error!("cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let server = match Server::start(&config) {
        Ok(s) => s,
        Err(e) => {
            error!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let mut metrics = "off".to_string();
    if let Ok(Some((addr, given))) = config.metrics_socket(server.local_addr().port()) {
        match serve_metrics(&config, addr) {
            Ok(()) => metrics = format!("http://{addr}/metrics"),
            Err(MetricsError::Listener(e)) if !given => warn!(
                "metrics not served: {addr} (the port + 3000) cannot be used: {e}; \
                 give --metrics-addr HOST:PORT, or none"
            ),
            Err(MetricsError::Settings(e) | MetricsError::Listener(e)) => {
                error!("cannot serve metrics on {addr}: {e}");
                server.shutdown();
                server.wait();
                return ExitCode::from(1);
            }
        }
    }
    info!("{}", settings_line(&config, &metrics));
    // The port line is printed on stdout so scripts using --port 0 can read
    // it; on a terminal the log's listening line already says it.
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        println!(
            "{}",
            kvtier_server::logging::port_line(&server.local_addr().to_string(), config.log_format)
        );
    }
    let shared = std::sync::Arc::clone(server.shared());
    std::thread::spawn(move || signals.wait(shared));
    server.wait();
    info!("kvtier stopped");
    ExitCode::SUCCESS
}

/// What a new operator needs to know of this server, once at start.
fn settings_line(config: &Config, metrics: &str) -> String {
    use kvtier_server::config::{auto_maxmemory, human_bytes};
    let memory = match config.maxmemory {
        0 => "no memory limit".to_string(),
        n if n == auto_maxmemory() => format!(
            "maxmemory {} (auto: 3/4 of this machine's memory; --maxmemory sets it, 0 for none)",
            human_bytes(n)
        ),
        n => format!("maxmemory {}", human_bytes(n)),
    };
    let spill = config
        .spill_dir
        .as_ref()
        .map_or("no spill tier".to_string(), |d| {
            format!("spill to {}", d.display())
        });
    let tls = match config.tls_port {
        0 => "no TLS port".to_string(),
        p => format!("TLS on port {p}"),
    };
    format!(
        "{memory}, policy {}; {spill}; {tls}; protected mode {}; metrics {metrics}",
        config.maxmemory_policy,
        if config.protected_mode { "yes" } else { "no" },
    )
}

/// Why the metrics endpoint is not served.
enum MetricsError {
    /// The settings are wrong (`--metrics-allow`).
    Settings(String),
    /// The listener could not be made (the address is taken, say).
    Listener(String),
}

/// Serves Prometheus metrics on `addr`.
fn serve_metrics(config: &Config, addr: std::net::SocketAddr) -> Result<(), MetricsError> {
    let builder = config
        .metrics_allow
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .try_fold(PrometheusBuilder::new().with_http_listener(addr), |b, a| {
            // A bare address is the network of just it.
            match (a.contains('/'), a.contains(':')) {
                (true, _) => b.add_allowed_address(a),
                (false, true) => b.add_allowed_address(format!("{a}/128")),
                (false, false) => b.add_allowed_address(format!("{a}/32")),
            }
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(LATENCY_HISTOGRAMS[0].into()), &BOUNDS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Prefix(LATENCY_HISTOGRAMS[1].into()), &BOUNDS)
        })
        .map_err(|e| MetricsError::Settings(e.to_string()))?;
    builder
        .install()
        .map_err(|e| MetricsError::Listener(e.to_string()))?;
    describe_metrics();
    info!("metrics on http://{addr}/metrics");
    Ok(())
}

/// SIGINT and SIGTERM, turned into a graceful shutdown.
struct Signals {
    runtime: tokio::runtime::Runtime,
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _guard = runtime.enter();
        let interrupt = signal(SignalKind::interrupt())?;
        let terminate = signal(SignalKind::terminate())?;
        drop(_guard);
        Ok(Signals {
            runtime,
            interrupt,
            terminate,
        })
    }

    fn wait(self, shared: std::sync::Arc<kvtier_server::shared::Shared>) {
        let Signals {
            runtime,
            mut interrupt,
            mut terminate,
        } = self;
        runtime.block_on(async move {
            let mut stop = shared.shutdown_signal();
            tokio::select! {
                _ = interrupt.recv() => info!("SIGINT: shutting down"),
                _ = terminate.recv() => info!("SIGTERM: shutting down"),
                _ = stop.changed() => return,
            }
            shared.request_shutdown();
        });
    }
}
