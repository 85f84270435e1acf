"""Settings of the client, its producers and its consumers: frozen dataclasses, checked on creation.

``Client(...)``, ``create_producer(...)``, ``subscribe(...)`` and ``create_reader(...)`` take these
settings as keyword arguments and build the dataclasses; they can also be built directly and
loaded with :func:`magnetar.common.config.load_config` (``MAGNETAR_*`` environment variables).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from magnetar.common.config import config_error

__all__ = [
    "ClientConfig",
    "CompressionName",
    "ConsumerConfig",
    "InitialPositionName",
    "ProducerConfig",
    "SubscriptionTypeName",
    "build_config",
    "client_config",
    "replace_config",
]

CompressionName = Literal["none", "zlib"]
SubscriptionTypeName = Literal["exclusive", "failover", "shared", "key_shared"]
InitialPositionName = Literal["latest", "earliest"]

_COMPRESSIONS = ("none", "zlib")
_SUBSCRIPTION_TYPES = ("exclusive", "failover", "shared", "key_shared")
_INITIAL_POSITIONS = ("latest", "earliest")
_MIN_ACK_TIMEOUT_MS = 1000
"""Shorter ack timeouts redeliver messages the application is still working on."""


def _at_least(config: object, names: tuple[str, ...], minimum: float) -> None:
    for name in names:
        value = getattr(config, name)
        if value < minimum:
            raise config_error(name, value, f"must be >= {minimum}")


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """How the client reaches the brokers."""

    service_url: str = "magnetar://localhost:6650"
    """Brokers to look topics up on: ``magnetar://host:port[,host:port...]``."""

    operation_timeout_s: float = 30.0
    """Limit for creating a producer, consumer or reader, a lookup, a seek, and for close."""

    connection_timeout_ms: int = 10_000
    """Limit for one lookup call or for a broker to answer the opening of a stream."""

    initial_backoff_ms: int = 50
    """First pause before reconnecting a producer or consumer; doubles on every failure."""

    max_backoff_ms: int = 1000
    """Longest pause between reconnection attempts."""

    max_message_size_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message sent to or accepted from a broker."""

    keepalive_time_ms: int = 10_000
    """Ping an idle broker connection this often, to notice a broker that vanished."""

    keepalive_timeout_ms: int = 5_000
    """A ping unanswered for this long closes the connection (its streams then reconnect)."""

    tls_trust_certs_file_path: str | None = None
    """PEM file of the CA certificates that sign the brokers' certificates, for a
    magnetar+ssl:// service URL (None: the system's CAs)."""

    tls_validate_hostname: bool = True
    """Refuse a broker whose certificate does not name the host connected to (pulsar-client's
    default is False; Magnetar's is the safe one)."""

    tls_certificate_file_path: str | None = None
    """A client certificate (PEM) to present on TLS connections, for brokers that require one
    (mutual TLS) while the client authenticates with a token; AuthenticationTLS sets it too."""

    tls_private_key_file_path: str | None = None
    """The private key (PEM) of tls_certificate_file_path."""

    def __post_init__(self) -> None:
        _at_least(self, ("operation_timeout_s",), 0.001)
        _at_least(
            self,
            (
                "connection_timeout_ms",
                "initial_backoff_ms",
                "max_backoff_ms",
                "max_message_size_bytes",
                "keepalive_time_ms",
                "keepalive_timeout_ms",
            ),
            1,
        )
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise config_error(
                "max_backoff_ms", self.max_backoff_ms, "must be >= initial_backoff_ms"
            )
        if (self.tls_certificate_file_path is None) != (self.tls_private_key_file_path is None):
            raise config_error(
                "tls_private_key_file_path",
                self.tls_private_key_file_path,
                "must be set together with tls_certificate_file_path",
            )


@dataclass(frozen=True, kw_only=True)
class ProducerConfig:
    """How a producer batches, bounds and retries its messages."""

    producer_name: str | None = None
    """Name used for deduplication; None: the broker assigns one, reused on every reconnect."""

    batching_max_messages: int = 1000
    """A batch is sent once it holds this many messages."""

    batching_max_bytes: int = 128 * 1024
    """A batch is sent once its messages hold this many bytes."""

    batching_max_publish_delay_ms: float = 1.0
    """A batch is sent at the latest this long after its first message (0: at once)."""

    batching_self_clocking: bool = True
    """A batch goes at once when no partly filled batch of its partition awaits a receipt; while
    one does, messages gather until its receipt, until the batch is full, or for at most
    batching_max_publish_delay_ms (as Nagle's algorithm). False: every batch waits out the delay
    unless it fills first (Pulsar's batchingMaxPublishDelay, Kafka's linger.ms)."""

    send_timeout_ms: int = 30_000
    """A message not confirmed this long after send() fails with a timeout (0: never)."""

    max_pending_messages: int = 10_000
    """Messages sent but not yet confirmed, at most (the bounded pending queue)."""

    block_if_queue_full: bool = True
    """When the pending queue is full, send() waits for room (True) or fails at once with
    ProducerQueueFullError (False). The asyncio send_async() never waits and always fails; the
    sync send_async() waits in the caller's thread when this is True."""

    compression: CompressionName = "none"
    """How batches are compressed on the wire and in storage."""

    max_request_bytes: int = 4 * 1024 * 1024
    """Batches travel together in one stream message up to this many bytes."""

    properties: dict[str, str] = field(default_factory=dict)
    """Free-form properties given to the broker when the producer opens."""

    initial_sequence_id: int = -1
    """The first message gets this + 1 as its sequence id (Pulsar's ``initialSequenceId``),
    unless the broker already stored a higher one under this producer name. With a fixed
    ``producer_name`` this lets a writer number its messages itself, so that a retried writer
    is told by :attr:`Producer.last_sequence_id` what was already stored and skips it."""

    def __post_init__(self) -> None:
        _at_least(
            self,
            ("batching_max_messages", "batching_max_bytes", "max_pending_messages"),
            1,
        )
        if not isinstance(self.batching_self_clocking, bool):
            raise config_error(
                "batching_self_clocking", self.batching_self_clocking, "must be True or False"
            )
        if isinstance(self.initial_sequence_id, bool) or not isinstance(
            self.initial_sequence_id, int
        ):
            raise config_error(
                "initial_sequence_id", self.initial_sequence_id, "must be an integer >= -1"
            )
        _at_least(self, ("initial_sequence_id",), -1)
        _at_least(self, ("batching_max_publish_delay_ms", "send_timeout_ms"), 0)
        _at_least(self, ("max_request_bytes",), 1024)
        if self.compression not in _COMPRESSIONS:
            raise config_error("compression", self.compression, f"must be one of {_COMPRESSIONS}")
        if self.producer_name == "":
            raise config_error("producer_name", self.producer_name, "must be None or non-empty")


@dataclass(frozen=True, kw_only=True)
class ConsumerConfig:
    """How a consumer subscribes, prefetches and acknowledges."""

    subscription_name: str
    """The subscription (the durable cursor on the broker) this consumer attaches to."""

    subscription_type: SubscriptionTypeName = "exclusive"
    """exclusive, failover, shared or key_shared."""

    initial_position: InitialPositionName = "latest"
    """Where a subscription that does not exist yet starts: latest or earliest."""

    receiver_queue_size: int = 1000
    """Messages prefetched ahead of receive(), split over the partitions."""

    consumer_name: str | None = None
    """Name shown in the broker's stats and used to order failover consumers."""

    priority_level: int = 0
    """Failover: lower is preferred as the active consumer."""

    negative_ack_redelivery_delay_ms: int = 60_000
    """How long after negative_acknowledge() a message comes again."""

    ack_group_time_ms: float = 10.0
    """Acknowledgements are gathered for this long into one stream message."""

    ack_group_max_ids: int = 100
    """... or until this many entries are waiting."""

    batch_receive_max_messages: int = 100
    """batch_receive() returns once it holds this many messages ..."""

    batch_receive_max_bytes: int = 10 * 1024 * 1024
    """... or this many bytes of message content ..."""

    batch_receive_timeout_ms: int = 100
    """... or this long after it was called (with what it has, possibly nothing)."""

    ack_receipts: bool = False
    """acknowledge() waits until the broker confirms it applied the acknowledgement."""

    ack_timeout_ms: int = 0
    """A received message not acknowledged this long after is redelivered (0: never; >= 1000)."""

    ack_timeout_tick_ms: int = 1000
    """How often unacknowledged messages are checked against ack_timeout_ms (its granularity)."""

    max_redelivery_count: int = 0
    """A message redelivered more times than this goes to the dead-letter topic (0: never)."""

    dead_letter_topic: str = ""
    """Where those messages go; empty: ``<topic>-DLQ`` (the consumer's topic's full name)."""

    properties: dict[str, str] = field(default_factory=dict)
    """Free-form properties given to the broker on subscribe."""

    def __post_init__(self) -> None:
        if not self.subscription_name:
            raise config_error("subscription_name", self.subscription_name, "must not be empty")
        if self.subscription_type not in _SUBSCRIPTION_TYPES:
            raise config_error(
                "subscription_type",
                self.subscription_type,
                f"must be one of {_SUBSCRIPTION_TYPES}",
            )
        if self.initial_position not in _INITIAL_POSITIONS:
            raise config_error(
                "initial_position", self.initial_position, f"must be one of {_INITIAL_POSITIONS}"
            )
        _at_least(
            self,
            (
                "receiver_queue_size",
                "ack_group_max_ids",
                "batch_receive_max_messages",
                "batch_receive_max_bytes",
            ),
            1,
        )
        _at_least(self, ("batch_receive_timeout_ms",), 0)
        _at_least(self, ("ack_timeout_tick_ms",), 10)
        if self.ack_timeout_ms != 0 and self.ack_timeout_ms < _MIN_ACK_TIMEOUT_MS:
            raise config_error(
                "ack_timeout_ms",
                self.ack_timeout_ms,
                f"must be 0 (off) or >= {_MIN_ACK_TIMEOUT_MS}",
            )
        _at_least(
            self,
            (
                "negative_ack_redelivery_delay_ms",
                "ack_group_time_ms",
                "max_redelivery_count",
                "priority_level",
            ),
            0,
        )


_C = TypeVar("_C")


def _check_names(cls: type, settings: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    for name, value in settings.items():
        if name not in known:
            raise config_error(name, value, f"is not a setting of {cls.__name__}")


def build_config(cls: type[_C], settings: dict[str, Any]) -> _C:
    """``cls(**settings)``, naming any setting ``cls`` does not have."""
    _check_names(cls, settings)
    return cls(**settings)


def replace_config(config: _C, settings: dict[str, Any]) -> _C:
    """``config`` with ``settings`` changed, naming any setting it does not have."""
    _check_names(type(config), settings)
    return dataclasses.replace(config, **settings)  # type: ignore[type-var]


def client_config(service_url: str | ClientConfig, settings: dict[str, Any]) -> ClientConfig:
    """The :class:`ClientConfig` of ``Client(service_url, **settings)``: a URL plus settings, or
    a whole config with some settings changed."""
    if isinstance(service_url, ClientConfig):
        return replace_config(service_url, settings) if settings else service_url
    return build_config(ClientConfig, {"service_url": service_url, **settings})
