"""A Magnetar cluster of real OS processes for tests: etcd, and bookies (brokers will follow).

This module owns starting ``magnetar bookie`` processes, knowing when each is ready (its one
stdout line), where its log goes, the faults tests inject into it (graceful stop, SIGKILL,
restart on the same data dir, SIGSTOP/SIGCONT), and waiting until the metadata store shows the
bookies registered or gone. :class:`BookieNode` is one bookie process; :class:`LocalCluster` is
an etcd (its own, or a shared one it is handed) with a set of bookies.

Typical use in a test::

    async with LocalCluster(tmp_path, bookies=3, zones=["a", "b"]) as cluster:
        victim = cluster.bookies[0]
        await victim.kill()  # SIGKILL: its registration lingers until its session expires
        await victim.restart()  # same data dir, so the same bookie id; likely a new port
        await cluster.wait_registered([victim.bookie_id])
        await cluster.add_bookie()  # bookie-3

Several clusters may share one etcd in a session: pass its URL as ``metadata_url`` and a
``bookie_id_prefix`` of the test's own, so that bookie ids never clash.

Each bookie's stderr (JSON logs) goes to ``<data_dir>.log``, never to the test's output; a
failed start quotes the log's last lines. The processes are polled (``Popen``), not watched by
an asyncio child watcher, so one object can be started in a session-scoped fixture's event loop
and killed from a test's. A process a test forgets is SIGKILLed when its :class:`BookieNode` is
garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from magnetar.testing._processes import KILL_WAIT_S, kill_quietly, wait_exit, wait_state
from magnetar.testing.etcd import HOST, EtcdCluster, EtcdServer
from metadata import MetadataStore, layout, open_store
from proto.format.v1 import cluster_pb2

__all__ = ["BookieNode", "LocalCluster"]

_READY_LINE = re.compile(
    r"^bookie (?P<bookie_id>\S+) serving on (?P<address>\S+) "
    r"\(metrics: http://(?P<http_host>\S+):(?P<http_port>\d+)/metrics\)$"
)
"""What ``magnetar bookie`` prints to stdout, once, when it serves and is registered."""
_POLL_INTERVAL_S = 0.02
_REGISTRATION_POLL_INTERVAL_S = 0.1
_DRAIN_WAIT_S = 2.0
_LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16_000
# Logging stays configurable from the outside; every other MAGNETAR_* variable is a config
# field, and a developer's own (say MAGNETAR_BOOKIE_ID) must not reach test bookies.
_INHERITED_MAGNETAR_VARIABLES = frozenset({"MAGNETAR_LOG_LEVEL", "MAGNETAR_LOG_FORMAT"})


def _bookie_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MAGNETAR_") or key in _INHERITED_MAGNETAR_VARIABLES
    }
    return {**inherited, "GRPC_VERBOSITY": "ERROR", **(env or {})}


class _StdoutReader:
    """Drains a bookie's stdout on a daemon thread, so the child never blocks on a full pipe.

    A thread rather than the event loop: the process may outlive the loop that started it. The
    ready line is kept; any other output is appended to the bookie's log. Holds no reference
    to the :class:`BookieNode`, so the node can still be garbage-collected.
    """

    def __init__(self, stream: IO[bytes], log_path: Path, name: str) -> None:
        self._stream = stream
        self._log_path = log_path
        self.ready: re.Match[str] | None = None
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-stdout", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._stream:
                for raw in self._stream:
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    match = _READY_LINE.match(line) if self.ready is None else None
                    if match is not None:
                        self.ready = match
                        continue
                    with contextlib.suppress(OSError), self._log_path.open("ab") as log:
                        log.write(b"stdout: " + raw if raw.endswith(b"\n") else raw + b"\n")
        except (OSError, ValueError):
            pass  # the pipe went away; there is nothing left to drain
        finally:
            self.finished.set()


class BookieNode:
    """One ``magnetar bookie`` OS process on 127.0.0.1, on a data dir fixed for its life.

    The bookie keeps its identity in its data dir, so every :meth:`start` after the first is
    the same bookie, usually on a new port (each incarnation listens on port 0).
    """

    def __init__(
        self,
        data_dir: Path,
        metadata_url: str,
        *,
        bookie_id: str | None = None,
        zone: str | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Describe the bookie; nothing runs until :meth:`start`.

        ``bookie_id`` is passed as ``--bookie-id``; without it the bookie picks one at its first
        start. ``extra_args`` follow the harness's own flags, so they override them (the last
        value of a flag wins). ``env`` is added to this process's environment, with
        ``GRPC_VERBOSITY=ERROR`` and without ``MAGNETAR_*`` config variables.
        ``log_path`` defaults to ``data_dir.with_suffix(".log")``.
        """
        self._data_dir = data_dir
        self._metadata_url = metadata_url
        self._configured_id = bookie_id
        self._bookie_id = bookie_id
        self._zone = zone
        self._log_path = log_path or data_dir.with_suffix(".log")
        self._extra_args = tuple(extra_args)
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: _StdoutReader | None = None
        self._reaper: weakref.finalize[..., BookieNode] | None = None
        self._paused = False
        self._address: str | None = None
        self._http_port: int | None = None
        self._log_offset = 0

    def __repr__(self) -> str:
        where = self._address if self.is_running else "not running"
        return f"BookieNode(bookie_id={self._bookie_id!r}, {where}, data_dir={self._data_dir})"

    @property
    def bookie_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._bookie_id

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"`` of the gRPC service of the current (or last) incarnation."""
        if self._address is None:
            raise RuntimeError(f"{self!r} has not been started, so it has no address yet")
        return self._address

    @property
    def http_port(self) -> int:
        """Port of ``/metrics`` and ``/health`` of the current (or last) incarnation."""
        if self._http_port is None:
            raise RuntimeError(f"{self!r} has not been started, so it has no HTTP port yet")
        return self._http_port

    @property
    def pid(self) -> int | None:
        """The process id while the process runs (paused or not), else None."""
        return self._proc.pid if self.is_running and self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """True from :meth:`start` until the process exits (a paused process is running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def metadata_url(self) -> str:
        return self._metadata_url

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, timeout_s: float = 60) -> None:
        """Start the bookie and wait for its ready line (it serves and is registered by then).

        Raises RuntimeError, quoting the last lines of its log, if the process exits first, and
        TimeoutError (after killing it) if no ready line comes within ``timeout_s``.
        """
        proc, reader = self._spawn()
        try:
            ready = await self._wait_ready(proc, reader, timeout_s)
        except BaseException:
            await self.kill()
            raise
        self._bookie_id = ready["bookie_id"]
        self._address = ready["address"]
        self._http_port = int(ready["http_port"])

    async def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (the bookie deregisters and closes its files), SIGKILL after ``timeout_s``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            if self._paused:
                # a stopped process only acts on SIGTERM once continued
                proc.send_signal(signal.SIGCONT)
            if not await wait_exit(proc, timeout_s, name=self._describe()):
                proc.kill()
                await wait_exit(proc, KILL_WAIT_S, name=self._describe(), must=True)
        await self._forget_process()

    async def kill(self) -> None:
        """SIGKILL the bookie (paused or not), a crash, and wait until it has exited."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            await wait_exit(proc, KILL_WAIT_S, name=self._describe(), must=True)
        await self._forget_process()

    async def restart(self, *, graceful: bool = True, timeout_s: float = 60) -> None:
        """Stop (or with ``graceful=False`` SIGKILL) and start again on the same data dir."""
        if graceful:
            await self.stop()
        else:
            await self.kill()
        await self.start(timeout_s)

    async def pause(self) -> None:
        """SIGSTOP the bookie: it keeps its sockets and lease but answers nothing until resumed.

        Its registration expires after the session TTL if the pause lasts that long.
        """
        proc = self._require_running("pause")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True
        await wait_state(proc, stopped=True)

    async def resume(self) -> None:
        """SIGCONT a paused bookie."""
        proc = self._require_running("resume")
        proc.send_signal(signal.SIGCONT)
        self._paused = False
        await wait_state(proc, stopped=False)

    async def aclose(self) -> None:
        await self.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _command(self) -> list[str]:
        command = [
            sys.executable, "-m", "magnetar.cli", "bookie",
            "--data-dir", str(self._data_dir),
            "--metadata", self._metadata_url,
            "--port", "0",
            "--http-port", "0",
            "--bind-host", HOST,
            "--advertised-host", HOST,
        ]  # fmt: skip
        if self._configured_id is not None:
            command += ["--bookie-id", self._configured_id]
        if self._zone is not None:
            command += ["--zone", self._zone]
        return command + list(self._extra_args)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], _StdoutReader]:
        if self.is_running:
            raise RuntimeError(f"{self!r} is already running (pid {self.pid})")
        if self._proc is not None:
            # it died on its own; poll() has reaped it, and its stdout is at EOF
            self._detach_process()
        self._data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self._command()
        with self._log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"--- magnetar harness: {' '.join(command)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=_bookie_environment(self._env),
                close_fds=True,
            )
        assert proc.stdout is not None  # stdout=PIPE gives one
        self._proc = proc
        self._paused = False
        self._reaper = weakref.finalize(self, kill_quietly, proc)
        self._reader = _StdoutReader(proc.stdout, self._log_path, self._describe())
        return proc, self._reader

    async def _wait_ready(
        self, proc: subprocess.Popen[bytes], reader: _StdoutReader, timeout_s: float
    ) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while (ready := reader.ready) is None:
            if proc.poll() is not None:
                # its stdout may still hold output for the log
                await self._wait_drained(reader)
                raise RuntimeError(
                    f"{self._describe()} exited with code {proc.returncode} before it was "
                    f"ready; last lines of {self._log_path}:\n{self._log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self._describe()} (pid {proc.pid}) printed no ready line within "
                    f"{timeout_s}s; last lines of {self._log_path}:\n{self._log_tail()}"
                )
            await asyncio.sleep(_POLL_INTERVAL_S)
        return ready

    def _describe(self) -> str:
        return f"bookie {self._bookie_id}" if self._bookie_id else f"bookie at {self._data_dir}"

    def _require_running(self, action: str) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"cannot {action} {self._describe()}: it is not running")
        return proc

    async def _forget_process(self) -> None:
        """After the process exited: let the reader finish the log, drop the process."""
        if self._reader is not None:
            await self._wait_drained(self._reader)
        self._detach_process()

    def _detach_process(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
        self._reaper = None
        self._proc = None
        self._reader = None
        self._paused = False

    @staticmethod
    async def _wait_drained(reader: _StdoutReader) -> None:
        await asyncio.to_thread(reader.finished.wait, _DRAIN_WAIT_S)

    def _log_tail(self) -> str:
        """The last lines this incarnation wrote to the log."""
        try:
            with self._log_path.open("rb") as log:
                log.seek(max(self._log_offset, log.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                text = log.read().decode(errors="replace")
        except OSError as error:
            return f"(cannot read the log: {error})"
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


class LocalCluster:
    """An etcd (owned, or shared through ``metadata_url``) and ``bookies`` bookie processes.

    Bookie ``i`` runs on ``root / f"bookie-{i}"`` as ``f"{bookie_id_prefix}-{i}"``, in zone
    ``zones[i % len(zones)]`` when zones are given. The :class:`BookieNode` objects exist once
    :meth:`start` has run (an owned etcd's URL is known only then).
    """

    def __init__(
        self,
        root: Path,
        *,
        bookies: int = 3,
        metadata_url: str | None = None,
        etcd_members: int = 1,
        zones: Sequence[str] | None = None,
        bookie_args: Sequence[str] = (),
        bookie_id_prefix: str = "bookie",
    ) -> None:
        """Describe the cluster; nothing runs until :meth:`start`.

        Without ``metadata_url`` the cluster starts its own etcd under ``root / "etcd"`` (one
        server, or ``etcd_members`` of them) and stops it with the bookies; with one it uses
        that store and leaves it alone. ``bookie_args`` go to every bookie's command line.
        """
        if bookies < 0:
            raise ValueError(f"a cluster cannot have {bookies} bookies")
        if zones is not None and not zones:
            raise ValueError("zones, when given, must name at least one zone")
        self._root = root
        self._initial_bookies = bookies
        self._zones = tuple(zones) if zones is not None else None
        self._bookie_args = tuple(bookie_args)
        self._bookie_id_prefix = bookie_id_prefix
        self._bookies: list[BookieNode] = []
        self._given_metadata_url = metadata_url
        self._etcd: EtcdServer | EtcdCluster | None = None
        if metadata_url is None:
            if etcd_members == 1:
                self._etcd = EtcdServer(data_dir=root / "etcd", name="etcd0")
            else:
                self._etcd = EtcdCluster(data_dir=root / "etcd", size=etcd_members)

    def __repr__(self) -> str:
        return f"LocalCluster(root={self._root}, bookies={[b.bookie_id for b in self._bookies]})"

    @property
    def metadata_url(self) -> str:
        """The metadata URL every process of the cluster uses."""
        if self._given_metadata_url is not None:
            return self._given_metadata_url
        assert self._etcd is not None  # one of the two is always set
        return self._etcd.url

    @property
    def bookies(self) -> list[BookieNode]:
        """The bookie nodes, in index order (a new list; the nodes are shared)."""
        return list(self._bookies)

    @property
    def etcd(self) -> EtcdServer | EtcdCluster | None:
        """The etcd this cluster started and owns, or None when it was handed a URL."""
        return self._etcd

    @property
    def root(self) -> Path:
        return self._root

    async def start(self, timeout_s: float = 60) -> None:
        """Start etcd, then every bookie not running (in parallel); wait until all registered.

        On failure every process of the cluster is killed and the first error is raised.
        """
        try:
            if self._etcd is not None:
                await self._etcd.start()
            while len(self._bookies) < self._initial_bookies:
                self._bookies.append(self._new_node())
            await self._start_bookies(timeout_s)
            await self.wait_registered(timeout_s=timeout_s)
        except BaseException:
            await self._kill_all()
            raise

    async def add_bookie(
        self,
        *,
        bookie_id: str | None = None,
        zone: str | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60,
    ) -> BookieNode:
        """Start one more bookie (next index; id, zone and args as for the others unless given)
        and wait until it is registered. ``extra_args`` follow the cluster's ``bookie_args``."""
        if self._etcd is not None and not self._etcd_running():
            raise RuntimeError(f"{self!r}: start the cluster before adding bookies")
        node = self._new_node(
            bookie_id=bookie_id, zone=zone, log_path=log_path, extra_args=extra_args, env=env
        )
        self._bookies.append(node)
        await node.start(timeout_s)
        await self.wait_registered([self._id_of(node)], timeout_s=timeout_s)
        return node

    async def wait_registered(
        self, bookie_ids: Iterable[str] | None = None, timeout_s: float = 30
    ) -> None:
        """Wait until those bookies (default: every running one) are in the available list.

        For a running bookie of this cluster the record must carry its current address, so a
        registration a killed incarnation left behind does not count.
        """
        running = {self._id_of(node): node for node in self._bookies if node.is_running}
        wanted = set(running) if bookie_ids is None else set(bookie_ids)

        def missing(found: dict[str, str]) -> set[str]:
            return {
                bookie_id
                for bookie_id in wanted
                if found.get(bookie_id) is None
                or (bookie_id in running and found[bookie_id] != running[bookie_id].address)
            }

        await self._poll_available(missing, "registered", timeout_s)

    async def wait_unregistered(self, bookie_id: str, timeout_s: float = 30) -> None:
        """Wait until ``bookie_id`` is gone from the available list (stopped, or session expired:
        about the bookies' ``session_ttl_s`` after a SIGKILL)."""
        await self._poll_available(
            lambda found: {bookie_id} & found.keys(), "unregistered", timeout_s
        )

    async def available_bookies(self) -> dict[str, str]:
        """The bookie ids in ``/magnetar/bookies/available/`` with the address each published."""
        store = await open_store(self.metadata_url)
        try:
            return await self._read_available(store)
        finally:
            await store.close()

    async def stop(self) -> None:
        """SIGTERM every bookie (they deregister), then stop the owned etcd.

        Everything stays configured: :meth:`start` brings the same cluster back.
        """
        try:
            await asyncio.gather(*(node.stop() for node in self._bookies))
        finally:
            if self._etcd is not None:
                await self._etcd.stop()

    async def aclose(self) -> None:
        """Stop for good. The data under ``root`` is left for the test to inspect."""
        await self.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _new_node(
        self,
        *,
        bookie_id: str | None = None,
        zone: str | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> BookieNode:
        index = len(self._bookies)
        if zone is None and self._zones is not None:
            zone = self._zones[index % len(self._zones)]
        return BookieNode(
            self._root / f"bookie-{index}",
            self.metadata_url,
            bookie_id=bookie_id or f"{self._bookie_id_prefix}-{index}",
            zone=zone,
            log_path=log_path,
            extra_args=(*self._bookie_args, *extra_args),
            env=env,
        )

    @staticmethod
    def _id_of(node: BookieNode) -> str:
        assert node.bookie_id is not None  # a started node knows its id
        return node.bookie_id

    def _etcd_running(self) -> bool:
        if isinstance(self._etcd, EtcdCluster):
            return any(member.is_running for member in self._etcd.members)
        return self._etcd is not None and self._etcd.is_running

    async def _start_bookies(self, timeout_s: float) -> None:
        # every start runs to its end (success or its own cleanup) before one error is raised
        results = await asyncio.gather(
            *(node.start(timeout_s) for node in self._bookies if not node.is_running),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _kill_all(self) -> None:
        try:
            await asyncio.gather(*(node.kill() for node in self._bookies))
        finally:
            if self._etcd is not None:
                await self._etcd.stop()

    @staticmethod
    async def _read_available(store: MetadataStore) -> dict[str, str]:
        listing = await store.list(layout.BOOKIES_AVAILABLE)
        found: dict[str, str] = {}
        for record in listing.records:
            registration = cluster_pb2.BookieRegistration.FromString(record.value)
            found[record.key.removeprefix(layout.BOOKIES_AVAILABLE)] = registration.address
        return found

    async def _poll_available(
        self,
        missing: Callable[[dict[str, str]], set[str]],
        what: str,
        timeout_s: float,
    ) -> None:
        # A store of this call's own: the caller's event loop may differ from call to call.
        store = await open_store(self.metadata_url)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                found = await self._read_available(store)
                not_yet = missing(found)
                if not not_yet:
                    return
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"bookies {sorted(not_yet)} were not {what} within {timeout_s}s; "
                        f"available now (id: address): {found}"
                    )
                await asyncio.sleep(_REGISTRATION_POLL_INTERVAL_S)
        finally:
            await store.close()
