//! One ACL user: whether it may log in and how, and its selectors — the
//! commands it may run and the keys it may touch — with Redis 7's rules
//! (`ACL SETUSER name on >pass ~tenant:* %R~shared:* +@read -@dangerous
//! (~other:* +get)`) and Redis's way of describing them back (ACL LIST,
//! ACL GETUSER, the ACL file).

use sha2::{Digest, Sha256};

use super::catalog::{category, perm, Catalog};
use crate::glob::glob_match;

/// A password hash: SHA-256 of the password.
pub type Hash = [u8; 32];

/// SHA-256 of `password`, as Redis stores it.
pub fn hash_password(password: &[u8]) -> Hash {
    Sha256::digest(password).into()
}

/// Bytes as lower-case hex digits (a hash: 64 of them).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// A `#hash` argument: exactly 64 lower-case hex digits.
fn parse_hex(text: &[u8]) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Whether `text` can be written into an ACL file line and read back the
/// same: no whitespace, no NUL (Redis's `ACLStringHasSpaces`), and UTF-8
/// (descriptions are text).
pub fn fits_a_line(text: &[u8]) -> bool {
    !text.iter().any(|&c| c == 0 || c.is_ascii_whitespace()) && std::str::from_utf8(text).is_ok()
}

/// Why an ACL rule was refused (Redis's texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleError {
    /// `+nosuchcommand`, `+@nosuchcategory`.
    Unknown,
    /// Not a rule at all, or a pattern with a space.
    Syntax,
    /// A key pattern after `allkeys`.
    AfterAllKeys,
    /// A channel pattern after `allchannels`.
    AfterAllChannels,
    /// `<pass` or `!hash` of a password the user does not have.
    NoSuchPassword,
    /// `#hash` that is not 64 lower-case hex digits.
    BadHash,
    /// `+cmd|sub|arg`: first arguments of subcommands.
    FirstArgOfSub,
}

impl RuleError {
    /// The explanation Redis gives.
    pub fn text(self) -> &'static str {
        match self {
            RuleError::Unknown => "Unknown command or category name in ACL",
            RuleError::Syntax => "Syntax error",
            RuleError::AfterAllKeys => "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns",
            RuleError::AfterAllChannels => "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels",
            RuleError::NoSuchPassword => "The password you are trying to remove from the user does not exist",
            RuleError::BadHash => "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters",
            RuleError::FirstArgOfSub => "Allowing first-arg of a subcommand is not supported",
        }
    }
}

/// A key fence: keys matching `pattern` may be read, written or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPattern {
    /// Glob pattern, as KEYS takes it.
    pub pattern: Vec<u8>,
    /// [`perm`] bits.
    pub perm: u8,
}

/// What one selector allows: commands (a bit per command id) and keys.
/// A user is allowed a command when any of its selectors allows it with
/// every key.
#[derive(Clone, Debug)]
pub struct Selector {
    /// Every command is allowed: the check looks no further (cleared by
    /// any command denied).
    all_commands: bool,
    /// Built from `+@all` (so commands added later are allowed): its
    /// description starts with `+@all`, else with `-@all`.
    from_all: bool,
    /// By command id.
    allowed: Vec<u64>,
    /// `+select|0`: first arguments allowed of an otherwise denied command.
    first_args: Vec<(usize, Vec<Vec<u8>>)>,
    /// `allkeys` / `~*`.
    all_keys: bool,
    keys: Vec<KeyPattern>,
    /// `allchannels` / `&*` (kvtier has no Pub/Sub; kept for ACL files).
    all_channels: bool,
    channels: Vec<Vec<u8>>,
}

impl Selector {
    /// Nothing allowed.
    pub fn new(catalog: &Catalog) -> Selector {
        Selector {
            all_commands: false,
            from_all: false,
            allowed: vec![0; catalog.len().div_ceil(64)],
            first_args: Vec::new(),
            all_keys: false,
            keys: Vec::new(),
            all_channels: false,
            channels: Vec::new(),
        }
    }

    fn bit(&self, id: usize) -> bool {
        self.allowed[id / 64] & (1 << (id % 64)) != 0
    }

    fn set_bit(&mut self, id: usize, on: bool) {
        if on {
            self.allowed[id / 64] |= 1 << (id % 64);
        } else {
            self.allowed[id / 64] &= !(1 << (id % 64));
            self.all_commands = false;
        }
    }

    /// Allows or denies a command and all its subcommands.
    fn change(&mut self, catalog: &Catalog, id: usize, on: bool) {
        for id in std::iter::once(id).chain(catalog.subs[id].clone()) {
            self.set_bit(id, on);
            self.first_args.retain(|(c, _)| *c != id);
        }
    }

    fn set_all(&mut self, on: bool) {
        self.all_commands = on;
        self.from_all = on;
        self.allowed.fill(if on { u64::MAX } else { 0 });
        self.first_args.clear();
    }

    fn set_category(&mut self, catalog: &Catalog, bits: u32, on: bool) {
        for id in catalog.in_category(bits) {
            self.set_bit(id, on);
            self.first_args.retain(|(c, _)| *c != id);
        }
    }

    /// Applies one selector rule (commands, keys, channels).
    pub fn apply(&mut self, catalog: &Catalog, op: &[u8]) -> Result<(), RuleError> {
        let is = |word: &str| op.eq_ignore_ascii_case(word.as_bytes());
        if is("allkeys") || op == b"~*" {
            self.all_keys = true;
            self.keys.clear();
        } else if is("resetkeys") {
            self.all_keys = false;
            self.keys.clear();
        } else if is("allchannels") || op == b"&*" {
            self.all_channels = true;
            self.channels.clear();
        } else if is("resetchannels") {
            self.all_channels = false;
            self.channels.clear();
        } else if is("allcommands") || is("+@all") {
            self.set_all(true);
        } else if is("nocommands") || is("-@all") {
            self.set_all(false);
        } else if op[0] == b'~' || op[0] == b'%' {
            if self.all_keys {
                return Err(RuleError::AfterAllKeys);
            }
            let (bits, pattern) = if op[0] == b'%' {
                // `%R~pattern`, `%W~`, `%RW~`; as in Redis, `%R` with no
                // `~` is the empty pattern.
                let mut bits = 0;
                let mut at = 1;
                while at < op.len() {
                    match op[at].to_ascii_uppercase() {
                        b'R' if bits & perm::READ == 0 => bits |= perm::READ,
                        b'W' if bits & perm::WRITE == 0 => bits |= perm::WRITE,
                        b'~' => {
                            at += 1;
                            break;
                        }
                        _ => return Err(RuleError::Syntax),
                    }
                    at += 1;
                }
                if bits == 0 {
                    // Redis takes a bare `%~x` and then cannot describe it.
                    return Err(RuleError::Syntax);
                }
                (bits, &op[at..])
            } else {
                (perm::ALL, &op[1..])
            };
            if !fits_a_line(pattern) {
                return Err(RuleError::Syntax);
            }
            match self.keys.iter_mut().find(|k| k.pattern == pattern) {
                Some(k) => k.perm |= bits,
                None => self.keys.push(KeyPattern {
                    pattern: pattern.to_vec(),
                    perm: bits,
                }),
            }
        } else if op[0] == b'&' {
            if self.all_channels {
                return Err(RuleError::AfterAllChannels);
            }
            let pattern = &op[1..];
            if !fits_a_line(pattern) {
                return Err(RuleError::Syntax);
            }
            if !self.channels.iter().any(|c| c == pattern) {
                self.channels.push(pattern.to_vec());
            }
        } else if (op[0] == b'+' || op[0] == b'-') && op.get(1) == Some(&b'@') {
            let bits = category::by_name(&op[2..]).ok_or(RuleError::Unknown)?;
            self.set_category(catalog, bits, op[0] == b'+');
        } else if op[0] == b'+' || op[0] == b'-' {
            let name = &op[1..];
            match catalog.id(name) {
                Some(id) => self.change(catalog, id, op[0] == b'+'),
                None if op[0] == b'+' => self.allow_first_arg(catalog, name)?,
                None => return Err(RuleError::Unknown),
            }
        } else {
            return Err(RuleError::Syntax);
        }
        Ok(())
    }

    /// `+cmd|arg` for a command without subcommands: that first argument.
    fn allow_first_arg(&mut self, catalog: &Catalog, name: &[u8]) -> Result<(), RuleError> {
        let bar = name
            .iter()
            .rposition(|&c| c == b'|')
            .ok_or(RuleError::Unknown)?;
        let (command, arg) = (&name[..bar], &name[bar + 1..]);
        let id = catalog.id(command).ok_or(RuleError::Unknown)?;
        if catalog.is_sub[id] {
            return Err(RuleError::FirstArgOfSub);
        }
        if arg.is_empty() || !fits_a_line(arg) {
            return Err(RuleError::Syntax);
        }
        if !catalog.subs[id].is_empty() {
            // A parent with subcommands, and this is not one of them.
            return Err(RuleError::Unknown);
        }
        let arg = arg.to_ascii_lowercase();
        match self.first_args.iter_mut().find(|(c, _)| *c == id) {
            Some((_, args)) if args.contains(&arg) => {}
            Some((_, args)) => args.push(arg),
            None => self.first_args.push((id, vec![arg])),
        }
        Ok(())
    }

    /// Whether the command `id` may run; `first` is its first argument
    /// (after a subcommand's name), for `+cmd|arg` rules.
    pub fn may_run(&self, id: usize, first: Option<&[u8]>) -> bool {
        if self.all_commands || self.bit(id) {
            return true;
        }
        let Some(first) = first else { return false };
        self.first_args
            .iter()
            .find(|(c, _)| *c == id)
            .is_some_and(|(_, args)| args.iter().any(|a| a.eq_ignore_ascii_case(first)))
    }

    /// Whether `key` may be used as `needs` ([`perm`] bits; 0 for a key
    /// whose existence alone is asked) asks.
    pub fn may_touch(&self, key: &[u8], needs: u8) -> bool {
        self.all_keys
            || self
                .keys
                .iter()
                .any(|k| k.perm & needs == needs && glob_match(&k.pattern, key, false))
    }

    /// The key patterns it may write (`*` for all keys).
    pub fn write_patterns(&self) -> Vec<Vec<u8>> {
        if self.all_keys {
            return vec![b"*".to_vec()];
        }
        self.keys
            .iter()
            .filter(|k| k.perm & perm::WRITE != 0)
            .map(|k| k.pattern.clone())
            .collect()
    }

    /// Whether it may run anything on any key.
    pub fn unrestricted(&self) -> bool {
        self.all_commands && self.all_keys
    }

    /// The key rules, as ACL GETUSER shows them (`~*`, `%R~a* ~b*`).
    pub fn describe_keys(&self) -> String {
        if self.all_keys {
            return "~*".into();
        }
        let words: Vec<String> = self
            .keys
            .iter()
            .map(|k| {
                let pattern = String::from_utf8_lossy(&k.pattern);
                match k.perm {
                    perm::READ => format!("%R~{pattern}"),
                    perm::WRITE => format!("%W~{pattern}"),
                    _ => format!("~{pattern}"),
                }
            })
            .collect();
        words.join(" ")
    }

    /// The channel rules, as ACL GETUSER shows them.
    pub fn describe_channels(&self) -> String {
        if self.all_channels {
            return "&*".into();
        }
        let words: Vec<String> = self
            .channels
            .iter()
            .map(|c| format!("&{}", String::from_utf8_lossy(c)))
            .collect();
        words.join(" ")
    }

    /// The command rules, in Redis's compact form: `+@all` or `-@all`,
    /// then the categories that best fit what is allowed, then single
    /// commands, so that applying them to a new selector gives exactly
    /// these permissions.
    pub fn describe_commands(&self, catalog: &Catalog) -> String {
        let additive = !self.from_all;
        let mut fake = Selector::new(catalog);
        fake.set_all(!additive);
        let mut rules = vec![if additive { "-@all" } else { "+@all" }.to_string()];
        // Greedy: the category with the fewest differences (and most in
        // common) from what is left to explain, until none fits.
        let mut left = self.clone();
        let mut applied = [false; category::NAMES.len()];
        loop {
            let mut best = None;
            let (mut min_diff, mut max_same) = (usize::MAX, 0);
            for (j, &(bits, _)) in category::NAMES.iter().enumerate() {
                if applied[j] {
                    continue;
                }
                let (mut on, mut off) = (0, 0);
                for id in catalog.in_category(bits) {
                    if left.bit(id) {
                        on += 1;
                    } else {
                        off += 1;
                    }
                }
                let (diff, same) = if additive { (off, on) } else { (on, off) };
                if same > diff && (diff < min_diff || (diff == min_diff && same > max_same)) {
                    best = Some(j);
                    (min_diff, max_same) = (diff, same);
                }
            }
            let Some(j) = best else { break };
            let (bits, name) = category::NAMES[j];
            fake.set_category(catalog, bits, additive);
            left.set_category(catalog, bits, !additive);
            rules.push(format!("{}@{name}", if additive { '+' } else { '-' }));
            applied[j] = true;
        }
        for id in 0..catalog.len() {
            let (user, fake_bit) = (self.bit(id), fake.bit(id));
            if user != fake_bit {
                rules.push(format!(
                    "{}{}",
                    if user { '+' } else { '-' },
                    catalog.names[id]
                ));
                fake.change(catalog, id, user);
            }
            if !user {
                if let Some((_, args)) = self.first_args.iter().find(|(c, _)| *c == id) {
                    for arg in args {
                        rules.push(format!(
                            "+{}|{}",
                            catalog.names[id],
                            String::from_utf8_lossy(arg)
                        ));
                    }
                }
            }
        }
        rules.join(" ")
    }

    /// Everything, as one ACL LIST / ACL file fragment.
    fn describe(&self, catalog: &Catalog) -> String {
        let mut out = Vec::new();
        let keys = self.describe_keys();
        if !keys.is_empty() {
            out.push(keys);
        }
        if self.all_channels {
            out.push("&*".into());
        } else {
            out.push("resetchannels".into());
            let channels = self.describe_channels();
            if !channels.is_empty() {
                out.push(channels);
            }
        }
        out.push(self.describe_commands(catalog));
        out.join(" ")
    }
}

/// One user.
#[derive(Clone, Debug)]
pub struct User {
    /// Its name.
    pub name: String,
    /// `on`: it may authenticate.
    pub enabled: bool,
    /// `nopass`: any password works.
    pub nopass: bool,
    /// `sanitize-payload` / `skip-sanitize-payload` (kept for ACL files;
    /// kvtier has no RESTORE payloads to sanitize).
    pub sanitize: Option<bool>,
    /// Its passwords' hashes.
    pub passwords: Vec<Hash>,
    /// The rules given outside parentheses.
    pub root: Selector,
    /// `(...)` selectors.
    pub selectors: Vec<Selector>,
}

impl User {
    /// The key patterns any of its selectors may write, in order.
    pub fn write_patterns(&self) -> Vec<Vec<u8>> {
        std::iter::once(&self.root)
            .chain(&self.selectors)
            .flat_map(Selector::write_patterns)
            .collect()
    }

    /// A new user: off, no passwords, nothing allowed.
    pub fn new(name: &str, catalog: &Catalog) -> User {
        User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            sanitize: None,
            passwords: Vec::new(),
            root: Selector::new(catalog),
            selectors: Vec::new(),
        }
    }

    /// Redis's default user: `on nopass ~* &* +@all`.
    pub fn default_user(catalog: &Catalog) -> User {
        let mut user = User::new("default", catalog);
        for op in ["+@all", "~*", "&*", "on", "nopass"] {
            let applied = user.apply(catalog, op.as_bytes());
            debug_assert!(applied.is_ok());
        }
        user
    }

    /// Applies one rule.
    pub fn apply(&mut self, catalog: &Catalog, op: &[u8]) -> Result<(), RuleError> {
        let is = |word: &str| op.eq_ignore_ascii_case(word.as_bytes());
        if op.is_empty() {
            return Ok(());
        }
        if is("on") {
            self.enabled = true;
        } else if is("off") {
            self.enabled = false;
        } else if is("nopass") {
            self.nopass = true;
            self.passwords.clear();
        } else if is("resetpass") {
            self.nopass = false;
            self.passwords.clear();
        } else if is("sanitize-payload") {
            self.sanitize = Some(true);
        } else if is("skip-sanitize-payload") {
            self.sanitize = Some(false);
        } else if op[0] == b'>' || op[0] == b'#' {
            let hash = if op[0] == b'>' {
                hash_password(&op[1..])
            } else {
                parse_hex(&op[1..]).ok_or(RuleError::BadHash)?
            };
            if !self.passwords.contains(&hash) {
                self.passwords.push(hash);
            }
            self.nopass = false;
        } else if op[0] == b'<' || op[0] == b'!' {
            let hash = if op[0] == b'<' {
                hash_password(&op[1..])
            } else {
                parse_hex(&op[1..]).ok_or(RuleError::BadHash)?
            };
            let at = self
                .passwords
                .iter()
                .position(|h| *h == hash)
                .ok_or(RuleError::NoSuchPassword)?;
            self.passwords.remove(at);
        } else if op[0] == b'(' && op.len() > 1 && op[op.len() - 1] == b')' {
            let inner = &op[1..op.len() - 1];
            let words =
                kvtier_protocol::inline::split_inline_args(inner).ok_or(RuleError::Syntax)?;
            let mut selector = Selector::new(catalog);
            for word in words {
                if !word.is_empty() {
                    selector.apply(catalog, &word)?;
                }
            }
            self.selectors.push(selector);
        } else if is("clearselectors") {
            self.selectors.clear();
        } else if is("reset") {
            for op in [
                "resetpass",
                "resetkeys",
                "resetchannels",
                "off",
                "sanitize-payload",
                "clearselectors",
                "-@all",
            ] {
                self.apply(catalog, op.as_bytes())?;
            }
        } else {
            self.root.apply(catalog, op)?;
        }
        Ok(())
    }

    /// Whether `password` logs in as this user (it must be on).
    pub fn accepts(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let hash = hash_password(password);
        // Compared in full whatever matches, as Redis's
        // time_independent_strcmp.
        self.passwords
            .iter()
            .fold(false, |found, h| found | constant_time_eq(h, &hash))
    }

    /// Every selector, the root first.
    pub fn all_selectors(&self) -> impl Iterator<Item = &Selector> {
        std::iter::once(&self.root).chain(&self.selectors)
    }

    /// Whether it may run any command on any key (the check is skipped).
    pub fn unrestricted(&self) -> bool {
        self.root.unrestricted()
    }

    /// Its flags, as ACL GETUSER lists them.
    pub fn flags(&self) -> Vec<&'static str> {
        let mut flags = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            flags.push("nopass");
        }
        match self.sanitize {
            Some(false) => flags.push("skip-sanitize-payload"),
            Some(true) => flags.push("sanitize-payload"),
            None => {}
        }
        flags
    }

    /// The user as one line of ACL LIST and of the ACL file (without the
    /// leading `user <name>`): applying it to a new user recreates it.
    pub fn describe(&self, catalog: &Catalog) -> String {
        let mut out: Vec<String> = self.flags().iter().map(|f| f.to_string()).collect();
        out.extend(self.passwords.iter().map(|h| format!("#{}", hex(h))));
        out.push(self.root.describe(catalog));
        for s in &self.selectors {
            out.push(format!("({})", s.describe(catalog)));
        }
        out.join(" ")
    }
}

/// Joins the words of a `(...)` selector split over several arguments
/// (`ACL SETUSER u (~a* +get)` as the words `(~a*` and `+get)`), as Redis
/// does; `Err` with the first word of an unterminated one.
pub fn merge_selectors(words: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, Vec<u8>> {
    let mut out = Vec::new();
    let mut open: Option<Vec<u8>> = None;
    for word in words {
        match &mut open {
            Some(selector) => {
                selector.push(b' ');
                selector.extend_from_slice(&word);
                if word.ends_with(b")") {
                    out.extend(open.take());
                }
            }
            None if word.starts_with(b"(") && !word.ends_with(b")") => open = Some(word),
            None => out.push(word),
        }
    }
    match open {
        Some(selector) => Err(selector),
        None => Ok(out),
    }
}

fn constant_time_eq(a: &Hash, b: &Hash) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        use category::*;
        Catalog::new([
            ("config", SLOW, 2),
            ("config|get", ADMIN | SLOW | DANGEROUS, 0),
            ("config|set", ADMIN | SLOW | DANGEROUS, 0),
            ("get", READ | STRING | FAST, 0),
            ("mgetprefix", READ | BLOCK | FAST, 0),
            ("select", FAST | CONNECTION, 0),
            ("set", WRITE | STRING | SLOW, 0),
        ])
    }

    fn user(rules: &str) -> Result<User, RuleError> {
        let catalog = catalog();
        let mut u = User::new("u", &catalog);
        let words = kvtier_protocol::inline::split_inline_args(rules.as_bytes()).unwrap();
        for op in merge_selectors(words).unwrap() {
            u.apply(&catalog, &op)?;
        }
        Ok(u)
    }

    #[test]
    fn sha256_matches_redis() {
        // `ACL SETUSER u >p` on redis-server 7.0 shows this hash.
        assert_eq!(
            hex(&hash_password(b"p")),
            "148de9c5a7a44d19e56cd9ae1a554bf67847afb0c58f6e12fa29ac7ddfca9940"
        );
    }

    #[test]
    fn passwords_and_flags() {
        let u = user("on >a >b <a").unwrap();
        assert!(u.accepts(b"b") && !u.accepts(b"a"));
        let hash = hex(&hash_password(b"b"));
        let u = user(&format!("on #{hash}")).unwrap();
        assert!(u.accepts(b"b"));
        assert_eq!(user("on #ABC").unwrap_err(), RuleError::BadHash);
        assert_eq!(user("<nope").unwrap_err(), RuleError::NoSuchPassword);
        let u = user("on nopass").unwrap();
        assert!(u.accepts(b"anything"));
        assert!(!user("off nopass").unwrap().accepts(b"x"));
        assert_eq!(user("reset").unwrap().flags(), ["off", "sanitize-payload"]);
    }

    #[test]
    fn commands_and_subcommands() {
        let c = catalog();
        let u = user("+config -config|set").unwrap();
        assert!(u.root.may_run(c.id(b"config|get").unwrap(), None));
        assert!(!u.root.may_run(c.id(b"config|set").unwrap(), None));
        assert_eq!(u.root.describe_commands(&c), "-@all +config -config|set");
        let u = user("+@all -get").unwrap();
        assert_eq!(u.root.describe_commands(&c), "+@all -get");
        assert!(!u.root.may_run(c.id(b"get").unwrap(), None));
        assert!(u.root.may_run(c.id(b"set").unwrap(), None));
        let u = user("+@all -config|set").unwrap();
        assert!(!u.root.may_run(c.id(b"config|set").unwrap(), None));
        assert!(!u.root.unrestricted());
        let u = user("+@all -get +get").unwrap();
        assert_eq!(u.root.describe_commands(&c), "+@all");
        let u = user("+@string -set +config|get").unwrap();
        // Half of @string is no better fit than its commands one by one.
        assert_eq!(u.root.describe_commands(&c), "-@all +config|get +get");
        let u = user("+@block").unwrap();
        assert!(u.root.may_run(c.id(b"mgetprefix").unwrap(), None));
        assert!(!u.root.may_run(c.id(b"get").unwrap(), None));
        assert_eq!(user("+nope").unwrap_err(), RuleError::Unknown);
        assert_eq!(user("+@nope").unwrap_err(), RuleError::Unknown);
        assert_eq!(user("+config|get|x").unwrap_err(), RuleError::FirstArgOfSub);
        let u = user("+select|0").unwrap();
        let select = c.id(b"select").unwrap();
        assert!(u.root.may_run(select, Some(b"0")) && !u.root.may_run(select, Some(b"1")));
        assert_eq!(u.root.describe_commands(&c), "-@all +select|0");
    }

    #[test]
    fn key_fences() {
        let u = user("%R~r* %W~w* ~a* %RW~b*").unwrap();
        let s = &u.root;
        assert!(s.may_touch(b"r1", perm::READ) && !s.may_touch(b"r1", perm::WRITE));
        assert!(s.may_touch(b"w1", perm::WRITE) && !s.may_touch(b"w1", perm::ALL));
        assert!(s.may_touch(b"a1", perm::ALL) && s.may_touch(b"b1", perm::ALL));
        assert!(s.may_touch(b"r1", 0) && !s.may_touch(b"x", 0));
        assert_eq!(s.describe_keys(), "%R~r* %W~w* ~a* ~b*");
        assert_eq!(user("allkeys ~x").unwrap_err(), RuleError::AfterAllKeys);
        assert_eq!(user("%X~a").unwrap_err(), RuleError::Syntax);
    }

    #[test]
    fn description_round_trips() {
        let c = catalog();
        for rules in [
            "on >p ~a* %R~r* +@read -get &ch",
            "off +@all -config|set resetchannels",
            "on nopass allkeys +get (~z* +set) (%W~q* +@write)",
            "+select|0 +select|1 -@all +config|get",
        ] {
            let u = user(rules).unwrap();
            let described = u.describe(&c);
            let mut again = User::new("u", &c);
            let words = kvtier_protocol::inline::split_inline_args(described.as_bytes()).unwrap();
            for op in merge_selectors(words).unwrap() {
                again.apply(&c, &op).unwrap();
            }
            assert_eq!(again.describe(&c), described, "{rules}");
            assert_eq!(again.root.allowed, u.root.allowed, "{rules}");
        }
    }
}
