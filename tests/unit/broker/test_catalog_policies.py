"""A topic's own policies change in place: the ones set change, the ones removed go back to the
broker's setting, the others stay; unknown names and bad values are refused, naming them."""

from __future__ import annotations

import pytest

from broker.service.catalog import TopicCatalog
from broker.service.records import TopicPolicies
from magnetar.common.errors import InvalidArgumentError, TopicNotFoundError
from magnetar.common.names import parse_topic
from metadata.memory import MemoryMetadataStore


async def test_policies_are_set_and_removed_one_by_one() -> None:
    catalog = TopicCatalog(MemoryMetadataStore())
    name = parse_topic("t/n/orders")
    await catalog.create(
        name, 3, policies=TopicPolicies(message_ttl_ms=60_000), properties={"team": "a"}
    )
    record = await catalog.update_policies(name, TopicPolicies(deduplication=False))
    assert record.policies == TopicPolicies(message_ttl_ms=60_000, deduplication=False)
    assert (record.partitions, record.properties) == (3, {"team": "a"})
    record = await catalog.update_policies(name, TopicPolicies(), ["deduplication"])
    assert record.policies == TopicPolicies(message_ttl_ms=60_000)
    # removing wins over setting the same policy in one change
    record = await catalog.update_policies(
        name, TopicPolicies(deduplication=True), ["deduplication", "message_ttl_ms"]
    )
    assert record.policies == TopicPolicies()
    assert await catalog.require(name) == record


async def test_bad_changes_are_refused_naming_what_was_wrong() -> None:
    catalog = TopicCatalog(MemoryMetadataStore())
    name = parse_topic("t/n/orders")
    with pytest.raises(TopicNotFoundError, match="t/n/orders"):
        await catalog.update_policies(name, TopicPolicies(deduplication=True))
    await catalog.create(name, 0)
    with pytest.raises(InvalidArgumentError, match="no such topic policy: dedup;"):
        await catalog.update_policies(name, TopicPolicies(), ["dedup"])
    with pytest.raises(InvalidArgumentError, match="message_ttl_ms is >= 0"):
        await catalog.update_policies(name, TopicPolicies(message_ttl_ms=-5))
    assert (await catalog.require(name)).policies == TopicPolicies()
