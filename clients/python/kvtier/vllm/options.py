"""The connector's options (``kv_connector_extra_config``) and its timing constants."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .._plugin import read_options, truthy

if TYPE_CHECKING:
    pass


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
        o = read_options(extra, DEFAULTS, "kvtier connector")
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
