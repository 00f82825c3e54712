"""LMCache remote-storage plugin: kvtier as LMCache's remote backend.

Load it from the LMCache config (see docs/connectors.md)::

    remote_storage_plugins: ["kvtier"]
    extra_config:
      remote_storage_plugin.kvtier.module_path: kvtier.lmcache
      remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter
      remote_storage_plugin.kvtier.url: "kvtier://10.0.0.1:6379,10.0.0.2:6379"

What each connector call sends:

=========================================  ===========================================
``batched_contains`` / ``batched_async_``  one ``PREFIXLEN ... HOLD`` (with TP > 1: over
``contains``                               every rank's keys, then one ``SET NX GET`` to
                                           agree); the counted chunks stay until read
``get`` / ``batched_get`` / ``batched_``   one ``MGETPREFIX``, values received into
``get_non_blocking``                       LMCache ``MemoryObj`` buffers
``put`` / ``batched_put``                  one ``MSETBLOCK ... CHAIN`` (existing kept)
``exists`` / ``exists_sync``               ``PREFIXLEN 1 key``
``remove_sync``                            ``DEL``
=========================================  ===========================================

One key per chunk (``CacheEngineKey.to_string()`` with the model's identity
after its name, ``model~identity@...``); its value is a 32-byte
kvtier header, LMCache's ``RemoteMetadata`` (shapes, dtypes, format) and the
KV bytes, so metadata and data are stored, evicted and read as one. A value
that fails any check is a miss, never bytes handed to the engine::

    +-------+--------+-------------+--------+-------+------------+--------------+-----------+
    | "KVTL"| hdrlen | payload len | crc32  | flags | key digest | RemoteMeta.  | KV bytes  |
    | 4 B   | u32    | u64         | u32    | u32   | 8 B        | M bytes      | payload   |
    +-------+--------+-------------+--------+-------+------------+--------------+-----------+
     0       4        8             16       20      24           32             32 + M

The header is checked against the key it was read for (digest), the value's
size, the engine's shapes/dtypes/format (a partial chunk may have fewer
tokens); with ``checksum`` on, writers add a CRC32 of the payload that every
reader verifies.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional, Union

from lmcache.logging import init_logger
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from . import _commands as cmd
from . import _header
from ._buffers import writable_view
from ._identity import identity_tag, serving_identity
from ._plugin import truthy
from .aio import AsyncClient
from .client import Client

logger = init_logger(__name__)

#: Sets of keys whose sync lookups are counted (the oldest are forgotten).
SYNC_LOOKUPS_KEPT = 4096

MAGIC = b"KVTL"
#: magic, header length, payload length, crc32, flags, key digest (kvtier._header)
_FIXED = _header.FIXED
FLAG_CRC = _header.FLAG_CRC
key_digest = _header.key_digest


def glob_escape(text: str) -> str:
    """``text`` matched literally in a ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


#: ``extra_config`` keys (``remote_storage_plugin.<name>.<option>``) and
#: their defaults. ``url`` is required with ``plugin://``.
DEFAULTS: dict[str, Any] = {
    "url": None,
    # Writers add a CRC32 of the payload; readers verify values that have one.
    "checksum": False,
    # TP agreement: "auto" (on when world_size > 1, unless MLA keys are
    # shared as worker 0) or "off".
    "tp_agreement": "auto",
    # How long a lookup's agreed count is kept for the other ranks (ms).
    "tp_agreement_ttl_ms": 2000,
    # How long a lookup holds the chunks it counted against eviction, until
    # they are read (PREFIXLEN ... HOLD; 0: no hold).
    "lookup_hold_ms": 5000,
    # Time to live of stored chunks in seconds (0: none).
    "ttl": 0,
    "socket_timeout": 30.0,
    "connect_timeout": 5.0,
    # Connections a large fetch or store is spread over (1: one command).
    "stripes": 8,
    # How fetches and stores run: "threads" (the sync client in worker
    # threads: blocking recv_into/sendall with the GIL released, no copy on
    # send; measured faster, docs/benchmarks.md) or "asyncio" (AsyncClient
    # on LMCache's event loop).
    "io": "threads",
}


class KvtierConnectorAdapter(ConnectorAdapter):
    """LMCache ``ConnectorAdapter`` for ``kvtier://host:port[,host:port]`` and for
    ``plugin://kvtier`` (the address is ``extra_config``'s
    ``remote_storage_plugin.kvtier.url``)."""

    def __init__(self) -> None:
        super().__init__("kvtier://")

    def can_parse(self, url: str) -> bool:
        if url.startswith(("kvtier://", "kvtiers://")):
            return True
        if url.startswith("plugin://"):
            return bool(extract_plugin_type(url[len("plugin://") :]) == "kvtier")
        return False

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        config = context.config
        if config is None:
            raise ValueError("the kvtier connector needs the LMCache config")
        plugin = context.plugin_name
        if plugin is None and context.url.startswith("plugin://"):
            plugin = context.url[len("plugin://") :]
        options = plugin_options(config.extra_config or {}, plugin or "kvtier")
        url = context.url
        if url.startswith("plugin://"):
            url = options["url"]
            if not url:
                raise ValueError(
                    "plugin://%s needs extra_config['remote_storage_plugin.%s.url'] = 'kvtier://host:port'"
                    % (plugin, plugin)
                )
        metadata = context.metadata
        if metadata is None:
            metadata = getattr(context.local_cpu_backend, "metadata", None)
        logger.info("Creating kvtier connector for %s", url)
        return KvtierConnector(url, context.loop, context.local_cpu_backend, config, metadata, options)


def plugin_options(extra_config: dict[str, Any], plugin: str) -> dict[str, Any]:
    """The plugin's options: ``remote_storage_plugin.<plugin>.<name>`` (also
    read as ``kvtier.<name>``), else the defaults."""
    options = dict(DEFAULTS)
    for name in DEFAULTS:
        for key in ("remote_storage_plugin.%s.%s" % (plugin, name), "kvtier.%s" % name):
            if key in extra_config:
                options[name] = extra_config[key]
                break
    options["checksum"] = truthy(options["checksum"])
    return options


class ChunkCodec:
    """Packs a chunk's header and checks a header read back."""

    def __init__(self, connector: KvtierConnector) -> None:
        self.meta_bytes: int = connector.remote_metadata_bytes
        self.header_len = _FIXED.size + self.meta_bytes
        self.shapes = [list(s) for s in connector.meta_shapes]
        self.dtypes = list(connector.meta_dtypes)
        self.fmt: MemoryFormat = connector.meta_fmt
        self.checksum: bool = connector.options["checksum"]

    @staticmethod
    def digest(key: str) -> bytes:
        # The key names the model's identity (KvtierConnector.name): a chunk
        # copied under another key, or another model's, is a miss.
        return key_digest(key)

    def header(self, key: str, obj: MemoryObj, payload: memoryview) -> bytearray:
        meta = RemoteMetadata(payload.nbytes, obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
        crc, flags = (zlib.crc32(payload), FLAG_CRC) if self.checksum else (0, 0)
        head = bytearray(self.header_len)
        _FIXED.pack_into(head, 0, MAGIC, self.header_len, payload.nbytes, crc, flags, self.digest(key))
        meta.serialize_into(memoryview(head)[_FIXED.size :])
        return head

    def check(
        self, key: str, head: Union[bytes, bytearray], total: int
    ) -> Optional[tuple[RemoteMetadata, int, int]]:
        """``(metadata, crc, flags)`` when the header fits this key, this value's
        size and the engine's layout, else None (logged)."""
        try:
            magic, hlen, plen, crc, flags, digest = _FIXED.unpack_from(head, 0)
        except struct.error:
            return self._bad(key, "short header")
        if magic != MAGIC or hlen != self.header_len:
            return self._bad(key, "not a kvtier chunk of this layout")
        if plen != total - hlen:
            return self._bad(key, "value is %d bytes, header says %d" % (total, hlen + plen))
        if digest != self.digest(key):
            return self._bad(key, "value was stored under another key or by another model")
        try:
            meta = RemoteMetadata.deserialize(bytes(head[_FIXED.size :]))
        except (ValueError, KeyError, struct.error) as e:
            return self._bad(key, "unreadable metadata (%s)" % e)
        if meta.length != plen or meta.fmt != self.fmt or list(meta.dtypes) != self.dtypes:
            return self._bad(key, "metadata does not match the engine's format")
        if len(meta.shapes) != len(self.shapes):
            return self._bad(key, "wrong number of KV groups")
        size = 0
        for got, want, dtype in zip(meta.shapes, self.shapes, meta.dtypes):
            got = list(got)
            if not self._shape_fits(got, want):
                return self._bad(key, "shape %s does not fit %s" % (got, want))
            n = 1
            for d in got:
                n *= d
            size += n * dtype.itemsize
        if size != plen:
            return self._bad(key, "shapes describe %d bytes, payload is %d" % (size, plen))
        return meta, crc, flags

    @staticmethod
    def _shape_fits(got: list[int], want: list[int]) -> bool:
        """Same shape, except that a partial chunk has fewer tokens."""
        if len(got) != len(want):
            return False
        token_dim = 2 if len(want) == 4 else 0
        for i, (g, w) in enumerate(zip(got, want)):
            if i == token_dim:
                if not 0 < g <= w:
                    return False
            elif g != w:
                return False
        return True

    @staticmethod
    def _bad(key: str, why: str) -> None:
        logger.warning("kvtier: treating %s as a miss: %s", key, why)
        return None


class _ChunkSink:
    """Receives an ``MGETPREFIX`` reply into freshly allocated MemoryObjs.

    For value ``i`` it first takes the header, checks it, allocates a
    MemoryObj of the stored shapes and then hands out that object's buffer,
    so the KV bytes go from the socket straight into LMCache's memory. The
    first value that fails a check, or that no memory can be allocated for,
    ends the prefix: later values are read and dropped. Values may arrive
    out of order (one reply per cluster node) and again (a retry).
    """

    def __init__(self, connector: KvtierConnector, keys: list[str]) -> None:
        self.connector = connector
        self.codec = connector.codec
        self.keys = keys
        self.lock = threading.Lock()  # stripes may arrive on several threads
        self.objs: dict[int, MemoryObj] = {}
        self.crcs: dict[int, tuple[int, int]] = {}
        self.first_bad = len(keys)

    def __call__(self, index: int, length: int) -> Iterable[Union[memoryview, bytearray, None]]:
        old = self.objs.pop(index, None)
        if old is not None:  # the same value again (a retry)
            old.ref_count_down()
        if index >= self.first_bad:
            return ()
        return self._fill(index, length)

    def _broken(self, index: int) -> None:
        with self.lock:
            self.first_bad = min(self.first_bad, index)

    def _fill(self, index: int, length: int) -> Iterator[Union[memoryview, bytearray, None]]:
        codec = self.codec
        if length < codec.header_len:
            codec._bad(self.keys[index], "value of %d bytes is shorter than a header" % length)
            self._broken(index)
            return
        head = bytearray(codec.header_len)
        yield head
        checked = codec.check(self.keys[index], head, length)
        if checked is None:
            self._broken(index)
            return
        meta, crc, flags = checked
        obj = self.connector._allocate(meta)
        if obj is None:
            logger.warning("kvtier: no memory for %s; the prefix ends before it", self.keys[index])
            self._broken(index)
            return
        view = writable_view(obj.byte_array)
        if view.nbytes < meta.length:
            obj.ref_count_down()
            codec._bad(self.keys[index], "allocated buffer is smaller than the chunk")
            self._broken(index)
            return
        self.objs[index] = obj
        self.crcs[index] = (crc, flags)
        yield view[: meta.length]

    def result(self, lengths: Sequence[int]) -> list[MemoryObj]:
        """The verified leading run; everything else is freed."""
        good: list[MemoryObj] = []
        for i in range(min(len(lengths), self.first_bad)):
            obj = self.objs.get(i)
            if obj is None:
                break
            crc, flags = self.crcs[i]
            if flags & FLAG_CRC:
                payload = writable_view(obj.byte_array)[: lengths[i] - self.codec.header_len]
                if zlib.crc32(payload) != crc:
                    self.codec._bad(self.keys[i], "CRC32 mismatch")
                    break
            good.append(obj)
        kept = {id(o) for o in good}
        for obj in self.objs.values():
            if id(obj) not in kept:
                obj.ref_count_down()
        self.objs = {}
        return good

    def release(self) -> None:
        for obj in self.objs.values():
            obj.ref_count_down()
        self.objs = {}


class KvtierConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` on kvtier's block dialect (see the module doc)."""

    def __init__(
        self,
        url: str,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: Any,
        config: Any,
        metadata: Any,
        options: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(config, metadata)
        self.options = dict(DEFAULTS) if options is None else options
        if getattr(config, "use_layerwise", False):
            raise ValueError("the kvtier connector does not support use_layerwise")
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.metadata = metadata
        # Keys name the model that computes the chunks, not only its name:
        # two checkpoints served under one name never share a key.
        self.identity = identity_tag(serving_identity(getattr(metadata, "model_name", None)))
        self.codec = ChunkCodec(self)
        settings: dict[str, Any] = dict(
            socket_timeout=float(self.options["socket_timeout"]),
            connect_timeout=float(self.options["connect_timeout"]),
            stripes=int(self.options["stripes"]),
        )
        self.client = Client.from_url(url, **settings)
        self.aclient = AsyncClient.from_url(url, **settings)
        self.ttl = int(self.options["ttl"]) or None
        io = str(self.options["io"]).lower()
        if io not in ("threads", "asyncio"):
            raise ValueError("io must be 'threads' or 'asyncio', not %r" % io)
        self.threads = io == "threads"
        self.agreement_ranks = self._agreement_ranks(config, metadata)
        self.agreement_ttl_ms = int(self.options["tp_agreement_ttl_ms"])
        self.hold_ms = int(self.options["lookup_hold_ms"]) or None
        # Lookups without a lookup_id, counted per set of keys: every rank
        # sees the same sequence of lookups, so the n-th lookup of some keys
        # on one rank meets the n-th on the others (and never an earlier
        # request's count).
        self._sync_lookups: OrderedDict[str, int] = OrderedDict()
        self._sync_lock = threading.Lock()

    def _agreement_ranks(self, config: Any, metadata: Any) -> Optional[list[int]]:
        mode = str(self.options["tp_agreement"]).lower()
        world = int(getattr(metadata, "world_size", 1) or 1)
        if mode == "off" or world <= 1:
            return None
        if mode != "auto":
            raise ValueError("tp_agreement must be 'auto' or 'off', not %r" % mode)
        mla_as0 = bool(
            getattr(metadata, "use_mla", False)
            and config.get_extra_config_value("remote_enable_mla_worker_id_as0", metadata.use_mla)
        )
        return None if mla_as0 else list(range(world))

    def __repr__(self) -> str:
        return "<KvtierConnector %s>" % self.url

    def name(self, key: CacheEngineKey) -> str:
        """The kvtier key of a chunk: LMCache's ``to_string()`` with the
        model's identity after its name, ``model~identity@world@worker@hash@dtype``."""
        s = key.to_string()
        model = len(key.model_name)
        return "%s~%s%s" % (s[:model], self.identity, s[model:])

    def unname(self, name: str) -> str:
        """LMCache's key string of a kvtier key of this model (``list``)."""
        return name.replace("~%s@" % self.identity, "@", 1)

    # -- memory ---------------------------------------------------------------

    def _allocate(self, meta: RemoteMetadata) -> Optional[MemoryObj]:
        try:
            return self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt, busy_loop=False)
        except TypeError:  # an allocator without busy_loop
            return self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)

    def _value(self, key: str, obj: MemoryObj) -> list[Union[bytes, bytearray, memoryview]]:
        length = sum(s.numel() * d.itemsize for s, d in zip(obj.get_shapes(), obj.get_dtypes()))
        payload = writable_view(obj.byte_array)[:length]
        if payload.nbytes != length:
            raise ValueError("MemoryObj holds %d bytes, its shapes need %d" % (payload.nbytes, length))
        return [self.codec.header(key, obj, payload), payload]

    # -- lookup -----------------------------------------------------------------

    def _lookup_keys(self, keys: Sequence[CacheEngineKey]) -> tuple[list[str], int]:
        if self.agreement_ranks is None:
            return [self.name(k) for k in keys], 1
        ranks = self.agreement_ranks
        return [self.name(k.with_new_worker_id(r)) for k in keys for r in ranks], len(ranks)

    def _agreement_key(self, keys: Sequence[CacheEngineKey], lookup_id: Optional[str]) -> str:
        h = hashlib.blake2b(digest_size=16)
        for k in keys:
            h.update(self.name(k.with_new_worker_id(0)).encode())
            h.update(b"\0")
        base = h.hexdigest()
        if lookup_id is None:
            with self._sync_lock:
                n = self._sync_lookups.pop(base, 0) + 1
                self._sync_lookups[base] = n
                while len(self._sync_lookups) > SYNC_LOOKUPS_KEPT:
                    self._sync_lookups.popitem(last=False)
            lookup_id = "#%d" % n
        return "kvtier:tp-lookup:%s:%s" % (base, lookup_id)

    def _agreed(self, own: int, agreed: object) -> int:
        """The count this rank answers: the first rank's, unless this rank
        cannot load that many (a chunk deleted since: what the first lookup
        counted is held against eviction, not against DEL)."""
        if agreed is None:
            return own
        return min(own, int(agreed))  # type: ignore[call-overload,no-any-return]

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading chunks present: one ``PREFIXLEN ... HOLD`` (TP: over all
        ranks, agreed)."""
        if not keys:
            return 0
        lookup, width = self._lookup_keys(keys)
        n = self.client.prefix_len(lookup, hold_ms=self.hold_ms) // width
        if width == 1:
            return n
        agreed = self.client.execute(
            "SET", self._agreement_key(keys, None), n, "NX", "PX", self.agreement_ttl_ms, "GET"
        )
        return self._agreed(n, agreed)

    def support_batched_contains(self) -> bool:
        return True

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        if not keys:
            return 0
        lookup, width = self._lookup_keys(keys)
        n = await self.aclient.prefix_len(lookup, hold_ms=self.hold_ms) // width
        if width == 1:
            return n
        agreed = await self.aclient.execute(
            "SET", self._agreement_key(keys, lookup_id), n, "NX", "PX", self.agreement_ttl_ms, "GET"
        )
        return self._agreed(n, agreed)

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self.aclient.prefix_len([self.name(key)]) == 1

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.client.prefix_len([self.name(key)]) == 1

    # -- fetch -------------------------------------------------------------------

    async def _fetch(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj]:
        names = [self.name(k) for k in keys]
        sink = _ChunkSink(self, names)
        try:
            if self.threads:
                lengths = await asyncio.to_thread(self.client.get_prefix, names, into=sink)
            else:
                lengths = await self.aclient.get_prefix(names, into=sink)
        except BaseException:
            sink.release()
            raise
        return sink.result(lengths)

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        objs = await self._fetch([key])
        return objs[0] if objs else None

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[Optional[MemoryObj]]:
        objs = await self._fetch(keys)
        return [*objs, *([None] * (len(keys) - len(objs)))]

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """Only the leading run: LMCache matches results to keys by position."""
        return await self._fetch(keys)

    # -- store --------------------------------------------------------------------

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        name = self.name(key)
        codes = await self.aclient.put_chain(
            [name], [self._value(name, memory_obj)], chain=False, ex=self.ttl
        )
        if codes[0] < 0:
            logger.warning("kvtier: %s was not stored (no memory on the server)", name)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """One ``MSETBLOCK ... CHAIN``: the chunks of a prompt, in order."""
        if not keys:
            return
        names = [self.name(k) for k in keys]
        values = [self._value(n, o) for n, o in zip(names, memory_objs)]
        if self.threads:
            codes = await asyncio.to_thread(self.client.put_chain, names, values, ex=self.ttl)
        else:
            codes = await self.aclient.put_chain(names, values, ex=self.ttl)
        failed = sum(1 for c in codes if c < 0)
        if failed:
            logger.warning(
                "kvtier: %d of %d chunks were not stored (no memory on the server)", failed, len(codes)
            )

    # -- the rest ----------------------------------------------------------------

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return bool(self.client.execute("DEL", self.name(key)))

    async def list(self) -> list[str]:
        """LMCache's key strings of this model's chunks on every node (``SCAN``)."""
        model = glob_escape(self.metadata.model_name) if self.metadata is not None else "*"
        names = await asyncio.to_thread(self.client.scan_keys, "%s~%s@*" % (model, self.identity))
        return [self.unname(n) for n in names]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        try:
            return 0 if await self.aclient.execute("PING") == b"PONG" else 1
        except Exception:
            return 1

    async def close(self) -> None:
        await self.aclient.close()
        self.client.close()
        logger.info("Closed the kvtier connection")


__all__ = ["KvtierConnector", "KvtierConnectorAdapter", "ChunkCodec", "cmd"]
