"""The block dialect's requests and replies, shared by the sync and asyncio
clients (see docs/commands.md for the server side)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union
from urllib.parse import unquote, urlparse

from ._resp import Arg, BulkSink
from .errors import ProtocolError

Key = Union[str, bytes]
#: A value to store: one buffer, or several sent back to back as one value.
Value = Union[bytes, bytearray, memoryview, Sequence[Union[bytes, bytearray, memoryview]]]


def _keys(keys: Sequence[Key]) -> list[Arg]:
    if not keys:
        raise ValueError("at least one key is needed")
    return [len(keys), *keys]


def prefixlen_args(keys: Sequence[Key], hold_ms: int | None = None) -> list[Arg]:
    """``PREFIXLEN numkeys key... [HOLD ms]``"""
    args: list[Arg] = ["PREFIXLEN", *_keys(keys)]
    if hold_ms is not None:
        if int(hold_ms) <= 0:
            raise ValueError("hold_ms must be greater than 0, not %r" % (hold_ms,))
        args += ["HOLD", int(hold_ms)]
    return args


def mexists_args(keys: Sequence[Key]) -> list[Arg]:
    """``MEXISTS numkeys key...``"""
    return ["MEXISTS", *_keys(keys)]


def mgetprefix_args(
    keys: Sequence[Key],
    max_bytes: int | None = None,
    block_ms: int | None = None,
    min: int | None = None,  # noqa: A002 - the dialect's own option name
) -> list[Arg]:
    """``MGETPREFIX numkeys key... [MAXBYTES b] [BLOCK ms [MIN m]]``"""
    args: list[Arg] = ["MGETPREFIX", *_keys(keys)]
    if max_bytes is not None:
        args += ["MAXBYTES", int(max_bytes)]
    if block_ms is not None:
        args += ["BLOCK", int(block_ms)]
        if min is not None:
            args += ["MIN", int(min)]
    elif min is not None:
        raise ValueError("min needs block_ms")
    return args


def msetblock_args(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Key | None = None,
    replace: bool = False,
    chain: bool = True,
    ex: int | None = None,
    px: int | None = None,
) -> list[Arg]:
    """``MSETBLOCK n key value... [EX s | PX ms] [CHAIN [PARENT p]] [REPLACE]``
    (the arguments checked by :func:`check_blocks`)."""
    args: list[Arg] = ["MSETBLOCK", len(keys)]
    for k, v in zip(keys, values):
        args.append(k)
        args.append(v)  # type: ignore[arg-type]
    if ex is not None:
        args += ["EX", int(ex)]
    if px is not None:
        args += ["PX", int(px)]
    if chain:
        args.append("CHAIN")
        if parent is not None:
            args += ["PARENT", parent]
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


@dataclass(frozen=True)
class Endpoint:
    """What a ``kvtier://`` URL says: the nodes and how to talk to them."""

    nodes: tuple[Node, ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False


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


def resolve_target(
    nodes: Union[str, Sequence[Union[str, tuple[str, int]]]],
    username: str | None,
    password: str | None,
    ssl: object,
) -> tuple[tuple[Node, ...], str | None, str | None, object]:
    """What a client's ``nodes`` names: a ``kvtier://`` / ``kvtiers://`` URL
    (its user, password and TLS unless given as keywords) or addresses."""
    if isinstance(nodes, str) and "://" in nodes:
        ep = parse_url(nodes)
        return (
            ep.nodes,
            username if username is not None else ep.username,
            password if password is not None else ep.password,
            ssl if ssl else ep.ssl,
        )
    return parse_nodes(nodes), username, password, ssl


def parse_url(url: str) -> Endpoint:
    """Parses ``kvtier://[user:password@]host:port[,host:port...]`` (``kvtiers://``
    for TLS). Several hosts name nodes of one cluster."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("kvtier", "kvtiers"):
        raise ValueError("not a kvtier:// URL: %r (the schemes are kvtier:// and kvtiers:// for TLS)" % url)
    auth, at, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0].split("?", 1)[0]
    username = password = None
    if at:
        # urlparse understands user:password; reuse it for the unquoting.
        parsed = urlparse("x://%s@h" % auth)
        username = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else None
    return Endpoint(parse_nodes(hosts), username, password, scheme == "kvtiers")


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
#: write only when it carries at least STRIPE_MIN_BYTES.
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
        ReadPart(node, list(r), mgetprefix_args([keys[i] for i in r]))
        for r in stripe_ranges(len(keys), stripes)
    ]


def value_nbytes(value: Value) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    return sum(len(p) if not isinstance(p, memoryview) else p.nbytes for p in value)


def check_blocks(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Optional[Key],
    chain: bool,
    ex: Optional[int],
    px: Optional[int],
) -> None:
    """A ValueError naming the argument of ``put_chain`` that is wrong, before
    anything is sent."""
    if len(keys) != len(values):
        raise ValueError(
            "put_chain: keys has %d items but values has %d (one value per key)" % (len(keys), len(values))
        )
    if not keys:
        raise ValueError("put_chain: keys is empty (at least one block is needed)")
    if parent is not None and not chain:
        raise ValueError("put_chain: parent needs chain=True")
    if ex is not None and px is not None:
        raise ValueError("put_chain: give ex or px, not both")


def stripe_msetblock(
    keys: Sequence[Key],
    values: Sequence[Value],
    parent: Optional[Key],
    replace: bool,
    chain: bool,
    ex: Optional[int],
    px: Optional[int],
    stripes: int,
) -> list[tuple[range, list[Arg]]]:
    """One ``MSETBLOCK`` per contiguous range; with ``CHAIN`` each range names
    the key before it as ``PARENT``, so the links are those of one call."""
    check_blocks(keys, values, parent, chain, ex, px)
    total = sum(value_nbytes(v) for v in values)
    ranges = stripe_ranges(len(keys), stripes) if total >= STRIPE_MIN_BYTES else [range(len(keys))]
    parts = []
    for r in ranges:
        p = (keys[r.start - 1] if r.start else parent) if chain else None
        parts.append(
            (r, msetblock_args([keys[i] for i in r], [values[i] for i in r], p, replace, chain, ex, px))
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
            args = mgetprefix_args(node_keys, max_bytes, block_ms, share)
        else:
            args = mgetprefix_args(node_keys, max_bytes)
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
) -> Optional[list[ReadPart]]:
    """How a client sends one ``MGETPREFIX``: per owner node (a cluster),
    striped over connections (a large batch without ``MAXBYTES``/``BLOCK``),
    or, None, as the one command."""
    simple = max_bytes is None and block_ms is None and stripes > 1
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
    """A part's sink: its value ``j`` is the caller's value ``positions[j]``."""
    if sink is None:
        return None

    def sub(j: int, length: int) -> Any:
        return sink(positions[j], length)

    return sub
