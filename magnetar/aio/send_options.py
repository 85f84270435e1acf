"""What a send may say about its message(s) besides the content: one value, declared once.

Every send call (``send``, ``send_async``, ``send_many`` ... of the asyncio and the sync
producer) takes the same keyword arguments, :class:`SendFields`, and turns them into one
:class:`SendOptions` at the call; everything below the call carries that value. A delay
(``deliver_after_ms``) becomes a time there, with this process's wall clock, so it counts from
the call however long the message then waits for room or for the client's thread.

Messages sent with no options share :data:`NO_OPTIONS`, so a run of them (a sync
``send_async`` loop handed to the event loop at once) is added to a batch as one run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from magnetar.common.errors import InvalidArgumentError, MagnetarError

__all__ = ["NO_OPTIONS", "SendFields", "SendOptions", "deliver_time_ms", "send_options"]

_INT64_MAX = 2**63 - 1


class SendFields(TypedDict, total=False):
    """The keyword arguments of every send call."""

    properties: Mapping[str, str] | None
    """Free-form ``str -> str`` properties of the message."""
    partition_key: str | None
    """Routes the message to a partition (same key, same partition) and orders per key on
    key_shared subscriptions."""
    event_timestamp: int | None
    """The application's time of the event, ms since the epoch."""
    deliver_after_ms: int | None
    """Delayed delivery, from now (this process's wall clock)."""
    deliver_at_ms: int | None
    """Delayed delivery, at this time (ms since the epoch)."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """The checked options of a send: properties, key, event time, and the delivery time."""

    properties: Mapping[str, str] | None = None
    partition_key: str | None = None
    event_timestamp: int | None = None
    deliver_at_ms: int = 0
    """When the broker may deliver it (ms since the epoch); 0: at once."""

    @property
    def plain(self) -> bool:
        """Nothing but the content: the fast path of the batch builder."""
        return self is NO_OPTIONS


NO_OPTIONS = SendOptions()
"""The options of a message sent with none: one shared value."""


def deliver_time_ms(deliver_after_ms: int | None, deliver_at_ms: int | None) -> int:
    """The delivery time of a message sent now (ms since the epoch; 0: at once) from
    ``deliver_after_ms`` or ``deliver_at_ms``; :class:`InvalidArgumentError` when both are given
    or one is not an int >= 0."""
    if deliver_after_ms is None and deliver_at_ms is None:
        return 0
    if deliver_after_ms is not None and deliver_at_ms is not None:
        raise InvalidArgumentError(
            "give deliver_after_ms or deliver_at_ms, not both"
            f" (got deliver_after_ms={deliver_after_ms!r}, deliver_at_ms={deliver_at_ms!r})"
        )
    for name, value in (("deliver_after_ms", deliver_after_ms), ("deliver_at_ms", deliver_at_ms)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidArgumentError(f"{name} is an int (milliseconds), got {value!r}")
        if value is not None and value < 0:
            raise InvalidArgumentError(f"{name} must be >= 0, got {value}")
    if deliver_after_ms:
        return time.time_ns() // 1_000_000 + deliver_after_ms
    return deliver_at_ms or 0


_KNOWN = frozenset(SendFields.__annotations__)


def send_options(fields: Mapping[str, object]) -> SendOptions:
    """The :class:`SendOptions` of a send call's keyword arguments; raises
    :class:`InvalidArgumentError` naming what is wrong (an unknown argument, a key that is not
    a str, properties that are not str -> str, an event time or delay that is not an int >= 0,
    both delays)."""
    if not fields:
        return NO_OPTIONS
    unknown = set(fields) - _KNOWN
    if unknown:
        raise InvalidArgumentError(
            f"unknown send argument(s) {', '.join(sorted(unknown))}; a send takes"
            f" {', '.join(sorted(_KNOWN))}"
        )
    properties = fields.get("properties")
    partition_key = fields.get("partition_key")
    event_timestamp = fields.get("event_timestamp")
    error = check_fields(properties, partition_key, event_timestamp)
    if error is not None:
        raise error
    deliver_at = deliver_time_ms(
        fields.get("deliver_after_ms"),  # type: ignore[arg-type]
        fields.get("deliver_at_ms"),  # type: ignore[arg-type]
    )
    if not properties and partition_key is None and event_timestamp is None and not deliver_at:
        return NO_OPTIONS
    return SendOptions(
        # a copy: the caller may change its dict for the next message before this one is built
        properties=dict(properties) if properties else None,  # type: ignore[call-overload]
        partition_key=partition_key,  # type: ignore[arg-type]
        event_timestamp=event_timestamp,  # type: ignore[arg-type]
        deliver_at_ms=deliver_at,
    )


def check_fields(
    properties: object, partition_key: object, event_timestamp: object
) -> MagnetarError | None:
    """What is wrong with a message's key, properties or event time (None: nothing)."""
    if partition_key is not None and not isinstance(partition_key, str):
        return InvalidArgumentError(
            f"partition_key must be a str, got {type(partition_key).__name__}"
        )
    if properties is not None and (
        not isinstance(properties, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    ):
        return InvalidArgumentError("message properties must map str to str")
    if event_timestamp is not None and (
        not isinstance(event_timestamp, int)
        or isinstance(event_timestamp, bool)
        or not 0 <= event_timestamp <= _INT64_MAX
    ):
        return InvalidArgumentError(
            f"event_timestamp is ms since the epoch (an int >= 0), got {event_timestamp!r}"
        )
    return None
