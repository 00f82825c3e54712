"""Benchmark of LMCache remote connectors (run by scripts/bench-connectors.sh).

In one run, through LMCache 0.5.6's own RemoteBackend (the layer its storage
manager calls), for 64-chunk prompts of 32 MiB chunks (256 tokens of
Llama-3-8B in bf16: 32 layers x 8 KV heads x 128) and of 2 MiB chunks (16
tokens):

* ``redis``   LMCache's ``redis://`` connector on redis-server 7
* ``plugin``  the kvtier plugin on kvtier (its default ``io: threads``)
* ``plugin-asyncio``  the same with ``io: asyncio`` (AsyncClient on LMCache's loop)
* ``resp``    LMCache's ``resp://`` native (C++) connector on kvtier
* ``redis@kvtier``  LMCache's ``redis://`` connector on kvtier (what a user
  gets today by pointing redis:// at kvtier)
* ``vllm``    kvtier's vLLM connector (``kvtier.vllm``) on kvtier, its save and
  load paths on a KV cache of the same shape (tests/vllm/bench_io.py, in the
  vLLM venv, with ``--vllm-python``); its retrieve is the load into the
  cache's block regions, and ``raw_retrieve_gbs`` the same MGETPREFIX into
  flat buffers

and per connector: lookup latency (``batched_contains`` of the 64 chunks),
store and retrieve GB/s (``batched_submit_put_task`` waited for /
``batched_get_blocking``; medians after one untimed round), and the Python
process's CPU seconds per GB moved (user + system, every thread). The
connectors take turns for ``--rounds`` rounds, each in a process of its own;
every figure is the median over the rounds. Prints a table, the ratios against redis, and
a JSON line.

Also, on a three-node kvtier cluster: the same 64-key lookup and a 64 x 2 MiB
fetch sent to one node that coordinates, against the client splitting the
keys by owner itself (one request per node in parallel, merged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The kvtier package of this checkout, or of another build (plugin@base).
sys.path.insert(0, os.environ.get("KVTIER_CLIENT_PATH") or str(HERE.parents[1] / "clients" / "python"))

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObj  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

import kvtier  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B
DTYPE = torch.bfloat16
CHUNKS = 64
GIB = 1 << 30


def config_for(
    kind: str, url: str, chunk_tokens: int, local_gb: float
) -> tuple[LMCacheEngineConfig, str | None]:
    common: dict[str, Any] = dict(
        chunk_size=chunk_tokens,
        local_cpu=False,
        max_local_cpu_size=local_gb,
        remote_serde="naive",
        blocking_timeout_secs=120,
    )
    if kind.startswith("plugin"):
        io = "asyncio" if kind == "plugin-asyncio" else "threads"
        cfg = LMCacheEngineConfig.from_defaults(
            **common,
            remote_storage_plugins=["kvtier"],
            save_unfull_chunk=True,
            extra_config={
                "remote_storage_plugin.kvtier.module_path": "kvtier.lmcache",
                "remote_storage_plugin.kvtier.class_name": "KvtierConnectorAdapter",
                "remote_storage_plugin.kvtier.url": url,
                "remote_storage_plugin.kvtier.io": io,
            },
        )
        return cfg, "kvtier"
    if kind == "resp":
        cfg = LMCacheEngineConfig.from_defaults(
            **common, remote_url=url, save_unfull_chunk=False, extra_config={"save_chunk_meta": False}
        )
        return cfg, None
    return LMCacheEngineConfig.from_defaults(**common, remote_url=url), None


class Bench:
    def __init__(self, kind: str, url: str, chunk_tokens: int, flush: Callable[[], None]) -> None:
        self.kind = kind
        self.chunk_tokens = chunk_tokens
        self.flush = flush
        self.chunk_bytes = 2 * LAYERS * chunk_tokens * KV_HEADS * HEAD_DIM * DTYPE.itemsize
        local_gb = 2.3 * CHUNKS * self.chunk_bytes / GIB + 0.5
        self.config, plugin = config_for(kind, url, chunk_tokens, local_gb)
        self.meta = LMCacheMetadata(
            model_name="meta-llama/Llama-3-8B",
            world_size=1,
            local_world_size=1,
            worker_id=0,
            local_worker_id=0,
            kv_dtype=DTYPE,
            kv_shape=(LAYERS, 2, chunk_tokens, KV_HEADS, HEAD_DIM),
            chunk_size=chunk_tokens,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cpu = LocalCPUBackend(config=self.config, metadata=self.meta, dst_device="cpu")
        self.backend = RemoteBackend(
            config=self.config,
            metadata=self.meta,
            loop=self.loop,
            local_cpu_backend=self.cpu,
            dst_device="cpu",
            plugin_name=plugin,
        )
        assert self.backend.connection is not None, "%s: no connection" % kind
        shape = torch.Size([2, LAYERS, chunk_tokens, KV_HEADS * HEAD_DIM])
        self.objs: list[MemoryObj] = []
        for _ in range(CHUNKS):
            obj = self.cpu.allocate([shape], [DTYPE], MemoryFormat.KV_2LTD)
            assert obj is not None and obj.tensor is not None, "out of local CPU memory"
            obj.tensor.view(torch.uint8).random_()
            self.objs.append(obj)
        self.rep = 0

    def keys(self) -> list[CacheEngineKey]:
        return [
            CacheEngineKey("meta-llama/Llama-3-8B", 1, 0, (self.rep << 32) + i + 1, DTYPE)
            for i in range(CHUNKS)
        ]

    def store(self) -> tuple[float, float]:
        """(seconds, CPU seconds) of storing the 64 chunks, waited for."""
        self.flush()
        self.rep += 1
        keys = self.keys()
        done = threading.Event()
        left = [len(keys)]
        lock = threading.Lock()

        def one_done(_key: Any) -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        c0, t0 = time.process_time(), time.perf_counter()
        self.backend.batched_submit_put_task(keys, self.objs, on_complete_callback=one_done)
        if not done.wait(300):
            raise RuntimeError("%s: store did not finish" % self.kind)
        while self.backend.put_tasks:
            time.sleep(0.001)
        t1, c1 = time.perf_counter(), time.process_time()
        return t1 - t0, c1 - c0

    def lookup(self) -> tuple[float, int]:
        keys = self.keys()
        t0 = time.perf_counter()
        n = self.backend.batched_contains(keys)
        return time.perf_counter() - t0, n

    def retrieve(self) -> tuple[float, float]:
        keys = self.keys()
        c0, t0 = time.process_time(), time.perf_counter()
        got = self.backend.batched_get_blocking(keys)
        t1, c1 = time.perf_counter(), time.process_time()
        missing = sum(1 for g in got if g is None)
        for g in got:
            if g is not None:
                g.ref_count_down()
        if missing:
            raise RuntimeError("%s: %d of %d chunks missing on retrieve" % (self.kind, missing, CHUNKS))
        return t1 - t0, c1 - c0

    def verify(self) -> None:
        keys = self.keys()
        got = self.backend.batched_get_blocking(keys[:2])
        for g, want in zip(got, self.objs):
            assert g is not None and g.tensor is not None and want.tensor is not None
            assert torch.equal(g.tensor.view(torch.uint8), want.tensor.view(torch.uint8)), (
                "%s: wrong bytes" % self.kind
            )
            g.ref_count_down()

    def close(self) -> None:
        for obj in self.objs:
            obj.ref_count_down()
        self.objs.clear()
        if self.kind.startswith("plugin"):
            # LMCache 0.5.6's redis:// and resp:// connectors hang in close()
            # (their job executor's shutdown waits on the loop it runs on), so
            # only the plugin is closed; the others are dropped with the loop.
            self.backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def run_one(
    kind: str, url: str, chunk_tokens: int, flush: Callable[[], None], reps: int, lookups: int
) -> dict[str, Any]:
    b = Bench(kind, url, chunk_tokens, flush)
    try:
        gb = CHUNKS * b.chunk_bytes / 1e9
        # One untimed round first: connections, threads and the server's
        # first use of its memory are not what is measured.
        b.store()
        stores = [b.store() for _ in range(reps)]
        b.verify()
        lk = [b.lookup() for _ in range(lookups)]
        assert all(n == CHUNKS for _, n in lk), "%s: lookup found %s" % (kind, [n for _, n in lk][:5])
        b.retrieve()
        gets = [b.retrieve() for _ in range(reps)]
        return {
            "connector": kind,
            "chunk_mib": b.chunk_bytes / (1 << 20),
            "lookup_ms": statistics.median(t for t, _ in lk) * 1e3,
            "store_gbs": gb / statistics.median(t for t, _ in stores),
            "retrieve_gbs": gb / statistics.median(t for t, _ in gets),
            "store_cpu_s_per_gb": statistics.median(c for _, c in stores) / gb,
            "retrieve_cpu_s_per_gb": statistics.median(c for _, c in gets) / gb,
        }
    finally:
        b.close()


# -- coordination vs client-side splitting ----------------------------------------


def cluster_bench(nodes: list[str], reps: int) -> dict[str, Any]:
    """A 64-key lookup, a 64 x 2 MiB fetch and a store on three nodes: one
    node coordinates (``split_reads=False, stripes=1``), against the
    client's default (reads split by owner, large batches striped). The two
    are run alternately and the medians reported."""
    coordinated = kvtier.Client(nodes, split_reads=False, stripes=1)
    default = kvtier.Client(nodes)
    keys = ["coord:%d" % i for i in range(CHUNKS)]
    value = bytes(2 << 20)
    gb = CHUNKS * len(value) / 1e9
    dest = [bytearray(len(value)) for _ in keys]
    default.put_chain(keys, [value] * CHUNKS)
    timings: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        timings.setdefault(name, []).append(time.perf_counter() - t0)

    for c in (coordinated, default):  # warm: connections, slot map
        c.get_prefix(keys, into=dest)

    def rounds(name: str, c: kvtier.Client) -> None:
        for _ in range(10):
            timed(name + "_lookup", lambda: c.prefix_len(keys))
        timed(name + "_fetch", lambda: c.get_prefix(keys, into=dest))
        for n in nodes:
            kvtier.Client(n).execute("FLUSHALL")
        timed(name + "_store", lambda: c.put_chain(keys, [value] * CHUNKS))

    for _ in range(max(5, reps * 3)):
        rounds("coordinated", coordinated)
        rounds("client", default)
    med = {k: statistics.median(v) for k, v in timings.items()}
    return {
        "coordinated_lookup_ms": med["coordinated_lookup"] * 1e3,
        "client_lookup_ms": med["client_lookup"] * 1e3,
        "coordinated_fetch_gbs": gb / med["coordinated_fetch"],
        "client_fetch_gbs": gb / med["client_fetch"],
        "coordinated_store_gbs": gb / med["coordinated_store"],
        "client_store_gbs": gb / med["client_store"],
    }


def flusher(c: kvtier.Client) -> Callable[[], None]:
    def flush() -> None:
        c.execute("FLUSHALL")

    return flush


def run_child(kind: str, url: str, tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one connector in a child process; a failure is reported, not fatal."""
    if kind == "vllm":
        # The vLLM connector's own save and load paths, in the vLLM venv.
        cmd = [args.vllm_python, str(HERE.parent / "vllm" / "bench_io.py"), "--kvtier", args.kvtier]
        cmd += ["--block-tokens", str(tokens), "--reps", str(args.reps), "--lookups", str(args.lookups)]
    else:
        cmd = [sys.executable, __file__, "--redis", args.redis, "--kvtier", args.kvtier]
        cmd += ["--reps", str(args.reps), "--lookups", str(args.lookups), "--one", kind, url, str(tokens)]
    env = dict(os.environ)
    if kind.endswith("@base"):
        # The same plugin from the baseline's kvtier package, first on the path.
        env["KVTIER_CLIENT_PATH"] = args.baseline_client
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return {"connector": kind, "chunk_mib": None, "error": "timed out after 900 s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    errors = [x for x in out.stderr.splitlines() if "Error" in x or "error" in x]
    why = errors[-1] if errors else "exit %d" % out.returncode
    return {"connector": kind, "chunk_mib": None, "error": why.strip()[:300]}


def median_of(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One connector's figures over its rounds: each number the median of
    the rounds that did not fail (a failure only when all did)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    out: dict[str, Any] = {"connector": kind, "chunk_mib": ok[0]["chunk_mib"], "rounds": len(ok)}
    for field, value in ok[0].items():
        if field not in out and isinstance(value, (int, float)):
            out[field] = statistics.median(r[field] for r in ok)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis", required=True, help="redis-server 7 host:port")
    ap.add_argument("--kvtier", required=True, help="kvtier host:port")
    ap.add_argument("--cluster", default="", help="three kvtier cluster nodes, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="runs of every connector, taking turns")
    ap.add_argument("--lookups", type=int, default=30)
    ap.add_argument("--chunk-tokens", default="256,16")
    ap.add_argument("--vllm-python", default="", help="the vLLM venv's python: also time the vLLM connector")
    ap.add_argument(
        "--baseline-client",
        default="",
        help="a clients/python of another build: also run the plugin with it (plugin@base), for before/after",
    )
    ap.add_argument("--one", nargs=3, metavar=("CONNECTOR", "URL", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        # One connector in a process of its own (memory fully returned, a
        # hang bounded): the parent collects the JSON line.
        kind, url, tokens = args.one
        flush_addr = args.redis if url.startswith("redis://" + args.redis) else args.kvtier
        res = run_one(
            kind.split("@")[0], url, int(tokens), flusher(kvtier.Client(flush_addr)), args.reps, args.lookups
        )
        res["connector"] = kind
        res["client"] = kvtier.__file__
        print("RESULT " + json.dumps(res), flush=True)
        return

    r = kvtier.Client(args.redis)
    k = kvtier.Client(args.kvtier)
    info = r.execute("INFO", "server")
    assert isinstance(info, bytes) and b"redis_version:7." in info, "--redis must be a redis-server 7"

    runs = [
        # LMCache's redis:// client times out writing 64 x 32 MiB at once with
        # redis-py's default timeout here: give it two minutes.
        ("redis", "redis://%s?socket_timeout=120" % args.redis),
        ("plugin", "kvtier://" + args.kvtier),
        ("plugin-asyncio", "kvtier://" + args.kvtier),
        ("resp", "resp://" + args.kvtier),
        ("redis@kvtier", "redis://%s?socket_timeout=120" % args.kvtier),
    ]
    if args.vllm_python:
        runs.append(("vllm", "kvtier://" + args.kvtier))
    if args.baseline_client:
        runs.insert(2, ("plugin@base", "kvtier://" + args.kvtier))
    results: list[dict[str, Any]] = []
    for tokens in [int(t) for t in args.chunk_tokens.split(",")]:
        # The connectors take turns, round after round: the machine's
        # drift (it is shared) falls on all of them, not on whichever ran
        # in a slow minute.
        rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind, _ in runs}
        for _ in range(args.rounds):
            for kind, url in runs:
                res = run_child(kind, url, tokens, args)
                rounds[kind].append(res)
                print(json.dumps(res), flush=True)
                r.execute("FLUSHALL")
                k.execute("FLUSHALL")
        results.extend(median_of(kind, got) for kind, got in rounds.items())

    print()
    print(
        "| chunk | connector | lookup 64 chunks (ms) | store GB/s | retrieve GB/s "
        "| CPU s/GB store | CPU s/GB retrieve |"
    )
    print("|---|---|---|---|---|---|---|")
    for res in results:
        if "error" in res:
            print("| | %s | failed: %s | | | | |" % (res["connector"], res["error"]))
            continue
        print(
            "| %g MiB | %s | %.3f | %.2f | %.2f | %.2f | %.2f |"
            % (
                res["chunk_mib"],
                res["connector"],
                res["lookup_ms"],
                res["store_gbs"],
                res["retrieve_gbs"],
                res["store_cpu_s_per_gb"],
                res["retrieve_cpu_s_per_gb"],
            )
        )
    print()
    print(
        "| chunk | kvtier's connector against | lookup faster | retrieve GB/s | store GB/s "
        "| CPU/GB retrieve | CPU/GB store |"
    )
    print("|---|---|---|---|---|---|---|")
    by: dict[tuple[str, float], dict[str, Any]] = {
        (x["connector"], float(x["chunk_mib"])): x for x in results if "error" not in x
    }
    for (conn, mib), x in sorted(by.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        if conn in ("plugin", "vllm"):
            for base in ("redis", "resp", "redis@kvtier", "plugin@base"):
                b = by.get((base, mib))
                if b is None or (base == "plugin@base" and conn != "plugin"):
                    continue
                print(
                    "| %g MiB | %s vs %s | %.1fx | %.2fx | %.2fx | %.2fx less | %.2fx less |"
                    % (
                        mib,
                        conn,
                        base,
                        b["lookup_ms"] / x["lookup_ms"],
                        x["retrieve_gbs"] / b["retrieve_gbs"],
                        x["store_gbs"] / b["store_gbs"],
                        b["retrieve_cpu_s_per_gb"] / x["retrieve_cpu_s_per_gb"],
                        b["store_cpu_s_per_gb"] / x["store_cpu_s_per_gb"],
                    )
                )
    if args.cluster:
        c = cluster_bench(args.cluster.split(","), args.reps)
        print()
        print("cluster (3 nodes, 64 keys):", json.dumps(c))
    print()
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
