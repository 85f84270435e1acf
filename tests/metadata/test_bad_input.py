"""Bad input gets a clear error naming what was wrong, and harms nothing else, on every backend."""

from __future__ import annotations

import pytest

from magnetar.common.errors import (
    InvalidArgumentError,
    InvalidKeyError,
    InvalidMetadataUrlError,
    MetadataUnavailableError,
    ValueTooLargeError,
)
from magnetar.testing.etcd import EtcdServer, free_port
from metadata import MetadataStore, MetadataStoreConfig, PutOp, open_store

BAD_KEYS = [
    ("", "must start with '/'"),
    ("no-slash", "must start with '/'"),
    ("/a//b", "empty segment"),
    ("/a/", "may not end with '/'"),
    ("/", "root, not a key"),
    ("/a b", "whitespace"),
    ("/a\x00b", "control characters"),
    ("/a/../b", "'.' or '..'"),
    ("/" + "k" * 2000, "at most 1024 bytes"),
]


@pytest.mark.parametrize(("key", "rule"), BAD_KEYS, ids=[r for _, r in BAD_KEYS])
async def test_invalid_keys_are_refused_by_name(
    store: MetadataStore, ns: str, key: str, rule: str
) -> None:
    for attempt in (
        lambda: store.get(key),
        lambda: store.put(key, b"x"),
        lambda: store.create(key, b"x"),
        lambda: store.delete(key),
        lambda: store.txn([], [PutOp(key, b"x")]),
    ):
        with pytest.raises(InvalidKeyError, match="invalid metadata key") as info:
            await attempt()
        assert rule in str(info.value)
    # the store is unharmed
    await store.put(f"{ns}/fine", b"ok")
    record = await store.get(f"{ns}/fine")
    assert record is not None


async def test_invalid_prefixes_and_non_string_keys(store: MetadataStore) -> None:
    with pytest.raises(InvalidKeyError, match="invalid metadata prefix 'x'"):
        await store.list("x")
    with pytest.raises(InvalidKeyError, match="empty segment"):
        await store.watch("/a//")
    with pytest.raises(InvalidKeyError, match="are str, got bytes"):
        await store.get(b"/a")  # type: ignore[arg-type]


async def test_values_must_be_bytes(store: MetadataStore, ns: str) -> None:
    with pytest.raises(InvalidArgumentError, match="values are bytes, got str"):
        await store.put(f"{ns}/a", "text")  # type: ignore[arg-type]
    assert await store.get(f"{ns}/a") is None


async def test_oversized_values_name_the_limit(store: MetadataStore, ns: str) -> None:
    limit = store.config.max_value_bytes
    with pytest.raises(ValueTooLargeError, match=rf"the limit is {limit:,} bytes") as info:
        await store.put(f"{ns}/big", b"x" * (limit + 1))
    assert info.value.context["size"] == str(limit + 1)
    assert await store.get(f"{ns}/big") is None
    await store.put(f"{ns}/at-limit", b"x" * limit)  # exactly the limit is fine
    record = await store.get(f"{ns}/at-limit")
    assert record is not None
    assert len(record.value) == limit


@pytest.mark.etcd
async def test_etcd_own_request_limit_is_reported_as_too_large(
    etcd_server: EtcdServer, ns: str
) -> None:
    # configured above etcd's own 1.5 MiB request limit: etcd refuses, and says so clearly
    config = MetadataStoreConfig(url=etcd_server.url, max_value_bytes=4 * 1024 * 1024)
    store = await open_store(config)
    with pytest.raises(ValueTooLargeError, match=r"refused .* as too large"):
        await store.put(f"{ns}/big", b"x" * (2 * 1024 * 1024))
    await store.put(f"{ns}/after", b"still works")
    await store.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, ns: s.put(f"{ns}/a", b"x", expected_version=0), "positive int"),
        (lambda s, ns: s.put(f"{ns}/a", b"x", expected_version="3"), "positive int"),
        (lambda s, ns: s.delete(f"{ns}/a", expected_version=-1), "positive int"),
        (lambda s, ns: s.grant_lease(0), "whole number of seconds"),
        (lambda s, ns: s.grant_lease(1.5), "whole number of seconds"),
        (lambda s, ns: s.keepalive(0), "'no lease'"),
        (lambda s, ns: s.put(f"{ns}/a", b"x", lease_id=-2), "lease id"),
        (lambda s, ns: s.watch(f"{ns}/", start_revision=0), "positive int"),
        (lambda s, ns: s.txn([], ["not an op"]), "not a PutOp"),
    ],
    ids=[
        "version-0",
        "version-str",
        "delete-version",
        "ttl-0",
        "ttl-float",
        "keepalive-0",
        "lease-negative",
        "watch-revision",
        "txn-op",
    ],
)
async def test_malformed_arguments_are_named(store: MetadataStore, ns: str, call, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        await call(store, ns)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "expected etcd://"),
        ("nonsense", "expected etcd://"),
        ("foo://bar", "unknown metadata URL scheme 'foo'"),
        ("etcd://", "needs at least one endpoint"),
        ("etcd://host:notaport", "invalid etcd endpoint 'host:notaport'"),
        ("etcd://h:99999", "port from 1 to 65535"),
        ("embedded://", "needs a directory"),
    ],
)
async def test_invalid_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidMetadataUrlError, match=says):
        await open_store(url)


async def test_unresolvable_etcd_host_is_named() -> None:
    config = MetadataStoreConfig(url="etcd://no-such-host.invalid:2379", connect_timeout_ms=2000)
    with pytest.raises(MetadataUnavailableError, match=r"no-such-host\.invalid") as info:
        await open_store(config)
    assert "does not resolve" in str(info.value)


async def test_etcd_endpoint_that_does_not_answer_is_named() -> None:
    port = free_port()  # nothing listens here
    config = MetadataStoreConfig(url=f"etcd://127.0.0.1:{port}", connect_timeout_ms=1000)
    with pytest.raises(MetadataUnavailableError, match=f"127.0.0.1:{port}"):
        await open_store(config)


@pytest.mark.etcd
async def test_one_dead_endpoint_among_live_ones_is_fine(etcd_server: EtcdServer, ns: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = await open_store(
        MetadataStoreConfig(url=f"etcd://{dead},{etcd_server.endpoint}", connect_timeout_ms=1000)
    )
    await store.put(f"{ns}/a", b"x")
    assert await store.get(f"{ns}/a") is not None
    await store.close()
