"""TLS on the client listener of a real ``magnetar standalone``: trust, host names, rotation.

The standalone's certificate names ``localhost`` only, so connecting by ``127.0.0.1`` is a
host-name mismatch: refused when validation is on, accepted (the chain still verified) when off.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import magnetar.aio
from magnetar.common.errors import InvalidConfigError, TlsError
from magnetar.common.security.tls import ClientTls, ReloadingServerCredentials, open_secure_channel
from magnetar.testing import StandaloneNode
from magnetar.testing.security import CertFiles, TestPki

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]


@dataclass
class TlsStandalone:
    node: StandaloneNode
    pki: TestPki
    cert: CertFiles

    @property
    def port(self) -> int:
        assert self.node.tls_address is not None
        return int(self.node.tls_address.rsplit(":", 1)[1])

    def url(self, host: str = "localhost") -> str:
        return f"magnetar+ssl://{host}:{self.port}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TlsStandalone]:
    root = tmp_path_factory.mktemp("tls")
    pki = TestPki(root / "pki")
    cert = pki.issue("broker-v1", hosts=["localhost"], name="broker")
    node = StandaloneNode(
        root / "data",
        bookies=1,
        env={"MAGNETAR_LOG_LEVEL": "info"},  # the rotation test reads the broker's log
        extra_args=[
            # clients are sent to the advertised host: it must be a name the certificate holds
            "--advertised-host",
            "localhost",
            "--tls-cert-file",
            str(cert.cert_file),
            "--tls-key-file",
            str(cert.key_file),
        ],
    )
    async with node:
        yield TlsStandalone(node, pki, cert)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def round_trip(client: magnetar.aio.Client, payload: bytes = b"over tls") -> bytes:
    topic = unique("tls")
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic)
    await producer.send(payload)
    message = await consumer.receive(timeout_millis=10_000)
    await consumer.acknowledge(message)
    return message.data()


def peer_common_name(port: int, ca_file: Path) -> str:
    """The common name of the certificate the TLS port presents to a new connection."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as wrapped,
    ):
        peer: Any = wrapped.getpeercert()
    subject = {key: value for rdn in peer["subject"] for key, value in rdn}
    return str(subject["commonName"])


async def test_a_client_that_trusts_the_ca_produces_and_consumes(standalone: TlsStandalone) -> None:
    async with magnetar.aio.Client(
        standalone.url(), tls_trust_certs_file_path=str(standalone.pki.ca_file)
    ) as client:
        assert await round_trip(client) == b"over tls"
    # the plaintext listener is still there, next to the TLS one
    async with magnetar.aio.Client(standalone.node.service_url) as client:
        assert await round_trip(client, b"plain") == b"plain"


async def test_a_client_without_the_trust_file_cannot_connect(standalone: TlsStandalone) -> None:
    async with magnetar.aio.Client(standalone.url(), operation_timeout_s=10) as client:
        with pytest.raises(TlsError, match=r"not trusted \(.*\): set tls_trust_certs_file_path"):
            await client.create_producer(unique("t"))
    other = TestPki(standalone.pki.directory.parent / "other-ca")
    async with magnetar.aio.Client(
        standalone.url(), tls_trust_certs_file_path=str(other.ca_file), operation_timeout_s=10
    ) as client:
        with pytest.raises(TlsError, match="not trusted"):
            await client.create_producer(unique("t"))


async def test_the_host_name_is_validated_unless_turned_off(standalone: TlsStandalone) -> None:
    ca = str(standalone.pki.ca_file)
    async with magnetar.aio.Client(
        standalone.url("127.0.0.1"), tls_trust_certs_file_path=ca, operation_timeout_s=10
    ) as client:
        with pytest.raises(TlsError, match=r"does not name the host.*tls_validate_hostname=False"):
            await client.create_producer(unique("t"))
    async with magnetar.aio.Client(
        standalone.url("127.0.0.1"), tls_trust_certs_file_path=ca, tls_validate_hostname=False
    ) as client:
        assert await round_trip(client) == b"over tls"


async def test_tls_to_the_plaintext_port_says_what_is_wrong(standalone: TlsStandalone) -> None:
    plain_port = standalone.node.address.rsplit(":", 1)[1]
    async with magnetar.aio.Client(
        f"magnetar+ssl://localhost:{plain_port}",
        tls_trust_certs_file_path=str(standalone.pki.ca_file),
        operation_timeout_s=10,
    ) as client:
        with pytest.raises(TlsError, match="refused the TLS connection"):
            await client.create_producer(unique("t"))


async def test_a_rotated_certificate_is_used_by_the_next_connection(
    standalone: TlsStandalone,
) -> None:
    ca = standalone.pki.ca_file
    assert peer_common_name(standalone.port, ca) == "broker-v1"
    pid = standalone.node.pid
    async with magnetar.aio.Client(standalone.url(), tls_trust_certs_file_path=str(ca)) as client:
        topic = unique("rotation")
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        await producer.send(b"before")
        # rotate in place: a new certificate (same CA) replaces the files on disk
        standalone.pki.issue("broker-v2", hosts=["localhost"], name="broker")
        await asyncio.sleep(1.2)  # the files are looked at once a second at most
        assert peer_common_name(standalone.port, ca) == "broker-v2"
        # the open connection was not dropped: the same producer and consumer go on
        await producer.send(b"after")
        received = [(await consumer.receive(timeout_millis=10_000)).data() for _ in range(2)]
        assert received == [b"before", b"after"]
    # one producer_opened for the topic in the broker's log: the stream was never reopened
    opened = [
        line
        for line in standalone.node.log_path.read_text().splitlines()
        if "producer_opened" in line and topic in line
    ]
    assert len(opened) == 1, opened
    async with magnetar.aio.Client(standalone.url(), tls_trust_certs_file_path=str(ca)) as client:
        assert await round_trip(client, b"new connection") == b"new connection"
    assert standalone.node.pid == pid  # no restart


async def test_a_half_written_rotation_keeps_the_old_certificate(tmp_path: Path) -> None:
    """A key that does not fit its certificate (written first, mid-rotation) is not taken: the
    listener keeps serving the old pair and takes the new one when the files agree."""
    pki = TestPki(tmp_path / "pki")
    first = pki.issue("v1", name="server")
    credentials = ReloadingServerCredentials(first.cert_file, first.key_file, component="test")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials.credentials)
    await server.start()
    try:
        other = TestPki(tmp_path / "scratch").issue("v2")
        first.key_file.write_bytes(other.key_file.read_bytes())  # the key alone: a mismatch
        await asyncio.sleep(1.1)
        assert peer_common_name(port, pki.ca_file) == "v1"
        assert credentials.reload_failures == 1
        pki.issue("v2", name="server")  # now both files, matching
        await asyncio.sleep(1.1)
        assert peer_common_name(port, pki.ca_file) == "v2"
        assert credentials.reloads == 1
        channel = await open_secure_channel(f"localhost:{port}", ClientTls(pki.ca_file))
        stub: Any = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        await channel.close()
    finally:
        await server.stop(0)


async def test_unusable_tls_files_fail_the_start_naming_the_file(tmp_path: Path) -> None:
    pki = TestPki(tmp_path)
    good = pki.issue("server")
    stranger = TestPki(tmp_path / "x").issue("other")
    with pytest.raises(InvalidConfigError, match=r"is not the key of the certificate"):
        ReloadingServerCredentials(good.cert_file, stranger.key_file, component="test")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(InvalidConfigError, match=r"empty\.pem is empty"):
        ReloadingServerCredentials(empty, good.key_file, component="test")
    with pytest.raises(InvalidConfigError, match=r"missing\.pem cannot be read"):
        ReloadingServerCredentials(tmp_path / "missing.pem", good.key_file, component="test")
    with pytest.raises(InvalidConfigError, match="holds no PEM certificate"):
        ReloadingServerCredentials(good.key_file, good.key_file, component="test")


async def test_the_plaintext_port_can_be_turned_off(tmp_path: Path) -> None:
    pki = TestPki(tmp_path / "pki")
    cert = pki.issue("broker", hosts=["localhost", "127.0.0.1"])
    node = StandaloneNode(
        tmp_path / "data",
        bookies=1,
        extra_args=[
            "--port",
            "",
            "--tls-cert-file",
            str(cert.cert_file),
            "--tls-key-file",
            str(cert.key_file),
        ],
    )
    async with node:
        assert node.tls_address is not None
        assert node.address == node.tls_address
        async with magnetar.aio.Client(
            node.tls_service_url, tls_trust_certs_file_path=str(pki.ca_file)
        ) as client:
            assert await round_trip(client, b"tls only") == b"tls only"
            admin = client.admin()
            brokers = await admin.list_brokers()
            await admin.close()
        assert brokers[0]["service_url"] == ""
        assert brokers[0]["service_url_tls"] == node.tls_service_url
