"""The cluster's own record at ``/magnetar/cluster``: its name, and the metadata format it uses.

``magnetar cluster init`` writes it once, create-only, before anything else uses the store. The
create-only write is what makes init safe to repeat and to race: a second init (a Kubernetes Job
run again, two operators at once) finds the first one's record and either agrees with it (same
name: nothing to do) or refuses (another name: this store belongs to another cluster).

Init may start before the store is reachable (a Job scheduled before etcd's pods are ready), so
:func:`initialize_cluster_waiting` keeps trying for a while, saying what it waits for.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    ClusterNameConflictError,
    InvalidArgumentError,
    KeyExistsError,
    MetadataError,
    OperationTimeoutError,
)
from metadata import MetadataStore, layout, open_store
from metadata.config import EtcdSecuritySettings
from proto.format.v1 import cluster_pb2

FORMAT_VERSION = 1
"""The metadata format this version of Magnetar writes."""

CLUSTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_CLUSTER_NAME_RULE = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"

_ATTEMPT_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What ``/magnetar/cluster`` says."""

    cluster_name: str
    format_version: int
    created_ms: int
    """When init wrote it, in ms since the epoch."""

    def to_bytes(self) -> bytes:
        return cluster_pb2.ClusterInfo(
            format_version=self.format_version,
            cluster_name=self.cluster_name,
            created_ms=self.created_ms,
        ).SerializeToString()

    @classmethod
    def from_bytes(cls, data: bytes) -> ClusterInfo:
        message = cluster_pb2.ClusterInfo.FromString(data)
        return cls(message.cluster_name, message.format_version, message.created_ms)


@dataclass(frozen=True, slots=True)
class InitResult:
    info: ClusterInfo
    """The record in the store now."""
    created: bool
    """True if this call wrote it; False if the cluster was already initialised (same name)."""


def check_cluster_name(name: str) -> str:
    """``name`` if it is a valid cluster name, else InvalidArgumentError saying the rule."""
    if not CLUSTER_NAME_PATTERN.fullmatch(name):
        raise InvalidArgumentError(
            f"invalid cluster name {name!r}: it must be {_CLUSTER_NAME_RULE}",
            context={"cluster_name": name},
        )
    return name


async def read_cluster_info(store: MetadataStore) -> ClusterInfo | None:
    """The cluster's record, or None if the cluster is not initialised."""
    record = await store.get(layout.CLUSTER)
    return None if record is None else ClusterInfo.from_bytes(record.value)


async def initialize_cluster(
    store: MetadataStore, cluster_name: str, *, clock: Clock = SYSTEM_CLOCK
) -> InitResult:
    """Write the cluster's record unless it exists; idempotent for the same name.

    Raises InvalidArgumentError for a bad name and ClusterNameConflictError if the store was
    initialised under another name.
    """
    check_cluster_name(cluster_name)
    info = ClusterInfo(cluster_name, FORMAT_VERSION, clock.time_ms())
    while True:
        try:
            await store.create(layout.CLUSTER, info.to_bytes())
        except KeyExistsError:
            existing = await read_cluster_info(store)
            if existing is None:
                continue  # deleted between the two calls: try to create it again
        else:
            return InitResult(info, created=True)
        if existing.cluster_name != cluster_name:
            raise ClusterNameConflictError(
                f"the metadata store {store.description} is already initialised for cluster"
                f" {existing.cluster_name!r}, not {cluster_name!r}: it belongs to another"
                f" cluster. Use --cluster-name {existing.cluster_name} to initialise that"
                " cluster, or point --metadata at this cluster's own store.",
                context={
                    "key": layout.CLUSTER,
                    "cluster_name": existing.cluster_name,
                    "requested": cluster_name,
                },
            )
        return InitResult(existing, created=False)


async def initialize_cluster_waiting(
    url: str,
    cluster_name: str,
    *,
    wait_s: float,
    security: EtcdSecuritySettings | None = None,
    on_wait: Callable[[str], None] = lambda _message: None,
    retry_interval_s: float = 1.0,
    report_interval_s: float = 10.0,
    clock: Clock = SYSTEM_CLOCK,
) -> InitResult:
    """Open the store at ``url`` and :func:`initialize_cluster`, retrying while the store is
    unreachable, for up to ``wait_s`` seconds.

    ``on_wait`` is told what init waits for (the store's last error) at the first failure and
    then every ``report_interval_s``. Errors that waiting cannot cure (a bad URL or
    name, another cluster's name) are raised at once; when ``wait_s`` passes, an
    OperationTimeoutError names the last problem. ``security`` holds etcd's credentials.
    """
    check_cluster_name(cluster_name)  # a bad name fails before any waiting
    start = clock.monotonic()
    deadline = start + wait_s
    last_report = float("-inf")
    while True:
        # bound each attempt by the time left, so that init gives up when it said it would, and
        # by the report interval (opening waits for an unreachable store up to its connect
        # timeout), so that what init waits for is said while it waits
        left_ms = int((deadline - clock.monotonic()) * 1000)
        attempt_ms = max(100, min(_ATTEMPT_TIMEOUT_MS, int(report_interval_s * 1000), left_ms))
        config = dataclasses.replace(
            (security or EtcdSecuritySettings()).store_config(url),
            connect_timeout_ms=attempt_ms,
            request_timeout_ms=attempt_ms,
        )
        try:
            store = await open_store(config, clock=clock)
            try:
                return await initialize_cluster(store, cluster_name, clock=clock)
            finally:
                await store.close()
        except MetadataError as e:
            if not e.retriable:
                raise
            reason = e.message
        now = clock.monotonic()
        if now >= deadline:
            raise OperationTimeoutError(
                f"the metadata store at {url} could not be reached within {wait_s:g} s, so the"
                f" cluster is not initialised (last problem: {reason})",
                context={"url": url, "wait_s": wait_s},
            )
        if now - last_report >= report_interval_s:
            on_wait(
                f"waiting for the metadata store at {url} ({now - start:.0f} s of {wait_s:g} s):"
                f" {reason}"
            )
            last_report = now
        await clock.sleep(min(retry_interval_s, deadline - now))
