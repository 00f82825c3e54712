"""The value format every plugin stores, and the sink that checks and lands it.

Each plugin (LMCache, SGLang, vLLM) stores one value per block: a fixed
header, the plugin's own bytes after it, then the KV bytes::

    +-------+--------+-------------+--------+-------+------------+-----------+
    | magic | hdrlen | payload len | crc32  | flags | key digest | ...       |
    | 4 B   | u32    | u64         | u32    | u32   | 8 B        |           |
    +-------+--------+-------------+--------+-------+------------+-----------+
     0       4        8             16       20      24           32

``magic`` names the plugin (and so the layout of what follows), ``hdrlen``
is the whole header with the plugin's part, the digest names the key the
value was stored under (a value read back under another key is a miss), and
with ``FLAG_CRC`` the CRC32 covers the payload. Little-endian.

A plugin writes values with :meth:`Codec.header` and reads them with a
:class:`CheckedSink`, supplying only where a value's bytes go: every check
that turns a wrong value into a miss is here, once.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Optional, Union

FIXED = struct.Struct("<4sIQII8s")
#: The payload's CRC32 is in the header.
FLAG_CRC = 1

Buffer = Union[bytes, bytearray, memoryview]
#: The buffers one value's payload fills, in order.
Views = list[Union[memoryview, bytearray]]


def key_digest(key: str) -> bytes:
    """8 bytes naming the key a value was stored under."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


class Header(NamedTuple):
    """A header as read back."""

    magic: bytes
    header_len: int
    payload_len: int
    crc: int
    flags: int
    digest: bytes


def unpack(buf: Buffer) -> Header:
    """The fixed header at the start of ``buf`` (``struct.error`` if short)."""
    return Header(*FIXED.unpack_from(buf, 0))


class Codec:
    """One plugin's values: ``magic``, the fixed header, ``extra`` bytes of
    the plugin's own, then the payload; with ``checksum`` the writer puts
    the payload's CRC32 in the header (a reader checks any value that has
    one). ``log`` says why a value is a miss."""

    def __init__(self, magic: bytes, extra: int, checksum: bool, log: logging.Logger) -> None:
        self.magic = magic
        self.header_len = FIXED.size + extra
        self.checksum = checksum
        self.log = log

    def header(self, key: str, payload: Sequence[Buffer], extra: Buffer = b"") -> bytearray:
        """The header of a value stored under ``key`` whose payload is the
        concatenation of ``payload``, with the plugin's ``extra`` bytes."""
        length, crc, flags = 0, 0, 0
        for p in payload:
            length += memoryview(p).nbytes
            if self.checksum:
                crc = zlib.crc32(p, crc)
        if self.checksum:
            flags = FLAG_CRC
        head = bytearray(self.header_len)
        FIXED.pack_into(head, 0, self.magic, self.header_len, length, crc, flags, key_digest(key))
        if memoryview(extra).nbytes != self.header_len - FIXED.size:
            raise ValueError(
                "the plugin's header part is %d bytes, not %d" % (len(extra), self.header_len - FIXED.size)
            )
        head[FIXED.size :] = extra
        return head

    def check(self, key: str, head: Buffer, length: int) -> Optional[Header]:
        """The header of a ``length``-byte value read under ``key`` when it
        is one of this plugin's, of this length, stored under this key;
        else None (logged)."""
        try:
            h = unpack(head)
        except struct.error:
            self.miss(key, "short header")
            return None
        if h.magic != self.magic or h.header_len != self.header_len:
            self.miss(key, "not a kvtier value of this kind")
            return None
        if h.payload_len != length - h.header_len:
            self.miss(key, "value is %d bytes, its header says %d" % (length, h.header_len + h.payload_len))
            return None
        if h.digest != key_digest(key):
            self.miss(key, "value was stored under another key")
            return None
        return h

    def miss(self, key: str, why: str) -> None:
        """Logs why the value under ``key`` is treated as a miss."""
        self.log.warning("kvtier: treating %s as a miss: %s", key, why)
        return None


#: Where the payload of value ``index`` goes, given its checked header and
#: the header's bytes (for the plugin's own part): the buffers it fills in
#: order, or None when the plugin refuses it (after ``Codec.miss``).
Place = Callable[[int, Header, bytearray], Optional[Views]]


class CheckedSink:
    """Receives an ``MGETPREFIX`` reply (a client's ``into=`` sink): for
    value ``i`` it takes the header, checks it (:meth:`Codec.check`, then
    the plugin's ``place``) and hands out the buffers ``place`` names, so
    the payload goes from the socket straight to where the plugin wants it.
    The first value that fails ends the prefix: later values are read and
    dropped. After the reply, :meth:`verify` checks the CRC32s and
    :meth:`prefix` says how many leading values are whole and sound.

    Values may arrive out of order (one reply per cluster node), on several
    threads (stripes) and again (a retry: ``forget`` is told first).
    """

    def __init__(
        self, codec: Codec, keys: Sequence[str], place: Place, forget: Optional[Callable[[int], None]] = None
    ) -> None:
        self.codec = codec
        self.keys = keys
        self.place = place
        self.forget = forget
        #: Indexes of values that failed a check.
        self.bad: set[int] = set()
        self.first_bad = len(keys)
        self._landed: dict[int, Views] = {}
        self._crcs: dict[int, int] = {}
        self._lock = threading.Lock()

    def __call__(self, index: int, length: int) -> Iterator[Union[bytearray, Views]]:
        if self._landed.pop(index, None) is not None:  # a retry
            self._crcs.pop(index, None)
            if self.forget is not None:
                self.forget(index)
        if index >= self.first_bad:
            return iter(())
        return self._fill(index, length)

    def _broken(self, index: int) -> None:
        with self._lock:
            self.bad.add(index)
            self.first_bad = min(self.first_bad, index)

    def _fill(self, index: int, length: int) -> Iterator[Union[bytearray, Views]]:
        key = self.keys[index]
        if length < self.codec.header_len:
            self.codec.miss(key, "value of %d bytes is shorter than a header" % length)
            self._broken(index)
            return
        head = bytearray(self.codec.header_len)
        yield head
        h = self.codec.check(key, head, length)
        views = None if h is None else self.place(index, h, head)
        if h is None or views is None:
            self._broken(index)
            return
        self._landed[index] = views
        if h.flags & FLAG_CRC:
            self._crcs[index] = h.crc
        yield views

    def verify(self) -> None:
        """Checks the CRC32 of every value that has one: a mismatch is a
        failed value (``bad``)."""
        for index, crc in sorted(self._crcs.items()):
            got = 0
            for v in self._landed.get(index, ()):
                got = zlib.crc32(v, got)
            if got != crc:
                self.codec.miss(self.keys[index], "CRC32 mismatch")
                self._broken(index)

    def landed(self, index: int) -> bool:
        """Whether value ``index`` arrived and passed the header checks."""
        return index in self._landed and index not in self.bad

    def prefix(self, arrived: int) -> int:
        """How many leading values of the ``arrived`` the reply held are
        whole and sound (call :meth:`verify` first)."""
        for i in range(min(arrived, self.first_bad)):
            if not self.landed(i):
                return i
        return min(arrived, self.first_bad)
