"""The kvtier HiCache backend under the real sglang package: created by
SGLang's own StorageBackendFactory ("dynamic"), subclassing its
HiCacheStorage, moving pages between a host pool and the real kvtier
binary."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hicache_storage")

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from kvtier.sglang import KvtierHiCacheStorage  # noqa: E402

from conftest import Server  # noqa: E402

PAGE, LAYERS, HEADS, DIM = 4, 3, 2, 16


class HostPoolStandIn:
    """What SGLang's MHA host pool (``page_first`` layout) gives a storage
    backend: ``page_size``, ``kv_buffer`` of shape (2, size, layers, heads,
    dim) and ``get_page_buffer_meta`` (one K and one V region per page),
    computed as sglang/srt/mem_cache/pool_host/mha.py does."""

    layout = "page_first"

    def __init__(self, pages: int) -> None:
        self.page_size = PAGE
        self.size = pages * PAGE
        self.layer_num, self.head_num, self.head_dim = LAYERS, HEADS, DIM
        self.dtype = torch.bfloat16
        self.kv_buffer = torch.zeros((2, self.size, LAYERS, HEADS, DIM), dtype=self.dtype)

    def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        ptrs: list[int] = []
        for i in range(0, len(indices), self.page_size):
            k = base + int(indices[i]) * self.layer_num * self.head_num * self.head_dim * item
            ptrs += [k, k + v_offset]
        size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        return ptrs, [size] * len(ptrs)

    def fill(self, page: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        rows = slice(page * PAGE, (page + 1) * PAGE)
        self.kv_buffer[:, rows] = torch.randn(self.kv_buffer[:, rows].shape, generator=g).to(self.dtype)

    def page(self, page: int) -> Any:
        return self.kv_buffer[:, page * PAGE : (page + 1) * PAGE].clone()

    def indices(self, pages: list[int]) -> Any:
        return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def make_backend(
    url: str, pool: HostPoolStandIn, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, **extra: Any
) -> HiCacheStorage:
    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name="test/model",
        extra_config={
            "backend_name": "kvtier",
            "module_path": "kvtier.sglang",
            "class_name": "KvtierHiCacheStorage",
            "url": url,
            **extra,
        },
    )
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)  # as HiCacheController does after creating it
    return backend


def hashes(n: int, start: int = 0) -> list[str]:
    return ["%064x" % (0xABC000 + i) for i in range(start, start + n)]


@pytest.fixture
def pool() -> HostPoolStandIn:
    p = HostPoolStandIn(pages=16)
    for i in range(8):
        p.fill(i, seed=i)
    return p


def test_created_by_sglangs_factory(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool)
    assert isinstance(backend, HiCacheStorage) and isinstance(backend, KvtierHiCacheStorage)


def test_set_exists_get_byte_exact(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool)
    keys = hashes(6)
    assert backend.batch_set_v1(keys, pool.indices(list(range(6)))) == [True] * 6
    assert backend.batch_exists(keys) == 6
    assert backend.exists(keys[0]) and not backend.exists(hashes(1, 99)[0])
    # Load into other host slots (pages 8..13) and compare with the originals.
    assert backend.batch_get_v1(keys, pool.indices(list(range(8, 14)))) == [True] * 6
    for i in range(6):
        assert torch.equal(pool.page(8 + i).view(torch.uint8), pool.page(i).view(torch.uint8))
    stats = backend.get_stats()
    assert stats.prefetch_pgs == [6] and stats.backup_pgs == [6]


def test_one_command_each(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool, stripes=1)
    keys = hashes(8)
    server.client().execute("CONFIG", "RESETSTAT")
    backend.batch_set_v1(keys, pool.indices(list(range(8))))
    backend.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=[]))
    backend.batch_get_v1(keys, pool.indices(list(range(8, 16))))
    stats = server.commandstats()
    assert (stats.get("msetblock"), stats.get("prefixlen"), stats.get("mgetprefix")) == (1, 1, 1), stats
    assert not {"exists", "get", "set", "mexists"} & set(stats), stats


def test_prefix_semantics_and_missing_middle_page(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool)
    keys = hashes(6)
    backend.batch_set_v1(keys, pool.indices(list(range(6))))
    server.client().execute("DEL", backend._key(keys[2]))  # type: ignore[attr-defined]
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(keys[3:]) == 3  # the pages after the hole are there
    assert backend.batch_get_v1(keys, pool.indices(list(range(8, 14)))) == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert torch.equal(pool.page(9).view(torch.uint8), pool.page(1).view(torch.uint8))
    # Nothing after the hole was written into the host pool.
    for p in range(10, 14):
        assert not pool.page(p).any()


def test_chain_continues_from_prefix_keys(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool)
    keys = hashes(6)
    backend.batch_set_v1(keys[:3], pool.indices([0, 1, 2]))
    info = HiCacheStorageExtraInfo(prefix_keys=keys[:3])
    assert backend.batch_set_v1(keys[3:], pool.indices([3, 4, 5]), info) == [True] * 3
    assert backend.batch_exists(keys) == 6
    # Already stored pages are kept (and reported as stored).
    assert backend.batch_set_v1(keys[:2], pool.indices([6, 7])) == [True, True]
    backend.batch_get_v1(keys[:1], pool.indices([8]))
    assert torch.equal(pool.page(8).view(torch.uint8), pool.page(0).view(torch.uint8))


def test_tp_ranks_have_their_own_pages_mla_shares_them(server: Server, pool: HostPoolStandIn) -> None:
    r0 = make_backend(server.url, pool, tp_rank=0, tp_size=2)
    r1 = make_backend(server.url, pool, tp_rank=1, tp_size=2)
    keys = hashes(2)
    r0.batch_set_v1(keys, pool.indices([0, 1]))
    assert r0.batch_exists(keys) == 2 and r1.batch_exists(keys) == 0
    m0 = make_backend(server.url, pool, tp_rank=0, tp_size=2, mla=True)
    m1 = make_backend(server.url, pool, tp_rank=1, tp_size=2, mla=True)
    assert m1.batch_set_v1(keys, pool.indices([2, 3])) == [True, True]  # a replica does not write
    assert m0.batch_exists(keys) == 0
    m0.batch_set_v1(keys, pool.indices([2, 3]))
    assert m1.batch_exists(keys) == 2


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-key"])
def test_damaged_page_is_a_miss(server: Server, pool: HostPoolStandIn, damage: str) -> None:
    backend = make_backend(server.url, pool)
    keys = hashes(4)
    backend.batch_set_v1(keys, pool.indices([0, 1, 2, 3]))
    c = server.client()
    victim = backend._key(keys[1])  # type: ignore[attr-defined]
    value = c.execute("GET", victim)
    assert isinstance(value, (bytes, bytearray))
    bad = {
        "truncated": bytes(value[:-8]),
        "garbage": os.urandom(len(value)),
        "other-key": c.execute("GET", backend._key(keys[2])),  # type: ignore[attr-defined]
    }[damage]
    assert isinstance(bad, (bytes, bytearray))
    c.execute("SET", victim, bad)
    assert backend.batch_get_v1(keys, pool.indices([8, 9, 10, 11])) == [True, False, False, False]
    for p in (9, 10, 11):
        assert not pool.page(p).any()


def test_checksum_catches_a_changed_payload(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool, checksum=True)
    keys = hashes(3)
    backend.batch_set_v1(keys, pool.indices([0, 1, 2]))
    server.client().execute("SETRANGE", backend._key(keys[1]), 100, b"\x01\x02")  # type: ignore[attr-defined]
    assert backend.batch_get_v1(keys, pool.indices([8, 9, 10])) == [True, False, False]


def test_server_down_is_a_miss(pool: HostPoolStandIn) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = "kvtier://127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    backend = make_backend(url, pool, connect_timeout=1)
    assert backend.batch_get_v1(hashes(2), pool.indices([8, 9])) == [False, False]
    assert backend.batch_set_v1(hashes(2), pool.indices([0, 1])) == [False, False]


def test_legacy_get_set_and_clear(server: Server, pool: HostPoolStandIn) -> None:
    backend = make_backend(server.url, pool)
    page = torch.arange(64, dtype=torch.uint8)
    assert backend.set("k1", page)
    out = torch.zeros(64, dtype=torch.uint8)
    assert backend.get("k1", out) is out and torch.equal(out, page)
    assert backend.get("k2", torch.zeros(64, dtype=torch.uint8)) is None
    backend.batch_set_v1(hashes(2), pool.indices([0, 1]))
    other = make_backend(server.url, pool, tp_rank=1, tp_size=2)
    other.batch_set_v1(hashes(2), pool.indices([0, 1]))
    backend.clear()
    assert backend.batch_exists(hashes(2)) == 0 and not backend.exists("k1")
    assert other.batch_exists(hashes(2)) == 2  # another rank's pages stay


def test_striped_batches_are_byte_exact(server: Server, pool: HostPoolStandIn) -> None:
    """8 pages with the default stripes: two MGETPREFIX on two connections,
    one answer; a hole in the second stripe still ends the prefix."""
    backend = make_backend(server.url, pool)
    keys = hashes(8)
    assert backend.batch_set_v1(keys, pool.indices(list(range(8)))) == [True] * 8
    server.client().execute("CONFIG", "RESETSTAT")
    assert backend.batch_get_v1(keys, pool.indices(list(range(8, 16)))) == [True] * 8
    assert server.commandstats().get("mgetprefix") == 2
    for i in range(8):
        assert torch.equal(pool.page(8 + i).view(torch.uint8), pool.page(i).view(torch.uint8))
    server.client().execute("DEL", backend._key(keys[5]))  # type: ignore[attr-defined]
    pool.kv_buffer[:, 8 * PAGE :] = 0
    assert backend.batch_get_v1(keys, pool.indices(list(range(8, 16)))) == [True] * 5 + [False] * 3
    assert backend.batch_exists(keys) == 5
