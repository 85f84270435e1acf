"""Length-prefixed frames over a byte stream: the framing layer of Magnetar's binary protocols.

Pulsar's binary protocol (``broker/pulsar/codec.py``) and, later, the framed broker-to-bookie
protocol both cut a TCP stream into frames the same way::

    [length u32, big-endian][length bytes of frame body]

This module owns that cut and nothing above it: what a body means is the protocol's business.

- :class:`FrameDecoder` is sans-I/O: :meth:`~FrameDecoder.feed` it bytes as they arrive, split
  anywhere (one byte at a time works), and it returns every frame the bytes complete. It refuses a
  length over ``max_frame_size`` as soon as the four length bytes are in, before a byte of the
  body is buffered, so a peer cannot make it allocate by what it claims.
- :class:`FrameReader` and :func:`write_frame` put it on asyncio streams. The reader reads from its
  :class:`asyncio.StreamReader` only when its caller asks for a frame and none is decoded, so a
  consumer that falls behind stops the reading; the stream's own buffer limit then pauses the
  transport and TCP's window pushes back to the sender. :func:`write_frame` waits for ``drain``,
  which pushes back the other way.

Memory is bounded per connection: the stream buffer (twice its ``limit``), at most one
incomplete frame (``4 + max_frame_size``) plus one read of ``read_size`` bytes in the decoder,
and the frames decoded from that one read.

Copies: the frames that lie whole in one read are cut from it without copying (each frame is a
read-only :class:`memoryview` of the ``bytes`` object read from the stream). Only a frame split
across reads is copied, once, into a :class:`bytearray` as its pieces arrive, and that buffer is
then handed over as the frame (read-only) and replaced; bytes are never moved inside a buffer, so
the cost per frame does not grow with what is buffered.

Errors (all :class:`FrameError`, an :class:`~magnetar.common.errors.InvalidArgumentError` that
never crosses the wire: the connection that broke the framing is closed)::

    FrameError                a byte stream broke the framing
    ├── FrameTooLargeError    a frame's length is over the maximum
    └── TruncatedFrameError   the stream ended inside a frame
"""

from __future__ import annotations

import asyncio
import collections
import struct

from magnetar.common.errors import InvalidArgumentError

Bytes = bytes | bytearray | memoryview
"""What the functions here take as bytes (``collections.abc.Buffer`` is Python 3.12's)."""

LENGTH = struct.Struct(">I")
"""The frame's length prefix: the number of body bytes that follow it."""
LENGTH_SIZE = LENGTH.size
MAX_LENGTH = 2**32 - 1
"""The largest length the prefix can say."""


class FrameError(InvalidArgumentError):
    """A byte stream broke the framing; the connection it came on is closed."""


class FrameTooLargeError(FrameError):
    """A frame's length prefix is over the connection's maximum frame size."""


class TruncatedFrameError(FrameError):
    """The stream ended inside a frame: its length prefix or body is incomplete."""


def encode_frame(body: Bytes) -> bytes:
    """``body`` with its length prefix, as one ``bytes`` ready to write."""
    view = memoryview(body)
    if view.nbytes > MAX_LENGTH:
        raise FrameTooLargeError(
            f"a frame of {view.nbytes} bytes is over the {MAX_LENGTH} a length prefix can say",
            context={"frame_size": view.nbytes, "max_frame_size": MAX_LENGTH},
        )
    return LENGTH.pack(view.nbytes) + view


class FrameDecoder:
    """Cuts bytes that arrive in arbitrary chunks into length-prefixed frames."""

    __slots__ = ("_max_frame_size", "_name", "_partial")

    def __init__(self, *, max_frame_size: int, name: str = "frame") -> None:
        if not 0 <= max_frame_size <= MAX_LENGTH:
            raise InvalidArgumentError(
                f"max_frame_size must be from 0 to {MAX_LENGTH}, not {max_frame_size}"
            )
        self._max_frame_size = max_frame_size
        self._name = name
        # The bytes of the frame begun and not complete: its length prefix and body so far.
        self._partial = bytearray()

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete (never more than 4 + max_frame_size)."""
        return len(self._partial)

    def _length_at(self, view: memoryview | bytearray, at: int) -> int:
        (length,) = LENGTH.unpack_from(view, at)
        if length > self._max_frame_size:
            raise FrameTooLargeError(
                f"a {self._name} of {length} bytes is over the maximum of {self._max_frame_size}",
                context={"frame_size": length, "max_frame_size": self._max_frame_size},
            )
        return int(length)

    def _complete_partial(self, view: memoryview, frames: list[memoryview]) -> int:
        """Take from ``view`` what the partial frame lacks; return how many bytes were taken."""
        partial = self._partial
        taken = 0
        if len(partial) < LENGTH_SIZE:
            taken = min(LENGTH_SIZE - len(partial), len(view))
            partial += view[:taken]
            if len(partial) < LENGTH_SIZE:
                return taken
        frame_end = LENGTH_SIZE + self._length_at(partial, 0)
        more = min(frame_end - len(partial), len(view) - taken)
        partial += view[taken : taken + more]
        taken += more
        if len(partial) == frame_end:
            # Hand the buffer itself over, read-only, and start a new one: no second copy.
            frames.append(memoryview(partial).toreadonly()[LENGTH_SIZE:])
            self._partial = bytearray()
        return taken

    def _cut(self, view: memoryview, frames: list[memoryview]) -> int:
        """Append the whole frames at the start of ``view``; return where the rest begins."""
        at, end = 0, len(view)
        while end - at >= LENGTH_SIZE:
            length = self._length_at(view, at)
            if end - at - LENGTH_SIZE < length:
                break
            at += LENGTH_SIZE
            frames.append(view[at : at + length])
            at += length
        return at

    def feed(self, data: Bytes) -> list[memoryview]:
        """Take the next bytes of the stream; return the frames they complete, in order.

        Raises :class:`FrameTooLargeError` when a length prefix is over the maximum; the decoder
        is then unusable, as the stream is.
        """
        view = memoryview(data).cast("B")
        if not isinstance(data, bytes):
            view = memoryview(bytes(view))  # a mutable buffer could change under the frames
        frames: list[memoryview] = []
        at = self._complete_partial(view, frames) if self._partial else 0
        if self._partial:
            return frames  # every byte went to the frame still incomplete
        # Whole frames are views of the caller's bytes; only an incomplete tail is copied.
        at += self._cut(view[at:], frames)
        self._partial += view[at:]
        return frames

    def end(self) -> None:
        """The stream ended: raise :class:`TruncatedFrameError` if it ended inside a frame."""
        if self.buffered:
            raise TruncatedFrameError(
                f"the stream ended inside a {self._name}: {self.buffered} bytes of it came",
                context={"buffered": self.buffered},
            )


class FrameReader:
    """Reads frames from an :class:`asyncio.StreamReader`, reading only as frames are taken."""

    __slots__ = ("_decoder", "_eof", "_frames", "_read_size", "_reader")

    def __init__(
        self,
        reader: asyncio.StreamReader,
        *,
        max_frame_size: int,
        read_size: int = 64 * 1024,
        name: str = "frame",
    ) -> None:
        if read_size < 1:
            raise InvalidArgumentError(f"read_size must be at least 1, not {read_size}")
        self._reader = reader
        self._decoder = FrameDecoder(max_frame_size=max_frame_size, name=name)
        self._frames: collections.deque[memoryview] = collections.deque()
        self._read_size = read_size
        self._eof = False

    async def read_frame(self) -> memoryview | None:
        """The next frame's body; ``None`` when the stream ended cleanly between frames.

        Raises :class:`FrameTooLargeError` or :class:`TruncatedFrameError`; the caller closes
        the connection.
        """
        while not self._frames:
            if self._eof:
                return None
            data = await self._reader.read(self._read_size)
            if not data:
                self._eof = True
                self._decoder.end()
                return None
            self._frames.extend(self._decoder.feed(data))
        return self._frames.popleft()

    def __aiter__(self) -> FrameReader:
        return self

    async def __anext__(self) -> memoryview:
        frame = await self.read_frame()
        if frame is None:
            raise StopAsyncIteration
        return frame


async def write_frame(writer: asyncio.StreamWriter, body: Bytes) -> None:
    """Write one length-prefixed frame and wait until the transport takes more."""
    writer.write(encode_frame(body))
    await writer.drain()
