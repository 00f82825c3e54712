"""The synchronous client: the block dialect on its own sockets (redis-py for
every other command, :attr:`Client.redis`)."""

from __future__ import annotations

import builtins
import inspect
import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from ssl import SSLContext
from typing import Any, Optional, Union, overload

import redis
import redis.connection

from . import _commands as cmd
from ._buffers import Buffer, BufferSink
from ._commands import Key, Node, Value
from ._resp import Arg, BulkSink, ReplyParser, encode_command
from ._retry import Attempts, NodeOrder
from .errors import ConnectionError, ProtocolError, ResponseError, TimeoutError


class _LostBeforeReply(Exception):
    """Internal: the connection closed or broke before any byte of the
    reply (:meth:`kvtier._retry.Attempts.lost_before_reply`)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Connection:
    """One connection to a node: a socket (TLS-wrapped for ``kvtiers://``),
    authenticated, one command at a time."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock = sock
        self.timeout = timeout
        self.closed = False
        #: A plain socket: many buffers per ``sendmsg`` / ``recvmsg_into``
        #: (TLS has neither), decided once, not per command.
        self.plain = not isinstance(sock, ssl.SSLSocket) and hasattr(sock, "recvmsg_into")

    @classmethod
    def open(cls, node: Node, client: Client) -> _Connection:
        try:
            sock = socket.create_connection((node.host, node.port), timeout=client.connect_timeout)
        except builtins.TimeoutError as e:
            raise TimeoutError("connecting to %s timed out" % node) from e
        except OSError as e:
            raise ConnectionError("cannot connect to %s: %s" % (node, e)) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if client._tls is not None:
                sock = client._tls.wrap_socket(sock, server_hostname=node.host)
            sock.settimeout(client.socket_timeout)
        except builtins.TimeoutError as e:
            sock.close()
            raise TimeoutError("TLS handshake with %s timed out" % node) from e
        except OSError as e:
            sock.close()
            raise ConnectionError("cannot connect to %s: %s" % (node, e)) from e
        conn = cls(sock, client.socket_timeout)
        if client.password is not None:
            auth: list[Arg] = (
                ["AUTH", client.password]
                if client.username is None
                else ["AUTH", client.username, client.password]
            )
            try:
                _send(conn.sock, encode_command(auth), conn.plain)
                parser = ReplyParser(None)
                if not _receive(conn.sock, parser, conn.plain):
                    raise ConnectionError("%s closed the connection at AUTH" % node)
                parser.result()  # WRONGPASS: a ResponseError, as AsyncClient's
            except BaseException:
                conn.close()
                raise
        return conn

    def idle_ok(self) -> bool:
        """Whether a pooled connection is still open with nothing unread
        (a server closes idle connections after its ``timeout``). Through
        TLS a readable socket may hold only session tickets: a
        non-blocking read tells."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return True
            self.sock.setblocking(False)
            try:
                self.sock.recv(1)  # data nobody asked for, or the end
                return False
            finally:
                self.sock.settimeout(self.timeout)
        except (BlockingIOError, ssl.SSLWantReadError):
            return True
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class _NodePool:
    """Idle connections to one node, made on demand (thread-safe)."""

    def __init__(self, node: Node, client: Client) -> None:
        self.node = node
        self.client = client
        self.idle: list[_Connection] = []
        self.count = 0
        self.lock = threading.Lock()

    def acquire(self) -> tuple[_Connection, bool]:
        """A connection, and whether it came from the idle list."""
        while True:
            with self.lock:
                conn = self.idle.pop() if self.idle else None
                if conn is None:
                    limit = self.client.max_connections
                    if limit is not None and self.count >= limit:
                        raise ConnectionError("Too many connections")
                    self.count += 1
                    break
            if conn.idle_ok():
                return conn, True
            self.discard(conn)
        try:
            conn = _Connection.open(self.node, self.client)
        except BaseException:
            with self.lock:
                self.count -= 1
            raise
        return conn, False

    def release(self, conn: _Connection) -> None:
        if conn.closed:
            with self.lock:
                self.count -= 1
            return
        with self.lock:
            self.idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        conn.close()
        with self.lock:
            self.count -= 1

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
            self.count -= len(idle)
        for conn in idle:
            conn.close()


def _no_setinfo() -> dict[str, None]:
    """Options that make redis-py skip its ``CLIENT SETINFO`` round trips on
    connect (spelled differently across redis-py versions)."""
    params = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    if "driver_info" in params:
        return {"driver_info": None}
    if "lib_name" in params:
        return {"lib_name": None, "lib_version": None}
    return {}


_NO_SETINFO = _no_setinfo()


class Client:
    """A kvtier client for one node or a cluster's nodes (thread-safe).

    ``nodes`` is a URL, ``"kvtier://[user:password@]host:port[,host:port...]"``
    (``kvtiers://`` for TLS, its options as query parameters:
    ``kvtiers://h:6380?ssl_ca_certs=ca.crt&ssl_certfile=c.crt&ssl_keyfile=c.key``;
    keywords given here win over the URL's), or ``"host:port"``,
    ``"h1:p1,h2:p2"`` or a list of addresses; a malformed one is a
    ``ValueError`` that says what is wrong.

    TLS (``ssl=True`` or ``kvtiers://``) talks to a node's ``--tls-port``:
    ``ssl_ca_certs`` is the CA that signed its certificate (default: the
    system's), ``ssl_certfile``/``ssl_keyfile`` a client certificate (for
    ``--tls-auth-clients yes``), ``ssl_cert_reqs`` ``required`` (default),
    ``optional`` or ``none``, ``ssl_check_hostname`` whether the
    certificate must name the host (default: yes).
    kvtier nodes coordinate multi-key dialect commands themselves (the node
    that receives ``PREFIXLEN``/``MSETBLOCK`` splits the keys by owner and
    merges the answers), so those go to one node: the client spreads
    commands over the nodes in turn and skips nodes that do not answer.
    ``MGETPREFIX`` is the exception: relaying values through a coordinating
    node cost 2.9x in throughput here (docs/connectors.md), so against a
    cluster (``split_reads``, the default) the client reads the slot map
    (``CLUSTER SLOTS``, every few seconds) and asks each owner for its own
    keys in parallel, merging the prefix exactly as the server would.

    Large batches are striped: a 64-key read or write goes out as up to
    ``stripes`` commands over as many connections in parallel (one
    connection is served by one server thread), merged into one answer.

    The dialect's connections are the client's own (a pool per node, at
    most ``max_connections`` each; AUTH, TLS, timeouts), read straight into
    the caller's buffers; :attr:`redis` is a plain ``redis.Redis`` on the
    first node for every other command, with ``connection_kwargs`` passed
    to its ``ConnectionPool``. Which node a command goes to when one fails
    is :mod:`kvtier._retry`'s decision, the same as the asyncio client's.
    """

    def __init__(
        self,
        nodes: Union[str, Sequence[Union[str, tuple[str, int]]]] = "127.0.0.1:6379",
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        ssl: bool = False,
        ssl_ca_certs: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
        ssl_cert_reqs: Optional[str] = None,
        ssl_check_hostname: Optional[bool] = None,
        socket_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_connections: Optional[int] = None,
        split_reads: bool = True,
        stripes: int = cmd.STRIPES,
        **connection_kwargs: Any,
    ) -> None:
        target = cmd.resolve_target(
            nodes,
            username,
            password,
            ssl,
            dict(
                ssl_ca_certs=ssl_ca_certs,
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                ssl_cert_reqs=ssl_cert_reqs,
                ssl_check_hostname=ssl_check_hostname,
            ),
        )
        self.nodes: tuple[Node, ...] = target.nodes
        self.split_reads = split_reads
        self.stripes = cmd.check_int("Client", "stripes", stripes, 1)
        self._slot_map = cmd.SlotMap(split_reads)
        self._executor: Optional[ThreadPoolExecutor] = None
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.username = target.username
        self.password = target.password
        self._tls: Optional[SSLContext] = None if target.tls is None else target.tls.context()
        # redis-py's pools, made when :attr:`redis` or :meth:`scan_keys`
        # first needs one.
        self._redis_options: dict[str, Any] = dict(
            username=target.username,
            password=target.password,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            max_connections=max_connections,
            connection_class=redis.Connection if target.tls is None else redis.SSLConnection,
            **({} if target.tls is None else target.tls.redis_kwargs()),
            **connection_kwargs,
        )
        self._redis_pools: dict[Node, redis.ConnectionPool] = {}
        self._order = NodeOrder(self.nodes)
        self._lock = threading.Lock()
        self._pools: dict[Node, _NodePool] = {n: _NodePool(n, self) for n in self.nodes}

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        """A client for ``kvtier://[user:pass@]host:port[,host:port...]``
        (``Client(url)`` as redis-py users spell it; an address is refused)."""
        if "://" not in url:
            raise ValueError("from_url takes a kvtier:// or kvtiers:// URL, not %r" % (url,))
        return cls(url, **kwargs)

    def _redis_pool(self, node: Node) -> redis.ConnectionPool:
        with self._lock:
            pool = self._redis_pools.get(node)
            if pool is None:
                opts = {k: v for k, v in self._redis_options.items() if v is not None}
                opts.update(_NO_SETINFO)
                pool = redis.ConnectionPool(host=node.host, port=node.port, protocol=2, **opts)
                self._redis_pools[node] = pool
            return pool

    @property
    def redis(self) -> redis.Redis:
        """A redis-py client on the first node, for commands outside the dialect."""
        return redis.Redis(connection_pool=self._redis_pool(self.nodes[0]))

    def close(self) -> None:
        """Closes every pooled connection."""
        with self._lock:
            pools, redis_pools = list(self._pools.values()), list(self._redis_pools.values())
        for pool in pools:
            pool.close()
        for rpool in redis_pools:
            rpool.disconnect()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the dialect ----------------------------------------------------------

    def prefix_len(self, keys: Sequence[Key], *, hold_ms: Optional[int] = None) -> int:
        """How many leading keys are present (one ``PREFIXLEN``; no side
        effects). With ``hold_ms`` (``PREFIXLEN ... HOLD ms``) the counted
        keys are kept from eviction until they are read or ``hold_ms``
        passes, so a load that follows the lookup finds them; the count
        then covers only keys the server could hold (its hold limits)."""
        return cmd.int_reply(self.execute(*cmd.prefixlen_args(keys, hold_ms)))

    def exists_many(self, keys: Sequence[Key]) -> list[bool]:
        """Whether each key is present, in order (one ``MEXISTS``)."""
        reply = cmd.int_list_reply(self.execute(*cmd.mexists_args(keys)), len(keys))
        return [bool(x) for x in reply]

    @overload
    def get_prefix(
        self,
        keys: Sequence[Key],
        *,
        max_bytes: Optional[int] = ...,
        block_ms: Optional[int] = ...,
        min: Optional[int] = ...,
        into: None = ...,
        stride: None = ...,
    ) -> list[Union[bytes, bytearray]]: ...

    @overload
    def get_prefix(
        self,
        keys: Sequence[Key],
        *,
        max_bytes: Optional[int] = ...,
        block_ms: Optional[int] = ...,
        min: Optional[int] = ...,
        into: Union[Buffer, Sequence[Buffer], BulkSink],
        stride: Optional[int] = ...,
    ) -> list[int]: ...

    def get_prefix(
        self,
        keys: Sequence[Key],
        *,
        max_bytes: Optional[int] = None,
        block_ms: Optional[int] = None,
        min: Optional[int] = None,  # noqa: A002 - the dialect's option name
        into: Union[Buffer, Sequence[Buffer], BulkSink, None] = None,
        stride: Optional[int] = None,
    ) -> Union[list[Union[bytes, bytearray]], list[int]]:
        """The values of the longest run of leading keys that are present
        (one ``MGETPREFIX``).

        Without ``into`` the values come back as bytes. With ``into`` each
        value is received straight into the caller's memory and the call
        returns the values' lengths. ``into`` is one of:

        * one writable buffer for all values (a ``bytearray``, a
          ``memoryview``, a numpy array, a tensor's storage...): value ``i``
          lands at byte ``i * stride``; ``stride`` is by default the
          buffer's size divided by the number of keys (which must divide
          it), so a region of ``n`` equal slots takes ``n`` keys as it is;
        * a list of one writable buffer per key;
        * a sink ``(index, length) -> iterable of buffers``.

        Only the returned prefix is defined: a buffer past it may have been
        written by a part of the read that went to another connection or
        node, and so may a slot's bytes past its value's length. A value
        longer than its buffer (or slot) raises
        :class:`~kvtier.errors.BufferTooSmall` after the reply has been
        read; an ``into`` of another kind is a ``TypeError``.

        ``max_bytes`` caps the total size of the prefix; ``block_ms`` waits
        up to that long for missing keys (for at least ``min`` of them).
        """
        args = cmd.mgetprefix_args(keys, max_bytes, block_ms, min)
        extra = block_ms / 1000.0 if block_ms else 0.0
        sink = BufferSink.of(into, len(keys), stride)
        reply: object = None
        parts = cmd.read_parts(
            keys,
            self._owners(),
            max_bytes,
            block_ms,
            min,
            self.stripes,
            None if sink is None else sink.capacity(),
        )
        if parts is not None:
            try:
                reply = self._split_get(len(keys), parts, sink, max_bytes, extra)
            except (ConnectionError, TimeoutError, ResponseError):
                self._slot_map.forget()  # stale map or a node down: let a node coordinate
        if reply is None:
            reply = self._run(args, sink, extra)
        if sink is not None:
            return sink.finish(reply)
        if not isinstance(reply, list):
            raise ProtocolError("MGETPREFIX: expected an array, got %r" % (reply,))
        return reply

    def _owners(self) -> Optional[list[Node]]:
        """The cluster's slot owners (cached), or None for a single server."""
        now = time.monotonic()
        if self._slot_map.due(now):
            try:
                self._slot_map.read(self._run(["CLUSTER", "SLOTS"], None, 0.0), now)
            except ResponseError:  # ERR This instance has cluster support disabled
                self._slot_map.not_a_cluster()
        return self._slot_map.owners

    def _split_get(
        self,
        nkeys: int,
        parts: list[cmd.ReadPart],
        sink: Optional[BufferSink],
        max_bytes: Optional[int],
        extra: float,
    ) -> list[Any]:
        def one(part: cmd.ReadPart) -> object:
            return self._run(part.args, cmd.positions_sink(sink, part.positions), extra, first=part.node)

        return cmd.merge_values(nkeys, parts, self._all(one, parts), max_bytes)

    def _all(self, fn: Any, items: Sequence[Any]) -> list[object]:
        """``fn`` over ``items`` in parallel threads; every call ends before
        the first error is raised."""
        if len(items) == 1:
            return [fn(items[0])]
        futures = [self._parallel().submit(fn, item) for item in items]
        cmd.first_error([f.exception() for f in futures])
        return [f.result() for f in futures]

    def put_chain(
        self,
        keys: Sequence[Key],
        values: Sequence[Value],
        parent: Optional[Key] = None,
        replace: bool = False,
        *,
        chain: bool = True,
        ex: Optional[int] = None,
        px: Optional[int] = None,
        partial: bool = False,
    ) -> list[int]:
        """Stores blocks as a chain in one ``MSETBLOCK ... CHAIN [PARENT p]``.

        Each value is a buffer or a sequence of buffers sent back to back as
        one value (header and payload without joining them). Existing keys
        are kept unless ``replace``. ``partial``: the last block is a
        request's final partial block (``PARTIAL``: evicted first, not
        spilled unless read). Returns one code per block: 1 stored,
        0 already present, -1 not stored (see docs/commands.md).
        """
        parts = cmd.stripe_msetblock(keys, values, parent, replace, chain, ex, px, self.stripes, partial)
        return cmd.merge_codes(parts, self._all(lambda part: self._run(part[1], None, 0.0), parts))

    def _parallel(self) -> ThreadPoolExecutor:
        if self._executor is None:
            workers = max(2, self.stripes, len(self.nodes))
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="kvtier")
        return self._executor

    def scan_keys(self, pattern: str = "*", count: int = 1000) -> list[str]:
        """Every key matching ``pattern`` on every node (``SCAN`` is per node,
        as in Redis Cluster)."""
        found: list[str] = []
        for node in self.nodes:
            found.extend(
                k.decode()
                for k in redis.Redis(connection_pool=self._redis_pool(node)).scan_iter(
                    match=pattern, count=count
                )
            )
        return found

    def execute(self, *args: Arg) -> object:
        """Sends any command and returns its parsed reply (bulk strings as
        bytes); an error reply raises :class:`~kvtier.errors.ResponseError`."""
        return self._run(list(args), None, 0.0)

    # -- plumbing ---------------------------------------------------------------

    def _pool_for(self, node: Node) -> _NodePool:
        pool = self._pools.get(node)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(node, _NodePool(node, self))
        return pool

    def _run(
        self, args: list[Arg], sink: Optional[BulkSink], extra_timeout: float, first: Optional[Node] = None
    ) -> object:
        buffers = encode_command(args)
        attempts = Attempts(self._order, first)
        while (node := attempts.next()) is not None:
            pool = self._pool_for(node)
            try:
                conn, pooled = pool.acquire()
            except (ConnectionError, TimeoutError) as e:
                attempts.no_connection(node, e)
                continue
            try:
                reply = _request(conn, buffers, sink, extra_timeout)
            except _LostBeforeReply as e:
                pool.discard(conn)
                attempts.lost_before_reply(node, e.cause, pooled)
                continue
            except ResponseError as e:
                pool.release(conn)
                pause = attempts.error_reply(node, str(e))
                if pause is None:
                    raise
                if pause:
                    time.sleep(pause)
                continue
            except BaseException:
                pool.discard(conn)
                raise
            pool.release(conn)
            return reply
        raise attempts.exhausted()


def _request(
    conn: _Connection,
    buffers: list[Union[bytes, bytearray, memoryview]],
    sink: Optional[BulkSink],
    extra_timeout: float,
) -> object:
    """Sends one command on ``conn`` and reads its whole reply (an error
    reply raised as :class:`ResponseError` with the connection still
    good). Any other failure closes the connection first; one before any
    byte of the reply is :class:`_LostBeforeReply`."""
    sock = conn.sock
    try:
        _send(sock, buffers, conn.plain)
    except builtins.TimeoutError as e:
        conn.close()
        raise TimeoutError("sending: %s" % e) from None
    except OSError as e:
        # A server that refuses a request (a value over its
        # proto-max-bulk-len) answers with an error and closes while the
        # rest is still being sent: its error, not the broken pipe, is the
        # cause.
        refused = _error_before_close(sock)
        conn.close()
        if refused is not None:
            raise ResponseError(refused) from None
        raise _LostBeforeReply(ConnectionError("connection lost: %s" % e)) from None
    parser = ReplyParser(sink)
    if extra_timeout:
        sock.settimeout(conn.timeout + extra_timeout)
    try:
        if not _receive(sock, parser, conn.plain):
            conn.close()
            raise _LostBeforeReply(ConnectionError("the server closed the connection"))
    except builtins.TimeoutError:
        conn.close()
        raise TimeoutError("no reply within %.1fs" % (conn.timeout + extra_timeout)) from None
    except (_LostBeforeReply, ProtocolError, ConnectionError):
        conn.close()
        raise
    except OSError as e:
        conn.close()
        if not parser.started:  # nothing reached a sink either
            raise _LostBeforeReply(ConnectionError("connection lost: %s" % e)) from None
        raise ConnectionError(str(e)) from e
    except BaseException:
        # Anything else mid-reply (a sink raising, KeyboardInterrupt): the
        # connection is in an unknown state.
        conn.close()
        raise
    if extra_timeout:
        sock.settimeout(conn.timeout)
    return parser.result()


def _receive(sock: socket.socket, parser: ReplyParser, plain: bool) -> bool:
    """Reads one reply into ``parser`` (values straight into its sink's
    buffers; on a ``plain`` socket several per ``recvmsg_into``); False if
    the server closed before any byte of it."""
    while not parser.done:
        if plain:
            views = parser.buffers()
            n = sock.recv_into(views[0]) if len(views) == 1 else sock.recvmsg_into(views)[0]
        else:
            n = sock.recv_into(parser.buffer())
        if n == 0:
            if not parser.started:
                return False
            raise ConnectionError("the server closed the connection")
        parser.advance(n)
    return True


#: Most buffers one ``sendmsg`` takes (Linux's IOV_MAX).
IOV_MAX = 1024
#: Bytes of buffers offered to one ``sendmsg``: more than a socket's send
#: buffer takes in one call.
SEND_WINDOW = 4 << 20


def _send(sock: socket.socket, buffers: list[Union[bytes, bytearray, memoryview]], plain: bool) -> None:
    """Sends a command's buffers: on a plain socket with ``sendmsg``, many
    buffers per system call (a value gathered from many regions, a KV block
    of every layer, costs a few calls instead of one per region); through
    TLS, which has no ``sendmsg``, one ``sendall`` per buffer."""
    if not plain:
        for b in buffers:
            sock.sendall(b)
        return
    views = [memoryview(b) for b in buffers]
    i = 0
    while i < len(views):
        # Only as many buffers as a send can take: the socket takes a few
        # MB per call, and every buffer passed costs a buffer export and an
        # iovec whether it is sent or not.
        end, window = i, 0
        while end < len(views) and end - i < IOV_MAX and window < SEND_WINDOW:
            window += views[end].nbytes
            end += 1
        sent = sock.sendmsg(views[i:end])
        while sent and i < len(views):
            n = views[i].nbytes
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
        while i < len(views) and views[i].nbytes == 0:
            i += 1


#: How long a failed send waits for the error reply the server closed with.
ERROR_BEFORE_CLOSE_WAIT = 1.0


def _error_before_close(sock: socket.socket) -> Optional[str]:
    """The error reply waiting on a connection whose send failed, if the
    server sent one before closing (it is the first reply: a connection
    carries one command at a time); None if it just went away."""
    data = b""
    try:
        sock.settimeout(ERROR_BEFORE_CLOSE_WAIT)
        while b"\r\n" not in data and len(data) < 64 << 10:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if data.startswith(b"-") and b"\r\n" in data:
        return data[1 : data.index(b"\r\n")].decode("utf-8", "replace")
    return None


__all__ = ["Client"]
