"""gRPC server reflection on real brokers and bookies, as grpcurl, Postman or evans use it: the
services listed, their descriptors served without the .proto files, and over TLS with
authentication on, reflection open to a client without a token while the services stay closed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from magnetar.aio.admin import AdminClient
from magnetar.testing import StandaloneNode
from magnetar.testing.security import TestPki, TestTokens
from proto.broker.v1 import broker_pb2, broker_pb2_grpc

HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"

on_node = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("reflection") / "data", bookies=1) as node:
        yield node


async def reflect(
    channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
    responses: list[reflection_pb2.ServerReflectionResponse] = [
        r async for r in stub.ServerReflectionInfo(iter([request]))
    ]
    assert len(responses) == 1
    assert not responses[0].HasField("error_response"), responses[0].error_response
    return responses[0]


async def services(channel: grpc.aio.Channel) -> set[str]:
    response = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    return {s.name for s in response.list_services_response.service}


async def methods(channel: grpc.aio.Channel, service: str) -> dict[str, tuple[bool, bool]]:
    """The methods of ``service`` as its served descriptor says: name -> (client streaming,
    server streaming)."""
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)
    response = await reflect(channel, request)
    package, _, name = service.rpartition(".")
    for serialized in response.file_descriptor_response.file_descriptor_proto:
        file = descriptor_pb2.FileDescriptorProto.FromString(serialized)
        for described in file.service:
            if file.package == package and described.name == name:
                return {m.name: (m.client_streaming, m.server_streaming) for m in described.method}
    pytest.fail(f"no descriptor of {service} in the reflection answer")


@on_node
async def test_a_broker_lists_and_describes_its_services(standalone: StandaloneNode) -> None:
    async with grpc.aio.insecure_channel(standalone.address) as channel:
        assert await services(channel) == {
            "magnetar.broker.v1.BrokerService",
            "magnetar.admin.v1.AdminService",
            HEALTH,
            REFLECTION,
        }
        broker = await methods(channel, "magnetar.broker.v1.BrokerService")
        assert broker == {
            "Lookup": (False, False),
            "Produce": (True, True),
            "Consume": (True, True),
        }
        assert "UnloadTopic" in await methods(channel, "magnetar.admin.v1.AdminService")


@on_node
async def test_a_bookie_lists_and_describes_its_services(standalone: StandaloneNode) -> None:
    async with AdminClient(standalone.service_url, operation_timeout_s=10) as admin:
        (bookie,) = await admin.list_bookies()
    async with grpc.aio.insecure_channel(bookie["address"]) as channel:
        assert await services(channel) == {"magnetar.bookie.v1.BookieService", HEALTH, REFLECTION}
        bookie_methods = await methods(channel, "magnetar.bookie.v1.BookieService")
        assert bookie_methods["AddEntries"] == (True, True)
        assert bookie_methods["ReadEntries"] == (False, False)


async def test_reflection_needs_no_token_and_opens_nothing_else(tmp_path: Path) -> None:
    # reflection tells what the published .proto files say; the services still ask for a token
    pki = TestPki(tmp_path / "pki")
    broker = pki.issue("broker")
    tokens = TestTokens(tmp_path / "tokens")
    args = [
        *("--tls-cert-file", str(broker.cert_file), "--tls-key-file", str(broker.key_file)),
        *("--authentication-enabled", "true", *tokens.broker_args),
    ]
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        assert node.tls_address is not None
        credentials = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
        async with grpc.aio.secure_channel(node.tls_address, credentials) as channel:
            assert "magnetar.broker.v1.BrokerService" in await services(channel)
            stub = broker_pb2_grpc.BrokerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Lookup(broker_pb2.LookupRequest(topic="secret"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
