"""A subscription's delayed-delivery index: which held-aside entries are in which bucket.

A shared or key_shared subscription holds entries that are not due aside (``Dispatcher.delayed``)
and reads on. Without an index, a new owner of the partition finds them only by reading every
unacknowledged entry again from the bookies: with 100,000 delayed messages that took about 45 s
before newer messages flowed. Pulsar's PIP-195 keeps a persisted, bucketed index instead, and so
does Magnetar:

- Each entry held aside joins the **open bucket** (in memory). The bucket is **sealed** when it
  holds ``bucket_entries`` entries or its first entry has waited ``seal_after_ms``, and the
  subscription writes it once, as a record of the cursor (``DelayBucket``), fenced like the
  cursor itself. A graceful close seals and writes what is open.
- A bucket is deleted once none of its entries waits any more (each became due, or was
  acknowledged or expired). A bucket never changes after it is written: entries leave it only
  in memory.
- A new owner loads the buckets, holds every entry that is not acknowledged aside again, and
  tells its cursor to jump over them when it reads. Only entries held aside after the last seal
  (at most ``seal_after_ms`` of them, or ``bucket_entries``) are read again.

Every entry in a bucket is an entry that really carries a later delivery time, so a stale bucket
(one the old owner was still writing when it lost the partition, say) can only make a new owner
hold aside entries that it would have held aside anyway: loading is always safe, and the index
needs no transaction with the cursor's acknowledgements.

This module is the bookkeeping, without I/O; :class:`broker.service.subscription.Subscription`
writes, deletes and loads the buckets through its cursor.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from broker.managed_ledger import DelayedEntry, Position

MAX_BUCKET_BYTES = 512 * 1024
"""A bucket is sealed at about this size whatever its entry count (entries of batches with a key
per message carry a hash per message), well within the metadata store's request limit."""


def _size(entry: DelayedEntry) -> int:
    """About what an entry takes in a written bucket."""
    return 16 + 5 * len(entry.key_hashes)


class DelayIndex:
    """The buckets of one subscription's delay index (see the module doc)."""

    def __init__(self, *, bucket_entries: int = 5_000, seal_after_ms: int = 5_000) -> None:
        self.bucket_entries = bucket_entries
        """Entries that seal the open bucket (0: no index is kept)."""
        self.seal_after_ms = seal_after_ms
        self._open: dict[Position, DelayedEntry] = {}
        self._open_since_ms: int | None = None
        self._open_bytes = 0
        self._bucket_of: dict[Position, str] = {}
        self._waiting: dict[str, int] = {}
        """Sealed buckets with entries still held aside: how many."""
        self.unwritten: dict[str, tuple[DelayedEntry, ...]] = {}
        """Sealed buckets to write, oldest first."""
        self.undeleted: set[str] = set()
        """Written buckets none of whose entries waits any more: to delete."""
        self._writing: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self.bucket_entries > 0

    @property
    def buckets(self) -> int:
        """Sealed buckets with entries still waiting."""
        return len(self._waiting)

    @property
    def open_entries(self) -> int:
        return len(self._open)

    @property
    def has_work(self) -> bool:
        """Something to seal, write or delete, now or later."""
        return bool(self._open or self.unwritten or self.undeleted)

    def add(self, entry: DelayedEntry, now_ms: int) -> None:
        """An entry read from the log was held aside: it joins the open bucket."""
        if not self.enabled or entry.position in self._bucket_of:
            return
        if not self._open:
            self._open_since_ms = now_ms
        self._open[entry.position] = entry
        self._open_bytes += _size(entry)

    def loaded(self, bucket: str, waiting: Iterable[Position]) -> None:
        """A persisted bucket was loaded; ``waiting``: its entries held aside again (the others
        were acknowledged). A bucket with none waiting is deleted."""
        positions = [p for p in waiting if p not in self._bucket_of]
        if not positions:
            self.undeleted.add(bucket)
            return
        for position in positions:
            self._bucket_of[position] = bucket
        self._waiting[bucket] = len(positions)

    def released(self, position: Position) -> None:
        """An entry no longer waits: it became due, or was acknowledged or expired."""
        entry = self._open.pop(position, None)
        if entry is not None:
            self._open_bytes -= _size(entry)
            if not self._open:
                self._open_since_ms = None
            return
        bucket = self._bucket_of.pop(position, None)
        if bucket is None:
            return
        left = self._waiting[bucket] - 1
        if left > 0:
            self._waiting[bucket] = left
            return
        del self._waiting[bucket]
        if self.unwritten.pop(bucket, None) is None or bucket in self._writing:
            self.undeleted.add(bucket)  # written (or being written): delete it

    def seal_due(self, now_ms: int) -> bool:
        since = self._open_since_ms
        return since is not None and (
            len(self._open) >= self.bucket_entries
            or self._open_bytes >= MAX_BUCKET_BYTES
            or now_ms >= since + self.seal_after_ms
        )

    def next_seal_ms(self) -> int | None:
        """When the open bucket is sealed at the latest (None: it is empty)."""
        if self._open_since_ms is None:
            return None
        return self._open_since_ms + self.seal_after_ms

    def seal(self, now_ms: int) -> str | None:
        """Seal the open bucket (if it holds anything): its name, now in :attr:`unwritten`."""
        if not self._open:
            return None
        name = f"{now_ms:013d}-{secrets.token_hex(4)}"
        entries = tuple(sorted(self._open.values(), key=lambda e: e.position))
        for entry in entries:
            self._bucket_of[entry.position] = name
        self._waiting[name] = len(entries)
        self.unwritten[name] = entries
        self._open.clear()
        self._open_since_ms = None
        self._open_bytes = 0
        return name

    def writing(self, bucket: str) -> None:
        self._writing.add(bucket)

    def written(self, bucket: str, *, ok: bool) -> None:
        """A write of ``bucket`` ended (``ok``: it is persisted)."""
        self._writing.discard(bucket)
        if ok:
            self.unwritten.pop(bucket, None)
        # a failed write stays in unwritten (tried again) unless the bucket emptied meanwhile:
        # then it is in undeleted, in case the write went through and only its answer was lost

    def deleted(self, bucket: str) -> None:
        self.undeleted.discard(bucket)

    def clear(self) -> None:
        """Forget everything (a seek or reset, whose cursor deletes the persisted buckets)."""
        self._open.clear()
        self._open_since_ms = None
        self._open_bytes = 0
        self._bucket_of.clear()
        self._waiting.clear()
        self.unwritten.clear()
        self.undeleted.clear()
        self._writing.clear()
