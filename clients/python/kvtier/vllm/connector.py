"""The connector vLLM loads: one class for both roles, handing each call to the
scheduler's half or the worker's half."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from .keys import KeyScheme
from .metadata import KvtierMetadata, KvtierWorkerReport
from .metrics import KvtierPromMetrics, KvtierStats
from .options import LOOKUP_POLL_S, Options
from .scheduler import _SchedulerSide
from .worker import WorkerSide

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
