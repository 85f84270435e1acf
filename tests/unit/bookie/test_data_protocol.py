"""The data protocol's frame layout, byte for byte (docs/protocol.md shows the same bytes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import data_protocol as dp
from bookie.data_protocol import Kind
from magnetar.common.framing import FrameDecoder


def test_a_fence_request_byte_for_byte() -> None:
    # FenceRequest{ledger_id: 5} is 08 05; the body is kind, request id, message
    assert dp.frame(Kind.FENCE, 258, b"\x08\x05") == bytes.fromhex("0000000b0500000000000001020805")


def test_an_error_answer_byte_for_byte() -> None:
    assert dp.frame(dp.ERROR_KIND, 7) == bytes.fromhex("00000009ff0000000000000007")


@settings(deadline=None)  # a shared machine: no timing in tests
@given(
    kind=st.integers(0, 255),
    request_id=st.integers(0, 2**64 - 1),
    message=st.binary(max_size=300),
    cut=st.integers(1, 50),
)
def test_frames_survive_any_split(kind: int, request_id: int, message: bytes, cut: int) -> None:
    data = dp.frame(kind, request_id, message) * 2
    decoder = FrameDecoder(max_frame_size=1024)
    frames = [f for at in range(0, len(data), cut) for f in decoder.feed(data[at : at + cut])]
    parsed = [dp.parse(f) for f in frames]
    assert [(k, i, bytes(m)) for k, i, m in parsed] == [(kind, request_id, message)] * 2


def test_a_body_shorter_than_the_header_is_a_protocol_error() -> None:
    with pytest.raises(dp.ProtocolError, match="shorter than its 9-byte header"):
        dp.parse(memoryview(b"\x05\x00\x00"))


def test_kind_names() -> None:
    assert dp.kind_name(Kind.READ_LAC) == "READ_LAC"
    assert dp.kind_name(Kind.ADD_ENTRIES | dp.RESPONSE) == "ADD_ENTRIES response"
    assert dp.kind_name(dp.ERROR_KIND) == "ERROR response"
    assert dp.kind_name(0x42) == "0x42"
    assert Kind.ERROR not in dp.REQUEST_KINDS
