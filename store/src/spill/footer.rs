//! A sealed segment's footer: what a warm restart needs of each record,
//! so the index comes back without reading a single payload.
//!
//! ```text
//!  segment file
//!  ┌────────────────── records ───────────────────┬─ footer body ─┬─ trailer ─┐
//!  │ record │ record │ ... (4096-aligned each)     │ entries, pad  │ 4096 bytes│
//!  └──────────────────────────────────────────────┴───────────────┴───────────┘
//!
//!  footer entry (little-endian), one per record, one per key of a
//!  tombstone list
//!  ┌──────┬─────┬────────────────────────────────────────────────┐
//!  │    0 │   8 │ offset of the record in the segment            │
//!  │    8 │   4 │ the record's CRC32C (its header field)         │
//!  │   12 │   4 │ value length                                   │
//!  │   16 │   8 │ expiry, Unix ms (0: none)                      │
//!  │   24 │   1 │ flags: bit 0 tombstone                         │
//!  │   25 │   1 │ reserved (0)                                   │
//!  │   26 │   2 │ key length                                     │
//!  │   28 │   2 │ parent key length                              │
//!  │   30 │   2 │ reserved (0)                                   │
//!  │   32 │     │ key │ parent key                               │
//!  └──────┴─────┴────────────────────────────────────────────────┘
//!
//!  trailer: the last 4096 bytes of the file
//!  ┌──────┬─────┬────────────────────────────────────────────────┐
//!  │    0 │   4 │ magic "KVTF"                                   │
//!  │    4 │   1 │ format version (1)                             │
//!  │    5 │   3 │ reserved (0)                                   │
//!  │    8 │   8 │ offset of the footer body                      │
//!  │   16 │   8 │ body length (unpadded)                         │
//!  │   24 │   8 │ entries                                        │
//!  │   32 │   4 │ CRC32C of the body                             │
//!  │   36 │   4 │ CRC32C of bytes 0..36                          │
//!  │   40 │     │ zero padding to 4096                           │
//!  └──────┴─────┴────────────────────────────────────────────────┘
//! ```
//!
//! The footer says where each record is and what it holds; the record still
//! carries its own CRC, checked on every read, so a footer that lists a
//! record the disk lost (a crash between them) costs a miss, never wrong
//! bytes. A footer that fails its checksums is ignored: the segment is then
//! scanned record by record, as a segment without one (the one a shard was
//! writing when the process died).

use bytes::{BufMut, BytesMut};

use super::record::{self, ALIGN, HEADER};

const MAGIC: &[u8; 4] = b"KVTF";
const VERSION: u8 = 1;
/// Bytes of a footer entry before its key.
pub const ENTRY_HEADER: usize = 32;
/// Bytes of the trailer (the file's last block).
pub const TRAILER: usize = ALIGN;

/// One record as the footer lists it (keys borrowed from the body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FooterEntry<'a> {
    /// Where the record starts in the segment.
    pub offset: u64,
    /// The record's CRC32C.
    pub crc: u32,
    /// The value's length.
    pub value_len: u32,
    /// Expiry in Unix ms, 0 for none.
    pub expire_at: u64,
    /// A deleted key.
    pub tombstone: bool,
    /// The key.
    pub key: &'a [u8],
    /// The CHAIN parent's key, if any.
    pub parent: Option<&'a [u8]>,
}

impl FooterEntry<'_> {
    /// The record's length on disk.
    pub fn record_len(&self) -> usize {
        record::record_len(
            self.key.len(),
            self.parent.map_or(0, <[u8]>::len),
            self.value_len as usize,
        )
    }
}

/// Appends the footer entries of one encoded record (at `offset` of its
/// segment) to `body`: one entry, or one per key of a tombstone list.
/// Returns how many entries it added.
pub fn note_record(body: &mut BytesMut, offset: u64, rec: &[u8]) -> u64 {
    let Some(h) = record::header(rec) else {
        return 0;
    };
    let crc = u32::from_le_bytes([rec[24], rec[25], rec[26], rec[27]]);
    let key_end = HEADER + h.key_len;
    let parent_end = key_end + h.parent_len;
    if rec.len() < parent_end + h.value_len {
        return 0;
    }
    let key = &rec[HEADER..key_end];
    if h.tombstone && key.is_empty() {
        let list = &rec[parent_end..parent_end + h.value_len];
        let mut n = 0;
        for k in record::key_list_ranges(list) {
            put_entry(body, offset, crc, 0, 0, true, &list[k], &[]);
            n += 1;
        }
        return n;
    }
    put_entry(
        body,
        offset,
        crc,
        h.value_len as u32,
        h.expire_at,
        h.tombstone,
        key,
        &rec[key_end..parent_end],
    );
    1
}

/// Appends one entry to `body` (what [`note_record`] writes per record;
/// public for tools that write footers of records they list).
#[allow(clippy::too_many_arguments)]
pub fn put_entry(
    body: &mut BytesMut,
    offset: u64,
    crc: u32,
    value_len: u32,
    expire_at: u64,
    tombstone: bool,
    key: &[u8],
    parent: &[u8],
) {
    body.put_u64_le(offset);
    body.put_u32_le(crc);
    body.put_u32_le(value_len);
    body.put_u64_le(expire_at);
    body.put_u8(tombstone as u8);
    body.put_u8(0);
    body.put_u16_le(key.len() as u16);
    body.put_u16_le(parent.len() as u16);
    body.put_u16_le(0);
    body.put_slice(key);
    body.put_slice(parent);
}

/// Bytes a footer of `body` takes on disk.
pub fn footer_len(body: usize) -> usize {
    body.div_ceil(ALIGN) * ALIGN + TRAILER
}

/// The footer to write at `at` (a multiple of 4096, after the last record)
/// for `body`: the body padded to a block, then the trailer; 4096-aligned
/// in memory (O_DIRECT).
pub fn encode(at: u64, body: &[u8], entries: u64) -> BytesMut {
    let padded = body.len().div_ceil(ALIGN) * ALIGN;
    let mut out = super::dir::aligned(padded + TRAILER);
    out.clear();
    out.put_slice(body);
    out.resize(padded, 0);
    let start = out.len();
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_bytes(0, 3);
    out.put_u64_le(at);
    out.put_u64_le(body.len() as u64);
    out.put_u64_le(entries);
    out.put_u32_le(crc32c::crc32c(body));
    let trailer_crc = crc32c::crc32c(&out[start..start + 36]);
    out.put_u32_le(trailer_crc);
    out.resize(start + TRAILER, 0);
    out
}

/// Where a trailer says the body is: `(offset, length, entries, body CRC)`;
/// `None` if these bytes are not a valid trailer.
pub fn trailer(block: &[u8]) -> Option<(u64, usize, u64, u32)> {
    if block.len() < 40 || &block[..4] != MAGIC || block[4] != VERSION {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(block[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_le_bytes(block[i..i + 4].try_into().unwrap_or([0; 4]));
    if crc32c::crc32c(&block[..36]) != u32_at(36) {
        return None;
    }
    Some((u64_at(8), u64_at(16) as usize, u64_at(24), u32_at(32)))
}

/// The entries of a footer body, if it matches its CRC and count.
pub fn decode(body: &[u8], entries: u64, crc: u32) -> Option<Vec<FooterEntry<'_>>> {
    if crc32c::crc32c(body) != crc {
        return None;
    }
    parse(body).filter(|out| out.len() as u64 == entries)
}

/// The entries of a footer body built in memory (no CRC to check yet).
pub fn parse(body: &[u8]) -> Option<Vec<FooterEntry<'_>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let b = body.get(at..at + ENTRY_HEADER)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let (key_len, parent_len) = (u16_at(26), u16_at(28));
        let key_at = at + ENTRY_HEADER;
        let end = key_at + key_len + parent_len;
        if end > body.len() {
            return None;
        }
        out.push(FooterEntry {
            offset: u64_at(0),
            crc: u32_at(8),
            value_len: u32_at(12),
            expire_at: u64_at(16),
            tombstone: b[24] & 1 != 0,
            key: &body[key_at..key_at + key_len],
            parent: (parent_len > 0).then(|| &body[key_at + key_len..end]),
        });
        at = end;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::spill::record::Record;

    fn record(key: &str, parent: Option<&str>, value_len: usize, tombstone: bool) -> BytesMut {
        let mut out = BytesMut::new();
        record::encode(
            &mut out,
            &Record {
                key: Bytes::copy_from_slice(key.as_bytes()),
                parent: parent.map(|p| Bytes::copy_from_slice(p.as_bytes())),
                value: Bytes::from(vec![3u8; value_len]),
                expire_at: if tombstone { 0 } else { 1_800_000_000_000 },
                tombstone,
            },
        );
        out
    }

    #[test]
    fn entries_round_trip_through_a_footer() {
        let mut body = BytesMut::new();
        let a = record("blk:1", None, 5000, false);
        let b = record("blk:2", Some("blk:1"), 100, false);
        let list = record::key_list(&[Bytes::from_static(b"x"), Bytes::from_static(b"yy")]);
        let mut t = BytesMut::new();
        record::encode(
            &mut t,
            &Record {
                key: Bytes::new(),
                parent: None,
                value: list,
                expire_at: 0,
                tombstone: true,
            },
        );
        assert_eq!(note_record(&mut body, 0, &a), 1);
        assert_eq!(note_record(&mut body, a.len() as u64, &b), 1);
        assert_eq!(note_record(&mut body, (a.len() + b.len()) as u64, &t), 2);
        let at = (a.len() + b.len() + t.len()) as u64;
        let footer = encode(at, &body, 4).freeze();
        assert_eq!(footer.len() % ALIGN, 0);
        let (offset, len, n, crc) = trailer(&footer[footer.len() - TRAILER..]).unwrap();
        assert_eq!((offset, n), (at, 4));
        let got = decode(&footer[..len], n, crc).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].key, b"blk:1");
        assert_eq!(got[0].record_len(), a.len());
        assert_eq!(got[1].parent, Some(&b"blk:1"[..]));
        assert_eq!(got[1].offset, a.len() as u64);
        assert!(got[2].tombstone && got[3].tombstone && got[3].key == b"yy");
    }

    #[test]
    fn a_damaged_footer_is_not_read() {
        let mut body = BytesMut::new();
        note_record(&mut body, 0, &record("k", None, 10, false));
        let footer = encode(4096, &body, 1);
        for i in [
            0,
            8,
            20,
            31,
            32,
            footer.len() - TRAILER,
            footer.len() - TRAILER + 9,
        ] {
            let mut bad = footer.clone();
            bad[i] ^= 1;
            let bad = bad.freeze();
            let ok = trailer(&bad[bad.len() - TRAILER..])
                .and_then(|(_, len, n, crc)| decode(&bad[..len], n, crc));
            assert!(ok.is_none(), "flip at {i} went unnoticed");
        }
    }
}
