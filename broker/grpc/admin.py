"""The broker's gRPC adapter for administration: topics, subscriptions, the cluster.

Any broker answers. Work on one partition runs on its owner: here if this broker owns it (or
takes it, when nobody does), otherwise the same request is forwarded to the owner, partition by
partition, and the answers are combined.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog

from bookie.client.ledger_metadata import LedgerMetadata, LedgerMetadataStore
from broker.grpc.servicer import to_start
from broker.service.broker import Broker
from broker.service.catalog import read_cluster
from broker.service.topic import Topic
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicBusyError,
    TopicNotOwnedError,
)
from magnetar.common.grpc_errors import abort_with, error_from_rpc_error
from magnetar.common.names import TopicName, parse_base_topic, parse_topic
from metadata import layout
from proto.admin.v1 import admin_pb2 as pb
from proto.admin.v1 import admin_pb2_grpc
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2, topic_pb2

log = structlog.get_logger("magnetar.broker.admin")

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]
FORWARD_TIMEOUT_S = 30.0


def _target(service_url: str) -> str:
    return service_url.removeprefix("magnetar://").split(",")[0]


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close()

    def _peer(self, service_url: str) -> admin_pb2_grpc.AdminServiceAsyncStub:
        target = _target(service_url)
        channel = self._channels.get(target)
        if channel is None:
            channel = grpc.aio.insecure_channel(target)
            self._channels[target] = channel
        return admin_pb2_grpc.AdminServiceStub(channel)

    async def _call(self, context: Context, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except MagnetarError as e:
            await abort_with(context, e)
            raise AssertionError("unreachable") from e

    async def _on_owner(
        self,
        partition: TopicName,
        local: Callable[[Topic], Awaitable[T]],
        remote: Callable[[admin_pb2_grpc.AdminServiceAsyncStub], Awaitable[T]],
    ) -> T:
        for _attempt in range(3):
            route = await self.broker.route(partition)
            if route.topic is not None:
                return await local(route.topic)
            try:
                return await remote(self._peer(route.service_url))
            except grpc.aio.AioRpcError as e:
                error = error_from_rpc_error(e, route.service_url)
                if not error.retriable:
                    raise error from None
                await asyncio.sleep(0.2)
        raise ServiceNotReadyError(f"could not reach the owner of {partition}; try again")

    async def _partitions(self, topic: str) -> list[TopicName]:
        name = parse_topic(topic)
        record = await self.broker.catalog.require(name)
        return [name] if name.is_partition else record.partition_names()

    # --- topics -----------------------------------------------------------------------------------

    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: Context
    ) -> pb.CreateTopicResponse:
        async def work() -> pb.CreateTopicResponse:
            record = await self.broker.create_topic(
                request.topic,
                request.partitions,
                policies=_topic_policies(request.policies),
                properties=dict(request.properties),
            )
            return pb.CreateTopicResponse(topic=record.name.topic, partitions=record.partitions)

        return await self._call(context, work)

    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: Context
    ) -> pb.DeleteTopicResponse:
        async def work() -> pb.DeleteTopicResponse:
            name = parse_topic(request.topic)
            if name.is_partition:
                # forwarded from another broker: delete this one partition here
                await self.broker.delete_partition_here(name, force=request.force)
                return pb.DeleteTopicResponse()
            record = await self.broker.catalog.require(name)
            partitions = record.partition_names()
            if not request.force:
                for p in partitions:
                    stats = await self._partition_stats(p, internal=False)
                    consumers = sum(len(s.consumers) for s in stats.subscriptions)
                    if stats.publishers or consumers:
                        raise TopicBusyError(
                            f"topic {name.topic} has {len(stats.publishers)} producer(s) and"
                            f" {consumers} consumer(s) on {p}; disconnect them or force the delete"
                        )
            for p in partitions:
                await self._delete_partition(p)
            await self.broker.catalog.delete(name)
            log.info("topic_deleted", topic=name.topic, partitions=record.partitions)
            return pb.DeleteTopicResponse()

        return await self._call(context, work)

    async def _delete_partition(self, partition: TopicName) -> None:
        async def local(_topic: Topic) -> None:
            await self.broker.delete_partition_here(partition, force=True)

        async def remote(peer: admin_pb2_grpc.AdminServiceAsyncStub) -> None:
            await peer.DeleteTopic(
                pb.DeleteTopicRequest(topic=partition.full, force=True), timeout=FORWARD_TIMEOUT_S
            )

        await self._on_owner(partition, local, remote)

    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: Context
    ) -> pb.ListTopicsResponse:
        async def work() -> pb.ListTopicsResponse:
            namespace = request.namespace.strip("/")
            if namespace and namespace.count("/") != 1:
                raise InvalidArgumentError(
                    f"a namespace is 'tenant/namespace', got {request.namespace!r}"
                )
            records = await self.broker.catalog.list(namespace)
            return pb.ListTopicsResponse(
                topics=[
                    pb.TopicSummary(topic=r.name.topic, partitions=r.partitions) for r in records
                ]
            )

        return await self._call(context, work)

    async def GetTopic(self, request: pb.GetTopicRequest, context: Context) -> pb.GetTopicResponse:
        async def work() -> pb.GetTopicResponse:
            record = await self.broker.catalog.require(parse_base_topic(request.topic))
            policies = pb.TopicPolicies()
            policies.ParseFromString(record.policies.SerializeToString())
            return pb.GetTopicResponse(
                topic=record.name.topic,
                partitions=record.partitions,
                policies=policies,
                properties=record.properties,
                created_ms=record.created_ms,
            )

        return await self._call(context, work)

    async def UpdatePartitions(
        self, request: pb.UpdatePartitionsRequest, context: Context
    ) -> pb.UpdatePartitionsResponse:
        async def work() -> pb.UpdatePartitionsResponse:
            record = await self.broker.catalog.update_partitions(
                parse_base_topic(request.topic), request.partitions
            )
            return pb.UpdatePartitionsResponse(partitions=record.partitions)

        return await self._call(context, work)

    async def GetTopicStats(
        self, request: pb.GetTopicStatsRequest, context: Context
    ) -> pb.GetTopicStatsResponse:
        async def work() -> pb.GetTopicStatsResponse:
            name = parse_topic(request.topic)
            response = pb.GetTopicStatsResponse(topic=name.full)
            for p in await self._partitions(request.topic):
                stats = await self._partition_stats(p, internal=request.internal)
                response.partitions.append(stats)
                response.msg_rate_in += stats.msg_rate_in
                response.msg_throughput_in += stats.msg_throughput_in
                response.msg_rate_out += stats.msg_rate_out
                response.msg_throughput_out += stats.msg_throughput_out
                response.storage_size_bytes += stats.storage_size_bytes
            return response

        return await self._call(context, work)

    async def _partition_stats(self, partition: TopicName, *, internal: bool) -> pb.PartitionStats:
        async def local(topic: Topic) -> pb.PartitionStats:
            return self._local_stats(topic, internal=internal)

        async def remote(peer: admin_pb2_grpc.AdminServiceAsyncStub) -> pb.PartitionStats:
            response = await peer.GetTopicStats(
                pb.GetTopicStatsRequest(topic=partition.full, internal=internal),
                timeout=FORWARD_TIMEOUT_S,
            )
            stats: pb.PartitionStats = response.partitions[0]
            return stats

        return await self._on_owner(partition, local, remote)

    def _local_stats(self, topic: Topic, *, internal: bool) -> pb.PartitionStats:
        rates = self.broker.load_manager.partition_rates.get(topic.name.full, (0.0,) * 4)
        ml = topic.ml
        stats = pb.PartitionStats(
            partition_topic=topic.name.full,
            partition=topic.name.partition,
            owner_broker_id=self.broker.broker_id,
            msg_rate_in=rates[0],
            msg_rate_out=rates[1],
            msg_throughput_in=rates[2],
            msg_throughput_out=rates[3],
            storage_size_bytes=ml.storage_size_bytes,
            earliest_offset=ml.earliest_offset,
            next_offset=ml.next_offset,
        )
        for producer in topic.producers.values():
            stats.publishers.add(
                producer_name=producer.name,
                last_sequence_id=producer.last_sequence_id,
                address=producer.address,
            )
        reported: set[str] = set()
        for name, subscription in topic.subscriptions.items():
            reported.add(name)
            cursor = subscription.cursor
            sub = stats.subscriptions.add(
                subscription=name,
                subscription_type=int(subscription.type),
                backlog_messages=cursor.backlog_messages,
                unacked_messages=subscription.dispatcher.unacked_messages,
                blocked=subscription.blocked_reason is not None,
                ack_hole_ranges=cursor.ack_hole_ranges,
                ack_ranges_over_limit=cursor.ack_ranges_over_limit,
                mark_delete_offset=cursor.mark_delete_offset,
                dead_lettered_messages=subscription.dead_lettered,
            )
            for consumer in subscription.consumers:
                sub.consumers.add(
                    consumer_name=consumer.name,
                    available_permits=consumer.permits,
                    unacked_messages=consumer.unacked_messages,
                    blocked=consumer.slot.blocked,
                    active=consumer.slot.active,
                    address=consumer.address,
                )
        for name, cursor in ml.cursors.items():
            if name not in reported:
                stats.subscriptions.add(
                    subscription=name,
                    subscription_type=cursor.subscription_type
                    or types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
                    backlog_messages=cursor.backlog_messages,
                    ack_hole_ranges=cursor.ack_hole_ranges,
                    ack_ranges_over_limit=cursor.ack_ranges_over_limit,
                    mark_delete_offset=cursor.mark_delete_offset,
                )
        if internal:
            for ledger in ml.ledgers:
                stats.ledgers.add(
                    ledger_id=ledger.ledger_id,
                    entries=ledger.entries,
                    size_bytes=ledger.size_bytes,
                    first_offset=ledger.first_offset,
                    created_ms=ledger.created_ms,
                )
            for name, cursor in ml.cursors.items():
                stats.cursors.add(
                    name=name,
                    mark_delete=types_pb2.Position(
                        ledger_id=cursor.mark_delete.ledger_id, entry_id=cursor.mark_delete.entry_id
                    ),
                    read_position=types_pb2.Position(
                        ledger_id=cursor.read_position.ledger_id,
                        entry_id=cursor.read_position.entry_id,
                    ),
                    ack_ranges=cursor.ack_hole_ranges,
                )
        return stats

    # --- subscriptions ----------------------------------------------------------------------------

    async def ListSubscriptions(
        self, request: pb.ListSubscriptionsRequest, context: Context
    ) -> pb.ListSubscriptionsResponse:
        async def work() -> pb.ListSubscriptionsResponse:
            names: set[str] = set()
            for p in await self._partitions(request.topic):
                stats = await self._partition_stats(p, internal=False)
                names.update(s.subscription for s in stats.subscriptions)
            return pb.ListSubscriptionsResponse(subscriptions=sorted(names))

        return await self._call(context, work)

    async def CreateSubscription(
        self, request: pb.CreateSubscriptionRequest, context: Context
    ) -> pb.CreateSubscriptionResponse:
        async def work() -> pb.CreateSubscriptionResponse:
            if not request.subscription:
                raise InvalidArgumentError("a subscription needs a name")
            for p in await self._partitions(request.topic):

                async def local(topic: Topic) -> None:
                    position, _ = await topic.resolve_start(to_start(request.start))
                    await topic.ml.open_cursor(request.subscription, start=position)

                async def remote(
                    peer: admin_pb2_grpc.AdminServiceAsyncStub, p: TopicName = p
                ) -> None:
                    await peer.CreateSubscription(
                        pb.CreateSubscriptionRequest(
                            topic=p.full, subscription=request.subscription, start=request.start
                        ),
                        timeout=FORWARD_TIMEOUT_S,
                    )

                await self._on_owner(p, local, remote)
            return pb.CreateSubscriptionResponse()

        return await self._call(context, work)

    async def DeleteSubscription(
        self, request: pb.DeleteSubscriptionRequest, context: Context
    ) -> pb.DeleteSubscriptionResponse:
        async def work() -> pb.DeleteSubscriptionResponse:
            found = False
            for p in await self._partitions(request.topic):

                async def local(topic: Topic) -> bool:
                    try:
                        await topic.delete_subscription(request.subscription, force=request.force)
                    except SubscriptionNotFoundError:
                        return False
                    return True

                async def remote(
                    peer: admin_pb2_grpc.AdminServiceAsyncStub, p: TopicName = p
                ) -> bool:
                    try:
                        await peer.DeleteSubscription(
                            pb.DeleteSubscriptionRequest(
                                topic=p.full, subscription=request.subscription, force=request.force
                            ),
                            timeout=FORWARD_TIMEOUT_S,
                        )
                    except grpc.aio.AioRpcError as e:
                        if isinstance(error_from_rpc_error(e), SubscriptionNotFoundError):
                            return False
                        raise
                    return True

                found = await self._on_owner(p, local, remote) or found
            if not found:
                raise SubscriptionNotFoundError(
                    f"topic {request.topic} has no subscription {request.subscription!r}"
                )
            return pb.DeleteSubscriptionResponse()

        return await self._call(context, work)

    async def ResetCursor(
        self, request: pb.ResetCursorRequest, context: Context
    ) -> pb.ResetCursorResponse:
        async def work() -> pb.ResetCursorResponse:
            partitions = await self._partitions(request.topic)
            # one partition: an offset or message id past its end is an error; across several,
            # an offset past the end of a shorter partition means its end
            strict = len(partitions) == 1 and not request.past_end_is_end
            for p in partitions:

                async def local(topic: Topic) -> None:
                    subscription = topic.subscriptions.get(request.subscription)
                    if subscription is not None:
                        await subscription.seek(to_start(request.target), strict=strict)
                        return
                    if request.subscription not in topic.ml.cursors:
                        raise SubscriptionNotFoundError(
                            f"topic {topic.name} has no subscription {request.subscription!r}"
                        )
                    position, _ = await topic.resolve_start(to_start(request.target), strict=strict)
                    await topic.ml.cursors[request.subscription].reset(position)

                async def remote(
                    peer: admin_pb2_grpc.AdminServiceAsyncStub, p: TopicName = p
                ) -> None:
                    await peer.ResetCursor(
                        pb.ResetCursorRequest(
                            topic=p.full,
                            subscription=request.subscription,
                            target=request.target,
                            past_end_is_end=not strict,
                        ),
                        timeout=FORWARD_TIMEOUT_S,
                    )

                await self._on_owner(p, local, remote)
            return pb.ResetCursorResponse()

        return await self._call(context, work)

    # --- cluster ----------------------------------------------------------------------------------

    async def ListBrokers(
        self, request: pb.ListBrokersRequest, context: Context
    ) -> pb.ListBrokersResponse:
        async def work() -> pb.ListBrokersResponse:
            snapshot = await read_cluster(self.broker.store)
            owned: dict[str, int] = {}
            for record in snapshot.owners.values():
                owned[record.broker_id] = owned.get(record.broker_id, 0) + 1
            response = pb.ListBrokersResponse()
            for broker_id, reg in sorted(snapshot.brokers.items()):
                load = snapshot.loads.get(broker_id, cluster_pb2.BrokerLoadReport())
                response.brokers.add(
                    broker_id=broker_id,
                    service_url=reg.service_url,
                    http_address=reg.http_address,
                    version=reg.version,
                    start_time_ms=reg.start_time_ms,
                    owned_partitions=owned.get(broker_id, 0),
                    msg_rate_in=load.msg_rate_in,
                    msg_rate_out=load.msg_rate_out,
                    cpu_percent=load.cpu_percent,
                )
            return response

        return await self._call(context, work)

    async def ListBookies(
        self, request: pb.ListBookiesRequest, context: Context
    ) -> pb.ListBookiesResponse:
        async def work() -> pb.ListBookiesResponse:
            listing = await self.broker.store.list(layout.BOOKIES_AVAILABLE)
            response = pb.ListBookiesResponse()
            for record in listing.records:
                reg = cluster_pb2.BookieRegistration()
                reg.ParseFromString(record.value)
                response.bookies.add(
                    bookie_id=reg.bookie_id,
                    address=reg.address,
                    state=reg.state,
                    total_disk_bytes=reg.total_disk_bytes,
                    free_disk_bytes=reg.free_disk_bytes,
                    labels=reg.labels,
                    version=reg.version,
                )
            return response

        return await self._call(context, work)

    async def ListOwnership(
        self, request: pb.ListOwnershipRequest, context: Context
    ) -> pb.ListOwnershipResponse:
        async def work() -> pb.ListOwnershipResponse:
            snapshot = await read_cluster(self.broker.store)
            response = pb.ListOwnershipResponse()
            for partition, record in sorted(snapshot.owners.items()):
                if request.broker_id and record.broker_id != request.broker_id:
                    continue
                response.ownership.add(
                    partition_topic=partition,
                    broker_id=record.broker_id,
                    broker_url=record.service_url,
                    acquired_ms=record.acquired_ms,
                )
            return response

        return await self._call(context, work)

    async def ListLedgers(
        self, request: pb.ListLedgersRequest, context: Context
    ) -> pb.ListLedgersResponse:
        async def work() -> pb.ListLedgersResponse:
            ledgers = LedgerMetadataStore(self.broker.store)
            wanted: dict[int, str] | None = None
            if request.topic:
                wanted = {}
                for p in await self._partitions(request.topic):
                    info = await self.broker.factory.read_info(p.full)
                    for ledger in info.ledgers:
                        wanted[ledger.ledger_id] = p.full
            response = pb.ListLedgersResponse()
            ids = sorted(wanted) if wanted is not None else await ledgers.ledger_ids()
            for ledger_id in ids:
                with contextlib.suppress(MagnetarError):
                    meta = await ledgers.read(ledger_id)
                    response.ledgers.append(
                        _ledger_summary(meta, wanted.get(ledger_id, "") if wanted else "")
                    )
            return response

        return await self._call(context, work)

    async def GetLedger(
        self, request: pb.GetLedgerRequest, context: Context
    ) -> pb.GetLedgerResponse:
        async def work() -> pb.GetLedgerResponse:
            meta = await LedgerMetadataStore(self.broker.store).read(request.ledger_id)
            response = pb.GetLedgerResponse(
                summary=_ledger_summary(meta, ""),
                created_ms=meta.created_ms,
                properties={k: v.decode("utf-8", errors="replace") for k, v in meta.custom.items()},
            )
            for segment in meta.segments:
                response.ensembles.add(
                    first_entry_id=segment.first_entry_id, bookie_ids=list(segment.bookies)
                )
            return response

        return await self._call(context, work)

    async def UnloadTopic(
        self, request: pb.UnloadTopicRequest, context: Context
    ) -> pb.UnloadTopicResponse:
        async def work() -> pb.UnloadTopicResponse:
            for p in await self._partitions(request.topic):
                try:
                    route = await self.broker.route(p, acquire=False)
                except TopicNotOwnedError:
                    continue  # nobody owns it: nothing to unload
                if route.topic is not None:
                    await self.broker.topics.unload(
                        p, reason=ServiceNotReadyError(f"partition {p} was unloaded")
                    )
                elif route.service_url:
                    await self._peer(route.service_url).UnloadTopic(
                        pb.UnloadTopicRequest(topic=p.full), timeout=FORWARD_TIMEOUT_S
                    )
            return pb.UnloadTopicResponse()

        return await self._call(context, work)


def _topic_policies(policies: pb.TopicPolicies) -> topic_pb2.TopicPolicies:
    stored = topic_pb2.TopicPolicies()
    stored.ParseFromString(policies.SerializeToString())
    return stored


def _ledger_summary(meta: LedgerMetadata, topic: str) -> pb.LedgerSummary:
    return pb.LedgerSummary(
        ledger_id=meta.ledger_id,
        state=meta.state.name,
        last_entry_id=meta.last_entry_id,
        length=meta.length,
        ensemble_size=meta.ensemble_size,
        write_quorum_size=meta.write_quorum,
        ack_quorum_size=meta.ack_quorum,
        topic=topic,
    )
