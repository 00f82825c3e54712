//! Key → hash slot, exactly as Redis Cluster computes it.
//!
//! `slot = CRC16-XMODEM(hashtag(key)) mod 16384`, where `hashtag(key)` is the
//! part between the first `{` and the next `}` when that part is non-empty, and
//! the whole key otherwise. Clients that group keys with `{tag}` get them on
//! one slot. A store holds a range of slots; the server maps slots to shards
//! and the cluster maps them to nodes.

/// Number of hash slots, as in Redis Cluster.
pub const SLOTS: usize = 16384;

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

/// CRC16 (XMODEM: poly 0x1021, init 0) lookup table, built at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16-XMODEM, the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize]
    })
}

/// The part of `key` that is hashed: the first non-empty `{...}` section, or
/// the whole key.
pub fn hashtag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The Redis Cluster hash slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashtag(key)) & (SLOTS as u16 - 1)
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

    #[test]
    fn crc16_matches_reference_vector() {
        // The check value of CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values printed by `CLUSTER KEYSLOT` on redis-server 7.0.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
        assert_eq!(key_slot(b"{user1000}.followers"), 3443);
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hashtag_rules() {
        assert_eq!(hashtag(b"a{b}c"), b"b");
        assert_eq!(hashtag(b"a{}c"), b"a{}c");
        assert_eq!(hashtag(b"a{bc"), b"a{bc");
        assert_eq!(hashtag(b"{a}{b}"), b"a");
    }
}
