"""The kvtier package itself: the RESP parser fed in every split, the sync
and asyncio clients against the real binary (one node, failover, a cluster
in forward and redirect mode), values received into caller buffers without
a copy, and errors."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import kvtier
from kvtier._resp import ReplyParser, encode_command

from conftest import ROOT, Server, free_ports, start_cluster


def feed(data: bytes, parser: ReplyParser, step: int) -> object:
    pos = 0
    while not parser.done:
        buf = parser.buffer()
        n = min(len(buf), step, len(data) - pos)
        assert n > 0, "parser wants more than the reply has"
        buf[:n] = data[pos : pos + n]
        pos += n
        parser.advance(n)
    assert pos == len(data), "parser stopped before the end of the reply"
    return parser.result()


REPLIES: list[tuple[bytes, object]] = [
    (b"+OK\r\n", b"OK"),
    (b":-42\r\n", -42),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*3\r\n$1\r\na\r\n:7\r\n*1\r\n$-1\r\n", [b"a", 7, [None]]),
    (b"*0\r\n", []),
    (b"%1\r\n+k\r\n:1\r\n", {b"k": 1}),
    (b"#t\r\n", True),
    (b"_\r\n", None),
]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1 << 20])
def test_parser_in_every_split(step: int) -> None:
    for data, want in REPLIES:
        assert feed(data, ReplyParser(), step) == want, data


def test_parser_errors() -> None:
    with pytest.raises(kvtier.ResponseError, match="ERR nope"):
        feed(b"-ERR nope\r\n", ReplyParser(), 3)
    inner = feed(b"*2\r\n-ERR a\r\n:1\r\n", ReplyParser(), 4)
    assert isinstance(inner, list) and isinstance(inner[0], kvtier.ResponseError) and inner[1] == 1
    with pytest.raises(kvtier.ProtocolError):
        feed(b"$3\r\nabcXY", ReplyParser(), 100)
    with pytest.raises(kvtier.ProtocolError):
        feed(b"?\r\n", ReplyParser(), 100)


@pytest.mark.parametrize("step", [1, 5, 33, 1 << 20])
def test_parser_sink_lands_payloads_in_buffers(step: int) -> None:
    values = [os.urandom(n) for n in (10, 0, 70000, 3)]
    data = b"*%d\r\n" % len(values) + b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values)
    dest = [bytearray(len(v) + 5) for v in values]
    split = bytearray(4), bytearray(70000 - 4)

    def sink(i: int, length: int):  # type: ignore[no-untyped-def]
        if i == 2:
            return iter(split)  # one value scattered over two buffers
        return [memoryview(dest[i])[:length]]

    lengths = feed(data, ReplyParser(sink), step)
    assert lengths == [len(v) for v in values]
    assert bytes(dest[0][:10]) == values[0] and bytes(dest[3][:3]) == values[3]
    assert bytes(split[0] + split[1]) == values[2]


def test_parser_sink_drops_what_it_does_not_want() -> None:
    values = [b"x" * 100, b"y" * 100]
    data = b"*2\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values)
    got = bytearray(10)

    def sink(i: int, length: int):  # type: ignore[no-untyped-def]
        return [memoryview(got)] if i == 0 else []

    assert feed(data, ReplyParser(sink), 16) == [100, 100]
    assert bytes(got) == b"x" * 10


def feed_vectored(data: bytes, parser: ReplyParser, step: int) -> tuple[object, int]:
    """As ``recvmsg_into`` over :meth:`ReplyParser.buffers` would: at most
    ``step`` bytes a call, spread over the buffers in order. Returns the
    reply and the number of calls."""
    pos = calls = 0
    while not parser.done:
        n = 0
        for buf in parser.buffers(1024):
            k = min(buf.nbytes, step - n, len(data) - pos - n)
            if k <= 0:
                break
            buf[:k] = data[pos + n : pos + n + k]
            n += k
        assert n > 0, "parser wants more than the reply has"
        pos += n
        calls += 1
        parser.advance(n)
    assert pos == len(data), "parser stopped before the end of the reply"
    return parser.result(), calls


def mgetprefix_reply(values: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(values) + b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values)


@pytest.mark.parametrize("step", [1, 5, 33, 1 << 20])
def test_parser_frames_a_reply_whose_values_fill_their_slots(step: int) -> None:
    """With one slot per key, the parser guesses every value fills its slot
    and posts the whole reply at once (a few reads for many values); a
    value shorter than its slot, an error item or a shorter prefix is
    still parsed right (the guess is checked as the headers arrive)."""
    from kvtier._buffers import BufferSink

    slot = 1000
    full = [os.urandom(slot) for _ in range(8)]
    cases = {
        "all full": full,
        "prefix of 3": full[:3],
        "second short": [full[0], full[1][:10], full[2]],
        "last short": [*full[:7], full[7][:999]],
        "last empty": [*full[:4], b""],
    }
    for name, values in cases.items():
        for vectored in (True, False):  # recvmsg_into, or one buffer a read (asyncio)
            dest = bytearray(8 * slot)
            parser = ReplyParser(BufferSink.of(dest, 8))
            data = mgetprefix_reply(values)
            got, calls = feed_vectored(data, parser, step) if vectored else (feed(data, parser, step), 0)
            assert got == [len(v) for v in values], name
            for i, v in enumerate(values):
                assert bytes(dest[i * slot : i * slot + len(v)]) == v, (name, i)
            if step == 1 << 20 and name == "all full" and vectored:
                # The header's small read, then the rest in one (unframed: a
                # header read and a payload read per value).
                assert calls <= 3, calls
    # Empty slots and empty values: nothing to land, never an empty buffer.
    got, _ = feed_vectored(
        mgetprefix_reply([b""] * 3), ReplyParser(BufferSink.of([bytearray(0)] * 3, 3)), step
    )
    assert got == [0, 0, 0]
    # A value longer than its slot: BufferTooSmall once the reply is read,
    # the values before it in place.
    dest = bytearray(3 * slot)
    sink = BufferSink.of(dest, 3)
    assert sink is not None
    got, _ = feed_vectored(mgetprefix_reply([full[0], full[1] + b"xy", full[2]]), ReplyParser(sink), step)
    with pytest.raises(kvtier.BufferTooSmall):
        sink.finish(got)
    assert bytes(dest[:slot]) == full[0]
    # An error item among the values: kept as the error, the rest parsed.
    dest = bytearray(2 * slot)
    data = b"*2\r\n$%d\r\n%s\r\n-ERR gone\r\n" % (slot, full[0])
    got, _ = feed_vectored(data, ReplyParser(BufferSink.of(dest, 2)), step)
    assert isinstance(got, list) and got[0] == slot and isinstance(got[1], kvtier.ResponseError)
    assert bytes(dest[:slot]) == full[0]


def test_encode_keeps_large_values_as_views() -> None:
    big = bytearray(1 << 20)
    parts = encode_command(["MSETBLOCK", 1, "k", [b"head", big]])
    assert any(isinstance(p, memoryview) and p.obj is big for p in parts)
    assert b"".join(bytes(p) for p in parts).startswith(
        b"*4\r\n$9\r\nMSETBLOCK\r\n$1\r\n1\r\n$1\r\nk\r\n$1048580\r\nhead"
    )


def test_core_package_imports_no_torch() -> None:
    code = "import sys, kvtier; bad = {'torch', 'lmcache', 'sglang'} & set(sys.modules); assert not bad, bad"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


# -- against the server ---------------------------------------------------------


def test_dialect_round_trip(server: Server) -> None:
    c = server.client()
    assert c.put_chain(["a", "b", "c"], [b"AAAA", [b"BB", b"BB"], b"C" * 100_000]) == [1, 1, 1]
    assert c.put_chain(["a", "d"], [b"XXXX", b"DDDD"], parent="c") == [0, 1]
    assert c.put_chain(["a"], [b"ZZZZ"], replace=True) == [1]
    assert c.prefix_len(["a", "b", "c", "nope", "d"]) == 3
    assert c.exists_many(["a", "nope", "d"]) == [True, False, True]
    got = c.get_prefix(["a", "b", "c", "nope"])
    assert got[:2] == [b"ZZZZ", b"BBBB"] and bytes(got[2]) == b"C" * 100_000 and len(got) == 3
    assert c.get_prefix(["a", "b", "c"], max_bytes=8) == [b"ZZZZ", b"BBBB"]
    bufs = [bytearray(4), bytearray(8), bytearray(100_000)]
    assert c.get_prefix(["a", "b", "c"], into=bufs) == [4, 4, 100_000]
    assert bytes(bufs[1][:4]) == b"BBBB" and bufs[2] == b"C" * 100_000


def test_errors_carry_the_servers_text(server: Server) -> None:
    c = server.client()
    with pytest.raises(kvtier.ResponseError, match="ERR MIN must be between 1 and numkeys"):
        c.execute("MGETPREFIX", 1, "a", "BLOCK", 10, "MIN", 5)
    with pytest.raises(ValueError):
        c.prefix_len([])
    c.put_chain(["a", "b"], [b"1234", b"5678"])
    with pytest.raises(kvtier.BufferTooSmall) as e:
        c.get_prefix(["a", "b"], into=[bytearray(4), bytearray(2)])
    assert (e.value.index, e.value.length) == (1, 4)
    assert c.execute("PING") == b"PONG"  # the connection survived


def test_a_refused_request_raises_the_servers_error_not_a_broken_pipe(tmp_path: Path) -> None:
    """A value over the server's proto-max-bulk-len: the server answers with
    an error naming the limit and closes while the client is still sending
    (more than it drains); both clients raise that error, not the pipe."""
    from conftest import start_kvtier

    s = start_kvtier(tmp_path / "limit.log", "--proto-max-bulk-len", "1mb")
    says = r"invalid bulk length \(%d bytes, over proto-max-bulk-len 1048576\)" % (96 << 20)
    try:
        c = s.client()
        big = bytes(96 << 20)
        with pytest.raises(kvtier.ResponseError, match=says):
            c.put_chain(["small", "big"], [b"v", big])
        with pytest.raises(kvtier.ResponseError, match=says):
            c.execute("SET", "big", big)
        assert c.execute("PING") == b"PONG"

        async def run() -> None:
            async with kvtier.AsyncClient(s.addr) as a:
                with pytest.raises(kvtier.ResponseError, match=says):
                    await a.put_chain(["big"], [big])
                assert await a.execute("PING") == b"PONG"

        asyncio.run(run())
    finally:
        s.stop()


def test_block_waits_for_a_writer(server: Server) -> None:
    c = server.client(socket_timeout=1.0)  # the wait is longer than the socket timeout
    threading.Timer(1.5, lambda: server.client().put_chain(["p", "q"], [b"P", b"Q"])).start()
    t0 = time.monotonic()
    assert c.get_prefix(["p", "q"], block_ms=5000) == [b"P", b"Q"]
    assert 1.0 < time.monotonic() - t0 < 5


def test_values_land_in_buffers_without_a_copy(server: Server) -> None:
    """64 MiB received into caller buffers allocates (almost) nothing."""
    c = server.client()
    keys = ["big%d" % i for i in range(8)]
    values = [os.urandom(8 << 20) for _ in keys]
    c.put_chain(keys, values)
    dest = [bytearray(8 << 20) for _ in keys]
    c.get_prefix(keys[:1], into=dest[:1])  # warm the connection
    tracemalloc.start()
    try:
        assert c.get_prefix(keys, into=dest) == [8 << 20] * 8
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(d == v for d, v in zip(dest, values))
    assert peak < 1 << 20, "receiving 64 MiB allocated %d bytes" % peak

    async def run() -> int:
        a = kvtier.AsyncClient(server.addr)
        d2 = [bytearray(8 << 20) for _ in keys]
        await a.get_prefix(keys[:1], into=d2[:1])
        tracemalloc.start()
        try:
            await a.get_prefix(keys, into=d2)
            _, apeak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert all(d == v for d, v in zip(d2, values))
        await a.close()
        return apeak

    assert asyncio.run(run()) < 1 << 20


def test_async_client(server: Server) -> None:
    async def run() -> None:
        async with kvtier.AsyncClient(server.addr) as a:
            assert await a.put_chain(["x", "y"], [b"xx", [b"y", b"y"]]) == [1, 1]
            assert await a.prefix_len(["x", "y", "z"]) == 2
            assert await a.exists_many(["x", "z"]) == [True, False]
            assert await a.get_prefix(["x", "y", "z"]) == [b"xx", b"yy"]
            buf = [bytearray(2), bytearray(2)]
            assert await a.get_prefix(["x", "y"], into=buf) == [2, 2] and buf[1] == b"yy"
            with pytest.raises(kvtier.ResponseError, match="numkeys should be greater than 0"):
                await a.execute("PREFIXLEN", 0, "x")
            results = await asyncio.gather(*(a.prefix_len(["x", "y"]) for _ in range(20)))
            assert results == [2] * 20
            # BLOCK outlasting the socket timeout
            a.socket_timeout = 0.5
            later = asyncio.get_running_loop().call_later(
                1.0, lambda: server.client().put_chain(["late"], [b"L"])
            )
            assert await a.get_prefix(["late"], block_ms=3000) == [b"L"]
            later.cancel()

    asyncio.run(run())


def test_server_down_and_timeouts() -> None:
    port = free_ports(1)[0]
    with pytest.raises(kvtier.ConnectionError, match="no kvtier node answered"):
        kvtier.Client("127.0.0.1:%d" % port, connect_timeout=1).prefix_len(["a"])
    with pytest.raises(kvtier.ConnectionError):
        asyncio.run(kvtier.AsyncClient("127.0.0.1:%d" % port).prefix_len(["a"]))

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    addr = "127.0.0.1:%d" % listener.getsockname()[1]
    try:
        with pytest.raises(kvtier.TimeoutError):
            kvtier.Client(addr, socket_timeout=0.3).prefix_len(["a"])
        with pytest.raises(kvtier.TimeoutError):
            asyncio.run(kvtier.AsyncClient(addr, socket_timeout=0.3).prefix_len(["a"]))
    finally:
        listener.close()


class FakeNode:
    """A node that answers every command the same way: ``reply`` (raw RESP),
    ``None`` to close the connection once the command has arrived, or
    ``b"RST"`` to reset it then."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.commands = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while conn.recv(65536):
                    self.commands += 1
                    if self.reply is None:
                        return
                    if self.reply == b"RST":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    conn.sendall(self.reply.replace(b"{addr}", self.addr.encode()))
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


def test_both_clients_decide_retries_alike_and_raise_the_same_errors() -> None:
    """kvtier._retry: a MOVED loop ends, TRYAGAIN is retried then answered,
    a node that drops every command is a ConnectionError naming it; the
    sync and asyncio clients raise the same class with the same text."""

    def both(addr: str, password: str | None = None, into: bool = False) -> list[tuple[type, str]]:
        """The error each client raises for one command: a lookup, or with
        ``into`` a read into caller buffers (a sink)."""
        seen: list[tuple[type, str]] = []
        try:
            c = kvtier.Client(addr, socket_timeout=5, password=password, split_reads=False)
            c.get_prefix(["a"], into=[bytearray(8)]) if into else c.prefix_len(["a"])
        except kvtier.KvtierError as e:
            seen.append((type(e), str(e)))

        async def run() -> None:
            a = kvtier.AsyncClient(addr, socket_timeout=5, password=password, split_reads=False)
            try:
                await (a.get_prefix(["a"], into=[bytearray(8)]) if into else a.prefix_len(["a"]))
            except kvtier.KvtierError as e:
                seen.append((type(e), str(e)))
            finally:
                await a.close()

        asyncio.run(run())
        assert len(seen) == 2, seen
        assert seen[0] == seen[1], seen
        return seen

    from kvtier._retry import MOVED_HOPS, TRYAGAIN_TRIES

    cases = [
        (b"-MOVED 1 {addr}\r\n", kvtier.ResponseError, "MOVED 1 ", 2 * (MOVED_HOPS + 1)),
        (b"-TRYAGAIN the slot's node is down\r\n", kvtier.ResponseError, "TRYAGAIN", 2 * TRYAGAIN_TRIES),
        (None, kvtier.ConnectionError, "no kvtier node answered: 127.0.0.1:", 2),
    ]
    # A refused AUTH is the server's error, not a node down.
    cases.append((b"-WRONGPASS invalid username-password pair\r\n", kvtier.ResponseError, "WRONGPASS", 2))
    for reply, cls, text, commands in cases:
        node = FakeNode(reply)
        try:
            password = "pw" if reply is not None and reply.startswith(b"-WRONGPASS") else None
            (kind, message), _ = both(node.addr, password)
            assert kind is cls and message.startswith(text), (reply, kind, message)
            assert node.commands == commands, (reply, node.commands)
        finally:
            node.close()
    # A connection reset before any byte of the reply, while a read goes into
    # caller buffers: nothing reached them, so both clients try the next
    # node (here none) alike.
    node = FakeNode(b"RST")
    try:
        for into in (False, True):
            (kind, message), _ = both(node.addr, into=into)
            assert kind is kvtier.ConnectionError, (into, kind, message)
            assert message.startswith("no kvtier node answered: 127.0.0.1:"), (into, message)
    finally:
        node.close()


def test_retry_decisions_without_io() -> None:
    """The decision alone (kvtier._retry.Attempts): no sockets, no sleeping."""
    from kvtier._commands import parse_nodes
    from kvtier._retry import TRYAGAIN_PAUSE, Attempts, NodeOrder

    a, b, c = parse_nodes("h1:1,h2:2,h3:3")
    order = NodeOrder((a, b, c))
    tries = Attempts(order, first=b)
    assert tries.next() == b
    # MOVED: the named node at once.
    assert tries.error_reply(b, "MOVED 7 h3:3") == 0.0
    assert tries.next() == c
    # TRYAGAIN: the same node after a pause.
    assert tries.error_reply(c, "TRYAGAIN later") == TRYAGAIN_PAUSE
    assert tries.next() == c
    # Any other error is the answer.
    assert tries.error_reply(c, "ERR wrong number of arguments") is None
    # A pooled connection lost before the reply: the same node again; a
    # fresh one: the node is skipped, the next tried, and marked down.
    tries.lost_before_reply(c, kvtier.ConnectionError("closed"), pooled=True)
    assert tries.next() == c
    tries.lost_before_reply(c, TimeoutError("timed out"), pooled=False)
    left = []
    while (n := tries.next()) is not None:
        left.append(n)
        tries.no_connection(n, kvtier.ConnectionError("refused"))
    # The nodes of the first order not yet tried (b was; c is tried again).
    assert sorted(map(str, left)) == ["h1:1", "h3:3"]
    err = tries.exhausted()
    assert isinstance(err, kvtier.ConnectionError) and "h3:3: timed out" in str(err)
    # Every node is now marked down: a new command still tries them all.
    assert sorted(map(str, order.order())) == ["h1:1", "h2:2", "h3:3"]
    # A last failure that timed out is a TimeoutError.
    late = Attempts(NodeOrder((a,)))
    late.no_connection(late.next() or a, kvtier.TimeoutError("connecting timed out"))
    assert isinstance(late.exhausted(), kvtier.TimeoutError)


def test_failover_to_a_live_node(server: Server) -> None:
    dead = "127.0.0.1:%d" % free_ports(1)[0]
    c = kvtier.Client([dead, server.addr], connect_timeout=1)
    c.put_chain(["f"], [b"F"])
    for _ in range(4):  # whichever node comes first in the rotation
        assert c.prefix_len(["f"]) == 1

    async def run() -> None:
        a = kvtier.AsyncClient([dead, server.addr], connect_timeout=1)
        for _ in range(4):
            assert await a.prefix_len(["f"]) == 1
        await a.close()

    asyncio.run(run())


def test_cluster_forward_mode(cluster_nodes: list[Server]) -> None:
    c = kvtier.Client([s.addr for s in cluster_nodes])
    keys = ["ck%d" % i for i in range(60)]
    assert c.put_chain(keys, [k.encode() * 10 for k in keys]) == [1] * 60
    held = [int(s.client().execute("DBSIZE")) for s in cluster_nodes]  # type: ignore[call-overload]
    assert sum(held) == 60 and all(held), held
    for _ in range(3):  # every node coordinates the same answer
        assert c.prefix_len(keys) == 60
        assert c.get_prefix(keys) == [k.encode() * 10 for k in keys]
    c.execute("DEL", keys[33])
    assert c.prefix_len(keys) == 33
    assert len(c.get_prefix(keys, into=[bytearray(40) for _ in keys])) == 33


def test_cluster_redirect_mode_follows_moved(tmp_path: Path) -> None:
    nodes = start_cluster(tmp_path, 3, "--cluster-redirect", "yes")
    try:
        c = kvtier.Client([nodes[0].addr])  # one seed node: the rest come from MOVED
        for i in range(30):
            assert c.put_chain(["rk%d" % i], [b"v%d" % i]) == [1]
            assert c.get_prefix(["rk%d" % i]) == [b"v%d" % i]
        assert c.prefix_len(["rk%d" % i for i in range(30)]) == 30

        async def run() -> None:
            a = kvtier.AsyncClient([nodes[0].addr])
            for i in range(30):
                assert await a.get_prefix(["rk%d" % i]) == [b"v%d" % i]
            await a.close()

        asyncio.run(run())
    finally:
        for n in nodes:
            n.stop()


def test_urls() -> None:
    ep = kvtier.parse_url("kvtier://u:p%40ss@h1:1,h2:2")
    assert [str(n) for n in ep.nodes] == ["h1:1", "h2:2"] and (ep.username, ep.password) == ("u", "p@ss")
    assert kvtier.parse_url("kvtiers://h").ssl and kvtier.parse_url("kvtiers://h").nodes[0].port == 6379
    with pytest.raises(ValueError, match="kvtiers:// for TLS"):
        kvtier.parse_url("redis://h:1")


def test_clients_take_urls_and_name_bad_addresses(server: Server) -> None:
    url = "kvtier://%s" % server.addr
    for i, c in enumerate((kvtier.Client(url), kvtier.Client.from_url(url))):
        assert c.put_chain(["url:%d" % i], [b"v"]) == [1] and c.get_prefix(["url:%d" % i]) == [b"v"]
        c.close()

    async def run() -> None:
        for make in (kvtier.AsyncClient, kvtier.AsyncClient.from_url):
            async with make(url) as a:
                assert await a.get_prefix(["url:0"]) == [b"v"]

    asyncio.run(run())
    # A URL's user and password are the client's unless given as keywords.
    c = kvtier.Client("kvtier://u:p%40ss@h1:1,h2:2")
    assert [str(n) for n in c.nodes] == ["h1:1", "h2:2"]
    assert (c.username, c.password) == ("u", "p@ss")
    assert kvtier.Client("kvtier://u:p@h1:1", password="other").password == "other"
    for bad, says in [
        ("kvtier://h1:port", "bad port 'port'"),
        ("h1:70000", "bad port"),
        ("redis://h1:1", "kvtier:// and kvtiers://"),
        ("kvtier://", "no nodes"),
        (":1", "no host"),
        (["h1:1", "kvtier://h2:2"], "a URL where an address was expected"),
    ]:
        with pytest.raises(ValueError, match=says):
            kvtier.Client(bad)
        with pytest.raises(ValueError, match=says):
            kvtier.AsyncClient(bad)
    for make in (kvtier.Client.from_url, kvtier.AsyncClient.from_url):
        with pytest.raises(ValueError, match="takes a kvtier:// or kvtiers:// URL"):
            make("h1:1")


def test_put_chain_names_a_wrong_argument_before_sending(server: Server) -> None:
    cases: list[tuple[list[str], list[bytes], dict[str, Any], str]] = [
        (["a", "b"], [b"x"], {}, "keys has 2 items but values has 1"),
        ([], [], {}, "keys is empty"),
        (["a"], [b"x"], {"parent": "p", "chain": False}, "parent needs chain=True"),
        (["a"], [b"x"], {"ex": 1, "px": 1}, "ex or px"),
    ]
    c = server.client()
    for keys, values, kw, says in cases:
        with pytest.raises(ValueError, match=says):
            c.put_chain(keys, values, **kw)

    async def run() -> None:
        async with kvtier.AsyncClient(server.addr) as a:
            for keys, values, kw, says in cases:
                with pytest.raises(ValueError, match=says):
                    await a.put_chain(keys, values, **kw)

    asyncio.run(run())
    assert c.execute("DBSIZE") == 0, "something was sent"


def _dialect_calls(server: Server) -> int:
    stats = server.commandstats()
    return sum(stats.get(c, 0) for c in ("prefixlen", "mexists", "mgetprefix", "msetblock"))


#: (method, args, keywords, exception, what its message says)
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    ("prefix_len", ("abc",), {}, TypeError, r"keys must be a list of keys, not one str \(wrap a single key"),
    ("prefix_len", ([],), {}, ValueError, "prefix_len: keys is empty"),
    ("prefix_len", ([b"a", 7],), {}, TypeError, r"prefix_len: keys\[1\] is int; a key is str or bytes"),
    ("prefix_len", (["a"],), {"hold_ms": 0}, ValueError, "hold_ms must be at least 1, not 0"),
    ("prefix_len", (["a"],), {"hold_ms": "5"}, TypeError, "hold_ms must be an int, not str"),
    ("exists_many", ({"a"},), {}, TypeError, "exists_many: keys must be a list of keys, not set"),
    ("exists_many", ([],), {}, ValueError, "exists_many: keys is empty"),
    ("get_prefix", (["a"],), {"min": 1}, ValueError, "min needs block_ms"),
    (
        "get_prefix",
        (["a", "b"],),
        {"block_ms": 10, "min": 3},
        ValueError,
        "min must be between 1 and 2, not 3",
    ),
    ("get_prefix", (["a"],), {"block_ms": -1}, ValueError, "block_ms must be at least 1"),
    ("get_prefix", (["a"],), {"max_bytes": -1}, ValueError, "max_bytes must be at least 0"),
    ("get_prefix", (["a"],), {"max_bytes": 1.5}, TypeError, "max_bytes must be an int, not float"),
    ("get_prefix", (["a"],), {"into": 5}, TypeError, "into is int; into takes one writable buffer"),
    ("get_prefix", (["a"],), {"into": b"xx"}, TypeError, r"into is read-only \(bytes\)"),
    ("get_prefix", (["a"],), {"into": [bytearray(1), b"x"]}, TypeError, r"into\[1\] is read-only"),
    ("get_prefix", (["a", "b"],), {"into": [bytearray(1)]}, ValueError, "2 keys but into has 1 buffers"),
    (
        "get_prefix",
        (["a", "b"],),
        {"into": bytearray(3)},
        ValueError,
        "into has 3 bytes, not a multiple of the 2",
    ),
    (
        "get_prefix",
        (["a", "b"],),
        {"into": bytearray(3), "stride": 2},
        ValueError,
        "needs 4 bytes but into has 3",
    ),
    ("get_prefix", (["a"],), {"stride": 2}, ValueError, "stride needs into="),
    (
        "get_prefix",
        (["a"],),
        {"into": [bytearray(2)], "stride": 2},
        ValueError,
        "stride applies to one buffer",
    ),
    ("put_chain", (["a"], [5]), {}, TypeError, r"values\[0\] is int; a value is bytes-like"),
    ("put_chain", (["a"], [[b"x", None]]), {}, TypeError, r"values\[0\]\[1\] is NoneType"),
    ("put_chain", (["a"], b"x"), {}, TypeError, "values must be a list"),
    ("put_chain", (["a"], [memoryview(bytearray(8))[::2]]), {}, ValueError, r"values\[0\] is not contiguous"),
    ("put_chain", (["a"], [b"x"]), {"ex": 0}, ValueError, "ex must be at least 1"),
    ("put_chain", (["a"], [b"x"]), {"parent": 3}, TypeError, "parent is int"),
]


def test_every_method_names_a_wrong_argument_before_sending(server: Server) -> None:
    """Each bad call is a TypeError/ValueError naming the argument, from both
    clients, and no dialect command reaches the server."""
    c = server.client()
    before = _dialect_calls(server)
    for method, args, kw, exc, says in BAD_CALLS:
        with pytest.raises(exc, match=says):
            getattr(c, method)(*args, **kw)

    async def run() -> None:
        async with kvtier.AsyncClient(server.addr) as a:
            for method, args, kw, exc, says in BAD_CALLS:
                with pytest.raises(exc, match=says):
                    await getattr(a, method)(*args, **kw)

    asyncio.run(run())
    assert _dialect_calls(server) == before, "a bad call sent something"
    assert c.execute("DBSIZE") == 0


def test_into_one_buffer_for_all_values(server: Server) -> None:
    """A region of n equal slots takes n keys as it is (numpy rows too); a
    larger region takes an explicit stride; a value longer than its slot is
    BufferTooSmall and the connection stays usable."""
    np = pytest.importorskip("numpy")
    c = server.client()
    keys = ["slot%d" % i for i in range(6)]
    values = [bytes([i]) * (100 + i) for i in range(6)]
    c.put_chain(keys, values)
    region = bytearray(6 * 128)
    assert c.get_prefix(keys, into=region) == [len(v) for v in values]
    assert all(region[i * 128 : i * 128 + len(v)] == v for i, v in enumerate(values))
    rows = np.zeros((6, 128), dtype=np.uint8)
    assert c.get_prefix(keys, into=rows) == [len(v) for v in values]
    assert all(rows[i, : len(v)].tobytes() == v for i, v in enumerate(values))
    big = memoryview(bytearray(10 * 200))
    assert c.get_prefix(keys[:3], into=big, stride=200) == [100, 101, 102]
    assert bytes(big[200:301]) == values[1]
    with pytest.raises(kvtier.BufferTooSmall, match="value 3 is 103 bytes, its buffer holds 102"):
        c.get_prefix(keys, into=bytearray(6 * 102))
    assert c.prefix_len(keys) == 6  # the connection survived
    # A large striped read and a hole: the prefix ends there (slots after it
    # are the caller's to ignore: a stripe past the hole may have filled them).
    many = ["many%d" % i for i in range(64)]
    c.put_chain(many, [bytes([i]) * 64 for i in range(64)])
    c.execute("DEL", many[40])
    out = bytearray(64 * 64)
    assert c.get_prefix(many, into=out) == [64] * 40
    assert out[: 40 * 64] == b"".join(bytes([i]) * 64 for i in range(40))

    async def run() -> None:
        async with kvtier.AsyncClient(server.addr) as a:
            dest = np.zeros((6, 128), dtype=np.uint8)
            assert await a.get_prefix(keys, into=dest) == [len(v) for v in values]
            assert dest[5, :105].tobytes() == values[5]

    asyncio.run(run())


def test_numpy_values_are_stored_as_their_bytes(server: Server) -> None:
    """A numpy array is its bytes, whatever its dtype and shape (its len
    counts rows, which once went out as the value's length)."""
    np = pytest.importorskip("numpy")
    c = server.client()
    small = np.arange(1000, dtype=np.float16)  # 2,000 bytes: joined into the request
    large = np.arange(3 * 8192, dtype=np.float32).reshape(3, 8192)  # 96 KiB: sent from its memory
    assert c.put_chain(["f16", "f32"], [small, [b"head", large]]) == [1, 1]
    got = c.get_prefix(["f16", "f32"])
    assert got == [small.tobytes(), b"head" + large.tobytes()]
    assert c.execute("PING") == b"PONG"


def test_tls_urls_and_keywords(tls_url: str, certs: Path) -> None:
    """kvtiers:// talks TLS to --tls-port: the CA and a client certificate
    from the URL's query or from keywords; a wrong CA, a missing client
    certificate or a TLS option without TLS fail with what is wrong."""
    keys = ["tls%d" % i for i in range(64)]
    values = [os.urandom(4096) for _ in keys]
    with kvtier.Client(tls_url) as c:
        assert c.put_chain(keys, values) == [1] * 64
        assert c.prefix_len(keys) == 64
        region = bytearray(64 * 4096)
        assert c.get_prefix(keys, into=region) == [4096] * 64 and bytes(region) == b"".join(values)
    port = int(tls_url.split("://")[1].split("?")[0].split(":")[1])
    kw = dict(
        ssl_ca_certs=str(certs / "ca.crt"),
        ssl_certfile=str(certs / "client.crt"),
        ssl_keyfile=str(certs / "client.key"),
    )
    with kvtier.Client("127.0.0.1:%d" % port, ssl=True, **kw) as c:  # type: ignore[arg-type]
        assert c.get_prefix(keys[:2]) == values[:2]
    with kvtier.Client.from_url("kvtiers://localhost:%d" % port, **kw) as c:  # type: ignore[arg-type]
        assert c.exists_many(keys[:2]) == [True, True]

    async def run() -> None:
        async with kvtier.AsyncClient.from_url(tls_url) as a:
            assert await a.get_prefix(keys) == values
            assert await a.put_chain(["tls-async"], [b"v"]) == [1]
        async with kvtier.AsyncClient("127.0.0.1:%d" % port, ssl=True, **kw) as a:  # type: ignore[arg-type]
            assert await a.prefix_len(["tls-async"]) == 1

    asyncio.run(run())
    with pytest.raises(kvtier.ResponseError, match="this port speaks TLS"):
        kvtier.Client("kvtier://127.0.0.1:%d" % port).prefix_len(["a"])
    no_client_cert = "kvtiers://127.0.0.1:%d?ssl_ca_certs=%s" % (port, certs / "ca.crt")
    with pytest.raises(kvtier.ConnectionError):
        kvtier.Client(no_client_cert, connect_timeout=2).prefix_len(["a"])
    wrong_ca = tls_url.replace("ca.crt", "other-ca.crt")
    with pytest.raises(kvtier.ConnectionError, match="certificate verify failed"):
        kvtier.Client(wrong_ca, connect_timeout=2).prefix_len(["a"])
    with pytest.raises(kvtier.ConnectionError, match="certificate verify failed"):
        asyncio.run(kvtier.AsyncClient(wrong_ca, connect_timeout=2).prefix_len(["a"]))
    for bad, says in [
        ("kvtier://h:1?ssl_ca_certs=x", "TLS options need a kvtiers:// URL"),
        ("kvtiers://h:1?ca=x", "unknown option 'ca'"),
        ("kvtiers://h:1?ssl_cert_reqs=maybe", "ssl_cert_reqs must be none, optional or required"),
        ("kvtiers://h:1?ssl_keyfile=k", "ssl_keyfile needs ssl_certfile"),
    ]:
        with pytest.raises(ValueError, match=says):
            kvtier.Client(bad)
    with pytest.raises(ValueError, match="ssl_ca_certs given without TLS"):
        kvtier.Client("h:1", ssl_ca_certs="x")
    with pytest.raises(ValueError, match="set its options on it"):
        kvtier.AsyncClient("h:1", ssl=ssl.create_default_context(), ssl_ca_certs="x")


def _coordinated(nodes: list[Server]) -> int:
    total = 0
    for s in nodes:
        info = s.client().execute("INFO", "cluster")
        assert isinstance(info, bytes)
        total += int(info.split(b"cluster_coordinated:")[1].split(b"\r\n")[0])
    return total


def test_cluster_reads_are_split_by_owner(cluster_nodes: list[Server]) -> None:
    """get_prefix asks each owner for its own keys (no node relays values)
    and merges exactly as a coordinating node would: holes, MAXBYTES, BLOCK."""
    addrs = [s.addr for s in cluster_nodes]
    c = kvtier.Client(addrs)
    plain = kvtier.Client(addrs, split_reads=False)
    keys = ["sk%d" % i for i in range(40)]
    values = [os.urandom(1000 + i) for i in range(40)]
    c.put_chain(keys, values)
    c.get_prefix(keys)  # reads the slot map
    before = _coordinated(cluster_nodes)
    assert c.get_prefix(keys) == values
    assert _coordinated(cluster_nodes) == before, "a node coordinated a split read"
    assert plain.get_prefix(keys) == values
    assert _coordinated(cluster_nodes) > before
    budget = sum(len(v) for v in values[:17]) + 5
    assert c.get_prefix(keys, max_bytes=budget) == plain.get_prefix(keys, max_bytes=budget) == values[:17]
    c.execute("DEL", keys[25])
    dest = [bytearray(2000) for _ in keys]
    assert c.get_prefix(keys, into=dest) == [len(v) for v in values[:25]]
    assert all(bytes(d[: len(v)]) == v for d, v in zip(dest, values[:25]))
    threading.Timer(0.5, lambda: plain.put_chain([keys[25]], [values[25]])).start()
    assert c.get_prefix(keys, block_ms=5000) == values

    async def run() -> None:
        a = kvtier.AsyncClient(addrs)
        assert await a.get_prefix(keys) == values
        n0 = _coordinated(cluster_nodes)
        assert await a.get_prefix(keys, max_bytes=budget) == values[:17]
        assert _coordinated(cluster_nodes) == n0
        await a.close()

    asyncio.run(run())


def test_large_batches_are_striped_and_merged(server: Server) -> None:
    """A large put/get goes out as up to 4 commands on parallel connections;
    the answer is the one a single command gives (holes in any stripe). A
    read into buffers smaller than 8 MiB goes as one command."""
    c = server.client()
    one = server.client(stripes=1)
    keys = ["st%d" % i for i in range(40)]
    values = [os.urandom(300_000) for _ in keys]  # 12 MB: striped
    server.client().execute("CONFIG", "RESETSTAT")
    assert c.put_chain(keys, values) == [1] * 40
    assert server.commandstats().get("msetblock") == 4
    assert c.put_chain(keys, values) == [0] * 40
    server.client().execute("CONFIG", "RESETSTAT")
    assert c.get_prefix(keys) == values
    assert server.commandstats().get("mgetprefix") == 4
    for hole in (3, 25, 39):
        c.execute("DEL", keys[hole])
        dest = [bytearray(300_000) for _ in keys]
        assert c.get_prefix(keys, into=dest) == one.get_prefix(keys, into=dest) == [300_000] * hole
        assert c.prefix_len(keys) == hole
        c.put_chain([keys[hole]], [values[hole]])
    # Into caller buffers, the buffers say how large the read is: under
    # 8 MiB it is one command (threads cost more than they gain there).
    for n, commands in ((27, 1), (28, 4)):  # 8.1 MB, 8.4 MB: 8 MiB between
        server.client().execute("CONFIG", "RESETSTAT")
        dest = [bytearray(300_000) for _ in keys[:n]]
        assert c.get_prefix(keys[:n], into=dest) == [300_000] * n
        assert [bytes(d) for d in dest] == values[:n]
        assert server.commandstats().get("mgetprefix") == commands, n

    async def run() -> None:
        a = kvtier.AsyncClient(server.addr)
        assert await a.get_prefix(keys) == values
        c.execute("DEL", keys[17])
        assert len(await a.get_prefix(keys)) == 17
        await a.close()

    asyncio.run(run())


def test_idle_connections_closed_by_the_server_are_replaced(tmp_path: Path) -> None:
    from conftest import start_kvtier

    s = start_kvtier(tmp_path / "idle.log", "--timeout", "1")
    try:
        c = s.client()
        c.put_chain(["i"], [b"I"])

        async def run() -> None:
            a = kvtier.AsyncClient(s.addr)
            assert await a.get_prefix(["i"]) == [b"I"]
            await asyncio.sleep(2.5)
            assert await a.get_prefix(["i"]) == [b"I"]
            await a.close()

        assert c.prefix_len(["i"]) == 1
        time.sleep(2.5)  # the server drops both clients' idle connections
        assert c.prefix_len(["i"]) == 1
        assert c.get_prefix(["i"], into=[bytearray(1)]) == [1]
        asyncio.run(run())
    finally:
        s.stop()
