"""kvtier: a Python client for kvtier's KV-cache block dialect.

``Client`` (threads) and ``AsyncClient`` (asyncio) speak ``PREFIXLEN``,
``MGETPREFIX``, ``MSETBLOCK ... CHAIN`` and ``MEXISTS`` to one kvtier node or
a cluster, and receive values straight into caller buffers. The LMCache
plugin is ``kvtier.lmcache``, the SGLang HiCache backend ``kvtier.sglang``;
this package itself imports neither of them, nor torch.
"""

from ._commands import Endpoint, Node, parse_nodes, parse_url
from .aio import AsyncClient
from .client import Client
from .errors import (
    BufferTooSmall,
    ConnectionError,
    KvtierError,
    ProtocolError,
    ResponseError,
    TimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BufferTooSmall",
    "Client",
    "ConnectionError",
    "Endpoint",
    "KvtierError",
    "Node",
    "ProtocolError",
    "ResponseError",
    "TimeoutError",
    "parse_nodes",
    "parse_url",
]
