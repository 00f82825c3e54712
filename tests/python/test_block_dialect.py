"""The block dialect (MSETBLOCK, MGETPREFIX, PREFIXLEN, MEXISTS) from the
clients a connector would use: redis-py's ``execute_command`` with RESP2 and
RESP3 (pure-Python and hiredis parsers), and ``redis-cli`` with its output
parsed as a shell script would. Replies must come out as plain Python values
(lists of bytes, ints) and errors as ``ResponseError``, with no special code.

The kvtier fixture runs with 4 shards; the chains below are built so that
their blocks are spread over all of them.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
import time
from typing import Iterator

import pytest
import redis
import redis.connection
import redis.utils
from redis.crc import key_slot

from conftest import Server

SHARDS = 4
SLOTS = 16384
#: Seconds any blocking call or subprocess may take before the test fails.
TIMEOUT = 30

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


def make_client(server: Server, protocol: int, parser: str) -> redis.Redis:
    if parser == "hiredis":
        parser_class = HIREDIS_PARSER
    else:
        parser_class = RESP3_PARSER if protocol == 3 else RESP2_PARSER
    pool = redis.ConnectionPool(
        host=server.host,
        port=server.port,
        protocol=protocol,
        parser_class=parser_class,
        socket_timeout=TIMEOUT,
        socket_connect_timeout=5,
    )
    return redis.Redis(connection_pool=pool)


@pytest.fixture(params=VARIANTS)
def r(request, kvtier: Server) -> Iterator[redis.Redis]:
    protocol, parser = request.param
    client = make_client(kvtier, protocol, parser)
    client.flushall()
    yield client
    client.close()


def shard_of(key: str) -> int:
    return key_slot(key.encode()) * SHARDS // SLOTS


def chain(prefix: str, n: int) -> list[str]:
    """``n`` keys whose blocks go round the shards (block i on shard i % 4)."""
    keys = []
    for i in range(n):
        j = 0
        while shard_of(f"{prefix}:{i}:{j}") != i % SHARDS:
            j += 1
        keys.append(f"{prefix}:{i}:{j}")
    return keys


def value_of(key: str) -> bytes:
    """A block's content, derived from its key (verifiable by hash)."""
    digest = hashlib.sha256(key.encode()).digest()
    return digest * (8 + digest[0] % 32)


def msetblock(r: redis.Redis, keys: list[str], *options) -> list:
    args = []
    for k in keys:
        args += [k, value_of(k)]
    return r.execute_command("MSETBLOCK", len(keys), *args, *options)


def blocking_state(r: redis.Redis) -> tuple[int, int]:
    info = r.info("clients")
    return int(info["blocked_clients"]), int(info["total_blocking_keys"])


def wait_blocking_state(r: redis.Redis, want: tuple[int, int]) -> None:
    deadline = time.monotonic() + 15
    seen = blocking_state(r)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = blocking_state(r)
    assert seen == want, f"INFO clients stayed at {seen}, expected {want}"


# ---- redis-py --------------------------------------------------------------------


def test_msetblock_codes_and_options(r: redis.Redis) -> None:
    keys = chain("py:set", 6)
    assert {shard_of(k) for k in keys} == set(range(SHARDS))
    assert msetblock(r, keys[:3], "CHAIN", "PARENT", "py:root", "EX", 600) == [1, 1, 1]
    # Immutable unless REPLACE; a call's new blocks are still stored.
    assert r.execute_command("MSETBLOCK", 2, keys[0], b"other", keys[3], b"new") == [0, 1]
    assert r.get(keys[0]) == value_of(keys[0])
    assert r.execute_command("MSETBLOCK", 1, keys[0], b"other", "REPLACE") == [1]
    assert r.get(keys[0]) == b"other"
    for k in keys[1:3]:
        assert 0 < r.ttl(k) <= 600
    assert r.ttl(keys[0]) == -1
    assert msetblock(r, keys[4:], "PX", 60000) == [1, 1]
    assert all(0 < r.pttl(k) <= 60000 for k in keys[4:])


def test_prefix_reads(r: redis.Redis) -> None:
    keys = chain("py:get", 8)
    assert msetblock(r, keys[:5], "CHAIN") == [1] * 5
    assert msetblock(r, keys[6:]) == [1, 1]
    got = r.execute_command("MGETPREFIX", len(keys), *keys)
    assert got == [value_of(k) for k in keys[:5]]
    assert r.execute_command("MGETPREFIX", 2, keys[5], keys[0]) == []
    limit = len(value_of(keys[0])) + len(value_of(keys[1]))
    got = r.execute_command("MGETPREFIX", len(keys), *keys, "MAXBYTES", limit)
    assert got == [value_of(k) for k in keys[:2]]
    assert r.execute_command("MGETPREFIX", len(keys), *keys, "MAXBYTES", 0) == []
    assert r.execute_command("PREFIXLEN", len(keys), *keys) == 5
    assert r.execute_command("PREFIXLEN", 1, "py:nope") == 0
    assert r.execute_command("MEXISTS", len(keys), *keys) == [1, 1, 1, 1, 1, 0, 1, 1]
    # Timeout: the partial prefix, an ordinary list.
    started = time.monotonic()
    got = r.execute_command("MGETPREFIX", len(keys), *keys, "BLOCK", 200)
    assert got == [value_of(k) for k in keys[:5]]
    assert time.monotonic() - started >= 0.15
    # Blocks are plain strings.
    assert r.mget(keys[:2]) == [value_of(k) for k in keys[:2]]
    assert r.exists(*keys) == 7


@pytest.mark.parametrize(
    "args, message",
    [
        (("MSETBLOCK", 0, "a", "1"), "numblocks should be greater than 0"),
        (("MSETBLOCK", "x", "a", "1"), "value is not an integer or out of range"),
        (("MSETBLOCK", 2, "a", "1", "b"), "syntax error"),
        (("MSETBLOCK", 1, "a", "1", "PARENT", "p"), "syntax error"),
        (("MSETBLOCK", 1, "a", "1", "EX", 10, "PX", 10), "syntax error"),
        (("MSETBLOCK", 1, "a", "1", "BOGUS"), "syntax error"),
        (("MSETBLOCK", 1, "a", "1", "EX", 0), "invalid expire time in 'msetblock' command"),
        (("MSETBLOCK", 1, "a"), "wrong number of arguments for 'msetblock' command"),
        (("MGETPREFIX", 0, "a"), "numkeys should be greater than 0"),
        (("MGETPREFIX", 3, "a", "b"), "syntax error"),
        (("MGETPREFIX", 1, "a", "MAXBYTES", -1), "MAXBYTES must not be negative"),
        (("MGETPREFIX", 1, "a", "BLOCK", 0), "timeout must be greater than 0"),
        (("MGETPREFIX", 2, "a", "b", "BLOCK", 10, "MIN", 3), "MIN must be between 1 and numkeys"),
        (("MGETPREFIX", 1, "a", "MIN", 1), "syntax error"),
        (("PREFIXLEN", 2, "a"), "syntax error"),
        (("MEXISTS", 1, "a", "b"), "syntax error"),
        (("PREFIXLEN", 1), "wrong number of arguments for 'prefixlen' command"),
    ],
)
def test_errors_are_response_errors(r: redis.Redis, args, message) -> None:
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*args)
    assert str(e.value) == message
    assert r.dbsize() == 0


def test_pipeline_of_dialect_commands(r: redis.Redis) -> None:
    keys = chain("py:pipe", 4)
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("MSETBLOCK", 2, keys[0], value_of(keys[0]), keys[1], value_of(keys[1]), "CHAIN")
    pipe.execute_command("PREFIXLEN", 4, *keys)
    pipe.execute_command("MGETPREFIX", 4, *keys)
    pipe.execute_command("MEXISTS", 4, *keys)
    pipe.execute_command("MGETPREFIX", 1, "a", "BOGUS")
    replies = pipe.execute(raise_on_error=False)
    assert replies[:4] == [[1, 1], 2, [value_of(keys[0]), value_of(keys[1])], [1, 1, 0, 0]]
    assert isinstance(replies[4], redis.ResponseError)


def test_blocking_read_wakes_on_write(r: redis.Redis, kvtier: Server) -> None:
    keys = chain("py:wait", 4)
    waiter = make_client(kvtier, r.connection_pool.connection_kwargs.get("protocol", 2), "python")
    result: dict = {}

    def wait() -> None:
        result["reply"] = waiter.execute_command("MGETPREFIX", 4, *keys, "BLOCK", 20000)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        wait_blocking_state(r, (1, 4))
        assert msetblock(r, keys, "CHAIN") == [1] * 4
        written = time.monotonic()
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the blocked MGETPREFIX never returned"
        assert result["reply"] == [value_of(k) for k in keys]
        assert result["at"] - written < 10, "woke long after the write"
        wait_blocking_state(r, (0, 0))
    finally:
        waiter.close()


def test_command_introspection_parses(r: redis.Redis) -> None:
    # redis-py's COMMAND parser (what its cluster client reads key
    # positions from) takes the whole table, the dialect included.
    table = r.command()
    for name in ("msetblock", "mgetprefix", "prefixlen", "mexists"):
        assert "movablekeys" in table[name]["flags"], table[name]
    assert table["mgetprefix"]["arity"] == -3
    assert "blocking" in table["mgetprefix"]["flags"]
    assert "write" in table["msetblock"]["flags"]
    # (Space-joined names: redis-py applies COMMAND's reply parser to
    # execute_command("COMMAND", ...), with redis-server as well.)
    info = r.execute_command("COMMAND INFO", "mgetprefix", "msetblock")
    assert [entry[0] for entry in info] == [b"mgetprefix", b"msetblock"]
    docs = r.execute_command("COMMAND DOCS", "mgetprefix")
    # RESP2: a flat list; RESP3: a dict. Either way the name is there.
    names = list(docs.keys()) if isinstance(docs, dict) else docs[::2]
    assert names == [b"mgetprefix"]
    keys = r.command_getkeys("MSETBLOCK", 2, "a", 1, "b", 2, "CHAIN", "PARENT", "p")
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == ["a", "b"]


# ---- redis-cli ----------------------------------------------------------------------

REDIS_CLI = shutil.which("redis-cli")
needs_cli = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not on PATH")


def cli(server: Server, *args: str, flags: tuple[str, ...] = ()) -> str:
    """redis-cli's stdout for one command (raw output, as in a pipe)."""
    done = subprocess.run(
        [REDIS_CLI, "-h", server.host, "-p", str(server.port), *flags, *args],
        capture_output=True,
        timeout=TIMEOUT,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return done.stdout.decode()


@pytest.fixture
def plain(kvtier: Server) -> Iterator[redis.Redis]:
    client = make_client(kvtier, 2, "python")
    client.flushall()
    yield client
    client.close()


@needs_cli
def test_redis_cli_raw_output(kvtier: Server, plain: redis.Redis) -> None:
    keys = chain("cli", 4)
    values = [f"value-of-{k}" for k in keys]
    store = ["MSETBLOCK", "3"]
    for k, v in zip(keys[:3], values[:3]):
        store += [k, v]
    assert cli(kvtier, *store, "CHAIN", "EX", "600").splitlines() == ["1", "1", "1"]
    assert cli(kvtier, *store).splitlines() == ["0", "0", "0"]
    out = cli(kvtier, "MGETPREFIX", "4", *keys)
    assert out.splitlines() == values[:3]
    out = cli(kvtier, "MGETPREFIX", "4", *keys, "MAXBYTES", str(len(values[0])))
    assert out.splitlines() == values[:1]
    assert cli(kvtier, "MGETPREFIX", "1", keys[3]).strip() == ""
    assert cli(kvtier, "PREFIXLEN", "4", *keys).strip() == "3"
    assert cli(kvtier, "MEXISTS", "4", keys[3], *keys[:3]).splitlines() == ["0", "1", "1", "1"]
    assert cli(kvtier, "MGETPREFIX", "1", "a", "BOGUS").strip() == "ERR syntax error"
    assert plain.get(keys[1]) == values[1].encode()


@needs_cli
@pytest.mark.parametrize("flags", [(), ("-3",)], ids=["resp2", "resp3"])
def test_redis_cli_formatted_output(kvtier: Server, plain: redis.Redis, flags: tuple[str, ...]) -> None:
    flags = (*flags, "--no-raw")
    keys = chain("clifmt", 3)
    out = cli(kvtier, "MSETBLOCK", "2", keys[0], "A", keys[1], "B", "CHAIN", flags=flags)
    assert out.splitlines() == ["1) (integer) 1", "2) (integer) 1"]
    out = cli(kvtier, "MGETPREFIX", "3", *keys, flags=flags)
    assert out.splitlines() == ['1) "A"', '2) "B"']
    assert cli(kvtier, "MGETPREFIX", "1", keys[2], flags=flags).strip() == "(empty array)"
    assert cli(kvtier, "PREFIXLEN", "3", *keys, flags=flags).strip() == "(integer) 2"
    out = cli(kvtier, "MEXISTS", "3", *keys, flags=flags)
    assert out.splitlines() == ["1) (integer) 1", "2) (integer) 1", "3) (integer) 0"]
    out = cli(kvtier, "MGETPREFIX", "1", keys[0], "BLOCK", "0", flags=flags)
    assert out.strip() == "(error) ERR timeout must be greater than 0"


@needs_cli
def test_redis_cli_json_output(kvtier: Server, plain: redis.Redis) -> None:
    keys = chain("clijson", 3)
    assert cli(kvtier, "MSETBLOCK", "2", keys[0], "A", keys[1], "B", flags=("--json",)).strip() == "[1,1]"
    assert cli(kvtier, "MGETPREFIX", "3", *keys, flags=("--json",)).strip() == '["A","B"]'
    assert cli(kvtier, "MEXISTS", "3", *keys, flags=("--json",)).strip() == "[1,1,0]"
    assert cli(kvtier, "PREFIXLEN", "3", *keys, flags=("--json",)).strip() == "2"


@needs_cli
def test_redis_cli_blocking_read(kvtier: Server, plain: redis.Redis) -> None:
    keys = chain("cliwait", 2)
    proc = subprocess.Popen(
        [REDIS_CLI, "-h", kvtier.host, "-p", str(kvtier.port), "MGETPREFIX", "2", *keys, "BLOCK", "20000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_blocking_state(plain, (1, 2))
        assert plain.execute_command("MSETBLOCK", 2, keys[0], "first", keys[1], "second", "CHAIN") == [1, 1]
        out, _ = proc.communicate(timeout=TIMEOUT)
        assert out.decode().splitlines() == ["first", "second"]
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    wait_blocking_state(plain, (0, 0))
