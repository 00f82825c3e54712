//! INFO's sections that are about the process rather than the data:
//! Server, Persistence, Replication, CPU, Modules. No metrics.

use super::snapshot::{Info, ShardReport};
use crate::config::Num;
use crate::shared::Shared;

/// `# Server`
pub fn server(o: &mut Info, shared: &Shared, _reports: &[ShardReport]) {
    let config = &shared.config;
    let uptime = shared.started.elapsed().as_secs();
    let now = kvtier_store::now_ms();
    o.field("redis_version", crate::about::REDIS_VERSION);
    o.field("redis_git_sha1", "00000000");
    o.field("redis_git_dirty", 0);
    o.field("redis_build_id", 0);
    o.field("redis_mode", "standalone");
    o.field(
        "os",
        format_args!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
    );
    o.field("arch_bits", 64);
    o.field("monotonic_clock", "POSIX clock_gettime");
    o.field("multiplexing_api", "epoll");
    o.field("process_id", std::process::id());
    o.field("process_supervised", "no");
    o.field("run_id", &shared.run_id);
    o.field("tcp_port", shared.port);
    o.field("server_time_usec", now * 1000);
    o.field("uptime_in_seconds", uptime);
    o.field("uptime_in_days", uptime / 86400);
    o.field("hz", config.num(Num::Hz));
    o.field("configured_hz", config.num(Num::Hz));
    o.field("lru_clock", (now / 1000) & 0xff_ffff);
    o.field("executable", &shared.executable);
    o.field("config_file", &shared.config_file);
    o.field("io_threads_active", 0);
    o.field("kvtier_version", env!("CARGO_PKG_VERSION"));
    o.field("kvtier_shards", shared.shards);
}

/// `# Persistence`: none, but clients read these fields.
pub fn persistence(o: &mut Info, shared: &Shared, _reports: &[ShardReport]) {
    o.field("loading", 0);
    o.field("async_loading", 0);
    o.field("rdb_changes_since_last_save", 0);
    o.field("rdb_bgsave_in_progress", 0);
    o.field("rdb_last_save_time", shared.started_unix);
    o.field("rdb_last_bgsave_status", "ok");
    o.field("aof_enabled", 0);
    o.field("aof_rewrite_in_progress", 0);
    o.field("aof_last_write_status", "ok");
}

/// `# Replication`: every node is a primary.
pub fn replication(o: &mut Info, shared: &Shared, _reports: &[ShardReport]) {
    o.field("role", "master");
    o.field("connected_slaves", 0);
    o.field("master_failover_state", "no-failover");
    o.field("master_replid", &shared.run_id);
    o.field("master_repl_offset", 0);
}

/// `# CPU`
pub fn cpu(o: &mut Info, _shared: &Shared, _reports: &[ShardReport]) {
    let (sys, user) = rusage();
    o.field("used_cpu_sys", format_args!("{sys:.6}"));
    o.field("used_cpu_user", format_args!("{user:.6}"));
}

/// `# Modules`: none.
pub fn modules(_o: &mut Info, _shared: &Shared, _reports: &[ShardReport]) {}

/// System and user CPU seconds of this process.
fn rusage() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct we own; no pointers escape.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return (0.0, 0.0);
        }
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        (t(usage.ru_stime), t(usage.ru_utime))
    }
}
