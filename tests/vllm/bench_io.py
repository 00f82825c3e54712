"""The vLLM connector's own I/O path without an engine (run by
scripts/bench-connectors.sh, in the vLLM venv): a worker's KV cache of
Llama-3-8B's shape (32 layers, 8 KV heads of 128, bf16) in host memory, and
for a 64-block prompt

* the scheduler's lookup: ``PREFIXLEN 64 ... HOLD`` (median of ``--lookups``);
* save: ``WorkerSide.submit_saves`` of the 64 blocks, waited for (one
  ``MSETBLOCK ... CHAIN`` striped over the client's connections, each value
  sent from the cache's own memory);
* load: ``WorkerSide.start_loads`` of them (``MGETPREFIX`` received straight
  into each block's layer regions);
* raw: ``Client.get_prefix`` of the same keys into one flat buffer per key:
  what the connection can deliver, the mark the load is compared with.

Medians over ``--reps`` rounds after an untimed one. Blocks of 16 tokens
are 2 MiB (vLLM's GPU block size), of 256 tokens 32 MiB (an LMCache chunk).
Prints one ``RESULT {json}`` line with the fields
tests/connectors/bench_connectors.py prints for LMCache's connectors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import kvtier  # noqa: E402
from kvtier.vllm import KeyScheme, KvtierMetadata, LoadSpec, Options, SaveSpec, WorkerSide  # noqa: E402

LAYERS, KV_HEADS, HEAD_SIZE = 32, 8, 128
BLOCKS = 64


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", required=True, help="host:port")
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lookups", type=int, default=30)
    ap.add_argument("--stripes", type=int, default=None)
    args = ap.parse_args()

    bs = args.block_tokens
    extra = {"url": "kvtier://" + args.kvtier}
    if args.stripes:
        extra["stripes"] = args.stripes
    options = Options.of(extra)
    keys = KeyScheme(
        model_id="meta-llama/Llama-3-8B",
        dtype="bfloat16",
        cache_dtype="auto",
        block_size=bs,
        layers=LAYERS,
        kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        tp=1,
        kv_layout="LBHNC",
    )
    caches = {
        "model.layers.%d.self_attn.attn" % i: torch.empty(
            (BLOCKS, KV_HEADS, bs, 2 * HEAD_SIZE), dtype=torch.bfloat16
        ).random_()
        for i in range(LAYERS)
    }
    worker = WorkerSide(options, keys, rank=0, num_blocks=BLOCKS)
    worker.register(caches)
    assert worker.cache is not None
    block_bytes = worker.cache.block_bytes
    gb = BLOCKS * block_bytes / 1e9
    client = kvtier.Client(args.kvtier)

    stores, loads, raws = [], [], []
    lookups: list[float] = []
    # Round 0 is not timed: connections, threads and the server's first use
    # of its memory are not what is measured.
    for rep in range(args.reps + 1):
        client.execute("FLUSHALL")
        hashes = ["%032x" % (rep << 64 | i) for i in range(BLOCKS)]
        block_ids = list(range(BLOCKS))
        save = KvtierMetadata(saves=[SaveSpec("r%d" % rep, hashes, block_ids, None)])
        c0, t0 = time.process_time(), time.perf_counter()
        worker.submit_saves(save)
        worker.drain_saves()
        if rep:
            stores.append((time.perf_counter() - t0, time.process_time() - c0))
        assert worker.stats["save_blocks"] == (rep + 1) * BLOCKS, worker.stats

        names = keys.lookup_keys(hashes)
        for _ in range(args.lookups):
            t = time.perf_counter()
            n = client.prefix_len(names, hold_ms=options.hold_ms)
            if rep:
                lookups.append(time.perf_counter() - t)
            assert n == BLOCKS
        load = KvtierMetadata(loads=[LoadSpec("r%d" % rep, hashes, block_ids)])
        c0, t0 = time.process_time(), time.perf_counter()
        worker.start_loads(load)
        worker.wait_loads()
        if rep:
            loads.append((time.perf_counter() - t0, time.process_time() - c0))
        assert not worker.take_load_errors()

        flat = [bytearray(block_bytes + 64) for _ in range(BLOCKS)]
        raw_client = worker.client
        t0 = time.perf_counter()
        got = raw_client.get_prefix(names, into=flat)
        if rep:
            raws.append(time.perf_counter() - t0)
        assert len(got) == BLOCKS
    worker.close()

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    result: dict[str, object] = {
        "connector": "vllm",
        "chunk_mib": block_bytes / (1 << 20),
        "lookup_ms": med(lookups) * 1e3,
        "lookup_p99_ms": sorted(lookups)[int(0.99 * (len(lookups) - 1))] * 1e3,
        "store_gbs": gb / med([t for t, _ in stores]),
        "retrieve_gbs": gb / med([t for t, _ in loads]),
        "raw_retrieve_gbs": gb / med(raws),
        "store_cpu_s_per_gb": med([c for _, c in stores]) / gb,
        "retrieve_cpu_s_per_gb": med([c for _, c in loads]) / gb,
    }
    result["load_vs_raw"] = (gb / med([t for t, _ in loads])) / (gb / med(raws))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
