"""The broker's gRPC adapter for administration: topics, subscriptions, tenants, the cluster.

Any broker answers. Work on one partition runs on its owner: here if this broker owns it (or
takes it, when nobody does), otherwise the same request is forwarded to the owner, partition by
partition, and the answers are combined.

Every call is authenticated and authorized here, at the broker that took it (see
:mod:`broker.service.authorization` for who may do what). A forwarded call carries credentials
too: the broker's own token (``broker_client_auth_token_file``, a superuser's), or else the
caller's token, and over TLS the broker's certificate; so the owner checks it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog

from bookie.client.ledger_metadata import LedgerMetadata, LedgerMetadataStore
from broker.grpc.servicer import to_start
from broker.service.authorization import AuthorizationService, TopicAction
from broker.service.broker import Broker, Route
from broker.service.catalog import read_cluster
from broker.service.records import (
    BrokerLoadReport,
    TopicPolicies,
    policies_from_message,
    policies_to_message,
)
from broker.service.tenants import Action, parse_actions
from broker.service.topic import Topic
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    NamespaceNotFoundError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicBusyError,
    TopicNotOwnedError,
)
from magnetar.common.grpc_errors import abort_with, error_from_rpc_error
from magnetar.common.names import (
    TopicName,
    check_tenant,
    parse_base_topic,
    parse_namespace,
    parse_topic,
)
from magnetar.common.security.authentication import Principal
from magnetar.common.security.grpc_credentials import AUTHORIZATION_HEADER, credentials_of
from magnetar.common.security.tls import ClientTls, open_secure_channel
from metadata import layout
from proto.admin.v1 import admin_pb2 as pb
from proto.admin.v1 import admin_pb2_grpc
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2, topic_pb2

log = structlog.get_logger("magnetar.broker.admin")

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]
FORWARD_TIMEOUT_S = 30.0


_caller_token: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "caller_token", default=None
)
"""The token of the admin call being served (each call is its own task, so its own value)."""


def _target(service_url: str) -> str:
    return service_url.split("://", 1)[-1].split(",", maxsplit=1)[0]


class _ForwardCredentials(grpc.aio.UnaryUnaryClientInterceptor):
    """Puts a token on every call forwarded to another broker: the broker's own, else the
    caller's."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        token = self._token()
        if token:
            metadata = [
                *(client_call_details.metadata or ()),
                (AUTHORIZATION_HEADER, f"Bearer {token}"),
            ]
            client_call_details = client_call_details._replace(metadata=metadata)
        return await continuation(client_call_details, request)


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._channels: dict[str, grpc.aio.Channel] = {}
        config = broker.config
        self._tls: ClientTls | None = None
        if config.tls_enabled or config.broker_client_trust_certs_file is not None:
            self._tls = ClientTls(
                trust_certs_file=config.broker_client_trust_certs_file
                or config.tls_trust_certs_file,
                cert_file=config.tls_cert_file,
                key_file=config.tls_key_file,
            )
        self._interceptors = [_ForwardCredentials(self._forward_token)]

    @property
    def _authz(self) -> AuthorizationService:
        return self.broker.security.authorization

    async def close(self) -> None:
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close()

    def _forward_token(self) -> str | None:
        path = self.broker.config.broker_client_auth_token_file
        if path is not None:
            try:
                return path.read_text().strip()
            except OSError as e:
                log.warning("broker_client_token_unreadable", file=str(path), error=e.strerror)
        return _caller_token.get()

    async def _peer(self, route: Route) -> admin_pb2_grpc.AdminServiceAsyncStub:
        """A stub on the owner at ``route``: over TLS when this broker speaks TLS to brokers and
        the owner has a TLS listener (or has no other)."""
        use_tls = bool(route.service_url_tls) and (self._tls is not None or not route.service_url)
        url = route.service_url_tls if use_tls else route.service_url
        target = _target(url)
        channel = self._channels.get(url)
        if channel is None:
            if use_tls:
                channel = await open_secure_channel(
                    target, self._tls or ClientTls(), interceptors=self._interceptors
                )
            else:
                channel = grpc.aio.insecure_channel(target, interceptors=self._interceptors)
            self._channels[url] = channel
        return admin_pb2_grpc.AdminServiceStub(channel)

    async def _call(self, context: Context, work: Callable[[Principal], Awaitable[T]]) -> T:
        try:
            credentials = credentials_of(context)
            principal = self.broker.security.authenticate(credentials)
            reset = _caller_token.set(credentials.token)
            try:
                return await work(principal)
            finally:
                _caller_token.reset(reset)
        except MagnetarError as e:
            await abort_with(context, e)

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
                return await remote(await self._peer(route))
            except grpc.aio.AioRpcError as e:
                error = error_from_rpc_error(e, route.service_url or route.service_url_tls)
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
        async def work(principal: Principal) -> pb.CreateTopicResponse:
            name = parse_base_topic(request.topic)
            await self._authz.check_tenant_admin(principal, name.tenant, f"create topic {name}")
            self._require_namespace(name)
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
        async def work(principal: Principal) -> pb.DeleteTopicResponse:
            name = parse_topic(request.topic)
            await self._authz.check_tenant_admin(principal, name.tenant, f"delete topic {name}")
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
        async def work(principal: Principal) -> pb.ListTopicsResponse:
            namespace = request.namespace.strip("/")
            if namespace and namespace.count("/") != 1:
                raise InvalidArgumentError(
                    f"a namespace is 'tenant/namespace', got {request.namespace!r}"
                )
            if namespace:
                await self._check_lookup(principal, namespace)
            records = [
                r
                for r in await self.broker.catalog.list(namespace)
                if self._authz.may(principal, TopicAction.LOOKUP, r.name.namespace_name)
            ]
            return pb.ListTopicsResponse(
                topics=[
                    pb.TopicSummary(topic=r.name.topic, partitions=r.partitions) for r in records
                ]
            )

        return await self._call(context, work)

    async def GetTopic(self, request: pb.GetTopicRequest, context: Context) -> pb.GetTopicResponse:
        async def work(principal: Principal) -> pb.GetTopicResponse:
            name = parse_base_topic(request.topic)
            await self._authz.check_topic(principal, TopicAction.LOOKUP, name)
            record = await self.broker.catalog.require(name)
            policies = pb.TopicPolicies()
            policies.ParseFromString(policies_to_message(record.policies).SerializeToString())
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
        async def work(principal: Principal) -> pb.UpdatePartitionsResponse:
            name = parse_base_topic(request.topic)
            await self._authz.check_tenant_admin(
                principal, name.tenant, f"change the partitions of topic {name}"
            )
            record = await self.broker.catalog.update_partitions(name, request.partitions)
            return pb.UpdatePartitionsResponse(partitions=record.partitions)

        return await self._call(context, work)

    async def UpdateTopicPolicies(
        self, request: pb.UpdateTopicPoliciesRequest, context: Context
    ) -> pb.UpdateTopicPoliciesResponse:
        async def work(principal: Principal) -> pb.UpdateTopicPoliciesResponse:
            name = parse_topic(request.topic)
            await self._authz.check_tenant_admin(
                principal, name.tenant, f"change the policies of topic {name}"
            )
            if name.is_partition:
                # forwarded from another broker: reopen this one partition
                await self._reopen(name)
                return pb.UpdateTopicPoliciesResponse()
            record = await self.broker.catalog.update_policies(
                name, _topic_policies(request.set), request.remove
            )
            log.info(
                "topic_policies_updated",
                topic=name.topic,
                set=[f.name for f, _ in request.set.ListFields()],
                removed=list(request.remove),
                by=principal.role,
            )
            # an open partition took its policies when it was opened: reopen it (its clients
            # reconnect, as after an unload) so that they apply now
            for p in record.partition_names():
                await self._reopen(p)
            response = pb.UpdateTopicPoliciesResponse()
            response.policies.ParseFromString(
                policies_to_message(record.policies).SerializeToString()
            )
            return response

        return await self._call(context, work)

    async def _reopen(self, partition: TopicName) -> None:
        async def forward(peer: admin_pb2_grpc.AdminServiceAsyncStub) -> None:
            await peer.UpdateTopicPolicies(
                pb.UpdateTopicPoliciesRequest(topic=partition.full), timeout=FORWARD_TIMEOUT_S
            )

        await self._unload(partition, f"partition {partition} reopens with new policies", forward)

    async def _unload(
        self,
        partition: TopicName,
        reason: str,
        forward: Callable[[admin_pb2_grpc.AdminServiceAsyncStub], Awaitable[None]],
    ) -> None:
        """Unload ``partition`` where it is open: here, or on its owner through ``forward``;
        nothing when nobody owns it."""
        try:
            route = await self.broker.route(partition, acquire=False)
        except TopicNotOwnedError:
            return
        if route.topic is not None:
            await self.broker.topics.unload(partition, reason=ServiceNotReadyError(reason))
        elif route.service_url or route.service_url_tls:
            await forward(await self._peer(route))

    async def GetTopicStats(
        self, request: pb.GetTopicStatsRequest, context: Context
    ) -> pb.GetTopicStatsResponse:
        async def work(principal: Principal) -> pb.GetTopicStatsResponse:
            name = parse_topic(request.topic)
            admin = self._authz.is_tenant_admin(principal, name.tenant)
            if request.internal and not admin:
                await self._authz.check_tenant_admin(
                    principal, name.tenant, f"read the internal stats of topic {name}"
                )
            await self._authz.check_topic(principal, TopicAction.LOOKUP, name)
            response = pb.GetTopicStatsResponse(topic=name.full)
            for p in await self._partitions(request.topic):
                stats = await self._partition_stats(p, internal=request.internal)
                response.partitions.append(stats)
                response.msg_rate_in += stats.msg_rate_in
                response.msg_throughput_in += stats.msg_throughput_in
                response.msg_rate_out += stats.msg_rate_out
                response.msg_throughput_out += stats.msg_throughput_out
                response.storage_size_bytes += stats.storage_size_bytes
            if not admin:
                _hide_addresses(response)
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
            write_problem=ml.write_problem.message if ml.write_problem else "",
            write_problem_since_ms=ml.write_problem_since_ms,
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
                redelivery_counts=len(cursor.redelivery_counts),
                redelivery_counts_dropped=cursor.redelivery_counts.dropped,
                delayed_entries=len(subscription.dispatcher.delayed),
                delayed_index_buckets=subscription.dispatcher.index.buckets,
                delayed_entries_loaded=subscription.delayed_entries_loaded,
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
                    redelivery_counts=len(cursor.redelivery_counts),
                    redelivery_counts_dropped=cursor.redelivery_counts.dropped,
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
        async def work(principal: Principal) -> pb.ListSubscriptionsResponse:
            await self._authz.check_topic(
                principal, TopicAction.CONSUME, parse_topic(request.topic)
            )
            names: set[str] = set()
            for p in await self._partitions(request.topic):
                stats = await self._partition_stats(p, internal=False)
                names.update(s.subscription for s in stats.subscriptions)
            return pb.ListSubscriptionsResponse(subscriptions=sorted(names))

        return await self._call(context, work)

    async def CreateSubscription(
        self, request: pb.CreateSubscriptionRequest, context: Context
    ) -> pb.CreateSubscriptionResponse:
        async def work(principal: Principal) -> pb.CreateSubscriptionResponse:
            await self._authz.check_topic(
                principal, TopicAction.CONSUME, parse_topic(request.topic)
            )
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
        async def work(principal: Principal) -> pb.DeleteSubscriptionResponse:
            name = parse_topic(request.topic)
            await self._authz.check_tenant_admin(
                principal,
                name.tenant,
                f"delete subscription {request.subscription!r} of topic {name}",
            )
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
        async def work(principal: Principal) -> pb.ResetCursorResponse:
            name = parse_topic(request.topic)
            await self._authz.check_tenant_admin(
                principal,
                name.tenant,
                f"reset subscription {request.subscription!r} of topic {name}",
            )
            partitions = await self._partitions(request.topic)
            # one partition: an offset or message id past its end is an error; across several,
            # an offset past the end of a shorter partition means its end
            strict = len(partitions) == 1 and not request.past_end_is_end
            for p in partitions:

                async def local(topic: Topic) -> None:
                    subscription = topic.subscriptions.get(request.subscription)
                    if subscription is not None:
                        await subscription.seek(to_start(request.target, "target"), strict=strict)
                        return
                    if request.subscription not in topic.ml.cursors:
                        raise SubscriptionNotFoundError(
                            f"topic {topic.name} has no subscription {request.subscription!r}"
                        )
                    position, _ = await topic.resolve_start(
                        to_start(request.target, "target"), strict=strict
                    )
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
        async def work(principal: Principal) -> pb.ListBrokersResponse:
            self._authz.check_superuser(principal, "list brokers")
            snapshot = await read_cluster(self.broker.store)
            owned: dict[str, int] = {}
            for record in snapshot.owners.values():
                owned[record.broker_id] = owned.get(record.broker_id, 0) + 1
            response = pb.ListBrokersResponse()
            for broker_id, reg in sorted(snapshot.brokers.items()):
                load = snapshot.loads.get(broker_id, BrokerLoadReport(broker_id=broker_id))
                response.brokers.add(
                    broker_id=broker_id,
                    service_url=reg.service_url,
                    service_url_tls=reg.service_url_tls,
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
        async def work(principal: Principal) -> pb.ListBookiesResponse:
            self._authz.check_superuser(principal, "list bookies")
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
        async def work(principal: Principal) -> pb.ListOwnershipResponse:
            self._authz.check_superuser(principal, "list partition ownership")
            snapshot = await read_cluster(self.broker.store)
            response = pb.ListOwnershipResponse()
            for partition, record in sorted(snapshot.owners.items()):
                if request.broker_id and record.broker_id != request.broker_id:
                    continue
                response.ownership.add(
                    partition_topic=partition,
                    broker_id=record.broker_id,
                    broker_url=record.service_url,
                    broker_url_tls=record.service_url_tls,
                    acquired_ms=record.acquired_ms,
                )
            return response

        return await self._call(context, work)

    async def ListLedgers(
        self, request: pb.ListLedgersRequest, context: Context
    ) -> pb.ListLedgersResponse:
        async def work(principal: Principal) -> pb.ListLedgersResponse:
            self._authz.check_superuser(principal, "list ledgers")
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
        async def work(principal: Principal) -> pb.GetLedgerResponse:
            self._authz.check_superuser(principal, "read ledger metadata")
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
        async def work(principal: Principal) -> pb.UnloadTopicResponse:
            self._authz.check_superuser(principal, f"unload topic {request.topic}")
            for p in await self._partitions(request.topic):

                async def forward(
                    peer: admin_pb2_grpc.AdminServiceAsyncStub, p: TopicName = p
                ) -> None:
                    await peer.UnloadTopic(
                        pb.UnloadTopicRequest(topic=p.full), timeout=FORWARD_TIMEOUT_S
                    )

                await self._unload(p, f"partition {p} was unloaded", forward)
            return pb.UnloadTopicResponse()

        return await self._call(context, work)

    # --- helpers of authorization -----------------------------------------------------------------

    async def _check_lookup(self, principal: Principal, namespace: str) -> None:
        """Refuse a role that may neither produce nor consume in ``namespace`` (nor administer
        its tenant) from listing or reading it."""
        if self._authz.may(principal, TopicAction.LOOKUP, namespace):
            return
        tenant, local = namespace.split("/", 1)
        await self._authz.check_topic(principal, TopicAction.LOOKUP, TopicName(tenant, local, "*"))

    def _require_namespace(self, name: TopicName) -> None:
        """With authorization on, topics live in namespaces that exist (as in Pulsar); without
        it, anywhere."""
        if (
            self._authz.enabled
            and self.broker.security.tenants.namespace(name.namespace_name) is None
        ):
            raise NamespaceNotFoundError(
                f"namespace {name.namespace_name} does not exist; create it first (magnetar"
                f" namespaces create {name.namespace_name})",
                context={"namespace": name.namespace_name},
            )

    # --- tenants and namespaces -------------------------------------------------------------------

    async def CreateTenant(
        self, request: pb.CreateTenantRequest, context: Context
    ) -> pb.CreateTenantResponse:
        async def work(principal: Principal) -> pb.CreateTenantResponse:
            self._authz.check_superuser(principal, f"create tenant {request.tenant!r}")
            await self.broker.security.tenants.create_tenant(request.tenant, request.admin_roles)
            log.info("tenant_created", tenant=request.tenant, by=principal.role)
            return pb.CreateTenantResponse()

        return await self._call(context, work)

    async def UpdateTenant(
        self, request: pb.UpdateTenantRequest, context: Context
    ) -> pb.UpdateTenantResponse:
        async def work(principal: Principal) -> pb.UpdateTenantResponse:
            self._authz.check_superuser(principal, f"update tenant {request.tenant!r}")
            await self.broker.security.tenants.update_tenant(request.tenant, request.admin_roles)
            log.info("tenant_updated", tenant=request.tenant, by=principal.role)
            return pb.UpdateTenantResponse()

        return await self._call(context, work)

    async def DeleteTenant(
        self, request: pb.DeleteTenantRequest, context: Context
    ) -> pb.DeleteTenantResponse:
        async def work(principal: Principal) -> pb.DeleteTenantResponse:
            self._authz.check_superuser(principal, f"delete tenant {request.tenant!r}")
            await self.broker.security.tenants.delete_tenant(request.tenant)
            log.info("tenant_deleted", tenant=request.tenant, by=principal.role)
            return pb.DeleteTenantResponse()

        return await self._call(context, work)

    async def ListTenants(
        self, request: pb.ListTenantsRequest, context: Context
    ) -> pb.ListTenantsResponse:
        async def work(principal: Principal) -> pb.ListTenantsResponse:
            tenants = self.broker.security.tenants
            visible = [
                t
                for t in tenants.tenants()
                if self._authz.is_tenant_admin(principal, t)
                or any(
                    self._authz.may(principal, TopicAction.LOOKUP, n) for n in tenants.namespaces(t)
                )
            ]
            return pb.ListTenantsResponse(tenants=visible)

        return await self._call(context, work)

    async def GetTenant(
        self, request: pb.GetTenantRequest, context: Context
    ) -> pb.GetTenantResponse:
        async def work(principal: Principal) -> pb.GetTenantResponse:
            tenant = check_tenant(request.tenant)
            await self._authz.check_tenant_admin(principal, tenant, f"read tenant {tenant!r}")
            found = await self.broker.security.tenants.read_tenant(tenant)
            return pb.GetTenantResponse(
                tenant=pb.TenantInfo(tenant=found.name, admin_roles=found.admin_roles)
            )

        return await self._call(context, work)

    async def CreateNamespace(
        self, request: pb.CreateNamespaceRequest, context: Context
    ) -> pb.CreateNamespaceResponse:
        async def work(principal: Principal) -> pb.CreateNamespaceResponse:
            tenant, _ = parse_namespace(request.namespace)
            await self._authz.check_tenant_admin(
                principal, tenant, f"create namespace {request.namespace!r}"
            )
            await self.broker.security.tenants.create_namespace(request.namespace)
            log.info("namespace_created", namespace=request.namespace, by=principal.role)
            return pb.CreateNamespaceResponse()

        return await self._call(context, work)

    async def DeleteNamespace(
        self, request: pb.DeleteNamespaceRequest, context: Context
    ) -> pb.DeleteNamespaceResponse:
        async def work(principal: Principal) -> pb.DeleteNamespaceResponse:
            tenant, _ = parse_namespace(request.namespace)
            await self._authz.check_tenant_admin(
                principal, tenant, f"delete namespace {request.namespace!r}"
            )
            await self.broker.security.tenants.delete_namespace(request.namespace)
            log.info("namespace_deleted", namespace=request.namespace, by=principal.role)
            return pb.DeleteNamespaceResponse()

        return await self._call(context, work)

    async def ListNamespaces(
        self, request: pb.ListNamespacesRequest, context: Context
    ) -> pb.ListNamespacesResponse:
        async def work(principal: Principal) -> pb.ListNamespacesResponse:
            tenants = self.broker.security.tenants
            tenant = check_tenant(request.tenant)
            await tenants.read_tenant(tenant)
            admin = self._authz.is_tenant_admin(principal, tenant)
            visible = [
                n
                for n in tenants.namespaces(tenant)
                if admin or self._authz.may(principal, TopicAction.LOOKUP, n)
            ]
            if not admin and not visible:
                await self._authz.check_tenant_admin(
                    principal, tenant, f"list the namespaces of tenant {tenant!r}"
                )
            return pb.ListNamespacesResponse(namespaces=visible)

        return await self._call(context, work)

    async def GrantPermission(
        self, request: pb.GrantPermissionRequest, context: Context
    ) -> pb.GrantPermissionResponse:
        async def work(principal: Principal) -> pb.GrantPermissionResponse:
            tenant, _ = parse_namespace(request.namespace)
            await self._authz.check_tenant_admin(
                principal, tenant, f"grant permissions on namespace {request.namespace!r}"
            )
            actions = parse_actions(_ACTION_NAMES.get(a, str(a)) for a in request.actions)
            await self.broker.security.tenants.grant(request.namespace, request.role, actions)
            log.info(
                "permission_granted",
                namespace=request.namespace,
                role=request.role,
                actions=sorted(actions),
                by=principal.role,
            )
            return pb.GrantPermissionResponse()

        return await self._call(context, work)

    async def RevokePermission(
        self, request: pb.RevokePermissionRequest, context: Context
    ) -> pb.RevokePermissionResponse:
        async def work(principal: Principal) -> pb.RevokePermissionResponse:
            tenant, _ = parse_namespace(request.namespace)
            await self._authz.check_tenant_admin(
                principal, tenant, f"revoke permissions on namespace {request.namespace!r}"
            )
            await self.broker.security.tenants.revoke(request.namespace, request.role)
            log.info(
                "permission_revoked",
                namespace=request.namespace,
                role=request.role,
                by=principal.role,
            )
            return pb.RevokePermissionResponse()

        return await self._call(context, work)

    async def GetPermissions(
        self, request: pb.GetPermissionsRequest, context: Context
    ) -> pb.GetPermissionsResponse:
        async def work(principal: Principal) -> pb.GetPermissionsResponse:
            tenant, _ = parse_namespace(request.namespace)
            await self._authz.check_tenant_admin(
                principal, tenant, f"read the permissions of namespace {request.namespace!r}"
            )
            namespace, _ = await self.broker.security.tenants.read_namespace(request.namespace)
            response = pb.GetPermissionsResponse()
            for role, actions in sorted(namespace.permissions.items()):
                response.permissions.add(
                    role=role, actions=[_ACTION_ENUMS[a] for a in sorted(actions)]
                )
            return response

        return await self._call(context, work)

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Context) -> pb.WhoAmIResponse:
        async def work(principal: Principal) -> pb.WhoAmIResponse:
            security = self.broker.security
            return pb.WhoAmIResponse(
                role=principal.role,
                method=principal.method,
                superuser=security.authorization.is_superuser(principal)
                and not principal.anonymous,
                authentication_enabled=security.authentication_enabled,
                authorization_enabled=security.authorization.enabled,
            )

        return await self._call(context, work)


_ACTION_NAMES = {pb.AUTH_ACTION_PRODUCE: "produce", pb.AUTH_ACTION_CONSUME: "consume"}
_ACTION_ENUMS = {Action.PRODUCE: pb.AUTH_ACTION_PRODUCE, Action.CONSUME: pb.AUTH_ACTION_CONSUME}


def _hide_addresses(response: pb.GetTopicStatsResponse) -> None:
    """Stats for a role that does not administer the tenant: no client addresses."""
    for partition in response.partitions:
        for publisher in partition.publishers:
            publisher.address = ""
        for subscription in partition.subscriptions:
            for consumer in subscription.consumers:
                consumer.address = ""


def _topic_policies(policies: pb.TopicPolicies) -> TopicPolicies:
    # the wire message and the stored one have the same fields, numbers and presence
    stored = topic_pb2.TopicPolicies()
    stored.ParseFromString(policies.SerializeToString())
    return policies_from_message(stored)


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
        intended_ensemble_size=meta.intended_ensemble_size,
    )
