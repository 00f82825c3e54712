"""redis-py against kvtier: RESP2 and RESP3, with hiredis and with the
pure-Python parsers, through the helpers applications actually call."""

from __future__ import annotations

import datetime
import os
import time
from typing import Iterator

import pytest
import redis
import redis.connection
import redis.utils

from conftest import Server

# redis-py 5+ names its parsers _RESP2Parser/_RESP3Parser/_HiredisParser
# (4.x: PythonParser/HiredisParser); hiredis is only used when installed.
RESP2_PARSER = getattr(redis.connection, "_RESP2Parser", None) or getattr(redis.connection, "PythonParser")
RESP3_PARSER = getattr(redis.connection, "_RESP3Parser", None)
HIREDIS_PARSER = getattr(redis.connection, "_HiredisParser", None) or getattr(redis.connection, "HiredisParser", None)
HIREDIS = bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False)) and HIREDIS_PARSER is not None

VARIANTS = [
    pytest.param((2, "python"), id="resp2-python"),
    pytest.param((3, "python"), id="resp3-python", marks=pytest.mark.skipif(RESP3_PARSER is None, reason="redis-py without RESP3")),
    pytest.param((2, "hiredis"), id="resp2-hiredis", marks=pytest.mark.skipif(not HIREDIS, reason="hiredis not installed")),
    pytest.param((3, "hiredis"), id="resp3-hiredis", marks=pytest.mark.skipif(not HIREDIS, reason="hiredis not installed")),
]

BIG = 16 * 1024 * 1024


def make_client(server: Server, protocol: int, parser: str, **kwargs) -> redis.Redis:
    if parser == "hiredis":
        parser_class = HIREDIS_PARSER
    else:
        parser_class = RESP3_PARSER if protocol == 3 else RESP2_PARSER
    pool = redis.ConnectionPool(
        host=server.host,
        port=server.port,
        protocol=protocol,
        parser_class=parser_class,
        socket_timeout=30,
        socket_connect_timeout=5,
        **kwargs,
    )
    return redis.Redis(connection_pool=pool)


@pytest.fixture(params=VARIANTS)
def r(request, kvtier: Server) -> Iterator[redis.Redis]:
    protocol, parser = request.param
    client = make_client(kvtier, protocol, parser)
    client.flushall()
    # The parser really is the one asked for.
    conn = client.connection_pool.get_connection()
    try:
        name = type(conn._parser).__name__
        assert ("Hiredis" in name) == (parser == "hiredis"), name
    finally:
        client.connection_pool.release(conn)
    client.protocol = protocol  # remembered for assertions
    yield client
    client.close()


@pytest.fixture(params=VARIANTS)
def rd(request, kvtier: Server) -> Iterator[redis.Redis]:
    """Like `r`, with decode_responses=True."""
    protocol, parser = request.param
    client = make_client(kvtier, protocol, parser, decode_responses=True)
    client.flushall()
    yield client
    client.close()


def test_hello_and_version(r: redis.Redis) -> None:
    hello = r.execute_command("HELLO")
    hello = {k.decode() if isinstance(k, bytes) else k: v for k, v in (hello.items() if isinstance(hello, dict) else zip(hello[::2], hello[1::2]))}
    assert hello["proto"] == r.protocol
    assert hello["version"] in (b"7.2.4", "7.2.4")
    assert r.ping() is True


def test_strings(r: redis.Redis) -> None:
    assert r.set("k", "v") is True
    assert r.get("k") == b"v"
    assert r.set("k", "w", nx=True) is None
    assert r.set("k", "w", xx=True, get=True) == b"v"
    assert r.set("new", "x", xx=True) is None
    assert r.setnx("k", "z") is False
    assert r.setnx("k2", "z") is True
    assert r.getset("k2", "y") == b"z"
    assert r.getdel("k2") == b"y"
    assert r.getdel("k2") is None
    assert r.mset({"a": "1", "b": "2", "{a}c": "3"}) is True
    assert r.mget("a", "b", "{a}c", "missing") == [b"1", b"2", b"3", None]
    assert r.msetnx({"a": "9", "z": "9"}) is False
    assert r.msetnx({"y": "1", "z": "2"}) is True
    assert r.append("a", "23") == 3
    assert r.strlen("a") == 3
    assert r.getrange("a", 0, 1) == b"12"
    assert r.setrange("a", 5, "x") == 6
    assert r.get("a") == b"123\x00\x00x"
    assert r.incr("n") == 1
    assert r.incrby("n", 41) == 42
    assert r.decr("n") == 41
    assert r.decrby("n", 40) == 1
    assert r.incrbyfloat("f", 2.5) == 2.5
    assert r.incrbyfloat("f", -1) == 1.5
    assert isinstance(r.incrbyfloat("f", 0), float)
    r.set("l1", "ohmytext")
    r.set("l2", "mynewtext")
    assert r.lcs("l1", "l2") == b"mytext"
    assert r.lcs("l1", "l2", len=True) == 6
    idx = r.lcs("l1", "l2", idx=True, withmatchlen=True)
    if isinstance(idx, list):  # RESP2: flat list
        idx = dict(zip(idx[::2], idx[1::2]))
    idx = {k.decode() if isinstance(k, bytes) else k: v for k, v in idx.items()}
    assert idx["len"] == 6
    assert idx["matches"][0] == [[4, 7], [5, 8], 4]
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.incr("l1")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'get' command"):
        r.execute_command("GET")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("SET", "k", "v", "FOO")


def test_decoded_responses(rd: redis.Redis) -> None:
    rd.set("ключ", "значение")
    assert rd.get("ключ") == "значение"
    assert rd.mget(["ключ", "nope"]) == ["значение", None]
    assert rd.keys("*") == ["ключ"]
    assert rd.type("ключ") == "string"
    assert rd.object("encoding", "ключ") == "embstr"
    assert rd.incrbyfloat("f", "0.1") == pytest.approx(0.1)
    assert isinstance(rd.info()["redis_version"], str)


def test_keys_and_types(r: redis.Redis) -> None:
    r.mset({"a": "1", "b": "2"})
    assert r.exists("a", "b", "c", "a") == 3
    assert r.touch("a", "c") == 1
    assert r.type("a") == b"string"
    assert r.type("nope") == b"none"
    assert r.rename("a", "a2") is True
    with pytest.raises(redis.ResponseError, match="no such key"):
        r.rename("a", "a3")
    assert r.renamenx("a2", "b") is False
    assert r.copy("a2", "a3") is True
    assert r.copy("a2", "a3") is False
    assert r.copy("a2", "a3", replace=True) is True
    assert r.object("encoding", "a3") == b"int"
    assert r.delete("a2", "a3", "nope") == 2
    assert r.unlink("b") == 1
    assert r.dbsize() == 0
    assert r.randomkey() is None
    r.set("only", "1")
    assert r.randomkey() == b"only"


def test_expiry_helpers(r: redis.Redis) -> None:
    r.set("k", "v", ex=datetime.timedelta(seconds=100))
    assert 99 <= r.ttl("k") <= 100
    assert 98_000 < r.pttl("k") <= 100_000
    r.set("k", "v", px=50_000)
    assert 49 <= r.ttl("k") <= 50
    r.set("k", "v", keepttl=True)
    assert 49 <= r.ttl("k") <= 50
    at = datetime.datetime.now() + datetime.timedelta(hours=1)
    assert r.expireat("k", at) is True
    assert abs(r.expiretime("k") - int(at.timestamp())) <= 1
    assert r.pexpireat("k", int(at.timestamp() * 1000)) is True
    assert abs(r.pexpiretime("k") - int(at.timestamp() * 1000)) <= 1
    assert r.expire("k", 100, nx=True) is False
    assert r.expire("k", 100, xx=True) is True
    assert r.expire("k", 50, gt=True) is False
    assert r.expire("k", 500, gt=True) is True
    assert r.expire("k", 600, lt=True) is False
    assert r.pexpire("k", 10_000, lt=True) is True
    assert r.persist("k") is True
    assert r.persist("k") is False
    assert r.ttl("k") == -1
    assert r.ttl("nope") == -2
    assert r.expiretime("k") == -1
    assert r.getex("k", ex=100) == b"v"
    assert 99 <= r.ttl("k") <= 100
    assert r.getex("k", persist=True) == b"v"
    assert r.ttl("k") == -1
    r.execute_command("SETEX", "s", 100, "v")
    r.execute_command("PSETEX", "p", 100_000, "v")
    assert r.ttl("s") > 0 and r.pttl("p") > 0
    # Keys really go away.
    r.set("gone", "v", px=30)
    r.set("gone2", "v")
    r.pexpire("gone2", 30)
    r.set("gone3", "v", exat=int(time.time()) - 10)
    time.sleep(0.15)
    assert r.get("gone") is None and r.exists("gone2") == 0 and r.get("gone3") is None


def test_pipelines(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(10_000):
        pipe.set(f"key:{i}", i)
    assert pipe.execute() == [True] * 10_000
    pipe = r.pipeline(transaction=False)
    for i in range(0, 10_000, 3):
        pipe.get(f"key:{i}")
    assert pipe.execute() == [str(i).encode() for i in range(0, 10_000, 3)]
    pipe = r.pipeline(transaction=False)
    pipe.set("s", "text").incr("s").get("s").expire("s", 100).ttl("s")
    result = pipe.execute(raise_on_error=False)
    assert result[0] is True and isinstance(result[1], redis.ResponseError)
    assert result[2:4] == [b"text", True] and 99 <= result[4] <= 100
    with pytest.raises(redis.ResponseError):
        r.pipeline(transaction=False).incr("s").execute()
    assert r.dbsize() == 10_001


def test_transaction_pipeline(r: redis.Redis) -> None:
    pipe = r.pipeline()
    pipe.set("a", 1).incr("a")
    assert pipe.execute() == [True, 2]


def test_scan_iter(r: redis.Redis) -> None:
    names = {f"user:{i}".encode() for i in range(1000)} | {f"{{s}}:{i}".encode() for i in range(100)}
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.set(name, "1")
    pipe.execute()
    found = list(r.scan_iter(count=50))
    assert len(found) == len(names) and set(found) == names
    found = list(r.scan_iter(match="user:1*", count=100))
    assert set(found) == {n for n in names if n.startswith(b"user:1")} and len(found) == 111
    assert set(r.scan_iter(match="{s}:*")) == {n for n in names if n.startswith(b"{s}")}
    assert len(list(r.scan_iter(_type="string", count=1000))) == len(names)
    assert list(r.scan_iter(_type="list")) == []
    cursor, batch = r.scan(0, count=10)
    assert isinstance(cursor, int) and isinstance(batch, list)
    assert set(r.keys("user:99*")) == {b"user:99"} | {f"user:99{i}".encode() for i in range(10)}


def test_client_name_and_list(r: redis.Redis) -> None:
    assert r.client_setname("py-test-client") is True
    assert r.client_getname() in (b"py-test-client", "py-test-client")
    mine = r.client_id()
    clients = r.client_list()
    me = [c for c in clients if int(c["id"]) == mine]
    assert len(me) == 1
    assert me[0]["name"] == "py-test-client"
    assert ":" in me[0]["addr"] and me[0]["cmd"].startswith("client")
    info = r.client_info()
    assert int(info["id"]) == mine and info["name"] == "py-test-client"
    assert any(int(c["id"]) == mine for c in r.client_list(_type="normal"))
    with pytest.raises(redis.ResponseError):
        r.client_setname("has space")


def test_info(r: redis.Redis) -> None:
    r.set("a", "1")
    r.set("b", "2", ex=100)
    info = r.info()
    assert info["redis_version"] == "7.2.4"
    assert info["redis_mode"] == "standalone"
    assert info["db0"]["keys"] == 2 and info["db0"]["expires"] == 1
    assert isinstance(info["used_memory"], int) and info["used_memory"] > 0
    assert r.info("server")["tcp_port"] == r.connection_pool.connection_kwargs["port"]
    stats = r.info("stats")
    assert isinstance(stats["total_commands_processed"], int)
    assert "keyspace_hits" in stats
    keyspace = r.info("keyspace")
    assert keyspace["db0"]["keys"] == 2 and 0 < keyspace["db0"]["avg_ttl"] <= 100_000
    everything = r.info("everything")
    assert "redis_version" in everything and "used_memory" in everything


def test_config_get_set(r: redis.Redis) -> None:
    assert r.config_get("databases") == {"databases": "1"}
    # The default limit is sized from the machine (--maxmemory auto), in bytes.
    assert int(r.config_get("maxmemory")["maxmemory"]) > 0
    policy = r.config_get("maxmemory-policy")["maxmemory-policy"]
    everything = r.config_get("*")
    assert "maxmemory" in everything and "timeout" in everything
    assert r.config_get("nosuchparam") == {}
    assert r.config_set("maxmemory-policy", "allkeys-lru") is True
    try:
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
    finally:
        r.config_set("maxmemory-policy", policy)
    with pytest.raises(redis.ResponseError):
        r.config_set("maxmemory-policy", "sometimes")


def test_memory_usage(r: redis.Redis) -> None:
    assert r.memory_usage("nope") is None
    r.set("small", "x")
    r.set("mib", b"\x00" * (1 << 20))
    small = r.memory_usage("small")
    big = r.memory_usage("mib", samples=0)
    assert isinstance(small, int) and 0 < small < 1000
    assert (1 << 20) <= big < (1 << 20) + 4096


@pytest.fixture(scope="module")
def big_value() -> bytes:
    return os.urandom(BIG)


def test_big_values(r: redis.Redis, big_value: bytes) -> None:
    assert r.set("big", big_value) is True
    assert r.strlen("big") == BIG
    assert r.get("big") == big_value
    assert r.getrange("big", BIG - 10, -1) == big_value[-10:]
    assert r.append("big", b"tail") == BIG + 4
    assert r.get("big")[-4:] == b"tail"
    pipe = r.pipeline(transaction=False)
    for i in range(3):
        pipe.set(f"big{i}", big_value)
    for i in range(3):
        pipe.get(f"big{i}")
    result = pipe.execute()
    assert result[:3] == [True] * 3
    assert all(v == big_value for v in result[3:])
    assert r.mget("big0", "big2") == [big_value, big_value]
    assert r.memory_usage("big0") >= BIG
    assert r.getdel("big1") == big_value
    assert r.copy("big0", "{big0}copy") is True
    assert r.get("{big0}copy") == big_value
