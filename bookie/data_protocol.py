"""The bookie data protocol: what a frame between the ledger client and a bookie holds.

Ledger clients reach bookies over this framed protocol, not gRPC (every gRPC stream message
costs ~0.2 ms of Python CPU on each side, several times the work of the add it carries). The
byte stream is cut into frames by :mod:`magnetar.common.framing` (a 4-byte big-endian length,
then the body); this module says what a body is::

    offset  size  field
    0       1     kind         (Kind below; a response is its request's kind | 0x80)
    1       8     request_id   (u64, big-endian; chosen by the client, echoed in the answer)
    9       n     message      (the protobuf message the kind names, possibly empty)

A connection opens with HELLO (``DataHello``) from the client and WELCOME (``DataWelcome``)
from the bookie; then the client sends requests with ids of its choosing and the bookie answers
each once, in any order. A request that fails as a whole is answered by an ERROR frame with the
same request id (``ErrorDetail``, the typed error's code); the per-entry refusals of an add
travel in its ``AddEntriesResponse``, as on the gRPC stream. An ERROR frame with request id 0
speaks of the connection itself (the greeting was refused, a frame broke the protocol): the
bookie closes the connection after it. ``docs/protocol.md`` describes it for operators and
other implementations.

Pure functions and constants: no I/O, no gRPC. Both ends import it.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence

from magnetar.common.errors import InvalidArgumentError
from magnetar.common.framing import LENGTH, Bytes

PROTOCOL_VERSION = 1
"""The version a client names in HELLO; a bookie refuses versions it does not speak."""

HEADER = struct.Struct(">BQ")
"""kind (u8) and request id (u64), big-endian, at the start of every frame body."""
HEADER_SIZE = HEADER.size

RESPONSE = 0x80
"""Set in the kind of every answer: a response's kind is its request's kind | RESPONSE."""


class Kind(enum.IntEnum):
    """What a frame carries (requests; a response sets :data:`RESPONSE`)."""

    HELLO = 0x01
    """DataHello -> DataWelcome. First frame of a connection, and only then."""
    ADD_ENTRIES = 0x02
    """AddEntriesRequest -> AddEntriesResponse (its request_id field unused: 0)."""
    READ_ENTRIES = 0x03
    """ReadEntriesRequest -> ReadEntriesResponse."""
    READ_LAC = 0x04
    """ReadLacRequest -> ReadLacResponse (a long poll with timeout_ms)."""
    FENCE = 0x05
    """FenceRequest -> FenceResponse."""
    DELETE_LEDGER = 0x06
    """DeleteLedgerRequest -> DeleteLedgerResponse."""
    GET_BOOKIE_INFO = 0x07
    """GetBookieInfoRequest -> GetBookieInfoResponse."""
    LIST_LEDGERS = 0x08
    """ListLedgersRequest -> ListLedgersResponse."""
    PING = 0x09
    """Empty -> empty: a liveness probe of an idle or silent connection."""
    ERROR = 0x7F
    """Only ever sent as ``ERROR | RESPONSE`` (0xFF), by the bookie: an ErrorDetail."""


ERROR_KIND = Kind.ERROR | RESPONSE
"""0xFF: the kind of an ERROR frame."""

REQUEST_KINDS = frozenset(Kind) - {Kind.ERROR}
"""The kinds a client may send."""


class ProtocolError(InvalidArgumentError):
    """A frame that breaks the data protocol (not the framing): the connection is closed."""


def frame(kind: int, request_id: int, message: Bytes = b"") -> bytes:
    """One whole frame, length prefix included, ready to write."""
    body_size = HEADER_SIZE + len(message)
    return b"".join((LENGTH.pack(body_size), HEADER.pack(kind, request_id), message))


def frame_of_parts(kind: int, request_id: int, parts: Sequence[Bytes]) -> bytes:
    """:func:`frame` of a message given as parts to join: one copy of them in all."""
    body_size = HEADER_SIZE + sum(len(part) for part in parts)
    return b"".join((LENGTH.pack(body_size), HEADER.pack(kind, request_id), *parts))


def parse(body: memoryview) -> tuple[int, int, memoryview]:
    """``(kind, request_id, message)`` of a frame body; :class:`ProtocolError` when it is too
    short to hold the header."""
    if len(body) < HEADER_SIZE:
        raise ProtocolError(
            f"a data protocol frame of {len(body)} bytes is shorter than its"
            f" {HEADER_SIZE}-byte header (kind, request id)",
            context={"frame_size": len(body)},
        )
    kind, request_id = HEADER.unpack_from(body)
    return int(kind), int(request_id), body[HEADER_SIZE:]


def kind_name(kind: int) -> str:
    """``"FENCE"``, ``"FENCE response"``, or the number of a kind no one defined."""
    base = kind & ~RESPONSE
    try:
        name = Kind(base).name
    except ValueError:
        return f"0x{kind:02x}"
    return f"{name} response" if kind & RESPONSE else name
