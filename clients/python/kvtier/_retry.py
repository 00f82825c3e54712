"""Where a command goes next when a node fails it: one decision for both
clients (sans-IO: no sockets, no clocks read here except the nodes' down
marks, no sleeping; :class:`kvtier.Client` and :class:`kvtier.AsyncClient`
do the I/O and the waiting, and raise what :meth:`Attempts.exhausted`
returns).

The rules, in the order a failure meets them:

* ``MOVED slot host:port``: the command goes to that node at once (at most
  :data:`MOVED_HOPS` times: a slot map in flux, not a loop).
* ``TRYAGAIN`` (a node died and the cluster has not yet noticed): the same
  node again after :data:`TRYAGAIN_PAUSE`, up to :data:`TRYAGAIN_TRIES`
  tries; then the error is the answer.
* Any other error reply is the answer.
* No connection (refused, unreachable, timed out connecting): the node is
  skipped for :data:`NODE_RETRY_AFTER` seconds and the next node is tried.
* The connection closed or broke before any byte of the reply: on a pooled
  connection (one the server may have timed out while idle) the same node
  again on another connection; on a fresh one, as for no connection. Every
  dialect command is idempotent, so sending it again is safe.
* A reply that stops midway, or none within the timeout: raised at once (a
  slow tier is not asked twice).

When every node has failed, the error names each node's failure: a
:class:`~kvtier.errors.TimeoutError` when the last one timed out, else a
:class:`~kvtier.errors.ConnectionError`.
"""

from __future__ import annotations

import builtins
import random
import threading
import time
from typing import Optional

from ._commands import Node, parse_nodes
from .errors import ConnectionError, KvtierError, TimeoutError

#: Seconds a node that refused a connection is skipped before it is tried again.
NODE_RETRY_AFTER = 2.0
#: How often a command that got ``TRYAGAIN`` (a cluster node died and is not
#: yet detected) is sent again, and the pause between tries.
TRYAGAIN_TRIES = 20
TRYAGAIN_PAUSE = 0.1
#: Most ``MOVED`` redirections one command follows.
MOVED_HOPS = 16


def moved_to(message: str) -> Optional[Node]:
    """The node of a ``MOVED slot host:port`` error, else None."""
    parts = message.split()
    if len(parts) == 3 and parts[0] == "MOVED":
        return parse_nodes(parts[2])[0]
    return None


class NodeOrder:
    """The nodes a client spreads commands over: each command starts at the
    next node in turn, nodes marked down last (thread-safe)."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self._turn = random.randrange(len(nodes))
        self._down_until: dict[Node, float] = {}
        self._lock = threading.Lock()

    def order(self, first: Optional[Node] = None) -> list[Node]:
        """The nodes to try for one command: ``first`` (a key's owner) if
        given, then the others from the next in turn, nodes up first."""
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.nodes)
        now = time.monotonic()
        turn = [self.nodes[(start + i) % len(self.nodes)] for i in range(len(self.nodes))]
        up = [n for n in turn if self._down_until.get(n, 0.0) <= now]
        down = [n for n in turn if self._down_until.get(n, 0.0) > now]
        ordered = up + down
        if first is not None:
            ordered = [first, *(n for n in ordered if n != first)]
        return ordered

    def mark_down(self, node: Node) -> None:
        """Skips ``node`` (tries it last) for :data:`NODE_RETRY_AFTER` seconds."""
        self._down_until[node] = time.monotonic() + NODE_RETRY_AFTER


class Attempts:
    """One command's tries: which node next, and what each failure means."""

    def __init__(self, order: NodeOrder, first: Optional[Node] = None) -> None:
        self._order = order
        self._targets = order.order(first)
        self._errors: list[str] = []
        self._timed_out = False
        self._tryagain = 0
        self._hops = 0

    def next(self) -> Optional[Node]:
        """The node to send the command to, or None when none is left."""
        return self._targets.pop(0) if self._targets else None

    def error_reply(self, node: Node, message: str) -> Optional[float]:
        """The node answered with an error: the seconds to wait before the
        command goes again (to the node :meth:`next` gives), or None when
        the error is the answer."""
        moved = moved_to(message)
        if moved is not None:
            if self._hops >= MOVED_HOPS:
                return None
            self._hops += 1
            self._targets.insert(0, moved)
            return 0.0
        if message.startswith("TRYAGAIN") and self._tryagain + 1 < TRYAGAIN_TRIES:
            self._tryagain += 1
            self._targets.insert(0, node)
            return TRYAGAIN_PAUSE
        return None

    def no_connection(self, node: Node, cause: BaseException) -> None:
        """No connection to ``node`` could be made: the next node is tried."""
        self._failed(node, cause)
        self._order.mark_down(node)

    def lost_before_reply(self, node: Node, cause: BaseException, pooled: bool) -> None:
        """The connection closed or broke before any byte of the reply."""
        if pooled:
            self._targets.insert(0, node)
        else:
            self.no_connection(node, cause)

    def exhausted(self) -> KvtierError:
        """The error to raise when no node is left."""
        if self._timed_out:
            return TimeoutError("no kvtier node answered in time: " + "; ".join(self._errors))
        return ConnectionError("no kvtier node answered: " + "; ".join(self._errors))

    def _failed(self, node: Node, cause: BaseException) -> None:
        self._errors.append("%s: %s" % (node, cause))
        self._timed_out = isinstance(cause, (TimeoutError, builtins.TimeoutError))
