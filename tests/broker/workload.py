"""A produce-and-consume workload for fault tests, and the check that nothing acknowledged was
lost, duplicated in storage or reordered.

One producer per partition (on the partition's own name, so each message's partition is known)
sends numbered messages ``"<partition>:<n>"`` continuously, a few in flight at a time; one
consumer subscribes to the whole topic and acknowledges everything. Sends that fail are
recorded, not retried: the checks are about what the application was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from magnetar.aio import Client
from magnetar.common.errors import MagnetarError, ReceiveTimeoutError
from magnetar.testing.eventually import eventually


@dataclass
class PartitionLog:
    acked: dict[int, int] = field(default_factory=dict)
    """message number -> offset the receipt gave"""
    ack_times: list[tuple[float, int, int]] = field(default_factory=list)
    """(monotonic time, message number, ledger id of its receipt)"""
    failed: list[tuple[int, str]] = field(default_factory=list)
    consumed: list[tuple[int, int]] = field(default_factory=list)
    """(offset, message number) in arrival order"""


class Workload:
    def __init__(
        self, service_url: str, topic: str, partitions: int, *, in_flight: int = 20
    ) -> None:
        self.service_url = service_url
        self.topic = topic
        self.partitions = partitions
        self.in_flight = in_flight
        self.logs = {p: PartitionLog() for p in range(partitions)}
        self._stop = asyncio.Event()
        self._producers_done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.client: Client | None = None
        self.consumer_errors: list[str] = []

    async def start(self, subscription: str = "check") -> None:
        self.client = Client(self.service_url, operation_timeout_s=60)
        self._consumer = await self.client.subscribe(
            self.topic, subscription, initial_position="earliest", receiver_queue_size=500
        )
        for p in range(self.partitions):
            producer = await self.client.create_producer(
                f"{self.topic}-partition-{p}", send_timeout_ms=60_000
            )
            self._tasks.append(asyncio.create_task(self._produce(p, producer)))
        self._consumer_task = asyncio.create_task(self._consume())

    async def _produce(self, partition: int, producer: object) -> None:
        log = self.logs[partition]
        gate = asyncio.Semaphore(self.in_flight)
        number = 0
        pending: set[asyncio.Task[None]] = set()

        async def send_one(n: int) -> None:
            try:
                message_id = await producer.send(f"{partition}:{n}".encode())  # type: ignore[attr-defined]
            except MagnetarError as e:
                log.failed.append((n, f"{type(e).__name__}: {e.message}"))
            else:
                log.acked[n] = message_id.offset if hasattr(message_id, "offset") else -1
                log.ack_times.append((time.monotonic(), n, message_id.ledger_id))
            finally:
                gate.release()

        while not self._stop.is_set():
            await gate.acquire()
            task = asyncio.create_task(send_one(number))
            pending.add(task)
            task.add_done_callback(pending.discard)
            number += 1
            await asyncio.sleep(0.002)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(MagnetarError):
            await producer.close()  # type: ignore[attr-defined]

    async def _consume(self) -> None:
        while True:
            try:
                message = await self._consumer.receive(timeout_millis=500)
            except ReceiveTimeoutError:
                if self._producers_done.is_set() and self._drained():
                    return
                continue
            except MagnetarError as e:
                self.consumer_errors.append(e.message)
                await asyncio.sleep(0.1)
                continue
            partition_text, number = message.data().decode().split(":")
            self.logs[int(partition_text)].consumed.append((message.offset(), int(number)))
            with contextlib.suppress(MagnetarError):
                await self._consumer.acknowledge(message)

    def _drained(self) -> bool:
        for log in self.logs.values():
            seen = {n for _, n in log.consumed}
            if not set(log.acked) <= seen:
                return False
        return True

    def acked_total(self) -> int:
        return sum(len(log.acked) for log in self.logs.values())

    async def wait_acked(self, more: int, timeout_s: float = 60) -> None:
        target = self.acked_total() + more
        await eventually(
            lambda: self.acked_total() >= target,
            timeout_s=timeout_s,
            what=f"{more} more receipts",
            interval_s=0.05,
        )

    def first_ack_after(
        self, moment: float, partitions: list[int], *, not_in_ledgers: set[int] | None = None
    ) -> float | None:
        """When the first receipt after ``moment`` arrived (from a ledger not listed: receipts
        the old owner sent just before dying do not show that the new owner serves)."""
        skip = not_in_ledgers or set()
        times = [
            t
            for p in partitions
            for t, _, ledger in self.logs[p].ack_times
            if t > moment and ledger not in skip
        ]
        return min(times) if times else None

    async def stop(self, drain_timeout_s: float = 60) -> None:
        self._stop.set()
        async with asyncio.timeout(drain_timeout_s):
            await asyncio.gather(*self._tasks)  # producers: every send answered
            self._producers_done.set()
            await self._consumer_task  # then everything acknowledged is drained
        assert self.client is not None
        await self._consumer.close()
        await self.client.close()

    def verify(self) -> dict[str, int]:
        """Every acknowledged message consumed, in order, no gaps, none stored twice."""
        totals = {"acked": 0, "consumed": 0, "redelivered": 0, "failed": 0}
        for partition, log in self.logs.items():
            first_seen: dict[int, int] = {}
            order: list[int] = []
            for offset, number in log.consumed:
                if offset in first_seen:
                    assert first_seen[offset] == number, (partition, offset)
                    totals["redelivered"] += 1
                    continue
                first_seen[offset] = number
                order.append(offset)
            offsets = sorted(first_seen)
            assert offsets == list(range(len(offsets))), f"partition {partition}: gap in offsets"
            assert order == offsets, f"partition {partition}: offsets arrived out of order"
            numbers = [first_seen[o] for o in offsets]
            assert numbers == sorted(numbers), f"partition {partition}: messages reordered"
            assert len(set(numbers)) == len(numbers), f"partition {partition}: stored twice"
            missing = set(log.acked) - set(numbers)
            assert not missing, (
                f"partition {partition}: acknowledged but lost: {sorted(missing)[:10]}"
            )
            for number, offset in log.acked.items():
                if offset >= 0:
                    assert first_seen[offset] == number, (partition, number, offset)
            totals["acked"] += len(log.acked)
            totals["consumed"] += len(first_seen)
            totals["failed"] += len(log.failed)
        return totals
