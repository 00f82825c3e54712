//! The on-disk record of the spill tier.
//!
//! ```text
//!  offset  size  field
//!  ┌──────┬─────┬──────────────────────────────────────────────┐
//!  │    0 │   4 │ magic "KVTS"                                  │
//!  │    4 │   1 │ format version (1)                            │
//!  │    5 │   1 │ flags: bit 0 tombstone (the key was deleted)  │
//!  │      │     │ (a tombstone with an empty key lists keys in  │
//!  │      │     │ its value: u16 length + key, repeated)        │
//!  │    6 │   2 │ key length                                    │
//!  │    8 │   2 │ parent key length (0: no CHAIN parent)        │
//!  │   10 │   2 │ reserved (0)                                  │
//!  │   12 │   4 │ value length                                  │
//!  │   16 │   8 │ expiry, Unix ms (0: none)                     │
//!  │   24 │   4 │ CRC32C of bytes 0..24 and 28..end of payload  │
//!  │   28 │   4 │ reserved (0)                                  │
//!  ├──────┴─────┴──────────────────────────────────────────────┤
//!  │ 32 .. key │ parent key │ value │ zero padding to 4096      │
//!  └───────────────────────────────────────────────────────────┘
//! ```
//!
//! Every record starts and ends on a 4096-byte boundary, so it can be read
//! and written with O_DIRECT. The checksum covers the header (with the CRC
//! field itself left out), the key, the parent key and the value: a torn or
//! flipped record never reads back as a block.

use bytes::{BufMut, Bytes, BytesMut};

/// Records start and end on multiples of this (O_DIRECT alignment).
pub const ALIGN: usize = 4096;
/// Header bytes before the key.
pub const HEADER: usize = 32;
const MAGIC: &[u8; 4] = b"KVTS";
const VERSION: u8 = 1;
const FLAG_TOMBSTONE: u8 = 1;

/// A record's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key.
    pub key: Bytes,
    /// The CHAIN parent's key, if any.
    pub parent: Option<Bytes>,
    /// The value (empty for a tombstone).
    pub value: Bytes,
    /// Expiry in Unix ms, 0 for none.
    pub expire_at: u64,
    /// The key was deleted: earlier records of it are dead.
    pub tombstone: bool,
}

/// The space a record with these lengths takes on disk.
pub fn record_len(key: usize, parent: usize, value: usize) -> usize {
    (HEADER + key + parent + value).div_ceil(ALIGN) * ALIGN
}

/// Where the value sits inside an encoded record.
pub fn value_offset(key: usize, parent: usize) -> usize {
    HEADER + key + parent
}

/// Appends the encoded record (padded to [`ALIGN`]) to `out`.
pub fn encode(out: &mut BytesMut, r: &Record) {
    let parent_len = r.parent.as_ref().map_or(0, |p| p.len());
    let start = out.len();
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(if r.tombstone { FLAG_TOMBSTONE } else { 0 });
    out.put_u16_le(r.key.len() as u16);
    out.put_u16_le(parent_len as u16);
    out.put_u16_le(0);
    out.put_u32_le(r.value.len() as u32);
    out.put_u64_le(r.expire_at);
    out.put_u32_le(0); // CRC, filled in below
    out.put_u32_le(0);
    out.put_slice(&r.key);
    if let Some(p) = &r.parent {
        out.put_slice(p);
    }
    out.put_slice(&r.value);
    let end = start + record_len(r.key.len(), parent_len, r.value.len());
    out.resize(end, 0);
    let crc = checksum(&out[start..start + value_offset(r.key.len(), parent_len) + r.value.len()]);
    out[start + 24..start + 28].copy_from_slice(&crc.to_le_bytes());
}

/// CRC32C of a record's covered bytes (everything but the CRC field).
fn checksum(record: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&record[..24]);
    crc32c::crc32c_append(crc, &record[28..])
}

/// Lengths read from a header, before the payload is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Key length.
    pub key_len: usize,
    /// Parent key length.
    pub parent_len: usize,
    /// Value length.
    pub value_len: usize,
    /// Expiry.
    pub expire_at: u64,
    /// Deleted key.
    pub tombstone: bool,
}

impl Header {
    /// Bytes the whole record takes on disk.
    pub fn record_len(&self) -> usize {
        record_len(self.key_len, self.parent_len, self.value_len)
    }
}

/// Parses a header; `None` if these bytes are not one (zeroes past the end
/// of a segment, or a torn write).
pub fn header(bytes: &[u8]) -> Option<Header> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC || bytes[4] != VERSION {
        return None;
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]) as usize;
    let value_len = u32::from_le_bytes(bytes[12..16].try_into().ok()?) as usize;
    let expire_at = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    Some(Header {
        key_len: u16_at(6),
        parent_len: u16_at(8),
        value_len,
        expire_at,
        tombstone: bytes[5] & FLAG_TOMBSTONE != 0,
    })
}

/// The value of a tombstone record for many keys: each key as a
/// little-endian u16 length and its bytes.
pub fn key_list<'a>(keys: impl IntoIterator<Item = &'a Bytes>) -> Bytes {
    let mut out = BytesMut::new();
    for k in keys {
        out.put_u16_le(k.len() as u16);
        out.put_slice(k);
    }
    out.freeze()
}

/// The keys of a tombstone list, as ranges of `value` (a truncated tail is
/// ignored; the CRC has already vouched for the bytes).
pub fn key_list_ranges(value: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = u16::from_le_bytes([*value.get(at)?, *value.get(at + 1)?]) as usize;
        let start = at + 2;
        (start + len <= value.len()).then(|| {
            at = start + len;
            start..at
        })
    })
}

/// The keys of a tombstone list ([`key_list_ranges`]).
pub fn read_key_list(value: &Bytes) -> Vec<Bytes> {
    key_list_ranges(value).map(|r| value.slice(r)).collect()
}

/// Decodes a whole record (as read from disk, padding included) and checks
/// its CRC. `None` for anything torn, flipped or not a record.
pub fn decode(bytes: Bytes) -> Option<Record> {
    let h = header(&bytes)?;
    let covered = value_offset(h.key_len, h.parent_len) + h.value_len;
    if bytes.len() < covered {
        return None;
    }
    let stored = u32::from_le_bytes(bytes[24..28].try_into().ok()?);
    if checksum(&bytes[..covered]) != stored {
        return None;
    }
    let key_end = HEADER + h.key_len;
    let parent_end = key_end + h.parent_len;
    Some(Record {
        key: bytes.slice(HEADER..key_end),
        parent: (h.parent_len > 0).then(|| bytes.slice(key_end..parent_end)),
        value: bytes.slice(parent_end..covered),
        expire_at: h.expire_at,
        tombstone: h.tombstone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value_len: usize) -> Record {
        Record {
            key: Bytes::from_static(b"blk:42"),
            parent: Some(Bytes::from_static(b"blk:41")),
            value: Bytes::from((0..value_len).map(|i| i as u8).collect::<Vec<u8>>()),
            expire_at: 1_700_000_000_000,
            tombstone: false,
        }
    }

    #[test]
    fn round_trip_and_alignment() {
        for len in [0, 1, 4096 - 44, 4096, 65536, 1 << 20] {
            let r = rec(len);
            let mut buf = BytesMut::new();
            encode(&mut buf, &r);
            assert_eq!(buf.len() % ALIGN, 0);
            assert_eq!(buf.len(), record_len(6, 6, len));
            assert_eq!(decode(buf.freeze()), Some(r));
        }
    }

    #[test]
    fn tombstone_lists_round_trip() {
        let keys = vec![
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from(vec![7u8; 300]),
        ];
        assert_eq!(read_key_list(&key_list(&keys)), keys);
    }

    #[test]
    fn any_flipped_byte_is_caught() {
        let r = rec(10_000);
        let mut buf = BytesMut::new();
        encode(&mut buf, &r);
        let covered = value_offset(6, 6) + 10_000;
        for i in (0..covered).step_by(97).chain([0, 5, 24, 27, covered - 1]) {
            let mut bad = buf.clone();
            bad[i] ^= 0x20;
            assert_eq!(decode(bad.freeze()), None, "flip at {i} went unnoticed");
        }
        // A truncated (torn) record is not a record either.
        assert_eq!(decode(buf.clone().freeze().slice(..4096)), None);
        // Zeroes past the end of a segment are not a header.
        assert_eq!(header(&[0u8; 64]), None);
    }
}
