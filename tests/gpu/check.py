"""kvtier.vllm's staging path on a real GPU (outside CI; tests/gpu/check.sh
runs it): paged caches of each layout vLLM's GPU backends write, built on
the device, saved to a kvtier on this machine and loaded back into other
blocks through kvtier/_staging.py and the client, exactly as the connector's
worker does it (``WorkerSide`` itself needs vLLM, which such a machine does
not have). Checks every byte, then prints GB/s device -> tier -> device at
64 KiB and 2 MiB blocks beside a plain torch device <-> pinned copy and the
client's own host-memory store and load (the two limits).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))

import kvtier
from kvtier._staging import StagingPool, block_regions, physical_layout

DEV = torch.device("cuda")


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def layouts(n: int, bs: int, heads: int, dim: int) -> dict[str, Callable[[], torch.Tensor]]:
    def z(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=DEV)

    return {
        "flash_attn [2,B,bs,h,d]": lambda: z(2, n, bs, heads, dim),
        "flashinfer NHD [B,2,bs,h,d]": lambda: z(n, 2, bs, heads, dim),
        "flashinfer HND (permuted)": lambda: z(n, 2, heads, bs, dim).permute(0, 1, 3, 2, 4),
        "flash_attn HND (permuted)": lambda: z(2, n, heads, bs, dim).permute(0, 1, 3, 2, 4),
        "MLA [B,bs,576]": lambda: z(n, bs, 576),
        "fp8 [2,B,bs,h,d]": lambda: z(2, n, bs, heads, dim, dtype=torch.uint8),
    }


def block_of(t: torch.Tensor, b: int, n: int) -> torch.Tensor:
    return t[:, b] if t.shape[0] == 2 and t.shape[1] == n else t[b]


def sink(staged: Any) -> Callable[[int, int], list[memoryview]]:
    return lambda index, length: staged.views(index)


def move(
    client: kvtier.Client, src: StagingPool, dst: StagingPool, ids: list[int], into: list[int], tag: str
) -> tuple[float, float]:
    """Blocks ``ids`` of src's cache to kvtier and back into ``into`` of
    dst's; the save's and the load's seconds."""
    keys = ["gpu:%s:%d" % (tag, i) for i in range(len(ids))]
    t0 = time.perf_counter()
    out = src.take(len(ids))
    assert out is not None
    src.gather(out, ids)
    out.ready()
    codes = client.put_chain(keys, [out.views(i) for i in range(len(ids))])
    out.release()
    t1 = time.perf_counter()
    assert all(c == 1 for c in codes), codes
    back = dst.take(len(ids))
    assert back is not None
    got = client.get_prefix(keys, into=sink(back))
    assert len(got) == len(ids), (len(got), len(ids))
    dst.scatter(back, len(ids), into)
    back.release()
    t2 = time.perf_counter()
    client.execute("DEL", *keys)
    return t1 - t0, t2 - t1


def correctness(client: kvtier.Client) -> list[str]:
    failures = []
    n = 64
    for name, make in layouts(n, 16, 8, 128).items():
        src = [make() for _ in range(4)]
        for t in src:
            t.view(torch.uint8).copy_(
                torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8, device=DEV)
            )
        dst = [make().zero_() for _ in range(4)]
        regs = lambda ts: [r for i, t in enumerate(ts) for r in block_regions("l%d" % i, t, n)]  # noqa: E731
        ids, into = [5, 63, 0, 17, 40], [1, 2, 3, 60, 33]
        move(client, StagingPool(regs(src), 16), StagingPool(regs(dst), 16), ids, into, "c")
        ok = all(
            torch.equal(block_of(d, b, n).view(torch.uint8), block_of(s, a, n).view(torch.uint8))
            for s, d in zip(src, dst)
            for a, b in zip(ids, into)
        ) and all(
            not block_of(d, b, n).view(torch.uint8).any() for d in dst for b in set(range(n)) - set(into)
        )
        print(
            "%-30s %s  %s"
            % (name, "every byte round-trips" if ok else "MISMATCH", physical_layout(src[0], n))
        )
        if not ok:
            failures.append(name)
    return failures


def speed(client: kvtier.Client, layers: int, total_mb: int) -> dict[str, Any]:
    """FlashAttention layout, 16 tokens x 8 heads x 128 (64 KiB a layer):
    ``layers`` layers a block."""
    bs, heads, dim = 16, 8, 128
    block = layers * 2 * bs * heads * dim * 2
    n = max(8, (total_mb << 20) // block)
    caches = [torch.randn(2, n + 8, bs, heads, dim, device=DEV).to(torch.bfloat16) for _ in range(layers)]
    regs = [r for i, t in enumerate(caches) for r in block_regions("l%d" % i, t, n + 8)]
    pool_a, pool_b = StagingPool(regs, n), StagingPool(regs, n)
    ids = list(range(n))
    into = list(range(8, n + 8))
    saves, loads = [], []
    for r in range(4):
        save, load = move(client, pool_a, pool_b, ids, into, "s%d" % r)
        saves.append(save)
        loads.append(load)
    nbytes = n * block
    # The limits: device <-> pinned of the same bytes, and the client with
    # host memory alone.
    flat = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=DEV.type == "cuda")
    sync()
    d2h, h2d = [], []
    for _ in range(4):
        t = time.perf_counter()
        pinned.copy_(flat, non_blocking=True)
        sync()
        d2h.append(time.perf_counter() - t)
        t = time.perf_counter()
        flat.copy_(pinned, non_blocking=True)
        sync()
        h2d.append(time.perf_counter() - t)
    host = [bytearray(block) for _ in range(n)]
    keys = ["gpu:host:%d" % i for i in range(n)]
    hs, hl = [], []
    for _ in range(4):
        t = time.perf_counter()
        client.put_chain(keys, host)
        hs.append(time.perf_counter() - t)
        t = time.perf_counter()
        client.get_prefix(keys, into=host)
        hl.append(time.perf_counter() - t)
        client.execute("DEL", *keys)
    gbs = lambda ts: nbytes / min(ts) / 1e9  # noqa: E731
    out = {
        "block_bytes": block,
        "blocks": n,
        "save_GBps": gbs(saves),
        "load_GBps": gbs(loads),
        "d2h_GBps": gbs(d2h),
        "h2d_GBps": gbs(h2d),
        "socket_store_GBps": gbs(hs),
        "socket_load_GBps": gbs(hl),
    }
    out["save_vs_limit"] = out["save_GBps"] / min(out["d2h_GBps"], out["socket_store_GBps"])
    out["load_vs_limit"] = out["load_GBps"] / min(out["h2d_GBps"], out["socket_load_GBps"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu (a dry run of the script)")
    ap.add_argument("--mb", type=int, default=1024, help="bytes moved per size (MB)")
    args = ap.parse_args()
    global DEV
    DEV = torch.device(args.device)
    name = torch.cuda.get_device_name(0) if DEV.type == "cuda" else "cpu"
    print("torch", torch.__version__, "on", name)
    client = kvtier.Client(args.url, stripes=8)
    failures = correctness(client)
    rows = {"64KiB": speed(client, 1, args.mb // 4), "2MiB": speed(client, 32, args.mb)}
    for size, r in rows.items():
        print(
            "%s blocks: save %.2f GB/s (%.2fx of the limit), load %.2f GB/s (%.2fx); "
            "device->pinned %.2f, pinned->device %.2f, client store %.2f, load %.2f GB/s"
            % (
                size,
                r["save_GBps"],
                r["save_vs_limit"],
                r["load_GBps"],
                r["load_vs_limit"],
                r["d2h_GBps"],
                r["h2d_GBps"],
                r["socket_store_GBps"],
                r["socket_load_GBps"],
            )
        )
    print("JSON " + json.dumps({"device": name, "failures": failures, "speed": rows}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
