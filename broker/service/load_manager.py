"""Load reports and load shedding.

Every broker publishes a :class:`BrokerLoadReport` (partitions, message and byte rates, CPU)
under its session lease. One broker, elected leader, runs the shedding round: it reads every
live broker's report and ownership, plans moves with :func:`broker.service.load.plan_shedding`
and writes a handover hint per move. The source broker sees the hint (it watches the hints)
and unloads the partition gracefully; lookups then send clients to the hint's target, which
takes ownership. No data moves, only ownership.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from collections.abc import Callable

import structlog

from broker.service.catalog import read_cluster
from broker.service.config import BrokerConfig
from broker.service.load import plan_shedding
from broker.service.records import (
    BrokerLoadReport,
    HandoverHint,
    PartitionLoad,
    encode_handover,
    encode_load_report,
)
from broker.service.topic import Topic
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import MagnetarError, SessionLostError
from metadata import MetadataStore, layout
from metadata.coordination import LeaderElection, Session

log = structlog.get_logger("magnetar.broker.load")


class RateMeter:
    """Per-second rates from counters sampled at each report."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, tuple[int, int, int, int]]] = {}

    def rates(self, key: str, now: float, counters: tuple[int, int, int, int]) -> tuple[float, ...]:
        previous = self._last.get(key)
        self._last[key] = (now, counters)
        if previous is None or now <= previous[0]:
            return (0.0, 0.0, 0.0, 0.0)
        elapsed = now - previous[0]
        return tuple(
            max(0.0, (c - p) / elapsed) for c, p in zip(counters, previous[1], strict=True)
        )

    def forget_except(self, keys: set[str]) -> None:
        for key in set(self._last) - keys:
            del self._last[key]


class LoadManager:
    """Publishes this broker's load and, while it leads, sheds load across the cluster."""

    def __init__(
        self,
        store: MetadataStore,
        config: BrokerConfig,
        *,
        broker_id: str,
        topics: Callable[[], dict[str, Topic]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.config = config
        self.broker_id = broker_id
        self._topics = topics
        self.clock = clock
        self._meter = RateMeter()
        self._cpu_last = (time.monotonic(), sum(os.times()[:2]))
        self.report = BrokerLoadReport(broker_id=broker_id)
        self.partition_rates: dict[str, tuple[float, ...]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._election: LeaderElection | None = None
        self.shedding_rounds = 0
        self.moves = 0

    def start(self, session: Session) -> None:
        self._tasks = [
            asyncio.create_task(self._report_loop(session), name="load-report"),
        ]
        if self.config.load_shedding_enabled:
            self._tasks.append(asyncio.create_task(self._leader_loop(session), name="shedding"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, MagnetarError):
                await task
        self._tasks = []
        if self._election is not None:
            with contextlib.suppress(MagnetarError):
                await self._election.close()
            self._election = None

    @property
    def is_leader(self) -> bool:
        return self._election is not None and self._election.is_leader

    # --- reporting ------------------------------------------------------------------------------

    def _cpu_percent(self) -> float:
        now, used = time.monotonic(), sum(os.times()[:2])
        last_now, last_used = self._cpu_last
        self._cpu_last = (now, used)
        return 0.0 if now <= last_now else 100.0 * (used - last_used) / (now - last_now)

    def build_report(self) -> BrokerLoadReport:
        now = time.monotonic()
        topics = self._topics()
        timestamp_ms = self.clock.time_ms()
        cpu_percent = self._cpu_percent()
        memory_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        partitions = []
        totals = [0.0, 0.0, 0.0, 0.0]
        for name, topic in topics.items():
            rates = self._meter.rates(
                name, now, (topic.msgs_in, topic.msgs_out, topic.bytes_in, topic.bytes_out)
            )
            self.partition_rates[name] = rates
            partitions.append(
                PartitionLoad(
                    partition=name,
                    msg_rate_in=rates[0],
                    msg_rate_out=rates[1],
                    bytes_rate_in=rates[2],
                    bytes_rate_out=rates[3],
                    acquired_ms=topic.acquired_ms,
                )
            )
            for i in range(4):
                totals[i] += rates[i]
        report = BrokerLoadReport(
            broker_id=self.broker_id,
            timestamp_ms=timestamp_ms,
            owned_partitions=len(topics),
            msg_rate_in=totals[0],
            msg_rate_out=totals[1],
            bytes_rate_in=totals[2],
            bytes_rate_out=totals[3],
            cpu_percent=cpu_percent,
            memory_bytes=memory_bytes,
            partitions=tuple(partitions),
        )
        self._meter.forget_except(set(topics))
        for gone in set(self.partition_rates) - set(topics):
            del self.partition_rates[gone]
        self.report = report
        return report

    async def publish(self, session: Session) -> None:
        report = self.build_report()
        await self.store.put(
            layout.broker_load(self.broker_id),
            encode_load_report(report),
            lease_id=session.lease_id,
        )

    async def _report_loop(self, session: Session) -> None:
        while session.alive:
            try:
                await self.publish(session)
            except MagnetarError as e:
                log.info("load_report_failed", error=e.message)
            await asyncio.sleep(self.config.load_report_interval_ms / 1000)

    # --- shedding ---------------------------------------------------------------------------------

    async def _leader_loop(self, session: Session) -> None:
        self._election = LeaderElection(
            self.store, session, layout.LOAD_MANAGER_LEADER, self.broker_id.encode()
        )
        try:
            await self._election.campaign()
        except SessionLostError:
            return
        log.info("load_manager_leader", broker=self.broker_id)
        election = self._election
        while True:
            await asyncio.sleep(self.config.load_shedding_interval_ms / 1000)
            if not election.is_leader:
                break
            try:
                await self.shed_once()
            except MagnetarError as e:
                log.info("shedding_round_failed", error=e.message)

    async def shed_once(self) -> int:
        """One shedding round; returns the number of partitions asked to move."""
        snapshot = await read_cluster(self.store)
        now_ms = self.clock.time_ms()
        moves = plan_shedding(
            snapshot.load_infos(),
            threshold=self.config.load_shedding_threshold,
            max_moves=self.config.load_shedding_max_moves,
            min_ownership_ms=self.config.load_shedding_min_ownership_ms,
            now_ms=now_ms,
        )
        self.shedding_rounds += 1
        for move in moves:
            hint = HandoverHint(
                broker_id=move.target,
                from_broker_id=move.source,
                expires_ms=now_ms + self.config.handover_hint_ttl_ms,
            )
            await self.store.put(layout.handover(move.partition), encode_handover(hint))
            log.info(
                "partition_shed", partition=move.partition, source=move.source, target=move.target
            )
        self.moves += len(moves)
        return len(moves)
