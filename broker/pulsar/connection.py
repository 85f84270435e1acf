"""One client connection speaking Pulsar's binary protocol: commands in, service calls, answers.

A second adapter beside ``broker/grpc/`` over the same service (:class:`Broker`,
:class:`Topic`, :class:`ConsumerSession`): lookups, ownership, deduplication, dispatch,
authentication and authorization are the service's, as for Magnetar's own clients.

The first frame must be CONNECT; the answer is CONNECTED with the lower of the client's and
this broker's protocol version, and nothing is sent that this version does not have. A frame
that breaks the format, one over the maximum size, a command before CONNECT or a SEND for a
producer the connection does not have closes this connection only. A request that fails is
answered in its own response command (PARTITIONED_METADATA_RESPONSE, LOOKUP_RESPONSE,
SEND_ERROR, ACK_RESPONSE) or with an ERROR carrying its request id (PRODUCER, SUBSCRIBE,
CLOSE_*, UNSUBSCRIBE), which is what the client waits for.

Requests that wait on the metadata store or a partition (lookups, PRODUCER, SUBSCRIBE,
UNSUBSCRIBE) run as tasks, so that one slow lookup does not hold up the connection's other
producers and consumers; SEND, FLOW, ACK and the like are applied in the order they came.
Receipts of a producer go out in the order of its sends. Each consumer has a task writing its
deliveries, and it waits for the socket to take them before the next (back-pressure: the
subscription's dispatcher stops reading for a consumer whose bytes are not taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from broker.managed_ledger import Position
from broker.pulsar.codec import (
    Frame,
    decode_frame,
    encode_command,
    encode_payload_command,
    sub_message,
)
from broker.pulsar.entries import (
    UnsupportedFeatureError,
    broker_entry_metadata,
    incoming_batch,
    last_batch_index,
    pulsar_metadata_and_payload,
)
from broker.pulsar.errors import server_error
from broker.service.authorization import TopicAction
from broker.service.broker import Broker
from broker.service.streams import (
    AckDone,
    ActiveChange,
    AuthChallenge,
    ClientDone,
    Deliveries,
    MessageIdStart,
    Receipt,
    RequestFailed,
    SeekDone,
    Start,
    StreamClosed,
    SubscribeRequest,
    SubscriptionType,
    TimeStart,
)
from broker.service.subscription import ConsumerSession
from broker.service.topic import AccessMode, ProducerSession, Topic
from broker.service.validation import BatchLimits, check_name
from magnetar.common.errors import (
    AuthenticationError,
    InternalError,
    InvalidArgumentError,
    MagnetarError,
    ProtocolError,
    ServiceNotReadyError,
    ShuttingDownError,
    SubscriptionBusyError,
    TopicNotOwnedError,
)
from magnetar.common.framing import FrameError, FrameReader
from magnetar.common.names import TopicName, parse_namespace, parse_topic
from magnetar.common.security.authentication import Credentials, Principal
from magnetar.common.security.config import AUTHENTICATION_PROVIDERS
from proto.pulsar import PulsarApi_pb2 as api

log = structlog.get_logger("magnetar.broker.pulsar")

Base = api.BaseCommand

PROTOCOL_VERSION = 19
"""The newest protocol version of the vendored ``PulsarApi.proto`` (``v19``): CONNECTED
answers the lower of this and the client's."""
FRAME_PADDING = 10 * 1024
"""Room for a SEND's command and metadata beyond the message (Pulsar's
``Commands.MESSAGE_SIZE_FRAME_PADDING``)."""
MIN_PROTOCOL_VERSION = 6
"""The oldest client this broker serves: v6 added the checksum that every MESSAGE carries (and
v5 the CLOSE_PRODUCER and CLOSE_CONSUMER a broker sends)."""
ACTIVE_CONSUMER_CHANGE_VERSION = 12
AUTH_CHALLENGE_VERSION = 14
"""v14 added AUTH_CHALLENGE and AUTH_RESPONSE: an older client is disconnected, not
challenged, when its token expires."""
REFRESH_AUTH_DATA = b"PulsarAuthRefresh"
"""What Pulsar's broker puts in the AUTH_CHALLENGE that asks for fresh credentials
(``AuthData.REFRESH_AUTH_DATA``); clients answer with their current token whatever it holds."""
ACK_RESPONSE_VERSION = 17
BROKER_ENTRY_METADATA_VERSION = 18
LATEST_ID = 2**63 - 1
"""A reader's start id of ``MessageId.latest``: (Long.MAX_VALUE, Long.MAX_VALUE)."""
EARLIEST_ID = 2**64 - 1
"""A reader's start id of ``MessageId.earliest``: (-1, -1), read as uint64."""

_SUBSCRIPTION_TYPES = {
    api.CommandSubscribe.Exclusive: SubscriptionType.EXCLUSIVE,
    api.CommandSubscribe.Shared: SubscriptionType.SHARED,
    api.CommandSubscribe.Failover: SubscriptionType.FAILOVER,
    api.CommandSubscribe.Key_Shared: SubscriptionType.KEY_SHARED,
}
_ACCESS_MODES = {
    api.Shared: AccessMode.SHARED,
    api.Exclusive: AccessMode.EXCLUSIVE,
    api.WaitForExclusive: AccessMode.WAIT_FOR_EXCLUSIVE,
    api.ExclusiveWithFencing: AccessMode.EXCLUSIVE_WITH_FENCING,
}
# errors after which a producer's client must look the partition up again and resend
_MOVED = (TopicNotOwnedError, ServiceNotReadyError, ShuttingDownError)

_ids = itertools.count(1)

CLIENT_COMMANDS = frozenset(
    {
        Base.CONNECT, Base.SUBSCRIBE, Base.PRODUCER, Base.SEND, Base.ACK, Base.FLOW,
        Base.UNSUBSCRIBE, Base.CLOSE_PRODUCER, Base.CLOSE_CONSUMER, Base.PING, Base.PONG,
        Base.REDELIVER_UNACKNOWLEDGED_MESSAGES, Base.PARTITIONED_METADATA, Base.LOOKUP,
        Base.CONSUMER_STATS, Base.SEEK, Base.GET_LAST_MESSAGE_ID, Base.GET_TOPICS_OF_NAMESPACE,
        Base.GET_SCHEMA, Base.AUTH_RESPONSE, Base.GET_OR_CREATE_SCHEMA, Base.NEW_TXN,
        Base.ADD_PARTITION_TO_TXN, Base.ADD_SUBSCRIPTION_TO_TXN, Base.END_TXN,
        Base.END_TXN_ON_PARTITION, Base.END_TXN_ON_SUBSCRIPTION, Base.TC_CLIENT_CONNECT_REQUEST,
        Base.WATCH_TOPIC_LIST, Base.WATCH_TOPIC_LIST_CLOSE,
    }
)  # fmt: skip
"""The commands a client sends a broker (the others are a broker's, or a proxy's)."""

Handler = Callable[[Frame], Awaitable[None]]


def _command(kind: int, **sub: Any) -> Base:
    return Base(type=kind, **sub)  # type: ignore[arg-type]


def _when(ms: int | None) -> str:
    return datetime.fromtimestamp((ms or 0) / 1000, UTC).isoformat(timespec="seconds")


def _message_id(position: Position, partition: int) -> api.MessageIdData:
    return api.MessageIdData(
        ledgerId=position.ledger_id, entryId=position.entry_id, partition=partition
    )


def _position(message_id: api.MessageIdData) -> Position:
    if message_id.ledgerId >= LATEST_ID or message_id.entryId >= LATEST_ID:
        raise InvalidArgumentError(
            f"message id ({message_id.ledgerId}, {message_id.entryId}) is not a stored entry"
        )
    return Position(message_id.ledgerId, message_id.entryId)


def _start_at(message_id: api.MessageIdData) -> Start:
    """Where a reader's start id or a seek's message id points: ``MessageId.earliest`` and
    ``latest`` by their markers, else the id's entry, delivered whole and inclusively (the
    client filters what it does not want of it)."""
    if message_id.ledgerId == EARLIEST_ID:
        return "earliest"
    if message_id.ledgerId >= LATEST_ID:
        return "latest"
    return MessageIdStart(message_id.ledgerId, message_id.entryId)


def ack_set_words(indexes: tuple[int, ...]) -> list[int]:
    """Java's ``BitSet.toLongArray()`` of ``indexes``, as signed 64-bit words: Pulsar's
    ``ack_set``, whose set bits are the messages of a batch still to be acknowledged."""
    if not indexes:
        return []
    words = [0] * (max(indexes) // 64 + 1)
    for index in indexes:
        words[index // 64] |= 1 << (index % 64)
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]


def ack_set_indexes(words: list[int], batch_size: int) -> tuple[int, ...]:
    """The batch indexes an ``ack_set`` marks acknowledged: its clear bits below ``batch_size``."""
    unsigned = [w & ((1 << 64) - 1) for w in words]

    def still_unacked(i: int) -> bool:
        return i // 64 < len(unsigned) and bool(unsigned[i // 64] >> (i % 64) & 1)

    return tuple(i for i in range(batch_size) if not still_unacked(i))


@dataclass(eq=False)
class _Producer:
    producer_id: int
    session: ProducerSession
    topic: Topic
    inflight: deque[tuple[int, int, asyncio.Future[Receipt]]] = field(default_factory=deque)
    """``(sequence_id, highest_sequence_id, receipt)`` in the order of the sends."""
    room: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Consumer:
    consumer_id: int
    session: ConsumerSession
    topic: Topic
    writer: asyncio.Future[object] | None = None
    seek_target: Start | None = None


class PulsarConnection:
    """One client's TCP connection; :meth:`run` serves it until either side ends it."""

    def __init__(
        self,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame_size: int,
        tls: bool = False,
    ) -> None:
        self.broker = broker
        self._reader = reader
        self._writer = writer
        self._max_frame_size = max_frame_size
        host, port = (writer.get_extra_info("peername") or ("?", 0))[:2]
        self.peer = f"ipv4:{host}:{port}"
        self.tls = tls
        """Whether the client came over TLS: its lookups answer the owners' TLS listeners."""
        self.protocol_version = 0
        self._entry_metadata = False
        self.principal: Principal | None = None
        self._auth_refresh = False
        """The client said it answers AUTH_CHALLENGE (feature flag ``supports_auth_refresh``)."""
        self._expiry: asyncio.TimerHandle | None = None
        self._refresh_deadline: asyncio.TimerHandle | None = None
        self.auth_challenges = 0
        self.auth_refreshes = 0
        self.producers: dict[int, _Producer] = {}
        self.consumers: dict[int, _Consumer] = {}
        self._pending_producers: set[int] = set()
        self._waiting_producers: dict[int, ProducerSession] = {}
        """WaitForExclusive producers queued for their topic, until they get it."""
        self._abandoned_producers: set[int] = set()
        """Producers the client closed while they were being opened: dropped once open."""
        self._closed_producers: set[int] = set()
        """Ids of producers that were open on this connection: a late SEND is not an error."""
        self._pending_consumers: set[int] = set()
        self._seek_targets: dict[int, Start] = {}
        """Where a reader seeked to, for the SUBSCRIBE that follows the seek's CLOSE_CONSUMER
        (the reader's non-durable subscription ends with that close)."""
        self._tasks: set[asyncio.Task[object]] = set()
        self._closing = False
        self._closer: asyncio.Future[None] | None = None
        config = broker.config
        self._limits = BatchLimits(
            max_message_bytes=config.max_message_bytes, max_messages=config.max_messages_per_batch
        )
        self._handlers: dict[int, Handler] = {
            Base.CONNECT: self._connect_again,
            Base.PING: self._ping,
            Base.PONG: self._pong,
            Base.AUTH_RESPONSE: self._auth_response,
            Base.PARTITIONED_METADATA: self._spawned(self._partitioned_metadata),
            Base.LOOKUP: self._spawned(self._lookup),
            Base.GET_TOPICS_OF_NAMESPACE: self._spawned(self._topics_of_namespace),
            Base.GET_SCHEMA: self._get_schema,
            Base.PRODUCER: self._spawned(self._producer),
            Base.SEND: self._send,
            Base.CLOSE_PRODUCER: self._close_producer,
            Base.SUBSCRIBE: self._spawned(self._subscribe),
            Base.FLOW: self._flow,
            Base.ACK: self._ack,
            Base.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._redeliver,
            Base.CLOSE_CONSUMER: self._close_consumer,
            Base.UNSUBSCRIBE: self._spawned(self._unsubscribe),
            Base.GET_LAST_MESSAGE_ID: self._spawned(self._last_message_id),
            Base.SEEK: self._spawned(self._seek),
        }

    # --- the connection ---------------------------------------------------------------------------

    async def run(self) -> None:
        frames = FrameReader(self._reader, max_frame_size=self._max_frame_size, name="Pulsar frame")
        try:
            first = await frames.read_frame()
            if first is None:
                return
            await self._connect(decode_frame(first))
            async for body in frames:
                frame = decode_frame(body)
                await self._handler(frame)(frame)
        except (FrameError, ProtocolError, AuthenticationError) as e:
            # names what was wrong; never a secret (auth data is not in any message)
            log.info("pulsar_connection_refused", peer=self.peer, error=e.message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("pulsar_connection_failed", peer=self.peer)
        finally:
            await self.close()

    def _handler(self, frame: Frame) -> Handler:
        handler = self._handlers.get(int(frame.type))
        if handler is not None:
            return handler
        if frame.type not in CLIENT_COMMANDS:
            raise ProtocolError(f"{frame.type_name} is not a command a client sends to a broker")
        return self._unsupported

    async def _unsupported(self, frame: Frame) -> None:
        """A client's command this broker does not serve yet: refused in an ERROR carrying its
        request id when it has one (the client fails that request and goes on), else ignored."""
        request = sub_message(frame.command)
        message = (
            f"{frame.type_name} is not supported by this broker yet (see pulsar-compatibility)"
        )
        if "request_id" in request.DESCRIPTOR.fields_by_name:
            self._error(
                getattr(request, "request_id"),  # noqa: B009 - not every sub-message has it
                UnsupportedFeatureError(message),
            )
        else:
            log.info("pulsar_command_unsupported", command=frame.type_name, peer=self.peer)

    async def close(self) -> None:
        """End the connection: its producers and consumers leave their partitions."""
        if self._closing:
            return
        self._closing = True
        self._cancel_auth_timers()
        for producer in list(self.producers.values()):
            self._drop_producer(producer)
        for consumer in list(self.consumers.values()):
            self._drop_consumer(consumer)
        for task in list(self._tasks):
            task.cancel()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    def _write(self, command: Base) -> None:
        if not self._closing and not self._writer.is_closing():
            self._writer.write(encode_command(command))

    def _spawn(self, coro: Awaitable[object]) -> asyncio.Future[object]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future[object]) -> None:
        """A request's task or a consumer's writer ended: one that failed unexpectedly leaves
        a request unanswered or a consumer without deliveries, so the connection is closed
        (the client reconnects and asks again)."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        if isinstance(error, (ConnectionError, OSError)):
            log.info("pulsar_connection_lost", peer=self.peer, error=repr(error))
        else:
            log.error("pulsar_request_failed", peer=self.peer, error=repr(error), exc_info=error)
        if not self._closing:
            self._closer = asyncio.ensure_future(self.close())

    def _spawned(self, handler: Handler) -> Handler:
        async def spawn(frame: Frame) -> None:
            self._spawn(handler(frame))

        return spawn

    async def _connect(self, frame: Frame) -> None:
        if frame.type != Base.CONNECT:
            raise ProtocolError(
                f"the first command on a connection is CONNECT, not {frame.type_name}"
            )
        connect = frame.command.connect
        try:
            self.principal = self._authenticate(connect)
        except AuthenticationError as e:
            await self._refuse_authentication(e)
            raise
        if connect.protocol_version < MIN_PROTOCOL_VERSION:
            self._write(
                _command(
                    Base.ERROR,
                    error=api.CommandError(
                        request_id=0,
                        error=api.UnsupportedVersionError,
                        message=f"protocol version {connect.protocol_version} is older than the"
                        f" {MIN_PROTOCOL_VERSION} this broker speaks (checksummed payloads)",
                    ),
                )
            )
            await self._writer.drain()
            raise ProtocolError(f"a client of protocol version {connect.protocol_version}")
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION)
        # PIP-70's broker entry metadata (the offset) on MESSAGE, for clients that ask for it
        self._entry_metadata = (
            self.protocol_version >= BROKER_ENTRY_METADATA_VERSION
            and connect.feature_flags.supports_broker_entry_metadata
        )
        self._auth_refresh = (
            self.protocol_version >= AUTH_CHALLENGE_VERSION
            and connect.feature_flags.supports_auth_refresh
        )
        self._write(
            _command(
                Base.CONNECTED,
                connected=api.CommandConnected(
                    server_version=f"Magnetar {self.broker.version}".strip(),
                    protocol_version=self.protocol_version,
                    max_message_size=self.broker.config.max_message_bytes,
                ),
            )
        )
        self._schedule_expiry()
        log.info(
            "pulsar_client_connected",
            peer=self.peer,
            client=connect.client_version,
            protocol_version=self.protocol_version,
            tls=self.tls,
            role=self.principal.role or None,
            auth_method=self.principal.method,
        )

    def _authenticate(self, connect: api.CommandConnect) -> Principal:
        """The principal of a CONNECT: ``token`` takes the JWT in ``auth_data``, ``tls`` the
        common name of the client certificate the TLS handshake verified; no method, the
        certificate when there is one (as on the gRPC ports)."""
        security = self.broker.security
        if not security.authentication_enabled:
            return security.authenticate(Credentials(self.peer))
        method = connect.auth_method_name if connect.HasField("auth_method_name") else ""
        authentication = security.authentication
        if method not in ("", "none", *AUTHENTICATION_PROVIDERS):
            raise authentication.refuse(
                AuthenticationError,
                "method_not_enabled",
                self.peer,
                f"authentication method {method[:64]!r} is not accepted here; use"
                f" {' or '.join(sorted(authentication.providers))} authentication",
            )
        if method and method != "none" and method not in authentication.providers:
            raise authentication.refuse(
                AuthenticationError,
                "method_not_enabled",
                self.peer,
                f"authentication method {method!r} is not enabled on this broker (authentication"
                f" providers: {', '.join(sorted(authentication.providers))})",
            )
        common_name = self._certificate_common_name()
        if method == "token":
            return security.authenticate(
                Credentials(self.peer, connect.auth_data.decode("utf-8", "replace"))
            )
        if method == "tls" and common_name is None:
            raise authentication.refuse(
                AuthenticationError,
                "no_credentials",
                self.peer,
                "authentication method 'tls' needs a client certificate verified by the TLS"
                " handshake: "
                + (
                    "this connection presented none"
                    if self.tls
                    else "this connection is plaintext (connect to the pulsar+ssl:// URL)"
                ),
            )
        return security.authenticate(Credentials(self.peer, None, common_name))

    def _certificate_common_name(self) -> str | None:
        """The common name of the client certificate the TLS handshake verified ("" for one
        without a common name), or None when none was presented or verified."""
        if not self.tls:
            return None
        peercert = self._writer.get_extra_info("peercert")
        if not peercert:
            return None  # no trust file (no client certificate asked for), or none given
        for rdn in peercert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return ""

    async def _refuse_authentication(self, error: AuthenticationError) -> None:
        """ERROR (AuthenticationError) with what was wrong and never the secret; the caller
        then closes the connection, as Pulsar's broker does."""
        self._write(
            _command(
                Base.ERROR,
                error=api.CommandError(
                    request_id=0, error=api.AuthenticationError, message=error.message
                ),
            )
        )
        await self._writer.drain()

    # --- refreshing expired credentials (AUTH_CHALLENGE) ------------------------------------------

    def _schedule_expiry(self) -> None:
        """Challenge the client when its token expires (Pulsar checks every
        ``authenticationRefreshCheckSeconds``; this broker acts at the expiry itself)."""
        self._cancel_auth_timers()
        principal = self.principal
        if principal is None or principal.expires_at_ms is None or self._closing:
            return
        delay_s = max(0.0, principal.expires_at_ms / 1000 - time.time())
        self._expiry = asyncio.get_running_loop().call_later(delay_s, self._credentials_expired)

    def _cancel_auth_timers(self) -> None:
        for handle in (self._expiry, self._refresh_deadline):
            if handle is not None:
                handle.cancel()
        self._expiry = self._refresh_deadline = None

    def _credentials_expired(self) -> None:
        self._expiry = None
        assert self.principal is not None
        if not self._auth_refresh:
            # as Pulsar's broker: a client that cannot be challenged is disconnected, and
            # reconnects with the credentials it has then
            self._end_for_credentials(
                self._refusal(
                    "expired",
                    f"the connection's token expired at {_when(self.principal.expires_at_ms)}"
                    " and this client cannot refresh it (protocol version"
                    f" {self.protocol_version}, supports_auth_refresh not set); reconnect",
                )
            )
            return
        self.auth_challenges += 1
        log.info("pulsar_credentials_expired", peer=self.peer, role=self.principal.role)
        self._write(
            _command(
                Base.AUTH_CHALLENGE,
                authChallenge=api.CommandAuthChallenge(
                    server_version=f"Magnetar {self.broker.version}".strip(),
                    challenge=api.AuthData(
                        auth_method_name=self.principal.method, auth_data=REFRESH_AUTH_DATA
                    ),
                    protocol_version=self.protocol_version,
                ),
            )
        )
        self._refresh_deadline = asyncio.get_running_loop().call_later(
            self.broker.security.refresh_grace_s, self._refresh_lapsed
        )

    def _refresh_lapsed(self) -> None:
        self._refresh_deadline = None
        assert self.principal is not None
        grace_ms = round(self.broker.security.refresh_grace_s * 1000)
        self._end_for_credentials(
            self._refusal(
                "expired",
                f"the connection's token expired at {_when(self.principal.expires_at_ms)} and no"
                f" fresh one came within {grace_ms} ms of the AUTH_CHALLENGE; reconnect",
            )
        )

    def _refusal(self, reason: str, message: str) -> AuthenticationError:
        return self.broker.security.authentication.refuse(
            AuthenticationError, reason, self.peer, message
        )

    def _end_for_credentials(self, error: AuthenticationError) -> None:
        """ERROR (AuthenticationError), then close: the client reconnects with fresh
        credentials, looks its partitions up again and resends what was not receipted."""
        log.info("pulsar_connection_refused", peer=self.peer, error=error.message)
        self._write(
            _command(
                Base.ERROR,
                error=api.CommandError(
                    request_id=0, error=api.AuthenticationError, message=error.message
                ),
            )
        )
        if not self._closing:
            self._closer = asyncio.ensure_future(self.close())

    async def _auth_response(self, frame: Frame) -> None:
        """The client's answer to AUTH_CHALLENGE: fresh credentials of the same role, or the
        end of the connection."""
        response = frame.command.authResponse
        if self._refresh_deadline is None:
            log.info("pulsar_auth_response_unasked", peer=self.peer)
            return
        self._refresh_deadline.cancel()
        self._refresh_deadline = None
        assert self.principal is not None
        method = response.response.auth_method_name
        try:
            if method != "token":
                raise self._refusal(
                    "method_not_enabled",
                    f"the answer to AUTH_CHALLENGE uses method {method[:64]!r}; this connection"
                    " authenticated with a token and refreshes only a token",
                )
            principal = self.broker.security.authentication.authenticate_token(
                response.response.auth_data.decode("utf-8", "replace"), self.peer
            )
            if principal.role != self.principal.role:
                raise self._refusal(
                    "role_changed",
                    f"the fresh token is for role {principal.role!r}; this connection was opened"
                    f" by role {self.principal.role!r} (connect again to act as another role)",
                )
        except AuthenticationError as e:
            self._end_for_credentials(e)
            return
        self.principal = principal
        self.auth_refreshes += 1
        log.info(
            "pulsar_credentials_refreshed",
            peer=self.peer,
            role=principal.role,
            expires_at=_when(principal.expires_at_ms) if principal.expires_at_ms else None,
        )
        self._schedule_expiry()

    async def _connect_again(self, _: Frame) -> None:
        raise ProtocolError("a second CONNECT on a connection")

    async def _ping(self, _: Frame) -> None:
        self._write(_command(Base.PONG, pong=api.CommandPong()))

    async def _pong(self, _: Frame) -> None:
        return None

    async def _authorize(self, action: TopicAction, name: TopicName) -> None:
        assert self.principal is not None
        await self.broker.security.authorize_topic(self.principal, action, name)

    def _error(self, request_id: int, error: MagnetarError) -> None:
        self._write(
            _command(
                Base.ERROR,
                error=api.CommandError(
                    request_id=request_id, error=server_error(error), message=error.message
                ),
            )
        )

    # --- lookups ----------------------------------------------------------------------------------

    async def _partitioned_metadata(self, frame: Frame) -> None:
        request = frame.command.partitionMetadata
        response = api.CommandPartitionedTopicMetadataResponse(request_id=request.request_id)
        try:
            name = parse_topic(request.topic)
            await self._authorize(TopicAction.LOOKUP, name)
            response.partitions = await self.broker.partition_count(name)
            response.response = api.CommandPartitionedTopicMetadataResponse.Success
        except MagnetarError as e:
            response.response = api.CommandPartitionedTopicMetadataResponse.Failed
            response.error = server_error(e)
            response.message = e.message
        self._write(
            _command(Base.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response)
        )

    async def _lookup(self, frame: Frame) -> None:
        request = frame.command.lookupTopic
        response = api.CommandLookupTopicResponse(request_id=request.request_id)
        try:
            name = parse_topic(request.topic)
            await self._authorize(TopicAction.LOOKUP, name)
            result = await self.broker.lookup(name.full)
            if len(result.owners) != 1:
                raise InvalidArgumentError(
                    f"topic {name.full} has {result.partitions} partitions: look up"
                    f" {name.partition_name(0)} and the others one by one",
                    context={"topic": name.full, "partitions": result.partitions},
                )
            owner = result.owners[0]
            # both, as Pulsar answers; a client over TLS follows brokerServiceUrlTls
            plain, tls = await self.broker.pulsar_urls_of(owner.broker_id, tls=self.tls)
            if plain:
                response.brokerServiceUrl = plain
            if tls:
                response.brokerServiceUrlTls = tls
            response.response = api.CommandLookupTopicResponse.Connect
            response.authoritative = True
        except MagnetarError as e:
            response.response = api.CommandLookupTopicResponse.Failed
            response.error = server_error(e)
            response.message = e.message
        self._write(_command(Base.LOOKUP_RESPONSE, lookupTopicResponse=response))

    async def _topics_of_namespace(self, frame: Frame) -> None:
        request = frame.command.getTopicsOfNamespace
        try:
            tenant, namespace = parse_namespace(request.namespace)
            # permissions are the namespace's; a refusal names its topics as "tenant/ns/*"
            await self._authorize(TopicAction.LOOKUP, TopicName(tenant, namespace, "*"))
            records = await self.broker.catalog.list(f"{tenant}/{namespace}")
        except MagnetarError as e:
            self._error(request.request_id, e)
            return
        topics: list[str] = []
        if request.mode != api.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            for record in records:
                names = record.partition_names() if record.partitions > 0 else [record.name]
                topics += [f"persistent://{n.full}" for n in names]
        self._write(
            _command(
                Base.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                getTopicsOfNamespaceResponse=api.CommandGetTopicsOfNamespaceResponse(
                    request_id=request.request_id, topics=topics
                ),
            )
        )

    async def _get_schema(self, frame: Frame) -> None:
        request = frame.command.getSchema
        # no schema registry yet: every topic has none, which is what Pulsar says of a topic
        # without a schema
        self._write(
            _command(
                Base.GET_SCHEMA_RESPONSE,
                getSchemaResponse=api.CommandGetSchemaResponse(
                    request_id=request.request_id,
                    error_code=api.TopicNotFound,
                    error_message=f"topic {request.topic} has no schema",
                ),
            )
        )

    # --- producers --------------------------------------------------------------------------------

    async def _producer(self, frame: Frame) -> None:
        request = frame.command.producer
        producer_id = request.producer_id
        if producer_id in self.producers or producer_id in self._pending_producers:
            existing = self.producers.get(producer_id)
            if existing is not None and existing.topic.name == _parse_or_none(request.topic):
                # the client asks again for a producer it has: Pulsar answers success
                self._producer_success(request, existing.session)
                return
            self._error(
                request.request_id,
                ProtocolError(f"producer id {producer_id} is in use on this connection"),
            )
            return
        self._pending_producers.add(producer_id)
        try:
            session = await self._open_producer(request)
        finally:
            self._pending_producers.discard(producer_id)
        if session is None:
            self._abandoned_producers.discard(producer_id)
            return
        topic = session.topic
        if self._closing or producer_id in self._abandoned_producers:
            self._abandoned_producers.discard(producer_id)
            topic.remove_producer(session)
            return
        producer = _Producer(producer_id, session, topic)
        producer.room.set()
        self.producers[producer_id] = producer
        session.closed.add_done_callback(lambda _: self._producer_closed_by_broker(producer))
        log.info(
            "pulsar_producer_opened",
            topic=topic.name.full,
            producer=session.name,
            access_mode=session.access_mode.value,
            peer=self.peer,
        )
        self._producer_success(request, session)

    async def _open_producer(self, request: api.CommandProducer) -> ProducerSession | None:
        """Attach the producer to its partition, by its access mode; None once refused (the
        ERROR is sent). A WaitForExclusive producer that must wait is told so at once
        (PRODUCER_SUCCESS with ``producer_ready`` false, which the client answers by waiting
        without a timeout) and this returns when it gets the topic."""
        try:
            name = parse_topic(request.topic)
            mode = _ACCESS_MODES.get(request.producer_access_mode)
            if mode is None:
                raise InvalidArgumentError(
                    f"unknown producer access mode {request.producer_access_mode}"
                )
            if request.encrypted:
                raise UnsupportedFeatureError("encrypted producers are not supported yet")
            if request.producer_name:
                check_name(
                    "producer_name", request.producer_name, self.broker.config.max_name_chars
                )
            await self._authorize(TopicAction.PRODUCE, name)
            topic = await self.broker.open_topic(name)
            # not the gRPC adapter's pattern: dedup tells producers apart by name
            producer_name = request.producer_name or (
                f"{self.broker.broker_id}-pulsar-{self.broker.start_time_ms}-{next(_ids)}"
            )
            session = topic.add_producer(
                producer_name,
                self.peer,
                access_mode=mode,
                topic_epoch=request.topic_epoch if request.HasField("topic_epoch") else None,
            )
        except MagnetarError as e:
            self._error(request.request_id, e)
            return None
        if session.ready.done():
            return session
        log.info("pulsar_producer_waiting", topic=name.full, producer=producer_name)
        self._producer_success(request, session, ready=False)
        self._waiting_producers[request.producer_id] = session
        try:
            await asyncio.shield(session.ready)
        except asyncio.CancelledError:
            if session.ready.cancelled():
                return None  # the client closed it while it waited (CLOSE_PRODUCER)
            topic.remove_producer(session)  # the connection is closing
            raise
        except MagnetarError as e:
            self._error(request.request_id, e)
            return None
        finally:
            self._waiting_producers.pop(request.producer_id, None)
        return session

    def _producer_success(
        self, request: api.CommandProducer, session: ProducerSession, *, ready: bool = True
    ) -> None:
        success = api.CommandProducerSuccess(
            request_id=request.request_id,
            producer_name=session.name,
            last_sequence_id=session.last_sequence_id,
            producer_ready=ready,
        )
        if ready and session.topic_epoch is not None:
            success.topic_epoch = session.topic_epoch
        self._write(_command(Base.PRODUCER_SUCCESS, producer_success=success))

    async def _send(self, frame: Frame) -> None:
        send = frame.command.send
        producer = self.producers.get(send.producer_id)
        if producer is None and send.producer_id in self._closed_producers:
            # closed by the broker (its partition moved) while the client was still sending:
            # the client resends whatever was not receipted once it has its producer back
            return
        if producer is None:
            raise ProtocolError(
                f"SEND for producer {send.producer_id}, which this connection lacks"
            )
        assert frame.payload is not None
        session = producer.session
        loop = asyncio.get_running_loop()
        max_pending = self.broker.config.max_pending_publish_requests
        while len(producer.inflight) >= max_pending and not session.is_closed:
            producer.room.clear()
            await producer.room.wait()
        await producer.topic.wait_for_space()
        if session.is_closed or self.producers.get(send.producer_id) is not producer:
            return  # closed meanwhile: the client resends what was not receipted
        try:
            batch = incoming_batch(
                frame.payload,
                sequence_id=send.sequence_id,
                highest_sequence_id=send.highest_sequence_id,
                limits=self._limits,
            )
            receipt = producer.topic.publish(session, batch)
        except _MOVED as e:
            session.close_with(e)
            return
        except MagnetarError as e:
            receipt = loop.create_future()
            receipt.set_exception(e)
        producer.inflight.append(
            (send.sequence_id, max(send.sequence_id, send.highest_sequence_id), receipt)
        )
        receipt.add_done_callback(lambda _: self._flush_receipts(producer))

    def _flush_receipts(self, producer: _Producer) -> None:
        """Answer the sends whose receipts are done, in the order they came."""
        inflight = producer.inflight
        partition = producer.topic.name.partition
        while inflight and inflight[0][2].done():
            sequence_id, highest, future = inflight.popleft()
            if self.producers.get(producer.producer_id) is not producer:
                continue
            if future.cancelled():
                producer.session.close_with(ServiceNotReadyError("a send was not stored"))
                continue
            error = future.exception()
            if error is None:
                receipt = future.result()
                self._write(
                    _command(
                        Base.SEND_RECEIPT,
                        send_receipt=api.CommandSendReceipt(
                            producer_id=producer.producer_id,
                            sequence_id=sequence_id,
                            highest_sequence_id=highest,
                            message_id=_message_id(receipt.position, partition),
                        ),
                    )
                )
            elif isinstance(error, _MOVED) or not isinstance(error, MagnetarError):
                # the partition's writer failed: the client resends everything unreceipted
                producer.session.close_with(
                    error
                    if isinstance(error, MagnetarError)
                    else ServiceNotReadyError(f"a send could not be stored: {error!r}")
                )
            elif error.code >= 100 and error.code < 500:
                producer.session.close_with(ServiceNotReadyError(error.message))
            else:
                self._write(
                    _command(
                        Base.SEND_ERROR,
                        send_error=api.CommandSendError(
                            producer_id=producer.producer_id,
                            sequence_id=sequence_id,
                            error=server_error(error),
                            message=error.message,
                        ),
                    )
                )
        producer.room.set()

    def _producer_closed_by_broker(self, producer: _Producer) -> None:
        """The partition moved or closed under the producer: tell the client, which looks the
        topic up again and resends what was not receipted."""
        if self.producers.get(producer.producer_id) is not producer:
            return
        self._drop_producer(producer)
        reason = producer.session.closed.result()
        log.info(
            "pulsar_producer_closed_by_broker",
            topic=str(producer.topic.name),
            producer=producer.session.name,
            reason=reason.message,
        )
        self._write(
            _command(
                Base.CLOSE_PRODUCER,
                close_producer=api.CommandCloseProducer(
                    producer_id=producer.producer_id, request_id=next(_ids)
                ),
            )
        )

    def _drop_producer(self, producer: _Producer) -> None:
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
            self._closed_producers.add(producer.producer_id)
        producer.topic.remove_producer(producer.session)
        producer.room.set()

    async def _close_producer(self, frame: Frame) -> None:
        request = frame.command.close_producer
        producer = self.producers.get(request.producer_id)
        if request.producer_id in self._pending_producers:
            self._abandoned_producers.add(request.producer_id)
        waiting = self._waiting_producers.get(request.producer_id)
        if waiting is not None:
            waiting.topic.remove_producer(waiting)  # leaves the queue; its task ends
        if producer is not None:
            self._drop_producer(producer)
            log.info("pulsar_producer_closed", topic=str(producer.topic.name), peer=self.peer)
        self._write(
            _command(Base.SUCCESS, success=api.CommandSuccess(request_id=request.request_id))
        )

    # --- consumers --------------------------------------------------------------------------------

    def _start(self, request: api.CommandSubscribe) -> Start:
        if not request.durable:
            target = self._seek_targets.pop(request.consumer_id, None)
            if target is not None:
                return target
        if not request.durable and request.HasField("start_message_id"):
            return _start_at(request.start_message_id)
        if request.initialPosition == api.CommandSubscribe.Earliest:
            return "earliest"
        return "latest"

    async def _subscribe(self, frame: Frame) -> None:
        request = frame.command.subscribe
        consumer_id = request.consumer_id
        if consumer_id in self.consumers or consumer_id in self._pending_consumers:
            existing = self.consumers.get(consumer_id)
            if existing is not None and existing.session.subscription.name == request.subscription:
                self._write(
                    _command(
                        Base.SUCCESS, success=api.CommandSuccess(request_id=request.request_id)
                    )
                )
                return
            self._error(
                request.request_id,
                ProtocolError(f"consumer id {consumer_id} is in use on this connection"),
            )
            return
        self._pending_consumers.add(consumer_id)
        try:
            name = parse_topic(request.topic)
            config = self.broker.config
            check_name("subscription", request.subscription, config.max_name_chars)
            if request.consumer_name:
                check_name("consumer_name", request.consumer_name, config.max_name_chars)
            sub_type = _SUBSCRIPTION_TYPES.get(request.subType)
            if sub_type is None:
                raise InvalidArgumentError(f"unknown subscription type {request.subType}")
            await self._authorize(TopicAction.CONSUME, name)
            topic = await self.broker.open_topic(name)
            session = await topic.subscribe(
                SubscribeRequest(
                    topic=name.full,
                    subscription=request.subscription,
                    subscription_type=sub_type,
                    consumer_name=request.consumer_name or f"consumer-{next(_ids)}",
                    start=self._start(request),
                    durable=request.durable,
                    priority_level=request.priority_level,
                    properties={kv.key: kv.value for kv in request.metadata},
                    # a Pulsar client acknowledges part of a batch only with batch-index acks on,
                    # which it does not tell the broker: never hand it part of an entry
                    whole_entries=True,
                ),
                self.peer,
            )
        except MagnetarError as e:
            self._error(request.request_id, e)
            return
        finally:
            self._pending_consumers.discard(consumer_id)
        consumer = _Consumer(consumer_id, session, topic)
        if self._closing:
            session.detach()
            return
        self.consumers[consumer_id] = consumer
        log.info(
            "pulsar_consumer_subscribed",
            topic=name.full,
            subscription=session.subscription.name,
            consumer=session.name,
            peer=self.peer,
        )
        self._write(
            _command(Base.SUCCESS, success=api.CommandSuccess(request_id=request.request_id))
        )
        consumer.writer = self._spawn(self._deliver(consumer))

    async def _deliver(self, consumer: _Consumer) -> None:
        """Write a consumer's events: deliveries as MESSAGE, ack receipts, the broker closing it."""
        session = consumer.session
        partition = consumer.topic.name.partition
        max_bytes = self.broker.config.max_message_bytes + FRAME_PADDING
        queue = session.events
        while True:
            event = await queue.get()
            if isinstance(event, Deliveries):
                size = 0
                for item in session.still_unacked(event):
                    size += len(item.payload)
                    try:
                        body = pulsar_metadata_and_payload(item.payload, max_bytes)
                    except MagnetarError as e:
                        log.error(  # noqa: TRY400 - the error says it all; no traceback
                            "pulsar_delivery_unreadable",
                            topic=str(consumer.topic.name),
                            position=tuple(item.position),
                            error=e.message,
                        )
                        continue
                    message = api.CommandMessage(
                        consumer_id=consumer.consumer_id,
                        message_id=_message_id(item.position, partition),
                        redelivery_count=item.redelivery_count,
                        ack_set=ack_set_words(item.batch_indexes),
                    )
                    if not self._closing:
                        self._writer.write(
                            encode_payload_command(
                                _command(Base.MESSAGE, message=message),
                                body,
                                broker_entry_metadata=(
                                    broker_entry_metadata(item.payload)
                                    if self._entry_metadata
                                    else None
                                ),
                            )
                        )
                await self._writer.drain()
                session.taken(size)
            elif isinstance(event, AckDone):
                self._ack_response(consumer, event.request_id, None)
            elif isinstance(event, SeekDone):
                self._seek_done(consumer, -event.request_id - 1)
                return
            elif isinstance(event, RequestFailed):
                if event.request_id < 0:
                    self._error(-event.request_id - 1, event.error)
                elif event.request_id:
                    self._ack_response(consumer, event.request_id, event.error)
                else:
                    log.info(
                        "pulsar_consumer_request_failed",
                        topic=str(consumer.topic.name),
                        error=event.error.message,
                    )
            elif isinstance(event, ActiveChange):
                if self.protocol_version < ACTIVE_CONSUMER_CHANGE_VERSION:
                    continue
                self._write(
                    _command(
                        Base.ACTIVE_CONSUMER_CHANGE,
                        active_consumer_change=api.CommandActiveConsumerChange(
                            consumer_id=consumer.consumer_id, is_active=event.active
                        ),
                    )
                )
            elif isinstance(event, StreamClosed):
                # moved, closed, or at the end of a terminated topic: the client subscribes
                # again after a lookup (REACHED_END_OF_TOPIC is not sent: see the docs)
                if self.consumers.get(consumer.consumer_id) is consumer:
                    self._drop_consumer(consumer, cancel_writer=False)
                    self._write(
                        _command(
                            Base.CLOSE_CONSUMER,
                            close_consumer=api.CommandCloseConsumer(
                                consumer_id=consumer.consumer_id, request_id=next(_ids)
                            ),
                        )
                    )
                return
            elif isinstance(event, ClientDone):
                return
            elif isinstance(event, AuthChallenge):
                pass  # this listener refreshes a token per connection (AUTH_CHALLENGE), not here

    def _seek_done(self, consumer: _Consumer, request_id: int) -> None:
        """As Pulsar answers a seek: CLOSE_CONSUMER first, then SUCCESS. The client drops the
        messages it has queued from before the seek and subscribes again; a durable
        subscription's cursor is where the seek put it, and a reader's target waits for its
        SUBSCRIBE here."""
        if not consumer.session.subscription.durable and consumer.seek_target is not None:
            self._seek_targets[consumer.consumer_id] = consumer.seek_target
        if self.consumers.get(consumer.consumer_id) is consumer:
            self._drop_consumer(consumer, cancel_writer=False)
        self._write(
            _command(
                Base.CLOSE_CONSUMER,
                close_consumer=api.CommandCloseConsumer(
                    consumer_id=consumer.consumer_id, request_id=next(_ids)
                ),
            )
        )
        self._write(_command(Base.SUCCESS, success=api.CommandSuccess(request_id=request_id)))

    def _ack_response(
        self, consumer: _Consumer, internal_id: int, error: MagnetarError | None
    ) -> None:
        response = api.CommandAckResponse(
            consumer_id=consumer.consumer_id, request_id=internal_id - 1
        )
        if error is not None:
            response.error = server_error(error)
            response.message = error.message
        if self.protocol_version >= ACK_RESPONSE_VERSION:  # older clients send no request id
            self._write(_command(Base.ACK_RESPONSE, ackResponse=response))

    def _drop_consumer(self, consumer: _Consumer, *, cancel_writer: bool = True) -> None:
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        consumer.session.detach()
        if cancel_writer and consumer.writer is not None:
            consumer.writer.cancel()

    def _consumer(self, consumer_id: int) -> _Consumer | None:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            log.info("pulsar_unknown_consumer", consumer_id=consumer_id, peer=self.peer)
        return consumer

    async def _flow(self, frame: Frame) -> None:
        flow = frame.command.flow
        consumer = self._consumer(flow.consumer_id)
        if consumer is not None:
            consumer.session.flow(flow.messagePermits)

    async def _ack(self, frame: Frame) -> None:
        ack = frame.command.ack
        consumer = self._consumer(ack.consumer_id)
        # acks whose request id is 0 (a client's first request) still get their receipt
        internal_id = ack.request_id + 1 if ack.HasField("request_id") else 0
        if consumer is None:
            if internal_id:
                self._write(
                    _command(
                        Base.ACK_RESPONSE,
                        ackResponse=api.CommandAckResponse(
                            consumer_id=ack.consumer_id,
                            request_id=ack.request_id,
                            error=api.ConsumerNotFound,
                            message=f"consumer {ack.consumer_id} is not on this connection",
                        ),
                    )
                )
            return
        cumulative = ack.ack_type == api.CommandAck.Cumulative
        whole: list[Position] = []
        partial: list[tuple[Position, tuple[int, ...], int]] = []
        try:
            for message_id in ack.message_id:
                position = _position(message_id)
                if not message_id.ack_set:
                    whole.append(position)
                    continue
                # a batch index ack: the C++ client leaves batch_size out, the broker knows it
                size = message_id.batch_size or consumer.session.subscription.messages_in(position)
                if size is None:
                    raise InvalidArgumentError(
                        f"a batch index ack for entry {tuple(position)}, which this consumer"
                        " does not hold; nothing of it was acknowledged"
                    )
                indexes = ack_set_indexes(list(message_id.ack_set), size)
                if len(indexes) == size:
                    whole.append(position)
                elif indexes:
                    partial.append((position, indexes, size))
        except MagnetarError as e:
            consumer.session.events.put_nowait(RequestFailed(internal_id, e))
            return
        if cumulative and partial:
            # a cumulative ack inside a batch: only the batch's own messages are acknowledged
            # (the entries before it stay until a later ack covers them: redelivered, not lost)
            cumulative = bool(whole)
        consumer.session.ack(whole, cumulative=cumulative, request_id=internal_id, partial=partial)

    async def _redeliver(self, frame: Frame) -> None:
        request = frame.command.redeliverUnacknowledgedMessages
        consumer = self._consumer(request.consumer_id)
        if consumer is None:
            return
        try:
            positions = [_position(m) for m in request.message_ids]
        except MagnetarError as e:
            log.info("pulsar_redeliver_refused", peer=self.peer, error=e.message)
            return
        consumer.session.redeliver(positions)

    async def _seek(self, frame: Frame) -> None:
        request = frame.command.seek
        consumer = self.consumers.get(request.consumer_id)
        if consumer is None:
            self._error(
                request.request_id,
                InvalidArgumentError(f"consumer {request.consumer_id} is not on this connection"),
            )
            return
        if request.HasField("message_id"):
            start = _start_at(request.message_id)
        elif request.HasField("message_publish_time"):
            start = TimeStart(request.message_publish_time)
        else:
            self._error(
                request.request_id,
                InvalidArgumentError("a SEEK needs message_id or message_publish_time"),
            )
            return
        consumer.seek_target = start
        # negative: a seek's id, told apart from an ack's in the consumer's events
        await consumer.session.seek(start, -(request.request_id + 1))

    async def _last_message_id(self, frame: Frame) -> None:
        request = frame.command.getLastMessageId
        consumer = self.consumers.get(request.consumer_id)
        if consumer is None:
            self._error(
                request.request_id,
                InvalidArgumentError(f"consumer {request.consumer_id} is not on this connection"),
            )
            return
        topic = consumer.topic
        try:
            if topic.is_closing:
                raise ServiceNotReadyError(f"partition {topic.name} is moving; ask again")
            last = topic.ml.last_confirmed
            batch_index = -1
            if last.entry_id >= 0:
                entries = await topic.ml.read(last, max_entries=1, max_bytes=1)
                if entries and entries[0].position == last:
                    batch_index = last_batch_index(entries[0].payload)
        except MagnetarError as e:
            self._error(request.request_id, e)
            return
        # no entry yet: (-1, -1), which the uint64 fields carry as 2**64 - 1
        last_id = api.MessageIdData(
            ledgerId=last.ledger_id % 2**64,
            entryId=last.entry_id % 2**64,
            partition=topic.name.partition,
            batch_index=batch_index,
        )
        self._write(
            _command(
                Base.GET_LAST_MESSAGE_ID_RESPONSE,
                getLastMessageIdResponse=api.CommandGetLastMessageIdResponse(
                    request_id=request.request_id, last_message_id=last_id
                ),
            )
        )

    async def _close_consumer(self, frame: Frame) -> None:
        request = frame.command.close_consumer
        consumer = self.consumers.get(request.consumer_id)
        if consumer is not None:
            self._drop_consumer(consumer)
            log.info("pulsar_consumer_closed", topic=str(consumer.topic.name), peer=self.peer)
        self._write(
            _command(Base.SUCCESS, success=api.CommandSuccess(request_id=request.request_id))
        )

    async def _unsubscribe(self, frame: Frame) -> None:
        request = frame.command.unsubscribe
        consumer = self.consumers.get(request.consumer_id)
        if consumer is None:
            self._error(
                request.request_id,
                InvalidArgumentError(f"consumer {request.consumer_id} is not on this connection"),
            )
            return
        subscription = consumer.session.subscription
        others = [c for c in subscription.consumers if c is not consumer.session]
        if others:
            self._error(
                request.request_id,
                SubscriptionBusyError(
                    f"subscription {subscription.name!r} has {len(others)} other consumer(s)"
                    " attached; close them first",
                    context={"subscription": subscription.name},
                ),
            )
            return
        try:
            self._drop_consumer(consumer)
            if subscription.durable:
                await consumer.topic.delete_subscription(subscription.name, force=False)
        except MagnetarError as e:
            self._error(request.request_id, e)
            return
        except Exception as e:
            log.exception("pulsar_unsubscribe_failed", peer=self.peer)
            self._error(request.request_id, InternalError(f"unsubscribe failed: {e!r}"))
            return
        log.info(
            "pulsar_unsubscribed", topic=str(consumer.topic.name), subscription=subscription.name
        )
        self._write(
            _command(Base.SUCCESS, success=api.CommandSuccess(request_id=request.request_id))
        )


def _parse_or_none(topic: str) -> TopicName | None:
    try:
        return parse_topic(topic)
    except MagnetarError:
        return None
