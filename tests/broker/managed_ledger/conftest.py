"""Managed ledgers over in-memory ledgers or real bookies, one memory store.

``ml_env`` is, by default, the in-memory ledger client of ``magnetar.testing.fake_ledgers``
(fast, with fault hooks); a test that needs bookies (stopping one, reading replicas, the
ledger client's own rules) asks for real ones with ``@pytest.mark.parametrize("ml_env",
["real"], indirect=True)`` (or ``pytestmark``), which starts three bookies in this process (real
gRPC, real files). ``env.factory(...)`` makes a managed ledger factory (a broker's), with the
test codec below; two factories on the same environment are two brokers competing for the same
managed ledgers.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bookie.client.bookie_client import BookieClient
from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_client import LedgerClient
from bookie.process import BookieProcess
from broker.managed_ledger import (
    AppendResult,
    EntryCache,
    EntryMeta,
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
)
from broker.managed_ledger.ports import LedgerClientApi
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.testing.eventually import eventually
from magnetar.testing.fake_ledgers import FakeBookies, FakeLedgerClient
from magnetar.testing.inprocess import start_bookie_in_process
from metadata import MetadataStore, open_store

_HEADER = struct.Struct(">qiq")


class HeaderCodec:
    """Payload = (first_offset, num_messages, publish_time_ms) header + body."""

    def describe(self, payload: bytes) -> EntryMeta:
        first_offset, num_messages, publish_time_ms = _HEADER.unpack_from(payload)
        return EntryMeta(first_offset, num_messages, publish_time_ms)


def encode(first_offset: int, num_messages: int, publish_time_ms: int, body: bytes) -> bytes:
    return _HEADER.pack(first_offset, num_messages, publish_time_ms) + body


def body_of(payload: bytes) -> bytes:
    return payload[_HEADER.size :]


def builder(num_messages: int, body: bytes) -> Callable[[int, int], bytes]:
    return lambda first_offset, publish_time_ms: encode(
        first_offset, num_messages, publish_time_ms, body
    )


def append(ml: ManagedLedger, body: bytes, num_messages: int = 1) -> asyncio.Future[AppendResult]:
    return ml.append(num_messages, builder(num_messages, body))


async def append_all(
    ml: ManagedLedger, bodies: list[bytes], num_messages: int = 1
) -> list[AppendResult]:
    return list(await asyncio.gather(*(append(ml, b, num_messages) for b in bodies)))


FAST = ManagedLedgerConfig(
    min_ledger_age_ms=0,
    cursor_persist_interval_ms=0,
    retention_time_ms=-1,
    retention_size_bytes=-1,
)
"""Rolls as soon as a limit is reached; cursors persisted on every change; nothing trimmed."""


class Env:
    """Three bookies (or in-memory ledgers: ``fake``), a memory store, a ledger client, and
    factories (brokers) on them."""

    def __init__(self, root: Path, store: MetadataStore, *, fake: bool = False) -> None:
        self.root = root
        self.store = store
        self.fake = FakeBookies() if fake else None
        """The in-memory ledgers (None: real bookies), with their fault hooks."""
        self.bookies: dict[str, BookieProcess] = {}
        self.clients: list[LedgerClient | FakeLedgerClient] = []
        self.factories: list[ManagedLedgerFactory] = []
        self.client: Any
        """The first ledger client (a ``LedgerClient``, or a ``FakeLedgerClient``)."""

    async def start_bookie(self, bookie_id: str) -> BookieProcess:
        process = await start_bookie_in_process(self.store, self.root / bookie_id, bookie_id)
        self.bookies[bookie_id] = process
        return process

    async def stop_bookie(self, bookie_id: str) -> None:
        await self.bookies.pop(bookie_id).stop(grace_s=0)

    async def new_client(self, **config: object) -> Any:
        if self.fake is not None:
            fake_client = self.fake.client()
            self.clients.append(fake_client)
            return fake_client
        client = await LedgerClient.start(
            self.store,
            LedgerClientConfig(**config),  # type: ignore[arg-type]
        )
        self.clients.append(client)
        await eventually(
            lambda: len(client.view.bookies) >= len(self.bookies),
            what="every bookie in the client's view",
            interval_s=0.01,
        )
        return client

    def factory(
        self,
        client: LedgerClientApi | None = None,
        *,
        config: ManagedLedgerConfig = FAST,
        cache: EntryCache | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> ManagedLedgerFactory:
        factory = ManagedLedgerFactory(
            self.store,
            client or self.client,
            codec=HeaderCodec(),
            config=config,
            cache=cache,
            clock=clock,
        )
        self.factories.append(factory)
        return factory

    async def ledgers_on_bookies(self) -> set[int]:
        """Every ledger id any running bookie stores (asked with ListLedgers)."""
        if self.fake is not None:
            return self.fake.ledger_ids()
        found: set[int] = set()
        for process in self.bookies.values():
            client = BookieClient(process.data_address)
            try:
                ids, more = await client.list_ledgers(limit=10_000)
            finally:
                await client.close()
            assert not more
            found.update(ids)
        return found

    async def ledgers_in_metadata(self) -> set[int]:
        return set(await self.client.ledgers.ledger_ids())


@pytest.fixture
async def ml_env(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    kind = getattr(request, "param", "fake")
    if kind not in ("fake", "real"):
        raise ValueError(f"ml_env is 'fake' or 'real', not {kind!r}")
    store = await open_store("memory://")
    env = Env(tmp_path, store, fake=kind == "fake")
    if kind == "real":
        for i in range(3):
            await env.start_bookie(f"b{i}")
    env.client = await env.new_client()
    yield env
    for factory in env.factories:
        await factory.close()
    for client in env.clients:
        await client.close()
    for bookie in list(env.bookies.values()):
        await bookie.stop(grace_s=0)
    await store.close()
