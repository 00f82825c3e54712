"""A CPU-only LMCache worker for the tests: the real LMCacheEngineConfig,
LMCacheMetadata, LocalCPUBackend, RemoteBackend and CreateConnector, with
the kvtier plugin loaded the way a user's config loads it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Optional, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

T = TypeVar("T")

MODEL = "test/kvtier-model"
LAYERS, HEADS, HEAD_DIM = 2, 2, 64
DTYPE = torch.bfloat16


def plugin_config(url: str, chunk_size: int = 16, **options: Any) -> LMCacheEngineConfig:
    """The config a user writes: the plugin, its module/class and its URL."""
    extra: dict[str, Any] = {
        "remote_storage_plugin.kvtier.module_path": "kvtier.lmcache",
        "remote_storage_plugin.kvtier.class_name": "KvtierConnectorAdapter",
        "remote_storage_plugin.kvtier.url": url,
    }
    for name, value in options.items():
        extra["remote_storage_plugin.kvtier.%s" % name] = value
    return LMCacheEngineConfig.from_defaults(
        chunk_size=chunk_size,
        local_cpu=False,
        max_local_cpu_size=0.25,
        remote_serde="naive",
        remote_storage_plugins=["kvtier"],
        save_unfull_chunk=True,
        extra_config=extra,
    )


def metadata(
    chunk_size: int = 16,
    world_size: int = 1,
    worker_id: int = 0,
    layers: int = LAYERS,
    heads: int = HEADS,
    model: str = MODEL,
) -> LMCacheMetadata:
    return LMCacheMetadata(
        model_name=model,
        world_size=world_size,
        local_world_size=world_size,
        worker_id=worker_id,
        local_worker_id=worker_id,
        kv_dtype=DTYPE,
        kv_shape=(layers, 2, chunk_size, heads, HEAD_DIM),
        chunk_size=chunk_size,
    )


class Worker:
    """One LMCache worker (one TP rank) with a RemoteBackend on the plugin."""

    def __init__(self, config: LMCacheEngineConfig, meta: LMCacheMetadata) -> None:
        self.config = config
        self.meta = meta
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cpu = LocalCPUBackend(config=config, metadata=meta, dst_device="cpu")
        self.backend = RemoteBackend(
            config=config,
            metadata=meta,
            loop=self.loop,
            local_cpu_backend=self.cpu,
            dst_device="cpu",
            plugin_name="kvtier",
        )
        assert self.backend.connection is not None, "the plugin did not load"
        self.connector = self.backend.connection  # InstrumentedRemoteConnector
        self.chunk_size = config.chunk_size
        self.made: list[MemoryObj] = []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def key(self, i: int, worker_id: Optional[int] = None) -> CacheEngineKey:
        return CacheEngineKey(
            model_name=self.meta.model_name,
            world_size=self.meta.world_size,
            worker_id=self.meta.worker_id if worker_id is None else worker_id,
            chunk_hash=0xC0FFEE0000 + i,
            dtype=DTYPE,
        )

    def name(self, key: CacheEngineKey) -> str:
        """The kvtier key the plugin stores ``key`` under."""
        return str(getattr(self.connector, "_connector", self.connector).name(key))

    def keys(self, n: int, start: int = 0) -> list[CacheEngineKey]:
        return [self.key(i) for i in range(start, start + n)]

    def chunk(self, seed: int, tokens: Optional[int] = None) -> MemoryObj:
        """A MemoryObj of ``tokens`` (default: a full chunk) of seeded random KV."""
        t = self.chunk_size if tokens is None else tokens
        layers, _, _, heads, dim = self.meta.kv_shape
        shape = torch.Size([2, layers, t, heads * dim])
        obj = self.cpu.allocate([shape], [DTYPE], MemoryFormat.KV_2LTD)
        assert obj is not None
        g = torch.Generator().manual_seed(seed)
        assert obj.tensor is not None
        obj.tensor.copy_(torch.randn(shape, generator=g, dtype=torch.float32).to(DTYPE))
        self.made.append(obj)
        return obj

    def store(self, keys: list[CacheEngineKey], objs: list[MemoryObj]) -> None:
        """RemoteBackend's batched put, waited for."""
        self.run(self.connector.batched_put(keys, [_up(o) for o in objs]))

    def store_and_read_back(self, keys: list[CacheEngineKey], objs: list[MemoryObj]) -> None:
        """Stores ``objs`` under ``keys``; a lookup then counts every one and
        a read returns each byte for byte."""
        self.store(keys, objs)
        assert self.backend.batched_contains(keys) == len(keys)
        got = self.run(self.backend.batched_get_non_blocking("req", keys))
        assert len(got) == len(keys) and all(same_bytes(g, o) for g, o in zip(got, objs))
        for g in got:
            g.ref_count_down()

    def close(self) -> None:
        for obj in self.made:
            obj.ref_count_down()
        self.made.clear()
        try:
            self.backend.close()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def _up(obj: MemoryObj) -> MemoryObj:
    # The instrumented connector drops one reference after a put, as the
    # serializer's reference in RemoteBackend.batched_submit_put_task would.
    obj.ref_count_up()
    return obj


def same_bytes(a: MemoryObj, b: MemoryObj) -> bool:
    assert a.tensor is not None and b.tensor is not None
    return a.tensor.shape == b.tensor.shape and bool(
        torch.equal(a.tensor.view(torch.uint8), b.tensor.view(torch.uint8))
    )
