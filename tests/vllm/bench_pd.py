"""Prefill -> decode hand-off through kvtier in real vLLM engines (run by
scripts/bench-vllm.sh, in the vLLM venv): a ``kv_producer`` engine and a
``kv_consumer`` engine in processes of their own, on one kvtier. For each of
a few 4,096-token prompts the consumer is asked first (it waits for the
blocks, ``MGETPREFIX ... BLOCK``) and the producer then computes and stores
the prompt. From the connectors' own timestamps (the log lines of
``log_transfers``, wall clock, one machine): how long the producer's store took, and when the
consumer had every block, counted from the moment the producer started
storing. Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import statistics
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import Engine, kv_config  # noqa: E402

SAVED = re.compile(r"kvtier: saved (\d+) blocks from ([0-9a-f]+) \(refused (\d+)\) ([\d.]+)\.\.([\d.]+)")
LOADED = re.compile(r"kvtier: loaded (\d+) of (\d+) blocks from ([0-9a-f]+) at ([\d.]+)")
LAYOUT = re.compile(r"kvtier connector \(kv_producer, worker\) for \S+: .*?; layout ([0-9a-f]+): ")


def handoff(
    label: str, model: Path, url: str, logdir: Path, seed: int, count: int, extra_path: Sequence[Path]
) -> list[dict[str, Any]]:
    """``count`` prompts handed from a producer to a consumer running the
    connector ``label`` (kvtier: this tree's, kvtier-base: the package
    ``kvtier_base`` under ``extra_path``); one row per prompt."""
    module = "kvtier.vllm" if label == "kvtier" else "kvtier_base.vllm"
    sys.path[:0] = [str(p) for p in extra_path]
    connector = importlib.import_module(module)
    conf: dict[str, Any] = {"log_transfers": True}
    logs = {role: logdir / ("%s-%s.log" % (label, role)) for role in ("consumer", "producer")}
    consumer = Engine(
        model, logs["consumer"], kv_config(url, "kv_consumer", module, **conf), extra_path=extra_path
    )
    producer = Engine(
        model, logs["producer"], kv_config(url, "kv_producer", module, **conf), extra_path=extra_path
    )
    # One prompt more, first, not counted: each engine's first request
    # warms it up.
    prompts = [[random.Random(seed + i).randrange(10, 4000) for _ in range(4096)] for i in range(count + 1)]
    decoded: list[Any] = []
    try:
        for p in prompts:
            t = threading.Thread(
                target=lambda p=p: decoded.extend(
                    consumer.generate([p], max_tokens=1, kv_transfer_params=[{"do_remote_prefill": True}])
                )
            )
            t.start()
            producer.generate([p], max_tokens=1, kv_transfer_params=[{"do_remote_decode": True}])
            t.join(600)
    finally:
        consumer.close()
        producer.close()

    plog = logs["producer"].read_text(errors="replace")
    clog = logs["consumer"].read_text(errors="replace")
    m = LAYOUT.search(plog)
    assert m, "no layout line in the producer's log"
    layout = m.group(1)
    saves = [(h, float(a), float(b)) for _, h, _, a, b in SAVED.findall(plog)]
    loads = {h: (int(n), int(of), float(at)) for n, of, h, at in LOADED.findall(clog)}
    rows: list[dict[str, Any]] = []
    for p, out in list(zip(prompts, decoded))[1:]:
        hashes: list[str] = []
        connector.extend_chain(hashes, connector.chain_root(layout), p, len(p) // 128, 128)
        mine = [(a, b) for h, a, b in saves if h in set(hashes)]
        got = loads.get(hashes[0])
        if not mine or got is None:
            rows.append({"connector": label, "error": "no save or load lines for a prompt"})
            continue
        start, end = min(a for a, _ in mine), max(b for _, b in mine)
        rows.append(
            {
                "connector": label,
                "blocks": got[1],
                "loaded": got[0],
                "store_ms": (end - start) * 1e3,
                "consumer_has_blocks_ms": (got[2] - start) * 1e3,
                "ratio": (got[2] - start) / (end - start),
                "consumer_cached": out["cached"],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kvtier", required=True, help="kvtier://host:port")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument(
        "--baseline",
        type=Path,
        help="a folder holding an earlier build's package as kvtier_base (at or after 4b0aa2e: "
        "its log lines and chain hashes as here): its hand-off runs too, on other prompts",
    )
    args = ap.parse_args()

    logdir = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    print("logs:", logdir)
    runs: list[tuple[str, list[Path]]] = [("kvtier", [])]
    if args.baseline:
        runs.append(("kvtier-base", [args.baseline]))
    rows: list[dict[str, Any]] = []
    for n, (label, extra) in enumerate(runs):
        rows += handoff(label, args.model, args.kvtier, logdir, 5000 + 100 * n, args.prompts, extra)
    print()
    print("| connector | prompt | blocks | producer's store (ms) | consumer has them after (ms) | ratio |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        if "error" in r:
            print("| %s | %d | %s | | | |" % (r["connector"], i, r["error"]))
            continue
        print(
            "| %s | %d | %d of %d | %.0f | %.0f | %.2fx |"
            % (
                r["connector"],
                i,
                r["loaded"],
                r["blocks"],
                r["store_ms"],
                r["consumer_has_blocks_ms"],
                r["ratio"],
            )
        )
    for label, _ in runs:
        mine = [r for r in rows if r["connector"] == label and "ratio" in r]
        if mine:
            print(
                "%s: median ratio %.2fx, consumer has its blocks after a median %.0f ms"
                % (
                    label,
                    statistics.median(r["ratio"] for r in mine),
                    statistics.median(r["consumer_has_blocks_ms"] for r in mine),
                )
            )
    print("JSON " + json.dumps(rows))


if __name__ == "__main__":
    main()
