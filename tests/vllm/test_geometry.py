"""The vLLM connector never loads a block written in another cache geometry:
its worker side (no engine) saving from a KV cache of one shape and loading
into one of another, against the real kvtier. The key names the layout (a
different key: a miss), and a value copied under the other layout's key is
refused by its length and key digest (a miss, no bytes written)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvtier.vllm import KeyScheme, KvtierMetadata, LoadSpec, Options, SaveSpec, WorkerSide

from conftest import Server

BLOCKS = 6


def worker(url: str, **geometry: Any) -> tuple[WorkerSide, KeyScheme, list[torch.Tensor]]:
    g: dict[str, Any] = dict(layers=2, kv_heads=4, head_size=32, block_size=16, dtype="bfloat16")
    g.update(geometry)
    keys = KeyScheme(
        model_id="test/model",
        dtype=g["dtype"],
        cache_dtype="auto",
        block_size=g["block_size"],
        layers=g["layers"],
        kv_heads=g["kv_heads"],
        head_size=g["head_size"],
        tp=1,
        kv_layout="LBHNC",
    )
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[g["dtype"]]
    caches = {
        "model.layers.%d.self_attn.attn" % i: torch.zeros(
            (BLOCKS, g["kv_heads"], g["block_size"], 2 * g["head_size"]), dtype=torch_dtype
        )
        for i in range(g["layers"])
    }
    w = WorkerSide(Options.of({"url": url}), keys, rank=0, num_blocks=BLOCKS)
    w.register(caches)
    return w, keys, list(caches.values())


HASHES = ["%032x" % (0xBEEF00 + i) for i in range(4)]


@pytest.mark.parametrize(
    "other",
    [
        {"kv_heads": 2},
        {"head_size": 64},
        {"block_size": 32},
        {"layers": 4},
        {"dtype": "float16"},
        {"kv_heads": 8, "head_size": 16},  # the same bytes per block, another shape
    ],
    ids=lambda o: ",".join("%s=%s" % kv for kv in o.items()),
)
def test_a_block_is_never_loaded_in_another_geometry(kvtier_server: Server, other: dict[str, Any]) -> None:
    kvtier_server.client().execute("FLUSHALL")
    writer, wkeys, wcache = worker(kvtier_server.url)
    reader, rkeys, rcache = worker(kvtier_server.url, **other)
    try:
        for t in wcache:
            t.view(torch.uint8).random_()
        writer.submit_saves(KvtierMetadata(saves=[SaveSpec("w", HASHES, [0, 1, 2, 3], None)]))
        writer.drain_saves()
        assert writer.stats["save_blocks"] == 4
        assert wkeys.layout != rkeys.layout
        # Another geometry's keys are other keys: the lookup finds nothing.
        client = kvtier_server.client()
        assert client.prefix_len(rkeys.lookup_keys(HASHES)) == 0
        # Even a value copied under the reader's key is refused, no bytes land.
        for h in HASHES:
            value = client.execute("GET", wkeys.key(0, h))
            assert isinstance(value, (bytes, bytearray))
            client.execute("SET", rkeys.key(0, h), value)
        reader.start_loads(KvtierMetadata(loads=[LoadSpec("r", HASHES, [0, 1, 2, 3])]))
        reader.wait_loads()
        assert reader.take_load_errors() == {0, 1, 2, 3}
        assert all(not t.any() for t in rcache)
        # The writer's own geometry loads them.
        again, _, acache = worker(kvtier_server.url)
        try:
            again.start_loads(KvtierMetadata(loads=[LoadSpec("a", HASHES, [0, 1, 2, 3])]))
            again.wait_loads()
            assert not again.take_load_errors()
            for a, b in zip(acache, wcache):
                assert torch.equal(a[:4].view(torch.uint8), b[:4].view(torch.uint8))
        finally:
            again.close()
    finally:
        writer.close()
        reader.close()
