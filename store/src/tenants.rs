//! Tenants: who owns a key, named by key patterns (one or more per tenant:
//! its own, and its ACL user's key fences), what each tenant may hold
//! (its guaranteed share and its cap of each tier, [`Limits`]) and what it
//! holds in this store (bytes in DRAM and on disk, blocks). Keys no pattern
//! names belong to the default tenant (slot 0). The server sums the shards'
//! figures (INFO `tenants`, metrics with a `tenant` label).
//!
//! A key's tenant is decided by its bytes alone, so it is the same at every
//! insert, change and removal; the patterns are fixed for the store's life
//! (they are start-up settings), and an entry keeps its tenant's slot (one
//! byte) so that queueing and counting it need no pattern search.
//!
//! Shares and caps are parts of each shard's budget: with eviction per
//! tenant ([`Tenants::fair`]), each tenant has queues of its own, and an
//! eviction first chooses the tenant ([`Tenants::victims`]), then the key
//! by the policy among that tenant's. Per shard, no lock, no allocation.

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

/// The whole of a tier in [`Limits`]' units (basis points: 1 = 0.01%).
pub const WHOLE: u16 = 10_000;

/// A tenant's share and cap of the DRAM tier (`maxmemory`) and of the
/// spill tier (`spill-max-bytes`), in basis points of each ([`WHOLE`] is
/// all of it). The share is guaranteed: eviction for another tenant's
/// write takes nothing from a tenant at or under it. The cap is the most
/// it may hold: its writes past it evict its own blocks. What one tenant
/// leaves of its share unused, the others may use until it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Guaranteed part of the DRAM tier.
    pub share: u16,
    /// Most of the DRAM tier it may hold.
    pub cap: u16,
    /// Guaranteed part of the spill tier.
    pub disk_share: u16,
    /// Most of the spill tier it may hold.
    pub disk_cap: u16,
}

impl Default for Limits {
    /// No guarantee, no cap.
    fn default() -> Self {
        Limits {
            share: 0,
            cap: WHOLE,
            disk_share: 0,
            disk_cap: WHOLE,
        }
    }
}

impl Limits {
    /// The default tenant's limits beside named tenants with `named`: on
    /// each tier where some named tenant has a share, the share they leave
    /// (none where none has: with caps alone, no tenant is guaranteed
    /// anything, the unnamed keys included); no cap.
    pub fn rest(named: &[Limits]) -> Limits {
        let left = |f: fn(&Limits) -> u16| {
            let taken: u32 = named.iter().map(|l| f(l) as u32).sum();
            match taken {
                0 => 0,
                t => WHOLE.saturating_sub(t.min(WHOLE as u32) as u16),
            }
        };
        Limits {
            share: left(|l| l.share),
            disk_share: left(|l| l.disk_share),
            ..Limits::default()
        }
    }
}

/// `part` basis points of `whole` bytes. (In 64 bits, where the division
/// by a constant is a multiply: a 128-bit one is a call of about a hundred
/// instructions, and an eviction with tenants works out a share per
/// tenant. Up to 1.8 PB; past it, in 128 bits.)
#[inline]
pub(crate) fn part_of(whole: usize, part: u16) -> usize {
    match (whole as u64).checked_mul(part as u64) {
        Some(n) => (n / WHOLE as u64) as usize,
        None => (whole as u128 * part as u128 / WHOLE as u128) as usize,
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

/// The tenants' patterns, their limits and what each holds here.
#[derive(Clone, Debug)]
pub(crate) struct Tenants {
    /// The named tenants' patterns, in the order they are tried, each
    /// with its tenant's slot.
    patterns: Vec<(KeyPattern, u8)>,
    /// Named tenants (slots 1..=named).
    named: usize,
    /// Per slot.
    pub(crate) usage: [TenantUse; TENANT_SLOTS],
    /// Per slot (the default tenant's: the shares the others leave).
    pub(crate) limits: [Limits; TENANT_SLOTS],
    /// Some named tenant has a share or a cap: eviction keeps a queue per
    /// tenant and chooses the tenant first. Without, tenants are only
    /// counted, and eviction sees one pool as it does with no tenants.
    fair: bool,
}

impl Default for Tenants {
    fn default() -> Self {
        Tenants::grouped(&[])
    }
}

/// Tenant slots in an order, at most [`TENANT_SLOTS`] of them, with no
/// allocation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Order {
    slots: [u8; TENANT_SLOTS],
    len: u8,
}

impl Order {
    /// Tenant slot `slot` alone.
    pub(crate) fn one(slot: usize) -> Order {
        let mut order = Order::default();
        order.push(slot);
        order
    }

    /// These slots, in order.
    pub(crate) fn of(slots: impl Iterator<Item = usize>) -> Order {
        let mut order = Order::default();
        slots.for_each(|s| order.push(s));
        order
    }

    /// Inserts `slot` among the slots from `start` on, which are in
    /// descending order of `weight` (ties: the lower slot first, as slots
    /// are inserted in ascending order).
    fn insert_by(&mut self, slot: usize, weight: &[usize; TENANT_SLOTS], start: usize) {
        let mut at = self.len as usize;
        while at > start && weight[self.slots[at - 1] as usize] < weight[slot] {
            self.slots[at] = self.slots[at - 1];
            at -= 1;
        }
        self.slots[at] = slot as u8;
        self.len += 1;
    }

    fn push(&mut self, slot: usize) {
        self.slots[self.len as usize] = slot as u8;
        self.len += 1;
    }

    /// The slots, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots[..self.len as usize].iter().map(|&s| s as usize)
    }

    /// Whether `slot` is one of them.
    pub(crate) fn has(&self, slot: usize) -> bool {
        self.iter().any(|s| s == slot)
    }
}

impl Tenants {
    /// Tenants with these patterns, slot `i + 1` for `patterns[i]`.
    #[cfg(test)]
    pub(crate) fn new(patterns: &[KeyPattern]) -> Tenants {
        let groups: Vec<Vec<KeyPattern>> = patterns.iter().map(|p| vec![p.clone()]).collect();
        Tenants::grouped(&groups)
    }

    /// Tenants with these patterns, slot `i + 1` for the patterns of
    /// `groups[i]` (tried in order, group by group).
    pub(crate) fn grouped(groups: &[Vec<KeyPattern>]) -> Tenants {
        assert!(groups.len() <= MAX_TENANTS, "at most {MAX_TENANTS} tenants");
        let patterns = groups
            .iter()
            .enumerate()
            .flat_map(|(i, g)| g.iter().map(move |p| (p.clone(), i as u8 + 1)))
            .collect();
        Tenants {
            patterns,
            named: groups.len(),
            usage: Default::default(),
            // No limits: the default tenant's are `Limits::rest(&[])`.
            limits: [Limits::default(); TENANT_SLOTS],
            fair: false,
        }
    }

    /// The same patterns and limits, nothing held (FLUSHALL).
    pub(crate) fn emptied(&self) -> Tenants {
        Tenants {
            usage: Default::default(),
            ..self.clone()
        }
    }

    /// Slots in use: the default tenant's and one per pattern.
    #[inline]
    pub(crate) fn slots(&self) -> usize {
        self.named + 1
    }

    /// Whether tenant slot `slot` has a cap on its DRAM.
    #[inline]
    pub(crate) fn capped(&self, slot: u8) -> bool {
        self.limits[slot as usize].cap < WHOLE
    }

    /// Sets the named tenants' limits (slot `i + 1` takes `named[i]`; the
    /// default tenant gets the shares they leave).
    pub(crate) fn set_limits(&mut self, named: &[Limits]) {
        let n = named.len().min(self.named);
        self.limits[1..=n].copy_from_slice(&named[..n]);
        let named = &self.limits[1..self.slots()];
        self.fair = named.iter().any(|l| *l != Limits::default());
        self.limits[0] = Limits::rest(named);
    }

    /// Bytes tenant slot `slot` holds in DRAM above its share of a tier of
    /// `budget` bytes.
    pub(crate) fn excess(&self, slot: usize, budget: usize) -> usize {
        self.usage[slot]
            .dram
            .saturating_sub(part_of(budget, self.limits[slot].share))
    }

    /// Whether eviction is per tenant (see [`Tenants::fair`]).
    #[inline]
    pub(crate) fn fair(&self) -> bool {
        self.fair
    }

    /// Eviction queues (lanes) kept: one per tenant slot when eviction is
    /// per tenant, else one for all.
    pub(crate) fn lanes(&self) -> usize {
        if self.fair {
            self.slots()
        } else {
            1
        }
    }

    /// The tenants eviction may take from in a DRAM tier of `budget`
    /// bytes (without per-tenant eviction: lane 0, which holds every key),
    /// in the order it should: those above their guaranteed share,
    /// furthest above first; then the writer's own (`writer`; with none,
    /// every other tenant by what it holds, most first). A tenant at or
    /// under its share is never taken from for another's write. A pass
    /// over the tenants (≤ 16) and an insertion sort of those above their
    /// share (mostly one), only when something is evicted.
    pub(crate) fn victims(&self, budget: usize, writer: Option<usize>) -> Order {
        let mut order = Order::default();
        if !self.fair {
            // One pool: one lane, every key may go.
            order.push(0);
            return order;
        }
        let n = self.slots();
        let mut weight = [0usize; TENANT_SLOTS];
        for t in 0..n {
            weight[t] = self.excess(t, budget);
            if weight[t] > 0 {
                order.insert_by(t, &weight, 0);
            }
        }
        match writer {
            Some(w) if !order.has(w) => order.push(w),
            Some(_) => {}
            None => {
                let start = order.len as usize;
                for t in 0..n {
                    if !order.has(t) && self.usage[t].dram > 0 {
                        weight[t] = self.usage[t].dram;
                        order.insert_by(t, &weight, start);
                    }
                }
            }
        }
        order
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
            .find(|(p, _)| p.matches_head(key, key_head))
            .map_or(0, |&(_, slot)| slot as usize)
    }

    /// `key`'s cost went from `before` to `after`, and its keys by `keys`
    /// (1: it is new, -1: it is gone): one pattern search for the three.
    #[inline]
    pub(crate) fn shift(&mut self, key: &[u8], before: Cost, after: Cost, keys: isize) {
        self.shift_slot(self.of(key), before, after, keys);
    }

    /// [`Tenants::shift`] for a key of tenant slot `slot`.
    #[inline]
    pub(crate) fn shift_slot(&mut self, slot: usize, before: Cost, after: Cost, keys: isize) {
        let u = &mut self.usage[slot];
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
    fn victims_are_the_tenants_above_their_share_furthest_first_then_the_writer() {
        let mut t = Tenants::new(&[
            KeyPattern::parse("a@*").unwrap(),
            KeyPattern::parse("b@*").unwrap(),
            KeyPattern::parse("c@*").unwrap(),
        ]);
        let order = |t: &Tenants, writer| t.victims(1000, writer).iter().collect::<Vec<_>>();
        // Counted only: one lane for all.
        assert_eq!(order(&t, Some(2)), [0]);
        let share = |share| Limits {
            share,
            ..Limits::default()
        };
        // Shares 10%, 20%, 30% (of 1000 bytes); the default gets 40%.
        t.set_limits(&[share(1000), share(2000), share(3000)]);
        for (slot, held) in [(0, 100), (1, 150), (2, 400), (3, 350)] {
            t.usage[slot].dram = held;
        }
        // Above: b by 200, c by 50, a by 50 (a first on the tie); the
        // default (at 100 of 400) is never taken for another's write.
        assert_eq!(order(&t, Some(0)), [2, 1, 3, 0]);
        assert_eq!(order(&t, Some(2)), [2, 1, 3]);
        // No writer: then the others by what they hold.
        assert_eq!(order(&t, None), [2, 1, 3, 0]);
        t.usage[2].dram = 100;
        assert_eq!(order(&t, None), [1, 3, 0, 2]);
    }

    #[test]
    fn parts_of_a_tier() {
        assert_eq!(part_of(4 << 20, 1000), 419_430);
        assert_eq!(part_of(usize::MAX, WHOLE), usize::MAX);
        assert_eq!(part_of(usize::MAX, 5000), usize::MAX / 2);
        assert_eq!(part_of(12345, 0), 0);
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
