//! Configuration: command-line flags, the config file, and the parameters
//! CONFIG GET / CONFIG SET read and change at run time.
//!
//! The config file holds `name value` lines with the same names as the flags
//! (and as CONFIG): `maxmemory 4gb`, `port 6380`. Flags given on the command
//! line override the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use clap::Parser;
use kvtier_store::EvictionPolicy;

use crate::acl::Acl;
use crate::glob::glob_match;
use crate::logging::LogFormat;
use crate::tls::{Tls, TlsSettings};
use kvtier_store::tenants::{KeyPattern, Limits, MAX_TENANTS, WHOLE};

/// kvtier-server: the shared, fleet-wide storage tier for LLM KV-cache blocks.
/// Speaks RESP (Redis clients work unchanged) and runs one shard per core.
#[derive(Parser, Debug, Clone)]
#[command(name = "kvtier-server", version, args_override_self = true)]
pub struct Config {
    /// Config file of `name value` lines (same names as the flags).
    #[arg(value_name = "CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// TCP port to listen on (0: pick a free one and print it).
    #[arg(long, default_value_t = 6379)]
    pub port: u16,

    /// Address to bind (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,

    /// Shard threads, one per core (default: the available cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Pin each shard thread to a core of its own (yes/no). Pinned, a
    /// request waits for its shard's core to wake; unpinned, the scheduler
    /// may run the shard where the client's packet was just handled.
    #[arg(long, default_value = "no", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub pin_threads: bool,

    /// After answering, a connection may keep polling its socket for up to
    /// this many microseconds before its shard thread sleeps (0: sleep at
    /// once). A client that sends its next request within the window is
    /// served without the thread's wake-up. A connection polls only while
    /// polling has been measured to bring its client's requests sooner (a
    /// paced client is not polled for); one connection per shard polls at a
    /// time, and none while several clients of the shard are active.
    #[arg(long, default_value_t = 50, value_parser = idle_poll_value)]
    pub idle_poll_us: u64,

    /// While the shard threads together use less than this percentage of
    /// one core (for a few seconds), every client connection is served by
    /// one shard thread: at a light load, one thread's wake-ups serve all
    /// the clients' requests and the other cores stay free. Above it by 30
    /// points, the connections are spread over the shards again (0: never
    /// pack; the shard threads together can use up to 100 per core, so 1000
    /// packs whatever the load of up to ten).
    #[arg(long, default_value_t = 40, value_parser = pack_below_value)]
    pub pack_below: u64,

    /// Memory limit for keys and values, e.g. 4gb or 512mb (0: no limit;
    /// `auto`, the default: three quarters of this machine's memory, or of
    /// the container's limit when lower). Divided equally among the shards.
    #[arg(long, default_value = "auto", value_parser = maxmemory_value)]
    pub maxmemory: u64,

    /// What to do when maxmemory is reached: prefix (KV-cache blocks:
    /// orphans, then final partial blocks, then chain leaves by LRU over two
    /// levels of reuse, inner blocks last), noeviction
    /// (writes fail with OOM), allkeys-lru, allkeys-lfu, allkeys-random, volatile-lru,
    /// volatile-lfu, volatile-random or volatile-ttl.
    #[arg(long, default_value = "prefix")]
    pub maxmemory_policy: EvictionPolicy,

    /// Ask for transparent huge pages (madvise) on the slab arena's pages.
    #[arg(long)]
    pub hugepages: bool,

    /// Map, touch and lock the slab arena up to maxmemory at start.
    #[arg(long)]
    pub prealloc: bool,

    /// Keys sampled per eviction choice.
    #[arg(long, default_value_t = 5, value_parser = samples_value)]
    pub maxmemory_samples: u64,

    /// Password clients must send with AUTH (empty: none): the default
    /// user's password.
    #[arg(long, default_value = "")]
    pub requirepass: String,

    /// ACL file (`user <name> <rules>` lines, as Redis's): its users are
    /// loaded at start and by ACL LOAD, and written by ACL SAVE.
    #[arg(long)]
    pub aclfile: Option<PathBuf>,

    /// Most entries ACL LOG keeps.
    #[arg(long, default_value_t = 128)]
    pub acllog_max_len: u64,

    /// The user this node logs in as on its cluster peers (with
    /// `masterauth`). Peer connections are checked only when they log in
    /// and say CLUSTER PEER: the node that took a command checked it.
    #[arg(long, default_value = "default")]
    pub masteruser: String,

    /// The password this node logs in to its cluster peers with (empty:
    /// requirepass).
    #[arg(long, default_value = "")]
    pub masterauth: String,

    /// Port of the TLS listener (0: none), beside `--port`.
    #[arg(long, default_value_t = 0)]
    pub tls_port: u16,

    /// This server's certificate chain (PEM), for clients and peers.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,

    /// Its private key (PEM).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,

    /// CA certificates (PEM) that client and peer certificates must chain
    /// to.
    #[arg(long)]
    pub tls_ca_cert_file: Option<PathBuf>,

    /// Whether TLS clients must show a certificate: yes, no or optional.
    #[arg(long, default_value = "yes")]
    pub tls_auth_clients: String,

    /// Links to cluster peers use TLS (their addresses in --cluster-nodes
    /// are then TLS ports).
    #[arg(long, default_value = "no", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub tls_cluster: bool,

    /// With no password set, refuse clients that do not connect from a
    /// loopback address (yes), with Redis's explanatory error; `no` accepts
    /// everyone (a trusted network, a container behind published ports).
    #[arg(long, default_value = "yes", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub protected_mode: bool,

    /// Who may run DEBUG (it can stall a shard): `no` nobody, `local`
    /// clients on a loopback address, `yes` everyone. Redis's option.
    #[arg(long, default_value = "no", value_parser = ["no", "local", "yes"])]
    pub enable_debug_command: String,

    /// Largest bulk argument accepted, e.g. 512mb.
    #[arg(long, default_value = "512mb", value_parser = memory_of_1mb_or_more)]
    pub proto_max_bulk_len: u64,

    /// Most memory one client's request may hold while it arrives (its
    /// arguments so far and the read buffer); a client over it is closed.
    /// Redis's name and default.
    #[arg(long, default_value = "1gb", value_parser = memory_of_1mb_or_more)]
    pub client_query_buffer_limit: u64,

    /// Most memory the requests still arriving on all connections may hold
    /// together (0: no limit); the client whose request takes the total
    /// over it is closed (INFO `evicted_clients`).
    #[arg(long, default_value = "0", value_parser = memory_value)]
    pub maxmemory_clients: u64,

    /// Redis's `client-output-buffer-limit`: `normal HARD SOFT SECONDS`
    /// (and `replica` / `pubsub` classes, accepted for compatibility). A
    /// client whose pending replies (values they reference included) exceed
    /// HARD, or SOFT for SECONDS, is closed; 0 turns a limit off.
    #[arg(long, default_value = DEFAULT_OUTPUT_LIMITS, value_parser = parse_output_limits_flag)]
    pub client_output_buffer_limit: String,

    /// Close clients idle for this many seconds (0: never).
    #[arg(long, default_value_t = 0, value_parser = integer_value)]
    pub timeout: u64,

    /// Most simultaneous client connections.
    #[arg(long, default_value_t = 10000, value_parser = maxclients_value)]
    pub maxclients: u64,

    /// Prometheus metrics endpoint: HOST:PORT, `none` to disable, or `auto`
    /// (127.0.0.1 at the server's port + 3000: 6379 -> 9379; off with
    /// `--port 0`). Several servers on one host each get their own; an
    /// `auto` address that is busy is a warning, a given one an exit.
    #[arg(long, default_value = "auto")]
    pub metrics_addr: String,

    /// Who may read the metrics endpoint: comma-separated addresses or
    /// networks (`10.0.0.0/8,127.0.0.1`); others get 403 Forbidden.
    /// Empty: whoever reaches `--metrics-addr`.
    #[arg(long, default_value = "")]
    pub metrics_allow: String,

    /// Log level, as Redis names it: debug, verbose, notice, warning or
    /// nothing (also `CONFIG SET loglevel`).
    #[arg(long, default_value = "notice", value_parser = loglevel_arg)]
    pub loglevel: String,

    /// A tenant: `name=NAME,keys=PATTERN` (a key prefix `llama70b@*` or an
    /// exact key) or `name=NAME,user=USER` (the keys the ACL user may
    /// write, by its key patterns at start) or both, optionally with
    /// `share=P%`, `cap=P%` (of maxmemory), `disk-share=P%` and
    /// `disk-cap=P%` (of spill-max-bytes). Repeat for
    /// each (at most 15); a key belongs to the first tenant whose pattern
    /// it matches, else to `default`, which gets the shares the others
    /// leave. A share is guaranteed: another tenant's writes evict nothing
    /// of a tenant within it. A cap is the most a tenant may hold. Each
    /// tenant's bytes, keys, hits, misses, evictions and refused writes
    /// are in INFO `tenants` and the metrics. `CONFIG SET tenant
    /// "name=NAME,share=P%"` changes the limits at run time.
    #[arg(long = "tenant", value_name = "SPEC", value_parser = parse_tenant, action = clap::ArgAction::Append)]
    pub tenants: Vec<TenantSpec>,

    /// Log format on stderr: `text` (colours only on a terminal) or `json`
    /// (one object per line: time, level, target, message, fields).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Longest wait of a blocking read (MGETPREFIX ... BLOCK ms), in ms.
    #[arg(long, default_value_t = 60000, value_parser = at_least_one)]
    pub max_block_ms: u64,

    /// Most clients waiting in MGETPREFIX ... BLOCK at once; one more is
    /// refused at once (0: no limit).
    #[arg(long, default_value_t = 10000, value_parser = integer_value)]
    pub max_blocked_clients: u64,

    /// Longest hold of a lookup (PREFIXLEN ... HOLD ms), in ms: longer
    /// holds are cut to it.
    #[arg(long, default_value_t = 10000, value_parser = at_least_one)]
    pub max_hold_ms: u64,

    /// Most bytes of blocks that lookups may hold against eviction at once
    /// on this node, e.g. 1gb (0: a quarter of maxmemory). Divided equally
    /// among the shards.
    #[arg(long, default_value = "0", value_parser = memory_value)]
    pub hold_max_memory: u64,

    /// Most bytes one client's lookups may hold at once (0: half of
    /// hold-max-memory). Divided equally among the shards.
    #[arg(long, default_value = "0", value_parser = memory_value)]
    pub hold_client_max_memory: u64,

    /// Background task frequency (active expiry runs `hz` times a second).
    #[arg(long, default_value_t = 10, value_parser = hz_value)]
    pub hz: u64,

    /// Directory of the NVMe spill tier: blocks evicted from DRAM are
    /// written there, read back on demand and kept across restarts. Unset:
    /// no spill tier (evicted blocks are gone).
    #[arg(long, value_name = "PATH")]
    pub spill_dir: Option<PathBuf>,

    /// Disk budget of the spill tier, e.g. 100gb (0: 90% of the space free
    /// on its filesystem at start).
    #[arg(long, default_value = "0", value_parser = parse_memory)]
    pub spill_max_bytes: u64,

    /// Which blocks DRAM eviction writes to the spill tier: `all`, or a
    /// number N for only blocks read at least N times.
    #[arg(long, default_value = "all", value_parser = parse_admission)]
    pub spill_admission: u64,

    /// Write the blocks still in DRAM to the spill tier on a graceful
    /// shutdown (yes/no), so a restart loses nothing that fits on disk.
    #[arg(long, default_value = "yes", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub spill_on_shutdown: bool,

    /// Threads doing the spill tier's disk reads and writes (the most disk
    /// requests in flight at once).
    #[arg(long, default_value_t = 8)]
    pub spill_io_threads: usize,

    /// The cluster's members, `ID@HOST:PORT[,ID@HOST:PORT...]`: the same list
    /// on every node, in any order. Unset: a plain single server.
    #[arg(long, value_name = "LIST")]
    pub cluster_nodes: Option<String>,

    /// This node's id in --cluster-nodes (default: the member whose port is
    /// this one on a local address).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,

    /// Epoch of --cluster-nodes. Nodes adopt the list with the highest
    /// epoch they hear of; restart with a higher one to change the list by
    /// flags (CLUSTER SETNODES does it at run time).
    #[arg(long, default_value_t = 0)]
    pub cluster_epoch: u64,

    /// Answer `-MOVED slot host:port` for keys of other nodes (yes), as Redis
    /// Cluster does, instead of forwarding the command to the owner (no).
    #[arg(long, default_value = "no", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub cluster_redirect: bool,

    /// Milliseconds of silence after which a peer counts as failed and its
    /// slots pass to the next node in rendezvous order.
    #[arg(long, default_value_t = 2000)]
    pub cluster_node_timeout: u64,

    /// Reads per second that make a key hot: its owner copies it to the
    /// next --hot-key-replicas nodes (0: no copies).
    #[arg(long, default_value_t = 1000)]
    pub hot_key_threshold: u64,

    /// Extra nodes a hot key is copied to.
    #[arg(long, default_value_t = 2)]
    pub hot_key_replicas: usize,

    /// List each slot's hot-key replicas in CLUSTER SLOTS / SHARDS and let
    /// READONLY connections read from them (yes), or show every node as the
    /// primary of its own slots only (no). Cluster clients give a node one
    /// role, so with `yes` they see some nodes as replicas only.
    #[arg(long, default_value = "no", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub cluster_replica_reads: bool,

    /// The address clients are told to reach this node at (topology replies
    /// and MOVED), when it is not the one in --cluster-nodes (NAT, a
    /// published container port).
    #[arg(long, value_name = "IP")]
    pub cluster_announce_ip: Option<String>,

    /// The port clients are told to reach this node at.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub cluster_announce_port: Option<u16>,

    /// A hostname for this node, shown in topology replies beside its
    /// address (or instead of it with --cluster-preferred-endpoint-type
    /// hostname).
    #[arg(long, value_name = "NAME")]
    pub cluster_announce_hostname: Option<String>,

    /// Milliseconds during which a slot's new owner (after a join, a rejoin
    /// or CLUSTER SETNODES) reads a miss from the slot's previous owner and
    /// keeps it, so the blocks follow the slot without a hit-rate cliff (0:
    /// no hand-off).
    #[arg(long, default_value_t = 120_000)]
    pub cluster_handoff_ms: u64,

    /// What topology replies and MOVED name a node by: `ip` or `hostname`
    /// (nodes without an announced hostname are named by address).
    #[arg(long, default_value = "ip", value_parser = ["ip", "hostname"])]
    pub cluster_preferred_endpoint_type: String,
}

/// `all` (0) or a read count.
pub fn parse_admission(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(0);
    }
    match s.parse::<u64>() {
        Ok(n) if n <= u8::MAX as u64 => Ok(n),
        _ => Err(format!(
            "invalid spill admission '{s}' (all, or a read count up to 255)"
        )),
    }
}

/// The admission setting as CONFIG GET shows it.
pub fn admission_name(n: u64) -> String {
    if n == 0 {
        "all".into()
    } else {
        n.to_string()
    }
}

/// `yes`/`no` as in redis.conf.
pub fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("expected yes or no, got '{s}'")),
    }
}

/// Longest idle poll (`--idle-poll-us`): 10 ms.
pub const MAX_IDLE_POLL_US: u64 = 10_000;
/// The highest `--pack-below` (percent of one core).
pub const MAX_PACK_BELOW: u64 = 1000;

/// A number `CONFIG SET` can change. Each is declared once, in
/// [`Num::spec`]: its name, how a value is read and checked (the same
/// function is its flag's parser, so the command line, the config file and
/// `CONFIG SET` accept and refuse the same values), how `CONFIG GET` shows
/// it, and its value at start. [`LiveConfig::num`] reads the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Num {
    Maxmemory,
    MaxmemorySamples,
    ProtoMaxBulkLen,
    ClientQueryBufferLimit,
    MaxmemoryClients,
    Timeout,
    Maxclients,
    Hz,
    MaxBlockMs,
    MaxBlockedClients,
    MaxHoldMs,
    HoldMaxMemory,
    HoldClientMaxMemory,
    IdlePollUs,
    PackBelow,
    SpillAdmission,
}

/// What [`Num::spec`] declares of a number.
pub struct NumSpec {
    /// The flag's, config file's and CONFIG's name.
    pub name: &'static str,
    /// Reads and checks a value as written (`4gb`, `60000`, `all`).
    pub parse: fn(&str) -> Result<u64, String>,
    /// How CONFIG GET and CONFIG REWRITE write it.
    pub show: fn(u64) -> String,
    /// Its value at start (the flag's, already parsed with `parse`).
    pub start: fn(&Config) -> u64,
}

impl Num {
    /// Every number, in [`LiveConfig`]'s order.
    pub const ALL: [Num; 16] = [
        Num::Maxmemory,
        Num::MaxmemorySamples,
        Num::ProtoMaxBulkLen,
        Num::ClientQueryBufferLimit,
        Num::MaxmemoryClients,
        Num::Timeout,
        Num::Maxclients,
        Num::Hz,
        Num::MaxBlockMs,
        Num::MaxBlockedClients,
        Num::MaxHoldMs,
        Num::HoldMaxMemory,
        Num::HoldClientMaxMemory,
        Num::IdlePollUs,
        Num::PackBelow,
        Num::SpillAdmission,
    ];

    /// The number's declaration.
    pub fn spec(self) -> NumSpec {
        fn plain(
            name: &'static str,
            parse: fn(&str) -> Result<u64, String>,
            start: fn(&Config) -> u64,
        ) -> NumSpec {
            NumSpec {
                name,
                parse,
                show: |n| n.to_string(),
                start,
            }
        }
        match self {
            Num::Maxmemory => plain("maxmemory", maxmemory_value, |c| c.maxmemory),
            Num::MaxmemorySamples => {
                plain("maxmemory-samples", samples_value, |c| c.maxmemory_samples)
            }
            Num::ProtoMaxBulkLen => plain("proto-max-bulk-len", memory_of_1mb_or_more, |c| {
                c.proto_max_bulk_len
            }),
            Num::ClientQueryBufferLimit => {
                plain("client-query-buffer-limit", memory_of_1mb_or_more, |c| {
                    c.client_query_buffer_limit
                })
            }
            Num::MaxmemoryClients => {
                plain("maxmemory-clients", memory_value, |c| c.maxmemory_clients)
            }
            Num::Timeout => plain("timeout", integer_value, |c| c.timeout),
            Num::Maxclients => plain("maxclients", maxclients_value, |c| c.maxclients),
            Num::Hz => plain("hz", hz_value, |c| c.hz),
            Num::MaxBlockMs => plain("max-block-ms", at_least_one, |c| c.max_block_ms),
            Num::MaxBlockedClients => plain("max-blocked-clients", integer_value, |c| {
                c.max_blocked_clients
            }),
            Num::MaxHoldMs => plain("max-hold-ms", at_least_one, |c| c.max_hold_ms),
            Num::HoldMaxMemory => plain("hold-max-memory", memory_value, |c| c.hold_max_memory),
            Num::HoldClientMaxMemory => plain("hold-client-max-memory", memory_value, |c| {
                c.hold_client_max_memory
            }),
            Num::IdlePollUs => plain("idle-poll-us", idle_poll_value, |c| c.idle_poll_us),
            Num::PackBelow => plain("pack-below", pack_below_value, |c| c.pack_below),
            Num::SpillAdmission => NumSpec {
                name: "spill-admission",
                parse: parse_admission,
                show: admission_name,
                start: |c| c.spill_admission,
            },
        }
    }

    /// The number named `name` (case-insensitive).
    pub fn named(name: &str) -> Option<Num> {
        Num::ALL
            .into_iter()
            .find(|n| n.spec().name.eq_ignore_ascii_case(name))
    }
}

/// A plain integer (Redis's error text).
fn integer_value(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .map_err(|_| "argument couldn't be parsed into an integer".into())
}

/// An integer of at least 1.
fn at_least_one(s: &str) -> Result<u64, String> {
    match integer_value(s)? {
        0 => Err("argument must be at least 1".into()),
        n => Ok(n),
    }
}

fn samples_value(s: &str) -> Result<u64, String> {
    match integer_value(s)? {
        n @ 1..=64 => Ok(n),
        _ => Err("argument must be between 1 and 64 inclusive".into()),
    }
}

fn maxclients_value(s: &str) -> Result<u64, String> {
    match integer_value(s)? {
        0 => Err("argument must be between 1 and 4294967295 inclusive".into()),
        n => Ok(n),
    }
}

/// `hz`: as Redis, a value outside 1..=500 is taken as the nearest bound.
fn hz_value(s: &str) -> Result<u64, String> {
    integer_value(s).map(|n| n.clamp(1, 500))
}

fn idle_poll_value(s: &str) -> Result<u64, String> {
    match integer_value(s)? {
        n if n <= MAX_IDLE_POLL_US => Ok(n),
        _ => Err(format!(
            "argument must be between 0 and {MAX_IDLE_POLL_US} inclusive"
        )),
    }
}

fn pack_below_value(s: &str) -> Result<u64, String> {
    match integer_value(s)? {
        n if n <= MAX_PACK_BELOW => Ok(n),
        _ => Err(format!(
            "argument must be between 0 and {MAX_PACK_BELOW} inclusive"
        )),
    }
}

/// A memory value (`4gb`, `512mb`, bytes).
fn memory_value(s: &str) -> Result<u64, String> {
    parse_memory(s).map_err(|_| "argument must be a memory value".into())
}

/// `maxmemory`: a memory value, or `auto` ([`auto_maxmemory`]).
fn maxmemory_value(s: &str) -> Result<u64, String> {
    parse_maxmemory(s).map_err(|_| "argument must be a memory value".into())
}

/// A memory value of at least 1 MiB (the buffer and bulk limits).
fn memory_of_1mb_or_more(s: &str) -> Result<u64, String> {
    match memory_value(s)? {
        n if n >= 1024 * 1024 => Ok(n),
        _ => Err("argument must be a memory value of at least 1mb".into()),
    }
}

impl Config {
    /// Parses the process arguments, reading the config file if one is named.
    pub fn load() -> Result<Config, String> {
        let args: Vec<String> = std::env::args().collect();
        if let Err(e) = Config::try_parse_from(&args) {
            // --help and --version print on stdout and exit 0, as clap does.
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if matches!(e.kind(), DisplayHelp | DisplayVersion) {
                e.exit();
            }
        }
        Self::load_from(args)
    }

    /// Parses `args` (program name first), reading the config file if named.
    /// The file's settings come first so that flags override them.
    pub fn load_from(args: Vec<String>) -> Result<Config, String> {
        let first = Config::try_parse_from(&args).map_err(|e| e.to_string())?;
        let Some(path) = &first.config_file else {
            return first.checked();
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let mut merged = vec![args[0].clone()];
        for setting in file_settings(&text).map_err(|e| format!("{}{e}", path.display()))? {
            setting
                .check(&args[0])
                .map_err(|e| format!("{} line {}: {e}", path.display(), setting.line))?;
            merged.push(format!("--{}", setting.name));
            merged.push(setting.value);
        }
        merged.extend(args[1..].iter().cloned());
        Config::try_parse_from(&merged)
            .map_err(|e| e.to_string())?
            .checked()
    }

    /// What one flag cannot check alone: the tenants' names are distinct,
    /// there are at most [`MAX_TENANTS`], and their shares add up to no
    /// more than the whole.
    fn checked(self) -> Result<Config, String> {
        if self.tenants.len() > MAX_TENANTS {
            return Err(format!(
                "{} tenants: at most {MAX_TENANTS}",
                self.tenants.len()
            ));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if self.tenants[..i].iter().any(|o| o.name == t.name) {
                return Err(format!("tenant '{}' is named twice", t.name));
            }
        }
        check_shares(self.tenants.iter().map(|t| &t.limits))?;
        Ok(self)
    }

    /// Shard threads to run.
    pub fn shard_count(&self) -> usize {
        self.threads
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// What TLS is built from (the `--tls-*` flags).
    pub fn tls_settings(&self) -> TlsSettings {
        TlsSettings {
            port: self.tls_port,
            cluster: self.tls_cluster,
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            ca_cert_file: self.tls_ca_cert_file.clone(),
            auth_clients: self.tls_auth_clients.clone(),
        }
    }

    /// The metrics listener address for a server listening on `port`,
    /// unless disabled, and whether it was given (not `auto`).
    pub fn metrics_socket(&self, port: u16) -> Result<Option<(SocketAddr, bool)>, String> {
        if self.metrics_addr.eq_ignore_ascii_case("none") || self.metrics_addr.is_empty() {
            return Ok(None);
        }
        if self.metrics_addr.eq_ignore_ascii_case("auto") {
            return Ok(metrics_port(port).map(|p| (SocketAddr::from(([127, 0, 0, 1], p)), false)));
        }
        self.metrics_addr
            .parse()
            .map(|a| Some((a, true)))
            .map_err(|e| format!("invalid --metrics-addr '{}': {e}", self.metrics_addr))
    }
}

/// The port `--metrics-addr auto` serves on for a server on `port`: 3000
/// above it (6379 -> 9379, as Redis Cluster's bus port follows the port);
/// none for `--port 0` or a port too high.
pub fn metrics_port(port: u16) -> Option<u16> {
    (port != 0).then(|| port.checked_add(3000)).flatten()
}

/// A tenant named by `--tenant`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSpec {
    /// Its name (letters, digits, `_`, `-`; not `default`).
    pub name: String,
    /// Its own key pattern and the pattern as written, if it has one.
    pub keys: Option<(KeyPattern, String)>,
    /// The ACL user whose writable keys are its keys too.
    pub user: Option<String>,
    /// Its shares and caps (at start; `CONFIG SET tenant` changes them).
    pub limits: Limits,
}

impl std::fmt::Display for TenantSpec {
    /// As `--tenant` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "name={}", self.name)?;
        if let Some((_, pattern)) = &self.keys {
            write!(f, ",keys={pattern}")?;
        }
        if let Some(user) = &self.user {
            write!(f, ",user={user}")?;
        }
        write_limits(f, &self.limits)
    }
}

/// `,share=P%,cap=P%,disk-share=P%,disk-cap=P%`.
fn write_limits(f: &mut impl std::fmt::Write, l: &Limits) -> std::fmt::Result {
    let percent = |bp: u16| {
        let (whole, rest) = (bp / 100, bp % 100);
        match rest {
            0 => format!("{whole}%"),
            r if r % 10 == 0 => format!("{whole}.{}%", r / 10),
            r => format!("{whole}.{r:02}%"),
        }
    };
    write!(
        f,
        ",share={},cap={},disk-share={},disk-cap={}",
        percent(l.share),
        percent(l.cap),
        percent(l.disk_share),
        percent(l.disk_cap)
    )
}

/// A part of a tier: `50%`, `12.5%` or `50` (percent), to 0.01%.
fn parse_part(v: &str) -> Result<u16, String> {
    let n = v.strip_suffix('%').unwrap_or(v);
    let (whole, frac) = n.split_once('.').unwrap_or((n, ""));
    let bad = || format!("'{v}': a percentage from 0% to 100%, to 0.01%");
    if whole.is_empty()
        || frac.len() > 2
        || !(whole.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: u32 = whole.parse().map_err(|_| bad())?;
    let frac: u32 = format!("{frac:0<2}").parse().map_err(|_| bad())?;
    let bp = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)?;
    if bp > WHOLE as u32 {
        return Err(bad());
    }
    Ok(bp as u16)
}

/// One `share=`, `cap=`, `disk-share=` or `disk-cap=` into `limits`;
/// false if `name` is none of them.
fn set_limit(limits: &mut Limits, name: &str, value: &str) -> Result<bool, String> {
    let field = match name {
        "share" => &mut limits.share,
        "cap" => &mut limits.cap,
        "disk-share" => &mut limits.disk_share,
        "disk-cap" => &mut limits.disk_cap,
        _ => return Ok(false),
    };
    *field = parse_part(value).map_err(|e| format!("{name}={e}"))?;
    Ok(true)
}

/// A tenant's share is within its cap, on each tier.
fn check_limits(name: &str, l: &Limits) -> Result<(), String> {
    if l.share > l.cap || l.disk_share > l.disk_cap {
        return Err(format!("tenant '{name}': a share above its cap"));
    }
    Ok(())
}

/// The tenants' shares add up to no more than the whole, on each tier.
fn check_shares<'a>(limits: impl Iterator<Item = &'a Limits> + Clone) -> Result<(), String> {
    let total = |f: fn(&Limits) -> u16| limits.clone().map(|l| f(l) as u32).sum::<u32>();
    for (tier, sum) in [
        ("share", total(|l| l.share)),
        ("disk-share", total(|l| l.disk_share)),
    ] {
        if sum > WHOLE as u32 {
            return Err(format!(
                "the tenants' {tier}s add up to {}%: at most 100%",
                sum as f64 / 100.0
            ));
        }
    }
    Ok(())
}

const TENANT_FORM: &str =
    "expected name=NAME,keys=PATTERN|user=USER[,share=P%][,cap=P%][,disk-share=P%][,disk-cap=P%]";

/// `name=NAME` with `keys=PATTERN`, `user=USER` or both, and the limits.
fn parse_tenant(s: &str) -> Result<TenantSpec, String> {
    let (mut name, mut keys, mut user) = (None, None, None);
    let mut limits = Limits::default();
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("name", v)) => name = Some(v),
            // No whitespace, as in ACL patterns: CONFIG GET and SET tenant
            // separate specs with spaces.
            Some(("keys", v)) if v.chars().any(char::is_whitespace) => {
                return Err(format!("key pattern '{v}': no whitespace"));
            }
            Some(("keys", v)) => keys = Some((KeyPattern::parse(v)?, v.to_string())),
            Some(("user", v)) if !v.is_empty() => user = Some(v.to_string()),
            Some((k, v)) if set_limit(&mut limits, k, v)? => {}
            _ => return Err(format!("'{part}': {TENANT_FORM}")),
        }
    }
    let Some(name) = name.filter(|_| keys.is_some() || user.is_some()) else {
        return Err(format!("'{s}': {TENANT_FORM}"));
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || !name.chars().all(valid) || name == "default" {
        return Err(format!(
            "tenant name '{name}': letters, digits, '_' or '-', and not 'default'"
        ));
    }
    check_limits(name, &limits)?;
    Ok(TenantSpec {
        name: name.to_string(),
        keys,
        user,
        limits,
    })
}

/// Each tenant's key patterns, in slot order from 1: its own, then its
/// ACL user's writable ones (a user's fences must be prefixes or exact
/// keys: a prefix test per key is what a write can afford).
pub fn tenant_patterns(tenants: &[TenantSpec], acl: &Acl) -> Result<Vec<Vec<KeyPattern>>, String> {
    tenants
        .iter()
        .map(|t| {
            let mut patterns: Vec<KeyPattern> = t.keys.iter().map(|(p, _)| p.clone()).collect();
            if let Some(name) = &t.user {
                let user = acl
                    .user(name)
                    .ok_or_else(|| format!("tenant '{}': no ACL user '{name}'", t.name))?;
                for glob in user.write_patterns() {
                    let text = String::from_utf8_lossy(&glob);
                    let p = KeyPattern::parse(&text)
                        .map_err(|e| format!("tenant '{}': ACL user '{name}': {e}", t.name))?;
                    patterns.push(p);
                }
            }
            Ok(patterns)
        })
        .collect()
}

/// One `name value` line of a config file.
struct FileSetting {
    /// Its line number, from 1.
    line: usize,
    /// The setting's name, lower case (a flag's long name).
    name: String,
    value: String,
}

/// The settings a config file's lines hold (`Err` names the line of one
/// that is not `name value`, after a colon).
fn file_settings(text: &str) -> Result<Vec<FileSetting>, String> {
    let mut settings = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words = kvtier_protocol::inline::split_inline_args(line.as_bytes())
            .ok_or_else(|| format!(" line {}: unbalanced quotes", n + 1))?;
        let mut words = words
            .into_iter()
            .map(|w| String::from_utf8_lossy(&w).into_owned());
        let Some(name) = words.next() else { continue };
        let value: Vec<String> = words.collect();
        let [value] = <[String; 1]>::try_from(value)
            .map_err(|_| format!(" line {}: expected `name value`, got {line:?}", n + 1))?;
        settings.push(FileSetting {
            line: n + 1,
            name: name.to_ascii_lowercase(),
            value,
        });
    }
    Ok(settings)
}

/// Whether `name` is a flag of kvtier-server (and so a config-file setting).
fn is_flag(name: &str) -> bool {
    use clap::CommandFactory;
    static FLAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FLAGS
        .get_or_init(|| {
            Config::command()
                .get_arguments()
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect()
        })
        .iter()
        .any(|f| f == name)
}

/// A config file's text with `changed` settings in it: the first line of
/// each replaced (later ones dropped), the others added at the end.
fn rewritten(text: &str, changed: &[(String, String)]) -> String {
    let line_of = |name: &str, value: &str| format!("{name} {}", quoted(value));
    let mut done = vec![false; changed.len()];
    let mut out = String::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        let hit = (!first.starts_with('#'))
            .then(|| {
                changed
                    .iter()
                    .position(|(n, _)| n.eq_ignore_ascii_case(first))
            })
            .flatten();
        match hit {
            Some(i) if done[i] => continue,
            Some(i) => {
                done[i] = true;
                out.push_str(&line_of(&changed[i].0, &changed[i].1));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    for (i, (name, value)) in changed.iter().enumerate() {
        if !done[i] {
            out.push_str(&line_of(name, value));
            out.push('\n');
        }
    }
    out
}

/// A value as a config-file word: in double quotes, with `\` and `"`
/// escaped, when it is empty or holds a space, a quote or a backslash.
fn quoted(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\');
    if plain {
        return value.to_string();
    }
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// Settings of redis.conf that kvtier does not have, so that a line
/// carried over from a Redis config is named as such.
const REDIS_ONLY: &[&str] = &[
    "activedefrag",
    "activerehashing",
    "always-show-logo",
    "aof-use-rdb-preamble",
    "appendfilename",
    "appendfsync",
    "appendonly",
    "cluster-config-file",
    "cluster-enabled",
    "daemonize",
    "databases",
    "dbfilename",
    "dir",
    "dynamic-hz",
    "io-threads",
    "lazyfree-lazy-eviction",
    "lazyfree-lazy-expire",
    "lazyfree-lazy-server-del",
    "logfile",
    "lua-time-limit",
    "notify-keyspace-events",
    "pidfile",
    "rdbchecksum",
    "rdbcompression",
    "replica-read-only",
    "replicaof",
    "save",
    "slaveof",
    "stop-writes-on-bgsave-error",
    "supervised",
    "syslog-enabled",
    "tcp-backlog",
    "unixsocket",
];

impl FileSetting {
    /// Whether kvtier has the setting and takes its value, alone: `Err`
    /// says which is wrong, in the file's words.
    fn check(&self, program: &str) -> Result<(), String> {
        if !is_flag(&self.name) {
            return Err(if REDIS_ONLY.contains(&self.name.as_str()) {
                format!(
                    "`{}` is a Redis setting that kvtier does not have; remove the line \
                     (kvtier-server --help lists kvtier's settings)",
                    self.name
                )
            } else {
                format!(
                    "unknown setting `{}` (kvtier-server --help lists the settings)",
                    self.name
                )
            });
        }
        let flag = format!("--{}", self.name);
        Config::try_parse_from([program, flag.as_str(), self.value.as_str()])
            .map(|_| ())
            .map_err(|e| {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                format!(
                    "`{} {}`: {}",
                    self.name,
                    self.value,
                    first.trim_start_matches("error: ")
                )
            })
    }
}

/// Parses a memory size the way redis.conf does: `1000`, `1k` (1000),
/// `1kb` (1024), `5mb`, `4gb` (case-insensitive).
/// `--maxmemory`: a size, or `auto` ([`auto_maxmemory`]).
pub fn parse_maxmemory(s: &str) -> Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(auto_maxmemory());
    }
    parse_memory(s)
}

/// What `--maxmemory auto` means: three quarters of the memory this process
/// may use (the machine's, or its cgroup's limit when that is lower), so a
/// cache tier never takes its whole host by default; 0 (no limit) when
/// neither can be read.
pub fn auto_maxmemory() -> u64 {
    let machine = total_system_memory();
    let limit =
        cgroup_memory_limit().map_or(machine, |c| if machine == 0 { c } else { c.min(machine) });
    limit / 4 * 3
}

/// The machine's memory (`MemTotal`), 0 if unknown.
pub fn total_system_memory() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The cgroup's memory limit (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), if it has one.
fn cgroup_memory_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|t| t.trim().parse::<u64>().ok())
    // v1 writes a huge number for "no limit".
    .find(|&n| n > 0 && n < (1 << 60))
}

pub fn parse_memory(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let split = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid memory size '{s}'"))?;
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return Err(format!("invalid memory size '{s}'")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("memory size '{s}' is too large"))
}

/// Formats bytes as Redis's `*_human` INFO fields do (`1.50M`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.2}{}", UNITS[unit])
    }
}

/// Redis's default `client-output-buffer-limit`.
pub const DEFAULT_OUTPUT_LIMITS: &str =
    "normal 0 0 0 replica 268435456 67108864 60 pubsub 33554432 8388608 60";

/// A `client-output-buffer-limit` value: `(hard, soft, seconds)` of the
/// normal class (what kvtier's clients are), and the value as CONFIG GET
/// shows it (every class, bytes in numbers).
pub fn parse_output_limits(s: &str) -> Result<((u64, u64, u64), String), String> {
    let words: Vec<&str> = s.split_whitespace().collect();
    if words.is_empty() || !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut classes: Vec<(&str, u64, u64, u64)> = vec![
        ("normal", 0, 0, 0),
        ("replica", 268_435_456, 67_108_864, 60),
        ("pubsub", 33_554_432, 8_388_608, 60),
    ];
    for group in words.chunks(4) {
        let class = match group[0].to_ascii_lowercase().as_str() {
            "normal" => "normal",
            "replica" | "slave" => "replica",
            "pubsub" => "pubsub",
            _ => {
                return Err("Invalid client class specified in buffer limit configuration.".into())
            }
        };
        let (Ok(hard), Ok(soft), Ok(secs)) = (
            parse_memory(group[1]),
            parse_memory(group[2]),
            group[3].parse::<u64>(),
        ) else {
            return Err(
                "Error in hard, soft or soft_seconds setting in buffer limit configuration.".into(),
            );
        };
        if let Some(c) = classes.iter_mut().find(|c| c.0 == class) {
            *c = (class, hard, soft, secs);
        }
    }
    let shown = classes
        .iter()
        .map(|(c, h, s, t)| format!("{c} {h} {s} {t}"))
        .collect::<Vec<_>>()
        .join(" ");
    let (_, h, s, t) = classes[0];
    Ok(((h, s, t), shown))
}

fn parse_output_limits_flag(s: &str) -> Result<String, String> {
    parse_output_limits(s).map(|(_, shown)| shown)
}

/// `--enable-debug-command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugCommand {
    /// Refused to everyone.
    No,
    /// Clients on a loopback address only.
    Local,
    /// Everyone.
    Yes,
}

/// The error a client gets when protected mode turns it away (Redis's text).
pub const PROTECTED_MODE_ERROR: &str = "-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Set up an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";

/// Whether `ip` is a loopback address (IPv4-mapped IPv6 included).
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Settings that CONFIG SET can change while the server runs.
pub struct LiveConfig {
    /// The numbers CONFIG SET changes, in [`Num::ALL`]'s order
    /// ([`LiveConfig::num`]).
    nums: [AtomicU64; Num::ALL.len()],
    policy: AtomicU8,
    /// The normal class's output limits: hard bytes, soft bytes, soft
    /// seconds (0: off).
    pub output_hard: AtomicU64,
    /// See `output_hard`.
    pub output_soft: AtomicU64,
    /// See `output_hard`.
    pub output_soft_secs: AtomicU64,
    /// `client-output-buffer-limit` as CONFIG GET shows it.
    pub output_limits: RwLock<String>,
    /// `requirepass` as last set (the default user's password).
    pub requirepass: Arc<RwLock<String>>,
    /// The users and their rules.
    pub acl: Acl,
    /// `masteruser`: the user this node logs in to its peers as.
    pub masteruser: Arc<RwLock<String>>,
    /// `masterauth`: its password (empty: requirepass).
    pub masterauth: Arc<RwLock<String>>,
    /// TLS, when a TLS port or TLS peer links are configured.
    pub tls: Option<Arc<Tls>>,
    /// Refuse non-loopback clients while no password is set.
    pub protected_mode: AtomicBool,
    /// Who may run DEBUG.
    pub debug_command: DebugCommand,
    /// Log level name.
    pub loglevel: RwLock<String>,
    /// `save` (kept for clients that read it; kvtier has no RDB).
    pub save: RwLock<String>,
    /// Settings fixed at start, reported by CONFIG GET.
    pub fixed: Vec<(&'static str, String)>,
    /// The settings CONFIG REWRITE may write, as they were at start.
    started: Vec<(String, String)>,
    /// The config file the server started with, if any.
    config_file: Option<PathBuf>,
    /// Transparent huge pages for the arena.
    pub hugepages: bool,
    /// Arena mapped and locked at start.
    pub prealloc: bool,
    /// Write DRAM blocks to the spill tier on graceful shutdown.
    pub spill_on_shutdown: AtomicBool,
    /// The tenants (`--tenant`), fixed at start: a store's tenant slot
    /// `i + 1` is `tenants[i]`, slot 0 the default tenant. Their limits
    /// are those at start: `tenant_limits` has the current ones.
    pub tenants: Vec<TenantSpec>,
    /// The tenants' shares and caps, `tenants`' order (`CONFIG SET
    /// tenant`).
    tenant_limits: RwLock<Vec<Limits>>,
}

impl LiveConfig {
    /// The current value of a number CONFIG SET changes.
    pub fn num(&self, n: Num) -> u64 {
        self.nums[n as usize].load(Relaxed)
    }

    /// The name of tenant slot `slot` (0: `default`).
    pub fn tenant_name(&self, slot: usize) -> &str {
        match slot {
            0 => "default",
            n => &self.tenants[n - 1].name,
        }
    }

    /// The tenants' key patterns, in slot order from 1 (each tenant's own
    /// and its ACL user's, as the ACL was at start).
    pub fn tenant_patterns(&self) -> Vec<Vec<KeyPattern>> {
        tenant_patterns(&self.tenants, &self.acl).unwrap_or_default()
    }

    /// The tenants' shares and caps now, in slot order from 1.
    pub fn tenant_limits(&self) -> Vec<Limits> {
        self.tenant_limits
            .read()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// CONFIG GET tenant: every tenant as `--tenant` takes it, with its
    /// limits now, separated by spaces.
    fn tenant_text(&self) -> String {
        let limits = self.tenant_limits();
        self.tenants
            .iter()
            .zip(&limits)
            .map(|(t, l)| {
                TenantSpec {
                    limits: *l,
                    ..t.clone()
                }
                .to_string()
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The limits CONFIG SET tenant `value` would leave of `limits`: one
    /// or more specs (separated by spaces) of tenants named at start, each
    /// `name=` and any of `share=`, `cap=`, `disk-share=`, `disk-cap=`
    /// (`keys=` and `user=` only as they are: a key's tenant cannot change
    /// while the server runs).
    fn tenant_limits_after(
        &self,
        mut limits: Vec<Limits>,
        value: &str,
    ) -> Result<Vec<Limits>, String> {
        for spec in value.split_whitespace() {
            let mut slot = None;
            let mut changes = Vec::new();
            for part in spec.split(',') {
                match part.split_once('=') {
                    Some(("name", v)) => {
                        slot = Some(self.tenants.iter().position(|t| t.name == v).ok_or_else(
                            || format!("no tenant '{v}' (tenants are named at start, by --tenant)"),
                        )?)
                    }
                    Some((k, v)) => changes.push((k, v)),
                    None => return Err(format!("'{part}': expected name=NAME,share=P%,...")),
                }
            }
            let slot = slot.ok_or_else(|| format!("'{spec}': no name=NAME"))?;
            for (k, v) in changes {
                if k == "keys" || k == "user" {
                    let t = &self.tenants[slot];
                    let now = match k {
                        "keys" => t.keys.as_ref().map(|(_, p)| p.as_str()),
                        _ => t.user.as_deref(),
                    };
                    if now != Some(v) {
                        return Err("a tenant's keys are set at start".into());
                    }
                } else if !set_limit(&mut limits[slot], k, v)? {
                    return Err(format!("'{k}={v}': {TENANT_FORM}"));
                }
            }
            check_limits(&self.tenants[slot].name, &limits[slot])?;
        }
        check_shares(limits.iter())?;
        Ok(limits)
    }

    /// How many bytes lookups may hold on one of `shards` shards
    /// (`hold-max-memory`, `hold-client-max-memory`; see
    /// `kvtier_store::holds`). No limit without maxmemory: nothing is
    /// evicted then.
    pub fn hold_limits(&self, shards: usize) -> kvtier_store::HoldLimits {
        let maxmemory = self.num(Num::Maxmemory);
        if maxmemory == 0 {
            return kvtier_store::HoldLimits::NONE;
        }
        let node = match self.num(Num::HoldMaxMemory) {
            0 => maxmemory / 4,
            n => n,
        };
        let client = match self.num(Num::HoldClientMaxMemory) {
            0 => node / 2,
            n => n.min(node),
        };
        let shards = shards.max(1) as u64;
        kvtier_store::HoldLimits {
            shard: (node / shards) as usize,
            client: (client / shards) as usize,
        }
    }

    /// Live settings initialised from the start-up configuration.
    pub fn new(
        config: &Config,
        acl: Acl,
        tls: Option<Arc<Tls>>,
        shards: usize,
        port: u16,
    ) -> LiveConfig {
        let mut live = LiveConfig {
            nums: Num::ALL.map(|n| AtomicU64::new((n.spec().start)(config))),
            started: Vec::new(),
            config_file: config.config_file.clone(),
            // The other settings CONFIG SET changes start as their
            // declarations say (`PARAMS`, below).
            policy: AtomicU8::new(0),
            output_hard: AtomicU64::new(0),
            output_soft: AtomicU64::new(0),
            output_soft_secs: AtomicU64::new(0),
            output_limits: RwLock::new(String::new()),
            requirepass: Arc::new(RwLock::new(String::new())),
            acl,
            tls,
            masteruser: Arc::new(RwLock::new(String::new())),
            masterauth: Arc::new(RwLock::new(String::new())),
            protected_mode: AtomicBool::new(false),
            debug_command: match config.enable_debug_command.as_str() {
                "yes" => DebugCommand::Yes,
                "local" => DebugCommand::Local,
                _ => DebugCommand::No,
            },
            loglevel: RwLock::new(String::new()),
            save: RwLock::new(String::new()),
            hugepages: config.hugepages,
            prealloc: config.prealloc,
            spill_on_shutdown: AtomicBool::new(false),
            tenants: config.tenants.clone(),
            tenant_limits: RwLock::new(config.tenants.iter().map(|t| t.limits).collect()),
            fixed: vec![
                (
                    "spill-dir",
                    config
                        .spill_dir
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                ),
                ("spill-max-bytes", config.spill_max_bytes.to_string()),
                ("spill-io-threads", config.spill_io_threads.to_string()),
                (
                    "cluster-nodes",
                    config.cluster_nodes.clone().unwrap_or_default(),
                ),
                ("node-id", config.node_id.clone().unwrap_or_default()),
                ("cluster-epoch", config.cluster_epoch.to_string()),
                ("cluster-redirect", yes_no_text(config.cluster_redirect)),
                (
                    "cluster-node-timeout",
                    config.cluster_node_timeout.to_string(),
                ),
                ("hot-key-threshold", config.hot_key_threshold.to_string()),
                ("enable-debug-command", config.enable_debug_command.clone()),
                ("hot-key-replicas", config.hot_key_replicas.to_string()),
                (
                    "cluster-replica-reads",
                    yes_no_text(config.cluster_replica_reads),
                ),
                ("cluster-handoff-ms", config.cluster_handoff_ms.to_string()),
                (
                    "cluster-announce-ip",
                    config.cluster_announce_ip.clone().unwrap_or_default(),
                ),
                (
                    "cluster-announce-port",
                    config.cluster_announce_port.unwrap_or(0).to_string(),
                ),
                (
                    "cluster-announce-hostname",
                    config.cluster_announce_hostname.clone().unwrap_or_default(),
                ),
                (
                    "cluster-preferred-endpoint-type",
                    config.cluster_preferred_endpoint_type.clone(),
                ),
                ("hugepages", yes_no_text(config.hugepages)),
                ("prealloc", yes_no_text(config.prealloc)),
                ("port", port.to_string()),
                ("tls-port", config.tls_port.to_string()),
                ("tls-cluster", yes_no_text(config.tls_cluster)),
                ("bind", config.bind.clone()),
                ("threads", shards.to_string()),
                ("pin-threads", yes_no_text(config.pin_threads)),
                (
                    "aclfile",
                    config
                        .aclfile
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                ),
                ("databases", "1".into()),
                ("appendonly", "no".into()),
                ("metrics-addr", config.metrics_addr.clone()),
                ("metrics-allow", config.metrics_allow.clone()),
                (
                    "config-file",
                    config
                        .config_file
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                ),
            ],
        };
        for p in PARAMS {
            // The flag was read by the same parser (clap's value_parser),
            // so its value parses here too.
            let v = (p.parse)(&(p.start)(config))
                .unwrap_or_else(|e| panic!("{} at start: {e} (clap took it)", p.name));
            (p.apply)(&live, v, When::Start);
        }
        live.started = live.rewritable();
        live
    }

    /// The settings CONFIG REWRITE may write and their values: those
    /// CONFIG SET changes that are also flags (so the file they are
    /// written to starts the server).
    fn rewritable(&self) -> Vec<(String, String)> {
        self.params()
            .chain(self.tls.iter().flat_map(|t| t.params()))
            .filter(|(name, _)| is_flag(name))
            .collect()
    }

    /// CONFIG REWRITE: the settings changed since start written into the
    /// config file the server started with (the line of each replaced,
    /// else one added; comments and other lines kept), atomically.
    pub fn rewrite(&self) -> Result<(), String> {
        let Some(path) = &self.config_file else {
            return Err("The server is running without a config file".into());
        };
        let changed: Vec<(String, String)> = self
            .rewritable()
            .into_iter()
            .filter(|setting| !self.started.contains(setting))
            .collect();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let written = rewritten(&text, &changed);
        let tmp = path.with_extension("rewrite.tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(written.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Reads the user and password this node logs in to its peers with
    /// (masteruser and masterauth, else requirepass; none when both are
    /// empty) when a peer connection opens: CONFIG SET applies to the
    /// next one.
    pub fn peer_login(&self) -> impl Fn() -> Option<(String, String)> + Send + Sync + 'static {
        let (user, auth) = (Arc::clone(&self.masteruser), Arc::clone(&self.masterauth));
        let requirepass = Arc::clone(&self.requirepass);
        move || {
            let pass = Some(read_text(&auth))
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| read_text(&requirepass));
            (!pass.is_empty()).then(|| (read_text(&user), pass))
        }
    }

    /// `requirepass` as last set.
    pub fn requirepass_text(&self) -> String {
        read_text(&self.requirepass)
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        EvictionPolicy::ALL[self.policy.load(Relaxed) as usize]
    }

    /// Whether protected mode turns away a client connecting from `peer`:
    /// it is on, the default user needs no password (as Redis checks it),
    /// and the address is not loopback.
    pub fn refuses(&self, peer: std::net::IpAddr) -> bool {
        self.protected_mode.load(Relaxed) && self.acl.default_user().nopass && !is_loopback(peer)
    }

    /// Whether a client connecting from `peer` may run DEBUG.
    pub fn debug_allowed(&self, peer: std::net::IpAddr) -> bool {
        match self.debug_command {
            DebugCommand::Yes => true,
            DebugCommand::Local => is_loopback(peer),
            DebugCommand::No => false,
        }
    }

    /// Whether clients must AUTH: the default user is off or has a
    /// password.
    pub fn auth_required(&self) -> bool {
        !self.acl.open()
    }

    /// Every parameter name and its current value, sorted by name.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .params()
            .chain(self.fixed.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .chain(self.tls.iter().flat_map(|t| t.params()))
            .chain([("tenant".to_string(), self.tenant_text())])
            .collect();
        out.sort();
        out
    }

    /// The settings CONFIG SET changes and their values: the numbers, then
    /// the others.
    fn params(&self) -> impl Iterator<Item = (String, String)> + '_ {
        Num::ALL
            .into_iter()
            .map(|n| {
                let spec = n.spec();
                (spec.name.to_string(), (spec.show)(self.num(n)))
            })
            .chain(PARAMS.iter().map(|p| (p.name.to_string(), (p.get)(self))))
    }

    /// CONFIG GET: parameters matching the glob `pattern` (case-insensitive).
    pub fn get(&self, pattern: &[u8]) -> Vec<(String, String)> {
        self.all()
            .into_iter()
            .filter(|(name, _)| glob_match(pattern, name.as_bytes(), true))
            .collect()
    }

    /// Validates `value` for parameter `name` without applying it.
    pub fn check(&self, name: &str, value: &str) -> Result<(), String> {
        if let Some(n) = Num::named(name) {
            return (n.spec().parse)(value).map(|_| ());
        }
        match PARAMS.iter().find(|p| p.name.eq_ignore_ascii_case(name)) {
            Some(p) => (p.parse)(value).map(|_| ()),
            // Checked by loading them, when set.
            None if self.tls_param(name) => Ok(()),
            None if name.eq_ignore_ascii_case("tenant") => self
                .tenant_limits_after(self.tenant_limits(), value)
                .map(|_| ()),
            None if self.fixed.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) => {
                Err("can't set immutable config".into())
            }
            None => Err("unknown".into()),
        }
    }

    fn tls_param(&self, name: &str) -> bool {
        self.tls
            .iter()
            .flat_map(|t| t.params())
            .any(|(k, _)| k.eq_ignore_ascii_case(name))
    }

    /// CONFIG SET of one parameter (checked first with [`Self::check`]).
    pub fn set(&self, name: &str, value: &str) -> Result<(), String> {
        self.set_all(&[(name.to_string(), value.to_string())])
            .map_err(|(_, e)| e)
    }

    /// CONFIG SET of several parameters (checked first with
    /// [`Self::check`]): the TLS ones together (a certificate and its key
    /// change at once), then the others; `Err` names the one refused.
    pub fn set_all(&self, pairs: &[(String, String)]) -> Result<(), (String, String)> {
        let (tls, rest): (Vec<_>, Vec<_>) = pairs.iter().partition(|(n, _)| self.tls_param(n));
        if let (Some(t), Some((name, _))) = (&self.tls, tls.first()) {
            let changes: Vec<(String, String)> = tls
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                .collect();
            t.set(&changes).map_err(|e| (name.clone(), e))?;
        }
        for (name, value) in rest {
            self.set_one(name, value).map_err(|e| (name.clone(), e))?;
        }
        Ok(())
    }

    fn set_one(&self, name: &str, value: &str) -> Result<(), String> {
        if name.eq_ignore_ascii_case("tenant") {
            // Read, changed and written under one lock: two clients
            // setting different tenants at once both take effect.
            let mut limits = self
                .tenant_limits
                .write()
                .map_err(|_| "tenant limits poisoned")?;
            *limits = self.tenant_limits_after(limits.clone(), value)?;
            return Ok(());
        }
        if let Some(n) = Num::named(name) {
            let v = (n.spec().parse)(value)?;
            self.nums[n as usize].store(v, Relaxed);
            return Ok(());
        }
        let p = PARAMS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .ok_or("unknown")?;
        let parsed = (p.parse)(value)?;
        (p.apply)(self, parsed, When::Set);
        Ok(())
    }
}

fn policy_index(p: EvictionPolicy) -> u8 {
    EvictionPolicy::ALL
        .iter()
        .position(|&q| q == p)
        .unwrap_or(0) as u8
}

/// A parsed CONFIG SET value.
enum Value {
    Number(u64),
    Text(String),
}

/// A setting CONFIG SET can change that is not a number ([`Num`]),
/// declared once: its name (the flag's, the config file's and CONFIG's),
/// how CONFIG GET shows it, how a value is read and checked (on the same
/// function as its flag's parser, so start-up and CONFIG SET accept the
/// same values), how it takes effect, and its value at start (the flag's,
/// taking effect through the same `parse` and `apply`).
struct Param {
    name: &'static str,
    get: fn(&LiveConfig) -> String,
    parse: fn(&str) -> Result<Value, String>,
    apply: fn(&LiveConfig, Value, When),
    start: fn(&Config) -> String,
}

/// When a [`Param`] is applied: at start (effects other parts own at start
/// — the default user's password, the log level — are already in place)
/// or by CONFIG SET.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    Start,
    Set,
}

fn number(s: &str) -> Result<Value, String> {
    s.parse::<u64>()
        .map(Value::Number)
        .map_err(|_| "argument couldn't be parsed into an integer".into())
}

fn text(s: &str) -> Result<Value, String> {
    Ok(Value::Text(s.to_string()))
}

fn set_num(target: &AtomicU64, v: Value) {
    if let Value::Number(n) = v {
        target.store(n, Relaxed);
    }
}

/// A Redis log level name, lower-cased, or Redis's error text.
fn loglevel_arg(s: &str) -> Result<String, String> {
    let level = s.to_ascii_lowercase();
    match crate::logging::level_filter(&level) {
        Some(_) => Ok(level),
        None => Err(format!(
            "argument(s) must be one of the following: {}",
            crate::logging::LEVELS.join(", ")
        )),
    }
}

fn set_text(target: &RwLock<String>, v: Value) {
    if let (Value::Text(t), Ok(mut guard)) = (v, target.write()) {
        *guard = t;
    }
}

/// A yes/no setting as CONFIG GET shows it.
fn yes_no(flag: &AtomicBool) -> String {
    yes_no_text(flag.load(Relaxed))
}

/// `yes` or `no`.
fn yes_no_text(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// `yes` / `no` for CONFIG SET (as a number: 1 / 0).
fn yes_no_value(s: &str) -> Result<Value, String> {
    parse_yes_no(s).map(|b| Value::Number(b as u64))
}

fn set_bool(target: &AtomicBool, v: Value) {
    if let Value::Number(n) = v {
        target.store(n != 0, Relaxed);
    }
}

fn read_text(target: &RwLock<String>) -> String {
    target.read().map(|s| s.clone()).unwrap_or_default()
}

const PARAMS: &[Param] = &[
    Param {
        name: "maxmemory-policy",
        get: |c| c.policy().name().to_string(),
        parse: |s| {
            s.parse::<EvictionPolicy>()
                .map(|p| Value::Number(policy_index(p) as u64))
                .map_err(|_| "argument(s) must be one of the following: volatile-lru, volatile-lfu, volatile-random, volatile-ttl, allkeys-lru, allkeys-lfu, allkeys-random, noeviction, prefix".into())
        },
        apply: |c, v, _| {
            if let Value::Number(n) = v {
                c.policy.store(n as u8, Relaxed);
            }
        },
        start: |c| c.maxmemory_policy.name().to_string(),
    },
    Param {
        name: "client-output-buffer-limit",
        get: |c| read_text(&c.output_limits),
        parse: |s| parse_output_limits(s).map(|(_, shown)| Value::Text(shown)),
        apply: |c, v, _| {
            if let Value::Text(shown) = v {
                if let Ok(((hard, soft, secs), _)) = parse_output_limits(&shown) {
                    c.output_hard.store(hard, Relaxed);
                    c.output_soft.store(soft, Relaxed);
                    c.output_soft_secs.store(secs, Relaxed);
                }
                set_text(&c.output_limits, Value::Text(shown));
            }
        },
        start: |c| c.client_output_buffer_limit.clone(),
    },
    Param {
        name: "spill-on-shutdown",
        get: |c| yes_no(&c.spill_on_shutdown),
        parse: yes_no_value,
        apply: |c, v, _| set_bool(&c.spill_on_shutdown, v),
        start: |c| yes_no_text(c.spill_on_shutdown),
    },
    Param {
        name: "requirepass",
        get: |c| read_text(&c.requirepass),
        parse: text,
        apply: |c, v, when| {
            // At start the ACL was built with it (Acl::new).
            if let (Value::Text(t), When::Set) = (&v, when) {
                c.acl.set_default_password(t);
            }
            set_text(&c.requirepass, v)
        },
        start: |c| c.requirepass.clone(),
    },
    Param {
        name: "masteruser",
        get: |c| read_text(&c.masteruser),
        parse: text,
        apply: |c, v, _| set_text(&c.masteruser, v),
        start: |c| c.masteruser.clone(),
    },
    Param {
        name: "masterauth",
        get: |c| read_text(&c.masterauth),
        parse: text,
        apply: |c, v, _| set_text(&c.masterauth, v),
        start: |c| c.masterauth.clone(),
    },
    Param {
        name: "acllog-max-len",
        get: |c| c.acl.log_max_len.load(Relaxed).to_string(),
        parse: number,
        apply: |c, v, _| set_num(&c.acl.log_max_len, v),
        start: |c| c.acllog_max_len.to_string(),
    },
    Param {
        name: "protected-mode",
        get: |c| yes_no(&c.protected_mode),
        parse: yes_no_value,
        apply: |c, v, _| set_bool(&c.protected_mode, v),
        start: |c| yes_no_text(c.protected_mode),
    },
    Param {
        name: "loglevel",
        get: |c| read_text(&c.loglevel),
        parse: |s| loglevel_arg(s).map(Value::Text),
        apply: |c, v, when| {
            // At start the logger was set up with it.
            if let (Value::Text(level), When::Set) = (&v, when) {
                crate::logging::set_level(level);
            }
            set_text(&c.loglevel, v)
        },
        start: |c| c.loglevel.clone(),
    },
    Param {
        name: "save",
        get: |c| read_text(&c.save),
        parse: |s| {
            if s.trim().is_empty() {
                Ok(Value::Text(String::new()))
            } else {
                Err("kvtier keeps no RDB snapshots; only an empty save is accepted".into())
            }
        },
        apply: |c, v, _| set_text(&c.save, v),
        start: |_| String::new(),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_units_like_redis_conf() {
        assert_eq!(parse_memory("100").unwrap(), 100);
        assert_eq!(parse_memory("1k").unwrap(), 1000);
        assert_eq!(parse_memory("1kb").unwrap(), 1024);
        assert_eq!(parse_memory("4GB").unwrap(), 4 << 30);
        assert_eq!(parse_memory("512mb").unwrap(), 512 << 20);
        assert!(parse_memory("12x").is_err());
        assert!(parse_memory("").is_err());
    }

    #[test]
    fn file_then_flags_override() {
        let dir = std::env::temp_dir().join(format!("kvtier-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvtier.conf");
        std::fs::write(
            &path,
            "# comment\nport 7000\nmaxmemory 1gb\nrequirepass \"a b\"\n",
        )
        .unwrap();
        let args = |extra: &[&str]| {
            let mut v = vec!["kvtier-server".to_string(), path.display().to_string()];
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };
        let c = Config::load_from(args(&[])).unwrap();
        assert_eq!(
            (c.port, c.maxmemory, c.requirepass.as_str()),
            (7000, 1 << 30, "a b")
        );
        let c = Config::load_from(args(&["--port", "7001"])).unwrap();
        assert_eq!(c.port, 7001);
        let refused = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Config::load_from(args(&[])).unwrap_err()
        };
        let at = |line: usize| format!("{} line {line}: ", path.display());
        assert_eq!(
            refused("port 7000\nbogus-option 1\n"),
            format!(
                "{}unknown setting `bogus-option` (kvtier-server --help lists the settings)",
                at(2)
            )
        );
        assert_eq!(
            refused("# from redis.conf\n\nappendonly no\n"),
            format!(
                "{}`appendonly` is a Redis setting that kvtier does not have; remove the line \
                 (kvtier-server --help lists kvtier's settings)",
                at(3)
            )
        );
        let e = refused("maxmemory lots\n");
        assert!(
            e.starts_with(&format!("{}`maxmemory lots`: invalid value 'lots'", at(1))),
            "{e}"
        );
        let e = refused("port 7000 7001\n");
        assert!(
            e.starts_with(&format!("{}expected `name value`", at(1))),
            "{e}"
        );
    }

    #[test]
    fn a_rewrite_replaces_each_changed_line_and_adds_the_others() {
        let text = "# kept\nport 7000\nmaxmemory 1gb\n# maxmemory 5gb\nmaxmemory 2gb\n";
        let changed = [
            ("maxmemory".to_string(), "3221225472".to_string()),
            ("requirepass".to_string(), "a \"b\\".to_string()),
            ("masterauth".to_string(), String::new()),
        ];
        let out = rewritten(text, &changed);
        assert_eq!(
            out,
            "# kept\nport 7000\nmaxmemory 3221225472\n# maxmemory 5gb\n\
             requirepass \"a \\\"b\\\\\"\nmasterauth \"\"\n"
        );
        let settings = file_settings(&out).unwrap();
        let values: Vec<(&str, &str)> = settings
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            values,
            [
                ("port", "7000"),
                ("maxmemory", "3221225472"),
                ("requirepass", "a \"b\\"),
                ("masterauth", ""),
            ]
        );
    }

    #[test]
    fn every_setting_config_set_changes_is_a_flag_or_said_not_to_be() {
        // CONFIG REWRITE writes only flags: a parameter that is not one
        // would be silently left out, so the list of those is explicit.
        let not_flags: Vec<&str> = PARAMS
            .iter()
            .map(|p| p.name)
            .filter(|n| !is_flag(n))
            .collect();
        assert_eq!(
            not_flags,
            ["save"],
            "parameters CONFIG REWRITE cannot write"
        );
    }

    #[test]
    fn config_get_glob_and_set() {
        let c = Config::load_from(vec!["kvtier-server".into()]).unwrap();
        let catalog = Box::leak(Box::new(crate::acl::Catalog::new([("get", 0, 0)])));
        let acl = Acl::new(catalog, "", None).unwrap();
        let live = LiveConfig::new(&c, acl, None, 2, 6379);
        let got = live.get(b"maxmemory*");
        assert_eq!(got.len(), 4, "maxmemory, -clients, -policy, -samples");
        live.set("maxmemory", "10mb").unwrap();
        assert_eq!(live.num(Num::Maxmemory), 10 << 20);
        assert!(live.check("maxmemory-policy", "bogus").is_err());
        assert!(live.check("port", "1").is_err());
        assert!(live.check("save", "900 1").is_err());
        live.set("maxmemory-policy", "allkeys-lru").unwrap();
        assert_eq!(live.policy(), EvictionPolicy::AllKeysLru);
    }

    /// Every number CONFIG SET changes is read by one function at start
    /// and at CONFIG SET: a value is refused by both or taken by both as
    /// the same number.
    #[test]
    fn start_and_config_set_agree_on_every_number() {
        let catalog = Box::leak(Box::new(crate::acl::Catalog::new([("get", 0, 0)])));
        let values = [
            "0", "1", "7", "64", "65", "500", "501", "10000", "10001", "1kb", "1mb", "2gb", "all",
            "auto", "-1", "x", "",
        ];
        for n in Num::ALL {
            let spec = n.spec();
            for v in values {
                let flag = format!("--{}", spec.name);
                let started = Config::load_from(vec!["kvtier-server".into(), flag, v.into()]);
                let live = LiveConfig::new(
                    &Config::load_from(vec!["kvtier-server".into()]).unwrap(),
                    Acl::new(catalog, "", None).unwrap(),
                    None,
                    1,
                    6379,
                );
                let set = live.set(spec.name, v);
                assert_eq!(
                    started.is_ok(),
                    set.is_ok(),
                    "{} {v:?}: {started:?} vs {set:?}",
                    spec.name
                );
                if let Ok(c) = started {
                    assert_eq!((spec.start)(&c), live.num(n), "{} {v:?}", spec.name);
                }
            }
            assert_eq!(Num::named(&spec.name.to_uppercase()), Some(n));
        }
    }

    #[test]
    fn every_setting_fixed_at_start_is_a_flag_or_a_redis_constant() {
        // CONFIG GET's fixed settings are named beside their flags: a
        // renamed flag must not leave its old name behind.
        let catalog = Box::leak(Box::new(crate::acl::Catalog::new([("get", 0, 0)])));
        let config = Config::load_from(vec!["kvtier-server".into()]).unwrap();
        let live = LiveConfig::new(&config, Acl::new(catalog, "", None).unwrap(), None, 1, 6379);
        let not_flags: Vec<&str> = live
            .fixed
            .iter()
            .map(|(name, _)| *name)
            .filter(|n| !is_flag(n))
            .collect();
        // Redis's constants, and the config file's path (the first
        // argument, as redis-server takes it).
        assert_eq!(not_flags, ["databases", "appendonly", "config-file"]);
    }

    #[test]
    fn start_and_config_set_agree_on_every_other_setting() {
        let catalog = Box::leak(Box::new(crate::acl::Catalog::new([("get", 0, 0)])));
        let live = |config: &Config| {
            LiveConfig::new(config, Acl::new(catalog, "", None).unwrap(), None, 1, 6379)
        };
        let values = [
            "yes",
            "no",
            "YES",
            "maybe",
            "",
            "notice",
            "DEBUG",
            "warning",
            "nothing",
            "loud",
            "prefix",
            "allkeys-LRU",
            "noeviction",
            "lru",
            "normal 0 0 0",
            "normal 1mb 512kb 60",
            "normal 1 2",
            "pubsub 0 0 0",
            "0",
            "128",
            "-1",
            "x",
            "a b",
        ];
        let mut checked = 0;
        for p in PARAMS.iter().filter(|p| is_flag(p.name)) {
            for v in values {
                let started =
                    Config::load_from(vec!["kvtier-server".into(), format!("--{}={v}", p.name)]);
                let set_live = live(&Config::load_from(vec!["kvtier-server".into()]).unwrap());
                let set = set_live.set(p.name, v);
                assert_eq!(
                    started.is_ok(),
                    set.is_ok(),
                    "{} {v:?}: {started:?} vs {set:?}",
                    p.name
                );
                if let Ok(c) = started {
                    // CONFIG GET shows the same value either way.
                    assert_eq!(
                        live(&c).get(p.name.as_bytes()),
                        set_live.get(p.name.as_bytes())
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 40, "{checked}");
    }
}
