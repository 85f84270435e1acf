"""TLS on the Pulsar listener (``pulsar+ssl://``), against a standalone with real certificates
from a CA of the test's own: the real ``pulsar-client`` produces and consumes over it; a client
that does not trust the broker's CA, or validates a host name the certificate does not hold,
cannot connect; a certificate rotated on disk is served to the next connection while open ones
go on; ``AuthenticationTLS`` acts as the certificate's common name, and authorization applies to
that role."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import pulsar  # the real pulsar-client from PyPI (its C++ core)

from magnetar.testing import StandaloneNode
from magnetar.testing.security import CertFiles, TestPki
from proto.pulsar import PulsarApi_pb2 as api
from tests.interop.pulsar_raw import RawConnection

TOPIC = "persistent://public/default/over-tls"


def _client(
    url: str, trust: Path | None, *, timeout_s: int = 5, **options: object
) -> pulsar.Client:
    return pulsar.Client(
        url,
        tls_trust_certs_file_path=None if trust is None else str(trust),
        operation_timeout_seconds=timeout_s,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        **options,
    )


def _round_trip(client: pulsar.Client, payload: bytes, subscription: str = "sub") -> bytes:
    """Produce ``payload`` and consume it back (from the earliest message not yet acked)."""
    try:
        consumer = client.subscribe(
            TOPIC, subscription, initial_position=pulsar.InitialPosition.Earliest
        )
        producer = client.create_producer(TOPIC)
        producer.send(payload)
        message = consumer.receive(10_000)
        consumer.acknowledge(message)
        return bytes(message.data())
    finally:
        client.close()


def _refused(client: pulsar.Client) -> BaseException | None:
    """What creating a producer raised (None: it worked)."""
    try:
        client.create_producer(TOPIC)
    except Exception as e:  # the client's refusal, as its exception
        return e
    finally:
        client.close()
    return None


def _served_certificate(address: str) -> bytes:
    """The DER certificate the listener presents to a new connection (not verified here)."""
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host, int(port)), timeout=10) as sock,
        context.wrap_socket(sock) as tls,
    ):
        served = tls.getpeercert(binary_form=True)
    assert served is not None
    return served


async def test_pulsar_clients_over_tls_trust_validate_and_follow_a_rotation(
    tmp_path: Path,
) -> None:
    pki = TestPki(tmp_path / "pki")
    other = TestPki(tmp_path / "other", name="Another CA")
    # valid for 127.0.0.1 only: "localhost" is a name the certificate does not hold
    server = pki.issue("broker", hosts=["127.0.0.1"])
    args = ["--tls-cert-file", str(server.cert_file), "--tls-key-file", str(server.key_file)]
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        url = node.pulsar_ssl_url
        assert url.startswith("pulsar+ssl://127.0.0.1:")
        assert node.pulsar_url.startswith("pulsar://")  # the plaintext listener stays too

        trusted = _client(url, pki.ca_file, tls_validate_hostname=True)
        assert await asyncio.to_thread(_round_trip, trusted, b"over tls") == b"over tls"

        # no trust file (the system's CAs), another CA, a name the certificate does not hold
        for client in (
            _client(url, None),
            _client(url, other.ca_file),
            _client(url.replace("127.0.0.1", "localhost"), pki.ca_file, tls_validate_hostname=True),
        ):
            assert isinstance(await asyncio.to_thread(_refused, client), pulsar.PulsarException)
        # the same name, not validated: the chain alone is checked
        lenient = _client(url.replace("127.0.0.1", "localhost"), pki.ca_file)
        assert await asyncio.to_thread(_round_trip, lenient, b"lenient") == b"lenient"

        # a connection open before the rotation, and a producer on it
        before = _client(url, pki.ca_file)
        producer = await asyncio.to_thread(before.create_producer, TOPIC)
        rotated = other.issue("broker", hosts=["127.0.0.1"])
        # replaced in place, key first (the listener keeps the old pair until both agree)
        server.key_file.write_bytes(rotated.key_file.read_bytes())
        server.cert_file.write_bytes(rotated.cert_file.read_bytes())
        new_der = ssl.PEM_cert_to_DER_cert(_first_pem(rotated.cert_file))
        assert node.pulsar_tls_address is not None
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(_served_certificate, node.pulsar_tls_address) != new_der:
            assert time.monotonic() < deadline, "the rotated certificate was never served"
            await asyncio.sleep(0.2)
        # new connections: the new CA's certificate, so only its clients connect now
        assert isinstance(
            await asyncio.to_thread(_refused, _client(url, pki.ca_file)), pulsar.PulsarException
        )
        renewed = _client(url, other.ca_file, tls_validate_hostname=True)
        assert await asyncio.to_thread(_round_trip, renewed, b"rotated") == b"rotated"
        # the connection made before goes on
        await asyncio.to_thread(producer.send, b"still open")
        await asyncio.to_thread(before.close)
        log = node.log_path.read_text(errors="replace")
    assert "pulsar_connection_failed" not in log


def _first_pem(path: Path) -> str:
    text = path.read_text()
    end = "-----END CERTIFICATE-----"
    return text[: text.index(end) + len(end)] + "\n"


async def test_tls_client_certificates_authenticate_as_their_common_name(tmp_path: Path) -> None:
    pki = TestPki(tmp_path / "pki")
    server = pki.issue("broker")
    admin, alice = pki.issue("admin"), pki.issue("alice")
    mallory = TestPki(tmp_path / "other", name="Another CA").issue("admin", name="mallory")
    args = [
        *("--tls-cert-file", str(server.cert_file), "--tls-key-file", str(server.key_file)),
        *("--tls-trust-certs-file", str(pki.ca_file)),
        *("--authentication-enabled", "true", "--authentication-providers", "tls"),
        *("--authorization-enabled", "true", "--superuser-roles", "admin"),
    ]
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        url = node.pulsar_ssl_url

        def as_certificate(cert: CertFiles, timeout_s: int = 5) -> pulsar.Client:
            return _client(
                url,
                pki.ca_file,
                timeout_s=timeout_s,
                tls_validate_hostname=True,
                authentication=pulsar.AuthenticationTLS(str(cert.cert_file), str(cert.key_file)),
            )

        # CN=admin is a superuser; CN=alice has no grant on public/default
        assert await asyncio.to_thread(_round_trip, as_certificate(admin), b"mine") == b"mine"
        refused = await asyncio.to_thread(_refused, as_certificate(alice))
        assert isinstance(refused, pulsar.exceptions.AuthorizationError), repr(refused)
        # no client certificate, or one of another CA (CN=admin too): no TLS session at all
        # (the client retries until its operation timeout, as against Pulsar)
        for client in (_client(url, pki.ca_file, timeout_s=2), as_certificate(mallory, 2)):
            assert isinstance(await asyncio.to_thread(_refused, client), pulsar.PulsarException)

        # spoken by hand: method tls over a verified certificate is CONNECTED as its CN, and a
        # lookup answers both URLs of the owner (this standalone)
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.load_cert_chain(str(alice.cert_file), str(alice.key_file))
        connect = api.CommandConnect(
            client_version="raw", protocol_version=19, auth_method_name="tls"
        )
        assert node.pulsar_tls_address is not None
        async with RawConnection.open(node.pulsar_tls_address, connect=False, tls=context) as raw:
            raw.send("CONNECT", connect=connect)
            await raw.expect("CONNECTED")
            raw.send(
                "LOOKUP",
                lookupTopic=api.CommandLookupTopic(topic="public/default/alices", request_id=1),
            )
            answer = (await raw.expect("LOOKUP_RESPONSE")).command.lookupTopicResponse
            # alice may not look it up: authorization applies to the certificate's role
            assert answer.response == answer.Failed
            assert answer.error == api.AuthorizationError
            assert "alice" in answer.message
        # naming no method: the verified certificate's common name too, as on the gRPC ports
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.load_cert_chain(str(admin.cert_file), str(admin.key_file))
        async with RawConnection.open(node.pulsar_tls_address, connect=False, tls=context) as raw:
            raw.send(
                "CONNECT", connect=api.CommandConnect(client_version="raw", protocol_version=19)
            )
            await raw.expect("CONNECTED")
            raw.send("LOOKUP", lookupTopic=api.CommandLookupTopic(topic=TOPIC, request_id=1))
            answer = (await raw.expect("LOOKUP_RESPONSE")).command.lookupTopicResponse
            assert answer.response == answer.Connect, answer
            assert answer.brokerServiceUrlTls == url
            assert answer.brokerServiceUrl == node.pulsar_url

        # method tls on the plaintext listener: no certificate to take a role from, refused
        # as a bad token is (ERROR, then the connection closes)
        # and methods this broker does not take: named, with the ones it does
        assert node.pulsar_address is not None
        token = api.CommandConnect(
            client_version="raw", protocol_version=19, auth_method_name="token", auth_data=b"x"
        )
        athenz = api.CommandConnect(
            client_version="raw", protocol_version=19, auth_method_name="athenz"
        )
        for refused_connect, reason in (
            (connect, "client certificate"),
            (token, "'token' is not enabled"),
            (athenz, "'athenz' is not accepted"),
        ):
            async with RawConnection.open(node.pulsar_address, connect=False) as raw:
                raw.send("CONNECT", connect=refused_connect)
                error = (await raw.expect("ERROR")).command.error
                assert error.error == api.AuthenticationError
                assert reason in error.message
                assert await raw.closed_by_broker()
        log = node.log_path.read_text(errors="replace")
    assert "pulsar_connection_failed" not in log
