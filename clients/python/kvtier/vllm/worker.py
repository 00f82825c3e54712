"""The workers' half: loads into and saves from the engine's KV cache."""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
)

from .. import _codec
from .._codec import CheckedSink, Codec, Header, Views
from .._plugin import Health
from .._staging import Staged, StagingPool, block_regions, physical_layout
from ..client import Client
from ..errors import KvtierError
from .keys import HEADER_LEN, KeyScheme
from .metadata import KvtierMetadata, KvtierWorkerReport, LoadSpec, SaveSpec, gone_key
from .metrics import Counters
from .options import IDLE_WAIT_S, MAGIC, WAIT_POLL_MS, Options

if TYPE_CHECKING:
    pass


# Under vLLM's logger, so that its handlers and level apply.
logger = logging.getLogger("vllm.kvtier")

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
        """Totals since start (:data:`kvtier.vllm.metrics.COUNTERS`)."""
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
