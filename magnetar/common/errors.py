"""The one exception tree of Magnetar, and the error codes that carry it over the wire.

Every error Magnetar raises is a :class:`MagnetarError` with a numbered :class:`ErrorCode` and a
``retriable`` flag. The code, not the message text, is what crosses the wire: a gRPC adapter puts
``(code, message, context)`` into an ``ErrorDetail`` and the receiving side rebuilds the same class
with :func:`error_from_code`. Codes are grouped by layer in blocks of 100.

::

    MagnetarError                         base: code, retriable, message, context
    ├── InternalError                     a bug or an unexpected state (1)
    ├── InvalidArgumentError              a request or flag was malformed (2)
    │   ├── InvalidConfigError            a configuration value broke its rule (9)
    │   └── BookieStillRunningError       a bookie to decommission is still running (2*)
    ├── OperationTimeoutError             a deadline passed (3, retriable)
    ├── ServiceUnavailableError           a peer cannot be reached now (4, retriable)
    ├── ShuttingDownError                 the component is stopping (10, retriable)
    ├── AuthenticationError               no, bad or expired credentials (20)
    │   └── AuthenticationExpiredError    a stream's credentials expired unrefreshed (21, retriable)
    ├── AuthorizationError                the role may not do that (22)
    ├── MetadataError                     the metadata store (100)
    │   ├── BadVersionError               compare-and-swap lost: the key changed (101)
    │   ├── KeyExistsError                create-only put on an existing key (102)
    │   │   └── ClusterNameConflictError  the store holds a cluster of another name (102*)
    │   ├── NoSuchKeyError                the key does not exist (103)
    │   │   └── BookieNotFoundError       the cluster knows no bookie of that id (103*)
    │   ├── InvalidKeyError               a key or prefix broke the key rules (104)
    │   ├── ValueTooLargeError            a value is over the backend's limit (105)
    │   ├── MetadataUnavailableError      the store cannot be reached (106, retriable)
    │   ├── SessionLostError              the session lease expired or was revoked (107)
    │   ├── LeaseNotFoundError            unknown or expired lease (108)
    │   ├── WatchCompactedError           a watch asked for history that was compacted (109)
    │   ├── LockBusyError                 another session holds the lock (110, retriable)
    │   ├── InvalidMetadataUrlError       a metadata URL could not be understood (111)
    │   ├── MetadataStoreClosedError      the store was closed (112)
    │   ├── MetadataStoreLockedError      another process holds the embedded store (113)
    │   ├── MetadataCorruptError          the store's files are damaged beyond a torn tail (114)
    │   └── TransactionTooLargeError      a transaction has too many operations (115)
    ├── StorageError                      a bookie's storage (200)
    │   ├── LedgerFencedError             the ledger is fenced: normal adds refused (201)
    │   ├── NoSuchLedgerError             the bookie has no such ledger (202)
    │   ├── NoSuchEntryError              the bookie has no such entry (203)
    │   ├── BookieReadOnlyError           the bookie is read-only (disk full) (204, retriable)
    │   ├── ChecksumMismatchError         an entry's checksum did not match its payload (205)
    │   ├── CorruptionError               stored data failed its integrity check (206)
    │   ├── EntryTooLargeError            an entry is over the size limit (207)
    │   ├── StorageClosedError            the storage engine was closed (210, retriable)
    │   ├── BookieIdentityError           data directory and cluster disagree on identity (211)
    │   └── EntryExistsError              the entry is stored with other bytes: write-once (212)
    ├── LedgerError                       the ledger client (300)
    │   ├── NotEnoughBookiesError         fewer writable bookies than the ensemble needs (301)
    │   │   └── EnsembleUnrepairableError a writer's bookie has no replacement: it stopped (301)
    │   ├── LedgerClosedError             the ledger is closed for writing (302)
    │   ├── LedgerNotFoundError           no metadata for the ledger (303)
    │   ├── LedgerRecoveryError           recovery could not complete (304, retriable)
    │   ├── BookieUnavailableError        a bookie could not be reached (305, retriable)
    │   ├── ReadBeyondLacError            a read past the last add confirmed (306)
    │   └── LedgerMetadataConflictError   another writer changed the ledger's metadata (307)
    ├── ManagedLedgerError                a partition's managed ledger (400)
    │   ├── ManagedLedgerFencedError      another owner took the managed ledger (401)
    │   ├── ManagedLedgerTerminatedError  the managed ledger takes no more writes (402)
    │   ├── CursorNotFoundError           no such cursor (403)
    │   ├── CursorAlreadyExistsError      a cursor of that name exists (404)
    │   ├── OffsetOutOfRangeError         the position or offset is not stored (405)
    │   └── ManagedLedgerClosedError      the managed ledger was closed (406, retriable)
    ├── BrokerError                       a broker (500)
    │   ├── TopicNotFoundError            (501)
    │   ├── TopicNotOwnedError            this broker does not own the partition (502, retriable)
    │   ├── TopicAlreadyExistsError       (503)
    │   ├── InvalidTopicNameError         (504)
    │   ├── ProducerBusyError             a producer of that name is connected (505)
    │   ├── ConsumerBusyError             an exclusive subscription has a consumer (506)
    │   ├── MessageTooLargeError          a message or batch is over the size limit (507)
    │   ├── ProducerQueueFullError        pending bytes over the partition's limit (508, retriable)
    │   ├── SubscriptionNotFoundError     (509)
    │   ├── ServiceNotReadyError          the broker is starting or moving it (510, retriable)
    │   ├── ProtocolError                 a stream message broke the protocol (511)
    │   ├── TopicTerminatedError          (512)
    │   ├── SubscriptionBusyError         the subscription has active consumers (513)
    │   ├── IncompatibleSubscriptionError the subscription exists with another type (515)
    │   ├── TopicBusyError                the topic has producers or consumers (516)
    │   ├── TenantNotFoundError           (517)
    │   ├── TenantAlreadyExistsError      (518)
    │   ├── NamespaceNotFoundError        (519)
    │   ├── NamespaceAlreadyExistsError   (520)
    │   ├── NotEmptyError                 a tenant or namespace still holds something (521)
    │   └── ProducerFencedError           another producer holds the topic exclusively (522)
    └── ClientError                       the client library (600)
        ├── ClientConnectionError         a broker connection failed (601, retriable)
        ├── TopicLookupError              no broker could say who owns a topic (602, retriable)
        ├── ClientClosedError             (603)
        ├── ReceiveTimeoutError           receive() waited its timeout with no message (604)
        ├── ProducerClosedError           (605)
        ├── ConsumerClosedError           (606)
        ├── InvalidServiceUrlError        (607)
        └── TlsError                      a broker's certificate was not trusted (608)

Besides ``retriable``, one more flag is fixed per class: ``look_up_again`` (like aiokafka's
``invalid_metadata``) marks the errors after which a producer must look its partition up again
and resend what was not receipted: the partition is not owned here (``TopicNotOwnedError``), is
moving or the broker is starting (``ServiceNotReadyError``), the broker is stopping
(``ShuttingDownError``), or the partition's managed ledger failed (``ManagedLedgerError`` and
its subtree).

A code marked ``*`` is its parent's: errors of operator commands that never cross the wire
subclass the error they refine without a code of their own, and travel (if ever) as their parent.

The gRPC status used for unary calls is a coarse summary (``grpc_status``); the code in the detail
is the truth. This module imports nothing outside the standard library so that every layer,
including the storage engine, can raise these errors.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import ClassVar


class ErrorCode(enum.IntEnum):
    """Numbered error codes; identical, name for name, to ``magnetar.common.v1.ErrorCode``.

    ``tests/unit/common/test_errors.py`` fails if this enum and the proto enum drift apart.
    """

    UNSPECIFIED = 0
    INTERNAL = 1
    INVALID_ARGUMENT = 2
    TIMEOUT = 3
    UNAVAILABLE = 4
    INVALID_CONFIG = 9
    SHUTTING_DOWN = 10
    AUTHENTICATION_FAILED = 20
    AUTHENTICATION_EXPIRED = 21
    AUTHORIZATION_FAILED = 22

    METADATA_ERROR = 100
    METADATA_BAD_VERSION = 101
    METADATA_KEY_EXISTS = 102
    METADATA_NO_SUCH_KEY = 103
    METADATA_INVALID_KEY = 104
    METADATA_VALUE_TOO_LARGE = 105
    METADATA_UNAVAILABLE = 106
    METADATA_SESSION_LOST = 107
    METADATA_LEASE_NOT_FOUND = 108
    METADATA_WATCH_COMPACTED = 109
    METADATA_LOCK_BUSY = 110
    METADATA_INVALID_URL = 111
    METADATA_STORE_CLOSED = 112
    METADATA_STORE_LOCKED = 113
    METADATA_CORRUPT = 114
    METADATA_TXN_TOO_LARGE = 115

    STORAGE_ERROR = 200
    LEDGER_FENCED = 201
    NO_SUCH_LEDGER = 202
    NO_SUCH_ENTRY = 203
    BOOKIE_READ_ONLY = 204
    CHECKSUM_MISMATCH = 205
    CORRUPTION = 206
    ENTRY_TOO_LARGE = 207
    STORAGE_CLOSED = 210
    BOOKIE_IDENTITY_MISMATCH = 211
    ENTRY_EXISTS = 212

    LEDGER_ERROR = 300
    NOT_ENOUGH_BOOKIES = 301
    LEDGER_CLOSED = 302
    LEDGER_NOT_FOUND = 303
    LEDGER_RECOVERY_FAILED = 304
    BOOKIE_UNAVAILABLE = 305
    READ_BEYOND_LAC = 306
    LEDGER_METADATA_CONFLICT = 307

    MANAGED_LEDGER_ERROR = 400
    MANAGED_LEDGER_FENCED = 401
    MANAGED_LEDGER_TERMINATED = 402
    CURSOR_NOT_FOUND = 403
    CURSOR_ALREADY_EXISTS = 404
    OFFSET_OUT_OF_RANGE = 405
    MANAGED_LEDGER_CLOSED = 406

    BROKER_ERROR = 500
    TOPIC_NOT_FOUND = 501
    TOPIC_NOT_OWNED = 502
    TOPIC_ALREADY_EXISTS = 503
    INVALID_TOPIC_NAME = 504
    PRODUCER_BUSY = 505
    CONSUMER_BUSY = 506
    MESSAGE_TOO_LARGE = 507
    PRODUCER_QUEUE_FULL = 508
    SUBSCRIPTION_NOT_FOUND = 509
    SERVICE_NOT_READY = 510
    PROTOCOL_ERROR = 511
    TOPIC_TERMINATED = 512
    SUBSCRIPTION_BUSY = 513
    INCOMPATIBLE_SUBSCRIPTION = 515
    TOPIC_BUSY = 516
    TENANT_NOT_FOUND = 517
    TENANT_ALREADY_EXISTS = 518
    NAMESPACE_NOT_FOUND = 519
    NAMESPACE_ALREADY_EXISTS = 520
    NOT_EMPTY = 521
    PRODUCER_FENCED = 522

    CLIENT_ERROR = 600
    CONNECTION_FAILED = 601
    LOOKUP_FAILED = 602
    CLIENT_CLOSED = 603
    RECEIVE_TIMEOUT = 604
    PRODUCER_CLOSED = 605
    CONSUMER_CLOSED = 606
    INVALID_SERVICE_URL = 607
    TLS_FAILED = 608


_BY_CODE: dict[int, type[MagnetarError]] = {}


class MagnetarError(Exception):
    """Base of every Magnetar error.

    ``code`` and ``retriable`` are fixed per class; ``context`` carries the structured facts a
    caller may act on (the key, the limit, the endpoint), and travels over the wire with the code.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    retriable: ClassVar[bool] = False
    #: after this error a producer looks its partition up again and resends (the partition
    #: moved, is moving, or its writer failed), rather than failing what it sent
    look_up_again: ClassVar[bool] = False
    #: name of the ``grpc.StatusCode`` a unary call fails with (kept as text: no gRPC import here)
    grpc_status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, context: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, str] = {k: str(v) for k, v in (context or {}).items()}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # One class per code: the first class that declares a code owns it. Subclasses that do
        # not declare their own code inherit the parent's and are not registered.
        if "code" in cls.__dict__:
            existing = _BY_CODE.get(int(cls.code))
            if existing is not None and existing is not cls:
                raise TypeError(f"{cls.__name__} reuses {cls.code!r} of {existing.__name__}")
            _BY_CODE[int(cls.code)] = cls

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code.name})"


def error_class_for(code: int) -> type[MagnetarError]:
    """The error class registered for ``code``; the closest layer base for unknown codes."""
    found = _BY_CODE.get(int(code))
    if found is not None:
        return found
    # A newer peer may send a code we do not know: fall back to its layer's base class.
    layer_base = _BY_CODE.get((int(code) // 100) * 100)
    return layer_base if layer_base is not None and code >= 100 else MagnetarError


def error_from_code(
    code: int, message: str, context: Mapping[str, object] | None = None
) -> MagnetarError:
    """Rebuild the typed error for a wire ``code``; never inspects the message text."""
    return error_class_for(code)(message, context=context)


# --- generic --------------------------------------------------------------------------------


class InternalError(MagnetarError):
    """A bug or an unexpected state; the message says what was seen."""

    code = ErrorCode.INTERNAL


class InvalidArgumentError(MagnetarError):
    """A request, flag or value was malformed; the message names it and the rule it broke."""

    code = ErrorCode.INVALID_ARGUMENT
    grpc_status = "INVALID_ARGUMENT"


class InvalidConfigError(InvalidArgumentError):
    """A configuration value broke its rule."""

    code = ErrorCode.INVALID_CONFIG


class BookieStillRunningError(InvalidArgumentError):
    """A bookie named for decommissioning is registered as available: it must be stopped first."""

    grpc_status = "FAILED_PRECONDITION"


class OperationTimeoutError(MagnetarError):
    """A deadline passed before the operation completed."""

    code = ErrorCode.TIMEOUT
    retriable = True
    grpc_status = "DEADLINE_EXCEEDED"


class ServiceUnavailableError(MagnetarError):
    """A peer could not be reached now; trying again later may work."""

    code = ErrorCode.UNAVAILABLE
    retriable = True
    grpc_status = "UNAVAILABLE"


class ShuttingDownError(MagnetarError):
    """The component is stopping and takes no new work."""

    code = ErrorCode.SHUTTING_DOWN
    retriable = True
    look_up_again = True
    grpc_status = "UNAVAILABLE"


class AuthenticationError(MagnetarError):
    """Credentials were missing, malformed, badly signed, expired, or of no known role.

    The message says which; it never holds the token or key itself."""

    code = ErrorCode.AUTHENTICATION_FAILED
    grpc_status = "UNAUTHENTICATED"


class AuthenticationExpiredError(AuthenticationError):
    """A long-lived stream's credentials expired and were not refreshed in time: reconnect with
    fresh credentials (the client does, asking its token supplier again)."""

    code = ErrorCode.AUTHENTICATION_EXPIRED
    retriable = True


class AuthorizationError(MagnetarError):
    """The authenticated role may not do what it asked; the message names the role, the action
    and the resource."""

    code = ErrorCode.AUTHORIZATION_FAILED
    grpc_status = "PERMISSION_DENIED"


# --- metadata -------------------------------------------------------------------------------


class MetadataError(MagnetarError):
    """An error of the metadata store or its coordination helpers."""

    code = ErrorCode.METADATA_ERROR


class BadVersionError(MetadataError):
    """A compare-and-swap lost: the key's version is not the expected one (or it is absent)."""

    code = ErrorCode.METADATA_BAD_VERSION
    grpc_status = "FAILED_PRECONDITION"


class KeyExistsError(MetadataError):
    """A create-only put found the key already present."""

    code = ErrorCode.METADATA_KEY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class ClusterNameConflictError(KeyExistsError):
    """``cluster init`` found the metadata store initialised for a cluster of another name."""


class NoSuchKeyError(MetadataError):
    """The key does not exist."""

    code = ErrorCode.METADATA_NO_SUCH_KEY
    grpc_status = "NOT_FOUND"


class BookieNotFoundError(NoSuchKeyError):
    """The cluster has no bookie of that id (no cookie under ``/magnetar/bookies/cookies/``)."""


class InvalidKeyError(MetadataError):
    """A key or prefix broke the key rules (see ``metadata.keys``)."""

    code = ErrorCode.METADATA_INVALID_KEY
    grpc_status = "INVALID_ARGUMENT"


class ValueTooLargeError(MetadataError):
    """A value is larger than the backend accepts."""

    code = ErrorCode.METADATA_VALUE_TOO_LARGE
    grpc_status = "RESOURCE_EXHAUSTED"


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached (all endpoints failed or timed out)."""

    code = ErrorCode.METADATA_UNAVAILABLE
    retriable = True
    grpc_status = "UNAVAILABLE"


class SessionLostError(MetadataError):
    """The session's lease expired or was revoked; its lease-bound keys are gone or going."""

    code = ErrorCode.METADATA_SESSION_LOST
    grpc_status = "FAILED_PRECONDITION"


class LeaseNotFoundError(MetadataError):
    """The lease is unknown to the store: it expired, was revoked, or never existed."""

    code = ErrorCode.METADATA_LEASE_NOT_FOUND
    grpc_status = "NOT_FOUND"


class WatchCompactedError(MetadataError):
    """A watch asked to start at a revision the store no longer keeps; re-read and watch again."""

    code = ErrorCode.METADATA_WATCH_COMPACTED
    grpc_status = "OUT_OF_RANGE"


class LockBusyError(MetadataError):
    """A resource lock is held by another session."""

    code = ErrorCode.METADATA_LOCK_BUSY
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


class InvalidMetadataUrlError(MetadataError):
    """A metadata URL could not be understood."""

    code = ErrorCode.METADATA_INVALID_URL
    grpc_status = "INVALID_ARGUMENT"


class MetadataStoreClosedError(MetadataError):
    """The metadata store was closed."""

    code = ErrorCode.METADATA_STORE_CLOSED
    grpc_status = "UNAVAILABLE"


class MetadataStoreLockedError(MetadataError):
    """Another process has the embedded store's directory open."""

    code = ErrorCode.METADATA_STORE_LOCKED
    grpc_status = "FAILED_PRECONDITION"


class MetadataCorruptError(MetadataError):
    """The store's files are damaged in a way that a torn tail does not explain."""

    code = ErrorCode.METADATA_CORRUPT
    grpc_status = "DATA_LOSS"


class TransactionTooLargeError(MetadataError):
    """A transaction has more operations than the backend accepts."""

    code = ErrorCode.METADATA_TXN_TOO_LARGE
    grpc_status = "RESOURCE_EXHAUSTED"


# --- bookie storage -------------------------------------------------------------------------


class StorageError(MagnetarError):
    """An error of a bookie's storage engine."""

    code = ErrorCode.STORAGE_ERROR


class LedgerFencedError(StorageError):
    """The ledger is fenced on this bookie: normal adds are refused, recovery adds accepted."""

    code = ErrorCode.LEDGER_FENCED
    grpc_status = "FAILED_PRECONDITION"


class NoSuchLedgerError(StorageError):
    """The bookie holds no entry of this ledger."""

    code = ErrorCode.NO_SUCH_LEDGER
    grpc_status = "NOT_FOUND"


class NoSuchEntryError(StorageError):
    """The bookie does not hold this entry."""

    code = ErrorCode.NO_SUCH_ENTRY
    grpc_status = "NOT_FOUND"


class BookieReadOnlyError(StorageError):
    """The bookie is read-only (disk usage over its threshold): writes refused, reads served."""

    code = ErrorCode.BOOKIE_READ_ONLY
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


class ChecksumMismatchError(StorageError):
    """An entry's CRC32C does not match its payload."""

    code = ErrorCode.CHECKSUM_MISMATCH
    grpc_status = "DATA_LOSS"


class CorruptionError(StorageError):
    """Stored data failed its integrity check; it is reported, never served as data."""

    code = ErrorCode.CORRUPTION
    grpc_status = "DATA_LOSS"


class EntryTooLargeError(StorageError):
    """An entry is larger than the bookie accepts."""

    code = ErrorCode.ENTRY_TOO_LARGE
    grpc_status = "RESOURCE_EXHAUSTED"


class StorageClosedError(StorageError):
    """The storage engine was closed."""

    code = ErrorCode.STORAGE_CLOSED
    retriable = True
    grpc_status = "UNAVAILABLE"


class BookieIdentityError(StorageError):
    """The data directory and the cluster's metadata disagree about who this bookie is."""

    code = ErrorCode.BOOKIE_IDENTITY_MISMATCH
    grpc_status = "FAILED_PRECONDITION"


class EntryExistsError(StorageError):
    """The bookie stores this entry with other bytes: entries are write-once, and only an
    identical add (an idempotent retry) of a stored entry succeeds."""

    code = ErrorCode.ENTRY_EXISTS
    grpc_status = "ALREADY_EXISTS"


# --- ledger client --------------------------------------------------------------------------


class LedgerError(MagnetarError):
    """An error of the ledger client."""

    code = ErrorCode.LEDGER_ERROR


class NotEnoughBookiesError(LedgerError):
    """Fewer writable bookies than the ensemble needs."""

    code = ErrorCode.NOT_ENOUGH_BOOKIES
    retriable = True
    grpc_status = "UNAVAILABLE"


class EnsembleUnrepairableError(NotEnoughBookiesError):
    """A ledger's writer lost a bookie that no writable bookie can replace, and stopped; the
    ledger is still its own, to close at the last entry it confirmed. (Same wire code.)"""


class LedgerClosedError(LedgerError):
    """The ledger is closed; it takes no more adds."""

    code = ErrorCode.LEDGER_CLOSED
    grpc_status = "FAILED_PRECONDITION"


class LedgerNotFoundError(LedgerError):
    """The metadata store has no such ledger."""

    code = ErrorCode.LEDGER_NOT_FOUND
    grpc_status = "NOT_FOUND"


class LedgerRecoveryError(LedgerError):
    """Recovery of a ledger could not complete (not enough bookies answered)."""

    code = ErrorCode.LEDGER_RECOVERY_FAILED
    retriable = True
    grpc_status = "UNAVAILABLE"


class BookieUnavailableError(LedgerError):
    """A bookie could not be reached."""

    code = ErrorCode.BOOKIE_UNAVAILABLE
    retriable = True
    grpc_status = "UNAVAILABLE"


class ReadBeyondLacError(LedgerError):
    """A read asked for entries past the last add confirmed."""

    code = ErrorCode.READ_BEYOND_LAC
    grpc_status = "OUT_OF_RANGE"


class LedgerMetadataConflictError(LedgerError):
    """Another writer changed the ledger's metadata (it was recovered or closed elsewhere)."""

    code = ErrorCode.LEDGER_METADATA_CONFLICT
    grpc_status = "ABORTED"


# --- managed ledger -------------------------------------------------------------------------


class ManagedLedgerError(MagnetarError):
    """An error of a partition's managed ledger."""

    code = ErrorCode.MANAGED_LEDGER_ERROR
    look_up_again = True


class ManagedLedgerFencedError(ManagedLedgerError):
    """Another owner took this managed ledger; this instance must stop writing."""

    code = ErrorCode.MANAGED_LEDGER_FENCED
    grpc_status = "FAILED_PRECONDITION"


class ManagedLedgerTerminatedError(ManagedLedgerError):
    """The managed ledger was terminated and takes no more writes."""

    code = ErrorCode.MANAGED_LEDGER_TERMINATED
    grpc_status = "FAILED_PRECONDITION"


class CursorNotFoundError(ManagedLedgerError):
    """No cursor of that name."""

    code = ErrorCode.CURSOR_NOT_FOUND
    grpc_status = "NOT_FOUND"


class CursorAlreadyExistsError(ManagedLedgerError):
    """A cursor of that name already exists."""

    code = ErrorCode.CURSOR_ALREADY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class OffsetOutOfRangeError(ManagedLedgerError):
    """The position or offset is not stored (trimmed by retention, or not yet written)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE
    grpc_status = "OUT_OF_RANGE"


class ManagedLedgerClosedError(ManagedLedgerError):
    """The managed ledger was closed."""

    code = ErrorCode.MANAGED_LEDGER_CLOSED
    retriable = True
    grpc_status = "UNAVAILABLE"


# --- broker ---------------------------------------------------------------------------------


class BrokerError(MagnetarError):
    """An error of a broker."""

    code = ErrorCode.BROKER_ERROR


class TopicNotFoundError(BrokerError):
    """No such topic."""

    code = ErrorCode.TOPIC_NOT_FOUND
    grpc_status = "NOT_FOUND"


class TopicNotOwnedError(BrokerError):
    """This broker does not own the partition; look it up again."""

    code = ErrorCode.TOPIC_NOT_OWNED
    retriable = True
    look_up_again = True
    grpc_status = "UNAVAILABLE"


class TopicAlreadyExistsError(BrokerError):
    """A topic of that name exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class InvalidTopicNameError(BrokerError):
    """A topic name broke the naming rules."""

    code = ErrorCode.INVALID_TOPIC_NAME
    grpc_status = "INVALID_ARGUMENT"


class ProducerBusyError(BrokerError):
    """A producer of that name is already connected."""

    code = ErrorCode.PRODUCER_BUSY
    grpc_status = "ALREADY_EXISTS"


class ConsumerBusyError(BrokerError):
    """An exclusive subscription already has its consumer."""

    code = ErrorCode.CONSUMER_BUSY
    grpc_status = "ALREADY_EXISTS"


class MessageTooLargeError(BrokerError):
    """A message or batch is larger than the broker accepts."""

    code = ErrorCode.MESSAGE_TOO_LARGE
    grpc_status = "RESOURCE_EXHAUSTED"


class ProducerQueueFullError(BrokerError):
    """Pending bytes on the partition are over their limit."""

    code = ErrorCode.PRODUCER_QUEUE_FULL
    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"


class SubscriptionNotFoundError(BrokerError):
    """No such subscription."""

    code = ErrorCode.SUBSCRIPTION_NOT_FOUND
    grpc_status = "NOT_FOUND"


class ServiceNotReadyError(BrokerError):
    """The broker is starting, or the partition is moving; try again shortly."""

    code = ErrorCode.SERVICE_NOT_READY
    retriable = True
    look_up_again = True
    grpc_status = "UNAVAILABLE"


class ProtocolError(BrokerError):
    """A stream message broke the protocol (wrong order, missing field)."""

    code = ErrorCode.PROTOCOL_ERROR
    grpc_status = "INVALID_ARGUMENT"


class TopicTerminatedError(BrokerError):
    """The topic was terminated and takes no more messages."""

    code = ErrorCode.TOPIC_TERMINATED
    grpc_status = "FAILED_PRECONDITION"


class SubscriptionBusyError(BrokerError):
    """The subscription has active consumers."""

    code = ErrorCode.SUBSCRIPTION_BUSY
    grpc_status = "FAILED_PRECONDITION"


class IncompatibleSubscriptionError(BrokerError):
    """The subscription exists with another subscription type."""

    code = ErrorCode.INCOMPATIBLE_SUBSCRIPTION
    grpc_status = "FAILED_PRECONDITION"


class TopicBusyError(BrokerError):
    """The topic has producers or consumers attached."""

    code = ErrorCode.TOPIC_BUSY
    grpc_status = "FAILED_PRECONDITION"


class TenantNotFoundError(BrokerError):
    """No such tenant."""

    code = ErrorCode.TENANT_NOT_FOUND
    grpc_status = "NOT_FOUND"


class TenantAlreadyExistsError(BrokerError):
    """A tenant of that name exists."""

    code = ErrorCode.TENANT_ALREADY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class NamespaceNotFoundError(BrokerError):
    """No such namespace."""

    code = ErrorCode.NAMESPACE_NOT_FOUND
    grpc_status = "NOT_FOUND"


class NamespaceAlreadyExistsError(BrokerError):
    """A namespace of that name exists."""

    code = ErrorCode.NAMESPACE_ALREADY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class NotEmptyError(BrokerError):
    """A tenant still has namespaces, or a namespace still has topics: delete those first."""

    code = ErrorCode.NOT_EMPTY
    grpc_status = "FAILED_PRECONDITION"


class ProducerFencedError(BrokerError):
    """Another producer holds the topic exclusively, or took it from this one (Pulsar's
    Exclusive and ExclusiveWithFencing access modes): this producer may not write to it."""

    code = ErrorCode.PRODUCER_FENCED
    grpc_status = "FAILED_PRECONDITION"


# --- client ---------------------------------------------------------------------------------


class ClientError(MagnetarError):
    """An error of the client library."""

    code = ErrorCode.CLIENT_ERROR


class ClientConnectionError(ClientError):
    """A connection to a broker failed."""

    code = ErrorCode.CONNECTION_FAILED
    retriable = True
    grpc_status = "UNAVAILABLE"


class TopicLookupError(ClientError):
    """No broker could say who owns a topic."""

    code = ErrorCode.LOOKUP_FAILED
    retriable = True
    grpc_status = "UNAVAILABLE"


class ClientClosedError(ClientError):
    """The client was closed."""

    code = ErrorCode.CLIENT_CLOSED


class ReceiveTimeoutError(ClientError):
    """``receive(timeout_millis=...)`` waited its whole timeout and nothing came."""

    code = ErrorCode.RECEIVE_TIMEOUT


class ProducerClosedError(ClientError):
    """The producer was closed."""

    code = ErrorCode.PRODUCER_CLOSED


class ConsumerClosedError(ClientError):
    """The consumer was closed."""

    code = ErrorCode.CONSUMER_CLOSED


class InvalidServiceUrlError(ClientError):
    """A service URL could not be understood."""

    code = ErrorCode.INVALID_SERVICE_URL
    grpc_status = "INVALID_ARGUMENT"


class TlsError(ClientError):
    """A TLS connection could not be made: the broker's certificate is not trusted (no or the
    wrong ``tls_trust_certs_file_path``), does not name the host (``tls_validate_hostname``), or
    the client's own certificate or key cannot be used."""

    code = ErrorCode.TLS_FAILED
    grpc_status = "UNAVAILABLE"
