"""The asyncio client: the same dialect and parser as :class:`kvtier.Client`,
with connections built on ``asyncio.BufferedProtocol``.

redis-py's asyncio connections read through a ``StreamReader``, which copies
every byte into its own buffer and then again into each ``bytes`` it returns.
A ``BufferedProtocol`` instead tells the event loop where to put incoming
bytes (``get_buffer``), so the loop's ``recv_into`` lands a value's payload
directly in the caller's buffer, exactly as the sync client's does.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
from collections.abc import Sequence
from typing import Any, Optional, Union, overload

from . import _commands as cmd
from ._buffers import Buffer, BufferSink
from ._commands import Key, Node, Value
from ._resp import Arg, BulkSink, ReplyParser, encode_command
from ._retry import Attempts, NodeOrder
from .errors import ConnectionError, ProtocolError, ResponseError, TimeoutError

#: Large buffers are handed to the transport in pieces of this size, waiting
#: while the transport's write buffer is full, so a big store never queues a
#: copy of itself in memory.
WRITE_PIECE = 1 << 20


class _Connection(asyncio.BufferedProtocol):
    """One connection: one command in flight at a time."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self._parser: Optional[ReplyParser] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._can_write: Optional[asyncio.Future[None]] = None
        self._junk = bytearray(4096)
        self.closed = False
        #: Bytes of the current reply received so far.
        self.received = 0

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._parser is None:
            return memoryview(self._junk)
        try:
            return self._parser.buffer()
        except BaseException as e:  # a protocol error: fail the command
            self._fail(e)
            return memoryview(self._junk)

    def buffer_updated(self, nbytes: int) -> None:
        parser = self._parser
        if parser is None:
            self._fail(ProtocolError("data arrived with no command in flight"))
            return
        self.received += nbytes
        try:
            parser.advance(nbytes)
        except BaseException as e:
            self._fail(e)
            return
        if parser.done:
            self._parser = None
            waiter, self._waiter = self._waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def eof_received(self) -> bool:
        self._fail(ConnectionError("the server closed the connection"))
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        self._fail(ConnectionError("connection lost: %s" % (exc or "closed by the server")))
        if self._can_write is not None and not self._can_write.done():
            self._can_write.set_result(None)

    def pause_writing(self) -> None:
        if self._can_write is None or self._can_write.done():
            self._can_write = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._can_write is not None and not self._can_write.done():
            self._can_write.set_result(None)

    # use

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        self._parser = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def request(
        self,
        buffers: list[Union[bytes, bytearray, memoryview]],
        sink: Optional[BulkSink],
        timeout: float,
    ) -> object:
        """Sends one command and waits for its whole reply."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection is closed")
        parser = ReplyParser(sink)
        loop = asyncio.get_running_loop()
        self.received = 0
        self._parser = parser
        self._waiter = waiter = loop.create_future()

        async def send_and_wait() -> None:
            assert self.transport is not None
            for buf in buffers:
                view = memoryview(buf)
                for off in range(0, max(view.nbytes, 1), WRITE_PIECE):
                    if self.closed:
                        break
                    self.transport.write(view[off : off + WRITE_PIECE])
                    if self._can_write is not None and not self._can_write.done():
                        await self._can_write
            await waiter

        try:
            await asyncio.wait_for(send_and_wait(), timeout)
        except asyncio.TimeoutError as e:
            self.close()
            raise TimeoutError("no reply within %.1fs" % timeout) from e
        except BaseException:
            if not parser.done:
                self.close()
            raise
        return parser.result()


class _NodePool:
    """Idle connections to one node, made on demand."""

    def __init__(self, node: Node, client: AsyncClient) -> None:
        self.node = node
        self.client = client
        self.idle: list[_Connection] = []

    async def acquire(self) -> tuple[_Connection, bool]:
        """A connection, and whether it was reused from the idle list."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn, True
        return await self.client._connect(self.node), False

    def release(self, conn: _Connection) -> None:
        if not conn.closed and len(self.idle) < self.client.max_idle:
            self.idle.append(conn)
        elif not conn.closed:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class AsyncClient:
    """The asyncio twin of :class:`kvtier.Client` (same methods, awaited).

    Connections belong to the event loop that made them; use one client per
    loop. Authentication (``AUTH``) and TLS (``kvtiers://``, ``ssl=True``
    with the ``ssl_*`` options of :class:`kvtier.Client`, or an
    ``ssl.SSLContext``) are supported.
    """

    def __init__(
        self,
        nodes: Union[str, Sequence[Union[str, tuple[str, int]]]] = "127.0.0.1:6379",
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        ssl: Union[bool, ssl_module.SSLContext] = False,
        ssl_ca_certs: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
        ssl_cert_reqs: Optional[str] = None,
        ssl_check_hostname: Optional[bool] = None,
        socket_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_idle: int = 16,
        split_reads: bool = True,
        stripes: int = cmd.STRIPES,
    ) -> None:
        tls_keywords = dict(
            ssl_ca_certs=ssl_ca_certs,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            ssl_cert_reqs=ssl_cert_reqs,
            ssl_check_hostname=ssl_check_hostname,
        )
        context = ssl if isinstance(ssl, ssl_module.SSLContext) else None
        if context is not None and any(v is not None for v in tls_keywords.values()):
            raise ValueError("ssl is an SSLContext: set its options on it, not as ssl_* keywords")
        target = cmd.resolve_target(nodes, username, password, bool(ssl), tls_keywords)
        self.nodes: tuple[Node, ...] = target.nodes
        self.split_reads = split_reads
        self.stripes = cmd.check_int("AsyncClient", "stripes", stripes, 1)
        self._slot_map = cmd.SlotMap(split_reads)
        self.username = target.username
        self.password = target.password
        self.ssl: Optional[ssl_module.SSLContext] = (
            context if context is not None else None if target.tls is None else target.tls.context()
        )
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._pools: dict[Node, _NodePool] = {n: _NodePool(n, self) for n in self.nodes}
        self._order = NodeOrder(self.nodes)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncClient:
        """A client for ``kvtier://[user:pass@]host:port[,host:port...]``
        (``AsyncClient(url)`` as redis-py users spell it; an address is refused)."""
        if "://" not in url:
            raise ValueError("from_url takes a kvtier:// or kvtiers:// URL, not %r" % (url,))
        return cls(url, **kwargs)

    async def close(self) -> None:
        """Closes every idle connection."""
        for pool in self._pools.values():
            pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the dialect ----------------------------------------------------------

    async def prefix_len(self, keys: Sequence[Key], *, hold_ms: Optional[int] = None) -> int:
        """How many leading keys are present (one ``PREFIXLEN``); with
        ``hold_ms``, the counted keys are kept from eviction until read or
        for that long (see :meth:`kvtier.Client.prefix_len`)."""
        return cmd.int_reply(await self.execute(*cmd.prefixlen_args(keys, hold_ms)))

    async def exists_many(self, keys: Sequence[Key]) -> list[bool]:
        """Whether each key is present, in order (one ``MEXISTS``)."""
        reply = cmd.int_list_reply(await self.execute(*cmd.mexists_args(keys)), len(keys))
        return [bool(x) for x in reply]

    @overload
    async def get_prefix(
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
    async def get_prefix(
        self,
        keys: Sequence[Key],
        *,
        max_bytes: Optional[int] = ...,
        block_ms: Optional[int] = ...,
        min: Optional[int] = ...,
        into: Union[Buffer, Sequence[Buffer], BulkSink],
        stride: Optional[int] = ...,
    ) -> list[int]: ...

    async def get_prefix(
        self,
        keys: Sequence[Key],
        *,
        max_bytes: Optional[int] = None,
        block_ms: Optional[int] = None,
        min: Optional[int] = None,  # noqa: A002
        into: Union[Buffer, Sequence[Buffer], BulkSink, None] = None,
        stride: Optional[int] = None,
    ) -> Union[list[Union[bytes, bytearray]], list[int]]:
        """See :meth:`kvtier.Client.get_prefix`."""
        args = cmd.mgetprefix_args(keys, max_bytes, block_ms, min)
        extra = block_ms / 1000.0 if block_ms else 0.0
        sink = BufferSink.of(into, len(keys), stride)
        reply: object = None
        parts = cmd.read_parts(
            keys,
            await self._owners(),
            max_bytes,
            block_ms,
            min,
            self.stripes,
            None if sink is None else sink.capacity(),
        )
        if parts is not None:
            try:
                reply = await self._split_get(len(keys), parts, sink, max_bytes, extra)
            except (ConnectionError, TimeoutError, ResponseError):
                self._slot_map.forget()  # stale map or a node down: let a node coordinate
        if reply is None:
            reply = await self._run(args, sink, extra)
        if sink is not None:
            return sink.finish(reply)
        if not isinstance(reply, list):
            raise ProtocolError("MGETPREFIX: expected an array, got %r" % (reply,))
        return reply

    async def _owners(self) -> Optional[list[Node]]:
        """See :meth:`kvtier.Client._owners`."""
        now = time.monotonic()
        if self._slot_map.due(now):
            try:
                self._slot_map.read(await self._run(["CLUSTER", "SLOTS"], None, 0.0), now)
            except ResponseError:  # ERR This instance has cluster support disabled
                self._slot_map.not_a_cluster()
        return self._slot_map.owners

    async def _split_get(
        self,
        nkeys: int,
        parts: list[cmd.ReadPart],
        sink: Optional[BufferSink],
        max_bytes: Optional[int],
        extra: float,
    ) -> list[Any]:
        runs = [self._run(p.args, cmd.positions_sink(sink, p.positions), extra, first=p.node) for p in parts]
        return cmd.merge_values(nkeys, parts, await self._all(runs), max_bytes)

    @staticmethod
    async def _all(coros: list[Any]) -> list[object]:
        """The coroutines concurrently; every one ends before the first
        error is raised."""
        if len(coros) == 1:
            return [await coros[0]]
        results = await asyncio.gather(*coros, return_exceptions=True)
        cmd.first_error(results)
        return list(results)

    async def put_chain(
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
        """See :meth:`kvtier.Client.put_chain`."""
        parts = cmd.stripe_msetblock(keys, values, parent, replace, chain, ex, px, self.stripes, partial)
        return cmd.merge_codes(parts, await self._all([self._run(args, None, 0.0) for _, args in parts]))

    async def execute(self, *args: Arg) -> object:
        """Sends any command and returns its parsed reply."""
        return await self._run(list(args), None, 0.0)

    # -- plumbing ---------------------------------------------------------------

    async def _connect(self, node: Node) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, node.host, node.port, ssl=self.ssl),
                self.connect_timeout,
            )
        except asyncio.TimeoutError as e:
            raise TimeoutError("connecting to %s timed out" % node) from e
        except OSError as e:
            raise ConnectionError("cannot connect to %s: %s" % (node, e)) from e
        if self.password is not None:
            auth: list[Arg] = (
                ["AUTH", self.password] if self.username is None else ["AUTH", self.username, self.password]
            )
            try:
                await conn.request(encode_command(auth), None, self.socket_timeout)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _run(
        self, args: list[Arg], sink: Optional[BulkSink], extra_timeout: float, first: Optional[Node] = None
    ) -> object:
        buffers = encode_command(args)
        attempts = Attempts(self._order, first)
        while (node := attempts.next()) is not None:
            pool = self._pools.get(node)
            if pool is None:
                pool = self._pools[node] = _NodePool(node, self)
            try:
                conn, pooled = await pool.acquire()
            except (ConnectionError, TimeoutError) as e:
                attempts.no_connection(node, e)
                continue
            try:
                reply = await conn.request(buffers, sink, self.socket_timeout + extra_timeout)
            except ResponseError as e:
                pool.release(conn)
                pause = attempts.error_reply(node, str(e))
                if pause is None:
                    raise
                if pause:
                    await asyncio.sleep(pause)
                continue
            except ConnectionError as e:
                conn.close()
                if conn.received:
                    raise
                attempts.lost_before_reply(node, e, pooled)
                continue
            except BaseException:
                conn.close()
                raise
            pool.release(conn)
            return reply
        raise attempts.exhausted()
