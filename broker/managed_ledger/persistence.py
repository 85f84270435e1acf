"""The persisted forms of a managed ledger (its info) and of its cursors, and their keys.

This is the only module of the managed ledger that handles protobuf classes: everything else
works with the plain values below. The formats are ``magnetar.format.v1.ManagedLedgerInfo`` and
``CursorInfo`` and ``DelayBucket`` (``proto/magnetar/format/v1/managed_ledger.proto``), stored at
the keys of
:mod:`metadata.layout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.managed_ledger.types import DelayedEntry, LedgerInfo, Position
from magnetar.common.errors import InvalidArgumentError, ManagedLedgerError
from proto.common.v1 import types_pb2
from proto.format.v1 import managed_ledger_pb2

FORMAT_VERSION = 1
DELAY_BUCKET_FORMAT_VERSION = 1
CURSOR_FORMAT_VERSION = 2
"""2: acked ranges packed (``packed_acked_ranges``); format 1 records are still read."""

MAX_NAME_BYTES = 512
MAX_CURSOR_NAME_BYTES = 256


@dataclass(frozen=True, slots=True)
class StoredInfo:
    """A managed ledger's info record."""

    ledgers: tuple[LedgerInfo, ...] = ()
    terminated: bool = False
    terminated_position: Position | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredCursor:
    """A durable cursor's record."""

    mark_delete: Position
    mark_delete_offset: int
    acked_ranges: tuple[tuple[Position, Position], ...] = ()
    properties: Mapping[str, int] = field(default_factory=dict)
    last_active_ms: int = 0
    batch_acks: tuple[tuple[Position, int, frozenset[int]], ...] = ()
    """Partly acknowledged entries: (position, messages in it, acknowledged indexes)."""
    subscription_type: int = 0
    """The subscription's type (``magnetar.common.v1.SubscriptionType``; 0: not recorded)."""
    redelivery_counts: tuple[tuple[Position, int], ...] = ()
    """Redelivery counts of unacknowledged entries, in position order."""


def _position_pb(position: Position) -> types_pb2.Position:
    return types_pb2.Position(ledger_id=position.ledger_id, entry_id=position.entry_id)


def _position(message: types_pb2.Position) -> Position:
    return Position(message.ledger_id, message.entry_id)


def encode_info(info: StoredInfo) -> bytes:
    message = managed_ledger_pb2.ManagedLedgerInfo(
        format_version=FORMAT_VERSION,
        terminated=info.terminated,
        properties=dict(info.properties),
    )
    if info.terminated_position is not None:
        message.terminated_position.CopyFrom(_position_pb(info.terminated_position))
    for ledger in info.ledgers:
        message.ledgers.add(
            ledger_id=ledger.ledger_id,
            entries=ledger.entries,
            size_bytes=ledger.size_bytes,
            first_offset=ledger.first_offset,
            messages=ledger.messages,
            created_ms=ledger.created_ms,
            last_publish_time_ms=ledger.last_publish_time_ms,
        )
    return message.SerializeToString()


def decode_info(name: str, data: bytes) -> StoredInfo:
    try:
        message = managed_ledger_pb2.ManagedLedgerInfo.FromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, under any name it has
        raise ManagedLedgerError(
            f"the info of managed ledger {name!r} cannot be decoded: {e}", context={"name": name}
        ) from None
    _check_format(message.format_version, f"the info of managed ledger {name!r}")
    return StoredInfo(
        ledgers=tuple(
            LedgerInfo(
                ledger_id=ledger.ledger_id,
                entries=ledger.entries,
                size_bytes=ledger.size_bytes,
                first_offset=ledger.first_offset,
                messages=ledger.messages,
                created_ms=ledger.created_ms,
                last_publish_time_ms=ledger.last_publish_time_ms,
            )
            for ledger in message.ledgers
        ),
        terminated=message.terminated,
        terminated_position=(
            _position(message.terminated_position)
            if message.HasField("terminated_position")
            else None
        ),
        properties=dict(message.properties),
    )


def encode_cursor(cursor: StoredCursor) -> bytes:
    message = managed_ledger_pb2.CursorInfo(
        format_version=CURSOR_FORMAT_VERSION,
        mark_delete=_position_pb(cursor.mark_delete),
        mark_delete_offset=cursor.mark_delete_offset,
        state_ledger_id=-1,
        properties=dict(cursor.properties),
        last_active_ms=cursor.last_active_ms,
        subscription_type=cursor.subscription_type,  # type: ignore[arg-type]
    )
    message.packed_acked_ranges.extend(pack_ranges(cursor.acked_ranges))
    for position, count in cursor.redelivery_counts:
        message.redelivery_counts.add(position=_position_pb(position), count=count)
    for position, batch_size, indexes in cursor.batch_acks:
        message.batch_acks.add(
            position=_position_pb(position),
            batch_size=batch_size,
            acked_words=_bitset_words(indexes, batch_size),
        )
    return message.SerializeToString()


def pack_ranges(ranges: Sequence[tuple[Position, Position]]) -> list[int]:
    """Ranges as ``CursorInfo.packed_acked_ranges``: two numbers per position, each a delta
    from the previous position (see the proto)."""
    return _pack_positions([position for start_end in ranges for position in start_end])


def unpack_ranges(name: str, packed: Sequence[int]) -> tuple[tuple[Position, Position], ...]:
    """The inverse of :func:`pack_ranges`."""
    if len(packed) % 4:
        raise ManagedLedgerError(
            f"cursor {name!r} has {len(packed)} packed range numbers, not a multiple of 4",
            context={"cursor": name},
        )
    positions = _unpack_positions(packed)
    return tuple((positions[i], positions[i + 1]) for i in range(0, len(positions), 2))


def _bitset_words(indexes: frozenset[int], size: int) -> list[int]:
    words = [0] * ((size + 63) // 64)
    for i in indexes:
        words[i >> 6] |= 1 << (i & 63)
    return words


def _bitset_indexes(words: Sequence[int], size: int) -> frozenset[int]:
    return frozenset(
        w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1
    ) & frozenset(range(size))


def decode_cursor(name: str, data: bytes) -> StoredCursor:
    try:
        message = managed_ledger_pb2.CursorInfo.FromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, under any name it has
        raise ManagedLedgerError(
            f"cursor {name!r} cannot be decoded: {e}", context={"cursor": name}
        ) from None
    _check_format(message.format_version, f"cursor {name!r}", CURSOR_FORMAT_VERSION)
    acked_ranges = tuple((_position(r.start), _position(r.end)) for r in message.acked_ranges)
    acked_ranges += unpack_ranges(name, message.packed_acked_ranges)
    return StoredCursor(
        mark_delete=_position(message.mark_delete),
        mark_delete_offset=message.mark_delete_offset,
        acked_ranges=acked_ranges,
        properties=dict(message.properties),
        last_active_ms=message.last_active_ms,
        batch_acks=tuple(
            (_position(b.position), b.batch_size, _bitset_indexes(b.acked_words, b.batch_size))
            for b in message.batch_acks
        ),
        subscription_type=message.subscription_type,
        redelivery_counts=tuple(
            (_position(c.position), c.count) for c in message.redelivery_counts if c.count > 0
        ),
    )


def encode_delay_bucket(entries: Sequence[DelayedEntry]) -> bytes:
    """A bucket of a delayed-delivery index (entries in position order)."""
    message = managed_ledger_pb2.DelayBucket(format_version=DELAY_BUCKET_FORMAT_VERSION)
    entries = sorted(entries, key=lambda entry: entry.position)
    positions = [entry.position for entry in entries]
    message.packed_positions.extend(_pack_positions(positions))
    previous = 0
    times: list[int] = []
    for entry in entries:
        times.append(entry.deliver_at_ms - previous)
        previous = entry.deliver_at_ms
    message.deliver_at_ms.extend(times)
    message.num_messages.extend(entry.num_messages for entry in entries)
    message.key_hash_counts.extend(len(entry.key_hashes) for entry in entries)
    for entry in entries:
        message.key_hashes.extend(entry.key_hashes)
    return message.SerializeToString()


def decode_delay_bucket(name: str, data: bytes) -> tuple[DelayedEntry, ...]:
    """The inverse of :func:`encode_delay_bucket`; ``name`` (the key) names what was wrong."""
    try:
        message = managed_ledger_pb2.DelayBucket.FromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, under any name it has
        raise ManagedLedgerError(
            f"delay index bucket {name!r} cannot be decoded: {e}", context={"bucket": name}
        ) from None
    _check_format(
        message.format_version, f"delay index bucket {name!r}", DELAY_BUCKET_FORMAT_VERSION
    )
    count = len(message.num_messages)
    packed = message.packed_positions
    if (
        len(packed) != 2 * count
        or len(message.deliver_at_ms) != count
        or len(message.key_hash_counts) != count
        or sum(message.key_hash_counts) != len(message.key_hashes)
    ):
        raise ManagedLedgerError(
            f"delay index bucket {name!r} is inconsistent: {count} entries, "
            f"{len(packed)} position numbers, {len(message.deliver_at_ms)} times, "
            f"{len(message.key_hash_counts)} key hash counts for {len(message.key_hashes)} hashes",
            context={"bucket": name},
        )
    positions = _unpack_positions(packed)
    entries: list[DelayedEntry] = []
    deliver_at = 0
    hashes = 0
    for i in range(count):
        deliver_at += message.deliver_at_ms[i]
        n = message.key_hash_counts[i]
        entries.append(
            DelayedEntry(
                positions[i],
                deliver_at,
                message.num_messages[i],
                tuple(message.key_hashes[hashes : hashes + n]),
            )
        )
        hashes += n
    return tuple(entries)


def _pack_positions(positions: Sequence[Position]) -> list[int]:
    """Positions as two numbers each, deltas as in :func:`pack_ranges`."""
    packed: list[int] = []
    ledger, entry = 0, 0
    for position in positions:
        if position.ledger_id == ledger:
            packed += (0, position.entry_id - entry)
        else:
            packed += (position.ledger_id - ledger, position.entry_id)
        ledger, entry = position
    return packed


def _unpack_positions(packed: Sequence[int]) -> list[Position]:
    positions: list[Position] = []
    ledger, entry = 0, 0
    for i in range(0, len(packed), 2):
        ledger_delta, value = packed[i], packed[i + 1]
        ledger, entry = (
            (ledger, entry + value) if ledger_delta == 0 else (ledger + ledger_delta, value)
        )
        positions.append(Position(ledger, entry))
    return positions


def _check_format(version: int, what: str, newest: int = FORMAT_VERSION) -> None:
    if version > newest:
        raise ManagedLedgerError(
            f"{what} is in format version {version}; this broker reads up to {newest}"
            " (a newer broker wrote it)",
            context={"format_version": version},
        )


# --- names ---------------------------------------------------------------------------------


def check_name(name: object) -> str:
    """A managed ledger name: ``/``-separated segments such as ``public/default/t-partition-0``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(
            f"a managed ledger name is a str, got {type(name).__name__}: {name!r}"
        )
    problem = _name_problem(name, MAX_NAME_BYTES)
    if problem is None:
        segments = name.split("/")
        if any(s == "" for s in segments):
            problem = "it may not start or end with '/' or contain '//'"
        elif any(s in (".", "..") for s in segments):
            problem = "it may not contain a '.' or '..' segment"
    if problem is not None:
        raise InvalidArgumentError(
            f"invalid managed ledger name {name!r}: {problem}", context={"name": name}
        )
    return name


def check_cursor_name(name: object) -> str:
    """A cursor name: one segment, no ``/``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"a cursor name is a str, got {type(name).__name__}: {name!r}")
    problem = _name_problem(name, MAX_CURSOR_NAME_BYTES)
    if problem is None and "/" in name:
        problem = "it may not contain '/'"
    if problem is None and name in (".", ".."):
        problem = "'.' and '..' are not names"
    if problem is not None:
        raise InvalidArgumentError(
            f"invalid cursor name {name!r}: {problem}", context={"name": name}
        )
    return name


def _name_problem(name: str, limit: int) -> str | None:
    if not name:
        return "it is empty"
    size = len(name.encode("utf-8", errors="surrogatepass"))
    if size > limit:
        return f"it is {size} bytes of UTF-8; the limit is {limit}"
    for ch in name:
        if ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF:
            return f"it may not contain whitespace or control characters (found {ch!r})"
    return None
