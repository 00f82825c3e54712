"""vLLM KV connector on kvtier: a prompt's KV blocks computed once, by any
engine, are loaded by every other engine instead of recomputed, and a
prefill engine hands its blocks to a decode engine.

Load it with (see docs/connectors.md)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "kvtier://10.0.0.1:6379"}}'

``kv_role`` is ``kv_both`` (load and save), ``kv_producer`` (save only: a
prefill engine) or ``kv_consumer`` (load only: a decode engine). The
connector is a best-effort cache: a block that cannot be loaded is
recomputed (it sets vLLM's ``kv_load_failure_policy`` to ``recompute``
unless its own ``load_failure_policy`` option says ``fail``).

What each step sends:

=====================================  ==========================================
scheduler: ``get_num_new_matched_``    one ``PREFIXLEN n k1..kn HOLD ms`` over the
``tokens`` (lookup)                    prompt's full blocks (every TP rank's keys),
                                       on a thread of its own: the scheduler waits
                                       at most 5 ms a step, the lookup at most
                                       ``lookup_timeout`` in all
worker, between steps (load)           one ``MGETPREFIX`` per request, each value
                                       received straight into the paged KV cache
                                       (``BLOCK ms MIN 1`` when a consumer waits
                                       for a producer); the request computes only
                                       once every rank's load is done
worker: ``wait_for_save`` (save)       one ``MSETBLOCK ... CHAIN PARENT p`` of the
                                       blocks completed this step, off the forward
                                       path, sent from the KV cache's own memory
=====================================  ==========================================

Nothing is sent per block. Keys are ``kvtier:vllm:<layout>:<rank>:<hash>``:
``<layout>`` digests everything that shapes a block's bytes besides its
tokens (the model's configuration and a fingerprint of its weight files,
dtype, KV cache dtype, block size, the attention backend and its cache
layout, the layers, KV heads, head size and the TP size: engines that could
not share blocks never share keys), ``<rank>`` is the TP rank (each rank
stores its heads) and ``<hash>`` chains the block's tokens to its prefix
(blake2b of the parent's hash, the token ids and what vLLM's own prefix
cache adds per block: LoRA name and path, cache salt, multimodal inputs at
their positions, prompt embeddings). A value is the 32-byte header of
``kvtier._codec`` (magic ``KVTV``), a 16-byte layout digest, then the
block's bytes of every layer, in layer order. A value whose header does not
match its key or the layout is a miss: the block and the ones after it are
recomputed, never loaded.

A prompt's final partial block is stored too (``PARTIAL``, under a key of
its own) once the prompt is computed, and loaded after the full blocks: a
hit on it leaves vLLM only the last token to compute. Counts (lookups,
hits, loads, saves, bytes, seconds, failures by cause, dropped saves) go
to vLLM's stats and Prometheus metrics (``kvtier.vllm.metrics``).

P/D hand-off: the producer's request output carries ``kv_transfer_params``
``{"do_remote_prefill": true, "kvtier_blocks": n, "kvtier_tail": t,
"kvtier_layout": l}``; a
request sent to the consumer with those params (or with ``do_remote_prefill``
alone, while the producer is still prefilling) is loaded asynchronously with
``MGETPREFIX ... BLOCK``: its decode starts as soon as the producer's blocks
land, and blocks that do not land within ``pd_wait_ms`` are recomputed (at
once when the producer's layout is not the consumer's, or the producer
marked the next block ``:gone``: refused by the tier or dropped).

A KV cache in host memory (vLLM's CPU backend) is read and written in
place: values are sent from and received into the cache tensors
themselves. A cache on a GPU goes through pinned staging buffers on a CUDA
stream of the connector's own (kvtier/vllm/staging.py). Supported: attention
models with one KV cache group, tensor parallelism; not: pipeline
parallelism, hybrid (Mamba) models, speculative tokens past the accepted
ones.
"""

from __future__ import annotations

from .connector import KvtierConnector
from .keys import HEADER_LEN, BlockExtras, KeyScheme, block_key, chain_root, extend_chain, tail_hash
from .metadata import KvtierMetadata, KvtierWorkerReport, LoadSpec, SaveSpec, gone_key
from .options import DEFAULTS, IN_FLIGHT_S, MAGIC, Options
from .worker import WorkerSide

__all__ = [
    "DEFAULTS",
    "HEADER_LEN",
    "IN_FLIGHT_S",
    "MAGIC",
    "BlockExtras",
    "KeyScheme",
    "KvtierConnector",
    "KvtierMetadata",
    "KvtierWorkerReport",
    "LoadSpec",
    "Options",
    "SaveSpec",
    "WorkerSide",
    "block_key",
    "chain_root",
    "extend_chain",
    "gone_key",
    "tail_hash",
]
