"""A bookie's identity: kept in its data directory, matched against the cluster's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bookie.service.registration import IDENTITY_FILE, establish_identity
from magnetar.common.errors import BookieIdentityError
from metadata import MetadataStore, layout, open_store


@pytest.fixture
async def store() -> MetadataStore:
    return await open_store("memory://")


async def test_first_start_creates_an_identity_that_later_starts_keep(
    store: MetadataStore, tmp_path: Path
) -> None:
    first = await establish_identity(store, tmp_path, None)
    assert first.bookie_id.startswith("bookie-")
    assert await store.get(layout.bookie_cookie(first.bookie_id)) is not None
    assert json.loads((tmp_path / IDENTITY_FILE).read_text())["registered"] is True
    assert await establish_identity(store, tmp_path, None) == first
    assert await establish_identity(store, tmp_path, first.bookie_id) == first


async def test_a_wiped_directory_may_not_rejoin_under_its_old_id(
    store: MetadataStore, tmp_path: Path
) -> None:
    await establish_identity(store, tmp_path / "a", "bk-1")
    with pytest.raises(BookieIdentityError, match=r"already a member .* was wiped or replaced"):
        await establish_identity(store, tmp_path / "fresh", "bk-1")


async def test_a_directory_from_another_cluster_is_refused(tmp_path: Path) -> None:
    other = await open_store("memory://")
    await establish_identity(other, tmp_path, "bk-1")
    this_cluster = await open_store("memory://")
    with pytest.raises(
        BookieIdentityError, match="does not know: the directory comes from another"
    ):
        await establish_identity(this_cluster, tmp_path, None)


async def test_another_incarnation_is_refused(store: MetadataStore, tmp_path: Path) -> None:
    await establish_identity(store, tmp_path / "one", "bk-1")
    await store.delete(layout.bookie_cookie("bk-1"))
    await establish_identity(store, tmp_path / "two", "bk-1")  # re-created after decommission
    with pytest.raises(BookieIdentityError, match="another incarnation"):
        await establish_identity(store, tmp_path / "one", None)


async def test_a_mismatched_id_flag_is_named(store: MetadataStore, tmp_path: Path) -> None:
    await establish_identity(store, tmp_path, "bk-1")
    with pytest.raises(BookieIdentityError, match="belongs to bookie bk-1, not bk-2"):
        await establish_identity(store, tmp_path, "bk-2")


async def test_data_without_identity_is_refused(store: MetadataStore, tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "seg-0000000001.log").write_bytes(b"x" * 100)
    with pytest.raises(BookieIdentityError, match="no identity file"):
        await establish_identity(store, tmp_path, None)


async def test_a_crash_between_the_two_writes_finishes_at_the_next_start(
    store: MetadataStore, tmp_path: Path
) -> None:
    identity = await establish_identity(store, tmp_path, "bk-1")
    # as if the process died after writing its identity file, before the cluster record
    await store.delete(layout.bookie_cookie("bk-1"))
    body = json.loads((tmp_path / IDENTITY_FILE).read_text())
    body["registered"] = False
    (tmp_path / IDENTITY_FILE).write_text(json.dumps(body))
    assert await establish_identity(store, tmp_path, None) == identity
    assert await store.get(layout.bookie_cookie("bk-1")) is not None
