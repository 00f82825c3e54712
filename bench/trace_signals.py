#!/usr/bin/env python3
"""What a server could know about a block's return, read off a trace.

    python3 bench/trace_signals.py TRACE.jsonl [--capacity 0.1] [--horizon 150]

Prints, for a Mooncake-format trace (the hit model of `kvtier-bench sim`:
a request's hits are the leading run of its blocks that are present):

1. The share of blocks used again within HORIZON requests, sampled every
   40 requests over every block seen so far, by how often it was used so
   far and how long ago (log2 of requests) it was last used: the two
   signals a policy that ranks by recency and frequency has.
2. For blocks at their first use, the same share by what the server sees
   at write time (whether the request's first block is new, how often the
   block it follows was used) and, beside it, by the request's output
   length, which a server does not see.
3. Bounds at CAPACITY (a fraction of the unique blocks): exact LRU;
   Belady's MIN, with its hits split by which use of a block they are;
   a cache that knows each block's total count from the start and keeps
   the most used ones (the value of knowing popularity in advance); and a
   policy that ranks by the table of (1), measured on the trace itself
   (an oracle of that table: what recency and frequency can reach at best
   with queues by use count, evicting the queue head whose (uses, age)
   class returns least).

Used for the synthetic-trace study in docs/research/eviction-study.md
("Why the synthetic goal stays out of reach").
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable

from gen_traces import load, lru_hit_rate


def uses_by_request(reqs: list[list[int]]) -> dict[int, list[int]]:
    at: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(reqs):
        for b in dict.fromkeys(ids):
            at[b].append(i)
    return at


def return_table(
    reqs: list[list[int]], horizon: int, bucket: Callable[[int], int]
) -> dict[tuple[int, int], tuple[int, int]]:
    """(use-count bucket, log2 age) -> (samples, used again within horizon),
    sampled every 40 requests (the same moments for every block)."""
    table: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    last = len(reqs) - horizon
    for uses in uses_by_request(reqs).values():
        for t in range(-(-uses[0] // 40) * 40, last, 40):
            k = bisect.bisect_right(uses, t)
            age = t - uses[k - 1]
            cell = table[(bucket(k), int(math.log2(age + 1)))]
            cell[0] += 1
            cell[1] += k < len(uses) and uses[k] - t <= horizon
    return {key: (n, p) for key, (n, p) in table.items()}


def first_use_signals(reqs: list[list[int]], outputs: list[int], horizon: int) -> None:
    at = uses_by_request(reqs)
    seen: Counter[int] = Counter()
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for i, ids in enumerate(reqs[: len(reqs) - horizon]):
        root = "request new from its first block" if seen[ids[0]] == 0 else "request continues a known prefix"
        output = "under 128" if outputs[i] < 128 else "128 or more"
        for j, b in enumerate(ids):
            if seen[b]:
                continue
            uses = at[b]
            again = len(uses) > 1 and uses[1] - i <= horizon
            parent = "-" if j == 0 else ("3+" if seen[ids[j - 1]] >= 3 else str(seen[ids[j - 1]]))
            for key in (
                ("request", root),
                ("uses of the block before", parent),
                ("output tokens (not seen by a server)", output),
            ):
                table[key][0] += 1
                table[key][1] += again
        seen.update(set(ids))
    for (name, value), (n, p) in sorted(table.items()):
        print(f"  {name} = {value}: {n} blocks, {p / n:.3f} used again")


def belady(reqs: list[list[int]], cap: int) -> tuple[float, Counter[int]]:
    flat = [b for ids in reqs for b in ids]
    following = [0] * len(flat)
    seen_at: dict[int, int] = {}
    for k in range(len(flat) - 1, -1, -1):
        following[k] = seen_at.get(flat[k], 1 << 60)
        seen_at[flat[k]] = k
    cache: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    used: Counter[int] = Counter()
    by_use: Counter[int] = Counter()
    k = hits = 0
    for ids in reqs:
        n = 0
        while n < len(ids) and ids[n] in cache:
            n += 1
        for b in ids[:n]:
            by_use[min(used[b] + 1, 6)] += 1
        hits += n
        for b in ids:
            used[b] += 1
            nxt = following[k]
            k += 1
            if b not in cache:
                while len(cache) >= cap:
                    neg, victim = heapq.heappop(heap)
                    if cache.get(victim) == -neg:
                        del cache[victim]
            cache[b] = nxt
            heapq.heappush(heap, (-nxt, b))
    return hits / len(flat), by_use


def most_used(reqs: list[list[int]], cap: int) -> float:
    total: Counter[int] = Counter(b for ids in reqs for b in ids)
    keep = {b for b, _ in total.most_common(cap)}
    seen: set[int] = set()
    hits = 0
    for ids in reqs:
        n = 0
        while n < len(ids) and ids[n] in keep and ids[n] in seen:
            n += 1
        hits += n
        seen.update(ids)
    return hits / sum(map(len, reqs))


def by_table(reqs: list[list[int]], cap: int, horizon: int, levels: int) -> float:
    def bucket(k: int) -> int:
        return min(k, levels) - 1

    counts = return_table(reqs, horizon, bucket)
    table = {key: (p + 0.5) / (n + 1) for key, (n, p) in counts.items()}
    # A (uses, age) class never sampled is ranked at its row's rate.
    row: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for (q, _), (n, p) in counts.items():
        row[q][0] += n
        row[q][1] += p
    rate = {q: (p + 0.5) / (n + 1) for q, (n, p) in row.items()}
    queues: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(levels)]
    level: dict[int, int] = {}
    last: dict[int, int] = {}
    used: Counter[int] = Counter()
    hits = 0
    for i, ids in enumerate(reqs):
        n = 0
        while n < len(ids) and ids[n] in level:
            n += 1
        hits += n
        used.update(set(ids))
        for b in reversed(ids):
            if b in level:
                del queues[level[b]][b]
            else:
                while len(level) >= cap:
                    heads = [(q, next(iter(queues[q]))) for q in range(levels) if queues[q]]
                    q, victim = min(
                        heads,
                        key=lambda h: table.get(
                            (h[0], int(math.log2(i - last[h[1]] + 1))), rate.get(h[0], 0.0)
                        ),
                    )
                    del queues[q][victim]
                    del level[victim]
            level[b] = bucket(used[b])
            queues[level[b]][b] = None
            last[b] = i
    return hits / sum(map(len, reqs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacity", type=float, default=0.1, help="fraction of the unique blocks")
    ap.add_argument("--horizon", type=int, default=150, help="requests")
    args = ap.parse_args()
    rows = load(args.trace)
    reqs = [r.hash_ids for r in rows]
    outputs = [r.output_length for r in rows]
    unique = len({b for ids in reqs for b in ids})
    cap = int(unique * args.capacity)
    print(f"{args.trace}: {len(reqs)} requests, {sum(map(len, reqs))} block uses, {unique} unique blocks")
    once = sum(1 for c in Counter(b for ids in reqs for b in ids).values() if c == 1)
    print(f"blocks used once in the whole trace: {once} ({once / unique:.0%})")

    print(
        f"\n1. used again within {args.horizon} requests, by uses so far (rows)"
        " and log2 requests since the last use"
    )
    table = return_table(reqs, args.horizon, lambda k: min(k, 8))
    print("uses  " + " ".join(f"{a:>5}" for a in range(12)))
    for c in range(1, 9):
        cells = []
        for a in range(12):
            n, p = table.get((c, a), (0, 0))
            cells.append(f"{p / n:5.2f}" if n > 200 else "    -")
        print(f"{c if c < 8 else '8+':>4}  " + " ".join(cells))

    print(f"\n2. blocks at their first use, used again within {args.horizon} requests")
    first_use_signals(reqs, outputs, args.horizon)

    print(f"\n3. block hit rates at {args.capacity:g} of the unique blocks ({cap} blocks)")
    base = lru_hit_rate(rows, cap)
    best, by_use = belady(reqs, cap)
    uses = sum(by_use.values()) / best if best else 1.0

    def gap(x: float) -> str:
        return f"{x:.4f} ({(x - base) / (best - base):+.1%} of the LRU-Belady gap)"

    print(f"  exact LRU (as `kvtier-bench sim --policy lru`): {base:.4f}")
    split = ", ".join(f"{'6th+' if u == 6 else f'#{u}'} {c / uses:.3f}" for u, c in sorted(by_use.items()))
    print(f"  Belady's MIN: {best:.4f}; its hits by which use of the block: {split}")
    print(f"  the most used blocks, known in advance: {gap(most_used(reqs, cap))}")
    for levels in (4, 8):
        print(
            f"  queues by uses (1..{levels}), the table of 1 known in advance:",
            gap(by_table(reqs, cap, args.horizon, levels)),
        )


if __name__ == "__main__":
    main()
