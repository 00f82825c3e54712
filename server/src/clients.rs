//! The connections a shard serves, as CLIENT LIST, CLIENT INFO and CLIENT
//! KILL see them. Each shard keeps its own registry; the CLIENT commands ask
//! every shard through its mailbox, so no lock is shared between threads.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// What the server shows of one connection.
#[derive(Clone)]
pub struct ClientInfo {
    /// Unique, increasing id (CLIENT ID).
    pub id: u64,
    /// The peer's address.
    pub addr: SocketAddr,
    /// Our address the peer connected to.
    pub laddr: SocketAddr,
    /// CLIENT SETNAME.
    pub name: String,
    /// The ACL user it is logged in as.
    pub user: String,
    /// CLIENT SETINFO LIB-NAME.
    pub lib_name: String,
    /// CLIENT SETINFO LIB-VER.
    pub lib_ver: String,
    /// When the connection was accepted.
    pub created: Instant,
    /// When the last command arrived (a `kvtier_store::mono_ns` reading).
    pub last_active: u64,
    /// Since when the connection has been waiting for the client's next
    /// request (`None` while it reads, runs or answers one): what
    /// `--timeout` measures.
    pub idle_since: Option<u64>,
    /// The last command's name.
    pub last_cmd: &'static str,
    /// RESP version in use.
    pub resp: u8,
    /// CLIENT NO-EVICT on.
    pub no_evict: bool,
    /// CLIENT NO-TOUCH on.
    pub no_touch: bool,
    /// Bytes waiting in the query buffer.
    pub qbuf: usize,
    /// Bytes waiting to be written.
    pub omem: usize,
    /// Set to make the connection close (CLIENT KILL, shutdown).
    pub kill: Arc<Notify>,
    /// Whether it was killed.
    pub killed: bool,
    /// The socket's descriptor (-1 when unknown).
    pub fd: std::os::fd::RawFd,
}

impl ClientInfo {
    /// A new connection's info.
    pub fn new(id: u64, addr: SocketAddr, laddr: SocketAddr, fd: std::os::fd::RawFd) -> ClientInfo {
        let now = Instant::now();
        ClientInfo {
            id,
            addr,
            laddr,
            name: String::new(),
            user: "default".into(),
            lib_name: String::new(),
            lib_ver: String::new(),
            created: now,
            last_active: kvtier_store::mono_ns(),
            idle_since: None,
            last_cmd: "NULL",
            resp: 2,
            no_evict: false,
            no_touch: false,
            qbuf: 0,
            omem: 0,
            kill: Arc::new(Notify::new()),
            killed: false,
            fd,
        }
    }

    /// The CLIENT LIST line (without the newline), in Redis 7.2's format.
    pub fn line(&self) -> String {
        let now = Instant::now();
        let mut flags = String::new();
        if self.no_evict {
            flags.push('e');
        }
        if self.no_touch {
            flags.push('T');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf={} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=16384 rbp=0 obl=0 oll=0 omem={} tot-mem={} events=r cmd={} user={} redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            self.name,
            now.duration_since(self.created).as_secs(),
            kvtier_store::mono_ns().saturating_sub(self.last_active) / 1_000_000_000,
            flags,
            self.qbuf,
            self.omem,
            self.qbuf + self.omem,
            self.last_cmd,
            self.user,
            self.resp,
            self.lib_name,
            self.lib_ver,
        )
    }

    /// Asks the connection to close. Its socket is shut down, so a
    /// connection waiting to read wakes up at once with end-of-file; the
    /// connection itself closes the descriptor later.
    pub fn kill(&mut self) {
        self.killed = true;
        self.kill.notify_one();
        if self.fd >= 0 {
            // SAFETY: `fd` is the socket of a connection still registered on
            // this shard's thread; it is unregistered before the socket is
            // closed, on this same thread, so the descriptor cannot have been
            // reused by another file. shutdown() only changes its state.
            unsafe {
                libc::shutdown(self.fd, libc::SHUT_RDWR);
            }
        }
    }

    /// Marks the connection killed without cutting its socket: for a client
    /// that kills itself and must still get its reply.
    pub fn kill_after_reply(&mut self) {
        self.killed = true;
    }
}

/// The connections of one shard, by id.
#[derive(Default)]
pub struct ClientRegistry {
    clients: BTreeMap<u64, Rc<RefCell<ClientInfo>>>,
    /// Connections that left lately for another shard (`net::packing`):
    /// what they were, where they went, when (`mono_ns`).
    departed: Vec<(ClientInfo, usize, u64)>,
}

/// How long a connection that moved away is remembered: its move takes
/// one mailbox job, microseconds; this covers any stall.
const DEPARTED_NS: u64 = 10_000_000_000;

impl ClientRegistry {
    /// Registers a connection.
    pub fn add(&mut self, info: Rc<RefCell<ClientInfo>>) {
        let id = info.borrow().id;
        self.clients.insert(id, info);
    }

    /// Forgets a connection.
    pub fn remove(&mut self, id: u64) {
        self.clients.remove(&id);
    }

    /// Notes that connection `info`, already forgotten here, is on its way
    /// to shard `to`. Until its move job has surely run there, a CLIENT
    /// KILL that finds it in no registry finds it here
    /// ([`ClientRegistry::departed_matching`]).
    pub fn depart(&mut self, info: &ClientInfo, to: usize) {
        let now = kvtier_store::mono_ns();
        self.departed
            .retain(|(.., at)| now.saturating_sub(*at) < DEPARTED_NS);
        self.departed.push((info.clone(), to, now));
    }

    /// `(shard, id)` of the connections `matches` accepts that left for
    /// another shard lately. A kill posted there now runs after their
    /// move job, which was posted before this call.
    pub fn departed_matching(&self, matches: impl Fn(&ClientInfo) -> bool) -> Vec<(usize, u64)> {
        let now = kvtier_store::mono_ns();
        self.departed
            .iter()
            .filter(|(info, _, at)| now.saturating_sub(*at) < DEPARTED_NS && matches(info))
            .map(|(info, to, _)| (*to, info.id))
            .collect()
    }

    /// A CLIENT KILL sent after connection `id`, which left another shard
    /// for this one: kills it here (1, or 0 if it was killed already);
    /// `Err`: it is not here, and where it went if it moved on.
    pub fn kill_moved(&self, id: u64) -> Result<usize, Vec<(usize, u64)>> {
        match self.clients.get(&id) {
            Some(c) if c.borrow().killed => Ok(0),
            Some(c) => {
                c.borrow_mut().kill();
                Ok(1)
            }
            None => Err(self.departed_matching(|c| c.id == id)),
        }
    }

    /// Number of connections.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// CLIENT LIST lines of the clients `keep` accepts.
    pub fn lines(&self, keep: impl Fn(&ClientInfo) -> bool) -> Vec<(u64, String)> {
        self.clients
            .values()
            .map(|c| c.borrow())
            // A killed client is gone for CLIENT LIST at once, as in Redis
            // (its task leaves the registry a moment later).
            .filter(|c| !c.killed && keep(c))
            .map(|c| (c.id, c.line()))
            .collect()
    }

    /// Kills the clients `matches` accepts; returns how many. Client
    /// `caller` (the one asking) is only marked, so it gets its reply.
    pub fn kill(&self, matches: impl Fn(&ClientInfo) -> bool, caller: Option<u64>) -> usize {
        let mut killed = 0;
        for c in self.clients.values() {
            let mut c = c.borrow_mut();
            if matches(&c) {
                if Some(c.id) == caller {
                    c.kill_after_reply();
                } else {
                    c.kill();
                }
                killed += 1;
            }
        }
        killed
    }

    /// Kills the clients that have waited for their next request for
    /// `timeout` or longer (`--timeout`); returns how many.
    pub fn kill_idle(&self, timeout: Duration) -> usize {
        let (now, timeout) = (kvtier_store::mono_ns(), timeout.as_nanos() as u64);
        self.kill(
            |c| {
                c.idle_since
                    .is_some_and(|since| now.saturating_sub(since) >= timeout)
            },
            None,
        )
    }

    /// Kills every client (shutdown).
    pub fn kill_all(&self) {
        self.kill(|_| true, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, port: u16) -> ClientInfo {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        ClientInfo::new(id, addr, addr, -1)
    }

    #[test]
    fn a_departed_connection_is_found_where_it_went() {
        let mut here = ClientRegistry::default();
        here.add(Rc::new(RefCell::new(info(1, 1001))));
        here.add(Rc::new(RefCell::new(info(2, 1002))));
        let moving = info(2, 1002);
        here.remove(2);
        here.depart(&moving, 1);
        assert_eq!(here.kill(|c| c.id == 2, None), 0, "not registered here");
        assert_eq!(here.departed_matching(|c| c.id == 2), vec![(1, 2)]);
        assert!(here.departed_matching(|c| c.id == 1).is_empty());
        // Where it went, the kill sent after it counts it once.
        let mut there = ClientRegistry::default();
        there.add(Rc::new(RefCell::new(moving)));
        assert_eq!(there.kill_moved(2), Ok(1));
        assert_eq!(there.kill_moved(2), Ok(0), "killed already");
        // Not there: it moved on (or is gone).
        here.depart(&info(3, 1003), 0);
        assert_eq!(here.kill_moved(3), Err(vec![(0, 3)]));
        assert_eq!(there.kill_moved(3), Err(vec![]));
    }
}
