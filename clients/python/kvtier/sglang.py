"""SGLang HiCache storage backend on kvtier.

Start SGLang with (see docs/connectors.md)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "url": "kvtier://10.0.0.1:6379"}'

What each call sends:

==================  =============================================================
``batch_exists``    one ``PREFIXLEN`` (the number of leading pages present)
``batch_get_v1``    one ``MGETPREFIX``; each page's bytes land in its host-pool slots
``batch_set_v1``    one ``MSETBLOCK ... CHAIN PARENT <last prefix page>`` (existing kept)
``exists``          ``PREFIXLEN 1 key``
``get`` / ``set``   ``MGETPREFIX 1`` / ``MSETBLOCK 1`` into / from a flat page tensor
``clear``           ``SCAN`` + ``DEL`` of this backend's keys, on every node
==================  =============================================================

One kvtier key per page and rank: ``<page hash>@sgl@<model>@<rank part>``
(MLA pages are shared by the ranks; other models have one key per TP rank).
A value is a 32-byte header (magic ``KVTS``, header and payload lengths, an
optional CRC32, a digest of the key) followed by the page's buffers back to
back, in ``get_page_buffer_meta`` order. A value whose header, key digest or
size does not match the page is a miss: the page and all after it count as
not loaded.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from . import _header
from ._buffers import writable_view
from .client import Client

logger = logging.getLogger(__name__)

MAGIC = b"KVTS"
#: magic, header length, payload length, crc32, flags, key digest (kvtier._header)
_HEADER = _header.FIXED
FLAG_CRC = _header.FLAG_CRC
_digest = _header.key_digest


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


class KvtierHiCacheStorage(HiCacheStorage):
    """``HiCacheStorage`` for ``--hicache-storage-backend dynamic``.

    ``extra_config`` options: ``url`` (``kvtier://host:port[,host:port]``,
    required), ``checksum`` (writers add a CRC32 that readers verify; default
    false), ``ttl`` (seconds; default none), ``stripes`` (connections a
    large batch is spread over; default 4), ``socket_timeout``,
    ``connect_timeout``.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict[str, Any]] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        url = extra.get("url")
        if not url:
            raise ValueError('the kvtier backend needs "url": "kvtier://host:port" in its extra config')
        self.storage_config = storage_config
        self.client = Client.from_url(
            str(url),
            socket_timeout=float(extra.get("socket_timeout", 30.0)),
            connect_timeout=float(extra.get("connect_timeout", 5.0)),
            stripes=int(extra.get("stripes", 4)),
        )
        self.checksum = str(extra.get("checksum", "false")).lower() in ("1", "true", "yes", "on")
        self.ttl = int(extra.get("ttl", 0)) or None
        model = (storage_config.model_name or "model").replace("@", "_")
        if storage_config.is_mla_model:
            rank = "mla@pp%d" % storage_config.pp_rank
        else:
            rank = "tp%d-%d@pp%d@dp%d" % (
                storage_config.tp_rank,
                storage_config.tp_size,
                storage_config.pp_rank,
                storage_config.dp_rank,
            )
        self.suffix = "@sgl@%s@%s" % (model, rank)
        self.mem_pool_host: Any = None
        self._stats: dict[str, list[Any]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }
        self.gets = self.hits = self.sets = 0

    # -- keys and pages -----------------------------------------------------------

    def _key(self, page_hash: str) -> str:
        return page_hash + self.suffix

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

    def _header(self, key: str, pieces: Sequence[memoryview]) -> bytes:
        length = sum(p.nbytes for p in pieces)
        crc, flags = 0, 0
        if self.checksum:
            for p in pieces:
                crc = zlib.crc32(p, crc)
            flags = FLAG_CRC
        return _HEADER.pack(MAGIC, _HEADER.size, length, crc, flags, _digest(key))

    def _check(self, key: str, head: bytes, length: int, expect: int) -> Optional[tuple[int, int]]:
        magic, hlen, plen, crc, flags, digest = _HEADER.unpack(head)
        if magic != MAGIC or hlen != _HEADER.size:
            why = "not a kvtier page"
        elif plen != length - hlen or plen != expect:
            why = "value holds %d bytes, the page has %d" % (length - hlen, expect)
        elif digest != _digest(key):
            why = "value was stored under another key"
        else:
            return crc, flags
        logger.warning("kvtier: treating %s as a miss: %s", key, why)
        return None

    # -- the v1 zero-copy API -------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Leading pages present: one ``PREFIXLEN``."""
        if not keys:
            return 0
        return self.client.prefix_len([self._key(k) for k in keys])

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
        n = self._read_pages(keys, pages)
        self._record("prefetch", n, pages, time.perf_counter() - t0)
        return [i < n for i in range(len(keys))]

    def _read_pages(self, keys: list[str], pages: list[list[memoryview]]) -> int:
        """One ``MGETPREFIX`` into the pages; how many leading pages arrived
        whole and checked (0 when the server cannot be reached)."""
        names = [self._key(k) for k in keys]
        sink = _PageSink(self, names, pages)
        try:
            lengths = self.client.get_prefix(names, into=sink)
        except Exception as e:
            logger.warning("kvtier: reading %d pages failed: %s", len(keys), e)
            return 0
        n = sink.verified(lengths)
        self.gets += len(keys)
        self.hits += n
        return n

    def _write_pages(
        self, keys: list[str], pages: list[list[memoryview]], parent: Optional[str]
    ) -> list[bool]:
        """One ``MSETBLOCK ... CHAIN`` from the pages (False for each page
        when the server cannot be reached)."""
        names = [self._key(k) for k in keys]
        values: list[list[Union[bytes, memoryview]]] = [
            [self._header(n, p), *p] for n, p in zip(names, pages)
        ]
        try:
            codes = self.client.put_chain(names, values, parent=parent, ex=self.ttl)
        except Exception as e:
            logger.warning("kvtier: writing %d pages failed: %s", len(keys), e)
            return [False] * len(keys)
        self.sets += len(keys)
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
        pages = self._page_views(keys, host_indices)
        prefix = extra_info.prefix_keys if extra_info is not None else None
        t0 = time.perf_counter()
        stored = self._write_pages(keys, pages, self._key(prefix[-1]) if prefix else None)
        self._record("backup", sum(stored), pages, time.perf_counter() - t0)
        return stored

    # -- single pages and the legacy API ----------------------------------------------

    def exists(self, key: str) -> bool:
        return self.client.prefix_len([self._key(key)]) == 1

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
        n = self._read_pages(keys, [[_tensor_view(t)] for t in target_locations])
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
        return all(self._write_pages(keys, [[_tensor_view(v)] for v in values], None))

    def clear(self) -> None:
        """Deletes this backend's keys (this model and rank) on every node."""
        keys = self.client.scan_keys("*" + self.suffix)
        for i in range(0, len(keys), 512):
            self.client.execute("DEL", *keys[i : i + 512])

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` for the pages moved since the last call
        (an object with the same four lists where that module cannot be
        imported, e.g. without torchvision)."""
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


class _PageSink:
    """Receives value ``i`` into page ``i``'s buffers after checking its header
    (values may arrive out of order, one reply per cluster node, and again
    on a retry)."""

    def __init__(self, owner: KvtierHiCacheStorage, keys: list[str], pages: list[list[memoryview]]) -> None:
        self.owner = owner
        self.keys = keys
        self.pages = pages
        self.crcs: dict[int, tuple[int, int]] = {}
        self.first_bad = len(keys)
        self.lock = threading.Lock()  # stripes arrive on several threads

    def _broken(self, index: int) -> None:
        with self.lock:
            self.first_bad = min(self.first_bad, index)

    def __call__(self, index: int, length: int) -> Iterable[Union[memoryview, bytearray, None]]:
        self.crcs.pop(index, None)
        if index >= self.first_bad:
            return ()
        return self._fill(index, length)

    def _fill(self, index: int, length: int) -> Iterator[Union[memoryview, bytearray, None]]:
        expect = sum(v.nbytes for v in self.pages[index])
        if length < _HEADER.size:
            logger.warning("kvtier: treating %s as a miss: %d-byte value", self.keys[index], length)
            self._broken(index)
            return
        head = bytearray(_HEADER.size)
        yield head
        checked = self.owner._check(self.keys[index], bytes(head), length, expect)
        if checked is None:
            self._broken(index)
            return
        self.crcs[index] = checked
        yield from self.pages[index]

    def verified(self, lengths: Sequence[int]) -> int:
        """How many leading pages arrived whole and passed their CRC."""
        for i in range(min(len(lengths), self.first_bad)):
            if i not in self.crcs:
                return i
            crc, flags = self.crcs[i]
            if flags & FLAG_CRC:
                got = 0
                for v in self.pages[i]:
                    got = zlib.crc32(v, got)
                if got != crc:
                    logger.warning("kvtier: treating %s as a miss: CRC32 mismatch", self.keys[i])
                    return i
        return min(len(lengths), self.first_bad)
