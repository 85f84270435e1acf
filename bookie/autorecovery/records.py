"""What autorecovery keeps in the metadata store: one record per under-replicated ledger (its
progress, listed by ``magnetar cluster under-replicated``) and the key of its election."""

from __future__ import annotations

import json
from dataclasses import dataclass

from metadata import MetadataStore

UNDER_REPLICATED = "/magnetar/underreplicated/"
LEADER = "/magnetar/autorecovery/leader"


@dataclass(frozen=True, slots=True)
class UnderReplicated:
    """One ledger's record of fragments still short of copies."""

    ledger_id: int
    lost_bookies: tuple[str, ...]
    fragments: int
    since_ms: int

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "ledger": self.ledger_id,
                "lost_bookies": list(self.lost_bookies),
                "fragments": self.fragments,
                "since_ms": self.since_ms,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnderReplicated:
        body = json.loads(data)
        return cls(
            int(body["ledger"]),
            tuple(body["lost_bookies"]),
            int(body["fragments"]),
            int(body["since_ms"]),
        )


def under_replicated_key(ledger_id: int) -> str:
    return f"{UNDER_REPLICATED}{ledger_id:020d}"


async def list_under_replicated(store: MetadataStore) -> list[UnderReplicated]:
    """What autorecovery still has to do (for ``magnetar cluster under-replicated``)."""
    listing = await store.list(UNDER_REPLICATED)
    return [UnderReplicated.from_bytes(r.value) for r in listing.records]
