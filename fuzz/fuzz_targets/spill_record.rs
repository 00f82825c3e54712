//! The spill tier's record decoder: arbitrary bytes (never a panic, a torn
//! or flipped record is `None`), the same bytes made to look like a record
//! with a valid CRC (so the lengths are what is tested), and a round trip of
//! arbitrary fields.
#![no_main]

use bytes::{Bytes, BytesMut};
use kvtier_store::spill::record::{decode, encode, header, Record, HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode(Bytes::copy_from_slice(data));
    let _ = header(data);
    // A header with the right magic and version and a CRC that matches,
    // whatever the lengths say.
    if data.len() >= HEADER {
        let mut forged = data.to_vec();
        forged[..5].copy_from_slice(b"KVTS\x01");
        if let Some(h) = header(&forged) {
            let covered = (HEADER + h.key_len + h.parent_len).saturating_add(h.value_len);
            if covered <= forged.len() {
                let crc =
                    crc32c::crc32c_append(crc32c::crc32c(&forged[..24]), &forged[28..covered]);
                forged[24..28].copy_from_slice(&crc.to_le_bytes());
            }
        }
        let _ = decode(Bytes::from(forged));
    }
    // Round trip: what is encoded decodes to the same record.
    if data.len() >= 12 {
        let (lens, body) = data.split_at(12);
        let key_len = (lens[0] as usize) % (body.len() + 1);
        let (key, body) = body.split_at(key_len);
        let parent_len = (lens[1] as usize) % (body.len() + 1);
        let (parent, value) = body.split_at(parent_len);
        let record = Record {
            key: Bytes::copy_from_slice(key),
            parent: (lens[2] & 1 == 1 && !parent.is_empty())
                .then(|| Bytes::copy_from_slice(parent)),
            value: Bytes::copy_from_slice(value),
            expire_at: u64::from_le_bytes(lens[4..12].try_into().unwrap()),
            tombstone: lens[3] & 1 == 1,
        };
        let mut out = BytesMut::new();
        encode(&mut out, &record);
        assert_eq!(decode(out.freeze()), Some(record));
    }
});
