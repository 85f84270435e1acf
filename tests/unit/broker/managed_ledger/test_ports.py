"""The real ledger client (and the test kit's fake) has the shape the managed ledger's
protocols describe.

The assignments below are checked by mypy (``tests`` are type-checked): if the ledger client's
methods or handles change shape, this file stops type-checking.
"""

from __future__ import annotations

from bookie.client import write_handle
from bookie.client.ledger_client import LedgerClient
from bookie.client.ledger_metadata import LedgerMetadata
from bookie.client.read_handle import LedgerEntry, ReadHandle
from bookie.client.write_handle import WriteHandle
from broker.managed_ledger import ports
from magnetar.testing.fake_ledgers import (
    FakeEntry,
    FakeLedgerClient,
    FakeMetadata,
    FakeReader,
    FakeWriter,
)


def fits(
    client: LedgerClient, reader: ReadHandle, writer: WriteHandle, metadata: LedgerMetadata
) -> list[object]:
    as_client: ports.LedgerClientApi = client
    as_reader: ports.LedgerReader = reader
    as_writer: ports.LedgerWriter = writer
    as_metadata: ports.LedgerMetadataView = metadata
    entry: ports.LedgerEntryView = LedgerEntry(1, 2, b"")
    return [as_client, as_reader, as_writer, as_metadata, entry]


def test_the_entry_size_limit_is_the_ledger_clients() -> None:
    assert ports.MAX_ENTRY_BYTES == write_handle.MAX_ENTRY_BYTES


def fake_fits(
    client: FakeLedgerClient, reader: FakeReader, writer: FakeWriter, metadata: FakeMetadata
) -> list[object]:
    """The test kit's in-memory ledger client has the same shape (mypy checks this too)."""
    as_client: ports.LedgerClientApi = client
    as_reader: ports.LedgerReader = reader
    as_writer: ports.LedgerWriter = writer
    as_metadata: ports.LedgerMetadataView = metadata
    entry: ports.LedgerEntryView = FakeEntry(1, 2, b"")
    return [as_client, as_reader, as_writer, as_metadata, entry]
