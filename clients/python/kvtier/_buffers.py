"""Caller buffers as destinations of ``MGETPREFIX`` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from ._resp import BulkSink, SinkItem
from .errors import BufferTooSmall, ProtocolError

#: Anything exposing a writable buffer: bytearray, memoryview, numpy array,
#: ``torch.Tensor.numpy()``, ``mmap``...
Buffer = Any


def writable_view(buf: Buffer) -> memoryview:
    """A flat, writable byte view of ``buf`` (no copy)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.readonly:
        raise TypeError("buffer is read-only")
    if not view.contiguous:
        raise TypeError("buffer is not contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class BufferSink:
    """Puts value ``i`` of a reply into ``buffers[i]``, or asks a user sink.

    After the reply, :meth:`finish` turns the parsed lengths into the call's
    result and raises :class:`BufferTooSmall` for the first value that did
    not fit (its bytes were read and dropped, so the connection is fine).
    """

    def __init__(self, views: Optional[list[memoryview]], user: Optional[BulkSink]) -> None:
        self._views = views
        self._user = user
        self._too_small: Optional[BufferTooSmall] = None

    @classmethod
    def of(cls, into: Union[Sequence[Buffer], BulkSink], nkeys: int) -> BufferSink:
        if callable(into):
            return cls(None, into)
        views = [writable_view(b) for b in into]
        if len(views) != nkeys:
            raise ValueError("%d keys but %d buffers" % (nkeys, len(views)))
        return cls(views, None)

    def __call__(self, index: int, length: int) -> Iterable[SinkItem]:
        if self._user is not None:
            return self._user(index, length)
        assert self._views is not None
        if index >= len(self._views):
            raise ProtocolError("more values than keys")
        view = self._views[index]
        if length > view.nbytes:
            if self._too_small is None:
                self._too_small = BufferTooSmall(index, length, view.nbytes)
            return ()
        return (view[:length],)

    def finish(self, reply: object) -> list[int]:
        if not isinstance(reply, list) or not all(isinstance(x, int) for x in reply):
            raise ProtocolError("MGETPREFIX: expected an array of bulk strings")
        if self._too_small is not None and self._too_small.index < len(reply):
            raise self._too_small
        return reply
