"""The client's hand-written AddEntriesRequest encoding is protobuf's, byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.client import wire
from bookie.entries import AddEntry
from proto.bookie.v1 import bookie_pb2 as pb

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
entries = st.lists(
    st.builds(
        AddEntry,
        ledger_id=int64,
        entry_id=int64,
        last_add_confirmed=int64,
        payload=st.one_of(st.binary(max_size=64), st.binary(min_size=4096, max_size=9000)),
        crc32c=st.integers(min_value=0, max_value=2**32 - 1),
        recovery=st.booleans(),
    ),
    max_size=6,
)


def reference(request_id: int, adds: list[AddEntry]) -> bytes:
    request = pb.AddEntriesRequest(request_id=request_id)
    for e in adds:
        request.entries.add(
            ledger_id=e.ledger_id,
            entry_id=e.entry_id,
            last_add_confirmed=e.last_add_confirmed,
            payload=e.payload,
            crc32c=e.crc32c,
            recovery=e.recovery,
        )
    return request.SerializeToString()


@settings(max_examples=300)
@given(st.integers(min_value=0, max_value=2**64 - 1), entries)
def test_encoding_matches_protobuf_byte_for_byte(request_id: int, adds: list[AddEntry]) -> None:
    assert wire.encode_add_request(request_id, adds) == reference(request_id, adds)


def test_large_entries_take_the_hand_written_path_and_parse_back() -> None:
    adds = [AddEntry(7, i, i - 1, bytes([i]) * 65536, 4_000_000_000 + i, i == 2) for i in range(4)]
    data = wire.encode_add_request(9, adds)
    parsed = pb.AddEntriesRequest.FromString(data)
    assert parsed.request_id == 9
    assert [
        (e.entry_id, e.last_add_confirmed, e.payload[:1], e.crc32c, e.recovery)
        for e in parsed.entries
    ] == [(i, i - 1, bytes([i]), 4_000_000_000 + i, i == 2) for i in range(4)]
