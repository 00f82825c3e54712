"""A vLLM engine (CPU build) in a process of its own, driven over JSON lines.

Started by the tests and by scripts/bench-vllm.sh::

    python engine.py --model DIR [--kv-transfer-config JSON] [--prefix-caching]
        [--served-model-name NAME]

It prints ``{"ready": ...}`` once the engine is up, then answers one line per
request line on stdin:

* ``{"op": "generate", "prompts": [[ids...], ...], "max_tokens": n,
  "kv_transfer_params": [params or null, ...]}`` -> ``{"outputs": [{"tokens":
  [...], "cached": n, "seconds": s, "kv_transfer_params": ...}, ...]}``: the
  prompts one after another (with ``"lora": [name, id, path]``, through
  that adapter; ``--lora``) (each timed alone: with ``max_tokens`` 1 that is
  its time to first token);
* ``{"op": "batch", ...}``: the same prompts submitted together;
* ``{"op": "abort", ..., "after_s": s}``: the prompts submitted together and
  aborted after ``s`` seconds;
* ``{"op": "metrics"}`` -> ``{"metrics": {name: value}}``: the connector's
  Prometheus counters (with ``--log-stats``);
* ``{"op": "quit"}``.

Everything else the engine prints goes to stderr, so stdout carries only
these lines. Prompts are token ids (the model has no tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--kv-transfer-config", default=None, help="KVTransferConfig fields as JSON")
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--log-stats", action="store_true", help="vLLM's stats and Prometheus metrics on")
    ap.add_argument("--lora", action="store_true", help="LoRA adapters on (rank 8)")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--kv-offloading-size", type=float, default=None, help="GiB: vLLM's own CPU offloading")
    args = ap.parse_args()

    # stdout is the protocol: the engine's own output (and its children's)
    # goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    options: dict[str, Any] = dict(
        model=args.model,
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.prefix_caching,
        dtype="bfloat16",
        gpu_memory_utilization=0.3,
        enforce_eager=True,
    )
    if args.log_stats:
        options["disable_log_stats"] = False
    if args.lora:
        options.update(enable_lora=True, max_lora_rank=8, max_loras=2)
    if args.served_model_name:
        options["served_model_name"] = args.served_model_name
    if args.kv_transfer_config:
        options["kv_transfer_config"] = KVTransferConfig(**json.loads(args.kv_transfer_config))
    if args.kv_offloading_size:
        options["kv_offloading_size"] = args.kv_offloading_size
    t0 = time.monotonic()
    llm = LLM(**options)
    print(json.dumps({"ready": True, "startup_s": time.monotonic() - t0}), file=proto)

    def params(req: dict[str, Any], i: int) -> SamplingParams:
        extra = None
        kvp = (req.get("kv_transfer_params") or [None] * len(req["prompts"]))[i]
        if kvp is not None:
            extra = {"kv_transfer_params": kvp}
        return SamplingParams(
            max_tokens=int(req.get("max_tokens", 8)),
            temperature=0,
            ignore_eos=True,
            detokenize=False,
            extra_args=extra,
        )

    def result(out: Any, seconds: float) -> dict[str, Any]:
        return {
            "tokens": list(out.outputs[0].token_ids),
            "cached": out.num_cached_tokens,
            "seconds": seconds,
            "kv_transfer_params": out.kv_transfer_params,
        }

    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            break
        if op == "metrics":
            # The connector's counters as vLLM exports them, summed over labels.
            totals: dict[str, float] = {}
            for m in llm.get_metrics():
                if m.name.startswith("vllm:kvtier_") and hasattr(m, "value"):
                    totals[m.name] = totals.get(m.name, 0) + m.value
            print(json.dumps({"metrics": totals}), file=proto)
            continue
        try:
            prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
            if op == "generate":
                outputs = []
                lora = LoRARequest(*req["lora"]) if req.get("lora") else None
                for i, p in enumerate(prompts):
                    t = time.monotonic()
                    (out,) = llm.generate([p], params(req, i), use_tqdm=False, lora_request=lora)
                    outputs.append(result(out, time.monotonic() - t))
            elif op == "abort":
                # Submitted together, aborted after ``after_s``; answers once
                # the engine has nothing left to do.
                engine = llm.llm_engine
                ids = ["abort-%d-%d" % (time.monotonic_ns(), i) for i in range(len(prompts))]
                for i, (rid, p) in enumerate(zip(ids, prompts)):
                    engine.add_request(rid, p, params(req, i))
                t = time.monotonic()
                while time.monotonic() - t < float(req.get("after_s", 1.0)):
                    engine.step()
                engine.abort_request(ids)
                t = time.monotonic()
                while engine.has_unfinished_requests():
                    engine.step()
                outputs = [{"aborted": len(ids), "seconds": time.monotonic() - t}]
            elif op == "batch":
                t = time.monotonic()
                outs = llm.generate(prompts, [params(req, i) for i in range(len(prompts))], use_tqdm=False)
                took = time.monotonic() - t
                outputs = [result(o, took) for o in outs]
            else:
                raise ValueError("unknown op %r" % op)
            print(json.dumps({"outputs": outputs}), file=proto)
        except Exception as e:  # report, keep serving
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}), file=proto)
    proto.close()


if __name__ == "__main__":
    main()
