"""The verify workload: producers and consumers that write down everything they are told.

Producers send sequence-numbered messages (per producer, per key) to one partitioned topic at
a steady rate; the key picks the partition, so one producer's messages for one key share a
partition and must be stored in send order. Every answer is recorded (acked with its message
id, or failed with its error). One subscription of each type (exclusive, failover, shared,
key_shared) has consumers that record every delivery and acknowledge it with a receipt, so the
history knows when the broker confirmed each ack. At the end, :meth:`Workload.drain` lets the
subscriptions catch up and reads every partition from its start.

Nothing here retries a send: the checker judges what the application was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from magnetar.aio import AdminClient, Client, Consumer, Message, Producer
from magnetar.aio.message import received_monotonic, stream_opened_monotonic
from magnetar.aio.message_id import MessageId
from magnetar.common.errors import (
    ClientClosedError,
    ConsumerClosedError,
    MagnetarError,
    ProducerClosedError,
    ReceiveTimeoutError,
)
from magnetar.verify.history import (
    Delivery,
    History,
    Send,
    Stored,
    Switch,
    decode_payload,
    encode_payload,
)

log = structlog.get_logger("magnetar.verify")

SUBSCRIPTIONS: tuple[tuple[str, str, int], ...] = (
    ("exclusive", "exclusive", 1),
    ("failover", "failover", 2),
    ("shared", "shared", 2),
    ("key_shared", "key_shared", 2),
)
"""(subscription name, type, consumers) of a run."""


class Clock:
    """Seconds since the run began, on the monotonic clock every event uses."""

    def __init__(self) -> None:
        self._zero = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._zero

    def at(self, monotonic: float) -> float:
        """A ``time.monotonic()`` reading as seconds since the run began."""
        return monotonic - self._zero


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """What the workload sends and how it consumes."""

    topic: str
    partitions: int = 4
    producers: int = 2
    keys: int = 8
    rate: float = 300.0
    """Messages per second, all producers together."""
    message_size: int = 100
    max_pending: int = 500
    """Sends in flight per producer (its ``max_pending_messages``)."""
    send_timeout_ms: int = 30_000
    subscriptions: tuple[tuple[str, str, int], ...] = SUBSCRIPTIONS

    def __post_init__(self) -> None:
        for name, value, low in (
            ("partitions", self.partitions, 1),
            ("producers", self.producers, 1),
            ("keys", self.keys, 1),
            ("message_size", self.message_size, 16),
            ("max_pending", self.max_pending, 1),
            ("send_timeout_ms", self.send_timeout_ms, 1),
        ):
            if value < low:
                raise ValueError(f"workload {name} must be >= {low}, got {value}")
        if self.rate <= 0:
            raise ValueError(f"workload rate must be > 0 messages/s, got {self.rate}")


class Workload:
    """Runs the producers and consumers of one verify run against ``service_url``."""

    def __init__(
        self,
        service_url: str | Callable[[], str],
        config: WorkloadConfig,
        history: History,
        clock: Clock,
        seed: int,
        *,
        client_settings: Callable[[], dict[str, Any]] | None = None,
        admin_settings: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``client_settings`` gives the workload's ``Client`` its keyword settings (TLS and
        authentication in a secure run); ``admin_settings``, when given, are those of a
        separate client that creates the topic (a role the workload's own may not be)."""
        self._service_url = service_url
        self._client_settings = client_settings or dict
        self._admin_settings = admin_settings
        self.config = config
        self.history = history
        self.clock = clock
        self.seed = seed
        self._stop_producing = asyncio.Event()
        self._stop_consuming = asyncio.Event()
        self._producer_tasks: list[asyncio.Task[None]] = []
        self._consumer_tasks: list[asyncio.Task[None]] = []
        self._ack_tasks: set[asyncio.Task[None]] = set()
        self._unanswered: set[asyncio.Future[MessageId]] = set()
        self._seen: dict[str, set[tuple[str, str, int]]] = defaultdict(set)
        self.client: Client | None = None
        self.errors: list[str] = []
        self._consumers: dict[str, Consumer] = {}
        """The consumer each consumer task uses now, by consumer name (for :meth:`_stalls`)."""

    def _url(self) -> str:
        return self._service_url() if callable(self._service_url) else self._service_url

    async def start(self) -> None:
        """Create the topic and the subscriptions, then start consuming and producing."""
        self.client = Client(self._url(), operation_timeout_s=60, **self._client_settings())
        await self._create_topic()
        for name, kind, count in self.config.subscriptions:
            for index in range(count):
                consumer = await self._subscribe(name, kind, index)
                self._consumers[f"{name}-{index}"] = consumer
                self._consumer_tasks.append(
                    asyncio.create_task(self._consume(name, kind, index, consumer))
                )
        for index in range(self.config.producers):
            producer = await self._open_producer(index)
            self._producer_tasks.append(asyncio.create_task(self._produce(index, producer)))

    async def _create_topic(self) -> None:
        async with self._admin() as admin:
            # keep every ledger (retention -1): consumed ones would otherwise be deleted, and
            # the final read must see everything that was ever stored
            await admin.create_topic(
                self.config.topic,
                self.config.partitions,
                policies={
                    "retention_time_ms": -1,
                    "retention_size_bytes": -1,
                    "deduplication": True,
                },
            )

    # --- producing ---------------------------------------------------------------------------

    async def _open_producer(self, index: int) -> Producer:
        assert self.client is not None
        return await self.client.create_producer(
            self.config.topic,
            f"verify-producer-{index}",
            send_timeout_ms=self.config.send_timeout_ms,
            max_pending_messages=self.config.max_pending,
            batching_max_publish_delay_ms=5.0,
        )

    async def _produce(self, index: int, producer: Producer) -> None:
        config = self.config
        rng = random.Random(self.seed * 1_000_003 + index)
        name = f"verify-producer-{index}"
        seqs: dict[str, int] = defaultdict(int)
        interval = config.producers / config.rate
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self._stop_producing.is_set():
            key = f"k{rng.randrange(config.keys)}"
            seq = seqs[key]
            seqs[key] += 1
            send = Send(name, key, seq, self.clock.now())
            self.history.sends.append(send)
            payload = encode_payload(name, key, seq, config.message_size)
            try:
                future = await producer.send_async_when_room(payload, partition_key=key)
            except MagnetarError as e:
                self._answered(send, None, e)
                future = None
            if future is not None:
                self._unanswered.add(future)
                future.add_done_callback(partial(self._on_answer, send))
                if future.done() and isinstance(future.exception(), ProducerClosedError):
                    producer = await self._reopen_producer(index, producer)
            due = max(due + interval, loop.time() - 1.0)  # never a burst after a stall
            delay = due - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_producing.wait(), delay)
        with contextlib.suppress(MagnetarError):
            await producer.flush()
        # every send is answered (acked, or failed by its send timeout) before the drain
        if self._unanswered:
            await asyncio.wait(set(self._unanswered), timeout=config.send_timeout_ms / 1000 + 30)
        with contextlib.suppress(MagnetarError):
            await producer.close()

    async def _reopen_producer(self, index: int, old: Producer) -> Producer:
        with contextlib.suppress(MagnetarError):
            await old.close()
        while not self._stop_producing.is_set():
            try:
                return await self._open_producer(index)
            except MagnetarError as e:
                self.errors.append(f"{self.clock.now():.3f}s reopen producer {index}: {e.message}")
                await asyncio.sleep(0.5)
        return old

    def _on_answer(self, send: Send, future: asyncio.Future[MessageId]) -> None:
        self._unanswered.discard(future)
        if future.cancelled():
            self._answered(send, None, None)
            return
        error = future.exception()
        self._answered(send, None if error else future.result(), error)

    def _answered(
        self, send: Send, message_id: MessageId | None, error: BaseException | None
    ) -> None:
        send.answered_at = self.clock.now()
        if message_id is not None:
            send.outcome = "acked"
            send.partition = max(message_id.partition, 0)
            send.ledger_id = message_id.ledger_id
            send.entry_id = message_id.entry_id
            send.batch_index = message_id.batch_index
        else:
            send.outcome = "failed"
            send.error = (
                f"{type(error).__name__}: {getattr(error, 'message', error)}"
                if error is not None
                else "cancelled"
            )

    def stop_producing(self) -> None:
        self._stop_producing.set()

    async def wait_producers(self) -> None:
        """Until every producer has stopped and every send has its answer."""
        await asyncio.gather(*self._producer_tasks)

    # --- consuming ---------------------------------------------------------------------------

    async def _subscribe(self, name: str, kind: str, index: int) -> Consumer:
        assert self.client is not None
        consumer_name = f"{name}-{index}"

        def switched(partition_topic: str, active: bool) -> None:
            partition = int(partition_topic.rsplit("-partition-", 1)[1])
            self.history.switches.append(
                Switch(self.clock.now(), name, consumer_name, partition, active)
            )

        return await self.client.subscribe(
            self.config.topic,
            name,
            kind,  # type: ignore[arg-type]  # one of the four type names
            on_active_change=switched if kind == "failover" else None,
            consumer_name=consumer_name,
            initial_position="earliest",
            ack_receipts=True,
            receiver_queue_size=200,
        )

    async def _consume(self, name: str, kind: str, index: int, consumer: Consumer) -> None:
        consumer_name = f"{name}-{index}"
        while not self._stop_consuming.is_set():
            try:
                message = await consumer.receive(timeout_millis=200)
            except ReceiveTimeoutError:
                continue
            except (ConsumerClosedError, ClientClosedError):
                if self._stop_consuming.is_set():
                    return
                consumer = await self._resubscribe(name, kind, index)
                self._consumers[consumer_name] = consumer
                continue
            except MagnetarError as e:
                self.errors.append(f"{self.clock.now():.3f}s {consumer_name}: {e.message}")
                await asyncio.sleep(0.2)
                continue
            delivery = self._record(name, kind, consumer_name, message)
            task = asyncio.create_task(self._ack(consumer, message, delivery))
            self._ack_tasks.add(task)
            task.add_done_callback(self._ack_tasks.discard)
        with contextlib.suppress(MagnetarError):
            await consumer.close()

    async def _resubscribe(self, name: str, kind: str, index: int) -> Consumer:
        while True:
            try:
                return await self._subscribe(name, kind, index)
            except MagnetarError as e:
                self.errors.append(
                    f"{self.clock.now():.3f}s resubscribe {name}-{index}: {e.message}"
                )
                await asyncio.sleep(0.5)

    def _record(self, subscription: str, kind: str, consumer: str, message: Message) -> Delivery:
        message_id = message.message_id()
        decoded = decode_payload(message.data())
        producer, key, seq = decoded if decoded is not None else ("?", "?", -1)
        delivery = Delivery(
            subscription=subscription,
            subscription_type=kind,
            consumer=consumer,
            at=self.clock.now(),
            partition=max(message_id.partition, 0),
            ledger_id=message_id.ledger_id,
            entry_id=message_id.entry_id,
            batch_index=message_id.batch_index,
            offset=message.offset(),
            producer=producer,
            key=key,
            seq=seq,
            redelivery_count=message.redelivery_count(),
            phantom=decoded is None,
            received_at=self.clock.at(received_monotonic(message)),
            stream_opened_at=self.clock.at(stream_opened_monotonic(message)),
        )
        self.history.deliveries.append(delivery)
        if decoded is not None:
            self._seen[subscription].add(decoded)
        return delivery

    async def _ack(self, consumer: Consumer, message: Message, delivery: Delivery) -> None:
        try:
            await consumer.acknowledge(message)
        except MagnetarError as e:
            delivery.ack_error = f"{type(e).__name__}: {e.message}"
        else:
            delivery.acked_at = self.clock.now()

    def caught_up(self) -> dict[str, int]:
        """Per subscription, how many acknowledged sends it has not been given yet."""
        acked = {s.name for s in self.history.sends if s.outcome == "acked"}
        return {name: len(acked - self._seen[name]) for name, _, _ in self.config.subscriptions}

    # --- the end -----------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Stop producing, wait until every subscription was given every acknowledged message
        (or ``timeout_s`` passed), stop consuming, then read every partition from its start."""
        self.stop_producing()
        await self.wait_producers()
        self.history.phases["producers_stopped"] = self.clock.now()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(self.caught_up().values()) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.25)  # polls the recorded history: no event to wait on
        self.history.phases["subscriptions_drained"] = self.clock.now()
        lagging = [name for name, missing in self.caught_up().items() if missing]
        if lagging:
            self.history.stalls = await self._stalls(lagging)
        # let acks in flight get their receipts, then stop the consumers
        if self._ack_tasks:
            await asyncio.wait(set(self._ack_tasks), timeout=30)
        self._stop_consuming.set()
        await asyncio.gather(*self._consumer_tasks)
        self.history.drain_complete = await self._read_log(max(30.0, deadline - loop.time()))
        self.history.phases["read"] = self.clock.now()

    async def _stalls(self, subscriptions: list[str]) -> list[dict[str, Any]]:
        """What the subscriptions that were not given everything hold, per partition, on both
        sides: the broker's consumers (permits, unacknowledged messages, blocked) and backlog,
        and the client's streams (connected, queued messages, permits not yet given back)."""
        stalls: list[dict[str, Any]] = []
        try:
            async with self._admin() as admin:
                for partition in range(self.config.partitions):
                    topic = f"{self.config.topic}-partition-{partition}"
                    try:
                        stats = (await admin.topic_stats(topic, internal=True))["partitions"][0]
                    except MagnetarError as e:
                        stats = {"error": e.message}
                    for name in subscriptions:
                        broker: dict[str, Any] | str = next(
                            (
                                {
                                    **s,
                                    "owner": stats.get("owner_broker_id"),
                                    "cursor": next(
                                        (c for c in stats["cursors"] if c["name"] == name), None
                                    ),
                                }
                                for s in stats.get("subscriptions", [])
                                if s["subscription"] == name
                            ),
                            stats.get("error", "no such subscription"),
                        )
                        clients = {
                            consumer_name: next(
                                (
                                    state
                                    for state in consumer.stream_states()
                                    if state["partition"] == partition
                                ),
                                None,
                            )
                            for consumer_name, consumer in sorted(self._consumers.items())
                            if consumer_name.rsplit("-", 1)[0] == name
                        }
                        stalls.append(
                            {
                                "subscription": name,
                                "partition": partition,
                                "missing": sum(
                                    1
                                    for s in self.history.sends
                                    if s.outcome == "acked"
                                    and s.partition == partition
                                    and s.name not in self._seen[name]
                                ),
                                "broker": broker,
                                "clients": clients,
                            }
                        )
        except MagnetarError as e:
            self.errors.append(f"could not read the stalled subscriptions' stats: {e.message}")
        return stalls

    def _admin(self) -> AdminClient:
        assert self.client is not None
        if self._admin_settings is None:
            return self.client.admin()
        settings = self._admin_settings()
        return AdminClient(
            self._url(),
            authentication=settings.pop("authentication", None),
            operation_timeout_s=60,
            **settings,
        )

    async def _read_log(self, timeout_s: float) -> bool:
        """Read every partition from its start until it stays quiet; whether all finished."""
        assert self.client is not None
        complete = True
        for partition in range(self.config.partitions):
            reader = await self.client.create_reader(
                f"{self.config.topic}-partition-{partition}",
                "earliest",
                receiver_queue_size=2000,
            )
            try:
                async with asyncio.timeout(timeout_s):
                    while True:
                        try:
                            message = await reader.read_next(timeout_millis=3000)
                        except ReceiveTimeoutError:
                            break
                        self.history.stored.append(self._stored(partition, message))
            except TimeoutError:
                complete = False
                self.errors.append(f"reading partition {partition} did not finish")
            finally:
                with contextlib.suppress(MagnetarError):
                    await reader.close()
        return complete

    @staticmethod
    def _stored(partition: int, message: Message) -> Stored:
        message_id = message.message_id()
        decoded = decode_payload(message.data())
        producer, key, seq = decoded if decoded is not None else ("?", "?", -1)
        return Stored(
            partition=partition,
            offset=message.offset(),
            ledger_id=message_id.ledger_id,
            entry_id=message_id.entry_id,
            batch_index=message_id.batch_index,
            producer=producer,
            key=key,
            seq=seq,
            phantom=decoded is None,
        )

    async def close(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for task in [*self._producer_tasks, *self._consumer_tasks, *self._ack_tasks]:
            task.cancel()
        await asyncio.gather(
            *self._producer_tasks, *self._consumer_tasks, *self._ack_tasks, return_exceptions=True
        )
        if self.client is not None:
            with contextlib.suppress(MagnetarError):
                await self.client.close()
