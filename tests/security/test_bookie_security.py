"""Bookies accept only bookie clients: mutual TLS (or a token), and roles allowed to use them.

Three bookie processes serve mutual TLS and take certificates (role = common name) and tokens;
``broker`` and ``autorecovery`` are their bookie_client_roles. A broker process writes and reads
through them with its certificate. Processes with no certificate, another CA's, or a certificate
of a role that is not a bookie client cannot add, read or fence; the broker never notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

import magnetar.aio
from bookie.client.bookie_client import BookieClient, BookieCredentials
from bookie.entries import AddEntry
from magnetar.common.errors import (
    AuthorizationError,
    BookieUnavailableError,
    MagnetarError,
    NoSuchLedgerError,
)
from magnetar.common.security.tokens import TokenFile
from magnetar.testing import LocalCluster
from magnetar.testing.probes import http_get
from magnetar.testing.security import CertFiles, TestPki, TestTokens

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.etcd, pytest.mark.timeout(150)]


@dataclass
class Bookies:
    cluster: LocalCluster
    pki: TestPki
    tokens: TestTokens

    def client(self, address: str, cert: CertFiles | None, **extra: object) -> BookieClient:
        credentials = BookieCredentials(
            trust_certs_file=self.pki.ca_file,
            cert_file=cert.cert_file if cert else None,
            key_file=cert.key_file if cert else None,
            **extra,  # type: ignore[arg-type]
        )
        return BookieClient(address, timeout_s=5, credentials=credentials)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bookies(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bookies]:
    root = tmp_path_factory.mktemp("bookies")
    pki = TestPki(root / "pki")
    bookie_cert = pki.issue("bookie", hosts=["127.0.0.1", "localhost"])
    broker_cert = pki.issue("broker")
    tokens = TestTokens(root / "tokens")
    bookie_args = [
        *("--tls-cert-file", str(bookie_cert.cert_file)),
        *("--tls-key-file", str(bookie_cert.key_file)),
        *("--tls-trust-certs-file", str(pki.ca_file)),
        *("--authentication-enabled", "true"),
        *("--authentication-providers", "tls,token"),
        *tokens.broker_args,
        *("--bookie-client-roles", "broker,autorecovery"),
        # metrics and health over HTTPS, on the same certificate
        *("--http-tls-cert-file", str(bookie_cert.cert_file)),
        *("--http-tls-key-file", str(bookie_cert.key_file)),
    ]
    broker_args = [
        *("--ledger-tls-trust-certs-file", str(pki.ca_file)),
        *("--ledger-tls-cert-file", str(broker_cert.cert_file)),
        *("--ledger-tls-key-file", str(broker_cert.key_file)),
    ]
    async with LocalCluster(
        root, bookies=3, brokers=1, bookie_args=bookie_args, broker_args=broker_args
    ) as cluster:
        await cluster.wait_brokers_registered()
        yield Bookies(cluster, pki, tokens)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def attempts(client: BookieClient) -> list[MagnetarError]:
    """What each of the bookie calls a stranger might try gives it."""
    errors: list[MagnetarError] = []
    calls = (
        client.add_entries([AddEntry(424242, 0, -1, b"forged", 0)]),
        client.read_entries(1, 0, 10),
        client.fence(1),
        client.delete_ledger(1),
        client.info(),
    )
    for call in calls:
        try:
            await call
        except MagnetarError as e:
            errors.append(e)
    await client.close()
    return errors


async def test_the_broker_writes_and_reads_through_mutual_tls(bookies: Bookies) -> None:
    topic = unique("through-tls")
    async with magnetar.aio.Client(bookies.cluster.service_url) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        for index in range(20):
            await producer.send(str(index).encode())
        got = [int((await consumer.receive(timeout_millis=10_000)).data()) for _ in range(20)]
        assert got == list(range(20))


async def test_strangers_cannot_add_read_or_fence(bookies: Bookies) -> None:
    address = bookies.cluster.bookies[0].data_address
    elsewhere = TestPki(bookies.pki.directory.parent / "elsewhere").issue("broker")
    no_certificate = await attempts(bookies.client(address, None))
    other_ca = await attempts(bookies.client(address, elsewhere))
    for errors in (no_certificate, other_ca):
        assert len(errors) == 5, "every call failed"
        assert all(isinstance(e, BookieUnavailableError) for e in errors), errors
    # a certificate of this CA, but of a role that is not a bookie client
    intruder = bookies.pki.issue("billing-app")
    refused = await attempts(bookies.client(address, intruder))
    assert len(refused) == 5
    for error in refused:
        assert isinstance(error, AuthorizationError), error
        assert "role 'billing-app' may not" in error.message
        assert "bookie_client_roles" in error.message
    # nothing was stored for ledger 424242, and ledger 1 was not fenced or deleted
    allowed = bookies.client(address, bookies.pki.issue("autorecovery"))
    with pytest.raises(NoSuchLedgerError):
        await allowed.read_entries(424242, 0, 0)
    await allowed.close()


async def test_a_token_of_a_bookie_client_role_is_an_alternative(bookies: Bookies) -> None:
    """Over the same mutual-TLS port, a token wins over the certificate's role."""
    address = bookies.cluster.bookies[1].data_address
    token_file = bookies.tokens.write("autorecovery")
    transport = bookies.pki.issue("some-pod")  # not a bookie client by itself
    with_token = bookies.client(address, transport, token=TokenFile(token_file))
    info = await with_token.info()
    assert info.bookie_id
    await with_token.close()
    wrong_role = bookies.client(
        address, transport, token=TokenFile(bookies.tokens.write("billing-app"))
    )
    with pytest.raises(AuthorizationError):
        await wrong_role.info()
    await wrong_role.close()


async def test_refusals_break_nothing_for_the_broker(bookies: Bookies) -> None:
    topic = unique("busy")
    intruder = bookies.pki.issue("mallory")
    pids = [b.pid for b in bookies.cluster.bookies]
    async with magnetar.aio.Client(bookies.cluster.service_url) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)

        async def attack() -> None:
            for _ in range(10):
                for bookie in bookies.cluster.bookies:
                    with contextlib.suppress(MagnetarError):
                        await attempts(bookies.client(bookie.data_address, intruder))

        attacker = asyncio.create_task(attack())
        for index in range(300):
            await producer.send(str(index).encode())
        await attacker
        got = [int((await consumer.receive(timeout_millis=10_000)).data()) for _ in range(300)]
        assert got == list(range(300))
    assert [b.pid for b in bookies.cluster.bookies] == pids
    metrics = ""
    https = ssl.create_default_context(cafile=str(bookies.pki.ca_file))
    for bookie in bookies.cluster.bookies:
        status, body = await http_get(bookie.http_port, "/metrics", tls=https)
        assert status == 200
        metrics += body
    assert 'magnetar_bookie_authorization_denied_total{bookie="' in metrics
