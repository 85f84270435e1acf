"""The real ledger client (and the test kit's fake), and the real managed ledger, have the
shapes the managed ledger's protocols describe.

The assignments below are checked by mypy (``tests`` are type-checked): if the ledger client's
methods or handles, or the managed ledger's calls for its cursors, change shape, this file stops
type-checking.
"""

from __future__ import annotations

import ast
import inspect
import typing

from bookie.client import write_handle
from bookie.client.ledger_client import LedgerClient
from bookie.client.ledger_metadata import LedgerMetadata
from bookie.client.read_handle import LedgerEntry, ReadHandle
from bookie.client.write_handle import WriteHandle
from broker.managed_ledger import cursor, ports
from broker.managed_ledger.managed_ledger import ManagedLedger
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


def hosts(ml: ManagedLedger) -> ports.CursorHost:
    return ml


def host_members() -> set[str]:
    return {
        name
        for name, value in vars(ports.CursorHost).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def test_the_managed_ledger_has_every_call_of_the_cursor_host() -> None:
    members = host_members()
    assert {"read", "check_ackable", "start_state", "write_cursor", "cursor_moved"} <= members
    instance_attributes = {"name", "config"}  # set in ManagedLedger.__init__
    missing = members - instance_attributes - set(dir(ManagedLedger))
    assert not missing, f"the managed ledger lacks {sorted(missing)}"
    for name in members - instance_attributes:
        assert not name.startswith("_")
        ours = getattr(ManagedLedger, name)
        theirs = getattr(ports.CursorHost, name)
        assert isinstance(ours, property) == isinstance(theirs, property), name
        if not isinstance(ours, property):
            assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs), name
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(theirs).parameters
            ), name


def test_the_cursor_calls_its_host_through_the_protocol_only() -> None:
    """Every ``self._host.<name>`` in the cursor names a member of :class:`CursorHost`, and the
    cursor module imports nothing of the managed ledger module."""
    tree = ast.parse(inspect.getsource(cursor))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_host"
    }
    assert used
    assert used <= host_members(), sorted(used - host_members())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "broker.managed_ledger.managed_ledger" not in imported
    hints = typing.get_type_hints(cursor.ManagedCursor.__init__, vars(cursor) | vars(ports))
    assert hints["host"] is ports.CursorHost
