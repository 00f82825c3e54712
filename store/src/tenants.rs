//! Tenants: who owns a key, named by a key pattern, and what each tenant
//! holds in this store (bytes in DRAM and on disk, blocks). Keys no pattern
//! names belong to the default tenant (slot 0). The server sums the shards'
//! figures (INFO `tenants`, metrics with a `tenant` label).
//!
//! A key's tenant is decided by its bytes alone, so it is the same at every
//! insert, change and removal, and needs no field in the entry; the
//! patterns are fixed for the store's life (they are start-up settings).

/// Most named tenants a store tells apart.
pub const MAX_TENANTS: usize = 15;
/// Tenant slots: 0 is the default tenant, 1..=MAX_TENANTS the named ones
/// in the order they were configured.
pub const TENANT_SLOTS: usize = MAX_TENANTS + 1;

/// A tenant's keys: those starting with a prefix (`llama70b@*`), or one
/// exact key. Patterns are tried in order; the first that matches owns the
/// key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPattern {
    /// `prefix*`: every key starting with the prefix (`*` alone: every key).
    Prefix(Vec<u8>),
    /// A key without `*`: that key only.
    Exact(Vec<u8>),
}

impl KeyPattern {
    /// `prefix*` or an exact key. Other glob forms (`?`, `[...]`, a `*`
    /// that is not last) are refused: a prefix test per key is what a
    /// write can afford.
    pub fn parse(s: &str) -> Result<KeyPattern, String> {
        let bytes = s.as_bytes();
        let body = bytes.strip_suffix(b"*").unwrap_or(bytes);
        if body
            .iter()
            .any(|b| matches!(b, b'*' | b'?' | b'[' | b']' | b'\\'))
        {
            return Err(format!(
                "key pattern '{s}': only 'prefix*' or an exact key (no ?, [ ], \\ or inner *)"
            ));
        }
        Ok(if body.len() < bytes.len() {
            KeyPattern::Prefix(body.to_vec())
        } else {
            KeyPattern::Exact(body.to_vec())
        })
    }

    /// Whether `key` is one of the pattern's keys.
    pub fn matches(&self, key: &[u8]) -> bool {
        match self {
            KeyPattern::Prefix(p) => key.starts_with(p),
            KeyPattern::Exact(k) => key == k.as_slice(),
        }
    }
}

/// What one tenant holds in a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantUse {
    /// Bytes in DRAM: its keys' index charges and their values' slots.
    pub dram: usize,
    /// Bytes of its blocks in the spill tier.
    pub disk: usize,
    /// Its keys.
    pub keys: usize,
}

/// What an entry costs the counters kept beside the maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    /// Charged to the DRAM tier's index ([`crate::Entry::charge`]).
    pub(crate) index: usize,
    /// Charged to the disk index (a block only on disk).
    pub(crate) disk_index: usize,
    /// Its tenant's bytes in DRAM.
    pub(crate) dram: usize,
    /// Its tenant's bytes on disk.
    pub(crate) disk: usize,
}

/// The tenants' patterns and what each holds here.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tenants {
    /// `(pattern, slot)`: the named tenants' patterns, in order.
    patterns: Vec<(KeyPattern, usize)>,
    /// Per slot.
    pub(crate) usage: [TenantUse; TENANT_SLOTS],
}

impl Tenants {
    /// Tenants with these patterns, slot `i + 1` for `patterns[i]`.
    pub(crate) fn new(patterns: &[KeyPattern]) -> Tenants {
        assert!(
            patterns.len() <= MAX_TENANTS,
            "at most {MAX_TENANTS} tenants"
        );
        Tenants {
            patterns: patterns.iter().cloned().zip(1..).collect(),
            usage: Default::default(),
        }
    }

    /// The same patterns, nothing held (FLUSHALL).
    pub(crate) fn emptied(&self) -> Tenants {
        Tenants {
            patterns: self.patterns.clone(),
            usage: Default::default(),
        }
    }

    /// The slot of `key`'s tenant.
    #[inline]
    pub(crate) fn of(&self, key: &[u8]) -> usize {
        if self.patterns.is_empty() {
            return 0;
        }
        self.find(key)
    }

    #[inline(never)]
    fn find(&self, key: &[u8]) -> usize {
        self.patterns
            .iter()
            .find(|(p, _)| p.matches(key))
            .map_or(0, |&(_, slot)| slot)
    }

    /// `key` came with `cost` (`keys`: it is a new key).
    #[inline]
    pub(crate) fn add(&mut self, key: &[u8], cost: Cost, keys: usize) {
        let u = &mut self.usage[self.of(key)];
        u.dram += cost.dram;
        u.disk += cost.disk;
        u.keys += keys;
    }

    /// `key` went, or gave up `cost` (`keys`: the key is gone).
    #[inline]
    pub(crate) fn sub(&mut self, key: &[u8], cost: Cost, keys: usize) {
        let u = &mut self.usage[self.of(key)];
        u.dram -= cost.dram;
        u.disk -= cost.disk;
        u.keys -= keys;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let p = KeyPattern::parse("llama70b@*").unwrap();
        assert!(p.matches(b"llama70b@1@2") && !p.matches(b"llama8b@1"));
        assert!(KeyPattern::parse("*").unwrap().matches(b"anything"));
        let exact = KeyPattern::parse("sys:prompt").unwrap();
        assert!(exact.matches(b"sys:prompt") && !exact.matches(b"sys:prompt2"));
        for bad in ["a*b*", "a?*", "[ab]*", "a\\*"] {
            assert!(KeyPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_first_matching_pattern_owns_a_key() {
        let t = Tenants::new(&[
            KeyPattern::parse("a@hot*").unwrap(),
            KeyPattern::parse("a@*").unwrap(),
        ]);
        assert_eq!(t.of(b"a@hot1"), 1);
        assert_eq!(t.of(b"a@cold"), 2);
        assert_eq!(t.of(b"b@x"), 0);
        assert_eq!(Tenants::default().of(b"a@hot1"), 0);
    }
}
