"""Cluster-unique, monotonic ids (ledger ids) from any metadata store.

Every write transaction advances the store's revision by exactly one, and a put returns the
revision that wrote it. So an unconditional put of one counter key hands out a revision that no
other allocation anywhere in the cluster can get. It is larger than every id handed out before it
completed, and it costs one round trip: there is no read-modify-write, so allocators never
conflict or retry. Ids are not dense (other writes consume revisions too), which ledger ids do not
need.
"""

from __future__ import annotations

from metadata.api import MetadataStore
from metadata.keys import check_key


class IdAllocator:
    """Hands out ids from the counter key at ``path``."""

    def __init__(self, store: MetadataStore, path: str) -> None:
        self.store = store
        self.path = check_key(path)

    async def next_id(self) -> int:
        """A new id: unique in the cluster and greater than any id allocated before this call."""
        return await self.store.put(self.path, b"")
