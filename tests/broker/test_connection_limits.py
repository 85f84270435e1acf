"""Connections a client opens and never uses cannot lock other clients out (issue 23, finding
4): a connection that never speaks is closed after ``connection_handshake_timeout_ms``, no more
than ``max_connections`` are held at once, and a server raises its soft file limit at start."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Iterator

import pytest

from magnetar.aio import Client
from magnetar.common.errors import InvalidConfigError
from tests.broker.conftest import StartCluster, broker_config

HANDSHAKE_MS = 500
CAP = 40


@contextlib.contextmanager
def silent_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections to ``port`` that send nothing."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setblocking(False)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


async def closed_by_server(sock: socket.socket) -> bool:
    """Wait until the server closes ``sock`` (end of stream or a reset)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = await loop.sock_recv(sock, 4096)
        except ConnectionResetError:
            return True
        if not data:
            return True


async def round_trip(url: str, topic: str) -> bytes:
    async with Client(url, operation_timeout_s=30) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        await producer.send(b"through")
        message = await consumer.receive(timeout_millis=30_000)
        await consumer.acknowledge(message)
        return message.data()


async def test_silent_connections_are_dropped_and_the_cap_holds(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(
        bookies=3, max_connections=CAP, connection_handshake_timeout_ms=HANDSHAKE_MS
    )
    broker = cluster.brokers[0]
    # three times the cap: the cap's worth are held until the handshake deadline, the rest
    # refused as they come; either way the server closes every one of them
    with silent_connections(broker.port, 3 * CAP) as sockets:
        async with asyncio.timeout(60):  # a hang guard, not a measure
            closed = await asyncio.gather(*(closed_by_server(s) for s in sockets))
        assert all(closed)
        # and a real client gets through, while the silent sockets are still open on this side
        assert await round_trip(cluster.service_url, "limits-after") == b"through"


async def test_a_client_works_beside_connections_that_never_speak(
    start_cluster: StartCluster,
) -> None:
    """Many silent connections under the cap: they do not stand in the way at all."""
    cluster = await start_cluster(bookies=3, max_connections=CAP)
    with silent_connections(cluster.brokers[0].port, CAP // 2):
        assert await round_trip(cluster.service_url, "limits-beside") == b"through"


def test_a_server_raises_its_soft_file_limit() -> None:
    from magnetar.common.server.serving import raise_file_limit  # noqa: PLC0415

    soft, hard = raise_file_limit()
    assert (soft, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_connections", -1),
        ("max_connections_per_ip", -1),
        ("connection_handshake_timeout_ms", 10),
        ("max_connection_idle_ms", -5),
    ],
)
def test_bad_limits_are_refused_naming_the_setting(name: str, value: int) -> None:
    with pytest.raises(InvalidConfigError, match=name):
        broker_config(**{name: value})


async def test_connections_per_ip_are_capped_and_the_ones_in_use_go_on(
    start_cluster: StartCluster,
) -> None:
    """Two connections from 127.0.0.1 hold streams open; a call on a third is refused with
    UNAVAILABLE naming the address and the setting; the first two go on; once one closes its
    stream, the third gets through."""
    import grpc  # noqa: PLC0415
    import grpc.aio  # noqa: PLC0415

    from proto.broker.v1 import broker_pb2, broker_pb2_grpc  # noqa: PLC0415

    cluster = await start_cluster(bookies=3, max_connections_per_ip=2)
    target = f"127.0.0.1:{cluster.brokers[0].port}"
    # a subchannel pool of its own: each channel is a connection of its own
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(3)
    ]
    try:
        stubs = [broker_pb2_grpc.BrokerServiceStub(c) for c in channels]
        lookup = broker_pb2.LookupRequest(topic="per-ip")
        streams = [stubs[i].Produce() for i in range(2)]
        for stream in streams:  # the stream is open at the broker once it answers a lookup
            await stream.wait_for_connection()
        for stub in stubs[:2]:
            await stub.Lookup(lookup, timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs[2].Lookup(lookup, timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "too many connections from 127.0.0.1" in (refused.value.details() or "")
        assert "max_connections_per_ip = 2" in (refused.value.details() or "")
        await stubs[0].Lookup(lookup, timeout=30)  # a connection in use goes on
        streams[0].cancel()
        async with asyncio.timeout(30):  # a hang guard, not a measure
            while True:
                try:
                    await stubs[2].Lookup(lookup, timeout=30)
                    break
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    await asyncio.sleep(0.1)
    finally:
        for channel in channels:
            await channel.close()
