"""What the scheduler tells the workers each step, and what they report back."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

if TYPE_CHECKING:
    pass


# Under vLLM's logger, so that its handlers and level apply.
logger = logging.getLogger("vllm.kvtier")

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
