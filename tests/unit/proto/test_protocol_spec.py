"""docs/protocol.md is the wire specification: its tables must say what the code does.

Each test reads a table out of the page and checks it against the real functions and classes:
the key-hash test vectors against the hash and the partition router, the byte examples against
the producer's encoder and the broker's envelope, the compression framing against the codec, the
error table against the error classes and errors.proto, the reasons a broker closes a stream
against the servicer, the limits against the config defaults and constants, and the field and
rpc names against the protos. Change the code and the page together, or these fail.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

import broker.process
from broker.grpc import servicer
from broker.service import catalog, dedup
from broker.service.config import BrokerConfig
from broker.service.envelope import IncomingBatch, build_envelope
from magnetar.aio.codec import BatchBuilder, decode_entry
from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.routing import PartitionRouter, key_partition
from magnetar.common import names
from magnetar.common.config import settings
from magnetar.common.errors import CorruptionError, ErrorCode, error_class_for
from magnetar.common.keys import KEYLESS_HASH, batch_key_hashes, key_hash
from magnetar.common.server.serving import grpc_server_options
from proto.admin.v1 import admin_pb2
from proto.broker.v1 import broker_pb2
from proto.common.v1 import errors_pb2, types_pb2
from proto.format.v1 import entry_pb2

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "protocol.md").read_text()

Row = dict[str, str]


def tables(header_start: str) -> list[list[Row]]:
    """Every markdown table of the page whose header row starts with ``header_start``."""
    # a table inside a list item is indented
    lines = [line.strip() for line in DOC.splitlines()]
    found: list[list[Row]] = []
    for n, line in enumerate(lines):
        if not line.startswith(header_start):
            continue
        columns = cells(line)
        rows: list[Row] = []
        for body in lines[n + 2 :]:
            if not body.startswith("|"):
                break
            rows.append(dict(zip(columns, cells(body), strict=True)))
        found.append(rows)
    assert found, f"docs/protocol.md has no table starting {header_start!r}"
    return found


def table(header_start: str) -> list[Row]:
    (only,) = tables(header_start)
    return only


def cells(line: str) -> list[str]:
    # a cell may hold an escaped pipe (\|); split on the others
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip() for p in parts]


def code_span(cell: str) -> str:
    match = re.fullmatch(r"`([^`]*)`", cell)
    assert match is not None, f"expected one code span, got {cell!r}"
    return match[1]


def hex_bytes(cell: str) -> bytes:
    return bytes.fromhex(code_span(cell))


# --- the key hash and partition routing ----------------------------------------------------------

VECTORS = table("| key | UTF-8 bytes (hex) |")
PARTITION_COLUMNS = {int(c.removeprefix("n=")): c for c in VECTORS[0] if c.startswith("n=")}


def fmix32_as_documented(h: int) -> int:
    """MurmurHash3's finalizer, with the multipliers the page's pseudo-code gives."""
    block = DOC[DOC.index("h ^= h >> 16;") :]
    block = block[: block.index("```")]
    first, second = (int(m, 16) for m in re.findall(r"\* (0x[0-9A-Fa-f]{8})\)", block))
    h ^= h >> 16
    h = (h * first) % 2**32
    h ^= h >> 13
    h = (h * second) % 2**32
    h ^= h >> 16
    return h


@pytest.mark.parametrize("row", VECTORS, ids=lambda r: r["key"])
def test_key_hash_vectors(row: Row) -> None:
    key = json.loads(code_span(row["key"]))
    data = key.encode()
    if row["UTF-8 bytes (hex)"] == "(none)":
        assert data == b""
    elif row["UTF-8 bytes (hex)"].endswith("bytes of ASCII)"):
        assert len(data) == int(row["UTF-8 bytes (hex)"].strip("()").split()[0])
        assert data.isascii()
    else:
        assert data == hex_bytes(row["UTF-8 bytes (hex)"])
    crc = int(row["crc32"])
    assert crc == zlib.crc32(data)
    assert int(row["key_hash"]) == key_hash(key) == fmix32_as_documented(crc)
    assert PARTITION_COLUMNS, "the vectors give partitions for some partition counts"
    for partitions, column in PARTITION_COLUMNS.items():
        expected = int(row[column])
        assert expected == crc % partitions
        assert PartitionRouter(partitions).partition_for(key) == expected
        if partitions > 1:
            assert key_partition(key, partitions) == expected


def test_vectors_cover_the_unsigned_trap_and_the_keyless_hash() -> None:
    crcs = [int(row["crc32"]) for row in VECTORS]
    # "Five of these have the top bit of crc32 set"
    assert sum(c >= 2**31 for c in crcs) == 5
    empty = next(row for row in VECTORS if json.loads(code_span(row["key"])) == "")
    # "A keyless message hashes as the empty key, to 0."
    assert key_hash(None) == KEYLESS_HASH == int(empty["key_hash"]) == 0


def test_a_batch_carries_none_one_or_one_hash_per_message() -> None:
    assert batch_key_hashes([None, None]) == []
    assert batch_key_hashes(["k", "k", "k"]) == [key_hash("k")]
    assert batch_key_hashes(["a", None, "a"]) == [key_hash("a"), key_hash(None), key_hash("a")]


# --- batches and entries, byte for byte ----------------------------------------------------------

EXAMPLES = {
    row["example"]: hex_bytes(row["bytes (hex)"]) for rows in tables("| example |") for row in rows
}


def two_message_batch() -> tuple[bytes, int, tuple[int, ...]]:
    builder: BatchBuilder[str] = BatchBuilder(max_messages=10, max_bytes=10_000)
    builder.add(b"hi", "first", partition_key="k")
    builder.add(b"yo", "second", partition_key="k", properties={"a": "b"}, event_time_ms=5)
    sealed = builder.seal(7)
    assert (sealed.sequence_id, sealed.last_sequence_id, sealed.num_messages) == (7, 8, 2)
    return sealed.payload, sealed.uncompressed_size, tuple(sealed.key_hashes)


def one_message_batch() -> bytes:
    builder: BatchBuilder[str] = BatchBuilder(max_messages=10, max_bytes=10_000)
    builder.add_plain(b"hi", "only", size=18)
    sealed = builder.seal(0)
    assert sealed.key_hashes == ()
    return sealed.payload


def envelope_of_two_message_batch() -> bytes:
    payload, size, hashes = two_message_batch()
    batch = IncomingBatch(1, 7, 8, 2, payload, types_pb2.COMPRESSION_TYPE_NONE, size, hashes)
    return build_envelope("p-1", batch, 42, 1_700_000_000_000)


BUILDERS: dict[str, Callable[[], bytes]] = {
    "one message `hi`, no key": one_message_batch,
    "two messages: `hi` with key `k`; `yo` with key `k`, property `a`=`b`, event time 5": (
        lambda: two_message_batch()[0]
    ),
    "envelope of the two-message batch": envelope_of_two_message_batch,
}


def test_every_byte_example_is_checked() -> None:
    assert set(EXAMPLES) == set(BUILDERS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_byte_example_is_what_the_code_writes(name: str) -> None:
    assert EXAMPLES[name] == BUILDERS[name]()


def test_the_two_message_batch_is_plain_protobuf() -> None:
    payload, size, hashes = two_message_batch()
    standard = entry_pb2.MessageBatch(
        messages=[
            entry_pb2.BatchedMessage(value=b"hi", partition_key="k"),
            entry_pb2.BatchedMessage(
                value=b"yo", partition_key="k", properties={"a": "b"}, event_time_ms=5
            ),
        ]
    ).SerializeToString()
    assert payload == standard
    # "The second batch is 28 bytes ... one key hash: key_hash("k") = 1844677702."
    assert size == len(payload) == 28
    assert hashes == (key_hash("k"),) == (1844677702,)


def test_an_entry_reads_back_as_the_page_says() -> None:
    entry = decode_entry(EXAMPLES["envelope of the two-message batch"])
    envelope = entry_pb2.EntryEnvelope.FromString(EXAMPLES["envelope of the two-message batch"])
    assert envelope.format_version == 1
    assert (entry.producer_name, entry.sequence_id, entry.first_offset) == ("p-1", 7, 42)
    assert entry.publish_time_ms == 1_700_000_000_000
    assert [m.value for m in entry.messages] == [b"hi", b"yo"]
    assert [m.HasField("partition_key") for m in entry.messages] == [True, True]


def zlib_entry(batch: bytes, raw: bytes) -> bytes:
    return build_envelope(
        "p",
        IncomingBatch(1, 0, 0, 1, batch, types_pb2.COMPRESSION_TYPE_ZLIB, len(raw)),
        0,
        0,
    )


def test_zlib_is_the_zlib_format_with_adler32_trailer() -> None:
    builder: BatchBuilder[str] = BatchBuilder(max_messages=10, max_bytes=10_000, compression="zlib")
    builder.add(b"hello hello hello hello", "h", partition_key="k")
    sealed = builder.seal(0)
    assert sealed.compression == types_pb2.COMPRESSION_TYPE_ZLIB
    compressed = sealed.payload
    raw = zlib.decompress(compressed)
    assert sealed.uncompressed_size == len(raw)
    cmf, flg = compressed[0], compressed[1]
    assert cmf & 0x0F == 8, "DEFLATE"
    assert (cmf << 8 | flg) % 31 == 0, "the RFC 1950 header check"
    assert not flg & 0x20, "no preset dictionary"
    assert compressed[-4:] == zlib.adler32(raw).to_bytes(4, "big")
    assert [m.value for m in decode_entry(zlib_entry(compressed, raw)).messages] == [
        b"hello hello hello hello"
    ]


def test_consumers_take_any_zlib_level_and_refuse_raw_deflate_gzip_and_dictionaries() -> None:
    raw = entry_pb2.MessageBatch(
        messages=[entry_pb2.BatchedMessage(value=b"x" * 100)]
    ).SerializeToString()
    for level in (1, 6, 9):
        assert len(decode_entry(zlib_entry(zlib.compress(raw, level), raw)).messages) == 1
    deflate = zlib.compressobj(wbits=-15)
    raw_deflate = deflate.compress(raw) + deflate.flush()
    with_dictionary = zlib.compressobj(zdict=b"xxxx")
    dictionary = with_dictionary.compress(raw) + with_dictionary.flush()
    for refused in (raw_deflate, gzip.compress(raw), dictionary):
        with pytest.raises(CorruptionError):
            decode_entry(zlib_entry(refused, raw))


# --- errors ---------------------------------------------------------------------------------------

ERROR_ROWS = table("| code | name | retriable | gRPC status |")


def test_error_table_lists_every_wire_code_once() -> None:
    documented = [int(row["code"]) for row in ERROR_ROWS]
    assert documented == [int(c) for c in ErrorCode if c is not ErrorCode.UNSPECIFIED]
    assert set(documented) | {0} == set(errors_pb2.ErrorCode.values())


@pytest.mark.parametrize("row", ERROR_ROWS, ids=lambda r: r["code"])
def test_error_table_row_matches_the_error_class(row: Row) -> None:
    code = int(row["code"])
    cls = error_class_for(code)
    assert code_span(row["name"]) == errors_pb2.ErrorCode.Name(errors_pb2.ErrorCode.ValueType(code))
    assert code_span(row["name"]) == f"ERROR_CODE_{ErrorCode(code).name}"
    assert code_span(row["Python class"]) == cls.__name__
    assert cls.code == code
    assert row["retriable"] == ("yes" if cls.retriable else "no")
    status = code_span(row["gRPC status"])
    assert status == cls.grpc_status
    assert grpc.StatusCode[status] is not None


# --- why a broker closes a stream -----------------------------------------------------------------

CLOSED_ROWS = table("| reason | when | what the client does |")


def reason_code(row: Row) -> ErrorCode:
    match = re.fullmatch(r"`([A-Z_]+)` \(([0-9]+)\)", row["reason"])
    assert match is not None, row["reason"]
    code = ErrorCode[match[1]]
    assert int(code) == int(match[2])
    return code


@pytest.mark.parametrize("row", CLOSED_ROWS, ids=lambda r: r["reason"])
def test_closed_reason_advice_agrees_with_the_code(row: Row) -> None:
    code = reason_code(row)
    action = row["what the client does"]
    if code is ErrorCode.UNSPECIFIED:
        return
    retriable = error_class_for(code).retriable
    if action.startswith("stop"):
        assert not retriable, f"{code.name} is retriable, yet the page says stop"
    elif action.startswith(("look up", "reopen")) and "act on the code" not in action:
        assert retriable, f"{code.name} is not retriable, yet the page says reopen"


def test_every_reason_the_broker_treats_as_moved_says_reopen() -> None:
    advice = {reason_code(row): row["what the client does"] for row in CLOSED_ROWS}
    declared = {error_class_for(code) for code in ErrorCode}
    for cls in sorted(
        (c for c in declared if c.__dict__.get("look_up_again")), key=lambda c: c.code
    ):
        assert advice[cls.code].startswith("look up, reopen"), cls.__name__


# --- limits ---------------------------------------------------------------------------------------

CONFIGS: dict[str, type] = {
    "broker": BrokerConfig,
    "producer": ProducerConfig,
    "consumer": ConsumerConfig,
    "client": ClientConfig,
}
GRPC_OPTIONS = dict(grpc_server_options(broker.process.MAX_GRPC_MESSAGE_BYTES))
CONSTANTS: dict[str, object] = {
    "grpc.max_receive_message_length": GRPC_OPTIONS["grpc.max_receive_message_length"],
    "grpc.http2.min_ping_interval_without_data_ms": GRPC_OPTIONS[
        "grpc.http2.min_ping_interval_without_data_ms"
    ],
    "MAX_DELIVERY_MESSAGE_BYTES": servicer.MAX_DELIVERY_MESSAGE_BYTES,
    "RECENT_RECEIPTS": dedup.RECENT_RECEIPTS,
    "MAX_NAME_CHARS": names.MAX_NAME_CHARS,
    "MAX_PARTITIONS": catalog.MAX_PARTITIONS,
}
LIMIT_ROWS = [row for rows in tables("| limit | setting | default |") for row in rows]


def default_of(setting: str) -> object:
    match = re.fullmatch(r"(broker|producer|consumer|client|fixed) `([A-Za-z0-9_.]+)`", setting)
    assert match is not None, f"unknown setting form {setting!r}"
    where, name = match[1], match[2]
    if where == "fixed":
        return CONSTANTS[name]
    (found,) = [s for s in settings(CONFIGS[where]) if s.name == name]
    return found.default


@pytest.mark.parametrize("row", LIMIT_ROWS, ids=lambda r: r["setting"])
def test_limit_default_is_the_code_default(row: Row) -> None:
    assert int(row["default"].replace(",", "")) == default_of(row["setting"])


def test_the_broker_says_its_batch_limit_when_a_producer_opens() -> None:
    (row,) = [r for r in LIMIT_ROWS if r["setting"] == "broker `max_message_bytes`"]
    assert "opened.max_message_bytes" in row["when it is reached"]
    assert "max_message_bytes" in broker_pb2.ProducerOpened.DESCRIPTOR.fields_by_name


# --- every rpc, stream message and field is on the page -------------------------------------


def test_every_rpc_is_documented() -> None:
    for service in (
        broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
        admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    ):
        for method in service.methods:
            assert f"`{method.name}`" in DOC, f"{service.name}.{method.name} is not on the page"
    admin = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
    assert f"| `AdminService` | {len(admin.methods)} calls |" in DOC


@pytest.mark.parametrize(
    "message",
    [
        broker_pb2.ProduceRequest,
        broker_pb2.ProduceResponse,
        broker_pb2.ConsumeRequest,
        broker_pb2.ConsumeResponse,
    ],
    ids=lambda m: m.DESCRIPTOR.name,
)
def test_every_stream_message_kind_is_in_its_state_machine(message: type[Message]) -> None:
    for field in message.DESCRIPTOR.oneofs_by_name["kind"].fields:
        # in a state machine diagram (kind{fields}) or named in the rules (`kind`)
        assert f"{field.name}{{" in DOC or f"`{field.name}`" in DOC, field.name


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("| field | meaning |", broker_pb2.Subscribe),
        ("| field | number | meaning |", broker_pb2.ProduceBatch),
        ("| field | number | wire type | tag byte | meaning |", entry_pb2.BatchedMessage),
        ("| field | number | set from | meaning |", entry_pb2.EntryEnvelope),
    ],
    ids=lambda x: x if isinstance(x, str) else x.DESCRIPTOR.name,
)
def test_every_field_is_in_its_table(header: str, message: type[Message]) -> None:
    rows = table(header)
    # a row may name several fields ("`sequence_id`, `last_sequence_id`" with "3, 4")
    documented = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row["field"])}
    fields = message.DESCRIPTOR.fields
    assert documented == {f.name for f in fields}
    numbered = [row for row in rows if "number" in row]
    numbers = {
        name: int(number)
        for row in numbered
        for name, number in zip(
            re.findall(r"`([a-z_]+)`", row["field"]), row["number"].split(","), strict=True
        )
    }
    assert numbers == ({f.name: f.number for f in fields} if numbered else {})
    if "tag byte" in header:
        tags = {code_span(row["field"]): int(code_span(row["tag byte"]), 16) for row in rows}
        for field in fields:
            wire_type = 0 if field.type in (field.TYPE_INT64, field.TYPE_UINT32) else 2
            assert tags[field.name] == field.number << 3 | wire_type, field.name


# --- links ---------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor a markdown renderer gives a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_links_stay_inside_the_repository_and_anchors_exist() -> None:
    assert "](http" not in DOC
    anchors = {slug(line.lstrip("#")) for line in DOC.splitlines() if line.startswith("#")}
    for anchor in re.findall(r"\]\(#([^)]+)\)", DOC):
        assert anchor in anchors, anchor
    for target in re.findall(r"\]\(([a-z-]+\.md)(?:#[^)]*)?\)", DOC):
        assert (ROOT / "docs" / target).exists(), target
