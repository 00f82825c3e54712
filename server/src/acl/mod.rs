//! Access control: who may log in, run which commands and touch which keys
//! (Redis 7's ACL), so a decode worker can be read-only and tenants can be
//! fenced by key prefix.
//!
//! * [`catalog`]: the categories, how commands use their keys, and the
//!   command table as the ACL sees it.
//! * [`user`]: one user and its rules.
//! * [`Acl`] (here): every user, the denial log, the ACL file.
//!
//! A connection holds its user as an `Arc<User>` and checks it without a
//! lock; any change bumps [`Acl::epoch`], and a connection that sees a new
//! epoch takes its user's new rules before its next command (one relaxed
//! load per command). A user with every command and every key (the default
//! user, unless restricted) skips the check.

pub mod catalog;
pub mod user;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

pub use catalog::{category, perm, Catalog, KeyUse};
pub use user::{merge_selectors, RuleError, User};

/// Entries of ACL LOG that repeat within this long are counted as one.
const LOG_GROUPING_MS: u128 = 60_000;

/// A denied command, login or key, for ACL LOG.
#[derive(Clone, Debug)]
pub struct Denial {
    /// `command`, `key`, `channel` or `auth`.
    pub reason: &'static str,
    /// `toplevel` or `multi`.
    pub context: &'static str,
    /// The command, the key, or the command that tried to log in.
    pub object: String,
    /// Who.
    pub username: String,
    /// The client, as CLIENT LIST shows it.
    pub client_info: String,
}

/// One ACL LOG entry.
#[derive(Clone, Debug)]
pub struct LogEntry {
    /// What was denied.
    pub denial: Denial,
    /// How many times within [`LOG_GROUPING_MS`] of each other.
    pub count: u64,
    /// When it last happened.
    pub at: Instant,
}

/// Every user, the denial log and the ACL file.
pub struct Acl {
    catalog: &'static Catalog,
    users: RwLock<BTreeMap<String, Arc<User>>>,
    epoch: AtomicU64,
    log: Mutex<VecDeque<LogEntry>>,
    /// `acllog-max-len`.
    pub log_max_len: AtomicU64,
    /// `--aclfile`, if any.
    pub file: Option<PathBuf>,
    /// Held while ACL SAVE writes the file.
    saving: Mutex<()>,
}

impl Acl {
    /// The default user (with `requirepass` as its password when set),
    /// then the users of `file`, if given.
    pub fn new(
        catalog: &'static Catalog,
        requirepass: &str,
        file: Option<PathBuf>,
    ) -> Result<Acl, String> {
        let acl = Acl {
            catalog,
            users: RwLock::new(BTreeMap::new()),
            epoch: AtomicU64::new(0),
            log: Mutex::new(VecDeque::new()),
            log_max_len: AtomicU64::new(128),
            file,
            saving: Mutex::new(()),
        };
        let mut default = User::default_user(catalog);
        set_password(&mut default, catalog, requirepass);
        acl.write().insert(default.name.clone(), Arc::new(default));
        if acl.file.is_some() {
            acl.load(requirepass)?;
        }
        Ok(acl)
    }

    /// The command table, as the ACL sees it.
    pub fn catalog(&self) -> &'static Catalog {
        self.catalog
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<User>>> {
        self.users.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<User>>> {
        self.users.write().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.epoch.fetch_add(1, Relaxed);
    }

    /// Bumped by every change to any user.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    /// A user by name.
    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.read().get(name).cloned()
    }

    /// The default user.
    pub fn default_user(&self) -> Arc<User> {
        self.user("default")
            .unwrap_or_else(|| Arc::new(User::default_user(self.catalog)))
    }

    /// Whether a new connection is logged in as the default user without
    /// AUTH: it is on and needs no password.
    pub fn open(&self) -> bool {
        let default = self.default_user();
        default.enabled && default.nopass
    }

    /// The user `name` if `password` logs in as it.
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<Arc<User>> {
        let name = std::str::from_utf8(name).ok()?;
        self.user(name).filter(|u| u.accepts(password))
    }

    /// ACL SETUSER: applies `ops` to the user (created if new) all or
    /// nothing; `Err` says which rule was refused and why.
    pub fn set_user(&self, name: &str, ops: &[Vec<u8>]) -> Result<(), String> {
        let ops = merge_selectors(ops.to_vec()).map_err(|open| {
            format!(
                "Unmatched parenthesis in acl selector starting at '{}'.",
                String::from_utf8_lossy(&open)
            )
        })?;
        let mut users = self.write();
        let mut user = match users.get(name) {
            Some(u) => (**u).clone(),
            None => User::new(name, self.catalog),
        };
        for op in &ops {
            user.apply(self.catalog, op).map_err(|e| {
                format!(
                    "Error in ACL SETUSER modifier '{}': {}",
                    String::from_utf8_lossy(op),
                    e.text()
                )
            })?;
        }
        users.insert(name.to_string(), Arc::new(user));
        drop(users);
        self.changed();
        Ok(())
    }

    /// ACL DELUSER: how many of `names` existed (the default user cannot
    /// be removed).
    pub fn delete(&self, names: &[String]) -> Result<usize, &'static str> {
        if names.iter().any(|n| n == "default") {
            return Err("ERR The 'default' user cannot be removed");
        }
        let mut users = self.write();
        let removed = names.iter().filter(|n| users.remove(*n).is_some()).count();
        drop(users);
        self.changed();
        Ok(removed)
    }

    /// `requirepass`: the default user's only password (none: nopass).
    pub fn set_default_password(&self, password: &str) {
        let mut users = self.write();
        let mut default = users
            .get("default")
            .map(|u| (**u).clone())
            .unwrap_or_else(|| User::default_user(self.catalog));
        set_password(&mut default, self.catalog, password);
        users.insert(default.name.clone(), Arc::new(default));
        drop(users);
        self.changed();
    }

    /// Every user's name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Every user, sorted by name.
    pub fn users(&self) -> Vec<Arc<User>> {
        self.read().values().cloned().collect()
    }

    /// ACL LIST: `user <name> <rules>` per user, sorted by name.
    pub fn list(&self) -> Vec<String> {
        self.users()
            .iter()
            .map(|u| format!("user {} {}", u.name, u.describe(self.catalog)))
            .collect()
    }

    /// ACL LOAD: replaces every user with those of the ACL file, or changes
    /// nothing if any line is wrong. A default user the file does not
    /// define is the built-in one (with `requirepass`).
    pub fn load(&self, requirepass: &str) -> Result<(), String> {
        let path = self.file.as_ref().ok_or(NO_FILE)?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("Error loading ACLs, opening file '{}': {e}", path.display()))?;
        let mut users = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fail = |why: &str| format!("{}:{}: {why}. ", path.display(), n + 1);
            // Split on spaces, as Redis reads its ACL files (no quoting: no
            // rule has a space, see `user::fits_a_line`).
            let words: Vec<Vec<u8>> = line
                .split(' ')
                .filter(|w| !w.is_empty())
                .map(|w| w.as_bytes().to_vec())
                .collect();
            if words.first().map(Vec::as_slice) != Some(b"user") || words.len() < 2 {
                return Err(fail("line should start with user keyword"));
            }
            if !user::fits_a_line(&words[1]) {
                return Err(fail("Usernames can't contain spaces or null characters"));
            }
            let name = String::from_utf8_lossy(&words[1]).into_owned();
            if users.contains_key(&name) {
                return Err(fail(
                    "Duplicate user found. A user can only be defined once in config files",
                ));
            }
            let ops = merge_selectors(words[2..].to_vec())
                .map_err(|_| fail("Unmatched parenthesis in acl selector"))?;
            let mut user = User::new(&name, self.catalog);
            for op in &ops {
                user.apply(self.catalog, op).map_err(|e| {
                    fail(&format!(
                        "Error in applying operation '{}': {}",
                        String::from_utf8_lossy(op),
                        e.text()
                    ))
                })?;
            }
            users.insert(name, Arc::new(user));
        }
        users.entry("default".to_string()).or_insert_with(|| {
            let mut default = User::default_user(self.catalog);
            set_password(&mut default, self.catalog, requirepass);
            Arc::new(default)
        });
        *self.write() = users;
        self.changed();
        Ok(())
    }

    /// ACL SAVE: every user to the ACL file, replaced whole (written
    /// aside, then renamed).
    pub fn save(&self) -> Result<(), String> {
        let path = self.file.as_ref().ok_or(NO_FILE)?;
        let mut text = String::new();
        for line in self.list() {
            text.push_str(&line);
            text.push('\n');
        }
        // One save at a time; written aside, synced, then renamed over the
        // file (and the directory synced), so the file is always whole.
        let _one = self.saving.lock().unwrap_or_else(|e| e.into_inner());
        let aside = path.with_extension(format!("tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&aside)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&aside, path)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| {
                let _ = std::fs::remove_file(&aside);
                tracing::warn!("ACL SAVE to {}: {e}", path.display());
                "There was an error trying to save the ACLs. Please check the server logs for more information".to_string()
            })
    }

    /// Records a denial in ACL LOG (one entry for repeats within a minute).
    pub fn log(&self, denial: Denial) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let same = log.iter().position(|e| {
            let d = &e.denial;
            d.reason == denial.reason
                && d.context == denial.context
                && d.object == denial.object
                && d.username == denial.username
                && now.duration_since(e.at).as_millis() < LOG_GROUPING_MS
        });
        let entry = match same.and_then(|i| log.remove(i)) {
            Some(mut e) => {
                e.count += 1;
                e.at = now;
                e.denial.client_info = denial.client_info;
                e
            }
            None => LogEntry {
                denial,
                count: 1,
                at: now,
            },
        };
        log.push_front(entry);
        log.truncate(self.log_max_len.load(Relaxed) as usize);
    }

    /// The newest `count` ACL LOG entries.
    pub fn log_entries(&self, count: usize) -> Vec<LogEntry> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().take(count).cloned().collect()
    }

    /// ACL LOG RESET.
    pub fn reset_log(&self) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// The error of ACL LOAD / SAVE with no `--aclfile`.
const NO_FILE: &str = "This Redis instance is not configured to use an ACL file. You may want to specify users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file set) in order to store users in the Redis configuration.";

/// Makes `password` the user's only password; empty: `nopass`.
fn set_password(user: &mut User, catalog: &Catalog, password: &str) {
    let op = if password.is_empty() {
        "nopass".to_string()
    } else {
        format!(">{password}")
    };
    let reset = user.apply(catalog, b"resetpass");
    let set = user.apply(catalog, op.as_bytes());
    debug_assert!(reset.is_ok() && set.is_ok());
}
