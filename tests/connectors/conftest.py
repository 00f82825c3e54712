"""Fixtures of the connector tests: the real kvtier binary (``KVTIER_BIN``,
default ``target/debug/kvtier-server``) on ephemeral ports, alone or as a
three-node cluster, and the kvtier package from ``clients/python``.

These tests run in their own venv (``tests/connectors/venv.sh``: torch,
lmcache 0.5.6, sglang), separate from the quick ``tests/python`` suite.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from kvtier_servers import Server, free_ports, start_cluster, start_kvtier  # noqa: E402

__all__ = ["ROOT", "Server", "checkpoint", "free_ports", "start_cluster", "start_kvtier"]


def checkpoint(folder: Path, seed: int, size: int = 3 << 20) -> Path:
    """A folder with a config and a weight file of ``size`` bytes."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    rng = bytes((seed * 7 + i) % 251 for i in range(251))
    data = bytearray(rng * (size // len(rng) + 1))[:size]
    (folder / "model.safetensors").write_bytes(bytes(data))
    return folder


@pytest.fixture(scope="session")
def kvtier_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One kvtier with 4 shards (multi-key commands really cross shards)."""
    server = start_kvtier(tmp_path_factory.mktemp("kvtier") / "kvtier.log", "--threads", "4")
    yield server
    server.stop()


@pytest.fixture
def server(kvtier_server: Server) -> Server:
    """The shared kvtier, emptied."""
    kvtier_server.client().execute("FLUSHALL")
    return kvtier_server


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """Three kvtier nodes forming one cluster."""
    servers = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
def cluster_nodes(cluster: list[Server]) -> list[Server]:
    for s in cluster:
        s.client().execute("FLUSHALL")
    return cluster


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Test certificates (scripts/test-certs.sh): ca signed server and client,
    other-ca signed stranger."""
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [str(ROOT / "scripts" / "test-certs.sh"), str(d)], check=True, capture_output=True, timeout=120
    )
    return d


@pytest.fixture(scope="session")
def tls_kvtier(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """A kvtier with a TLS port that wants client certificates, and the
    ``kvtiers://`` URL a client with the right certificates uses."""
    port = free_ports(1)[0]
    server = start_kvtier(
        tmp_path_factory.mktemp("tls") / "kvtier.log",
        "--tls-port", str(port),
        "--tls-cert-file", str(certs / "server.crt"),
        "--tls-key-file", str(certs / "server.key"),
        "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", "yes",
    )  # fmt: skip
    url = "kvtiers://127.0.0.1:%d?ssl_ca_certs=%s&ssl_certfile=%s&ssl_keyfile=%s" % (
        port,
        certs / "ca.crt",
        certs / "client.crt",
        certs / "client.key",
    )
    yield server, url
    server.stop()


@pytest.fixture
def tls_url(tls_kvtier: tuple[Server, str]) -> str:
    """The TLS kvtier's URL, the server emptied."""
    tls_kvtier[0].client().execute("FLUSHALL")
    return tls_kvtier[1]
