"""Reading a ledger: entries up to the LAC (or the end of a closed ledger), from any replica.

For each entry the handle asks one replica of its write set, grouping the entries per bookie into
one listed read each. Entries a replica does not return (missing, damaged, wrong checksum, or the
bookie failed) are asked of the next replica. A replica that has not answered within
``speculative_read_delay_ms`` gets company: the same entries also go to the next replica, and
the first intact answer wins, so one slow bookie does not slow the reader. Every entry's CRC32C
is checked before it is returned.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

import structlog

from bookie.client.ledger_metadata import LedgerMetadata
from bookie.entries import entry_checksum
from magnetar.common.errors import (
    BookieUnavailableError,
    CorruptionError,
    InvalidArgumentError,
    LedgerError,
    MagnetarError,
    NoSuchLedgerError,
    ReadBeyondLacError,
)

if TYPE_CHECKING:
    from bookie.client.ledger_client import LedgerClient

log = structlog.get_logger("magnetar.ledger.read")


class LedgerEntry(NamedTuple):
    ledger_id: int
    entry_id: int
    payload: bytes


def check_readable(ledger_id: int, first_entry_id: int, last_entry_id: int, lac: int) -> None:
    """That entries ``first..last`` of a ledger confirmed up to ``lac`` may be read:
    InvalidArgumentError for a range that is none, ReadBeyondLacError past the LAC."""
    if first_entry_id < 0 or last_entry_id < first_entry_id:
        raise InvalidArgumentError(
            f"a read needs 0 <= first <= last, got {first_entry_id}..{last_entry_id}"
        )
    if last_entry_id > lac:
        raise ReadBeyondLacError(
            f"ledger {ledger_id} is confirmed up to entry {lac};"
            f" entry {last_entry_id} may not be read",
            context={"ledger": ledger_id, "lac": lac},
        )


class ReadHandle:
    """Reads one ledger. Obtain from :meth:`LedgerClient.open_ledger`."""

    def __init__(self, client: LedgerClient, metadata: LedgerMetadata, last_add_confirmed: int):
        self._client = client
        self.metadata = metadata
        self.last_add_confirmed = last_add_confirmed

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` inclusive, each intact (checksum verified)."""
        check_readable(self.ledger_id, first_entry_id, last_entry_id, self.last_add_confirmed)
        found = await self._read(list(range(first_entry_id, last_entry_id + 1)))
        return [found[e] for e in range(first_entry_id, last_entry_id + 1)]

    async def _read(self, entry_ids: list[int]) -> dict[int, LedgerEntry]:
        metadata = self.metadata
        config = self._client.config
        found: dict[int, LedgerEntry] = {}
        tried: dict[int, int] = dict.fromkeys(entry_ids, 0)
        failures: dict[int, MagnetarError] = {}
        unreachable: set[int] = set()
        """Entries a replica could not be asked for (down, cut off, timed out)."""
        in_flight: dict[asyncio.Task[None], list[int]] = {}
        delay = config.speculative_read_delay_ms / 1000

        def launch(wanted: list[int]) -> None:
            groups: dict[str, list[int]] = defaultdict(list)
            for entry_id in wanted:
                replicas = metadata.write_set(entry_id)
                if tried[entry_id] < len(replicas):
                    groups[replicas[tried[entry_id]]].append(entry_id)
                    tried[entry_id] += 1
            for bookie, ids in groups.items():
                task = asyncio.ensure_future(self._fetch(bookie, ids, found, failures, unreachable))
                in_flight[task] = ids

        launch(entry_ids)
        try:
            # done when every entry is in, even if a slow replica is still busy (it is cancelled)
            while in_flight and len(found) < len(entry_ids):
                done, _ = await asyncio.wait(
                    in_flight, timeout=delay or None, return_when=asyncio.FIRST_COMPLETED
                )
                retry: list[int] = []
                for task in done:
                    retry += [e for e in in_flight.pop(task) if e not in found]
                if not done:
                    # slow replicas: ask the next ones too, keep the first ones going
                    for ids in in_flight.values():
                        retry += [e for e in ids if e not in found]
                retry = sorted(set(retry))
                launch(retry)
        finally:
            for task in in_flight:
                task.cancel()
        missing = [e for e in entry_ids if e not in found]
        if missing:
            first = missing[0]
            cause = failures.get(first)
            error_class: type[LedgerError] | type[CorruptionError] = LedgerError
            if isinstance(cause, CorruptionError):
                error_class = CorruptionError
            elif first in unreachable:
                # a replica that could not be asked may well hold it: worth asking again
                # (magnetar verify seed 20261121 saw a broker cut off from the bookies fail a
                # partition's load with a final error, and its producers gave up for good)
                error_class = BookieUnavailableError
            raise error_class(
                f"entry {first} of ledger {self.ledger_id} could not be read from any of its"
                f" replicas {list(metadata.write_set(first))}"
                + (f": {cause.message}" if cause else ""),
                context={"ledger": self.ledger_id, "entry": first},
            )
        return found

    async def _fetch(
        self,
        bookie: str,
        entry_ids: list[int],
        found: dict[int, LedgerEntry],
        failures: dict[int, MagnetarError],
        unreachable: set[int],
    ) -> None:
        timeout = self._client.config.read_timeout_ms / 1000
        try:
            client = self._client.pool.client(bookie)
            result = await client.read_entries(
                self.ledger_id,
                entry_ids[0],
                entry_ids[-1],
                entry_ids=entry_ids,
                max_bytes=1 << 30,
                timeout_s=timeout,
            )
        except (MagnetarError, TimeoutError) as e:
            error = e if isinstance(e, MagnetarError) else BookieUnavailableError(str(e))
            for entry_id in entry_ids:
                failures.setdefault(entry_id, error)
            if error.retriable:
                unreachable.update(entry_ids)
            if not isinstance(e, NoSuchLedgerError):
                log.info("ledger_read_failed", ledger=self.ledger_id, bookie=bookie, error=str(e))
            return
        for entry in result.entries:
            if entry.entry_id in found:
                continue
            if (
                entry_checksum(
                    self.ledger_id, entry.entry_id, entry.last_add_confirmed, entry.payload
                )
                != entry.crc32c
            ):
                failures[entry.entry_id] = CorruptionError(
                    f"entry {entry.entry_id} of ledger {self.ledger_id} from bookie {bookie}"
                    " failed its checksum",
                    context={"ledger": self.ledger_id, "entry": entry.entry_id},
                )
                continue
            found[entry.entry_id] = LedgerEntry(self.ledger_id, entry.entry_id, entry.payload)

    async def refresh_lac(self, *, wait_ms: int = 0) -> int:
        """Ask the last ensemble for the LAC (long-polling up to ``wait_ms`` for it to move)."""
        if self.metadata.closed:
            return self.last_add_confirmed
        bookies = self.metadata.last_segment.bookies

        async def ask(bookie: str) -> int:
            client = self._client.pool.client(bookie)
            answer = await client.read_lac(
                self.ledger_id, previous_lac=self.last_add_confirmed, timeout_ms=wait_ms
            )
            return answer.last_add_confirmed

        results = await asyncio.gather(*(ask(b) for b in bookies), return_exceptions=True)
        lacs = [r for r in results if isinstance(r, int)]
        if lacs:
            self.last_add_confirmed = max(self.last_add_confirmed, *lacs)
        return self.last_add_confirmed

    async def close(self) -> None:
        """Nothing to release: connections belong to the client."""
