"""Which partition a message goes to.

A message with a partition key goes to ``crc32(key) % partitions``: the same key always lands on
the same partition (while the partition count stays), which is what per-key order needs. Keyless
messages go round robin *per batch*: they all join one partition's batch until that batch is
sealed, then the next partition takes over. Spreading single messages would cut every batch into
``partitions`` small ones and multiply the stream messages.
"""

from __future__ import annotations

import random
import zlib

__all__ = ["PartitionRouter", "key_partition"]


def key_partition(partition_key: str, partitions: int) -> int:
    """The partition of a key: stable across processes and runs (unlike ``hash()``)."""
    return zlib.crc32(partition_key.encode()) % partitions


class PartitionRouter:
    """Chooses partitions for one producer; keyless round robin starts at a random partition."""

    def __init__(self, partitions: int, *, rng: random.Random | None = None) -> None:
        if partitions < 1:
            raise ValueError(f"need at least one partition, got {partitions}")
        self.partitions = partitions
        # a random start spreads many producers' first batches over the partitions
        self.keyless = (rng or random.Random()).randrange(partitions)  # noqa: S311
        """The partition keyless messages go to now (what ``partition_for(None)`` returns)."""

    def partition_for(self, partition_key: str | None) -> int:
        if self.partitions == 1:
            return 0
        if partition_key is not None:
            return key_partition(partition_key, self.partitions)
        return self.keyless

    def batch_sealed(self, partition: int) -> None:
        """A partition sealed a batch: if keyless messages were filling it, move on."""
        if partition == self.keyless:
            self.keyless = (self.keyless + 1) % self.partitions
