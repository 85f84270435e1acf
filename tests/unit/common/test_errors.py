"""The error tree and its wire form."""

from __future__ import annotations

import inspect

import grpc
import grpc.aio
import pytest

from magnetar.common import errors
from magnetar.common.errors import (
    BadVersionError,
    ErrorCode,
    LedgerFencedError,
    MagnetarError,
    MetadataError,
    StorageError,
    error_class_for,
    error_from_code,
)
from magnetar.common.grpc_errors import (
    abort_with,
    error_from_detail,
    error_from_rpc_error,
    error_to_detail,
)
from proto.common.v1 import errors_pb2

ALL_ERRORS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, MagnetarError) and cls is not MagnetarError
]

LAYER_BASES = {
    100: errors.MetadataError,
    200: errors.StorageError,
    300: errors.LedgerError,
    400: errors.ManagedLedgerError,
    500: errors.BrokerError,
    600: errors.ClientError,
}


def test_python_and_proto_error_codes_are_the_same_enum() -> None:
    proto = {
        name.removeprefix("ERROR_CODE_"): number for name, number in errors_pb2.ErrorCode.items()
    }
    ours = {code.name: code.value for code in ErrorCode}
    assert ours == proto


def test_every_code_but_unspecified_has_exactly_one_class() -> None:
    owners: dict[int, list[str]] = {}
    for cls in ALL_ERRORS:
        if "code" in cls.__dict__:
            owners.setdefault(int(cls.code), []).append(cls.__name__)
    for code in ErrorCode:
        if code is ErrorCode.UNSPECIFIED:
            continue
        assert len(owners.get(code.value, [])) == 1, (code, owners.get(code.value))


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_sits_under_its_layer_and_names_a_real_status(cls) -> None:
    layer = (int(cls.code) // 100) * 100
    if layer in LAYER_BASES:
        assert issubclass(cls, LAYER_BASES[layer])
    assert isinstance(getattr(grpc.StatusCode, cls.grpc_status), grpc.StatusCode)
    assert cls.__doc__, f"{cls.__name__} needs a docstring saying when it happens"


def test_errors_are_rebuilt_from_their_code_not_their_text() -> None:
    error = error_from_code(ErrorCode.LEDGER_FENCED, "says anything", {"ledger": 7})
    assert type(error) is LedgerFencedError
    assert error.context == {"ledger": "7"}
    assert isinstance(error, StorageError)
    assert not error.retriable


def test_unknown_codes_fall_back_to_their_layer_base() -> None:
    assert error_class_for(199) is MetadataError
    assert error_class_for(250) is StorageError
    assert error_class_for(77) is MagnetarError
    assert error_class_for(100_000) is MagnetarError


def test_detail_round_trip() -> None:
    original = BadVersionError("changed", context={"key": "/a", "expected_version": 3})
    detail = errors_pb2.ErrorDetail.FromString(error_to_detail(original).SerializeToString())
    assert detail.code == errors_pb2.ERROR_CODE_METADATA_BAD_VERSION
    rebuilt = error_from_detail(detail)
    assert type(rebuilt) is BadVersionError
    assert (rebuilt.message, rebuilt.context) == (original.message, original.context)


async def test_typed_error_crosses_a_real_grpc_call() -> None:
    async def fail(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await abort_with(context, LedgerFencedError("ledger 7 is fenced", context={"ledger": 7}))
        raise AssertionError("abort returns only by raising")

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Fail": grpc.unary_unary_rpc_method_handler(fail)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/test.Echo/Fail"
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(b"")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        error = error_from_rpc_error(info.value, f"127.0.0.1:{port}")
        assert type(error) is LedgerFencedError
        assert error.context == {"ledger": "7"}
    finally:
        await server.stop(None)


async def test_transport_failures_become_unavailable() -> None:
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/test.Echo/Nothing"
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"", timeout=2)
    error = error_from_rpc_error(info.value, "127.0.0.1:1")
    assert isinstance(error, errors.ServiceUnavailableError | errors.OperationTimeoutError)
    assert error.retriable
    assert "127.0.0.1:1" in error.message


def test_the_errors_after_which_a_producer_looks_its_partition_up_again() -> None:
    """The partition is not owned here, is moving, its broker stops, or its managed ledger
    failed (any error of that subtree); nothing else sends a producer to look up again."""
    flagged = {cls.__name__ for cls in errors.MagnetarError.__subclasses__() if cls.look_up_again}
    assert flagged == {"ShuttingDownError", "ManagedLedgerError"}
    every = {errors.error_class_for(code) for code in errors.ErrorCode}
    moved = {cls for cls in every if cls.look_up_again}
    assert moved == {
        cls
        for cls in every
        if issubclass(
            cls,
            errors.TopicNotOwnedError
            | errors.ServiceNotReadyError
            | errors.ShuttingDownError
            | errors.ManagedLedgerError,
        )
    }
    assert errors.TopicNotOwnedError.look_up_again
    assert errors.ServiceNotReadyError.look_up_again
    assert not errors.BrokerError.look_up_again
    assert not errors.TopicNotFoundError.look_up_again
