"""ManagedLedgerConfig validation, name rules, and the persisted formats round-tripping."""

from __future__ import annotations

import pytest

from broker.managed_ledger import LedgerInfo, ManagedLedgerConfig, Position
from broker.managed_ledger.persistence import (
    StoredCursor,
    StoredInfo,
    check_cursor_name,
    check_name,
    decode_cursor,
    decode_info,
    encode_cursor,
    encode_info,
)
from magnetar.common.errors import InvalidArgumentError, InvalidConfigError, ManagedLedgerError
from proto.format.v1 import managed_ledger_pb2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ensemble_size": 2, "write_quorum": 3}, "write_quorum: must be <= ensemble_size"),
        ({"write_quorum": 2, "ack_quorum": 3}, "ack_quorum: must be <= write_quorum"),
        ({"ensemble_size": 0}, "ensemble_size: must be >= 1"),
        ({"max_entries_per_ledger": 0}, "max_entries_per_ledger: must be >= 1"),
        ({"max_ledger_size_bytes": -5}, "max_ledger_size_bytes: must be >= 1"),
        ({"min_ledger_age_ms": -1}, "min_ledger_age_ms: must be >= 0"),
        ({"retention_time_ms": -2}, "retention_time_ms: must be >= 0, or -1"),
        ({"retention_size_bytes": -3}, "retention_size_bytes: must be >= 0, or -1"),
        ({"max_inline_ack_ranges": 0}, "max_inline_ack_ranges: must be >= 1"),
        ({"trim_interval_ms": 0}, "trim_interval_ms: must be >= 1"),
    ],
)
def test_bad_settings_name_the_field_and_the_rule(settings, message) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        ManagedLedgerConfig(**settings)


def test_good_settings() -> None:
    config = ManagedLedgerConfig(
        ensemble_size=3, write_quorum=3, ack_quorum=2, retention_time_ms=-1, retention_size_bytes=-1
    )
    assert config.retention_time_ms == -1


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "it is empty"),
        ("/public/default/t", "may not start or end with '/'"),
        ("public/default/t/", "may not start or end with '/'"),
        ("public//t", "'//'"),
        ("public/../t", "'.' or '..'"),
        ("public/default/a b", "whitespace"),
        ("x" * 600, "the limit is 512"),
    ],
)
def test_bad_managed_ledger_names(name, problem) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        check_name(name)


def test_good_names() -> None:
    assert check_name("public/default/t-partition-0") == "public/default/t-partition-0"
    assert check_cursor_name("my-sub") == "my-sub"
    with pytest.raises(InvalidArgumentError, match="may not contain '/'"):
        check_cursor_name("a/b")
    with pytest.raises(InvalidArgumentError, match="a cursor name is a str"):
        check_cursor_name(3)


def test_info_round_trips() -> None:
    info = StoredInfo(
        ledgers=(LedgerInfo(7, 10, 1000, 0, 25, 123, 456), LedgerInfo(9, 0, 0, 25, 0, 789, 0)),
        properties={"k": "v"},
    )
    assert decode_info("t", encode_info(info)) == info


def test_cursor_round_trips() -> None:
    cursor = StoredCursor(
        mark_delete=Position(7, 3),
        mark_delete_offset=11,
        acked_ranges=((Position(7, 5), Position(7, 6)), (Position(9, 0), Position(9, 0))),
        last_active_ms=5,
    )
    assert decode_cursor("c", encode_cursor(cursor)) == cursor
    before_everything = StoredCursor(Position(-1, -1), -1)
    assert decode_cursor("c", encode_cursor(before_everything)).mark_delete == Position(-1, -1)


def test_a_newer_format_is_refused_clearly() -> None:
    data = managed_ledger_pb2.ManagedLedgerInfo(format_version=2).SerializeToString()
    with pytest.raises(ManagedLedgerError, match="format version 2"):
        decode_info("t", data)
    with pytest.raises(ManagedLedgerError, match="cannot be decoded"):
        decode_info("t", b"\xff\xff\xff")
