"""Validation at the door: each rule a batch, a name or properties must keep, checked alone."""

from __future__ import annotations

import os
import zlib
from dataclasses import replace

import pytest

from broker.managed_ledger import Position
from broker.service.dispatch import Dispatcher, Item
from broker.service.envelope import IncomingBatch
from broker.service.streams import SubscriptionType
from broker.service.validation import BatchLimits, check_batch, check_name, check_properties
from magnetar.common.errors import (
    InvalidArgumentError,
    InvalidTopicNameError,
    MessageTooLargeError,
    ProtocolError,
)
from magnetar.common.keys import key_hash
from magnetar.common.names import parse_topic
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2

LIMITS = BatchLimits(max_message_bytes=64 * 1024, max_messages=100)
NONE = types_pb2.COMPRESSION_TYPE_NONE
ZLIB = types_pb2.COMPRESSION_TYPE_ZLIB


def encoded(*values: bytes, keys: tuple[str | None, ...] = ()) -> bytes:
    messages = [
        entry_pb2.BatchedMessage(value=v, partition_key=keys[i] if keys else None)
        for i, v in enumerate(values)
    ]
    return entry_pb2.MessageBatch(messages=messages).SerializeToString()


def batch(raw: bytes, count: int, **fields: object) -> IncomingBatch:
    made = IncomingBatch(
        request_id=1,
        sequence_id=0,
        last_sequence_id=count - 1,
        num_messages=count,
        batch=raw,
        compression=NONE,
        uncompressed_size=len(raw),
    )
    return replace(made, **fields)  # type: ignore[arg-type]


def refusal(incoming: IncomingBatch) -> str:
    with pytest.raises((ProtocolError, MessageTooLargeError)) as raised:
        check_batch(incoming, LIMITS)
    return str(raised.value)


def test_well_formed_batches_pass() -> None:
    raw = encoded(b"a", b"b", b"c")
    check_batch(batch(raw, 3), LIMITS)
    check_batch(batch(raw, 3, uncompressed_size=0), LIMITS)
    check_batch(batch(zlib.compress(raw), 3, compression=ZLIB, uncompressed_size=len(raw)), LIMITS)
    keyed = encoded(b"a", b"b", keys=("k1", None))
    check_batch(batch(keyed, 2, key_hashes=(key_hash("k1"), key_hash(None))), LIMITS)
    same = encoded(b"a", b"b", keys=("k", "k"))
    check_batch(batch(same, 2, key_hashes=(key_hash("k"),)), LIMITS)


def test_a_count_the_batch_does_not_hold_is_refused() -> None:
    one = encoded(b"x")
    # the one-message batch declaring 2^31-1 messages, and one declaring a million
    assert "2,147,483,647" in refusal(batch(one, 2**31 - 1, last_sequence_id=0))
    assert "1 to 100" in refusal(batch(one, 1_000_000, last_sequence_id=0))
    message = refusal(batch(one, 2))
    assert "num_messages=2" in message
    assert "holds 1" in message
    assert "0" in refusal(batch(one, 0, last_sequence_id=0))


def test_bytes_that_are_not_a_batch_are_refused() -> None:
    noise = os.urandom(512)
    while True:  # random bytes that happen to parse are vanishingly rare; make sure
        try:
            entry_pb2.MessageBatch.FromString(noise)
        except Exception:  # protobuf's DecodeError
            break
        noise = os.urandom(512)
    assert "not a serialized magnetar.format.v1.MessageBatch" in refusal(batch(noise, 1))


def test_compression_must_be_known_and_real() -> None:
    raw = encoded(b"a")
    assert "not a zlib stream" in refusal(batch(raw, 1, compression=ZLIB))
    assert "UNSPECIFIED" in refusal(batch(raw, 1, compression=0))
    assert "7, which this broker does not know" in refusal(batch(raw, 1, compression=7))
    packed = zlib.compress(raw)
    truncated = batch(packed[:-3], 1, compression=ZLIB, uncompressed_size=len(raw))
    assert "truncated" in refusal(truncated)
    trailing = batch(packed + b"xx", 1, compression=ZLIB, uncompressed_size=len(raw))
    assert "followed by other bytes" in refusal(trailing)
    short = batch(packed, 1, compression=ZLIB, uncompressed_size=len(raw) + 5)
    assert f"inflates to {len(raw)} bytes" in refusal(short)
    uncompressed = batch(raw, 1, uncompressed_size=len(raw) + 1)
    assert "uncompressed_size" in refusal(uncompressed)


def test_a_zlib_bomb_is_never_inflated_past_what_it_declares() -> None:
    bomb_raw = encoded(b"\0" * 60_000)  # under the limit, but inflates past what it declares
    bomb = zlib.compress(bomb_raw)
    lying = batch(bomb, 1, compression=ZLIB, uncompressed_size=100)
    assert "more than its declared uncompressed_size of 100" in refusal(lying)
    # a batch declaring more than the broker's limit is refused before inflating anything
    huge = batch(bomb, 1, compression=ZLIB, uncompressed_size=256 * 1024 * 1024)
    with pytest.raises(MessageTooLargeError, match="268,435,456"):
        check_batch(huge, LIMITS)


def test_key_hashes_must_be_those_of_the_keys() -> None:
    keyed = encoded(b"a", b"b", keys=("k1", "k2"))
    message = refusal(batch(keyed, 2, key_hashes=(key_hash("k1"), key_hash("other"))))
    assert "message 1" in message
    assert "'k2'" in message
    assert "message 0" in refusal(batch(keyed, 2, key_hashes=(key_hash("k1") ^ 1,)))
    keyless = encoded(b"a")
    assert "key hash" in refusal(batch(keyless, 1, key_hashes=(key_hash("k"),)))
    assert "none, one, or one per message" in refusal(
        batch(encoded(b"a", b"b", b"c"), 3, key_hashes=(1, 2))
    )


def test_sizes_are_bounded() -> None:
    big = encoded(b"x" * (LIMITS.max_message_bytes + 1))
    with pytest.raises(MessageTooLargeError, match="65,536"):
        check_batch(batch(big, 1), LIMITS)


def test_long_names_are_refused_without_being_echoed() -> None:
    name = "n" * 10_000
    with pytest.raises(InvalidArgumentError) as raised:
        check_name("consumer_name", name, 256)
    message = str(raised.value)
    assert "consumer_name is 10,000 characters long; the limit is 256" in message
    assert len(message) < 200
    check_name("consumer_name", "n" * 256, 256)
    with pytest.raises(InvalidArgumentError, match="a key of properties is 300"):
        check_properties("properties", {"k" * 300: "v"}, max_key_chars=256, max_bytes=1024)
    with pytest.raises(InvalidArgumentError, match="more than 1,024 bytes"):
        check_properties("properties", {"k": "v" * 2000}, max_key_chars=256, max_bytes=1024)


def test_a_long_topic_name_is_refused_with_a_short_message() -> None:
    with pytest.raises(InvalidTopicNameError) as raised:
        parse_topic("t" * 10_000)
    error = raised.value
    assert "10,000 characters long; the limit is 200" in error.message
    assert len(error.message) < 200
    assert all(len(v) < 100 for v in error.context.values())


def test_acknowledging_a_whole_entry_builds_no_set_of_its_messages() -> None:
    """An entry's count sizes nothing an ack does: a whole-entry ack (or a consumer leaving)
    releases it without building the set of its indexes (the count is validated at the door,
    and this keeps the common path cheap for large batches)."""
    dispatcher = Dispatcher(SubscriptionType.SHARED)
    slot, _, _ = dispatcher.add("c")
    dispatcher.flow(slot, 10)
    huge = 2**40  # would take terabytes as a set
    dispatcher.assign([Item(Position(1, 0), huge)], now_ms=0)
    assert slot.unacked_messages == huge
    dispatcher.acked(slot, Position(1, 0))
    assert slot.unacked_messages == 0
    dispatcher.flow(slot, 2 * huge)
    dispatcher.assign([Item(Position(1, 1), huge)], now_ms=0)
    assert slot.unacked_messages == huge
    dispatcher.remove(slot)
    assert Position(1, 1) in dispatcher.replay
