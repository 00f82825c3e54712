"""kvtier inside a running vLLM engine (the CPU build, a generated model):
the same tokens as vLLM's own ExampleConnector on the same load path, the
engine's own KV bytes in the tier, prefix reuse across engines, the
prefill->decode hand-off, and faults (server down, restarted, blocks evicted
between lookup and load with and without the hold, a damaged block).

Random weights give nearly flat logits, so a computed prompt and a loaded
one may pick different tokens after a few steps: tokens are compared
between runs that take the same path (computed with computed, loaded with
loaded), never a load against a recompute.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

import kvtier
from kvtier import _codec
from kvtier.vllm import DEFAULTS, IN_FLIGHT_S, MAGIC, block_key, chain_root, extend_chain, tail_hash

from conftest import BLOCK, Engine, Server, kv_config, start_kvtier

HERE = Path(__file__).resolve().parent


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def loadable(tokens: list[int]) -> int:
    """Full blocks of a prompt: the connector loads every one (vLLM computes
    the last token again after a load), and the final partial block after
    them when it was stored (a full hit's cached tokens are then the whole
    prompt)."""
    return len(tokens) // BLOCK


def blocks(tokens: list[int]) -> int:
    """Keys a prompt is stored under: its full blocks and its final partial
    block."""
    return -(-len(tokens) // BLOCK)


def tail_key(server: Server, tokens: list[int]) -> str:
    """The key of the prompt's final partial block."""
    layout = layout_of(server)
    hashes: list[str] = []
    full = len(tokens) // BLOCK
    extend_chain(hashes, chain_root(layout), tokens, full, BLOCK)
    parent = bytes.fromhex(hashes[-1]) if hashes else chain_root(layout)
    return block_key(layout, 0, tail_hash(parent, tokens[full * BLOCK :]))


def stats_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def keyspace_hits(server: Server) -> int:
    info = server.client().execute("INFO", "stats")
    assert isinstance(info, bytes)
    return int(info.split(b"keyspace_hits:")[1].split(b"\r")[0])


def layout_of(server: Server) -> str:
    """The layout part of the stored keys' names. The engine stores on its
    save thread after generate returns: waits up to 60 s for a first key."""
    deadline = time.monotonic() + 60
    while not (keys := server.client().scan_keys("kvtier:vllm:*")):
        assert time.monotonic() < deadline, "nothing stored"
        time.sleep(0.05)
    return keys[0].split(":")[2]


def wait_stored(server: Server, keys: list[str]) -> None:
    """Waits up to 60 s until every one of ``keys`` is stored (the engine's
    save thread runs after generate returns)."""
    deadline = time.monotonic() + 60
    while True:
        present = server.client().execute("EXISTS", *keys)
        assert isinstance(present, int)
        if present == len(keys):
            return
        assert time.monotonic() < deadline, "the engine's save did not land"
        time.sleep(0.05)


def block_keys(server: Server, tokens: list[int], rank: int = 0, count: int | None = None) -> list[str]:
    """The keys of the first ``count`` blocks of ``tokens`` (default: the
    blocks a lookup can load)."""
    layout = layout_of(server)
    hashes: list[str] = []
    extend_chain(hashes, chain_root(layout), tokens, loadable(tokens) if count is None else count, BLOCK)
    return [block_key(layout, rank, h) for h in hashes]


# Prompt lengths whose last token does not end a block: the ExampleConnector
# loads (n - 2) // 128 blocks and kvtier n // 128, the same here.
LENGTHS = [1000, 2000, 3000]


def test_same_tokens_as_the_example_connector_and_the_engines_own_kv_bytes(
    model: Path, kvtier_server: Server, kv_engine: Engine, tmp_path: Path
) -> None:
    kvtier_server.client().execute("FLUSHALL")
    prompts = [prompt(100 + i, n) for i, n in enumerate(LENGTHS)]
    example = Engine(
        model,
        tmp_path / "example.log",
        {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "example")},
        },
    )
    try:
        ex_computed = example.generate(prompts)
        ex_loaded = example.generate(prompts)
    finally:
        example.close()
    kv_computed = kv_engine.generate(prompts)
    # Without their final partial blocks, kvtier loads what the
    # ExampleConnector loads and computes the rest: the same path.
    # (The engine saves them after generate returns.)
    tails = [tail_key(kvtier_server, p) for p in prompts]
    wait_stored(kvtier_server, tails)
    kvtier_server.client().execute("DEL", *tails)
    # Past the time the engine waits for blocks it saved itself.
    time.sleep(IN_FLIGHT_S + 0.5)
    kv_loaded = kv_engine.generate(prompts)

    for p, exc, exl, kvc, kvl in zip(prompts, ex_computed, ex_loaded, kv_computed, kv_loaded):
        assert kvc["cached"] == 0 and exc["cached"] == 0
        assert kvl["cached"] == loadable(p) * BLOCK == exl["cached"]
        assert kvc["tokens"] == exc["tokens"], "computed the same way, different tokens"
        assert kvl["tokens"] == exl["tokens"], "loaded the same way, different tokens"

    # The engine's own KV, as the ExampleConnector extracted it (token by
    # token through the slot mapping), equals what kvtier stores for each
    # block (the cache's block regions, layer after layer).
    p = prompts[-1]
    keys = block_keys(kvtier_server, p)
    values = kvtier_server.client().get_prefix(keys)
    assert len(values) == len(keys) == loadable(p)
    (folder,) = [
        d
        for d in (tmp_path / "example").iterdir()
        if load_file(str(next(d.iterdir())))["kv_cache"].shape[0] == loadable(p) * BLOCK
    ]
    layers = sorted(folder.iterdir(), key=lambda f: int(f.name.split(".")[2]))
    own = [load_file(str(f))["kv_cache"] for f in layers]  # [tokens, heads, 2 * head_size] each
    for b, value in enumerate(values):
        head = _codec.unpack(value)
        assert head.magic == MAGIC and head.digest == _codec.key_digest(keys[b])
        payload = torch.frombuffer(bytearray(value[head.header_len :]), dtype=torch.bfloat16)
        per_layer = payload.reshape(len(own), -1)
        for layer, ref in zip(per_layer, own):
            heads, width = ref.shape[1], ref.shape[2]
            stored = layer.reshape(heads, BLOCK, width).permute(1, 0, 2)
            assert torch.equal(stored, ref[b * BLOCK : (b + 1) * BLOCK]), "block %d differs" % b


def test_a_second_engine_loads_a_shared_prefix(
    model: Path, kvtier_server: Server, kv_engine: Engine, tmp_path: Path
) -> None:
    kvtier_server.client().execute("FLUSHALL")
    shared = prompt(7, 3000)
    a_prompt, b_prompt = shared + prompt(8, 200), shared + prompt(9, 200)
    (a_out,) = kv_engine.generate([a_prompt])
    assert a_out["cached"] == 0
    other = Engine(model, tmp_path / "b.log", kv_config(kvtier_server.url))
    try:
        before = kvtier_server.commandstats()
        (b_out,) = other.generate([b_prompt])
        # The save thread writes after the request's output is back: wait
        # for its write (on a loaded machine it can come later).
        deadline = time.monotonic() + 20
        calls = stats_delta(before, kvtier_server.commandstats())
        while "msetblock" not in calls and time.monotonic() < deadline:
            time.sleep(0.05)
            calls = stats_delta(before, kvtier_server.commandstats())
    finally:
        other.close()
    # 3,000 shared tokens: 23 whole blocks.
    assert b_out["cached"] == 23 * BLOCK
    # One lookup for the request, its load as MGETPREFIX (over the client's
    # stripes), its new blocks in one chain write; nothing per block.
    assert calls.get("prefixlen") == 1, calls
    assert 1 <= calls.get("mgetprefix", 0) <= DEFAULTS["stripes"], calls
    assert calls.get("msetblock") == 1, calls
    # (INFO is this test's own reading of the counts.)
    assert not set(calls) - {"prefixlen", "mgetprefix", "msetblock", "cluster|slots", "info"}, calls
    # The first engine, loading the same prefix the same way (without the
    # block the second one stored after it), picks the same tokens.
    kvtier_server.client().execute("DEL", *block_keys(kvtier_server, b_prompt)[23:])
    (again,) = kv_engine.generate([b_prompt])
    assert again["cached"] == b_out["cached"]
    assert again["tokens"] == b_out["tokens"]
    # The engine stores what it recomputed on its save thread, after
    # generate returns: wait for every whole block of the prompt, so that
    # no write of this test lands in the next one's emptied tier.
    wait_stored(kvtier_server, block_keys(kvtier_server, b_prompt, count=len(b_prompt) // BLOCK))


def test_prefill_engine_hands_its_blocks_to_a_decode_engine(
    model: Path, kvtier_server: Server, kv_engine: Engine, tmp_path: Path
) -> None:
    kvtier_server.client().execute("FLUSHALL")
    producer = Engine(model, tmp_path / "producer.log", kv_config(kvtier_server.url, role="kv_producer"))
    consumer = Engine(model, tmp_path / "consumer.log", kv_config(kvtier_server.url, role="kv_consumer"))
    try:
        # The decode engine is asked first and waits for the blocks the
        # prefill engine computes meanwhile.
        early = [prompt(20 + i, 2500) for i in range(2)]
        waiting: list[Any] = []
        t = threading.Thread(
            target=lambda: waiting.extend(
                consumer.generate(early, kv_transfer_params=[{"do_remote_prefill": True}] * len(early))
            )
        )
        t.start()
        produced = producer.generate(early, max_tokens=1, kv_transfer_params=[{"do_remote_decode": True}] * 2)
        t.join(timeout=300)
        assert not t.is_alive()
        for p, out, dec in zip(early, produced, waiting):
            assert out["kv_transfer_params"]["kvtier_blocks"] == loadable(p)
            assert dec["cached"] == len(p), "the decode engine computed the prompt"
        # The usual order: prefill first, its params passed on. (With them
        # vLLM reports the producer's own cache hits as the consumer's
        # cached tokens: what the consumer read is counted by the tier.)
        # A prompt with a final partial block and a block-aligned one: the
        # consumer reads every block of each.
        late = [prompt(30, 3000), prompt(31, 20 * BLOCK)]
        handed = []
        for p in late:
            (out,) = producer.generate([p], max_tokens=1, kv_transfer_params=[{"do_remote_decode": True}])
            assert out["kv_transfer_params"]["kvtier_tail"] == bool(len(p) % BLOCK)
            hits = keyspace_hits(kvtier_server)
            handed += consumer.generate([p], kv_transfer_params=[out["kv_transfer_params"]])
            assert keyspace_hits(kvtier_server) - hits == blocks(p), "the decode engine computed the prompt"
        # A consumer loads, it never stores: only the producer's blocks
        # (its prompts' whole blocks) are there.
        assert kvtier_server.client().execute("DBSIZE") == sum(blocks(p) for p in early + late)
    finally:
        producer.close()
        consumer.close()
    # A kv_both engine loading the same prompts the same way picks the same
    # tokens as the decode engine.
    for p, dec in zip([*early, *late], [*waiting, *handed]):
        (same,) = kv_engine.generate([p])
        assert same["cached"] == len(p)
        assert same["tokens"] == dec["tokens"]


def test_faults_cost_recomputation_never_wrong_tokens(model: Path, tmp_path: Path) -> None:
    """Its own kvtier (stopped and restarted here), with room for about 100
    blocks, and a connector that can flood the tier between a request's
    lookup and its load (tests/vllm/faulty.py)."""
    flags = [
        *("--maxmemory", "32mb", "--maxmemory-policy", "allkeys-lru"),
        *("--hold-max-memory", "16mb", "--hold-client-max-memory", "16mb"),
    ]
    server = start_kvtier(tmp_path / "kvtier.log", *flags)
    port = str(server.port)
    config = kv_config(server.url, module="faulty", retry_after=0.2)
    engine = Engine(model, tmp_path / "engine.log", config, extra_path=[HERE])
    try:
        p = prompt(40, 3000)
        (computed,) = engine.generate([p])
        (loaded,) = engine.generate([p])
        assert (computed["cached"], loaded["cached"]) == (0, len(p))
        c = server.client()

        # Evicted between lookup and load: held, the blocks stay and load.
        (held,) = engine.generate([p], kv_transfer_params=[{"test_flood_mb": 96}])
        assert held["cached"] == len(p)
        assert held["tokens"] == loaded["tokens"]
        info = c.execute("INFO", "stats")
        assert isinstance(info, bytes)
        assert b"lookup_holds_broken:0" in info and b"evicted_keys:0\r" not in info
        # Not held, they are gone by the load: recomputed (from its first
        # block, so exactly as the first time).
        (lost,) = engine.generate([p], kv_transfer_params=[{"test_flood_mb": 96, "test_no_hold": True}])
        assert lost["tokens"] == computed["tokens"]

        # A damaged first block (its header names another key): recomputed.
        engine.generate([p])  # stores the prompt again
        keys = block_keys(server, p)
        bogus = bytearray(c.get_prefix(keys[:1])[0])
        bogus[24:32] = _codec.key_digest("another key")
        assert c.put_chain(keys[:1], [bytes(bogus)], replace=True) == [1]
        (damaged,) = engine.generate([p])
        assert damaged["tokens"] == computed["tokens"]
        # ... and replaced: the next request loads it.
        (repaired,) = engine.generate([p])
        assert repaired["cached"] == len(p)
        assert repaired["tokens"] == loaded["tokens"]

        # kvtier stopped: every request computes.
        server.stop()
        outs = engine.generate([p, p])
        assert [o["tokens"] for o in outs] == [computed["tokens"]] * 2
        # Restarted (empty): the engine stores again, then loads.
        server = start_kvtier(tmp_path / "kvtier2.log", "--port", port, *flags)
        time.sleep(0.5)  # past the connector's retry_after
        first, second = engine.generate([p, p])
        assert first["tokens"] == computed["tokens"]
        assert second["cached"] == len(p)
        assert second["tokens"] == loaded["tokens"]
    finally:
        engine.close()
        server.stop()


def test_a_client_can_read_what_the_engine_stored(kvtier_server: Server, kv_engine: Engine) -> None:
    """The stored chain is a chain: PREFIXLEN over the prompt's keys counts
    every block, and a key of another layout counts none."""
    kvtier_server.client().execute("FLUSHALL")
    p = prompt(50, 1500)
    kv_engine.generate([p])
    keys = block_keys(kvtier_server, p)
    wait_stored(kvtier_server, keys)
    c = kvtier.Client(kvtier_server.addr)
    assert c.prefix_len(keys) == loadable(p)
    other = [k.replace(":vllm:", ":vllm:0") for k in keys]
    assert c.prefix_len(other) == 0
