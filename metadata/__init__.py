"""Magnetar's metadata: one async store API, three backends, and coordination helpers on top.

Open a store from a metadata URL::

    store = await metadata.open_store("etcd://10.0.0.1:2379,10.0.0.2:2379")
    store = await metadata.open_store("embedded:///var/lib/magnetar/metadata")
    store = await metadata.open_store("memory://")

The API is in :mod:`metadata.api`; sessions, locks, leader election and id allocation are in
:mod:`metadata.coordination` and work on any backend.
"""

from __future__ import annotations

from pathlib import Path

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import InvalidMetadataUrlError
from metadata.api import (
    ABSENT,
    NO_LEASE,
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
)
from metadata.config import MetadataStoreConfig

__all__ = [
    "ABSENT",
    "NO_LEASE",
    "Compare",
    "DeleteOp",
    "EventType",
    "Lease",
    "Listing",
    "MetadataStore",
    "MetadataStoreConfig",
    "PutOp",
    "Record",
    "TxnOp",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "open_store",
]

_URL_FORMS = "etcd://host:2379[,host2:2379...], embedded:///path/to/dir, or memory://"


async def open_store(
    url_or_config: str | MetadataStoreConfig, *, clock: Clock = SYSTEM_CLOCK
) -> MetadataStore:
    """Open the store a metadata URL names; raises InvalidMetadataUrlError for a bad URL."""
    if isinstance(url_or_config, MetadataStoreConfig):
        config = url_or_config
    else:
        config = MetadataStoreConfig(url=url_or_config)
    url = config.url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidMetadataUrlError(
            f"invalid metadata URL {url!r}: expected {_URL_FORMS}", context={"url": url}
        )
    scheme = scheme.lower()
    if scheme == "memory":
        from metadata.memory import MemoryMetadataStore  # noqa: PLC0415 - load backends lazily

        return MemoryMetadataStore(config, clock=clock)
    if scheme == "embedded":
        if not rest:
            raise InvalidMetadataUrlError(
                f"invalid metadata URL {url!r}: an embedded store needs a directory,"
                " as in embedded:///var/lib/magnetar/metadata",
                context={"url": url},
            )
        from metadata.embedded import EmbeddedMetadataStore  # noqa: PLC0415

        return await EmbeddedMetadataStore.open(Path(rest), config, clock=clock)
    if scheme == "etcd":
        from metadata.etcd import EtcdMetadataStore, parse_endpoints  # noqa: PLC0415

        return await EtcdMetadataStore.open(parse_endpoints(rest.rstrip("/")), config)
    raise InvalidMetadataUrlError(
        f"unknown metadata URL scheme {scheme!r} in {url!r}: expected {_URL_FORMS}",
        context={"url": url},
    )
