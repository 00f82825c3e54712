//! What the ACL knows of the command table: each command's id, full name,
//! categories and subcommands ([`Catalog`], built by the command table), the
//! categories themselves ([`category`]) and how a command uses its keys
//! ([`KeyUse`]), which `%R~` / `%W~` fences are checked against.

use std::ops::Range;

use bytes::Bytes;

/// ACL categories (`+@read`, `ACL CAT`), as bits.
pub mod category {
    /// Commands on keys of any type (DEL, EXPIRE, KEYS, ...).
    pub const KEYSPACE: u32 = 1;
    /// Reads values or metadata.
    pub const READ: u32 = 1 << 1;
    /// Writes.
    pub const WRITE: u32 = 1 << 2;
    /// Sets (none in kvtier; the name is accepted as Redis's).
    pub const SET: u32 = 1 << 3;
    /// Sorted sets (none in kvtier).
    pub const SORTEDSET: u32 = 1 << 4;
    /// Lists (none in kvtier).
    pub const LIST: u32 = 1 << 5;
    /// Hashes (none in kvtier).
    pub const HASH: u32 = 1 << 6;
    /// Strings.
    pub const STRING: u32 = 1 << 7;
    /// Bitmaps.
    pub const BITMAP: u32 = 1 << 8;
    /// HyperLogLogs (none in kvtier).
    pub const HYPERLOGLOG: u32 = 1 << 9;
    /// Geo (none in kvtier).
    pub const GEO: u32 = 1 << 10;
    /// Streams (none in kvtier).
    pub const STREAM: u32 = 1 << 11;
    /// Pub/Sub (none in kvtier).
    pub const PUBSUB: u32 = 1 << 12;
    /// Administration.
    pub const ADMIN: u32 = 1 << 13;
    /// O(1) or O(log N).
    pub const FAST: u32 = 1 << 14;
    /// Everything not fast.
    pub const SLOW: u32 = 1 << 15;
    /// May block the client.
    pub const BLOCKING: u32 = 1 << 16;
    /// Can do harm when misused (FLUSHALL, KEYS, CONFIG, DEBUG, ...).
    pub const DANGEROUS: u32 = 1 << 17;
    /// About the connection (PING, AUTH, CLIENT ...).
    pub const CONNECTION: u32 = 1 << 18;
    /// MULTI/EXEC/WATCH.
    pub const TRANSACTION: u32 = 1 << 19;
    /// Scripts and functions.
    pub const SCRIPTING: u32 = 1 << 20;
    /// kvtier's block dialect (MSETBLOCK, MGETPREFIX, PREFIXLEN, MEXISTS).
    pub const BLOCK: u32 = 1 << 21;

    /// Names in Redis's order (`ACL CAT`), kvtier's own last.
    pub const NAMES: [(u32, &str); 22] = [
        (KEYSPACE, "keyspace"),
        (READ, "read"),
        (WRITE, "write"),
        (SET, "set"),
        (SORTEDSET, "sortedset"),
        (LIST, "list"),
        (HASH, "hash"),
        (STRING, "string"),
        (BITMAP, "bitmap"),
        (HYPERLOGLOG, "hyperloglog"),
        (GEO, "geo"),
        (STREAM, "stream"),
        (PUBSUB, "pubsub"),
        (ADMIN, "admin"),
        (FAST, "fast"),
        (SLOW, "slow"),
        (BLOCKING, "blocking"),
        (DANGEROUS, "dangerous"),
        (CONNECTION, "connection"),
        (TRANSACTION, "transaction"),
        (SCRIPTING, "scripting"),
        (BLOCK, "block"),
    ];

    /// A category by name, case-insensitively.
    pub fn by_name(name: &[u8]) -> Option<u32> {
        NAMES
            .iter()
            .find(|(_, n)| n.as_bytes().eq_ignore_ascii_case(name))
            .map(|&(bit, _)| bit)
    }
}

/// The permission a key fence grants (`%R~`: read, `%W~`: write, `~`: both).
pub mod perm {
    /// Reading the key's value.
    pub const READ: u8 = 1;
    /// Changing or deleting the key.
    pub const WRITE: u8 = 2;
    /// Both (`~pattern`, `%RW~pattern`).
    pub const ALL: u8 = READ | WRITE;
}

/// How a command uses its keys, which decides the fences a key must pass:
/// a key whose value is read needs `%R`, one that is changed `%W`, one
/// whose existence alone is asked (EXISTS, TYPE, PREFIXLEN) any fence, as
/// in Redis's key specs (ACCESS, INSERT/UPDATE/DELETE).
#[derive(Clone, Copy)]
pub enum KeyUse {
    /// READONLY commands read their keys' values, WRITE commands read and
    /// change them (INCR): the usual case.
    ByFlags,
    /// Existence or metadata only.
    Exists,
    /// Only read.
    Read,
    /// Changed without being read (SET, DEL, APPEND).
    Write,
    /// The key at argument `at` needs `that`, the others `rest` ([`perm`]
    /// bits): COPY reads its source and writes its destination.
    OneDiffers { at: usize, that: u8, rest: u8 },
    /// Decided by the arguments: what the key at argument `i` needs.
    ByArgs(fn(&[Bytes], usize) -> u8),
}

impl KeyUse {
    /// What the key at argument `i` of `args` needs of a key fence
    /// ([`perm`] bits; 0: that it exists is all it asks), for a command
    /// that writes (`write`: its WRITE flag) or not.
    pub fn needs(self, write: bool, args: &[Bytes], i: usize) -> u8 {
        match self {
            KeyUse::ByFlags if write => perm::ALL,
            KeyUse::ByFlags => perm::READ,
            KeyUse::Exists => 0,
            KeyUse::Read => perm::READ,
            KeyUse::Write => perm::WRITE,
            KeyUse::OneDiffers { at, that, rest } => {
                if i == at {
                    that
                } else {
                    rest
                }
            }
            KeyUse::ByArgs(f) => f(args, i),
        }
    }
}

/// The command table as the ACL sees it: ids (the table's statistics ids,
/// a parent followed by its subcommands), names, categories.
pub struct Catalog {
    /// Full names (`get`, `config|get`) by id.
    pub names: Vec<&'static str>,
    /// Categories by id.
    pub categories: Vec<u32>,
    /// The ids of each command's subcommands (empty for most).
    pub subs: Vec<Range<usize>>,
    /// Whether each id is a subcommand.
    pub is_sub: Vec<bool>,
    by_name: hashbrown::HashMap<&'static str, usize>,
}

impl Catalog {
    /// A catalog of `commands`: (full name, categories, subcommand count)
    /// in id order, each parent followed by its subcommands.
    pub fn new(commands: impl IntoIterator<Item = (&'static str, u32, usize)>) -> Catalog {
        let mut catalog = Catalog {
            names: Vec::new(),
            categories: Vec::new(),
            subs: Vec::new(),
            is_sub: Vec::new(),
            by_name: hashbrown::HashMap::new(),
        };
        let mut sub_left = 0;
        for (name, categories, subs) in commands {
            let id = catalog.names.len();
            catalog.names.push(name);
            catalog.categories.push(categories);
            catalog.subs.push(id + 1..id + 1 + subs);
            catalog.is_sub.push(sub_left > 0);
            sub_left = if sub_left > 0 { sub_left - 1 } else { subs };
            catalog.by_name.insert(name, id);
        }
        catalog
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// A command or `parent|sub` by name, case-insensitively.
    pub fn id(&self, name: &[u8]) -> Option<usize> {
        let lower = std::str::from_utf8(name).ok()?.to_ascii_lowercase();
        self.by_name.get(lower.as_str()).copied()
    }

    /// Ids of the commands in `category`, in id order.
    pub fn in_category(&self, category: u32) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(move |&id| self.categories[id] & category != 0)
    }
}
