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
import json
import random
import re
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kvtier.vllm import chain_root, extend_chain  # noqa: E402

from conftest import Engine, kv_config  # noqa: E402

SAVED = re.compile(r"kvtier: saved (\d+) blocks from ([0-9a-f]+) \(refused (\d+)\) ([\d.]+)\.\.([\d.]+)")
LOADED = re.compile(r"kvtier: loaded (\d+) of (\d+) blocks from ([0-9a-f]+) at ([\d.]+)")
LAYOUT = re.compile(r"kvtier connector \(kv_producer, worker\) for \S+: .*?; layout ([0-9a-f]+): ")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kvtier", required=True, help="kvtier://host:port")
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()

    logdir = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    print("logs:", logdir)
    conf: dict[str, Any] = {"log_transfers": True}
    consumer = Engine(args.model, logdir / "consumer.log", kv_config(args.kvtier, role="kv_consumer", **conf))
    producer = Engine(args.model, logdir / "producer.log", kv_config(args.kvtier, role="kv_producer", **conf))
    prompts = [
        [random.Random(5000 + i).randrange(10, 4000) for _ in range(4096)] for i in range(args.prompts)
    ]
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

    plog = (logdir / "producer.log").read_text(errors="replace")
    clog = (logdir / "consumer.log").read_text(errors="replace")
    m = LAYOUT.search(plog)
    assert m, "no layout line in the producer's log"
    layout = m.group(1)
    saves = [(h, float(a), float(b)) for _, h, _, a, b in SAVED.findall(plog)]
    loads = {h: (int(n), int(of), float(at)) for n, of, h, at in LOADED.findall(clog)}
    rows: list[dict[str, Any]] = []
    for p, out in zip(prompts, decoded):
        hashes: list[str] = []
        extend_chain(hashes, chain_root(layout), p, len(p) // 128, 128)
        mine = [(a, b) for h, a, b in saves if h in set(hashes)]
        got = loads.get(hashes[0])
        if not mine or got is None:
            rows.append({"error": "no save or load lines for a prompt"})
            continue
        start, end = min(a for a, _ in mine), max(b for _, b in mine)
        rows.append(
            {
                "blocks": got[1],
                "loaded": got[0],
                "store_ms": (end - start) * 1e3,
                "consumer_has_blocks_ms": (got[2] - start) * 1e3,
                "ratio": (got[2] - start) / (end - start),
                "consumer_cached": out["cached"],
            }
        )
    print()
    print("| prompt | blocks | producer's store (ms) | consumer has them after (ms) | ratio |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows):
        if "error" in r:
            print("| %d | %s | | | |" % (i, r["error"]))
            continue
        print(
            "| %d | %d of %d | %.0f | %.0f | %.2fx |"
            % (i, r["loaded"], r["blocks"], r["store_ms"], r["consumer_has_blocks_ms"], r["ratio"])
        )
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        print("median ratio %.2fx" % statistics.median(ratios))
    print("JSON " + json.dumps(rows))


if __name__ == "__main__":
    main()
