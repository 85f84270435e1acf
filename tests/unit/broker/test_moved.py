"""A producer whose partition's writer failed under it is told to look the partition up again,
never given a final error it would stop on (the partition's managed ledger fenced by a new
owner is a move, not the end of the producer)."""

from __future__ import annotations

from broker.grpc.servicer import _moved, _producer_closed
from magnetar.common.errors import (
    ErrorCode,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ServiceNotReadyError,
    TopicNotOwnedError,
)


def test_a_fenced_or_failed_managed_ledger_reads_as_a_move() -> None:
    for error in (
        ManagedLedgerFencedError("managed ledger t was fenced", context={"name": "t"}),
        ManagedLedgerError("the ledger failed"),
    ):
        moved = _moved(error)
        assert isinstance(moved, TopicNotOwnedError)
        assert moved.retriable
        assert error.message in moved.message
        assert moved.context["cause"] == error.code.name
        closed = _producer_closed(moved).closed.reason
        assert closed.code == ErrorCode.TOPIC_NOT_OWNED.value


def test_a_retriable_reason_is_passed_on_as_it_is() -> None:
    error = ServiceNotReadyError("moving")
    assert _moved(error) is error
