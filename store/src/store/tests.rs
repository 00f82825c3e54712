use super::*;
use crate::entry::charge;
use crate::errors::OutOfMemory;
use crate::slot::{key_slot, SLOTS};

fn store(budget: usize, policy: EvictionPolicy) -> Store {
    Store::new(0..SLOTS, budget, policy)
}

/// A store of `budget` bytes under `policy` whose keys `a@*` are
/// tenant slot 1's and `b@*` slot 2's.
fn tenants_ab(budget: usize, policy: EvictionPolicy) -> Store {
    let mut s = store(budget, policy);
    s.set_tenants(&[
        vec![tenants::KeyPattern::parse("a@*").unwrap()],
        vec![tenants::KeyPattern::parse("b@*").unwrap()],
    ]);
    s
}

/// A guaranteed DRAM share of `share` basis points, nothing else.
fn share(share: u16) -> tenants::Limits {
    tenants::Limits {
        share,
        ..tenants::Limits::default()
    }
}

/// Writes `value` under `key`.
fn put_bytes(s: &mut Store, key: &str, value: &Bytes) -> Result<(), OutOfMemory> {
    let slot = key_slot(key.as_bytes());
    s.insert(slot, key.as_bytes(), value.clone(), 0, 0)
        .map(|_| ())
}

/// A tenant within its share keeps all it holds through another's
/// flood; shares changed later take effect at the next writes, and the
/// tenant above its share is brought to it, not below it by more than
/// a block.
#[test]
fn shares_hold_against_a_flood_and_change_at_run_time() {
    for policy in [
        EvictionPolicy::Prefix,
        EvictionPolicy::AllKeysLru,
        EvictionPolicy::AllKeysLfu,
    ] {
        let budget = 4 << 20;
        let mut s = tenants_ab(budget, policy);
        s.set_tenant_limits(&[share(0), share(5000)]);
        let block = Bytes::from(vec![7u8; 16384]);
        for i in 0..75 {
            put_bytes(&mut s, &format!("b@{i}"), &block).unwrap();
        }
        for i in 0..2500 {
            put_bytes(&mut s, &format!("a@{i}"), &block).unwrap();
        }
        assert_eq!(s.stats.tenants.evicted[2], 0, "{policy}");
        s.set_tenant_limits(&[share(9000), share(1000)]);
        for i in 0..2500 {
            put_bytes(&mut s, &format!("a@again{i}"), &block).unwrap();
        }
        let share = tenants::part_of(budget, 1000);
        let held = s.tenant_usage()[2].dram;
        assert!(s.stats.tenants.evicted[2] > 0, "{policy}");
        assert!(held <= share, "{policy}: {held} > {share}");
        assert!(held + 16384 + 200 > share, "{policy}: {held} of {share}");
    }
}

/// Sampling policies: a tenant above its share with few keys beside a
/// tenant with many is found (by a walk when the samples miss it), and
/// the tenant under its share loses nothing.
#[test]
fn sampling_policies_take_from_a_small_tenant_above_its_share() {
    for policy in [EvictionPolicy::AllKeysRandom, EvictionPolicy::AllKeysLfu] {
        let mut s = tenants_ab(4 << 20, policy);
        s.set_tenant_limits(&[share(0), share(9500)]);
        let (big, small) = (Bytes::from(vec![2u8; 200_000]), Bytes::from(vec![1u8; 100]));
        for i in 0..8 {
            put_bytes(&mut s, &format!("a@{i}"), &big).unwrap();
        }
        let mut i = 0;
        while s.stats.tenants.evicted[1] < 8 {
            put_bytes(&mut s, &format!("b@{i}"), &small).unwrap();
            i += 1;
            assert!(i < 100_000, "{policy}: a's blocks never went");
        }
        assert_eq!(
            s.stats.tenants.evicted[2], 0,
            "{policy}: b is within its share"
        );
    }
}

/// With caps alone, nobody is guaranteed anything: a capped tenant's
/// writes take from the unnamed keys that fill the tier, and its
/// overwrite of a block at its cap fits (the old block's room counts).
#[test]
fn caps_alone_guarantee_nothing_and_an_overwrite_fits_its_cap() {
    let budget = 4 << 20;
    let mut s = tenants_ab(budget, EvictionPolicy::Prefix);
    s.set_tenant_limits(&[
        tenants::Limits {
            cap: 1000,
            ..tenants::Limits::default()
        },
        tenants::Limits::default(),
    ]);
    let block = Bytes::from(vec![3u8; 16384]);
    for i in 0..400 {
        put_bytes(&mut s, &format!("other@{i}"), &block).unwrap();
    }
    for i in 0..10 {
        put_bytes(&mut s, &format!("a@{i}"), &block).unwrap();
    }
    assert_eq!(s.tenant_usage()[1].keys, 10);
    let big = Bytes::from(vec![4u8; 300_000]);
    put_bytes(&mut s, "a@big", &big).unwrap();
    put_bytes(&mut s, "a@big", &big).expect("an overwrite gives its old room back");
    assert!(s.tenant_usage()[1].dram <= tenants::part_of(budget, 1000));
}

fn put(s: &mut Store, key: &str, value: &str, expire_at: u64) -> Result<(), OutOfMemory> {
    s.insert(
        key_slot(key.as_bytes()),
        key.as_bytes(),
        Bytes::from(value.to_owned()),
        expire_at,
        1000,
    )
    .map(|_| ())
}

fn get(s: &mut Store, key: &str, now: u64) -> Option<Bytes> {
    s.read(key_slot(key.as_bytes()), key.as_bytes(), now, true)
        .and_then(|e| e.value.bytes())
}

#[test]
fn insert_read_remove_and_accounting() {
    let mut s = store(0, EvictionPolicy::NoEviction);
    put(&mut s, "a", "1", 0).unwrap();
    put(&mut s, "b", "22", 5000).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s.volatile_len(), 1);
    assert_eq!(s.used_memory(), charge(1, 1, false) + charge(1, 2, true));
    assert_eq!(get(&mut s, "a", 1000).unwrap(), "1");
    assert_eq!(get(&mut s, "b", 4999).unwrap(), "22");
    assert_eq!(get(&mut s, "b", 5000), None, "expired lazily");
    assert_eq!(s.stats.expired_keys, 1);
    assert_eq!(s.volatile_len(), 0);
    s.remove(key_slot(b"a"), b"a").unwrap();
    assert_eq!(s.used_memory(), 0);
    assert!(s.is_empty());
}

#[test]
fn active_expiry_pops_due_keys_only() {
    let mut s = store(0, EvictionPolicy::NoEviction);
    for i in 0..100 {
        put(&mut s, &format!("k{i}"), "v", 2000 + i).unwrap();
    }
    assert_eq!(s.expire_due(2049, 1000), 50);
    assert_eq!(s.len(), 50);
    assert_eq!(s.avg_ttl(2049), (2050 + 2099) / 2 - 2049);
}

#[test]
fn set_expire_updates_index_and_charge() {
    let mut s = store(0, EvictionPolicy::NoEviction);
    put(&mut s, "k", "v", 0).unwrap();
    assert!(s.set_expire(key_slot(b"k"), b"k", 9000, 1000));
    assert_eq!(s.used_memory(), charge(1, 1, true));
    assert!(s.set_expire(key_slot(b"k"), b"k", 0, 1000));
    assert_eq!(s.used_memory(), charge(1, 1, false));
    assert_eq!(s.volatile_len(), 0);
    assert!(!s.set_expire(key_slot(b"x"), b"x", 5, 1000));
}

#[test]
fn noeviction_refuses_and_lru_evicts() {
    let each = charge(4, 100, false);
    let mut s = store(each * 10, EvictionPolicy::NoEviction);
    let v = "x".repeat(100);
    for i in 0..10 {
        put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
    }
    assert_eq!(put(&mut s, "k999", &v, 0), Err(OutOfMemory));
    s.set_policy(EvictionPolicy::AllKeysLru);
    for i in 10..1000 {
        put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
        assert!(s.used_memory() <= each * 10);
    }
    assert_eq!(s.len(), 10);
    assert_eq!(s.stats.evicted_keys, 990);
}

#[test]
fn a_new_ttl_makes_room_for_its_charge() {
    let each = charge(4, 100, false);
    let mut s = store(each * 10, EvictionPolicy::AllKeysLru);
    let v = "x".repeat(100);
    for i in 0..10 {
        put(&mut s, &format!("k{i:03}"), &v, 0).unwrap();
    }
    assert_eq!(s.used_memory(), each * 10, "exactly full");
    assert!(s.set_expire(key_slot(b"k005"), b"k005", 9000, 1000));
    assert!(s.used_memory() <= each * 10, "{}", s.used_memory());
    assert_eq!(s.stats.evicted_keys, 1);
}

#[test]
fn scan_visits_every_key_once() {
    let mut s = store(0, EvictionPolicy::NoEviction);
    for i in 0..1000 {
        put(&mut s, &format!("key:{i}"), "v", 0).unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    let mut cursor = Some(0);
    while let Some(from) = cursor {
        let (keys, next, visited) = s.scan(from, 10, |_| true, 1000);
        assert!(visited >= keys.len());
        for k in keys {
            assert!(seen.insert(k));
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 1000);
}
