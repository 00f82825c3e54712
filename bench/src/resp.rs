//! A small RESP client built for measuring, not for convenience: commands
//! are queued and written with one vectored write (big values by reference,
//! never copied into a buffer), and a big bulk reply is read straight into a
//! buffer of its exact size. The same client talks to kvtier and to
//! redis-server, so both are measured alike.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Arguments at least this long are written by reference.
const BIG: usize = 16 * 1024;
/// Bulk replies at least this long are read into their own buffer.
const BIG_REPLY: usize = 64 * 1024;

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
        })
    }

    /// Queues a command (not sent until [`Client::flush`]).
    pub fn send(&mut self, args: &[Bytes]) {
        self.scratch
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.scratch
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
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
                let slices: Vec<IoSlice<'_>> = self
                    .chunks
                    .iter()
                    .take(64)
                    .map(|c| IoSlice::new(c))
                    .collect();
                self.stream.write_vectored(&slices).await?
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

    async fn line(&mut self) -> io::Result<(u8, String)> {
        loop {
            if let Some(end) = self.rbuf.windows(2).position(|w| w == b"\r\n") {
                let line = self.rbuf.split_to(end + 2);
                let text = String::from_utf8_lossy(&line[1..end]).into_owned();
                return Ok((line[0], text));
            }
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
        // Big value: its own buffer, filled straight from the socket.
        let mut data = BytesMut::with_capacity(len + 2);
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

    /// Reads one reply.
    pub async fn recv(&mut self) -> io::Result<Value> {
        // Arrays being filled: (elements still expected, elements so far).
        let mut stack: Vec<(usize, Vec<Value>)> = Vec::new();
        loop {
            let (kind, text) = self.line().await?;
            let number = || {
                text.parse::<i64>()
                    .map_err(|_| protocol_error("bad length"))
            };
            let mut value = match kind {
                b'+' | b',' | b'#' | b'(' => Value::Simple(text),
                b'-' => Value::Error(text),
                b':' => Value::Int(number()?),
                b'_' => Value::Nil,
                b'$' | b'=' => match number()? {
                    n if n < 0 => Value::Nil,
                    n => Value::Bulk(self.bulk(n as usize).await?),
                },
                b'*' | b'~' | b'>' | b'%' => {
                    let n = number()?;
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
                _ => return Err(protocol_error("unknown reply type")),
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
