"""The log pipeline as an operator sees its output, including when the output stream stalls."""

from __future__ import annotations

import datetime
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import structlog

from magnetar.common.errors import InvalidConfigError
from magnetar.common.log import (
    configure_logging,
    dropped_log_records,
    flush_logging,
    get_logger,
    reset_logging,
)


class BlockingStream(io.StringIO):
    """A stream whose writes hang until released, like stdout piped to a stalled reader."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writing = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.release.wait()
        return super().write(text)


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    reset_logging()


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    assert flush_logging(timeout_s=5)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_timestamp_level_logger_event_and_context() -> None:
    stream = io.StringIO()
    configure_logging(mode="json", stream=stream)
    log = get_logger("magnetar.bookie", component="bookie").bind(bookie_id="bookie-1")

    log.info("ledger_closed", ledger_id=7, last_entry_id=41)

    [record] = json_lines(stream)
    assert list(record)[:4] == ["timestamp", "level", "logger", "event"]
    assert record == {
        "timestamp": record["timestamp"],
        "level": "info",
        "logger": "magnetar.bookie",
        "event": "ledger_closed",
        "component": "bookie",
        "bookie_id": "bookie-1",
        "ledger_id": 7,
        "last_entry_id": 41,
    }
    assert isinstance(record["timestamp"], str)
    assert record["timestamp"].endswith("Z")
    stamped = datetime.datetime.fromisoformat(record["timestamp"])
    assert stamped.utcoffset() == datetime.timedelta(0)


def test_records_below_the_level_are_left_out() -> None:
    stream = io.StringIO()
    configure_logging(mode="json", level="warning", stream=stream)
    log = get_logger("magnetar.broker")

    log.debug("cursor_moved")
    log.info("topic_loaded")
    log.warning("ownership_lost", topic="t")
    log.error("ledger_write_failed")

    assert [r["event"] for r in json_lines(stream)] == ["ownership_lost", "ledger_write_failed"]


def test_standard_library_records_share_the_pipeline() -> None:
    stream = io.StringIO()
    configure_logging(mode="json", stream=stream)

    with structlog.contextvars.bound_contextvars(request_id="r-1"):
        logging.getLogger("grpc._server").warning("channel %s closed", "c-9")
    logging.getLogger("asyncio").debug("below the level")

    [record] = json_lines(stream)
    assert record["logger"] == "grpc._server"
    assert record["level"] == "warning"
    assert record["event"] == "channel c-9 closed"
    assert record["request_id"] == "r-1"


def test_exceptions_are_rendered_with_their_traceback() -> None:
    stream = io.StringIO()
    configure_logging(mode="json", stream=stream)
    log = get_logger("magnetar.bookie")

    try:
        int("bad entry")
    except ValueError:
        log.exception("entry_rejected", entry_id=3)
        logging.getLogger("aetcd").exception("watch failed")

    structlog_record, stdlib_record = json_lines(stream)
    assert structlog_record["level"] == "error"
    for record in (structlog_record, stdlib_record):
        assert isinstance(record["exception"], str)
        assert "ValueError: invalid literal" in record["exception"]


def test_contextvars_bound_for_a_task_appear_in_its_records() -> None:
    stream = io.StringIO()
    configure_logging(mode="json", stream=stream)
    log = get_logger("magnetar.broker")

    with structlog.contextvars.bound_contextvars(topic="persistent://t/n/orders"):
        log.info("producer_connected")
    log.info("idle")

    first, second = json_lines(stream)
    assert first["topic"] == "persistent://t/n/orders"
    assert "topic" not in second


def test_console_mode_is_plain_text_without_colour_when_not_a_terminal() -> None:
    stream = io.StringIO()
    configure_logging(mode="console", stream=stream)
    get_logger("magnetar.cli").info("topic_created", partitions=4)

    assert flush_logging(timeout_s=5)
    output = stream.getvalue()
    assert "topic_created" in output
    assert "partitions=4" in output
    assert "\x1b[" not in output
    assert output.count("\n") == 1


def test_console_mode_uses_colour_on_a_terminal() -> None:
    stream = TerminalStream()
    configure_logging(mode="console", stream=stream)
    get_logger("magnetar.cli").info("topic_created")

    assert flush_logging(timeout_s=5)
    assert "\x1b[" in stream.getvalue()


def test_a_blocked_stream_never_blocks_callers_and_drops_are_counted() -> None:
    stream = BlockingStream()
    configure_logging(mode="json", stream=stream, queue_size=10)
    log = get_logger("magnetar.bookie")
    try:
        log.info("first")
        # The writer now hangs inside write(); nothing more leaves the queue.
        assert stream.writing.wait(timeout=5)

        for index in range(100):
            log.info("entry_added", index=index)
        logging.getLogger("grpc").error("also dropped")

        # The queue held 10 records; every call still returned, and the rest were counted.
        assert dropped_log_records() == 91
        assert not flush_logging(timeout_s=0.05)
    finally:
        stream.release.set()

    # Once the stream moves again, the queued records and then the drop report are written.
    assert flush_logging(timeout_s=5)
    log.info("after_release")
    records = json_lines(stream)
    events = [record["event"] for record in records]
    assert events == [
        "first",
        *["entry_added"] * 10,
        "log_records_dropped",
        "after_release",
    ]
    assert [record["index"] for record in records[1:11]] == list(range(10))
    drop_report = records[11]
    assert drop_report["count"] == 91
    assert drop_report["level"] == "warning"


def test_drops_are_reported_even_when_nothing_is_logged_afterwards() -> None:
    stream = BlockingStream()
    configure_logging(mode="json", stream=stream, queue_size=1)
    log = get_logger("magnetar.bookie")
    log.info("first")
    assert stream.writing.wait(timeout=5)
    log.info("queued")
    log.info("dropped")
    stream.release.set()

    records = json_lines(stream)
    assert [record["event"] for record in records] == ["first", "queued", "log_records_dropped"]
    assert records[-1]["count"] == 1


def test_configuring_again_replaces_the_previous_setup() -> None:
    first_stream = io.StringIO()
    configure_logging(mode="json", stream=first_stream)
    second_stream = io.StringIO()
    configure_logging(mode="json", level="debug", stream=second_stream)

    get_logger("magnetar.bookie").debug("journal_synced")
    logging.getLogger("grpc").info("one stdlib record")

    assert [r["event"] for r in json_lines(second_stream)] == [
        "journal_synced",
        "one stdlib record",
    ]
    assert first_stream.getvalue() == ""
    assert dropped_log_records() == 0


def test_loggers_made_before_a_reconfiguration_follow_it() -> None:
    configure_logging(mode="json", stream=io.StringIO())
    log = get_logger("magnetar.broker").bind(broker_id="b-1")
    log.info("warm_up")
    stream = io.StringIO()
    configure_logging(mode="json", stream=stream)

    log.info("after_reconfigure")

    [record] = json_lines(stream)
    assert record["event"] == "after_reconfigure"
    assert record["broker_id"] == "b-1"


def test_reset_restores_the_root_logger_level() -> None:
    root = logging.getLogger()
    before = root.level
    configure_logging(mode="json", level="error", stream=io.StringIO())
    assert root.level == logging.ERROR
    reset_logging()
    assert root.level == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"level": "verbose"}, "log level: must be one of debug, info"),
        ({"mode": "xml"}, "log mode: must be 'json' or 'console', got 'xml'"),
        ({"queue_size": 0}, "log queue_size: must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_with_the_rule(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        configure_logging(stream=io.StringIO(), **options)  # type: ignore[arg-type]
    assert message in str(caught.value)
