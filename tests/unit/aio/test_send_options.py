"""Send options: every send call's keyword arguments, checked once at the call into one value."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.aio.send_options import NO_OPTIONS, SendFields, SendOptions, send_options
from magnetar.common.errors import InvalidArgumentError

INT64_MAX = 2**63 - 1
FIELDS = ["deliver_after_ms", "deliver_at_ms", "event_timestamp", "partition_key", "properties"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_send_without_options_shares_the_one_no_options_value() -> None:
    assert send_options({}) is NO_OPTIONS
    assert NO_OPTIONS.plain
    assert SendOptions() == NO_OPTIONS


@pytest.mark.parametrize(
    "fields",
    [
        {"properties": None},
        {"properties": {}},
        {"partition_key": None},
        {"event_timestamp": None},
        {"deliver_after_ms": None},
        {"deliver_after_ms": 0},
        {"deliver_at_ms": None},
        {"deliver_at_ms": 0},
        dict.fromkeys(FIELDS),
        {"properties": {}, "deliver_after_ms": 0, "deliver_at_ms": None},
    ],
)
def test_empty_or_absent_fields_are_no_options(fields: dict[str, Any]) -> None:
    assert send_options(fields) is NO_OPTIONS


def test_options_that_say_something_are_not_plain() -> None:
    options = send_options({"partition_key": "k", "properties": {"a": "b"}, "event_timestamp": 5})
    assert options == SendOptions(properties={"a": "b"}, partition_key="k", event_timestamp=5)
    assert not options.plain
    assert not SendOptions().plain  # only the shared value takes the fast path
    assert send_options({"partition_key": ""}).partition_key == ""  # an empty key is a key
    assert send_options({"event_timestamp": 0}).event_timestamp == 0


def test_an_unknown_argument_is_named_with_the_ones_a_send_takes() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        send_options({"key": "k", "propertys": {}})
    message = str(raised.value)
    assert "key, propertys" in message
    for name in FIELDS:
        assert name in message.split("a send takes")[1]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"partition_key": 5}, "partition_key must be a str, got int"),
        ({"partition_key": b"k"}, "partition_key must be a str, got bytes"),
        ({"properties": {"a": 1}}, "properties must map str to str"),
        ({"properties": {1: "a"}}, "properties must map str to str"),
        ({"properties": [("a", "b")]}, "properties must map str to str"),
        ({"properties": "a=b"}, "properties must map str to str"),
        ({"event_timestamp": -1}, "event_timestamp"),
        ({"event_timestamp": True}, "event_timestamp"),
        ({"event_timestamp": INT64_MAX + 1}, "event_timestamp"),
        ({"event_timestamp": 1.5}, "event_timestamp"),
        ({"event_timestamp": "5"}, "event_timestamp"),
        ({"deliver_after_ms": 1, "deliver_at_ms": 2}, "deliver_after_ms or deliver_at_ms"),
        ({"deliver_after_ms": 0, "deliver_at_ms": 0}, "not both"),
        ({"deliver_after_ms": -1}, "deliver_after_ms must be >= 0, got -1"),
        ({"deliver_at_ms": -5}, "deliver_at_ms must be >= 0, got -5"),
        ({"deliver_after_ms": 1.5}, "deliver_after_ms is an int"),
        ({"deliver_after_ms": "10"}, "deliver_after_ms is an int"),
        ({"deliver_after_ms": True}, "deliver_after_ms is an int"),
        ({"deliver_at_ms": 2.0}, "deliver_at_ms is an int"),
        ({"deliver_at_ms": False}, "deliver_at_ms is an int"),
    ],
)
def test_a_bad_field_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        send_options(fields)


def test_the_event_timestamp_may_be_anything_from_zero_to_int64_max() -> None:
    assert send_options({"event_timestamp": INT64_MAX}).event_timestamp == INT64_MAX


def test_a_delay_becomes_a_wall_clock_time_at_the_call() -> None:
    before = now_ms()
    options = send_options({"deliver_after_ms": 60_000})
    after = now_ms()
    assert before + 60_000 <= options.deliver_at_ms <= after + 60_000
    assert not options.plain


def test_a_delivery_time_is_kept_as_given() -> None:
    assert send_options({"deliver_at_ms": 1_700_000_000_000}).deliver_at_ms == 1_700_000_000_000


def test_equal_arguments_give_equal_options_and_different_ones_do_not() -> None:
    # the sync producer hands consecutive sends with equal options to the loop as one run
    def options(**fields: Any) -> SendOptions:
        return send_options(fields)

    same = {"properties": {"a": "1"}, "partition_key": "k", "event_timestamp": 3}
    assert options(**same) == options(**same)
    assert options(**same, deliver_at_ms=9) == options(**same, deliver_at_ms=9)
    assert options(**same) != options(**same, deliver_at_ms=9)
    assert options(**same) != options(**{**same, "properties": {"a": "2"}})
    assert options(**same) != options(**{**same, "partition_key": "j"})
    assert options(**same) != options(**{**same, "event_timestamp": 4})
    assert options(**same) != NO_OPTIONS


def test_options_do_not_change_when_the_callers_properties_change_after_the_call() -> None:
    properties = {"seq": "1"}
    options = send_options({"properties": properties})
    properties["seq"] = "2"
    properties["extra"] = "x"
    assert options.properties == {"seq": "1"}


keys = st.none() | st.text(max_size=20)
properties = st.none() | st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=5)
timestamps = st.none() | st.integers(min_value=0, max_value=INT64_MAX)
delivery_times = st.none() | st.integers(min_value=0, max_value=INT64_MAX)


@given(key=keys, props=properties, timestamp=timestamps, deliver_at=delivery_times)
def test_valid_fields_come_back_as_given_and_nothing_given_is_no_options(
    key: str | None, props: dict[str, str] | None, timestamp: int | None, deliver_at: int | None
) -> None:
    fields: SendFields = {
        "partition_key": key,
        "properties": props,
        "event_timestamp": timestamp,
        "deliver_at_ms": deliver_at,
    }
    options = send_options(fields)
    assert options == send_options(dict(fields))
    if key is None and not props and timestamp is None and not deliver_at:
        assert options is NO_OPTIONS
        return
    assert (options.partition_key, options.event_timestamp) == (key, timestamp)
    assert options.properties == (props or None)
    assert options.deliver_at_ms == (deliver_at or 0)


@given(
    timestamp=st.integers(max_value=-1)
    | st.integers(min_value=INT64_MAX + 1)
    | st.booleans()
    | st.floats()
    | st.text()
)
def test_every_event_timestamp_outside_int64_ms_is_refused(timestamp: object) -> None:
    with pytest.raises(InvalidArgumentError, match="event_timestamp"):
        send_options({"event_timestamp": timestamp})


@given(
    name=st.sampled_from(["deliver_after_ms", "deliver_at_ms"]),
    delay=st.integers(max_value=-1) | st.booleans() | st.floats() | st.text(),
)
def test_every_delay_that_is_not_an_int_of_at_least_zero_is_refused(
    name: str, delay: object
) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        send_options({name: delay})
