"""Errors on the wire stay small enough to arrive, whatever value they quote."""

from __future__ import annotations

from magnetar.common.errors import SubscriptionNotFoundError
from magnetar.common.grpc_errors import error_from_detail, error_to_detail


def test_an_error_quoting_a_huge_value_is_cut_to_fit_the_trailers() -> None:
    name = "s" * 10_000
    error = SubscriptionNotFoundError(f"no subscription {name!r}", context={"subscription": name})
    detail = error_to_detail(error)
    assert len(detail.SerializeToString()) < 2000  # gRPC's metadata limit is 8 KiB
    again = error_from_detail(detail)
    assert isinstance(again, SubscriptionNotFoundError)
    assert again.message.startswith("no subscription 'sss")
    assert "cut from 10,018 characters" in again.message
    assert "cut from 10,000 characters" in again.context["subscription"]
    short = SubscriptionNotFoundError("no subscription 'a'", context={"subscription": "a"})
    assert error_from_detail(error_to_detail(short)).message == "no subscription 'a'"
