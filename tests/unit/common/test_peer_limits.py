"""The per-address connection bound, on gRPC's peer strings."""

from __future__ import annotations

from typing import Any

import pytest

from magnetar.common.errors import ServiceUnavailableError
from magnetar.common.peer_limits import ConnectionsPerIp, split_peer


@pytest.mark.parametrize(
    ("peer", "split"),
    [
        ("ipv4:10.0.0.1:5432", ("10.0.0.1", "5432")),
        ("ipv6:[::1]:5432", ("[::1]", "5432")),
        ("ipv6:[2001:db8::7]:80", ("[2001:db8::7]", "80")),
        ("unix:/tmp/sock", None),
        ("ipv4:", None),
        ("", None),
    ],
)
def test_split_peer(peer: str, split: tuple[str, str] | None) -> None:
    assert split_peer(peer) == split


def test_connections_over_the_bound_are_refused_and_released_ones_make_room() -> None:
    limits = ConnectionsPerIp(2)
    assert limits.admit("ipv4:10.0.0.1:1")
    assert limits.admit("ipv4:10.0.0.1:1")  # a second call on the same connection
    assert limits.admit("ipv4:10.0.0.1:2")
    assert limits.admit("ipv4:10.0.0.2:1")  # another address has its own count
    with pytest.raises(ServiceUnavailableError, match=r"too many connections from 10\.0\.0\.1"):
        limits.admit("ipv4:10.0.0.1:3")
    assert limits.refused == 1
    limits.release("ipv4:10.0.0.1:1")
    assert limits.connections("10.0.0.1") == 2  # one call still open on it
    limits.release("ipv4:10.0.0.1:1")
    assert limits.connections("10.0.0.1") == 1
    assert limits.admit("ipv4:10.0.0.1:3")
    for peer in ("ipv4:10.0.0.1:2", "ipv4:10.0.0.1:3", "ipv4:10.0.0.2:1"):
        limits.release(peer)
    assert limits.connections("10.0.0.1") == limits.connections("10.0.0.2") == 0
    limits.release("ipv4:10.0.0.9:1")  # never counted: nothing happens


def test_no_bound_and_peers_without_an_address_are_not_counted() -> None:
    assert not ConnectionsPerIp(0).admit("ipv4:10.0.0.1:1")
    assert not ConnectionsPerIp(1).admit("unix:/tmp/sock")


class EndingContext:
    """A servicer context whose ``peer()`` must not be called once its call has ended: on a real
    ended call, gRPC's C core dereferences the freed call and the process dies of SIGSEGV."""

    def __init__(self) -> None:
        self.ended = False
        self.peers_read = 0

    def peer(self) -> str:
        assert not self.ended, "context.peer() on an ended call (SIGSEGV in grpc's cygrpc)"
        self.peers_read += 1
        return "ipv4:10.0.0.1:5000"


async def test_the_per_ip_count_never_reads_the_peer_of_an_ended_call() -> None:
    import grpc  # noqa: PLC0415

    from magnetar.common.grpc_decoding import RequestDecoding  # noqa: PLC0415
    from proto.broker.v1 import broker_pb2  # noqa: PLC0415

    limits = ConnectionsPerIp(4)
    decoding = RequestDecoding(
        [broker_pb2.DESCRIPTOR.services_by_name["BrokerService"]], per_ip=limits
    )
    context = EndingContext()

    async def produce(requests: object, ctx: EndingContext) -> object:
        try:
            async for _ in requests:  # type: ignore[attr-defined]
                yield broker_pb2.ProduceResponse()
        finally:
            ctx.ended = True  # what follows the handler's end runs on an ended call

    async def lookup(request: object, ctx: EndingContext) -> object:
        ctx.ended = True
        return broker_pb2.LookupResponse()

    async def requests() -> object:
        yield broker_pb2.ProduceRequest()

    stream = decoding._wrap(
        "/magnetar.broker.v1.BrokerService/Produce",
        grpc.stream_stream_rpc_method_handler(produce),
        lambda data: data,
    )
    stream_stream: Any = stream.stream_stream
    answers = [a async for a in stream_stream(requests(), context)]
    assert len(answers) == 1
    unary = decoding._wrap(
        "/magnetar.broker.v1.BrokerService/Lookup",
        grpc.unary_unary_rpc_method_handler(lookup),
        lambda data: data,
    )
    context = EndingContext()
    unary_unary: Any = unary.unary_unary
    await unary_unary(broker_pb2.LookupRequest(), context)
    assert context.peers_read == 1  # once, as the call was admitted
    assert limits.connections("10.0.0.1") == 0  # and released under that peer
