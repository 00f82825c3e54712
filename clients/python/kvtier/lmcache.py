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
from collections import OrderedDict
from collections.abc import Sequence
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
from ._buffers import writable_view
from ._codec import FIXED, CheckedSink, Codec, Header, Views
from ._identity import identity_tag, serving_identity
from ._plugin import read_options
from .aio import AsyncClient
from .client import Client

logger = init_logger(__name__)

#: Sets of keys whose sync lookups are counted (the oldest are forgotten).
SYNC_LOOKUPS_KEPT = 4096

MAGIC = b"KVTL"


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
    read as ``kvtier.<name>``), else the defaults. Any other key under those
    prefixes is refused, but LMCache's own ``module_path`` and ``class_name``
    of the plugin."""
    given: dict[str, Any] = {}
    for prefix in ("kvtier.", "remote_storage_plugin.%s." % plugin):  # the second wins
        given.update((k[len(prefix) :], v) for k, v in extra_config.items() if k.startswith(prefix))
    return read_options(given, DEFAULTS, "kvtier plugin", host=("module_path", "class_name"))


class ChunkCodec:
    """A chunk's value: kvtier's header (:mod:`kvtier._codec`) with LMCache's
    ``RemoteMetadata`` as the plugin's part, then the KV bytes. The key
    names the model's identity (``KvtierConnector.name``): a chunk copied
    under another key, or another model's, is a miss."""

    def __init__(self, connector: KvtierConnector) -> None:
        self.meta_bytes: int = connector.remote_metadata_bytes
        self.codec = Codec(MAGIC, self.meta_bytes, connector.options["checksum"], logger)
        self.shapes = [list(s) for s in connector.meta_shapes]
        self.dtypes = list(connector.meta_dtypes)
        self.fmt: MemoryFormat = connector.meta_fmt

    def header(self, key: str, obj: MemoryObj, payload: memoryview) -> bytearray:
        meta = RemoteMetadata(payload.nbytes, obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
        extra = bytearray(self.meta_bytes)
        meta.serialize_into(memoryview(extra))
        return self.codec.header(key, [payload], extra)

    def metadata(self, key: str, h: Header, head: bytearray) -> Optional[RemoteMetadata]:
        """The chunk's metadata (the header's plugin part) when it fits the
        engine's layout and the payload's size, else None (logged)."""
        miss = self.codec.miss
        try:
            meta = RemoteMetadata.deserialize(bytes(head[FIXED.size :]))
        except (ValueError, KeyError, struct.error) as e:
            miss(key, "unreadable metadata (%s)" % e)
            return None
        if meta.length != h.payload_len or meta.fmt != self.fmt or list(meta.dtypes) != self.dtypes:
            miss(key, "metadata does not match the engine's format")
            return None
        if len(meta.shapes) != len(self.shapes):
            miss(key, "wrong number of KV groups")
            return None
        size = 0
        for got, want, dtype in zip(meta.shapes, self.shapes, meta.dtypes):
            got = list(got)
            if not self._shape_fits(got, want):
                miss(key, "shape %s does not fit %s" % (got, want))
                return None
            n = 1
            for d in got:
                n *= d
            size += n * dtype.itemsize
        if size != h.payload_len:
            miss(key, "shapes describe %d bytes, payload is %d" % (size, h.payload_len))
            return None
        return meta

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


class _ChunkSink:
    """Receives an ``MGETPREFIX`` reply into freshly allocated MemoryObjs: a
    :class:`~kvtier._codec.CheckedSink` whose values go, once their header
    and metadata are checked, into a MemoryObj of the stored shapes, so the
    KV bytes go from the socket straight into LMCache's memory. A value no
    memory can be allocated for ends the prefix too."""

    def __init__(self, connector: KvtierConnector, keys: list[str]) -> None:
        self.connector = connector
        self.chunks = connector.codec
        self.keys = keys
        self.objs: dict[int, MemoryObj] = {}
        self.checked = CheckedSink(self.chunks.codec, keys, self._place, self._forget)

    def _forget(self, index: int) -> None:
        old = self.objs.pop(index, None)
        if old is not None:  # the same value again (a retry)
            old.ref_count_down()

    def _place(self, index: int, h: Header, head: bytearray) -> Optional[Views]:
        key = self.keys[index]
        meta = self.chunks.metadata(key, h, head)
        if meta is None:
            return None
        obj = self.connector._allocate(meta)
        if obj is None:
            logger.warning("kvtier: no memory for %s; the prefix ends before it", key)
            return None
        view = writable_view(obj.byte_array)
        if view.nbytes < meta.length:
            obj.ref_count_down()
            self.chunks.codec.miss(key, "allocated buffer is smaller than the chunk")
            return None
        self.objs[index] = obj
        return [view[: meta.length]]

    def result(self, lengths: Sequence[int]) -> list[MemoryObj]:
        """The verified leading run; everything else is freed."""
        self.checked.verify()
        good = [self.objs[i] for i in range(self.checked.prefix(len(lengths)))]
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
                lengths = await asyncio.to_thread(self.client.get_prefix, names, into=sink.checked)
            else:
                lengths = await self.aclient.get_prefix(names, into=sink.checked)
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
