//! The memory bound: `--maxmemory` with `noeviction` refuses writes with
//! Redis's OOM error; with `allkeys-lru` writes keep succeeding, INFO's
//! used_memory stays within maxmemory and evicted_keys grows.

mod common;

use common::*;

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

#[test]
fn noeviction_refuses_writes_with_oom() {
    let server = Server::start(&["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]);
    let mut c = server.raw();
    let value = vec![b'v'; 10_000];
    let mut stored = Vec::new();
    let mut refused = None;
    for i in 0..1000 {
        let key = format!("oom:{i}");
        match c.cmd(&[b"SET", key.as_bytes(), &value]) {
            r if r == ok() => stored.push(key),
            r => {
                refused = Some((key, r));
                break;
            }
        }
    }
    let (refused_key, reply) = refused.expect("1000 x 10 KB cannot fit in 1 MB");
    assert_eq!(reply, err(OOM));
    assert!(stored.len() > 10, "stored {} keys first", stored.len());
    // The refused write left nothing; what was stored is intact.
    assert_eq!(c.cmd(&[b"EXISTS", refused_key.as_bytes()]), int(0));
    for k in &stored {
        assert_eq!(c.cmd(&[b"STRLEN", k.as_bytes()]), int(10_000));
    }
    // Every growing write on a full shard is refused the same way.
    let full_shard_key = (0..)
        .map(|i| format!("again:{i}"))
        .find(|k| shard_of(k.as_bytes(), SHARDS) == shard_of(refused_key.as_bytes(), SHARDS))
        .unwrap();
    assert_eq!(
        c.cmd(&[b"SET", full_shard_key.as_bytes(), &value]),
        err(OOM)
    );
    // A growth the shard's remaining budget cannot hold (memory comes in
    // slab pages, so a small append may still fit a dedicated span).
    let big = vec![b'v'; 100_000];
    assert_eq!(
        c.cmd(&[b"APPEND", stored_on(&stored, &refused_key).as_bytes(), &big]),
        err(OOM)
    );
    let info = c.run("INFO memory").text();
    assert!(info_num(&info, "used_memory") <= 1 << 20, "{info}");
    assert_eq!(info_num(&c.run("INFO stats").text(), "evicted_keys"), 0);
    let errors = c.run("INFO errorstats").text();
    assert!(errors.contains("errorstat_OOM:count="), "{errors}");
    // Freeing memory makes room again.
    assert_eq!(c.run("FLUSHALL"), ok());
    assert_eq!(c.cmd(&[b"SET", refused_key.as_bytes(), &value]), ok());
}

/// A stored key on the same shard as `like`.
fn stored_on(stored: &[String], like: &str) -> String {
    let shard = shard_of(like.as_bytes(), SHARDS);
    stored
        .iter()
        .find(|k| shard_of(k.as_bytes(), SHARDS) == shard)
        .expect("a stored key on the full shard")
        .clone()
}

#[test]
fn noeviction_through_the_redis_crate() {
    let server = Server::start(&["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]);
    let mut con = server.redis();
    let value = vec![7u8; 50_000];
    let mut error = None;
    for i in 0..200 {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(&value)
            .query(&mut con);
        if let Err(e) = r {
            error = Some(e);
            break;
        }
    }
    let e = error.expect("OOM before 10 MB were written");
    assert_eq!(err_text(&e), OOM);
    // Reads still work.
    let v: Vec<u8> = redis::cmd("GET").arg("k0").query(&mut con).unwrap();
    assert_eq!(v, value);
}

#[test]
fn allkeys_lru_evicts_and_stays_within_maxmemory() {
    let maxmemory: u64 = 2 << 20;
    let server = Server::start(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut c = server.raw();
    let mut previous_evicted = 0;
    for round in 0..4 {
        let mut pipeline = Vec::new();
        for i in 0..250 {
            let key = format!("lru:{round}:{i}");
            let value = vec![b'a' + (i % 26) as u8; 8_000];
            pipeline.extend(encode(&[b"SET", key.as_bytes(), &value]));
        }
        c.send(&pipeline);
        for i in 0..250 {
            assert_eq!(c.read(), ok(), "round {round} write {i}");
        }
        let info = c.run("INFO").text();
        let used = info_num(&info, "used_memory");
        assert!(
            used <= maxmemory,
            "used_memory {used} > maxmemory {maxmemory}"
        );
        assert_eq!(info_num(&info, "maxmemory"), maxmemory);
        let evicted = info_num(&info, "evicted_keys");
        // The first 2 MB almost fit; from then on every round evicts.
        if round > 0 {
            assert!(
                evicted > previous_evicted,
                "round {round}: evicted_keys {evicted}"
            );
        }
        previous_evicted = evicted;
    }
    // 1000 x 8 KB were written into 2 MB: most are gone, the rest are whole.
    let keys = c.run("DBSIZE").int();
    assert!(keys > 50 && keys < 1000, "{keys} keys left");
    assert_eq!(keys as u64 + previous_evicted, 1000);
    let latest = c.run("GET lru:3:249").bytes();
    assert_eq!(
        latest,
        vec![b'a' + (249 % 26) as u8; 8_000],
        "the newest key survives"
    );
    for k in c.run("KEYS *").items() {
        assert_eq!(c.cmd(&[b"STRLEN", &k.bytes()]), int(8_000));
    }
}

#[test]
fn config_set_maxmemory_at_run_time() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let value = vec![b'z'; 10_000];
    for i in 0..200 {
        assert_eq!(c.cmd(&[b"SET", format!("k{i}").as_bytes(), &value]), ok());
    }
    // Lowering maxmemory under allkeys-lru evicts down to the new bound.
    assert_eq!(c.run("CONFIG SET maxmemory-policy allkeys-lru"), ok());
    assert_eq!(c.run("CONFIG SET maxmemory 1mb"), ok());
    let info = c.run("INFO").text();
    assert!(info_num(&info, "used_memory") <= 1 << 20);
    assert!(info_num(&info, "evicted_keys") > 0);
    // And under noeviction new writes are refused.
    assert_eq!(c.run("CONFIG SET maxmemory-policy noeviction"), ok());
    let mut refused = false;
    for i in 0..200 {
        if c.cmd(&[b"SET", format!("n{i}").as_bytes(), &value]) == err(OOM) {
            refused = true;
            break;
        }
    }
    assert!(refused);
    assert_eq!(c.run("CONFIG SET maxmemory 0"), ok());
    assert_eq!(c.cmd(&[b"SET", b"after", &value]), ok());
}

/// Tenants with shares and caps: a flood of one tenant's unique blocks
/// evicts only its own while the other is within its guaranteed share;
/// `CONFIG SET tenant` changes shares and caps while the server runs.
#[test]
fn a_tenant_within_its_share_keeps_its_blocks_through_another_tenants_flood() {
    let server = Server::start(&[
        "--maxmemory",
        "8mb",
        "--tenant",
        "name=a,keys=a@*",
        "--tenant",
        "name=b,keys=b@*,share=50%",
    ]);
    let mut c = server.raw();
    let block = vec![b'x'; 16384];
    let set = |c: &mut RawConn, key: &str| c.cmd(&[b"SET", key.as_bytes(), &block]);
    // b: 2.4 MB, within its half of the tier on each shard.
    for i in 0..150 {
        assert_eq!(set(&mut c, &format!("b@{i}")), ok());
    }
    // a: 40 MB of unique blocks.
    for i in 0..2500 {
        assert_eq!(set(&mut c, &format!("a@{i}")), ok());
    }
    for i in 0..150 {
        let key = format!("b@{i}");
        assert_eq!(c.cmd(&[b"GET", key.as_bytes()]), bulk(&block), "{key}");
    }
    let t = tenants_info(&mut c);
    assert_eq!(t["b"]["evicted_keys"], 0, "{t:?}");
    assert!(t["a"]["evicted_keys"] > 2000, "{t:?}");
    let got = c.run("CONFIG GET tenant").items();
    assert_eq!(
        got[1],
        bulk(
            "name=a,keys=a@*,share=0%,cap=100%,disk-share=0%,disk-cap=100% \
             name=b,keys=b@*,share=50%,cap=100%,disk-share=0%,disk-cap=100%"
        )
    );

    // Shares changed at run time: b keeps a tenth, a takes the rest (the
    // default tenant has nothing left to lend).
    assert_eq!(
        c.cmd(&[
            b"CONFIG",
            b"SET",
            b"tenant",
            b"name=a,share=90% name=b,share=10%"
        ]),
        ok()
    );
    for i in 0..2500 {
        assert_eq!(set(&mut c, &format!("a@again{i}")), ok());
    }
    let t = tenants_info(&mut c);
    // Each shard holds its part of the share, less than a block short.
    let (tenth, slack) = ((8u64 << 20) / 10, SHARDS as u64 * 16_600);
    assert!(t["b"]["evicted_keys"] > 0, "{t:?}");
    assert!(t["b"]["dram_bytes"] <= tenth, "{t:?}");
    assert!(
        t["b"]["dram_bytes"] + slack >= tenth,
        "b keeps its share: {t:?}"
    );

    // A cap: a's blocks beyond a quarter of the tier go at once, and its
    // writes stay within it.
    assert_eq!(
        c.cmd(&[b"CONFIG", b"SET", b"tenant", b"name=a,share=0%,cap=25%"]),
        ok()
    );
    assert!(tenants_info(&mut c)["a"]["dram_bytes"] <= 2 << 20);
    for i in 0..200 {
        assert_eq!(set(&mut c, &format!("a@capped{i}")), ok());
    }
    let t = tenants_info(&mut c);
    assert!(t["a"]["dram_bytes"] <= 2 << 20, "{t:?}");
    assert!(t["a"]["dram_bytes"] + slack >= 2 << 20, "{t:?}");

    // Settings that cannot be: the error says why, nothing changes.
    for (value, error) in [
        ("name=zz,share=1%", "no tenant 'zz'"),
        (
            "name=a,share=60%,cap=100% name=b,share=60%",
            "add up to 120%",
        ),
        ("name=a,keys=x@*", "keys are set at start"),
        ("name=a,share=30%,cap=20%", "a share above its cap"),
        ("name=a,share=abc", "a percentage"),
        ("name=a,share=101%", "a percentage"),
        ("name=a,weight=2", "expected name="),
    ] {
        let reply = c.cmd(&[b"CONFIG", b"SET", b"tenant", value.as_bytes()]);
        let text = format!("{reply:?}");
        assert!(reply.is_error() && text.contains(error), "{value}: {text}");
    }
    assert!(c.run("CONFIG GET tenant").items()[1]
        .text()
        .contains("name=a,keys=a@*,share=0%,cap=25%"));
}
