//! Writes under eviction, on the store alone: one shard's `Store` (no
//! network, no server) filled past its budget, then timed while every write
//! of a value to a random key evicts. What the eviction policy costs per
//! write, without the noise of sockets and a client sharing the cores.
//!
//! It uses only `Store::new`, `Store::insert` and `key_slot`, which older
//! builds have too, and no crate but `bytes` and the store (its flags are
//! read by hand, not with clap): `scripts/bench-store-writes.sh` builds this same file
//! against another revision's store crate and compares the two, timed and
//! counted (cachegrind). The key sequence is fixed (a seeded xorshift), so
//! under cachegrind the counts repeat (to about 1%: the store's maps seed
//! their hashes per process).
//!
//!     kvtier-store-writes [--writes N] [--warm N] [--keys N] [--value BYTES]
//!                         [--maxmemory BYTES] [--policy P] [--chunks N]
//!
//! Prints `ns/write median M min M` over the chunks the timed writes are cut
//! into (the median is the figure; a chunk is long enough to span many
//! evictions of every kind).

use std::fmt::Write as _;
use std::time::Instant;

use bytes::Bytes;
use kvtier_store::slot::key_slot;
use kvtier_store::{EvictionPolicy, Store};

struct Args {
    writes: u64,
    warm: u64,
    keys: u64,
    value: usize,
    maxmemory: usize,
    policy: EvictionPolicy,
    chunks: u64,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        writes: 2_000_000,
        warm: 200_000,
        keys: 1_000_000,
        value: 4096,
        maxmemory: 256 << 20,
        policy: EvictionPolicy::Prefix,
        chunks: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--writes" => args.writes = number()?,
            "--warm" => args.warm = number()?,
            "--keys" => args.keys = number()?.max(1),
            "--value" => args.value = number()? as usize,
            "--maxmemory" => args.maxmemory = number()? as usize,
            "--policy" => args.policy = value.parse()?,
            "--chunks" => args.chunks = number()?.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("kvtier-store-writes: {e}");
            std::process::exit(2);
        }
    };
    let mut store = Store::new(0..16384, args.maxmemory, args.policy);
    let value = Bytes::from(vec![b'v'; args.value]);
    let mut rng: u64 = 0x6b76_7469_6572_0001;
    let mut key = String::new();
    // One write of the value to the next random key (redis-benchmark's
    // `key:__rand_int__` form).
    let mut write = |store: &mut Store| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        key.clear();
        let _ = write!(
            key,
            "key:{:012}",
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % args.keys
        );
        let k = key.as_bytes();
        let _ = store.insert(key_slot(k), k, value.clone(), 0, 1);
    };
    for _ in 0..args.warm {
        write(&mut store);
    }
    let per_chunk = (args.writes / args.chunks).max(1);
    let mut ns = Vec::new();
    for _ in 0..args.chunks {
        let start = Instant::now();
        for _ in 0..per_chunk {
            write(&mut store);
        }
        ns.push(start.elapsed().as_nanos() as f64 / per_chunk as f64);
    }
    ns.sort_by(f64::total_cmp);
    println!(
        "ns/write median {:.1} min {:.1} keys {}",
        ns[ns.len() / 2],
        ns[0],
        store.len()
    );
}
