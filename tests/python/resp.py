"""A raw RESP client for differential tests.

Nothing here normalises a reply: :meth:`RawConnection.call` returns the exact
bytes the server sent for one reply, so two servers can be compared byte for
byte, error texts included. :func:`parse` turns those bytes into Python values
(bytes, int, list, dict, ...) when a test needs to look inside (shape checks,
set comparisons).
"""

from __future__ import annotations

import socket
import time
from typing import Any

#: Seconds any single socket operation may take before the test fails.
SOCKET_TIMEOUT = 10.0


class ErrorReply(Exception):
    """A `-ERR ...` reply, as returned by :func:`parse` (not raised)."""

    def __init__(self, text: bytes):
        super().__init__(text.decode("utf-8", "replace"))
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ErrorReply) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"ErrorReply({self.text!r})"


def encode(*args: Any) -> bytes:
    """A command as a RESP multibulk."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, (int, float)):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Incomplete(Exception):
    """More bytes are needed to finish the reply."""


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    return buf[pos:end], end + 2


def _skip(buf: bytes, pos: int) -> int:
    """Position just past the reply starting at `pos` (raises Incomplete)."""
    if pos >= len(buf):
        raise Incomplete
    kind = buf[pos : pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind in (b"+", b"-", b":", b",", b"#", b"_", b"("):
        return pos
    if kind in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return pos
        if len(buf) < pos + n + 2:
            raise Incomplete
        return pos + n + 2
    if kind in (b"*", b"~", b">"):
        n = int(line)
        for _ in range(max(n, 0)):
            pos = _skip(buf, pos)
        return pos
    if kind in (b"%", b"|"):
        n = int(line)
        for _ in range(2 * n):
            pos = _skip(buf, pos)
        if kind == b"|":  # an attribute precedes the real reply
            pos = _skip(buf, pos)
        return pos
    raise ValueError(f"bad RESP type byte {kind!r} in {buf[:200]!r}")


def parse(raw: bytes) -> Any:
    """One reply's bytes as Python values (maps become lists of pairs)."""
    value, pos = _parse(raw, 0)
    assert pos == len(raw), f"trailing bytes after reply: {raw!r}"
    return value


def _parse(buf: bytes, pos: int) -> tuple[Any, int]:
    kind = buf[pos : pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return ErrorReply(line), pos
    if kind in (b":", b"("):
        return int(line), pos
    if kind == b",":
        return float(line), pos
    if kind == b"#":
        return line == b"t", pos
    if kind == b"_":
        return None, pos
    if kind in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return None, pos
        return buf[pos : pos + n], pos + n + 2
    if kind in (b"*", b"~", b">"):
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == b"%":
        n = int(line)
        pairs = []
        for _ in range(n):
            k, pos = _parse(buf, pos)
            v, pos = _parse(buf, pos)
            pairs.append((k, v))
        return pairs, pos
    raise ValueError(f"bad RESP type byte {kind!r}")


class RawConnection:
    """One TCP connection speaking raw RESP, every operation with a timeout."""

    def __init__(self, host: str, port: int, timeout: float = SOCKET_TIMEOUT):
        self.addr = (host, port)
        self.timeout = timeout
        self.sock = socket.create_connection(self.addr, timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete reply from {self.addr} (have {self.buf[:200]!r})")
        self.sock.settimeout(left)
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"{self.addr} closed the connection (have {self.buf[:200]!r})")
        self.buf += chunk

    def read_reply(self) -> bytes:
        """The raw bytes of the next complete reply."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                end = _skip(self.buf, 0)
            except Incomplete:
                self._fill(deadline)
                continue
            raw, self.buf = self.buf[:end], self.buf[end:]
            return raw

    def call(self, *args: Any) -> bytes:
        """Sends one command, returns the raw bytes of its reply."""
        self.send(encode(*args))
        return self.read_reply()

    def pipeline(self, commands: list[tuple]) -> list[bytes]:
        """Sends all commands at once, returns their raw replies in order."""
        self.send(b"".join(encode(*c) for c in commands))
        return [self.read_reply() for _ in commands]

    def read_all_until_close(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._fill(deadline)
            except ConnectionError:
                out, self.buf = self.buf, b""
                return out
            except OSError as e:  # connection reset counts as closed
                if isinstance(e, TimeoutError):
                    raise
                out, self.buf = self.buf, b""
                return out
