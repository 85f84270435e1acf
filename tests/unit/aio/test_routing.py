"""Partition routing: keys stick to a partition; keyless messages go round robin per batch."""

from __future__ import annotations

import random

import pytest

from magnetar.aio.routing import PartitionRouter, key_partition


def test_a_key_always_lands_on_the_same_partition() -> None:
    router = PartitionRouter(8, rng=random.Random(1))
    for key in ("a", "order-17", "ключ", ""):
        first = router.partition_for(key)
        assert all(router.partition_for(key) == first for _ in range(10))
        assert first == key_partition(key, 8)
        router.batch_sealed(first)
        assert router.partition_for(key) == first


def test_keys_spread_over_the_partitions() -> None:
    counts = [0] * 4
    for i in range(4000):
        counts[key_partition(f"key-{i}", 4)] += 1
    assert min(counts) > 800


def test_key_partitions_are_stable_across_processes() -> None:
    # crc32, not hash(): these values must never change, or keys move between partitions
    # crc32("a") = 0xE8B7BE43, crc32("b") = 0x71BEEFF9
    assert [key_partition(k, 16) for k in ("a", "b", "order-17")] == [3, 9, 4]


def test_keyless_messages_fill_one_partition_until_its_batch_is_sealed() -> None:
    router = PartitionRouter(3, rng=random.Random(7))
    start = router.partition_for(None)
    assert all(router.partition_for(None) == start for _ in range(5))
    router.batch_sealed((start + 1) % 3)  # another partition's batch: no move
    assert router.partition_for(None) == start
    seen = []
    for _ in range(6):
        partition = router.partition_for(None)
        seen.append(partition)
        router.batch_sealed(partition)
    assert seen == [(start + i) % 3 for i in range(6)]


def test_a_single_partition_takes_everything() -> None:
    router = PartitionRouter(1)
    assert router.partition_for(None) == router.partition_for("k") == 0


def test_a_router_needs_a_partition() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PartitionRouter(0)
