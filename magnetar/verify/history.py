"""What a verify run saw: every send, delivery, stored message and fault, with its time.

The workload and the nemesis append to one :class:`History`; the checker reads it and nothing
else, so a history saved as JSON can be checked again later (``History.load``). Times are
seconds since the run started (one monotonic clock for every event).

A message is named by what its payload says, not by where it was stored: ``(producer, key,
seq)``, where ``seq`` counts that producer's messages for that key from 0. The payload also
carries a checksum, so a delivery of bytes no producer sent is recognised as a phantom.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PAYLOAD_VERSION = "v1"

Name = tuple[str, str, int]
"""A message's identity: (producer, key, seq)."""


def encode_payload(producer: str, key: str, seq: int, size: int) -> bytes:
    """``v1|producer|key|seq|pad|crc``, padded with a pattern so that it is ``size`` bytes long
    (or as short as its fields allow)."""
    head = f"{PAYLOAD_VERSION}|{producer}|{key}|{seq}|"
    pad_len = max(0, size - len(head) - 9)
    body = head + ("abcdefghijklmnopqrstuvwxyz" * (pad_len // 26 + 1))[:pad_len] + "|"
    return (body + f"{zlib.crc32(body.encode()):08x}").encode()


def decode_payload(payload: bytes) -> Name | None:
    """The name a payload carries, or None when it is not one the workload wrote intact."""
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return None
    body, _, crc = text.rpartition("|")
    parts = body.split("|")
    if len(parts) != 5 or parts[0] != PAYLOAD_VERSION:
        return None
    if f"{zlib.crc32((body + '|').encode()):08x}" != crc:
        return None
    try:
        return parts[1], parts[2], int(parts[3])
    except ValueError:
        return None


@dataclass(slots=True)
class Send:
    """One message a producer tried to publish, and what it was told."""

    producer: str
    key: str
    seq: int
    sent_at: float
    outcome: str = "pending"
    """``acked``, ``failed`` (the application got an error: the message may or may not be
    stored) or ``pending`` (no answer by the end of the run)."""
    answered_at: float | None = None
    partition: int = -1
    ledger_id: int = -1
    entry_id: int = -1
    batch_index: int = -1
    error: str = ""

    @property
    def name(self) -> Name:
        return (self.producer, self.key, self.seq)


@dataclass(slots=True)
class Delivery:
    """One message handed to a consumer of a subscription, and how its ack went."""

    subscription: str
    subscription_type: str
    consumer: str
    at: float
    partition: int
    ledger_id: int
    entry_id: int
    batch_index: int
    offset: int
    producer: str
    key: str
    seq: int
    redelivery_count: int
    phantom: bool = False
    """The payload was not one the workload wrote (unknown or corrupt)."""
    acked_at: float | None = None
    """When the broker confirmed the ack (acks wait for receipts); None if it never did."""
    ack_error: str = ""
    received_at: float | None = None
    """When the consumer's client got it from the broker (``at`` is when the application did;
    in between it waited in the client's queue). None in histories from before it was kept."""
    stream_opened_at: float | None = None
    """When the consumer stream it came on was opened (the broker sent it after this, perhaps
    long before its client got it). None in histories from before it was kept."""

    @property
    def name(self) -> Name:
        return (self.producer, self.key, self.seq)


@dataclass(slots=True)
class Stored:
    """One message of the final read of every partition from its start."""

    partition: int
    offset: int
    ledger_id: int
    entry_id: int
    batch_index: int
    producer: str
    key: str
    seq: int
    phantom: bool = False

    @property
    def name(self) -> Name:
        return (self.producer, self.key, self.seq)


@dataclass(slots=True)
class Switch:
    """A failover consumer told it became, or stopped being, a partition's active consumer."""

    at: float
    subscription: str
    consumer: str
    partition: int
    active: bool


@dataclass(slots=True)
class Fault:
    """One fault the nemesis injected: from ``started_at`` until it was healed at ``ended_at``."""

    index: int
    kind: str
    target: str
    planned_at: float
    planned_duration_s: float
    started_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    """Why the fault could not be injected or healed (empty when it went as planned)."""


@dataclass
class History:
    """Everything one run recorded."""

    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    sends: list[Send] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    stored: list[Stored] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    drain_complete: bool = False
    """Whether the final read reached the end of every partition."""
    phases: dict[str, float] = field(default_factory=dict)
    """When each phase began (``workload``, ``nemesis``, ``healed``, ``drain``, ``end``; in a
    secure run also ``rotation``)."""
    unexpected_exits: list[str] = field(default_factory=list)
    """Servers that exited without the nemesis killing them (a crash of Magnetar or etcd): one
    line each, naming the node, when it was found gone and its exit status."""
    stalls: list[dict[str, Any]] = field(default_factory=list)
    """When the drain ran out of time: per subscription that was not given every acknowledged
    message and per partition, what the broker's consumers and the client's streams held then
    (:meth:`Workload._stalls`)."""
    security: dict[str, Any] = field(default_factory=dict)
    """A secure run's security facts (empty otherwise): the hops, the rotation (when, what,
    the faults active then, how soon each server presented its new certificate), which
    certificate every server presented at the end, the tokens handed out and the refreshes
    and reloads the servers logged."""

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "config": self.config,
            "drain_complete": self.drain_complete,
            "phases": self.phases,
            "security": self.security,
            "unexpected_exits": self.unexpected_exits,
            "stalls": self.stalls,
            "faults": [asdict(f) for f in self.faults],
            "switches": [asdict(s) for s in self.switches],
            "sends": [asdict(s) for s in self.sends],
            "deliveries": [asdict(d) for d in self.deliveries],
            "stored": [asdict(s) for s in self.stored],
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")))

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> History:
        return cls(
            seed=int(body["seed"]),
            config=dict(body.get("config", {})),
            sends=[Send(**s) for s in body.get("sends", [])],
            deliveries=[Delivery(**d) for d in body.get("deliveries", [])],
            stored=[Stored(**s) for s in body.get("stored", [])],
            faults=[Fault(**f) for f in body.get("faults", [])],
            switches=[Switch(**s) for s in body.get("switches", [])],
            drain_complete=bool(body.get("drain_complete", False)),
            phases={k: float(v) for k, v in body.get("phases", {}).items()},
            security=dict(body.get("security", {})),
            unexpected_exits=list(body.get("unexpected_exits", [])),
            stalls=list(body.get("stalls", [])),
        )

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text()))
