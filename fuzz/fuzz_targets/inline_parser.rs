//! Inline commands (telnet style, quotes and escapes) on arbitrary lines,
//! split directly and through the request parser: never a panic.
#![no_main]

use bytes::BytesMut;
use kvtier_protocol::inline::split_inline_args;
use kvtier_protocol::request::RequestParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = split_inline_args(data);
    // Through the request parser, as an inline command (never a `*` frame).
    let mut line = data.to_vec();
    if line.first() == Some(&b'*') {
        line[0] = b' ';
    }
    line.extend_from_slice(b"\r\n");
    let mut parser = RequestParser::new(512 << 20);
    let mut buf = BytesMut::from(&line[..]);
    while let Ok(Some(_)) = parser.parse(&mut buf) {}
});
