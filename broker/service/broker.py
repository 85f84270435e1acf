"""The broker: lookups, the partitions it owns, its session, load reporting and shutdown.

A broker holds no data. It registers under a session lease, answers lookups for any topic
(assigning unowned partitions to the least-loaded live broker, itself included), serves the
partitions it owns through :class:`TopicManager`, and publishes its load. When its session is
lost it drops every partition at once (another broker may own them already) and starts a new
session. A graceful shutdown hands each partition to the least-loaded other broker before
exiting. :attr:`Broker.serving` says whether it can take clients now (a live session, not
stopping); the process reports it as readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from bookie.client.ledger_client import LedgerClient
from broker.managed_ledger import EntryCache, ManagedLedgerFactory
from broker.service.catalog import (
    TopicCatalog,
    TopicRecord,
    read_cluster,
    read_handover,
    read_owner,
)
from broker.service.config import BrokerConfig
from broker.service.envelope import EnvelopeCodec
from broker.service.liveness import LOOKUP_WAIT_S, Peer, PeerWatchdog, parse_service_address
from broker.service.load import BrokerLoadInfo, choose_least_loaded
from broker.service.load_manager import LoadManager
from broker.service.records import (
    BrokerRegistration,
    HandoverHint,
    OwnershipRecord,
    TopicPolicies,
    decode_broker_registration,
    decode_handover,
    encode_broker_registration,
    encode_handover,
)
from broker.service.security import BrokerSecurity
from broker.service.topic import Topic
from broker.service.topics import TopicManager
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    InvalidArgumentError,
    InvalidConfigError,
    KeyExistsError,
    MagnetarError,
    MetadataError,
    ServiceNotReadyError,
    SessionLostError,
    ShuttingDownError,
    TopicAlreadyExistsError,
    TopicBusyError,
    TopicNotFoundError,
    TopicNotOwnedError,
)
from magnetar.common.names import TopicName, parse_base_topic, parse_topic
from metadata import MetadataStore, layout
from metadata.coordination import Session

log = structlog.get_logger("magnetar.broker")

SHUTDOWN_PARALLELISM = 8
LIVE_REFRESH_S = 1.0


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    partition_topic: str
    partition: int
    broker_url: str
    broker_id: str
    broker_url_tls: str = ""


@dataclass(frozen=True, slots=True)
class LookupResult:
    topic: str
    partitions: int
    owners: list[PartitionOwner]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a partition's owner is: here (``topic`` set) or at ``service_url``."""

    topic: Topic | None
    service_url: str = ""
    broker_id: str = ""
    service_url_tls: str = ""


class BrokerIdInUseError(InvalidConfigError):
    """Another live broker registered under this broker's id."""


class Broker:
    """One broker's service core, below the gRPC adapters."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        ledger_client: LedgerClient,
        *,
        broker_id: str,
        service_url: str,
        service_url_tls: str = "",
        http_address: str = "",
        pulsar_url: str = "",
        pulsar_url_tls: str = "",
        version: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.store = store
        self.ledger_client = ledger_client
        self.broker_id = broker_id
        self.service_url = service_url
        self.service_url_tls = service_url_tls
        self.security = BrokerSecurity(
            config, store, authorization_enabled=config.authorization_enabled, clock=clock
        )
        self.http_address = http_address
        self.pulsar_url = pulsar_url
        """``pulsar://host:port`` of this broker's Pulsar-protocol listener ("" without one)."""
        self.pulsar_url_tls = pulsar_url_tls
        """``pulsar+ssl://host:port`` of its TLS Pulsar-protocol listener ("" without one)."""
        self.version = version
        self.clock = clock
        self.start_time_ms = clock.time_ms()
        self.cache = EntryCache(config.entry_cache_max_bytes)
        self.factory = ManagedLedgerFactory(
            store,
            ledger_client,
            codec=EnvelopeCodec(),
            config=config.managed_ledger,
            cache=self.cache,
            clock=clock,
        )
        self.catalog = TopicCatalog(store, clock)
        self.live_brokers: dict[str, BrokerRegistration] = {}
        self.peer_watchdog: PeerWatchdog | None = None
        if config.peer_probe_interval_ms > 0:
            self.peer_watchdog = PeerWatchdog(
                store,
                self_id=broker_id,
                interval_s=config.peer_probe_interval_ms / 1000,
                on_revoked=self._peer_revoked,
            )
        self.topics = TopicManager(
            store,
            self.factory,
            self.catalog,
            config,
            broker_id=broker_id,
            service_url=service_url,
            service_url_tls=service_url_tls,
            is_live=lambda b: b in self.live_brokers,
            clock=clock,
        )
        self.load_manager = LoadManager(
            store, config, broker_id=broker_id, topics=lambda: self.topics.topics, clock=clock
        )
        self.session: Session | None = None
        self._registration_version = 0
        self.sessions_lost = 0
        self._stopping = False
        self._tasks: set[asyncio.Task[object]] = set()
        self._serving_listeners: list[Callable[[], None]] = []
        self.ready = asyncio.Event()

    # --- life cycle -------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether this broker can take clients now: it holds a live metadata session (without
        one it owns nothing) and is not stopping."""
        return not self._stopping and self.session is not None and self.session.alive

    def on_serving_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (synchronously, in the event loop) whenever :attr:`serving` may
        have changed: a session lost or restored, a stop begun."""
        self._serving_listeners.append(listener)

    def _serving_changed(self) -> None:
        for listener in self._serving_listeners:
            try:
                listener()
            except Exception:
                log.exception("serving_listener_failed", broker=self.broker_id)

    async def start(self) -> None:
        await self.security.start()
        await self._new_session()
        await self._refresh_live()
        self._spawn(self._live_loop())
        self._spawn(self._handover_loop())
        if self.peer_watchdog is not None:
            self._spawn(self.peer_watchdog.run())
        self.ready.set()
        log.info(
            "broker_started",
            broker=self.broker_id,
            url=self.service_url,
            url_tls=self.service_url_tls,
        )

    async def _new_session(self) -> None:
        session = await Session.start(
            self.store, ttl_s=self.config.session_ttl_s, clock=self.clock, name=self.broker_id
        )
        registration = BrokerRegistration(
            broker_id=self.broker_id,
            service_url=self.service_url,
            service_url_tls=self.service_url_tls,
            http_address=self.http_address,
            pulsar_url=self.pulsar_url,
            pulsar_url_tls=self.pulsar_url_tls,
            version=self.version,
            start_time_ms=self.start_time_ms,
        )
        try:
            self._registration_version = await self._register(session, registration)
        except BaseException:
            with contextlib.suppress(MagnetarError):
                await session.close()
            raise
        self.session = session
        self.topics.use_session(session)
        self.topics.accepting = True
        self.load_manager.start(session)
        with contextlib.suppress(MagnetarError):
            await self.load_manager.publish(session)
        session.on_lost(lambda error: self._lost(session, error))
        self._serving_changed()

    def _lost(self, session: Session, error: SessionLostError) -> None:
        # told at once, not from the task: readiness must drop before anything else happens
        self._serving_changed()
        self._spawn(self._session_lost(session, error))

    async def _register(self, session: Session, registration: BrokerRegistration) -> int:
        """Create the lease-bound registration; a live broker with the same id is refused.

        A previous incarnation of this broker (crashed, or a session just lost) may hold the
        key until its lease expires, so the create is retried for one session TTL.
        """
        key = layout.broker(self.broker_id)
        deadline = self.clock.monotonic() + self.config.session_ttl_s + 1
        while True:
            try:
                return await self.store.create(
                    key, encode_broker_registration(registration), lease_id=session.lease_id
                )
            except KeyExistsError:
                holder = await self.store.get(key)
                if holder is None:
                    continue
                if self.clock.monotonic() >= deadline:
                    other = decode_broker_registration(holder.value)
                    raise BrokerIdInUseError(
                        f"broker id {self.broker_id!r} is registered by a live broker at"
                        f" {other.service_url or other.service_url_tls}; give this broker"
                        " another --broker-id",
                        context={"broker_id": self.broker_id},
                    ) from None
                await asyncio.sleep(0.25)

    async def _session_lost(self, session: Session, error: SessionLostError) -> None:
        if session is not self.session:
            return
        self.sessions_lost += 1
        self.topics.accepting = False
        log.warning("broker_session_lost", broker=self.broker_id, error=error.message)
        await self.load_manager.stop()
        await self.topics.drop_all(
            TopicNotOwnedError(f"broker {self.broker_id} lost its metadata session")
        )
        delay = 0.2
        revoked = False
        while not self._stopping:
            revoked = revoked or await self._revoke_lost_lease(session)
            try:
                await self._new_session()
            except MagnetarError as e:
                log.info("broker_session_retry", error=e.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                log.info("broker_session_restored", broker=self.broker_id)
                return

    async def _revoke_lost_lease(self, session: Session) -> bool:
        """Revoke a lost session's lease, in case the store still has it; True once done.

        A lease the broker gave up on may live on: etcd grants every lease a fresh TTL when it
        restarts. Its keys, this broker's registration and ownership locks, would then keep the
        new session from registering, and other brokers from the partitions, for one more TTL.
        Revoking it is safe: everything held under it was dropped already.
        """
        try:
            await asyncio.wait_for(self.store.revoke_lease(session.lease_id), timeout=2.0)
        except (MetadataError, TimeoutError) as e:
            log.info("lost_lease_revoke_failed", lease=session.lease_id, error=str(e))
            return False
        return True

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh_live(self) -> None:
        live = {}
        peers = []
        for record in (await self.store.list(layout.BROKERS)).records:
            registration = decode_broker_registration(record.value)
            live[registration.broker_id] = registration
            address = parse_service_address(
                registration.service_url or registration.service_url_tls
            )
            if address is not None:
                peers.append(Peer(registration.broker_id, *address, record.lease_id))
        self.live_brokers = live
        if self.peer_watchdog is not None:
            self.peer_watchdog.set_peers(peers)

    def _peer_revoked(self, peer: Peer) -> None:
        # its registration is gone; the next listing agrees, this one need not wait for it
        self.live_brokers.pop(peer.broker_id, None)

    @property
    def peers_watched(self) -> int:
        """Other brokers seen listening, whose process dying this broker would notice."""
        return 0 if self.peer_watchdog is None else self.peer_watchdog.watched

    @property
    def peer_leases_revoked(self) -> int:
        """Leases of other brokers this one revoked because their process was found dead."""
        return 0 if self.peer_watchdog is None else self.peer_watchdog.revoked

    async def _free_dead_owners(
        self, owners: list[OwnershipRecord | None]
    ) -> list[OwnershipRecord | None]:
        """The owners with those whose process was just found dead (their lease revoked, so
        their ownership keys are gone) replaced by None, to be assigned again."""
        watchdog = self.peer_watchdog
        if watchdog is None:
            return owners
        others = {o.broker_id for o in owners if o is not None and o.broker_id != self.broker_id}
        if not others:
            return owners
        ids = sorted(others)
        found = await asyncio.gather(*(watchdog.check(b, wait_s=LOOKUP_WAIT_S) for b in ids))
        dead = {b for b, gone in zip(ids, found, strict=True) if gone}
        return [None if o is not None and o.broker_id in dead else o for o in owners]

    async def _live_loop(self) -> None:
        while True:
            await asyncio.sleep(LIVE_REFRESH_S)
            with contextlib.suppress(MagnetarError):
                await self._refresh_live()

    async def _handover_loop(self) -> None:
        """Unload partitions the shedding leader asked this broker to hand over."""
        while True:
            try:
                listing = await self.store.list(layout.HANDOVER)
                now = self.clock.time_ms()
                for record in listing.records:
                    hint = decode_handover(record.value)
                    partition = record.key[len(layout.HANDOVER) :]
                    if hint.expires_ms <= now:
                        with contextlib.suppress(MetadataError):
                            await self.store.delete(record.key, expected_version=record.version)
                        continue
                    if hint.from_broker_id != self.broker_id or hint.broker_id == self.broker_id:
                        continue
                    name = parse_topic(partition)
                    if self.topics.owned(name) is not None:
                        self._spawn(
                            self.topics.unload(
                                name,
                                reason=ServiceNotReadyError(
                                    f"partition {partition} moves to broker {hint.broker_id}"
                                ),
                            )
                        )
                # a watch would be quicker, but hints are rare and a listing is cheap
                await asyncio.sleep(0.5)
            except MagnetarError as e:
                log.info("handover_check_failed", error=e.message)
                await asyncio.sleep(1.0)

    async def shutdown(self) -> None:
        """Hand every partition over, then leave the cluster."""
        if self._stopping:
            return
        self._stopping = True
        self._serving_changed()
        self.topics.accepting = False
        log.info("broker_stopping", broker=self.broker_id, partitions=len(self.topics.topics))
        with contextlib.suppress(MetadataError):
            await self.store.delete(
                layout.broker(self.broker_id), expected_version=self._registration_version
            )
        await self.load_manager.stop()
        try:
            snapshot = await read_cluster(self.store)
            infos = snapshot.load_infos()
        except MagnetarError:
            infos = []
        promised: dict[str, int] = {}
        gate = asyncio.Semaphore(SHUTDOWN_PARALLELISM)

        async def hand_over(topic: Topic) -> None:
            target = choose_least_loaded(infos, exclude=[self.broker_id], extra=promised)
            if target is not None:
                promised[target] = promised.get(target, 0) + 1
            async with gate:
                await self.topics.unload(
                    topic.name,
                    reason=ShuttingDownError(f"broker {self.broker_id} is shutting down"),
                    handover_to=target,
                )

        try:
            async with asyncio.timeout(self.config.shutdown_timeout_s):
                await asyncio.gather(
                    *(hand_over(t) for t in list(self.topics.topics.values())),
                    return_exceptions=True,
                )
        except TimeoutError:
            log.warning("broker_shutdown_timeout", remaining=len(self.topics.topics))
        await self.topics.drop_all(ShuttingDownError(f"broker {self.broker_id} stopped"))
        await self.close()

    async def close(self) -> None:
        self._stopping = True
        self._serving_changed()
        for task in list(self._tasks):
            task.cancel()
        await self.load_manager.stop()
        await self.topics.close()
        with contextlib.suppress(MagnetarError):
            await self.factory.close()
        if self.session is not None:
            with contextlib.suppress(MagnetarError):
                await self.session.close()
        await self.security.close()
        log.info("broker_stopped", broker=self.broker_id)

    # --- lookup -----------------------------------------------------------------------------------

    async def topic_record(self, name: TopicName, *, create: bool) -> TopicRecord:
        record = await self.catalog.get(name)
        if record is not None:
            if name.is_partition:
                await self.catalog.require(name)
            return record
        if name.is_partition or not create or not self.config.allow_auto_topic_creation:
            raise TopicNotFoundError(
                f"topic {name.topic} does not exist (automatic topic creation is"
                f" {'on' if self.config.allow_auto_topic_creation else 'off'})",
                context={"topic": name.topic},
            )
        try:
            return await self.catalog.create(name, self.config.auto_topic_partitions)
        except TopicAlreadyExistsError:
            return await self.catalog.require(name)

    async def lookup(self, topic: str) -> LookupResult:
        """Who owns each partition of ``topic``, assigning owners to unowned partitions."""
        if self._stopping:
            raise ShuttingDownError(f"broker {self.broker_id} is shutting down")
        self._check_session()
        name = parse_topic(topic)
        record = await self.topic_record(name, create=True)
        partitions = [name] if name.is_partition else record.partition_names()
        owners = await self._free_dead_owners(
            await asyncio.gather(*(read_owner(self.store, p.full) for p in partitions))
        )
        result: list[PartitionOwner] = []
        snapshot_infos = None
        promised: dict[str, int] = {}
        for partition, found in zip(partitions, owners, strict=True):
            owner = found
            if owner is None:
                if snapshot_infos is None:
                    snapshot_infos = (await read_cluster(self.store)).load_infos()
                owner = await self._assign(partition, snapshot_infos, promised)
            result.append(
                PartitionOwner(
                    partition.full,
                    partition.partition,
                    owner.service_url,
                    owner.broker_id,
                    owner.service_url_tls,
                )
            )
        if name.is_partition:
            # a partition looked up on its own is served like a non-partitioned topic
            return LookupResult(name.full, 0, result)
        return LookupResult(name.topic, record.partitions, result)

    async def partition_count(self, name: TopicName) -> int:
        """How many partitions ``name`` has (0: not partitioned, or a partition itself), as a
        lookup finds the topic: created first when automatic creation is on."""
        if name.is_partition:
            return 0
        if self._stopping:
            raise ShuttingDownError(f"broker {self.broker_id} is shutting down")
        self._check_session()
        return (await self.topic_record(name, create=True)).partitions

    def _check_session(self) -> None:
        """Refuse at once, retriably, while this broker has no live session: it can take no
        partition, and its reads of a store it lost touch with would hang, while the client
        could be asking another broker."""
        if self.session is None or not self.session.alive:
            raise ServiceNotReadyError(
                f"broker {self.broker_id} has no metadata session now; ask another broker",
                context={"broker": self.broker_id},
            )

    async def _assign(
        self, partition: TopicName, infos: list[BrokerLoadInfo], promised: dict[str, int]
    ) -> OwnershipRecord:
        live = {i.broker_id for i in infos}
        hint = await read_handover(self.store, partition.full, self.clock.time_ms())
        if hint is not None and hint.broker_id in live:
            target = hint.broker_id
        else:
            target = choose_least_loaded(infos, extra=promised) or self.broker_id
        promised[target] = promised.get(target, 0) + 1
        if target == self.broker_id and self.topics.accepting:
            try:
                await self.topics.get(partition, acquire=True)
            except TopicNotOwnedError:
                owner = await read_owner(self.store, partition.full)
                if owner is not None:
                    return owner
                raise
            return OwnershipRecord(
                broker_id=self.broker_id,
                service_url=self.service_url,
                service_url_tls=self.service_url_tls,
            )
        registration = self.live_brokers.get(target)
        if registration is None:
            await self._refresh_live()
            registration = self.live_brokers.get(target)
        if registration is None:
            raise ServiceNotReadyError(f"no live broker can take partition {partition} yet")
        if hint is None or hint.broker_id != target:
            # reserve the partition for the chosen broker until its client connects there,
            # so that another broker does not take it first
            reservation = HandoverHint(
                broker_id=target,
                expires_ms=self.clock.time_ms() + self.config.handover_hint_ttl_ms,
            )
            await self.store.put(layout.handover(partition.full), encode_handover(reservation))
        return OwnershipRecord(
            broker_id=target,
            service_url=registration.service_url,
            service_url_tls=registration.service_url_tls,
        )

    async def pulsar_urls_of(self, broker_id: str, *, tls: bool) -> tuple[str, str]:
        """``(pulsar://..., pulsar+ssl://...)`` of a live broker's Pulsar listeners ("" for one
        it does not have), what a lookup answers as ``brokerServiceUrl`` and
        ``brokerServiceUrlTls``. :class:`ServiceNotReadyError` (retriable: the broker may be
        starting, or its partitions about to move) when it has no listener of the kind the
        client uses (``tls``: the client connected over TLS, and follows the TLS URL)."""
        if broker_id == self.broker_id:
            registration: BrokerRegistration | None = BrokerRegistration(
                broker_id=broker_id, pulsar_url=self.pulsar_url, pulsar_url_tls=self.pulsar_url_tls
            )
        else:
            registration = self.live_brokers.get(broker_id)
            if registration is None:
                await self._refresh_live()
                registration = self.live_brokers.get(broker_id)
        if registration is None:
            raise ServiceNotReadyError(
                f"broker {broker_id} has no Pulsar-protocol listener registered now",
                context={"broker": broker_id},
            )
        wanted = registration.pulsar_url_tls if tls else registration.pulsar_url
        if not wanted:
            raise ServiceNotReadyError(
                f"broker {broker_id} has no {'TLS ' if tls else 'plaintext '}Pulsar-protocol"
                f" listener (its {'pulsar_tls_port' if tls else 'pulsar_port'} is empty"
                + (", or TLS is off)" if tls else ")"),
                context={"broker": broker_id},
            )
        return registration.pulsar_url, registration.pulsar_url_tls

    async def open_topic(self, name: TopicName) -> Topic:
        """The partition a producer or consumer opens: served here, taken here if nobody owns
        it, created first if it is a new topic and automatic creation is on. The base name of
        a partitioned topic is refused, naming its partitions."""
        topic = self.topics.owned(name)
        if topic is not None:
            # owned: checked when it was taken (a topic's partition count changes only by
            # deleting it, which unloads it)
            return topic
        self._check_session()
        if not name.is_partition:
            record = await self.topic_record(name, create=True)
            if record.partitions > 0:
                # its messages would land in a ledger that no partition's consumer reads
                raise InvalidArgumentError(
                    f"topic {name.topic} has {record.partitions} partitions: open"
                    f" {name.partition_name(0)} ... {name.partition_name(record.partitions - 1)}"
                    " (a lookup of the topic names each partition and its broker)",
                    context={"topic": name.topic, "partitions": record.partitions},
                )
        return await self.topics.get(name, acquire=True)

    async def route(self, partition: TopicName, *, acquire: bool = True) -> Route:
        """Where a partition is served: here (taking it if nobody owns it), or elsewhere."""
        topic = self.topics.owned(partition)
        if topic is not None:
            return Route(topic)
        owner = await read_owner(self.store, partition.full)
        if owner is not None and owner.broker_id != self.broker_id:
            return Route(None, owner.service_url, owner.broker_id, owner.service_url_tls)
        if not acquire:
            raise TopicNotOwnedError(f"partition {partition} is not owned by any broker")
        hint = await read_handover(self.store, partition.full, self.clock.time_ms())
        if hint is not None and hint.broker_id != self.broker_id:
            registration = self.live_brokers.get(hint.broker_id)
            if registration is not None:
                return Route(
                    None, registration.service_url, hint.broker_id, registration.service_url_tls
                )
        return Route(await self.topics.get(partition, acquire=True))

    # --- topic administration ---------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        policies: TopicPolicies | None = None,
        properties: dict[str, str] | None = None,
    ) -> TopicRecord:
        name = parse_base_topic(topic)
        return await self.catalog.create(name, partitions, policies=policies, properties=properties)

    async def delete_partition_here(self, partition: TopicName, *, force: bool) -> None:
        """Delete one partition's data; the caller routed it here (we own it, or nobody did)."""
        topic = self.topics.owned(partition)
        if topic is None:
            topic = await self.topics.get(partition, acquire=True)
        if not force and (
            topic.producers or any(s.consumers for s in topic.subscriptions.values())
        ):
            raise TopicBusyError(
                f"partition {partition} has {len(topic.producers)} producer(s) and"
                f" {sum(len(s.consumers) for s in topic.subscriptions.values())} consumer(s);"
                " disconnect them or force the delete",
                context={"topic": partition.full},
            )

        async def delete_data() -> None:
            await self.factory.delete(partition.full)
            with contextlib.suppress(MetadataError):
                await self.store.delete(layout.dedup_snapshot(partition.full))

        await self.topics.unload(
            partition,
            reason=TopicNotFoundError(f"topic {partition.topic} was deleted"),
            before_release=delete_data,
        )
        log.info("partition_deleted", topic=partition.full)
