"""The connector's option parsing: every bad option is named in its error."""

from __future__ import annotations

import pytest

from magnetar.common.errors import InvalidArgumentError
from magnetar.spark.options import (
    EARLIEST,
    LATEST,
    client_settings,
    parse_read_options,
    parse_write_options,
)


def test_defaults_for_batch_and_streaming() -> None:
    batch = parse_read_options({"topic": "t"}, streaming=False)
    assert batch.topics == ("t",)
    assert batch.starting.kind == "earliest"
    assert batch.ending.kind == "latest"
    assert batch.fail_on_data_loss is True
    assert batch.service_url == "magnetar://localhost:6650"
    stream = parse_read_options({"TOPIC": "t"}, streaming=True)  # names are case-insensitive
    assert stream.starting.kind == "latest"


def test_topics_and_patterns() -> None:
    assert parse_read_options({"topics": "a, b,,c"}, streaming=False).topics == ("a", "b", "c")
    pattern = parse_read_options({"topicsPattern": "public/default/x-.*"}, streaming=True)
    assert pattern.topics_pattern == "public/default/x-.*"
    for options in ({}, {"topic": "a", "topics": "b"}):
        with pytest.raises(InvalidArgumentError, match="exactly one of"):
            parse_read_options(options, streaming=False)
    with pytest.raises(InvalidArgumentError, match="topicsPattern is not a regular expression"):
        parse_read_options({"topicsPattern": "("}, streaming=False)


def test_json_offsets_and_times() -> None:
    options = parse_read_options(
        {"topic": "t", "startingOffsets": '{"t": {"0": 5, "1": -2}}', "endingOffsets": "latest"},
        streaming=False,
    )
    assert options.starting.kind == "offsets"
    assert options.starting.per_partition == {"t": {0: 5, 1: EARLIEST}}
    stream = parse_read_options(
        {"topic": "t", "startingOffsets": '{"t": {"0": -1}}'}, streaming=True
    )
    assert stream.starting.per_partition == {"t": {0: LATEST}}
    by_time = parse_read_options(
        {"topic": "t", "startingOffsetsByTimestamp": '{"t": {"0": 1700000000000}}'},
        streaming=True,
    )
    assert by_time.starting.kind == "timestamps"
    assert (
        parse_read_options(
            {"topic": "t", "startingTimestamp": "1700000000000"}, streaming=False
        ).starting.timestamp_ms
        == 1_700_000_000_000
    )


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"startingOffsets": "{bad"}, False, "startingOffsets"),
        ({"startingOffsets": '{"t": {"x": 1}}'}, False, "partition 'x'"),
        ({"startingOffsets": '{"t": {"0": -3}}'}, False, "startingOffsets"),
        ({"startingOffsets": '{"t": {"0": -1}}'}, False, "latest"),
        ({"startingOffsets": "latest"}, False, "batch query"),
        ({"endingOffsets": "earliest"}, False, "read nothing"),
        ({"endingOffsets": "latest"}, True, "batch reads"),
        ({"startingOffsets": "earliest", "startingTimestamp": "1"}, False, "at most one"),
        ({"minPartitions": "0"}, False, "minPartitions"),
        ({"maxRecordsPerTrigger": "10"}, False, "streaming reads"),
        ({"maxRecordsPerTrigger": "many"}, True, "maxRecordsPerTrigger"),
        ({"failOnDataLoss": "perhaps"}, False, "failOnDataLoss"),
        ({"valueFormat": "avro"}, False, "valueFormat"),
        ({"valueFormat": "json"}, False, "valueSchema"),
        ({"tls.enabled": "true"}, False, "tls.enabled"),
        ({"auth.token": "x", "auth.tokenFile": "/t"}, True, "auth.token and auth.tokenFile"),
        ({"tls.trustCertsFilePath": "/ca"}, False, "tls.trustCertsFilePath is for TLS"),
        ({"auth.token_file": "/t"}, False, "did you mean auth.tokenFile"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], streaming: bool, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        parse_read_options({"topic": "t", **options}, streaming=streaming)


def test_client_passthrough_and_write_options() -> None:
    assert client_settings(
        {"client.operation_timeout_s": "12.5", "client.max_retries": "3", "topic": "t"}
    ) == {"operation_timeout_s": 12.5, "max_retries": 3}
    write = parse_write_options(
        {"serviceUrl": "magnetar://h:1", "topic": "out", "batchingMaxMessages": "50"}
    )
    assert (write.service_url, write.topic) == ("magnetar://h:1", "out")
    assert write.producer == {"batching_max_messages": 50}
    secured = parse_write_options({"auth.token": "secret"})
    assert secured.security.token is not None
    assert secured.security.token.reveal() == "secret"
    assert "secret" not in repr(secured)
