//! Slot → shard: each of a node's shards owns a contiguous range of the
//! 16384 hash slots, so a SCAN walks one shard's slots before moving to the
//! next. The slot function itself (Redis Cluster's CRC16 of the hash tag)
//! is the store's, [`kvtier_store::slot`], re-exported here.

pub use kvtier_store::slot::{crc16, hashtag, key_slot, SLOTS};

/// Which of `shards` shards owns `slot`: shards own contiguous slot ranges,
/// so a SCAN walks one shard's slots before moving to the next.
pub fn slot_shard(slot: u16, shards: usize) -> usize {
    (slot as usize * shards) / SLOTS
}

/// The slot range `[start, end)` owned by `shard` of `shards`.
pub fn shard_slots(shard: usize, shards: usize) -> std::ops::Range<usize> {
    let start = (shard * SLOTS).div_ceil(shards);
    let end = ((shard + 1) * SLOTS).div_ceil(shards);
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_ranges_partition_the_slots() {
        for shards in 1..=7 {
            let mut next = 0;
            for shard in 0..shards {
                let range = shard_slots(shard, shards);
                assert_eq!(range.start, next);
                for slot in range.clone() {
                    assert_eq!(slot_shard(slot as u16, shards), shard);
                }
                next = range.end;
            }
            assert_eq!(next, SLOTS);
        }
    }
}
