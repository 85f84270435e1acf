"""The metadata store API: one asyncio interface that every backend implements the same way.

Everything Magnetar knows about its cluster (ledgers, managed ledgers, cursors, topics, who owns
what) lives in a metadata store. The model is etcd's, so the production backend is a thin
translation and the in-process backends behave identically:

- The store has one **revision** counter. Every write transaction that changes something advances
  it by one, and each key written records it as its ``version``. A version therefore changes on
  every write of the key and is never reused, even if the key is deleted and created again, so a
  compare-and-swap on it cannot be fooled by an ABA sequence.
- ``create`` is a create-only put; ``put(expected_version=v)`` and ``delete(expected_version=v)``
  are compare-and-swap; ``txn`` applies several puts and deletes atomically if every comparison
  holds.
- ``watch(prefix, start_revision=r)`` delivers every change under the prefix with revision >= r,
  in revision order, with none skipped: a watch that falls behind the history the store keeps
  fails with :class:`WatchCompactedError` rather than silently missing events.
- A **lease** has a TTL and must be kept alive; keys put with a lease vanish (a DELETE event) when
  the lease expires or is revoked. The coordination helpers build sessions, locks, elections and
  id allocation on these primitives alone, so they work on any backend.

Subclasses implement the ``_do_*`` methods; argument checking happens here, once, so every
backend refuses bad input with the same error.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from magnetar.common.errors import (
    BadVersionError,
    InvalidArgumentError,
    KeyExistsError,
    MetadataStoreClosedError,
    NoSuchKeyError,
    TransactionTooLargeError,
    ValueTooLargeError,
)
from metadata.config import MetadataStoreConfig
from metadata.keys import check_key, check_prefix

NO_LEASE = 0
"""The lease id of keys that are not bound to a lease."""

ABSENT = 0
"""The version of a key that does not exist (for :class:`Compare`)."""


@dataclass(frozen=True, slots=True)
class Record:
    """A key as stored."""

    key: str
    value: bytes
    version: int
    """The revision that last wrote the key; what ``put(expected_version=...)`` compares."""
    create_revision: int
    """The revision that created the key (changes if it is deleted and created again)."""
    lease_id: int = NO_LEASE
    """The lease the key is bound to, or :data:`NO_LEASE`."""


@dataclass(frozen=True, slots=True)
class Listing:
    """The keys under a prefix, read at one revision."""

    records: tuple[Record, ...]
    """In key order."""
    revision: int
    """The store revision of the read: watch from ``revision + 1`` to see every later change."""

    def keys(self) -> list[str]:
        return [r.key for r in self.records]


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change to one key."""

    type: EventType
    key: str
    value: bytes
    """The new value for a PUT; empty for a DELETE."""
    revision: int
    """The revision of the change (the key's new version for a PUT)."""
    lease_id: int = NO_LEASE


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction condition: the key's version equals ``version`` (:data:`ABSENT`: no key)."""

    key: str
    version: int

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, ABSENT)


@dataclass(frozen=True, slots=True)
class PutOp:
    key: str
    value: bytes
    lease_id: int = NO_LEASE


@dataclass(frozen=True, slots=True)
class DeleteOp:
    key: str


TxnOp = PutOp | DeleteOp


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a successful transaction did."""

    revision: int
    """The store revision after the transaction."""
    versions: dict[str, int]
    """The new version of every key the transaction put."""
    deleted: frozenset[str]
    """The keys the transaction deleted that existed."""


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    ttl_s: int
    """The TTL the store granted (etcd may round a requested TTL up to its minimum)."""


class Watch(abc.ABC):
    """A stream of :class:`WatchEvent` under a prefix. Use as ``async with`` and ``async for``."""

    prefix: str
    start_revision: int
    """The first revision this watch delivers."""

    def __aiter__(self) -> Self:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> WatchEvent:
        """The next event; raises :class:`WatchCompactedError` if history ran out under it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop watching; a pending ``__anext__`` ends with ``StopAsyncIteration``."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class MetadataStore(abc.ABC):
    """The one metadata API. Obtain one with :func:`metadata.open_store`."""

    def __init__(self, config: MetadataStoreConfig) -> None:
        self.config = config
        self._closed = False

    # --- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        """The record at ``key``, or ``None``."""
        self._check_open()
        return await self._do_get(check_key(key))

    async def list(self, prefix: str) -> Listing:
        """Every key starting with ``prefix``, in key order, read at one revision."""
        self._check_open()
        return await self._do_list(check_prefix(prefix))

    # --- writes --------------------------------------------------------------------------

    async def create(self, key: str, value: bytes, *, lease_id: int = NO_LEASE) -> int:
        """Put ``key`` only if it does not exist; returns its version.

        Raises :class:`KeyExistsError` if it exists.
        """
        try:
            result = await self.txn([Compare.absent(key)], [PutOp(key, value, lease_id)])
        except BadVersionError as e:
            raise KeyExistsError(
                f"metadata key {key!r} already exists (version {e.context.get('actual_version')})",
                context={"key": key, "version": e.context.get("actual_version", "")},
            ) from None
        return result.versions[key]

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        lease_id: int = NO_LEASE,
    ) -> int:
        """Put ``key``; returns its new version.

        With ``expected_version`` this is a compare-and-swap: it raises
        :class:`BadVersionError` if the key's version differs and :class:`NoSuchKeyError` if
        the key does not exist.
        """
        if expected_version is None:
            result = await self.txn([], [PutOp(key, value, lease_id)])
            return result.versions[key]
        _check_version(expected_version)
        try:
            result = await self.txn([Compare(key, expected_version)], [PutOp(key, value, lease_id)])
        except BadVersionError as e:
            _raise_missing_if_absent(key, e)
            raise
        return result.versions[key]

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        """Delete ``key``; returns whether it existed.

        With ``expected_version``, deletes only that version: raises :class:`BadVersionError`
        if the version differs and :class:`NoSuchKeyError` if the key does not exist.
        """
        if expected_version is None:
            result = await self.txn([], [DeleteOp(key)])
            return key in result.deleted
        _check_version(expected_version)
        try:
            await self.txn([Compare(key, expected_version)], [DeleteOp(key)])
        except BadVersionError as e:
            _raise_missing_if_absent(key, e)
            raise
        return True

    async def txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        """Apply ``ops`` atomically if every comparison holds.

        Raises :class:`BadVersionError` naming the first comparison that failed (its context has
        ``key``, ``expected_version`` and ``actual_version``, 0 for an absent key).
        """
        self._check_open()
        compares = list(compares)
        ops = list(ops)
        if len(compares) + len(ops) > self.config.max_txn_ops:
            raise TransactionTooLargeError(
                f"a metadata transaction may have at most {self.config.max_txn_ops} comparisons"
                f" and operations; this one has {len(compares) + len(ops)}",
                context={"limit": self.config.max_txn_ops, "size": len(compares) + len(ops)},
            )
        for cmp in compares:
            if not isinstance(cmp, Compare):
                raise InvalidArgumentError(f"not a Compare: {cmp!r}")
            check_key(cmp.key)
            if cmp.version != ABSENT:
                _check_version(cmp.version)
        seen: set[str] = set()
        for op in ops:
            if isinstance(op, PutOp):
                check_key(op.key)
                self._check_value(op.key, op.value)
                _check_lease_id(op.lease_id)
            elif isinstance(op, DeleteOp):
                check_key(op.key)
            else:
                raise InvalidArgumentError(f"not a PutOp or DeleteOp: {op!r}")
            if op.key in seen:
                # etcd refuses this too ("duplicate key given in txn request"); say so up front
                raise InvalidArgumentError(
                    f"metadata key {op.key!r} is written twice in one transaction",
                    context={"key": op.key},
                )
            seen.add(op.key)
        return await self._do_txn(compares, ops)

    # --- watches -------------------------------------------------------------------------

    async def watch(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        """Watch every change under ``prefix`` from ``start_revision`` (default: from now).

        The watch is established when this returns: every later change is delivered. Raises
        :class:`WatchCompactedError` if ``start_revision`` is older than the history kept.
        """
        self._check_open()
        if start_revision is not None and (
            not isinstance(start_revision, int) or start_revision < 1
        ):
            raise InvalidArgumentError(
                f"start_revision must be a positive int, got {start_revision!r}"
            )
        return await self._do_watch(check_prefix(prefix), start_revision)

    # --- leases --------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        """A new lease that expires ``ttl_s`` seconds after its last keepalive."""
        self._check_open()
        if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or ttl_s < 1:
            raise InvalidArgumentError(
                f"a lease TTL is a whole number of seconds >= 1, got {ttl_s!r}",
                context={"ttl_s": ttl_s},
            )
        return await self._do_grant_lease(ttl_s)

    async def keepalive(self, lease_id: int) -> int:
        """Refresh a lease; returns the TTL granted. Raises :class:`LeaseNotFoundError`."""
        self._check_open()
        _check_lease_id(lease_id, allow_none=False)
        return await self._do_keepalive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        """End a lease now, deleting its keys. Revoking an unknown lease is not an error."""
        self._check_open()
        _check_lease_id(lease_id, allow_none=False)
        await self._do_revoke_lease(lease_id)

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Release connections and files; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._do_close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- for backends --------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where the store is, for logs and errors (``etcd://h1:2379``)."""

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreClosedError(f"the metadata store {self.description} is closed")

    def _check_value(self, key: str, value: object) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(
                f"metadata values are bytes, got {type(value).__name__} for key {key!r}",
                context={"key": key},
            )
        size = len(value)
        limit = self.config.max_value_bytes
        if size > limit:
            raise ValueTooLargeError(
                f"value for metadata key {key!r} is {size:,} bytes; the limit is {limit:,} bytes"
                f" ({self.description})",
                context={"key": key, "size": size, "limit": limit},
            )

    @abc.abstractmethod
    async def _do_get(self, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def _do_list(self, prefix: str) -> Listing: ...

    @abc.abstractmethod
    async def _do_txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult: ...

    @abc.abstractmethod
    async def _do_watch(self, prefix: str, start_revision: int | None) -> Watch: ...

    @abc.abstractmethod
    async def _do_grant_lease(self, ttl_s: int) -> Lease: ...

    @abc.abstractmethod
    async def _do_keepalive(self, lease_id: int) -> int: ...

    @abc.abstractmethod
    async def _do_revoke_lease(self, lease_id: int) -> None: ...

    @abc.abstractmethod
    async def _do_close(self) -> None: ...


def compare_failed(key: str, expected: int, actual: int) -> BadVersionError:
    """The error every backend raises when a transaction comparison fails."""
    found = "absent" if actual == ABSENT else f"version {actual}"
    wanted = "absent" if expected == ABSENT else f"version {expected}"
    return BadVersionError(
        f"metadata key {key!r} changed: expected {wanted}, found {found}",
        context={"key": key, "expected_version": expected, "actual_version": actual},
    )


def _raise_missing_if_absent(key: str, error: BadVersionError) -> None:
    if error.context.get("actual_version") == str(ABSENT):
        raise NoSuchKeyError(f"metadata key {key!r} does not exist", context={"key": key}) from None


def _check_version(version: object) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgumentError(
            f"a metadata version is a positive int, got {version!r}",
            context={"version": repr(version)},
        )


def _check_lease_id(lease_id: object, *, allow_none: bool = True) -> None:
    if not isinstance(lease_id, int) or isinstance(lease_id, bool) or lease_id < 0:
        raise InvalidArgumentError(f"a lease id is an int >= 0, got {lease_id!r}")
    if not allow_none and lease_id == NO_LEASE:
        raise InvalidArgumentError("lease id 0 means 'no lease'; pass a granted lease id")
