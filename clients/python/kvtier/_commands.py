"""The block dialect's requests and replies, shared by the sync and asyncio
clients (see docs/commands.md for the server side)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union
from urllib.parse import parse_qsl, unquote, urlparse

from ._resp import Arg, BulkSink, arg_nbytes
from .errors import ProtocolError

Key = Union[str, bytes]
#: A value to store: one buffer, or several sent back to back as one value.
Value = Union[bytes, bytearray, memoryview, Sequence[Union[bytes, bytearray, memoryview]]]


def _keys(method: str, keys: Sequence[Key]) -> list[Arg]:
    check_keys(method, keys)
    return [len(keys), *keys]


_KEY_TYPES = frozenset((str, bytes))


def check_keys(method: str, keys: Sequence[Key], name: str = "keys") -> None:
    """A TypeError or ValueError naming ``method``'s ``keys`` argument when it
    is not a non-empty list of str or bytes keys."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            "%s: %s must be a list of keys, not one %s (wrap a single key: [key])"
            % (method, name, type(keys).__name__)
        )
    if not isinstance(keys, Sequence):
        raise TypeError("%s: %s must be a list of keys, not %s" % (method, name, type(keys).__name__))
    if not keys:
        raise ValueError("%s: %s is empty (at least one key is needed)" % (method, name))
    if _KEY_TYPES.issuperset(map(type, keys)):
        return  # the usual case, in C: a loop of isinstance cost 3 us per 64 keys
    for i, k in enumerate(keys):
        if not isinstance(k, (str, bytes)):
            raise TypeError("%s: %s[%d] is %s; a key is str or bytes" % (method, name, i, type(k).__name__))


def check_int(method: str, name: str, value: object, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in ``low..high``, or a TypeError/ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s: %s must be an int, not %s" % (method, name, type(value).__name__))
    if value < low or (high is not None and value > high):
        within = "at least %d" % low if high is None else "between %d and %d" % (low, high)
        raise ValueError("%s: %s must be %s, not %d" % (method, name, within, value))
    return value


def prefixlen_args(keys: Sequence[Key], hold_ms: int | None = None) -> list[Arg]:
    """``PREFIXLEN numkeys key... [HOLD ms]``"""
    args: list[Arg] = ["PREFIXLEN", *_keys("prefix_len", keys)]
    if hold_ms is not None:
        args += ["HOLD", check_int("prefix_len", "hold_ms", hold_ms, 1)]
    return args


def mexists_args(keys: Sequence[Key]) -> list[Arg]:
    """``MEXISTS numkeys key...``"""
    return ["MEXISTS", *_keys("exists_many", keys)]


def mgetprefix_args(
    keys: Sequence[Key],
    max_bytes: int | None = None,
    block_ms: int | None = None,
    min: int | None = None,  # noqa: A002 - the dialect's own option name
) -> list[Arg]:
    """``MGETPREFIX numkeys key... [MAXBYTES b] [BLOCK ms [MIN m]]``, its
    arguments checked."""
    check_keys("get_prefix", keys)
    if max_bytes is not None:
        check_int("get_prefix", "max_bytes", max_bytes, 0)
    if block_ms is not None:
        check_int("get_prefix", "block_ms", block_ms, 1)
        if min is not None:
            check_int("get_prefix", "min", min, 1, len(keys))
    elif min is not None:
        raise ValueError("get_prefix: min needs block_ms (how long to wait for min keys)")
    return _mgetprefix(keys, max_bytes, block_ms, min)


def _mgetprefix(
    keys: Sequence[Key],
    max_bytes: int | None,
    block_ms: int | None,
    min: int | None,  # noqa: A002
) -> list[Arg]:
    """A part of a checked ``MGETPREFIX`` (its keys are some of the checked ones)."""
    args: list[Arg] = ["MGETPREFIX", len(keys), *keys]
    if max_bytes is not None:
        args += ["MAXBYTES", max_bytes]
    if block_ms is not None:
        args += ["BLOCK", block_ms]
        if min is not None:
            args += ["MIN", min]
    return args


def msetblock_args(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Key | None = None,
    replace: bool = False,
    chain: bool = True,
    ex: int | None = None,
    px: int | None = None,
    partial: bool = False,
) -> list[Arg]:
    """``MSETBLOCK n key value... [EX s | PX ms] [CHAIN [PARENT p] [PARTIAL]]
    [REPLACE]`` (the arguments checked by :func:`check_blocks`)."""
    args: list[Arg] = ["MSETBLOCK", len(keys)]
    for k, v in zip(keys, values):
        args.append(k)
        args.append(v)  # type: ignore[arg-type]
    if ex is not None:
        args += ["EX", ex]
    if px is not None:
        args += ["PX", px]
    if chain:
        args.append("CHAIN")
        if parent is not None:
            args += ["PARENT", parent]
        if partial:
            args.append("PARTIAL")
    if replace:
        args.append("REPLACE")
    return args


def int_reply(reply: object) -> int:
    if not isinstance(reply, int):
        raise ProtocolError("expected an integer reply, got %r" % (reply,))
    return reply


def int_list_reply(reply: object, n: int | None = None) -> list[int]:
    if not isinstance(reply, list) or not all(isinstance(x, int) for x in reply):
        raise ProtocolError("expected an array of integers, got %r" % (reply,))
    if n is not None and len(reply) != n:
        raise ProtocolError("expected %d integers, got %d" % (n, len(reply)))
    return reply


@dataclass(frozen=True)
class Node:
    """One server address."""

    host: str
    port: int

    def __str__(self) -> str:
        return "%s:%d" % (self.host, self.port)


#: TLS options, as ``kvtiers://`` query parameters and client keywords
#: (redis-py's names): the CA that signed the server's certificate (default:
#: the system's), a client certificate and its key (for a server started
#: with ``--tls-auth-clients yes``), whether the server's certificate is
#: ``required`` (default), ``optional`` or not checked (``none``), and
#: whether its name must match the host (default yes).
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True)
class Tls:
    """How a client talks TLS to kvtier's ``--tls-port``."""

    ca_certs: Optional[str] = None
    certfile: Optional[str] = None
    keyfile: Optional[str] = None
    cert_reqs: str = "required"
    check_hostname: bool = True

    @classmethod
    def of(cls, options: dict[str, Any]) -> Tls:
        """From ``TLS_OPTIONS`` (strings from a URL, or typed keywords)."""
        reqs = str(options.get("ssl_cert_reqs") or "required").lower()
        if reqs not in _CERT_REQS:
            raise ValueError("ssl_cert_reqs must be none, optional or required, not %r" % (reqs,))
        check = options.get("ssl_check_hostname")
        if isinstance(check, str):
            if check.lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise ValueError("ssl_check_hostname must be true or false, not %r" % (check,))
            check = check.lower() in ("true", "yes", "1")
        certfile, keyfile = options.get("ssl_certfile"), options.get("ssl_keyfile")
        if keyfile and not certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate)")
        return cls(
            ca_certs=options.get("ssl_ca_certs"),
            certfile=certfile,
            keyfile=keyfile,
            cert_reqs=reqs,
            check_hostname=(reqs != "none") if check is None else bool(check) and reqs != "none",
        )

    def context(self) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` for asyncio (files are read here, so a
        missing one is an error at construction)."""
        ctx = ssl.create_default_context(cafile=self.ca_certs)
        ctx.check_hostname = self.check_hostname
        ctx.verify_mode = _CERT_REQS[self.cert_reqs]
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx

    def redis_kwargs(self) -> dict[str, Any]:
        """The same for a redis-py ``SSLConnection``."""
        return dict(
            ssl_ca_certs=self.ca_certs,
            ssl_certfile=self.certfile,
            ssl_keyfile=self.keyfile,
            ssl_cert_reqs=self.cert_reqs,
            ssl_check_hostname=self.check_hostname,
        )


@dataclass(frozen=True)
class Endpoint:
    """What a ``kvtier://`` URL says: the nodes and how to talk to them."""

    nodes: tuple[Node, ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    #: TLS options from the query (``TLS_OPTIONS``), as written.
    tls_options: dict[str, str] = field(default_factory=dict)


def parse_nodes(spec: Union[str, Sequence[Union[str, tuple[str, int]]]]) -> tuple[Node, ...]:
    """``"h1:p1,h2:p2"``, ``["h1:p1", ("h2", p2)]`` -> nodes (port 6379 by default)."""
    items: list[Union[str, tuple[str, int]]]
    if isinstance(spec, str):
        items = [s for s in spec.split(",") if s.strip()]
    else:
        items = list(spec)
    nodes = []
    for item in items:
        port: object
        if isinstance(item, tuple):
            host, port = item
        else:
            text = item.strip()
            if "://" in text:
                raise ValueError(
                    "%r: a URL where an address was expected (use kvtier://host:port as the "
                    "whole target, or host:port)" % (item,)
                )
            if text.startswith("["):  # [::1]:6379
                host, _, rest = text[1:].partition("]")
                port = rest[1:] if rest.startswith(":") else 6379
            elif text.count(":") == 1:
                host, port = text.split(":")
            else:
                host, port = text, 6379
        if not host:
            raise ValueError("no host in %r (expected host:port)" % (item,))
        nodes.append(Node(host, _port(port, item)))
    if not nodes:
        raise ValueError("no nodes in %r (expected host:port[,host:port...])" % (spec,))
    return tuple(nodes)


def _port(value: object, item: object) -> int:
    """A port number, or a ValueError naming the address it came from."""
    try:
        port = int(str(value))
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ValueError("bad port %r in %r (expected host:port, port 1-65535)" % (value, item))
    return port


@dataclass(frozen=True)
class Target:
    """Whom a client talks to and how: its ``nodes`` argument and keywords."""

    nodes: tuple[Node, ...]
    username: str | None
    password: str | None
    #: None: plain TCP; else how to talk TLS.
    tls: Optional[Tls]


def resolve_target(
    nodes: Union[str, Sequence[Union[str, tuple[str, int]]]],
    username: str | None,
    password: str | None,
    use_tls: bool,
    tls_keywords: dict[str, Any],
) -> Target:
    """What a client's ``nodes`` names: a ``kvtier://`` / ``kvtiers://`` URL
    (its user, password and TLS options unless given as keywords) or
    addresses. TLS options without TLS are a ValueError."""
    options = {k: v for k, v in tls_keywords.items() if v is not None}
    if isinstance(nodes, str) and "://" in nodes:
        ep = parse_url(nodes)
        found = ep.nodes
        username = username if username is not None else ep.username
        password = password if password is not None else ep.password
        use_tls = use_tls or ep.ssl
        options = {**ep.tls_options, **options}
    else:
        found = parse_nodes(nodes)
    if options and not use_tls:
        raise ValueError(
            "%s given without TLS (use a kvtiers:// URL or ssl=True)" % ", ".join(sorted(options))
        )
    return Target(found, username, password, Tls.of(options) if use_tls else None)


def parse_url(url: str) -> Endpoint:
    """Parses ``kvtier://[user:password@]host:port[,host:port...][?options]``
    (``kvtiers://`` for TLS, whose options are ``TLS_OPTIONS``). Several hosts
    name nodes of one cluster."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("kvtier", "kvtiers"):
        raise ValueError("not a kvtier:// URL: %r (the schemes are kvtier:// and kvtiers:// for TLS)" % url)
    rest, _, query = rest.partition("?")
    auth, at, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0]
    username = password = None
    if at:
        # urlparse understands user:password; reuse it for the unquoting.
        parsed = urlparse("x://%s@h" % auth)
        username = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else None
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in TLS_OPTIONS:
            raise ValueError("unknown option %r in %r (a URL takes %s)" % (name, url, ", ".join(TLS_OPTIONS)))
        options[name] = value
    if options and scheme != "kvtiers":
        raise ValueError("%s in %r: TLS options need a kvtiers:// URL" % (", ".join(options), url))
    return Endpoint(parse_nodes(hosts), username, password, scheme == "kvtiers", options)


# -- reads split by owner (a cluster) ------------------------------------------

#: Seconds a cluster's slot map is used before it is read again.
SLOT_MAP_TTL = 5.0


def parse_cluster_slots(reply: object) -> Optional[list[Node]]:
    """The owner of each of the 16384 slots from a ``CLUSTER SLOTS`` reply,
    or None when a slot has no owner."""
    if not isinstance(reply, list):
        return None
    owners: list[Optional[Node]] = [None] * 16384
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list):
            return None
        start, end, primary = entry[0], entry[1], entry[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        node = Node(host, int(primary[1]))
        for slot in range(int(start), int(end) + 1):
            owners[slot] = node
    if any(o is None for o in owners):
        return None
    return owners  # type: ignore[return-value]


class SlotMap:
    """A client's cache of the cluster's slot owners, without I/O: whether
    it is due a ``CLUSTER SLOTS`` (every :data:`SLOT_MAP_TTL` seconds), the
    owners it has, and that a single server has none."""

    def __init__(self, enabled: bool) -> None:
        self._owners: Optional[list[Node]] = None
        self._read_at = float("-inf")
        self._off = not enabled

    def due(self, now: float) -> bool:
        """Whether to read the map now."""
        return not self._off and (self._owners is None or now - self._read_at > SLOT_MAP_TTL)

    def read(self, reply: object, now: float) -> None:
        """The reply to ``CLUSTER SLOTS``, read at ``now``."""
        self._owners = parse_cluster_slots(reply)
        self._read_at = now

    def not_a_cluster(self) -> None:
        """``CLUSTER SLOTS`` was refused: a single server; never asked again."""
        self._off = True

    def forget(self) -> None:
        """A read by the map failed (a stale map or a node down): read it
        again before the next one."""
        self._owners = None

    @property
    def owners(self) -> Optional[list[Node]]:
        """Each slot's owner, or None (no cluster, or not read yet)."""
        return None if self._off else self._owners


@dataclass
class ReadPart:
    """Some of the keys, by their positions in the caller's list, and the
    node to ask (None: any)."""

    node: Optional[Node]
    positions: list[int]
    args: list[Arg]


#: Large batches go over this many connections at once: one connection is
#: served by one server thread, so a 64-chunk read or write on a single
#: connection leaves the server's other cores idle (docs/connectors.md).
STRIPES = 4
#: A batch is striped only with at least this many keys per stripe, and a
#: write, or a read into caller buffers, only when it moves at least
#: STRIPE_MIN_BYTES (below that the threads' hand-offs cost more than the
#: parallel connections gain: 16 x 64 KiB loads at 2.3 GB/s on one
#: connection, 0.8 GB/s over four; docs/decisions/0056).
STRIPE_MIN_KEYS = 4
STRIPE_MIN_BYTES = 8 << 20


def stripe_ranges(n: int, stripes: int) -> list[range]:
    """``n`` positions cut into at most ``stripes`` contiguous ranges."""
    k = max(1, min(stripes, n // STRIPE_MIN_KEYS))
    bounds = [n * i // k for i in range(k + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(k)]


def stripe_mgetprefix(keys: Sequence[Key], node: Optional[Node], stripes: int) -> list[ReadPart]:
    """One ``MGETPREFIX`` per contiguous range of the keys, all to ``node``."""
    return [
        ReadPart(node, list(r), _mgetprefix([keys[i] for i in r], None, None, None))
        for r in stripe_ranges(len(keys), stripes)
    ]


def value_nbytes(value: Value) -> int:
    """Bytes a value is sent as (a numpy array's ``len`` counts rows)."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    parts = value if isinstance(value, (list, tuple)) else (value,)
    return sum(arg_nbytes(p) for p in parts)


#: What a value of ``put_chain`` may be, for its errors.
VALUE_FORMS = (
    "a value is bytes-like (bytes, bytearray, memoryview, a numpy array) "
    "or a list of bytes-like parts sent back to back"
)


def _check_part(where: str, part: object) -> None:
    if isinstance(part, (bytes, bytearray, str)):
        return
    try:
        view = part if isinstance(part, memoryview) else memoryview(part)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("put_chain: %s is %s; %s" % (where, type(part).__name__, VALUE_FORMS)) from None
    if not view.c_contiguous:
        raise ValueError("put_chain: %s is not contiguous (copy it, or pass its parts as a list)" % where)


def check_blocks(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Optional[Key],
    chain: bool,
    ex: Optional[int],
    px: Optional[int],
    partial: bool = False,
) -> None:
    """A ValueError or TypeError naming the argument of ``put_chain`` that is
    wrong, before anything is sent."""
    check_keys("put_chain", keys)
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Sequence):
        raise TypeError(
            "put_chain: values must be a list (one value per key), not %s" % type(values).__name__
        )
    if len(keys) != len(values):
        raise ValueError(
            "put_chain: keys has %d items but values has %d (one value per key)" % (len(keys), len(values))
        )
    for i, v in enumerate(values):
        if isinstance(v, (list, tuple)):
            for j, part in enumerate(v):
                _check_part("values[%d][%d]" % (i, j), part)
        else:
            _check_part("values[%d]" % i, v)
    if parent is not None:
        if not isinstance(parent, (str, bytes)):
            raise TypeError("put_chain: parent is %s; a key is str or bytes" % type(parent).__name__)
        if not chain:
            raise ValueError("put_chain: parent needs chain=True")
    if partial and not chain:
        raise ValueError("put_chain: partial needs chain=True")
    if ex is not None and px is not None:
        raise ValueError("put_chain: give ex or px, not both")
    if ex is not None:
        check_int("put_chain", "ex", ex, 1)
    if px is not None:
        check_int("put_chain", "px", px, 1)


def stripe_msetblock(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Optional[Key],
    replace: bool,
    chain: bool,
    ex: Optional[int],
    px: Optional[int],
    stripes: int,
    partial: bool = False,
) -> list[tuple[range, list[Arg]]]:
    """One ``MSETBLOCK`` per contiguous range; with ``CHAIN`` each range names
    the key before it as ``PARENT``, so the links are those of one call, and
    ``PARTIAL`` goes with the range that holds the last key."""
    check_blocks(keys, values, parent, chain, ex, px, partial)
    total = sum(value_nbytes(v) for v in values)
    ranges = stripe_ranges(len(keys), stripes) if total >= STRIPE_MIN_BYTES else [range(len(keys))]
    parts = []
    for r in ranges:
        p = (keys[r.start - 1] if r.start else parent) if chain else None
        last = partial and r.stop == len(keys)
        parts.append(
            (r, msetblock_args([keys[i] for i in r], [values[i] for i in r], p, replace, chain, ex, px, last))
        )
    return parts


def split_mgetprefix(
    keys: Sequence[Key],
    owners: Sequence[Node],
    max_bytes: Optional[int],
    block_ms: Optional[int],
    min: Optional[int],  # noqa: A002
) -> list[ReadPart]:
    """One ``MGETPREFIX`` per owner, as the server's own coordination splits
    it: each node gets its keys in order, ``MAXBYTES`` as is (the merged
    prefix is cut again) and ``BLOCK ms MIN`` = its share of the first
    ``min`` keys."""
    by_node: dict[Node, list[int]] = {}
    for i, k in enumerate(keys):
        by_node.setdefault(owners[key_slot(k)], []).append(i)
    wanted = len(keys) if min is None else min
    parts = []
    for node, positions in by_node.items():
        share = sum(1 for p in positions if p < wanted)
        node_keys = [keys[p] for p in positions]
        if block_ms is not None and share:
            args = _mgetprefix(node_keys, max_bytes, block_ms, share)
        else:
            args = _mgetprefix(node_keys, max_bytes, None, None)
        parts.append(ReadPart(node, positions, args))
    return parts


def merge_prefix(
    nkeys: int, parts: Sequence[ReadPart], replies: Sequence[list[Any]], max_bytes: Optional[int]
) -> int:
    """How many leading keys the merged answer covers: up to the earliest key
    some node lacks, then cut at ``max_bytes`` (``replies[i][j]`` is the
    value, or its length, of ``parts[i].positions[j]``)."""
    end = nkeys
    sizes: dict[int, int] = {}
    for part, reply in zip(parts, replies):
        if len(reply) < len(part.positions):
            end = min(end, part.positions[len(reply)])
        for pos, value in zip(part.positions, reply):
            sizes[pos] = value if isinstance(value, int) else len(value)
    if max_bytes is not None:
        total = 0
        for i in range(end):
            total += sizes[i]
            if total > max_bytes:
                return i
    return end


def key_slot(key: Key) -> int:
    """Redis Cluster's slot of a key (CRC16 of its ``{hashtag}``, mod 16384)."""
    from redis.crc import key_slot as slot

    return int(slot(key.encode() if isinstance(key, str) else key))


def read_parts(
    keys: Sequence[Key],
    owners: Optional[Sequence[Node]],
    max_bytes: Optional[int],
    block_ms: Optional[int],
    min: Optional[int],  # noqa: A002
    stripes: int,
    capacity: Optional[int] = None,
) -> Optional[list[ReadPart]]:
    """How a client sends one ``MGETPREFIX``: per owner node (a cluster),
    striped over connections (a large batch without ``MAXBYTES``/``BLOCK``:
    when the caller's buffers say how large, at least ``STRIPE_MIN_BYTES``
    of them, as for a store), or, None, as the one command."""
    large = capacity is None or capacity >= STRIPE_MIN_BYTES
    simple = max_bytes is None and block_ms is None and stripes > 1 and large
    if owners is not None:
        parts = split_mgetprefix(keys, owners, max_bytes, block_ms, min)
        if len(parts) == 1 and simple:
            return stripe_mgetprefix(keys, parts[0].node, stripes)
        return parts
    if simple:
        parts = stripe_mgetprefix(keys, None, stripes)
        if len(parts) > 1:
            return parts
    return None


def merge_values(
    nkeys: int, parts: Sequence[ReadPart], replies: Sequence[object], max_bytes: Optional[int]
) -> list[Any]:
    """The parts' replies as the one reply a single ``MGETPREFIX`` gives."""
    lists: list[list[Any]] = []
    for reply in replies:
        if not isinstance(reply, list):
            raise ProtocolError("MGETPREFIX: expected an array, got %r" % (reply,))
        lists.append(reply)
    n = merge_prefix(nkeys, parts, lists, max_bytes)
    merged: dict[int, Any] = {}
    for part, reply in zip(parts, lists):
        merged.update(zip(part.positions, reply))
    return [merged[i] for i in range(n)]


def merge_codes(parts: Sequence[tuple[range, list[Arg]]], replies: Sequence[object]) -> list[int]:
    """The striped ``MSETBLOCK`` replies as one list of codes."""
    codes: list[int] = []
    for (r, _), reply in zip(parts, replies):
        codes += int_list_reply(reply, len(r))
    return codes


def first_error(results: Sequence[object]) -> None:
    """Raises the first exception among parallel parts' results (after all
    of them ended, so none still writes into a sink)."""
    for r in results:
        if isinstance(r, BaseException):
            raise r


def positions_sink(sink: Optional[BulkSink], positions: list[int]) -> Optional[BulkSink]:
    """A part's sink: its value ``j`` is the caller's value ``positions[j]``
    (the sink itself for a part of every position in order, so what it
    knows of its buffers still serves, :meth:`BufferSink.expected_lengths`)."""
    if sink is None or all(p == i for i, p in enumerate(positions)):
        return sink

    def sub(j: int, length: int) -> Any:
        return sink(positions[j], length)

    return sub
