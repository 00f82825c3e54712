"""RESP without I/O: request encoding and a reply parser that lands bulk
payloads in caller buffers.

Both clients (``kvtier.Client`` over its own sockets and
``kvtier.AsyncClient`` over an asyncio ``BufferedProtocol``) drive the same
:class:`ReplyParser`; only the way bytes arrive differs::

    parser = ReplyParser(sink)
    while not parser.done:
        n = sock.recv_into(parser.buffer())   # or: BufferedProtocol.get_buffer
        parser.advance(n)                     #     and buffer_updated(n)
    reply = parser.result()

``buffer()`` returns either a window of the parser's small scratch buffer
(for headers, integers, errors and small replies) or, while the payload of a
bulk string in a sink-handled array is arriving, a slice of the caller's own
buffer: the kernel copies those bytes straight into the destination. Only the
few bytes that arrive in the same read as a bulk header (at most
``HEADER_READ`` of each value) pass through the scratch buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Union

from .errors import ProtocolError, ResponseError

#: A request argument: bytes-like, text (UTF-8), an integer, or a sequence of
#: bytes-like pieces sent back to back as one bulk string (a value gathered
#: from several buffers without joining them).
Arg = Union[bytes, bytearray, memoryview, str, int, Sequence[Union[bytes, bytearray, memoryview]]]

#: Where the payload of bulk string ``index`` (``length`` bytes) goes: an
#: iterable of writable buffers filled in order. A generator may look at the
#: bytes of one buffer (a header) before it yields the next; a list of
#: buffers yielded as one item is filled by as few reads as the socket
#: allows (one ``recvmsg_into`` for many regions). Bytes left over when it
#: ends (or yields ``None``) are read and dropped.
SinkItem = Union[memoryview, bytearray, list[Union[memoryview, bytearray]], None]
BulkSink = Callable[[int, int], Iterable[SinkItem]]

#: Pieces of at most this size are copied into one request buffer; larger
#: ones are sent from the caller's memory as they are.
SMALL_PIECE = 16 * 1024
#: Bytes read at a time while a sink-handled array expects its next bulk
#: header, so that little of the payload after it lands in scratch memory.
HEADER_READ = 32
SCRATCH_SIZE = 64 * 1024
#: Longest header line accepted (an integer, a simple string, an error).
MAX_LINE = 64 * 1024


def _as_bytes(arg: Union[bytes, bytearray, memoryview, str, int]) -> Union[bytes, bytearray, memoryview]:
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, (bytes, bytearray)):
        return arg
    if isinstance(arg, bool):
        raise TypeError("a bool is not a RESP argument")
    if isinstance(arg, int):
        return str(arg).encode()
    # A memoryview or any other buffer (a numpy array: its len counts rows
    # and its + adds numbers), as flat bytes.
    view = arg if isinstance(arg, memoryview) else memoryview(arg)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _nbytes(buf: Union[bytes, bytearray, memoryview]) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def arg_nbytes(arg: Union[bytes, bytearray, memoryview, str, int]) -> int:
    """Bytes an argument (or a piece of one) is sent as."""
    return _nbytes(_as_bytes(arg))


def encode_command(args: Sequence[Arg]) -> list[Union[bytes, bytearray, memoryview]]:
    """Encodes one command as a list of buffers to send in order.

    Small arguments are joined into shared buffers; large ones are passed
    through as memoryviews of the caller's memory, never copied.
    """
    out: list[Union[bytes, bytearray, memoryview]] = []
    head = bytearray(b"*%d\r\n" % len(args))
    for arg in args:
        # A key or a word: one format per argument (the general path below
        # cost 0.85 us per argument, 55 us of a 64-key lookup).
        data = arg.encode() if isinstance(arg, str) else arg if isinstance(arg, bytes) else None
        if data is not None and len(data) <= SMALL_PIECE:
            head += b"$%d\r\n%b\r\n" % (len(data), data)
            continue
        if isinstance(arg, (list, tuple)):
            pieces = [_as_bytes(p) for p in arg]
        else:
            pieces = [_as_bytes(arg)]  # type: ignore[arg-type]
        total = sum(_nbytes(p) for p in pieces)
        head += b"$%d\r\n" % total
        for piece in pieces:
            if _nbytes(piece) <= SMALL_PIECE:
                head += piece
            else:
                out.append(head)
                out.append(piece if isinstance(piece, memoryview) else memoryview(piece))
                head = bytearray()
        head += b"\r\n"
    if head:
        out.append(head)
    return out


class _Container:
    """An aggregate being filled: what kind, how many items are still due."""

    __slots__ = ("items", "kind", "left")

    def __init__(self, kind: bytes, left: int) -> None:
        self.kind = kind
        self.items: list[object] = []
        self.left = left


class _Frame:
    """The rest of a sink-handled array whose value lengths are known before
    it arrives (one buffer per value, of the value's exact size): every
    header, value and CRLF of it posted at once, so one ``recvmsg_into``
    lands many values. The headers and CRLFs land in ``glue`` and are
    checked against what the lengths say as they arrive; a difference (a
    shorter value, an error item) ends the frame, and what landed is parsed
    the ordinary way (:meth:`ReplyParser._unframe`)."""

    __slots__ = (
        "bad_at",
        "checked",
        "expected",
        "filled",
        "glue",
        "glue_at",
        "heads",
        "lengths",
        "off",
        "seg",
        "segs",
        "size",
    )

    def __init__(self, lengths: list[int], views: list[memoryview]) -> None:
        self.lengths = lengths
        self.expected = b"".join(
            [b"$%d\r\n" % lengths[0]] + [b"\r\n$%d\r\n" % n for n in lengths[1:]] + [b"\r\n"]
        )
        self.glue = bytearray(len(self.expected))
        glue = memoryview(self.glue)
        # Segments in reply order: glue, value, glue, value, ..., glue; a
        # glue segment is one of ``glue``'s windows, in order.
        self.segs: list[tuple[memoryview, bool]] = []
        pos = 0
        #: Where each item's header starts: (segment, offset in it), and
        #: where its glue starts in ``glue``.
        self.heads: list[tuple[int, int]] = []
        self.glue_at: list[int] = []
        for i, n in enumerate(lengths):
            head = len(b"$%d\r\n" % n) + (2 if i else 0)
            self.heads.append((len(self.segs), 2 if i else 0))
            self.glue_at.append(pos)
            self.segs.append((glue[pos : pos + head], True))
            if n:  # an empty value has no bytes to land
                self.segs.append((views[i][:n], False))
            pos += head
        self.segs.append((glue[pos : pos + 2], True))
        self.size = len(self.expected) + sum(lengths)
        self.seg = 0  # the segment being filled
        self.off = 0  # bytes of it filled
        self.filled = 0  # glue bytes landed
        self.checked = 0  # glue bytes found as expected
        self.bad_at = -1  # the first glue byte found otherwise

    def buffers(self, most: int) -> list[memoryview]:
        view = self.segs[self.seg][0][self.off :]
        return [view] + [v for v, _ in self.segs[self.seg + 1 : self.seg + most]]

    def advance(self, n: int) -> bool:
        """Records ``n`` bytes landed in :meth:`buffers`; False when the glue
        differs from the expected (the frame must end)."""
        while n:
            view, is_glue = self.segs[self.seg]
            step = min(n, view.nbytes - self.off)
            if is_glue:
                self.filled += step
            self.off += step
            n -= step
            if self.off == view.nbytes:
                self.seg += 1
                self.off = 0
                if self.seg == len(self.segs) and n:
                    raise ProtocolError("more bytes received than the reply holds")
        if self.filled > self.checked:
            if self.glue[self.checked : self.filled] != self.expected[self.checked : self.filled]:
                self.bad_at = next(
                    i for i in range(self.checked, self.filled) if self.glue[i] != self.expected[i]
                )
                return False
            self.checked = self.filled
        return True

    @property
    def done(self) -> bool:
        return self.seg == len(self.segs)

    def whole(self) -> int:
        """After a mismatch, how many leading items surely landed whole: those
        before the item whose glue differed, less the one just before it (the
        CRLF ending that one is in the differing glue)."""
        item = sum(1 for at in self.glue_at if at <= self.bad_at) - 1
        return max(0, item - 1)

    def landed_from(self, item: int) -> bytes:
        """The bytes received into the frame from item ``item``'s header on,
        in reply order."""
        first, off = self.heads[item]
        parts = []
        for i in range(first, min(self.seg + 1, len(self.segs))):
            view = self.segs[i][0]
            start = off if i == first else 0
            end = self.off if i == self.seg else view.nbytes
            parts.append(bytes(view[start:end]))
        return b"".join(parts)


class ReplyParser:
    """Parses exactly one RESP2/RESP3 reply fed through :meth:`buffer`.

    With a ``sink``, the bulk strings that are direct items of a top-level
    array are not returned as ``bytes``: their payloads go where the sink
    says, and the array holds each one's length instead. Errors at the top
    level are raised by :meth:`result`; errors inside an aggregate are kept as
    :class:`ResponseError` items.
    """

    def __init__(self, sink: BulkSink | None = None) -> None:
        self._sink = sink
        self._scratch = bytearray(SCRATCH_SIZE)
        self._view = memoryview(self._scratch)
        self._start = 0  # first unparsed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._stack: list[_Container] = []
        self._done = False
        self._started = False
        self._value: object = None
        # A bulk string being received: bytes still due (payload + CRLF).
        self._bulk_left = 0
        self._bulk_len = 0
        self._bulk_direct = False
        self._bulk_buf: bytearray | None = None  # small bulk assembled here
        self._bulk_pos = 0
        self._targets: Iterator[SinkItem] | None = None
        self._target: memoryview | None = None  # unfilled part of the current target
        self._queued: list[memoryview] = []  # the rest of a list of targets, in order
        self._bulk_index = 0  # index of the next sink-handled bulk
        self._frame: _Frame | None = None  # a framed array being received

    # -- driver interface -------------------------------------------------

    @property
    def done(self) -> bool:
        """True once a whole reply has been parsed."""
        return self._done

    @property
    def started(self) -> bool:
        """True once any byte of the reply has been received."""
        return self._started

    def buffer(self) -> memoryview:
        """Where the next received bytes should be written (never empty)."""
        if self._frame is not None:
            return self._frame.buffers(1)[0]
        if self._bulk_left > 2:
            payload_left = self._bulk_left - 2
            if self._target is not None:
                return self._target[: min(self._target.nbytes, payload_left)]
            if self._bulk_buf is not None:
                return memoryview(self._bulk_buf)[self._bulk_pos : self._bulk_pos + payload_left]
            limit = self._bulk_left  # payload nobody wants: dropped from scratch
        elif self._small_reads():
            limit = HEADER_READ
        else:
            limit = SCRATCH_SIZE
        self._compact()
        room = min(len(self._scratch) - self._end, limit)
        if room <= 0:
            raise ProtocolError("reply line longer than %d bytes" % MAX_LINE)
        return self._view[self._end : self._end + room]

    def buffers(self, most: int = 64) -> list[memoryview]:
        """Where the next received bytes should go, in order: several buffers
        while a sink's list of targets is being filled (for one
        ``recvmsg_into``), else the one :meth:`buffer`."""
        if self._frame is not None:
            return self._frame.buffers(most)
        if self._bulk_left > 2 and self._target is not None and self._queued:
            left = self._bulk_left - 2
            out = []
            for view in (self._target, *self._queued[: most - 1]):
                if left <= 0:
                    break
                out.append(view[: min(view.nbytes, left)])
                left -= out[-1].nbytes
            return out
        return [self.buffer()]

    def advance(self, n: int) -> None:
        """Records that ``n`` bytes were written into the last :meth:`buffer`
        (or, in order, into the last :meth:`buffers`)."""
        if n <= 0:
            raise ValueError("advance needs a positive byte count")
        self._started = True
        if self._frame is not None:
            self._advance_frame(n)
            return
        if self._bulk_left > 2 and self._target is not None:
            while n > 0 and self._target is not None:
                step = min(n, self._target.nbytes)
                self._bulk_left -= step
                n -= step
                if step == self._target.nbytes:
                    self._next_target()
                else:
                    self._target = self._target[step:]
            if n:
                raise ProtocolError("more bytes received than the targets hold")
        elif self._bulk_left > 2 and self._bulk_buf is not None:
            self._bulk_pos += n
            self._bulk_left -= n
        else:
            self._end += n
        self._parse()

    def result(self) -> object:
        """The parsed reply; raises :class:`ResponseError` for an error reply."""
        if not self._done:
            raise ProtocolError("reply is not complete")
        if isinstance(self._value, ResponseError):
            raise self._value
        return self._value

    # -- a framed array -------------------------------------------------------

    def _start_frame(self, count: int) -> bool:
        """Enters a frame for a sink-handled array of ``count`` values when the
        sink knows their lengths and what arrived of the first header agrees."""
        expect = getattr(self._sink, "expected_lengths", None)
        known = expect(count) if expect is not None else None
        if not known:
            return False
        lengths, targets = known
        arrived = self._end - self._start
        first = b"$%d\r\n" % lengths[0]
        k = min(arrived, len(first))
        if self._scratch[self._start : self._start + k] != first[:k]:
            return False
        frame = _Frame(lengths, [_target_view(t) for t in targets])
        if arrived > frame.size:
            return False  # more than the guess holds: it is wrong
        # What arrived with the array's header goes in first.
        if arrived:
            src = self._start
            for view in frame.buffers(len(frame.segs)):
                step = min(self._end - src, view.nbytes)
                view[:step] = self._view[src : src + step]
                src += step
                if src == self._end:
                    break
            self._start = self._end = 0
        self._frame = frame
        if arrived:
            self._advance_frame(arrived)
        return True

    def _advance_frame(self, n: int) -> None:
        frame = self._frame
        assert frame is not None
        if not frame.advance(n):
            self._unframe()
            return
        if frame.done:
            self._frame = None
            self._bulk_index += len(frame.lengths)
            for length in frame.lengths:
                self._emit(length)

    def _unframe(self) -> None:
        """Ends a frame whose glue differed: the items that landed whole and
        checked are kept as they are; the bytes from the next item's header
        on are parsed the ordinary way, from a copy of them."""
        frame = self._frame
        assert frame is not None
        self._frame = None
        whole = frame.whole()
        landed = frame.landed_from(whole)
        if len(landed) + SCRATCH_SIZE > len(self._scratch):
            self._scratch = bytearray(len(landed) + SCRATCH_SIZE)
            self._view = memoryview(self._scratch)
        self._scratch[: len(landed)] = landed
        self._start, self._end = 0, len(landed)
        self._bulk_index += whole
        for length in frame.lengths[:whole]:
            self._emit(length)
        self._parse()

    # -- parsing ------------------------------------------------------------

    def _compact(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._start > SCRATCH_SIZE // 2:
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start : self._end]
            self._start, self._end = 0, n

    def _small_reads(self) -> bool:
        """While a sink-handled array's headers are due, read little at a time."""
        return self._sink is not None and (
            not self._stack or (len(self._stack) == 1 and self._stack[0].kind == b"*")
        )

    def _line(self) -> bytes | None:
        i = self._scratch.find(b"\r\n", self._start, self._end)
        if i < 0:
            if self._end - self._start > MAX_LINE:
                raise ProtocolError("reply line longer than %d bytes" % MAX_LINE)
            return None
        line = bytes(self._scratch[self._start : i])
        self._start = i + 2
        return line

    def _parse(self) -> None:
        while not self._done:
            if self._bulk_left:
                if not self._continue_bulk():
                    return
                continue
            line = self._line()
            if line is None:
                return
            if not line:
                raise ProtocolError("empty reply line")
            kind, rest = line[:1], line[1:]
            if kind in (b"+",):
                self._emit(rest)
            elif kind == b"-":
                self._emit(ResponseError(rest.decode(errors="replace")))
            elif kind == b":":
                self._emit(self._int(rest))
            elif kind in (b"$", b"=", b"!"):
                length = self._int(rest)
                if length < 0:
                    self._emit(None)
                else:
                    self._start_bulk(kind, length)
            elif kind in (b"*", b"~", b">"):
                count = self._int(rest)
                if count < 0:
                    self._emit(None)
                elif count == 0:
                    self._emit([])
                else:
                    self._stack.append(_Container(kind, count))
                    if kind == b"*" and len(self._stack) == 1 and self._start_frame(count):
                        return
            elif kind == b"%":
                count = self._int(rest)
                if count == 0:
                    self._emit({})
                else:
                    self._stack.append(_Container(kind, 2 * count))
            elif kind == b"_":
                self._emit(None)
            elif kind == b"#":
                self._emit(rest == b"t")
            elif kind == b",":
                self._emit(float(rest))
            elif kind == b"(":
                self._emit(self._int(rest))
            else:
                raise ProtocolError("unknown RESP type byte %r" % kind)

    @staticmethod
    def _int(text: bytes) -> int:
        try:
            return int(text)
        except ValueError:
            raise ProtocolError("not an integer: %r" % text[:40]) from None

    def _start_bulk(self, kind: bytes, length: int) -> None:
        self._bulk_len = length
        self._bulk_left = length + 2
        self._bulk_direct = kind == b"$" and self._expect_direct_bulk_item()
        self._bulk_buf = None
        self._bulk_pos = 0
        self._target = None
        self._targets = None
        self._queued = []
        if self._bulk_direct:
            assert self._sink is not None
            index = self._bulk_index
            self._bulk_index += 1
            self._targets = iter(self._sink(index, length))
            self._next_target()
        else:
            self._bulk_buf = bytearray(length)
        self._take_buffered()

    def _expect_direct_bulk_item(self) -> bool:
        return self._sink is not None and len(self._stack) == 1 and self._stack[0].kind == b"*"

    def _next_target(self) -> None:
        self._target = None
        while self._queued:
            view = self._queued.pop(0)
            if view.nbytes:
                self._target = view
                return
        if self._targets is None:
            return
        for t in self._targets:
            if t is None:
                break
            views = [_target_view(x) for x in t] if isinstance(t, (list, tuple)) else [_target_view(t)]
            views = [v for v in views if v.nbytes]
            if views:
                self._target = views[0]
                self._queued = views[1:]
                return
        self._targets = None

    def _take_buffered(self) -> None:
        """Moves payload bytes that arrived in scratch along with the header."""
        while self._bulk_left > 2 and self._start < self._end:
            payload_left = self._bulk_left - 2
            avail = min(self._end - self._start, payload_left)
            if self._target is not None:
                n = min(avail, self._target.nbytes)
                self._target[:n] = self._view[self._start : self._start + n]
                self._target = self._target[n:] if n < self._target.nbytes else None
                if self._target is None:
                    self._next_target()
            elif self._bulk_buf is not None:
                n = avail
                self._bulk_buf[self._bulk_pos : self._bulk_pos + n] = self._view[
                    self._start : self._start + n
                ]
                self._bulk_pos += n
            else:
                n = avail  # dropped: nobody wants these bytes
            self._start += n
            self._bulk_left -= n

    def _continue_bulk(self) -> bool:
        """Finishes the current bulk if its bytes are here; False if not yet."""
        if self._bulk_left > 2:
            self._take_buffered()
            if self._bulk_left > 2:
                return False
        if self._end - self._start < 2:
            return False
        if self._scratch[self._start : self._start + 2] != b"\r\n":
            raise ProtocolError("bulk string not followed by CRLF")
        self._start += 2
        self._bulk_left = 0
        if self._bulk_direct:
            self._targets = None
            self._target = None
            self._queued = []
            self._emit(self._bulk_len)
        else:
            value = self._bulk_buf if self._bulk_buf is not None else bytearray()
            self._bulk_buf = None
            # Small values as bytes; a large one stays the bytearray it was
            # received into (no second copy).
            self._emit(bytes(value) if len(value) <= SMALL_PIECE else value)
        return True

    def _emit(self, value: object) -> None:
        while True:
            if not self._stack:
                self._value = value
                self._done = True
                return
            top = self._stack[-1]
            top.items.append(value)
            top.left -= 1
            if top.left:
                return
            self._stack.pop()
            if top.kind == b"%":
                it = iter(top.items)
                value = {_hashable(k): v for k, v in zip(it, it)}
            else:
                value = top.items


def _target_view(t: Union[memoryview, bytearray]) -> memoryview:
    view = t if isinstance(t, memoryview) else memoryview(t)
    if view.readonly:
        raise TypeError("a sink yielded a read-only buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _hashable(key: object) -> object:
    return tuple(key) if isinstance(key, list) else key
