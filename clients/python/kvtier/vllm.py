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
to vLLM's stats and Prometheus metrics (``kvtier._vllm_metrics``).

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
stream of the connector's own (kvtier/_staging.py). Supported: attention
models with one KV cache group, tensor parallelism; not: pipeline
parallelism, hybrid (Mamba) models, speculative tokens past the accepted
ones.
"""

from __future__ import annotations

import array
import hashlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from . import _codec
from ._codec import CheckedSink, Codec, Header, Views
from ._identity import attention_layout, model_fingerprint
from ._plugin import Health, truthy
from ._staging import Staged, StagingPool, block_regions, physical_layout
from ._vllm_metrics import Counters, KvtierPromMetrics, KvtierStats
from .client import Client
from .errors import KvtierError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under vLLM's logger, so that its handlers and level apply.
logger = logging.getLogger("vllm.kvtier")

MAGIC = b"KVTV"
#: A block this engine handed to its save thread this recently and that a
#: lookup does not find yet is waited for (its save is on the way), at most
#: IN_FLIGHT_WAIT_MS; saved longer ago and not found, it was evicted.
IN_FLIGHT_S = 5.0
#: How long an engine step with nothing to compute waits for an
#: asynchronous load to end before vLLM steps again (it returns as soon as
#: one ends; on two cores, steps taken meanwhile took the CPU from the load).
IDLE_WAIT_S = 0.02
#: The longest the scheduler waits for a lookup in one call: past it the
#: request is asked about again the next step (vLLM's ``None``).
LOOKUP_POLL_S = 0.005
#: A consumer waiting for blocks polls this often whether its request was
#: aborted.
WAIT_POLL_MS = 200
IN_FLIGHT_WAIT_MS = 2000
RECENT_SAVES_KEPT = 1 << 16

#: ``kv_connector_extra_config`` keys and their defaults.
DEFAULTS: dict[str, Any] = {
    # kvtier://host:port[,host:port...] (kvtiers:// for TLS).
    "url": "kvtier://127.0.0.1:6379",
    # Names the model's weights in the keys instead of a fingerprint of its
    # weight files: engines that set the same id share blocks whatever they
    # loaded (the model's configuration is keyed either way).
    "model_id": None,
    # How the weight files are fingerprinted: "sampled" (sizes and 64
    # slices of each file), "full" (every byte, read once at start) or
    # "none" (the model's name and revision stand for its weights).
    "weights": "sampled",
    # What vLLM does with a block that cannot be loaded: "recompute" (the
    # connector's default, whatever kv_load_failure_policy says) or "fail"
    # (the request fails).
    "load_failure_policy": "recompute",
    # How long a lookup holds the blocks it counted for the load (0: no hold).
    "hold_ms": 5000,
    # A lookup's whole budget (s): the scheduler never blocks on it (it
    # waits at most LOOKUP_POLL_S per call and asks again the next step);
    # past the budget the request computes and the server is skipped for
    # retry_after.
    "lookup_timeout": 0.25,
    # Socket timeout of loads and saves (s).
    "socket_timeout": 30.0,
    "connect_timeout": 2.0,
    # After a failed call, lookups and saves are skipped this long (s), so a
    # server that is down costs nothing per request.
    "retry_after": 2.0,
    # How long a consumer waits for a producer's blocks (ms).
    "pd_wait_ms": 30000,
    # Also store blocks completed during decode (multi-turn reuse).
    "save_decode": True,
    # Writers add a CRC32 of each block; readers check blocks that have one.
    "checksum": False,
    # Most bytes of blocks waiting to be saved (MB; 0: a quarter of the KV
    # cache). A finished request keeps its blocks until they are saved, so a
    # slow tier would otherwise take the engine's KV capacity: past it new
    # saves are dropped and counted.
    "save_backlog_mb": 0,
    # Connections a large load or save is spread over.
    "stripes": 8,
    # Blocks through pinned host buffers: "auto" (a cache outside host
    # memory, a GPU's), "on" (also a CPU cache: the GPU's code path), "off"
    # (a cache outside host memory is refused).
    "staging": "auto",
    # The staging buffers (MB; 0: four steps' worth of blocks).
    "staging_mb": 0,
    # Log every save and load with its wall-clock times (INFO).
    "log_transfers": False,
}


@dataclass(frozen=True)
class Options:
    """The connector's settings (``kv_connector_extra_config``)."""

    url: str
    model_id: Optional[str]
    weights: str
    load_failure_policy: str
    hold_ms: int
    lookup_timeout: float
    socket_timeout: float
    connect_timeout: float
    retry_after: float
    pd_wait_ms: int
    save_decode: bool
    checksum: bool
    save_backlog_mb: int
    stripes: int
    staging: str
    staging_mb: int
    log_transfers: bool

    @classmethod
    def of(cls, extra: dict[str, Any]) -> Options:
        unknown = sorted(set(extra) - set(DEFAULTS))
        if unknown:
            raise ValueError("unknown kvtier connector option(s): %s" % ", ".join(unknown))
        o = {**DEFAULTS, **extra}
        if o["weights"] not in ("sampled", "full", "none"):
            raise ValueError(
                "kvtier connector option weights: 'sampled', 'full' or 'none', not %r" % o["weights"]
            )
        if o["load_failure_policy"] not in ("recompute", "fail"):
            raise ValueError(
                "kvtier connector option load_failure_policy: 'recompute' or 'fail', not %r"
                % o["load_failure_policy"]
            )
        if o["staging"] not in ("auto", "on", "off"):
            raise ValueError("kvtier connector option staging: 'auto', 'on' or 'off', not %r" % o["staging"])
        return cls(
            url=str(o["url"]),
            model_id=None if o["model_id"] is None else str(o["model_id"]),
            weights=str(o["weights"]),
            load_failure_policy=str(o["load_failure_policy"]),
            hold_ms=int(o["hold_ms"]),
            lookup_timeout=float(o["lookup_timeout"]),
            socket_timeout=float(o["socket_timeout"]),
            connect_timeout=float(o["connect_timeout"]),
            retry_after=float(o["retry_after"]),
            pd_wait_ms=int(o["pd_wait_ms"]),
            save_decode=truthy(o["save_decode"]),
            checksum=truthy(o["checksum"]),
            save_backlog_mb=int(o["save_backlog_mb"]),
            stripes=int(o["stripes"]),
            staging=str(o["staging"]),
            staging_mb=int(o["staging_mb"]),
            log_transfers=truthy(o["log_transfers"]),
        )


# -- keys ---------------------------------------------------------------------------


#: The part of a value's header after the fixed one: the layout digest.
HEADER_LEN = _codec.FIXED.size + 16


class KeyScheme:
    """Block keys: a layout digest, the TP rank and a chained block hash.

    The layout names everything that shapes a block's bytes besides its
    tokens: the model's identity (its configuration and weights, not its
    name or path), dtype, KV cache dtype and scales, block size, the
    attention backend and its cache layout, the layers in order, KV heads,
    head size and TP size. The scheduler and every worker build it from the
    same configuration (:meth:`from_vllm`), so they name the same blocks.
    """

    def __init__(
        self,
        *,
        model_id: str,
        dtype: str,
        cache_dtype: str,
        block_size: int,
        layers: int,
        kv_heads: int,
        head_size: int,
        tp: int,
        kv_layout: str,
        layer_names: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        self.block_size = block_size
        self.tp = tp
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_size = head_size
        fields = (
            "v2",
            model_id,
            dtype,
            cache_dtype,
            block_size,
            layers,
            kv_heads,
            head_size,
            tp,
            kv_layout,
            ",".join(layer_names),
            *extra,
        )
        self.descriptor = "|".join(str(x) for x in fields)
        self.layout = hashlib.blake2b(self.descriptor.encode(), digest_size=8).hexdigest()
        #: Every value's header carries it and a load checks it: a key that
        #: collides across layouts is a miss, never another layout's bytes.
        self.layout_digest = hashlib.blake2b(
            self.descriptor.encode(), digest_size=16, person=b"kvtier-layout"
        ).digest()

    @classmethod
    def from_vllm(
        cls, vllm_config: VllmConfig, options: Options, kv_cache_config: Optional[KVCacheConfig] = None
    ) -> KeyScheme:
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        cache = vllm_config.cache_config
        if parallel.pipeline_parallel_size > 1:
            raise ValueError("the kvtier connector does not support pipeline parallelism")
        attn_type = str(getattr(model, "attn_type", "decoder"))
        if attn_type != "decoder" or not getattr(model.hf_text_config, "is_causal", True):
            # A block's KV would depend on the tokens after it: vLLM itself
            # turns prefix caching off for these.
            raise ValueError(
                "kvtier.vllm stores the KV of causal decoder models only; %s is %s"
                % (model.model, attn_type if attn_type != "decoder" else "not causal")
            )
        head_size = model.get_head_size()
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
        layer_names = list(groups[0].layer_names) if groups else []
        return cls(
            model_id=model_fingerprint(model, options.weights, options.model_id),
            dtype=str(model.dtype).replace("torch.", ""),
            cache_dtype=str(cache.cache_dtype),
            block_size=cache.block_size,
            layers=model.get_num_layers(parallel),
            kv_heads=model.get_num_kv_heads(parallel),
            head_size=head_size,
            tp=parallel.tensor_parallel_size,
            kv_layout=attention_layout(vllm_config, head_size),
            layer_names=layer_names,
            extra=(
                "scales=%s" % getattr(cache, "calculate_kv_scales", None),
                "skip=%s" % ",".join(getattr(cache, "kv_cache_dtype_skip_layers", None) or ()),
            ),
        )

    def extend(
        self,
        hashes: list[str],
        root: bytes,
        tokens: Sequence[int],
        blocks: int,
        extras: Optional[Callable[[int], bytes]] = None,
    ) -> None:
        """Appends the hashes of full blocks ``len(hashes)..blocks`` of ``tokens``."""
        extend_chain(hashes, root, tokens, blocks, self.block_size, extras)

    def key(self, rank: int, block_hash: str) -> str:
        return block_key(self.layout, rank, block_hash)

    def lookup_keys(self, hashes: Sequence[str]) -> list[str]:
        """Every rank's key of each block, block by block: PREFIXLEN over
        them, divided by the TP size, is the blocks every rank can load."""
        return [self.key(r, h) for h in hashes for r in range(self.tp)]


class BlockExtras:
    """What besides its tokens makes a block of one request different KV,
    block by block, as vLLM's own prefix cache keys it: the LoRA adapter's
    name and path, the cache salt (first block), each multimodal input in
    the blocks it covers at its offset, and the prompt embeddings of each
    block. Called once per block, in order."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.needed = bool(
            getattr(request, "lora_request", None)
            or getattr(request, "cache_salt", None)
            or getattr(request, "mm_features", None)
            or getattr(request, "prompt_embeds", None) is not None
        )
        self._mm_index = 0
        self._keys: Optional[Callable[..., tuple[Any, int]]] = None
        if self.needed:
            try:
                from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

                self._keys = generate_block_hash_extra_keys
            except ImportError:
                self._keys = None

    @property
    def keyable(self) -> bool:
        """False when the request needs extra keys this vLLM cannot give:
        it is neither looked up nor stored."""
        return not self.needed or self._keys is not None

    def __call__(self, block: int, block_size: int) -> bytes:
        if not self.needed or self._keys is None:
            return b""
        keys, self._mm_index = self._keys(
            self.request, block * block_size, (block + 1) * block_size, self._mm_index
        )
        return b"" if keys is None else repr(keys).encode()

    def tail(self, start: int, end: int) -> Optional[bytes]:
        """The extras of the partial block of tokens ``start..end``; None
        when a multimodal input may fall in it (their keys follow the
        blocks in order: no partial block is stored then)."""
        if not self.needed:
            return b""
        if self._keys is None or getattr(self.request, "mm_features", None):
            return None
        keys, _ = self._keys(self.request, start, end, 0)
        return b"" if keys is None else repr(keys).encode()


def chain_root(layout: str) -> bytes:
    """The hash a chain starts from (what else makes the same tokens other
    KV is folded into each block's hash: :class:`BlockExtras`)."""
    return hashlib.blake2b(layout.encode(), digest_size=16).digest()


def extend_chain(
    hashes: list[str],
    root: bytes,
    tokens: Sequence[int],
    blocks: int,
    block_size: int,
    extras: Optional[Callable[[int], bytes]] = None,
) -> None:
    """Appends to ``hashes`` (hex) the hashes of full blocks
    ``len(hashes)..blocks`` of ``tokens``: each the blake2b of its parent's
    hash, its token ids (int64, little-endian) and ``extras(block)`` when
    that is not empty."""
    parent = bytes.fromhex(hashes[-1]) if hashes else root
    for b in range(len(hashes), blocks):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(array.array("q", tokens[b * block_size : (b + 1) * block_size]).tobytes())
        extra = extras(b) if extras is not None else b""
        if extra:
            h.update(b"\0extra\0" + extra)
        parent = h.digest()
        hashes.append(parent.hex())


def tail_hash(parent: bytes, tokens: Sequence[int], extra: bytes = b"") -> str:
    """The hash of a prompt's final partial block (``tokens``, fewer than a
    block, and its extras) after the block hashed ``parent``: never a full
    block's hash."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"\0partial\0")
    h.update(array.array("q", tokens).tobytes())
    if extra:
        h.update(b"\0extra\0" + extra)
    return h.hexdigest()


def block_key(layout: str, rank: int, block_hash: str) -> str:
    """The kvtier key of one block of one TP rank."""
    return "kvtier:vllm:%s:%d:%s" % (layout, rank, block_hash)


# -- metadata (scheduler -> workers) ----------------------------------------------------


@dataclass
class LoadSpec:
    """Blocks of one request to read into the KV cache, between steps."""

    req_id: str
    hashes: list[str]
    block_ids: list[int]
    #: Wait for missing blocks this long (a consumer waiting for a producer,
    #: or blocks this engine is still saving); None: load what is there.
    wait_ms: Optional[int] = None


@dataclass
class SaveSpec:
    """Blocks of one request completed this step, to store as a chain."""

    req_id: str
    hashes: list[str]
    block_ids: list[int]
    parent: Optional[str]
    #: The last block is the prompt's final partial block (``PARTIAL``).
    partial: bool = False


@dataclass
class KvtierMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """What the workers do this step."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    #: Requests that finished (aborted) while their load was running: the
    #: workers stop waiting for their blocks.
    cancelled: list[str] = field(default_factory=list)


@dataclass
class KvtierWorkerReport(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """What the workers tell the scheduler after a step: blocks (hashes,
    by request) a save did not store (refused, dropped under backlog,
    skipped or failed while the tier was down), so that the scheduler
    neither waits for them nor counts them as stored."""

    not_stored: dict[str, list[str]] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KvtierWorkerReport):
            for req_id, hashes in other.not_stored.items():
                mine = self.not_stored.setdefault(req_id, [])
                mine.extend(h for h in hashes if h not in mine)
        return self


def gone_key(key: str) -> str:
    """The marker a producer leaves when a block it was to store will not
    come (refused, or dropped under backlog): a consumer waiting for that
    block stops waiting."""
    return key + ":gone"


# -- the connector ----------------------------------------------------------------------


class KvtierConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM ``KVConnectorBase_V1`` on kvtier's block dialect (see the module doc)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: Optional[KVCacheConfig] = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self.options = Options.of(dict(transfer.kv_connector_extra_config or {}))
        self.keys = KeyScheme.from_vllm(vllm_config, self.options, kv_cache_config)
        self.loads = transfer.kv_role in ("kv_both", "kv_consumer")
        self.saves = transfer.kv_role in ("kv_both", "kv_producer")
        self._scheduler: Optional[_SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            # vLLM's scheduler reads the policy after building its connector.
            policy = self.options.load_failure_policy
            if getattr(transfer, "kv_load_failure_policy", policy) != policy:
                logger.info(
                    "kvtier: kv_load_failure_policy %r -> %r: a block that cannot be loaded is %s",
                    transfer.kv_load_failure_policy,
                    policy,
                    "computed instead" if policy == "recompute" else "a failed request",
                )
                transfer.kv_load_failure_policy = policy
            self._scheduler = _SchedulerSide(self)
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
            self._worker = WorkerSide(self.options, self.keys, get_tensor_model_parallel_rank(), blocks)
            tokens = int(getattr(vllm_config.scheduler_config, "max_num_batched_tokens", 0) or 0)
            if tokens:
                self._worker.step_blocks = -(-tokens // self.keys.block_size)
        logger.info(
            "kvtier connector (%s, %s) for %s: a best-effort cache (a lost or damaged block is %s, "
            "a lookup costs the scheduler at most %.0f ms a step); layout %s: %s",
            transfer.kv_role,
            role.name.lower(),
            self.options.url,
            "recomputed" if self.options.load_failure_policy == "recompute" else "a failed request",
            LOOKUP_POLL_S * 1000,
            self.keys.layout,
            self.keys.descriptor,
        )

    @property
    def requires_kv_delivery(self) -> bool:
        """A best-effort cache: a save dropped is a future miss, never lost work."""
        return False

    # -- scheduler side ---------------------------------------------------------

    def _sched(self) -> _SchedulerSide:
        assert self._scheduler is not None, "a scheduler-side call on a worker"
        return self._scheduler

    def _work(self) -> WorkerSide:
        assert self._worker is not None, "a worker-side call on the scheduler"
        return self._worker

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[Optional[int], bool]:
        return self._sched().lookup(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._sched().allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvtierMetadata:
        return self._sched().build(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._sched().output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, Optional[dict[str, Any]]]:
        return self._sched().finished(request)

    # -- worker side ------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._work().register(kv_caches, self._backend(kv_caches))

    def _backend(self, kv_caches: dict[str, torch.Tensor]) -> str:
        """The attention backends the engine runs the cached layers with, as
        it reports them (the one it chose, not the one configured)."""
        layers = getattr(self._vllm_config.compilation_config, "static_forward_context", None) or {}
        names = set()
        for name in kv_caches:
            backend = getattr(layers.get(name), "attn_backend", None)
            try:
                names.add(str(backend.get_name()) if backend is not None else "?")
            except Exception:  # a doubt is a layout of its own
                names.add("?%s" % getattr(backend, "__name__", type(backend).__name__))
        return ",".join(sorted(names)) or "-"

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        # A step without a forward (attn_metadata None) is the engine
        # looping while requests wait for their loads.
        idle = getattr(forward_context, "attn_metadata", None) is None
        self._work().start_loads(self._get_connector_metadata(), idle=idle)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads run between steps: a request computes only once its blocks
        # are all in place.
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        # Blocks are sent whole once the forward wrote every layer
        # (wait_for_save).
        return

    def wait_for_save(self) -> None:
        self._work().submit_saves(self._get_connector_metadata())

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, KvtierMetadata) and kv_connector_metadata.preempted:
            self._work().wait_saves(kv_connector_metadata.preempted)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        return self._work().finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().take_load_errors()

    def build_connector_worker_meta(self) -> Optional[KvtierWorkerReport]:
        return self._work().report()

    # -- both sides ---------------------------------------------------------------

    def get_kv_connector_stats(self) -> Optional[KvtierStats]:
        side: Union[WorkerSide, _SchedulerSide, None] = self._worker or self._scheduler
        return None if side is None else side.counters.take()

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None) -> KvtierStats:
        return KvtierStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvtierPromMetrics:
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def has_pending_block_frees(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_frees()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()


# -- the scheduler's half ---------------------------------------------------------------------


@dataclass
class _Tracked:
    """What the scheduler knows of one request."""

    request: Request
    extras: BlockExtras
    root: bytes
    hashes: list[str] = field(default_factory=list)
    #: Leading full blocks known to be in the tier (found by the lookup,
    #: loaded, or saved): saves start after them.
    stored: int = 0
    #: The prompt's final partial block: (its end in tokens, its hash), and
    #: whether it is in the tier (found, loaded or handed to a save).
    tail: Optional[tuple[int, str]] = None
    tail_stored: bool = False
    #: What the last lookup asked for: full blocks, then the partial one.
    lookup_hashes: list[str] = field(default_factory=list)
    #: The lookup in flight, and when it was sent (monotonic).
    lookup: Optional[Future[int]] = None
    lookup_sent: float = 0.0
    #: A load was planned (blocks [start, start + count) of the request).
    load: Optional[LoadSpec] = None
    load_start: int = 0
    #: The workers are loading its blocks (until they report it).
    loading: bool = False
    #: How many blocks the consumer waits for (P/D), when it waits.
    wait_blocks: int = 0
    #: Saves were handed to the workers: its blocks are freed only once they
    #: report the saves done.
    saved_any: bool = False
    lookup_local: int = 0


class _SchedulerSide:
    def __init__(self, connector: KvtierConnector) -> None:
        self.c = connector
        o = connector.options
        self.keys = connector.keys
        # The lookup's socket gives up with its budget: a stalled server
        # frees the lookup thread as the scheduler stops waiting for it.
        self.client = Client.from_url(
            o.url,
            socket_timeout=o.lookup_timeout,
            connect_timeout=min(o.connect_timeout, o.lookup_timeout),
            stripes=1,
        )
        self.lookups = ThreadPoolExecutor(2, thread_name_prefix="kvtier-lookup")
        self.health = Health(o.retry_after, logger)
        self.requests: dict[str, _Tracked] = {}
        self.pending_loads: list[LoadSpec] = []
        self.cancelled: list[str] = []
        # Finished requests whose blocks wait for their saves.
        self.sending: set[str] = set()
        self.counters = Counters()
        # Blocks this engine handed to its save thread lately, by hash: a
        # lookup that misses one of them waits for it (its save is on the
        # way) rather than computing it again.
        self.recent_saves: OrderedDict[str, float] = OrderedDict()

    def close(self) -> None:
        self.lookups.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def _track(self, request: Request) -> _Tracked:
        t = self.requests.get(request.request_id)
        if t is None or t.request is not request:
            t = _Tracked(request, BlockExtras(request), chain_root(self.keys.layout))
            self.requests[request.request_id] = t
        return t

    def _extend(self, t: _Tracked, tokens: Sequence[int], blocks: int) -> None:
        """Hashes ``t``'s first ``blocks`` full blocks (each once)."""
        if len(t.hashes) < blocks:
            bs = self.keys.block_size
            self.keys.extend(t.hashes, t.root, tokens, blocks, lambda b: t.extras(b, bs))

    def _tail(self, t: _Tracked, tokens: Sequence[int], end: int) -> Optional[str]:
        """The hash of the partial block that ends at token ``end`` (None
        when ``end`` ends a block, or multimodal inputs may fall in it)."""
        bs = self.keys.block_size
        full = end // bs
        if end == full * bs:
            return None
        if t.tail is None or t.tail[0] != end:
            extra = t.extras.tail(full * bs, end)
            if extra is None:
                return None
            self._extend(t, tokens, full)
            parent = bytes.fromhex(t.hashes[full - 1]) if full else t.root
            t.tail = (end, tail_hash(parent, tokens[full * bs : end], extra))
        return t.tail[1]

    def _found(self, t: _Tracked, hashes: list[str]) -> Optional[int]:
        """How many of ``hashes`` every rank can load, from a lookup that
        runs on a thread of its own; None while it is still running (the
        scheduler asks again next step), 0 past its budget."""
        budget = self.c.options.lookup_timeout
        if t.lookup is None:
            if not self.health.ok():
                return 0
            hold = self.c.options.hold_ms if self.c.loads else 0
            t.lookup = self.lookups.submit(
                self.client.prefix_len, self.keys.lookup_keys(hashes), hold_ms=hold or None
            )
            t.lookup_sent = time.monotonic()
            self.counters.add(lookups=1)
        lookup = t.lookup
        left = t.lookup_sent + budget - time.monotonic()
        if not lookup.done():
            wait_futures([lookup], timeout=max(0.0, min(LOOKUP_POLL_S, left)))
        if not lookup.done():
            if left > 0:
                return None
            # The server did not answer within the budget: this request
            # computes, and the next ones do not ask for retry_after.
            t.lookup = None
            self.health.failed("lookup", TimeoutError("no answer within %.0f ms" % (budget * 1000)))
            self.counters.add(lookup_timeouts=1)
            return 0
        t.lookup = None
        try:
            return lookup.result() // self.keys.tp
        except (KvtierError, OSError) as e:
            self.health.failed("lookup", e)
            self.counters.add(lookup_errors=1)
            return 0

    def has_pending_frees(self) -> bool:
        """Blocks of finished requests that their saves will release."""
        return bool(self.sending)

    def lookup(self, request: Request, num_computed_tokens: int) -> tuple[Optional[int], bool]:
        t = self._track(request)
        if not t.extras.keyable:
            return 0, False
        bs = self.keys.block_size
        # Every full block and the final partial one: after a load between
        # steps vLLM computes the last token again itself.
        tokens = request.all_token_ids
        full = request.num_tokens // bs
        self._extend(t, tokens, full)
        hashes = t.hashes[:full]
        tail = self._tail(t, tokens, request.num_tokens)
        if tail is not None:
            hashes.append(tail)
        if not hashes:
            return 0, False
        found = self._found(t, hashes)
        if found is None:
            return None, False

        def count(blocks: int) -> int:
            """Tokens in the first ``blocks`` of ``hashes``."""
            return request.num_tokens if blocks > full else blocks * bs

        self.counters.add(lookup_hit_blocks=found, lookup_miss_blocks=len(hashes) - found)
        t.stored = min(found, full)
        t.tail_stored = found > full
        t.lookup_hashes = hashes
        t.lookup_local = num_computed_tokens
        # A new attempt (the first, or after a load failed): its own load.
        t.load = None
        if not self.c.loads:
            return 0, False
        local = num_computed_tokens // bs
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill") and self.health.ok():
            # A consumer: the producer's blocks may still be arriving.
            expected = self._expected(request, params, full, len(hashes))
            if expected > found and expected > local:
                t.wait_blocks = expected
                return count(expected) - local * bs, True
        # Blocks this engine is still saving: wait for them, briefly.
        coming = self._in_flight(hashes, found)
        if coming > found and coming > local and self.health.ok():
            t.wait_blocks = coming
            return count(coming) - local * bs, True
        t.wait_blocks = 0
        logger.debug(
            "kvtier: %s: %d of %d blocks found, %d local", request.request_id, found, len(hashes), local
        )
        if found <= local:
            return 0, False
        # Loaded between steps: no step computes on a block before every
        # rank's load of it succeeded, so nothing computed over a failed
        # load is ever stored.
        return count(found) - local * bs, True

    def _expected(self, request: Request, params: dict[str, Any], full: int, blocks: int) -> int:
        """How many of a consumer's ``blocks`` (``full`` ones, then the
        partial one) it waits for: what the producer says it stored, none if
        it stored them under another layout."""
        layout = params.get("kvtier_layout")
        if layout is not None and layout != self.keys.layout:
            logger.warning(
                "kvtier: %s: the producer stores blocks of layout %s, this engine reads %s (their "
                "models, dtypes, block sizes, attention backends or TP sizes differ): computed here",
                request.request_id,
                layout,
                self.keys.layout,
            )
            return 0
        if "kvtier_blocks" not in params:
            # Asked before the producer finished: every block, the partial
            # one too.
            return blocks
        expected = max(0, min(int(params["kvtier_blocks"]), full))
        if expected == full and blocks > full and params.get("kvtier_tail"):
            expected += 1
        return expected

    def _in_flight(self, hashes: Sequence[str], found: int) -> int:
        """``found`` extended over the blocks after it that this engine
        handed to its save thread within the last ``IN_FLIGHT_S`` seconds."""
        horizon = time.monotonic() - IN_FLIGHT_S
        while self.recent_saves and next(iter(self.recent_saves.values())) < horizon:
            self.recent_saves.popitem(last=False)
        n = found
        while n < len(hashes) and hashes[n] in self.recent_saves:
            n += 1
        return n

    def allocated(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        t = self.requests.get(request.request_id)
        if t is None or num_external_tokens <= 0 or t.load is not None:
            return
        bs = self.keys.block_size
        block_ids = blocks.get_block_ids()[0]
        start = t.lookup_local // bs
        count = -(-num_external_tokens // bs)  # the partial block too
        full = request.num_tokens // bs
        wait_ms = None
        if t.wait_blocks:
            params = request.kv_transfer_params or {}
            wait_ms = self.c.options.pd_wait_ms if params.get("do_remote_prefill") else IN_FLIGHT_WAIT_MS
        spec = LoadSpec(
            req_id=request.request_id,
            hashes=t.lookup_hashes[start : start + count],
            block_ids=list(block_ids[start : start + count]),
            wait_ms=wait_ms,
        )
        t.load, t.load_start, t.loading = spec, start, True
        t.stored = max(t.stored, min(start + count, full))
        t.tail_stored = t.tail_stored or start + count > full
        self.pending_loads.append(spec)

    def build(self, out: SchedulerOutput) -> KvtierMetadata:
        meta = KvtierMetadata(
            loads=self.pending_loads,
            preempted=sorted(out.preempted_req_ids or ()),
            cancelled=self.cancelled,
        )
        self.pending_loads, self.cancelled = [], []
        if not self.c.saves:
            return meta
        manager = self.c._kv_cache_manager
        scheduled = [r.req_id for r in out.scheduled_new_reqs] + list(out.scheduled_cached_reqs.req_ids)
        for req_id in scheduled:
            t = self.requests.get(req_id)
            if t is None or manager is None or not t.extras.keyable:
                continue
            spec = self._save_spec(t, out, manager)
            if spec is not None:
                meta.saves.append(spec)
                t.saved_any = True
                now = time.monotonic()
                for h in spec.hashes:
                    self.recent_saves[h] = now
                    self.recent_saves.move_to_end(h)
                while len(self.recent_saves) > RECENT_SAVES_KEPT:
                    self.recent_saves.popitem(last=False)
        return meta

    def _save_spec(self, t: _Tracked, out: SchedulerOutput, manager: Any) -> Optional[SaveSpec]:
        """The blocks of ``t`` this step completes that the tier lacks: full
        blocks, and the prompt's final partial block once the prompt is
        computed (a decode engine loads it instead of computing it)."""
        request = t.request
        req_id = request.request_id
        bs = self.keys.block_size
        tokens = request.all_token_ids
        # Tokens whose KV exists once this step ran (not speculative ones).
        spec_tokens = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
        done = request.num_computed_tokens + out.num_scheduled_tokens.get(req_id, 0) - spec_tokens
        if not self.c.options.save_decode:
            done = min(done, request.num_prompt_tokens)
        full = min(done, len(tokens)) // bs
        prompt_full = request.num_prompt_tokens // bs
        tail = None
        if not t.tail_stored and done >= request.num_prompt_tokens and full == prompt_full:
            tail = self._tail(t, tokens, request.num_prompt_tokens)
        if full <= t.stored and tail is None:
            return None
        block_ids = manager.get_block_ids(req_id)[0]
        full = min(full, len(block_ids))
        if tail is not None and len(block_ids) <= prompt_full:
            tail = None
        if full <= t.stored and tail is None:
            return None
        self._extend(t, tokens, full)
        start = min(t.stored, full)
        t.stored = full
        spec = SaveSpec(
            req_id=req_id,
            hashes=t.hashes[start:full],
            block_ids=list(block_ids[start:full]),
            parent=t.hashes[start - 1] if start else None,
        )
        if tail is not None:
            spec.hashes.append(tail)
            spec.block_ids.append(block_ids[prompt_full])
            spec.partial = True
            t.tail_stored = True
        return spec

    def output(self, connector_output: KVConnectorOutput) -> None:
        for req_id in connector_output.finished_recving or ():
            t = self.requests.get(req_id)
            if t is not None:
                t.loading = False
        self.sending.difference_update(connector_output.finished_sending or ())
        report = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(report, KvtierWorkerReport):
            self._not_stored(report.not_stored)
        bad = set(connector_output.invalid_block_ids or ())
        if not bad:
            return
        # Blocks that failed to load are recomputed: store them afterwards;
        # and if this engine was saving them, those saves did not land: a
        # lookup does not wait for them again.
        for t in self.requests.values():
            if t.load is None:
                continue
            for i, b in enumerate(t.load.block_ids):
                if b in bad:
                    t.stored = min(t.stored, t.load_start + i)
                    t.tail_stored = False
                    for h in t.load.hashes[i:]:
                        self.recent_saves.pop(h, None)
                    break

    def _not_stored(self, not_stored: dict[str, list[str]]) -> None:
        """Blocks a save did not store: a lookup does not wait for them, and
        a request still running saves them again from the first one."""
        for req_id, hashes in not_stored.items():
            for h in hashes:
                self.recent_saves.pop(h, None)
            t = self.requests.get(req_id)
            if t is None:
                continue
            lost = set(hashes)
            first = next((i for i, h in enumerate(t.hashes) if h in lost), None)
            if first is not None:
                t.stored = min(t.stored, first)
            if first is not None or (t.tail is not None and t.tail[1] in lost):
                t.tail_stored = False

    def finished(self, request: Request) -> tuple[bool, Optional[dict[str, Any]]]:
        t = self.requests.pop(request.request_id, None)
        if t is None:
            return False, None
        if t.saved_any:
            self.sending.add(request.request_id)
        if t.loading:
            # Aborted while its blocks load: vLLM keeps them until the
            # workers report the load, which they now stop waiting for.
            self.cancelled.append(request.request_id)
        params: Optional[dict[str, Any]] = None
        asked = request.kv_transfer_params or {}
        if self.c.saves and asked.get("do_remote_decode"):
            # What the consumer should load: the prompt's full blocks this
            # engine stored or found, under this layout.
            bs = self.keys.block_size
            blocks = min(request.num_prompt_tokens // bs, t.stored)
            params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "kvtier_blocks": blocks,
                # The prompt's final partial block follows them.
                "kvtier_tail": bool(t.tail_stored and blocks == request.num_prompt_tokens // bs),
                "kvtier_layout": self.keys.layout,
            }
        return t.saved_any, params


# -- the workers' half -------------------------------------------------------------------------


class _KvCache:
    """The paged KV cache as bytes: each block is its regions in layer order
    (a value is their concatenation), read and written in place in host
    memory, or through a pool of pinned staging buffers (kvtier/_staging.py)."""

    def __init__(
        self,
        kv_caches: dict[str, torch.Tensor],
        num_blocks: int,
        staging: str,
        staging_bytes: int = 0,
        default_slots: int = 256,
    ) -> None:
        self.regions: list[torch.Tensor] = []
        layouts: set[str] = set()
        devices = set()
        for name, t in kv_caches.items():
            self.regions.extend(block_regions(name, t, num_blocks))
            layouts.add(physical_layout(t, num_blocks))
            devices.add(t.device)
        if not self.regions:
            raise ValueError("no KV cache layers to read or write")
        if len(devices) != 1:
            raise ValueError(
                "kvtier.vllm: the KV cache is on several devices: %s" % sorted(map(str, devices))
            )
        device = devices.pop()
        self.region_bytes = [int(r.shape[1]) for r in self.regions]
        self.block_bytes = sum(self.region_bytes)
        #: Where the bytes are: device kind and each layer's physical order.
        self.layout = "%s|%s" % (device.type, ";".join(sorted(layouts)))
        self.pool: Optional[StagingPool] = None
        self.host: list[Any] = []
        if device.type == "cpu" and staging != "on":
            self.host = [r.numpy() for r in self.regions]
        elif staging == "off":
            raise ValueError(
                "kvtier.vllm: the KV cache is on %s and staging is off (staging: auto moves blocks "
                "through pinned host buffers)" % device
            )
        else:
            # Staging buffers of staging_bytes, else default_slots blocks.
            slots = staging_bytes // self.block_bytes if staging_bytes else default_slots
            self.pool = StagingPool(self.regions, max(1, min(slots, num_blocks)))
        #: Most blocks one load moves at a time.
        self.chunk = max(1, self.pool.slots // 2) if self.pool is not None else 1 << 30

    def views(self, block_id: int) -> list[memoryview]:
        """A block's regions in host memory (a cache read in place)."""
        return [memoryview(layer[block_id]) for layer in self.host]

    def blocks(self, block_ids: Sequence[int], gather: bool, timeout: Optional[float]) -> Optional[_Blocks]:
        """Host memory for ``block_ids``: the cache itself, or staging slots
        (holding the blocks' bytes once ready when ``gather``); None when
        the pool has no room within ``timeout`` (None: at once)."""
        if self.pool is None:
            return _Blocks(self, list(block_ids), None)
        staged = self.pool.take(len(block_ids), timeout)
        if staged is None:
            return None
        if gather:
            self.pool.gather(staged, block_ids)
        return _Blocks(self, list(block_ids), staged)


class _Blocks:
    """Some blocks of the cache in host memory: block ``i`` is ``views(i)``."""

    def __init__(self, cache: _KvCache, block_ids: list[int], staged: Optional[Staged]) -> None:
        self.cache = cache
        self.block_ids = block_ids
        self.staged = staged

    def views(self, i: int) -> list[memoryview]:
        if self.staged is None:
            return self.cache.views(self.block_ids[i])
        return self.staged.views(i)

    def ready(self) -> None:
        """Returns once the blocks' bytes are in host memory (a save)."""
        if self.staged is not None:
            self.staged.ready()

    def commit(self, count: int) -> None:
        """The first ``count`` blocks received go into the cache (a load)."""
        if self.staged is not None and self.cache.pool is not None:
            self.cache.pool.scatter(self.staged, count, self.block_ids)

    def release(self) -> None:
        if self.staged is not None:
            self.staged.release()
            self.staged = None


class WorkerSide:
    """The connector's half in each worker: one TP rank's loads into and
    saves from its KV cache. (Built by :class:`KvtierConnector`; the
    benchmarks drive it directly.)"""

    def __init__(self, options: Options, keys: KeyScheme, rank: int, num_blocks: int = 0) -> None:
        o = options
        self.options = options
        self.keys = keys
        self.rank = rank
        self.num_blocks = num_blocks
        self.client = Client.from_url(
            o.url, socket_timeout=o.socket_timeout, connect_timeout=o.connect_timeout, stripes=o.stripes
        )
        self.health = Health(o.retry_after, logger)
        self.codec = Codec(MAGIC, HEADER_LEN - _codec.FIXED.size, o.checksum, logger)
        self.cache: Optional[_KvCache] = None
        #: The header's layout digest: the key's layout, where the bytes are
        #: in the cache and the attention backend the engine runs (register).
        self.layout_digest = keys.layout_digest
        #: Blocks one step may compute (sizes the staging pool).
        self.step_blocks = 64
        self.lock = threading.Lock()
        self.load_errors: set[int] = set()
        # Saves run in order on one thread (a chain's parent goes first).
        # (A job: the spec, each block's buffers, the bytes it holds.)
        self.save_queue: queue.Queue[Optional[tuple[SaveSpec, _Blocks, int]]] = queue.Queue()
        self.saves_pending: dict[str, int] = {}
        self.saved_reqs: set[str] = set()
        self.finishing: set[str] = set()
        self.saver = threading.Thread(target=self._save_loop, name="kvtier-save", daemon=True)
        self.saver.start()
        self.loaders = ThreadPoolExecutor(4, thread_name_prefix="kvtier-load")
        self.async_loads: dict[str, Future[None]] = {}
        self.cancels: dict[str, threading.Event] = {}
        self.saves_done = threading.Condition(self.lock)
        self.done_recving: set[str] = set()
        self.load_done = threading.Event()
        self.idle_step = False
        self.counters = Counters()
        #: Bytes of blocks handed to the save thread and not yet saved, and
        #: the most there may be (set by register).
        self.backlog = 0
        self.backlog_max = o.save_backlog_mb << 20
        self.not_stored: dict[str, list[str]] = {}
        # Markers for blocks that will not come, written off the save thread.
        self.notices = ThreadPoolExecutor(1, thread_name_prefix="kvtier-notice")

    @property
    def stats(self) -> dict[str, float]:
        """Totals since start (:data:`kvtier._vllm_metrics.COUNTERS`)."""
        return self.counters.totals

    def close(self) -> None:
        # Saves still queued are sent, at most one socket timeout long.
        self.save_queue.put(None)
        self.saver.join(timeout=self.options.socket_timeout)
        self.loaders.shutdown(wait=False, cancel_futures=True)
        self.notices.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def register(self, kv_caches: dict[str, torch.Tensor], backend: str = "-") -> None:
        if not self.num_blocks:
            self.num_blocks = int(next(iter(kv_caches.values())).shape[0])
        o = self.options
        self.cache = _KvCache(kv_caches, self.num_blocks, o.staging, o.staging_mb << 20, 4 * self.step_blocks)
        if not self.backlog_max:
            self.backlog_max = self.num_blocks * self.cache.block_bytes // 4
        self.layout_digest = hashlib.blake2b(
            b"%s|%s|%s" % (self.keys.layout_digest, self.cache.layout.encode(), backend.encode()),
            digest_size=len(self.keys.layout_digest),
        ).digest()
        pool = self.cache.pool
        logger.info(
            "kvtier: KV cache %s, %d bytes a block, backend %s%s",
            self.cache.layout,
            self.cache.block_bytes,
            backend,
            "" if pool is None else "; staged through %d slots (%d MB)" % (pool.slots, pool.bytes >> 20),
        )
        k = self.keys
        itemsize = next(iter(kv_caches.values())).element_size()
        want = k.layers * 2 * k.kv_heads * k.block_size * k.head_size * itemsize
        if self.cache.block_bytes != want:
            raise ValueError(
                "kvtier.vllm: a block's KV is %d bytes in the cache, the layout (%s) says %d"
                % (self.cache.block_bytes, k.descriptor, want)
            )

    # -- values ----------------------------------------------------------------

    def _header(self, key: str, views: Sequence[memoryview]) -> bytearray:
        return self.codec.header(key, views, self.layout_digest)

    def _sink(self, keys: list[str], blocks: _Blocks) -> CheckedSink:
        """A sink that puts value ``i`` into ``blocks.views(i)`` once its
        header says it is a block of this layout (the sink's ``bad`` has
        those that are not)."""
        assert self.cache is not None
        block_bytes, layout = self.cache.block_bytes, self.layout_digest

        def place(index: int, h: Header, head: bytearray) -> Optional[Views]:
            if h.payload_len != block_bytes or head[_codec.FIXED.size :] != layout:
                self.codec.miss(keys[index], "not a block of this layout: recomputed")
                return None
            # One list: the block's layer regions are filled together.
            return list(blocks.views(index))

        return CheckedSink(self.codec, keys, place)

    # -- loads -----------------------------------------------------------------

    def start_loads(self, meta: KVConnectorMetadata, idle: bool = False) -> None:
        """Starts this step's loads on the loader threads (vLLM schedules a
        request only once every rank reported its load done, with its
        failed blocks), and stops the loads of requests that were aborted."""
        self.idle_step = idle
        if not isinstance(meta, KvtierMetadata):
            return
        for spec in meta.loads:
            # A wait runs from when the engine asked, not from when a loader
            # thread is free.
            deadline = None if spec.wait_ms is None else time.monotonic() + spec.wait_ms / 1000.0
            cancel = threading.Event()
            with self.lock:
                self.cancels[spec.req_id] = cancel
            self.async_loads[spec.req_id] = self.loaders.submit(self._load_async, spec, deadline, cancel)
        # After the loads: a request aborted in the step its load was
        # planned stops at once too.
        with self.lock:
            for req_id in meta.cancelled:
                event = self.cancels.get(req_id)
                if event is not None:
                    event.set()

    def wait_loads(self) -> None:
        """Waits until every load started is done (benchmarks and tests)."""
        wait_futures(list(self.async_loads.values()))

    def _load_async(self, spec: LoadSpec, deadline: Optional[float], cancel: threading.Event) -> None:
        try:
            self.load(spec, deadline, cancel)
        except Exception:  # never lose a loader thread, never leave vLLM waiting
            logger.exception("kvtier: load of %s failed", spec.req_id)
            with self.lock:
                self.load_errors.update(spec.block_ids)
        finally:
            with self.lock:
                self.done_recving.add(spec.req_id)
                self.cancels.pop(spec.req_id, None)
            self.load_done.set()

    def load(
        self, spec: LoadSpec, deadline: Optional[float] = None, cancel: Optional[threading.Event] = None
    ) -> None:
        """Reads ``spec``'s blocks into the cache; the ones that did not
        arrive or failed a check are reported for recomputation."""
        keys = [self.keys.key(self.rank, h) for h in spec.hashes]
        bad: list[int] = []
        got = 0
        failed_call = False
        started = time.monotonic()
        no_room = False
        if self.cache is not None and keys:
            try:
                if deadline is None:
                    got, no_room = self._load_now(keys, spec.block_ids, bad)
                else:
                    got, no_room = self._load_as_they_land(keys, spec.block_ids, deadline, cancel, bad)
            except (KvtierError, OSError) as e:
                self.health.failed("load", e)
                failed_call = True
                got = 0
        if bad:
            # A damaged value is deleted, so that the recomputed block is
            # stored in its place (saves keep existing blocks).
            try:
                self.client.execute("DEL", *sorted({keys[i] for i in bad if i < len(keys)}))
            except (KvtierError, OSError) as e:
                self.health.failed("delete of damaged blocks", e)
        first_bad = min([got, *bad])
        failed = spec.block_ids[first_bad:]
        self._log_transfer(
            "kvtier: loaded %d of %d blocks from %s at %.6f",
            first_bad,
            len(keys),
            spec.hashes[0] if spec.hashes else "-",
            time.time(),
        )
        if cancel is not None and cancel.is_set():
            cause = "loads_cancelled"
        elif failed_call:
            cause = "load_failed_error_blocks"
        elif no_room and got == first_bad:
            cause = "load_failed_staging_blocks"
        elif bad and min(bad) == first_bad:
            cause = "load_failed_damaged_blocks"
        else:
            cause = "load_failed_missing_blocks"
        block_bytes = self.cache.block_bytes if self.cache is not None else 0
        self.counters.add(
            loads=1,
            load_blocks=first_bad,
            load_bytes=first_bad * block_bytes,
            load_seconds=time.monotonic() - started,
            **{cause: 1 if cause == "loads_cancelled" else len(failed)},
        )
        with self.lock:
            self.load_errors.update(failed)
        if failed and cause != "loads_cancelled":
            logger.info(
                "kvtier: %s: %d of %d blocks not loaded, recomputed", spec.req_id, len(failed), len(keys)
            )

    def _read_into(
        self, keys: list[str], block_ids: list[int], first: int, bad: list[int], **read: Any
    ) -> tuple[int, bool]:
        """One ``MGETPREFIX`` of ``keys[first:]`` (at most a chunk) into
        their blocks; indexes of values that failed a check (from ``first``)
        go to ``bad``. Returns how many values arrived, and whether there was
        no staging room for them."""
        assert self.cache is not None
        end = min(len(keys), first + self.cache.chunk)
        blocks = self.cache.blocks(block_ids[first:end], gather=False, timeout=self.options.socket_timeout)
        if blocks is None:
            return 0, True
        try:
            sink = self._sink(keys[first:end], blocks)
            n = len(self.client.get_prefix(keys[first:end], into=sink, **read))
            sink.verify()
            part = sorted(sink.bad)
            good = sink.prefix(n)
            blocks.commit(good)
            if blocks.staged is not None:
                self.counters.add(staging_bytes=good * self.cache.block_bytes)
            bad.extend(first + i for i in part)
            return n, False
        finally:
            blocks.release()

    def _load_now(self, keys: list[str], block_ids: list[int], bad: list[int]) -> tuple[int, bool]:
        """Reads the blocks present, a chunk at a time. Returns how many
        leading blocks arrived, and whether staging had no room."""
        got = 0
        while got < len(keys) and not bad:
            n, no_room = self._read_into(keys, block_ids, got, bad)
            got += n
            if no_room or n < min(len(keys) - (got - n), self.cache.chunk if self.cache else 0):
                return got, no_room
        return got, False

    def _load_as_they_land(
        self,
        keys: list[str],
        block_ids: list[int],
        deadline: float,
        cancel: Optional[threading.Event],
        bad: list[int],
    ) -> tuple[int, bool]:
        """Reads blocks another engine is still writing, each as soon as it
        is there: ``MGETPREFIX ... BLOCK ms MIN 1`` of the blocks still
        missing returns the leading ones present, again until all arrived
        (the reads overlap the writer's stores), a check failed, the
        deadline passed or the request was aborted. Returns how many
        leading blocks arrived, and whether staging had no room."""
        got = 0
        while got < len(keys) and not bad and not (cancel is not None and cancel.is_set()):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            n, no_room = self._read_into(
                keys, block_ids, got, bad, block_ms=min(left_ms, WAIT_POLL_MS), min=1
            )
            if no_room:
                return got, True
            got += n
            self._log_transfer("kvtier: %d more blocks of %s at %.6f", n, keys[0], time.time())
            if n == 0 and not bad and self.client.execute("EXISTS", gone_key(keys[got])):
                # Nothing came this poll, and the writer dropped or was
                # refused the next block: it will not come.
                break
        return got, False

    def _log_transfer(self, message: str, *args: Any) -> None:
        if self.options.log_transfers:
            logger.info(message, *args)
        else:
            logger.debug(message, *args)

    def take_load_errors(self) -> set[int]:
        with self.lock:
            errors, self.load_errors = self.load_errors, set()
        return errors

    # -- saves -----------------------------------------------------------------

    def submit_saves(self, meta: KVConnectorMetadata) -> None:
        if not isinstance(meta, KvtierMetadata):
            return
        for spec in meta.saves:
            with self.lock:
                # The scheduler keeps the request's blocks until this worker
                # reports it (get_finished), saved or not.
                self.saved_reqs.add(spec.req_id)
            if self.cache is None:
                continue
            size = len(spec.hashes) * (HEADER_LEN + self.cache.block_bytes)
            with self.lock:
                full = self.backlog + size > self.backlog_max and self.backlog > 0
                if not full:
                    self.backlog += size
                    self.saves_pending[spec.req_id] = self.saves_pending.get(spec.req_id, 0) + 1
            if full:
                # The tier is slower than the engine: this save is dropped
                # (a later miss), not queued while the request's blocks wait.
                self._not_saved(spec, 0, "save_dropped_backlog_blocks", notify=True)
                continue
            # Staged: the copies start now, on the pool's stream, after this
            # step's forward; the save thread sends once they landed.
            blocks = self.cache.blocks(spec.block_ids, gather=True, timeout=None)
            if blocks is None:
                with self.lock:
                    self.backlog -= size
                    self._save_done(spec.req_id)
                self._not_saved(spec, 0, "save_dropped_staging_blocks", notify=True)
                continue
            self.save_queue.put((spec, blocks, size))

    def _not_saved(self, spec: SaveSpec, first: int, cause: str, notify: bool = False) -> None:
        """Blocks ``first..`` of ``spec`` were not stored: counted, reported
        to the scheduler, and (``notify``) marked for a consumer waiting
        for them."""
        hashes = spec.hashes[first:]
        if not hashes:
            return
        self.counters.add(**{cause: len(hashes)})
        with self.lock:
            self.not_stored.setdefault(spec.req_id, []).extend(hashes)
        if notify:
            key = gone_key(self.keys.key(self.rank, hashes[0]))
            self.notices.submit(self._mark_gone, key)

    def _mark_gone(self, key: str) -> None:
        try:
            self.client.execute("SET", key, "1", "PX", max(1000, self.options.pd_wait_ms))
        except (KvtierError, OSError) as e:
            self.health.failed("marking blocks not stored", e)

    def report(self) -> Optional[KvtierWorkerReport]:
        """Blocks not stored since the last report, for the scheduler."""
        with self.lock:
            if not self.not_stored:
                return None
            not_stored, self.not_stored = self.not_stored, {}
        return KvtierWorkerReport(not_stored=not_stored)

    def _save_loop(self) -> None:
        while True:
            job = self.save_queue.get()
            if job is None:
                self.save_queue.task_done()
                return
            spec, blocks, size = job
            try:
                blocks.ready()
                if blocks.staged is not None and self.cache is not None:
                    self.counters.add(staging_bytes=len(spec.block_ids) * self.cache.block_bytes)
                if not self.health.ok():
                    self._not_saved(spec, 0, "save_dropped_down_blocks")
                    continue
                keys = [self.keys.key(self.rank, h) for h in spec.hashes]
                values: list[list[Union[bytearray, memoryview]]] = []
                for i, key in enumerate(keys):
                    views = blocks.views(i)
                    values.append([self._header(key, views), *views])
                parent = None if spec.parent is None else self.keys.key(self.rank, spec.parent)
                started, clock = time.time(), time.monotonic()
                codes = self.client.put_chain(keys, values, parent=parent, partial=spec.partial)
                # A chain stops at its first refused block.
                stored = next((i for i, c in enumerate(codes) if c < 0), len(codes))
                self.counters.add(
                    saves=1, save_blocks=stored, save_bytes=size, save_seconds=time.monotonic() - clock
                )
                self._not_saved(spec, stored, "save_refused_blocks", notify=True)
                # Wall-clock times: scripts/bench-vllm.sh lines up a
                # producer's saves with a consumer's loads by them.
                self._log_transfer(
                    "kvtier: saved %d blocks from %s (refused %d) %.6f..%.6f",
                    len(codes),
                    spec.hashes[0],
                    len(codes) - stored,
                    started,
                    time.time(),
                )
            except (KvtierError, OSError) as e:
                self.health.failed("save", e)
                self._not_saved(spec, 0, "save_failed_blocks")
            except Exception:  # never lose the worker thread
                logger.exception("kvtier: save of %s failed", spec.req_id)
                self._not_saved(spec, 0, "save_failed_blocks")
            finally:
                blocks.release()
                with self.lock:
                    self.backlog -= size
                    self._save_done(spec.req_id)
                self.save_queue.task_done()

    def _save_done(self, req_id: str) -> None:
        """One save of ``req_id`` is over (holding ``self.lock``)."""
        self.saves_pending[req_id] -= 1
        if not self.saves_pending[req_id]:
            del self.saves_pending[req_id]
            self.saves_done.notify_all()

    def drain_saves(self) -> None:
        """Waits until every save handed to the save thread is done."""
        self.save_queue.join()

    def wait_saves(self, req_ids: Sequence[str]) -> None:
        """Waits until the saves of ``req_ids`` are done (vLLM frees a
        preempted request's blocks at once): other requests' saves go on."""
        with self.saves_done:
            self.saves_done.wait_for(lambda: not any(r in self.saves_pending for r in req_ids))

    # -- completion ------------------------------------------------------------

    def finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        if self.idle_step and self.async_loads and not self.done_recving:
            # Nothing to compute, requests waiting for their blocks: vLLM
            # would step again at once, and again, taking the cores from the
            # engine that is writing those blocks. Wait a little for a load
            # to end instead.
            self.load_done.wait(IDLE_WAIT_S)
        self.load_done.clear()
        with self.lock:
            self.finishing |= finished_req_ids & self.saved_reqs
            sending = {r for r in self.finishing if r not in self.saves_pending}
            self.finishing -= sending
            self.saved_reqs -= sending
            recving, self.done_recving = self.done_recving, set()
        for r in recving:
            self.async_loads.pop(r, None)
        return sending or None, recving or None


__all__ = [
    "DEFAULTS",
    "WorkerSide",
    "MAGIC",
    "KeyScheme",
    "KvtierConnector",
    "KvtierMetadata",
    "LoadSpec",
    "Options",
    "SaveSpec",
    "block_key",
    "chain_root",
    "extend_chain",
]
