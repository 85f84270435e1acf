"""Authentication and authorization against a real cluster: etcd, 3 bookies, 2 brokers.

The brokers take tokens (HS256) on their plaintext port and require client certificates on their
TLS port (mutual TLS, the certificate's common name is the role); authorization is on. Roles:

- ``admin`` (superuser), ``broker`` (superuser: the brokers' own token, for forwarded calls);
- ``acme-admin`` administers tenant ``acme``, ``globex-admin`` tenant ``globex``;
- ``producer`` may produce on ``acme/ns1``; ``consumer`` may consume there; ``stranger`` nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

import magnetar.aio
from magnetar.common.errors import (
    AuthenticationError,
    AuthorizationError,
    NamespaceNotFoundError,
    OperationTimeoutError,
    TlsError,
)
from magnetar.testing import LocalCluster
from magnetar.testing.probes import http_get
from magnetar.testing.security import CertFiles, TestPki, TestTokens
from proto.admin.v1 import admin_pb2, admin_pb2_grpc
from proto.broker.v1 import broker_pb2, broker_pb2_grpc

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.etcd, pytest.mark.timeout(180)]

REFRESH_GRACE_MS = 1500


@dataclass
class Secure:
    cluster: LocalCluster
    pki: TestPki
    tokens: TestTokens
    issued: list[str]
    """Every token handed out, to look for in the logs."""

    def token(self, role: str, *, expiry_s: int | None = None) -> str:
        token = self.tokens.create(role, expiry_s=expiry_s)
        self.issued.append(token)
        return token

    def client(self, role: str | None, **settings: object) -> magnetar.aio.Client:
        authentication = (
            magnetar.aio.AuthenticationToken(self.token(role)) if role is not None else None
        )
        settings.setdefault("operation_timeout_s", 15)
        return magnetar.aio.Client(
            self.cluster.service_url, authentication=authentication, **settings
        )

    def admin(self, role: str | None) -> magnetar.aio.AdminClient:
        authentication = (
            magnetar.aio.AuthenticationToken(self.token(role)) if role is not None else None
        )
        return magnetar.aio.AdminClient(
            self.cluster.service_url, authentication=authentication, operation_timeout_s=15
        )

    def tls_client(self, cert: CertFiles, **settings: object) -> magnetar.aio.Client:
        return magnetar.aio.Client(
            self.cluster.tls_service_url,
            authentication=magnetar.aio.AuthenticationTLS(cert.cert_file, cert.key_file),
            tls_trust_certs_file_path=str(self.pki.ca_file),
            operation_timeout_s=15,
            **settings,
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secure(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secure]:
    root = tmp_path_factory.mktemp("auth")
    pki = TestPki(root / "pki")
    broker_cert = pki.issue("broker", hosts=["localhost", "127.0.0.1"])
    tokens = TestTokens(root / "tokens")
    broker_token = tokens.write("broker")
    args = [
        *("--tls-cert-file", str(broker_cert.cert_file)),
        *("--tls-key-file", str(broker_cert.key_file)),
        *("--tls-trust-certs-file", str(pki.ca_file)),
        *("--authentication-enabled", "true"),
        *("--authentication-providers", "token,tls"),
        *tokens.broker_args,
        *("--superuser-roles", "admin,broker"),
        *("--authorization-enabled", "true"),
        *("--broker-client-auth-token-file", str(broker_token)),
        *("--authentication-refresh-grace-ms", str(REFRESH_GRACE_MS)),
    ]
    async with LocalCluster(root, bookies=3, brokers=2, broker_args=args) as cluster:
        await cluster.wait_brokers_registered()
        secure = Secure(cluster, pki, tokens, [tokens.create("broker")])
        async with secure.admin("admin") as admin:
            await admin.create_tenant("acme", ["acme-admin"])
            await admin.create_tenant("globex", ["globex-admin"])
            for namespace in ("acme/ns1", "acme/ns2", "globex/ns1"):
                await admin.create_namespace(namespace)
            await admin.grant_permission("acme/ns1", "producer", ["produce"])
            await admin.grant_permission("acme/ns1", "consumer", ["consume"])
        yield secure


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def produce_one(client: magnetar.aio.Client, topic: str, payload: bytes = b"m") -> None:
    producer = await client.create_producer(topic)
    await producer.send(payload)
    await producer.close()


# --- authentication ------------------------------------------------------------------------------


async def test_calls_without_credentials_are_refused(secure: Secure) -> None:
    topic = f"acme/ns1/{unique('t')}"
    async with secure.client(None) as client:
        with pytest.raises(AuthenticationError, match="no credentials"):
            await client.create_producer(topic)
        with pytest.raises(AuthenticationError, match="no credentials"):
            await client.subscribe(topic, "s")
    async with secure.admin(None) as admin:
        with pytest.raises(AuthenticationError):
            await admin.list_topics("acme/ns1")
        with pytest.raises(AuthenticationError):
            await admin.create_topic(topic)
    # as the wire says it: UNAUTHENTICATED on a unary call, in band on a stream
    target = secure.cluster.brokers[0].address
    async with grpc.aio.insecure_channel(target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin_pb2_grpc.AdminServiceStub(channel).DeleteTopic(
                admin_pb2.DeleteTopicRequest(topic=topic), timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        call = broker_pb2_grpc.BrokerServiceStub(channel).Produce()
        await call.write(broker_pb2.ProduceRequest(open=broker_pb2.ProducerOpen(topic=topic)))
        answer: Any = await call.read()
        assert answer.WhichOneof("kind") == "closed"
        assert "no credentials" in answer.closed.reason.message
        call.cancel()


async def test_bad_tokens_are_refused_each_with_its_reason(secure: Secure) -> None:
    topic = f"acme/ns1/{unique('t')}"
    elsewhere = TestTokens(secure.pki.directory.parent / "elsewhere")
    expired = secure.token("producer", expiry_s=1)
    await asyncio.sleep(1.1)
    cases = [
        (elsewhere.create("producer"), AuthenticationError, "signature"),
        (expired, AuthenticationError, "expired at"),
        ("garbage", AuthenticationError, "not a well-formed JWT"),
        # a good token of a role nobody granted anything: authenticated, then refused
        (secure.token("stranger"), AuthorizationError, "role 'stranger' may not look up topics"),
    ]
    for token, error, text in cases:
        async with magnetar.aio.Client(
            secure.cluster.service_url,
            authentication=magnetar.aio.AuthenticationToken(token),
            operation_timeout_s=15,
        ) as client:
            with pytest.raises(error, match=text) as caught:
                await client.create_producer(topic)
            assert token not in str(caught.value)


async def test_a_client_certificate_is_a_role_and_another_cas_is_refused(secure: Secure) -> None:
    consumer_cert = secure.pki.issue("consumer")
    topic = f"acme/ns1/{unique('t')}"
    async with secure.client("producer") as producer_client:
        await produce_one(producer_client, topic, b"for the certificate")
    async with secure.tls_client(consumer_cert) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        assert (await consumer.receive(timeout_millis=10_000)).data() == b"for the certificate"
        who = await client.admin().whoami()
        assert (who["role"], who["method"]) == ("consumer", "tls")
        with pytest.raises(AuthorizationError, match="role 'consumer' may not produce"):
            await client.create_producer(topic)
    foreign = TestPki(secure.pki.directory.parent / "foreign").issue("consumer")
    async with secure.tls_client(foreign) as client:
        with pytest.raises(TlsError, match="refused"):
            await client.subscribe(topic, "s2")
    # no certificate at all on the mutual-TLS port
    async with magnetar.aio.Client(
        secure.cluster.tls_service_url,
        authentication=magnetar.aio.AuthenticationToken(secure.token("admin")),
        tls_trust_certs_file_path=str(secure.pki.ca_file),
        operation_timeout_s=15,
    ) as client:
        with pytest.raises(TlsError, match="gave none"):
            await client.create_producer(topic)
    # a token over mutual TLS, with a certificate for the transport: the token's role
    transport = secure.pki.issue("some-service")
    async with magnetar.aio.Client(
        secure.cluster.tls_service_url,
        authentication=magnetar.aio.AuthenticationToken(secure.token("admin")),
        tls_trust_certs_file_path=str(secure.pki.ca_file),
        tls_certificate_file_path=str(transport.cert_file),
        tls_private_key_file_path=str(transport.key_file),
    ) as client:
        assert (await client.admin().whoami())["role"] == "admin"


# --- authorization -------------------------------------------------------------------------------


async def test_a_produce_grant_allows_producing_there_and_nothing_else(secure: Secure) -> None:
    ns1 = f"acme/ns1/{unique('t')}"
    ns2 = f"acme/ns2/{unique('t')}"
    async with secure.client("producer") as client:
        await produce_one(client, ns1)
        with pytest.raises(
            AuthorizationError, match="role 'producer' may not consume from acme/ns1"
        ):
            await client.subscribe(ns1, "s")
        # nothing granted on acme/ns2: already its lookup is refused
        with pytest.raises(AuthorizationError, match="may not look up topics of acme/ns2"):
            await client.create_producer(ns2)
        with pytest.raises(AuthorizationError, match="may not look up topics of acme/ns2"):
            await client.subscribe(ns2, "s")
    async with secure.client("consumer") as client:
        consumer = await client.subscribe(ns1, "s", initial_position="earliest")
        assert (await consumer.receive(timeout_millis=10_000)).data() == b"m"


async def test_a_tenant_admin_manages_its_own_tenant_only(secure: Secure) -> None:
    mine = f"acme/ns2/{unique('t')}"
    theirs = f"globex/ns1/{unique('t')}"
    async with secure.admin("acme-admin") as admin:
        await admin.create_topic(mine, partitions=2)
        assert await admin.update_partitions(mine, 3) == 3
        await admin.create_subscription(mine, "s")
        await admin.reset_cursor(mine, "s", "earliest")
        await admin.delete_subscription(mine, "s")
        await admin.create_namespace("acme/scratch")
        await admin.grant_permission("acme/scratch", "someone", ["consume"])
        assert await admin.permissions("acme/scratch") == {"someone": ["consume"]}
        await admin.delete_namespace("acme/scratch")
        stats = await admin.topic_stats(mine)
        assert len(stats["partitions"]) == 3
        await admin.delete_topic(mine)
        for attempt in (
            admin.create_topic(theirs),
            admin.delete_topic(theirs),
            admin.create_namespace("globex/mine-now"),
            admin.grant_permission("globex/ns1", "acme-admin", ["produce", "consume"]),
            admin.delete_tenant("acme"),
            admin.unload_topic(f"acme/ns1/{unique('t')}"),
            admin.list_bookies(),
        ):
            with pytest.raises(AuthorizationError):
                await attempt
        with pytest.raises(NamespaceNotFoundError, match="create it first"):
            await admin.create_topic(f"acme/missing/{unique('t')}")


async def test_a_superuser_does_everything(secure: Secure) -> None:
    topic = f"globex/ns1/{unique('t')}"
    async with secure.admin("admin") as admin:
        await admin.create_tenant("initech", ["initech-admin"])
        await admin.create_namespace("initech/ns")
        await admin.create_topic(topic, partitions=4)
        assert len(await admin.list_brokers()) == 2
        assert len(await admin.list_bookies()) == 3
        assert await admin.list_ownership() is not None
        assert await admin.list_ledgers() is not None
        await admin.unload_topic(topic)
        stats = await admin.topic_stats(topic, internal=True)
        assert len(stats["partitions"]) == 4
        await admin.delete_topic(topic)
        await admin.delete_namespace("initech/ns")
        await admin.delete_tenant("initech")
        assert "initech" not in await admin.list_tenants()
    async with secure.client("admin") as client:
        await produce_one(client, topic)


async def test_lists_and_stats_show_only_what_the_role_may_use(secure: Secure) -> None:
    visible = f"acme/ns1/{unique('t')}"
    hidden = f"globex/ns1/{unique('t')}"
    async with secure.admin("admin") as admin:
        await admin.create_topic(visible)
        await admin.create_topic(hidden)
    async with secure.client("producer") as client:
        producer = await client.create_producer(visible)
        async with secure.admin("producer") as admin:
            topics = [t["topic"] for t in await admin.list_topics()]
            assert visible in topics
            assert hidden not in topics
            assert not any(t.startswith("globex/") for t in topics)
            assert await admin.list_tenants() == ["acme"]
            assert await admin.list_namespaces("acme") == ["acme/ns1"]
            with pytest.raises(AuthorizationError):
                await admin.list_topics("globex/ns1")
            stats = await admin.topic_stats(visible)
            publishers = [p for part in stats["partitions"] for p in part["publishers"]]
            assert publishers
            assert all(p["address"] == "" for p in publishers), "client addresses are hidden"
            with pytest.raises(AuthorizationError):
                await admin.topic_stats(visible, internal=True)
        async with secure.admin("acme-admin") as admin:
            stats = await admin.topic_stats(visible)
            addresses = [p["address"] for part in stats["partitions"] for p in part["publishers"]]
            assert all(addresses), "a tenant admin sees them"
        await producer.close()


async def test_permission_changes_apply_at_once_to_new_and_open_streams(secure: Secure) -> None:
    topic = f"acme/ns2/{unique('t')}"
    async with secure.admin("acme-admin") as admin, secure.client("latecomer") as client:
        with pytest.raises(AuthorizationError):
            await client.create_producer(topic)
        await admin.grant_permission("acme/ns2", "latecomer", ["produce"])
        producer = await client.create_producer(topic)  # no broker restarted
        await producer.send(b"allowed")
        await admin.revoke_permission("acme/ns2", "latecomer")

        async def send_until_refused() -> None:
            for _ in range(100):
                await producer.send(b"after revocation")
                await asyncio.sleep(0.05)

        # the open producer is closed by its broker: the next send fails, naming why
        with pytest.raises(AuthorizationError, match="permission was revoked"):
            await send_until_refused()
        with pytest.raises(AuthorizationError):
            await client.create_producer(topic)


# --- long-lived streams --------------------------------------------------------------------------


async def test_an_expiring_token_is_refreshed_in_band_with_nothing_lost(secure: Secure) -> None:
    """Tokens that live 2 s, a producer that runs for ~7 s: every message arrives once, in
    order, and the streams were refreshed in band (never reopened)."""
    topic = f"acme/ns1/{unique('refresh')}"
    issued: list[str] = []

    def fresh(role: str) -> Callable[[], str]:
        def supplier() -> str:
            token = secure.token(role, expiry_s=2)
            issued.append(token)
            return token

        return supplier

    async with (
        magnetar.aio.Client(
            secure.cluster.service_url,
            authentication=magnetar.aio.AuthenticationToken(fresh("producer")),
        ) as producing,
        magnetar.aio.Client(
            secure.cluster.service_url,
            authentication=magnetar.aio.AuthenticationToken(fresh("consumer")),
        ) as consuming,
    ):
        consumer = await consuming.subscribe(topic, "s", initial_position="earliest")
        producer = await producing.create_producer(topic)
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 7:
            await producer.send(str(sent).encode())
            sent += 1
            await asyncio.sleep(0.01)
        received: list[int] = []
        while len(received) < sent:
            message = await consumer.receive(timeout_millis=15_000)
            received.append(int(message.data()))
            await consumer.acknowledge(message)
        assert received == list(range(sent))
        with pytest.raises(magnetar.aio.ReceiveTimeoutError):
            await consumer.receive(timeout_millis=500)
    assert len(issued) >= 6  # each stream was asked at least twice more
    logs = "".join(b.log_path.read_text() for b in secure.cluster.brokers)
    refreshed = [line for line in logs.splitlines() if "stream_credentials_refreshed" in line]
    assert len([line for line in refreshed if topic in line]) >= 4
    reopened = [line for line in logs.splitlines() if "producer_opened" in line and topic in line]
    assert len(reopened) == 1, "the producer's stream was refreshed in band, not reopened"


async def test_a_stream_whose_refresh_fails_reconnects_with_nothing_lost(secure: Secure) -> None:
    """The token supplier fails when first asked for a refresh: the broker closes the stream
    after its grace period (retriably), the producer reconnects with a fresh token and resends;
    deduplication keeps every message once."""
    topic = f"acme/ns1/{unique('lapse')}"
    state = {"armed": False, "failed": False}

    def flaky() -> str:
        if state["armed"] and not state["failed"]:  # the first refresh the broker asks for
            state["failed"] = True
            raise RuntimeError("token service down")
        return secure.token("producer", expiry_s=60 if state["failed"] else 2)

    async with (
        magnetar.aio.Client(
            secure.cluster.service_url, authentication=magnetar.aio.AuthenticationToken(flaky)
        ) as producing,
        secure.client("consumer") as consuming,
    ):
        consumer = await consuming.subscribe(topic, "s", initial_position="earliest")
        producer = await producing.create_producer(topic)
        state["armed"] = True
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 2 + REFRESH_GRACE_MS / 1000 + 2:
            producer.send_async(str(sent).encode(), lambda *_: None)
            sent += 1
            await asyncio.sleep(0.005)
        await producer.flush()
        received: list[int] = []
        while len(received) < sent:
            message = await consumer.receive(timeout_millis=15_000)
            received.append(int(message.data()))
        assert received == list(range(sent))
    logs = "".join(b.log_path.read_text() for b in secure.cluster.brokers)
    opened = [line for line in logs.splitlines() if "producer_opened" in line and topic in line]
    assert len(opened) == 2, "the lapsed stream was closed and the producer reconnected"


# --- no harm to others ---------------------------------------------------------------------------


async def test_refused_clients_break_nothing_for_the_others(secure: Secure) -> None:
    topic = f"acme/ns1/{unique('busy')}"
    pids = [b.pid for b in secure.cluster.brokers]
    elsewhere = TestTokens(secure.pki.directory.parent / "attacker")
    async with secure.client("producer") as good, secure.client("consumer") as reader:
        consumer = await reader.subscribe(topic, "s", initial_position="earliest")
        producer = await good.create_producer(topic)

        async def attack() -> None:
            for index in range(20):
                token = elsewhere.create("admin") if index % 2 else "x" * 5000
                async with magnetar.aio.Client(
                    secure.cluster.service_url,
                    authentication=magnetar.aio.AuthenticationToken(token),
                    operation_timeout_s=5,
                ) as bad:
                    with contextlib.suppress(AuthenticationError, OperationTimeoutError):
                        await bad.create_producer(topic)

        attacker = asyncio.create_task(attack())
        for index in range(200):
            await producer.send(str(index).encode())
        await attacker
        received = [int((await consumer.receive(timeout_millis=10_000)).data()) for _ in range(200)]
        assert received == list(range(200))
    assert [b.pid for b in secure.cluster.brokers] == pids
    assert all(b.is_running for b in secure.cluster.brokers)


async def test_refusals_are_counted_by_reason_and_no_secret_is_logged(secure: Secure) -> None:
    expired = secure.token("producer", expiry_s=1)
    await asyncio.sleep(1.1)
    elsewhere = TestTokens(secure.pki.directory.parent / "counted").create("admin")
    secure.issued.append(elsewhere)
    for authentication in (
        None,
        magnetar.aio.AuthenticationToken("not.a.token"),
        magnetar.aio.AuthenticationToken(expired),
        magnetar.aio.AuthenticationToken(elsewhere),
    ):
        async with magnetar.aio.Client(
            secure.cluster.service_url, authentication=authentication, operation_timeout_s=5
        ) as client:
            with pytest.raises(AuthenticationError):
                await client.create_producer("acme/ns1/x")
    scraped = ""
    for broker in secure.cluster.brokers:
        status, body = await http_get(broker.http_port, "/metrics")
        assert status == 200
        scraped += body
    counts = re.findall(
        r'magnetar_broker_authentication_failures_total\{broker="[^"]+",reason="(\w+)"\} (\d+)',
        scraped,
    )
    reasons = {reason for reason, count in counts if float(count) > 0}
    assert {"malformed", "no_credentials", "bad_signature", "expired"} <= reasons
    assert "magnetar_broker_authorization_denied_total" in scraped
    logs = "".join(b.log_path.read_text() for b in secure.cluster.brokers)
    assert "authentication_failed" in logs
    assert "peer" in logs
    for token in secure.issued:
        assert token not in logs
        assert token not in scraped
    secret_file = secure.tokens.secret_key_file
    assert secret_file is not None
    secret = secret_file.read_bytes()
    for form in (secret.hex(), base64.b64encode(secret).decode()):
        assert form not in logs


async def test_the_broker_help_echoes_no_setting_from_the_environment() -> None:
    marker = "this-value-must-not-be-echoed"
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "magnetar.cli", "broker", "--help"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "MAGNETAR_TOKEN_SECRET_KEY_FILE": marker,
            "MAGNETAR_TOKEN_AUDIENCE": marker,
        },
        check=True,
        timeout=60,
    )
    assert "--token-secret-key-file" in result.stdout
    assert marker not in result.stdout
