"""Caller buffers as destinations of ``MGETPREFIX`` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from ._resp import BulkSink, SinkItem
from .errors import BufferTooSmall, ProtocolError

#: Anything exposing a writable buffer: bytearray, memoryview, numpy array,
#: ``torch.Tensor.numpy()``, ``mmap``...
Buffer = Any


#: What ``into`` accepts, for its errors.
INTO_FORMS = (
    "into takes one writable buffer (value i at byte i*stride), a list of one "
    "writable buffer per key, or a sink (index, length) -> buffers"
)


def writable_view(buf: Buffer, name: str = "into") -> memoryview:
    """A flat, writable byte view of ``buf`` (no copy)."""
    try:
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
    except TypeError:
        raise TypeError("get_prefix: %s is %s; %s" % (name, type(buf).__name__, INTO_FORMS)) from None
    if view.readonly:
        raise TypeError("get_prefix: %s is read-only (%s); %s" % (name, type(buf).__name__, INTO_FORMS))
    if not view.c_contiguous:
        raise TypeError("get_prefix: %s is not contiguous" % name)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _is_buffer(obj: object) -> bool:
    try:
        memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


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
    def of(
        cls, into: Union[Buffer, Sequence[Buffer], BulkSink, None], nkeys: int, stride: Optional[int] = None
    ) -> Optional[BufferSink]:
        """The destinations ``into`` names for ``nkeys`` values: one buffer
        cut into slots of ``stride`` bytes (by default its size / ``nkeys``,
        which must divide it), a list of buffers, a sink, or None (values
        returned as bytes)."""
        if into is None:
            if stride is not None:
                raise ValueError("get_prefix: stride needs into= (one buffer for all values)")
            return None
        if _is_buffer(into):
            whole = writable_view(into)
            if stride is None:
                if whole.nbytes % nkeys:
                    raise ValueError(
                        "get_prefix: into has %d bytes, not a multiple of the %d keys "
                        "(pass stride=, the bytes from one value's start to the next)" % (whole.nbytes, nkeys)
                    )
                stride = whole.nbytes // nkeys
            elif isinstance(stride, bool) or not isinstance(stride, int) or stride <= 0:
                raise ValueError("get_prefix: stride must be a positive int, not %r" % (stride,))
            elif stride * nkeys > whole.nbytes:
                raise ValueError(
                    "get_prefix: stride %d for %d keys needs %d bytes but into has %d"
                    % (stride, nkeys, stride * nkeys, whole.nbytes)
                )
            return cls([whole[i * stride : (i + 1) * stride] for i in range(nkeys)], None)
        if stride is not None:
            raise ValueError("get_prefix: stride applies to one buffer, not to %s" % type(into).__name__)
        if callable(into):
            return cls(None, into)
        if not isinstance(into, Sequence) or isinstance(into, str):
            raise TypeError("get_prefix: into is %s; %s" % (type(into).__name__, INTO_FORMS))
        views = [writable_view(b, "into[%d]" % i) for i, b in enumerate(into)]
        if len(views) != nkeys:
            raise ValueError(
                "get_prefix: %d keys but into has %d buffers (one per key, or one buffer for all)"
                % (nkeys, len(views))
            )
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

    def capacity(self) -> Optional[int]:
        """Bytes the caller's buffers hold, None for a user sink."""
        return None if self._views is None else sum(v.nbytes for v in self._views)

    def expected_lengths(self, count: int) -> Optional[tuple[list[int], list[memoryview]]]:
        """The lengths of a reply's ``count`` values, as a guess the parser
        checks (:class:`~kvtier._resp.ReplyParser` frames the reply when
        it holds): with one slot per key, each value fills its slot (KV
        blocks are of one size), and the slots. None for a user sink."""
        if self._views is None or count > len(self._views):
            return None
        views = self._views[:count]
        return [v.nbytes for v in views], views

    def finish(self, reply: object) -> list[int]:
        if not isinstance(reply, list) or not all(isinstance(x, int) for x in reply):
            raise ProtocolError("MGETPREFIX: expected an array of bulk strings")
        if self._too_small is not None and self._too_small.index < len(reply):
            raise self._too_small
        return reply
