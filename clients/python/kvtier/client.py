"""The synchronous client: the block dialect over redis-py's connections."""

from __future__ import annotations

import builtins
import inspect
import random
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union, overload

import redis
import redis.connection
import redis.exceptions
from redis._parsers import _RESP2Parser

from . import _commands as cmd
from ._buffers import Buffer, BufferSink
from ._commands import Key, Node, Value
from ._resp import Arg, BulkSink, ReplyParser, encode_command
from .errors import ConnectionError, ProtocolError, ResponseError, TimeoutError

#: Seconds a node that refused a connection is skipped before it is tried again.
NODE_RETRY_AFTER = 2.0
#: How often a command that got ``TRYAGAIN`` (a cluster node died and is not
#: yet detected) is sent again, and the pause between tries.
TRYAGAIN_TRIES = 20
TRYAGAIN_PAUSE = 0.1


class _Retry(Exception):
    """Internal: the command did not reach this node; try it elsewhere."""

    def __init__(self, cause: BaseException, node: Optional[Node] = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.node = node


ConnectionPool = redis.connection.ConnectionPool


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


def _get_connection(pool: ConnectionPool) -> redis.Connection:
    try:
        return pool.get_connection()  # type: ignore[call-arg,no-any-return]
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("_")  # type: ignore[arg-type,no-any-return]


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

    Connections come from one redis-py ``ConnectionPool`` per node (AUTH,
    TLS, timeouts); :attr:`redis` is a plain ``redis.Redis`` for every other
    command.
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
        self._slots: Optional[list[Node]] = None
        self._slots_read_at = float("-inf")
        self._not_cluster = False
        self._executor: Optional[ThreadPoolExecutor] = None
        self.socket_timeout = socket_timeout
        # Through TLS, redis-py's own parser: with hiredis, "is there data on this
        # pooled connection?" polls the raw socket, which a TLS 1.3 server's session
        # tickets make readable with no data in it, so a fresh connection was taken
        # for a dirty one, reconnected, and failed "Connection not ready" (32 of 300
        # new connections on a loaded machine). The Python parser asks TLS itself.
        # Only redis-py's reads use it (AUTH, ``Client.redis``); replies to the
        # dialect are read by kvtier's own parser either way.
        self._options: dict[str, Any] = dict(
            username=target.username,
            password=target.password,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            max_connections=max_connections,
            connection_class=redis.Connection if target.tls is None else redis.SSLConnection,
            **({} if target.tls is None else dict(target.tls.redis_kwargs(), parser_class=_RESP2Parser)),
            **connection_kwargs,
        )
        self._pools = [self._make_pool(n) for n in self.nodes]
        self._down_until = [0.0] * len(self.nodes)
        self._lock = threading.Lock()
        self._turn = random.randrange(len(self.nodes))
        self._extra: dict[Node, ConnectionPool] = {}

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        """A client for ``kvtier://[user:pass@]host:port[,host:port...]``
        (``Client(url)`` as redis-py users spell it; an address is refused)."""
        if "://" not in url:
            raise ValueError("from_url takes a kvtier:// or kvtiers:// URL, not %r" % (url,))
        return cls(url, **kwargs)

    def _make_pool(self, node: Node) -> ConnectionPool:
        opts = {k: v for k, v in self._options.items() if v is not None}
        opts.update(_NO_SETINFO)
        return redis.ConnectionPool(host=node.host, port=node.port, protocol=2, **opts)

    @property
    def redis(self) -> redis.Redis:
        """A redis-py client on the first node, for commands outside the dialect."""
        return redis.Redis(connection_pool=self._pools[0])

    def close(self) -> None:
        """Closes every pooled connection."""
        for pool in [*self._pools, *self._extra.values()]:
            pool.disconnect()
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
        node. A value longer than its buffer (or slot) raises
        :class:`~kvtier.errors.BufferTooSmall` after the reply has been
        read; an ``into`` of another kind is a ``TypeError``.

        ``max_bytes`` caps the total size of the prefix; ``block_ms`` waits
        up to that long for missing keys (for at least ``min`` of them).
        """
        args = cmd.mgetprefix_args(keys, max_bytes, block_ms, min)
        extra = block_ms / 1000.0 if block_ms else 0.0
        sink = BufferSink.of(into, len(keys), stride)
        reply: object = None
        parts = cmd.read_parts(keys, self._owners(), max_bytes, block_ms, min, self.stripes)
        if parts is not None:
            try:
                reply = self._split_get(len(keys), parts, sink, max_bytes, extra)
            except (ConnectionError, TimeoutError, ResponseError):
                self._slots = None  # stale map or a node down: let a node coordinate
        if reply is None:
            reply = self._run(args, sink, extra)
        if sink is not None:
            return sink.finish(reply)
        if not isinstance(reply, list):
            raise ProtocolError("MGETPREFIX: expected an array, got %r" % (reply,))
        return reply

    def _owners(self) -> Optional[list[Node]]:
        """The cluster's slot owners (cached), or None for a single server."""
        if not self.split_reads or self._not_cluster:
            return None
        now = time.monotonic()
        if self._slots is None or now - self._slots_read_at > cmd.SLOT_MAP_TTL:
            try:
                reply = self._run(["CLUSTER", "SLOTS"], None, 0.0)
            except ResponseError:  # ERR This instance has cluster support disabled
                self._not_cluster = True
                return None
            self._slots = cmd.parse_cluster_slots(reply)
            self._slots_read_at = now
        return self._slots

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
        for pool in self._pools:
            found.extend(
                k.decode() for k in redis.Redis(connection_pool=pool).scan_iter(match=pattern, count=count)
            )
        return found

    def execute(self, *args: Arg) -> object:
        """Sends any command and returns its parsed reply (bulk strings as
        bytes); an error reply raises :class:`~kvtier.errors.ResponseError`."""
        return self._run(list(args), None, 0.0)

    # -- plumbing ---------------------------------------------------------------

    def _order(self) -> list[int]:
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.nodes)
        now = time.monotonic()
        order = [(start + i) % len(self.nodes) for i in range(len(self.nodes))]
        up = [i for i in order if self._down_until[i] <= now]
        down = [i for i in order if self._down_until[i] > now]
        return up + down

    def _pool_for(self, node: Node) -> ConnectionPool:
        if node in self.nodes:
            return self._pools[self.nodes.index(node)]
        with self._lock:
            if node not in self._extra:
                self._extra[node] = self._make_pool(node)
            return self._extra[node]

    def _run(
        self, args: list[Arg], sink: Optional[BulkSink], extra_timeout: float, first: Optional[Node] = None
    ) -> object:
        buffers = encode_command(args)
        errors: list[str] = []
        timed_out = False
        tryagain = 0
        order = self._order()
        targets: list[Union[int, Node]] = list(order)
        if first is not None:
            if first in self.nodes:
                targets.remove(self.nodes.index(first))
            targets.insert(0, first)
        while targets:
            target = targets.pop(0)
            if isinstance(target, int):
                pool, node = self._pools[target], self.nodes[target]
            else:
                pool, node = self._pool_for(target), target
            try:
                return self._run_on(pool, buffers, sink, extra_timeout)
            except _Retry as r:
                errors.append("%s: %s" % (node, r.cause))
                timed_out = isinstance(r.cause, TimeoutError)
                if r.node is not None:  # MOVED: the owner is elsewhere
                    targets.insert(0, r.node)
                    continue
                if isinstance(r.cause, ResponseError):  # TRYAGAIN
                    tryagain += 1
                    if tryagain < TRYAGAIN_TRIES:
                        time.sleep(TRYAGAIN_PAUSE)
                        targets.insert(0, target)
                        continue
                    raise r.cause from None
                if isinstance(target, int):
                    self._down_until[target] = time.monotonic() + NODE_RETRY_AFTER
        if timed_out:
            raise TimeoutError("no kvtier node answered in time: " + "; ".join(errors))
        raise ConnectionError("no kvtier node answered: " + "; ".join(errors))

    def _run_on(
        self,
        pool: ConnectionPool,
        buffers: list[Union[bytes, bytearray, memoryview]],
        sink: Optional[BulkSink],
        extra_timeout: float,
    ) -> object:
        try:
            conn = _get_connection(pool)
        except redis.exceptions.TimeoutError as e:
            raise _Retry(TimeoutError("connecting: %s" % e)) from None
        except (redis.exceptions.ConnectionError, OSError) as e:
            raise _Retry(e) from None
        received = False
        try:
            try:
                _send(conn, buffers)
            except (builtins.TimeoutError, redis.exceptions.TimeoutError) as e:
                conn.disconnect()
                raise TimeoutError(str(e)) from None
            except (redis.exceptions.ConnectionError, OSError) as e:
                # A server that refuses a request (a value over its
                # proto-max-bulk-len) answers with an error and closes while
                # the rest is still being sent: its error, not the broken
                # pipe, is the cause.
                refused = _error_before_close(conn)
                conn.disconnect()
                if refused is not None:
                    raise ResponseError(refused) from None
                # Nothing was answered: safe to send it again elsewhere (a
                # stale pooled connection, a node that went away).
                raise _Retry(e) from None
            sock: Optional[socket.socket] = getattr(conn, "_sock", None)
            if sock is None:
                raise ConnectionError("connection closed while sending")
            if extra_timeout:
                sock.settimeout(self.socket_timeout + extra_timeout)
            parser = ReplyParser(sink)
            scatter = hasattr(sock, "recvmsg_into") and not isinstance(sock, ssl.SSLSocket)
            while not parser.done:
                if scatter:
                    views = parser.buffers()
                    n = sock.recv_into(views[0]) if len(views) == 1 else sock.recvmsg_into(views)[0]
                else:
                    n = sock.recv_into(parser.buffer())
                if n == 0:
                    if not received:
                        # Closed before any reply (an idle connection the
                        # server timed out): every dialect command is
                        # idempotent, so it is sent again on another one.
                        conn.disconnect()
                        raise _Retry(ConnectionError("the server closed the connection"))
                    raise ConnectionError("the server closed the connection")
                received = True
                parser.advance(n)
            if extra_timeout:
                sock.settimeout(self.socket_timeout)
        except builtins.TimeoutError:
            conn.disconnect()
            raise TimeoutError("no reply within %.1fs" % (self.socket_timeout + extra_timeout)) from None
        except (ProtocolError, ConnectionError, _Retry):
            conn.disconnect()
            raise
        except OSError as e:
            conn.disconnect()
            if not received and sink is None:
                raise _Retry(e) from None
            raise ConnectionError(str(e)) from e
        except BaseException:
            # Anything else mid-reply (a sink raising, KeyboardInterrupt):
            # the connection is in an unknown state.
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        try:
            return parser.result()
        except ResponseError as e:
            moved = _moved(str(e))
            if moved is not None:
                raise _Retry(e, moved) from None
            if str(e).startswith("TRYAGAIN"):
                raise _Retry(e) from None
            raise


#: Most buffers one ``sendmsg`` takes (Linux's IOV_MAX).
IOV_MAX = 1024
#: Bytes of buffers offered to one ``sendmsg``: more than a socket's send
#: buffer takes in one call.
SEND_WINDOW = 4 << 20


def _send(conn: redis.Connection, buffers: list[Union[bytes, bytearray, memoryview]]) -> None:
    """Sends a command's buffers: on a plain socket with ``sendmsg``, many
    buffers per system call (a value gathered from many regions, a KV block
    of every layer, costs a few calls instead of one per region); through
    TLS, which has no ``sendmsg``, one ``sendall`` per buffer."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        conn.connect()
        sock = getattr(conn, "_sock", None)
    if sock is None:
        conn.send_packed_command(buffers, check_health=False)
        return
    if not hasattr(sock, "sendmsg") or isinstance(sock, ssl.SSLSocket):
        # Raw sends, not redis-py's (which close the socket on a failure):
        # the error the server closed with stays readable.
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


def _error_before_close(conn: redis.Connection) -> Optional[str]:
    """The error reply waiting on a connection whose send failed, if the
    server sent one before closing (it is the first reply: a connection
    carries one command at a time); None if it just went away."""
    sock: Optional[socket.socket] = getattr(conn, "_sock", None)
    if sock is None:
        return None
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


def _moved(message: str) -> Optional[Node]:
    """The node of a ``MOVED slot host:port`` error, else None."""
    parts = message.split()
    if len(parts) == 3 and parts[0] == "MOVED":
        return cmd.parse_nodes(parts[2])[0]
    return None


__all__ = ["Client"]
