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

/// CRC16 (XMODEM: poly 0x1021, init 0) lookup tables, built at compile
/// time: `CRC16_TABLES[k][b]` is the CRC of byte `b` followed by `k` zero
/// bytes. `CRC16_TABLES[0]` is the classic table; with all eight, eight
/// bytes take eight independent lookups ("slicing by 8", 4 KiB of tables):
/// a 16-byte key costs about half the instructions of two bytes at a time.
const CRC16_TABLES: [[u16; 256]; 8] = {
    let mut tables = [[0u16; 256]; 8];
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
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let t = tables[k - 1][i];
            tables[k][i] = (t << 8) ^ tables[0][(t >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

/// The CRC after eight more bytes (`word`, big-endian: its first byte is
/// the high one).
#[inline]
fn crc16_word(crc: u16, word: u64) -> u16 {
    let t = &CRC16_TABLES;
    let x = word ^ ((crc as u64) << 48);
    let byte = |n: u32| ((x >> (56 - 8 * n)) & 0xff) as usize;
    t[7][byte(0)]
        ^ t[6][byte(1)]
        ^ t[5][byte(2)]
        ^ t[4][byte(3)]
        ^ t[3][byte(4)]
        ^ t[2][byte(5)]
        ^ t[1][byte(6)]
        ^ t[0][byte(7)]
}

/// The CRC after one more byte.
#[inline]
fn crc16_byte(crc: u16, b: u8) -> u16 {
    (crc << 8) ^ CRC16_TABLES[0][((crc >> 8) as u8 ^ b) as usize]
}

/// CRC16-XMODEM, the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        crc = crc16_word(crc, u64::from_be_bytes(w.try_into().unwrap_or([0; 8])));
    }
    for &b in words.remainder() {
        crc = crc16_byte(crc, b);
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

/// Whether any byte of `word` is `{` (the classic has-a-zero-byte test on
/// `word ^ "{{{{{{{{"`: exact, no false positives).
#[inline]
fn has_open_brace(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let x = word ^ (ONES * b'{' as u64);
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// The Redis Cluster hash slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    const MASK: u16 = SLOTS as u16 - 1;
    // Most keys have no `{`: hash the whole key while looking for one, and
    // start again on the tag only if there is one.
    let mut crc = 0u16;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let word = u64::from_be_bytes(w.try_into().unwrap_or([0; 8]));
        if has_open_brace(word) {
            return crc16(hashtag(key)) & MASK;
        }
        crc = crc16_word(crc, word);
    }
    for &b in words.remainder() {
        if b == b'{' {
            return crc16(hashtag(key)) & MASK;
        }
        crc = crc16_byte(crc, b);
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
        // Eight bytes at a time agrees with the bit-by-bit definition at
        // every length.
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
        for b in 0..=255u8 {
            let word = u64::from_be_bytes([b'a', b'b', b, b'c', b'd', b'e', b'f', b'g']);
            assert_eq!(has_open_brace(word), b == b'{', "{b}");
        }
        let mut x = 12345u32;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let len = (x % 40) as usize;
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
