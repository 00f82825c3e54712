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
use kvtier_protocol::reply::encode_command;
use kvtier_protocol::{Reply, ReplyParser};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long connecting to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

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
            let mut parser = ReplyParser::<Reply>::new();
            loop {
                match parser.read_from(&mut reader, &mut buf).await {
                    Ok(reply) => {
                        if let Some(Some(w)) = waiting.borrow_mut().pop_front() {
                            let _ = w.send(reply);
                        }
                    }
                    Err(e) => {
                        if e.kind() == std::io::ErrorKind::InvalidData {
                            tracing::warn!("peer {addr}: {e}");
                        }
                        return;
                    }
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
    let mut parser = ReplyParser::<Reply>::new();
    for _ in &hello {
        parser.read_from(&mut stream, &mut buf).await?;
    }
    parser.read_from(&mut stream, &mut buf).await
}
