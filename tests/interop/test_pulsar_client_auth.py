"""Token authentication on the Pulsar listener, against a standalone whose authentication and
authorization are on: the token is checked at CONNECT (a missing or forged one is refused
there), permissions at each producer and consumer, and the real ``pulsar-client`` with
``AuthenticationToken`` works with a good token."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pulsar  # the real pulsar-client from PyPI (its C++ core)

from magnetar.testing import StandaloneNode
from magnetar.testing.security import TestTokens
from proto.pulsar import PulsarApi_pb2 as api
from tests.interop.pulsar_raw import RawConnection


def _client(url: str, token: str | None) -> pulsar.Client:
    return pulsar.Client(
        url,
        authentication=None if token is None else pulsar.AuthenticationToken(token),
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


async def test_tokens_are_checked_at_connect_and_permissions_per_producer_and_consumer(
    tmp_path: Path,
) -> None:
    tokens = TestTokens(tmp_path / "tokens")
    forger = TestTokens(tmp_path / "forged")
    args = [
        *("--authentication-enabled", "true", *tokens.broker_args),
        *("--authorization-enabled", "true", "--superuser-roles", "admin"),
    ]
    admin_token = tokens.create("admin")
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        url = node.pulsar_url

        def attempt(token: str | None) -> BaseException | None:
            client = _client(url, token)
            try:
                client.create_producer("persistent://public/default/guarded")
            except Exception as e:  # the refusal, as the client's exception
                return e
            finally:
                client.close()
            return None

        # a CONNECT without a token, or with a forged one: ERROR, then the connection closes
        # (the C++ client closes on any answer to CONNECT but CONNECTED and retries until its
        # operation timeout, as against Pulsar: spoken by hand here, which is quicker)
        assert node.pulsar_address is not None
        forged_token = forger.create("admin")
        without = api.CommandConnect(client_version="raw", protocol_version=19)
        forged = api.CommandConnect(
            client_version="raw",
            protocol_version=19,
            auth_method_name="token",
            auth_data=forged_token.encode(),
        )
        for connect in (without, forged):
            async with RawConnection.open(node.pulsar_address, connect=False) as raw:
                raw.send("CONNECT", connect=connect)
                error = (await raw.expect("ERROR")).command.error
                assert error.error == api.AuthenticationError
                assert forged_token not in error.message
                assert await raw.closed_by_broker()
        nobody = await asyncio.to_thread(attempt, tokens.create("nobody"))
        assert isinstance(nobody, pulsar.exceptions.AuthorizationError), repr(nobody)

        def superuser_round_trip() -> bytes:
            client = _client(url, admin_token)
            try:
                consumer = client.subscribe(
                    "persistent://public/default/guarded",
                    "sub",
                    initial_position=pulsar.InitialPosition.Earliest,
                )
                producer = client.create_producer("persistent://public/default/guarded")
                producer.send(b"allowed")
                message = consumer.receive(10_000)
                consumer.acknowledge(message)
                return bytes(message.data())
            finally:
                client.close()

        assert await asyncio.to_thread(superuser_round_trip) == b"allowed"
        log = node.log_path.read_text(errors="replace")
    assert admin_token not in log  # no secret in the broker's log
    assert forged_token not in log
    assert "pulsar_connection_failed" not in log


def _connect(token: str, *, refresh: bool = True) -> api.CommandConnect:
    return api.CommandConnect(
        client_version="raw",
        protocol_version=19,
        auth_method_name="token",
        auth_data=token.encode(),
        feature_flags=api.FeatureFlags(supports_auth_refresh=refresh),
    )


def _auth_response(token: str) -> api.CommandAuthResponse:
    return api.CommandAuthResponse(
        client_version="raw",
        protocol_version=19,
        response=api.AuthData(auth_method_name="token", auth_data=token.encode()),
    )


async def test_an_expired_token_is_refreshed_in_band_or_the_connection_closes(
    tmp_path: Path,
) -> None:
    tokens = TestTokens(tmp_path / "tokens")
    grace_s = 2
    args = [
        *("--authentication-enabled", "true", *tokens.broker_args),
        *("--authentication-refresh-grace-ms", str(grace_s * 1000)),
        *("--log-level", "info"),
    ]
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        address = node.pulsar_address
        assert address is not None

        async def refreshed() -> None:
            """A fresh token of the same role: the connection goes on past the grace."""
            async with RawConnection.open(address, connect=False) as raw:
                raw.send("CONNECT", connect=_connect(tokens.create("alice", expiry_s=2)))
                await raw.expect("CONNECTED")
                challenge = (await raw.expect("AUTH_CHALLENGE")).command.authChallenge
                assert challenge.challenge.auth_method_name == "token"
                raw.send("AUTH_RESPONSE", authResponse=_auth_response(tokens.create("alice")))
                await asyncio.sleep(grace_s + 1)
                raw.send("PING", ping=api.CommandPing())
                await raw.expect("PONG")
                await raw.create_producer("persistent://public/default/refreshed", 1)

        async def refused(answer: str | None, *, refresh: bool = True) -> str:
            """The ERROR that ends the connection (an answer with ``answer``, or none)."""
            async with RawConnection.open(address, connect=False) as raw:
                raw.send(
                    "CONNECT", connect=_connect(tokens.create("alice", expiry_s=2), refresh=refresh)
                )
                await raw.expect("CONNECTED")
                if refresh:
                    await raw.expect("AUTH_CHALLENGE")
                    if answer is not None:
                        raw.send("AUTH_RESPONSE", authResponse=_auth_response(answer))
                error = (await raw.expect("ERROR")).command.error
                assert error.error == api.AuthenticationError
                assert await raw.closed_by_broker()
                return error.message

        forged = TestTokens(tmp_path / "forged").create("alice")
        _, other_role, bad_signature, silent, old_client = await asyncio.gather(
            refreshed(),
            refused(tokens.create("mallory")),
            refused(forged),
            refused(None),
            refused(None, refresh=False),
        )
        assert "role 'mallory'" in other_role
        assert "signature" in bad_signature
        assert forged not in bad_signature
        assert f"within {grace_s * 1000} ms" in silent
        assert "cannot refresh" in old_client

        # the real client answers AUTH_CHALLENGE with its token supplier's current token
        supplied: list[str] = []

        def supplier() -> str:
            supplied.append(tokens.create("alice", expiry_s=2))
            return supplied[-1]

        def produce_across_expiry() -> None:
            client = pulsar.Client(
                node.pulsar_url,
                authentication=pulsar.AuthenticationToken(supplier),
                operation_timeout_seconds=10,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )
            try:
                producer = client.create_producer("persistent://public/default/long-lived")
                producer.send(b"before")
                time.sleep(4)  # past the token's expiry: the broker challenges the client
                producer.send(b"after")
            finally:
                client.close()

        await asyncio.to_thread(produce_across_expiry)
        assert len(supplied) >= 2
        log = node.log_path.read_text(errors="replace")
    assert "pulsar_credentials_refreshed" in log
    assert log.count("pulsar_credentials_refreshed") >= 2  # the raw client's and the real one's
    assert "pulsar_connection_failed" not in log
    for token in supplied:
        assert token not in log
