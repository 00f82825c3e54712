//! Connections from this node to its peers.
//!
//! Each shard keeps, per peer and protocol version, one pooled connection
//! that carries every forwarded command of that shard in order, pipelined:
//! a writer task sends what is queued in one write, a reader task matches
//! replies to requests first-in first-out. The connection introduces
//! itself with `CLUSTER PEER`, so the peer runs what arrives on it locally
//! and never forwards it again (one hop, no loops). A command that blocks
//! (MGETPREFIX ... BLOCK) gets a connection of its own, so it cannot hold
//! up the pipe.
//!
//! Replies are parsed into [`Reply`] values (bulk strings stay slices of the
//! read buffer) and encoded again for the client, in the protocol the
//! client speaks (the peer connection speaks the same one).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::Reply;

/// How long connecting to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// Replies nested deeper than this are refused (a broken peer).
const MAX_DEPTH: usize = 64;

/// Encodes a command as a RESP array of bulk strings.
pub fn encode_command(args: &[Bytes]) -> Bytes {
    let size: usize = args.iter().map(|a| a.len() + 16).sum::<usize>() + 16;
    let mut out = BytesMut::with_capacity(size);
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// Finds where the reply starting at `pos` ends: `Ok(None)` when more bytes
/// are needed.
fn scan(buf: &[u8], pos: usize, depth: usize) -> Result<Option<usize>, String> {
    if depth > MAX_DEPTH {
        return Err("reply nested too deeply".into());
    }
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    let Some(nl) = buf[pos..].windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if nl == 0 {
        return Err("empty reply line".into());
    }
    let line = &buf[pos + 1..pos + nl];
    let after = pos + nl + 2;
    let number = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad length in reply: {:?}", String::from_utf8_lossy(line)))
    };
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(after)),
        b'$' | b'=' | b'!' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some(after));
            }
            let end = after + n as usize + 2;
            if buf.len() < end {
                return Ok(None);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err("bulk string not followed by CRLF".into());
            }
            Ok(Some(end))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = number()?;
            let items = if matches!(kind, b'%' | b'|') {
                n.saturating_mul(2)
            } else {
                n
            };
            let mut at = after;
            for _ in 0..items.max(0) {
                match scan(buf, at, depth + 1)? {
                    Some(next) => at = next,
                    None => return Ok(None),
                }
            }
            if kind == b'|' {
                // An attribute precedes the reply it annotates.
                return scan(buf, at, depth + 1);
            }
            Ok(Some(at))
        }
        other => Err(format!("unexpected reply type byte {other:#04x}")),
    }
}

/// Builds the reply at `pos` of a complete frame; returns it and its end.
fn build(frame: &Bytes, pos: usize) -> (Reply, usize) {
    let buf = &frame[..];
    let nl = buf[pos..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(buf.len() - pos);
    let line = &buf[pos + 1..pos + nl];
    let after = pos + nl + 2;
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> i64 {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let items = |count: i64, mut at: usize| {
        let mut out = Vec::with_capacity(count.clamp(0, 1024) as usize);
        for _ in 0..count.max(0) {
            let (item, next) = build(frame, at);
            out.push(item);
            at = next;
        }
        (out, at)
    };
    match buf[pos] {
        b'+' => (Reply::Status(text().into()), after),
        b'-' => (Reply::Error(text().into()), after),
        b':' => (Reply::Int(number()), after),
        b'_' => (Reply::Nil, after),
        b',' => (Reply::Double(text().parse().unwrap_or(f64::NAN)), after),
        b'#' => (Reply::Bool(line == b"t"), after),
        b'(' => (Reply::Bulk(frame.slice(pos + 1..pos + nl)), after),
        b'$' | b'=' | b'!' => {
            let n = number();
            if n < 0 {
                return (Reply::Nil, after);
            }
            let body = frame.slice(after..after + n as usize);
            let reply = match buf[pos] {
                b'=' => Reply::Verbatim(body.slice(4.min(body.len())..)),
                b'!' => Reply::Error(String::from_utf8_lossy(&body).into_owned().into()),
                _ => Reply::Bulk(body),
            };
            (reply, after + n as usize + 2)
        }
        b'*' | b'>' => {
            let n = number();
            if n < 0 {
                return (Reply::NilArray, after);
            }
            let (items, end) = items(n, after);
            (Reply::Array(items), end)
        }
        b'~' => {
            let (items, end) = items(number(), after);
            (Reply::Set(items), end)
        }
        b'%' => {
            let (flat, end) = items(number().saturating_mul(2), after);
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            (Reply::Map(pairs), end)
        }
        b'|' => {
            let (_, end) = items(number().saturating_mul(2), after);
            build(frame, end)
        }
        _ => (Reply::Nil, after),
    }
}

/// Takes one complete reply off the front of `buf`, if there is one.
pub fn parse_reply(buf: &mut BytesMut) -> Result<Option<Reply>, String> {
    let Some(end) = scan(buf, 0, 0)? else {
        return Ok(None);
    };
    let frame = buf.split_to(end).freeze();
    Ok(Some(build(&frame, 0).0))
}

type Waiter = oneshot::Sender<Reply>;

/// A pooled, pipelined connection to one peer.
pub struct PeerConn {
    requests: mpsc::UnboundedSender<(Bytes, Waiter)>,
}

impl PeerConn {
    /// Opens (in the background) a connection to `addr` that speaks RESP3
    /// when `resp3`, authenticating with `password` when one is set.
    fn open(addr: String, resp3: bool, password: Option<String>, me: String) -> PeerConn {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_local(run_conn(addr, resp3, password, me, rx));
        PeerConn { requests: tx }
    }

    fn is_open(&self) -> bool {
        !self.requests.is_closed()
    }

    fn send(&self, command: Bytes) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        // A closed connection drops the waiter: the caller sees an error.
        let _ = self.requests.send((command, tx));
        rx
    }
}

/// The handshake every peer connection starts with.
fn handshake(resp3: bool, password: Option<&str>, me: &str) -> Vec<Bytes> {
    let mut out = Vec::new();
    let arg = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    if let Some(pass) = password {
        out.push(encode_command(&[arg("AUTH"), arg(pass)]));
    }
    if resp3 {
        out.push(encode_command(&[arg("HELLO"), arg("3")]));
    }
    out.push(encode_command(&[arg("CLUSTER"), arg("PEER"), arg(me)]));
    out
}

async fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

async fn run_conn(
    addr: String,
    resp3: bool,
    password: Option<String>,
    me: String,
    mut requests: mpsc::UnboundedReceiver<(Bytes, Waiter)>,
) {
    let stream = match connect(&addr).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("peer {addr}: {e}");
            return;
        }
    };
    let (mut reader, mut writer) = stream.into_split();
    let waiting: Rc<RefCell<VecDeque<Option<Waiter>>>> = Rc::default();
    let replies = {
        let waiting = Rc::clone(&waiting);
        async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                loop {
                    match parse_reply(&mut buf) {
                        Ok(Some(reply)) => {
                            if let Some(Some(w)) = waiting.borrow_mut().pop_front() {
                                let _ = w.send(reply);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("peer {addr}: {e}");
                            return;
                        }
                    }
                }
                if buf.capacity() - buf.len() < 16 * 1024 {
                    buf.reserve(64 * 1024);
                }
                match reader.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        }
    };
    let sends = async {
        let mut out = BytesMut::new();
        for hello in handshake(resp3, password.as_deref(), &me) {
            waiting.borrow_mut().push_back(None);
            out.extend_from_slice(&hello);
        }
        loop {
            while let Ok((command, waiter)) = requests.try_recv() {
                waiting.borrow_mut().push_back(Some(waiter));
                if command.len() >= 64 * 1024 && out.is_empty() {
                    if writer.write_all(&command).await.is_err() {
                        return;
                    }
                } else {
                    out.extend_from_slice(&command);
                }
                if out.len() >= 1 << 20 {
                    break;
                }
            }
            if !out.is_empty() {
                if writer.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                continue;
            }
            match requests.recv().await {
                Some((command, waiter)) => {
                    waiting.borrow_mut().push_back(Some(waiter));
                    if writer.write_all(&command).await.is_err() {
                        return;
                    }
                }
                None => return,
            }
        }
    };
    tokio::select! {
        _ = replies => {},
        _ = sends => {},
    }
    // Whatever was not answered gets an error (its waiter is dropped).
    requests.close();
    waiting.borrow_mut().clear();
}

/// Connections per peer and protocol version: a client's forwarded
/// commands always take the same one (their order is kept), and different
/// clients spread over them, so one client's large replies do not hold up
/// everyone's.
pub const LANES: u64 = 4;

/// Which pooled connection a client's forwarded commands use.
#[derive(Debug, Clone, Copy)]
pub struct Lane {
    /// The client speaks RESP3 (so does the connection).
    pub resp3: bool,
    /// The client's id: its commands use connection `id % LANES`.
    pub id: u64,
}

/// A shard's connections to its peers, by (address, RESP3, lane).
#[derive(Default)]
pub struct PeerPool {
    conns: RefCell<HashMap<(String, bool, u64), PeerConn>>,
}

impl PeerPool {
    /// Sends `args` to the peer at `addr` on the pooled connection (opened
    /// or re-opened as needed); the receiver gets its reply, or is dropped
    /// if the connection fails.
    pub fn send(
        &self,
        addr: &str,
        lane: Lane,
        password: Option<String>,
        me: &str,
        args: &[Bytes],
    ) -> oneshot::Receiver<Reply> {
        let mut conns = self.conns.borrow_mut();
        let resp3 = lane.resp3;
        let key = (addr.to_string(), resp3, lane.id % LANES);
        let conn = conns
            .entry(key)
            .and_modify(|c| {
                if !c.is_open() {
                    *c = PeerConn::open(addr.to_string(), resp3, password.clone(), me.into());
                }
            })
            .or_insert_with(|| PeerConn::open(addr.to_string(), resp3, password, me.into()));
        conn.send(encode_command(args))
    }

    /// Drops the connections to `addr`: their tasks end, and whatever
    /// waits on them gets an error instead of waiting for a peer that is
    /// gone (or hangs).
    pub fn forget(&self, addr: &str) {
        self.conns.borrow_mut().retain(|(a, _, _), _| a != addr);
    }
}

/// Runs one command on a connection of its own (a blocking command must not
/// hold up the pooled pipe), closed afterwards.
pub async fn call_once(
    addr: &str,
    resp3: bool,
    password: Option<&str>,
    me: &str,
    args: &[Bytes],
) -> std::io::Result<Reply> {
    let mut stream = connect(addr).await?;
    let hello = handshake(resp3, password, me);
    let mut out = BytesMut::new();
    for h in &hello {
        out.extend_from_slice(h);
    }
    out.extend_from_slice(&encode_command(args));
    stream.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut skip = hello.len();
    loop {
        while let Some(reply) = parse_reply(&mut buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
        {
            if skip == 0 {
                return Ok(reply);
            }
            skip -= 1;
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Vec<Reply> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = parse_reply(&mut buf).unwrap() {
            out.push(r);
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        out
    }

    #[test]
    fn parses_resp2_and_resp3_replies() {
        let got = parse_all(
            b"+OK\r\n-ERR bad\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n*2\r\n$1\r\na\r\n:1\r\n\
              _\r\n,1.5\r\n#t\r\n%1\r\n+k\r\n:2\r\n~1\r\n+m\r\n=7\r\ntxt:abc\r\n",
        );
        assert_eq!(
            got,
            vec![
                Reply::Status("OK".into()),
                Reply::Error("ERR bad".into()),
                Reply::Int(42),
                Reply::Bulk(Bytes::from_static(b"abc")),
                Reply::Nil,
                Reply::NilArray,
                Reply::Array(vec![Reply::Bulk(Bytes::from_static(b"a")), Reply::Int(1)]),
                Reply::Nil,
                Reply::Double(1.5),
                Reply::Bool(true),
                Reply::Map(vec![(Reply::Status("k".into()), Reply::Int(2))]),
                Reply::Set(vec![Reply::Status("m".into())]),
                Reply::Verbatim(Bytes::from_static(b"abc")),
            ]
        );
    }

    #[test]
    fn waits_for_the_whole_reply_at_every_cut() {
        let full = b"*3\r\n$5\r\nhello\r\n*1\r\n:7\r\n$0\r\n\r\n+OK\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            if let Some(r) = parse_reply(&mut buf).unwrap() {
                assert!(cut >= full.len() - 5, "complete at {cut}: {r:?}");
            }
        }
        let mut buf = BytesMut::from(&full[..]);
        assert!(matches!(
            parse_reply(&mut buf).unwrap(),
            Some(Reply::Array(_))
        ));
        assert_eq!(
            parse_reply(&mut buf).unwrap(),
            Some(Reply::Status("OK".into()))
        );
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse_reply(&mut BytesMut::from(&b"\r\n"[..])).is_err());
        assert!(parse_reply(&mut BytesMut::from(&b"*1\r\n\r\n"[..])).is_err());
        assert!(parse_reply(&mut BytesMut::from(&b"?x\r\n"[..])).is_err());
        assert!(parse_reply(&mut BytesMut::from(&b"$3\r\nabcde\r\n"[..])).is_err());
        assert!(parse_reply(&mut BytesMut::from(&b"$x\r\n"[..])).is_err());
    }
}
