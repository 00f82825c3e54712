"""Prefill -> decode through kvtier, over vLLM's OpenAI API: what a P/D
proxy does, for docker/vllm/docker-compose.yml.

For each prompt (token ids: the generated model has no tokenizer) it asks
the prefill engine for one token with ``kv_transfer_params:
{"do_remote_decode": true}``, passes the ``kv_transfer_params`` of its answer
to the decode engine with the real ``max_tokens``, and prints both times and
how many blocks the decode engine read from kvtier (INFO's keyspace_hits,
before and after). Exits non-zero when the decode engine read fewer blocks
than the prefill engine said it stored: it computed the prompt itself.

    python pd_client.py [--prefill http://prefill:8000] [--decode http://decode:8000]
        [--kvtier kvtier:6379] [--prompts 3] [--tokens 4096]

(the defaults are the services of docker/vllm/docker-compose.yml)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.request
from typing import Any

import kvtier


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        out: dict[str, Any] = json.load(r)
    return out


def model_of(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return str(json.load(r)["data"][0]["id"])


def hits(client: kvtier.Client) -> int:
    info = client.execute("INFO", "stats")
    assert isinstance(info, bytes)
    for line in info.decode().splitlines():
        if line.startswith("keyspace_hits:"):
            return int(line.split(":")[1])
    raise RuntimeError("no keyspace_hits in INFO")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", default="http://prefill:8000")
    ap.add_argument("--decode", default="http://decode:8000")
    ap.add_argument("--kvtier", default="kvtier:6379", help="host:port")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()

    tier = kvtier.Client(args.kvtier)
    model = model_of(args.prefill)
    failed = 0
    print("| prompt | prefill (ms) | decode (ms) | blocks stored | blocks the decode engine read |")
    print("|---|---|---|---|---|")
    for i in range(args.prompts):
        rng = random.Random(7000 + i)
        prompt = [rng.randrange(10, 4000) for _ in range(args.tokens)]
        t0 = time.perf_counter()
        pre = post(
            args.prefill,
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True},
            },
        )
        t1 = time.perf_counter()
        params = pre["kv_transfer_params"]
        before = hits(tier)
        post(
            args.decode,
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "return_token_ids": True,
                "kv_transfer_params": params,
            },
        )
        t2 = time.perf_counter()
        read = hits(tier) - before
        stored = int(params.get("kvtier_blocks", 0))
        failed += read < stored
        print("| %d | %.0f | %.0f | %d | %d |" % (i, (t1 - t0) * 1e3, (t2 - t1) * 1e3, stored, read))
    if failed:
        print("%d of %d prompts were computed by the decode engine" % (failed, args.prompts))
        sys.exit(1)
    print("every prompt's blocks went from the prefill engine to the decode engine through kvtier")


if __name__ == "__main__":
    main()
