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
/// key. Kept as a key is tested against it: its first 16 bytes as one
/// number under a mask (one compare for most prefixes, no call), the rest
/// as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPattern {
    head: u128,
    mask: u128,
    /// The prefix's (or exact key's) length.
    len: usize,
    /// Its bytes past the 16th.
    rest: Box<[u8]>,
    /// An exact key, not a prefix.
    exact: bool,
}

/// A key's first 16 bytes (zeros past its end) as one number. A key of 8
/// to 15 bytes is read as two overlapping 8-byte words, with no copy.
#[inline]
fn head(key: &[u8]) -> u128 {
    if let Some(first) = key.first_chunk::<16>() {
        return u128::from_le_bytes(*first);
    }
    let n = key.len();
    match (key.first_chunk::<8>(), key.last_chunk::<8>()) {
        (Some(lo), Some(hi)) => {
            // `hi` is bytes n-8..n: shifted to their places, it overlaps
            // `lo` only where the bytes are the same.
            u64::from_le_bytes(*lo) as u128 | (u64::from_le_bytes(*hi) as u128) << (8 * (n - 8))
        }
        _ => {
            let mut buf = [0u8; 16];
            buf[..n].copy_from_slice(key);
            u128::from_le_bytes(buf)
        }
    }
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
        let n = body.len().min(16);
        Ok(KeyPattern {
            head: head(&body[..n]),
            mask: if n == 16 {
                u128::MAX
            } else {
                (1u128 << (8 * n)) - 1
            },
            len: body.len(),
            rest: body[n..].into(),
            exact: body.len() == bytes.len(),
        })
    }

    /// Whether `key` is one of the pattern's keys.
    pub fn matches(&self, key: &[u8]) -> bool {
        self.matches_head(key, head(key))
    }

    /// [`KeyPattern::matches`] with the key's [`head`] worked out once for
    /// every pattern.
    #[inline]
    fn matches_head(&self, key: &[u8], key_head: u128) -> bool {
        key.len() >= self.len
            && key_head & self.mask == self.head
            && (self.rest.is_empty() || key[16..self.len] == self.rest[..])
            && (!self.exact || key.len() == self.len)
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
    /// The named tenants' patterns, in order: slot `i + 1` is `patterns[i]`.
    patterns: Vec<KeyPattern>,
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
            patterns: patterns.to_vec(),
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
        let key_head = head(key);
        self.patterns
            .iter()
            .position(|p| p.matches_head(key, key_head))
            .map_or(0, |i| i + 1)
    }

    /// `key`'s cost went from `before` to `after`, and its keys by `keys`
    /// (1: it is new, -1: it is gone): one pattern search for the three.
    #[inline]
    pub(crate) fn shift(&mut self, key: &[u8], before: Cost, after: Cost, keys: isize) {
        let u = &mut self.usage[self.of(key)];
        u.dram = u.dram - before.dram + after.dram;
        u.disk = u.disk - before.disk + after.disk;
        u.keys = u.keys.wrapping_add_signed(keys);
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

    /// The masked compare against plain slice matching, for every key
    /// length around the 8- and 16-byte edges and prefixes of every length
    /// (equal, and differing in their last byte).
    #[test]
    fn masked_compare_agrees_with_plain_matching() {
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH";
        for plen in 0..=24 {
            let mut other = alphabet[..plen].to_vec();
            if let Some(last) = other.last_mut() {
                *last = b'!';
            }
            for body in [&alphabet[..plen], &other[..]] {
                let text = std::str::from_utf8(body).unwrap();
                for (pattern, exact) in [(format!("{text}*"), false), (text.to_string(), true)] {
                    let p = KeyPattern::parse(&pattern).unwrap();
                    for klen in 0..=40 {
                        let key = &alphabet[..klen];
                        let plain = if exact {
                            key == body
                        } else {
                            key.starts_with(body)
                        };
                        assert_eq!(p.matches(key), plain, "{pattern:?} against {klen} bytes");
                    }
                }
            }
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
