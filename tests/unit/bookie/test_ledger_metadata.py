"""Ledger metadata: segments, write sets, and its stored form."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bookie.client.ledger_metadata import LedgerMetadata, LedgerState, Segment


def metadata(**overrides: object) -> LedgerMetadata:
    base = {
        "ledger_id": 7,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": LedgerState.OPEN,
        "segments": (Segment(0, ("a", "b", "c")), Segment(100, ("d", "b", "c"))),
    }
    base.update(overrides)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def test_write_sets_follow_the_segment_in_force() -> None:
    md = metadata()
    assert md.write_set(0) == ("a", "b")
    assert md.write_set(2) == ("c", "a")
    assert md.write_set(99) == ("a", "b")
    assert md.write_set(100) == ("b", "c")  # 100 mod 3 = 1
    assert md.write_set(102) == ("d", "b")
    assert md.segment_end(0) == 99
    assert md.segment_end(1) is None
    assert metadata(state=LedgerState.CLOSED, last_entry_id=150).segment_end(1) == 150


def test_a_new_segment_at_the_same_entry_replaces_the_old_one() -> None:
    md = metadata().with_segment(100, ["e", "b", "c"])
    assert md.segments == (Segment(0, ("a", "b", "c")), Segment(100, ("e", "b", "c")))
    md = md.with_segment(120, ["e", "f", "c"])
    assert [s.first_entry_id for s in md.segments] == [0, 100, 120]
    assert md.replacing(0, ["x", "b", "c"]).segments[0].bookies == ("x", "b", "c")


@given(
    st.integers(0, 2**62),
    st.sampled_from(list(LedgerState)),
    st.integers(-1, 10**9),
    st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=3),
)
def test_stored_form_round_trips(ledger_id, state, last, custom) -> None:
    md = metadata(ledger_id=ledger_id, state=state, last_entry_id=last, custom=custom, version=0)
    again = LedgerMetadata.from_bytes(ledger_id, md.to_bytes(), version=42)
    assert again == metadata(
        ledger_id=ledger_id, state=state, last_entry_id=last, custom=custom, version=42
    )
