//! One client connection: read, parse, execute, reply.
//!
//! Everything that is already in the read buffer is parsed and executed as
//! one batch. Single-key commands for this shard run inline at once; those
//! for other shards are queued per shard and sent as one mailbox job per
//! shard, so a pipeline costs one cross-thread round trip per shard instead
//! of one per command. A command that needs every shard (MGET, INFO, ...)
//! first waits for what is queued, so it sees the effects of the commands
//! before it. Replies go out in order with one vectored write.
//!
//! Each key's commands apply in pipeline order (a key has one owner and each
//! mailbox is FIFO); commands on different shards may become visible to
//! other clients in a different order, as with a pipeline spread over Redis
//! Cluster nodes.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kvtier_protocol::{Reply, ReplyBuf, Request, RequestParser};
use kvtier_store::{mono_ns, now_ms};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::batch::{Batch, BatchEnd, Entry, Remote};
use super::handover::{send_socket, Handover};
use super::idle_poll::PollPlan;
use super::packing;
use crate::admission::{self, Admitted, LastLookup};
use crate::clients::ClientInfo;
use crate::commands::registry::table;
use crate::commands::{
    flags, unknown_subcommand, Args, AsyncFn, Client, CommandSpec, LocalBoxFuture, Plan, ShardOp,
};
use crate::config::Num;
use crate::coordination::Through;
use crate::shard::watching::Watching;
use crate::shard::{Access, Shard, ShardGone};
use crate::shared::ShardSeat;

/// Bytes read per `read` call into the shared read buffer.
const READ_CHUNK: usize = 16 * 1024;
/// Most commands executed before replies are written.
const MAX_BATCH: usize = 1024;
/// Most bytes read ahead while a blocking command waits.
const MAX_BUFFERED_WHILE_BLOCKED: usize = 1024 * 1024;
/// Commands timed together by one clock read.
const TIMING_GROUP: usize = 8;
/// How long polling stays off after two connections of a shard read in
/// turn.
const POLL_QUIET_NS: u64 = 2_000_000;
/// Output size after which a batch is cut short and written.
const MAX_PENDING_OUTPUT: usize = 4 * 1024 * 1024;

/// What a connection reads and writes: plain TCP, or TLS (`--tls-port`).
/// The connection is generic over it, so a plain connection pays for no
/// TLS check on its reads and writes.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {
    /// TLS: writes are held (as records) until flushed, and what has
    /// arrived cannot be looked for without a read that may wait.
    const TLS: bool;

    /// Reads what has arrived without waiting (`WouldBlock`: nothing).
    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize>;

    /// The plain socket, out of this thread's runtime, to be served by
    /// another shard's (`None`: this stream cannot move).
    fn into_std(self) -> Option<std::net::TcpStream>;
}

impl ClientIo for TcpStream {
    const TLS: bool = false;

    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        TcpStream::try_read_buf(self, buf)
    }

    fn into_std(self) -> Option<std::net::TcpStream> {
        TcpStream::into_std(self).ok()
    }
}

impl ClientIo for Box<tokio_rustls::server::TlsStream<TcpStream>> {
    const TLS: bool = true;

    fn try_read_buf(&self, _buf: &mut BytesMut) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    /// A TLS session's state stays with its thread.
    fn into_std(self) -> Option<std::net::TcpStream> {
        None
    }
}

/// How long a TLS client may take to finish its handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one accepted connection (after its TLS handshake when `tls`)
/// until it closes; `seat` counts it (on this shard, and among the
/// server's connections) until then.
pub async fn accept(
    shard: Rc<Shard>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: bool,
    seat: ShardSeat,
) {
    let _ = tcp.set_nodelay(true);
    let local = tcp.local_addr().unwrap_or(peer);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
    match shard.shared.config.tls.as_ref().filter(|_| tls) {
        None => serve(shard, tcp, peer, local, fd, seat).await,
        Some(config) => {
            if !starts_a_tls_handshake(&tcp).await {
                // A plain RESP client on the TLS port: say so in its own
                // language instead of a handshake failure it cannot read.
                let mut tcp = tcp;
                let said = kvtier_timer::timeout(LINGER, tcp.write_all(NOT_TLS_ERROR)).await;
                if let Ok(Ok(())) = said {
                    linger(&mut tcp, 64 * 1024).await;
                }
                debug!("{peer} spoke plain text to the TLS port");
                return;
            }
            let acceptor = tokio_rustls::TlsAcceptor::from(config.server_config());
            match kvtier_timer::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => serve(shard, Box::new(s), peer, local, fd, seat).await,
                Ok(Err(e)) => debug!("TLS handshake with {peer}: {e}"),
                Err(_) => debug!("TLS handshake with {peer}: timed out"),
            }
        }
    }
}

/// What a client that is not speaking TLS reads from the TLS port.
const NOT_TLS_ERROR: &[u8] = b"-ERR this port speaks TLS: connect with TLS (kvtiers://, \
rediss://, redis-cli --tls) or to the server's plain port\r\n";

/// Whether the first byte a client sends opens a TLS record of the
/// handshake type (every ClientHello does); false for a plain RESP
/// request, a client that closes, or one that sends nothing in time.
async fn starts_a_tls_handshake(tcp: &TcpStream) -> bool {
    const HANDSHAKE: u8 = 0x16;
    let mut first = [0u8; 1];
    matches!(
        kvtier_timer::timeout(TLS_HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await,
        Ok(Ok(1)) if first[0] == HANDSHAKE
    )
}

/// How long a connection closed after an error reads what its client
/// still sends ([`linger`]).
const LINGER: Duration = Duration::from_millis(500);
/// Most bytes [`linger`] reads after a protocol error.
const LINGER_BYTES: usize = 64 << 20;

/// Closes the way HTTP servers do after an error: the write side is shut
/// (the client reads the error, then EOF) and what the client is still
/// sending is read and dropped, for at most [`LINGER`] and `max` bytes, so
/// the close does not turn into a reset that destroys the error before it
/// is read.
async fn linger<S: ClientIo>(stream: &mut S, max: usize) {
    let _ = kvtier_timer::timeout(LINGER, async {
        stream.shutdown().await?;
        let mut sink = vec![0u8; READ_CHUNK];
        let mut drained = 0;
        while drained < max {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// Serves one connection until it closes (or moves to another shard).
async fn serve<S: ClientIo>(
    shard: Rc<Shard>,
    mut stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    fd: std::os::fd::RawFd,
    seat: ShardSeat,
) {
    if shard.shared.config.refuses(peer.ip()) {
        // Protected mode: explain, then close (as Redis does at accept).
        let error = crate::config::PROTECTED_MODE_ERROR.as_bytes();
        if let Ok(Ok(())) = kvtier_timer::timeout(LINGER, stream.write_all(error)).await {
            linger(&mut stream, 64 * 1024).await;
        }
        shard.stats.borrow_mut().rejected_connections += 1;
        return;
    }
    let shared = Arc::clone(&shard.shared);
    let id = shared.next_client_id.fetch_add(1, Relaxed);
    shard.stats.borrow_mut().connections_received += 1;
    let info = ClientInfo::new(id, peer, local, fd);
    let session = Handover::new(&shared);
    let settled = mono_ns() + packing::SETTLE_NS;
    Connection::new(shard, stream, info, session, settled)
        .serve(seat)
        .await;
}

struct Connection<S: ClientIo> {
    stream: S,
    rbuf: BytesMut,
    parser: RequestParser,
    out: ReplyBuf,
    client: Client,
    /// When the commands in `untimed` began (command timing): a
    /// [`mono_ns`] reading.
    clock: u64,
    /// Commands run since `clock` whose time is not yet taken: the clock is
    /// read once for a few commands, not once per command.
    untimed: Vec<(usize, bool)>,
    /// The last command looked up, by its name as sent.
    last_lookup: LastLookup,
    /// Unix milliseconds for the commands of the current batch.
    now_ms: u64,
    /// This connection's share of `Shared::client_query_bytes`.
    query_bytes: usize,
    /// Why the last request could not be parsed (the batch's last reply).
    protocol_error: Option<String>,
    /// Whether polling for the next request pays for this client.
    poll_plan: PollPlan,
    /// When (mono ns) the connection may first be packed on another shard.
    settled: u64,
}

/// A command body that awaits other shards or nodes.
#[derive(Clone, Copy)]
enum Awaited {
    /// The command's own (async) handler.
    Command(AsyncFn),
    /// A cluster path (see `coordination`).
    Through(Through),
}

impl Awaited {
    fn start<'a>(
        self,
        client: &'a mut Client,
        spec: &'static CommandSpec,
        args: Args,
    ) -> LocalBoxFuture<'a> {
        match self {
            Awaited::Command(f) => f(client, args),
            Awaited::Through(t) => t.start(client, spec, args),
        }
    }
}

impl<S: ClientIo> Connection<S> {
    /// A connection served by `shard` from now on (its info registered
    /// there).
    fn new(
        shard: Rc<Shard>,
        stream: S,
        info: ClientInfo,
        session: Handover,
        settled: u64,
    ) -> Connection<S> {
        let shared = &shard.shared;
        let id = info.id;
        let info = Rc::new(RefCell::new(info));
        shard.clients.borrow_mut().add(Rc::clone(&info));
        let parser = RequestParser::new(shared.config.num(Num::ProtoMaxBulkLen) as usize);
        Connection {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            parser,
            out: ReplyBuf::new(),
            client: Client {
                shard: Rc::clone(&shard),
                info,
                resp3: session.resp3,
                authenticated: session.authenticated,
                user: session.user,
                acl_epoch: session.acl_epoch,
                no_touch: session.no_touch,
                readonly: session.readonly,
                peer: false,
                close_after_reply: false,
                multi: None,
                watching: Watching::new(shard, id),
                commands: table(),
            },
            clock: mono_ns(),
            untimed: Vec::with_capacity(TIMING_GROUP),
            last_lookup: LastLookup::default(),
            now_ms: now_ms(),
            query_bytes: 0,
            protocol_error: None,
            poll_plan: session.poll_plan,
            settled,
        }
    }

    /// Serves the connection until it closes, or hands it to the shard
    /// that is to serve it from now on.
    async fn serve(mut self, seat: ShardSeat) {
        let moving = match self.run().await {
            Ok(to) => to,
            Err(e) => {
                let info = self.client.info.borrow();
                debug!("client {} ({}): {e}", info.id, info.addr);
                None
            }
        };
        let shard = Rc::clone(&self.client.shard);
        shard
            .shared
            .client_query_bytes
            .fetch_sub(self.query_bytes as u64, Relaxed);
        shard.clients.borrow_mut().remove(self.client.id());
        if let Some(to) = moving {
            self.move_to(to, seat);
        }
    }

    /// Where this connection should be served now, checked between
    /// requests (`net::packing`): `None` to stay. Only a connection with
    /// nothing half done and nothing tied to this thread moves: no
    /// request partly read, no MULTI or WATCH, no TLS session, not a peer
    /// node, no link events of its writes still to apply here.
    #[inline]
    fn move_target(&self) -> Option<usize> {
        if S::TLS {
            return None;
        }
        let shard = &self.client.shard;
        let to = packing::move_target(&shard.shared, shard.id)?;
        let client = &self.client;
        let still = self.clock < self.settled
            || !self.rbuf.is_empty()
            || self.parser.in_progress()
            || client.multi.is_some()
            || !client.watching.is_empty()
            || client.peer
            || client.info.borrow().killed
            || shard.links_queued_here();
        (!still).then_some(to)
    }

    /// Hands the connection to shard `to` (already out of this shard's
    /// registry). If it cannot move, it is closed: the client sees its
    /// connection end between two replies, as after a restart.
    fn move_to(self, to: usize, mut seat: ShardSeat) {
        let Connection {
            stream,
            client,
            poll_plan,
            ..
        } = self;
        let (Ok(info), Some(stream)) = (Rc::try_unwrap(client.info), stream.into_std()) else {
            warn!("a client connection could not move to shard {to}: closed");
            return;
        };
        let session = Handover {
            resp3: client.resp3,
            authenticated: client.authenticated,
            user: client.user,
            acl_epoch: client.acl_epoch,
            no_touch: client.no_touch,
            readonly: client.readonly,
            poll_plan,
        };
        seat.move_to(to);
        client.shard.stats.borrow_mut().connections_moved += 1;
        let info = info.into_inner();
        client.shard.clients.borrow_mut().depart(&info, to);
        send_socket(&client.shard, to, stream, move |shard, stream| {
            Connection::new(shard, stream, info, session, 0).serve(seat)
        });
    }

    /// Serves the connection: batches of the requests read so far, their
    /// replies, then more reading, until the client or the server ends it.
    /// (The steps' awaits stay here: an `async fn` per step would cost
    /// every request a future of its own.) `Some(shard)`: the connection is
    /// to be served by that shard now.
    async fn run(&mut self) -> std::io::Result<Option<usize>> {
        if self.client.shard.shared.shutting_down() {
            return Ok(None);
        }
        loop {
            // Link events queued here go first: the client's previous
            // replies waited for them.
            if self.client.shard.links_queued_here() {
                self.client.shard.settle_links().await;
            }
            let mut batch = Batch::default();
            self.start_batch(&mut batch);
            let end = loop {
                match self.next_request(&batch) {
                    Ok(request) => {
                        self.dispatch(request, &mut batch).await;
                        if self.client.close_after_reply {
                            break BatchEnd::Closing;
                        }
                    }
                    Err(end) => break end,
                }
            };
            self.finish(batch).await;
            if end == BatchEnd::Fatal {
                self.queue_protocol_error();
            }
            if !self.out.is_empty() && !self.send_replies().await? {
                return Ok(None);
            }
            if self.client.close_after_reply {
                if end == BatchEnd::Fatal {
                    linger(&mut self.stream, LINGER_BYTES).await;
                }
                return Ok(None);
            }
            if end == BatchEnd::CutShort {
                continue;
            }
            if !self.within_query_limits() {
                return Ok(None);
            }
            if let Some(to) = self.move_target() {
                return Ok(Some(to));
            }
            // Polling first (`--idle-poll-us`), then a read that may wait.
            let n = match self.idle_poll().await? {
                Some(n) => n,
                None => {
                    self.before_waiting();
                    let n = self.read_into_buffers().await?;
                    if n == 0 || self.client.info.borrow().killed {
                        return Ok(None);
                    }
                    n
                }
            };
            self.client.shard.stats.borrow_mut().net_input_bytes += n as u64;
        }
    }

    /// Starts a batch: the clock is read once for it. (`remote` gets its
    /// per-shard queues when a command is first queued for another shard:
    /// none for a batch that runs here.)
    #[inline(always)]
    fn start_batch(&mut self, batch: &mut Batch) {
        let shared = &self.client.shard.shared;
        self.parser
            .set_max_bulk(shared.config.num(Num::ProtoMaxBulkLen) as usize);
        batch.rounds_from = self.client.shard.round_mark();
        self.clock = mono_ns();
        self.poll_plan.arrived(self.clock);
        self.note_reader();
        self.now_ms = kvtier_store::ms_at(self.clock);
        let mut info = self.client.info.borrow_mut();
        info.last_active = self.clock;
        info.idle_since = None;
    }

    /// The next request of the batch, or how the batch ends (full, drained,
    /// or a request that cannot be parsed).
    #[inline(always)]
    fn next_request(&mut self, batch: &Batch) -> Result<Request, BatchEnd> {
        if batch.entries.len() >= MAX_BATCH || self.out.pending() >= MAX_PENDING_OUTPUT {
            return Err(BatchEnd::CutShort);
        }
        self.parser.set_unauthenticated(!self.client.authenticated);
        match self.parser.parse(&mut self.rbuf) {
            Ok(Some(request)) => Ok(request),
            Ok(None) => Err(BatchEnd::Drained),
            Err(e) => {
                self.protocol_error = Some(e.0);
                Err(BatchEnd::Fatal)
            }
        }
    }

    /// After a protocol error, its error is the batch's last reply and the
    /// connection closes once the replies are out.
    #[cold]
    fn queue_protocol_error(&mut self) {
        let why = self.protocol_error.take().unwrap_or_default();
        debug!("protocol error from client {}: {why}", self.client.id());
        let reply = Reply::error(format!("ERR {why}"));
        self.count_error(&reply);
        self.out.push(&reply, self.client.resp3);
        self.client.close_after_reply = true;
    }

    /// Writes the pending replies (watched, [`Connection::write_watched`]);
    /// `false` when the connection is to close.
    async fn send_replies(&mut self) -> std::io::Result<bool> {
        let bytes = self.out.pending() as u64;
        if !self.write_watched().await? {
            return Ok(false);
        }
        self.client.shard.stats.borrow_mut().net_output_bytes += bytes;
        Ok(true)
    }

    /// The client is waiting to be read from now: past `--timeout` the
    /// shard's cron closes the connection (as Redis's clientsCron does), so
    /// the read needs no timer of its own.
    #[inline(always)]
    fn before_waiting(&mut self) {
        self.client.info.borrow_mut().idle_since = Some(self.clock);
    }

    /// Reads what the client sends next: into the big argument arriving,
    /// else into the read buffer. CLIENT KILL, shutdown and the idle
    /// timeout shut the socket down, which ends this read; nothing else
    /// needs watching on the hot path.
    async fn read_into_buffers(&mut self) -> std::io::Result<usize> {
        let Connection {
            stream,
            rbuf,
            parser,
            ..
        } = self;
        match parser.big_bulk_buffer() {
            Some(big) => stream.read_buf(big).await,
            None => {
                // Room for a chunk is made only when little is left
                // (reserving on every read costs a reclaim each time).
                if rbuf.capacity() - rbuf.len() < READ_CHUNK / 4 {
                    rbuf.reserve(READ_CHUNK);
                }
                stream.read_buf(rbuf).await
            }
        }
    }

    /// Before reading more: what the request still arriving holds (read
    /// buffer and arguments so far) against `client-query-buffer-limit`
    /// and, with every connection's, against `maxmemory-clients`. `false`:
    /// over a limit, the connection is to be closed (as Redis closes it,
    /// with no reply: the request never ends).
    #[inline(always)]
    fn within_query_limits(&mut self) -> bool {
        let held = self.rbuf.len() + self.parser.pending_bytes();
        {
            let mut info = self.client.info.borrow_mut();
            info.qbuf = held;
            info.omem = 0;
        }
        let shared = &self.client.shard.shared;
        // The shared total is touched only when this connection's share
        // changed (between whole requests it stays 0: no shared cache line
        // written per batch).
        let grew = held > self.query_bytes;
        let mut total = 0;
        if grew {
            let more = (held - self.query_bytes) as u64;
            total = shared.client_query_bytes.fetch_add(more, Relaxed) + more;
        } else if held < self.query_bytes {
            let less = (self.query_bytes - held) as u64;
            shared.client_query_bytes.fetch_sub(less, Relaxed);
        }
        self.query_bytes = held;
        if held == 0 {
            return true;
        }
        let config = &shared.config;
        let (id, addr) = (self.client.id(), self.client.info.borrow().addr);
        if held as u64 > config.num(Num::ClientQueryBufferLimit) {
            warn!("closing client {id} ({addr}): its request reached client-query-buffer-limit ({held} bytes)");
            self.client.shard.stats.borrow_mut().query_buffer_closed += 1;
            return false;
        }
        let all = config.num(Num::MaxmemoryClients);
        let exempt = self.client.info.borrow().no_evict;
        if all > 0 && total > all && grew && !exempt {
            warn!("evicting client {id} ({addr}): requests being received hold {total} bytes, over maxmemory-clients");
            self.client.shard.stats.borrow_mut().evicted_clients += 1;
            return false;
        }
        true
    }

    /// Writes the pending replies, watched: `client-output-buffer-limit`
    /// (pending bytes, values the replies reference included, over the hard
    /// limit, or over the soft one for its seconds) and `--timeout` (no byte
    /// taken by the client for that long: it stopped reading) close the
    /// client, so a stalled reader cannot pin memory for good. A write the
    /// socket takes at once needs no clock and no timer; only a client slow
    /// to take its replies is timed. `Ok(false)`: closed for that.
    async fn write_watched(&mut self) -> std::io::Result<bool> {
        let config = &self.client.shard.shared.config;
        let (hard, soft, soft_secs) = (
            config.output_hard.load(Relaxed) as usize,
            config.output_soft.load(Relaxed) as usize,
            Duration::from_secs(config.output_soft_secs.load(Relaxed)),
        );
        let idle = config.num(Num::Timeout);
        let mut over_soft_since: Option<Instant> = None;
        let mut waited = false;
        while !self.out.is_empty() {
            let pending = self.out.pending();
            if hard > 0 && pending > hard {
                output_limit_hit(&self.client, "hard", pending);
                return Ok(false);
            }
            let write = self.out.write_once(&mut self.stream);
            tokio::pin!(write);
            let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
            if let Poll::Ready(written) = first {
                written?;
                continue;
            }
            // Slow to take them: CLIENT LIST shows it, the limits time it.
            self.client.info.borrow_mut().omem = pending;
            waited = true;
            let now = Instant::now();
            if soft > 0 && pending > soft {
                let since = *over_soft_since.get_or_insert(now);
                if now.duration_since(since) >= soft_secs {
                    output_limit_hit(&self.client, "soft", pending);
                    return Ok(false);
                }
            } else {
                over_soft_since = None;
            }
            // Wait for the socket at most until the client has been silent
            // for --timeout, or until the soft limit's time is up.
            let silent_until = (idle > 0).then(|| now + Duration::from_secs(idle));
            let soft_until = over_soft_since.map(|since| since + soft_secs);
            let Some(until) = silent_until.into_iter().chain(soft_until).min() else {
                write.await?;
                continue;
            };
            match kvtier_timer::timeout_at(until, write).await {
                Ok(written) => {
                    written?;
                }
                Err(_) if silent_until.is_some_and(|t| Instant::now() >= t) => {
                    let (id, addr) = (self.client.id(), self.client.info.borrow().addr);
                    warn!("closing client {id} ({addr}): it read nothing for {idle} s (timeout) with {pending} bytes of replies pending");
                    return Ok(false);
                }
                // The soft limit's time is up: checked on the next round.
                Err(_) => {}
            }
        }
        if waited {
            // The client's idle time (`--timeout`) starts when it has taken
            // its replies, not when they were ready.
            self.clock = mono_ns();
        }
        // TLS took the replies as plaintext; the records the socket did not
        // take yet must still go out (within --timeout, as any write).
        if S::TLS {
            let flush = self.stream.flush();
            if idle == 0 {
                flush.await?;
            } else if kvtier_timer::timeout(Duration::from_secs(idle), flush)
                .await
                .is_err()
            {
                let (id, addr) = (self.client.id(), self.client.info.borrow().addr);
                warn!("closing client {id} ({addr}): it read nothing for {idle} s (timeout)");
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Notes that this connection is reading a request: when the last
    /// reader was another connection, polling is off for a while
    /// ([`POLL_QUIET_NS`]).
    fn note_reader(&self) {
        let shard = &self.client.shard;
        let id = self.client.id();
        if shard.last_reader.get().0 != id {
            shard.last_reader.set((id, self.clock + POLL_QUIET_NS));
        }
    }

    /// `--idle-poll-us`: before the shard thread may sleep, keeps looking
    /// for this client's next request for a few microseconds, yielding to
    /// every other task between looks (each yield lets the runtime poll
    /// its sockets without blocking). A request that arrives meanwhile is
    /// read at once: no thread wake-up. Returns the bytes read, `None`
    /// when the window passed (or polling is off, or another connection of
    /// this shard is polling).
    async fn idle_poll(&mut self) -> std::io::Result<Option<usize>> {
        let window = self.client.shard.shared.config.num(Num::IdlePollUs);
        let shard = Rc::clone(&self.client.shard);
        let contended = self.clock < shard.last_reader.get().1;
        // A TLS record cannot be looked for without a read that may wait:
        // TLS connections do not poll.
        if window == 0
            || !self.poll_plan.wants_poll()
            || contended
            || shard.polling.get()
            || self.parser.big_bulk_buffer().is_some()
            || S::TLS
        {
            return Ok(None);
        }
        shard.polling.set(true);
        let started = Instant::now();
        let window = Duration::from_micros(window);
        let found = loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(n) => break Ok(Some(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => break Err(e),
            }
            if started.elapsed() >= window || self.client.info.borrow().killed {
                break Ok(None);
            }
            tokio::task::yield_now().await;
        };
        shard.polling.set(false);
        self.poll_plan.polled(matches!(found, Ok(Some(_))));
        let mut stats = shard.stats.borrow_mut();
        stats.idle_poll_us += started.elapsed().as_micros() as u64;
        stats.idle_poll_hits += matches!(found, Ok(Some(n)) if n > 0) as u64;
        drop(stats);
        match found {
            // EOF: let the blocking read below see it.
            Ok(Some(0)) => Ok(None),
            other => other,
        }
    }

    /// Looks up, checks and runs (or queues) one command.
    async fn dispatch(&mut self, request: Request, batch: &mut Batch) {
        let resp3 = self.client.resp3;
        let (id, spec, args, through) =
            match admission::admit(&mut self.client, &mut self.last_lookup, request.args) {
                Admitted::Run {
                    id,
                    spec,
                    args,
                    through,
                } => (id, spec, args, through),
                Admitted::Answered { reply, ran } => {
                    self.doom_transaction();
                    if let Some(id) = ran {
                        self.record(id, &reply);
                    }
                    return self.ready(batch, reply, resp3);
                }
                Admitted::Close => {
                    self.client.close_after_reply = true;
                    return;
                }
            };
        if self.client.multi.is_some() && !spec.has(flags::TX_NOW) {
            return self.queue_in_multi(id, spec, args, batch);
        }
        self.client.info.borrow_mut().last_cmd = spec.name;
        if spec.has(flags::DENYOOM) {
            self.wait_for_spill(batch).await;
            if !spec.has(flags::OOM_PER_KEY) {
                if let Some(refusal) = crate::commands::too_large_for_a_shard(&self.client, &args) {
                    let resp3 = self.client.resp3;
                    return self.ready(batch, refusal, resp3);
                }
            }
        }
        let Some((body, args)) = self.plan(id, spec, args, through, batch) else {
            return;
        };
        self.run_awaited(id, spec, body, args, batch).await;
    }

    /// Inside MULTI a refused command dooms the transaction.
    #[inline(always)]
    fn doom_transaction(&mut self) {
        if let Some(tx) = &mut self.client.multi {
            tx.failed = true;
        }
    }

    /// Inside MULTI, queues a command that does not run at once (EXEC,
    /// DISCARD, ... do): `QUEUED`.
    fn queue_in_multi(
        &mut self,
        id: usize,
        spec: &'static CommandSpec,
        args: Args,
        batch: &mut Batch,
    ) {
        if let Some(tx) = &mut self.client.multi {
            tx.queued.push((id, spec, args));
        }
        let resp3 = self.client.resp3;
        self.ready(batch, Reply::status("QUEUED"), resp3);
    }

    /// A write queue the disk cannot keep up with slows the writers (and
    /// only them) down, so evicted blocks are written, not dropped.
    async fn wait_for_spill(&mut self, batch: &mut Batch) {
        if let Some(tier) = &self.client.shard.shared.spill {
            if tier.dir.congested() {
                let dir = Arc::clone(&tier.dir);
                self.send_remote(batch).await;
                dir.drain(kvtier_timer::sleep(Duration::from_secs(1))).await;
                self.now_ms = now_ms();
            }
        }
    }

    /// How the command runs: batched with the pipeline for the owning
    /// shard (inline when that is this one) or answered now, both done
    /// here (`None`); or awaited, by its own handler or a cluster path.
    #[inline(always)]
    fn plan(
        &mut self,
        id: usize,
        spec: &'static CommandSpec,
        args: Args,
        through: Option<Through>,
        batch: &mut Batch,
    ) -> Option<(Awaited, Args)> {
        if let Some(t) = through {
            return Some((Awaited::Through(t), args));
        }
        let resp3 = self.client.resp3;
        match Plan::of(&self.client, spec, args) {
            Plan::Shard(op) => {
                self.run_on(id, op, batch);
                None
            }
            Plan::Now(f, a) => {
                let reply = f(&mut self.client, &a);
                self.parser.recycle(a.into_vec());
                self.record(id, &reply);
                let resp3 = self.client.resp3;
                self.ready(batch, reply, resp3);
                None
            }
            Plan::Parent(a) => {
                self.ready(batch, unknown_subcommand(spec.name, &a[0]), resp3);
                None
            }
            Plan::Await(f, a) => Some((Awaited::Command(f), a)),
        }
    }

    /// Runs a command that awaits other shards or nodes, after everything
    /// queued before it (it sees their effects), timed on its own.
    async fn run_awaited(
        &mut self,
        id: usize,
        spec: &'static CommandSpec,
        body: Awaited,
        args: Args,
        batch: &mut Batch,
    ) {
        self.send_remote(batch).await;
        self.take_time();
        let reply = if spec.has(flags::BLOCKING) {
            match self.run_blocking(body, spec, args).await {
                Some(reply) => reply,
                None => {
                    // The client left (or was killed) mid-wait: the
                    // dropped command released what it held.
                    self.client.close_after_reply = true;
                    return;
                }
            }
        } else {
            body.start(&mut self.client, spec, args).await
        };
        // Timed on its own: it may have waited for other shards.
        self.untimed.push((id, reply.is_error()));
        self.take_time();
        self.now_ms = kvtier_store::ms_at(self.clock);
        let resp3 = self.client.resp3;
        self.ready(batch, reply, resp3);
    }

    /// Runs a command that may wait a long time, while still noticing the
    /// client going away: bytes that arrive meanwhile are kept for later (up
    /// to a bound), and EOF, CLIENT KILL or shutdown abandon the command.
    async fn run_blocking(
        &mut self,
        body: Awaited,
        spec: &'static CommandSpec,
        args: Args,
    ) -> Option<Reply> {
        let kill = Arc::clone(&self.client.info.borrow().kill);
        let mut shutdown = self.client.shard.shared.shutdown_signal();
        let Connection {
            client,
            stream,
            rbuf,
            ..
        } = self;
        let shard = Rc::clone(&client.shard);
        let mut command = body.start(client, spec, args);
        loop {
            let room = rbuf.len() < MAX_BUFFERED_WHILE_BLOCKED;
            tokio::select! {
                reply = &mut command => return Some(reply),
                read = stream.read_buf(rbuf), if room => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => shard.stats.borrow_mut().net_input_bytes += n as u64,
                },
                _ = kill.notified() => return None,
                _ = shutdown.changed() => return None,
            }
        }
    }

    /// Runs `op` on its shard: inline now if that is this shard; a read of
    /// another shard with nothing of this batch queued before it there,
    /// inline too when that shard's store is free (no wake-up); else queued
    /// for the owner's next batch job.
    fn run_on(&mut self, id: usize, op: ShardOp, batch: &mut Batch) {
        let shard = &self.client.shard;
        let now = self.now_ms;
        let done = if op.owner == shard.id {
            Some(op.run(&mut shard.store.lock(), now))
        } else if op.access == Access::Read && batch.remote.get(op.owner).is_none_or(Vec::is_empty)
        {
            shard.read_now(op.owner, |store| op.run(store, now)).ok()
        } else {
            None
        };
        if let Some(reply) = done {
            self.parser.recycle(op.into_args());
            self.record(id, &reply);
            let resp3 = self.client.resp3;
            self.ready(batch, reply, resp3);
        } else {
            let entry = batch.entries.len();
            batch.entries.push(Entry {
                reply: None,
                resp3: self.client.resp3,
            });
            if batch.remote.is_empty() {
                batch.remote = (0..shard.count()).map(|_| Vec::new()).collect();
            }
            batch.remote[op.owner].push(Remote { entry, id, op });
            batch.remote_count += 1;
        }
    }

    /// Counts one execution. Its time is taken with the next few commands
    /// (one clock read per [`TIMING_GROUP`]) and shared out among them.
    fn record(&mut self, id: usize, reply: &Reply) {
        self.untimed.push((id, reply.is_error()));
        if self.untimed.len() >= TIMING_GROUP {
            self.take_time();
        }
    }

    /// Reads the clock and charges the elapsed time to the untimed commands.
    fn take_time(&mut self) {
        let now = mono_ns();
        if !self.untimed.is_empty() {
            let each = now.saturating_sub(self.clock) / self.untimed.len() as u64;
            let mut stats = self.client.shard.stats.borrow_mut();
            for (id, failed) in self.untimed.drain(..) {
                stats.record(id, each, failed);
            }
        }
        self.clock = now;
    }

    /// A command's reply: encoded at once unless an earlier command of the
    /// batch still waits for another shard.
    /// A reply still waiting for a disk read is queued the same way.
    fn ready(&mut self, batch: &mut Batch, reply: Reply, resp3: bool) {
        if batch.entries.is_empty() && !reply.has_pending() {
            if reply.is_error() {
                self.count_error(&reply);
            }
            self.out.push(&reply, resp3);
        } else {
            batch.entries.push(Entry {
                reply: Some(reply),
                resp3,
            });
        }
    }

    /// Sends the queued commands of each shard as one job and fills in the
    /// replies.
    async fn send_remote(&mut self, batch: &mut Batch) {
        if batch.remote_count == 0 && batch.entries.is_empty() {
            return;
        }
        batch.remote_count = 0;
        let shard = Rc::clone(&self.client.shard);
        let mut pending = Vec::new();
        for (target, queue) in batch.remote.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let work: Vec<Remote> = std::mem::take(queue);
            let indexes: Vec<usize> = work.iter().map(|r| r.entry).collect();
            let job = shard.call(target, move |s: &Shard| {
                let mut store = s.store.lock();
                let now = now_ms();
                let started = mono_ns();
                let mut done = Vec::with_capacity(work.len());
                let replies = work
                    .into_iter()
                    .map(|r| {
                        let reply = r.op.run(&mut store, now);
                        done.push((r.id, reply.is_error()));
                        reply
                    })
                    .collect::<Vec<Reply>>();
                // One clock read for the job, shared out among its commands.
                let each = mono_ns().saturating_sub(started) / done.len().max(1) as u64;
                let mut stats = s.stats.borrow_mut();
                for (id, failed) in done {
                    stats.record(id, each, failed);
                }
                replies
            });
            pending.push((indexes, job));
        }
        for (indexes, job) in pending {
            let replies = match job.await {
                Ok(replies) => replies,
                Err(_) => indexes.iter().map(|_| Reply::from(ShardGone)).collect(),
            };
            for (i, reply) in indexes.into_iter().zip(replies) {
                batch.entries[i].reply = Some(reply);
            }
        }
        // Everything queued is answered: encode in order, once the values
        // read from the spill tier are in.
        for entry in std::mem::take(&mut batch.entries) {
            let mut reply = entry.reply.unwrap_or(Reply::Nil);
            if reply.has_pending() {
                reply = reply.resolve().await;
            }
            if reply.is_error() {
                self.count_error(&reply);
            }
            self.out.push(&reply, entry.resp3);
        }
    }

    /// Resolves the batch and encodes its replies in order.
    async fn finish(&mut self, mut batch: Batch) {
        self.send_remote(&mut batch).await;
        self.take_time();
        // The replies go out once the link events the batch recorded here
        // are applied on every shard: the client's next request reads after
        // them, as in the policy simulator (bench/src/sim.rs). Whatever took them while the batch
        // waited for other shards (the mailbox, the cron, another
        // connection) is waited for too.
        let mark = batch.rounds_from;
        self.client.shard.links_applied(mark).await;
    }

    fn count_error(&self, reply: &Reply) {
        if let Reply::Error(msg) = reply {
            self.client.shard.stats.borrow_mut().error_reply(msg);
        }
    }
}

/// Logs and counts a client closed by client-output-buffer-limit.
fn output_limit_hit(client: &Client, which: &str, pending: usize) {
    let (id, addr) = (client.id(), client.info.borrow().addr);
    warn!("closing client {id} ({addr}): {pending} bytes of replies pending, over the {which} client-output-buffer-limit");
    client.shard.stats.borrow_mut().output_buffer_closed += 1;
}
