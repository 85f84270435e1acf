"""Client, producer and consumer settings: checked when made, named when wrong."""

from __future__ import annotations

import pytest

from magnetar.aio import Client, ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.common.config import field_docs, missing_field_docs
from magnetar.common.errors import InvalidConfigError, InvalidServiceUrlError


@pytest.mark.parametrize("cls", [ClientConfig, ProducerConfig, ConsumerConfig])
def test_every_setting_has_a_docstring(cls: type) -> None:
    assert missing_field_docs(cls) == []
    assert field_docs(cls)


@pytest.mark.parametrize(
    ("cls", "settings", "field"),
    [
        (ClientConfig, {"operation_timeout_s": 0}, "operation_timeout_s"),
        (ClientConfig, {"initial_backoff_ms": 500, "max_backoff_ms": 100}, "max_backoff_ms"),
        (ProducerConfig, {"batching_max_messages": 0}, "batching_max_messages"),
        (ProducerConfig, {"compression": "lz4"}, "compression"),
        (ProducerConfig, {"producer_name": ""}, "producer_name"),
        (ProducerConfig, {"send_timeout_ms": -1}, "send_timeout_ms"),
        (ProducerConfig, {"batching_self_clocking": "yes"}, "batching_self_clocking"),
        (ConsumerConfig, {"subscription_name": ""}, "subscription_name"),
        (ConsumerConfig, {"subscription_name": "s", "subscription_type": "x"}, "subscription_type"),
        (ConsumerConfig, {"subscription_name": "s", "initial_position": "x"}, "initial_position"),
        (
            ConsumerConfig,
            {"subscription_name": "s", "receiver_queue_size": 0},
            "receiver_queue_size",
        ),
    ],
)
def test_bad_settings_name_their_field(cls: type, settings: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        cls(**settings)
    assert info.value.context["field"] == field


def test_a_client_takes_a_url_and_settings_or_a_config() -> None:
    client = Client("magnetar://b1:6650,b2:6650", operation_timeout_s=5)
    assert client.config.operation_timeout_s == 5
    assert client.config.service_url == "magnetar://b1:6650,b2:6650"
    config = ClientConfig(service_url="magnetar://b1:6650")
    assert Client(config).config is config
    assert Client(config, connection_timeout_ms=7).config.connection_timeout_ms == 7


def test_a_client_refuses_a_bad_url_and_unknown_settings_at_once() -> None:
    with pytest.raises(InvalidServiceUrlError):
        Client("http://b1:6650")
    with pytest.raises(InvalidConfigError) as info:
        Client("magnetar://b1:6650", operation_timeout=5)
    assert "operation_timeout" in info.value.message
