"""kvtier processes for the Python test suites (tests/connectors, tests/vllm):
the real binary (``KVTIER_BIN``, default ``target/debug/kvtier-server``) on
ephemeral ports, alone or as a cluster, killed when the test process goes
away."""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import kvtier  # noqa: E402

START_TIMEOUT = 30.0


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when pytest goes away."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Server:
    """A kvtier process and its address."""

    host: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    args: tuple[str, ...]

    @property
    def addr(self) -> str:
        return "%s:%d" % (self.host, self.port)

    @property
    def url(self) -> str:
        return "kvtier://" + self.addr

    def client(self, **kwargs: object) -> kvtier.Client:
        return kvtier.Client(self.addr, **kwargs)  # type: ignore[arg-type]

    def commandstats(self) -> dict[str, int]:
        """``INFO commandstats`` as {command: calls}."""
        text = self.client().execute("INFO", "commandstats")
        assert isinstance(text, bytes)
        return {
            m.group(1).decode().lower(): int(m.group(2))
            for m in re.finditer(rb"cmdstat_([a-zA-Z|_]+):calls=(\d+)", text)
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def kvtier_binary() -> Path:
    return Path(os.environ.get("KVTIER_BIN", ROOT / "target" / "debug" / "kvtier-server"))


def start_kvtier(log: Path, *extra: str) -> Server:
    """Starts kvtier (``--port 0`` unless given) and waits until it answers PING."""
    binary = kvtier_binary()
    if not binary.exists():
        raise RuntimeError("%s not found: build kvtier-server or set KVTIER_BIN" % binary)
    args = ("--metrics-addr", "none", *extra)
    if "--port" not in extra:
        args = ("--port", "0", *args)
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(binary), *args],
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("kvtier did not start:\n%s" % log.read_text(errors="replace"))
        if select.select([proc.stdout], [], [], left)[0]:
            byte = os.read(proc.stdout.fileno(), 1)
            if byte:
                line += byte
    m = re.search(rb"kvtier listening on ([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError("unexpected first line from kvtier: %r" % line)
    server = Server(m.group(1).decode(), int(m.group(2)), proc, log, args)
    c = server.client(socket_timeout=2)
    while True:
        try:
            if c.execute("PING") == b"PONG":
                break
        except kvtier.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    c.close()
    return server


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_cluster(workdir: Path, n: int = 3, *extra: str) -> list[Server]:
    ports = free_ports(n)
    members = ",".join("n%d@127.0.0.1:%d" % (i + 1, p) for i, p in enumerate(ports))
    return [
        start_kvtier(
            workdir / ("n%d.log" % (i + 1)),
            "--port",
            str(p),
            "--threads",
            "2",
            "--cluster-nodes",
            members,
            "--node-id",
            "n%d" % (i + 1),
            *extra,
        )
        for i, p in enumerate(ports)
    ]
