"""Autorecovery: bring every ledger back to Qw copies after a bookie is lost.

One instance at a time is active, elected through the metadata store. It runs inside bookies
started with ``--autorecovery``, or on its own as ``magnetar autorecovery``. The active instance
repeats three steps:

1. **Audit.** Every bookie the cluster knows (``/magnetar/bookies/cookies/``) that has been
   missing from ``/magnetar/bookies/available/`` for longer than ``lost_bookie_grace_s`` is
   lost. Every ledger fragment (segment) that names a lost bookie and whose end is known is
   recorded as under-replicated at ``/magnetar/underreplicated/<ledger>``. A known end means a
   sealed segment, or the last segment of a closed ledger: an open ledger's tail belongs to its
   writer or to the recovery that closes it.
2. **Replicate.** For each recorded ledger and each such fragment, pick a replacement bookie,
   copy every entry of the fragment that the lost bookie held from a surviving replica to the
   replacement (recovery adds: accepted even on a fenced ledger), then swap the bookie in that
   segment with a compare-and-swap on the ledger's metadata.
3. **Clear.** A ledger's record is removed once none of its fragments names a lost bookie.

The records are the progress (``magnetar cluster under-replicated`` lists them), and they are
what makes a restart mid-way safe. A new active instance picks the work up where it stopped;
copies are idempotent, so redoing part of one costs time, not correctness.

``magnetar autorecovery`` (:func:`run_autorecovery`) also serves ``/health`` and ``/metrics``
over HTTP on ``http_port``, from what the instance already knows (:meth:`Autorecovery.health`,
:mod:`bookie.autorecovery_metrics`): a probe or a scrape never reads the metadata store. An
instance a bookie runs inside itself serves nothing of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import structlog

from bookie.autorecovery_metrics import AutorecoveryMetrics
from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_client import LedgerClient
from bookie.client.ledger_metadata import LedgerMetadata, write_set_indexes
from bookie.client.placement import choose_replacement
from bookie.entries import AddEntry, entry_checksum
from magnetar.common.config import config_error
from magnetar.common.errors import (
    BadVersionError,
    InvalidConfigError,
    LedgerError,
    LedgerNotFoundError,
    MagnetarError,
    MetadataError,
    NoSuchKeyError,
    NotEnoughBookiesError,
    SessionLostError,
)
from magnetar.common.security.config import HttpSettings
from magnetar.common.server.serving import run_until_signalled
from magnetar.common.server.status_http import Response, status_server
from metadata import MetadataStore, layout, open_store
from metadata.config import EtcdSecuritySettings
from metadata.coordination import LeaderElection, Session

log = structlog.get_logger("magnetar.autorecovery")

UNDER_REPLICATED = "/magnetar/underreplicated/"
LEADER = "/magnetar/autorecovery/leader"
COPY_BATCH = 256


@dataclass(frozen=True, kw_only=True)
class AutorecoveryConfig(HttpSettings, EtcdSecuritySettings):
    """When a bookie counts as lost, and how often autorecovery looks."""

    metadata: str = "memory://"
    """Metadata URL of the cluster (magnetar autorecovery --metadata)."""

    name: str = "autorecovery"
    """Name of this instance in the election (and in logs)."""

    http_port: int = 8001
    """HTTP port of /metrics and /health of `magnetar autorecovery` (0: any free port)."""

    bind_host: str = "0.0.0.0"  # noqa: S104 - a server listens on every interface by default
    """Address the HTTP server of `magnetar autorecovery` listens on."""

    lost_bookie_grace_s: float = 60.0
    """A bookie missing this long is lost, and its ledgers are re-replicated."""

    check_interval_s: float = 5.0
    """How often the active instance audits and replicates."""

    session_ttl_s: int = 10
    """TTL of the metadata session the active instance holds its election with."""

    ledger: LedgerClientConfig = field(default_factory=LedgerClientConfig)
    """How copies are read and written."""

    def __post_init__(self) -> None:
        self._check_etcd_security()
        self._check_http()
        if not 0 <= self.http_port <= 65535:
            raise config_error("http_port", self.http_port, "must be a port number from 0 to 65535")
        if self.lost_bookie_grace_s < 0:
            raise config_error("lost_bookie_grace_s", self.lost_bookie_grace_s, "must be >= 0")
        if self.check_interval_s <= 0:
            raise config_error("check_interval_s", self.check_interval_s, "must be > 0")


@dataclass(frozen=True, slots=True)
class UnderReplicated:
    """One ledger's record of fragments still short of copies."""

    ledger_id: int
    lost_bookies: tuple[str, ...]
    fragments: int
    since_ms: int

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "ledger": self.ledger_id,
                "lost_bookies": list(self.lost_bookies),
                "fragments": self.fragments,
                "since_ms": self.since_ms,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnderReplicated:
        body = json.loads(data)
        return cls(
            int(body["ledger"]),
            tuple(body["lost_bookies"]),
            int(body["fragments"]),
            int(body["since_ms"]),
        )


def under_replicated_key(ledger_id: int) -> str:
    return f"{UNDER_REPLICATED}{ledger_id:020d}"


async def list_under_replicated(store: MetadataStore) -> list[UnderReplicated]:
    """What autorecovery still has to do (for ``magnetar cluster under-replicated``)."""
    listing = await store.list(UNDER_REPLICATED)
    return [UnderReplicated.from_bytes(r.value) for r in listing.records]


def lost_fragments(metadata: LedgerMetadata, lost: set[str]) -> list[int]:
    """Indexes of the segments that name a lost bookie and whose end is known."""
    found = []
    for index, segment in enumerate(metadata.segments):
        if lost & set(segment.bookies) and metadata.segment_end(index) is not None:
            found.append(index)
    return found


class Autorecovery:
    """One autorecovery instance; active while it leads the election."""

    def __init__(self, store: MetadataStore, config: AutorecoveryConfig) -> None:
        self.store = store
        self.config = config
        self.name = config.name
        self._missing_since: dict[str, float] = {}
        self._client: LedgerClient | None = None
        self._session: Session | None = None
        self._election: LeaderElection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_error: str | None = None
        self.active = asyncio.Event()
        # what /metrics reports (bookie/autorecovery_metrics.py): plain numbers kept as the
        # work happens, so a scrape costs no metadata read
        self.copied_entries = 0
        self.replicated_fragments = 0
        self.replicated_ledgers = 0
        self.replication_failures: Counter[str] = Counter()
        """Ledgers whose replication failed in a pass, by reason (the next pass retries them)."""
        self.interruptions = 0
        self.lost_bookie_count = 0
        self.under_replicated_ledgers = 0
        """Records listed by the last audit, less those this instance has cleared since."""
        self.last_audit_at: float | None = None
        """Wall-clock time (s since the epoch) the last audit completed; None before the first."""

    async def start(self) -> Autorecovery:
        self._client = await LedgerClient.start(
            self.store, self.config.ledger, creator=f"autorecovery:{self.name}"
        )
        self._task = asyncio.create_task(self._run(), name="autorecovery")
        return self

    async def _run(self) -> None:
        while not self._stopping:
            try:
                self._session = await Session.start(
                    self.store, ttl_s=self.config.session_ttl_s, name=self.name
                )
                self._last_error = None
                self._election = LeaderElection(
                    self.store, self._session, LEADER, self.name.encode()
                )
                await self._election.campaign()
                log.info("autorecovery_active", name=self.name)
                self.active.set()
                while self._session.alive and self._election.is_leader and not self._stopping:
                    await self.run_once()
                    await asyncio.sleep(self.config.check_interval_s)
                if not self._stopping:
                    log.warning("autorecovery_leadership_lost", name=self.name)
                    self.interruptions += 1
            except (SessionLostError, MetadataError) as e:
                log.warning("autorecovery_interrupted", error=str(e))
                self._last_error = e.message
                self.interruptions += 1
                await asyncio.sleep(1.0)
            finally:
                self.active.clear()
                if self._session is not None:
                    with contextlib.suppress(MagnetarError):
                        await self._session.close()

    # --- state, for /health ---------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """``(True, "active")`` or ``(True, "standby")`` while the instance runs under a live
        metadata session; otherwise ``(False, why)``. Reads only what the instance holds (no
        metadata request), so a probe may ask as often as it likes."""
        if self._stopping:
            return False, "stopping"
        task = self._task
        if task is None:
            return False, "starting"
        if task.done():
            error = None if task.cancelled() else task.exception()
            return False, f"the autorecovery loop ended: {error!r}"
        session = self._session
        if session is None or not session.alive:
            lost = session.lost_error if session is not None else None
            why = self._last_error or (lost.message if lost is not None else None)
            return False, f"no metadata session: {why or 'connecting to the metadata store'}"
        return True, "active" if self.is_active else "standby"

    @property
    def is_active(self) -> bool:
        """Whether this instance leads the election now and works under a live session."""
        session, election = self._session, self._election
        return (
            self.active.is_set()
            and not self._stopping
            and session is not None
            and session.alive
            and election is not None
            and election.is_leader
        )

    # --- one pass ---------------------------------------------------------------------------------

    async def run_once(self) -> None:
        """Audit, then replicate what is recorded (the active instance's loop body)."""
        available = await self._available()
        lost = await self.lost_bookies(available)
        if lost:
            await self.audit(lost)
        records = await list_under_replicated(self.store)
        self.lost_bookie_count = len(lost)
        self.under_replicated_ledgers = len(records)
        self.last_audit_at = time.time()
        for record in records:
            # what a record names stays lost while it is still away, even if this instance
            # only just started (and so has not yet watched it miss its grace period)
            still_lost = set(record.lost_bookies) - available
            try:
                await self.replicate(record.ledger_id, still_lost)
            except NotEnoughBookiesError as e:
                self.replication_failures["no_replacement"] += 1
                log.warning("autorecovery_no_replacement", ledger=record.ledger_id, error=e.message)
            except LedgerError as e:
                self.replication_failures["ledger_error"] += 1
                log.warning("autorecovery_ledger_failed", ledger=record.ledger_id, error=e.message)

    async def _available(self) -> set[str]:
        listing = await self.store.list(layout.BOOKIES_AVAILABLE)
        return {k.rsplit("/", 1)[1] for k in listing.keys()}  # noqa: SIM118 - Listing.keys()

    async def lost_bookies(self, available: set[str] | None = None) -> set[str]:
        """Known bookies missing for longer than the grace period."""
        cookies = await self.store.list(layout.BOOKIE_COOKIES)
        known = {k.rsplit("/", 1)[1] for k in cookies.keys()}  # noqa: SIM118 - Listing.keys()
        if available is None:
            available = await self._available()
        now = time.monotonic()
        for bookie in known - available:
            self._missing_since.setdefault(bookie, now)
        for bookie in list(self._missing_since):
            if bookie in available or bookie not in known:
                del self._missing_since[bookie]
        return {
            b
            for b, since in self._missing_since.items()
            if now - since >= self.config.lost_bookie_grace_s
        }

    async def audit(self, lost: set[str]) -> int:
        """Record every ledger with a fragment on a lost bookie; returns how many."""
        assert self._client is not None
        recorded = 0
        for ledger_id in await self._client.ledgers.ledger_ids():
            try:
                metadata = await self._client.ledgers.read(ledger_id)
            except LedgerNotFoundError:
                continue
            fragments = lost_fragments(metadata, lost)
            if not fragments:
                continue
            key = under_replicated_key(ledger_id)
            if await self.store.get(key) is None:
                record = UnderReplicated(
                    ledger_id,
                    tuple(sorted(lost & metadata.all_bookies())),
                    len(fragments),
                    int(time.time() * 1000),
                )
                with contextlib.suppress(MetadataError):
                    await self.store.create(key, record.to_bytes())
                    log.info("ledger_under_replicated", ledger=ledger_id, fragments=len(fragments))
            recorded += 1
        return recorded

    async def replicate(self, ledger_id: int, lost: set[str]) -> None:
        """Copy every lost fragment of one ledger, then clear its record."""
        assert self._client is not None
        client = self._client
        copied = False
        while True:
            try:
                metadata = await client.ledgers.read(ledger_id)
            except LedgerNotFoundError:
                await self.store.delete(under_replicated_key(ledger_id))  # deleted meanwhile
                self._cleared()
                return
            fragments = lost_fragments(metadata, lost)
            if not fragments:
                await self.store.delete(under_replicated_key(ledger_id))
                self._cleared()
                if copied:  # not a record cleared because its bookie came back
                    self.replicated_ledgers += 1
                log.info("ledger_replicated", ledger=ledger_id)
                return
            index = fragments[0]
            segment = metadata.segments[index]
            bookies = list(segment.bookies)
            missing = [b for b in bookies if b in lost]
            replacements = {}
            for bookie in missing:
                position = bookies.index(bookie)
                bookies[position] = choose_replacement(
                    client.view.candidates(),
                    bookies,
                    position,
                    metadata.write_quorum,
                    exclude=lost,
                )
                replacements[position] = bookies[position]
            await self._copy(metadata, index, replacements)
            try:
                await client.ledgers.write(metadata.replacing(index, bookies))
            except (BadVersionError, NoSuchKeyError):
                continue  # the ledger changed (closed, or its writer changed ensemble): redo
            self.replicated_fragments += 1
            copied = True
            log.info(
                "fragment_replicated",
                ledger=ledger_id,
                segment=index,
                replaced={segment.bookies[p]: b for p, b in replacements.items()},
            )

    def _cleared(self) -> None:
        self.under_replicated_ledgers = max(0, self.under_replicated_ledgers - 1)

    async def _copy(
        self, metadata: LedgerMetadata, index: int, replacements: dict[int, str]
    ) -> None:
        """Copy the fragment's entries that the replaced positions held to their replacements."""
        assert self._client is not None
        client = self._client
        segment = metadata.segments[index]
        end = metadata.segment_end(index)
        assert end is not None
        e, qw = metadata.ensemble_size, metadata.write_quorum
        for position, target in replacements.items():
            wanted = [
                entry_id
                for entry_id in range(segment.first_entry_id, end + 1)
                if position in write_set_indexes(entry_id, e, qw)
            ]
            for start in range(0, len(wanted), COPY_BATCH):
                batch = wanted[start : start + COPY_BATCH]
                entries = await self._read_from_survivors(metadata, index, position, batch)
                adds = [
                    AddEntry(metadata.ledger_id, entry_id, lac, payload, crc, recovery=True)
                    for entry_id, (lac, payload, crc) in entries.items()
                ]
                failures = await client.pool.client(target).add_entries(adds)
                if failures:
                    raise failures[0].error
                self.copied_entries += len(adds)

    async def _read_from_survivors(
        self, metadata: LedgerMetadata, index: int, lost_position: int, entry_ids: list[int]
    ) -> dict[int, tuple[int, bytes, int]]:
        assert self._client is not None
        segment = metadata.segments[index]
        e, qw = metadata.ensemble_size, metadata.write_quorum
        found: dict[int, tuple[int, bytes, int]] = {}
        survivors = sorted(
            {p for i in entry_ids for p in write_set_indexes(i, e, qw)} - {lost_position}
        )
        for position in survivors:
            wanted = [
                i for i in entry_ids if i not in found and position in write_set_indexes(i, e, qw)
            ]
            if not wanted:
                continue
            try:
                result = await self._client.pool.client(segment.bookies[position]).read_entries(
                    metadata.ledger_id, wanted[0], wanted[-1], entry_ids=wanted, max_bytes=1 << 30
                )
            except MagnetarError:
                continue
            for entry in result.entries:
                if (
                    entry_checksum(
                        metadata.ledger_id, entry.entry_id, entry.last_add_confirmed, entry.payload
                    )
                    == entry.crc32c
                ):
                    found[entry.entry_id] = (entry.last_add_confirmed, entry.payload, entry.crc32c)
        absent = [i for i in entry_ids if i not in found]
        if absent:
            raise LedgerError(
                f"entries {absent[:5]} of ledger {metadata.ledger_id} (segment {index}) are on no"
                " surviving replica: they cannot be re-replicated",
                context={"ledger": metadata.ledger_id, "entries": len(absent)},
            )
        return found

    async def close(self) -> None:
        """Stop; if this instance was active, another one takes over."""
        self._stopping = True
        if self._task is not None:
            # a cancellation that lands just as an inner wait_for finishes is lost on Python
            # 3.11, so cancel until the task has really ended (the flag ends its loops anyway)
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                self._task.result()
        if self._client is not None:
            await self._client.close()


class AutorecoveryProcess:
    """``magnetar autorecovery``: one instance, and /health and /metrics over HTTP.

    Create with :meth:`start`, end with :meth:`stop`. The HTTP server listens before the
    instance starts, so a taken port fails the start before it joins the election.
    """

    def __init__(
        self, config: AutorecoveryConfig, store: MetadataStore, *, owns_store: bool
    ) -> None:
        self.config = config
        self.store = store
        self._owns_store = owns_store
        self.instance = Autorecovery(store, config)
        self.metrics = AutorecoveryMetrics(self.instance)
        self._http = status_server(
            config,
            config.bind_host,
            config.http_port,
            {"/metrics": self._metrics, "/health": self._health_check},
            component="autorecovery",
        )
        self.http_port = 0

    @classmethod
    async def start(
        cls, config: AutorecoveryConfig, *, store: MetadataStore | None = None
    ) -> AutorecoveryProcess:
        """Open the metadata store (unless ``store`` is given, which it then does not close),
        listen on ``http_port``, start the instance."""
        if store is None:
            store = await open_store(config.store_config(config.metadata))
            self = cls(config, store, owns_store=True)
        else:
            self = cls(config, store, owns_store=False)
        try:
            try:
                self.http_port = await self._http.start()
            except OSError as e:
                raise InvalidConfigError(
                    f"cannot listen on {config.bind_host}:{config.http_port} for /metrics and"
                    f" /health: {e.strerror or e}; stop the other process or choose another"
                    " --http-port",
                    context={"address": f"{config.bind_host}:{config.http_port}"},
                ) from None
            await self.instance.start()
        except BaseException:
            await self.instance.close()
            await self._http.stop()
            await self._close_store()
            raise
        log.info("autorecovery_started", name=config.name, http_port=self.http_port)
        return self

    @property
    def http_host(self) -> str:
        """Where to reach the HTTP server: the bind address, or this machine's name."""
        host = self.config.bind_host
        return socket.gethostname() if host in ("", "0.0.0.0", "::") else host  # noqa: S104

    def _metrics(self) -> Response:
        return Response(200, self.metrics.render(), "text/plain; version=0.0.4")

    def _health_check(self) -> Response:
        ok, state = self.instance.health()
        return (
            Response(200, f"ok {state}\n".encode()) if ok else Response(503, f"{state}\n".encode())
        )

    async def stop(self) -> None:
        """Leave the election (another instance takes over), then stop serving."""
        await self.instance.close()
        await self._http.stop()
        await self._close_store()
        log.info("autorecovery_stopped", name=self.config.name)

    async def _close_store(self) -> None:
        if self._owns_store:
            await self.store.close()


async def run_autorecovery(config: AutorecoveryConfig) -> int:
    """Run an autorecovery instance until SIGTERM or SIGINT (``magnetar autorecovery``)."""
    return await run_until_signalled(
        lambda: AutorecoveryProcess.start(config),
        lambda p: (
            f"autorecovery {config.name} running"
            f" (metrics: {p._http.scheme}://{p.http_host}:{p.http_port}/metrics)"
        ),
        lambda p: p.stop(),
    )
