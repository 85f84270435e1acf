"""Pulsar's admin REST API on a Magnetar standalone's HTTP port, spoken over real HTTP: topics
created, grown, listed, read and deleted in pulsar-admin's paths; the real ``pulsar-client``
producing to and consuming from a partitioned topic created over REST; the dedup switch, seen
by a Pulsar producer; bad requests answered in Pulsar's JSON while /metrics goes on; and the
same tokens and roles as the gRPC admin service.

One standalone (one bookie), with authentication and authorization on, serves the module: the
calls are made as its superuser ``admin`` unless a test says otherwise. HTTP and the Pulsar
client are blocking: they run in a thread, so the event loop that owns the standalone stays
free.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pulsar  # the real pulsar-client from PyPI (its C++ core)
import pytest
import pytest_asyncio

from magnetar.testing import StandaloneNode
from magnetar.testing.security import TestTokens
from tests.interop.test_pulsar_client_auth import _client

T = TypeVar("T")

on_node = pytest.mark.asyncio(loop_scope="module")
pytestmark = on_node

NS = "/admin/v2/persistent/public/default"


@dataclass(frozen=True)
class Env:
    node: StandaloneNode
    tokens: dict[str, str]
    """Tokens by role (``forged``: the superuser's name signed with another key)."""
    log_path: Path

    @property
    def admin(self) -> str:
        return self.tokens["admin"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    where = tmp_path_factory.mktemp("rest")
    tokens = TestTokens(where / "tokens")
    args = [
        *("--authentication-enabled", "true", *tokens.broker_args),
        *("--authorization-enabled", "true", "--superuser-roles", "admin"),
    ]
    issued = {
        "admin": tokens.create("admin"),
        "nobody": tokens.create("nobody"),
        "forged": TestTokens(where / "forged").create("admin"),
        "garbage": "not-a-token",
    }
    log_path = where / "standalone.log"
    async with StandaloneNode(
        where / "data", bookies=1, extra_args=args, log_path=log_path
    ) as node:
        yield Env(node, issued, log_path)


async def run(step: Callable[[], T]) -> T:
    return await asyncio.to_thread(step)


def unique(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def call(
    env: Env,
    method: str,
    path: str,
    body: str | bytes | None = None,
    *,
    role: str | None = "admin",
) -> tuple[int, Any]:
    """One request (http.client sends a Content-Length, 0 for a PUT or POST without a body):
    the status and the JSON answered (None: no body; the text of a plain-text refusal)."""
    host, port = env.node.http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    if role is not None:
        headers["Authorization"] = f"Bearer {env.tokens[role]}"
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    if response.getheader("Content-Type") != "application/json":
        return response.status, raw.decode()
    return response.status, json.loads(raw) if raw else None


def raw_request(node: StandaloneNode, request: bytes) -> tuple[int, bytes]:
    """Bytes sent as they are; the status and the body answered."""
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def pulsar_client(node: StandaloneNode, token: str | None = None) -> pulsar.Client:
    return _client(node.pulsar_url, token)


async def test_a_partitioned_topic_made_over_rest_serves_the_pulsar_client(
    env: Env,
) -> None:
    name = unique("orders")
    topic = f"persistent://public/default/{name}"
    path = f"{NS}/{name}"
    assert await run(lambda: call(env, "PUT", f"{path}/partitions", "3")) == (204, None)
    assert await run(lambda: call(env, "GET", f"{path}/partitions")) == (
        200,
        {"partitions": 3},
    )
    status, body = await run(lambda: call(env, "PUT", f"{path}/partitions", "3"))
    assert (status, body) == (409, {"reason": f"topic public/default/{name} already exists"})

    def produce_and_consume() -> tuple[list[bytes], dict[str, Any], dict[str, Any]]:
        client = pulsar_client(env.node, env.admin)
        try:
            consumer = client.subscribe(
                topic,
                "sub",
                consumer_type=pulsar.ConsumerType.Shared,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(30):
                producer.send(f"m{i}".encode(), partition_key=f"k{i % 10}")
            received = []
            for _ in range(30):
                message = consumer.receive(10_000)
                received.append(message.data())
                consumer.acknowledge(message)
            # while the producer and consumer are attached
            stats = call(env, "GET", f"{path}/partitioned-stats")
            busy = call(env, "DELETE", f"{path}/partitions")
            assert busy[0] == 412, busy
            assert "force the delete" in busy[1]["reason"]
            return received, stats[1], call(env, "GET", f"{path}-partition-0/stats")[1]
        finally:
            client.close()

    received, stats, one = await run(produce_and_consume)
    assert sorted(received) == sorted(f"m{i}".encode() for i in range(30))
    assert stats["metadata"] == {"partitions": 3}
    assert sorted(stats["partitions"]) == [f"{topic}-partition-{i}" for i in range(3)]
    assert stats["msgInCounter"] == 30
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == 30
    assert stats["storageSize"] > 0
    assert len(stats["publishers"]) == 3  # the client's producer has one per partition
    subscription = stats["subscriptions"]["sub"]
    assert subscription["type"] == "Shared"
    assert len(subscription["consumers"]) == 3
    assert {"consumerName", "availablePermits", "unackedMessages"} <= set(
        subscription["consumers"][0]
    )
    assert one["msgInCounter"] == stats["partitions"][f"{topic}-partition-0"]["msgInCounter"]

    assert await run(lambda: call(env, "POST", f"{path}/partitions", "4")) == (204, None)
    assert (await run(lambda: call(env, "GET", f"{path}/partitions")))[1] == {"partitions": 4}
    status, body = await run(lambda: call(env, "POST", f"{path}/partitions", "2"))
    assert status == 400
    assert "can only grow" in body["reason"]
    status, listed = await run(lambda: call(env, "GET", NS))
    assert status == 200
    assert {f"{topic}-partition-{i}" for i in range(4)} <= set(listed)
    assert topic not in listed
    assert topic in (await run(lambda: call(env, "GET", f"{NS}/partitioned")))[1]

    status, body = await run(lambda: call(env, "DELETE", path))
    assert status == 409
    assert "/partitions" in body["reason"]
    assert await run(lambda: call(env, "DELETE", f"{path}/partitions?force=true")) == (
        204,
        None,
    )
    assert await run(lambda: call(env, "GET", f"{path}/partitions")) == (
        200,
        {"partitions": 0},
    )
    status, _ = await run(lambda: call(env, "DELETE", f"{path}/partitions"))
    assert status == 404
    assert topic not in (await run(lambda: call(env, "GET", f"{NS}/partitioned")))[1]


async def test_the_dedup_switch_applies_to_an_open_topic(env: Env) -> None:
    name = unique("dedup")
    topic = f"persistent://public/default/{name}"
    path = f"{NS}/{name}"
    status, _ = await run(lambda: call(env, "PUT", path, '{"team": "payments"}'))
    assert status == 204
    assert (await run(lambda: call(env, "PUT", path)))[0] == 409
    assert await run(lambda: call(env, "GET", f"{path}/deduplication")) == (200, None)
    # what applies with no switch of its own: the broker's setting, on by default
    assert await run(lambda: call(env, "GET", f"{path}/deduplication?applied=true")) == (
        200,
        True,
    )

    def switch(on: str) -> None:
        assert call(env, "POST", f"{path}/deduplication", on) == (204, None)
        assert call(env, "GET", f"{path}/deduplication") == (200, on == "true")

    def produce_twice_each() -> list[bytes]:
        client = pulsar_client(env.node, env.admin)
        try:
            producer = client.create_producer(
                topic, producer_name="payments-1", batching_enabled=False
            )
            producer.send(b"a", sequence_id=1)
            producer.send(b"b", sequence_id=1)  # stored: dedup is off
            switch("true")  # the topic reopens; the producer reconnects
            producer.send(b"c", sequence_id=2)
            producer.send(b"d", sequence_id=2)  # dropped: dedup is on
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            got = [reader.read_next(10_000).data() for _ in range(3)]
            assert not reader.has_message_available()
            return got
        finally:
            client.close()

    await run(lambda: switch("false"))
    assert await run(produce_twice_each) == [b"a", b"b", b"c"]
    status, stats = await run(lambda: call(env, "GET", f"{path}/stats"))
    assert status == 200
    assert stats["msgInCounter"] == 3
    assert await run(lambda: call(env, "DELETE", f"{path}/deduplication")) == (204, None)
    assert await run(lambda: call(env, "GET", f"{path}/deduplication")) == (200, None)
    status, body = await run(lambda: call(env, "DELETE", f"{path}/partitions"))
    assert status == 404
    assert "not partitioned" in body["reason"]
    assert await run(lambda: call(env, "DELETE", path)) == (204, None)
    assert (await run(lambda: call(env, "GET", f"{path}/stats")))[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("PUT", "/x/partitions", "three", 400, "could not be read as JSON"),
        ("PUT", "/x/partitions", '"3"', 400, "a JSON integer"),
        ("PUT", "/x/partitions", "3.0", 400, "a JSON integer"),
        ("PUT", "/x/partitions", "true", 400, "a JSON integer"),
        ("PUT", "/x/partitions", "1" * 5000, 400, "could not be read as JSON"),
        ("PUT", "/x/partitions", "[" * 16000, 400, "could not be read as JSON"),
        ("PUT", "/x/partitions", "0", 412, "from 1 to 10,000"),
        ("PUT", "/x/partitions", "-4", 412, "from 1 to 10,000"),
        ("PUT", "/x/partitions", "100001", 412, "from 1 to 10,000"),
        ("PUT", "/x", "[1]", 400, "JSON object of string properties"),
        ("POST", "/x/deduplication", "yes", 400, "true or false"),
        ("DELETE", "/x?force=maybe", None, 400, "force is true or false"),
        ("PATCH", "/x/partitions", "3", 405, "only GET, PUT, POST and DELETE"),
        ("POST", "/x/stats", "1", 405, "this path takes GET, not POST"),
        ("GET", "/x/stats", None, 404, "does not exist"),
        ("GET", "/x/subscriptions", None, 404, "no such topic call"),
        ("PUT", "/bad%20name", None, 400, "may only hold letters"),
        ("PUT", "/..%2F..%2Fx/partitions", "3", 400, "encoded '/'"),
        ("PUT", "/%2E%2E/partitions", "3", 400, "'.' or '..'"),
        ("PUT", "//partitions", "3", 400, "is empty"),
        ("PUT", "/x-partition-0/partitions", "3", 400, "partition"),
        ("DELETE", "/x-partition-0", None, 400, "partition"),
    ],
)
async def test_bad_requests_get_a_reason_and_the_port_goes_on(
    env: Env, method: str, path: str, body: str | None, status: int, says: str
) -> None:
    answer = await run(lambda: call(env, method, NS + path, body))
    assert answer[0] == status, answer
    # the HTTP server refuses some before the API sees them, in plain text
    reason = answer[1] if isinstance(answer[1], str) else answer[1]["reason"]
    assert says in reason, answer
    assert (await run(lambda: call(env, "GET", f"{NS}/x/partitions")))[1] == {"partitions": 0}


async def test_requests_the_http_server_refuses(env: Env) -> None:
    head = f"PUT {NS}/x/partitions HTTP/1.1\r\nHost: x\r\n"
    chunked = "Transfer-Encoding: chunked\r\n\r\n1\r\n3\r\n0\r\n\r\n"
    cases = [
        ((head + "\r\n3").encode(), 411, b"Content-Length"),
        ((head + "Content-Length: 20000\r\n\r\n").encode() + b"1" * 20000, 413, b"at most"),
        ((head + chunked).encode(), 411, b"chunked"),
        (b"GET /admin/v2/tenants HTTP/1.1\r\n\r\n", 404, b"no such admin path"),
        (b"GET /admin/v2/non-persistent/public/default HTTP/1.1\r\n\r\n", 501, b"persistent"),
    ]  # fmt: skip
    for request, status, says in cases:
        answer = await asyncio.to_thread(raw_request, env.node, request)
        assert answer[0] == status, answer
        assert says in answer[1]
    status, _ = await run(lambda: raw_request(env.node, b"GET /health HTTP/1.1\r\n\r\n"))
    assert status == 200
    status, metrics = await run(lambda: raw_request(env.node, b"GET /metrics HTTP/1.1\r\n\r\n"))
    assert status == 200
    assert b"# TYPE" in metrics


async def test_the_grpc_admin_service_tokens_and_roles_apply(env: Env) -> None:
    name = unique("guarded")
    path = f"{NS}/{name}"

    def check() -> None:
        for role in (None, "garbage", "forged"):
            status, body = call(env, "PUT", f"{path}/partitions", "2", role=role)
            assert status == 401, (status, body)
            assert env.tokens["forged"] not in body["reason"]
        status, body = call(env, "PUT", f"{path}/partitions", "2", role="nobody")
        assert status == 403
        assert "nobody" in body["reason"]
        assert call(env, "PUT", f"{path}/partitions", "2") == (204, None)
        assert call(env, "GET", f"{path}/partitions") == (200, {"partitions": 2})
        for method, where in (("GET", f"{path}/partitions"), ("GET", f"{path}/stats"),
                              ("GET", NS), ("POST", f"{path}/deduplication"),
                              ("DELETE", f"{path}/partitions")):  # fmt: skip
            body_text = "true" if method == "POST" else None
            status, body = call(env, method, where, body_text, role="nobody")
            assert status == 403, (method, where, status, body)
        client = pulsar_client(env.node, env.admin)
        try:
            producer = client.create_producer(f"persistent://public/default/{name}")
            producer.send(b"over REST-made partitions")
        finally:
            client.close()
        status, stats = call(env, "GET", f"{path}/partitioned-stats")
        assert status == 200
        assert stats["msgInCounter"] == 1
        assert call(env, "DELETE", f"{path}/partitions") == (204, None)

    await run(check)
    logged = env.log_path.read_text()
    for token in env.tokens.values():
        assert token not in logged
