"""Exceptions of the kvtier client.

They subclass redis-py's own, so code that already catches
``redis.exceptions.ConnectionError`` or ``ResponseError`` keeps working.
"""

from __future__ import annotations

import redis.exceptions


class KvtierError(redis.exceptions.RedisError):
    """Base class of every error this package raises."""


class ResponseError(KvtierError, redis.exceptions.ResponseError):
    """The server answered with an error; the message is the server's text
    (for example ``ERR numkeys should be greater than 0``)."""


class ConnectionError(KvtierError, redis.exceptions.ConnectionError):  # noqa: A001
    """No node could be reached, or a connection broke during a command."""


class TimeoutError(KvtierError, redis.exceptions.TimeoutError):  # noqa: A001
    """A node did not answer in time; the connection is dropped."""


class ProtocolError(KvtierError):
    """The server's reply is not valid RESP (the connection is dropped)."""


class BufferTooSmall(KvtierError):
    """A value is longer than the caller's buffer for it. The reply was read
    to its end, so the connection stays usable; ``index`` is the key's
    position and ``length`` the value's size."""

    def __init__(self, index: int, length: int, capacity: int) -> None:
        super().__init__("value %d is %d bytes, its buffer holds %d" % (index, length, capacity))
        self.index = index
        self.length = length
        self.capacity = capacity
