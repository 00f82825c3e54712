//! What this build is: the Redis version it answers as, and its heap
//! allocator.

/// The heap allocator of every program built on this crate (INFO
/// `mem_allocator`). mimalloc frees a block another thread allocated
/// without a lock: a shard running another shard's pipelined commands frees
/// their request buffers, where glibc's malloc took the allocating thread's
/// arena lock and the two shards slept on it
/// (docs/decisions/0035-heap-allocator-mimalloc.md). The fuzz targets build
/// without the feature, so their address sanitizer sees every allocation.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator's name and version as INFO reports it (as Redis's
/// `jemalloc-5.3.0`): `mimalloc-3.3.2`, or `libc` without the feature.
pub fn mem_allocator() -> String {
    #[cfg(feature = "mimalloc")]
    {
        let v = ALLOCATOR.version();
        format!("mimalloc-{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }
    #[cfg(not(feature = "mimalloc"))]
    {
        "libc".to_string()
    }
}

/// The Redis version kvtier reports (INFO, HELLO): the command set and
/// replies follow Redis 7.
pub const REDIS_VERSION: &str = "7.2.4";

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(feature = "mimalloc")]
    fn the_allocator_reports_its_version() {
        let name = super::mem_allocator();
        let version = name.strip_prefix("mimalloc-").expect(&name);
        let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{name}");
        assert!(parts[0] >= 2, "{name}");
    }
}
