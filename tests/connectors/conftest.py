"""Fixtures of the connector tests: the real kvtier binary (``KVTIER_BIN``,
default ``target/debug/kvtier-server``) on ephemeral ports, alone or as a
three-node cluster, and the kvtier package from ``clients/python``.

These tests run in their own venv (``tests/connectors/venv.sh``: torch,
lmcache 0.5.6, sglang), separate from the quick ``tests/python`` suite.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from kvtier_servers import Server, free_ports, start_cluster, start_kvtier  # noqa: E402

__all__ = ["ROOT", "Server", "free_ports", "start_cluster", "start_kvtier"]


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
