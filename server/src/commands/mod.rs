//! The command layer: every command's name, arity, flags, key positions,
//! documentation and handler, registered by family (one file per family, as
//! in Dragonfly's `string_family`, `generic_family`).
//!
//! Inside the layer, imports point one way: this file (the spec, the
//! arguments, the [`Client`] context and what the families share) ← the
//! helpers (`docs.rs`, `long_double.rs`, `session.rs`) ← the families
//! (one file each; a family never imports another) ← `registry.rs` (the
//! table of every family's commands).
//!
//! Handlers come in four shapes:
//! * [`Handler::Key`]: a single-key command. It runs on the shard that owns
//!   the key, inline when that is the connection's shard, and otherwise
//!   through the owner's mailbox, batched with the rest of the pipeline.
//! * [`Handler::Sync`]: connection-level work that needs no other shard.
//! * [`Handler::Async`]: commands that fan out (MGET, DEL k1 k2, KEYS, INFO,
//!   FLUSHALL, ...) and await the shards' answers.
//! * [`Handler::Parent`]: a container (CLIENT, CONFIG, ...) whose
//!   subcommands have their own specs.
//!
//! [`Plan::of`] turns a spec and its [`Args`] into how the call runs, once,
//! for the connection, EXEC and the local share of a spread command alike.

pub mod acl;
pub mod bitmap;
pub mod block;
pub mod client;
pub mod cluster;
pub mod connection;
pub mod docs;
pub mod keyspace;
pub mod long_double;
pub mod registry;
pub mod server;
pub mod session;
pub mod string;
pub mod transaction;

use std::cell::RefCell;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_protocol::{PendingValue, Reply};
use kvtier_store::{now_ms, Encoding, Entry, Fetched, Store};

use crate::acl::{Acl, Catalog, KeyUse};
use crate::clients::ClientInfo;
use crate::config::Num;
use crate::shard::slot::key_slot;
use crate::shard::watching::Watching;
use crate::shard::{Access, Shard, ShardGone};

/// A boxed future borrowing the client, returned by async handlers.
pub type LocalBoxFuture<'a> = Pin<Box<dyn Future<Output = Reply> + 'a>>;

/// A command's arguments (the name first), with the hash slots of its keys
/// found once, when the command was parsed: admission, routing, the shard
/// fan-out and the store all read the same figures.
#[derive(Clone, Debug, Default)]
pub struct Args {
    list: Vec<Bytes>,
    /// The keys found when the command was parsed: (argument index, slot),
    /// in argument order; none when the key count was bad. Read as a slice
    /// (`args.keys.iter()`); only [`Args`] makes them.
    pub keys: Keys,
}

/// The keys [`Args`] found, read as a slice of (argument index, slot): none,
/// one key (no allocation: the common single-key command), or several
/// (with the slot of each argument, for [`Args::slot`]).
#[derive(Clone, Debug, Default)]
pub struct Keys(Found);

#[derive(Clone, Debug, Default)]
enum Found {
    /// No keys (none, or a bad key count).
    #[default]
    None,
    /// One key.
    One([(usize, u16); 1]),
    /// Several: the keys, and by argument ([`NOT_A_KEY`] for an argument
    /// that is not a key).
    Each {
        keys: Vec<(usize, u16)>,
        by_arg: Vec<u16>,
    },
}

impl std::ops::Deref for Keys {
    type Target = [(usize, u16)];
    fn deref(&self) -> &[(usize, u16)] {
        match &self.0 {
            Found::None => &[],
            Found::One(one) => one,
            Found::Each { keys, .. } => keys,
        }
    }
}

/// [`Keys`]'s mark for an argument that is not a key.
const NOT_A_KEY: u16 = u16::MAX;

impl Args {
    /// `list`, with the slots of the arguments at `keys` computed now.
    pub fn new(list: Vec<Bytes>, keys: impl IntoIterator<Item = usize>) -> Args {
        let mut keys = keys.into_iter();
        let found = match (keys.next(), keys.next()) {
            (None, _) => Found::None,
            (Some(index), None) => Found::One([(index, key_slot(&list[index]))]),
            (Some(a), Some(b)) => {
                let mut by_arg = vec![NOT_A_KEY; list.len()];
                let keys: Vec<(usize, u16)> = [a, b]
                    .into_iter()
                    .chain(keys)
                    .map(|i| {
                        let slot = key_slot(&list[i]);
                        by_arg[i] = slot;
                        (i, slot)
                    })
                    .collect();
                Found::Each { keys, by_arg }
            }
        };
        Args {
            list,
            keys: Keys(found),
        }
    }

    /// `list` as the arguments of `spec` (its keys' slots computed now; a
    /// single key costs no allocation).
    pub fn of(spec: &CommandSpec, list: Vec<Bytes>) -> Args {
        let k = spec.keys;
        if k.first > 0 && k.first == k.last && (k.first as usize) < list.len() {
            // One key at a fixed place (GET, SET, ...): the common case.
            let index = k.first as usize;
            let slot = key_slot(&list[index]);
            return Args {
                list,
                keys: Keys(Found::One([(index, slot)])),
            };
        }
        match spec.key_positions(&list) {
            Some(keys) => Args::new(list, keys),
            None => Args::new(list, None),
        }
    }

    /// The hash slot of argument `i` (found at parsing for a key, hashed
    /// now for any other argument used as one).
    pub fn slot(&self, i: usize) -> u16 {
        match &self.keys.0 {
            Found::One([(index, slot)]) if *index == i => *slot,
            Found::Each { by_arg, .. } if by_arg.get(i).is_some_and(|&s| s != NOT_A_KEY) => {
                by_arg[i]
            }
            _ => key_slot(&self.list[i]),
        }
    }

    /// The arguments alone.
    pub fn into_vec(self) -> Vec<Bytes> {
        self.list
    }
}

impl std::ops::Deref for Args {
    type Target = Vec<Bytes>;
    fn deref(&self) -> &Vec<Bytes> {
        &self.list
    }
}

/// What a single-key command gets on the owning shard.
pub struct KeyOp {
    /// All arguments, the command name first.
    pub args: Args,
    /// Index of the key in `args`.
    pub key_index: usize,
    /// Slot of the key.
    pub slot: u16,
    /// Whether reads count as accesses (false under CLIENT NO-TOUCH).
    pub touch: bool,
}

impl KeyOp {
    /// The key this command is about.
    pub fn key(&self) -> &[u8] {
        &self.args[self.key_index]
    }
}

/// A single-key command (or a multi-key one whose keys share a shard) made
/// ready to run on the shard that owns its key.
pub struct ShardOp {
    /// The body.
    pub run: KeyFn,
    /// What it gets.
    pub op: KeyOp,
    /// The shard owning the key.
    pub owner: usize,
    /// [`Access::Read`] for a READONLY command: another shard's thread may
    /// run it when the owner is free (see [`Shard::with_store`]).
    pub access: Access,
}

impl ShardOp {
    /// `args` for `run`, its key at `key_index`, for `client`.
    pub fn new(
        client: &Client,
        spec: &CommandSpec,
        run: KeyFn,
        args: Args,
        key_index: usize,
    ) -> Self {
        let slot = args.slot(key_index);
        ShardOp {
            run,
            owner: client.shard.owner_of(slot),
            access: if spec.has(flags::READONLY) {
                Access::Read
            } else {
                Access::Write
            },
            op: KeyOp {
                args,
                key_index,
                slot,
                touch: !client.no_touch,
            },
        }
    }

    /// Runs it against the owner's store.
    pub fn run(&self, store: &mut Store, now: u64) -> Reply {
        (self.run)(store, &self.op, now)
    }

    /// Its argument list, once run (for the parser to reuse).
    pub fn into_args(self) -> Vec<Bytes> {
        self.op.args.into_vec()
    }
}

/// How a command runs: decided once, by [`Plan::of`], for every path (the
/// connection, EXEC's queued commands, the local share of a command spread
/// over nodes).
pub enum Plan {
    /// On the shard owning its key: a single-key command, or a multi-key
    /// one whose keys all live on one shard (its `one_shard` form: batched
    /// like a single-key command, atomic).
    Shard(ShardOp),
    /// At once, on the connection.
    Now(SyncFn, Args),
    /// Awaiting other shards.
    Await(AsyncFn, Args),
    /// A container called without a known subcommand.
    Parent(Args),
}

impl Plan {
    /// How `args`, a call of `spec`, runs for `client`.
    pub fn of(client: &Client, spec: &'static CommandSpec, args: Args) -> Plan {
        match spec.handler {
            Handler::Key(f) => Plan::Shard(ShardOp::new(
                client,
                spec,
                f,
                args,
                spec.keys.first as usize,
            )),
            Handler::Sync(f) => Plan::Now(f, args),
            Handler::Parent => Plan::Parent(args),
            Handler::Async(f) => match spec.one_shard.filter(|one| (one.applies)(&args)) {
                Some(one) => match single_owner(client, &args) {
                    Some(first) => Plan::Shard(ShardOp::new(client, spec, one.run, args, first)),
                    None => Plan::Await(f, args),
                },
                None => Plan::Await(f, args),
            },
        }
    }
}

/// The first key of a multi-key call, if every key lives on the same shard.
fn single_owner(client: &Client, args: &Args) -> Option<usize> {
    let shard = &client.shard;
    let (&(first, slot), rest) = args.keys.split_first()?;
    let owner = shard.owner_of(slot);
    rest.iter()
        .all(|&(_, s)| shard.owner_of(s) == owner)
        .then_some(first)
}

/// Runs a command for `client`, awaited to its end: EXEC's queued commands
/// and the local share of a command spread over nodes. The connection runs
/// the same [`Plan`] but batches its shard work with the pipeline.
pub async fn execute(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    match Plan::of(client, spec, args) {
        Plan::Shard(op) => client
            .shard
            .with_store(op.owner, op.access, move |store| op.run(store, now_ms()))
            .await
            .unwrap_or_else(|_| Reply::from(ShardGone)),
        Plan::Now(f, args) => f(client, &args),
        Plan::Await(f, args) => f(client, args).await,
        Plan::Parent(args) => unknown_subcommand(spec.name, &args[0]),
    }
}

/// A single-key command body, run on the owner shard against its store.
pub type KeyFn = fn(&mut Store, &KeyOp, u64) -> Reply;
/// A connection-level command body.
pub type SyncFn = fn(&mut Client, &[Bytes]) -> Reply;
/// A command body that awaits other shards.
pub type AsyncFn = for<'a> fn(&'a mut Client, Args) -> LocalBoxFuture<'a>;

/// How a command is executed.
#[derive(Clone, Copy)]
pub enum Handler {
    /// See [`KeyFn`].
    Key(KeyFn),
    /// See [`SyncFn`].
    Sync(SyncFn),
    /// See [`AsyncFn`].
    Async(AsyncFn),
    /// A container (CLIENT, CONFIG, ...): dispatches on its subcommand.
    Parent,
}

/// Command flags, as COMMAND INFO reports them.
pub mod flags {
    /// May modify the keyspace.
    pub const WRITE: u32 = 1;
    /// Only reads.
    pub const READONLY: u32 = 1 << 1;
    /// May grow memory use: refused under OOM.
    pub const DENYOOM: u32 = 1 << 2;
    /// Administrative.
    pub const ADMIN: u32 = 1 << 3;
    /// O(1) or O(log N).
    pub const FAST: u32 = 1 << 4;
    /// Allowed before AUTH.
    pub const NO_AUTH: u32 = 1 << 5;
    /// Not allowed in scripts.
    pub const NOSCRIPT: u32 = 1 << 6;
    /// Allowed while loading.
    pub const LOADING: u32 = 1 << 7;
    /// Allowed on a stale replica.
    pub const STALE: u32 = 1 << 8;
    /// Answers may differ between calls with the same arguments.
    pub const RANDOM: u32 = 1 << 9;
    /// Can block the client.
    pub const BLOCKING: u32 = 1 << 10;
    /// Not propagated to replicas / AOF.
    pub const SKIP_MONITOR: u32 = 1 << 11;
    /// Has dangerous effects (FLUSHALL, KEYS, ...).
    pub const DANGEROUS: u32 = 1 << 12;

    // kvtier's own flags (not in COMMAND INFO): what the connection and
    // the cluster layer need to know of a command.

    /// Runs at once inside MULTI instead of being queued (EXEC, DISCARD,
    /// MULTI, WATCH, QUIT, RESET, as in Redis).
    pub const TX_NOW: u32 = 1 << 16;
    /// Runs on the node the client is connected to whatever its keys
    /// (WATCH registers on this node's shards).
    pub const HERE: u32 = 1 << 17;
    /// Empties the keyspace: in a cluster, the hot-key copies this node
    /// made elsewhere and the ones it holds go too.
    pub const FLUSH: u32 = 1 << 18;
    /// Answers a write that does not fit per key (MSETBLOCK's `-1`), so
    /// one value too large for memory does not refuse the whole command.
    pub const OOM_PER_KEY: u32 = 1 << 19;

    /// Names reported by COMMAND INFO, in Redis's order.
    pub const NAMES: [(u32, &str); 12] = [
        (WRITE, "write"),
        (READONLY, "readonly"),
        (DENYOOM, "denyoom"),
        (ADMIN, "admin"),
        (NOSCRIPT, "noscript"),
        (BLOCKING, "blocking"),
        (LOADING, "loading"),
        (STALE, "stale"),
        (SKIP_MONITOR, "skip_monitor"),
        (NO_AUTH, "no_auth"),
        (FAST, "fast"),
        (RANDOM, "random"),
    ];
}

/// Where a command's keys are, as in COMMAND INFO (first, last, step), or
/// after a count argument (`numkeys`, as in ZUNIONSTORE: "movable" keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// Index of the first key (0: no keys).
    pub first: i32,
    /// Index of the last key; negative counts from the end.
    pub last: i32,
    /// Distance between keys.
    pub step: i32,
    /// Index of the argument that says how many keys follow (0: none).
    pub count_at: i32,
}

impl KeySpec {
    /// Keys at fixed positions `first..=last` every `step`.
    pub const fn range(first: i32, last: i32, step: i32) -> KeySpec {
        KeySpec {
            first,
            last,
            step,
            count_at: 0,
        }
    }

    /// `args[count_at]` keys starting at `count_at + 1`, every `step`.
    pub const fn counted(count_at: i32, step: i32) -> KeySpec {
        KeySpec {
            first: count_at + 1,
            last: -1,
            step,
            count_at,
        }
    }

    /// Whether the key positions depend on an argument (movablekeys).
    pub const fn movable(&self) -> bool {
        self.count_at > 0
    }
}

/// No keys.
pub const NO_KEYS: KeySpec = KeySpec::range(0, 0, 0);
/// One key at index 1.
pub const KEY1: KeySpec = KeySpec::range(1, 1, 1);
/// Keys from index 1 to the end.
pub const ALL_KEYS: KeySpec = KeySpec::range(1, -1, 1);
/// Key, value pairs from index 1 to the end.
pub const KEY_VALUE_PAIRS: KeySpec = KeySpec::range(1, -1, 2);

/// Every field's default: the families' base specs start from it
/// (`..DEFAULTS`), so a new field is given its default once, here.
pub const DEFAULTS: CommandSpec = CommandSpec {
    name: "",
    arity: 1,
    flags: 0,
    keys: NO_KEYS,
    group: "",
    since: "1.0.0",
    summary: "",
    complexity: "O(1)",
    syntax: "",
    handler: Handler::Parent,
    subcommands: &[],
    one_shard: None,
    spread: Spread::No,
    from_copies: None,
    categories: 0,
    key_use: KeyUse::ByFlags,
    option_key: None,
};

/// One command (or subcommand) of the table.
pub struct CommandSpec {
    /// Lower-case name; subcommands are `parent|sub`.
    pub name: &'static str,
    /// Redis arity: N exactly, or at least |N| when negative.
    pub arity: i32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Key positions.
    pub keys: KeySpec,
    /// COMMAND DOCS group (`string`, `generic`, `connection`, `server`, ...).
    pub group: &'static str,
    /// Redis version the command appeared in.
    pub since: &'static str,
    /// One-line description.
    pub summary: &'static str,
    /// Time complexity.
    pub complexity: &'static str,
    /// Argument syntax after the name, e.g. `key value [NX|XX]` (see [`docs`]).
    pub syntax: &'static str,
    /// The body.
    pub handler: Handler,
    /// Subcommands of a container.
    pub subcommands: &'static [CommandSpec],
    /// For a multi-key command: a body that runs on one shard's store, used
    /// (and batched like a single-key command) when all its keys live on
    /// that shard.
    pub one_shard: Option<OneShard>,
    /// How the command runs when its keys live on several cluster nodes.
    pub spread: Spread,
    /// How a read is answered from this node's copies of other nodes' hot
    /// keys, when every key has one (`None`: it is not).
    pub from_copies: Option<FromCopies>,
    /// ACL categories beyond those its flags imply (`@string`,
    /// `@keyspace`, `@block`, ...; see [`CommandSpec::acl_categories`]).
    pub categories: u32,
    /// How it uses its keys: the `%R~` / `%W~` fences each key must pass.
    pub key_use: KeyUse,
    /// A key an option names, beyond the key positions (MSETBLOCK ...
    /// CHAIN PARENT key): its argument index, if the call has one. Key
    /// fences check it as a key whose existence is asked.
    pub option_key: Option<OptionKey>,
}

/// Finds the key an option names in a call's arguments (see
/// [`CommandSpec::option_key`]).
pub type OptionKey = fn(&[Bytes]) -> Option<usize>;

/// How a command whose keys live on several cluster nodes runs: each node
/// gets a sub-command with its own keys, in parallel, and the replies are
/// merged as named here (see `coordination::multi_node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// Not at all: Redis's CROSSSLOT error.
    No,
    /// Replies placed back by key position (MGET, MEXISTS).
    ByPosition,
    /// `OK` once every node stored its pairs (MSET).
    AllOk,
    /// The nodes' counts added up (DEL, UNLINK, EXISTS, TOUCH).
    Sum,
    /// How many leading keys are present: the earliest miss of any node
    /// (PREFIXLEN).
    PrefixCount,
    /// The values of the leading present keys, MAXBYTES on the merged
    /// prefix, each node waiting (BLOCK) for its share of MIN
    /// (MGETPREFIX).
    PrefixValues,
    /// Blocks stored by their nodes; with CHAIN, runs of one node's blocks
    /// one after the other, in chain order (MSETBLOCK).
    Blocks,
}

/// Answers a read from copies: the copy of every key (in key order) and
/// the command's arguments; `None` reads through to the owner.
pub type FromCopies = fn(&[&Bytes], &[Bytes]) -> Option<Reply>;

/// The single-shard form of a multi-key command.
#[derive(Clone, Copy)]
pub struct OneShard {
    /// The body; it finds each key's slot itself.
    pub run: KeyFn,
    /// Whether this call may use it (e.g. not MGETPREFIX ... BLOCK).
    pub applies: fn(&[Bytes]) -> bool,
}

/// For [`OneShard::applies`]: every call.
pub fn always(_: &[Bytes]) -> bool {
    true
}

impl CommandSpec {
    /// Whether `argc` arguments (name included) satisfy the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let arity = self.arity;
        (arity >= 0 && argc == arity as usize)
            || (arity < 0 && argc >= arity.unsigned_abs() as usize)
    }

    /// Whether a flag bit is set.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Its ACL categories: the declared ones and those its flags imply, as
    /// Redis derives them (write → @write, readonly → @read, admin →
    /// @admin and @dangerous, fast → @fast, else @slow, blocking →
    /// @blocking, kvtier's dangerous flag → @dangerous).
    pub fn acl_categories(&self) -> u32 {
        use crate::acl::category::*;
        let mut c = self.categories;
        for (flag, cat) in [
            (flags::WRITE, WRITE),
            (flags::READONLY, READ),
            (flags::ADMIN, ADMIN | DANGEROUS),
            (flags::DANGEROUS, DANGEROUS),
            (flags::BLOCKING, BLOCKING),
        ] {
            if self.has(flag) {
                c |= cat;
            }
        }
        c | if self.has(flags::FAST) { FAST } else { SLOW }
    }

    /// The name as shown to users (`client|setname` → `client|setname`).
    pub fn full_name(&self) -> &'static str {
        self.name
    }

    /// The keys of a call (`args` includes the name), by the key spec.
    /// `None` when a key count (`numkeys`) is not a positive integer or
    /// announces more keys than there are arguments (Redis's COMMAND
    /// GETKEYS then answers "Invalid arguments specified for command").
    pub fn key_indexes(&self, args: &[Bytes]) -> Option<Vec<usize>> {
        self.key_positions(args).map(Iterator::collect)
    }

    /// [`CommandSpec::key_indexes`] without collecting them.
    pub fn key_positions(&self, args: &[Bytes]) -> Option<std::iter::StepBy<Range<usize>>> {
        let argc = args.len();
        let KeySpec {
            first,
            last,
            step,
            count_at,
        } = self.keys;
        if count_at > 0 {
            let count = args
                .get(count_at as usize)
                .and_then(|a| parse_int(a))
                .filter(|&n| n > 0)? as usize;
            let (first, step) = (first as usize, step.max(1) as usize);
            let last_key = count
                .checked_sub(1)?
                .checked_mul(step)?
                .checked_add(first)?;
            if last_key >= argc {
                return None;
            }
            return Some((first..last_key + 1).step_by(step));
        }
        if first <= 0 || step <= 0 || first as usize >= argc {
            return Some((0..0).step_by(1));
        }
        let last = if last < 0 {
            argc as i32 + last
        } else {
            last.min(argc as i32 - 1)
        };
        Some((first as usize..(last + 1).max(first) as usize).step_by(step as usize))
    }
}

/// The command table, flattened for lookup and statistics.
pub struct CommandTable {
    /// Top-level commands, sorted by name.
    pub commands: Vec<&'static CommandSpec>,
    /// Top-level name → id.
    by_name: hashbrown::HashMap<&'static [u8], usize>,
    /// Every command followed by its subcommands; index = statistics id.
    pub all: Vec<&'static CommandSpec>,
    ids: hashbrown::HashMap<&'static str, usize>,
    /// The table as the ACL sees it (same ids).
    pub catalog: Catalog,
}

impl CommandTable {
    /// The table of `commands` (each with its subcommands).
    pub fn new(mut commands: Vec<&'static CommandSpec>) -> CommandTable {
        commands.sort_by_key(|c| c.name);
        let mut all = Vec::new();
        let mut by_name = hashbrown::HashMap::new();
        for c in &commands {
            by_name.insert(c.name.as_bytes(), all.len());
            all.push(*c);
            all.extend(c.subcommands.iter());
        }
        let ids = all.iter().enumerate().map(|(i, c)| (c.name, i)).collect();
        let catalog = Catalog::new(
            all.iter()
                .map(|c| (c.name, c.acl_categories(), c.subcommands.len())),
        );
        CommandTable {
            commands,
            by_name,
            all,
            ids,
            catalog,
        }
    }

    /// Number of commands and subcommands.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether the table is empty (never).
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// A top-level command and its id by name, case-insensitively.
    pub fn lookup(&self, name: &[u8]) -> Option<(usize, &'static CommandSpec)> {
        let mut lower = [0u8; 32];
        let lower = lower.get_mut(..name.len())?;
        for (d, s) in lower.iter_mut().zip(name) {
            *d = s.to_ascii_lowercase();
        }
        let &id = self.by_name.get(&lower[..])?;
        Some((id, self.all[id]))
    }

    /// A subcommand and its id, given its parent's id, case-insensitively.
    pub fn lookup_sub(&self, parent: usize, name: &[u8]) -> Option<(usize, &'static CommandSpec)> {
        let spec = self.all[parent];
        let prefix = spec.name.len() + 1;
        let pos = spec
            .subcommands
            .iter()
            .position(|s| s.name.as_bytes()[prefix..].eq_ignore_ascii_case(name))?;
        Some((parent + 1 + pos, &spec.subcommands[pos]))
    }

    /// A top-level command by name, case-insensitively.
    pub fn get(&self, name: &[u8]) -> Option<&'static CommandSpec> {
        self.lookup(name).map(|(_, spec)| spec)
    }

    /// A subcommand of `parent` by name, case-insensitively.
    pub fn sub(&self, parent: &'static CommandSpec, name: &[u8]) -> Option<&'static CommandSpec> {
        self.lookup_sub(self.id(parent), name).map(|(_, spec)| spec)
    }

    /// The statistics id of a command.
    pub fn id(&self, spec: &'static CommandSpec) -> usize {
        self.ids[spec.name]
    }
}

/// Per-connection state that commands read and change.
pub struct Client {
    /// The shard serving this connection.
    pub shard: Rc<Shard>,
    /// What CLIENT LIST shows of this connection.
    pub info: Rc<RefCell<ClientInfo>>,
    /// Replies in RESP3.
    pub resp3: bool,
    /// AUTH done (or not required).
    pub authenticated: bool,
    /// The user it is logged in as (the default user until AUTH).
    pub user: std::sync::Arc<crate::acl::User>,
    /// The [`Acl::epoch`](crate::acl::Acl::epoch) `user` was read at.
    pub acl_epoch: u64,
    /// CLIENT NO-TOUCH.
    pub no_touch: bool,
    /// Close once the pending replies are written (QUIT, protocol errors).
    pub close_after_reply: bool,
    /// Commands queued since MULTI.
    pub multi: Option<Transaction>,
    /// Keys under WATCH.
    pub watching: Watching,
    /// The command table this connection runs against (the registry's),
    /// for the commands that list or look up commands.
    pub commands: &'static CommandTable,
    /// READONLY: reads may be answered by a replica of the slot.
    pub readonly: bool,
    /// A cluster peer (`CLUSTER PEER`): its commands run here, never
    /// forwarded again.
    pub peer: bool,
}

impl Client {
    /// The connection's id.
    pub fn id(&self) -> u64 {
        self.info.borrow().id
    }

    /// The node's users.
    pub fn acl(&self) -> &Acl {
        &self.shard.shared.config.acl
    }
}

/// `ERR wrong number of arguments for '<name>' command`.
pub fn arity_error(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// `ERR syntax error`.
pub fn syntax_error() -> Reply {
    Reply::error("ERR syntax error")
}

/// `ERR value is not an integer or out of range`.
pub fn not_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

/// The OOM error of a write refused under `noeviction`.
pub fn oom_error() -> Reply {
    Reply::error("OOM command not allowed when used memory > 'maxmemory'.")
}

/// The OOM error of a write with an argument larger than a shard's whole
/// share of `maxmemory`, which no eviction can make room for: it says so,
/// where Redis's words would blame the memory in use.
pub fn too_large_for_a_shard(client: &Client, args: &[Bytes]) -> Option<Reply> {
    let shared = &client.shard.shared;
    let budget = crate::shard::shard_budget(&shared.config, shared.shards) as u64;
    if budget == 0 {
        return None;
    }
    let longest = args.iter().skip(1).map(|a| a.len() as u64).max()?;
    if longest <= budget {
        return None;
    }
    let human = crate::config::human_bytes;
    Some(Reply::error(format!(
        "OOM a value of {longest} bytes is larger than one shard's share of maxmemory \
         ({}: maxmemory {} over {} shards); raise maxmemory",
        human(budget),
        human(shared.config.num(Num::Maxmemory)),
        shared.shards
    )))
}

/// `ERR unknown subcommand '<sub>'. Try <PARENT> HELP.`
pub fn unknown_subcommand(parent: &str, sub: &[u8]) -> Reply {
    Reply::error(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        sanitize(sub, 128),
        parent.to_ascii_uppercase()
    ))
}

/// `ERR unknown command '<name>', with args beginning with: '<a>' '<b>' `,
/// exactly as Redis 7 phrases it.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut shown = String::new();
    for arg in &args[1..] {
        if shown.len() >= 128 {
            break;
        }
        let room = 128 - shown.len();
        shown.push('\'');
        shown.push_str(&sanitize(arg, room));
        shown.push_str("' ");
    }
    Reply::error(format!(
        "ERR unknown command '{}', with args beginning with: {}",
        sanitize(&args[0], 128),
        shown
    ))
}

/// Lossy text of at most `max` bytes with newlines made spaces (errors must
/// stay on one line). Like Redis's `%s`, it stops at a NUL byte.
pub fn sanitize(bytes: &[u8], max: usize) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let cut = &bytes[..end.min(max)];
    String::from_utf8_lossy(cut)
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect()
}

/// A stored value as a reply: a bulk string now, or one the connection
/// awaits while it is read from the spill tier (nil if it fails its
/// checksum: never wrong bytes).
pub fn value_reply(value: Fetched) -> Reply {
    match value {
        Fetched::Now(b) => Reply::Bulk(b),
        Fetched::Later { read, .. } => Reply::Pending(PendingValue::new(read.into_receiver())),
    }
}

/// Stores `value` under `key` raw, as Redis keeps a string changed in
/// place (SETRANGE, SETBIT, BITFIELD), or answers OOM.
pub fn store_raw(
    store: &mut Store,
    slot: u16,
    key: &[u8],
    value: bytes::BytesMut,
    expire_at: u64,
    now: u64,
) -> Result<(), Reply> {
    store
        .insert_entry(
            slot,
            key,
            value.freeze(),
            expire_at,
            Encoding::Raw,
            None,
            now,
        )
        .map(|_| ())
        .map_err(|_| oom_error())
}

/// Redis's clamping of `start..=end` into `0..total` (negative from the
/// end); `None` when the range is empty.
pub fn clamp(start: i64, end: i64, total: i64) -> Option<(i64, i64)> {
    let (mut start, mut end) = (start, end);
    if start < 0 {
        start += total;
    }
    if end < 0 {
        end += total;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= total {
        end = total - 1;
    }
    (start <= end).then_some((start, end))
}

/// Parses an integer argument exactly as Redis does.
pub fn parse_int(arg: &[u8]) -> Option<i64> {
    kvtier_protocol::parse_i64_strict(arg)
}

/// A database index, read as Redis's `getIntFromObjectOrReply` reads it:
/// an integer that fits a C `int`.
pub fn parse_db_index(arg: &[u8]) -> Result<i64, Reply> {
    let n = parse_int(arg).ok_or_else(not_integer)?;
    if n < i32::MIN as i64 || n > i32::MAX as i64 {
        return Err(Reply::error(format!(
            "ERR value is out of range, value must between {} and {}",
            i32::MIN,
            i32::MAX
        )));
    }
    Ok(n)
}

/// Lower-case ASCII equality for option names.
pub fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

// -- what the families share -------------------------------------------------------

/// A HELP reply in Redis's format: a title line, the lines, and HELP itself.
pub fn help_reply(command: &str, lines: &[&str]) -> Reply {
    let mut out = vec![Reply::status_owned(format!(
        "{command} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    ))];
    out.extend(lines.iter().map(|l| Reply::status_owned(l.to_string())));
    out.push(Reply::status("HELP"));
    out.push(Reply::status("    Prints this help."));
    Reply::Array(out)
}

/// Whether a client or library name is acceptable (no spaces or controls).
pub fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

/// Parses a float as Redis's `string2ld` does: no surrounding spaces, no NaN.
pub fn parse_float(arg: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(arg).ok()?;
    if s.is_empty() || s.len() > 5120 || s.trim() != s {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

/// Absolute expiry from an option: `EX`/`PX`/`EXAT`/`PXAT` and its value.
/// Errors are Redis's: not-an-integer, or `invalid expire time in '<cmd>'`.
pub fn expire_at_from(unit: &[u8], value: &[u8], command: &str, now: u64) -> Result<u64, Reply> {
    let n = parse_int(value).ok_or_else(not_integer)?;
    let invalid = || Reply::error(format!("ERR invalid expire time in '{command}' command"));
    if n <= 0 {
        return Err(invalid());
    }
    let ms = if is(unit, "ex") || is(unit, "exat") {
        n.checked_mul(1000).ok_or_else(invalid)?
    } else {
        n
    };
    if is(unit, "ex") || is(unit, "px") {
        ms.checked_add(now as i64)
            .map(|t| t as u64)
            .ok_or_else(invalid)
    } else {
        Ok(ms as u64)
    }
}

/// OBJECT ENCODING's answer, as Redis would give it for a string.
pub fn object_encoding(entry: &Entry) -> &'static str {
    let v = &entry.value;
    if entry.encoding == Encoding::Auto && v.len() <= 20 && parse_int(v).is_some() {
        "int"
    } else if entry.encoding != Encoding::Raw && v.len() <= 44 {
        "embstr"
    } else {
        "raw"
    }
}

/// Outcome of a conditional per-key write in a fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fanned {
    /// Written.
    Done,
    /// Left alone (a condition failed).
    Skipped,
    /// Refused for lack of memory.
    Oom,
}

/// Runs `f` for each key `args[i]`, `i` in `key_indexes`, on the shard that
/// owns it: one job per shard, all shards in parallel, this shard's keys
/// inline. `f` gets the store, the key's slot, the key, the argument after the
/// key (the value, for MSET-like commands) and the time; results come back in
/// key order.
pub async fn fan_out<R, F>(
    client: &Client,
    args: &Arc<Args>,
    key_indexes: &[usize],
    access: Access,
    f: F,
) -> Result<Vec<R>, ShardGone>
where
    R: Send + 'static,
    F: Fn(&mut Store, u16, &[u8], Option<&Bytes>, u64) -> R + Send + Copy + 'static,
{
    let shard = &client.shard;
    // (position among the keys, argument index) per shard: the jobs read
    // the arguments where they are, shared, with no per-key clone.
    let mut per_shard: Vec<Vec<(usize, usize)>> = (0..shard.count()).map(|_| Vec::new()).collect();
    for (pos, &i) in key_indexes.iter().enumerate() {
        per_shard[shard.owner_of(args.slot(i))].push((pos, i));
    }
    // Post every remote job first, so shards work in parallel; this shard's
    // own keys run inline while the others are busy.
    let mut pending = Vec::new();
    let mut local = None;
    for (target, work) in per_shard.into_iter().enumerate() {
        if work.is_empty() {
            continue;
        }
        let args = Arc::clone(args);
        let job = move |store: &mut Store| {
            let now = kvtier_store::now_ms();
            work.into_iter()
                .map(|(pos, i)| (pos, f(store, args.slot(i), &args[i], args.get(i + 1), now)))
                .collect::<Vec<_>>()
        };
        if target == shard.id {
            local = Some(job);
        } else {
            pending.push(shard.with_store(target, access, job));
        }
    }
    let mut out: Vec<Option<R>> = (0..key_indexes.len()).map(|_| None).collect();
    if let Some(job) = local {
        for (pos, r) in job(&mut shard.store.lock()) {
            out[pos] = Some(r);
        }
    }
    for p in pending {
        for (pos, r) in p.await? {
            out[pos] = Some(r);
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// A transaction being queued (between MULTI and EXEC).
#[derive(Default)]
pub struct Transaction {
    /// The queued commands: statistics id, spec, arguments.
    pub queued: Vec<(usize, &'static CommandSpec, Args)>,
    /// A command was refused while queueing: EXEC will abort.
    pub failed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_text_matches_redis() {
        let args: Vec<Bytes> = ["foo", "a", "b"].iter().map(|s| Bytes::from(*s)).collect();
        assert_eq!(
            unknown_command(&args),
            Reply::error("ERR unknown command 'foo', with args beginning with: 'a' 'b' ")
        );
        let args: Vec<Bytes> = ["f\0oo", "a\0b"].iter().map(|s| Bytes::from(*s)).collect();
        assert_eq!(
            unknown_command(&args),
            Reply::error("ERR unknown command 'f', with args beginning with: 'a' ")
        );
    }

    #[test]
    fn floats_like_string2ld() {
        assert_eq!(parse_float(b"1.5"), Some(1.5));
        assert_eq!(parse_float(b"1e3"), Some(1000.0));
        assert_eq!(parse_float(b" 1"), None);
        assert_eq!(parse_float(b"nan"), None);
        assert_eq!(parse_float(b""), None);
        assert_eq!(parse_float(b"abc"), None);
    }
}
