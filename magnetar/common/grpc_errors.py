"""The one bridge between Magnetar errors and gRPC: used by every adapter and by the client.

A unary call fails with a coarse gRPC status (the error class's ``grpc_status``) and carries the
exact error in its trailing metadata under :data:`ERROR_DETAIL_KEY`, a serialized
``magnetar.common.v1.ErrorDetail``. Streams put the same ``ErrorDetail`` in band. The receiver
rebuilds the typed error from the code (:func:`error_from_detail`), never from the message text.

Unlike the rest of :mod:`magnetar.common`, this module imports gRPC and the protocol; the storage
engine and the other gRPC-free layers do not import it.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
import grpc.aio

from magnetar.common.errors import (
    MagnetarError,
    OperationTimeoutError,
    ServiceUnavailableError,
    error_from_code,
)
from proto.common.v1 import errors_pb2

ERROR_DETAIL_KEY = "magnetar-error-bin"
"""Trailing-metadata key of the serialized ErrorDetail (``-bin``: gRPC carries it as bytes)."""


MAX_MESSAGE_CHARS = 1000
"""Characters of an error message that travel; a longer one (one that quoted a huge value a
client sent) is cut, so that the trailers fit gRPC's metadata limit (8 KiB by default) and the
client gets the error rather than RESOURCE_EXHAUSTED."""
MAX_CONTEXT_VALUE_CHARS = 200
"""Characters of each context value that travel, for the same reason."""


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut from {len(text):,} characters)"


def error_to_detail(error: MagnetarError) -> errors_pb2.ErrorDetail:
    return errors_pb2.ErrorDetail(
        code=errors_pb2.ErrorCode.ValueType(int(error.code)),
        message=_bounded(error.message, MAX_MESSAGE_CHARS),
        retriable=error.retriable,
        context={k: _bounded(v, MAX_CONTEXT_VALUE_CHARS) for k, v in error.context.items()},
    )


def error_from_detail(detail: errors_pb2.ErrorDetail) -> MagnetarError:
    return error_from_code(int(detail.code), detail.message, dict(detail.context))


def status_code_of(error: MagnetarError) -> grpc.StatusCode:
    code: grpc.StatusCode = getattr(grpc.StatusCode, error.grpc_status, grpc.StatusCode.INTERNAL)
    return code


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: MagnetarError) -> NoReturn:
    """End a unary call with ``error``: its status, its message, its detail in the trailers.
    It never returns: ``context.abort`` raises, and gRPC answers the call from that."""
    detail = error_to_detail(error)
    await context.abort(
        status_code_of(error),
        detail.message,
        trailing_metadata=((ERROR_DETAIL_KEY, detail.SerializeToString()),),
    )


def error_from_rpc_error(error: grpc.RpcError, peer: str = "") -> MagnetarError:
    """The typed error a failed call carried, or the best description of a transport failure."""
    trailing = error.trailing_metadata() if isinstance(error, grpc.aio.AioRpcError) else None
    for key, value in trailing or ():
        if key == ERROR_DETAIL_KEY and isinstance(value, bytes):
            return error_from_detail(errors_pb2.ErrorDetail.FromString(value))
    code = error.code() if isinstance(error, grpc.aio.AioRpcError) else grpc.StatusCode.UNKNOWN
    details = (error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)) or ""
    where = f" {peer}" if peer else ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServiceUnavailableError(
            f"cannot reach{where}: {details}", context={"peer": peer, "grpc_status": code.name}
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return OperationTimeoutError(
            f"no answer from{where} in time", context={"peer": peer, "grpc_status": code.name}
        )
    return MagnetarError(
        f"call to{where} failed with {code.name}: {details}",
        context={"peer": peer, "grpc_status": code.name},
    )
