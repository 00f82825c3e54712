"""The scheduler's lookup while the tier is under write pressure (run by
scripts/bench-vllm.sh): a 256-block prompt's keys, as the vLLM connector
names them, looked up again and again with one ``PREFIXLEN 256 ... HOLD``
(what ``get_num_new_matched_tokens`` sends) while a writer pushes 1 MiB
blocks into the tier past its maxmemory; beside it, the same lookup against
redis-server as a Redis connector would send it (256 ``EXISTS`` in one
pipeline), under the same writer. Prints p50/p99/p99.9 in ms and a JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import redis  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm import block_key, chain_root, extend_chain  # noqa: E402

BLOCKS = 256


def writer(write: object, stop: threading.Event, written: list[int]) -> None:
    junk = os.urandom(1 << 20)
    i = 0
    while not stop.is_set():
        names = ["writer:%d:%d" % (i, j) for j in range(8)]
        if isinstance(write, kvtier.Client):
            write.put_chain(names, [junk] * 8)
        else:
            assert isinstance(write, redis.Redis)
            p = write.pipeline(transaction=False)
            for n in names:
                p.set(n, junk)
            p.execute()
        written[0] += 8 << 20
        i += 1


def exists_prefix(r: redis.Redis, keys: list[str]) -> int:
    """The leading keys present, as a Redis connector asks: EXISTS each
    (here all in one pipeline, the best a Redis client can do)."""
    p = r.pipeline(transaction=False)
    for k in keys:
        p.exists(k)
    found = 0
    for e in p.execute():
        if not e:
            break
        found += 1
    return found


def percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)

    def q(f: float) -> float:
        return xs[min(len(xs) - 1, round(f * (len(xs) - 1)))] * 1e3

    return {"p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", required=True, help="host:port (started with a maxmemory)")
    ap.add_argument("--redis", required=True, help="redis-server host:port (with a maxmemory)")
    ap.add_argument("--lookups", type=int, default=3000)
    ap.add_argument("--hold-ms", type=int, default=5000)
    args = ap.parse_args()

    hashes: list[str] = []
    tokens = list(range(BLOCKS * 16))
    extend_chain(hashes, chain_root("bench"), tokens, BLOCKS, 16)
    keys = [block_key("bench", 0, h) for h in hashes]
    value = os.urandom(64 * 1024)
    results: dict[str, dict[str, float]] = {}
    for name in ("kvtier", "redis"):
        if name == "kvtier":
            lookup = kvtier.Client(args.kvtier, stripes=1)
            lookup.execute("FLUSHALL")
            lookup.put_chain(keys, [value] * BLOCKS)
            write: object = kvtier.Client(args.kvtier)
            one = functools.partial(lookup.prefix_len, keys, hold_ms=args.hold_ms)
        else:
            r = redis.Redis.from_url("redis://" + args.redis)
            r.flushall()
            p = r.pipeline(transaction=False)
            for k in keys:
                p.set(k, value)
            p.execute()
            write = redis.Redis.from_url("redis://" + args.redis)
            one = functools.partial(exists_prefix, r, keys)

        stop = threading.Event()
        written = [0]
        t = threading.Thread(target=writer, args=(write, stop, written), daemon=True)
        t.start()
        time.sleep(1.0)  # the writer past maxmemory
        lat: list[float] = []
        found = []
        t0 = time.perf_counter()
        for _ in range(args.lookups):
            s = time.perf_counter()
            found.append(one())
            lat.append(time.perf_counter() - s)
        took = time.perf_counter() - t0
        stop.set()
        t.join(30)
        res = percentiles(lat)
        res["found_all"] = sum(1 for f in found if f == BLOCKS) / len(found)
        res["writer_gbs"] = written[0] / 1e9 / (took + 1.0)
        results[name] = res
        print(name, json.dumps(res), flush=True)
    print()
    print("| 256-block lookup under a writer | p50 (ms) | p99 (ms) | p99.9 (ms) | found all | writer GB/s |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        label = "kvtier PREFIXLEN 256 HOLD" if name == "kvtier" else "redis-server 256 EXISTS, pipelined"
        print(
            "| %s | %.3f | %.3f | %.3f | %.0f%% | %.2f |"
            % (label, res["p50_ms"], res["p99_ms"], res["p999_ms"], 100 * res["found_all"], res["writer_gbs"])
        )
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
