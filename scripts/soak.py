#!/usr/bin/env python3
"""Soak: a kvtier with a spill dir under mixed load and hostile clients, for a
bounded time on loopback, restarted gracefully (SIGTERM) and abruptly
(SIGKILL) in between. Run by scripts/soak.sh.

Load: kvtier-bench kv (GET/SET, values verified), kvtier-bench trace
(dialect replay of a generated conversation trace, blocks verified), and a
writer storing MSETBLOCK chains whose every acknowledged block is recorded,
with a reader checking them. Hostility, at random: CLIENT KILL of random
clients, stalled readers (pipelined GETs of large values, never read),
oversized and never-ending requests, malformed frames.

Asserts: zero wrong bytes (kv, trace, reader); RSS never above maxmemory +
maxmemory-clients + the stalled readers' output limits + a stated margin;
every acknowledged block present and intact after each graceful restart.
Reports what fraction of them survive a SIGKILL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

MB = 1 << 20
#: What the process may hold beyond its data and client limits: runtime,
#: index and arena rounding, spill-tier buffers, allocator slack.
MARGIN = 256 * MB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest() * 128  # 4 KiB


#: MSETBLOCK calls of 8 blocks per second the writer makes at most (the
#: acknowledged blocks are all read back after each restart).
WRITES_PER_SECOND = 125


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.acked: list[str] = []
        self.lock = threading.Lock()
        self.wrong = 0
        self.errors: list[str] = []
        self.rss_max = 0
        self.stop = threading.Event()
        self.chaos_counts: dict[str, int] = {}
        self.seq = 0
        self.maxmemory = 256 * MB
        self.clients_limit = 64 * MB
        self.out_hard = 32 * MB
        self.stalled_max = 8

    # ---- the server -------------------------------------------------------

    def start(self) -> None:
        log = open(self.work / "kvtier.log", "ab")
        self.proc = subprocess.Popen(
            [
                self.args.bin, "--port", str(self.port), "--metrics-addr", "none",
                "--maxmemory", str(self.maxmemory), "--spill-dir", str(self.work / "spill"),
                "--maxmemory-clients", str(self.clients_limit),
                "--client-output-buffer-limit", f"normal {self.out_hard} {self.out_hard // 2} 5",
                "--timeout", "30",
            ],
            stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = redis.Redis(port=self.port, socket_timeout=2)
                # It answers at once; blocks on disk are misses until the
                # warm restart has indexed them (INFO spill_loading).
                if r.ping() and int(r.info("spill").get("spill_loading", 0)) == 0:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise SystemExit("kvtier did not start")

    def rss(self) -> int:
        assert self.proc is not None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def restart(self, sig: int) -> float:
        """Stops the server with `sig` and starts it again on the same spill
        dir; returns the seconds the stop took."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)
        took = time.monotonic() - started
        self.start()
        return took

    # ---- load -------------------------------------------------------------

    def writer(self) -> None:
        r = redis.Redis(port=self.port, socket_timeout=30, client_name="soak-writer")
        while not self.stop.is_set():
            time.sleep(1 / WRITES_PER_SECOND)
            keys = [f"soak:{self.seq}:{i}" for i in range(8)]
            self.seq += 1
            args: list = [8]
            for k in keys:
                args += [k, block(k)]
            try:
                replies = r.execute_command("MSETBLOCK", *args, "CHAIN")
            except redis.RedisError:
                continue  # killed or refused: nothing acknowledged
            with self.lock:
                self.acked.extend(k for k, ok in zip(keys, replies) if ok == 1)

    def reader(self) -> None:
        r = redis.Redis(port=self.port, socket_timeout=30, client_name="soak-reader")
        while not self.stop.is_set():
            with self.lock:
                sample = random.sample(self.acked, min(16, len(self.acked)))
            if not sample:
                time.sleep(0.05)
                continue
            try:
                values = r.mget(sample)
            except redis.RedisError:
                continue
            for k, v in zip(sample, values):
                # A block may be evicted past the spill budget (a miss), never wrong.
                if v is not None and v != block(k):
                    self.wrong += 1
                    self.errors.append(f"wrong bytes for {k}")

    def monitor(self) -> None:
        while not self.stop.is_set():
            self.rss_max = max(self.rss_max, self.rss())
            time.sleep(0.2)

    # ---- hostility --------------------------------------------------------

    def chaos(self) -> None:
        admin = redis.Redis(port=self.port, socket_timeout=10, client_name="soak-admin")
        stalled: list[socket.socket] = []
        admin.set("soak:big", os.urandom(MB))
        while not self.stop.is_set():
            action = random.choice(["kill", "stall", "oversized", "endless", "malformed"])
            self.chaos_counts[action] = self.chaos_counts.get(action, 0) + 1
            try:
                if action == "kill":
                    # The load generators do not reconnect: the victims are
                    # the writer, the reader and the stalled readers.
                    victims = [
                        c for c in admin.client_list()
                        if c.get("name", "").startswith("soak-") and c.get("name") != "soak-admin"
                    ]
                    if victims:
                        admin.client_kill_filter(_id=random.choice(victims)["id"])
                elif action == "stall":
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    s.sendall(b"CLIENT SETNAME soak-stalled\r\n" + b"GET soak:big\r\n" * 64)  # 64 MiB, never read
                    stalled.append(s)
                    if len(stalled) > self.stalled_max:
                        stalled.pop(0).close()
                elif action == "oversized":
                    with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                        s.sendall(b"*2147483647\r\n" + b"$16384\r\n" + b"x" * 16384)
                        s.sendall(b"$999999999999\r\n")
                        s.recv(256)
                elif action == "endless":
                    with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$500000000\r\n")
                        for _ in range(20):
                            s.sendall(os.urandom(64 * 1024))
                elif action == "malformed":
                    with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                        s.sendall(random.choice([b"*1\r\n$-5\r\n", b"*x\r\n", os.urandom(256), b"$3\r\nfoo\r\n"]))
                        s.recv(256)
            except (OSError, redis.RedisError):
                pass
            time.sleep(random.uniform(0.05, 0.3))
        for s in stalled:
            s.close()

    def bench(self, seconds: int, trace: Path) -> list[subprocess.Popen]:
        kv_json, trace_json = self.work / "kv.json", self.work / "trace.json"
        target = f"127.0.0.1:{self.port}"
        return [
            subprocess.Popen(
                [self.args.bench_bin, "kv", "--target", target, "--duration", str(seconds),
                 "--connections", "8", "--value-size", "4KiB", "--keys", "20000",
                 "--key-prefix", "kv:", "--json", str(kv_json)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [self.args.bench_bin, "trace", str(trace), "--target", target,
                 "--as-fast-as-possible", "--concurrency", "4", "--json", str(trace_json)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
        ]

    def verification_failures(self) -> int:
        failures = 0
        for name in ("kv.json", "trace.json"):
            path = self.work / name
            if path.exists():
                failures += int(json.loads(path.read_text()).get("verification_failures", 0))
                path.unlink()
        return failures

    # ---- checks -----------------------------------------------------------

    def check_acked(self) -> tuple[int, int, int]:
        """(present and intact, missing, wrong) of every acknowledged block."""
        r = redis.Redis(port=self.port, socket_timeout=60)
        present = missing = wrong = 0
        with self.lock:
            keys = list(self.acked)
        for i in range(0, len(keys), 256):
            chunk = keys[i : i + 256]
            for k, v in zip(chunk, r.mget(chunk)):
                if v is None:
                    missing += 1
                elif v != block(k):
                    wrong += 1
                else:
                    present += 1
        return present, missing, wrong

    def phase(self, seconds: int, trace: Path) -> None:
        self.stop.clear()
        threads = [threading.Thread(target=f, daemon=True) for f in (self.writer, self.reader, self.monitor, self.chaos)]
        for t in threads:
            t.start()
        benches = self.bench(seconds, trace)
        time.sleep(seconds)
        for b in benches:
            try:
                b.wait(timeout=60)
            except subprocess.TimeoutExpired:
                b.kill()
        self.stop.set()
        for t in threads:
            t.join(timeout=30)
        self.wrong += self.verification_failures()

    def run(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        trace = self.work / "trace.jsonl"
        subprocess.run(
            [sys.executable, str(Path(__file__).parent.parent / "bench" / "gen_traces.py"),
             "conversation", "--requests", "3000", "-o", str(trace)],
            check=True,
        )
        self.start()
        phase_seconds = max(10, self.args.seconds // 5)
        report = {"phases": []}
        ok = True
        for step, sig in enumerate([signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, None]):
            self.phase(phase_seconds, trace)
            info = redis.Redis(port=self.port, socket_timeout=30).info()
            entry = {
                "phase": step + 1,
                "acked": len(self.acked),
                "rss_max_mib": self.rss_max // MB,
                "used_memory_mib": info.get("used_memory", 0) // MB,
                "used_memory_index_mib": info.get("used_memory_index", 0) // MB,
                "spill_keys": info.get("spill_keys", 0),
                "keys": info.get("db0", {}).get("keys", 0),
            }
            if sig is not None:
                entry["stop"] = sig.name
                entry["stop_seconds"] = round(self.restart(sig), 2)
                present, missing, wrong = self.check_acked()
                entry.update(present=present, missing=missing, wrong=wrong)
                self.wrong += wrong
                if sig == signal.SIGTERM and missing:
                    ok = False
                    self.errors.append(f"{missing} acknowledged blocks missing after a graceful restart")
                if sig == signal.SIGKILL:
                    entry["survived_sigkill"] = round(present / max(1, present + missing), 4)
                    with self.lock:
                        # What was lost is lost; later checks count what survived.
                        r = redis.Redis(port=self.port, socket_timeout=60)
                        alive = []
                        for i in range(0, len(self.acked), 256):
                            chunk = self.acked[i : i + 256]
                            alive += [k for k, v in zip(chunk, r.mget(chunk)) if v is not None]
                        self.acked = alive
            report["phases"].append(entry)
            print(json.dumps(entry), flush=True)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        bound = self.maxmemory + self.clients_limit + self.stalled_max * self.out_hard + MARGIN
        report.update(
            wrong_bytes=self.wrong, rss_max_mib=self.rss_max // MB, rss_bound_mib=bound // MB,
            chaos=self.chaos_counts, errors=self.errors[:20],
        )
        if self.wrong:
            ok = False
        if self.rss_max > bound:
            ok = False
            self.errors.append(f"RSS {self.rss_max // MB} MiB over the bound {bound // MB} MiB")
        print(json.dumps(report, indent=1))
        print("SOAK:", "PASS" if ok else "FAIL")
        return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--bench-bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--seconds", type=int, default=300, help="total load time (5 phases' worth)")
    return Soak(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
