"""The kvtier HiCache backend under the real sglang package and the real
kvtier binary: SGLang's own host pools (``MHATokenToKVPoolHost`` in its
layer_first, page_first and page_first_direct layouts, ``MLATokenToKVPoolHost``)
and SGLang's own ``HiCacheController`` storage paths (attach, backup,
hit query, page transfer), which pick the zero-copy or the flat path and call
the backend as a running SGLang does. The controller is built without its
constructor (that wants device streams): the attributes its storage paths
read are set as ``__init__`` sets them for one rank."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any, Optional

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hicache_storage")

from sglang.srt.managers.cache_controller import (  # noqa: E402
    HiCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

from kvtier.sglang import KvtierHiCacheStorage, _memory_at  # noqa: E402

from conftest import Server  # noqa: E402

PAGE, LAYERS, HEADS, DIM = 4, 3, 2, 16
#: Host slots: enough for two batches of STORAGE_BATCH_SIZE pages.
HOST_PAGES = 2 * STORAGE_BATCH_SIZE + 16
MODEL = "test/model"
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@pytest.fixture(scope="module", autouse=True)
def one_rank() -> None:
    """SGLang's parallel context for a single rank (what publishing a
    parallel config sets in a running SGLang)."""
    get_parallel().override_permanently(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_tp_rank=0,
        attn_tp_size=1,
        attn_dp_rank=0,
        attn_dcp_size=1,
        attn_dcp_rank=0,
    )


def host_pool(layout: str, mla: bool = False) -> Any:
    """SGLang's host pool of ``layout`` over a device pool on the CPU."""
    tokens = HOST_PAGES * PAGE
    if mla:
        dev = MLATokenToKVPool(tokens, PAGE, torch.bfloat16, 32, 16, LAYERS, "cpu", False, 0, LAYERS - 1)
        return MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info,
            1.0,
            0,
            PAGE,
            layout,
            pin_memory=False,
            device_capacity_tokens=dev.size,
            start_layer=0,
            end_layer=LAYERS - 1,
            target_layer_num=LAYERS,
        ), dev
    dev = MHATokenToKVPool(
        tokens, PAGE, torch.bfloat16, HEADS, DIM, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS - 1
    )
    return MHATokenToKVPoolHost(
        dev.get_device_pool_infos()[0].buffer_info,
        1.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device_capacity_tokens=dev.size,
        start_layer=0,
        end_layer=LAYERS - 1,
        write_back_staging=dev.hicache_write_back_staging,
    ), dev


def slots(pages: list[int]) -> Any:
    """Host indices of the given host pages."""
    if not pages:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_bytes(pool: Any, page: int) -> bytes:
    """A host page's bytes, region by region, as the pool describes them."""
    ptrs, sizes = pool.get_page_buffer_meta(slots([page]))
    return b"".join(bytes(_memory_at(p, s)) for p, s in zip(ptrs, sizes))


def fill(pool: Any, pages: list[int], seed: int) -> None:
    ptrs, sizes = pool.get_page_buffer_meta(slots(pages))
    rng = torch.Generator().manual_seed(seed)
    for p, s in zip(ptrs, sizes):
        _memory_at(p, s)[:] = torch.randint(0, 256, (s,), dtype=torch.uint8, generator=rng).numpy().tobytes()


def clear_pages(pool: Any, pages: list[int]) -> None:
    ptrs, sizes = pool.get_page_buffer_meta(slots(pages))
    for p, s in zip(ptrs, sizes):
        _memory_at(p, s)[:] = bytes(s)


class Controller:
    """SGLang's HiCacheController storage side for one rank, attached with
    the documented launch config (plus ``extra``)."""

    def __init__(self, url: str, pool: Any, device_pool: Any, **extra: Any) -> None:
        c = object.__new__(HiCacheController)
        c.enable_storage = False
        c.host_memory_mode = "default"
        c.mem_pool_host = pool
        c.storage_host_pool = pool
        c.mem_pool_device = device_pool
        c.page_size = PAGE
        c.tp_group = c.attn_cp_group = c.attn_tp_group = c.pp_group = None
        c.storage_stop_event = threading.Event()
        c.enable_storage_metrics = True
        config = {
            "backend_name": "kvtier",
            "module_path": "kvtier.sglang",
            "class_name": "KvtierHiCacheStorage",
            "url": url,
            **extra,
        }
        c.attach_storage_backend("dynamic", PAGE, MODEL, config)
        self.c = c
        self.backend: KvtierHiCacheStorage = c.storage_backend

    def backup(self, tokens: list[int], pages: list[int]) -> int:
        """What a write-through does: the pages' hashes from the tokens, one
        backup operation; returns the tokens written."""
        op = StorageOperation(slots(pages), tokens, hash_value=hashes_of(tokens), prefix_keys=[])
        self.c._page_backup(op)
        return int(op.completed_tokens)

    def prefetch(self, tokens: list[int], pages: list[int]) -> tuple[int, int]:
        """A prefetch: the hit query (``batch_exists``), then the transfer of
        the hit into the given host pages. (tokens found, pages loaded)"""
        op = PrefetchOperation("req", tokens, prefix_keys=[])
        found, count = self.c._storage_hit_query(op)
        op.hash_value = found
        op.host_indices = slots(pages[: len(found)])
        loaded = self.c._page_transfer(op) if found else 0
        return count, loaded

    def close(self) -> None:
        self.c._stop_storage_threads()
        self.backend.close()


def hashes_of(tokens: list[int]) -> list[str]:
    return list(get_storage_hash_str(tokens, None, page_size=PAGE))


def tokens(n_pages: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(1, 30000, (n_pages * PAGE,), generator=g)]


@pytest.fixture
def controllers(server: Server) -> Iterator[list[Controller]]:
    made: list[Controller] = []
    yield made
    for c in made:
        c.close()


def attach(
    made: list[Controller], server_url: str, layout: str, mla: bool = False, **extra: Any
) -> Controller:
    pool, dev = host_pool(layout, mla)
    c = Controller(server_url, pool, dev, **extra)
    made.append(c)
    return c


def make_backend(
    url: str,
    pool: Any,
    tp_rank: int = 0,
    tp_size: int = 1,
    mla: bool = False,
    dp_rank: int = 0,
    pp: tuple[int, int] = (0, 1),
    cp: tuple[int, int] = (0, 1),
    **extra: Any,
) -> KvtierHiCacheStorage:
    """The backend as SGLang's factory creates it for a rank of the given geometry."""
    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=pp[0],
        pp_size=pp[1],
        attn_cp_rank=cp[0],
        attn_cp_size=cp[1],
        is_mla_model=mla,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name=MODEL,
        dp_rank=dp_rank,
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
    assert isinstance(backend, KvtierHiCacheStorage)
    return backend


def names(n: int, start: int = 0) -> list[str]:
    return ["%064x" % (0xABC000 + i) for i in range(start, start + n)]


# -- through SGLang's controller -------------------------------------------------------


def test_documented_launch_takes_the_zero_copy_path(server: Server, controllers: list[Controller]) -> None:
    c = attach(controllers, server.url, "page_first")
    assert isinstance(c.backend, HiCacheStorage)
    assert c.c.page_get_func == c.c._page_get_zero_copy
    assert c.c.page_set_func == c.c._page_set_zero_copy
    assert c.c.storage_config.extra_config["interface_v1"] == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_backup_and_prefetch_through_the_controller(
    server: Server, controllers: list[Controller], layout: str, mla: bool
) -> None:
    c = attach(controllers, server.url, layout, mla)
    pool = c.c.mem_pool_host
    toks = tokens(6, seed=1)
    fill(pool, list(range(6)), seed=1)
    server.client().execute("CONFIG", "RESETSTAT")
    assert c.backup(toks, list(range(6))) == 6 * PAGE
    assert c.prefetch(toks, list(range(8, 14))) == (6 * PAGE, 6)
    for i in range(6):
        assert page_bytes(pool, 8 + i) == page_bytes(pool, i)
    stats = server.commandstats()
    assert (stats.get("msetblock"), stats.get("prefixlen")) == (1, 1), stats
    assert stats.get("mgetprefix", 0) >= 1, stats
    assert not {"exists", "get", "set", "mexists", "mget", "mset"} & set(stats), stats
    assert c.backend.sets == 6 and c.backend.hits == 6


def test_backup_and_prefetch_over_tls(tls_url: str, controllers: list[Controller]) -> None:
    """The documented launch with a kvtiers:// URL (CA and client certificate
    as query parameters) talks TLS to kvtier's --tls-port."""
    assert tls_url.startswith("kvtiers://")
    c = attach(controllers, tls_url, "page_first")
    pool = c.c.mem_pool_host
    toks = tokens(4, seed=7)
    fill(pool, list(range(4)), seed=7)
    assert c.backup(toks, list(range(4))) == 4 * PAGE
    assert c.prefetch(toks, list(range(8, 12))) == (4 * PAGE, 4)
    for i in range(4):
        assert page_bytes(pool, 8 + i) == page_bytes(pool, i)


def test_the_flat_path_works_but_warns(
    server: Server, controllers: list[Controller], caplog: pytest.LogCaptureFixture
) -> None:
    c = attach(controllers, server.url, "page_first", interface_v1=False)
    assert c.c.page_get_func == c.c._generic_page_get
    pool = c.c.mem_pool_host
    toks = tokens(3, seed=2)
    fill(pool, [0, 1, 2], seed=2)
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        assert c.backup(toks, [0, 1, 2]) == 3 * PAGE
        c.backup(tokens(3, seed=3), [0, 1, 2])
    flat_warnings = [r for r in caplog.records if "batch_get/batch_set path" in r.getMessage()]
    assert len(flat_warnings) == 1
    # The flat path's pages are not the zero-copy path's: never read as them.
    v1 = attach(controllers, server.url, "page_first")
    assert v1.prefetch(toks, [8, 9, 10]) == (0, 0)


# -- never wrong KV across layouts and geometries ---------------------------------------


@pytest.mark.parametrize(
    "written, read",
    [
        (("page_first", False), ("page_first_direct", False)),
        (("page_first", False), ("layer_first", False)),
        (("layer_first", False), ("page_first", False)),
        (("page_first_direct", False), ("page_first", False)),
        (("page_first", True), ("layer_first", True)),
        (("page_first", True), ("page_first", False)),
    ],
    ids=lambda x: "%s%s" % (x[0], "-mla" if x[1] else ""),
)
def test_a_page_is_never_read_in_another_layout(
    server: Server, controllers: list[Controller], written: tuple[str, bool], read: tuple[str, bool]
) -> None:
    writer = attach(controllers, server.url, *written)
    reader = attach(controllers, server.url, *read)
    toks = tokens(4, seed=4)
    fill(writer.c.mem_pool_host, [0, 1, 2, 3], seed=4)
    assert writer.backup(toks, [0, 1, 2, 3]) == 4 * PAGE
    clear_pages(reader.c.mem_pool_host, [8, 9, 10, 11])
    assert reader.prefetch(toks, [8, 9, 10, 11]) == (0, 0)
    for p in (8, 9, 10, 11):
        assert not any(page_bytes(reader.c.mem_pool_host, p))
    # The same layout reads them.
    same = attach(controllers, server.url, *written)
    assert same.prefetch(toks, [8, 9, 10, 11]) == (4 * PAGE, 4)


def test_ranks_and_groups(server: Server) -> None:
    pool, _ = host_pool("page_first")
    fill(pool, [0, 1], seed=5)
    keys = names(2)
    r0 = make_backend(server.url, pool, tp_rank=0, tp_size=2)
    r1 = make_backend(server.url, pool, tp_rank=1, tp_size=2)
    assert r0.batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert r0.batch_exists(keys) == 2 and r1.batch_exists(keys) == 0
    # Another DP group's rank 0 shares the pages.
    assert make_backend(server.url, pool, tp_rank=0, tp_size=2, dp_rank=1).batch_exists(keys) == 2
    # Other pipeline stages and context-parallel ranks hold other bytes.
    assert make_backend(server.url, pool, tp_rank=0, tp_size=2, pp=(1, 2)).batch_exists(keys) == 0
    assert make_backend(server.url, pool, tp_rank=0, tp_size=2, cp=(1, 2)).batch_exists(keys) == 0
    # MLA: every TP rank reads the page rank 0 wrote; a replica does not write.
    mla_pool, _ = host_pool("page_first", mla=True)
    fill(mla_pool, [2, 3], seed=6)
    m0 = make_backend(server.url, mla_pool, tp_rank=0, tp_size=2, mla=True)
    m1 = make_backend(server.url, mla_pool, tp_rank=1, tp_size=2, mla=True)
    assert m1.batch_set_v1(keys, slots([2, 3])) == [True, True]
    assert m0.batch_exists(keys) == 0
    m0.batch_set_v1(keys, slots([2, 3]))
    assert m1.batch_exists(keys) == 2


# -- chains ---------------------------------------------------------------------------


def test_batches_are_chained_to_their_prefix(server: Server, controllers: list[Controller]) -> None:
    """Two batches of one backup (more than STORAGE_BATCH_SIZE pages): the
    second names the first's last page as PARENT."""
    c = attach(controllers, server.url, "page_first", hicache_storage_pass_prefix_keys=True)
    parents: list[Optional[str]] = []
    put_chain = c.backend.client.put_chain

    def spy(keys: Any, values: Any, parent: Optional[str] = None, **kw: Any) -> list[int]:
        parents.append(parent)
        return put_chain(keys, values, parent=parent, **kw)

    c.backend.client.put_chain = spy  # type: ignore[method-assign,assignment]
    n = STORAGE_BATCH_SIZE + 4
    toks = tokens(n, seed=7)
    assert c.backup(toks, list(range(n))) == n * PAGE
    h = hashes_of(toks)
    assert parents == [None, c.backend._key(h[STORAGE_BATCH_SIZE - 1])]
    assert c.backend.batch_exists(h[:STORAGE_BATCH_SIZE]) == STORAGE_BATCH_SIZE


def test_no_prefix_keys_warns_once(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    pool, _ = host_pool("page_first")
    backend = make_backend(server.url, pool)
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        for i in range(3):
            backend.batch_set_v1(names(1, i), slots([i]), HiCacheStorageExtraInfo(prefix_keys=None))
        backend.batch_set_v1(names(1, 5), slots([5]), HiCacheStorageExtraInfo(prefix_keys=[]))
    assert len([r for r in caplog.records if "hicache_storage_pass_prefix_keys" in r.getMessage()]) == 1


# -- damaged values -------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-key", "crc"])
def test_damaged_page_is_a_miss_deleted_and_written_again(server: Server, damage: str) -> None:
    pool, _ = host_pool("page_first")
    fill(pool, [0, 1, 2, 3], seed=8)
    backend = make_backend(server.url, pool, checksum=True)
    keys = names(4)
    backend.batch_set_v1(keys, slots([0, 1, 2, 3]))
    c = server.client()
    victim = backend._key(keys[1])
    value = c.execute("GET", victim)
    assert isinstance(value, (bytes, bytearray))
    if damage == "crc":
        c.execute("SETRANGE", victim, 100, b"\x01\x02")
    else:
        bad = {
            "truncated": bytes(value[:-8]),
            "garbage": os.urandom(len(value)),
            "other-key": c.execute("GET", backend._key(keys[2])),
        }[damage]
        assert isinstance(bad, (bytes, bytearray))
        c.execute("SET", victim, bad)
    clear_pages(pool, [8, 9, 10, 11])
    assert backend.batch_get_v1(keys, slots([8, 9, 10, 11])) == [True, False, False, False]
    if damage != "crc":  # (a CRC is checked after the bytes landed)
        for p in (9, 10, 11):
            assert not any(page_bytes(pool, p))
    assert backend.damaged == 1
    assert c.execute("EXISTS", victim) == 0
    assert backend.batch_exists(keys) == 1
    # The next backup stores it again.
    assert backend.batch_set_v1(keys, slots([0, 1, 2, 3])) == [True] * 4
    assert backend.batch_get_v1(keys, slots([8, 9, 10, 11])) == [True] * 4
    assert page_bytes(pool, 9) == page_bytes(pool, 1)


# -- failures -------------------------------------------------------------------------


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = "kvtier://127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return url


def test_server_down_is_a_miss_with_few_log_lines(
    server: Server, controllers: list[Controller], caplog: pytest.LogCaptureFixture
) -> None:
    pool, dev = host_pool("page_first")
    c = Controller(closed_port_url(), pool, dev)
    controllers.append(c)
    toks = tokens(4, seed=9)
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            assert c.prefetch(toks, [8, 9, 10, 11]) == (0, 0)
            c.backup(toks, [0, 1, 2, 3])
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    # The failure that started the back-off, then nothing: the server was
    # skipped (and tried again after retry_after).
    assert len(caplog.records) <= 2, [r.getMessage() for r in caplog.records]
    assert c.backend.dropped == 50 * 4  # the lookup failed first: every write was skipped


def test_stalled_server_costs_one_timeout_then_is_skipped(server: Server) -> None:
    """A server that accepts and never answers: the first lookup times out
    (socket_timeout), the next calls do not touch it until retry_after."""
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(16)
    url = "kvtier://127.0.0.1:%d" % stalled.getsockname()[1]
    pool, _ = host_pool("page_first")
    backend = make_backend(url, pool, socket_timeout=0.3, retry_after=60)
    try:
        assert backend.batch_exists(names(2)) == 0
        assert not backend.health.ok()
        stalled.settimeout(0.5)
        conn, _ = stalled.accept()
        conn.settimeout(0.5)
        first = conn.recv(1 << 16)
        assert b"PREFIXLEN" in first
        assert backend.batch_exists(names(2)) == 0
        assert backend.batch_get_v1(names(2), slots([8, 9])) == [False, False]
        assert backend.batch_set_v1(names(2), slots([0, 1])) == [True, True]
        assert backend.dropped == 2
        # Nothing more was sent: the timed-out connection was closed, and
        # no other was opened.
        assert conn.recv(1 << 16) == b""
        conn.close()
        with pytest.raises(socket.timeout):
            stalled.accept()
    finally:
        stalled.close()
        backend.close()


# -- sidecar pools --------------------------------------------------------------------


def test_models_with_sidecar_pools_run_without_l3(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    pool, _ = host_pool("page_first")
    fill(pool, [0, 1], seed=10)
    backend = make_backend(server.url, pool)
    backend.register_mem_host_pool_v2(pool, PoolName.KV)
    backend.register_mem_host_pool_v2(pool, PoolName.MAMBA)
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        backend.on_host_pools_registered()
    assert any("mamba" in r.getMessage() for r in caplog.records)
    keys = names(2)
    assert backend.batch_set_v1(keys, slots([0, 1])) == [True, True]  # dropped
    transfer = PoolTransfer(name=PoolName.MAMBA, host_indices=slots([0]), keys=keys[:1])
    assert backend.batch_set_v2([transfer]) == {"mamba": [False]}
    assert server.client().execute("DBSIZE") == 0
    assert backend.batch_exists(keys) == 0
    assert backend.batch_exists_v2(keys, [transfer]).kv_hit_pages == 0
    assert backend.batch_get_v2([transfer]) == {"mamba": [False]}


# -- the rest of the interface --------------------------------------------------------


def test_legacy_get_set_and_clear(server: Server) -> None:
    pool, _ = host_pool("page_first")
    fill(pool, [0, 1], seed=11)
    backend = make_backend(server.url, pool)
    page = pool.get_dummy_flat_data_page().view(torch.uint8)
    page[:] = torch.arange(page.numel(), dtype=torch.int64).remainder(256).to(torch.uint8)
    assert backend.set("k1", page)
    out = torch.zeros_like(page)
    assert backend.get("k1", out) is out and torch.equal(out, page)
    assert backend.get("k2", torch.zeros_like(page)) is None
    backend.batch_set_v1(names(2), slots([0, 1]))
    other = make_backend(server.url, pool, tp_rank=1, tp_size=2)
    other.batch_set_v1(names(2), slots([0, 1]))
    backend.clear()
    assert backend.batch_exists(names(2)) == 0 and not backend.get("k1", out)
    assert other.batch_exists(names(2)) == 2  # another rank's pages stay


def test_striped_batches_are_byte_exact(server: Server) -> None:
    """8 pages with the default stripes: two MGETPREFIX on two connections,
    one answer; a hole in the second stripe still ends the prefix."""
    pool, _ = host_pool("layer_first")
    fill(pool, list(range(8)), seed=12)
    backend = make_backend(server.url, pool)
    keys = names(8)
    assert backend.batch_set_v1(keys, slots(list(range(8)))) == [True] * 8
    server.client().execute("CONFIG", "RESETSTAT")
    assert backend.batch_get_v1(keys, slots(list(range(8, 16)))) == [True] * 8
    assert server.commandstats().get("mgetprefix") == 2
    for i in range(8):
        assert page_bytes(pool, 8 + i) == page_bytes(pool, i)
    server.client().execute("DEL", backend._key(keys[5]))
    assert backend.batch_get_v1(keys, slots(list(range(8, 16)))) == [True] * 5 + [False] * 3
    assert backend.batch_exists(keys) == 5
    stats = backend.get_stats()
    assert stats.prefetch_pgs == [8, 5] and stats.backup_pgs == [8]


def test_options_are_read_as_the_other_plugins_read_theirs(server: Server) -> None:
    """kvtier._plugin.read_options: a misspelt option is refused, SGLang's own
    keys pass, values take the defaults' types."""
    pool, _ = host_pool("page_first", False)
    with pytest.raises(ValueError, match=r"unknown kvtier backend option\(s\): sokcet_timeout"):
        make_backend(server.url, pool, sokcet_timeout=1)
    b = make_backend(server.url, pool, stripes="2", checksum="yes", tp_lcm_size=None)
    assert b.client.stripes == 2 and b.codec.checksum is True
