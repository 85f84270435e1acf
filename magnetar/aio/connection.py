"""Broker connections and topic lookups.

One gRPC channel per broker address, shared by every producer and consumer stream of the client
to that broker (HTTP/2 multiplexes them). A lookup may go to any broker: the pool tries the
service URL's brokers in turn, starting after the one that answered last, so a dead broker costs
one fast refusal and not a timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import grpc.aio

from magnetar.aio.backoff import Backoff
from magnetar.aio.config import ClientConfig
from magnetar.aio.names import TopicName, parse_broker_url, parse_service_url
from magnetar.common.errors import (
    ClientClosedError,
    MagnetarError,
    OperationTimeoutError,
    TopicLookupError,
)
from magnetar.common.grpc_errors import error_from_rpc_error
from magnetar.common.log import get_library_logger
from proto.broker.v1 import broker_pb2, broker_pb2_grpc

__all__ = ["ConnectionPool", "PartitionOwner", "TopicLookup", "is_transient"]

log = get_library_logger("magnetar.aio.connection", component="client")


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    partition_topic: str
    """``tenant/ns/topic-partition-N``, or the topic itself when it has no partitions."""
    partition: int
    """-1 for a non-partitioned topic."""
    address: str
    """gRPC target of the owning broker (``host:port``)."""
    broker_id: str


@dataclass(frozen=True, slots=True)
class TopicLookup:
    topic: str
    """The canonical topic name."""
    partitions: int
    """0 for a non-partitioned topic."""
    owners: tuple[PartitionOwner, ...]

    def owner_of(self, partition_topic: str) -> PartitionOwner | None:
        for owner in self.owners:
            if owner.partition_topic == partition_topic:
                return owner
        return None


def is_transient(error: MagnetarError) -> bool:
    """Whether a stream or call that failed with ``error`` is worth retrying.

    Errors rebuilt from a code say so themselves; a bare :class:`MagnetarError` is what a
    transport failure without a Magnetar code becomes (a broker killed mid-call: ``UNKNOWN``,
    ``INTERNAL``, ``CANCELLED``), and those are retried too.
    """
    return error.retriable or type(error) is MagnetarError


_GRPC_STATUS_TASK = "_handle_status_once_received"
_GRPC_TASKS_TIMEOUT_S = 1.0


class ConnectionPool:
    """Channels to brokers, and lookups over the service URL's brokers."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.service_targets = parse_service_url(config.service_url)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerServiceAsyncStub] = {}
        self._next_lookup = 0
        self._closed = False
        self._options = [
            ("grpc.max_receive_message_length", config.max_message_size_bytes),
            ("grpc.max_send_message_length", config.max_message_size_bytes),
            ("grpc.keepalive_time_ms", config.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", config.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # a restarted broker must be found again quickly, not after gRPC's default 2 minutes
            ("grpc.initial_reconnect_backoff_ms", config.initial_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", config.initial_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", config.max_backoff_ms),
        ]

    @property
    def closed(self) -> bool:
        return self._closed

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to the broker at ``address`` (``host:port``), opened once."""
        if self._closed:
            raise ClientClosedError("the client was closed")
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=self._options)
            self._channels[address] = channel
        return channel

    def stub(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        """The broker-service stub for the broker at ``address``."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = broker_pb2_grpc.BrokerServiceStub(self.channel(address))
            self._stubs[address] = stub
        return stub

    async def lookup(self, topic: str, *, timeout_s: float | None = None) -> TopicLookup:
        """Who owns each partition of ``topic``, asked of the service URL's brokers in turn.

        A broker that cannot be reached, or answers with a retriable error, passes the question
        to the next one. A non-retriable answer (no such topic, a bad name) is raised at once;
        when every broker failed, :class:`TopicLookupError` (retriable) names the last cause.
        """
        per_call_s = self.config.connection_timeout_ms / 1000
        if timeout_s is not None:
            per_call_s = min(per_call_s, timeout_s)
        targets = self.service_targets
        last: MagnetarError | None = None
        for attempt in range(len(targets)):
            index = (self._next_lookup + attempt) % len(targets)
            address = targets[index]
            try:
                response = await self.stub(address).Lookup(
                    broker_pb2.LookupRequest(topic=topic), timeout=per_call_s
                )
            except grpc.aio.AioRpcError as e:
                error = error_from_rpc_error(e, address)
                if not is_transient(error):
                    raise error from None
                log.debug("lookup_failed", broker=address, topic=topic, error=repr(error))
                last = error
                continue
            self._next_lookup = index
            return self._to_lookup(response)
        self._next_lookup = (self._next_lookup + 1) % len(targets)
        raise TopicLookupError(
            f"no broker of {self.config.service_url} could look up {topic!r}: {last}. Check"
            " that a broker runs there (for a quick start: magnetar standalone) and that the"
            " service URL names its host and port",
            context={"topic": topic, "service_url": self.config.service_url},
        )

    async def lookup_until_found(self, topic: str, timeout_s: float) -> TopicLookup:
        """:meth:`lookup`, retried with backoff while the failure is retriable, for up to
        ``timeout_s``; then :class:`OperationTimeoutError` naming the last problem."""
        backoff = Backoff(self.config.initial_backoff_ms, self.config.max_backoff_ms)
        last: MagnetarError | None = None
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        return await self.lookup(topic)
                    except MagnetarError as e:
                        if not is_transient(e):
                            raise
                        last = e
                    await asyncio.sleep(backoff.next_delay_s())
        except TimeoutError:
            raise OperationTimeoutError(
                f"could not look up {topic!r} within {timeout_s} s (last problem: {last})",
                context={"topic": topic, "timeout_s": timeout_s},
            ) from None

    async def partitions_of(self, topic: TopicName, timeout_s: float) -> list[tuple[str, int]]:
        """``(partition_topic, partition)`` for each partition a producer or consumer of
        ``topic`` serves: every partition, the topic itself (partition -1) when it has none, or
        the one partition a ``topic-partition-N`` name picks."""
        if topic.is_partition:
            return [(topic.full, topic.partition)]
        lookup = await self.lookup_until_found(topic.full, timeout_s)
        if lookup.partitions == 0:
            only = lookup.owners[0].partition_topic if lookup.owners else lookup.topic
            return [(only or topic.full, -1)]
        if len(lookup.owners) != lookup.partitions:
            raise TopicLookupError(
                f"the lookup of {topic} names {len(lookup.owners)} owners for"
                f" {lookup.partitions} partitions",
                context={"topic": topic.full},
            )
        return [(o.partition_topic, o.partition) for o in lookup.owners]

    @staticmethod
    def _to_lookup(response: broker_pb2.LookupResponse) -> TopicLookup:
        owners = tuple(
            PartitionOwner(
                partition_topic=o.partition_topic,
                partition=o.partition,
                address=parse_broker_url(o.broker_url),
                broker_id=o.broker_id,
            )
            for o in response.owners
        )
        return TopicLookup(response.topic, response.partitions, owners)

    async def close(self) -> None:
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        await _grpc_call_tasks_done()


async def _grpc_call_tasks_done() -> None:
    """Let gRPC's per-call status tasks finish (up to a second). A program that ends right
    after closing the client (``asyncio.run``) would otherwise close the loop with one still
    queued, and asyncio prints "Task was destroyed but it is pending"."""
    current = asyncio.current_task()
    pending = [
        task
        for task in asyncio.all_tasks()
        if task is not current
        and getattr(task.get_coro(), "__qualname__", "").endswith(_GRPC_STATUS_TASK)
    ]
    if pending:
        await asyncio.wait(pending, timeout=_GRPC_TASKS_TIMEOUT_S)
