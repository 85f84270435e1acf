"""Authorization, tenants and the credentials of open streams, on an in-memory metadata store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.service.authorization import TopicAction
from broker.service.security import BrokerSecurity
from broker.service.tenants import Action, TenantCatalog, parse_actions
from magnetar.common.errors import (
    AuthenticationError,
    AuthenticationExpiredError,
    AuthorizationError,
    InvalidArgumentError,
    MagnetarError,
    NamespaceAlreadyExistsError,
    NamespaceNotFoundError,
    NotEmptyError,
    TenantAlreadyExistsError,
    TenantNotFoundError,
)
from magnetar.common.names import parse_topic
from magnetar.common.security.authentication import Credentials, Principal
from magnetar.common.security.config import AuthenticationSettings
from magnetar.testing.eventually import eventually
from magnetar.testing.security import TestTokens
from metadata import MetadataStore, layout, open_store

PEER = "ipv4:10.0.0.9:40000"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    opened = await open_store("memory://")
    yield opened
    await opened.close()


@pytest.fixture
def tokens(tmp_path: Path) -> TestTokens:
    return TestTokens(tmp_path)


async def started(
    store: MetadataStore, tokens: TestTokens, *, grace_ms: int = 10_000
) -> BrokerSecurity:
    security = BrokerSecurity(
        AuthenticationSettings(
            authentication_enabled=True,
            token_secret_key_file=tokens.secret_key_file,
            superuser_roles=("admin",),
            authentication_refresh_grace_ms=grace_ms,
        ),
        store,
        authorization_enabled=True,
    )
    await security.start()
    return security


def role(name: str) -> Principal:
    return Principal(name, "token")


async def test_tenants_and_namespaces_live_in_the_store(store: MetadataStore) -> None:
    catalog = TenantCatalog(store)
    await catalog.start()
    try:
        await catalog.create_tenant("acme", ["acme-admin"])
        with pytest.raises(TenantAlreadyExistsError):
            await catalog.create_tenant("acme", [])
        with pytest.raises(TenantNotFoundError):
            await catalog.create_namespace("nobody/ns")
        await catalog.create_namespace("acme/ns1")
        with pytest.raises(NamespaceAlreadyExistsError):
            await catalog.create_namespace("acme/ns1")
        await catalog.grant("acme/ns1", "alice", frozenset({Action.PRODUCE}))
        await catalog.grant("acme/ns1", "bob", parse_actions(["produce", "consume"]))
        namespace, _ = await catalog.read_namespace("acme/ns1")
        assert namespace.permissions == {
            "alice": {Action.PRODUCE},
            "bob": {Action.PRODUCE, Action.CONSUME},
        }
        await catalog.revoke("acme/ns1", "bob")
        # a second catalog (another broker) sees the same records through its watch
        other = TenantCatalog(store)
        await other.start()
        try:
            found = other.namespace("acme/ns1")
            assert found is not None
            assert set(found.permissions) == {"alice"}
            await catalog.grant("acme/ns1", "carol", frozenset({Action.CONSUME}))
            await eventually(
                lambda: "carol" in (other.namespace("acme/ns1") or found).permissions,
                timeout_s=5,
                what="the grant to reach the other view",
                interval_s=0.01,
            )
        finally:
            await other.close()
        with pytest.raises(NotEmptyError, match="acme/ns1"):
            await catalog.delete_tenant("acme")
        await store.put(layout.topic("acme/ns1/orders"), b"")
        with pytest.raises(NotEmptyError, match="orders"):
            await catalog.delete_namespace("acme/ns1")
        await store.delete(layout.topic("acme/ns1/orders"))
        await catalog.delete_namespace("acme/ns1")
        await catalog.delete_tenant("acme")
        assert catalog.tenants() == []
        with pytest.raises(NamespaceNotFoundError):
            await catalog.read_namespace("acme/ns1")
    finally:
        await catalog.close()


@pytest.mark.parametrize(
    "bad", ["", "a/b/c", "no-slash", "/x", "acme/", "acme/ns 1", "ac me/ns", ".acme/ns"]
)
async def test_namespace_names_are_checked(store: MetadataStore, bad: str) -> None:
    catalog = TenantCatalog(store)
    await catalog.start()
    try:
        await catalog.ensure_tenant("acme")
        with pytest.raises(InvalidArgumentError):
            await catalog.create_namespace(bad)
    finally:
        await catalog.close()


def test_actions_are_named() -> None:
    assert parse_actions(["Produce", " consume "]) == {Action.PRODUCE, Action.CONSUME}
    with pytest.raises(InvalidArgumentError, match="unknown action 'admin'"):
        parse_actions(["admin"])
    with pytest.raises(InvalidArgumentError):
        parse_actions([])


async def test_who_may_do_what(store: MetadataStore, tokens: TestTokens) -> None:
    security = await started(store, tokens)
    try:
        tenants = security.tenants
        await tenants.create_tenant("acme", ["acme-admin"])
        await tenants.create_tenant("globex", ["globex-admin"])
        for namespace in ("acme/ns1", "acme/ns2", "globex/ns1"):
            await tenants.create_namespace(namespace)
        await tenants.grant("acme/ns1", "producer", frozenset({Action.PRODUCE}))
        await tenants.grant("acme/ns1", "reader", frozenset({Action.CONSUME}))
        authz = security.authorization
        ns1 = parse_topic("acme/ns1/orders")
        ns2 = parse_topic("acme/ns2/orders")
        other = parse_topic("globex/ns1/orders")

        await authz.check_topic(role("producer"), TopicAction.PRODUCE, ns1)
        await authz.check_topic(role("producer"), TopicAction.LOOKUP, ns1)
        with pytest.raises(AuthorizationError) as refused:
            await authz.check_topic(role("producer"), TopicAction.CONSUME, ns1)
        assert "role 'producer' may not consume from acme/ns1" in refused.value.message
        for action in TopicAction:
            with pytest.raises(AuthorizationError):
                await authz.check_topic(role("producer"), action, ns2)
        await authz.check_topic(role("reader"), TopicAction.CONSUME, ns1)
        with pytest.raises(AuthorizationError, match="may not produce to"):
            await authz.check_topic(role("reader"), TopicAction.PRODUCE, ns1)

        # a tenant admin does anything in its tenant and nothing in another
        for action in TopicAction:
            await authz.check_topic(role("acme-admin"), action, ns2)
        await authz.check_tenant_admin(role("acme-admin"), "acme", "delete topic x")
        with pytest.raises(AuthorizationError, match="needs an admin of tenant 'globex'"):
            await authz.check_tenant_admin(role("acme-admin"), "globex", "delete topic x")
        with pytest.raises(AuthorizationError):
            await authz.check_topic(role("acme-admin"), TopicAction.CONSUME, other)
        with pytest.raises(AuthorizationError, match="needs a superuser"):
            authz.check_superuser(role("acme-admin"), "unload topics")

        # a superuser does everything; a role nobody granted anything does nothing
        for action in TopicAction:
            await authz.check_topic(role("admin"), action, other)
        authz.check_superuser(role("admin"), "unload topics")
        with pytest.raises(AuthorizationError, match="role 'stranger'"):
            await authz.check_topic(role("stranger"), TopicAction.LOOKUP, ns1)
        assert authz.denials["consume"] >= 2
        # public/default exists from the start, as in Pulsar
        assert security.tenants.namespace("public/default") is not None
    finally:
        await security.close()


async def test_a_denial_is_checked_against_the_store_not_a_stale_view(
    store: MetadataStore, tokens: TestTokens
) -> None:
    """A grant made on another broker a moment ago is honoured although this broker's watch
    has not delivered it yet."""
    security = await started(store, tokens)
    writer = TenantCatalog(store)
    await writer.start()
    try:
        await writer.create_tenant("acme", [])
        await writer.create_namespace("acme/ns1")
        await writer.grant("acme/ns1", "late", frozenset({Action.PRODUCE}))
        # no sleep: the check must not depend on the watch having run
        await security.authorization.check_topic(
            role("late"), TopicAction.PRODUCE, parse_topic("acme/ns1/t")
        )
    finally:
        await writer.close()
        await security.close()


async def test_a_revocation_closes_open_streams_of_that_role(
    store: MetadataStore, tokens: TestTokens
) -> None:
    security = await started(store, tokens)
    try:
        await security.tenants.create_tenant("acme", [])
        await security.tenants.create_namespace("acme/ns1")
        await security.tenants.grant("acme/ns1", "alice", frozenset({Action.PRODUCE}))
        await security.tenants.grant("acme/ns1", "bob", frozenset({Action.PRODUCE}))
        closed: dict[str, MagnetarError] = {}
        for name in ("alice", "bob"):
            security.stream(
                role(name),
                PEER,
                action=TopicAction.PRODUCE,
                topic=parse_topic("acme/ns1/t"),
                on_challenge=lambda _: None,
                on_revoked=lambda error, name=name: closed.__setitem__(name, error),  # type: ignore[misc]
            )
        await security.tenants.revoke("acme/ns1", "alice")
        assert set(closed) == {"alice"}
        assert isinstance(closed["alice"], AuthorizationError)
        assert "may no longer produce to acme/ns1" in closed["alice"].message
    finally:
        await security.close()


async def test_an_expiring_stream_is_challenged_and_refreshed(
    store: MetadataStore, tokens: TestTokens
) -> None:
    security = await started(store, tokens, grace_ms=2000)
    try:
        topic = parse_topic("public/default/t")
        await security.tenants.grant("public/default", "alice", frozenset({Action.PRODUCE}))
        principal = security.authenticate(Credentials(PEER, tokens.create("alice", expiry_s=1)))
        challenges: list[int] = []
        closed: list[MagnetarError] = []
        stream = security.stream(
            principal,
            PEER,
            action=TopicAction.PRODUCE,
            topic=topic,
            on_challenge=challenges.append,
            on_revoked=closed.append,
        )
        await eventually(lambda: challenges, timeout_s=5, what="a challenge", interval_s=0.05)
        assert challenges == [principal.expires_at_ms]
        # another role's token is refused, and so is a token of the right role signed elsewhere
        with pytest.raises(AuthenticationError, match="for role 'mallory'"):
            await stream.refresh(tokens.create("mallory", expiry_s=60))
        with pytest.raises(AuthenticationError, match="signature"):
            await stream.refresh(TestTokens(Path(str(tokens.directory) + "-x")).create("alice"))
        await stream.refresh(tokens.create("alice", expiry_s=60))
        assert stream.principal.expires_at_ms is not None
        assert stream.principal.expires_at_ms > time.time() * 1000 + 50_000
        await asyncio.sleep(2.2)  # past the grace: the refresh cancelled the deadline
        assert closed == []
        stream.close()

        # a stream that gets no fresh token is closed, retriably, after the grace
        lapsing = security.stream(
            security.authenticate(Credentials(PEER, tokens.create("alice", expiry_s=1))),
            PEER,
            action=TopicAction.PRODUCE,
            topic=topic,
            on_challenge=lambda _: None,
            on_revoked=closed.append,
        )
        await eventually(lambda: closed, timeout_s=8, what="the stream closed", interval_s=0.05)
        assert isinstance(closed[0], AuthenticationExpiredError)
        assert closed[0].retriable
        assert "no fresh one came within 2000 ms" in closed[0].message
        lapsing.close()
    finally:
        await security.close()
