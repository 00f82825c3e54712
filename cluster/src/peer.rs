//! Connections from this node to its peers.
//!
//! Each shard keeps, per peer, protocol version and lane, one pooled
//! connection that carries forwarded commands in order, pipelined: a
//! writer task sends what is queued with vectored writes (big arguments by
//! reference, never copied into a buffer), a reader task matches replies to
//! requests first-in first-out. The connection introduces itself with
//! `CLUSTER PEER`, so the peer runs what arrives on it locally and never
//! forwards it again (one hop, no loops). A command that blocks
//! (MGETPREFIX ... BLOCK) gets a connection of its own ([`call_once`]), so
//! it cannot hold up the pipe.
//!
//! Replies are parsed with kvtier-protocol's reply parser into [`Reply`]
//! values (big values read straight into buffers of their own) and encoded
//! again for the client, in the protocol the client speaks (the peer
//! connection speaks the same one).
//!
//! A forwarded command costs no lock and no allocation for who this node
//! is: the [`Identity`] is shared, and its login and TLS configuration are
//! read only when a connection opens ([`dial`]).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::stream::Stream;
use kvtier_protocol::{Reply, ReplyBuf, ReplyParser};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::topology::Node;

/// How long connecting to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// Connections per peer and protocol version: a client's forwarded
/// commands always take the same one (their order is kept), and different
/// clients spread over them, so one client's large replies do not hold up
/// everyone's.
pub const LANES: u64 = 4;

/// Most bytes the writer gathers before it writes.
const WRITE_BATCH: usize = 1 << 20;

/// The user and password a node logs in to its peers with.
pub type Login = Option<(String, String)>;

/// The TLS client configuration peer links use (`--tls-cluster yes`), as
/// in force when a connection opens; `None`: plain TCP.
pub type PeerTls = Option<Arc<rustls::ClientConfig>>;

/// Who this node is to its peers: its id, sent with `CLUSTER PEER`, and
/// the user and password it logs in with (read each time a connection
/// opens, so `CONFIG SET masterauth` applies to the next one).
#[derive(Clone)]
pub struct Identity {
    /// This node's id.
    pub me: Arc<str>,
    login: Arc<dyn Fn() -> Login + Send + Sync>,
    tls: Arc<dyn Fn() -> PeerTls + Send + Sync>,
}

impl Identity {
    /// Node `me`, logging in with whatever `login` returns, over TLS when
    /// `tls` returns a configuration.
    pub fn new(
        me: &str,
        login: impl Fn() -> Login + Send + Sync + 'static,
        tls: impl Fn() -> PeerTls + Send + Sync + 'static,
    ) -> Self {
        Identity {
            me: Arc::from(me),
            login: Arc::new(login),
            tls: Arc::new(tls),
        }
    }

    /// The user and password to log in with now, if any.
    pub fn login(&self) -> Login {
        (self.login)()
    }

    /// The commands every peer connection starts with: AUTH user password
    /// when a password is set, HELLO 3 for RESP3, CLUSTER PEER.
    pub fn handshake(&self, resp3: bool) -> Vec<Vec<Bytes>> {
        let mut out = Vec::new();
        if let Some((user, pass)) = self.login() {
            out.push(vec![
                Bytes::from_static(b"AUTH"),
                Bytes::from(user),
                Bytes::from(pass),
            ]);
        }
        if resp3 {
            out.push(vec![Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
        }
        out.push(vec![
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"PEER"),
            Bytes::copy_from_slice(self.me.as_bytes()),
        ]);
        out
    }
}

type Waiter = oneshot::Sender<Reply>;

/// A pooled, pipelined connection to one peer.
struct PeerConn {
    requests: mpsc::UnboundedSender<(Vec<Bytes>, Waiter)>,
}

impl PeerConn {
    /// Opens (in the background) a connection to `addr` that speaks RESP3
    /// when `resp3`.
    fn open(addr: &str, resp3: bool, identity: &Identity) -> PeerConn {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_local(run_conn(addr.to_string(), resp3, identity.clone(), rx));
        PeerConn { requests: tx }
    }

    fn is_open(&self) -> bool {
        !self.requests.is_closed()
    }

    fn send(&self, args: Vec<Bytes>) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        // A closed connection drops the waiter: the caller sees an error.
        let _ = self.requests.send((args, tx));
        rx
    }
}

/// A connection to a peer: plain TCP, or TLS over it.
pub type PeerStream = Stream<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// Connects to the peer at `addr` (`host:port`), with TLS when the
/// identity has a configuration: the peer's certificate must name `host`
/// (a DNS name or an IP address) and chain to the configured CA.
pub async fn dial(addr: &str, identity: &Identity) -> std::io::Result<PeerStream> {
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
    let stream = kvtier_timer::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out())??;
    let _ = stream.set_nodelay(true);
    let Some(config) = (identity.tls)() else {
        return Ok(Stream::Plain(stream));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = kvtier_timer::timeout(CONNECT_TIMEOUT, connector.connect(name, stream))
        .await
        .map_err(|_| timed_out())??;
    Ok(Stream::Tls(Box::new(tls)))
}

async fn run_conn(
    addr: String,
    resp3: bool,
    identity: Identity,
    requests: mpsc::UnboundedReceiver<(Vec<Bytes>, Waiter)>,
) {
    match dial(&addr, &identity).await {
        Ok(Stream::Plain(s)) => {
            let (reader, writer) = s.into_split();
            drive(&addr, resp3, &identity, requests, reader, writer).await
        }
        Ok(Stream::Tls(s)) => {
            let (reader, writer) = tokio::io::split(*s);
            drive(&addr, resp3, &identity, requests, reader, writer).await
        }
        Err(e) => tracing::debug!("peer {addr}: {e}"),
    }
}

/// Carries one connection's requests and replies until either side ends.
async fn drive<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    addr: &str,
    resp3: bool,
    identity: &Identity,
    mut requests: mpsc::UnboundedReceiver<(Vec<Bytes>, Waiter)>,
    mut reader: R,
    mut writer: W,
) {
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
        let mut out = ReplyBuf::new();
        for hello in identity.handshake(resp3) {
            waiting.borrow_mut().push_back(None);
            out.push_command(&hello);
        }
        loop {
            while out.pending() < WRITE_BATCH {
                let Ok((args, waiter)) = requests.try_recv() else {
                    break;
                };
                waiting.borrow_mut().push_back(Some(waiter));
                out.push_command(&args);
            }
            if !out.is_empty() {
                if out.write_to(&mut writer).await.is_err() {
                    return;
                }
                continue;
            }
            match requests.recv().await {
                Some((args, waiter)) => {
                    waiting.borrow_mut().push_back(Some(waiter));
                    out.push_command(&args);
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

/// Which pooled connection a client's forwarded commands use.
#[derive(Debug, Clone, Copy)]
pub struct Lane {
    /// The client speaks RESP3 (so does the connection).
    pub resp3: bool,
    /// The client's id: its commands use connection `id % LANES`.
    pub id: u64,
}

/// The pooled connection copies, leases and invalidations travel on.
pub const CONTROL: Lane = Lane {
    resp3: false,
    id: 0,
};

/// One peer's pooled connections: RESP2 lanes, then RESP3 lanes.
type Lanes = [Option<PeerConn>; 2 * LANES as usize];

/// A shard's connections to its peers, by address, protocol and lane.
#[derive(Default)]
pub struct PeerPool {
    conns: RefCell<HashMap<String, Lanes>>,
}

impl PeerPool {
    /// Sends `args` to `node` on the pooled connection of `lane` (opened or
    /// re-opened as needed); the receiver gets its reply, or is dropped if
    /// the connection fails.
    pub fn send(
        &self,
        identity: &Identity,
        node: &Node,
        lane: Lane,
        args: Vec<Bytes>,
    ) -> oneshot::Receiver<Reply> {
        let mut conns = self.conns.borrow_mut();
        if !conns.contains_key(node.addr()) {
            conns.insert(node.addr().to_string(), Lanes::default());
        }
        let Some(lanes) = conns.get_mut(node.addr()) else {
            unreachable!("inserted above")
        };
        let at = (lane.id % LANES) as usize + if lane.resp3 { LANES as usize } else { 0 };
        let conn = &mut lanes[at];
        if !conn.as_ref().is_some_and(PeerConn::is_open) {
            *conn = Some(PeerConn::open(node.addr(), lane.resp3, identity));
        }
        conn.as_ref().expect("opened above").send(args)
    }

    /// Drops the connections to `addr`: their tasks end, and whatever
    /// waits on them gets an error instead of waiting for a peer that is
    /// gone (or hangs).
    pub fn forget(&self, addr: &str) {
        self.conns.borrow_mut().remove(addr);
    }
}

/// Runs one command on a connection of its own (a blocking command must not
/// hold up the pooled pipe), closed afterwards.
pub async fn call_once(
    identity: &Identity,
    addr: &str,
    resp3: bool,
    args: &[Bytes],
) -> std::io::Result<Reply> {
    let mut stream = dial(addr, identity).await?;
    let hello = identity.handshake(resp3);
    let mut out = ReplyBuf::new();
    for h in &hello {
        out.push_command(h);
    }
    out.push_command(args);
    out.write_to(&mut stream).await?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut parser = ReplyParser::<Reply>::new();
    for _ in &hello {
        parser.read_from(&mut stream, &mut buf).await?;
    }
    parser.read_from(&mut stream, &mut buf).await
}
