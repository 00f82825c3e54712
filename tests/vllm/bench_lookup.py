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
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import redis  # noqa: E402

import kvtier  # noqa: E402

BLOCKS = 256


def writer(kind: str, addr: str, stop: Any, written: Any, gbs: float) -> None:
    """Writes chains of eight 1 MiB blocks until ``stop`` is set, at most
    ``gbs`` GB/s (0: as fast as it can), in a process of its own (the
    lookups are timed without sharing its interpreter)."""
    write: Any = kvtier.Client(addr) if kind == "kvtier" else redis.Redis.from_url("redis://" + addr)
    junk = os.urandom(1 << 20)
    i = 0
    t0 = time.monotonic()
    while not stop.is_set():
        if gbs and written.value / 1e9 > gbs * (time.monotonic() - t0):
            time.sleep(0.001)
            continue
        names = ["writer:%d:%d" % (i, j) for j in range(8)]
        if kind == "kvtier":
            write.put_chain(names, [junk] * 8)
        else:
            p = write.pipeline(transaction=False)
            for n in names:
                p.set(n, junk)
            p.execute()
        written.value += 8 << 20
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
    ap.add_argument("--maxmemory", type=int, default=512 << 20, help="the servers' maxmemory, bytes")
    ap.add_argument("--writer-gbs", default="0,0.5", help="writer rates to try, GB/s (0: unpaced)")
    args = ap.parse_args()

    # (Here, not at the top: the writer's process imports this module and
    # needs neither vLLM nor torch.)
    from kvtier.vllm import block_key, chain_root, extend_chain

    hashes: list[str] = []
    tokens = list(range(BLOCKS * 16))
    extend_chain(hashes, chain_root("bench"), tokens, BLOCKS, 16)
    keys = [block_key("bench", 0, h) for h in hashes]
    value = os.urandom(64 * 1024)
    results: dict[str, dict[str, float]] = {}
    runs = [(name, float(g)) for g in args.writer_gbs.split(",") for name in ("kvtier", "redis")]
    for name, gbs in runs:
        if name == "kvtier":
            lookup = kvtier.Client(args.kvtier, stripes=1)
            lookup.execute("FLUSHALL")
            lookup.put_chain(keys, [value] * BLOCKS)
            one = functools.partial(lookup.prefix_len, keys, hold_ms=args.hold_ms)
        else:
            r = redis.Redis.from_url("redis://" + args.redis)
            r.flushall()
            p = r.pipeline(transaction=False)
            for k in keys:
                p.set(k, value)
            p.execute()
            one = functools.partial(exists_prefix, r, keys)

        # The prompt is looked up once (held) before the writer starts, as a
        # scheduler looks up a prompt whose blocks are in the tier.
        assert one() == BLOCKS
        ctx = multiprocessing.get_context("spawn")
        stop, written = ctx.Event(), ctx.Value("q", 0)
        target = args.kvtier if name == "kvtier" else args.redis
        proc = ctx.Process(target=writer, args=(name, target, stop, written, gbs))
        proc.start()
        # Until the writer wrote twice the tier's maxmemory.
        deadline = time.monotonic() + 60
        while written.value < 2 * args.maxmemory and time.monotonic() < deadline:
            if not proc.is_alive():
                raise RuntimeError("the writer stopped (exit %s)" % proc.exitcode)
            time.sleep(0.05)
        lat: list[float] = []
        found = []
        w0, t0 = written.value, time.perf_counter()
        for _ in range(args.lookups):
            s = time.perf_counter()
            found.append(one())
            lat.append(time.perf_counter() - s)
        took, w1 = time.perf_counter() - t0, written.value
        stop.set()
        proc.join(30)
        res = percentiles(lat)
        res["found_all"] = sum(1 for f in found if f == BLOCKS) / len(found)
        res["writer_gbs"] = (w1 - w0) / 1e9 / took
        res["writer_limit_gbs"] = gbs
        results["%s@%g" % (name, gbs)] = res
        print(name, json.dumps(res), flush=True)
    print()
    print("| 256-block lookup | writer (GB/s, paced at) | p50 (ms) | p99 (ms) | p99.9 (ms) | found all |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        label = (
            "kvtier PREFIXLEN 256 HOLD" if name.startswith("kvtier") else "redis-server 256 EXISTS, pipelined"
        )
        limit = "%g" % res["writer_limit_gbs"] if res["writer_limit_gbs"] else "unpaced"
        print(
            "| %s | %.2f (%s) | %.3f | %.3f | %.3f | %.0f%% |"
            % (
                label,
                res["writer_gbs"],
                limit,
                res["p50_ms"],
                res["p99_ms"],
                res["p999_ms"],
                100 * res["found_all"],
            )
        )
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
