"""The fixed header the plugins put in front of every value they store.

Each plugin (LMCache, SGLang, vLLM) stores one value per block: this header,
anything the plugin adds after it, then the KV bytes::

    +-------+--------+-------------+--------+-------+------------+-----------+
    | magic | hdrlen | payload len | crc32  | flags | key digest | ...       |
    | 4 B   | u32    | u64         | u32    | u32   | 8 B        |           |
    +-------+--------+-------------+--------+-------+------------+-----------+
     0       4        8             16       20      24           32

``magic`` names the plugin (and so the layout of what follows), ``hdrlen``
is the whole header with the plugin's part, the digest names the key the
value was stored under (a value read back under another key is a miss), and
with ``FLAG_CRC`` the CRC32 covers the payload. Little-endian.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple, Union

FIXED = struct.Struct("<4sIQII8s")
#: The payload's CRC32 is in the header.
FLAG_CRC = 1


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


def pack_into(
    buf: Union[bytearray, memoryview],
    magic: bytes,
    header_len: int,
    payload_len: int,
    crc: int,
    flags: int,
    key: str,
) -> None:
    """Writes the fixed header at the start of ``buf``."""
    FIXED.pack_into(buf, 0, magic, header_len, payload_len, crc, flags, key_digest(key))


def unpack(buf: Union[bytes, bytearray, memoryview]) -> Header:
    """The fixed header at the start of ``buf`` (``struct.error`` if short)."""
    return Header(*FIXED.unpack_from(buf, 0))
