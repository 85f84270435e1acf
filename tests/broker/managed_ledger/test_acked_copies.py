"""A subscription on an in-process managed ledger never hands out a copy of an entry after an
ack of it was applied (the ack's receipt may only be overtaken by copies sent before it).

``magnetar verify --seed 2 --secure`` once saw a shared consumer get messages again after
another consumer's resent acks of them were receipted: the new owner had sent them to the
first consumer before those acks came. These tests pin the broker's side of that: a delivery
waiting for its stream to write it, or read while the same read went on, whose entry is
acknowledged meanwhile, is not written."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.managed_ledger import Entry, ManagedLedger, Position
from broker.service.config import BrokerConfig
from broker.service.streams import AckDone, Deliveries, DeliveryItem, SubscriptionType
from broker.service.subscription import ConsumerSession, Subscription
from magnetar.common.errors import ServiceNotReadyError
from magnetar.common.names import parse_topic
from magnetar.testing.eventually import eventually
from tests.broker.managed_ledger.conftest import Env, append_all


class FakeTopic:
    """What a subscription asks of its topic, around a real managed ledger."""

    def __init__(self, ml: ManagedLedger) -> None:
        self.ml = ml
        self.name = parse_topic("persistent://t/ns/acked-copies-partition-0")
        self.config = BrokerConfig(metadata="memory://")
        self.is_closing = False

    def cursor_moved(self) -> None:
        pass

    def fenced(self, error: Any) -> None:
        raise AssertionError(f"fenced: {error}")

    def drop_subscription(self, subscription: Subscription) -> None:
        pass

    seek_to: Position | None = None

    async def resolve_start(self, start: object, *, strict: bool = False) -> tuple[Position, int]:
        assert self.seek_to is not None
        return self.seek_to, 0


async def shared(env: Env, entries: int) -> tuple[Subscription, list[Position]]:
    ml = await env.factory().open("acked-copies")
    cursor = await ml.open_cursor("sub", start="earliest")
    written = await append_all(ml, [b"m%d" % i for i in range(entries)], 1)
    subscription = Subscription(
        FakeTopic(ml),  # type: ignore[arg-type]  # the part of a Topic it uses
        "sub",
        cursor,
        SubscriptionType.SHARED,
        durable=True,
        max_entries=100,
        max_bytes=1 << 20,
    )
    return subscription, [r.position for r in written]


def queued(session: ConsumerSession) -> list[DeliveryItem]:
    return [item for event in queued_events(session) for item in event.items]


def queued_events(session: ConsumerSession) -> list[Deliveries]:
    events: list[Deliveries] = []
    while not session.events.empty():
        event = session.events.get_nowait()
        if isinstance(event, Deliveries):
            events.append(event)
    return events


async def receipt(session: ConsumerSession, request_id: int) -> None:
    async with asyncio.timeout(10):
        while True:
            event = await session.events.get()
            if isinstance(event, AckDone) and event.request_id == request_id:
                return


async def test_a_queued_delivery_acknowledged_by_another_consumer_is_not_written(
    ml_env: Env,
) -> None:
    subscription, positions = await shared(ml_env, 4)
    acker = ConsumerSession(subscription, "acker")
    slow = ConsumerSession(subscription, "slow")
    subscription.add_consumer(acker)
    subscription.add_consumer(slow)
    try:
        slow.flow(10)  # the acker has no permits: every entry goes to the slow consumer
        await eventually(lambda: slow.events.qsize() > 0, interval_s=0.01)
        assert slow.permits == 6
        # its stream has not written them yet; the acker's resent acks of two of them come,
        # are persisted and receipted (a consumer may ack what another holds on shared)
        acker.ack(positions[:2], cumulative=False, request_id=1)
        await receipt(acker, 1)
        assert subscription.cursor.is_acked(positions[0])

        written = [item for event in queued_events(slow) for item in slow.still_unacked(event)]

        assert [item.position for item in written] == positions[2:]
        assert slow.permits == 8  # the two dropped messages' permits came back
        assert slow.buffered_bytes == sum(len(item.payload) for item in written)
    finally:
        await subscription.close(_closing())


async def test_after_a_seek_the_dropped_copies_give_no_permits_back(ml_env: Env) -> None:
    # a seek forward counts what is before its target as acknowledged, so copies queued before
    # it are dropped too; the seek took the consumer's permits away and the client grants anew
    # after seek_complete: giving the dropped ones' permits back would grant more than it did
    subscription, positions = await shared(ml_env, 4)
    slow = ConsumerSession(subscription, "slow")
    subscription.add_consumer(slow)
    try:
        slow.flow(10)
        await eventually(lambda: slow.events.qsize() > 0, interval_s=0.01)
        subscription.topic.seek_to = positions[2]  # type: ignore[attr-defined]
        await slow.seek(None, request_id=1)  # type: ignore[arg-type]  # the fake resolves it
        assert slow.permits == 0

        written = [item for event in queued_events(slow) for item in slow.still_unacked(event)]

        assert [item.position for item in written] == positions[2:]
        assert slow.permits == 0
    finally:
        await subscription.close(_closing())


async def test_an_entry_acknowledged_during_the_read_that_found_it_is_not_dispatched(
    ml_env: Env,
) -> None:
    subscription, positions = await shared(ml_env, 4)
    acker = ConsumerSession(subscription, "acker")
    reader = ConsumerSession(subscription, "reader")
    ml = subscription.ml
    real_read = ml.read
    calls = 0

    async def short_then_acked(start: Position, *, max_entries: int, max_bytes: int) -> list[Entry]:
        # the dispatcher reads one entry first (to learn the batch size), then the rest; that
        # read comes back short (a ledger's end, say), so the cursor reads again, and during
        # the second part the entry the first part found is acknowledged
        nonlocal calls
        calls += 1
        if calls == 2:
            return await real_read(start, max_entries=1, max_bytes=max_bytes)
        if calls == 3:
            acker.ack([positions[1]], cumulative=False)
        return await real_read(start, max_entries=max_entries, max_bytes=max_bytes)

    ml.read = short_then_acked  # type: ignore[method-assign]
    subscription.add_consumer(acker)
    subscription.add_consumer(reader)
    try:
        reader.flow(10)
        await eventually(lambda: reader.events.qsize() > 0, interval_s=0.01)
        await asyncio.sleep(0.05)  # let the dispatcher go idle

        got = [item.position for item in queued(reader)]

        assert calls >= 3
        assert got == [positions[0], *positions[2:]]
        assert reader.permits == 7
        assert reader.unacked_messages == 3
    finally:
        ml.read = real_read  # type: ignore[method-assign]
        await subscription.close(_closing())


def _closing() -> ServiceNotReadyError:
    return ServiceNotReadyError("test over")
