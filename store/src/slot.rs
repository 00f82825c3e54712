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

/// [`CRC16_TABLE`] of a byte followed by a zero byte: with it two bytes
/// take two independent lookups (`crc16` "slicing by 2").
const CRC16_TABLE2: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let t = CRC16_TABLE[i];
        table[i] = (t << 8) ^ CRC16_TABLE[(t >> 8) as usize];
        i += 1;
    }
    table
};

/// CRC16-XMODEM, the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    let mut pairs = data.chunks_exact(2);
    for pair in &mut pairs {
        let high = ((crc >> 8) as u8 ^ pair[0]) as usize;
        let low = ((crc & 0xff) as u8 ^ pair[1]) as usize;
        crc = CRC16_TABLE2[high] ^ CRC16_TABLE[low];
    }
    for &b in pairs.remainder() {
        crc = (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize];
    }
    crc
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
    const MASK: u16 = SLOTS as u16 - 1;
    // Most keys have no `{`: hash the whole key while looking for one, and
    // start again on the tag only if there is one.
    let mut crc = 0u16;
    let mut pairs = key.chunks_exact(2);
    for pair in &mut pairs {
        if pair[0] == b'{' || pair[1] == b'{' {
            return crc16(hashtag(key)) & MASK;
        }
        let high = ((crc >> 8) as u8 ^ pair[0]) as usize;
        let low = ((crc & 0xff) as u8 ^ pair[1]) as usize;
        crc = CRC16_TABLE2[high] ^ CRC16_TABLE[low];
    }
    if let [last] = pairs.remainder() {
        if *last == b'{' {
            return crc16(hashtag(key)) & MASK;
        }
        crc = (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ last) as usize];
    }
    crc & MASK
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
        // Two bytes at a time agrees with the bit-by-bit definition at
        // every length, odd and even.
        let bitwise = |data: &[u8]| {
            let mut crc = 0u16;
            for &b in data {
                crc ^= (b as u16) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 {
                        (crc << 1) ^ 0x1021
                    } else {
                        crc << 1
                    };
                }
            }
            crc
        };
        let data: Vec<u8> = (0..64u32).map(|i| (i * 97 + 13) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(crc16(&data[..len]), bitwise(&data[..len]), "length {len}");
        }
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
        // The one-pass form agrees with the definition, braces anywhere.
        let alphabet = b"ab{}xyz019";
        let mut x = 12345u32;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let len = (x % 24) as usize;
            let key: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i % 27)) as usize + i * 7) % alphabet.len()])
                .collect();
            assert_eq!(key_slot(&key), crc16(hashtag(&key)) & 16383, "{key:?}");
        }
    }

    #[test]
    fn hashtag_rules() {
        assert_eq!(hashtag(b"a{b}c"), b"b");
        assert_eq!(hashtag(b"a{}c"), b"a{}c");
        assert_eq!(hashtag(b"a{bc"), b"a{bc");
        assert_eq!(hashtag(b"{a}{b}"), b"a");
    }
}
