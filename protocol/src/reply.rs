//! Replies, and their encoding as RESP2 or RESP3 into a [`ReplyBuf`].
//!
//! A `ReplyBuf` is a queue of byte chunks written with one vectored write:
//! small replies are copied into a scratch buffer, while a value of
//! [`ZERO_COPY_MIN`] bytes or more is queued as the stored `Bytes` handle
//! itself, so a 2 MiB block goes from the store to the socket without a copy.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

/// Values at least this long are written by reference, not copied.
pub const ZERO_COPY_MIN: usize = 16 * 1024;
/// Most chunks handed to one `writev`.
const MAX_IOVECS: usize = 64;

/// A reply to one command, independent of the protocol version.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+text`
    Status(Cow<'static, str>),
    /// `-text`; the text starts with the error code (`ERR`, `WRONGTYPE`, ...).
    Error(Cow<'static, str>),
    /// `:n`
    Int(i64),
    /// `$len` + bytes
    Bulk(Bytes),
    /// The null bulk string (RESP3 `_`).
    Nil,
    /// The null array (RESP3 `_`).
    NilArray,
    /// `*n` + elements
    Array(Vec<Reply>),
    /// RESP3 `%n` map; a flat array of pairs in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `~n` set; an array in RESP2.
    Set(Vec<Reply>),
    /// RESP3 `,` double; a bulk string in RESP2.
    Double(f64),
    /// RESP3 `#t`/`#f`; `:1`/`:0` in RESP2.
    Bool(bool),
    /// RESP3 `=` verbatim text (`txt:`); a bulk string in RESP2.
    Verbatim(Bytes),
    /// Nothing at all goes on the wire (SHUTDOWN closes without a reply).
    Silent,
    /// A value still being read from the spill tier; the connection awaits
    /// it ([`Reply::resolve`]) before writing. Resolves to a bulk string, or
    /// to nil if the block failed its checksum.
    Pending(PendingValue),
    /// An array of values of which only the leading present ones count
    /// (MGETPREFIX): after resolving, it is cut at the first nil.
    PrefixOf(Vec<Reply>),
    /// The reply of a command forwarded to another cluster node; the
    /// connection awaits it, in order with the rest.
    Remote(RemoteReply),
}

/// A reply on its way from a peer node.
#[derive(Clone)]
pub struct RemoteReply(Arc<Mutex<Option<RemoteWait>>>);

/// The receiving end of a forwarded command and the peer's name.
type RemoteWait = (oneshot::Receiver<Reply>, Arc<str>);

impl RemoteReply {
    /// Wraps the receiving end of a forwarded command; `node` names the
    /// peer in the error a lost connection gives.
    pub fn new(rx: oneshot::Receiver<Reply>, node: Arc<str>) -> RemoteReply {
        RemoteReply(Arc::new(Mutex::new(Some((rx, node)))))
    }

    /// The peer's reply, or an error if it never came.
    pub async fn wait(&self) -> Reply {
        let Some((rx, node)) = self.0.lock().ok().and_then(|mut g| g.take()) else {
            return Reply::error("ERR cluster: reply already taken");
        };
        rx.await.unwrap_or_else(|_| {
            Reply::error(format!(
                "TRYAGAIN cluster node {node} did not answer; the command may or may not have run"
            ))
        })
    }
}

impl std::fmt::Debug for RemoteReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteReply")
    }
}

impl PartialEq for RemoteReply {
    fn eq(&self, other: &RemoteReply) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A value on its way from disk: shared so a reply can be cloned, taken
/// once when resolved.
#[derive(Clone)]
pub struct PendingValue(Arc<Mutex<Option<oneshot::Receiver<Option<Bytes>>>>>);

impl PendingValue {
    /// Wraps the receiving end of a disk read.
    pub fn new(rx: oneshot::Receiver<Option<Bytes>>) -> PendingValue {
        PendingValue(Arc::new(Mutex::new(Some(rx))))
    }

    /// The value, once read (`None`: checksum failure, I/O error).
    pub async fn wait(&self) -> Option<Bytes> {
        let rx = self.0.lock().ok()?.take()?;
        rx.await.ok().flatten()
    }
}

impl std::fmt::Debug for PendingValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingValue")
    }
}

impl PartialEq for PendingValue {
    fn eq(&self, other: &PendingValue) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Reply {
    /// `+OK`
    pub const fn ok() -> Reply {
        Reply::Status(Cow::Borrowed("OK"))
    }

    /// An error reply; `msg` must start with its code, e.g. `ERR syntax error`.
    pub fn error(msg: impl Into<Cow<'static, str>>) -> Reply {
        Reply::Error(msg.into())
    }

    /// A bulk string copied from `s`.
    pub fn bulk(s: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_ref()))
    }

    /// A bulk string from a `'static` slice (no copy).
    pub const fn bulk_static(s: &'static [u8]) -> Reply {
        Reply::Bulk(Bytes::from_static(s))
    }

    /// A simple status from a `'static` string.
    pub const fn status(s: &'static str) -> Reply {
        Reply::Status(Cow::Borrowed(s))
    }

    /// A simple status from an owned string.
    pub fn status_owned(s: String) -> Reply {
        Reply::Status(Cow::Owned(s))
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The elements, if this is an array (or a set).
    pub fn into_array(self) -> Option<Vec<Reply>> {
        match self {
            Reply::Array(items) | Reply::Set(items) => Some(items),
            _ => None,
        }
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Whether part of the reply still waits for the disk.
    pub fn has_pending(&self) -> bool {
        match self {
            Reply::Pending(_) | Reply::PrefixOf(_) | Reply::Remote(_) => true,
            Reply::Array(items) | Reply::Set(items) => items.iter().any(Reply::has_pending),
            Reply::Map(pairs) => pairs
                .iter()
                .any(|(k, v)| k.has_pending() || v.has_pending()),
            _ => false,
        }
    }

    /// The reply with every pending value read.
    pub fn resolve(self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Reply>>> {
        Box::pin(async move {
            match self {
                Reply::Pending(p) => p.wait().await.map_or(Reply::Nil, Reply::Bulk),
                Reply::Remote(r) => r.wait().await,
                Reply::PrefixOf(items) => {
                    let mut out = Vec::with_capacity(items.len());
                    for item in items {
                        let item = item.resolve().await;
                        if item == Reply::Nil {
                            break;
                        }
                        out.push(item);
                    }
                    Reply::Array(out)
                }
                Reply::Array(items) => {
                    let mut out = Vec::with_capacity(items.len());
                    for item in items {
                        out.push(item.resolve().await);
                    }
                    Reply::Array(out)
                }
                other => other,
            }
        })
    }
}

impl From<i64> for Reply {
    fn from(n: i64) -> Reply {
        Reply::Int(n)
    }
}

impl From<Bytes> for Reply {
    fn from(b: Bytes) -> Reply {
        Reply::Bulk(b)
    }
}

impl From<Option<Bytes>> for Reply {
    fn from(b: Option<Bytes>) -> Reply {
        b.map_or(Reply::Nil, Reply::Bulk)
    }
}

/// Pending output of one connection.
#[derive(Default)]
pub struct ReplyBuf {
    /// Sealed chunks, written before `scratch`.
    chunks: VecDeque<Bytes>,
    /// Where small replies are encoded.
    scratch: BytesMut,
    /// Bytes in `chunks` (not yet written).
    chunk_bytes: usize,
}

impl ReplyBuf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes waiting to be written.
    pub fn pending(&self) -> usize {
        self.chunk_bytes + self.scratch.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// Encodes `reply` in RESP3 when `resp3`, RESP2 otherwise.
    pub fn push(&mut self, reply: &Reply, resp3: bool) {
        self.encode(reply, resp3);
    }

    /// Appends raw, already-encoded bytes.
    pub fn push_raw(&mut self, raw: &[u8]) {
        self.scratch.extend_from_slice(raw);
    }

    /// Encodes a command: an array of bulk strings, big arguments queued by
    /// reference like big values.
    pub fn push_command(&mut self, args: &[Bytes]) {
        self.put_header(b'*', args.len() as i64);
        for a in args {
            self.put_bulk(a);
        }
    }

    fn encode(&mut self, reply: &Reply, resp3: bool) {
        match reply {
            Reply::Status(s) => {
                self.scratch.put_u8(b'+');
                put_line_safe(&mut self.scratch, s.as_bytes());
            }
            Reply::Error(s) => {
                self.scratch.put_u8(b'-');
                put_line_safe(&mut self.scratch, s.as_bytes());
            }
            Reply::Int(n) => self.put_header(b':', *n),
            Reply::Bulk(b) => self.put_bulk(b),
            Reply::Verbatim(b) if resp3 => {
                self.put_header(b'=', b.len() as i64 + 4);
                self.scratch.extend_from_slice(b"txt:");
                self.put_payload(b);
            }
            Reply::Verbatim(b) => self.put_bulk(b),
            Reply::Silent => {}
            // Resolved before encoding; should one slip through, it reads as
            // a miss rather than as wrong bytes.
            Reply::Pending(_) | Reply::Remote(_) => {
                self.scratch
                    .extend_from_slice(if resp3 { b"_\r\n" } else { b"$-1\r\n" })
            }
            Reply::PrefixOf(items) => {
                let present: Vec<&Reply> = items
                    .iter()
                    .take_while(|r| matches!(r, Reply::Bulk(_)))
                    .collect();
                self.put_header(b'*', present.len() as i64);
                for r in present {
                    self.encode(r, resp3);
                }
            }
            Reply::Nil | Reply::NilArray if resp3 => self.scratch.extend_from_slice(b"_\r\n"),
            Reply::Nil => self.scratch.extend_from_slice(b"$-1\r\n"),
            Reply::NilArray => self.scratch.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                self.put_header(b'*', items.len() as i64);
                items.iter().for_each(|r| self.encode(r, resp3));
            }
            Reply::Set(items) => {
                self.put_header(if resp3 { b'~' } else { b'*' }, items.len() as i64);
                items.iter().for_each(|r| self.encode(r, resp3));
            }
            Reply::Map(pairs) => {
                if resp3 {
                    self.put_header(b'%', pairs.len() as i64);
                } else {
                    self.put_header(b'*', pairs.len() as i64 * 2);
                }
                for (k, v) in pairs {
                    self.encode(k, resp3);
                    self.encode(v, resp3);
                }
            }
            Reply::Double(d) if resp3 => {
                self.scratch.put_u8(b',');
                self.scratch.extend_from_slice(format_double(*d).as_bytes());
                self.scratch.extend_from_slice(b"\r\n");
            }
            Reply::Double(d) => self.put_bulk(&Bytes::from(format_double(*d))),
            Reply::Bool(b) => {
                let text: &[u8] = match (resp3, b) {
                    (true, true) => b"#t\r\n",
                    (true, false) => b"#f\r\n",
                    (false, true) => b":1\r\n",
                    (false, false) => b":0\r\n",
                };
                self.scratch.extend_from_slice(text);
            }
        }
    }

    fn put_header(&mut self, kind: u8, n: i64) {
        self.scratch.put_u8(kind);
        put_int(&mut self.scratch, n);
        self.scratch.extend_from_slice(b"\r\n");
    }

    fn put_bulk(&mut self, b: &Bytes) {
        self.put_header(b'$', b.len() as i64);
        self.put_payload(b);
    }

    /// The payload of a bulk value plus its CRLF: copied when small, queued
    /// by reference when large.
    fn put_payload(&mut self, b: &Bytes) {
        if b.len() >= ZERO_COPY_MIN {
            self.seal();
            self.chunk_bytes += b.len();
            self.chunks.push_back(b.clone());
        } else {
            self.scratch.extend_from_slice(b);
        }
        self.scratch.extend_from_slice(b"\r\n");
    }

    /// Moves `scratch` into the chunk queue.
    fn seal(&mut self) {
        if !self.scratch.is_empty() {
            self.chunk_bytes += self.scratch.len();
            self.chunks.push_back(self.scratch.split().freeze());
        }
    }

    /// Takes everything pending as one contiguous `Vec` (tests, forwarding).
    pub fn take_bytes(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.pending());
        for c in self.chunks.drain(..) {
            out.extend_from_slice(&c);
        }
        out.extend_from_slice(&self.scratch);
        self.scratch.clear();
        self.chunk_bytes = 0;
        out
    }

    /// Writes everything pending with vectored writes.
    pub async fn write_to<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> io::Result<()> {
        while !self.is_empty() {
            self.write_once(w).await?;
        }
        // A TLS stream may hold records the socket did not take yet (a
        // plain socket's flush does nothing).
        w.flush().await
    }

    /// One write of what is pending (as much as the socket takes); the
    /// bytes written. The caller loops, and may watch each write for
    /// progress (a client that stopped reading).
    pub async fn write_once<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> io::Result<usize> {
        {
            let written = if self.chunks.is_empty() {
                // The common reply, small values only: one buffer, no
                // iovec list.
                w.write(&self.scratch).await?
            } else {
                let mut slices: Vec<IoSlice<'_>> =
                    Vec::with_capacity(self.chunks.len().min(MAX_IOVECS) + 1);
                for c in self.chunks.iter().take(MAX_IOVECS) {
                    slices.push(IoSlice::new(c));
                }
                if slices.len() < MAX_IOVECS && !self.scratch.is_empty() {
                    slices.push(IoSlice::new(&self.scratch));
                }
                w.write_vectored(&slices).await?
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.consume(written);
            Ok(written)
        }
    }

    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            match self.chunks.front_mut() {
                Some(front) if front.len() <= n => {
                    n -= front.len();
                    self.chunk_bytes -= front.len();
                    self.chunks.pop_front();
                }
                Some(front) => {
                    front.advance(n);
                    self.chunk_bytes -= n;
                    return;
                }
                None if n >= self.scratch.len() => {
                    // All of it: cleared where it starts, so the next reply
                    // is encoded into the same room (an `advance` first
                    // would leave that room behind, to be reclaimed by a
                    // reserve on the next reply).
                    self.scratch.clear();
                    break;
                }
                None => {
                    self.scratch.advance(n);
                    break;
                }
            }
        }
    }
}

/// A command encoded as one contiguous RESP array of bulk strings.
pub fn encode_command(args: &[Bytes]) -> Bytes {
    let mut out = ReplyBuf::new();
    out.push_command(args);
    Bytes::from(out.take_bytes())
}

/// Writes `s` and CRLF, turning any CR or LF inside `s` into a space so a
/// status or error line can never break the framing.
fn put_line_safe(buf: &mut BytesMut, s: &[u8]) {
    if s.iter().any(|&b| b == b'\r' || b == b'\n') {
        buf.extend(
            s.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        buf.extend_from_slice(s);
    }
    buf.extend_from_slice(b"\r\n");
}

/// Appends the decimal form of `n`.
pub fn put_int(buf: &mut BytesMut, n: i64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if n < 0 {
        buf.put_u8(b'-');
    }
    buf.extend_from_slice(&digits[i..]);
}

/// A double as Redis prints it: the shortest text that reads back the same
/// value, integers without a fraction, `inf`, `-inf` and `nan` by name.
pub fn format_double(d: f64) -> String {
    if d.is_nan() {
        "nan".into()
    } else if d.is_infinite() {
        if d > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{d}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: Reply, resp3: bool) -> String {
        let mut b = ReplyBuf::new();
        b.push(&r, resp3);
        let pending = b.pending();
        let out = b.take_bytes();
        assert_eq!(pending, out.len());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn resp2_and_resp3() {
        assert_eq!(enc(Reply::ok(), false), "+OK\r\n");
        assert_eq!(enc(Reply::Int(-42), false), ":-42\r\n");
        assert_eq!(
            enc(Reply::Int(i64::MIN), false),
            ":-9223372036854775808\r\n"
        );
        assert_eq!(enc(Reply::Nil, false), "$-1\r\n");
        assert_eq!(enc(Reply::Nil, true), "_\r\n");
        assert_eq!(enc(Reply::NilArray, false), "*-1\r\n");
        assert_eq!(enc(Reply::bulk("hi"), false), "$2\r\nhi\r\n");
        let map = Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]);
        assert_eq!(enc(map.clone(), false), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(map, true), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(Reply::Double(1.5), true), ",1.5\r\n");
        assert_eq!(enc(Reply::Double(3.0), false), "$1\r\n3\r\n");
        assert_eq!(enc(Reply::Bool(true), true), "#t\r\n");
        assert_eq!(
            enc(Reply::Verbatim(Bytes::from("x")), true),
            "=5\r\ntxt:x\r\n"
        );
        assert_eq!(enc(Reply::error("ERR a\r\nb"), false), "-ERR a  b\r\n");
    }

    #[test]
    fn large_values_are_queued_by_reference() {
        let value = Bytes::from(vec![7u8; ZERO_COPY_MIN]);
        let mut b = ReplyBuf::new();
        b.push(&Reply::Int(1), false);
        b.push(&Reply::Bulk(value.clone()), false);
        b.push(&Reply::Int(2), false);
        assert!(b.chunks.iter().any(|c| c.as_ptr() == value.as_ptr()));
        let out = b.take_bytes();
        let header = format!(":1\r\n${}\r\n", ZERO_COPY_MIN);
        assert!(out.starts_with(header.as_bytes()));
        assert!(out.ends_with(b"\r\n:2\r\n"));
        assert_eq!(out.len(), header.len() + ZERO_COPY_MIN + 2 + 4);
    }

    #[tokio::test]
    async fn vectored_write_sends_everything_in_order() {
        let mut b = ReplyBuf::new();
        let mut want = Vec::new();
        for i in 0..200 {
            let v = Bytes::from(vec![i as u8; ZERO_COPY_MIN + i]);
            b.push(&Reply::Bulk(v.clone()), false);
            want.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
            want.extend_from_slice(&v);
            want.extend_from_slice(b"\r\n");
        }
        let mut out = Vec::new();
        b.write_to(&mut out).await.unwrap();
        assert!(b.is_empty());
        assert_eq!(out, want);
    }
}
