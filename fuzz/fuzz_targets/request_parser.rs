//! The request parser on arbitrary bytes, fed in arbitrary chunks: never a
//! panic, and every parsed command's arguments are within the limits.
#![no_main]

use bytes::BytesMut;
use kvtier_protocol::request::RequestParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let max_bulk = 64 * 1024;
    let mut parser = RequestParser::new(max_bulk);
    parser.set_unauthenticated(split & 1 == 1);
    let mut buf = BytesMut::new();
    // Bytes arrive in pieces whose size the first byte picks.
    for piece in rest.chunks(split as usize % 64 + 1) {
        buf.extend_from_slice(piece);
        loop {
            match parser.parse(&mut buf) {
                Ok(Some(request)) => {
                    assert!(request.args.iter().all(|a| a.len() <= max_bulk));
                    assert_eq!(parser.pending_bytes(), 0);
                }
                Ok(None) => break,
                // A protocol error closes the connection: start afresh.
                Err(_) => {
                    parser = RequestParser::new(max_bulk);
                    buf.clear();
                    break;
                }
            }
        }
    }
});
