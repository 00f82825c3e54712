"""Time to first token in real vLLM engines (the CPU build) with and without
kvtier (run by scripts/bench-vllm.sh, in the vLLM venv).

Each configuration is one engine serving three workloads, one request at a
time (a request of ``max_tokens`` 1: its time is its TTFT):

* ``full hit``: four 4,096-token prompts, served twice; the second pass is
  timed (a full prefix hit for every configuration that can hit);
* ``system prompt``: one 4,096-token system prompt and eight users' 256
  tokens after it; requests 2..8 are timed;
* ``multi-turn``: three conversations of three turns, the first turn 4,096
  tokens, each later one the previous prompt, a 64-token reply and 256 new
  tokens; turns 2 and 3 are timed.

Configurations: ``recompute`` (no connector, no prefix cache), ``local``
(vLLM's own prefix cache: the same engine serving a prefix again), ``disk``
(vLLM's ExampleConnector; it keys whole prompts, so only identical prompts
hit; its files are in the page cache, so this is a read from DRAM),
``disk-cold`` (the same with the page cache dropped before each timed
request, root only: a read from the disk, as from a tier larger than DRAM),
``kvtier`` (one node), ``kvtier-cluster`` (three nodes) and ``kvtier-base``
(an earlier build's connector, ``--baseline``, on the one node); the
connector configurations run with the engine's prefix cache off, so that
every hit is a load from the connector. Prints a table of TTFT p50/p99 per
workload and configuration, the ratios the goals name, and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import Engine, kv_config  # noqa: E402

PREFIX = 4096


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def workloads() -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    """Each workload: (prompts served untimed first, prompts timed)."""
    full = [tokens(1000 + i, PREFIX) for i in range(4)]
    system = tokens(2000, PREFIX)
    users = [system + tokens(2100 + i, 256) for i in range(8)]
    turns: list[list[list[int]]] = []
    for c in range(3):
        prompt = tokens(3000 + c, PREFIX)
        conv = [prompt]
        for t in range(2):
            prompt = prompt + tokens(3100 + 10 * c + t, 64) + tokens(3200 + 10 * c + t, 256)
            conv.append(prompt)
        turns.append(conv)
    first_turns = [conv[0] for conv in turns]
    later_turns = [p for conv in turns for p in conv[1:]]
    return {
        "full hit": (full, full),
        "system prompt": (users[:1], users[1:]),
        "multi-turn": (first_turns, later_turns),
    }


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def drop_page_cache() -> None:
    """Empties the kernel's page cache (root only): the disk connector's
    files are then read from the disk, as a tier larger than DRAM is."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_config(
    name: str,
    model: Path,
    logdir: Path,
    kv: Optional[dict[str, Any]],
    prefix_caching: bool,
    cold: bool = False,
    extra_path: Sequence[Path] = (),
) -> dict[str, Any]:
    engine = Engine(
        model, logdir / ("%s.log" % name), kv, prefix_caching=prefix_caching, extra_path=extra_path
    )
    out: dict[str, Any] = {}
    try:
        for wname, (warm, timed) in workloads().items():
            engine.generate(warm, max_tokens=1)
            # Later requests, not the next instant: what the first pass
            # stores is stored by then.
            time.sleep(1.0)
            if cold:
                res = []
                for p in timed:
                    drop_page_cache()
                    res.extend(engine.generate([p], max_tokens=1))
            else:
                res = engine.generate(timed, max_tokens=1)
            secs = [r["seconds"] for r in res]
            out[wname] = {
                "p50_ms": statistics.median(secs) * 1e3,
                "p99_ms": percentile(secs, 0.99) * 1e3,
                "cached_tokens": statistics.mean(r["cached"] for r in res),
                "prompt_tokens": statistics.mean(len(p) for p in timed),
                "each_ms": [round(x * 1e3) for x in secs],
                "each_cached": [r["cached"] for r in res],
            }
            print(name, wname, json.dumps(out[wname]), flush=True)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kvtier", required=True, help="kvtier://host:port of one node")
    ap.add_argument("--cluster", default="", help="kvtier://h1:p1,h2:p2,h3:p3 of a three-node cluster")
    ap.add_argument("--configs", default="recompute,local,disk,disk-cold,kvtier,kvtier-cluster")
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a folder holding an earlier build's package as kvtier_base: config kvtier-base runs it",
    )
    args = ap.parse_args()

    logdir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))

    def disk(path: str) -> dict[str, Any]:
        # A directory per configuration: the ExampleConnector names a
        # prompt's files by a hash of its leading tokens and fails on a
        # file another prompt of another length wrote.
        return {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(logdir / path)},
        }

    configs: dict[str, tuple[Optional[dict[str, Any]], bool]] = {
        "recompute": (None, False),
        "local": (None, True),
        "disk": (disk("disk"), False),
        "disk-cold": (disk("disk-cold"), False),
        "kvtier": (kv_config(args.kvtier), False),
    }
    if args.cluster:
        configs["kvtier-cluster"] = (kv_config(args.cluster), False)
    if args.baseline:
        configs["kvtier-base"] = (kv_config(args.kvtier, module="kvtier_base.vllm"), False)
    results: dict[str, dict[str, Any]] = {}
    for name in args.configs.split(","):
        if name not in configs:
            continue
        kv, prefix_caching = configs[name]
        cold = name == "disk-cold"
        if cold and os.geteuid() != 0:
            print("disk-cold needs root (it drops the page cache): skipped", flush=True)
            continue
        extra = [args.baseline] if name == "kvtier-base" and args.baseline else []
        results[name] = run_config(name, args.model, logdir, kv, prefix_caching, cold, extra)

    print()
    print("| workload | configuration | TTFT p50 (ms) | TTFT p99 (ms) | cached tokens / prompt |")
    print("|---|---|---|---|---|")
    for wname in workloads():
        for name, res in results.items():
            r = res[wname]
            print(
                "| %s | %s | %.0f | %.0f | %.0f / %.0f |"
                % (wname, name, r["p50_ms"], r["p99_ms"], r["cached_tokens"], r["prompt_tokens"])
            )
    print()
    print("| workload | kvtier's TTFT p50 against | ratio |")
    print("|---|---|---|")
    for wname in workloads():
        for kvname in ("kvtier", "kvtier-cluster", "kvtier-base"):
            if kvname not in results:
                continue
            mine = results[kvname][wname]["p50_ms"]
            for base in (
                "recompute",
                "disk",
                "disk-cold",
                "local",
                *(("kvtier-base",) if kvname == "kvtier" else ()),
            ):
                if base in results:
                    print(
                        "| %s | %s vs %s | %.3fx |"
                        % (wname, kvname, base, mine / results[base][wname]["p50_ms"])
                    )
    print()
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
