"""The ledger-client calls several jobs of a managed ledger make: create one of its ledgers,
delete one quietly, and recover the last one when a new owner opens it."""

from __future__ import annotations

import structlog

from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.ledger_list import LedgerRecord
from broker.managed_ledger.ports import LedgerClientApi, LedgerReader, LedgerWriter
from broker.managed_ledger.types import EntryCodec
from magnetar.common.errors import LedgerNotFoundError, MagnetarError, ManagedLedgerError

log = structlog.get_logger("magnetar.managed_ledger")

LEDGER_PROPERTY = "managed-ledger"
"""Custom metadata key on every ledger a managed ledger creates: its name (finds orphans)."""


async def create_ledger(
    client: LedgerClientApi, config: ManagedLedgerConfig, name: str
) -> LedgerWriter:
    return await client.create_ledger(
        ensemble_size=config.ensemble_size,
        write_quorum=config.write_quorum,
        ack_quorum=config.ack_quorum,
        custom={LEDGER_PROPERTY: name.encode()},
    )


async def delete_quietly(client: LedgerClientApi, ledger_id: int, name: str) -> None:
    try:
        await client.delete_ledger(ledger_id)
    except LedgerNotFoundError:
        pass
    except MagnetarError as e:
        log.warning("ledger_delete_failed", managed_ledger=name, ledger=ledger_id, error=e.message)


async def recover_last(
    client: LedgerClientApi, codec: EntryCodec, name: str, last: LedgerRecord
) -> LedgerReader | None:
    """Recover (fence and close) the last ledger and update its counts from its real end.

    Returns its read handle, or ``None`` if it holds no entry.
    """
    try:
        reader = await client.open_ledger(last.ledger_id, recovery=True)
    except LedgerNotFoundError:
        if last.entries == 0:
            return None  # created, listed, never written, and since deleted
        raise ManagedLedgerError(
            f"ledger {last.ledger_id} of managed ledger {name!r} holds {last.entries} entries"
            " in the info but has no metadata: its data is lost",
            context={"name": name, "ledger": last.ledger_id},
        ) from None
    last_entry_id = reader.last_add_confirmed
    if last_entry_id < 0:
        return None
    (entry,) = await reader.read(last_entry_id, last_entry_id)
    meta = codec.describe(entry.payload)
    entries = last_entry_id + 1
    if reader.metadata.length >= 0:
        size = reader.metadata.length
    elif last.entries == entries and last.size_bytes > 0:
        size = last.size_bytes
    else:
        # recovery records no length: estimate from the last entry (see docs/managed-ledger.md)
        size = len(entry.payload) * entries
    last.entries = entries
    last.size_bytes = size
    last.messages = meta.first_offset + meta.num_messages - last.first_offset
    last.last_publish_time_ms = meta.publish_time_ms
    log.info(
        "managed_ledger_last_ledger_recovered",
        managed_ledger=name,
        ledger=last.ledger_id,
        entries=entries,
        next_offset=meta.first_offset + meta.num_messages,
    )
    return reader
