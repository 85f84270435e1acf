"""Requests that do not decode: refused with INVALID_ARGUMENT naming the field, logged in one line.

gRPC Python decodes a request before the handler runs, with the deserializer the generated code
registers (``Message.FromString``). When that raises, as protobuf does for invalid UTF-8 in a
proto3 ``string`` field or for bytes that are not the message at all, gRPC logs a traceback and
ends the call with status UNKNOWN, naming nothing; a stream ends with it. A hostile or buggy
client could fill the log with one traceback per request.

:class:`RequestDecoding` is a server interceptor that swaps in a deserializer that never raises:
a request that does not decode becomes an :class:`Undecodable` holding an
:class:`InvalidArgumentError` that names the first ``string`` field with invalid UTF-8 (found by
walking the wire format against the message's descriptor), or says the bytes are not the message.
A unary call fails with that error (status INVALID_ARGUMENT, the error's detail in the
trailers). On a stream, reading that request raises the error, which the stream reports in band
(a ``closed`` message with the error, then status OK), as it does any refused request. Each is
logged as one ``request_undecodable`` line, at most one per method every
:data:`LOG_INTERVAL_S`, the next line counting those left out.

Given a :class:`~magnetar.common.peer_limits.ConnectionsPerIp`, the same wrappers count every call
by its client's address and refuse one that would open a connection too many from that address
(logged as ``connection_refused_per_ip``, rate-limited the same way).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import structlog
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from magnetar.common.errors import InvalidArgumentError, ServiceUnavailableError
from magnetar.common.grpc_errors import abort_with
from magnetar.common.peer_limits import ConnectionsPerIp

LOGGER_NAME = "magnetar.grpc"
LOG_INTERVAL_S = 10.0
"""At most one ``request_undecodable`` line per method in this many seconds."""
MAX_NESTING = 32
"""How deep the UTF-8 search follows nested messages (protobuf's own limit is 100)."""

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the deserializer gives for a request that does not decode."""

    error: InvalidArgumentError


class _Malformed(Exception):  # noqa: N818 - internal control flow, never escapes
    """The bytes are not valid wire format: no field can be named."""


def invalid_utf8_field(descriptor: Descriptor, data: bytes) -> str | None:
    """The dotted path of the first ``string`` field of ``data`` (a serialized
    ``descriptor`` message) whose bytes are not UTF-8 (``open.properties.key``); None when
    there is none or the bytes are not valid wire format."""
    try:
        return _walk(descriptor, memoryview(data), "", 0)
    except _Malformed:
        return None


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _walk(descriptor: Descriptor, data: memoryview, path: str, depth: int) -> str | None:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            end = pos + length
            if end > len(data):
                raise _Malformed
            field = descriptor.fields_by_number.get(number)
            if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                try:
                    str(data[pos:end], "utf-8")
                except UnicodeDecodeError:
                    return path + field.name
            elif (
                field is not None
                and field.message_type is not None
                and field.type == FieldDescriptor.TYPE_MESSAGE
                and depth < MAX_NESTING
            ):
                found = _walk(field.message_type, data[pos:end], f"{path}{field.name}.", depth + 1)
                if found is not None:
                    return found
            pos = end
        else:  # groups (3, 4) are not used by these protocols; 6 and 7 do not exist
            raise _Malformed
    return None


def undecodable(descriptor: Descriptor, data: bytes) -> Undecodable:
    """The refusal of ``data``, which did not decode as a ``descriptor`` message."""
    message = descriptor.full_name
    field = invalid_utf8_field(descriptor, data)
    if field is not None:
        return Undecodable(
            InvalidArgumentError(
                f"field {field} of the {message} is not valid UTF-8 (proto3 string fields must be)",
                context={"field": field, "message": message},
            )
        )
    return Undecodable(
        InvalidArgumentError(
            f"the request is not a valid {message}: its {len(data):,} bytes do not decode",
            context={"message": message},
        )
    )


def lenient_deserializer(message_class: type[Message]) -> Callable[[bytes], object]:
    """``message_class.FromString`` that gives an :class:`Undecodable` instead of raising."""
    parse = message_class.FromString
    descriptor: Descriptor = message_class.DESCRIPTOR  # type: ignore[assignment]  # upb's is one

    def deserialize(data: bytes) -> object:
        try:
            return parse(data)
        except DecodeError:
            return undecodable(descriptor, data)

    return deserialize


async def _result(answer: object) -> object:
    """A unary handler's answer: awaited when it is a coroutine's (the generated servicer base
    answers UNIMPLEMENTED from a plain method)."""
    return await answer if inspect.isawaitable(answer) else answer


class RateLimitedLog:
    """At most one line per kind every ``interval_s``; the next counts those left out."""

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}
        """kind -> (when its last line was written, lines left out since)."""

    def admit(self, kind: str) -> int | None:
        """Whether to write a line of ``kind`` now: None (leave it out), or how many were left
        out since the last one."""
        now = self._clock()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self._interval_s:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        self._kinds[kind] = (now, 0)
        return 0 if last is None else last[1]


class RequestDecoding(grpc.aio.ServerInterceptor):
    """Decodes the requests of ``services`` leniently (see the module doc)."""

    def __init__(
        self,
        services: Iterable[ServiceDescriptor],
        *,
        limiter: RateLimitedLog | None = None,
        per_ip: ConnectionsPerIp | None = None,
    ) -> None:
        self.per_ip = per_ip
        self._inputs: dict[str, type[Message]] = {
            f"/{service.full_name}/{method.name}": GetMessageClass(method.input_type)
            for service in services
            for method in service.methods
        }
        self._limiter = limiter or RateLimitedLog()
        self._handlers: dict[
            str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]
        ] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        message_class = self._inputs.get(method)
        if handler is None or message_class is None:
            return handler
        cached = self._handlers.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler, lenient_deserializer(message_class))
        self._handlers[method] = (handler, wrapped)
        return wrapped

    def refused(self, method: str, request: Undecodable, context: Context) -> None:
        """Log one line for a request that did not decode (rate-limited, no traceback)."""
        left_out = self._limiter.admit(method)
        if left_out is not None:
            # a logger got here, not at import: rare lines, and never one structlog cached
            # under an earlier configuration
            structlog.get_logger(LOGGER_NAME).warning(
                "request_undecodable",
                method=method,
                peer=context.peer(),
                error=request.error.message,
                left_out=left_out,
            )

    async def _admit(self, context: Context) -> str | None:
        """Count the call against its address's connections; refuse it past the bound. The peer
        it was counted under (None: not counted), for :meth:`_release`: read here, while the
        call is surely alive, since ``context.peer()`` on a call that has ended dereferences a
        freed call in gRPC's C core and crashes the process."""
        if self.per_ip is None:
            return None
        peer = context.peer()
        try:
            return peer if self.per_ip.admit(peer) else None
        except ServiceUnavailableError as e:
            left_out = self._limiter.admit("connection_refused_per_ip")
            if left_out is not None:
                structlog.get_logger(LOGGER_NAME).warning(
                    "connection_refused_per_ip",
                    address=e.context.get("address"),
                    limit=self.per_ip.limit,
                    left_out=left_out,
                )
            await abort_with(context, e)

    def _release(self, counted: str | None) -> None:
        if counted is not None and self.per_ip is not None:
            self.per_ip.release(counted)

    def _wrap(
        self,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        deserialize: Callable[[bytes], object],
    ) -> grpc.RpcMethodHandler[Any, Any]:
        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            unary_unary: Any = handler.unary_unary

            async def checked_unary_unary(request: object, context: Context) -> object:
                if isinstance(request, Undecodable):
                    self.refused(method, request, context)
                    await abort_with(context, request.error)
                counted = await self._admit(context)
                try:
                    return await _result(unary_unary(request, context))
                finally:
                    self._release(counted)

            return grpc.unary_unary_rpc_method_handler(
                checked_unary_unary, request_deserializer=deserialize, response_serializer=serialize
            )
        if handler.unary_stream is not None:
            unary_stream: Any = handler.unary_stream

            async def checked_unary_stream(
                request: object, context: Context
            ) -> AsyncIterator[object]:
                if isinstance(request, Undecodable):
                    self.refused(method, request, context)
                    await abort_with(context, request.error)
                counted = await self._admit(context)
                try:
                    async with contextlib.aclosing(unary_stream(request, context)) as responses:
                        async for response in responses:
                            yield response
                finally:
                    self._release(counted)

            return grpc.unary_stream_rpc_method_handler(
                checked_unary_stream,
                request_deserializer=deserialize,
                response_serializer=serialize,
            )
        if handler.stream_unary is not None:
            stream_unary: Any = handler.stream_unary

            async def checked_stream_unary(
                requests: AsyncIterator[object], context: Context
            ) -> object:
                counted = await self._admit(context)
                try:
                    return await _result(
                        stream_unary(self._checked(method, requests, context), context)
                    )
                finally:
                    self._release(counted)

            return grpc.stream_unary_rpc_method_handler(
                checked_stream_unary,
                request_deserializer=deserialize,
                response_serializer=serialize,
            )
        stream_stream: Any = handler.stream_stream

        async def checked_stream_stream(
            requests: AsyncIterator[object], context: Context
        ) -> AsyncIterator[object]:
            counted = await self._admit(context)
            try:
                responses = stream_stream(self._checked(method, requests, context), context)
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        yield response
            finally:
                self._release(counted)

        return grpc.stream_stream_rpc_method_handler(
            checked_stream_stream, request_deserializer=deserialize, response_serializer=serialize
        )

    async def _checked(
        self, method: str, requests: AsyncIterator[object], context: Context
    ) -> AsyncIterator[object]:
        """The stream's requests; one that did not decode raises its error (the stream's
        handler reports it in band and ends the stream)."""
        async for request in requests:
            if isinstance(request, Undecodable):
                self.refused(method, request, context)
                raise request.error
            yield request
