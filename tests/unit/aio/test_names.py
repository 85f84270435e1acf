"""Service URLs and topic names, as a user types them."""

from __future__ import annotations

import pytest

from magnetar.aio.names import (
    TopicName,
    parse_broker_url,
    parse_service_url,
    parse_topic,
    uses_tls,
)
from magnetar.common.errors import InvalidServiceUrlError, InvalidTopicNameError


@pytest.mark.parametrize(
    ("url", "targets"),
    [
        ("magnetar://localhost:6650", ("localhost:6650",)),
        ("magnetar://localhost", ("localhost:6650",)),
        ("magnetar://h1:6650,h2:6651", ("h1:6650", "h2:6651")),
        ("magnetar://h1:6650, h2:6650/", ("h1:6650", "h2:6650")),
        ("magnetar://h1:6650,h1:6650", ("h1:6650",)),
        ("magnetar://10.0.0.1:7000", ("10.0.0.1:7000",)),
        ("magnetar://[::1]:6650,[fe80::1]", ("[::1]:6650", "[fe80::1]:6650")),
        ("magnetar+ssl://broker.example", ("broker.example:6651",)),
        ("magnetar+ssl://b1:7651,b2", ("b1:7651", "b2:6651")),
    ],
)
def test_service_urls_become_grpc_targets(url: str, targets: tuple[str, ...]) -> None:
    assert parse_service_url(url) == targets
    assert uses_tls(url) == url.startswith("magnetar+ssl://")


@pytest.mark.parametrize(
    "url",
    [
        "pulsar://localhost:6650",
        "magnetar+tls://localhost:6651",
        "magnetar+ssl://",
        "localhost:6650",
        "magnetar://",
        "magnetar://h1:6650,,h2",
        "magnetar://h1:0",
        "magnetar://h1:70000",
        "magnetar://h 1:6650",
        "magnetar://h1:port",
        6650,
    ],
)
def test_bad_service_urls_are_refused_with_the_expected_form(url: object) -> None:
    with pytest.raises(InvalidServiceUrlError) as info:
        parse_service_url(url)
    assert "magnetar://host:port" in info.value.message


def test_a_broker_url_names_one_broker() -> None:
    assert parse_broker_url("magnetar://b1:6650") == "b1:6650"
    assert parse_broker_url("magnetar+ssl://b1:6651") == "b1:6651"
    with pytest.raises(InvalidServiceUrlError):
        parse_broker_url("magnetar://b1:6650,b2:6650")


@pytest.mark.parametrize(
    ("name", "full", "partition"),
    [
        ("orders", "public/default/orders", -1),
        ("acme/sales/orders", "acme/sales/orders", -1),
        ("persistent://acme/sales/orders", "acme/sales/orders", -1),
        ("acme/sales/orders-partition-3", "acme/sales/orders-partition-3", 3),
        ("orders-partition-0", "public/default/orders-partition-0", 0),
    ],
)
def test_topic_names_are_normalized(name: str, full: str, partition: int) -> None:
    topic = parse_topic(name)
    assert (topic.full, topic.partition, str(topic)) == (full, partition, full)
    assert topic.is_partition == (partition >= 0)


def test_partition_names_derive_from_the_topic() -> None:
    topic = parse_topic("acme/sales/orders")
    assert topic.partition_name(2) == TopicName("acme", "sales", "orders", 2)
    assert topic.partition_name(2).topic == "acme/sales/orders"


@pytest.mark.parametrize("name", ["", "a/b", "a/b/c/d", "a/b/.c", "a b", None])
def test_bad_topic_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidTopicNameError):
        parse_topic(name)
