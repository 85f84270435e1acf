"""Broker connections and topic lookups.

One gRPC channel per broker address, shared by every producer and consumer stream of the client
to that broker (HTTP/2 multiplexes them). A lookup may go to any broker: the pool tries the
service URL's brokers in turn, starting after the one that answered last, so a dead broker costs
one fast refusal and not a timeout.

With a ``magnetar+ssl://`` service URL every channel is TLS, checked before it opens
(:func:`magnetar.common.security.tls.open_secure_channel`: an untrusted certificate is a
:class:`TlsError` at once, not a retried ``UNAVAILABLE``), and lookups answer with the owners'
TLS addresses. Credentials (:mod:`magnetar.aio.auth`) go on every call: unary calls get them
from an interceptor on the channel, streams from :meth:`ConnectionPool.call_metadata` when they
open.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from magnetar.aio.auth import Authentication
from magnetar.aio.backoff import Backoff
from magnetar.aio.config import ClientConfig
from magnetar.aio.names import TopicName, parse_broker_url, parse_service_url, uses_tls
from magnetar.common.errors import (
    ClientClosedError,
    InvalidArgumentError,
    InvalidServiceUrlError,
    MagnetarError,
    OperationTimeoutError,
    TopicLookupError,
)
from magnetar.common.grpc_errors import error_from_rpc_error
from magnetar.common.log import get_library_logger
from magnetar.common.security.tls import ClientTls, open_secure_channel
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
AUTHORIZATION_HEADER = "authorization"


class _CallCredentials(grpc.aio.UnaryUnaryClientInterceptor):
    """Puts the client's credentials on every unary call (lookups, admin calls)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        metadata = await self._pool.call_metadata()
        if metadata:
            client_call_details = client_call_details._replace(
                metadata=[*(client_call_details.metadata or ()), *metadata]
            )
        return await continuation(client_call_details, request)


class ConnectionPool:
    """Channels to brokers, and lookups over the service URL's brokers."""

    def __init__(self, config: ClientConfig, authentication: Authentication | None = None) -> None:
        self.config = config
        self.service_targets = parse_service_url(config.service_url)
        self.tls = uses_tls(config.service_url)
        if authentication is not None and not isinstance(authentication, Authentication):
            raise InvalidArgumentError(
                "authentication is magnetar.AuthenticationToken(...) or"
                f" magnetar.AuthenticationTLS(...), got {type(authentication).__name__}"
            )
        self.authentication = authentication
        certificate = authentication.certificate if authentication is not None else None
        if certificate is None and config.tls_certificate_file_path is not None:
            assert config.tls_private_key_file_path is not None  # the config checks the pair
            certificate = (
                Path(config.tls_certificate_file_path),
                Path(config.tls_private_key_file_path),
            )
        if certificate is not None and not self.tls:
            raise InvalidArgumentError(
                "a client certificate is presented on TLS connections: use a"
                f" magnetar+ssl:// service URL, not {config.service_url!r}"
            )
        self._tls = ClientTls(
            trust_certs_file=Path(config.tls_trust_certs_file_path)
            if config.tls_trust_certs_file_path
            else None,
            validate_hostname=config.tls_validate_hostname,
            cert_file=certificate[0] if certificate else None,
            key_file=certificate[1] if certificate else None,
        )
        self._interceptors = [_CallCredentials(self)] if authentication is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._opening: dict[str, asyncio.Task[grpc.aio.Channel]] = {}
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

    async def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The credentials to put on a call or stream opened now (the token supplier is asked
        each time)."""
        if self.authentication is None:
            return None
        token = await self.authentication.token()
        return None if token is None else ((AUTHORIZATION_HEADER, f"Bearer {token}"),)

    async def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to the broker at ``address`` (``host:port``), opened once: over TLS
        (checked first) with a ``magnetar+ssl://`` service URL."""
        if self._closed:
            raise ClientClosedError("the client was closed")
        channel = self._channels.get(address)
        if channel is not None:
            return channel
        if not self.tls:
            channel = grpc.aio.insecure_channel(
                address, options=self._options, interceptors=self._interceptors
            )
        else:
            opening = self._opening.get(address)
            if opening is None:
                opening = asyncio.create_task(
                    open_secure_channel(
                        address,
                        self._tls,
                        self._options,
                        timeout_s=self.config.connection_timeout_ms / 1000,
                        interceptors=self._interceptors,
                    ),
                    name=f"tls:{address}",
                )
                self._opening[address] = opening
                opening.add_done_callback(lambda _: self._opening.pop(address, None))
            channel = await asyncio.shield(opening)
            if self.closed:
                await channel.close()
                raise ClientClosedError("the client was closed")
        return self._channels.setdefault(address, channel)

    async def stub(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        """The broker-service stub for the broker at ``address``."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = broker_pb2_grpc.BrokerServiceStub(await self.channel(address))
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
                stub = await self.stub(address)
                response = await stub.Lookup(
                    broker_pb2.LookupRequest(topic=topic), timeout=per_call_s
                )
            except grpc.aio.AioRpcError as e:
                error = error_from_rpc_error(e, address)
                if not is_transient(error):
                    raise error from None
                log.debug("lookup_failed", broker=address, topic=topic, error=repr(error))
                last = error
                continue
            except MagnetarError as error:
                # the TLS check of a new channel: an untrusted broker is final, an
                # unreachable one is the next broker's turn
                if not is_transient(error):
                    raise
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

    def _to_lookup(self, response: broker_pb2.LookupResponse) -> TopicLookup:
        owners = tuple(
            PartitionOwner(
                partition_topic=o.partition_topic,
                partition=o.partition,
                address=self._owner_address(o),
                broker_id=o.broker_id,
            )
            for o in response.owners
        )
        return TopicLookup(response.topic, response.partitions, owners)

    def _owner_address(self, owner: broker_pb2.PartitionOwner) -> str:
        url = owner.broker_url_tls if self.tls else owner.broker_url
        if not url:
            kind, other = ("TLS", "magnetar://") if self.tls else ("plaintext", "magnetar+ssl://")
            raise InvalidServiceUrlError(
                f"broker {owner.broker_id}, the owner of {owner.partition_topic}, has no {kind}"
                f" listener; connect with a {other} service URL",
                context={"broker": owner.broker_id},
            )
        return parse_broker_url(url)

    async def close(self) -> None:
        self._closed = True
        for opening in list(self._opening.values()):
            opening.cancel()
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
