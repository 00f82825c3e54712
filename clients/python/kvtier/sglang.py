"""SGLang HiCache storage backend on kvtier.

Start SGLang with (see docs/connectors.md)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "url": "kvtier://10.0.0.1:6379", "hicache_storage_pass_prefix_keys": true}'

The backend sets ``interface_v1`` in that config itself, so SGLang moves
pages with ``batch_get_v1``/``batch_set_v1`` straight between kvtier and its
host pool. ``hicache_storage_pass_prefix_keys`` (SGLang reads it before the
backend exists, so it must be in the line above) gives every write the pages
before it, which chains each batch to its prefix.

What each call sends:

==================  =============================================================
``batch_exists``    one ``PREFIXLEN`` (the number of leading pages present)
``batch_get_v1``    one ``MGETPREFIX``; each page's bytes land in its host-pool slots
``batch_set_v1``    one ``MSETBLOCK ... CHAIN PARENT <last prefix page>`` (existing kept)
``exists``          ``PREFIXLEN 1 key``
``get`` / ``set``   the flat path (``interface_v1`` off): ``MGETPREFIX`` / ``MSETBLOCK``
                    into / from a flat page tensor, a copy each way
``clear``           ``SCAN`` + ``DEL`` of this backend's keys, on every node
==================  =============================================================

Keys: ``<page hash>@sgl@<model>~<identity>@<format>@<ranks>``. ``<identity>``
digests the model SGLang loaded (a fingerprint of its weight files, revision,
dtype, quantization, overrides, attention backend), so two checkpoints served
under one name never share a page. ``<format>`` digests the
host pool's layout, dtype, page size and the sizes of a page's regions (and
whether the flat path wrote it), so a page written in one layout is never
read in another: it is a different key. ``<ranks>`` is ``mla`` for MLA
models (every TP rank holds the same page; rank 0 writes) or
``tp<rank>of<size>`` otherwise, with ``pp<rank>of<size>`` and
``cp<rank>of<size>`` when pipeline or context parallelism splits pages. DP
groups share pages (no DP rank in the key). A value is a 32-byte header
(magic ``KVTS``, lengths, an optional CRC32, a digest of the key) followed
by the page's buffers back to back, in ``get_page_buffer_meta`` order. A
value whose header, key digest, size or CRC does not match is a miss and is
deleted (counted in ``damaged``), so the next write stores it again.

Models with extra host pools (Mamba state, sliding-window, DSA indexer,
draft model) are not stored: the backend says so once when the pools are
registered, finds nothing and drops writes, and SGLang runs as without L3.

A server that is down or stalled costs one timeout (``socket_timeout``, 1 s
by default, inside SGLang's prefetch budget) and a warning (at most one per
10 s); calls then skip it for ``retry_after`` seconds: lookups find nothing
and writes are dropped (reported done, so SGLang does not log a failure per
batch; counted in ``dropped``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolTransfer,
    PoolTransferResult,
)

from ._buffers import writable_view
from ._codec import CheckedSink, Codec, Header, Place, Views
from ._identity import identity_tag, serving_identity
from ._plugin import Health, read_options, truthy
from .client import Client
from .errors import KvtierError

logger = logging.getLogger(__name__)

MAGIC = b"KVTS"

#: Defaults of the options in the backend's extra config.
DEFAULTS: dict[str, Any] = {
    # kvtier://host:port[,host:port...] (required).
    "url": None,
    "checksum": False,
    "ttl": 0,
    "stripes": 4,
    # SGLang gives a prefetch about 1 s plus 0.25 s per 1k tokens: a stalled
    # server must cost less than that.
    "socket_timeout": 1.0,
    "connect_timeout": 0.5,
    "retry_after": 2.0,
}


#: SGLang's own keys in a storage backend's extra config (which backend to
#: load, and settings of its cache controller), beside the backend's options.
SGLANG_KEYS = (
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "tp_lcm_size",
    "prefetch_threshold",
    "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
)


def _flatten(items: Sequence[Any]) -> list[int]:
    out: list[int] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out.extend(int(x) for x in item)
        else:
            out.append(int(item))
    return out


def _memory_at(ptr: int, size: int) -> memoryview:
    """A writable view of ``size`` bytes of host memory at ``ptr`` (no copy)."""
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def rank_part(config: HiCacheStorageConfig) -> str:
    """The ranks a page belongs to: one copy per TP rank unless MLA (every
    rank holds the same page), one per pipeline stage and per context-
    parallel rank (each holds other layers or another slice); DP groups
    share."""
    part = "mla" if config.is_mla_model else "tp%dof%d" % (config.tp_rank, config.tp_size)
    if config.pp_size > 1:
        part += "-pp%dof%d" % (config.pp_rank, config.pp_size)
    if config.attn_cp_size > 1:
        part += "-cp%dof%d" % (config.attn_cp_rank, config.attn_cp_size)
    return part


def format_digest(*fields: Any) -> str:
    """12 hex digits naming a page format: pages of different formats never
    share a key."""
    return hashlib.blake2b("|".join(map(str, fields)).encode(), digest_size=6).hexdigest()


def pool_format(pool: Any) -> str:
    """The host pool's page format as ``batch_get_v1``/``batch_set_v1`` move
    it: the pool's kind, layout, dtype, page size and the sizes of one
    page's regions in ``get_page_buffer_meta`` order."""
    page = int(pool.page_size)
    try:
        _, sizes = pool.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
        regions: Any = _flatten(sizes)
    except Exception as e:  # a layout without zero-copy metadata
        regions = "no-meta:%s" % type(e).__name__
    return format_digest(
        "v1", type(pool).__name__, getattr(pool, "layout", "?"), getattr(pool, "dtype", "?"), page, regions
    )


class KvtierHiCacheStorage(HiCacheStorage):
    """``HiCacheStorage`` for ``--hicache-storage-backend dynamic``.

    ``extra_config`` options: ``url`` (``kvtier://host:port[,host:port]``,
    required), ``checksum`` (writers add a CRC32 that readers verify; default
    false), ``ttl`` (seconds; default none), ``stripes`` (connections a
    large batch is spread over; default 4), ``socket_timeout`` (1 s),
    ``connect_timeout`` (0.5 s), ``retry_after`` (seconds a failed server is
    skipped; 2). Counters: ``gets``, ``hits``, ``sets``, ``damaged`` (pages
    that failed a check, deleted), ``dropped`` (pages not written: the
    server was being skipped, or the model has sidecar pools).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict[str, Any]] = None) -> None:
        if storage_config.extra_config is None:
            storage_config.extra_config = {}
        extra = storage_config.extra_config
        options = read_options(extra, DEFAULTS, "kvtier backend", host=SGLANG_KEYS)
        url = options["url"]
        if not url:
            raise ValueError('the kvtier backend needs "url": "kvtier://host:port" in its extra config')
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError("the kvtier backend does not split pages by head (tp_lcm_size with page_head)")
        # SGLang reads this after creating the backend: with it, pages move
        # between kvtier and the host pool without the flat path's copies.
        if "interface_v1" in extra and not truthy(extra["interface_v1"]):
            logger.warning("kvtier: interface_v1 is off: every page is copied through a flat tensor each way")
        else:
            extra["interface_v1"] = 1
        self.storage_config = storage_config
        self.client = Client.from_url(
            str(url),
            socket_timeout=options["socket_timeout"],
            connect_timeout=options["connect_timeout"],
            stripes=options["stripes"],
        )
        self.codec = Codec(MAGIC, 0, options["checksum"], logger)
        self.ttl = options["ttl"] or None
        self.health = Health(options["retry_after"], logger)
        # The served name and a digest of the model's identity (weights,
        # revision, dtype, quantization, overrides, attention backend): two
        # checkpoints served under one name never share a page.
        name = storage_config.model_name or "model"
        self.model = "%s~%s" % (name.replace("@", "_"), identity_tag(serving_identity(name)))
        self.ranks = rank_part(storage_config)
        self.mem_pool_host: Any = None
        self.v1_format: Optional[str] = None
        self.flat_format: Optional[str] = None
        #: Names of host pools this backend does not store (sidecars): L3 off.
        self.refused: list[str] = []
        self._warned: dict[str, float] = {}
        self._stats: dict[str, list[Any]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }
        self.gets = self.hits = self.sets = self.damaged = self.dropped = 0

    # -- registration ----------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self.v1_format = pool_format(mem_pool_host)
        logger.info(
            "kvtier: HiCache pages of %s (%s layout) as *@sgl@%s@%s@%s",
            type(mem_pool_host).__name__,
            getattr(mem_pool_host, "layout", "?"),
            self.model,
            self.v1_format,
            self.ranks,
        )

    def on_host_pools_registered(self) -> None:
        pools = getattr(self, "registered_pools", {}) or {}
        self.refused = sorted(str(name) for name in pools if str(name) != "kv")
        if self.refused:
            logger.warning(
                "kvtier: this model keeps host pools the kvtier backend does not store (%s): "
                "HiCache L3 stays off for it (lookups find nothing, writes are dropped)",
                ", ".join(self.refused),
            )

    # -- keys and pages -----------------------------------------------------------

    def _key(self, page_hash: str, fmt: Optional[str] = None) -> str:
        fmt = fmt or self.v1_format
        if fmt is None:
            raise RuntimeError("register_mem_pool_host was not called")
        return "%s@sgl@%s@%s@%s" % (page_hash, self.model, fmt, self.ranks)

    def _page_views(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[list[memoryview]]:
        """For each page, the host-pool memory its value is made of."""
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("register_mem_pool_host was not called")
        page_size = int(pool.page_size)
        if len(host_indices) != len(keys) * page_size:
            raise ValueError(
                "%d keys need %d host indices, got %d" % (len(keys), len(keys) * page_size, len(host_indices))
            )
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        ptrs, sizes = _flatten(ptrs), _flatten(sizes)
        if len(ptrs) != len(sizes) or len(ptrs) % len(keys):
            raise ValueError("page buffer meta does not divide into %d pages" % len(keys))
        per = len(ptrs) // len(keys)
        return [
            [_memory_at(p, s) for p, s in zip(ptrs[i * per : (i + 1) * per], sizes[i * per : (i + 1) * per])]
            for i in range(len(keys))
        ]

    # -- failures ------------------------------------------------------------------

    def _usable(self) -> bool:
        return not self.refused and self.health.ok()

    def _warn_once(self, topic: str, message: str, *args: Any) -> None:
        if topic not in self._warned:
            self._warned[topic] = time.monotonic()
            logger.warning(message, *args)

    # -- the v1 zero-copy API -------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Leading pages present: one ``PREFIXLEN`` (0 when the server cannot
        answer: the pages are computed)."""
        if not keys or not self._usable():
            return 0
        try:
            return self.client.prefix_len([self._key(k) for k in keys])
        except (KvtierError, OSError) as e:
            self.health.failed("lookup", e)
            return 0

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> list[bool]:
        """One ``MGETPREFIX``; page ``i``'s bytes are received into its host slots."""
        if not keys:
            return []
        pages = self._page_views(keys, host_indices)
        t0 = time.perf_counter()
        n = self._read_pages([self._key(k) for k in keys], pages)
        self._record("prefetch", n, pages, time.perf_counter() - t0)
        return [i < n for i in range(len(keys))]

    def _read_pages(self, names: list[str], pages: list[list[memoryview]]) -> int:
        """One ``MGETPREFIX`` into the pages; how many leading pages arrived
        whole and checked (0 when the server cannot be reached). A page
        that fails a check is deleted, so it is written again."""
        if not self._usable():
            return 0
        sink = CheckedSink(self.codec, names, self._page_place(names, pages))
        try:
            lengths = self.client.get_prefix(names, into=sink)
        except (KvtierError, OSError) as e:
            self.health.failed("read", e)
            return 0
        sink.verify()
        n = sink.prefix(len(lengths))
        self.gets += len(names)
        self.hits += n
        if sink.bad:
            damaged = [names[i] for i in sorted(sink.bad)]
            self.damaged += len(damaged)
            try:
                self.client.execute("DEL", *damaged)
            except (KvtierError, OSError) as e:
                self.health.failed("delete of damaged pages", e)
        return n

    def _page_place(self, names: list[str], pages: list[list[memoryview]]) -> Place:
        """Where value ``i`` goes: page ``i``'s buffers, when it is a page's size."""

        def place(index: int, h: Header, _head: bytearray) -> Optional[Views]:
            expect = sum(v.nbytes for v in pages[index])
            if h.payload_len != expect:
                self.codec.miss(
                    names[index], "value holds %d bytes, the page has %d" % (h.payload_len, expect)
                )
                return None
            return list(pages[index])

        return place

    def _write_pages(
        self, names: list[str], pages: list[list[memoryview]], parent: Optional[str]
    ) -> list[bool]:
        """One ``MSETBLOCK ... CHAIN`` from the pages (False for each page
        when the server cannot be reached)."""
        if self.refused or not self.health.ok():
            # Dropped, and reported done: a sidecar model (nothing is stored
            # for it) or a server being skipped after a failure. SGLang would
            # log a warning per batch for False, and would not write the
            # pages again later either; lookups find nothing either way.
            self.dropped += len(names)
            return [True] * len(names)
        values: list[list[Union[bytes, bytearray, memoryview]]] = [
            [self.codec.header(n, p), *p] for n, p in zip(names, pages)
        ]
        try:
            codes = self.client.put_chain(names, values, parent=parent, ex=self.ttl)
        except (KvtierError, OSError) as e:
            self.health.failed("write", e)
            return [False] * len(names)
        self.sets += len(names)
        return [c >= 0 for c in codes]

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> list[bool]:
        """One ``MSETBLOCK ... CHAIN PARENT <last prefix page>`` from the host slots."""
        if not keys:
            return []
        if not self.storage_config.is_storage_writer:
            return [True] * len(keys)  # an MLA replica: rank 0 of its group writes
        prefix = extra_info.prefix_keys if extra_info is not None else None
        if prefix is None:
            self._warn_once(
                "prefix",
                "kvtier: SGLang passes no prefix keys, so pages are chained only within a batch: "
                'add "hicache_storage_pass_prefix_keys": true to --hicache-storage-backend-extra-config',
            )
        pages = self._page_views(keys, host_indices)
        t0 = time.perf_counter()
        names = [self._key(k) for k in keys]
        stored = self._write_pages(names, pages, self._key(prefix[-1]) if prefix else None)
        self._record("backup", sum(stored), pages, time.perf_counter() - t0)
        return stored

    # -- pools this backend does not store ------------------------------------------

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: Optional[list[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """Sidecar pools are not stored: nothing is found."""
        return PoolTransferResult(0, {str(t.name): 0 for t in pool_transfers or []})

    def batch_get_v2(
        self, transfers: list[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> dict[str, list[bool]]:
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    def batch_set_v2(
        self, transfers: list[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> dict[str, list[bool]]:
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    # -- single pages and the flat path ------------------------------------------------

    def _flat_format(self, like: Any) -> str:
        if self.flat_format is None:
            pool = self.mem_pool_host
            self.flat_format = format_digest(
                "flat",
                type(pool).__name__,
                getattr(pool, "layout", "?"),
                getattr(pool, "dtype", "?"),
                getattr(pool, "page_size", "?"),
                _tensor_view(like).nbytes,
            )
        return self.flat_format

    def _warn_flat(self) -> None:
        self._warn_once(
            "flat",
            "kvtier: SGLang uses the flat batch_get/batch_set path (a copy of every page each way): "
            "leave interface_v1 on",
        )

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(
        self,
        key: str,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> Optional[torch.Tensor]:
        """Reads a page into ``target_location`` (a flat CPU tensor)."""
        if target_location is None:
            raise ValueError("the kvtier backend reads into a target tensor")
        got = self.batch_get([key], [target_location])
        return got[0] if isinstance(got, list) else None

    def batch_get(
        self,
        keys: list[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> Union[list[Optional[torch.Tensor]], int]:
        if target_locations is None:
            raise ValueError("the kvtier backend reads into target tensors")
        if not keys:
            return []
        self._warn_flat()
        fmt = self._flat_format(target_locations[0])
        n = self._read_pages([self._key(k, fmt) for k in keys], [[_tensor_view(t)] for t in target_locations])
        return [t if i < n else None for i, t in enumerate(target_locations)]

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        if values is None:
            raise ValueError("the kvtier backend stores the given tensors")
        if not keys:
            return True
        self._warn_flat()
        fmt = self._flat_format(values[0])
        names = [self._key(k, fmt) for k in keys]
        return all(self._write_pages(names, [[_tensor_view(v)] for v in values], None))

    def clear(self) -> None:
        """Deletes this backend's keys (this model and ranks, every format) on
        every node."""
        keys = self.client.scan_keys("*@sgl@%s@*@%s" % (self.model, self.ranks))
        for i in range(0, len(keys), 512):
            self.client.execute("DEL", *keys[i : i + 512])

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` for the pages moved since the last call
        (an object with the same four lists where that module cannot be
        imported)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            metrics: Any = StorageMetrics()
        except Exception:
            metrics = PageStats()
        for name, values in self._stats.items():
            getattr(metrics, name).extend(values)
            values.clear()
        return metrics

    def close(self) -> None:
        self.client.close()

    def _record(self, kind: str, pages: int, views: list[list[memoryview]], seconds: float) -> None:
        if not pages or not self.storage_config.enable_storage_metrics:
            return
        nbytes = sum(v.nbytes for v in views[0]) * pages
        self._stats["%s_pgs" % kind].append(pages)
        self._stats["%s_bandwidth" % kind].append(nbytes / 1e9 / max(seconds, 1e-9))


@dataclass
class PageStats:
    """The fields of SGLang's ``StorageMetrics``."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


def _tensor_view(t: Any) -> memoryview:
    if isinstance(t, torch.Tensor):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("pages must be contiguous CPU tensors")
        return _memory_at(t.data_ptr(), t.numel() * t.element_size())
    return writable_view(t)
