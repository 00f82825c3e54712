"""A three-node kvtier cluster driven by redis-py's RedisCluster (RESP2 and
RESP3, with and without read_from_replicas) and by plain clients on each
node: string and key commands over keys spread across all slots, the block
dialect sent to any node, and topology replies checked against where the
keys really live."""

from __future__ import annotations

import socket
from typing import Iterator

import pytest
import redis
from redis.cluster import ClusterNode, LoadBalancingStrategy, RedisCluster

from conftest import Server, start_kvtier


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    ports = _free_ports(3)
    nodes = ",".join(f"n{i + 1}@127.0.0.1:{p}" for i, p in enumerate(ports))
    workdir = tmp_path_factory.mktemp("cluster")
    servers = [
        start_kvtier(
            workdir / f"n{i + 1}.log",
            "--port", str(p),
            "--threads", "2",
            "--cluster-nodes", nodes,
            "--node-id", f"n{i + 1}",
        )
        for i, p in enumerate(ports)
    ]
    yield servers
    for s in servers:
        s.stop()


def _client(servers: list[Server], protocol: int, replicas: bool) -> RedisCluster:
    # Reads spread over primaries and replicas (what read_from_replicas did
    # before redis-py 5.3 named it a load-balancing strategy).
    options: dict[str, object] = {}
    if replicas:
        options["load_balancing_strategy"] = LoadBalancingStrategy.ROUND_ROBIN
    return RedisCluster(
        startup_nodes=[ClusterNode(s.host, s.port) for s in servers],
        protocol=protocol,
        socket_timeout=10,
        **options,
    )


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("replicas", [False, True])
def test_redis_cluster_client(cluster: list[Server], protocol: int, replicas: bool) -> None:
    rc = _client(cluster, protocol, replicas)
    try:
        prefix = f"py{protocol}{int(replicas)}"
        keys = [f"{prefix}:key:{i}" for i in range(300)]
        for i, k in enumerate(keys):
            assert rc.set(k, f"v{i}")
        for i, k in enumerate(keys):
            assert rc.get(k) == f"v{i}".encode()
        assert rc.mget_nonatomic(keys[:50]) == [f"v{i}".encode() for i in range(50)]
        assert rc.incr(f"{prefix}:counter", 3) == 3
        assert rc.append(keys[0], "!") == 3
        assert rc.strlen(keys[0]) == 3
        assert rc.expire(keys[1], 100)
        assert 0 < rc.ttl(keys[1]) <= 100
        assert rc.exists(keys[2]) == 1
        assert rc.delete(keys[3]) == 1
        assert rc.get(keys[3]) is None
        # Hash tags keep keys together; multi-key commands on one slot.
        rc.mset({f"{{{prefix}}}:a": "1", f"{{{prefix}}}:b": "2"})
        assert rc.mget(f"{{{prefix}}}:a", f"{{{prefix}}}:b") == [b"1", b"2"]
        # The keys are spread over every node.
        owners = {rc.get_node_from_key(k).port for k in keys}
        assert owners == {s.port for s in cluster}
        # The dialect, sent to one node, coordinates keys of every node.
        blocks = [f"{prefix}:block:{i}" for i in range(16)]
        args: list[object] = ["MSETBLOCK", len(blocks)]
        for i, b in enumerate(blocks):
            args += [b, f"kv{i}"]
        node = rc.get_random_node()
        assert rc.execute_command(*args, "CHAIN", target_nodes=node) == [1] * 16
        for target in rc.get_primaries():
            assert rc.execute_command("PREFIXLEN", 16, *blocks, target_nodes=target) == 16
            got = rc.execute_command("MGETPREFIX", 16, *blocks, target_nodes=target)
            assert got == [f"kv{i}".encode() for i in range(16)]
            assert rc.execute_command("MEXISTS", 2, blocks[0], "nope", target_nodes=target) == [1, 0]
    finally:
        rc.close()


def test_topology_agrees_with_where_keys_live(cluster: list[Server]) -> None:
    rc = _client(cluster, 2, False)
    try:
        for i in range(100):
            rc.set(f"where:{i}", i)
        by_port = {s.port: redis.Redis(host=s.host, port=s.port, socket_timeout=10) for s in cluster}
        for i in range(100):
            key = f"where:{i}"
            slot = rc.keyslot(key)
            owner = rc.get_node_from_key(key).port
            for port, plain in by_port.items():
                count = plain.execute_command("CLUSTER COUNTKEYSINSLOT", slot)
                if port == owner:
                    assert count >= 1
                    listed = plain.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
                    assert key in [k.decode() if isinstance(k, bytes) else k for k in listed]
                else:
                    assert count == 0
        # A plain client on any node reads every key (forwarded).
        for plain in by_port.values():
            assert [plain.get(f"where:{i}") for i in range(0, 100, 9)] == [
                str(i).encode() for i in range(0, 100, 9)
            ]
            info = plain.info("cluster")
            assert info["cluster_enabled"] == 1
        for plain in by_port.values():
            plain.close()
    finally:
        rc.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_every_node_is_a_primary_and_commands_on_primaries_cover_every_key(
    cluster: list[Server], protocol: int
) -> None:
    rc = _client(cluster, protocol, False)
    try:
        primaries = rc.get_primaries()
        assert sorted(n.port for n in primaries) == sorted(s.port for s in cluster)
        assert rc.get_replicas() == []
        rc.flushall(target_nodes=RedisCluster.PRIMARIES)
        keys = [f"cover{protocol}:{i}" for i in range(64)]
        for k in keys:
            rc.set(k, "x")
        # Spread over every node, and each node-wide command sees them all.
        assert {rc.get_node_from_key(k).port for k in keys} == {s.port for s in cluster}
        assert rc.dbsize(target_nodes=RedisCluster.PRIMARIES) == 64
        listed = rc.keys("cover*", target_nodes=RedisCluster.PRIMARIES)
        assert sorted(k.decode() for k in listed) == sorted(keys)
        scanned = set(rc.scan_iter(match="cover*", count=10, target_nodes=RedisCluster.PRIMARIES))
        assert {k.decode() for k in scanned} == set(keys)
        assert rc.flushall(target_nodes=RedisCluster.PRIMARIES)
        for s in cluster:
            plain = redis.Redis(host=s.host, port=s.port, socket_timeout=10)
            assert plain.dbsize() == 0
            plain.close()
    finally:
        rc.close()
