//! A small RESP client built for measuring, not for convenience: commands
//! are queued and written with one vectored write (big values by reference,
//! never copied into a buffer), and a big bulk reply is read straight into a
//! buffer of its exact size. The same client talks to kvtier and to
//! redis-server, so both are measured alike.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Arguments at least this long are written by reference.
const BIG: usize = 16 * 1024;
/// Bulk replies at least this long are read into their own buffer.
const BIG_REPLY: usize = 64 * 1024;
/// Buffers of big replies kept for reuse after [`Client::recycle`].
const SPARE_BUFFERS: usize = 16;
/// Slices handed to one vectored write.
const IOV: usize = 64;

/// A reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `$-1`, `*-1` or RESP3 `_`.
    Nil,
    /// `:n`
    Int(i64),
    /// `$n`, RESP3 verbatim.
    Bulk(Bytes),
    /// `+text`, RESP3 double/bool/big number as text.
    Simple(String),
    /// `-text`
    Error(String),
    /// `*n`, RESP3 map (flattened), set, push.
    Array(Vec<Value>),
}

impl Value {
    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn into_array(self) -> Option<Vec<Value>> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

fn protocol_error(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// One connection.
pub struct Client {
    stream: TcpStream,
    rbuf: BytesMut,
    chunks: VecDeque<Bytes>,
    scratch: BytesMut,
    /// Buffers of big replies the caller gave back, reused for the next
    /// ones so a steady run allocates no value buffers.
    spare: Vec<BytesMut>,
}

/// Appends `tag`, `n` in decimal and CRLF, without allocating.
fn put_header(buf: &mut BytesMut, tag: u8, n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.reserve(digits.len() - i + 3);
    buf.put_u8(tag);
    buf.extend_from_slice(&digits[i..]);
    buf.extend_from_slice(b"\r\n");
}

/// Parses a RESP integer or length without allocating.
fn parse_int(text: &[u8]) -> io::Result<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(protocol_error("bad integer"));
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(protocol_error("bad integer"));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add((d - b'0') as i64))
            .ok_or_else(|| protocol_error("integer out of range"))?;
    }
    Ok(if negative { -n } else { n })
}

impl Client {
    /// Connects (TCP_NODELAY on).
    pub async fn connect(addr: &str) -> io::Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            chunks: VecDeque::new(),
            scratch: BytesMut::with_capacity(16 * 1024),
            spare: Vec::new(),
        })
    }

    /// Queues a command (not sent until [`Client::flush`]).
    pub fn send(&mut self, args: &[Bytes]) {
        put_header(&mut self.scratch, b'*', args.len());
        for a in args {
            put_header(&mut self.scratch, b'$', a.len());
            if a.len() >= BIG {
                if !self.scratch.is_empty() {
                    self.chunks.push_back(self.scratch.split().freeze());
                }
                self.chunks.push_back(a.clone());
            } else {
                self.scratch.extend_from_slice(a);
            }
            self.scratch.extend_from_slice(b"\r\n");
        }
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.scratch.is_empty() {
            self.chunks.push_back(self.scratch.split().freeze());
        }
        while !self.chunks.is_empty() {
            let n = {
                let mut slices = [IoSlice::new(&[]); IOV];
                let mut used = 0;
                for (slot, chunk) in slices.iter_mut().zip(&self.chunks) {
                    *slot = IoSlice::new(chunk);
                    used += 1;
                }
                self.stream.write_vectored(&slices[..used]).await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let mut left = n;
            while left > 0 {
                let Some(front) = self.chunks.front_mut() else {
                    break;
                };
                if front.len() <= left {
                    left -= front.len();
                    self.chunks.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
        }
        Ok(())
    }

    /// Sends one command and reads its reply.
    pub async fn call(&mut self, args: &[Bytes]) -> io::Result<Value> {
        self.send(args);
        self.flush().await?;
        self.recv().await
    }

    async fn fill(&mut self) -> io::Result<()> {
        self.rbuf.reserve(64 * 1024);
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// Index of the CR ending the reply line at the front of the buffer.
    async fn line_end(&mut self) -> io::Result<usize> {
        let mut from = 0;
        loop {
            if let Some(p) = self.rbuf[from..].windows(2).position(|w| w == b"\r\n") {
                return Ok(from + p);
            }
            from = self.rbuf.len().saturating_sub(1);
            self.fill().await?;
        }
    }

    async fn bulk(&mut self, len: usize) -> io::Result<Bytes> {
        if self.rbuf.len() >= len + 2 {
            let data = self.rbuf.split_to(len).freeze();
            self.rbuf.advance(2);
            return Ok(data);
        }
        if len < BIG_REPLY {
            while self.rbuf.len() < len + 2 {
                self.fill().await?;
            }
            let data = self.rbuf.split_to(len).freeze();
            self.rbuf.advance(2);
            return Ok(data);
        }
        // Big value: its own buffer (a recycled one when there is one big
        // enough), filled straight from the socket.
        let mut data = match self.spare.pop() {
            Some(mut b) if b.capacity() >= len + 2 => {
                b.clear();
                b
            }
            _ => BytesMut::with_capacity(len + 2),
        };
        let have = self.rbuf.len().min(len + 2);
        data.extend_from_slice(&self.rbuf[..have]);
        self.rbuf.advance(have);
        while data.len() < len + 2 {
            if self.stream.read_buf(&mut data).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        data.truncate(len);
        Ok(data.freeze())
    }

    /// Gives the buffers of a reply back once the caller is done with it
    /// (verified it), so later big replies reuse them instead of allocating.
    /// Buffers still referenced elsewhere are simply dropped.
    pub fn recycle(&mut self, v: Value) {
        match v {
            Value::Bulk(b) => self.recycle_bytes(b),
            Value::Array(items) => {
                for item in items {
                    self.recycle(item);
                }
            }
            _ => {}
        }
    }

    /// [`Client::recycle`] for one bulk value.
    pub fn recycle_bytes(&mut self, b: Bytes) {
        if b.len() < BIG_REPLY || self.spare.len() >= SPARE_BUFFERS {
            return;
        }
        if let Ok(buf) = b.try_into_mut() {
            self.spare.push(buf);
        }
    }

    /// Reads one reply.
    pub async fn recv(&mut self) -> io::Result<Value> {
        // Arrays being filled: (elements still expected, elements so far).
        let mut stack: Vec<(usize, Vec<Value>)> = Vec::new();
        loop {
            let end = self.line_end().await?;
            let kind = self.rbuf[0];
            let body = &self.rbuf[1..end];
            let text = || String::from_utf8_lossy(body).into_owned();
            let parsed = match kind {
                b'+' | b',' | b'#' | b'(' => Ok(Value::Simple(text())),
                b'-' => Ok(Value::Error(text())),
                b':' => parse_int(body).map(Value::Int),
                b'_' => Ok(Value::Nil),
                // Lengths: resolved below, once the line is consumed.
                b'$' | b'=' | b'*' | b'~' | b'>' | b'%' => parse_int(body).map(Value::Int),
                _ => Err(protocol_error("unknown reply type")),
            };
            self.rbuf.advance(end + 2);
            let mut value = match (kind, parsed?) {
                (b'$' | b'=', Value::Int(n)) if n < 0 => Value::Nil,
                (b'$' | b'=', Value::Int(n)) => Value::Bulk(self.bulk(n as usize).await?),
                (b'*' | b'~' | b'>' | b'%', Value::Int(n)) => {
                    let n = if kind == b'%' { n * 2 } else { n };
                    if n < 0 {
                        Value::Nil
                    } else if n == 0 {
                        Value::Array(Vec::new())
                    } else {
                        stack.push((n as usize, Vec::with_capacity(n.min(4096) as usize)));
                        continue;
                    }
                }
                (_, v) => v,
            };
            loop {
                let Some((left, items)) = stack.last_mut() else {
                    return Ok(value);
                };
                items.push(value);
                *left -= 1;
                if *left > 0 {
                    break;
                }
                let (_, items) = stack.pop().unwrap_or_default();
                value = Value::Array(items);
            }
        }
    }
}

/// Builds an argument list from anything byte-like.
pub fn args<I, T>(items: I) -> Vec<Bytes>
where
    I: IntoIterator<Item = T>,
    T: Into<Bytes>,
{
    items.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn headers_and_integers_without_allocation() {
        let mut b = BytesMut::new();
        put_header(&mut b, b'*', 0);
        put_header(&mut b, b'$', 65536);
        put_header(&mut b, b'*', usize::MAX);
        assert_eq!(&b[..], b"*0\r\n$65536\r\n*18446744073709551615\r\n");
        assert_eq!(parse_int(b"-1").unwrap(), -1);
        assert_eq!(parse_int(b"9223372036854775807").unwrap(), i64::MAX);
        assert!(parse_int(b"").is_err());
        assert!(parse_int(b"12a").is_err());
        assert!(parse_int(b"99999999999999999999").is_err());
    }

    /// A server that reads a request of `expect` bytes, then answers it with
    /// `reply` a few bytes at a time, and returns what it read.
    async fn canned(expect: usize, reply: Vec<u8>) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = vec![0u8; expect];
            s.read_exact(&mut got).await.unwrap();
            // Trickle the reply to exercise partial reads.
            for chunk in reply.chunks(7) {
                s.write_all(chunk).await.unwrap();
                s.flush().await.unwrap();
            }
            got
        });
        (addr, task)
    }

    #[tokio::test]
    async fn parses_every_reply_kind_split_across_reads() {
        let big = vec![b'x'; BIG_REPLY + 5];
        let mut reply = b"*7\r\n+OK\r\n-ERR no\r\n:-42\r\n$-1\r\n$3\r\nabc\r\n*0\r\n".to_vec();
        reply.extend_from_slice(format!("${}\r\n", big.len()).as_bytes());
        reply.extend_from_slice(&big);
        reply.extend_from_slice(b"\r\n");
        let mut want = format!("*2\r\n$3\r\nGET\r\n${BIG}\r\n").into_bytes();
        want.extend(std::iter::repeat_n(b'k', BIG));
        want.extend_from_slice(b"\r\n");
        let (addr, server) = canned(want.len(), reply).await;
        let mut c = Client::connect(&addr).await.unwrap();
        let v = c
            .call(&[Bytes::from("GET"), Bytes::from(vec![b'k'; BIG])])
            .await
            .unwrap();
        let items = v.into_array().unwrap();
        assert_eq!(items[0], Value::Simple("OK".into()));
        assert_eq!(items[1], Value::Error("ERR no".into()));
        assert_eq!(items[2], Value::Int(-42));
        assert_eq!(items[3], Value::Nil);
        assert_eq!(items[4], Value::Bulk(Bytes::from("abc")));
        assert_eq!(items[5], Value::Array(Vec::new()));
        assert_eq!(items[6], Value::Bulk(Bytes::from(big)));
        assert_eq!(server.await.unwrap(), want);
        // The big value's buffer comes back for reuse once nothing else holds it.
        c.recycle(Value::Array(items));
        assert_eq!(c.spare.len(), 1);
    }
}
