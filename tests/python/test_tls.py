"""TLS (rustls) with real clients: redis-cli --tls and redis-py ssl=True;
client certificates required, optional and refused; certificates reloaded by
CONFIG SET; a cluster whose peer links are TLS; the metrics allow list.

Certificates are made for the module by scripts/test-certs.sh (openssl): a
CA, and server and client certificates it signed (names localhost and
127.0.0.1), plus a second CA that signed nothing the server trusts.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import redis

from conftest import Server, _free_port, start_kvtier
from resp import parse

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca signed server, server2 and client; other-ca signed stranger."""
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [str(Path(__file__).resolve().parents[2] / "scripts" / "test-certs.sh"), str(d)],
        check=True, capture_output=True, timeout=120,
    )
    return d


def _tls_args(certs: Path, port: int, *extra: str) -> list[str]:
    return [
        "--tls-port", str(port),
        "--tls-cert-file", str(certs / "server.crt"),
        "--tls-key-file", str(certs / "server.key"),
        "--tls-ca-cert-file", str(certs / "ca.crt"),
        *extra,
    ]


@pytest.fixture(scope="module")
def tls_server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    port = _free_port()
    server = start_kvtier(tmp_path_factory.mktemp("tls") / "kvtier.log", *_tls_args(certs, port))
    yield server, port
    server.stop()


def _cli(certs: Path, port: int, *cmd: str, cert: str | None = "client", ca: str = "ca") -> subprocess.CompletedProcess:
    args = ["redis-cli", "-p", str(port), "--tls", "--cacert", str(certs / f"{ca}.crt")]
    if cert:
        args += ["--cert", str(certs / f"{cert}.crt"), "--key", str(certs / f"{cert}.key")]
    return subprocess.run([*args, *cmd], capture_output=True, text=True, timeout=30)


def _py(certs: Path, port: int, cert: str | None = "client", **kw) -> redis.Redis:
    extra = {}
    if cert:
        extra = {"ssl_certfile": str(certs / f"{cert}.crt"), "ssl_keyfile": str(certs / f"{cert}.key")}
    return redis.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(certs / "ca.crt"),
        socket_timeout=10, **extra, **kw,
    )


def test_redis_cli_over_tls(certs: Path, tls_server: tuple[Server, int]) -> None:
    _, port = tls_server
    out = _cli(certs, port, "SET", "tls:k", "v")
    assert out.stdout.strip() == "OK", out
    assert _cli(certs, port, "GET", "tls:k").stdout.strip() == "v"
    # The plain port serves the same keyspace.
    server = tls_server[0]
    with server.connect() as c:
        assert c.call("GET", "tls:k") == b"$1\r\nv\r\n"


def test_client_certificates_are_required(certs: Path, tls_server: tuple[Server, int]) -> None:
    _, port = tls_server
    for cert in (None, "stranger"):
        out = _cli(certs, port, "PING", cert=cert)
        assert "PONG" not in out.stdout, (cert, out)
    with pytest.raises(redis.exceptions.ConnectionError):
        _py(certs, port, cert=None).ping()
    with pytest.raises(redis.exceptions.ConnectionError):
        _py(certs, port, cert="stranger").ping()
    # A client that does not trust the server's CA refuses it.
    out = _cli(certs, port, "PING", ca="other-ca")
    assert "PONG" not in out.stdout, out


def test_a_plain_client_on_the_tls_port_is_told_so(certs: Path, tls_server: tuple[Server, int]) -> None:
    """redis-cli and redis-py without TLS read an error that names the
    cause; TLS clients on the same port still work."""
    server, port = tls_server
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True, timeout=30
    )
    assert "this port speaks TLS" in out.stdout + out.stderr, out
    with pytest.raises(redis.exceptions.ResponseError, match="this port speaks TLS"):
        redis.Redis(port=port, socket_timeout=10).ping()
    assert _py(certs, port).ping() is True
    assert redis.Redis(port=server.port).ping() is True


def test_redis_py_ssl_large_values_and_the_dialect(certs: Path, tls_server: tuple[Server, int]) -> None:
    _, port = tls_server
    for protocol in (2, 3):
        r = _py(certs, port, protocol=protocol)
        big = bytes(range(256)) * (4 << 12)  # 4 MiB
        assert r.set("tls:big", big)
        assert r.get("tls:big") == big
        blocks = [hashlib.sha256(b"%d" % i).digest() * 2048 for i in range(8)]  # 64 KiB each
        args = [8]
        for i, b in enumerate(blocks):
            args += [f"tls:blk:{protocol}:{i}", b]
        assert r.execute_command("MSETBLOCK", *args, "CHAIN") == [1] * 8
        keys = [f"tls:blk:{protocol}:{i}" for i in range(8)]
        assert r.execute_command("PREFIXLEN", 8, *keys) == 8
        assert r.execute_command("MGETPREFIX", 8, *keys) == blocks
        pipe = r.pipeline(transaction=False)
        for i in range(200):
            pipe.set(f"tls:p:{i}", i)
            pipe.get(f"tls:p:{i}")
        got = pipe.execute()
        assert got[1::2] == [str(i).encode() for i in range(200)]
        r.close()


def test_replies_larger_than_the_socket_takes_arrive_whole(certs: Path, tls_server: tuple[Server, int]) -> None:
    """16 MiB replies, one request at a time: the TLS records the socket
    could not take when the last plaintext was written must still go out
    (they once waited for the client's next request: a hang)."""
    _, port = tls_server
    r = _py(certs, port)
    blocks = [bytes([i]) * (1 << 20) for i in range(16)]
    keys = [f"tls:mb:{i}" for i in range(16)]
    for k, b in zip(keys, blocks):
        r.set(k, b)
    for _ in range(5):
        assert r.execute_command("MGETPREFIX", 16, *keys) == blocks
    r.close()
    # A client slow to start reading: the socket is full when the last
    # plaintext is handed to TLS, so records are left over at the end.
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    request = b"MGETPREFIX 16 " + b" ".join(k.encode() for k in keys) + b"\r\n"
    want = b"*16\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(b), b) for b in blocks)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            for _ in range(3):
                tls.sendall(request)
                time.sleep(0.5)
                got = b""
                while len(got) < len(want):
                    chunk = tls.recv(1 << 20)  # times out (10 s) if the tail never comes
                    assert chunk, "connection closed"
                    got += chunk
                assert got == want


def test_optional_and_no_client_auth(certs: Path, tmp_path: Path) -> None:
    for mode, anonymous_ok in (("optional", True), ("no", True), ("yes", False)):
        port = _free_port()
        server = start_kvtier(tmp_path / f"kv-{mode}.log", *_tls_args(certs, port, "--tls-auth-clients", mode))
        try:
            assert (_cli(certs, port, "PING", cert=None).stdout.strip() == "PONG") == anonymous_ok, mode
            assert _cli(certs, port, "PING").stdout.strip() == "PONG", mode
            if mode == "optional":
                # A certificate shown must still be one the CA signed.
                assert "PONG" not in _cli(certs, port, "PING", cert="stranger").stdout
        finally:
            server.stop()


def test_acl_over_tls(certs: Path, tls_server: tuple[Server, int]) -> None:
    server, port = tls_server
    with server.connect() as c:
        assert c.call("ACL", "SETUSER", "tlsuser", "on", ">pw", "~tls:*", "+@read") == b"+OK\r\n"
    r = _py(certs, port, username="tlsuser", password="pw")
    assert r.get("tls:k") == b"v"
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.set("tls:k", "x")
    r.close()
    with server.connect() as c:
        c.call("ACL", "DELUSER", "tlsuser")


def test_certificates_reload_on_config_set(certs: Path, tmp_path: Path) -> None:
    port = _free_port()
    server = start_kvtier(tmp_path / "kv.log", *_tls_args(certs, port))
    try:
        before = _py(certs, port)
        assert before.ping()
        # A new certificate from the same CA: new connections see it.
        with server.connect() as c:
            assert c.call("CONFIG", "SET", "tls-cert-file", str(certs / "server2.crt"), "tls-key-file", str(certs / "server2.key")) == b"+OK\r\n"
            assert parse(c.call("CONFIG", "GET", "tls-cert-file"))[1].endswith(b"server2.crt")
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                cert = tls.getpeercert()
                assert dict(x[0] for x in cert["subject"])["commonName"] == "server2"
                tls.sendall(b"PING\r\n")
                assert tls.recv(100) == b"+PONG\r\n"
        # The connection made before keeps working.
        assert before.ping()
        # Trust another CA: clients of the first are refused from now on.
        with server.connect() as c:
            assert c.call("CONFIG", "SET", "tls-ca-cert-file", str(certs / "other-ca.crt")) == b"+OK\r\n"
        assert "PONG" not in _cli(certs, port, "PING").stdout
        assert _cli(certs, port, "PING", cert="stranger").stdout.strip() == "PONG"
        # A file that does not load is refused, and nothing changes.
        with server.connect() as c:
            reply = c.call("CONFIG", "SET", "tls-cert-file", str(tmp_path / "missing.crt"))
            assert reply.startswith(b"-ERR CONFIG SET failed (possibly related to argument 'tls-cert-file')"), reply
            assert parse(c.call("CONFIG", "GET", "tls-cert-file"))[1].endswith(b"server2.crt")
            assert c.call("CONFIG", "SET", "tls-auth-clients", "maybe").startswith(b"-ERR")
        assert _cli(certs, port, "PING", cert="stranger").stdout.strip() == "PONG"
        before.close()
    finally:
        server.stop()


def test_bad_tls_settings_stop_the_start(certs: Path, tmp_path: Path) -> None:
    port = _free_port()
    with pytest.raises(RuntimeError, match="tls-cert-file"):
        start_kvtier(tmp_path / "a.log", "--tls-port", str(port), "--tls-key-file", str(certs / "server.key"))
    with pytest.raises(RuntimeError, match="needs tls-ca-cert-file"):
        start_kvtier(
            tmp_path / "b.log", "--tls-port", str(port),
            "--tls-cert-file", str(certs / "server.crt"), "--tls-key-file", str(certs / "server.key"),
        )


def test_a_cluster_with_tls_peer_links(certs: Path, tmp_path: Path) -> None:
    """Three nodes whose --cluster-nodes are their TLS ports: every hop
    between them is TLS (a plain connection to a TLS port would fail), and
    clients reach keys of every node over plain TCP and over TLS."""
    ports = [_free_port() for _ in range(3)]
    nodes = ",".join(f"n{i + 1}@127.0.0.1:{p}" for i, p in enumerate(ports))
    servers = []
    try:
        for i, port in enumerate(ports):
            servers.append(
                start_kvtier(
                    tmp_path / f"n{i}.log",
                    *_tls_args(certs, port, "--tls-cluster", "yes"),
                    "--cluster-nodes", nodes, "--node-id", f"n{i + 1}",
                    "--cluster-node-timeout", "1000",
                )
            )
        with servers[0].connect() as c:
            for i in range(60):
                assert c.call("SET", f"tls:c:{i}", f"v{i}") == b"+OK\r\n"
            info = parse(c.call("CLUSTER", "INFO")).decode()
            assert "cluster_known_nodes:3" in info, info
        # Every node answers for every key, over plain TCP and TLS.
        for i, server in enumerate(servers):
            with server.connect() as c:
                for k in range(60):
                    assert c.call("GET", f"tls:c:{k}") == b"$%d\r\nv%d\r\n" % (len(f"v{k}"), k)
            r = _py(certs, ports[i])
            assert r.mget([f"tls:c:{k}" for k in range(60)]) == [f"v{k}".encode() for k in range(60)]
            r.close()
        # The keys really live on all three nodes.
        owners = set()
        with servers[0].connect() as c:
            for k in range(60):
                slot = parse(c.call("CLUSTER", "KEYSLOT", f"tls:c:{k}"))
                for s in parse(c.call("CLUSTER", "SLOTS")):
                    if s[0] <= slot <= s[1]:
                        owners.add(s[2][1])
        assert owners == set(ports)
    finally:
        for s in servers:
            s.stop()


def test_metrics_allow_list(tmp_path: Path) -> None:
    for allow, code in (("10.0.0.0/8", 403), ("10.0.0.0/8,127.0.0.1", 200), ("", 200)):
        port = _free_port()
        server = start_kvtier(tmp_path / "m.log", "--metrics-addr", f"127.0.0.1:{port}", "--metrics-allow", allow)
        try:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == code, allow
        finally:
            server.stop()
