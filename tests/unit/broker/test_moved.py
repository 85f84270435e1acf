"""A producer whose partition's writer failed under it is told to look the partition up again,
never given a final error it would stop on (the partition's managed ledger fenced by a new
owner is a move, not the end of the producer)."""

from __future__ import annotations

from broker.grpc.servicer import _moved, _not_now, _producer_closed
from magnetar.common.errors import (
    AuthorizationError,
    ErrorCode,
    InvalidTopicNameError,
    LeaseNotFoundError,
    LedgerFencedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
    MetadataError,
    ServiceNotReadyError,
    SessionLostError,
    TopicNotFoundError,
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


def test_a_failure_of_the_broker_at_open_is_retriable_and_a_refusal_stays_final() -> None:
    for error in (
        MetadataError("etcd failed range: UNKNOWN: Stream removed"),
        LeaseNotFoundError("etcd: the lease is not known (expired or revoked)"),
        SessionLostError("the session was lost"),
        LedgerFencedError("fenced"),
        ManagedLedgerFencedError("opened by another owner at the same time"),
    ):
        answer = _not_now(error, "broker-1")
        assert isinstance(answer, ServiceNotReadyError), error
        assert answer.retriable
        assert error.message in answer.message
        assert answer.context["cause"] == error.code.name
    for final in (
        TopicNotFoundError("no such topic"),
        InvalidTopicNameError("bad"),
        AuthorizationError("denied"),
        ManagedLedgerTerminatedError("terminated"),
    ):
        assert _not_now(final, "broker-1") is final
