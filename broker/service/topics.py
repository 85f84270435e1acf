"""The partitions this broker owns: taking ownership, loading, unloading, losing them.

Ownership is a lock at ``/magnetar/ownership/<partition>`` bound to the broker's session lease
(:class:`metadata.coordination.LockManager`). Loading a partition takes the lock *first*, then
opens the managed ledger, which recovers (fences and closes) the previous owner's last ledger
and starts a new one. When the lock is lost (session lost, key taken) or the managed ledger
finds itself fenced, the partition is dropped at once, without waiting for anything: another
broker may already be writing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, ManagedLedgerFactory
from broker.service.catalog import TopicCatalog, read_handover, read_owner
from broker.service.config import BrokerConfig
from broker.service.dedup import Deduplication
from broker.service.records import (
    HandoverHint,
    OwnershipRecord,
    TopicPolicies,
    encode_handover,
    encode_owner,
)
from broker.service.topic import Topic
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    LockBusyError,
    MagnetarError,
    ManagedLedgerFencedError,
    MetadataError,
    ServiceNotReadyError,
    ShuttingDownError,
    TopicNotOwnedError,
)
from magnetar.common.names import TopicName
from metadata import MetadataStore, layout
from metadata.coordination import LockManager, ResourceLock, Session

log = structlog.get_logger("magnetar.broker.topics")

ML_OPEN_ATTEMPTS = 5


class TopicManager:
    """Loads and unloads the partitions this broker owns."""

    def __init__(
        self,
        store: MetadataStore,
        factory: ManagedLedgerFactory,
        catalog: TopicCatalog,
        config: BrokerConfig,
        *,
        broker_id: str,
        service_url: str,
        service_url_tls: str = "",
        is_live: Callable[[str], bool],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.factory = factory
        self.catalog = catalog
        self.config = config
        self.broker_id = broker_id
        self.service_url = service_url
        self.service_url_tls = service_url_tls
        self._is_live = is_live
        self.clock = clock
        self.topics: dict[str, Topic] = {}
        self._locks: dict[str, ResourceLock] = {}
        self._loading: dict[str, asyncio.Task[Topic]] = {}
        self._lock_manager: LockManager | None = None
        self._session: Session | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self.accepting = True

    def use_session(self, session: Session) -> None:
        """Own partitions under this session from now on (at start, and after a lost one)."""
        self._session = session
        self._lock_manager = LockManager(self.store, session, layout.OWNERSHIP)

    # --- getting an owned partition -----------------------------------------------------------

    def owned(self, name: TopicName) -> Topic | None:
        topic = self.topics.get(name.full)
        return topic if topic is not None and not topic.is_closing else None

    async def get(self, name: TopicName, *, acquire: bool = True) -> Topic:
        """The loaded partition; with ``acquire``, take ownership first if nobody holds it."""
        topic = self.topics.get(name.full)
        if topic is not None:
            if topic.is_closing:
                raise ServiceNotReadyError(
                    f"partition {name} is moving to another broker; look it up again",
                    context={"topic": name.full},
                )
            return topic
        loading = self._loading.get(name.full)
        if loading is None:
            if not acquire:
                raise self._not_owned(name, None)
            if not self.accepting or self._lock_manager is None:
                raise ShuttingDownError(f"broker {self.broker_id} is not taking partitions now")
            loading = asyncio.get_running_loop().create_task(self._load(name))
            self._loading[name.full] = loading
            loading.add_done_callback(lambda _t: self._loading.pop(name.full, None))
        return await asyncio.shield(loading)

    def _not_owned(self, name: TopicName, owner: OwnershipRecord | None) -> TopicNotOwnedError:
        where = f"; its owner is {owner.broker_id} at {owner.service_url}" if owner else ""
        return TopicNotOwnedError(
            f"broker {self.broker_id} does not own partition {name}{where}",
            context={"topic": name.full, "owner": owner.service_url if owner else ""},
        )

    async def _load(self, name: TopicName) -> Topic:
        topic_record = await self.catalog.require(name)
        full = name.full
        owner = await read_owner(self.store, full)
        if owner is not None and owner.broker_id != self.broker_id:
            raise self._not_owned(name, owner)
        hint = await read_handover(self.store, full, self.clock.time_ms())
        if hint is not None and hint.broker_id != self.broker_id and self._is_live(hint.broker_id):
            raise TopicNotOwnedError(
                f"partition {name} is being handed over to {hint.broker_id}",
                context={"topic": full},
            )
        assert self._lock_manager is not None
        session = self._session
        record = OwnershipRecord(
            broker_id=self.broker_id,
            service_url=self.service_url,
            service_url_tls=self.service_url_tls,
            acquired_ms=self.clock.time_ms(),
        )
        try:
            lock = await self._lock_manager.acquire(layout.ownership(full), encode_owner(record))
        except LockBusyError:
            raise self._not_owned(name, await read_owner(self.store, full)) from None
        try:
            policies = topic_record.policies
            ml = await self._open_managed_ledger(full, self._ledger_config(policies))
            try:
                dedup = Deduplication(
                    self.store,
                    full,
                    ml,
                    enabled=policies.deduplication
                    if policies.deduplication is not None
                    else self.config.deduplication_enabled,
                    snapshot_interval=self.config.dedup_snapshot_interval_entries,
                )
                await dedup.load()
            except BaseException:
                with contextlib.suppress(MagnetarError):
                    await ml.close()
                raise
        except BaseException:
            with contextlib.suppress(MagnetarError):
                await lock.release()
            raise
        if not lock.held or session is not self._session:
            with contextlib.suppress(MagnetarError):
                await ml.close()
            raise self._not_owned(name, None)
        topic = Topic(name, ml, dedup, self.config, on_fenced=self._fenced, clock=self.clock)
        if policies.max_redelivery_count is not None:
            topic.max_redelivery_count = policies.max_redelivery_count
        topic.set_message_ttl(
            policies.message_ttl_ms
            if policies.message_ttl_ms is not None
            else self.config.message_ttl_ms
        )
        self.topics[full] = topic
        self._locks[full] = lock
        self._spawn(self._watch_lock(topic, lock))
        if hint is not None and hint.broker_id == self.broker_id:
            with contextlib.suppress(MetadataError):
                await self.store.delete(layout.handover(full))
        log.info(
            "ownership_acquired",
            topic=full,
            next_offset=ml.next_offset,
            ledgers=len(ml.ledgers),
        )
        return topic

    def _ledger_config(self, policies: TopicPolicies) -> ManagedLedgerConfig:
        """The broker's managed-ledger settings with the topic's own retention policies."""
        overrides = {
            name: value
            for name in ("retention_time_ms", "retention_size_bytes")
            if (value := getattr(policies, name)) is not None
        }
        config = self.config.managed_ledger
        return dataclasses.replace(config, **overrides) if overrides else config

    async def _open_managed_ledger(self, full: str, config: ManagedLedgerConfig) -> ManagedLedger:
        for attempt in range(ML_OPEN_ATTEMPTS):
            try:
                return await self.factory.open(full, config=config)
            except ManagedLedgerFencedError:
                # a previous owner was still rolling its ledger: read the list again
                if attempt == ML_OPEN_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    # --- losing and giving up partitions ----------------------------------------------------------

    async def _watch_lock(self, topic: Topic, lock: ResourceLock) -> None:
        """Drop the partition if its lock is lost; end when the partition closes (unloaded,
        deleted, dropped), which it must, or the watch would hold the topic, its managed ledger
        and their caches for as long as the broker runs."""
        lost = asyncio.ensure_future(lock.lost.wait())
        closed = asyncio.ensure_future(topic.closed.wait())
        try:
            await asyncio.wait((lost, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            closed.cancel()
        if not lock.lost.is_set():
            return
        if self.topics.get(topic.name.full) is topic and not topic.is_closing:
            log.warning("ownership_lost", topic=str(topic.name), reason=lock.lost_reason)
            await self._drop(
                topic,
                TopicNotOwnedError(
                    f"broker {self.broker_id} lost ownership of {topic.name}: {lock.lost_reason}",
                    context={"topic": str(topic.name)},
                ),
            )

    def _fenced(self, topic: Topic, error: MagnetarError) -> None:
        self._spawn(
            self._drop(
                topic,
                TopicNotOwnedError(
                    f"partition {topic.name} was taken over by another broker ({error.message})",
                    context={"topic": str(topic.name)},
                ),
                release=True,
            )
        )

    async def _drop(self, topic: Topic, reason: MagnetarError, *, release: bool = False) -> None:
        """Stop serving at once (another broker may be writing the partition already)."""
        full = topic.name.full
        lock = self._locks.pop(full, None)

        async def give_up() -> None:
            # our lock is released only if it is still ours (a fenced owner's lease may hold it)
            if release and lock is not None and lock.held:
                await lock.release()

        await topic.close(reason, graceful=False, release=give_up)
        if self.topics.get(full) is topic:
            del self.topics[full]

    async def unload(
        self,
        name: TopicName,
        *,
        reason: MagnetarError,
        handover_to: str | None = None,
        before_release: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Hand a partition over gracefully; False if this broker did not own it.

        ``before_release`` runs once the partition is closed and while it is still owned (a
        delete removes the data there, so nobody can take the partition in between)."""
        full = name.full
        topic = self.topics.get(full)
        if topic is None or topic.is_closing:
            return False
        lock = self._locks.get(full)

        async def release() -> None:
            if before_release is not None:
                await before_release()
            if handover_to:
                hint = HandoverHint(
                    broker_id=handover_to,
                    from_broker_id=self.broker_id,
                    expires_ms=self.clock.time_ms() + self.config.handover_hint_ttl_ms,
                )
                with contextlib.suppress(MetadataError):
                    await self.store.put(layout.handover(full), encode_handover(hint))
            if lock is not None and lock.held:
                with contextlib.suppress(MetadataError):
                    await lock.release()
            self._locks.pop(full, None)

        await topic.close(reason, graceful=True, release=release)
        if self.topics.get(full) is topic:
            del self.topics[full]
        log.info("ownership_released", topic=full, handover_to=handover_to or "")
        return True

    async def drop_all(self, reason: MagnetarError) -> None:
        """The session is lost: stop serving everything now."""
        for loading in list(self._loading.values()):
            loading.cancel()
        await asyncio.gather(
            *(self._drop(t, reason) for t in list(self.topics.values())), return_exceptions=True
        )
        if self._lock_manager is not None:
            await self._lock_manager.close(release=False)
            self._lock_manager = None

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._lock_manager is not None:
            await self._lock_manager.close(release=True)
