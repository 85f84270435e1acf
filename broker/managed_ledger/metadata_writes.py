"""A managed ledger's writes to the metadata store, each fenced by the info's version.

The info (the ledger list) is written by compare-and-swap with the version this owner last
wrote; cursors, and records no other version guards (a delay index's buckets), are written in
a transaction that compares the info's version too. So an old owner cannot overwrite anything
once a new owner took over, even before the new owner first writes that record. A lost
comparison fences the managed ledger (:meth:`Lifecycle.fence`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord
from broker.managed_ledger.persistence import (
    StoredCursor,
    StoredInfo,
    decode_cursor,
    decode_info,
    encode_cursor,
    encode_info,
)
from broker.managed_ledger.state import Lifecycle, LogState, State
from magnetar.common.errors import (
    BadVersionError,
    CursorAlreadyExistsError,
    KeyExistsError,
    NoSuchKeyError,
)
from metadata import layout
from metadata.api import Compare, DeleteOp, MetadataStore, PutOp


async def read_or_create_info(store: MetadataStore, name: str) -> tuple[StoredInfo, int]:
    """The info of managed ledger ``name`` and its version, created empty if there is none."""
    key = layout.managed_ledger_info(name)
    while True:
        record = await store.get(key)
        if record is not None:
            return decode_info(name, record.value), record.version
        info = StoredInfo()
        with contextlib.suppress(KeyExistsError):  # else created by someone else meanwhile
            return info, await store.create(key, encode_info(info))


class MetadataWrites:
    """The info, cursor and guarded writes of one managed ledger."""

    def __init__(
        self,
        name: str,
        *,
        store: MetadataStore,
        life: Lifecycle,
        log_state: LogState,
        info: StoredInfo,
        info_version: int,
    ) -> None:
        self._name = name
        self._store = store
        self._life = life
        self._log_state = log_state
        self._info_key = layout.managed_ledger_info(name)
        self._info = info
        self._info_version = info_version
        self._lock = asyncio.Lock()

    @property
    def info(self) -> StoredInfo:
        """The info as this owner last wrote it."""
        return self._info

    def _stored_info(self, ledgers: Sequence[LedgerRecord]) -> StoredInfo:
        return StoredInfo(
            ledgers=tuple(ledger.info() for ledger in ledgers),
            terminated=self._info.terminated,
            terminated_position=self._info.terminated_position,
            properties=self._info.properties,
        )

    async def update_info(self, change: Callable[[list[LedgerRecord]], list[LedgerRecord]]) -> None:
        """Compare-and-swap the info with the ledger list ``change`` makes of the current one."""
        async with self._lock:
            if self._life.state is State.FENCED:
                raise self._life.fenced_error()
            ledgers = change(list(self._log_state.ledgers))
            info = self._stored_info(ledgers)
            value = encode_info(info)
            try:
                version = await self._store.put(
                    self._info_key, value, expected_version=self._info_version
                )
            except (BadVersionError, NoSuchKeyError):
                record = await self._store.get(self._info_key)
                if record is None or record.value != value:
                    self._life.fence("the info changed under this owner")
                    raise self._life.fenced_error() from None
                version = record.version  # our write went through; its answer was lost
            self._info_version = version
            self._info = info
            self._log_state.ledgers = LedgerList(ledgers)

    async def write_guarded(self, key: str, value: bytes | None) -> None:
        """Put (``value``) or delete (``None``) a record of this managed ledger that no other
        record's version guards (a bucket of a cursor's delay index), if the info is still the
        version this owner knows: a zombie owner writes nothing. A lost comparison fences the
        managed ledger."""
        async with self._lock:
            self._life.check_usable()
            op = PutOp(key, value) if value is not None else DeleteOp(key)
            try:
                await self._store.txn([Compare(self._info_key, self._info_version)], [op])
            except BadVersionError:
                self._life.fence("the info changed under this owner")
                raise self._life.fenced_error() from None

    async def list_records(self, prefix: str) -> list[tuple[str, bytes]]:
        """Records under ``prefix`` (one of this managed ledger's): key and value, in key order."""
        self._life.check_usable()
        listing = await self._store.list(prefix)
        return [(record.key, record.value) for record in listing.records]

    async def write_cursor(self, cursor: str, stored: StoredCursor | None, version: int) -> int:
        """Put (``stored``) or delete (``None``) cursor ``cursor``'s record, if the info and the
        record are still the versions this owner knows (``version`` 0: absent); returns the
        record's new version (0: deleted). A lost comparison fences the managed ledger."""
        key = layout.managed_ledger_cursor(self._name, cursor)
        value = encode_cursor(stored) if stored is not None else None
        async with self._lock:
            self._life.check_usable()
            compares = [
                Compare(self._info_key, self._info_version),
                Compare(key, version) if version else Compare.absent(key),
            ]
            op = PutOp(key, value) if value is not None else DeleteOp(key)
            try:
                result = await self._store.txn(compares, [op])
            except BadVersionError as e:
                record = await self._store.get(key)
                info = await self._store.get(self._info_key)
                info_ours = info is not None and info.version == self._info_version
                if info_ours and value is not None and record is not None and record.value == value:
                    return record.version  # our write went through; its answer was lost
                if info_ours and value is None and record is None:
                    return 0
                if info_ours and version == 0 and e.context.get("key") == key:
                    raise CursorAlreadyExistsError(
                        f"cursor {cursor!r} of {self._name!r} was created by someone else",
                        context={"name": self._name, "cursor": cursor},
                    ) from None
                self._life.fence(f"cursor {cursor!r} or the info changed under this owner")
                raise self._life.fenced_error() from None
            return result.versions.get(key, 0)

    async def read_cursor(self, cursor: str) -> tuple[StoredCursor, int] | None:
        """Cursor ``cursor``'s record and its version, if there is one."""
        record = await self._store.get(layout.managed_ledger_cursor(self._name, cursor))
        if record is None:
            return None
        return decode_cursor(cursor, record.value), record.version

    async def load_cursors(self) -> list[tuple[str, StoredCursor, int]]:
        """Every cursor's name, record and version."""
        prefix = layout.managed_ledger_cursors(self._name)
        listing = await self._store.list(prefix)
        cursors = []
        for record in listing.records:
            cursor_name = record.key[len(prefix) :]
            if "/" in cursor_name:
                continue  # a key of another managed ledger whose name extends ours
            cursors.append((cursor_name, decode_cursor(cursor_name, record.value), record.version))
        return cursors
