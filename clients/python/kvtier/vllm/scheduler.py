"""The scheduler's half: lookups, and the loads and saves each step asks for."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

from .._plugin import Health
from ..client import Client
from ..errors import KvtierError
from .keys import BlockExtras, KeyScheme, chain_root, tail_hash
from .metadata import KvtierMetadata, KvtierWorkerReport, LoadSpec, SaveSpec
from .metrics import Counters
from .options import IN_FLIGHT_S, IN_FLIGHT_WAIT_MS, LOOKUP_POLL_S, RECENT_SAVES_KEPT, Options

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


# Under vLLM's logger, so that its handlers and level apply.
logger = logging.getLogger("vllm.kvtier")


class Connector(Protocol):
    """What the scheduler's half reads of the connector it serves, at each
    call (its options may be replaced while it runs)."""

    options: Options
    keys: KeyScheme
    loads: bool
    saves: bool
    _kv_cache_manager: Any


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
    def __init__(self, connector: Connector) -> None:
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
