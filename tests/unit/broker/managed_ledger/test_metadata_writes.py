"""A managed ledger's metadata writes on the memory store: versions, fencing, lost answers.

Two owners of one managed ledger are two :class:`MetadataWrites` over one store; the second
takes the info over as an opening owner does (a compare-and-swap of the info), after which
nothing of the first may land.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import structlog

from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord
from broker.managed_ledger.metadata_writes import MetadataWrites, read_or_create_info
from broker.managed_ledger.persistence import StoredCursor, decode_cursor, encode_info
from broker.managed_ledger.state import Lifecycle, LogState, State
from broker.managed_ledger.types import BEFORE_EVERYTHING, Position
from magnetar.common.errors import CursorAlreadyExistsError, ManagedLedgerFencedError
from metadata import layout
from metadata.memory import MemoryMetadataStore

NAME = "t/ns/meta-partition-0"


@pytest.fixture
async def store() -> AsyncIterator[MemoryMetadataStore]:
    store = MemoryMetadataStore()
    try:
        yield store
    finally:
        await store.close()


async def owner(store: MemoryMetadataStore) -> MetadataWrites:
    """An owner as :meth:`ManagedLedger.open` makes one: it has just written the info."""
    info, version = await read_or_create_info(store, NAME)
    version = await store.put(
        layout.managed_ledger_info(NAME), encode_info(info), expected_version=version
    )
    life = Lifecycle(NAME, structlog.get_logger("test"))
    state = LogState(LedgerList([LedgerRecord(7, 0, created_ms=0)]), BEFORE_EVERYTHING, 0)
    return MetadataWrites(
        NAME, store=store, life=life, log_state=state, info=info, info_version=version
    )


def cursor_at(entry_id: int) -> StoredCursor:
    return StoredCursor(mark_delete=Position(7, entry_id), mark_delete_offset=entry_id)


async def test_cursor_versions_move_with_each_write(store: MemoryMetadataStore) -> None:
    writes = await owner(store)
    created = await writes.write_cursor("sub", cursor_at(0), 0)
    assert created > 0
    moved = await writes.write_cursor("sub", cursor_at(1), created)
    assert moved > created
    found = await writes.read_cursor("sub")
    assert found is not None
    assert found[0].mark_delete == Position(7, 1)
    assert found[1] == moved
    assert [(name, version) for name, _, version in await writes.load_cursors()] == [("sub", moved)]
    assert await writes.write_cursor("sub", None, moved) == 0
    assert await writes.read_cursor("sub") is None


async def test_a_cursor_someone_else_created_is_named(store: MemoryMetadataStore) -> None:
    writes = await owner(store)
    await writes.write_cursor("sub", cursor_at(0), 0)
    with pytest.raises(CursorAlreadyExistsError, match="'sub'"):
        await writes.write_cursor("sub", cursor_at(3), 0)
    assert writes._life.state is State.WRITING  # not a fencing


async def test_a_write_whose_answer_was_lost_is_recognised(store: MemoryMetadataStore) -> None:
    writes = await owner(store)
    version = await writes.write_cursor("sub", cursor_at(0), 0)
    again = await writes.write_cursor("sub", cursor_at(2), version)
    # the same record once more from the version before: it is there already, not a takeover
    assert await writes.write_cursor("sub", cursor_at(2), version) == again
    assert writes._life.state is State.WRITING


async def test_nothing_of_an_old_owner_lands_after_a_takeover(store: MemoryMetadataStore) -> None:
    old = await owner(store)
    version = await old.write_cursor("sub", cursor_at(0), 0)
    fenced: list[ManagedLedgerFencedError] = []
    old._life.on_fenced = fenced.append
    new = await owner(store)

    with pytest.raises(ManagedLedgerFencedError):
        await old.write_cursor("sub", cursor_at(5), version)
    assert len(fenced) == 1
    assert old._life.fenced.is_set()
    record = await store.get(layout.managed_ledger_cursor(NAME, "sub"))
    assert record is not None
    assert decode_cursor("sub", record.value).mark_delete == Position(7, 0)

    bucket = layout.managed_ledger_delay_bucket(NAME, "sub", "b1")
    with pytest.raises(ManagedLedgerFencedError):
        await old.write_guarded(bucket, b"held")
    with pytest.raises(ManagedLedgerFencedError):
        await old.update_info(lambda ledgers: ledgers)
    assert await store.get(bucket) is None

    await new.write_guarded(bucket, b"held")
    assert await new.list_records(layout.managed_ledger_delay_index(NAME, "sub")) == [
        (bucket, b"held")
    ]
    await new.update_info(lambda ledgers: [*ledgers, LedgerRecord(9, 0, created_ms=1)])
    assert [ledger.ledger_id for ledger in new._log_state.ledgers] == [7, 9]
    assert [ledger.ledger_id for ledger in new.info.ledgers] == [7, 9]


async def test_a_lost_info_swap_with_the_same_value_is_ours(store: MemoryMetadataStore) -> None:
    writes = await owner(store)
    await writes.update_info(lambda ledgers: ledgers)
    # the store holds exactly what this owner would write, at a version it did not see
    # (its answer was lost): the swap counts as done
    key = layout.managed_ledger_info(NAME)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)
    await writes.update_info(lambda ledgers: ledgers)
    assert writes._life.state is State.WRITING
