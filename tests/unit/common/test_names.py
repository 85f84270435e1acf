"""Topic names: what is accepted, what each part is, and the rule a bad name broke."""

from __future__ import annotations

import pytest

from magnetar.common.errors import ErrorCode, InvalidTopicNameError
from magnetar.common.names import TopicName, parse_base_topic, parse_topic


def test_bare_name_is_in_the_default_namespace() -> None:
    name = parse_topic("orders")
    assert name == TopicName("public", "default", "orders")
    assert name.full == "public/default/orders"
    assert not name.is_partition


def test_full_and_pulsar_style_names() -> None:
    assert parse_topic("acme/prod/orders").topic == "acme/prod/orders"
    assert parse_topic("persistent://acme/prod/orders").topic == "acme/prod/orders"


def test_partition_names_round_trip() -> None:
    topic = parse_topic("acme/prod/orders")
    third = topic.partition_name(3)
    assert third.full == "acme/prod/orders-partition-3"
    parsed = parse_topic(third.full)
    assert parsed == third
    assert parsed.is_partition
    assert parsed.base() == topic


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "empty"),
        ("a/b", "tenant/namespace/topic"),
        ("a/b/c/d", "tenant/namespace/topic"),
        ("a/b/has space", "may only hold"),
        ("a/b/.hidden", "may only hold"),
        ("x" * 201, "200"),
        ("a//c", "may only hold"),
    ],
)
def test_bad_names_say_which_rule_they_broke(name: str, rule: str) -> None:
    with pytest.raises(InvalidTopicNameError) as raised:
        parse_topic(name)
    assert rule in raised.value.message
    assert raised.value.code == ErrorCode.INVALID_TOPIC_NAME


def test_non_string_is_refused() -> None:
    with pytest.raises(InvalidTopicNameError, match="string"):
        parse_topic(42)


def test_partition_suffix_is_reserved_when_creating() -> None:
    with pytest.raises(InvalidTopicNameError, match="reserved"):
        parse_base_topic("orders-partition-1")
    assert parse_base_topic("orders-partitioned").local == "orders-partitioned"
