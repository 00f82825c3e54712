//! Reading replies: the one RESP2/RESP3 reply parser of the project, used by
//! the server's links to its cluster peers, by kvtier-bench and by the
//! integration tests.
//!
//! [`ReplyParser`] is incremental: [`ReplyParser::parse`] takes whatever
//! complete lines and payloads are at the front of the read buffer, keeps
//! the aggregates it has opened, and returns a reply once one is whole, so
//! a reply arriving in many reads is scanned once, not once per read. A
//! bulk payload of [`ReplyParser::big_bulk`] bytes or more is read into a
//! buffer of its own, of exactly its size: the caller reads the socket
//! straight into [`ReplyParser::big_bulk_buffer`] while one is open, and
//! the value comes out as that buffer, frozen, without a copy.
//!
//! What a reply is built as is the caller's choice ([`BuildReply`]): the
//! server and the bench build [`Reply`] values (bulk strings stay slices of
//! the read buffer), the tests build an exact picture of the wire.

use bytes::buf::Limit;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::reply::Reply;

/// Aggregates nested deeper than this are refused (a broken peer).
pub const MAX_DEPTH: usize = 64;
/// Bulk payloads at least this long get a buffer of their own by default.
pub const BIG_BULK_REPLY: usize = 64 * 1024;
/// Longest bulk payload accepted by default (Redis's largest
/// `proto-max-bulk-len`, 4 GiB): a longer announced length is a broken
/// stream, not a reply.
pub const MAX_BULK_REPLY: usize = 4 << 30;
/// A big payload's buffer is reserved whole up to this size (a KV-cache
/// block is read into one allocation of its exact size); beyond it, the
/// buffer grows as the bytes arrive, so a length announced by a broken or
/// hostile peer never reserves memory the bytes have not paid for.
const RESERVE_AHEAD: usize = 64 << 20;
/// Longest line (status, error, number) accepted.
const MAX_LINE: usize = 64 * 1024;
/// Bytes reserved for a read into the shared buffer.
const READ_CHUNK: usize = 64 * 1024;
/// Elements reserved up front for an aggregate, whatever it announces.
const MAX_RESERVE: usize = 4096;

/// A reply that cannot be parsed: the stream is out of step and the
/// connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyError(pub String);

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad reply: {}", self.0)
    }
}

impl std::error::Error for ReplyError {}

impl From<ReplyError> for std::io::Error {
    fn from(e: ReplyError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// How the parser's output is built, one RESP type at a time.
pub trait BuildReply: Sized {
    /// A line type: `+` status, `-` error, `:` integer, `_` null, `,`
    /// double, `#` boolean, `(` big number; `line` is the text after the
    /// type byte.
    fn line(kind: u8, line: &[u8]) -> Result<Self, ReplyError>;
    /// A length-prefixed type: `$` bulk, `=` verbatim (format prefix
    /// included), `!` blob error.
    fn blob(kind: u8, body: Bytes) -> Result<Self, ReplyError>;
    /// A null length: `$-1` or `*-1` (`kind` says which; RESP3 `~`, `%`,
    /// `>` and `=` are null the same way).
    fn null(kind: u8) -> Result<Self, ReplyError>;
    /// An aggregate: `*` array, `~` set, `>` push, `%` map (its items
    /// flat: key, value, key, value...).
    fn aggregate(kind: u8, items: Vec<Self>) -> Result<Self, ReplyError>;
    /// A RESP3 attribute (`|`), read before the reply it annotates; it is
    /// dropped unless this says otherwise.
    fn attribute(_items: Vec<Self>) -> Result<(), ReplyError> {
        Ok(())
    }
}

/// An aggregate still being filled.
struct Open<T> {
    kind: u8,
    left: usize,
    items: Vec<T>,
}

/// A big bulk payload being read into its own buffer.
struct BigBulk {
    kind: u8,
    buf: BytesMut,
    len: usize,
}

/// Parses a stream of replies; see the module docs.
pub struct ReplyParser<T = Reply> {
    open: Vec<Open<T>>,
    big: Option<BigBulk>,
    big_bulk: usize,
    max_bulk: usize,
    /// Buffers handed back by the caller, reused for big payloads.
    spare: Vec<BytesMut>,
    /// Their capacity in all (at most [`SPARE_BYTES`]).
    spare_bytes: usize,
    /// A big payload ended and the reply it belongs to has not: see
    /// [`ReplyParser::read_hint`].
    after_big: bool,
}

/// Bytes read into the shared buffer right after a big payload, while its
/// array goes on: the next bulk header (`$2097152\r\n`) and little of the
/// payload after it, which would otherwise be copied out of the shared
/// buffer into its own (up to a whole read's worth per value).
pub const HEADER_READ: usize = 32;

/// Capacity of the buffers kept for reuse: enough for a whole reply of
/// 32 blocks of 2 MiB, or eight LMCache chunks of 32 MiB, so a client that
/// reads one such reply after another allocates (and the kernel zeroes
/// and maps) nothing new for them.
const SPARE_BYTES: usize = 256 << 20;

impl<T: BuildReply> Default for ReplyParser<T> {
    fn default() -> Self {
        ReplyParser::new()
    }
}

impl<T: BuildReply> ReplyParser<T> {
    /// A parser giving payloads of [`BIG_BULK_REPLY`] bytes or more their own
    /// buffer.
    pub fn new() -> Self {
        ReplyParser::with_big_bulk(BIG_BULK_REPLY)
    }

    /// A parser giving payloads of `min` bytes or more their own buffer.
    pub fn with_big_bulk(min: usize) -> Self {
        ReplyParser {
            open: Vec::new(),
            big: None,
            big_bulk: min.max(1),
            max_bulk: MAX_BULK_REPLY,
            spare: Vec::new(),
            spare_bytes: 0,
            after_big: false,
        }
    }

    /// Refuses bulk payloads longer than `max` bytes.
    pub fn with_max_bulk(mut self, max: usize) -> Self {
        self.max_bulk = max;
        self
    }

    /// The size from which a payload gets its own buffer.
    pub fn big_bulk(&self) -> usize {
        self.big_bulk
    }

    /// Whether part of a reply has been taken and the rest is awaited.
    pub fn in_progress(&self) -> bool {
        !self.open.is_empty() || self.big.is_some()
    }

    /// While a big payload is arriving: the buffer to read the socket into,
    /// limited to exactly what is still missing (CRLF included), so a read
    /// never takes bytes of the next reply. `None` otherwise: read into the
    /// buffer given to `parse`.
    pub fn big_bulk_buffer(&mut self) -> Option<Limit<&mut BytesMut>> {
        self.big.as_mut().map(|b| {
            let missing = b.len + 2 - b.buf.len();
            let room = b.buf.capacity() - b.buf.len();
            if room < missing.min(READ_CHUNK) {
                // Past what was reserved up front: grow with the bytes.
                b.buf.reserve(missing.min(RESERVE_AHEAD));
            }
            (&mut b.buf).limit(missing)
        })
    }

    /// Gives a value's buffer back once the caller is done with it, so a
    /// later big payload reuses it instead of allocating (kept only when
    /// nothing else still holds it).
    pub fn recycle(&mut self, value: Bytes) {
        if value.len() < self.big_bulk || self.spare_bytes + value.len() > SPARE_BYTES {
            return;
        }
        if let Ok(buf) = value.try_into_mut() {
            if self.spare_bytes + buf.capacity() <= SPARE_BYTES {
                self.spare_bytes += buf.capacity();
                self.spare.push(buf);
            }
        }
    }

    /// Takes what it can from the front of `buf`; returns a reply once one
    /// is complete, `Ok(None)` when more bytes are needed.
    pub fn parse(&mut self, buf: &mut BytesMut) -> Result<Option<T>, ReplyError> {
        loop {
            let value = match self.big.take() {
                Some(mut big) => {
                    let missing = big.len + 2 - big.buf.len();
                    let take = missing.min(buf.len());
                    big.buf.extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    if big.buf.len() < big.len + 2 {
                        self.big = Some(big);
                        return Ok(None);
                    }
                    if &big.buf[big.len..] != b"\r\n" {
                        return Err(ReplyError("bulk string not followed by CRLF".into()));
                    }
                    big.buf.truncate(big.len);
                    self.after_big = true;
                    T::blob(big.kind, big.buf.freeze())?
                }
                None => match self.next_value(buf)? {
                    Some(Step::Value(v)) => v,
                    Some(Step::Opened) => continue,
                    None => return Ok(None),
                },
            };
            if let Some(done) = self.place(value)? {
                self.after_big = false;
                return Ok(Some(done));
            }
        }
    }

    /// How many bytes to read into the shared buffer next: [`HEADER_READ`]
    /// right after a big payload inside an array that goes on (another
    /// bulk header is next, and a big read would take payload bytes that
    /// then have to be copied), `READ_CHUNK` (64 KiB) otherwise. Readers
    /// that read ahead further may use their own size in the second case.
    pub fn read_hint(&self) -> usize {
        if self.after_big && !self.open.is_empty() {
            HEADER_READ
        } else {
            READ_CHUNK
        }
    }

    /// Reads from `r` until a whole reply is parsed: into `buf`, or straight
    /// into a big payload's own buffer while one is arriving.
    pub async fn read_from<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        buf: &mut BytesMut,
    ) -> std::io::Result<T> {
        loop {
            if let Some(reply) = self.parse(buf)? {
                return Ok(reply);
            }
            let n = match self.big_bulk_buffer() {
                Some(mut own) => r.read_buf(&mut own).await?,
                None => {
                    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                        buf.reserve(READ_CHUNK);
                    }
                    let want = self.read_hint();
                    r.read_buf(&mut (&mut *buf).limit(want)).await?
                }
            };
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Reads one line (and, for a small bulk, its payload) off `buf`.
    fn next_value(&mut self, buf: &mut BytesMut) -> Result<Option<Step<T>>, ReplyError> {
        let Some(&kind) = buf.first() else {
            return Ok(None);
        };
        let Some(nl) = find_crlf(buf) else {
            if buf.len() > MAX_LINE {
                return Err(ReplyError("reply line too long".into()));
            }
            return Ok(None);
        };
        if nl == 0 {
            return Err(ReplyError("empty reply line".into()));
        }
        match kind {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                let value = T::line(kind, &buf[1..nl])?;
                buf.advance(nl + 2);
                Ok(Some(Step::Value(value)))
            }
            b'$' | b'=' | b'!' => {
                let n = length(&buf[1..nl])?;
                let Ok(len) = usize::try_from(n) else {
                    buf.advance(nl + 2);
                    return Ok(Some(Step::Value(T::null(kind)?)));
                };
                if len > self.max_bulk {
                    return Err(ReplyError(format!(
                        "bulk length {len} over the {} limit",
                        self.max_bulk
                    )));
                }
                if len >= self.big_bulk {
                    buf.advance(nl + 2);
                    let spare = self.spare.pop();
                    self.spare_bytes -= spare.as_ref().map_or(0, BytesMut::capacity);
                    let mut own = match spare {
                        Some(mut b) if b.capacity() >= len + 2 => {
                            b.clear();
                            b
                        }
                        _ => BytesMut::with_capacity((len + 2).min(RESERVE_AHEAD)),
                    };
                    let have = buf.len().min(len + 2);
                    own.extend_from_slice(&buf[..have]);
                    buf.advance(have);
                    self.big = Some(BigBulk {
                        kind,
                        buf: own,
                        len,
                    });
                    return Ok(Some(Step::Opened));
                }
                let end = nl + 2 + len + 2;
                if buf.len() < end {
                    buf.reserve(end - buf.len());
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(ReplyError("bulk string not followed by CRLF".into()));
                }
                buf.advance(nl + 2);
                let body = buf.split_to(len).freeze();
                buf.advance(2);
                Ok(Some(Step::Value(T::blob(kind, body)?)))
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n = length(&buf[1..nl])?;
                buf.advance(nl + 2);
                let Ok(n) = usize::try_from(n) else {
                    return Ok(Some(Step::Value(T::null(kind)?)));
                };
                let left = if matches!(kind, b'%' | b'|') {
                    n.checked_mul(2)
                        .ok_or_else(|| ReplyError("aggregate too long".into()))?
                } else {
                    n
                };
                if left == 0 {
                    // An empty attribute annotates nothing: it is dropped.
                    return Ok(Some(match kind {
                        b'|' => Step::Opened,
                        _ => Step::Value(T::aggregate(kind, Vec::new())?),
                    }));
                }
                if self.open.len() >= MAX_DEPTH {
                    return Err(ReplyError("reply nested too deeply".into()));
                }
                self.open.push(Open {
                    kind,
                    left,
                    items: Vec::with_capacity(left.min(MAX_RESERVE)),
                });
                Ok(Some(Step::Opened))
            }
            other => Err(ReplyError(format!(
                "unexpected reply type byte {other:#04x}"
            ))),
        }
    }

    /// Puts a finished value into the innermost open aggregate, closing
    /// every aggregate it completes; returns the whole reply when nothing
    /// is left open.
    fn place(&mut self, mut value: T) -> Result<Option<T>, ReplyError> {
        loop {
            let Some(top) = self.open.last_mut() else {
                return Ok(Some(value));
            };
            top.items.push(value);
            top.left -= 1;
            if top.left > 0 {
                return Ok(None);
            }
            let Some(done) = self.open.pop() else {
                unreachable!("the top was just read")
            };
            if done.kind == b'|' {
                // An attribute precedes the reply it annotates.
                T::attribute(done.items)?;
                return Ok(None);
            }
            value = T::aggregate(done.kind, done.items)?;
        }
    }
}

/// What reading one line gave.
enum Step<T> {
    /// A complete value.
    Value(T),
    /// An aggregate or a big payload was opened.
    Opened,
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    let limit = buf.len().min(MAX_LINE + 2);
    buf[..limit].windows(2).position(|w| w == b"\r\n")
}

/// A length or count: a decimal integer, `-1` for null.
fn length(line: &[u8]) -> Result<i64, ReplyError> {
    crate::integer::parse_i64_strict(line)
        .filter(|&n| n >= -1)
        .ok_or_else(|| ReplyError(format!("bad length {:?}", String::from_utf8_lossy(line))))
}

impl BuildReply for Reply {
    fn line(kind: u8, line: &[u8]) -> Result<Reply, ReplyError> {
        let text = || String::from_utf8_lossy(line).into_owned();
        Ok(match kind {
            b'+' => Reply::Status(text().into()),
            b'-' => Reply::Error(text().into()),
            b':' => Reply::Int(
                crate::integer::parse_i64_strict(line)
                    .ok_or_else(|| ReplyError(format!("bad integer {:?}", text())))?,
            ),
            b'_' => Reply::Nil,
            b',' => Reply::Double(parse_double(line)),
            b'#' => Reply::Bool(line == b"t"),
            // A big number keeps its digits.
            _ => Reply::Bulk(Bytes::copy_from_slice(line)),
        })
    }

    fn blob(kind: u8, body: Bytes) -> Result<Reply, ReplyError> {
        Ok(match kind {
            b'=' => Reply::Verbatim(body.slice(4.min(body.len())..)),
            b'!' => Reply::Error(String::from_utf8_lossy(&body).into_owned().into()),
            _ => Reply::Bulk(body),
        })
    }

    fn null(kind: u8) -> Result<Reply, ReplyError> {
        Ok(if kind == b'$' || kind == b'=' || kind == b'!' {
            Reply::Nil
        } else {
            Reply::NilArray
        })
    }

    fn aggregate(kind: u8, items: Vec<Reply>) -> Result<Reply, ReplyError> {
        Ok(match kind {
            b'~' => Reply::Set(items),
            b'%' => {
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Reply::Map(pairs)
            }
            _ => Reply::Array(items),
        })
    }
}

/// A RESP3 double (`inf`, `-inf` and `nan` by name).
fn parse_double(line: &[u8]) -> f64 {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8], big: usize) -> Vec<Reply> {
        let mut parser = ReplyParser::<Reply>::with_big_bulk(big);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = parser.parse(&mut buf).expect("valid") {
            out.push(r);
        }
        assert!(buf.is_empty() && !parser.in_progress(), "left over");
        out
    }

    const EVERY_KIND: &[u8] = b"+OK\r\n-ERR bad\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n*2\r\n$1\r\na\r\n:1\r\n_\r\n,1.5\r\n#t\r\n%1\r\n+k\r\n:2\r\n~1\r\n+x\r\n=7\r\ntxt:abc\r\n|1\r\n+ttl\r\n:3\r\n:5\r\n>1\r\n+p\r\n*0\r\n(123\r\n!3\r\nbad\r\n";

    fn every_kind() -> Vec<Reply> {
        vec![
            Reply::status("OK"),
            Reply::error("ERR bad"),
            Reply::Int(42),
            Reply::bulk("abc"),
            Reply::Nil,
            Reply::NilArray,
            Reply::Array(vec![Reply::bulk("a"), Reply::Int(1)]),
            Reply::Nil,
            Reply::Double(1.5),
            Reply::Bool(true),
            Reply::Map(vec![(Reply::status("k"), Reply::Int(2))]),
            Reply::Set(vec![Reply::status("x")]),
            Reply::Verbatim(Bytes::from_static(b"abc")),
            Reply::Int(5),
            Reply::Array(vec![Reply::status("p")]),
            Reply::Array(Vec::new()),
            Reply::bulk("123"),
            Reply::error("bad"),
        ]
    }

    #[test]
    fn parses_resp2_and_resp3_replies() {
        assert_eq!(parse_all(EVERY_KIND, 1 << 20), every_kind());
        // Every payload through its own buffer gives the same replies.
        assert_eq!(parse_all(EVERY_KIND, 1), every_kind());
    }

    #[test]
    fn waits_for_the_whole_reply_at_every_cut() {
        for big in [1, 4, 1 << 20] {
            for cut in 0..EVERY_KIND.len() {
                let mut parser = ReplyParser::<Reply>::with_big_bulk(big);
                let mut buf = BytesMut::new();
                let mut out = Vec::new();
                for part in [&EVERY_KIND[..cut], &EVERY_KIND[cut..]] {
                    buf.extend_from_slice(part);
                    loop {
                        // Bytes for a big payload go where the parser asks.
                        if let Some(mut own) = parser.big_bulk_buffer() {
                            let n = own.remaining_mut().min(buf.len());
                            own.put_slice(&buf.split_to(n));
                        }
                        match parser.parse(&mut buf).expect("valid") {
                            Some(r) => out.push(r),
                            None => break,
                        }
                    }
                }
                assert_eq!(out, every_kind(), "cut at {cut}, big {big}");
            }
        }
    }

    #[test]
    fn a_big_payload_is_the_buffer_it_was_read_into() {
        let mut parser = ReplyParser::<Reply>::with_big_bulk(8);
        let mut buf = BytesMut::from(&b"$10\r\n0123"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        let mut own = parser.big_bulk_buffer().expect("own buffer");
        assert_eq!(own.remaining_mut(), 8, "exactly what is missing");
        own.put_slice(b"456789\r\n");
        let Some(Reply::Bulk(value)) = parser.parse(&mut buf).unwrap() else {
            panic!("a bulk")
        };
        assert_eq!(&value[..], b"0123456789");
        let at = value.as_ptr();
        parser.recycle(value);
        buf.extend_from_slice(b"$9\r\nabcdefghi\r\n");
        let Some(Reply::Bulk(again)) = parser.parse(&mut buf).unwrap() else {
            panic!("a bulk")
        };
        assert_eq!((&again[..], again.as_ptr()), (&b"abcdefghi"[..], at));
    }

    #[test]
    fn a_whole_reply_of_big_values_is_read_into_recycled_buffers() {
        let mut parser = ReplyParser::<Reply>::with_big_bulk(8);
        let reply = |n: usize| {
            let mut wire = format!("*{n}\r\n").into_bytes();
            for i in 0..n {
                wire.extend_from_slice(format!("$16\r\nvalue-{i:010}\r\n").as_bytes());
            }
            BytesMut::from(&wire[..])
        };
        let places = |r: Reply| -> Vec<Bytes> {
            r.into_array()
                .unwrap()
                .into_iter()
                .map(|v| match v {
                    Reply::Bulk(b) => b,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let first = places(parser.parse(&mut reply(32)).unwrap().unwrap());
        let mut at: Vec<_> = first.iter().map(|b| b.as_ptr()).collect();
        first.into_iter().for_each(|b| parser.recycle(b));
        let second = places(parser.parse(&mut reply(32)).unwrap().unwrap());
        let mut again: Vec<_> = second.iter().map(|b| b.as_ptr()).collect();
        at.sort();
        again.sort();
        assert_eq!(at, again, "all 32 buffers reused");
        // What is kept is bounded.
        for _ in 0..(SPARE_BYTES / (64 << 20)) + 4 {
            parser.recycle(Bytes::from(vec![0u8; 64 << 20]));
        }
        assert!(parser.spare_bytes <= SPARE_BYTES);
    }

    #[test]
    fn reads_little_between_the_big_values_of_a_reply() {
        let mut parser = ReplyParser::<Reply>::with_big_bulk(8);
        assert_eq!(parser.read_hint(), READ_CHUNK);
        let mut buf = BytesMut::from(&b"*2\r\n$10\r\n0123456789\r\n$10\r\n01"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        // The second value is open: its bytes go to its own buffer.
        assert!(parser.big_bulk_buffer().is_some());
        let mut buf = BytesMut::from(&b"*2\r\n$10\r\n0123456789\r\n"[..]);
        let mut parser = ReplyParser::<Reply>::with_big_bulk(8);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert_eq!(parser.read_hint(), HEADER_READ, "a header is next");
        buf.extend_from_slice(b"$1\r\nx\r\n");
        assert!(parser.parse(&mut buf).unwrap().is_some());
        assert_eq!(parser.read_hint(), READ_CHUNK, "the reply is whole");
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            &b"?\r\n"[..],
            b"$x\r\n",
            b"$-2\r\n",
            b"*01\r\n",
            b"\r\n",
            b"$3\r\nabcXY",
            b":1.5\r\n",
        ] {
            let mut parser = ReplyParser::<Reply>::new();
            assert!(
                parser.parse(&mut BytesMut::from(bad)).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        deep.extend_from_slice(b":1\r\n");
        let mut parser = ReplyParser::<Reply>::new();
        assert!(parser.parse(&mut BytesMut::from(&deep[..])).is_err());
        // An endless line is refused rather than buffered for ever.
        let long = vec![b'+'; MAX_LINE + 10];
        assert!(parser.parse(&mut BytesMut::from(&long[..])).is_err());
    }

    #[test]
    fn a_huge_announced_length_reserves_little_or_is_refused() {
        // Longer than the limit: a broken stream.
        for bad in [&b"$9223372036854775807\r\n"[..], b"$100000000000\r\n"] {
            let mut parser = ReplyParser::<Reply>::new();
            assert!(parser.parse(&mut BytesMut::from(bad)).is_err());
        }
        // Within it but not yet paid for: the buffer grows with the bytes.
        let mut parser = ReplyParser::<Reply>::new().with_max_bulk(usize::MAX);
        let mut buf = BytesMut::from(&b"$1000000000\r\nabc"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        let own = parser.big_bulk_buffer().expect("own buffer");
        assert!(own.get_ref().capacity() <= RESERVE_AHEAD + READ_CHUNK);
        assert_eq!(own.remaining_mut(), 1_000_000_000 - 3 + 2);
    }

    #[test]
    fn a_huge_announced_count_reserves_little() {
        let mut parser = ReplyParser::<Reply>::new();
        let mut buf = BytesMut::from(&b"*2147483647\r\n:1\r\n"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert!(parser.in_progress());
        assert!(parser.open[0].items.capacity() <= MAX_RESERVE);
    }
}
