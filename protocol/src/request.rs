//! Turning bytes from a client into commands (`Vec<Bytes>` of arguments).
//!
//! Three paths, one result:
//!
//! * **Fast path.** When a whole RESP array written canonically is already in
//!   the read buffer, one scan finds its arguments and they become slices of
//!   one frozen `Bytes`: no copy, no allocation but the argument list.
//! * **Streaming path.** A command that is still arriving is assembled one
//!   argument at a time, so a pipeline or a huge MSET never re-scans what was
//!   already parsed. A bulk argument of [`BIG_BULK`] bytes or more gets its own
//!   buffer of exactly its size, and the connection reads the rest of it
//!   straight into that buffer ([`RequestParser::big_bulk_buffer`]).
//! * **Inline commands** (`PING\r\n`, what telnet and `redis-cli` in some
//!   modes send), split with Redis's quoting rules (see [`super::inline`]).
//!
//! Violations get Redis's exact error text and close the connection, as Redis
//! does (`Protocol error: invalid bulk length`, ...).

use bytes::{Buf, Bytes, BytesMut};

use super::inline::split_inline_args;

/// Arguments at least this large are read into a buffer of their exact size.
pub const BIG_BULK: usize = 32 * 1024;
/// Most elements one multibulk request may declare: Redis 7 accepts up to
/// `INT_MAX` (memory for the arguments grows as they arrive, not up front).
pub const MAX_MULTIBULK: usize = i32::MAX as usize;
/// Longest inline command, and longest `*N` / `$N` header line.
pub const MAX_INLINE: usize = 64 * 1024;
/// Unauthenticated clients may not send more elements than this...
const UNAUTH_MAX_MULTIBULK: usize = 10;
/// Bookkeeping counted per argument held (a `Bytes` and its allocation's
/// header), so a million one-byte arguments count as what they take.
const ARG_OVERHEAD: usize = 48;
/// ...nor bulk arguments longer than this (Redis's limits, against DoS).
const UNAUTH_MAX_BULK: usize = 16 * 1024;

/// A request that cannot be parsed. Redis answers `-ERR <message>` and closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(msg: impl Into<String>) -> Self {
        ProtocolError(msg.into())
    }
}

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The arguments, the command name first.
    pub args: Vec<Bytes>,
    /// Whether it came as an inline command rather than a RESP array.
    pub inline: bool,
}

enum State {
    /// Between commands.
    Idle,
    /// Inside a multibulk: `remaining` arguments still to come.
    Args { remaining: usize, args: Vec<Bytes> },
    /// Inside a small bulk argument whose `$len` header was consumed.
    SmallBulk {
        len: usize,
        remaining: usize,
        args: Vec<Bytes>,
    },
    /// Inside a big bulk argument being read into its own buffer (`len`
    /// payload bytes plus the trailing CRLF).
    BigBulk {
        buf: BytesMut,
        len: usize,
        remaining: usize,
        args: Vec<Bytes>,
    },
}

/// Incremental RESP2/inline request parser for one connection.
pub struct RequestParser {
    state: State,
    max_bulk: usize,
    /// Memory held by the arguments of the command being received (its
    /// bytes plus a per-argument overhead), big bulk in progress excluded.
    pending: usize,
    /// When set, the stricter limits for clients that have not authenticated.
    unauthenticated: bool,
    /// An empty argument list handed back by the caller
    /// ([`RequestParser::recycle`]), reused for the next request: most
    /// requests then cost no allocation for their list.
    spare: Vec<Bytes>,
}

/// Argument lists longer than this are not kept for reuse.
const SPARE_MAX: usize = 64;
/// Requests of up to this many arguments are cut in the fast path's one
/// scan (their places kept on the stack); longer ones are scanned twice.
const ONE_SCAN_MAX: usize = 8;

impl RequestParser {
    /// A parser that accepts bulk arguments of up to `max_bulk` bytes.
    pub fn new(max_bulk: usize) -> Self {
        RequestParser {
            state: State::Idle,
            max_bulk,
            pending: 0,
            unauthenticated: false,
            spare: Vec::new(),
        }
    }

    /// Takes back a request's argument list once the command is done with
    /// it: emptied and kept (unless long), the next request's arguments go
    /// into it without an allocation.
    pub fn recycle(&mut self, mut args: Vec<Bytes>) {
        if args.capacity() <= SPARE_MAX && args.capacity() > self.spare.capacity() {
            args.clear();
            self.spare = args;
        }
    }

    /// An empty list with room for `count` arguments: the spare one when
    /// it has the room, else a new one with room for a short request at
    /// least (so that it can serve the next one).
    fn new_args(&mut self, count: usize) -> Vec<Bytes> {
        if self.spare.capacity() >= count {
            std::mem::take(&mut self.spare)
        } else {
            Vec::with_capacity(count.max(ONE_SCAN_MAX))
        }
    }

    /// Changes `proto-max-bulk-len` for requests that start from now on.
    pub fn set_max_bulk(&mut self, max_bulk: usize) {
        self.max_bulk = max_bulk;
    }

    /// Applies Redis's smaller limits to clients that still have to AUTH.
    pub fn set_unauthenticated(&mut self, unauthenticated: bool) {
        self.unauthenticated = unauthenticated;
    }

    /// While a big argument is arriving: the buffer to read its bytes into
    /// (its capacity is exactly what is missing), so they skip the read
    /// buffer. `None` otherwise.
    pub fn big_bulk_buffer(&mut self) -> Option<&mut BytesMut> {
        match &mut self.state {
            State::BigBulk { buf, .. } if buf.len() < buf.capacity() => Some(buf),
            _ => None,
        }
    }

    /// Memory the command still being received holds: its arguments so
    /// far (bytes and bookkeeping) and the part of a big argument read yet.
    /// What `client-query-buffer-limit` and `maxmemory-clients` bound.
    pub fn pending_bytes(&self) -> usize {
        self.pending
            + match &self.state {
                State::BigBulk { buf, .. } => buf.len(),
                _ => 0,
            }
    }

    /// Whether a command is partly parsed (so EOF now would cut it).
    pub fn in_progress(&self) -> bool {
        !matches!(self.state, State::Idle)
    }

    /// Parses the next complete command out of `buf`, consuming its bytes.
    /// `Ok(None)` means more bytes are needed.
    pub fn parse(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ProtocolError> {
        loop {
            match std::mem::replace(&mut self.state, State::Idle) {
                State::Idle => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    if buf[0] != b'*' {
                        match parse_inline(buf)? {
                            Some(args) if args.is_empty() => continue,
                            Some(args) => return Ok(Some(Request { args, inline: true })),
                            None => return Ok(None),
                        }
                    }
                    if let Some(args) = self.fast_path(buf) {
                        if args.is_empty() {
                            continue;
                        }
                        return Ok(Some(Request {
                            args,
                            inline: false,
                        }));
                    }
                    let Some((line, used)) = header_line(buf, "mbulk count")? else {
                        return Ok(None);
                    };
                    let count = parse_len(&line[1..]);
                    buf.advance(used);
                    let count = match count {
                        Some(n) if n <= 0 => continue,
                        Some(n) if (n as usize) <= MAX_MULTIBULK => n as usize,
                        _ => {
                            return Err(ProtocolError::new(
                                "Protocol error: invalid multibulk length",
                            ))
                        }
                    };
                    if self.unauthenticated && count > UNAUTH_MAX_MULTIBULK {
                        return Err(ProtocolError::new(
                            "Protocol error: unauthenticated multibulk length",
                        ));
                    }
                    self.state = State::Args {
                        remaining: count,
                        args: self.new_args(count.min(1024)),
                    };
                }
                State::Args { remaining: 0, args } => {
                    self.pending = 0;
                    return Ok(Some(Request {
                        args,
                        inline: false,
                    }));
                }
                State::Args { remaining, args } => {
                    if buf.is_empty() {
                        self.state = State::Args { remaining, args };
                        return Ok(None);
                    }
                    if buf[0] != b'$' {
                        return Err(ProtocolError::new(format!(
                            "Protocol error: expected '$', got '{}'",
                            buf[0] as char
                        )));
                    }
                    let Some((line, used)) = header_line(buf, "bulk count")? else {
                        self.state = State::Args { remaining, args };
                        return Ok(None);
                    };
                    let len = match parse_len(&line[1..]) {
                        Some(n) if n >= 0 && (n as u64) <= self.max_bulk as u64 => n as usize,
                        // Redis's words, then the limit, so a client that
                        // sent too much learns which setting refused it.
                        Some(n) if n >= 0 => {
                            return Err(ProtocolError::new(format!(
                                "Protocol error: invalid bulk length ({n} bytes, over \
                                 proto-max-bulk-len {})",
                                self.max_bulk
                            )))
                        }
                        _ => return Err(ProtocolError::new("Protocol error: invalid bulk length")),
                    };
                    if self.unauthenticated && len > UNAUTH_MAX_BULK {
                        return Err(ProtocolError::new(
                            "Protocol error: unauthenticated bulk length",
                        ));
                    }
                    buf.advance(used);
                    let remaining = remaining - 1;
                    if len >= BIG_BULK {
                        let mut big = BytesMut::with_capacity(len + 2);
                        let take = buf.len().min(len + 2);
                        big.extend_from_slice(&buf[..take]);
                        buf.advance(take);
                        self.state = State::BigBulk {
                            buf: big,
                            len,
                            remaining,
                            args,
                        };
                    } else {
                        self.state = State::SmallBulk {
                            len,
                            remaining,
                            args,
                        };
                    }
                }
                State::SmallBulk {
                    len,
                    remaining,
                    mut args,
                } => {
                    if buf.len() < len + 2 {
                        self.state = State::SmallBulk {
                            len,
                            remaining,
                            args,
                        };
                        return Ok(None);
                    }
                    // Copied: a slice would pin the whole read buffer while
                    // the rest of the command arrives.
                    args.push(Bytes::copy_from_slice(&buf[..len]));
                    self.pending += len + ARG_OVERHEAD;
                    // Like Redis, the two bytes after the payload are skipped
                    // without checking that they are CRLF.
                    buf.advance(len + 2);
                    self.state = State::Args { remaining, args };
                }
                State::BigBulk {
                    buf: mut big,
                    len,
                    remaining,
                    mut args,
                } => {
                    let missing = len + 2 - big.len();
                    if missing > 0 && !buf.is_empty() {
                        let take = buf.len().min(missing);
                        big.extend_from_slice(&buf[..take]);
                        buf.advance(take);
                    }
                    if big.len() < len + 2 {
                        self.state = State::BigBulk {
                            buf: big,
                            len,
                            remaining,
                            args,
                        };
                        return Ok(None);
                    }
                    big.truncate(len);
                    args.push(big.freeze());
                    self.pending += len + ARG_OVERHEAD;
                    self.state = State::Args { remaining, args };
                }
            }
        }
    }

    /// A whole array of bulk strings at the front of `buf`, every length
    /// written canonically (`*3\r\n$3\r\nSET\r\n...`): its arguments as
    /// slices of one frozen `Bytes`, no copy. `None` sends the request down
    /// the streaming path (incomplete, malformed, non-canonical or over a
    /// limit), which produces Redis's exact errors.
    ///
    /// One scan checks the frame, finds its end and, for up to
    /// [`ONE_SCAN_MAX`] arguments, notes where each is; a longer request is
    /// cut in a second scan over the frozen frame (re-reading a few digits
    /// is cheaper than keeping its ranges in an allocation).
    fn fast_path(&mut self, buf: &mut BytesMut) -> Option<Vec<Bytes>> {
        let (max_count, max_bulk) = if self.unauthenticated {
            (UNAUTH_MAX_MULTIBULK, UNAUTH_MAX_BULK.min(self.max_bulk))
        } else {
            (MAX_MULTIBULK, self.max_bulk)
        };
        let (count, mut at) = canonical_header(buf, 0, b'*')?;
        if count == 0 || count > max_count {
            return None;
        }
        // Where each argument is, for short requests (the common ones): no
        // second scan.
        let mut spans = [(0usize, 0usize); ONE_SCAN_MAX];
        for i in 0..count {
            let (len, payload) = canonical_header(buf, at, b'$')?;
            if len > max_bulk {
                return None;
            }
            let end = payload.checked_add(len)?;
            if buf.get(end..end + 2)? != b"\r\n" {
                return None;
            }
            if let Some(span) = spans.get_mut(i) {
                *span = (payload, len);
            }
            at = end + 2;
        }
        let frame = buf.split_to(at).freeze();
        let mut args = self.new_args(count);
        // Big arguments own their memory, so a stored value never pins a
        // read buffer.
        let cut = |payload: usize, len: usize| {
            if len >= BIG_BULK {
                Bytes::copy_from_slice(&frame[payload..payload + len])
            } else {
                frame.slice(payload..payload + len)
            }
        };
        if count <= ONE_SCAN_MAX {
            args.extend(
                spans[..count]
                    .iter()
                    .map(|&(payload, len)| cut(payload, len)),
            );
        } else {
            let (_, mut at) = canonical_header(&frame, 0, b'*')?;
            for _ in 0..count {
                let (len, payload) = canonical_header(&frame, at, b'$')?;
                args.push(cut(payload, len));
                at = payload + len + 2;
            }
        }
        Some(args)
    }
}

/// A canonical header line at `at` (`kind`, then a decimal number with no
/// sign and no leading zero, then CRLF): the number and where the line
/// ends. `None` for anything else, or when the line is not all there.
fn canonical_header(buf: &[u8], at: usize, kind: u8) -> Option<(usize, usize)> {
    /// Digits a length may have here (larger ones go the streaming way).
    const MAX_DIGITS: usize = 18;
    if *buf.get(at)? != kind {
        return None;
    }
    let digits = at + 1;
    let mut n: usize = 0;
    let mut i = digits;
    loop {
        let b = *buf.get(i)?;
        match b {
            b'0'..=b'9' if i - digits < MAX_DIGITS => {
                if b == b'0' && i == digits && buf.get(i + 1) != Some(&b'\r') {
                    return None;
                }
                n = n * 10 + (b - b'0') as usize;
                i += 1;
            }
            b'\r' if i > digits => {
                return (*buf.get(i + 1)? == b'\n').then_some((n, i + 2));
            }
            _ => return None,
        }
    }
}

/// The header line (`*N` or `$N`) at the front of `buf`, up to its `\r`, and
/// how many bytes it spans with its CRLF. Like Redis, the line ends at the
/// first `\r` and the byte after it is taken as `\n`.
fn header_line<'a>(
    buf: &'a BytesMut,
    what: &str,
) -> Result<Option<(&'a [u8], usize)>, ProtocolError> {
    let window = &buf[..buf.len().min(MAX_INLINE + 1)];
    match window.iter().position(|&b| b == b'\r') {
        Some(cr) if cr + 1 < buf.len() => Ok(Some((&buf[..cr], cr + 2))),
        Some(_) => Ok(None),
        None if buf.len() > MAX_INLINE => Err(ProtocolError::new(format!(
            "Protocol error: too big {what} string"
        ))),
        None => Ok(None),
    }
}

/// Parses a length the way Redis's `string2ll` does: optional `-`, digits,
/// no leading zeros (except "0"), no spaces, must fit an i64.
pub fn parse_len(digits: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(digits).ok()?;
    crate::integer::parse_i64_strict(s.as_bytes())
}

/// An inline command at the front of `buf`: `Ok(None)` until its newline.
fn parse_inline(buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_INLINE {
            return Err(ProtocolError::new("Protocol error: too big inline request"));
        }
        return Ok(None);
    };
    if newline > MAX_INLINE {
        return Err(ProtocolError::new("Protocol error: too big inline request"));
    }
    let mut line = &buf[..newline];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    let args = split_inline_args(line)
        .ok_or_else(|| ProtocolError::new("Protocol error: unbalanced quotes in request"))?;
    buf.advance(newline + 1);
    Ok(Some(args.into_iter().map(Bytes::from).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut parser = RequestParser::new(512 * 1024 * 1024);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(req) = parser.parse(&mut buf)? {
            out.push(req.args.iter().map(|a| a.to_vec()).collect());
        }
        Ok(out)
    }

    /// Feeds `input` one byte at a time, the worst case for the streaming path.
    fn parse_bytewise(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut parser = RequestParser::new(512 * 1024 * 1024);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Some(req) = parser.parse(&mut buf)? {
                out.push(req.args.iter().map(|a| a.to_vec()).collect());
            }
        }
        Ok(out)
    }

    fn strs(cmds: &[&[&str]]) -> Vec<Vec<Vec<u8>>> {
        cmds.iter()
            .map(|c| c.iter().map(|a| a.as_bytes().to_vec()).collect())
            .collect()
    }

    #[test]
    fn pipeline_whole_and_bytewise() {
        let input =
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n";
        let want = strs(&[&["SET", "k", "hello"], &["GET", "k"], &["PING"]]);
        assert_eq!(parse_all(input).unwrap(), want);
        assert_eq!(parse_bytewise(input).unwrap(), want);
    }

    #[test]
    fn lengths_are_read_like_string2ll() {
        // The fast path (whole request in the buffer) and the streaming path
        // (byte by byte) refuse the same headers.
        for (input, error) in [
            (&b"*+1\r\n$4\r\nPING\r\n"[..], "invalid multibulk length"),
            (b"*01\r\n$4\r\nPING\r\n", "invalid multibulk length"),
            (b"*1\r\n$04\r\nPING\r\n", "invalid bulk length"),
            (b"*1\r\n$+4\r\nPING\r\n", "invalid bulk length"),
        ] {
            let want = format!("Protocol error: {error}");
            assert_eq!(parse_all(input).unwrap_err().0, want);
            assert_eq!(parse_bytewise(input).unwrap_err().0, want);
        }
        // Redis accepts up to INT_MAX elements.
        let mut parser = RequestParser::new(1 << 20);
        let mut buf = BytesMut::from(&b"*3000000\r\n"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert!(parser.in_progress());
    }

    #[test]
    fn empty_multibulk_is_ignored() {
        assert_eq!(
            parse_all(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n").unwrap(),
            strs(&[&["PING"]])
        );
    }

    #[test]
    fn big_bulk_goes_to_its_own_buffer() {
        let value = vec![b'x'; BIG_BULK + 10];
        let mut input = format!("*2\r\n$4\r\nECHO\r\n${}\r\n", value.len()).into_bytes();
        let mut parser = RequestParser::new(1 << 30);
        let mut buf = BytesMut::from(&input[..]);
        assert!(parser.parse(&mut buf).unwrap().is_none());
        // The connection now reads straight into the exact-size buffer.
        let big = parser.big_bulk_buffer().expect("streaming a big argument");
        assert_eq!(big.capacity(), value.len() + 2);
        big.extend_from_slice(&value);
        big.extend_from_slice(b"\r\n");
        let req = parser.parse(&mut buf).unwrap().unwrap();
        assert_eq!(req.args[1].len(), value.len());
        input.extend_from_slice(&value);
        input.extend_from_slice(b"\r\n");
        assert_eq!(parse_bytewise(&input).unwrap()[0][1], value);
    }

    #[test]
    fn errors_use_redis_text() {
        let err = |input: &[u8]| parse_all(input).unwrap_err().0;
        assert_eq!(
            err(b"*1\r\n:5\r\n"),
            "Protocol error: expected '$', got ':'"
        );
        assert_eq!(err(b"*1\r\n$-5\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(
            err(b"*1\r\n$abc\r\n"),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(err(b"*abc\r\n"), "Protocol error: invalid multibulk length");
        assert_eq!(
            err(b"*2147483648\r\n"),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(parse_all(b"*2147483647\r\n").unwrap(), strs(&[]));
        assert_eq!(
            err(b"*2\r\n$999999999999\r\n"),
            "Protocol error: invalid bulk length (999999999999 bytes, over proto-max-bulk-len \
             536870912)"
        );
        assert_eq!(
            err(b"SET \"unterminated\r\n"),
            "Protocol error: unbalanced quotes in request"
        );
        let long = vec![b'a'; MAX_INLINE + 2];
        assert_eq!(err(&long), "Protocol error: too big inline request");
        let mut long_header = b"*".to_vec();
        long_header.extend(std::iter::repeat_n(b'1', MAX_INLINE + 2));
        assert_eq!(
            err(&long_header),
            "Protocol error: too big mbulk count string"
        );
    }

    #[test]
    fn lengths_must_be_canonical_on_every_path() {
        let err = |input: &[u8]| parse_all(input).unwrap_err().0;
        assert_eq!(
            err(b"*1\r\n$+4\r\nPING\r\n"),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(
            err(b"*1\r\n$04\r\nPING\r\n"),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(
            err(b"*01\r\n$4\r\nPING\r\n"),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(
            parse_all(b"*1\r\n$10\r\n0123456789\r\n").unwrap(),
            strs(&[&["0123456789"]])
        );
    }

    #[test]
    fn canonical_headers() {
        assert_eq!(canonical_header(b"*3\r\n", 0, b'*'), Some((3, 4)));
        assert_eq!(canonical_header(b"xx$0\r\n", 2, b'$'), Some((0, 6)));
        assert_eq!(canonical_header(b"$10\r\n", 0, b'$'), Some((10, 5)));
        for bad in [
            &b"$01\r\n"[..],
            b"$\r\n",
            b"$-1\r\n",
            b"$+1\r\n",
            b"$1 \r\n",
            b"$1\rx",
            b"*1\r\n",
            b"$1234567890123456789\r\n",
        ] {
            assert_eq!(canonical_header(bad, 0, b'$'), None, "{bad:?}");
        }
        // Not all there yet.
        assert_eq!(canonical_header(b"$12", 0, b'$'), None);
        assert_eq!(canonical_header(b"$12\r", 0, b'$'), None);
    }

    #[test]
    fn fast_path_cuts_one_frame_and_agrees_with_streaming() {
        let mut parser = RequestParser::new(1 << 30);
        let mut rng = 7u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _ in 0..300 {
            let args: Vec<Vec<u8>> = (0..1 + next(6))
                .map(|_| {
                    let len = [0, 1, 9, 10, 99, 100, 1000][next(7) as usize];
                    (0..len).map(|_| next(256) as u8).collect()
                })
                .collect();
            let mut input = format!("*{}\r\n", args.len()).into_bytes();
            for a in &args {
                input.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                input.extend_from_slice(a);
                input.extend_from_slice(b"\r\n");
            }
            input.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            let mut buf = BytesMut::from(&input[..]);
            let fast = parser.fast_path(&mut buf).expect("a canonical frame");
            assert_eq!(fast, args);
            assert_eq!(&buf[..], b"*1\r\n$4\r\nPING\r\n");
            let mut want = vec![args.clone()];
            want.push(vec![b"PING".to_vec()]);
            assert_eq!(parse_bytewise(&input).unwrap(), want);
            // Cut anywhere, the frame is not taken.
            let cut = next(input.len() as u64 - 14) as usize;
            let mut part = BytesMut::from(&input[..cut]);
            assert!(parser.fast_path(&mut part).is_none());
            assert_eq!(part.len(), cut);
        }
    }

    #[test]
    fn max_bulk_is_enforced_and_named() {
        let mut parser = RequestParser::new(4);
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n"[..]);
        assert_eq!(
            parser.parse(&mut buf).unwrap_err().0,
            "Protocol error: invalid bulk length (5 bytes, over proto-max-bulk-len 4)"
        );
    }

    #[test]
    fn unauthenticated_limits() {
        let mut parser = RequestParser::new(1 << 20);
        parser.set_unauthenticated(true);
        let mut buf = BytesMut::from(&b"*11\r\n"[..]);
        assert_eq!(
            parser.parse(&mut buf).unwrap_err().0,
            "Protocol error: unauthenticated multibulk length"
        );
    }

    #[test]
    fn inline_quoting() {
        assert_eq!(
            parse_all(b"set \"a b\" 'c d'\r\nget \"\\x41\\n\"\n").unwrap(),
            strs(&[&["set", "a b", "c d"], &["get", "A\n"]])
        );
        assert_eq!(parse_all(b"\r\n  \r\nPING\n").unwrap(), strs(&[&["PING"]]));
    }

    #[test]
    fn pending_bytes_count_the_command_still_arriving() {
        let mut p = RequestParser::new(512 << 20);
        let mut buf = BytesMut::from(&b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n"[..]);
        assert_eq!(p.parse(&mut buf).unwrap(), None);
        assert_eq!(p.pending_bytes(), 3 + 1 + 2 * ARG_OVERHEAD);
        // Half of a big argument counts as what has arrived of it.
        let big = vec![b'x'; BIG_BULK * 2];
        buf.extend_from_slice(format!("${}\r\n", big.len()).as_bytes());
        buf.extend_from_slice(&big[..BIG_BULK]);
        assert_eq!(p.parse(&mut buf).unwrap(), None);
        assert_eq!(p.pending_bytes(), 4 + 2 * ARG_OVERHEAD + BIG_BULK);
        buf.extend_from_slice(&big[BIG_BULK..]);
        buf.extend_from_slice(b"\r\n$1\r\nz\r\n");
        assert!(p.parse(&mut buf).unwrap().is_some());
        assert_eq!(p.pending_bytes(), 0);
    }

    #[test]
    fn a_recycled_argument_list_is_reused() {
        let mut p = RequestParser::new(512 << 20);
        let mut buf = BytesMut::from(
            &b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"[..],
        );
        let first = p.parse(&mut buf).unwrap().unwrap().args;
        let (place, room) = (first.as_ptr(), first.capacity());
        assert!(room >= 3, "room for the next request too");
        p.recycle(first);
        let second = p.parse(&mut buf).unwrap().unwrap().args;
        assert_eq!(second.as_ptr(), place);
        assert_eq!(
            second,
            vec![Bytes::from("SET"), Bytes::from("k"), Bytes::from("v")]
        );
        // A long list is not kept.
        p.recycle(vec![Bytes::new(); 1000]);
        assert!(p.spare.capacity() <= SPARE_MAX);
    }
}
