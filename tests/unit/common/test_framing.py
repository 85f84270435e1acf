"""The framing layer: length-prefixed frames cut from bytes split anywhere, bounded, refused when
too large, and read from asyncio streams only as fast as they are taken."""

from __future__ import annotations

import asyncio
import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.common.errors import InvalidArgumentError
from magnetar.common.framing import (
    FrameDecoder,
    FrameError,
    FrameReader,
    FrameTooLargeError,
    TruncatedFrameError,
    encode_frame,
    write_frame,
)


def framed(*bodies: bytes) -> bytes:
    # written out by hand, not by encode_frame: the format is [length u32 big-endian][body]
    return b"".join(struct.pack(">I", len(b)) + b for b in bodies)


BODIES = [b"first", b"", b"x" * 300, bytes(range(256)), b"last"]


def test_encode_frame_writes_a_big_endian_length_then_the_body() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_frame(memoryview(b"")) == b"\x00\x00\x00\x00"
    assert encode_frame(bytearray(b"\x01")) == framed(b"\x01")


def test_frames_in_one_chunk_come_out_in_order() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    frames = decoder.feed(framed(*BODIES))
    assert [bytes(f) for f in frames] == BODIES
    assert decoder.buffered == 0
    decoder.end()


def test_bytes_fed_one_at_a_time_make_the_same_frames() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    stream = framed(*BODIES)
    frames: list[bytes] = []
    for i in range(len(stream)):
        frames += [bytes(f) for f in decoder.feed(stream[i : i + 1])]
        assert decoder.buffered <= 4 + 1000
    assert frames == BODIES
    assert decoder.buffered == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
)
def test_any_split_of_the_stream_makes_the_same_frames(bodies, cuts) -> None:
    stream = framed(*bodies)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_size=300)
    frames: list[bytes] = []
    for start, end in itertools.pairwise(points):
        frames += [bytes(f) for f in decoder.feed(stream[start:end])]
    assert frames == bodies
    decoder.end()


def test_frames_cut_from_a_bytes_chunk_are_views_of_it_not_copies() -> None:
    chunk = framed(b"a" * 1000, b"b" * 1000)
    frames = FrameDecoder(max_frame_size=1000).feed(chunk)
    assert all(f.obj is chunk for f in frames)


def test_a_frame_split_across_chunks_is_handed_over_read_only() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00\x03ab") == []
    (frame, after) = decoder.feed(b"c\x00\x00\x00\x01d")
    assert (bytes(frame), bytes(after)) == (b"abc", b"d")
    assert frame.readonly
    assert decoder.buffered == 0


def test_a_mutable_buffer_fed_in_is_copied_so_frames_do_not_change_with_it() -> None:
    chunk = bytearray(framed(b"abc"))
    (frame,) = FrameDecoder(max_frame_size=10).feed(chunk)
    chunk[4:7] = b"xyz"
    assert bytes(frame) == b"abc"


def test_a_frame_over_the_maximum_is_refused_from_its_length_alone() -> None:
    decoder = FrameDecoder(max_frame_size=100, name="test frame")
    assert decoder.feed(framed(b"y" * 100)) != []  # the maximum itself is allowed
    with pytest.raises(
        FrameTooLargeError, match="test frame of 101 bytes is over the maximum of 100"
    ):
        # only the length prefix has come: nothing of the claimed body is waited for or buffered
        decoder.feed(struct.pack(">I", 101))
    with pytest.raises(FrameTooLargeError) as raised:
        FrameDecoder(max_frame_size=100).feed(b"\xff\xff\xff\xff")
    assert raised.value.context == {"frame_size": str(2**32 - 1), "max_frame_size": "100"}
    assert isinstance(raised.value, FrameError)
    assert isinstance(raised.value, InvalidArgumentError)


def test_a_too_large_frame_behind_a_split_one_is_refused_too() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    assert decoder.feed(b"\x00\x00\x00\x02a") == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"b" + struct.pack(">I", 11))


def test_a_stream_that_ends_inside_a_frame_is_truncated() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    decoder.feed(b"\x00\x00\x00\x05ab")
    with pytest.raises(TruncatedFrameError, match="6 bytes of it came"):
        decoder.end()
    decoder = FrameDecoder(max_frame_size=10)
    decoder.feed(b"\x00\x00")
    with pytest.raises(TruncatedFrameError):
        decoder.end()


def test_the_decoder_holds_only_the_incomplete_frame() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    decoder.feed(b"\x00\x00\x00")  # start a partial frame so the buffered path runs
    for _ in range(500):
        decoder.feed(b"\x05abcde\x00\x00\x00")
        assert decoder.buffered == 3


async def test_bad_limits_are_named() -> None:
    with pytest.raises(InvalidArgumentError, match="max_frame_size must be from 0"):
        FrameDecoder(max_frame_size=-1)
    with pytest.raises(InvalidArgumentError, match="read_size must be at least 1"):
        FrameReader(asyncio.StreamReader(), max_frame_size=1, read_size=0)


async def take(reader: FrameReader) -> bytes:
    frame = await reader.read_frame()
    assert frame is not None, "the stream ended"
    return bytes(frame)


class RecordingTransport(asyncio.ReadTransport):
    """A fake transport that records whether the stream reader paused it."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def is_paused(self) -> bool:
        return self.paused

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_frames_are_read_from_the_stream_only_as_they_are_taken() -> None:
    stream = asyncio.StreamReader(limit=4096)
    transport = RecordingTransport()
    stream.set_transport(transport)
    body = b"m" * 1000
    stream.feed_data(framed(*[body] * 20))  # 20 KB arrive while nobody takes a frame
    assert transport.is_paused()  # the stream reader stops the socket: nothing more is read
    reader = FrameReader(stream, max_frame_size=1000, read_size=2048)
    assert await take(reader) == body
    # one frame was taken: the reader read one read_size from the stream, not the backlog
    assert transport.is_paused()
    taken = 1
    while transport.is_paused():
        assert await take(reader) == body
        taken += 1
    assert taken < 20  # the socket is resumed as the backlog drains, before it is all taken
    stream.feed_eof()
    rest = [bytes(f) async for f in reader]
    assert len(rest) + taken == 20


async def test_a_reader_returns_none_at_a_clean_end_and_raises_inside_a_frame() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(framed(b"one") + b"\x00\x00\x00\x09par")
    stream.feed_eof()
    reader = FrameReader(stream, max_frame_size=100)
    assert await take(reader) == b"one"
    with pytest.raises(TruncatedFrameError):
        await reader.read_frame()
    clean = asyncio.StreamReader()
    clean.feed_eof()
    assert await FrameReader(clean, max_frame_size=1).read_frame() is None


async def test_frames_cross_a_real_socket_split_anywhere() -> None:
    received: list[bytes] = []
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for frame in FrameReader(reader, max_frame_size=70_000, read_size=1000):
            received.append(bytes(frame))
            await write_frame(writer, frame)  # echo
        writer.close()
        done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        bodies = [b"", b"a", b"b" * 65_000, bytes(range(256)) * 3]
        stream = framed(*bodies)
        for at in range(0, len(stream), 7777):  # arbitrary write boundaries
            writer.write(stream[at : at + 7777])
            await writer.drain()
        echoes = FrameReader(reader, max_frame_size=70_000)
        echoed = [await take(echoes) for _ in bodies]
        writer.write_eof()
        assert await echoes.read_frame() is None
        await done.wait()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    assert received == bodies
    assert echoed == bodies
