"""The etcd metadata store: Magnetar's production backend (``etcd://h1:2379,h2:2379``).

It speaks etcd's v3 API through aetcd's generated bindings (``aetcd.rpc``) over our own
``grpc.aio`` channels rather than through ``aetcd.Client``, for three reasons:

- endpoints: one channel per endpoint, rotating to the next when one fails (``aetcd.Client``
  takes a single host);
- watches: each watch is its own stream that we re-create from the last delivered revision after
  any disconnect (etcd restart, leader loss), so a watch delivers every change in order, with no
  gaps, or fails loudly with WatchCompactedError;
- errors: every failure becomes one of our MetadataError classes naming the endpoint; etcd only
  distinguishes some conditions by message text, so that matching is confined to
  :func:`_map_rpc_error`.

Reads are retried on other endpoints within the request deadline. A write is sent only on a
channel that is connected. If the write's fate is then unknown (the connection broke mid-call), it
fails with MetadataUnavailableError rather than being silently sent twice.

Security (:class:`~metadata.config.EtcdSecuritySettings`): with a trust file or a client
certificate every channel is TLS; with a user, the store authenticates (etcd's ``Authenticate``)
and sends the token etcd gives on every call. etcd's tokens expire: a call refused for an
"invalid auth token" is authenticated again and retried (it did not run). A wrong password or
an untrusted certificate fails the opening of the store, saying which setting to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog
from aetcd import rpc

from magnetar.common.errors import (
    InternalError,
    InvalidConfigError,
    InvalidMetadataUrlError,
    LeaseNotFoundError,
    MetadataError,
    MetadataStoreClosedError,
    MetadataUnavailableError,
    TransactionTooLargeError,
    ValueTooLargeError,
    WatchCompactedError,
)
from metadata.api import (
    ABSENT,
    Compare,
    DeleteOp,
    EventType,
    Lease,
    Listing,
    MetadataStore,
    PutOp,
    Record,
    TxnOp,
    TxnResult,
    Watch,
    WatchEvent,
    compare_failed,
)
from metadata.config import MetadataStoreConfig

log = structlog.get_logger("magnetar.metadata.etcd")

T = TypeVar("T")

_LIST_PAGE = 1000
_CHANNEL_OPTIONS = [
    # etcd restarts must be noticed in well under a session TTL: gRPC's default reconnect
    # backoff grows to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # detect a silently dead peer (network cut) on active streams; etcd's server allows pings
    # every 5 s, and refuses pings without active calls by default
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def parse_endpoints(text: str) -> list[str]:
    """``"h1:2379,h2"`` -> ``["h1:2379", "h2:2379"]``; raises InvalidMetadataUrlError."""
    endpoints = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "2379"
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidMetadataUrlError(
                f"invalid etcd endpoint {item!r}: expected host:port with a port from 1 to 65535",
                context={"endpoint": item},
            )
        endpoints.append(f"{host}:{int(port)}" if ":" not in host else f"[{host}]:{int(port)}")
    if not endpoints:
        raise InvalidMetadataUrlError(
            "an etcd metadata URL needs at least one endpoint: etcd://host:2379[,host2:2379]"
        )
    return endpoints


def prefix_range_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"  # every key
    end[-1] += 1
    return bytes(end)


def _record(kv: Any) -> Record:
    return Record(
        key=kv.key.decode("utf-8"),
        value=bytes(kv.value),
        version=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        lease_id=int(kv.lease),
    )


def _cancelled_from_outside() -> bool:
    """Whether the running task itself is being cancelled (not just a call it was waiting on)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _map_rpc_error(error: grpc.aio.AioRpcError, endpoint: str, what: str) -> MetadataError:
    code = error.code()
    details = error.details() or ""
    context = {"endpoint": endpoint, "grpc_status": code.name}
    # etcd reports these conditions only through the message text of its rpctypes errors
    if "request is too large" in details or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and ("message larger than max" in details)
    ):
        return ValueTooLargeError(
            f"etcd at {endpoint} refused {what} as too large: {details}", context=context
        )
    if "too many operations in txn request" in details:
        return TransactionTooLargeError(
            f"etcd at {endpoint} refused {what}: {details}", context=context
        )
    if "requested lease not found" in details:
        return LeaseNotFoundError(
            f"etcd at {endpoint}: {what}: the lease is not known (expired or revoked)",
            context=context,
        )
    if "required revision has been compacted" in details:
        return WatchCompactedError(f"etcd at {endpoint}: {what}: {details}", context=context)
    if "invalid auth token" in details or "user name is empty" in details:
        return _TokenExpiredError(
            f"etcd at {endpoint} refused the auth token for {what}; authenticating again",
            context=context,
        )
    if "permission denied" in details:
        return MetadataError(
            f"etcd at {endpoint} refused {what}: permission denied. The etcd user (etcd_user,"
            " or else the common name of the client certificate) needs read-write access to"
            " Magnetar's keys",
            context=context,
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return MetadataError(
            f"etcd at {endpoint} refused {what}: {details} (check etcd_user and"
            " etcd_password_file)",
            context=context,
        )
    if "database space exceeded" in details:
        return MetadataError(
            f"etcd at {endpoint} is out of space (NOSPACE alarm): {what} refused;"
            " compact and defragment etcd, then disarm the alarm",
            context=context,
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        reason = "did not answer in time" if code == grpc.StatusCode.DEADLINE_EXCEEDED else details
        return MetadataUnavailableError(
            f"etcd at {endpoint} is unavailable for {what}: {reason}", context=context
        )
    return MetadataError(
        f"etcd at {endpoint} failed {what}: {code.name}: {details}", context=context
    )


class _TokenExpiredError(MetadataUnavailableError):
    """etcd refused a call's auth token (expired, or none was sent): authenticate again."""


_AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"


class _Credentials:
    """TLS files and etcd's user of one store, and the auth token etcd gave it."""

    def __init__(self, config: MetadataStoreConfig) -> None:
        self.config = config
        self.tls: grpc.ChannelCredentials | None = None
        if config.etcd_tls_enabled:
            self.tls = grpc.ssl_channel_credentials(
                root_certificates=_read_file(config.etcd_trust_certs_file, "etcd_trust_certs_file"),
                private_key=_read_file(config.etcd_key_file, "etcd_key_file"),
                certificate_chain=_read_file(config.etcd_cert_file, "etcd_cert_file"),
            )
        self.user = config.etcd_user
        self._password: str | None = None
        if config.etcd_password_file is not None:
            data = _read_file(config.etcd_password_file, "etcd_password_file")
            assert data is not None
            self._password = data.decode("utf-8").strip()
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._auth_disabled = False

    def invalidate(self) -> None:
        self._token = None

    async def metadata(self, channel: grpc.aio.Channel, endpoint: str) -> list[tuple[str, str]]:
        """``[("token", ...)]`` for a call on ``channel``; [] without a user."""
        if self.user is None or self._auth_disabled:
            return []
        if self._token is None:
            async with self._lock:
                if self._token is None:
                    self._token = await self._authenticate(channel, endpoint)
        return [("token", self._token)] if self._token else []

    async def _authenticate(self, channel: grpc.aio.Channel, endpoint: str) -> str:
        request = rpc.AuthenticateRequest(name=self.user, password=self._password or "")
        timeout_s = self.config.request_timeout_ms / 1000
        try:
            response = await rpc.AuthStub(channel).Authenticate(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            details = e.details() or e.code().name
            if "authentication is not enabled" in details:
                self._auth_disabled = True
                log.warning("etcd_auth_not_enabled", endpoint=endpoint, user=self.user)
                return ""
            if "invalid user ID or password" in details or "authentication failed" in details:
                raise MetadataError(
                    f"etcd at {endpoint} refused user {self.user!r}: wrong user or password"
                    " (check etcd_user and etcd_password_file)",
                    context={"endpoint": endpoint, "user": str(self.user)},
                ) from None
            raise _map_rpc_error(e, endpoint, f"authenticate as {self.user!r}") from None
        log.info("etcd_authenticated", endpoint=endpoint, user=self.user)
        return str(response.token)


def _read_file(path: object, setting: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(str(path), "rb") as stream:
            return stream.read()
    except OSError as e:
        raise InvalidConfigError(
            f"{setting} {path} cannot be read: {e.strerror}", context={"field": setting}
        ) from None


class _TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Puts the store's etcd auth token on every unary call of a channel."""

    def __init__(self, credentials: _Credentials, endpoint: str) -> None:
        self._credentials = credentials
        self._endpoint = endpoint
        self.channel: grpc.aio.Channel | None = None

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = client_call_details.method
        if isinstance(method, bytes):
            method = method.decode()
        if method != _AUTHENTICATE and self.channel is not None:
            metadata = await self._credentials.metadata(self.channel, self._endpoint)
            if metadata:
                client_call_details = client_call_details._replace(
                    metadata=[*(client_call_details.metadata or ()), *metadata]
                )
        return await continuation(client_call_details, request)


class _Endpoints:
    """One gRPC channel per etcd endpoint; calls go to the current one and rotate on failure."""

    def __init__(self, endpoints: list[str], credentials: _Credentials) -> None:
        self.endpoints = endpoints
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = 0

    @property
    def current(self) -> str:
        return self.endpoints[self._current]

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            interceptor = (
                _TokenInterceptor(self.credentials, endpoint)
                if self.credentials.user is not None
                else None
            )
            interceptors = [interceptor] if interceptor is not None else None
            if self.credentials.tls is not None:
                channel = grpc.aio.secure_channel(
                    endpoint,
                    self.credentials.tls,
                    options=_CHANNEL_OPTIONS,
                    interceptors=interceptors,
                )
            else:
                channel = grpc.aio.insecure_channel(
                    endpoint, options=_CHANNEL_OPTIONS, interceptors=interceptors
                )
            if interceptor is not None:
                interceptor.channel = channel
            self._channels[endpoint] = channel
        return channel

    def rotate(self, failed: str) -> None:
        if self.current == failed:
            self._current = (self._current + 1) % len(self.endpoints)

    async def ready_channel(self, deadline: float) -> tuple[str, grpc.aio.Channel]:
        """A connected channel, trying each endpoint in turn until ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        while True:
            endpoint = self.current
            channel = self.channel(endpoint)
            if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
                return endpoint, channel
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MetadataUnavailableError(
                    f"no etcd endpoint is reachable ({', '.join(self.endpoints)})",
                    context={"endpoints": ",".join(self.endpoints)},
                )
            # give each endpoint a fair share of the time left before moving on
            share = max(0.05, min(remaining, remaining / len(self.endpoints), 1.0))
            try:
                await asyncio.wait_for(channel.channel_ready(), share)
            except TimeoutError:
                self.rotate(endpoint)
                continue
            return endpoint, channel

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()


class EtcdMetadataStore(MetadataStore):
    """The metadata store on an etcd cluster."""

    def __init__(self, config: MetadataStoreConfig, endpoints: list[str]) -> None:
        super().__init__(config)
        self._endpoints = _Endpoints(endpoints, _Credentials(config))
        self._watches: weakref.WeakSet[_EtcdWatch] = weakref.WeakSet()

    @classmethod
    async def open(cls, endpoints: list[str], config: MetadataStoreConfig) -> EtcdMetadataStore:
        """Connect, and fail clearly (naming every endpoint and why) if none answers."""
        store = cls(config, endpoints)
        try:
            await store._check_reachable()
        except BaseException:
            await store.close()
            raise
        return store

    @property
    def description(self) -> str:
        return "etcd://" + ",".join(self._endpoints.endpoints)

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints.endpoints)

    @property
    def current_endpoint(self) -> str:
        """The endpoint requests go to now (it changes when that endpoint fails)."""
        return self._endpoints.current

    async def _check_reachable(self) -> None:
        """Find an endpoint that answers, trying them all in turn until ``connect_timeout_ms``
        has passed: an etcd that is still starting, or a machine too busy to finish a handshake
        at once, is waited for. A refusal that waiting cannot cure (a bad password, a
        certificate etcd rejects) fails at once."""
        timeout_s = self.config.connect_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            problems: list[str] = []
            final = False
            for endpoint in self._endpoints.endpoints:
                attempt_s = max(0.5, min(5.0, deadline - loop.time()))
                problem, final_problem = await self._try_endpoint(endpoint, attempt_s)
                if problem is None:
                    # start with an endpoint that answers
                    while self._endpoints.current != endpoint:
                        self._endpoints.rotate(self._endpoints.current)
                    return
                problems.append(problem)
                final = final or final_problem
            if final or loop.time() >= deadline:
                break
            await asyncio.sleep(min(0.5, max(0.0, deadline - loop.time())))
        raise MetadataUnavailableError(
            "cannot reach etcd at any endpoint of "
            + self.description
            + f" (tried for {timeout_s:g} s, connect_timeout_ms): "
            + "; ".join(problems),
            context={"endpoints": ",".join(self._endpoints.endpoints)},
        )

    async def _try_endpoint(self, endpoint: str, timeout_s: float) -> tuple[str | None, bool]:
        """``(None, False)`` when ``endpoint`` answers, else what is wrong and whether waiting
        cannot cure it."""
        loop = asyncio.get_running_loop()
        host = endpoint.rsplit(":", 1)[0].strip("[]")
        try:
            await asyncio.wait_for(loop.getaddrinfo(host, None), timeout_s)
        except (OSError, TimeoutError) as e:
            return f"{endpoint}: host name {host!r} does not resolve ({e})", False
        channel = self._endpoints.channel(endpoint)
        tls_hint = (
            " (TLS: check etcd_trust_certs_file, and etcd_cert_file/etcd_key_file if etcd"
            " requires client certificates)"
            if self._endpoints.credentials.tls is not None
            else ""
        )
        try:
            await rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=timeout_s)
            # a wrong password fails here, at the start, not at the first write
            await self._endpoints.credentials.metadata(channel, endpoint)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            reason = (
                f"no answer within {timeout_s:g} s"
                if code == grpc.StatusCode.DEADLINE_EXCEEDED
                else (e.details() or code.name)
            )
            transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return f"{endpoint}: {reason}{tls_hint}", not transient
        except MetadataUnavailableError as e:
            return f"{endpoint}: {e.message}{tls_hint}", not e.retriable
        return None, False

    # --- the call path ------------------------------------------------------------------------

    async def _call(
        self,
        what: str,
        fn: Callable[[grpc.aio.Channel, float], Awaitable[T]],
        *,
        idempotent: bool,
    ) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        last_error: MetadataError | None = None
        while True:
            self._check_open()
            try:
                endpoint, channel = await self._endpoints.ready_channel(deadline)
                remaining = max(0.01, deadline - loop.time())
                return await fn(channel, remaining)
            except asyncio.CancelledError:
                # closing the store closes its channels, which cancels the calls on them
                if self.closed and not _cancelled_from_outside():
                    raise MetadataStoreClosedError(
                        f"the metadata store {self.description} was closed during {what}"
                    ) from None
                raise
            except grpc.aio.AioRpcError as e:
                error = _map_rpc_error(e, endpoint, what)
                if self.closed:
                    raise MetadataStoreClosedError(
                        f"the metadata store {self.description} was closed during {what}"
                    ) from None
                if isinstance(error, _TokenExpiredError):
                    if self._endpoints.credentials.user is None:
                        raise MetadataError(
                            f"etcd at {endpoint} requires a user for {what}: set etcd_user and"
                            " etcd_password_file",
                            context={"endpoint": endpoint},
                        ) from None
                    if loop.time() < deadline:
                        # refused before it ran: authenticate again and send it again
                        self._endpoints.credentials.invalidate()
                        continue
                if not isinstance(error, MetadataUnavailableError):
                    raise error from None
                self._endpoints.rotate(endpoint)
                last_error = error
                if not idempotent or loop.time() >= deadline:
                    raise last_error from None
                await asyncio.sleep(0.05)

    # --- reads --------------------------------------------------------------------------------

    async def _do_get(self, key: str) -> Record | None:
        request = rpc.RangeRequest(key=key.encode())

        async def call(channel: grpc.aio.Channel, time_left: float) -> Record | None:
            response = await rpc.KVStub(channel).Range(request, timeout=time_left)
            return _record(response.kvs[0]) if response.kvs else None

        return await self._call(f"get {key!r}", call, idempotent=True)

    async def _do_list(self, prefix: str) -> Listing:
        start = prefix.encode()
        end = prefix_range_end(start)
        for _attempt in range(3):
            try:
                return await self._list_pages(prefix, start, end)
            except WatchCompactedError:
                # the revision we pinned the pages to was compacted mid-listing: start over
                continue
        return await self._list_pages(prefix, start, end)

    async def _list_pages(self, prefix: str, start: bytes, end: bytes) -> Listing:
        records: list[Record] = []
        revision = 0
        key = start
        while True:
            request = rpc.RangeRequest(key=key, range_end=end, limit=_LIST_PAGE, revision=revision)

            async def call(channel: grpc.aio.Channel, time_left: float, req: Any = request) -> Any:
                return await rpc.KVStub(channel).Range(req, timeout=time_left)

            response = await self._call(f"list {prefix!r}", call, idempotent=True)
            if revision == 0:
                revision = int(response.header.revision)
            records.extend(_record(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return Listing(tuple(records), revision)
            key = bytes(response.kvs[-1].key) + b"\0"

    # --- writes -------------------------------------------------------------------------------

    async def _do_txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        request = rpc.TxnRequest()
        for cmp in compares:
            if cmp.version == ABSENT:
                request.compare.add(
                    key=cmp.key.encode(),
                    target=rpc.Compare.CompareTarget.CREATE,
                    result=rpc.Compare.CompareResult.EQUAL,
                    create_revision=0,
                )
            else:
                request.compare.add(
                    key=cmp.key.encode(),
                    target=rpc.Compare.CompareTarget.MOD,
                    result=rpc.Compare.CompareResult.EQUAL,
                    mod_revision=cmp.version,
                )
            # on failure, read the compared keys back to say which comparison failed
            request.failure.add(request_range=rpc.RangeRequest(key=cmp.key.encode()))
        for op in ops:
            if isinstance(op, PutOp):
                request.success.add(
                    request_put=rpc.PutRequest(
                        key=op.key.encode(), value=bytes(op.value), lease=op.lease_id
                    )
                )
            else:
                assert isinstance(op, DeleteOp)
                request.success.add(
                    request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode())
                )

        async def call(channel: grpc.aio.Channel, time_left: float) -> Any:
            return await rpc.KVStub(channel).Txn(request, timeout=time_left)

        what = f"a transaction on {', '.join(repr(o.key) for o in ops) or 'no keys'}"
        response = await self._call(what, call, idempotent=False)
        if not response.succeeded:
            for cmp, op_response in zip(compares, response.responses, strict=True):
                kvs = op_response.response_range.kvs
                actual = int(kvs[0].mod_revision) if kvs else ABSENT
                if actual != cmp.version:
                    raise compare_failed(cmp.key, cmp.version, actual)
            # the failure reads run in the same transaction as the comparisons, so one must differ
            raise InternalError(f"etcd failed {what} but every comparison held")
        revision = int(response.header.revision)
        versions: dict[str, int] = {}
        deleted: set[str] = set()
        for op, op_response in zip(ops, response.responses, strict=True):
            if isinstance(op, PutOp):
                versions[op.key] = revision
            elif op_response.response_delete_range.deleted > 0:
                deleted.add(op.key)
        return TxnResult(revision, versions, frozenset(deleted))

    # --- leases ---------------------------------------------------------------------------------

    async def _do_grant_lease(self, ttl_s: int) -> Lease:
        async def call(channel: grpc.aio.Channel, time_left: float) -> Any:
            return await rpc.LeaseStub(channel).LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s, ID=0), timeout=time_left
            )

        response = await self._call(f"grant a {ttl_s} s lease", call, idempotent=False)
        if response.error:
            raise MetadataError(f"etcd refused a {ttl_s} s lease: {response.error}")
        return Lease(int(response.ID), int(response.TTL))

    async def _do_keepalive(self, lease_id: int) -> int:
        async def call(channel: grpc.aio.Channel, time_left: float) -> Any:
            metadata = await self._endpoints.credentials.metadata(channel, self.current_endpoint)
            stream = rpc.LeaseStub(channel).LeaseKeepAlive(timeout=time_left, metadata=metadata)
            try:
                await stream.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                return await stream.read()
            finally:
                stream.cancel()

        # refreshing a lease twice is harmless, so a keepalive retries like a read
        response = await self._call(f"keep lease {lease_id} alive", call, idempotent=True)
        if response is grpc.aio.EOF or int(response.TTL) <= 0:
            raise LeaseNotFoundError(
                f"lease {lease_id} is not known to etcd (expired or revoked)",
                context={"lease": lease_id},
            )
        return int(response.TTL)

    async def _do_revoke_lease(self, lease_id: int) -> None:
        async def call(channel: grpc.aio.Channel, time_left: float) -> None:
            await rpc.LeaseStub(channel).LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), timeout=time_left
            )

        with contextlib.suppress(LeaseNotFoundError):
            await self._call(f"revoke lease {lease_id}", call, idempotent=True)

    # --- watches ---------------------------------------------------------------------------------

    async def current_revision(self) -> int:
        """The store's revision now."""

        async def call(channel: grpc.aio.Channel, time_left: float) -> int:
            response = await rpc.KVStub(channel).Range(
                rpc.RangeRequest(key=b"\0", count_only=True), timeout=time_left
            )
            return int(response.header.revision)

        return await self._call("read the current revision", call, idempotent=True)

    async def compact(self, revision: int) -> None:
        """Drop etcd's history before ``revision`` (operators run this to bound etcd's size;
        watches that still need older revisions then fail with WatchCompactedError)."""
        self._check_open()

        async def call(channel: grpc.aio.Channel, time_left: float) -> None:
            await rpc.KVStub(channel).Compact(
                rpc.CompactionRequest(revision=revision, physical=True), timeout=time_left
            )

        await self._call(f"compact history before revision {revision}", call, idempotent=True)

    async def _check_history(self, prefix: str, start_revision: int) -> None:
        """Fail now if ``start_revision`` is compacted: etcd itself would first confirm the watch
        and cancel it only afterwards."""
        request = rpc.RangeRequest(
            key=prefix.encode(),
            range_end=prefix_range_end(prefix.encode()),
            count_only=True,
            revision=start_revision - 1,
        )

        async def call(channel: grpc.aio.Channel, time_left: float) -> None:
            await rpc.KVStub(channel).Range(request, timeout=time_left)

        try:
            await self._call(f"check history of {prefix!r}", call, idempotent=True)
        except WatchCompactedError:
            raise WatchCompactedError(
                f"cannot watch {prefix!r} from revision {start_revision}: etcd compacted that"
                " history; list again and watch from the listing's revision",
                context={"revision": start_revision},
            ) from None
        except MetadataError as e:
            if "future revision" not in str(e):  # a start in the future is fine for a watch
                raise

    async def _do_watch(self, prefix: str, start_revision: int | None) -> Watch:
        if start_revision is not None and start_revision > 1:
            await self._check_history(prefix, start_revision)
        start = start_revision if start_revision is not None else await self.current_revision() + 1
        watch = _EtcdWatch(self, prefix, start)
        await watch.open_stream()
        self._watches.add(watch)
        return watch

    async def _do_close(self) -> None:
        # watches see self.closed and end with MetadataStoreClosedError, as on every backend
        for watch in list(self._watches):
            watch._drop_stream()
        await self._endpoints.close()


class _EtcdWatch(Watch):
    def __init__(self, store: EtcdMetadataStore, prefix: str, start_revision: int) -> None:
        self._store = store
        self.prefix = prefix
        self.start_revision = start_revision
        self._next = start_revision
        self._key = prefix.encode()
        self._range_end = prefix_range_end(self._key)
        self._stream: Any = None
        self._buffer: deque[WatchEvent] = deque()
        self._closed = False

    async def open_stream(self) -> None:
        """Create the etcd watch from ``self._next``; raises if that history is compacted."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._store.config.request_timeout_ms / 1000
        endpoint, channel = await self._store._endpoints.ready_channel(deadline)
        metadata = await self._store._endpoints.credentials.metadata(channel, endpoint)
        stream = rpc.WatchStub(channel).Watch(metadata=metadata)
        create = rpc.WatchCreateRequest(
            key=self._key,
            range_end=self._range_end,
            start_revision=self._next,
            progress_notify=True,
        )
        try:
            await stream.write(rpc.WatchRequest(create_request=create))
            response = await asyncio.wait_for(stream.read(), max(0.1, deadline - loop.time()))
        except grpc.aio.AioRpcError as e:
            stream.cancel()
            error = _map_rpc_error(e, endpoint, f"watch {self.prefix!r}")
            if isinstance(error, _TokenExpiredError):
                self._store._endpoints.credentials.invalidate()  # the next attempt gets a new one
            else:
                self._store._endpoints.rotate(endpoint)
            raise error from None
        except TimeoutError:
            stream.cancel()
            self._store._endpoints.rotate(endpoint)
            raise MetadataUnavailableError(
                f"etcd at {endpoint} did not confirm the watch on {self.prefix!r} in time",
                context={"endpoint": endpoint},
            ) from None
        if response is grpc.aio.EOF:
            stream.cancel()
            raise MetadataUnavailableError(f"etcd at {endpoint} ended the watch stream at once")
        if response.compact_revision:
            stream.cancel()
            raise WatchCompactedError(
                f"cannot watch {self.prefix!r} from revision {self._next}: etcd compacted its"
                f" history up to revision {response.compact_revision}; list again and watch from"
                " the listing's revision",
                context={"revision": self._next, "compacted": response.compact_revision},
            )
        if response.canceled:
            stream.cancel()
            raise MetadataError(
                f"etcd refused the watch on {self.prefix!r}: {response.cancel_reason}"
            )
        self._stream = stream
        self._handle(response)

    def _handle(self, response: Any) -> None:
        for event in response.events:
            kv = event.kv
            revision = int(kv.mod_revision)
            if event.type == rpc.Event.EventType.PUT:
                self._buffer.append(
                    WatchEvent(
                        EventType.PUT, kv.key.decode(), bytes(kv.value), revision, int(kv.lease)
                    )
                )
            else:
                self._buffer.append(WatchEvent(EventType.DELETE, kv.key.decode(), b"", revision))
            self._next = revision + 1
        if not response.events and response.header.revision and not response.created:
            # a progress notification: nothing under the prefix changed up to this revision
            self._next = max(self._next, int(response.header.revision) + 1)

    async def __anext__(self) -> WatchEvent:
        backoff = 0.1
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            if self._store.closed:
                raise MetadataStoreClosedError(
                    f"the metadata store was closed under the watch on {self.prefix!r}"
                )
            if self._stream is None:
                try:
                    await self.open_stream()
                    backoff = 0.1
                except asyncio.CancelledError:
                    if self._ending() and not _cancelled_from_outside():
                        continue
                    raise
                except MetadataUnavailableError:
                    # etcd is down or restarting: keep trying, resuming from the same revision
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                continue
            try:
                response = await self._stream.read()
            except asyncio.CancelledError:
                # the stream, not this task, was cancelled: by close() or by the store closing
                if self._ending() and not _cancelled_from_outside():
                    continue
                raise
            except grpc.aio.AioRpcError as e:
                if self._ending():
                    continue
                log.info(
                    "metadata_watch_interrupted",
                    prefix=self.prefix,
                    resume_revision=self._next,
                    status=e.code().name,
                )
                self._drop_stream()
                continue
            if response is grpc.aio.EOF:
                self._drop_stream()
                continue
            if response.compact_revision:
                self._drop_stream()
                raise WatchCompactedError(
                    f"the watch on {self.prefix!r} fell behind etcd's history (needs revision"
                    f" {self._next}, compacted up to {response.compact_revision})",
                    context={"revision": self._next, "compacted": response.compact_revision},
                )
            if response.canceled:
                # etcd cancels watches on some server-side conditions; re-create from _next
                self._drop_stream()
                continue
            self._handle(response)

    def _ending(self) -> bool:
        return self._closed or self._store.closed

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def close(self) -> None:
        self._closed = True
        self._drop_stream()
