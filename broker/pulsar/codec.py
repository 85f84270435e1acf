"""The wire format of Pulsar's binary protocol: frames to and from commands, payloads and batches.

Pure functions over bytes, with no I/O: a connection cuts its stream into frames with
:class:`magnetar.common.framing.FrameDecoder` (``[total_size u32][frame body]``), and this module
reads and writes the frame bodies. The commands are Pulsar's own protobuf messages, generated
from the vendored ``third_party/pulsar/PulsarApi.proto`` as :mod:`proto.pulsar.PulsarApi_pb2`.
All integers are big-endian.

**Simple commands** (everything but SEND and MESSAGE)::

    [total_size u32][command_size u32][BaseCommand]

**Payload commands** (SEND from a producer, MESSAGE to a consumer)::

    [total_size u32][command_size u32][BaseCommand]
      [0x0e02 u16][size u32][BrokerEntryMetadata]          MESSAGE only, optional
      [0x0e01 u16][crc32c u32][metadata_size u32][MessageMetadata][payload]

``total_size`` counts every byte after itself. The CRC-32C (Castagnoli) covers everything from
``metadata_size`` to the end of the frame. Broker entry metadata (PIP-70: the broker's
timestamp and the entry's index, here Magnetar's offset) goes only to clients whose CONNECT's
feature flags ask for it, and sits outside the checksum. ``metadata_size`` onwards is what a
producer sent and what a consumer gets: :attr:`Payload.metadata_and_payload` keeps those bytes,
so an entry can be stored and dispatched as sent.

**Batches**: when ``MessageMetadata.num_messages_in_batch`` is present, the payload (after
decompression of ``MessageMetadata.compression``, which is not this module's job) holds that many
messages, each::

    [size u32][SingleMessageMetadata][payload of SingleMessageMetadata.payload_size bytes]

Decoding never trusts a size the peer wrote: every size is checked against the bytes actually
there before it is used, and nothing is allocated by it. A frame that breaks the format raises a
:class:`PulsarFrameError` (an :class:`~magnetar.common.framing.FrameError`) naming what was
wrong; a connection closes on it. The protobuf runtime raises nothing else out of this module.

::

    FrameError                      magnetar.common.framing
    ├── FrameTooLargeError          total_size over the connection's maximum (framing layer)
    ├── TruncatedFrameError         the stream ended inside a frame (framing layer)
    └── PulsarFrameError            a frame broke Pulsar's format
        ├── PulsarSizeError         a size disagrees with the bytes there are
        ├── PulsarMagicError        not the magic number that belongs there
        ├── PulsarChecksumError     the payload's CRC-32C does not match
        └── PulsarCommandError      a command or metadata that does not parse, lacks a required
                                    field or the sub-message of its type, or has text that is
                                    not UTF-8

Copies: one, of the checksummed part of a payload command (``google_crc32c`` takes only
``bytes``); the payload and batched messages are views of it.

Proto2 string fields with bytes that are not UTF-8 come out of the protobuf runtime as ``bytes``,
not ``str``. :func:`decode_frame` refuses them in commands; it does not look into message metadata
(stored and returned as sent), so code that reads text from metadata must expect that.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import google_crc32c
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from magnetar.common.framing import LENGTH, Bytes, FrameDecoder, FrameError, FrameTooLargeError
from proto.pulsar import PulsarApi_pb2 as api

U32 = struct.Struct(">I")
MAGIC = struct.Struct(">H")
CHECKSUM_MAGIC = 0x0E01
"""Marks the CRC-32C before a payload's metadata."""
BROKER_ENTRY_METADATA_MAGIC = 0x0E02
"""Marks broker entry metadata before the checksum, on MESSAGE."""

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024 + 10 * 1024
"""Pulsar's default: a 5 MiB message (``maxMessageSize``) plus 10 KiB for its command and
metadata (``Commands.MESSAGE_SIZE_FRAME_PADDING``)."""

PAYLOAD_COMMANDS = frozenset({api.BaseCommand.SEND, api.BaseCommand.MESSAGE})
"""The command types followed by a payload."""

_TYPE_NAMES = api.BaseCommand.Type


class PulsarFrameError(FrameError):
    """A frame broke the format of Pulsar's binary protocol; the connection is closed."""


class PulsarSizeError(PulsarFrameError):
    """A size inside a frame disagrees with the number of bytes there are."""


class PulsarMagicError(PulsarFrameError):
    """The bytes after a command are not the magic number that belongs there."""


class PulsarChecksumError(PulsarFrameError):
    """A payload's CRC-32C does not match its metadata and payload."""


class PulsarCommandError(PulsarFrameError):
    """A command or metadata did not parse, lacks a required field or its sub-message."""


def type_name(command_type: int) -> str:
    """``SEND`` for 6; ``type 99`` for a number this revision of the protocol does not know."""
    try:
        return _TYPE_NAMES.Name(command_type)  # type: ignore[arg-type]
    except ValueError:
        return f"type {command_type}"


def _sub_message_fields() -> dict[int, FieldDescriptor]:
    """The field of BaseCommand holding the sub-message of each type (same number as the type)."""
    fields: dict[int, FieldDescriptor] = {}
    by_number = api.BaseCommand.DESCRIPTOR.fields_by_number
    for value in api.BaseCommand.DESCRIPTOR.enum_types_by_name["Type"].values:
        field = by_number[value.number]
        assert field.message_type is not None, field.full_name
        fields[value.number] = field
    return fields


SUB_MESSAGE_FIELDS = _sub_message_fields()


# An absent sub-message reads as an empty one; that is only wrong when it has required fields
# (PING and PONG have none, and a client may leave them out).
NEEDS_SUB_MESSAGE = frozenset(
    number
    for number, field in SUB_MESSAGE_FIELDS.items()
    if not getattr(api.BaseCommand(), field.name).IsInitialized()
)


def sub_message(command: api.BaseCommand) -> Message:
    """The sub-message a command's type names (``command.send`` for SEND)."""
    return getattr(command, SUB_MESSAGE_FIELDS[command.type].name)  # type: ignore[no-any-return]


def _holds_text(descriptor: Descriptor | None, seen: frozenset[str] = frozenset()) -> bool:
    """Whether messages of this type can hold a string field, at any depth."""
    if descriptor is None or descriptor.full_name in seen:
        return False  # MessageIdData holds itself; its other fields decide
    inner = seen | {descriptor.full_name}
    return any(
        f.type == FieldDescriptor.TYPE_STRING
        or (f.type == FieldDescriptor.TYPE_MESSAGE and _holds_text(f.message_type, inner))
        for f in descriptor.fields
    )


HAS_TEXT = frozenset(
    number for number, field in SUB_MESSAGE_FIELDS.items() if _holds_text(field.message_type)
)
"""The command types whose sub-message can hold text, which must be UTF-8."""


def _has(message: Message, field: str) -> bool:
    return message.HasField(field)


def _missing(message: Message) -> str:
    """The required fields ``message`` lacks, by path (``connect.client_version``)."""
    # in every protobuf runtime, not in the type stubs
    errors: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
    return ", ".join(errors)


def _text_problem(message: Message, path: str) -> str | None:
    """The first string field of ``message`` (or below) that holds bytes that are not UTF-8."""
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            values = value if field.is_repeated else [value]
            if any(not isinstance(v, str) for v in values):
                return f"{path}.{field.name}"
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            values = value if field.is_repeated else [value]
            for v in values:
                problem = _text_problem(v, f"{path}.{field.name}")
                if problem is not None:
                    return problem
    return None


def check_command(command: api.BaseCommand) -> None:
    """Raise :class:`PulsarCommandError` unless ``command`` is complete and of a known type."""
    if not command.HasField("type"):
        raise PulsarCommandError(
            "a command without a type, or of a type this protocol revision does not know"
        )
    field = SUB_MESSAGE_FIELDS[command.type]
    if command.type in NEEDS_SUB_MESSAGE and not _has(command, field.name):
        name = type_name(command.type)
        raise PulsarCommandError(
            f"a {name} command without its {field.name} sub-message",
            context={"command": name, "field": field.name},
        )
    if not command.IsInitialized():
        name = type_name(command.type)
        missing = _missing(command)
        raise PulsarCommandError(
            f"a {name} command lacks required fields: {missing}",
            context={"command": name, "missing": missing},
        )
    if command.type not in HAS_TEXT:
        return  # SEND, ACK, FLOW and the like: nothing to look at
    problem = _text_problem(getattr(command, field.name), f"BaseCommand.{field.name}")
    if problem is not None:
        name = type_name(command.type)
        raise PulsarCommandError(
            f"a {name} command's {problem} is not UTF-8 text",
            context={"command": name, "field": problem},
        )


def _parse(
    message_class: type[Message], data: memoryview, what: str, *, complete: bool = True
) -> Message:
    try:
        message = message_class.FromString(data)  # type: ignore[arg-type]  # any buffer does
    except (DecodeError, ValueError, RuntimeError) as e:
        raise PulsarCommandError(f"{what} does not parse: {e}", context={"what": what}) from e
    if complete and not message.IsInitialized():
        missing = _missing(message)
        raise PulsarCommandError(
            f"{what} lacks required fields: {missing}", context={"what": what, "missing": missing}
        )
    return message


# --- encoding ---------------------------------------------------------------------------------


def _serialize(message: Message, what: str) -> bytes:
    try:
        return message.SerializeToString()
    except EncodeError as e:
        raise PulsarCommandError(f"{what} cannot be encoded: {e}", context={"what": what}) from e


def encode_command(command: api.BaseCommand) -> bytes:
    """A simple command as a whole frame: ``[total_size][command_size][BaseCommand]``."""
    check_command(command)
    if command.type in PAYLOAD_COMMANDS:
        raise PulsarCommandError(
            f"a {type_name(command.type)} command carries a payload: use encode_payload_command"
        )
    data = _serialize(command, "the command")
    return U32.pack(4 + len(data)) + U32.pack(len(data)) + data


def encode_metadata_and_payload(metadata: api.MessageMetadata, payload: Bytes) -> bytes:
    """``[metadata_size][MessageMetadata][payload]``: the checksummed part of a payload command."""
    data = _serialize(metadata, "the message metadata")
    return U32.pack(len(data)) + data + payload


def encode_payload_command(
    command: api.BaseCommand,
    metadata_and_payload: Bytes,
    *,
    broker_entry_metadata: api.BrokerEntryMetadata | None = None,
) -> bytes:
    """A SEND or MESSAGE as a whole frame, around ``metadata_and_payload`` as it was sent.

    ``metadata_and_payload`` is ``[metadata_size][MessageMetadata][payload]``
    (:func:`encode_metadata_and_payload`, or :attr:`Payload.metadata_and_payload` of a frame
    read); its CRC-32C is computed here.
    """
    check_command(command)
    if command.type not in PAYLOAD_COMMANDS:
        raise PulsarCommandError(f"a {type_name(command.type)} command carries no payload")
    if broker_entry_metadata is not None and command.type != api.BaseCommand.MESSAGE:
        raise PulsarCommandError("only MESSAGE carries broker entry metadata")
    body = bytes(metadata_and_payload)
    if len(body) < 4 or U32.unpack_from(body)[0] > len(body) - 4:
        raise PulsarSizeError(
            "metadata_and_payload must start with the size of the metadata that follows it"
        )
    data = _serialize(command, "the command")
    parts = [b"", U32.pack(len(data)), data]
    if broker_entry_metadata is not None:
        entry = _serialize(broker_entry_metadata, "the broker entry metadata")
        parts += [MAGIC.pack(BROKER_ENTRY_METADATA_MAGIC), U32.pack(len(entry)), entry]
    parts += [MAGIC.pack(CHECKSUM_MAGIC), U32.pack(google_crc32c.value(body)), body]
    total = sum(len(p) for p in parts)  # everything after total_size itself
    parts[0] = LENGTH.pack(total)
    return b"".join(parts)


def encode_message(
    command: api.BaseCommand,
    metadata: api.MessageMetadata,
    payload: Bytes,
    *,
    broker_entry_metadata: api.BrokerEntryMetadata | None = None,
) -> bytes:
    """A SEND or MESSAGE as a whole frame, from its metadata and payload."""
    return encode_payload_command(
        command,
        encode_metadata_and_payload(metadata, payload),
        broker_entry_metadata=broker_entry_metadata,
    )


# --- decoding ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Payload:
    """What follows a SEND or MESSAGE command."""

    metadata: api.MessageMetadata
    metadata_and_payload: bytes
    """``[metadata_size][MessageMetadata][payload]`` as the peer sent it: what the CRC covers."""
    payload: memoryview
    """The message's bytes, or its batch (compressed as ``metadata.compression`` says)."""
    checksum: int
    broker_entry_metadata: api.BrokerEntryMetadata | None = None


@dataclass(frozen=True, slots=True)
class Frame:
    """A decoded frame: its command and, for SEND and MESSAGE, the payload after it."""

    command: api.BaseCommand
    payload: Payload | None = None

    @property
    def type(self) -> int:
        return self.command.type

    @property
    def type_name(self) -> str:
        return type_name(self.command.type)


def frame_decoder(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> FrameDecoder:
    """A decoder cutting a Pulsar connection's stream into frame bodies for :func:`decode_frame`.

    Its length prefix is Pulsar's ``total_size``; a frame over ``max_frame_size`` raises
    :class:`~magnetar.common.framing.FrameTooLargeError`.
    """
    return FrameDecoder(max_frame_size=max_frame_size, name="Pulsar frame")


def _u32(view: memoryview, at: int, what: str) -> int:
    if len(view) - at < 4:
        raise PulsarSizeError(
            f"the frame ends {len(view) - at} bytes after {what} began, inside its 4 bytes",
            context={"what": what},
        )
    return int(U32.unpack_from(view, at)[0])


def decode_frame(body: Bytes) -> Frame:
    """Decode one frame's body (the bytes after ``total_size``).

    Raises :class:`PulsarFrameError` for anything but a well-formed frame.
    """
    view = memoryview(body).cast("B")
    end = len(view)
    command_size = _u32(view, 0, "command_size")
    if command_size > end - 4:
        raise PulsarSizeError(
            f"command_size {command_size} is over the {end - 4} bytes the frame has after it",
            context={"command_size": command_size, "frame_size": end},
        )
    # check_command says what a command lacks
    command = _parse(api.BaseCommand, view[4 : 4 + command_size], "the command", complete=False)
    assert isinstance(command, api.BaseCommand)
    check_command(command)
    at = 4 + command_size
    if at == end:
        if command.type in PAYLOAD_COMMANDS:
            name = type_name(command.type)
            raise PulsarSizeError(f"a {name} command without the payload it carries")
        return Frame(command)
    if command.type not in PAYLOAD_COMMANDS:
        name = type_name(command.type)
        raise PulsarSizeError(
            f"{end - at} bytes follow a {name} command, which carries no payload",
            context={"command": name, "extra_bytes": end - at},
        )
    return Frame(command, _decode_payload(view, at, command.type))


def _magic(view: memoryview, at: int) -> int | None:
    return int(MAGIC.unpack_from(view, at)[0]) if len(view) - at >= 2 else None


def _decode_payload(view: memoryview, at: int, command_type: int) -> Payload:
    entry_metadata: api.BrokerEntryMetadata | None = None
    if _magic(view, at) == BROKER_ENTRY_METADATA_MAGIC:
        if command_type != api.BaseCommand.MESSAGE:
            name = type_name(command_type)
            raise PulsarMagicError(
                f"broker entry metadata (0x0e02) on a {name}; only MESSAGE carries it"
            )
        size = _u32(view, at + 2, "the broker entry metadata size")
        start = at + 6
        if size > len(view) - start:
            raise PulsarSizeError(
                f"broker entry metadata of {size} bytes is over the {len(view) - start} left",
                context={"size": size, "left": len(view) - start},
            )
        parsed = _parse(
            api.BrokerEntryMetadata, view[start : start + size], "the broker entry metadata"
        )
        assert isinstance(parsed, api.BrokerEntryMetadata)
        entry_metadata = parsed
        at = start + size
    magic = _magic(view, at)
    if magic != CHECKSUM_MAGIC:
        found = "the end of the frame" if magic is None else f"0x{magic:04x}"
        name = type_name(command_type)
        raise PulsarMagicError(
            f"{found} where a {name}'s checksum magic 0x0e01 belongs",
            context={"command": name, "found": found},
        )
    checksum = _u32(view, at + 2, "the checksum")
    # google_crc32c reads bytes only: this is the one copy of the payload.
    checksummed = bytes(view[at + 6 :])
    region = memoryview(checksummed)
    metadata_size = _u32(region, 0, "metadata_size")
    if metadata_size > len(region) - 4:
        raise PulsarSizeError(
            f"metadata_size {metadata_size} is over the {len(region) - 4} bytes after it",
            context={"metadata_size": metadata_size, "left": len(region) - 4},
        )
    actual = google_crc32c.value(checksummed)
    if actual != checksum:
        name = type_name(command_type)
        raise PulsarChecksumError(
            f"a {name}'s CRC-32C is 0x{actual:08x}, the frame says 0x{checksum:08x}",
            context={"command": name, "computed": f"0x{actual:08x}", "sent": f"0x{checksum:08x}"},
        )
    metadata = _parse(api.MessageMetadata, region[4 : 4 + metadata_size], "the message metadata")
    assert isinstance(metadata, api.MessageMetadata)
    return Payload(
        metadata=metadata,
        metadata_and_payload=checksummed,
        payload=region[4 + metadata_size :],
        checksum=checksum,
        broker_entry_metadata=entry_metadata,
    )


# --- batches ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchedMessage:
    """One message of a batch: its metadata and its bytes (a view of the batch)."""

    metadata: api.SingleMessageMetadata
    payload: memoryview


def encode_batch(messages: Iterable[tuple[api.SingleMessageMetadata, Bytes]]) -> bytes:
    """A batch's payload, uncompressed; each metadata's ``payload_size`` is set to its payload's."""
    parts: list[bytes | memoryview] = []
    for metadata, payload in messages:
        view = memoryview(payload).cast("B")
        single = api.SingleMessageMetadata()
        single.CopyFrom(metadata)
        single.payload_size = len(view)
        data = _serialize(single, "a batched message's metadata")
        parts += [U32.pack(len(data)), data, view]
    return b"".join(parts)


def decode_batch(batch: Bytes, count: int) -> list[BatchedMessage]:
    """The ``count`` messages of an uncompressed batch payload, which they must fill exactly.

    ``count`` is the metadata's ``num_messages_in_batch``.
    """
    view = memoryview(batch).cast("B")
    end = len(view)
    if count < 0:
        raise PulsarSizeError(f"num_messages_in_batch is {count}; it cannot be negative")
    # Each message takes at least 4 bytes: no list is sized by a count the bytes cannot hold.
    if count > end // 4:
        raise PulsarSizeError(
            f"num_messages_in_batch {count} cannot fit in a batch of {end} bytes",
            context={"count": count, "batch_size": end},
        )
    messages: list[BatchedMessage] = []
    at = 0
    for index in range(count):
        size = _u32(view, at, f"the metadata size of batched message {index}")
        at += 4
        if size > end - at:
            raise PulsarSizeError(
                f"batched message {index}'s metadata of {size} bytes is over the {end - at} left",
                context={"index": index, "size": size, "left": end - at},
            )
        parsed = _parse(
            api.SingleMessageMetadata, view[at : at + size], f"batched message {index}'s metadata"
        )
        assert isinstance(parsed, api.SingleMessageMetadata)
        at += size
        payload_size = parsed.payload_size
        if not 0 <= payload_size <= end - at:
            raise PulsarSizeError(
                f"batched message {index}'s payload_size {payload_size} is not within the"
                f" {end - at} bytes left",
                context={"index": index, "payload_size": payload_size, "left": end - at},
            )
        messages.append(BatchedMessage(parsed, view[at : at + payload_size]))
        at += payload_size
    if at != end:
        raise PulsarSizeError(
            f"{end - at} bytes follow the {count} messages of the batch",
            context={"count": count, "extra_bytes": end - at},
        )
    return messages


__all__ = [
    "BROKER_ENTRY_METADATA_MAGIC",
    "CHECKSUM_MAGIC",
    "DEFAULT_MAX_FRAME_SIZE",
    "PAYLOAD_COMMANDS",
    "BatchedMessage",
    "Frame",
    "FrameTooLargeError",
    "Payload",
    "PulsarChecksumError",
    "PulsarCommandError",
    "PulsarFrameError",
    "PulsarMagicError",
    "PulsarSizeError",
    "check_command",
    "decode_batch",
    "decode_frame",
    "encode_batch",
    "encode_command",
    "encode_message",
    "encode_metadata_and_payload",
    "encode_payload_command",
    "frame_decoder",
    "sub_message",
    "type_name",
]
