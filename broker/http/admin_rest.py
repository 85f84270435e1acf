"""Pulsar's admin REST API on the broker's HTTP port: the topic calls pulsar-admin makes and
pulsar-client's own tests use, in Pulsar's paths, JSON and status codes.

It is a translation over the gRPC admin service (:class:`broker.grpc.admin.AdminServicer`), not
a second implementation: each call builds the request the gRPC API takes and runs the same
servicer method. So authentication (``Authorization: Bearer <token>``), authorization,
forwarding to a partition's owner and the combining of partitions are the gRPC API's, and only
the answers are re-expressed in Pulsar's terms. The servicer sees the HTTP request as its call
context (:class:`_HttpCall`): the credentials it presented, and an ``abort`` that hands the
typed error back here, where it becomes a JSON ``{"reason": ...}`` with the HTTP status of its
kind.

Under ``/admin/v2/persistent/{tenant}/{namespace}``:

=======================================  ======  ==========================================
path                                     method  what
=======================================  ======  ==========================================
(the namespace)                          GET     topics: every non-partitioned topic and
                                                 every partition, by full name
``/partitioned``                         GET     partitioned topics, by full name
``/{topic}``                             PUT     create a non-partitioned topic (body: none,
                                                 or a JSON object of string properties)
``/{topic}``                             DELETE  delete a non-partitioned topic
``/{topic}/partitions``                  PUT     create a partitioned topic (body: the
                                                 partition count, a JSON integer)
``/{topic}/partitions``                  POST    grow its partitions (body: the new count)
``/{topic}/partitions``                  GET     ``{"partitions": N}`` (0: not partitioned)
``/{topic}/partitions``                  DELETE  delete a partitioned topic
``/{topic}/stats``                       GET     stats, in Pulsar's field names
``/{topic}/partitioned-stats``           GET     stats summed over partitions, and each one
``/{topic}/deduplication``               POST    set the topic's dedup switch (``true``)
``/{topic}/deduplication``               GET     the topic's switch (``null``: not set;
                                                 ``?applied=true``: what applies)
``/{topic}/deduplication``               DELETE  remove the topic's switch
=======================================  ======  ==========================================

A DELETE takes ``?force=true`` to delete a topic that has producers or consumers. Changes
answer 204 with no body, as Pulsar's do.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import parse_qs, unquote

import grpc
import grpc.aio
import structlog
from google.protobuf.message import Message

from broker.grpc.admin import AdminServicer
from broker.service.catalog import MAX_PARTITIONS
from magnetar.common.errors import InternalError, MagnetarError, TopicNotFoundError
from magnetar.common.grpc_errors import ERROR_DETAIL_KEY, error_from_detail
from magnetar.common.security.grpc_credentials import AUTHORIZATION_HEADER
from magnetar.common.server.status_http import Request, Response
from proto.admin.v1 import admin_pb2 as pb
from proto.common.v1 import errors_pb2, types_pb2

log = structlog.get_logger("magnetar.broker.admin_rest")

__all__ = ["PREFIX", "PulsarAdminRest"]

PREFIX = "/admin/v2/"
"""The path prefix this API is mounted at."""

_JSON = "application/json"
_NO_CONTENT = Response(204, b"", _JSON)

_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "FAILED_PRECONDITION": 412,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
"""The HTTP status of each kind of error (a :class:`MagnetarError`'s ``grpc_status``); any other
kind is a 500. Pulsar answers 409 for a topic that exists, 404 for one that does not, 412 for a
topic with clients that a delete without ``force`` would cut off, 401 and 403 for who may not."""

_SUBSCRIPTION_TYPES = {
    types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE: "Exclusive",
    types_pb2.SUBSCRIPTION_TYPE_FAILOVER: "Failover",
    types_pb2.SUBSCRIPTION_TYPE_SHARED: "Shared",
    types_pb2.SUBSCRIPTION_TYPE_KEY_SHARED: "Key_Shared",
}

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Context = grpc.aio.ServicerContext[Any, Any]


class _RefusedError(Exception):
    """A request this adapter refuses before any service call: its HTTP status and reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _HttpCall:
    """What the admin servicer reads of its call context, for one HTTP request: the
    credentials it presented, and ``abort``, which raises the call's typed error (rebuilt from
    its code, as a gRPC client would) for :class:`PulsarAdminRest` to answer."""

    def __init__(self, request: Request) -> None:
        self._request = request

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        authorization = self._request.headers.get("authorization")
        return () if authorization is None else ((AUTHORIZATION_HEADER, authorization),)

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # the HTTP port's TLS asks for no client certificate: tokens only

    def peer(self) -> str:
        return self._request.peer

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> NoReturn:
        for key, value in trailing_metadata:
            if key == ERROR_DETAIL_KEY and isinstance(value, bytes):
                raise error_from_detail(errors_pb2.ErrorDetail.FromString(value))
        raise InternalError(details or f"the admin call failed with {code.name}")


class PulsarAdminRest:
    """The app the broker's HTTP server mounts at :data:`PREFIX`."""

    def __init__(self, admin: AdminServicer) -> None:
        self._admin = admin

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except _RefusedError as e:
            return _error(e.status, e.reason)
        except MagnetarError as e:
            return _error(_HTTP_STATUS.get(e.grpc_status, 500), e.message)
        except Exception:
            log.exception("admin_rest_request_failed", method=request.method)
            return _error(500, "the broker failed to answer; its log says why")

    async def _route(self, request: Request) -> Response:
        segments = _segments(request.path)
        if segments[:1] == ["non-persistent"]:
            raise _RefusedError(
                501, "Magnetar's topics are all persistent: use /admin/v2/persistent/"
            )
        if segments[:1] != ["persistent"] or len(segments) < 3 or len(segments) > 5:
            raise _RefusedError(
                404,
                "no such admin path; this API serves /admin/v2/persistent/{tenant}/{namespace}"
                " and its topics",
            )
        tenant, namespace = segments[1], segments[2]
        method = request.method
        query = parse_qs(request.query)
        if len(segments) == 3:
            _allow(method, "GET")
            return await self._list(request, tenant, namespace, partitioned=False)
        if len(segments) == 4 and segments[3] == "partitioned" and method == "GET":
            return await self._list(request, tenant, namespace, partitioned=True)
        topic = f"{tenant}/{namespace}/{segments[3]}"
        if len(segments) == 4:
            _allow(method, "PUT", "DELETE")
            if method == "PUT":
                return await self._create(request, topic, _properties(request.body))
            return await self._delete(
                request, topic, partitioned=False, force=_flag(query, "force")
            )
        action = segments[4]
        if action == "partitions":
            _allow(method, "PUT", "POST", "GET", "DELETE")
            if method == "PUT":
                return await self._create(request, topic, {}, _partitions(request.body))
            if method == "POST":
                return await self._grow(request, topic, _partitions(request.body))
            if method == "GET":
                return await self._partition_count(request, topic)
            return await self._delete(request, topic, partitioned=True, force=_flag(query, "force"))
        if action in ("stats", "partitioned-stats"):
            _allow(method, "GET")
            return await self._stats(
                request,
                topic,
                partitioned=action == "partitioned-stats",
                per_partition=_flag(query, "perPartition", default=True),
            )
        if action == "deduplication":
            _allow(method, "POST", "GET", "DELETE")
            if method == "GET":
                return await self._deduplication(request, topic, applied=_flag(query, "applied"))
            return await self._set_deduplication(
                request, topic, _boolean(request.body) if method == "POST" else None
            )
        raise _RefusedError(
            404,
            "no such topic call; this API serves a topic's partitions, stats,"
            " partitioned-stats and deduplication",
        )

    async def _call(
        self,
        request: Request,
        method: Callable[[Req, Context], Awaitable[Resp]],
        message: Req,
    ) -> Resp:
        return await method(message, cast(Context, _HttpCall(request)))

    # --- the calls --------------------------------------------------------------------------------

    async def _list(
        self, request: Request, tenant: str, namespace: str, *, partitioned: bool
    ) -> Response:
        listing = await self._call(
            request, self._admin.ListTopics, pb.ListTopicsRequest(namespace=f"{tenant}/{namespace}")
        )
        names: list[str] = []
        for summary in listing.topics:
            base = f"persistent://{summary.topic}"
            if partitioned:
                if summary.partitions:
                    names.append(base)
            elif summary.partitions:
                names.extend(f"{base}-partition-{i}" for i in range(summary.partitions))
            else:
                names.append(base)
        return _json(sorted(names))

    async def _create(
        self, request: Request, topic: str, properties: dict[str, str], partitions: int = 0
    ) -> Response:
        await self._call(
            request,
            self._admin.CreateTopic,
            pb.CreateTopicRequest(topic=topic, partitions=partitions, properties=properties),
        )
        return _NO_CONTENT

    async def _grow(self, request: Request, topic: str, partitions: int) -> Response:
        await self._call(
            request,
            self._admin.UpdatePartitions,
            pb.UpdatePartitionsRequest(topic=topic, partitions=partitions),
        )
        return _NO_CONTENT

    async def _get(self, request: Request, topic: str) -> pb.GetTopicResponse:
        return await self._call(request, self._admin.GetTopic, pb.GetTopicRequest(topic=topic))

    async def _partition_count(self, request: Request, topic: str) -> Response:
        try:
            found = await self._get(request, topic)
        except TopicNotFoundError:
            # as Pulsar answers a topic it does not know: not partitioned
            return _json({"partitions": 0})
        return _json({"partitions": found.partitions})

    async def _delete(
        self, request: Request, topic: str, *, partitioned: bool, force: bool
    ) -> Response:
        # a partition name is refused by GetTopic: the gRPC call deletes one partition's data
        # only when a broker forwards it to the partition's owner
        found = await self._get(request, topic)
        if partitioned and not found.partitions:
            raise _RefusedError(
                404, f"topic {found.topic} is not partitioned: delete it without /partitions"
            )
        if not partitioned and found.partitions:
            raise _RefusedError(
                409,
                f"topic {found.topic} is partitioned ({found.partitions} partitions): delete it"
                " with /partitions",
            )
        await self._call(
            request, self._admin.DeleteTopic, pb.DeleteTopicRequest(topic=topic, force=force)
        )
        return _NO_CONTENT

    async def _stats(
        self, request: Request, topic: str, *, partitioned: bool, per_partition: bool
    ) -> Response:
        stats = await self._call(
            request, self._admin.GetTopicStats, pb.GetTopicStatsRequest(topic=topic)
        )
        if not partitioned:
            return _json(_topic_stats(stats.partitions))
        found = await self._get(request, topic)
        body = _topic_stats(stats.partitions)
        body["metadata"] = {"partitions": found.partitions}
        body["partitions"] = (
            {f"persistent://{p.partition_topic}": _topic_stats([p]) for p in stats.partitions}
            if per_partition and found.partitions
            else {}
        )
        return _json(body)

    async def _deduplication(self, request: Request, topic: str, *, applied: bool) -> Response:
        found = await self._get(request, topic)
        if found.policies.HasField("deduplication"):
            return _json(found.policies.deduplication)
        if applied:
            return _json(self._admin.broker.config.deduplication_enabled)
        return _json(None)

    async def _set_deduplication(self, request: Request, topic: str, on: bool | None) -> Response:
        update = pb.UpdateTopicPoliciesRequest(topic=topic)
        if on is None:
            update.remove.append("deduplication")
        else:
            update.set.deduplication = on
        await self._get(request, topic)  # a partition's name is refused, as it is by GetTopic
        await self._call(request, self._admin.UpdateTopicPolicies, update)
        return _NO_CONTENT


# --- request parts ------------------------------------------------------------------------------


def _segments(path: str) -> list[str]:
    """The path's segments after :data:`PREFIX`, percent-decoded; a segment that is empty,
    ``.`` or ``..``, or holds a ``/`` once decoded, is refused (it could name something else)."""
    rest = path[len(PREFIX) :].removesuffix("/")
    segments = []
    for raw in rest.split("/"):
        try:
            segment = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise _RefusedError(400, "a path segment is not UTF-8 once percent-decoded") from None
        if segment in ("", ".", "..") or "/" in segment:
            raise _RefusedError(
                400, "a path segment is empty, '.' or '..', or holds an encoded '/'"
            )
        segments.append(segment)
    return segments


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise _RefusedError(405, f"this path takes {', '.join(allowed)}, not {method}")


def _flag(query: dict[str, list[str]], name: str, *, default: bool = False) -> bool:
    values = query.get(name)
    if not values:
        return default
    value = values[-1].lower()
    if value not in ("true", "false"):
        raise _RefusedError(400, f"query parameter {name} is true or false")
    return value == "true"


def _body(body: bytes, what: str) -> object:
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too many digits, too deep
        raise _RefusedError(
            400, f"the body could not be read as JSON; it should be {what}"
        ) from None


def _partitions(body: bytes) -> int:
    what = f"the number of partitions, a JSON integer from 1 to {MAX_PARTITIONS:,}"
    count = _body(body, what)
    if not isinstance(count, int) or isinstance(count, bool):
        raise _RefusedError(400, f"the body should be {what}")
    if not 0 < count <= MAX_PARTITIONS:
        # Pulsar answers 412 Precondition Failed for a partition count out of range
        raise _RefusedError(412, f"the number of partitions is from 1 to {MAX_PARTITIONS:,}")
    return count


def _boolean(body: bytes) -> bool:
    value = _body(body, "true or false")
    if not isinstance(value, bool):
        raise _RefusedError(400, "the body should be true or false")
    return value


def _properties(body: bytes) -> dict[str, str]:
    if not body.strip():
        return {}
    what = "none, or a JSON object of string properties"
    properties = _body(body, what)
    if not isinstance(properties, dict) or not all(isinstance(v, str) for v in properties.values()):
        raise _RefusedError(400, f"the body should be {what}")
    return cast(dict[str, str], properties)


# --- answers -------------------------------------------------------------------------------------


def _json(value: object, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode(), _JSON)


def _error(status: int, reason: str) -> Response:
    return _json({"reason": reason}, status)


def _topic_stats(partitions: Sequence[pb.PartitionStats]) -> dict[str, Any]:
    """Pulsar's TopicStats fields that Magnetar has a figure for, over ``partitions``."""
    subscriptions: dict[str, dict[str, Any]] = {}
    publishers: list[dict[str, Any]] = []
    for p in partitions:
        publishers.extend(
            {"producerName": publisher.producer_name}
            | ({"address": publisher.address} if publisher.address else {})
            for publisher in p.publishers
        )
        for s in p.subscriptions:
            found = subscriptions.setdefault(
                s.subscription,
                {
                    "msgBacklog": 0,
                    "unackedMessages": 0,
                    "type": _SUBSCRIPTION_TYPES.get(s.subscription_type, "Exclusive"),
                    "isDurable": True,
                    "blockedSubscriptionOnUnackedMsgs": False,
                    "consumers": [],
                },
            )
            found["msgBacklog"] += s.backlog_messages
            found["unackedMessages"] += s.unacked_messages
            found["blockedSubscriptionOnUnackedMsgs"] |= s.blocked
            for c in s.consumers:
                found["consumers"].append(
                    {
                        "consumerName": c.consumer_name,
                        "availablePermits": c.available_permits,
                        "unackedMessages": c.unacked_messages,
                        "blockedConsumerOnUnackedMsgs": c.blocked,
                    }
                    | ({"address": c.address} if c.address else {})
                )
    return {
        "msgRateIn": sum(p.msg_rate_in for p in partitions),
        "msgThroughputIn": sum(p.msg_throughput_in for p in partitions),
        "msgRateOut": sum(p.msg_rate_out for p in partitions),
        "msgThroughputOut": sum(p.msg_throughput_out for p in partitions),
        # offsets are dense and start at 0: the next one is how many messages were written
        "msgInCounter": sum(p.next_offset for p in partitions),
        "storageSize": sum(p.storage_size_bytes for p in partitions),
        "publishers": publishers,
        "subscriptions": subscriptions,
    }
