"""The kvtier plugin inside the real LMCache 0.5.6 (CPU), against the real
kvtier binary: LMCache's own basic_check, then RemoteBackend/CreateConnector
through the plugin: store, lookup, retrieve byte-exact, partial chunks,
eviction, TP agreement, a three-node cluster, and bad input."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

import kvtier

from conftest import ROOT, Server, checkpoint, start_kvtier
from lmcache_env import Worker, metadata, plugin_config, same_bytes


@pytest.fixture(params=["threads", "asyncio"])
def worker(server: Server, request: pytest.FixtureRequest) -> Iterator[Worker]:
    """A worker on the plugin, fetching and storing through the sync client
    in threads (the default) or AsyncClient on LMCache's loop."""
    w = Worker(plugin_config(server.url, io=request.param), metadata())
    yield w
    w.close()


def test_basic_check_test_remote(server: Server, tmp_path: Path) -> None:
    """``python -m lmcache.v1.basic_check --mode test_remote`` with a config
    file that loads the plugin (basic_check builds its RemoteBackend from
    ``remote_url``, so the file names the kvtier:// URL there too)."""
    config = tmp_path / "lmcache.yaml"
    config.write_text(
        "chunk_size: 256\n"
        "local_cpu: false\n"
        "max_local_cpu_size: 1\n"
        "remote_serde: naive\n"
        'remote_url: "%s"\n'
        'remote_storage_plugins: ["kvtier"]\n'
        "extra_config:\n"
        "  remote_storage_plugin.kvtier.module_path: kvtier.lmcache\n"
        "  remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter\n"
        '  remote_storage_plugin.kvtier.url: "%s"\n' % (server.url, server.url)
    )
    env = dict(os.environ, LMCACHE_CONFIG_FILE=str(config), PYTHONPATH=str(ROOT / "clients" / "python"))
    out = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_remote", "--num-keys", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "Creating kvtier connector" in text, text
    assert "Validation (content correct): 8/8 passed (100.0%)" in text, text
    assert "Test Failed" not in text, text
    # It really went to kvtier: 8 chunks are stored there.
    keys = server.client().scan_keys("*")
    assert len(keys) == 8, keys


def test_store_lookup_retrieve_byte_exact(worker: Worker, server: Server) -> None:
    keys = worker.keys(12)
    objs = [worker.chunk(i) for i in range(12)]
    worker.store(keys, objs)
    assert worker.backend.batched_contains(keys) == 12
    assert worker.backend.batched_contains([*keys[:5], worker.key(999), *keys[6:]]) == 5
    got = worker.backend.batched_get_blocking(keys)
    assert len(got) == 12 and all(g is not None for g in got)
    for g, o in zip(got, objs):
        assert g is not None and same_bytes(g, o)
        g.ref_count_down()
    # One key per chunk: metadata and data in one value.
    assert len(server.client().scan_keys("*")) == 12


def test_lookup_is_one_prefixlen_and_no_exists(worker: Worker, server: Server) -> None:
    keys = worker.keys(64)
    worker.store(keys, [worker.chunk(i) for i in range(64)])
    server.client().execute("CONFIG", "RESETSTAT")
    assert worker.backend.batched_contains(keys) == 64
    stats = server.commandstats()
    assert stats.get("prefixlen") == 1, stats
    assert "exists" not in stats and "mexists" not in stats, stats
    server.client().execute("CONFIG", "RESETSTAT")
    assert worker.run(worker.backend.batched_async_contains("req-1", keys)) == 64
    stats = server.commandstats()
    assert stats.get("prefixlen") == 1 and "exists" not in stats, stats


@pytest.mark.parametrize("stripes", [1, 4])
def test_fetch_is_mgetprefix_and_store_msetblock(server: Server, stripes: int) -> None:
    """stripes=1: one MGETPREFIX and one MSETBLOCK for the batch; the default
    spreads a large batch over up to 4 connections, still with no per-chunk
    GET/SET/EXISTS."""
    w = Worker(plugin_config(server.url, chunk_size=256, stripes=stripes), metadata(chunk_size=256))
    try:
        keys = w.keys(32)  # 32 x 256 KiB: large enough to be striped
        server.client().execute("CONFIG", "RESETSTAT")
        w.store(keys, [w.chunk(i) for i in range(32)])
        got = w.backend.batched_get_blocking(keys)
        stats = server.commandstats()
        assert stats.get("msetblock") == stripes and stats.get("mgetprefix") == stripes, stats
        assert not {"get", "set", "mget", "exists"} & set(stats), stats
        assert all(g is not None and same_bytes(g, o) for g, o in zip(got, w.made))
        for g in got:
            assert g is not None
            g.ref_count_down()
    finally:
        w.close()


def test_non_blocking_get_returns_the_leading_run_only(worker: Worker) -> None:
    keys = worker.keys(6)
    objs = [worker.chunk(i) for i in range(6)]
    worker.store(keys[:2] + keys[3:], objs[:2] + objs[3:])  # chunk 2 missing
    got = worker.run(worker.backend.batched_get_non_blocking("req", keys))
    assert len(got) == 2
    assert all(same_bytes(g, o) for g, o in zip(got, objs))
    blocking = worker.backend.batched_get_blocking(keys)
    assert [g is not None for g in blocking] == [True, True, False, False, False, False]
    for g in [*got, *blocking]:
        if g is not None:
            g.ref_count_down()


def test_partial_chunk(worker: Worker) -> None:
    keys = worker.keys(3)
    objs = [worker.chunk(0), worker.chunk(1), worker.chunk(2, tokens=5)]
    worker.store(keys, objs)
    got = worker.backend.batched_get_blocking(keys)
    assert got[2] is not None and got[2].tensor is not None
    assert list(got[2].tensor.shape) == [2, 2, 5, 128]
    for g, o in zip(got, objs):
        assert g is not None and same_bytes(g, o)
        g.ref_count_down()


def test_single_key_methods(worker: Worker) -> None:
    conn = worker.connector
    key, obj = worker.key(1), worker.chunk(1)
    assert not conn.exists_sync(key)
    worker.run(conn.put(key, _ref(obj)))
    assert conn.exists_sync(key) and worker.run(conn.exists(key))
    got = worker.run(conn.get(key))
    assert got is not None and same_bytes(got, obj)
    got.ref_count_down()
    assert worker.run(conn.ping()) == 0
    assert key.to_string() in worker.run(conn.list())
    assert conn.remove_sync(key)
    assert not conn.exists_sync(key)
    assert worker.run(conn.get(key)) is None


def _ref(obj: object) -> object:
    obj.ref_count_up()  # type: ignore[attr-defined]
    return obj


def test_existing_chunks_are_kept(worker: Worker, server: Server) -> None:
    keys = worker.keys(2)
    worker.store(keys, [worker.chunk(1), worker.chunk(2)])
    worker.store(keys, [worker.chunk(7), worker.chunk(8)])  # NX: the first copy stays
    got = worker.backend.batched_get_blocking(keys)
    assert got[0] is not None and same_bytes(got[0], worker.chunk(1))
    for g in got:
        assert g is not None
        g.ref_count_down()


def test_eviction_keeps_lookup_and_retrieve_consistent(tmp_path: Path) -> None:
    """Under a small maxmemory, the chunks that a lookup counts are the ones
    a retrieve returns, byte for byte; the prefix policy evicts chain ends."""
    small = start_kvtier(tmp_path / "small.log", "--threads", "2", "--maxmemory", "3mb")
    w = Worker(plugin_config(small.url, chunk_size=64), metadata(chunk_size=64))
    try:
        keys = w.keys(96)  # 96 x 64 KiB chunks into 3 MB
        objs = [w.chunk(i) for i in range(96)]
        for i in range(0, 96, 8):
            w.store(keys[i : i + 8], objs[i : i + 8])
        present = small.client().exists_many([w.name(k) for k in keys])
        leading = present.index(False) if False in present else len(present)
        assert 0 < sum(present) < 96, present
        n = w.backend.batched_contains(keys)
        assert n == leading
        got = w.run(w.backend.batched_get_non_blocking("req", keys))
        assert len(got) == n
        for g, o in zip(got, objs):
            assert same_bytes(g, o)
            g.ref_count_down()
    finally:
        w.close()
        small.stop()


def test_tp_ranks_agree_when_a_chunk_is_gone(server: Server, tmp_path: Path) -> None:
    """world_size 2: each rank stores its own keys; a lookup is one
    PREFIXLEN ... HOLD over both ranks' keys, and the ranks of one request
    agree through a short-lived rendezvous key. What the first rank counted
    is held, so a flood of writes between the ranks' lookups cannot make it
    unloadable; a rank never answers more than it can load (a chunk deleted
    between the lookups); and no count is shared across requests, with or
    without a lookup_id. With the agreement off, ranks disagree."""
    small = start_kvtier(
        tmp_path / "small.log",
        *("--maxmemory", "16mb", "--maxmemory-policy", "allkeys-lru", "--hold-client-max-memory", "1mb"),
    )
    cfg = plugin_config(small.url)
    r0, r1 = (
        Worker(cfg, metadata(world_size=2, worker_id=0)),
        Worker(cfg, metadata(world_size=2, worker_id=1)),
    )
    try:
        k0, k1 = r0.keys(10), r1.keys(10)
        assert r0.name(k0[0]) != r1.name(k1[0])
        r0.store(k0, [r0.chunk(i) for i in range(10)])
        r1.store(k1, [r1.chunk(100 + i) for i in range(10)])
        assert r0.backend.batched_contains(k0) == 10 == r1.backend.batched_contains(k1)

        # Gone before both lookups: both see 6.
        small.client().execute("DEL", r1.name(k1[6]))
        assert r0.run(r0.backend.batched_async_contains("req-a", k0)) == 6
        assert r1.run(r1.backend.batched_async_contains("req-a", k1)) == 6

        # The tier flooded between the two lookups of one request: the six
        # chunks of each rank that the first lookup counted are still there.
        assert r0.run(r0.backend.batched_async_contains("req-b", k0[:6])) == 6
        flood = small.client()
        junk = bytes(1 << 20)
        for i in range(48):
            flood.put_chain(["flood:%d" % i], [junk], chain=False)
        assert r1.run(r1.backend.batched_async_contains("req-b", k1[:6])) == 6
        for w, keys in ((r0, k0), (r1, k1)):
            got = w.run(w.connector.batched_get(keys[:6]))
            assert all(g is not None for g in got), "a counted chunk was evicted"
            for g in got:
                g.ref_count_down()

        # Deleted between the two lookups: the second rank answers what it
        # can load, not the first rank's count.
        assert r0.run(r0.backend.batched_async_contains("req-c", k0[:6])) == 6
        small.client().execute("DEL", r1.name(k1[3]))
        assert r1.run(r1.backend.batched_async_contains("req-c", k1[:6])) == 3
        # A later request sees the loss on both ranks ...
        assert r1.run(r1.backend.batched_async_contains("req-d", k1[:6])) == 3
        assert r0.run(r0.backend.batched_async_contains("req-d", k0[:6])) == 3
        # ... and so do lookups without a lookup_id, within the agreement's
        # lifetime of an earlier one (each rank's n-th lookup of these keys
        # meets the other's n-th).
        r0.store(k0[:6], [r0.chunk(i) for i in range(6)])
        r1.store(k1[:6], [r1.chunk(100 + i) for i in range(6)])
        assert r0.backend.batched_contains(k0[:6]) == 6 == r1.backend.batched_contains(k1[:6])
        small.client().execute("DEL", r1.name(k1[2]))
        assert r0.backend.batched_contains(k0[:6]) == 2 == r1.backend.batched_contains(k1[:6])
    finally:
        r0.close()
        r1.close()
        small.stop()

    off = plugin_config(server.url, tp_agreement="off")
    a, b = Worker(off, metadata(world_size=2, worker_id=0)), Worker(off, metadata(world_size=2, worker_id=1))
    try:
        server.client().execute("FLUSHALL")
        ka, kb = a.keys(4), b.keys(4)
        a.store(ka, [a.chunk(i) for i in range(4)])
        b.store(kb, [b.chunk(i) for i in range(4)])
        server.client().execute("DEL", b.name(kb[1]))
        assert (a.backend.batched_contains(ka), b.backend.batched_contains(kb)) == (4, 1)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("io", ["asyncio", "threads"])
def test_three_node_cluster(cluster_nodes: list[Server], io: str) -> None:
    url = "kvtier://" + ",".join(s.addr for s in cluster_nodes)
    w = Worker(plugin_config(url, io=io), metadata())
    try:
        keys = w.keys(48)
        objs = [w.chunk(i) for i in range(48)]
        w.store(keys, objs)
        held = [int(s.client().execute("DBSIZE")) for s in cluster_nodes]  # type: ignore[call-overload]
        assert sum(held) == 48 and all(h > 0 for h in held), held
        assert w.backend.batched_contains(keys) == 48
        got = w.run(w.backend.batched_get_non_blocking("req", keys))
        assert len(got) == 48 and all(same_bytes(g, o) for g, o in zip(got, objs))
        for g in got:
            g.ref_count_down()
        # A hole on whichever node owns chunk 20 ends the prefix there.
        kvtier.Client([s.addr for s in cluster_nodes]).execute("DEL", w.name(keys[20]))
        assert w.backend.batched_contains(keys) == 20
    finally:
        w.close()


@pytest.mark.parametrize("io", ["threads", "asyncio"])
def test_kvtiers_url_talks_tls(tls_url: str, io: str) -> None:
    """remote_storage_plugin.kvtier.url = kvtiers://...?ssl_ca_certs=...: the
    plugin stores and retrieves over TLS to kvtier's --tls-port."""
    w = Worker(plugin_config(tls_url, io=io), metadata())
    try:
        w.store_and_read_back(w.keys(8), [w.chunk(i) for i in range(8)])
    finally:
        w.close()


# -- bad input ------------------------------------------------------------------


def test_server_down_is_a_clear_error_and_a_miss(worker: Worker, server: Server) -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    dead = "kvtier://127.0.0.1:%d" % port.getsockname()[1]
    port.close()
    w = Worker(plugin_config(dead, connect_timeout=1), metadata())
    try:
        conn = w.connector.getWrappedConnector()
        with pytest.raises(kvtier.ConnectionError, match="no kvtier node answered"):
            conn.batched_contains(w.keys(2))
        assert w.backend.batched_contains(w.keys(2)) == 0
        assert w.backend.get_blocking(w.key(0)) is None
        assert w.run(w.backend.batched_get_non_blocking("r", w.keys(2))) == []
    finally:
        w.close()


def test_timeout_is_a_clear_error(tmp_path: Path) -> None:
    """A peer that accepts and never answers: TimeoutError, then a miss."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    url = "kvtier://127.0.0.1:%d" % listener.getsockname()[1]
    w = Worker(plugin_config(url, socket_timeout=0.5), metadata())
    try:
        conn = w.connector.getWrappedConnector()
        with pytest.raises(kvtier.TimeoutError):
            conn.batched_contains(w.keys(2))
        with pytest.raises(kvtier.TimeoutError):
            w.run(conn.batched_get_non_blocking("r", w.keys(2)))
        assert w.backend.batched_contains(w.keys(2)) == 0
    finally:
        w.close()
        stop.set()
        t.join(2)
        listener.close()
        for s in held:
            s.close()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-key", "longer"])
def test_damaged_value_is_a_miss_never_wrong_bytes(worker: Worker, server: Server, damage: str) -> None:
    keys = worker.keys(4)
    objs = [worker.chunk(i) for i in range(4)]
    worker.store(keys, objs)
    c = server.client()
    victim = worker.name(keys[2])
    value = c.execute("GET", victim)
    assert isinstance(value, (bytes, bytearray))
    if damage == "truncated":
        bad = bytes(value[:-100])
    elif damage == "garbage":
        bad = os.urandom(len(value))
    elif damage == "longer":
        bad = bytes(value) + b"\0" * 64
    else:  # a well-formed chunk, but stored under another key
        bad = c.execute("GET", worker.name(keys[3]))  # type: ignore[assignment]
    c.execute("SET", victim, bad)
    got = worker.run(worker.backend.batched_get_non_blocking("req", keys))
    assert len(got) == 2 and all(same_bytes(g, o) for g, o in zip(got, objs))
    assert worker.backend.get_blocking(keys[2]) is None
    for g in got:
        g.ref_count_down()


def test_a_checkpoint_re_pointed_under_one_path_shares_nothing(server: Server, tmp_path: Path) -> None:
    """The model's path names other weights now: the engine that loads them
    neither counts nor reads the chunks the first weights computed under the
    same LMCache keys, and stores its own beside them (the key names the
    weights, not only the name)."""
    folder = checkpoint(tmp_path / "model", 1)
    config = plugin_config(server.url)
    first = Worker(config, metadata(model=str(folder)))
    try:
        keys = first.keys(4)
        first.store(keys, [first.chunk(i) for i in range(4)])
        assert first.backend.batched_contains(keys) == 4
    finally:
        first.close()
    (folder / "model.safetensors").unlink()
    checkpoint(tmp_path / "other", 2).joinpath("model.safetensors").rename(folder / "model.safetensors")
    second = Worker(config, metadata(model=str(folder)))
    try:
        assert [k.to_string() for k in second.keys(4)] == [k.to_string() for k in keys]
        assert second.name(keys[0]) != first.name(keys[0])
        assert second.backend.batched_contains(keys) == 0
        second.store_and_read_back(keys, [second.chunk(100 + i) for i in range(4)])
    finally:
        second.close()


@pytest.mark.parametrize("other", [{"heads": 4}, {"layers": 4}, {"heads": 1, "layers": 4}])
def test_a_chunk_is_never_read_in_another_geometry(server: Server, other: dict[str, Any]) -> None:
    """Chunks another engine geometry stored under the same LMCache keys
    (LMCache's key names the model, world size, rank and dtype, not the
    KV shape) are misses: the header's shapes do not fit, no bytes."""
    writer = Worker(plugin_config(server.url), metadata())
    reader = Worker(plugin_config(server.url), metadata(**other))
    try:
        keys = writer.keys(3)
        assert keys == reader.keys(3)
        writer.store(keys, [writer.chunk(i) for i in range(3)])
        assert reader.backend.get_blocking(keys[0]) is None
        assert reader.run(reader.backend.batched_get_non_blocking("req", keys)) == []
        got = writer.run(writer.backend.batched_get_non_blocking("req", keys))
        assert len(got) == 3
        for g in got:
            g.ref_count_down()
    finally:
        writer.close()
        reader.close()


def test_checksum_catches_a_changed_payload(server: Server) -> None:
    w = Worker(plugin_config(server.url, checksum=True), metadata())
    try:
        keys = w.keys(3)
        objs = [w.chunk(i) for i in range(3)]
        w.store(keys, objs)
        c = server.client()
        # Another client changes one payload byte, header untouched.
        c.execute("SETRANGE", w.name(keys[1]), 500, b"\x5a")
        got = w.run(w.backend.batched_get_non_blocking("req", keys))
        assert len(got) == 1 and same_bytes(got[0], objs[0])
        got[0].ref_count_down()
    finally:
        w.close()


def test_adapter_urls() -> None:
    from kvtier.lmcache import KvtierConnectorAdapter, plugin_options

    a = KvtierConnectorAdapter()
    assert (
        a.can_parse("kvtier://h:1,h:2")
        and a.can_parse("plugin://kvtier")
        and a.can_parse("plugin://kvtier.b")
    )
    assert not a.can_parse("redis://h:1") and not a.can_parse("plugin://redis")
    opts = plugin_options(
        {"remote_storage_plugin.kvtier.url": "kvtier://x:1", "kvtier.checksum": "yes"}, "kvtier"
    )
    assert opts["url"] == "kvtier://x:1" and opts["checksum"] is True
    # The same rules as the other plugins (kvtier._plugin.read_options): a
    # misspelt option is refused, LMCache's own keys pass, values take the
    # defaults' types.
    with pytest.raises(ValueError, match=r"unknown kvtier plugin option\(s\): chekcsum"):
        plugin_options({"remote_storage_plugin.kvtier.chekcsum": True}, "kvtier")
    opts = plugin_options(
        {
            "remote_storage_plugin.kvtier.module_path": "kvtier.lmcache",
            "remote_storage_plugin.kvtier.class_name": "KvtierConnectorAdapter",
            "remote_storage_plugin.kvtier.stripes": "3",
            "chunk_size": 256,
        },
        "kvtier",
    )
    assert opts["stripes"] == 3
    with pytest.raises(ValueError, match="kvtier plugin option stripes: 'many' is not a int"):
        plugin_options({"kvtier.stripes": "many"}, "kvtier")
