"""kvtier/_staging.py: the per-block regions of every KV cache layout
vLLM's attention backends write, built here on the CPU device with the
shapes and strides those backends give them, and blocks moved through the
staging pool and a real kvtier: every byte round-trips, into exactly the
blocks asked for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

import kvtier
from kvtier._staging import StagingPool, block_regions, physical_layout

from conftest import Server

BLOCKS, BS, HEADS, DIM = 12, 16, 4, 32


def flash_attn(n: int) -> torch.Tensor:
    """FlashAttention: K and V outer, ``[2, blocks, block_size, heads, dim]``."""
    return torch.zeros(2, n, BS, HEADS, DIM, dtype=torch.bfloat16)


def flashinfer_nhd(n: int) -> torch.Tensor:
    """FlashInfer NHD: the block outer, ``[blocks, 2, block_size, heads, dim]``."""
    return torch.zeros(n, 2, BS, HEADS, DIM, dtype=torch.float16)


def flashinfer_hnd(n: int) -> torch.Tensor:
    """FlashInfer HND: NHD's logical shape, heads before tokens in memory
    (vLLM allocates in the backend's stride order and permutes)."""
    return torch.zeros(n, 2, HEADS, BS, DIM, dtype=torch.float16).permute(0, 1, 3, 2, 4)


def flash_attn_hnd(n: int) -> torch.Tensor:
    """K and V outer, HND in memory."""
    return torch.zeros(2, n, HEADS, BS, DIM, dtype=torch.bfloat16).permute(0, 1, 3, 2, 4)


def mla(n: int) -> torch.Tensor:
    """MLA: one latent tensor, ``[blocks, block_size, kv_lora_rank + rope_dim]``."""
    return torch.zeros(n, BS, 576, dtype=torch.bfloat16)


def fp8(n: int) -> torch.Tensor:
    """An fp8 cache (one byte an element) with K and V outer."""
    return torch.zeros(2, n, BS, HEADS, DIM, dtype=torch.uint8)


LAYOUTS: dict[str, Callable[[int], torch.Tensor]] = {
    "flash_attn": flash_attn,
    "flashinfer_nhd": flashinfer_nhd,
    "flashinfer_hnd": flashinfer_hnd,
    "flash_attn_hnd": flash_attn_hnd,
    "mla": mla,
    "fp8": fp8,
}


def filled(make: Callable[[int], torch.Tensor], seed: int, layers: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        t = make(BLOCKS)
        t.view(torch.uint8).copy_(
            torch.randint(0, 256, t.view(torch.uint8).shape, generator=g, dtype=torch.uint8)
        )
        out.append(t)
    return out


def block_of(t: torch.Tensor, b: int) -> torch.Tensor:
    """Block ``b`` of a layer, by the logical shape (not by the regions)."""
    return t[:, b] if t.shape[0] == 2 and t.shape[1] == BLOCKS else t[b]


def regions(layers: list[torch.Tensor]) -> list[torch.Tensor]:
    return [r for i, t in enumerate(layers) for r in block_regions("layer.%d" % i, t, BLOCKS)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_byte_moves_into_exactly_the_blocks_asked_for(server: Server, layout: str) -> None:
    src = filled(LAYOUTS[layout], 1)
    dst = [LAYOUTS[layout](BLOCKS) for _ in src]
    out, back = StagingPool(regions(src), slots=4), StagingPool(regions(dst), slots=4)
    sent, into = [7, 2, 11], [0, 5, 9]
    staged = out.take(3)
    assert staged is not None
    out.gather(staged, sent)
    staged.ready()
    keys = ["staging:%s:%d" % (layout, i) for i in range(3)]
    client = kvtier.Client(server.addr)
    assert client.put_chain(keys, [staged.views(i) for i in range(3)]) == [1, 1, 1]
    staged.release()
    recv = back.take(3)
    assert recv is not None
    block_bytes = sum(v.nbytes for v in recv.views(0))
    assert client.get_prefix(keys, into=_sink(recv)) == [block_bytes] * 3
    back.scatter(recv, 3, into)
    recv.release()
    for s, d in zip(src, dst):
        for a, b in zip(sent, into):
            assert torch.equal(block_of(d, b).view(torch.uint8), block_of(s, a).view(torch.uint8))
        for b in set(range(BLOCKS)) - set(into):
            assert not block_of(d, b).view(torch.uint8).any(), "block %d was written" % b
    assert out.in_use == back.in_use == 0


def _sink(staged: object) -> Callable[[int, int], list[memoryview]]:
    def fill(index: int, length: int) -> list[memoryview]:
        return staged.views(index)  # type: ignore[attr-defined, no-any-return]

    return fill


def test_the_physical_order_names_the_layout() -> None:
    nhd, hnd = (
        physical_layout(flashinfer_nhd(BLOCKS), BLOCKS),
        physical_layout(flashinfer_hnd(BLOCKS), BLOCKS),
    )
    assert nhd != hnd
    assert nhd.startswith("Bx2x16x4x32:") and hnd.startswith("Bx2x16x4x32:")
    # The block count is not part of it: engines with other cache sizes agree.
    assert physical_layout(flashinfer_nhd(BLOCKS + 5), BLOCKS + 5) == nhd


@pytest.mark.parametrize(
    "shape, dims",
    [
        ((BS, BLOCKS, HEADS, DIM), None),  # the block not outermost
        ((BLOCKS, 2, BS, HEADS, DIM), (1, 0, 2, 3, 4)),  # K and V outer in memory, block second
    ],
)
def test_a_layout_it_does_not_know_is_refused(shape: tuple[int, ...], dims: tuple[int, ...] | None) -> None:
    t = torch.zeros(*shape)
    if dims is not None:
        t = torch.zeros(*[shape[d] for d in dims]).permute(*[dims.index(i) for i in range(len(dims))])
    with pytest.raises(ValueError, match="not a layout it knows"):
        block_regions("model.layers.0.attn", t, BLOCKS)


def test_the_pool_is_bounded_and_waits_for_slots_given_back() -> None:
    pool = StagingPool(regions(filled(flash_attn, 2, layers=1)), slots=4)
    assert pool.bytes == 4 * 2 * BS * HEADS * DIM * 2
    assert pool.take(5) is None  # more than the pool ever holds
    first = pool.take(3)
    assert first is not None and pool.take(2) is None  # no wait: none
    threading.Timer(0.2, first.release).start()
    t0 = time.monotonic()
    second = pool.take(4, timeout=5)
    assert second is not None and time.monotonic() - t0 >= 0.15
    assert pool.take(1, timeout=0.05) is None
    second.release()
    assert pool.in_use == 0
