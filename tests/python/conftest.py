"""Fixtures: a kvtier server and a reference redis-server, started once per
test session on ephemeral ports and killed at the end.

* ``KVTIER_BIN`` names the kvtier binary (default ``target/debug/kvtier-server``
  at the repository root); it runs with ``--threads 4`` so multi-key commands
  really cross shards.
* ``redis-server`` (7.0, from PATH) runs with ``--save '' --appendonly no``.

Both children get ``PR_SET_PDEATHSIG`` so they die with pytest even if pytest
itself is killed, and every socket operation has a timeout.
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from resp import RawConnection, parse

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a server may take to start answering.
START_TIMEOUT = 30.0
#: Seconds a server may take to exit after SIGTERM before it gets SIGKILL.
STOP_TIMEOUT = 10.0


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when pytest goes away."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Server:
    """A running server process and where it listens."""

    name: str
    host: str
    port: int
    proc: subprocess.Popen
    log: Path

    def connect(self, timeout: float = 10.0) -> RawConnection:
        return RawConnection(self.host, self.port, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def _wait_until_ready(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        try:
            with RawConnection(server.host, server.port, timeout=2) as c:
                if c.call("PING") == b"+PONG\r\n":
                    return
        except OSError as e:
            last_error = e
        time.sleep(0.05)
    raise RuntimeError(f"{server.name} did not answer PING: {last_error}\n{server.log_tail()}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvtier_binary() -> Path:
    return Path(os.environ.get("KVTIER_BIN", ROOT / "target" / "debug" / "kvtier-server"))


def start_kvtier(log: Path, *extra: str) -> Server:
    """Starts kvtier on an ephemeral port, read from its first stdout line."""
    binary = kvtier_binary()
    if not binary.exists():
        raise RuntimeError(f"{binary} not found: run `cargo build -p kvtier-server` or set KVTIER_BIN")
    log_file = open(log, "wb")
    proc = subprocess.Popen(
        [str(binary), "--port", "0", "--metrics-addr", "none", "--threads", "4", *extra],
        stdout=subprocess.PIPE,
        stderr=log_file,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    log_file.close()
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
            raise RuntimeError(f"kvtier did not print its port:\n{log.read_text(errors='replace')}")
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            byte = os.read(proc.stdout.fileno(), 1)
            if not byte:
                continue
            line += byte
    m = re.search(rb"kvtier listening on ([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"unexpected first line from kvtier: {line!r}")
    server = Server("kvtier", m.group(1).decode(), int(m.group(2)), proc, log)
    _wait_until_ready(server)
    return server


def start_redis(workdir: Path) -> Server:
    """Starts redis-server on a free port (retrying if the port was taken)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (scripts/test.sh installs it)")
    last: Exception | None = None
    for attempt in range(5):
        port = _free_port()
        log = workdir / f"redis-{attempt}.log"
        log_file = open(log, "wb")
        proc = subprocess.Popen(
            [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "no",
                "--daemonize", "no",
                "--dir", str(workdir),
                "--logfile", "",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log_file.close()
        server = Server("redis-server", "127.0.0.1", port, proc, log)
        try:
            _wait_until_ready(server)
            return server
        except RuntimeError as e:
            last = e
            server.stop()
    raise RuntimeError(f"could not start redis-server: {last}")


@pytest.fixture(scope="session")
def kvtier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_kvtier(tmp_path_factory.mktemp("kvtier") / "kvtier.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    with server.connect() as c:
        info = parse(c.call("INFO", "server")).decode()
    version = re.search(r"redis_version:(\S+)", info).group(1)
    if not version.startswith("7."):
        server.stop()
        pytest.fail(f"the reference must be redis-server 7.x, found {version}")
    yield server
    server.stop()


@pytest.fixture
def kv(kvtier: Server) -> Iterator[RawConnection]:
    """A raw connection to an empty kvtier."""
    with kvtier.connect() as c:
        assert c.call("FLUSHALL") == b"+OK\r\n"
        yield c


@pytest.fixture
def ref(redis_server: Server) -> Iterator[RawConnection]:
    """A raw connection to an empty reference redis-server."""
    with redis_server.connect() as c:
        assert c.call("FLUSHALL") == b"+OK\r\n"
        yield c
