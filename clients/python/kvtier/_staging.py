"""Where a block's bytes are in an engine's paged KV cache, and how they
reach host memory: the device-specific part of :mod:`kvtier.vllm`.

A layer's cache tensor holds every block. Whatever the attention backend,
each block is one or two dense byte regions in it:

===================================================  ==============================
layout (logical shape)                               regions of a block
===================================================  ==============================
K and V outer: ``[2, blocks, ...]`` (FlashAttention,  two: K's and V's
the CPU backend)
block outer: ``[blocks, 2, ...]`` (FlashInfer NHD     one
and HND, Triton), ``[blocks, ...]`` (MLA's latent)
===================================================  ==============================

vLLM may allocate a layer in another physical order than its logical shape
(a backend's stride order: HND kept as NHD's shape). Regions are found from
the strides, so what counts is where the bytes are, and the physical order
is part of :func:`physical_layout`, which the values' header digests: bytes
written in one order are never read in another.

A cache in host memory is read and written in place (no copy). Anywhere
else, blocks go through a :class:`StagingPool` of pinned host buffers: one
gather per region per batch on a stream of the pool's own, an event the
socket waits for before sending (saves), and one scatter per region after a
load arrived (loads). On a CPU cache the pool can be forced (``staging:
on``) so that the CPU tests run the code a GPU runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch


def block_regions(name: str, t: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
    """The layer's per-block regions, each a ``[num_blocks, bytes]`` uint8
    view of ``t`` whose rows are the blocks (on ``t``'s device); a
    ValueError naming the layer when a block is not made of dense regions."""
    if t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == num_blocks and _dense_blocks(t[0], 0):
        parts = [t[0], t[1]]
    elif t.dim() >= 2 and t.shape[0] == num_blocks and _dense_blocks(t, 0):
        parts = [t]
    else:
        raise ValueError(
            "kvtier.vllm: layer %s has a KV cache of shape %s and strides %s: not a layout it knows "
            "(each block one or two dense regions, K and V outer or the block outer)"
            % (name, tuple(t.shape), t.stride())
        )
    out = []
    for p in parts:
        n = p[0].numel()
        out.append(p.as_strided((num_blocks, n), (p.stride(0), 1)).view(torch.uint8))
    return out


def _dense_blocks(p: torch.Tensor, dim: int) -> bool:
    """Whether each index of ``dim`` is one dense run of memory, in any
    order of the other dimensions."""
    rest = sorted((p.stride(d), p.shape[d]) for d in range(p.dim()) if d != dim and p.shape[d] != 1)
    expect = 1
    for stride, size in rest:
        if stride != expect:
            return False
        expect *= size
    return bool(p.stride(dim) >= expect)


def physical_layout(t: torch.Tensor, num_blocks: int) -> str:
    """The layer's logical shape (``B`` for the blocks) and its dimensions
    in memory order, outermost first: ``2xBx16x8x128:0,1,2,3,4``."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    shape = ["B" if n == num_blocks else str(n) for n in t.shape]
    return "%s:%s" % ("x".join(shape), ",".join(map(str, order)))


class _Device:
    """The few calls that differ by device: a stream and events on CUDA;
    elsewhere copies are synchronous and there is nothing to wait for."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None

    def on_stream(self) -> Any:
        """Work queued inside runs on the pool's stream, after what the
        engine queued before on its own."""
        if not self.cuda:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)

    def event(self) -> Any:
        if not self.cuda:
            return None
        e = torch.cuda.Event()
        e.record(self.stream)
        return e

    @staticmethod
    def wait(event: Any) -> None:
        if event is not None:
            event.synchronize()


class Staged:
    """Slots of a :class:`StagingPool` holding ``n`` blocks: block ``i``'s
    value is ``views(i)``, its regions in order."""

    def __init__(self, pool: StagingPool, first: int, n: int) -> None:
        self.pool = pool
        self.first = first
        self.n = n
        self.event: Any = None

    def views(self, i: int) -> list[memoryview]:
        return [memoryview(h[self.first + i]) for h in self.pool.host_np]

    def ready(self) -> None:
        """Returns once the copies into these slots landed."""
        self.pool.dev.wait(self.event)

    def release(self) -> None:
        self.pool.free(self.first, self.n)


class StagingPool:
    """Bounded pinned host memory for blocks on their way between the cache
    and kvtier: ``slots`` blocks, taken as contiguous runs (one copy per
    region per batch) and given back; never allocated per request."""

    def __init__(self, regions: Sequence[torch.Tensor], slots: int) -> None:
        self.regions = list(regions)
        self.slots = slots
        self.dev = _Device(self.regions[0].device)
        pinned = self.dev.cuda
        self.host = [
            torch.empty((slots, int(r.shape[1])), dtype=torch.uint8, pin_memory=pinned) for r in regions
        ]
        self.host_np = [h.numpy() for h in self.host]
        self.used = [False] * slots
        self.in_use = 0
        self.cond = threading.Condition()

    @property
    def bytes(self) -> int:
        return sum(int(h.numel()) for h in self.host)

    def take(self, n: int, timeout: Optional[float] = None) -> Optional[Staged]:
        """``n`` contiguous slots, waiting up to ``timeout`` seconds (None:
        not at all) for others to be given back; None when there are none."""
        if n <= 0 or n > self.slots:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                first = self._find(n)
                if first is not None:
                    for i in range(first, first + n):
                        self.used[i] = True
                    self.in_use += n
                    return Staged(self, first, n)
                left = 0.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def _find(self, n: int) -> Optional[int]:
        run = 0
        for i, used in enumerate(self.used):
            run = 0 if used else run + 1
            if run == n:
                return i - n + 1
        return None

    def free(self, first: int, n: int) -> None:
        with self.cond:
            for i in range(first, first + n):
                self.used[i] = False
            self.in_use -= n
            self.cond.notify_all()

    def gather(self, staged: Staged, block_ids: Sequence[int]) -> None:
        """Queues the copies of ``block_ids`` into ``staged`` (one per
        region); ``staged.ready()`` returns once they landed."""
        with self.dev.on_stream():
            ids = torch.tensor(list(block_ids), dtype=torch.long, device=self.dev.device)
            for region, host in zip(self.regions, self.host):
                dst = host[staged.first : staged.first + staged.n]
                dst.copy_(region.index_select(0, ids), non_blocking=self.dev.cuda)
            staged.event = self.dev.event()

    def scatter(self, staged: Staged, count: int, block_ids: Sequence[int]) -> None:
        """Copies the first ``count`` staged blocks into ``block_ids`` of
        the cache and returns once they landed."""
        if count <= 0:
            return
        with self.dev.on_stream():
            ids = torch.tensor(list(block_ids[:count]), dtype=torch.long, device=self.dev.device)
            for region, host in zip(self.regions, self.host):
                src = host[staged.first : staged.first + count]
                region.index_copy_(0, ids, src.to(self.dev.device, non_blocking=self.dev.cuda))
            staged.event = self.dev.event()
        staged.ready()


@contextlib.contextmanager
def taken(pool: StagingPool, n: int, timeout: Optional[float]) -> Iterator[Optional[Staged]]:
    """:meth:`StagingPool.take` given back on leaving."""
    staged = pool.take(n, timeout)
    try:
        yield staged
    finally:
        if staged is not None:
            staged.release()
