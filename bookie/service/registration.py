"""A bookie's identity and its registration in the cluster's metadata.

**Identity.** A bookie is its data, not its address: it may come back on another host or IP and is
still the same bookie, holding the same entries. At first start it gets a bookie id (given, or
generated) and a random instance id, written to ``<data_dir>/BOOKIE`` and to the cluster's record
at ``/magnetar/bookies/cookies/<bookie_id>``. At every later start the two must agree. A bookie
refuses to join, with a message saying what happened and what to do, when:

- its data directory is empty but the cluster knows its id: the directory was wiped or replaced,
  and rejoining would pretend to hold replicas it lost;
- its data directory has an identity the cluster does not know: it comes from another cluster,
  or the metadata was wiped;
- the instance ids differ: the directory belongs to another incarnation of that id;
- the directory has data but no identity file: it is not a bookie's directory, or it is damaged.

**Registration.** While it runs, the bookie publishes its address, state and disk figures at
``/magnetar/bookies/available/<bookie_id>``, bound to its session's lease. So it vanishes from
placement when the process dies, and it is refreshed periodically and on every state change.
When the session is lost the bookie keeps serving and registers again under a new one;
:attr:`Registration.registered` says whether it is in the list now (the process reports it as
readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from bookie.service.bookie import BookieStatus
from magnetar import __version__
from magnetar.common.errors import BookieIdentityError, KeyExistsError, MetadataError
from magnetar.common.files import private_dir, write_private
from metadata import MetadataStore, layout
from metadata.coordination import Session
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2

log = structlog.get_logger("magnetar.bookie.registration")

IDENTITY_FILE = "BOOKIE"
_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Identity:
    bookie_id: str
    instance_id: str


def _read_identity_file(data_dir: Path) -> dict[str, object] | None:
    path = data_dir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BookieIdentityError(
            f"the identity file {path} cannot be read ({e}); it is written aside and renamed,"
            " so it is damaged, not torn",
            context={"path": str(path)},
        ) from e
    if not isinstance(found, dict) or not {"bookie_id", "instance_id"} <= found.keys():
        raise BookieIdentityError(f"the identity file {path} is not a bookie identity")
    return found


def _write_identity_file(data_dir: Path, identity: Identity, *, registered: bool) -> None:
    private_dir(data_dir)
    path = data_dir / IDENTITY_FILE
    tmp = path.with_suffix(".tmp")
    body = {
        "format_version": _FORMAT_VERSION,
        "bookie_id": identity.bookie_id,
        "instance_id": identity.instance_id,
        "registered": registered,
    }
    write_private(tmp, (json.dumps(body, indent=2) + "\n").encode())
    os.replace(tmp, path)
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _has_data(data_dir: Path) -> bool:
    storage = data_dir / "storage"
    if not storage.exists():
        return False
    return any(p.is_file() and p.stat().st_size > 0 for p in storage.iterdir())


def _cookie(identity: Identity) -> bytes:
    return cluster_pb2.BookieRegistration(
        format_version=_FORMAT_VERSION,
        bookie_id=identity.bookie_id,
        instance_id=identity.instance_id,
        version=__version__,
        start_time_ms=int(time.time() * 1000),
    ).SerializeToString()


async def establish_identity(
    store: MetadataStore, data_dir: Path, configured_id: str | None
) -> Identity:
    """Who this bookie is, checked against the cluster; raises BookieIdentityError if it is not."""
    local = _read_identity_file(data_dir)
    if local is None:
        if _has_data(data_dir):
            raise BookieIdentityError(
                f"the data directory {data_dir} holds bookie data but no identity file"
                f" ({IDENTITY_FILE}): it is not this bookie's directory, or it is damaged."
                " Start the bookie on its own data directory, or on an empty one.",
                context={"path": str(data_dir)},
            )
        bookie_id = configured_id or f"bookie-{uuid.uuid4().hex[:12]}"
        known = await store.get(layout.bookie_cookie(bookie_id))
        if known is not None:
            previous = cluster_pb2.BookieRegistration.FromString(known.value)
            raise BookieIdentityError(
                f"bookie {bookie_id} is already a member of this cluster (instance"
                f" {previous.instance_id}), but its data directory {data_dir} is empty: it was"
                " wiped or replaced. A bookie that lost its data must not rejoin under its old"
                " identity, since it would claim replicas it no longer has. Decommission the old"
                f" identity first with 'magnetar cluster decommission-bookie {bookie_id}' (it"
                " waits until autorecovery has re-replicated the bookie's ledgers, then deletes"
                f" its cookie {layout.bookie_cookie(bookie_id)}; this bookie may then start"
                " under that id), or start this bookie with another --bookie-id.",
                context={"bookie": bookie_id, "path": str(data_dir)},
            )
        identity = Identity(bookie_id, uuid.uuid4().hex)
        # local first: a crash between the two writes leaves a directory that finishes
        # registering at its next start
        _write_identity_file(data_dir, identity, registered=False)
        try:
            await store.create(layout.bookie_cookie(bookie_id), _cookie(identity))
        except KeyExistsError:
            raise BookieIdentityError(
                f"another bookie registered the id {bookie_id} at the same moment; start this"
                " one with another --bookie-id",
                context={"bookie": bookie_id},
            ) from None
        _write_identity_file(data_dir, identity, registered=True)
        log.info("bookie_identity_created", bookie=bookie_id, instance=identity.instance_id)
        return identity

    identity = Identity(str(local["bookie_id"]), str(local["instance_id"]))
    if configured_id is not None and configured_id != identity.bookie_id:
        raise BookieIdentityError(
            f"the data directory {data_dir} belongs to bookie {identity.bookie_id}, not"
            f" {configured_id}: start it with --bookie-id {identity.bookie_id} (or without"
            f" --bookie-id), or give bookie {configured_id} its own directory",
            context={"bookie": identity.bookie_id, "path": str(data_dir)},
        )
    known = await store.get(layout.bookie_cookie(identity.bookie_id))
    if known is None:
        if local.get("registered") is False:
            await store.create(layout.bookie_cookie(identity.bookie_id), _cookie(identity))
            _write_identity_file(data_dir, identity, registered=True)
            return identity
        raise BookieIdentityError(
            f"the data directory {data_dir} belongs to bookie {identity.bookie_id}, which this"
            " cluster's metadata does not know: the directory comes from another cluster, or the"
            " metadata was wiped. Start the bookie on an empty data directory to join this"
            " cluster as a new bookie.",
            context={"bookie": identity.bookie_id, "path": str(data_dir)},
        )
    recorded = cluster_pb2.BookieRegistration.FromString(known.value)
    if recorded.instance_id != identity.instance_id:
        raise BookieIdentityError(
            f"the cluster knows bookie {identity.bookie_id} as instance {recorded.instance_id},"
            f" but the data directory {data_dir} is instance {identity.instance_id}: it belongs"
            " to another incarnation of this bookie (or another cluster)",
            context={"bookie": identity.bookie_id, "path": str(data_dir)},
        )
    return identity


def registration_record(
    status: BookieStatus, identity: Identity, http_address: str, data_address: str = ""
) -> bytes:
    state = (
        types_pb2.BOOKIE_STATE_READ_ONLY if status.read_only else types_pb2.BOOKIE_STATE_WRITABLE
    )
    return cluster_pb2.BookieRegistration(
        format_version=_FORMAT_VERSION,
        bookie_id=identity.bookie_id,
        address=status.address,
        http_address=http_address,
        data_address=data_address,
        state=state,
        labels=status.labels,
        total_disk_bytes=status.total_disk_bytes,
        free_disk_bytes=status.free_disk_bytes,
        version=__version__,
        start_time_ms=int(time.time() * 1000),
        instance_id=identity.instance_id,
        ledger_count=status.ledger_count,
    ).SerializeToString()


class Registration:
    """Keeps ``/magnetar/bookies/available/<id>`` current while the bookie runs."""

    def __init__(
        self,
        store: MetadataStore,
        identity: Identity,
        status: Callable[[], BookieStatus],
        *,
        http_address: str,
        data_address: str = "",
        ttl_s: int,
        refresh_s: float,
    ) -> None:
        self.store = store
        self.identity = identity
        self._status = status
        self._http_address = http_address
        self._data_address = data_address
        self._ttl_s = ttl_s
        self._refresh_s = refresh_s
        self._session: Session | None = None
        self._registered_under: Session | None = None
        self._listeners: list[Callable[[], None]] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._register()
        self._task = asyncio.create_task(self._keep_current(), name="bookie-registration")

    def changed(self) -> None:
        """Publish again now (the state or the disk figures changed)."""
        self._changed.set()

    @property
    def registered(self) -> bool:
        """Whether the bookie is in the list of available bookies now: its record was written
        under the current session, and that session is alive."""
        session = self._session
        return session is not None and session.alive and self._registered_under is session

    def on_registered_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (synchronously, in the event loop) whenever :attr:`registered` may
        have changed: the session lost, the record written under a new one, the bookie left."""
        self._listeners.append(listener)

    def _registered_changed(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("registration_listener_failed", bookie=self.identity.bookie_id)

    async def _register(self) -> None:
        if self._session is None or not self._session.alive:
            self._session = await Session.start(
                self.store, ttl_s=self._ttl_s, name=f"bookie:{self.identity.bookie_id}"
            )
            self._session.on_lost(lambda _: self._registered_changed())
        session = self._session
        record = registration_record(
            self._status(), self.identity, self._http_address, self._data_address
        )
        await self.store.put(
            layout.bookie_available(self.identity.bookie_id), record, lease_id=session.lease_id
        )
        if self._registered_under is not session:
            self._registered_under = session
            self._registered_changed()

    async def _keep_current(self) -> None:
        while True:
            lost = asyncio.ensure_future(self._session.lost.wait()) if self._session else None
            changed = asyncio.ensure_future(self._changed.wait())
            waiting = {changed} | ({lost} if lost else set())
            try:
                await asyncio.wait(
                    waiting, timeout=self._refresh_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for future in waiting:
                    future.cancel()
            self._changed.clear()
            try:
                await self._register()
            except MetadataError as e:
                # the bookie keeps serving; it is only missing from placement until this works
                log.warning("bookie_registration_failed", error=str(e))
                await asyncio.sleep(min(self._refresh_s, 1.0))

    async def close(self) -> None:
        """Leave the cluster's list of available bookies now."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()
        self._registered_changed()
