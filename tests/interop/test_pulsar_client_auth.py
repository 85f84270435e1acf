"""Token authentication on the Pulsar listener, against a standalone whose authentication and
authorization are on: the token is checked at CONNECT (a missing or forged one is refused
there), permissions at each producer and consumer, and the real ``pulsar-client`` with
``AuthenticationToken`` works with a good token."""

from __future__ import annotations

import asyncio
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
