"""What the vLLM connector counts, in vLLM's own place: each step the
scheduler's and every worker's counts since the step before travel as
:class:`KvtierStats` (``get_kv_connector_stats``), vLLM sums them over the
ranks, logs them (``KV Transfer metrics: ...``) and, where it exports
Prometheus metrics, adds them to ``vllm:kvtier_<name>_total``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

#: Every counter, with what it counts (its Prometheus help text).
COUNTERS: dict[str, str] = {
    "lookups": "Lookups the scheduler sent to kvtier (one PREFIXLEN per request).",
    "lookup_timeouts": "Lookups past their budget: the request computed.",
    "lookup_errors": "Lookups that failed (connection, server error): the request computed.",
    "lookup_hit_blocks": "Full blocks of looked-up prompts that kvtier held.",
    "lookup_miss_blocks": "Full blocks of looked-up prompts that kvtier did not hold.",
    "loads": "Loads of a request's blocks (one MGETPREFIX per request and rank).",
    "load_blocks": "Blocks loaded into the KV cache.",
    "load_bytes": "Bytes loaded into the KV cache.",
    "load_seconds": "Seconds spent loading (the sum over loads).",
    "load_failed_missing_blocks": "Blocks planned for a load that were not there: recomputed.",
    "load_failed_damaged_blocks": "Blocks that failed a check (key, layout, length, CRC): recomputed.",
    "load_failed_error_blocks": "Blocks not loaded because kvtier failed or timed out: recomputed.",
    "loads_cancelled": "Loads stopped because their request was aborted.",
    "saves": "Saves of blocks a step completed (one MSETBLOCK chain per request and rank).",
    "save_blocks": "Blocks kvtier stored.",
    "save_bytes": "Bytes sent to kvtier in saves.",
    "save_seconds": "Seconds spent saving (the sum over saves).",
    "save_refused_blocks": "Blocks kvtier refused to store (memory limits).",
    "save_dropped_backlog_blocks": "Blocks not saved because the save backlog was full (a slow tier).",
    "save_dropped_down_blocks": "Blocks not saved while kvtier was skipped after a failure.",
    "save_failed_blocks": "Blocks of saves that failed (connection, timeout).",
    "save_dropped_staging_blocks": "Blocks not saved because the staging buffers were full.",
    "load_failed_staging_blocks": "Blocks not loaded because no staging buffer freed in time: recomputed.",
    "staging_bytes": "Bytes moved between the KV cache and the staging buffers (both ways).",
}


@dataclass
class KvtierStats(KVConnectorStats):  # type: ignore[misc]
    """Counts since the last report: ``data`` maps a name of
    :data:`COUNTERS` to a number; reports add up."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: round(v, 3) for k, v in self.data.items() if v}
        for what in ("load", "save"):
            n = self.data.get(what + "s", 0)
            if n:
                out[what + "_mean_ms"] = round(1000 * self.data.get(what + "_seconds", 0) / n, 2)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class Counters:
    """The counts of one side (scheduler or a worker): totals since start
    and the part vLLM has not collected yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._new: dict[str, float] = {}

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, n in counts.items():
                if name not in COUNTERS:
                    raise KeyError("not a kvtier counter: %s" % name)
                self.totals[name] += n
                self._new[name] = self._new.get(name, 0) + n

    def take(self) -> Optional[KvtierStats]:
        """The counts since the last call, None if nothing happened."""
        with self._lock:
            if not any(self._new.values()):
                return None
            data, self._new = self._new, {}
        return KvtierStats(data=data)


class KvtierPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """One Prometheus counter per name of :data:`COUNTERS`, per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            name: self._counter_cls(name="vllm:kvtier_" + name, documentation=doc, labelnames=labelnames)
            for name, doc in COUNTERS.items()
        }
        self._children: dict[tuple[int, str], Any] = {}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            counter = self._counters.get(name)
            if counter is None or not value:
                continue
            child = self._children.get((engine_idx, name))
            if child is None:
                child = counter.labels(*self.per_engine_labelvalues[engine_idx])
                self._children[(engine_idx, name)] = child
            child.inc(value)
