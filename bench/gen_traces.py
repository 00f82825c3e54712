#!/usr/bin/env python3
"""Generator of KV-cache request traces in the Mooncake FAST '25 JSONL format.

Each output line is one request::

    {"timestamp": <ms>, "input_length": <tokens>, "output_length": <tokens>, "hash_ids": [...]}

``hash_ids`` is the prompt as a chain of 512-token blocks: an id stands for a block *and its whole
prefix* (a chained hash), so two requests share their first k ids exactly when they share their
first k x 512 tokens. When ``input_length`` is not a multiple of 512 the last block is partial; a
request that extends the same prompt has different tokens in that block and gets a different id.

The generator models a prompt as a sequence of *segments* (a system prompt, a user message, an
answer, a tool output, a retrieved chunk), each with a content id and a length in tokens. A block's
identity is (id of the previous block, the pieces of segments it holds), interned in one table, so
equal prefixes get equal ids and anything else gets a fresh one: no special case is needed for
partial blocks. Ids are renumbered in order of first appearance in the written trace.

Workloads (``params WORKLOAD`` lists every parameter and its default; docs/traces.md explains them):

- ``conversation``: multi-turn chat sessions; each turn's prompt is the previous prompt, the
  previous answer and a new user message.
- ``system-prompts``: single-turn requests sharing one of K system prompts (Zipf popularity).
- ``agent``: tool-agent loops with long, growing contexts, compaction and restarts from
  checkpoints.
- ``rag``: a system prompt, k retrieved chunks and a question; popular queries repeat their chunk
  list.
- ``mix``: the first four on one clock.
- ``chat``: conversations shaped like a real multi-turn trace (one shared root block, long first
  turns, most sessions of one turn, turns hundreds of requests apart); calibrated to its figures.

Usage::

    python3 bench/gen_traces.py conversation --requests 20000 --seed 1 -o /tmp/conv.jsonl --stats
    python3 bench/gen_traces.py standard --out-dir /tmp/traces  # the set in docs/traces.md
    python3 bench/gen_traces.py stats FILE --capacity 0.05,0.1,0.25  # summary of any trace
    python3 bench/gen_traces.py check FILE  # invariants of any trace
    python3 bench/gen_traces.py selftest

Lint: ``ruff check --line-length 100 --select E,F,W,I,B,UP,A,RUF bench/gen_traces.py`` and
``mypy --strict bench/gen_traces.py``.

Standard library only; deterministic for a given seed (same Python minor version).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import hashlib
import heapq
import io
import json
import math
import os
import random
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TextIO

BLOCK_TOKENS = 512
"""Tokens per block, as in the Mooncake trace (kvtier-bench trace --block-tokens 512)."""

ROOT = -1
"""Parent id of a chain's first block."""


# --------------------------------------------------------------------------------------------------
# Blocks and prompts
# --------------------------------------------------------------------------------------------------


class BlockTable:
    """Interns block identities: (parent id, content pieces) -> id.

    A key is one flat tuple ``(parent, uid, start, end, uid, start, end, ...)``: the previous
    block's id followed by the slices ``[start, end)`` of the segments (content ids ``uid``) whose
    tokens fill the block. The same key always gets the same id, so equal token prefixes get equal
    ids; a partial block's key differs from that of any extension of it.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], int] = {}

    def block_id(self, key: tuple[int, ...]) -> int:
        """The id of the block with this key, a new one if it was never seen."""
        ids = self._ids
        found = ids.get(key)
        if found is None:
            found = len(ids)
            ids[key] = found
        return found

    def __len__(self) -> int:
        return len(self._ids)


class Context:
    """A prompt under construction: the ids of its full blocks and the pieces of its tail.

    ``append`` adds a segment's tokens; ``hash_ids`` gives the chain for a request with this
    prompt; ``fork`` copies it (a branch shares every full block of the prefix). With ``record``
    the segments are kept too, for the self-test's independent check of the ids.
    """

    __slots__ = ("_tail", "full", "segments", "table", "tail_len")

    def __init__(self, table: BlockTable, record: bool = False) -> None:
        self.table = table
        self.full: list[int] = []
        # The tail's key under construction: parent id, then (uid, start, end) triples.
        self._tail: list[int] = [ROOT]
        self.tail_len = 0
        self.segments: list[tuple[int, int]] | None = [] if record else None

    @property
    def tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.full) * BLOCK_TOKENS + self.tail_len

    def append(self, uid: int, n: int) -> None:
        """Appends ``n`` tokens of the segment with content id ``uid``.

        A content id must always stand for the same token sequence (a length-n segment of it is
        its first n tokens).
        """
        if n <= 0:
            return
        if self.segments is not None:
            self.segments.append((uid, n))
        off = 0
        tail = self._tail
        while off < n:
            take = min(n - off, BLOCK_TOKENS - self.tail_len)
            tail += (uid, off, off + take)
            self.tail_len += take
            off += take
            if self.tail_len == BLOCK_TOKENS:
                block = self.table.block_id(tuple(tail))
                self.full.append(block)
                tail = self._tail = [block]
                self.tail_len = 0

    def hash_ids(self) -> list[int]:
        """The block chain of a request whose prompt is this context."""
        ids = self.full.copy()
        if self.tail_len:
            ids.append(self.table.block_id(tuple(self._tail)))
        return ids

    def fork(self) -> Context:
        """An independent copy (shares the table)."""
        c = Context.__new__(Context)
        c.table = self.table
        c.full = self.full.copy()
        c._tail = self._tail.copy()
        c.tail_len = self.tail_len
        c.segments = None if self.segments is None else self.segments.copy()
        return c


@dataclass(slots=True)
class Request:
    """A generated request (time in seconds; ids before renumbering)."""

    t: float
    seq: int
    input_length: int
    output_length: int
    hash_ids: list[int]
    segments: list[tuple[int, int]] | None = None


class Trace:
    """Shared state of one generation: the block table, content ids and the requests."""

    def __init__(self, record: bool = False) -> None:
        self.table = BlockTable()
        self.record = record
        self.requests: list[Request] = []
        self._next_uid = 0

    def uid(self) -> int:
        """A fresh content id (a segment of tokens seen nowhere else)."""
        self._next_uid += 1
        return self._next_uid

    def context(self) -> Context:
        """An empty prompt."""
        return Context(self.table, self.record)

    def emit(self, t: float, ctx: Context, output_length: int) -> None:
        """Records a request at time ``t`` (seconds) with prompt ``ctx``."""
        segs = None if ctx.segments is None else ctx.segments.copy()
        self.requests.append(Request(t, len(self.requests), ctx.tokens, output_length, ctx.hash_ids(), segs))


# --------------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------------


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """A lognormal integer with the given median and log-space sigma, clamped to [lo, hi]."""
    return min(hi, max(lo, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    """A lognormal real with the given median and log-space sigma."""
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer spread uniformly in log space over [lo, hi]."""
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


class Zipf:
    """Samples ranks 0..n-1 with probability proportional to 1/(rank+1)^s."""

    __slots__ = ("_cum", "_rng")

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        if n < 1:
            raise ValueError("Zipf needs at least one item")
        acc = 0.0
        self._cum: list[float] = []
        for r in range(n):
            acc += 1.0 / (r + 1) ** s
            self._cum.append(acc)
        self._rng = rng

    def sample(self) -> int:
        """One rank."""
        cum = self._cum
        return min(len(cum) - 1, bisect.bisect_right(cum, self._rng.random() * cum[-1]))


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------


def param(default: Any, doc: str) -> Any:
    """A documented parameter with a default (``params WORKLOAD`` prints the docs)."""
    return field(default=default, metadata={"doc": doc})


class Workload:
    """A source of sessions arriving as a Poisson process; each session emits its requests."""

    name = ""
    default_requests = 20_000

    def __init__(self, params: Any, trace: Trace, seed: int) -> None:
        self.p = params
        self.trace = trace
        # String seeds are hashed with SHA-512 by random.seed: stable across runs and platforms.
        self.rng = random.Random(f"{seed}/{self.name}")
        self.clock = 0.0

    @property
    def rate(self) -> float:
        """Session arrivals per second."""
        return float(self.p.rate)

    def next_arrival(self) -> float:
        """The next session's start time (seconds), advancing the arrival process."""
        self.clock += self.rng.expovariate(self.rate)
        return self.clock

    def session(self, t0: float) -> None:
        """Emits every request of one session starting at ``t0``."""
        raise NotImplementedError

    def shared_prompts(self, count: int, lo: int, hi: int) -> tuple[list[Context], list[int]]:
        """``count`` shared prompts with log-uniform sizes in [lo, hi]: contexts and sizes."""
        ctxs, sizes = [], []
        for _ in range(count):
            size = log_uniform_int(self.rng, lo, hi)
            ctx = self.trace.context()
            ctx.append(self.trace.uid(), size)
            ctxs.append(ctx)
            sizes.append(size)
        return ctxs, sizes


@dataclass
class ConversationParams:
    """Parameters of ``conversation``."""

    rate: float = param(5.0, "session arrivals per second (Poisson)")
    system_prompts: int = param(4, "number of shared system prompts")
    system_min: int = param(400, "smallest system prompt, tokens (sizes log-uniform)")
    system_max: int = param(4000, "largest system prompt, tokens")
    system_zipf: float = param(1.0, "Zipf exponent of system-prompt popularity")
    turns_median: float = param(3.0, "turns per session: ceil(lognormal) median")
    turns_sigma: float = param(1.0, "turns per session: lognormal sigma (heavy tail)")
    turns_max: int = param(80, "turns per session: cap")
    abandon_prob: float = param(
        0.15, "a session is abandoned at a uniform turn before its planned end; its answer is cut"
    )
    message_median: int = param(120, "user message, tokens: lognormal median")
    message_sigma: float = param(1.1, "user message: lognormal sigma")
    doc_prob: float = param(0.2, "first message carries a pasted document")
    later_doc_prob: float = param(0.03, "a later message carries a pasted document")
    doc_median: int = param(4000, "pasted document, tokens: lognormal median")
    doc_sigma: float = param(1.0, "pasted document: lognormal sigma")
    answer_median: int = param(350, "answer (output_length), tokens: lognormal median")
    answer_sigma: float = param(0.8, "answer: lognormal sigma")
    think_median_s: float = param(25.0, "user think time between answer and next turn: median s")
    think_sigma: float = param(0.9, "think time: lognormal sigma")
    pause_prob: float = param(0.05, "a turn follows a long pause instead (user comes back later)")
    pause_median_s: float = param(900.0, "long pause: lognormal median s")
    pause_sigma: float = param(0.8, "long pause: lognormal sigma")
    regenerate_prob: float = param(
        0.03, "user asks to regenerate: the identical prompt again (its partial block reused)"
    )
    decode_tps: float = param(40.0, "decode speed, tokens/s (answer time = output/decode_tps)")
    prefill_tps: float = param(8000.0, "prefill speed, tokens/s")
    max_context: int = param(128_000, "context window: the session ends before exceeding it")


class Conversation(Workload):
    """Multi-turn chat: turn n+1's prompt = turn n's prompt + its answer + a new message."""

    name = "conversation"
    default_requests = 20_000

    def __init__(self, params: ConversationParams, trace: Trace, seed: int) -> None:
        super().__init__(params, trace, seed)
        p = params
        self.systems, _ = self.shared_prompts(p.system_prompts, p.system_min, p.system_max)
        self.pick_system = Zipf(p.system_prompts, p.system_zipf, self.rng)

    def session(self, t0: float) -> None:
        p: ConversationParams = self.p
        rng, tr = self.rng, self.trace
        turns = min(p.turns_max, max(1, math.ceil(lognormal(rng, p.turns_median, p.turns_sigma))))
        abandoned = rng.random() < p.abandon_prob
        if abandoned:
            turns = rng.randint(1, turns)
        ctx = self.systems[self.pick_system.sample()].fork()
        t = t0
        for turn in range(turns):
            if rng.random() < (p.doc_prob if turn == 0 else p.later_doc_prob):
                doc = lognormal_int(rng, p.doc_median, p.doc_sigma, 256, p.max_context)
            else:
                doc = 0
            msg = lognormal_int(rng, p.message_median, p.message_sigma, 4, 32_000)
            if ctx.tokens + doc + msg > p.max_context:
                break
            ctx.append(tr.uid(), doc)
            ctx.append(tr.uid(), msg)
            answer = lognormal_int(rng, p.answer_median, p.answer_sigma, 1, 8192)
            if abandoned and turn == turns - 1:
                answer = max(1, int(answer * rng.random()))
            tr.emit(t, ctx, answer)
            t += ctx.tokens / p.prefill_tps + answer / p.decode_tps
            if rng.random() < p.regenerate_prob:
                t += lognormal(rng, 4.0, 0.5)
                answer = lognormal_int(rng, p.answer_median, p.answer_sigma, 1, 8192)
                tr.emit(t, ctx, answer)
                t += ctx.tokens / p.prefill_tps + answer / p.decode_tps
            ctx.append(tr.uid(), answer)
            if rng.random() < p.pause_prob:
                t += lognormal(rng, p.pause_median_s, p.pause_sigma)
            else:
                t += max(0.5, lognormal(rng, p.think_median_s, p.think_sigma))


@dataclass
class ChatParams:
    """Parameters of ``chat`` (defaults calibrated to a real multi-turn trace, issue 42)."""

    rate: float = param(2.3, "session arrivals per second (Poisson)")
    root_tokens: int = param(512, "the one system prompt every request starts with, tokens")
    short_prob: float = param(0.1, "a first turn is a short question instead of a long context")
    short_median: int = param(150, "short question, tokens: lognormal median (sigma 1)")
    first_median: int = param(5600, "first turn's own part (after the root), tokens: median")
    first_sigma: float = param(1.15, "first turn's part: lognormal sigma")
    first_continue_prob: float = param(0.28, "a session's first turn is followed by a second")
    continue_prob: float = param(0.5, "the second turn is followed by a third")
    continue_max: float = param(0.7, "later turns: the chance rises towards this")
    continue_rise: float = param(0.7, "later turns: the gap to continue_max shrinks by this a turn")
    gap_min: float = param(40.0, "requests (of the whole trace) between turns: at least")
    gap_median: float = param(480.0, "requests between turns beyond gap_min: lognormal median")
    gap_sigma: float = param(1.15, "gap between turns: lognormal sigma")
    message_median: int = param(450, "a later turn's new message, tokens: lognormal median")
    message_sigma: float = param(1.2, "later message: lognormal sigma")
    answer_median: int = param(350, "answer (output_length), tokens: lognormal median")
    answer_sigma: float = param(0.9, "answer: lognormal sigma")
    max_context: int = param(128_000, "context window: the session ends before exceeding it")


class Chat(Workload):
    """Chat sessions shaped like a real multi-turn trace rather than like a chat product.

    Every request starts with one shared root block; a session's first turn is long (a pasted
    context) and most sessions end after it; a turn is followed by another with a chance that
    rises with the turn (``continue_after``), the next turn arriving a lognormal number of
    *requests* later (converted to time at the mean request rate), its prompt the previous prompt
    + its answer + a new message. So the blocks of a continued prompt come back hundreds of
    requests later, and three quarters of all blocks are read once.
    """

    name = "chat"
    default_requests = 12_000

    def __init__(self, params: ChatParams, trace: Trace, seed: int) -> None:
        super().__init__(params, trace, seed)
        root = trace.context()
        root.append(trace.uid(), params.root_tokens)
        self.root = root
        # Seconds per request of the whole trace: 1 / (sessions/s times turns per session).
        turns, alive = 1.0, 1.0
        for k in range(1, 2000):
            alive *= self.continue_after(k)
            turns += alive
        self.per_request_s = 1.0 / (params.rate * turns)

    def continue_after(self, turn: int) -> float:
        """The chance that turn ``turn`` (1-based) is followed by another."""
        p: ChatParams = self.p
        if turn == 1:
            return float(p.first_continue_prob)
        gap = p.continue_max - p.continue_prob
        return float(p.continue_max - gap * p.continue_rise ** (turn - 2))

    def session(self, t0: float) -> None:
        p: ChatParams = self.p
        rng, tr = self.rng, self.trace
        ctx = self.root.fork()
        if rng.random() < p.short_prob:
            first = lognormal_int(rng, p.short_median, 1.0, 4, p.max_context)
        else:
            first = lognormal_int(rng, p.first_median, p.first_sigma, 16, p.max_context)
        ctx.append(tr.uid(), first)
        t = t0
        turn = 0
        while True:
            turn += 1
            answer = lognormal_int(rng, p.answer_median, p.answer_sigma, 1, 8192)
            tr.emit(t, ctx, answer)
            if rng.random() >= self.continue_after(turn):
                return
            msg = lognormal_int(rng, p.message_median, p.message_sigma, 4, 32_000)
            if ctx.tokens + answer + msg > p.max_context:
                return
            ctx.append(tr.uid(), answer)
            ctx.append(tr.uid(), msg)
            t += (p.gap_min + lognormal(rng, p.gap_median, p.gap_sigma)) * self.per_request_s


@dataclass
class SystemPromptsParams:
    """Parameters of ``system-prompts``."""

    rate: float = param(20.0, "request arrivals per second (Poisson)")
    prompts: int = param(2000, "number of system prompts (apps / API customers' templates)")
    prompt_min: int = param(1000, "smallest system prompt, tokens (sizes log-uniform)")
    prompt_max: int = param(16_000, "largest system prompt, tokens")
    zipf: float = param(1.0, "Zipf exponent of prompt popularity (rank independent of size)")
    user_median: int = param(1000, "unique user part, tokens: lognormal median")
    user_sigma: float = param(1.0, "user part: lognormal sigma")
    answer_median: int = param(200, "output_length: lognormal median")
    answer_sigma: float = param(0.8, "output_length: lognormal sigma")
    retry_prob: float = param(0.03, "the identical request is sent again (client retry)")
    retry_median_s: float = param(3.0, "delay of a retry: lognormal median s (sigma 0.7)")
    churn_s: float = param(
        600.0, "mean seconds between prompt updates (a random app ships a new prompt); 0 = none"
    )


class SystemPrompts(Workload):
    """Single-turn requests: one of K shared system prompts followed by a unique user part."""

    name = "system-prompts"
    default_requests = 50_000

    def __init__(self, params: SystemPromptsParams, trace: Trace, seed: int) -> None:
        super().__init__(params, trace, seed)
        p = params
        self.prompts, self.sizes = self.shared_prompts(p.prompts, p.prompt_min, p.prompt_max)
        self.pick = Zipf(p.prompts, p.zipf, self.rng)
        self.next_churn = self.rng.expovariate(1.0 / p.churn_s) if p.churn_s > 0 else math.inf

    def session(self, t0: float) -> None:
        p: SystemPromptsParams = self.p
        rng, tr = self.rng, self.trace
        while t0 >= self.next_churn:
            i = rng.randrange(p.prompts)
            size = max(p.prompt_min, round(self.sizes[i] * rng.uniform(0.9, 1.1)))
            ctx = tr.context()
            ctx.append(tr.uid(), size)
            self.prompts[i], self.sizes[i] = ctx, size
            self.next_churn += rng.expovariate(1.0 / p.churn_s)
        ctx = self.prompts[self.pick.sample()].fork()
        ctx.append(tr.uid(), lognormal_int(rng, p.user_median, p.user_sigma, 8, 16_000))
        answer = lognormal_int(rng, p.answer_median, p.answer_sigma, 1, 8192)
        tr.emit(t0, ctx, answer)
        if rng.random() < p.retry_prob:
            tr.emit(t0 + lognormal(rng, p.retry_median_s, 0.7), ctx, answer)


@dataclass
class AgentParams:
    """Parameters of ``agent``."""

    rate: float = param(1.0, "session (task) arrivals per second (Poisson)")
    frameworks: int = param(4, "shared agent system prompts (instructions + tool schemas)")
    system_min: int = param(3000, "smallest agent system prompt, tokens (log-uniform)")
    system_max: int = param(12_000, "largest agent system prompt, tokens")
    system_zipf: float = param(1.0, "Zipf exponent of framework popularity")
    task_median: int = param(400, "task description, tokens: lognormal median (sigma 1.0)")
    steps_median: float = param(25.0, "steps (requests) per task: lognormal median")
    steps_sigma: float = param(0.9, "steps per task: lognormal sigma")
    steps_max: int = param(400, "steps per task: cap")
    call_median: int = param(120, "model output per step (reasoning + tool call): median tokens")
    call_sigma: float = param(0.9, "model output: lognormal sigma")
    tool_median: int = param(400, "tool output, tokens: lognormal median (1k-8k tokens ~ 24%)")
    tool_sigma: float = param(1.3, "tool output: lognormal sigma")
    tool_max: int = param(16_000, "tool output: cap")
    tool_latency_s: float = param(1.5, "tool run time: lognormal median s (sigma 1.0)")
    decode_tps: float = param(60.0, "decode speed, tokens/s")
    prefill_tps: float = param(8000.0, "prefill speed, tokens/s")
    branch_prob: float = param(
        0.04, "per step: restart from an earlier checkpoint (a uniformly chosen earlier step)"
    )
    max_context: int = param(100_000, "context at which the agent compacts")
    summary_median: int = param(2000, "compaction summary, tokens (new chain: system + summary)")


class Agent(Workload):
    """Tool-agent loops: each step appends a tool call, its output and reasoning to the context."""

    name = "agent"
    default_requests = 30_000

    def __init__(self, params: AgentParams, trace: Trace, seed: int) -> None:
        super().__init__(params, trace, seed)
        p = params
        self.systems, _ = self.shared_prompts(p.frameworks, p.system_min, p.system_max)
        self.pick_system = Zipf(p.frameworks, p.system_zipf, self.rng)

    def session(self, t0: float) -> None:
        p: AgentParams = self.p
        rng, tr = self.rng, self.trace
        steps = min(p.steps_max, max(1, round(lognormal(rng, p.steps_median, p.steps_sigma))))
        system = self.systems[self.pick_system.sample()]
        ctx = system.fork()
        ctx.append(tr.uid(), lognormal_int(rng, p.task_median, 1.0, 16, 32_000))
        checkpoints: list[Context] = []
        t = t0
        for _ in range(steps):
            if checkpoints and rng.random() < p.branch_prob:
                ctx = rng.choice(checkpoints).fork()
                # The restart says why (a short note), so the branch diverges right away.
                ctx.append(tr.uid(), lognormal_int(rng, 60, 0.5, 8, 1000))
            out = lognormal_int(rng, p.call_median, p.call_sigma, 4, 8192)
            tr.emit(t, ctx, out)
            checkpoints.append(ctx.fork())
            t += ctx.tokens / p.prefill_tps + out / p.decode_tps
            ctx.append(tr.uid(), out)
            ctx.append(tr.uid(), lognormal_int(rng, p.tool_median, p.tool_sigma, 8, p.tool_max))
            t += max(0.05, lognormal(rng, p.tool_latency_s, 1.0))
            if ctx.tokens > p.max_context:
                ctx = system.fork()
                ctx.append(tr.uid(), lognormal_int(rng, p.summary_median, 0.3, 256, 8000))
                checkpoints = []


@dataclass
class RagParams:
    """Parameters of ``rag``."""

    rate: float = param(10.0, "request arrivals per second (Poisson)")
    apps: int = param(3, "RAG applications, each with its own system prompt")
    system_min: int = param(300, "smallest system prompt, tokens (log-uniform)")
    system_max: int = param(1500, "largest system prompt, tokens")
    docs: int = param(5000, "documents in the corpus")
    chunks_per_doc: int = param(10, "chunks per document")
    doc_zipf: float = param(1.0, "Zipf exponent of document popularity")
    chunk_median: int = param(400, "chunk length, tokens: lognormal median (sigma 0.4)")
    k: int = param(5, "chunks retrieved per query")
    queries: int = param(20_000, "distinct recurring queries")
    query_zipf: float = param(0.9, "Zipf exponent of recurring-query popularity")
    novel_prob: float = param(0.4, "a request is a one-off query (fresh chunk draw and order)")
    reorder_prob: float = param(0.15, "a recurring query gets its chunks in a different order")
    drift_prob: float = param(0.1, "a recurring query gets one chunk replaced (index changed)")
    same_question_prob: float = param(
        0.5, "a recurring query repeats its exact wording (else a paraphrase of similar length)"
    )
    question_median: int = param(30, "question, tokens: lognormal median (sigma 0.7)")
    answer_median: int = param(250, "output_length: lognormal median (sigma 0.8)")


class Rag(Workload):
    """RAG: a shared system prompt, k retrieved chunks, then the question."""

    name = "rag"
    default_requests = 30_000

    def __init__(self, params: RagParams, trace: Trace, seed: int) -> None:
        super().__init__(params, trace, seed)
        p = params
        self.systems, _ = self.shared_prompts(p.apps, p.system_min, p.system_max)
        self.pick_app = Zipf(p.apps, 1.0, self.rng)
        self.pick_doc = Zipf(p.docs, p.doc_zipf, self.rng)
        self.pick_query = Zipf(p.queries, p.query_zipf, self.rng)
        self.chunk_uid: dict[int, tuple[int, int]] = {}
        # Recurring queries, made on first use: app, chunk list, question (uid, length).
        self.query: dict[int, tuple[int, list[int], int, int]] = {}

    def chunk(self, c: int) -> tuple[int, int]:
        """Content id and length of corpus chunk ``c`` (fixed once drawn)."""
        got = self.chunk_uid.get(c)
        if got is None:
            got = (self.trace.uid(), lognormal_int(self.rng, self.p.chunk_median, 0.4, 64, 2048))
            self.chunk_uid[c] = got
        return got

    def retrieve(self) -> list[int]:
        """k distinct chunks from Zipf-popular documents, in relevance order."""
        p: RagParams = self.p
        chosen: list[int] = []
        while len(chosen) < p.k:
            c = self.pick_doc.sample() * p.chunks_per_doc + self.rng.randrange(p.chunks_per_doc)
            if c not in chosen:
                chosen.append(c)
        return chosen

    def session(self, t0: float) -> None:
        p: RagParams = self.p
        rng, tr = self.rng, self.trace
        if rng.random() < p.novel_prob:
            app, chunks = self.pick_app.sample(), self.retrieve()
            q_uid = tr.uid()
            q_len = lognormal_int(rng, p.question_median, 0.7, 4, 2000)
        else:
            qi = self.pick_query.sample()
            known = self.query.get(qi)
            if known is None:
                known = (
                    self.pick_app.sample(),
                    self.retrieve(),
                    tr.uid(),
                    lognormal_int(rng, p.question_median, 0.7, 4, 2000),
                )
                self.query[qi] = known
            app, chunks, q_uid, q_len = known[0], known[1].copy(), known[2], known[3]
            if rng.random() < p.reorder_prob:
                rng.shuffle(chunks)
            if rng.random() < p.drift_prob:
                new = self.retrieve()[0]
                if new not in chunks:
                    chunks[rng.randrange(len(chunks))] = new
            if rng.random() >= p.same_question_prob:
                q_uid = tr.uid()
        ctx = self.systems[app].fork()
        for c in chunks:
            ctx.append(*self.chunk(c))
        ctx.append(q_uid, q_len)
        tr.emit(t0, ctx, lognormal_int(rng, p.answer_median, 0.8, 1, 8192))


@dataclass
class MixParams:
    """Parameters of ``mix``: component rates (each component keeps its own defaults)."""

    conversation_rate: float = param(2.5, "conversation sessions per second (~5 requests each)")
    system_prompts_rate: float = param(9.0, "system-prompts requests per second")
    agent_rate: float = param(0.25, "agent tasks per second (~30 requests each)")
    rag_rate: float = param(5.0, "rag requests per second")


WORKLOADS: dict[str, tuple[type[Workload], type[Any]]] = {
    "conversation": (Conversation, ConversationParams),
    "system-prompts": (SystemPrompts, SystemPromptsParams),
    "agent": (Agent, AgentParams),
    "rag": (Rag, RagParams),
    "chat": (Chat, ChatParams),
}
MIX: tuple[str, ...] = ("conversation", "system-prompts", "agent", "rag")
"""The components of ``mix``."""
DEFAULT_MIX_REQUESTS = 40_000


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------


def coerce(default: Any, text: str) -> Any:
    """Parses ``text`` as the type of ``default``."""
    if isinstance(default, bool):
        return text.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


def build_params(cls: type[Any], overrides: dict[str, str]) -> Any:
    """An instance of the params dataclass ``cls`` with ``overrides`` (name -> text) applied."""
    obj = cls()
    names = {f.name for f in dataclasses.fields(obj)}
    for k, v in overrides.items():
        if k not in names:
            raise SystemExit(f"gen_traces: unknown parameter '{k}' (see: params)")
        setattr(obj, k, coerce(getattr(obj, k), v))
    return obj


def make_workloads(
    name: str, seed: int, rate: float | None, overrides: dict[str, str], trace: Trace
) -> list[Workload]:
    """The workload(s) behind ``name``; ``mix`` yields one per component."""
    if name == "mix":
        own = {k: v for k, v in overrides.items() if "." not in k}
        mix = build_params(MixParams, own)
        if rate is not None:
            raise SystemExit("gen_traces: mix takes --set <component>_rate=R, not --rate")
        out = []
        for comp in MIX:
            wcls, pcls = WORKLOADS[comp]
            sub = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith(comp + ".")}
            p = build_params(pcls, sub)
            p.rate = getattr(mix, comp.replace("-", "_") + "_rate")
            out.append(wcls(p, trace, seed))
        return out
    wcls, pcls = WORKLOADS[name]
    p = build_params(pcls, overrides)
    if rate is not None:
        p.rate = rate
    return [wcls(p, trace, seed)]


def generate(
    name: str,
    requests: int | None = None,
    sessions: int | None = None,
    seed: int = 1,
    rate: float | None = None,
    overrides: dict[str, str] | None = None,
    record: bool = False,
) -> list[Request]:
    """Generates a trace: requests sorted by time, ids renumbered by first appearance.

    With ``requests`` (the default count of the workload when neither is given) the trace is the
    first ``requests`` requests in time of an unbounded run: sessions are generated until every
    session that starts before the last kept request has been generated, so the window is exact
    (sessions still running at its end are cut, as in a real trace).
    With ``sessions`` exactly that many sessions are generated in full (then cut to ``requests``
    if that is given too).
    """
    trace = Trace(record)
    workloads = make_workloads(name, seed, rate, overrides or {}, trace)
    if requests is None and sessions is None:
        requests = DEFAULT_MIX_REQUESTS if name == "mix" else workloads[0].default_requests
    heap = [(w.next_arrival(), i) for i, w in enumerate(workloads)]
    heapq.heapify(heap)

    def step() -> None:
        t, i = heapq.heappop(heap)
        workloads[i].session(t)
        heapq.heappush(heap, (workloads[i].next_arrival(), i))

    reqs = trace.requests
    if sessions is not None:
        for _ in range(sessions):
            step()
    else:
        assert requests is not None
        # A request is settled once the next session starts after it: no later session can
        # add a request before it. Stop when N are settled; they are the first N in time.
        pending: list[float] = []
        settled = 0
        while settled < requests:
            start = len(reqs)
            step()
            for r in reqs[start:]:
                heapq.heappush(pending, r.t)
            horizon = heap[0][0]
            while pending and pending[0] <= horizon and settled < requests:
                heapq.heappop(pending)
                settled += 1
    reqs.sort(key=lambda r: (r.t, r.seq))
    if requests is not None:
        del reqs[requests:]
    renumber(reqs)
    return reqs


def renumber(reqs: Sequence[Request]) -> None:
    """Renames block ids 0, 1, 2, ... in order of first appearance."""
    names: dict[int, int] = {}
    for r in reqs:
        ids = r.hash_ids
        for j, x in enumerate(ids):
            y = names.get(x)
            if y is None:
                y = names[x] = len(names)
            ids[j] = y


def write_jsonl(reqs: Iterable[Request], out: TextIO) -> None:
    """Writes the trace as Mooncake JSONL (timestamps in whole milliseconds)."""
    for r in reqs:
        out.write(
            json.dumps(
                {
                    "timestamp": int(r.t * 1000.0),
                    "input_length": r.input_length,
                    "output_length": r.output_length,
                    "hash_ids": r.hash_ids,
                }
            )
        )
        out.write("\n")


# --------------------------------------------------------------------------------------------------
# Statistics and checks (work on any Mooncake trace)
# --------------------------------------------------------------------------------------------------


class Row(NamedTuple):
    """One request as read from a trace file."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


def rows_of(reqs: Iterable[Request]) -> list[Row]:
    """Generated requests as they will be written."""
    return [Row(int(r.t * 1000.0), r.input_length, r.output_length, r.hash_ids) for r in reqs]


def load(path: str) -> list[Row]:
    """Reads a Mooncake JSONL trace (as bench/src/trace.rs ``load`` does)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            v = json.loads(line)
            out.append(
                Row(
                    int(v["timestamp"]),
                    int(v["input_length"]),
                    int(v.get("output_length", 0)),
                    [int(x) for x in v["hash_ids"]],
                )
            )
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values (nearest rank); 0 when empty."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def lru_hit_rate(rows: Sequence[Row], capacity: int) -> float:
    """Prefix hit rate of exact LRU holding ``capacity`` blocks (the dialect replay's model).

    Hits are the request's leading run of present blocks; every block of the request is then
    touched root to leaf (the missing ones stored) and the least recent evicted. Indicative only:
    ``kvtier-bench sim`` is the reference.
    """
    cache: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for r in rows:
        total += len(r.hash_ids)
        leading = True
        for x in r.hash_ids:
            if x in cache:
                if leading:
                    hits += 1
                cache.move_to_end(x)
            else:
                leading = False
                cache[x] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits / max(1, total)


def min_hit_rate(rows: Sequence[Row], capacity: int) -> float:
    """Prefix hit rate of Belady's MIN holding ``capacity`` blocks, same model as ``lru_hit_rate``.

    After each request the block whose next use is farthest (never, first) is evicted until the
    cache fits; a block's next use is never later than its descendants', so chains go from the
    tail. Indicative only, like ``lru_hit_rate``.
    """
    never = len(rows)
    nxt: list[list[int]] = [[] for _ in rows]
    last: dict[int, int] = {}
    for i in range(len(rows) - 1, -1, -1):
        ids = rows[i].hash_ids
        nxt[i] = [last.get(x, never) for x in ids]
        for x in ids:
            last[x] = i
    cache: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    hits = total = 0
    for i, r in enumerate(rows):
        ids = r.hash_ids
        total += len(ids)
        for x in ids:
            if x not in cache:
                break
            hits += 1
        for x, nu in zip(ids, nxt[i], strict=True):
            cache[x] = nu
            heapq.heappush(heap, (-nu, x))
        while len(cache) > capacity:
            nu, x = heapq.heappop(heap)
            if cache.get(x) == -nu:
                del cache[x]
    return hits / max(1, total)


def summarize(rows: Sequence[Row], capacities: Sequence[float] = ()) -> dict[str, float]:
    """Summary statistics of a trace under the prefix model with an infinite cache.

    A block read is a reuse when it is in the request's leading run of blocks already seen.
    """
    seen: dict[int, int] = {}  # id -> last access, ms
    first: dict[int, int] = {}
    hits_of: dict[int, int] = {}
    kind: dict[int, bool] = {}  # id -> stored as a request's final partial block
    gaps: list[int] = []
    reads = hits = partial = 0
    for r in rows:
        ids = r.hash_ids
        reads += len(ids)
        is_partial = r.input_length % BLOCK_TOKENS != 0
        partial += is_partial
        run = True
        last = len(ids) - 1
        for j, x in enumerate(ids):
            prev = seen.get(x)
            if prev is not None and run:
                hits += 1
                hits_of[x] = hits_of.get(x, 0) + 1
                gaps.append(r.timestamp - prev)
            elif prev is None:
                run = False
                first[x] = r.timestamp
                kind[x] = is_partial and j == last
            else:
                run = False
            seen[x] = r.timestamp
    unique = len(seen)
    lengths = sorted(r.input_length for r in rows)
    n = len(rows)
    counts = sorted(hits_of.values(), reverse=True)
    top = counts[: max(1, unique // 10)]
    lifetimes = sorted(seen[x] - first[x] for x in hits_of)
    gaps.sort()
    stored_partial = sum(1 for v in kind.values() if v)
    stored_full = unique - stored_partial
    reused_partial = sum(1 for x in hits_of if kind[x])
    reused_full = len(hits_of) - reused_partial
    out: dict[str, float] = {
        "requests": n,
        "duration_s": (rows[-1].timestamp - rows[0].timestamp) / 1000.0 if rows else 0.0,
        "unique_blocks": unique,
        "block_reads": reads,
        "reuse": hits / max(1, reads),
        "prompt_mean": sum(lengths) / max(1, n),
        "prompt_p50": percentile(lengths, 0.5),
        "prompt_p90": percentile(lengths, 0.9),
        "prompt_p99": percentile(lengths, 0.99),
        "prompt_max": lengths[-1] if lengths else 0,
        "output_mean": sum(r.output_length for r in rows) / max(1, n),
        "partial_final": partial / max(1, n),
        "top10_share": sum(top) / max(1, hits),
        "reused_blocks": len(hits_of) / max(1, unique),
        "new_full_reused": reused_full / max(1, stored_full),
        "new_partial_reused": reused_partial / max(1, stored_partial),
        "gap_p50_s": percentile(gaps, 0.5) / 1000.0,
        "gap_p90_s": percentile(gaps, 0.9) / 1000.0,
        "gap_p99_s": percentile(gaps, 0.99) / 1000.0,
        "life_p50_s": percentile(lifetimes, 0.5) / 1000.0,
        "life_p99_s": percentile(lifetimes, 0.99) / 1000.0,
    }
    for f in capacities:
        out[f"lru@{f:g}"] = lru_hit_rate(rows, max(1, int(f * unique)))
    for f in capacities:
        out[f"min@{f:g}"] = min_hit_rate(rows, max(1, int(f * unique)))
    return out


def shape(rows: Sequence[Row]) -> dict[str, float]:
    """What decides hit rates on real conversations, in requests rather than seconds.

    - ``root_share``: requests whose first block is the most common first block (one shared
      system prompt: 1.0);
    - ``early_shared``: unique blocks at positions 1-2 that more than one request references;
    - ``blocks_*``: blocks per request;
    - ``once``: unique blocks referenced by one request only;
    - ``continues``: requests that continue an earlier one, that is whose ids start with all of
      an earlier request's full blocks (its final partial block left out), more than its first
      block; for those, ``cover_p50`` is the share of the request that prefix covers and
      ``turn_back_*`` how many requests back that earlier one is (the latest such);
    - ``reref_*``: for each block a request references again, requests since the last one that
      referenced it.
    """
    first_count: dict[int, int] = {}
    refs: dict[int, int] = {}  # id -> requests that reference it
    early: set[int] = set()
    last_ref: dict[int, int] = {}  # id -> index of the last request referencing it
    ends: dict[int, int] = {}  # id of a request's last full block -> that request's index
    rerefs: list[int] = []
    backs: list[int] = []
    covers: list[float] = []
    for i, r in enumerate(rows):
        ids = r.hash_ids
        if not ids:
            continue
        first_count[ids[0]] = first_count.get(ids[0], 0) + 1
        # The longest earlier request this one continues: its full blocks' last id is one of
        # ours, past the first (a chained id names its whole prefix).
        for j in range(len(ids) - 1, 0, -1):
            e = ends.get(ids[j])
            if e is not None:
                backs.append(i - e)
                covers.append((j + 1) / len(ids))
                break
        for j, x in enumerate(dict.fromkeys(ids)):
            refs[x] = refs.get(x, 0) + 1
            if 1 <= j <= 2:
                early.add(x)
            prev = last_ref.get(x)
            if prev is not None:
                rerefs.append(i - prev)
            last_ref[x] = i
        full = len(ids) - (1 if r.input_length % BLOCK_TOKENS else 0)
        if full >= 2:
            ends[ids[full - 1]] = i
    n = sum(1 for r in rows if r.hash_ids)
    lens = sorted(len(r.hash_ids) for r in rows)
    for v in (rerefs, backs, covers):
        v.sort()
    return {
        "root_share": max(first_count.values(), default=0) / max(1, n),
        "early_shared": sum(1 for x in early if refs[x] > 1) / max(1, len(early)),
        "blocks_mean": sum(lens) / max(1, len(lens)),
        "blocks_p10": percentile(lens, 0.1),
        "blocks_p50": percentile(lens, 0.5),
        "blocks_p90": percentile(lens, 0.9),
        "blocks_p99": percentile(lens, 0.99),
        "output_p50": percentile(sorted(r.output_length for r in rows), 0.5),
        "once": sum(1 for c in refs.values() if c == 1) / max(1, len(refs)),
        "continues": len(backs) / max(1, n),
        "cover_p50": percentile(covers, 0.5),
        "turn_back_p10": percentile(backs, 0.1),
        "turn_back_p50": percentile(backs, 0.5),
        "turn_back_p90": percentile(backs, 0.9),
        "reref_p10": percentile(rerefs, 0.1),
        "reref_p50": percentile(rerefs, 0.5),
        "reref_p90": percentile(rerefs, 0.9),
        "reref_p99": percentile(rerefs, 0.99),
    }


STAT_DOCS: dict[str, str] = {
    "requests": "requests",
    "duration_s": "first to last timestamp, s",
    "unique_blocks": "distinct block ids",
    "block_reads": "sum of len(hash_ids)",
    "reuse": "block reads that are reuses (infinite-cache prefix hit rate)",
    "prompt_mean": "input_length mean, tokens",
    "prompt_p50": "input_length median",
    "prompt_p90": "input_length P90",
    "prompt_p99": "input_length P99",
    "prompt_max": "input_length max",
    "output_mean": "output_length mean",
    "partial_final": "requests whose last block is partial",
    "top10_share": "share of reuses going to the 10% most reused blocks (of all unique blocks)",
    "reused_blocks": "unique blocks read again at least once",
    "new_full_reused": "newly stored full blocks read again later",
    "new_partial_reused": "newly stored final partial blocks read again later",
    "gap_p50_s": "time between a reuse and the previous access of the block: median, s",
    "gap_p90_s": "reuse gap P90, s",
    "gap_p99_s": "reuse gap P99, s",
    "life_p50_s": "lifetime (first to last access) of reused blocks: median, s",
    "life_p99_s": "lifetime P99, s",
    "root_share": "requests starting with the most common first block",
    "early_shared": "unique blocks at positions 1-2 referenced by more than one request",
    "blocks_mean": "blocks per request: mean",
    "blocks_p10": "blocks per request P10",
    "blocks_p50": "blocks per request median",
    "blocks_p90": "blocks per request P90",
    "blocks_p99": "blocks per request P99",
    "output_p50": "output_length median",
    "once": "unique blocks referenced by one request only",
    "continues": "requests continuing an earlier one (all its full blocks, more than one)",
    "cover_p50": "share of such a request its earlier turn covers: median",
    "turn_back_p10": "requests back to the earlier turn: P10",
    "turn_back_p50": "requests back to the earlier turn: median",
    "turn_back_p90": "requests back to the earlier turn: P90",
    "reref_p10": "requests between a block's references: P10",
    "reref_p50": "requests between a block's references: median",
    "reref_p90": "requests between a block's references: P90",
    "reref_p99": "requests between a block's references: P99",
}


def format_stats(title: str, stats: dict[str, float]) -> str:
    """Human-readable summary."""
    lines = [f"== {title}"]
    for k, v in stats.items():
        shown = f"{v:.4f}" if isinstance(v, float) and abs(v) < 10 else f"{v:,.0f}"
        if isinstance(v, float) and 10 <= abs(v) < 1000 and k.endswith("_s"):
            shown = f"{v:.1f}"
        doc = STAT_DOCS.get(k) or (
            f"{'exact LRU' if k.startswith('lru') else 'Belady MIN'}: prefix hit rate at this"
            " capacity (fraction of unique blocks)"
        )
        lines.append(f"  {k:<20} {shown:>14}  {doc}")
    return "\n".join(lines)


def check_rows(rows: Sequence[Row]) -> list[str]:
    """Structural invariants of a Mooncake trace; returns the violations (empty when fine).

    - timestamps are non-negative integers, non-decreasing;
    - ``len(hash_ids) == ceil(input_length / 512)``; ids are non-negative integers;
    - an id always has the same predecessor and position (a chained id names its prefix);
    - an id that ends a request on a partial block appears only as the final block of requests
      with the same ``input_length`` (a partial block is reused only by the identical prompt).
    """
    errors: list[str] = []
    parent: dict[int, tuple[int, int]] = {}
    partial_len: dict[int, int] = {}
    inner: set[int] = set()
    prev_t = 0
    for n, r in enumerate(rows, 1):
        if len(errors) > 20:
            break
        if r.timestamp < prev_t or r.timestamp < 0:
            errors.append(f"line {n}: timestamp {r.timestamp} after {prev_t}")
        prev_t = r.timestamp
        ids = r.hash_ids
        if len(ids) != -(-r.input_length // BLOCK_TOKENS):
            errors.append(f"line {n}: {len(ids)} ids for {r.input_length} tokens")
        for j, x in enumerate(ids):
            if x < 0:
                errors.append(f"line {n}: negative id {x}")
            want = (ids[j - 1] if j else ROOT, j)
            if parent.setdefault(x, want) != want:
                errors.append(f"line {n}: id {x} at {want}, before at {parent[x]}")
        final_partial = r.input_length % BLOCK_TOKENS != 0
        for x in ids[:-1] if final_partial else ids:
            inner.add(x)
            if x in partial_len:
                errors.append(f"line {n}: partial block {x} reused as a full block")
        if final_partial and ids:
            x = ids[-1]
            if x in inner:
                errors.append(f"line {n}: full block {x} reused as a partial block")
            if partial_len.setdefault(x, r.input_length) != r.input_length:
                errors.append(f"line {n}: partial block {x} reused by a different prompt length")
    return errors


def check_segments(reqs: Sequence[Request]) -> list[str]:
    """Checks the ids against the prompts' recorded segments, independently of ``BlockTable``.

    For every request and block boundary b (512, 1024, ..., input_length) the token prefix
    [0, b) is fingerprinted from the segments; prefix fingerprints and ids must map one to one.
    """
    by_print: dict[bytes, int] = {}
    by_id: dict[int, bytes] = {}
    errors: list[str] = []
    for r in reqs:
        assert r.segments is not None
        h = hashlib.sha256()
        pos = 0
        j = 0
        ids = r.hash_ids
        for uid, n in r.segments:
            end = pos + n
            while j < len(ids) and min((j + 1) * BLOCK_TOKENS, r.input_length) <= end:
                b = min((j + 1) * BLOCK_TOKENS, r.input_length)
                g = h.copy()
                g.update(f"{uid}:{b - pos};".encode())
                fp = g.digest()
                if by_print.setdefault(fp, ids[j]) != ids[j] or by_id.setdefault(ids[j], fp) != fp:
                    errors.append(f"request {r.seq} block {j}: id {ids[j]} vs prefix")
                j += 1
            h.update(f"{uid}:{n};".encode())
            pos = end
        if pos != r.input_length or j != len(ids):
            errors.append(f"request {r.seq}: segments cover {pos} tokens, {j} of {len(ids)} ids")
    return errors


# --------------------------------------------------------------------------------------------------
# The standard set
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Standard:
    """One trace of the standard tuning set."""

    name: str
    workload: str
    requests: int
    seed: int
    rate: float | None = None
    sets: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The generate command's arguments (without the output file)."""
        out = [self.workload, "--requests", str(self.requests), "--seed", str(self.seed)]
        if self.rate is not None:
            out += ["--rate", f"{self.rate:g}"]
        for kv in self.sets:
            out += ["--set", kv]
        return out


STANDARD: tuple[Standard, ...] = (
    Standard("conv-1", "conversation", 20_000, 1),
    Standard("conv-2", "conversation", 50_000, 2, 8.0, ("doc_prob=0.4", "turns_median=4")),
    Standard("sys-1", "system-prompts", 50_000, 1),
    Standard("agent-1", "agent", 30_000, 1),
    Standard("rag-1", "rag", 30_000, 1),
    Standard("mix-1", "mix", 40_000, 1),
    # Calibrated to a real multi-turn trace (docs/traces.md): its scale, twice as busy an hour
    # (twice the sessions at once, so turns come twice as many requests apart), and a longer
    # window of the same service.
    Standard("chat-1", "chat", 12_000, 1),
    Standard("chat-2", "chat", 24_000, 2, 4.6, ("gap_min=80", "gap_median=960")),
    Standard("chat-3", "chat", 30_000, 3),
)


# --------------------------------------------------------------------------------------------------
# Self-test
# --------------------------------------------------------------------------------------------------


def trace_bytes(reqs: Iterable[Request]) -> bytes:
    """The JSONL text of a trace."""
    buf = io.StringIO()
    write_jsonl(reqs, buf)
    return buf.getvalue().encode()


def selftest() -> None:
    """Asserts the invariants on small traces of every workload; raises AssertionError."""
    started = time.monotonic()
    checks = 0

    def ok(cond: bool, what: str) -> None:
        nonlocal checks
        checks += 1
        if not cond:
            raise AssertionError(what)

    # The conversation shape on a hand-made trace: one root (1), turn 1 = [1, 2, 3p], an
    # unrelated request, turn 2 continues turn 1's full blocks: [1, 2, 4, 5].
    sh = shape(
        [
            Row(0, 3 * BLOCK_TOKENS - 100, 10, [1, 2, 3]),
            Row(1, 2 * BLOCK_TOKENS, 20, [1, 6]),
            Row(2, 4 * BLOCK_TOKENS, 30, [1, 2, 4, 5]),
        ]
    )
    ok(sh["root_share"] == 1.0, f"root_share {sh}")
    ok(sh["continues"] == 1 / 3 and sh["cover_p50"] == 0.5, f"continues {sh}")
    ok(sh["turn_back_p50"] == 2, f"turn_back {sh}")
    ok(sh["once"] == 4 / 6, f"once {sh}")  # 3, 6, 4, 5 once; 1 and 2 more
    ok(sh["early_shared"] == 1 / 4, f"early_shared {sh}")  # 2, 3, 6, 4: only 2 shared
    ok(sh["reref_p50"] == 1 and sh["blocks_p50"] == 3, f"reref {sh}")

    # The block table on a hand-made case: 512 + 300 tokens, extended, and sent again.
    tr = Trace(record=True)
    a = tr.context()
    a.append(1, 512)
    a.append(2, 300)
    first = a.hash_ids()
    b = a.fork()
    b.append(3, 100)
    ok(b.hash_ids()[0] == first[0], "an extension keeps the full block")
    ok(b.hash_ids()[1] != first[1], "an extension changes the partial block")
    ok(a.hash_ids() == first, "the identical prompt gets the identical ids")
    c = tr.context()
    c.append(1, 512)
    c.append(2, 300)
    ok(c.hash_ids() == first, "equal prompts built separately get equal ids")
    d = tr.context()
    d.append(1, 300)
    d.append(2, 512)
    ok(d.hash_ids()[0] != first[0], "a different prefix gets a different id")
    e = tr.context()
    e.append(9, 1024)
    f = tr.context()
    f.append(9, 512)
    f.append(9 + 1, 512)
    ok(e.hash_ids()[0] == f.hash_ids()[0], "same first 512 tokens, same first id")
    ok(e.hash_ids()[1] != f.hash_ids()[1], "different second block, different id")

    for name in (*WORKLOADS, "mix"):
        reqs = generate(name, requests=1500, seed=7, record=True)
        rows = rows_of(reqs)
        ok(len(rows) == 1500, f"{name}: request count")
        errs = check_rows(rows)
        ok(not errs, f"{name}: {errs[:3]}")
        errs = check_segments(reqs)
        ok(not errs, f"{name}: ids disagree with prompts: {errs[:3]}")
        ok(all(r.output_length >= 1 for r in rows), f"{name}: output lengths")
        text = trace_bytes(reqs)
        ok(trace_bytes(generate(name, requests=1500, seed=7)) == text, f"{name}: deterministic")
        ok(trace_bytes(generate(name, requests=1500, seed=8)) != text, f"{name}: seed matters")
        # The file parses back as bench/src/trace.rs reads it (every field an integer).
        back = [json.loads(line) for line in text.decode().splitlines()]
        ok(
            all(
                set(v) == {"timestamp", "input_length", "output_length", "hash_ids"}
                and all(type(v[k]) is int for k in ("timestamp", "input_length", "output_length"))
                and all(type(x) is int and 0 <= x < 2**63 for x in v["hash_ids"])
                for v in back
            ),
            f"{name}: JSON fields",
        )
        ok([Row(**v) for v in back] == rows, f"{name}: round trip")
        s = summarize(rows)
        ok(s["partial_final"] > 0.95, f"{name}: most requests end in a partial block")
        ok(0.0 < s["reuse"] < 1.0, f"{name}: some reuse")
        ids = {x for r in rows for x in r.hash_ids}
        ok(ids == set(range(len(ids))), f"{name}: ids dense from 0")

    # Chat: one shared root, most blocks read once, a third of requests continue a turn.
    sh = shape(rows_of(generate("chat", requests=3000, seed=3)))
    ok(sh["root_share"] == 1.0, f"chat: one root {sh}")
    ok(0.6 < sh["once"] < 0.9 and 0.2 < sh["continues"] < 0.45, f"chat: shape {sh}")
    ok(sh["cover_p50"] > 0.6, f"chat: a continued turn covers most of the request {sh}")

    # The request window is exact: the first N of a longer run are the run of N.
    long = rows_of(generate("conversation", requests=3000, seed=3))
    short = rows_of(generate("conversation", requests=1000, seed=3))
    ok(
        [(r.timestamp, r.input_length, len(r.hash_ids)) for r in long[:1000]]
        == [(r.timestamp, r.input_length, len(r.hash_ids)) for r in short],
        "a shorter trace is a prefix of a longer one",
    )
    # Conversations: each turn's prompt extends the previous one's full blocks.
    sess = generate("conversation", sessions=200, seed=5, record=True)
    ok(not check_segments(sess), "conversation sessions consistent")
    s = summarize(rows_of(sess))
    ok(s["new_full_reused"] > 0.5, "conversation: a turn's new full blocks are read again")
    ok(s["new_partial_reused"] < 0.1, "conversation: partial blocks are rarely read again")
    print(
        f"selftest: {checks} passed, 0 failed ({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def parse_sets(items: Sequence[str]) -> dict[str, str]:
    """``name=value`` strings to a dict."""
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            raise SystemExit(f"gen_traces: --set wants name=value, got '{it}'")
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def print_params(names: Sequence[str], out: TextIO) -> None:
    """Lists each workload's parameters with defaults and meaning."""
    classes: list[tuple[str, type[Any]]] = [(n, WORKLOADS[n][1]) for n in names if n in WORKLOADS]
    if "mix" in names:
        classes.append(("mix", MixParams))
    for n, cls in classes:
        print(f"{n}:", file=out)
        for f in dataclasses.fields(cls):
            print(f"  {f.name:<20} {f.default!s:>8}  {f.metadata.get('doc', '')}", file=out)


def timed(what: str, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` and reports its duration on stderr."""
    t0 = time.monotonic()
    out = fn()
    print(f"gen_traces: {what} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return out


def parse_fractions(text: str | None) -> list[float]:
    """``0.05,0.1`` -> [0.05, 0.1]."""
    return [float(x) for x in text.split(",") if x] if text else []


def markdown_row(name: str, s: dict[str, float]) -> str:
    """One row of the standard set's table in docs/traces.md."""
    cells = [
        name,
        f"{s['requests']:,.0f}",
        f"{s['duration_s']:,.0f}",
        f"{s['unique_blocks']:,.0f}",
        f"{s['block_reads']:,.0f}",
        f"{s['reuse']:.3f}",
        f"{s['prompt_mean']:,.0f}",
        f"{s['prompt_p50']:,.0f}",
        f"{s['prompt_p99']:,.0f}",
        f"{s['partial_final']:.4f}",
        f"{s['top10_share']:.2f}",
        f"{s['new_full_reused']:.2f}",
        f"{s['new_partial_reused']:.3f}",
        f"{s['gap_p50_s']:,.1f}",
        f"{s['gap_p99_s']:,.0f}",
        f"{s['life_p99_s']:,.0f}",
    ]
    cells += [f"{v:.3f}" for k, v in s.items() if k.startswith(("lru@", "min@"))]
    return "| " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(
        description="Generate KV-cache request traces (Mooncake JSONL). See docs/traces.md."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in (*WORKLOADS, "mix"):
        g = sub.add_parser(name, help=f"generate a {name} trace")
        g.add_argument("--requests", type=int, help="requests to keep (first N in time)")
        g.add_argument("--sessions", type=int, help="generate exactly this many sessions")
        g.add_argument("--seed", type=int, default=1)
        g.add_argument("--rate", type=float, help="session arrivals per second")
        g.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="override a parameter (see: params); for mix also COMPONENT.NAME=VALUE",
        )
        g.add_argument("-o", "--output", help="output file (default: stdout)")
        g.add_argument("--stats", action="store_true", help="print a summary to stderr")
        g.add_argument(
            "--capacity",
            help="with --stats: LRU and MIN hit rates at these capacity fractions of unique blocks",
        )
    p = sub.add_parser("params", help="list parameters and defaults")
    p.add_argument("workload", nargs="*", default=[*WORKLOADS, "mix"])
    s = sub.add_parser("stats", help="summary of an existing trace")
    s.add_argument("file")
    s.add_argument("--capacity", help="LRU and MIN hit rates at these capacity fractions, e.g. 0.05,0.1,0.25")
    c = sub.add_parser("check", help="structural invariants of an existing trace")
    c.add_argument("file")
    st = sub.add_parser("standard", help="write the standard set (docs/traces.md)")
    st.add_argument("--out-dir", required=True)
    st.add_argument("--capacity", help="also LRU and MIN hit rates at these capacity fractions")
    st.add_argument("--only", action="append", help="only these names (conv-1, ...)")
    sub.add_parser("selftest", help="assert the generator's invariants")
    a = ap.parse_args(argv)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly

    if a.cmd == "selftest":
        selftest()
        return 0
    if a.cmd == "params":
        print_params(a.workload, sys.stdout)
        return 0
    if a.cmd in ("stats", "check"):
        rows = load(a.file)
        if a.cmd == "check":
            errs = check_rows(rows)
            for e in errs:
                print(e, file=sys.stderr)
            print(f"{a.file}: {len(rows)} requests, {len(errs)} violations", file=sys.stderr)
            return 1 if errs else 0
        stats = summarize(rows, parse_fractions(a.capacity)) | shape(rows)
        print(format_stats(a.file, stats))
        return 0
    if a.cmd == "standard":
        os.makedirs(a.out_dir, exist_ok=True)
        table = []
        for std in STANDARD:
            if a.only and std.name not in a.only:
                continue
            print("python3 bench/gen_traces.py " + " ".join(std.argv()), file=sys.stderr)
            t0 = time.monotonic()
            reqs = generate(std.workload, std.requests, None, std.seed, std.rate, parse_sets(std.sets))
            print(f"gen_traces: generated in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            path = os.path.join(a.out_dir, f"{std.name}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                write_jsonl(reqs, f)
            stats = summarize(rows_of(reqs), parse_fractions(a.capacity))
            print(format_stats(f"{std.name}: {path}", stats), file=sys.stderr)
            table.append(markdown_row(std.name, stats))
        print("\n".join(table))
        return 0

    reqs = timed(
        f"{a.cmd} generated",
        lambda: generate(a.cmd, a.requests, a.sessions, a.seed, a.rate, parse_sets(a.set), record=False),
    )
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            write_jsonl(reqs, f)
    else:
        write_jsonl(reqs, sys.stdout)
    if a.stats:
        print(
            format_stats(a.cmd, summarize(rows_of(reqs), parse_fractions(a.capacity))),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
