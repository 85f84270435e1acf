"""The TLS Pulsar listener's settings: its port (beside Magnetar's), the standalone giving it
Pulsar's 6651 when asked, and the ready lines the test kit reads its URL from."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bookie.client.config import LedgerClientConfig
from broker.service.config import DEFAULT_PULSAR_PORT, DEFAULT_PULSAR_TLS_PORT, BrokerConfig
from magnetar.cli.standalone import StandaloneConfig
from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.errors import InvalidConfigError
from magnetar.testing.cluster import BrokerNode, StandaloneNode

CERT, KEY = Path("/tls/broker.pem"), Path("/tls/broker.key")


def test_the_default_pulsar_tls_port_clashes_with_none_of_magnetars() -> None:
    config = BrokerConfig(metadata="memory://", tls_cert_file=CERT, tls_key_file=KEY)
    assert config.pulsar_tls_port == DEFAULT_PULSAR_TLS_PORT
    others = {config.port, config.tls_port, config.http_port, DEFAULT_PULSAR_PORT, 3181, 8000}
    assert DEFAULT_PULSAR_TLS_PORT not in others
    assert BrokerConfig(metadata="memory://", pulsar_tls_port=None).pulsar_tls_port is None


def test_the_pulsar_tls_port_may_not_take_another_listeners_port() -> None:
    with pytest.raises(InvalidConfigError, match="pulsar_tls_port") as e:
        BrokerConfig(
            metadata="memory://", pulsar_tls_port=6651, tls_cert_file=CERT, tls_key_file=KEY
        )
    assert "tls_port's port" in e.value.message
    with pytest.raises(InvalidConfigError, match="pulsar_tls_port"):
        BrokerConfig(metadata="memory://", pulsar_tls_port=65536)
    # without TLS the listener stays closed, so its port clashes with nothing
    assert BrokerConfig(metadata="memory://", pulsar_tls_port=6651).pulsar_tls_port == 6651


def test_standalone_takes_pulsars_tls_port_when_asked() -> None:
    # `magnetar standalone --pulsar-tls-port 6651`, as parsed from its flags
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, StandaloneConfig)
    args = parser.parse_args(
        ["--pulsar-tls-port", "6651", "--tls-cert-file", "/c.pem", "--tls-key-file", "/c.key"]
    )
    config = load_config(
        StandaloneConfig, env={}, overrides=config_overrides_from_args(args, StandaloneConfig)
    )
    broker = config.broker_config(ledger=LedgerClientConfig())
    assert (broker.pulsar_tls_port, broker.tls_port) == (6651, DEFAULT_PULSAR_TLS_PORT)
    # without the clash, TLS gRPC keeps its port
    default = StandaloneConfig(tls_cert_file=CERT, tls_key_file=KEY).broker_config(
        ledger=LedgerClientConfig()
    )
    assert (default.tls_port, default.pulsar_tls_port) == (6651, DEFAULT_PULSAR_TLS_PORT)
    with pytest.raises(InvalidConfigError, match="pulsar_tls_port"):
        StandaloneConfig(tls_port=DEFAULT_PULSAR_TLS_PORT, pulsar_tls_port=DEFAULT_PULSAR_TLS_PORT)


def test_the_test_kit_reads_the_pulsar_ssl_url_from_ready_lines() -> None:
    broker = BrokerNode._ready_line.match(
        "broker b1 serving on h:6650, TLS on h:6651, Pulsar on h:6660, Pulsar TLS on h:6661"
        " (metrics: https://h:8080/metrics)"
    )
    assert broker is not None
    assert (broker["pulsar_address"], broker["pulsar_tls_address"]) == ("h:6660", "h:6661")
    standalone = StandaloneNode._ready_line.match(
        "magnetar standalone ready in 0.40 s: service URL magnetar://h:6650, magnetar+ssl://h:6651"
        " (pulsar://h:6660; pulsar+ssl://h:6661; 3 bookies; metrics: http://h:8080/metrics;"
        " data: /d)"
    )
    assert standalone is not None
    assert (standalone["pulsar_address"], standalone["pulsar_tls_address"]) == ("h:6660", "h:6661")
    plain = StandaloneNode._ready_line.match(
        "magnetar standalone ready in 0.40 s: service URL magnetar://h:6650"
        " (pulsar://h:6660; 3 bookies; metrics: http://h:8080/metrics; data: /d)"
    )
    assert plain is not None
    assert plain["pulsar_tls_address"] is None
