use super::keyspace::BlockWrite;
use super::*;
use crate::clock::now_ms;
use crate::entry::Queue;
use crate::holds::HoldLimits;
use crate::links::Route;
use crate::policy::prefix::Classes;
use crate::policy::WriteClass;
use crate::slot::{key_slot, SLOTS};
use crate::stats::EvictReason;

fn block(i: u32, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|j| (j as u32 ^ i.wrapping_mul(2654435761)) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn put(s: &mut Store, key: &str, value: Bytes, parent: Option<&str>) -> i64 {
    let parent = parent.map(|p| Bytes::copy_from_slice(p.as_bytes()));
    let write = BlockWrite {
        parent,
        ..BlockWrite::default()
    };
    let code = s.insert_block(key_slot(key.as_bytes()), key.as_bytes(), value, write, 1000);
    settle(s);
    code
}

/// Delivers link events within one store (every key is local here).
fn settle(s: &mut Store) {
    loop {
        let events = s.take_link_events();
        if events.is_empty() {
            return;
        }
        // The store applied its own; a parent's departure has no
        // other store to reach.
        for e in events {
            if !matches!(e.route(), Route::Others) {
                s.apply_link(e);
            }
        }
    }
}

fn has(s: &mut Store, key: &str) -> bool {
    s.peek(key_slot(key.as_bytes()), key.as_bytes(), 1000)
        .is_some()
}

#[test]
fn blocks_live_in_the_slab_and_read_back_exactly() {
    let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
    for i in 0..40 {
        assert_eq!(put(&mut s, &format!("b{i}"), block(i, 64 * 1024), None), 1);
    }
    for i in 0..40 {
        let key = format!("b{i}");
        let e = s
            .peek(key_slot(key.as_bytes()), key.as_bytes(), 1000)
            .unwrap();
        assert!(e.value.slot().is_some());
        assert_eq!(e.value.bytes(), Some(block(i, 64 * 1024)));
    }
    let stats = s.arena_stats();
    assert_eq!(stats.classes[0].slot_size, 64 * 1024);
    assert_eq!(stats.classes[0].used, 40);
    assert_eq!(s.used_memory(), s.index_memory() + stats.page_bytes);
}

#[test]
fn used_memory_stays_under_the_budget_and_held_blocks_survive() {
    let budget = 4 << 20;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
    assert_eq!(put(&mut s, "held", block(7, 64 * 1024), None), 1);
    let held = s
        .read(key_slot(b"held"), b"held", 1000, true)
        .unwrap()
        .value
        .bytes();
    for i in 0..500 {
        assert_eq!(put(&mut s, &format!("k{i}"), block(i, 64 * 1024), None), 1);
        assert!(s.used_memory() <= budget, "{} > {budget}", s.used_memory());
    }
    assert!(
        has(&mut s, "held"),
        "a block a reply holds is never evicted"
    );
    assert_eq!(held, Some(block(7, 64 * 1024)));
    assert!(s.stats.evicted_keys > 400);
}

#[test]
fn prefix_policy_evicts_orphans_then_chains_from_their_tails() {
    // Room for about 24 blocks of 64 KiB (pages of 256 KiB).
    let budget = 24 * 64 * 1024 + 64 * 1024;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    // A chain a0 <- a1 <- ... <- a9, the oldest blocks.
    for i in 0..10 {
        let parent = (i > 0).then(|| format!("a{}", i - 1));
        assert_eq!(
            put(
                &mut s,
                &format!("a{i}"),
                block(i, 64 * 1024),
                parent.as_deref()
            ),
            1
        );
    }
    // An orphan: its parent was never stored.
    assert_eq!(
        put(&mut s, "orphan", block(99, 64 * 1024), Some("missing")),
        1
    );
    // Fill the rest with unchained blocks (leaves) until eviction starts.
    let mut i = 0;
    while s.stats.evicted_keys == 0 {
        put(&mut s, &format!("x{i}"), block(1000 + i, 64 * 1024), None);
        i += 1;
    }
    assert!(!has(&mut s, "orphan"), "the orphan goes first");
    assert_eq!(s.stats.evicted_by[EvictReason::Orphan as usize], 1);
    // Keep writing: the chain, least recently used, goes from its tail
    // (what is left of it is always a prefix), each inner block once it
    // is a leaf; then the leaves written after it.
    let mut left = 10;
    for j in 0..40 {
        put(&mut s, &format!("y{j}"), block(2000 + j, 64 * 1024), None);
        let present: Vec<bool> = (0..10).map(|k| has(&mut s, &format!("a{k}"))).collect();
        let now_left = present.iter().take_while(|&&p| p).count();
        assert!(
            present[now_left..].iter().all(|&p| !p),
            "a chain loses its tail first: {present:?}"
        );
        assert!(now_left <= left);
        left = now_left;
        if left > 0 {
            assert!(has(&mut s, "x0"), "x0 is newer than the chain");
        }
    }
    assert_eq!(left, 0, "the unread chain is evicted");
    assert_eq!(s.stats.evicted_by[EvictReason::Inner as usize], 0);
}

#[test]
fn large_blocks_are_stored_in_the_buffer_they_arrived_in() {
    let budget = 16 << 20;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    // Pages of 1 MiB here: 2 MiB blocks get spans.
    let big = block(1, 2 << 20);
    assert_eq!(put(&mut s, "big", big.clone(), None), 1);
    let got = s
        .read(key_slot(b"big"), b"big", 1000, true)
        .unwrap()
        .value
        .bytes();
    assert_eq!(got.unwrap().as_ptr(), big.as_ptr(), "copied");
    // Smaller blocks are copied into their class's pages.
    let small = block(2, 64 * 1024);
    assert_eq!(put(&mut s, "small", small.clone(), None), 1);
    let got = s
        .read(key_slot(b"small"), b"small", 1000, true)
        .unwrap()
        .value
        .bytes();
    assert_ne!(got.unwrap().as_ptr(), small.as_ptr());
    // The budget holds with kept buffers: writes past it evict.
    for i in 0..40 {
        assert_eq!(put(&mut s, &format!("b{i}"), block(i, 2 << 20), None), 1);
    }
    assert!(s.stats.evicted_keys > 30);
    assert!(s.used_memory() <= budget, "{} > {budget}", s.used_memory());
}

#[test]
fn held_blocks_are_not_evicted_and_writers_never_fail_for_them() {
    for policy in [
        EvictionPolicy::Prefix,
        EvictionPolicy::AllKeysLru,
        EvictionPolicy::AllKeysLfu,
        EvictionPolicy::AllKeysRandom,
    ] {
        let budget = 24 * 64 * 1024 + 64 * 1024;
        let mut s = Store::new(0..SLOTS, budget, policy);
        for i in 0..8 {
            put(&mut s, &format!("h{i}"), block(i, 64 * 1024), None);
        }
        let until = now_ms() + 60_000;
        for i in 0..8 {
            let key = Bytes::from(format!("h{i}"));
            let held = s.hold(key_slot(&key), &key, 7, until, 1000, HoldLimits::NONE);
            assert!(held, "{policy:?}");
        }
        assert!(!s.hold(
            key_slot(b"absent"),
            &Bytes::from_static(b"absent"),
            7,
            until,
            1000,
            HoldLimits::NONE
        ));
        // Write past the budget many times over: the held eight stay.
        for i in 0..200 {
            assert_eq!(put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None), 1);
        }
        assert!(s.stats.evicted_keys > 150, "{policy:?}");
        for i in 0..8 {
            assert!(
                has(&mut s, &format!("h{i}")),
                "{policy:?}: h{i} was evicted"
            );
        }
        assert_eq!(s.stats.holds.broken, 0);
        // A read ends a hold: the block may go again.
        assert!(s.read(key_slot(b"h0"), b"h0", 1000, true).is_some());
        assert_eq!(s.holds().len(), 7);

        // Everything held and nothing else to evict: the write still
        // succeeds, by breaking the holds.
        let mut t = Store::new(0..SLOTS, budget, policy);
        let mut n = 0;
        while t.stats.evicted_keys == 0 {
            let key = format!("k{n}");
            put(&mut t, &key, block(n, 64 * 1024), None);
            let key = Bytes::from(key);
            t.hold(key_slot(&key), &key, 1, until, 1000, HoldLimits::NONE);
            n += 1;
        }
        // The first write past the budget broke them (nothing else
        // could go); only the block written last is held again.
        assert_eq!(t.stats.holds.broken, n as u64 - 1, "{policy:?}");
        assert_eq!(t.holds().len(), 1);
    }
}

#[test]
fn a_cold_partial_block_goes_before_older_leaves() {
    let budget = 24 * 64 * 1024 + 64 * 1024;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    let mut i = 0;
    while s.len() < 8 {
        put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None);
        i += 1;
    }
    let write = BlockWrite {
        cold: true,
        ..BlockWrite::default()
    };
    let slot = key_slot(b"tail");
    assert_eq!(
        s.insert_block(slot, b"tail", block(7, 64 * 1024), write, 1000),
        1
    );
    while s.stats.evicted_keys == 0 {
        put(&mut s, &format!("x{i}"), block(i, 64 * 1024), None);
        i += 1;
    }
    assert!(!has(&mut s, "tail"), "the cold block is the first victim");
    assert!(has(&mut s, "x0"), "older leaves stay");
}

/// Stores `keys` as one chain write of `class` (each block continues
/// the one before it).
fn put_chain(s: &mut Store, keys: &[String], class: WriteClass) {
    put_run(s, keys, class, None);
}

/// Stores `keys` as a run of a chain write of `class`, `decided` on
/// another shard (None: the write starts here).
fn put_run(s: &mut Store, keys: &[String], class: WriteClass, decided: Option<bool>) {
    let mut parent: Option<Bytes> = None;
    s.begin_chain(decided);
    for (i, k) in keys.iter().enumerate() {
        let write = BlockWrite {
            parent: parent.take(),
            class,
            ..BlockWrite::default()
        };
        let slot = key_slot(k.as_bytes());
        s.insert_block(slot, k.as_bytes(), block(i as u32, 64 * 1024), write, 1000);
        settle(s);
        parent = Some(Bytes::from(k.clone()));
    }
}

#[test]
fn a_class_of_chain_writes_seldom_read_is_stored_cold() {
    let budget = 24 * 64 * 1024 + 64 * 1024;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    let (unread, read, back) = (
        WriteClass::chain(4, false),
        WriteClass::chain(2, false),
        WriteClass::chain(1, true),
    );
    // Chains of four never read; chains of two read once each; single
    // blocks that are evicted and written again while remembered (a
    // fifth of the evictions come back).
    for i in 0..3000 {
        put_chain(
            &mut s,
            &(0..4).map(|j| format!("u{i}-{j}")).collect::<Vec<_>>(),
            unread,
        );
        let pair: Vec<String> = (0..2).map(|j| format!("r{i}-{j}")).collect();
        put_chain(&mut s, &pair, read);
        for k in &pair {
            s.read(key_slot(k.as_bytes()), k.as_bytes(), 1000, true);
        }
        put_chain(&mut s, &[format!("back{}", i % 16)], back);
    }
    let classes = &s.recency.classes;
    let t = s.recency.tuning;
    assert!(classes.cold(Classes::of(unread, false), &t));
    assert!(!classes.cold(Classes::of(read, false), &t));
    // One chain write in `class_probe` of a cold class is stored as
    // usual and measured, all its blocks; the others, none.
    let mut measured = 0;
    for i in 0..16 {
        let keys: Vec<String> = (0..4).map(|j| format!("probe{i}-{j}")).collect();
        put_chain(&mut s, &keys, unread);
        assert!(keys.iter().all(|k| has(&mut s, k)));
        let of_class = keys
            .iter()
            .filter(|k| {
                s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
                    .is_some_and(|e| e.class != 0)
            })
            .count();
        assert!(of_class == 0 || of_class == 4, "one decision per call");
        measured += of_class / 4;
    }
    assert_eq!(measured, 16 / t.class_probe as usize);
    // A run that continues a chain write decided on another shard is
    // stored as decided there, whatever its class here.
    for (decided, class, measured) in [(Some(true), read, false), (Some(false), unread, true)] {
        let keys: Vec<String> = (0..3).map(|j| format!("{decided:?}{j}")).collect();
        put_run(&mut s, &keys, class, decided);
        assert!(keys.iter().all(|k| {
            s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
                .is_some_and(|e| (e.class != 0) == measured)
        }));
        assert_eq!(s.chain_decision(), decided);
    }
    // Without probes: a new chain of the unread class goes before older
    // blocks, from its tail.
    s.set_prefix_tuning(PrefixTuning {
        class_probe: u32::MAX,
        ..s.recency.tuning
    });
    for j in 0..8 {
        put(&mut s, &format!("p{j}"), block(j, 64 * 1024), None);
    }
    let chain: Vec<String> = (0..4).map(|j| format!("c{j}")).collect();
    put_chain(&mut s, &chain, unread);
    assert!(
        chain.iter().all(|k| has(&mut s, k)),
        "a chain being written keeps its blocks"
    );
    let mut j = 100;
    for left in (0..4).rev() {
        while chain.iter().filter(|k| has(&mut s, k)).count() > left {
            put(&mut s, &format!("p{j}"), block(j, 64 * 1024), None);
            j += 1;
        }
        let present: Vec<bool> = chain.iter().map(|k| has(&mut s, k)).collect();
        assert!(
            present[..left].iter().all(|&p| p),
            "tail first: {present:?}"
        );
    }
    assert!(
        (0..8).all(|j| has(&mut s, &format!("p{j}"))),
        "older blocks stay"
    );
    // Off: the same class is stored as usual again, every block
    // measured (with the rule on and no probes, none would be).
    s.set_prefix_tuning(PrefixTuning {
        class_threshold: 0.0,
        ..s.recency.tuning
    });
    let keys: Vec<String> = (0..4).map(|j| format!("off{j}")).collect();
    put_chain(&mut s, &keys, unread);
    assert!(keys.iter().all(|k| {
        s.peek(key_slot(k.as_bytes()), k.as_bytes(), 1000)
            .is_some_and(|e| e.class != 0)
    }));
}

#[test]
fn write_classes_bucket_chains_by_length() {
    let c = WriteClass::chain;
    assert_ne!(c(1, false), c(2, false));
    assert_eq!(c(2, false), c(3, false));
    assert_ne!(c(3, false), c(4, false));
    assert_eq!(c(128, false), c(100_000, false));
    assert_ne!(c(4, false), c(4, true));
    assert_eq!(c(0, false), c(1, false));
    assert_ne!(c(1, false), WriteClass::default());
    let all: std::collections::HashSet<u8> = (1..300)
        .flat_map(|n| [false, true].map(|r| Classes::of(c(n, r), true)))
        .chain((1..300).flat_map(|n| [false, true].map(|r| Classes::of(c(n, r), false))))
        .collect();
    assert_eq!(all.len(), 32, "8 lengths x rooted x remembered");
    assert!(all.iter().all(|&m| (1..=32).contains(&m)));
}

#[test]
fn an_evicted_block_written_again_comes_back_with_its_uses() {
    let budget = 24 * 64 * 1024 + 64 * 1024;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    put(&mut s, "r", block(1, 64 * 1024), None);
    let mut i = 0;
    while has(&mut s, "r") {
        put(&mut s, &format!("x{i}"), block(100 + i, 64 * 1024), None);
        i += 1;
    }
    // Each eviction remembered (a set met by more than four forgets
    // its oldest).
    let evicted = s.stats.evicted_keys as usize;
    assert!(s.recency.ghosts.len() <= evicted && s.recency.ghosts.len() + 2 >= evicted);
    assert_eq!(
        s.used_memory(),
        s.index_memory() + s.arena.mapped_bytes() + s.recency.ghosts.bytes(),
        "the ghost list is charged"
    );
    // Written once before, written again: two uses, level 1.
    put(&mut s, "r", block(1, 64 * 1024), None);
    let e = s.peek(key_slot(b"r"), b"r", 1000).unwrap();
    assert_eq!((e.uses, e.queue), (2, Queue::at(1)));
    // A key never seen starts from its write.
    put(&mut s, "new", block(2, 64 * 1024), None);
    let e = s.peek(key_slot(b"new"), b"new", 1000).unwrap();
    assert_eq!((e.uses, e.queue), (1, Queue::at(0)));
    // The table has room for `ghosts_per_block` x blocks in DRAM (the
    // power of two at or above), and newer evictions take the place of
    // older ones: it stays that size however many go.
    for j in 0..2000 {
        put(&mut s, &format!("y{j}"), block(5000 + j, 64 * 1024), None);
    }
    let room = (s.meta.queued as f32 * s.recency.tuning.ghosts_per_block) as usize;
    let size = s.recency.ghosts.capacity();
    assert_eq!(size, room.next_power_of_two());
    assert!(s.recency.ghosts.len() <= size && s.recency.ghosts.len() >= size / 2);
    assert_eq!(s.recency.ghosts.bytes(), 4 * size);
    // The last ones evicted are there: written again, they come back
    // with their uses.
    let gone = (0..2000)
        .rev()
        .map(|j| format!("y{j}"))
        .find(|k| !has(&mut s, k))
        .unwrap();
    put(&mut s, &gone, block(1, 64 * 1024), None);
    let e = s
        .peek(key_slot(gone.as_bytes()), gone.as_bytes(), 1000)
        .unwrap();
    assert_eq!(e.uses, 2, "{gone}");
    // Other policies remember nothing.
    let mut lru = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
    for j in 0..100 {
        put(&mut lru, &format!("y{j}"), block(j, 64 * 1024), None);
    }
    assert!(lru.stats.evicted_keys > 0);
    assert_eq!(lru.recency.ghosts.len(), 0);
}

#[test]
fn reads_alone_keep_the_queues_bounded() {
    for policy in [EvictionPolicy::Prefix, EvictionPolicy::AllKeysLru] {
        let mut s = Store::new(0..SLOTS, 1 << 30, policy);
        put(&mut s, "b", block(1, 8192), None);
        let slot = key_slot(b"b");
        for _ in 0..20_000 {
            assert!(s.read(slot, b"b", 1000, true).is_some());
        }
        assert_eq!(s.meta.queued, 1);
        // Counted once more than `queued + 1024` slots were pushed,
        // compacted above four slots a block plus 1024.
        assert!(s.recency.slots() <= 5 * s.meta.queued + 2049, "{policy}");
    }
}

#[test]
fn queues_are_built_when_a_budget_is_set() {
    // No budget: nothing is queued, whatever is written or read.
    let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
    for k in ["a", "b", "c"] {
        put(&mut s, k, block(1, 8192), None);
    }
    assert!(s.read(key_slot(b"a"), b"a", 1000, true).is_some());
    assert_eq!((s.recency.slots(), s.meta.queued), (0, 0));
    // A budget: every block queued in recency order on its level (a,
    // written and read, has two uses: level 1).
    s.set_budget(1 << 30);
    let keys = |q: &std::collections::VecDeque<(Bytes, u32)>| -> Vec<Bytes> {
        q.iter().map(|(k, _)| k.clone()).collect()
    };
    assert_eq!(keys(&s.recency.lanes[0].queues[0]), ["b", "c"]);
    assert_eq!(keys(&s.recency.lanes[0].queues[1]), ["a"]);
    assert_eq!(s.meta.queued, 3);
    // No budget again: the queues go.
    s.set_budget(0);
    assert_eq!((s.recency.slots(), s.meta.queued), (0, 0));

    // Eviction on the rebuilt queues: the unread chain goes first, from
    // its tail, before the newer blocks.
    let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
    for i in 0..10 {
        let parent = (i > 0).then(|| format!("a{}", i - 1));
        put(
            &mut s,
            &format!("a{i}"),
            block(i, 1 << 20),
            parent.as_deref(),
        );
    }
    for i in 0..30 {
        put(&mut s, &format!("x{i}"), block(100 + i, 1 << 20), None);
    }
    s.set_budget(25 << 20);
    assert!(s.stats.evicted_keys > 0);
    assert_eq!(s.stats.evicted_by[EvictReason::Inner as usize], 0);
    let present: Vec<bool> = (0..10).map(|k| has(&mut s, &format!("a{k}"))).collect();
    let left = present.iter().take_while(|&&p| p).count();
    assert!(present[left..].iter().all(|&p| !p), "{present:?}");
    assert_eq!(left, 0, "the oldest blocks, the chain, go first");
    assert!(has(&mut s, "x29"), "the newest block stays");
}

#[test]
fn a_departed_parent_orphans_its_children() {
    let mut s = Store::new(0..SLOTS, 0, EvictionPolicy::Prefix);
    put(&mut s, "p", block(1, 8192), None);
    put(&mut s, "c1", block(2, 8192), Some("p"));
    put(&mut s, "c2", block(3, 8192), Some("p"));
    let slot = key_slot(b"p");
    assert_eq!(s.peek(slot, b"p", 1000).unwrap().children, 2);
    s.remove(slot, b"p");
    settle(&mut s);
    for c in ["c1", "c2"] {
        assert!(
            s.peek(key_slot(c.as_bytes()), c.as_bytes(), 1000)
                .unwrap()
                .orphan
        );
    }
}

#[test]
fn heap_values_evicted_first_do_not_refuse_blocks() {
    // Small values (on the heap, below the slab's minimum), then chains
    // of 4 KiB blocks past the budget: a block write's first evictions
    // take the small values, the least recently used, which free too
    // little for a new page, and every page is the blocks' class
    // already (none of another class to empty): eviction must go on
    // to the blocks rather than refuse the write.
    let budget = 32 << 20;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::Prefix);
    for i in 0..200 {
        assert_eq!(put(&mut s, &format!("one{i}"), block(i, 64), None), 1);
    }
    for c in 0..200 {
        let mut parent: Option<String> = None;
        for i in 0..64 {
            let key = format!("w{c}:{i}");
            let code = put(&mut s, &key, block(i, 4096), parent.as_deref());
            assert_eq!(code, 1, "chain {c}, block {i}");
            parent = Some(key);
        }
        assert!(s.used_memory() <= budget);
    }
}

#[test]
fn pages_move_to_a_new_block_size() {
    let budget = 16 << 20;
    let mut s = Store::new(0..SLOTS, budget, EvictionPolicy::AllKeysLru);
    // One write per second, so LRU knows the 64 KiB blocks are older.
    let mut now = 1_000_000;
    let mut write = |s: &mut Store, key: String, value: Bytes| {
        now += 1000;
        s.insert_block(
            key_slot(key.as_bytes()),
            key.as_bytes(),
            value,
            BlockWrite::default(),
            now,
        )
    };
    for i in 0..400 {
        assert_eq!(write(&mut s, format!("small{i}"), block(i, 64 * 1024)), 1);
    }
    for i in 0..80 {
        assert_eq!(write(&mut s, format!("big{i}"), block(i, 256 * 1024)), 1);
        assert!(s.used_memory() <= budget);
    }
    let stats = s.arena_stats();
    let big = stats
        .classes
        .iter()
        .find(|c| c.slot_size == 256 * 1024)
        .unwrap();
    assert!(stats.rebalanced_pages > 0, "pages changed class");
    assert!(big.pages >= 10, "the new size got most pages: {stats:?}");
    let mut present = 0;
    for i in 0..80 {
        let key = format!("big{i}");
        if let Some(e) = s.peek(key_slot(key.as_bytes()), key.as_bytes(), now) {
            assert_eq!(e.value.bytes(), Some(block(i, 256 * 1024)));
            present += 1;
        }
    }
    assert!(present >= 40, "{present} big blocks kept");
}
