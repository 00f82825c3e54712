//! The reply parser the peer links, kvtier-bench and the tests share, on
//! arbitrary bytes in arbitrary chunks: never a panic.
#![no_main]

use bytes::BytesMut;
use kvtier_protocol::{Reply, ReplyParser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let mut parser = ReplyParser::<Reply>::with_big_bulk(64).with_max_bulk(1 << 20);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(split as usize % 64 + 1) {
        buf.extend_from_slice(piece);
        loop {
            match parser.parse(&mut buf) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    parser = ReplyParser::<Reply>::with_big_bulk(64).with_max_bulk(1 << 20);
                    buf.clear();
                    break;
                }
            }
        }
    }
});
