"""Requests that do not decode: the field is named, the call refused, one line logged."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import grpc
import pytest
import structlog
from structlog.testing import capture_logs

from magnetar.common.errors import ErrorCode, InvalidArgumentError
from magnetar.common.grpc_decoding import (
    RateLimitedLog,
    RequestDecoding,
    Undecodable,
    invalid_utf8_field,
    lenient_deserializer,
)
from magnetar.common.grpc_errors import ERROR_DETAIL_KEY
from proto.broker.v1 import broker_pb2 as pb
from proto.common.v1 import errors_pb2

SERVICE = pb.DESCRIPTOR.services_by_name["BrokerService"]


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """structlog's ``capture_logs``, leaving structlog unconfigured afterwards if it was: the
    client library's loggers go to the standard library (and pytest's caplog) only then."""
    configured = structlog.is_configured()
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        if not configured:
            structlog.reset_defaults()


def spoiled(message: Any, good: bytes) -> bytes:
    """``message`` serialized with the bytes ``good`` (a string's value) made invalid UTF-8."""
    data: bytes = message.SerializeToString()
    assert data.count(good) == 1
    return data.replace(good, b"\xff" * len(good))


def test_the_first_invalid_string_field_is_named() -> None:
    request = pb.ProduceRequest(open=pb.ProducerOpen(topic="orders", properties={"key": "v"}))
    data = spoiled(request, b"orders")
    assert invalid_utf8_field(pb.ProduceRequest.DESCRIPTOR, data) == "open.topic"
    data = spoiled(request, b"key")
    assert invalid_utf8_field(pb.ProduceRequest.DESCRIPTOR, data) == "open.properties.key"
    subscribe = pb.ConsumeRequest(subscribe=pb.Subscribe(topic="t", consumer_name="someone"))
    data = spoiled(subscribe, b"someone")
    assert invalid_utf8_field(pb.ConsumeRequest.DESCRIPTOR, data) == "subscribe.consumer_name"
    assert invalid_utf8_field(pb.ProduceRequest.DESCRIPTOR, b"\xff\xff\xff") is None


def test_the_lenient_deserializer_refuses_instead_of_raising() -> None:
    deserialize = lenient_deserializer(pb.LookupRequest)
    good = pb.LookupRequest(topic="orders")
    assert deserialize(good.SerializeToString()) == good
    refused = deserialize(spoiled(good, b"orders"))
    assert isinstance(refused, Undecodable)
    assert refused.error.context["field"] == "topic"
    assert "field topic of the magnetar.broker.v1.LookupRequest is not valid UTF-8" in str(
        refused.error
    )
    noise = deserialize(b"\xff\xff\xff")
    assert isinstance(noise, Undecodable)
    assert "3 bytes do not decode" in str(noise.error)


def test_lines_are_rate_limited_per_kind_and_count_what_was_left_out() -> None:
    now = [100.0]
    limiter = RateLimitedLog(10.0, clock=lambda: now[0])
    assert limiter.admit("a") == 0
    assert limiter.admit("a") is None
    assert limiter.admit("a") is None
    assert limiter.admit("b") == 0
    now[0] += 10.0
    assert limiter.admit("a") == 2
    assert limiter.admit("a") is None


class AbortedError(Exception):
    pass


class FakeContext:
    """Just what the interceptor's handlers use of a servicer context."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]] | None = None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[Any, ...] = ()
    ) -> None:
        self.aborted = (code, details, trailing_metadata)
        raise AbortedError


class Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


async def test_a_unary_call_that_does_not_decode_fails_with_invalid_argument() -> None:
    async def lookup(request: pb.LookupRequest, context: object) -> pb.LookupResponse:
        return pb.LookupResponse(topic=request.topic)

    original = grpc.unary_unary_rpc_method_handler(
        lookup,
        request_deserializer=pb.LookupRequest.FromString,
        response_serializer=pb.LookupResponse.SerializeToString,
    )

    async def continuation(details: grpc.HandlerCallDetails) -> Any:
        return original

    decoding = RequestDecoding([SERVICE])
    handler: Any = await decoding.intercept_service(
        continuation, Details("/magnetar.broker.v1.BrokerService/Lookup")
    )
    assert handler is not None
    good = handler.request_deserializer(pb.LookupRequest(topic="t").SerializeToString())
    assert (await handler.unary_unary(good, FakeContext())).topic == "t"
    bad = handler.request_deserializer(spoiled(pb.LookupRequest(topic="orders"), b"orders"))
    context = FakeContext()
    with captured_logs() as logs, pytest.raises(AbortedError):
        await handler.unary_unary(bad, context)
    assert context.aborted is not None
    code, details, trailers = context.aborted
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "field topic" in details
    detail = errors_pb2.ErrorDetail.FromString(dict(trailers)[ERROR_DETAIL_KEY])
    assert ErrorCode(detail.code) == ErrorCode.INVALID_ARGUMENT
    assert [entry["event"] for entry in logs] == ["request_undecodable"]
    assert "exc_info" not in logs[0]
    # another service's methods pass through untouched
    other = await decoding.intercept_service(continuation, Details("/grpc.health.v1.Health/Check"))
    assert other is original


async def test_a_stream_request_that_does_not_decode_raises_its_error_in_the_handler() -> None:
    seen: list[object] = []

    async def produce(requests: AsyncIterator[object], context: object) -> AsyncIterator[str]:
        try:
            async for request in requests:
                seen.append(request)  # noqa: PERF401 - what came before the bad one counts
        except InvalidArgumentError as e:
            yield f"closed: {e.context['field']}"

    original: Any = grpc.stream_stream_rpc_method_handler(
        produce, request_deserializer=pb.ProduceRequest.FromString
    )

    async def continuation(details: grpc.HandlerCallDetails) -> Any:
        return original

    decoding = RequestDecoding([SERVICE])
    handler: Any = await decoding.intercept_service(
        continuation, Details("/magnetar.broker.v1.BrokerService/Produce")
    )
    assert handler is not None
    good = pb.ProduceRequest(open=pb.ProducerOpen(topic="t"))
    bad = spoiled(pb.ProduceRequest(open=pb.ProducerOpen(topic="orders")), b"orders")

    async def requests() -> AsyncIterator[object]:
        yield handler.request_deserializer(good.SerializeToString())
        yield handler.request_deserializer(bad)
        yield handler.request_deserializer(good.SerializeToString())

    with captured_logs() as logs:
        responses = [r async for r in handler.stream_stream(requests(), FakeContext())]
    assert responses == ["closed: open.topic"]
    assert seen == [good]
    assert [entry["event"] for entry in logs] == ["request_undecodable"]
