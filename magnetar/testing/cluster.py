"""A Magnetar cluster of real OS processes for tests: etcd, bookies and brokers.

This module owns starting ``magnetar bookie`` and ``magnetar broker`` processes, knowing when
each is ready (its one stdout line), where its log goes, the faults tests inject into it
(graceful stop, SIGKILL, restart, SIGSTOP/SIGCONT), and waiting until the metadata store shows
the servers registered or gone. :class:`ServerNode` is what both kinds share;
:class:`BookieNode` is one bookie process (on a data dir fixed for its life),
:class:`BrokerNode` one broker process (stateless: it only has a log). :class:`LocalCluster` is
an etcd (its own, or a shared one it is handed) with a set of bookies and brokers.

Typical use in a test::

    async with LocalCluster(tmp_path, bookies=3, brokers=2, zones=["a", "b"]) as cluster:
        victim = cluster.bookies[0]
        await victim.kill()  # SIGKILL: its registration lingers until its session expires
        await victim.restart()  # same data dir, so the same bookie id; likely a new port
        await cluster.wait_registered([victim.bookie_id])
        await cluster.add_bookie()  # bookie-3

        client_url = cluster.service_url  # "magnetar://127.0.0.1:p1,127.0.0.1:p2"
        broker = cluster.brokers[0]
        await broker.kill()  # its partitions move once its session expires
        await cluster.wait_broker_unregistered("broker-0")
        await broker.restart()  # the same broker id (the cluster names its brokers)
        await cluster.add_broker(extra_args=["--load-shedding-interval-ms", "2000"])

Several clusters may share one etcd in a session: pass its URL as ``metadata_url`` and a
``bookie_id_prefix`` and ``broker_id_prefix`` of the test's own, so that ids never clash.

Each server's stderr (JSON logs) goes to a log file (``<data_dir>.log`` for a bookie,
``root/broker-<i>.log`` for a cluster's broker), never to the test's output; a failed start
quotes the log's last lines. The processes are polled (``Popen``), not watched by an asyncio
child watcher, so one object can be started in a session-scoped fixture's event loop and killed
from a test's. A process a test forgets is SIGKILLed when its node object is garbage-collected
or the interpreter exits.
"""

from __future__ import annotations

import abc
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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self, TypeVar

from magnetar.testing._processes import KILL_WAIT_S, kill_quietly, wait_exit, wait_state
from magnetar.testing.etcd import HOST, EtcdCluster, EtcdServer
from metadata import MetadataStore, layout, open_store
from proto.format.v1 import cluster_pb2

__all__ = ["BookieNode", "BrokerNode", "LocalCluster", "ServerNode", "StandaloneNode"]

_Node = TypeVar("_Node", bound="ServerNode")

_POLL_INTERVAL_S = 0.02
_REGISTRATION_POLL_INTERVAL_S = 0.1
_DRAIN_WAIT_S = 2.0
_LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16_000
# Logging stays configurable from the outside; every other MAGNETAR_* variable is a config
# field, and a developer's own (say MAGNETAR_BOOKIE_ID) must not reach test servers.
_INHERITED_MAGNETAR_VARIABLES = frozenset({"MAGNETAR_LOG_LEVEL", "MAGNETAR_LOG_FORMAT"})

_RegistryReader = Callable[[MetadataStore], Awaitable[dict[str, str]]]
"""Reads one kind of registration: id -> address (bookies) or service URL (brokers)."""


def _ready_line_pattern(kind: str) -> re.Pattern[str]:
    """What ``magnetar <kind>`` prints to stdout, once, when it serves and is registered."""
    return re.compile(
        rf"^{kind} (?P<node_id>\S+) serving on (?P<address>\S+) "
        r"\(metrics: http://(?P<http_host>\S+):(?P<http_port>\d+)/metrics\)$"
    )


def _server_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MAGNETAR_") or key in _INHERITED_MAGNETAR_VARIABLES
    }
    return {**inherited, "GRPC_VERBOSITY": "ERROR", **(env or {})}


class _StdoutReader:
    """Drains a server's stdout on a daemon thread, so the child never blocks on a full pipe.

    A thread rather than the event loop: the process may outlive the loop that started it. The
    ready line is kept; any other output is appended to the server's log. Holds no reference
    to the node, so the node can still be garbage-collected.
    """

    def __init__(
        self, stream: IO[bytes], log_path: Path, name: str, ready_line: re.Pattern[str]
    ) -> None:
        self._stream = stream
        self._log_path = log_path
        self._ready_line = ready_line
        self.ready: re.Match[str] | None = None
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-stdout", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._stream:
                for raw in self._stream:
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    match = self._ready_line.match(line) if self.ready is None else None
                    if match is not None:
                        self.ready = match
                        continue
                    with contextlib.suppress(OSError), self._log_path.open("ab") as log:
                        log.write(b"stdout: " + raw if raw.endswith(b"\n") else raw + b"\n")
        except (OSError, ValueError):
            pass  # the pipe went away; there is nothing left to drain
        finally:
            self.finished.set()


class ServerNode(abc.ABC):
    """One ``magnetar <kind>`` server OS process on 127.0.0.1: what bookies and brokers share.

    The process listens on port 0 for gRPC and HTTP, and prints one ready line
    (``<kind> <id> serving on <host:port> (metrics: http://<host>:<port>/metrics)``) once it
    serves and is registered; :meth:`start` waits for that line. Each :meth:`start` is a new
    incarnation, usually on new ports.
    """

    _kind: ClassVar[str]
    """The ``magnetar`` subcommand, which is also the first word of the ready line."""
    _ready_line: ClassVar[re.Pattern[str]]
    _stop_timeout_s: ClassVar[float]
    """How long :meth:`stop` waits after SIGTERM, by default, before it SIGKILLs."""

    def __init__(
        self,
        metadata_url: str,
        *,
        node_id: str | None,
        log_path: Path,
        extra_args: Sequence[str],
        env: Mapping[str, str] | None,
    ) -> None:
        self._metadata_url = metadata_url
        self._configured_id = node_id
        self._node_id = node_id
        self._log_path = log_path
        self._extra_args = tuple(extra_args)
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: _StdoutReader | None = None
        self._reaper: weakref.finalize[..., ServerNode] | None = None
        self._paused = False
        self._address: str | None = None
        self._http_port: int | None = None
        self._exit_code: int | None = None
        self._log_offset = 0

    @property
    def node_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

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
    def exit_code(self) -> int | None:
        """How the last incarnation ended: its exit status, or ``-signal`` (``-9`` after a
        SIGKILL, also when :meth:`stop` had to send one). None while it runs and before the
        first start."""
        if self._proc is not None:
            return self._proc.poll()
        return self._exit_code

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def metadata_url(self) -> str:
        return self._metadata_url

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, timeout_s: float = 60) -> None:
        """Start the process and wait for its ready line (it serves and is registered by then).

        Raises RuntimeError, quoting the last lines of its log, if the process exits first, and
        TimeoutError (after killing it) if no ready line comes within ``timeout_s``.
        """
        proc, reader = self._spawn()
        try:
            ready = await self._wait_ready(proc, reader, timeout_s)
        except BaseException:
            await self.kill()
            raise
        self._on_ready(ready)

    def _on_ready(self, ready: re.Match[str]) -> None:
        """Keep what the ready line says about this incarnation."""
        self._node_id = ready["node_id"]
        self._address = ready["address"]
        self._http_port = int(ready["http_port"])

    async def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM (a graceful shutdown: the server deregisters and hands its work over), then
        SIGKILL if it has not exited after ``timeout_s`` (default: the kind's own, generous
        enough for its shutdown). :attr:`exit_code` tells which of the two ended it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            if self._paused:
                # a stopped process only acts on SIGTERM once continued
                proc.send_signal(signal.SIGCONT)
            wait_s = self._stop_timeout_s if timeout_s is None else timeout_s
            if not await wait_exit(proc, wait_s, name=self._describe()):
                proc.kill()
                await wait_exit(proc, KILL_WAIT_S, name=self._describe(), must=True)
        await self._forget_process()

    async def kill(self) -> None:
        """SIGKILL the process (paused or not), a crash, and wait until it has exited.

        The signal is sent before the first await.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            await wait_exit(proc, KILL_WAIT_S, name=self._describe(), must=True)
        await self._forget_process()

    async def restart(self, *, graceful: bool = True, timeout_s: float = 60) -> None:
        """Stop (or with ``graceful=False`` SIGKILL) and start again with the same arguments."""
        if graceful:
            await self.stop()
        else:
            await self.kill()
        await self.start(timeout_s)

    async def pause(self) -> None:
        """SIGSTOP the process: it keeps its sockets and lease but answers nothing until resumed.

        Its registration expires after the session TTL if the pause lasts that long.
        """
        proc = self._require_running("pause")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True
        await wait_state(proc, stopped=True)

    async def resume(self) -> None:
        """SIGCONT a paused process."""
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

    # -- what each kind adds -----------------------------------------------------------------

    @abc.abstractmethod
    def _kind_args(self) -> list[str]:
        """The flags of this kind (data dir, id, zone), before the caller's ``extra_args``."""

    @abc.abstractmethod
    def _unnamed(self) -> str:
        """How to name the process in messages before it has an id."""

    def _prepare(self) -> None:
        """Create what must exist before the process starts."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)

    def _where(self) -> str:
        return str(self._address) if self.is_running else "not running"

    # -- internals ---------------------------------------------------------------------------

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "magnetar.cli", self._kind,
            "--metadata", self._metadata_url,
            "--port", "0",
            "--http-port", "0",
            "--bind-host", HOST,
            "--advertised-host", HOST,
            *self._kind_args(),
            *self._extra_args,
        ]  # fmt: skip

    def _spawn(self) -> tuple[subprocess.Popen[bytes], _StdoutReader]:
        if self.is_running:
            raise RuntimeError(f"{self!r} is already running (pid {self.pid})")
        if self._proc is not None:
            # it died on its own; poll() has reaped it, and its stdout is at EOF
            self._detach_process()
        self._prepare()
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
                env=_server_environment(self._env),
                close_fds=True,
            )
        assert proc.stdout is not None  # stdout=PIPE gives one
        self._proc = proc
        self._paused = False
        self._exit_code = None
        self._reaper = weakref.finalize(self, kill_quietly, proc)
        self._reader = _StdoutReader(
            proc.stdout, self._log_path, self._describe(), self._ready_line
        )
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
        return f"{self._kind} {self._node_id}" if self._node_id else self._unnamed()

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
        if self._proc is not None:
            self._exit_code = self._proc.returncode
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


class BookieNode(ServerNode):
    """One ``magnetar bookie`` OS process on 127.0.0.1, on a data dir fixed for its life.

    The bookie keeps its identity in its data dir, so every :meth:`start` after the first is
    the same bookie, usually on a new port (each incarnation listens on port 0). On SIGTERM
    it deregisters and closes its files; :meth:`stop` waits 30 s for that by default.
    """

    _kind = "bookie"
    _ready_line = _ready_line_pattern("bookie")
    _stop_timeout_s = 30.0

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
        super().__init__(
            metadata_url,
            node_id=bookie_id,
            log_path=log_path or data_dir.with_suffix(".log"),
            extra_args=extra_args,
            env=env,
        )
        self._data_dir = data_dir
        self._zone = zone

    def __repr__(self) -> str:
        return (
            f"BookieNode(bookie_id={self._node_id!r}, {self._where()}, data_dir={self._data_dir})"
        )

    @property
    def bookie_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    def _kind_args(self) -> list[str]:
        args = ["--data-dir", str(self._data_dir)]
        if self._configured_id is not None:
            args += ["--bookie-id", self._configured_id]
        if self._zone is not None:
            args += ["--zone", self._zone]
        return args

    def _unnamed(self) -> str:
        return f"bookie at {self._data_dir}"

    def _prepare(self) -> None:
        self._data_dir.parent.mkdir(parents=True, exist_ok=True)
        super()._prepare()


class BrokerNode(ServerNode):
    """One ``magnetar broker`` OS process on 127.0.0.1.

    A broker keeps nothing on disk: its identity is ``broker_id`` when one is given (then every
    :meth:`start` is the same broker, usually on a new port), else the broker names itself
    ``<host>-<port>`` and each incarnation is a new broker. On SIGTERM it deregisters and hands
    its partitions over to other brokers, which may take a few seconds; :meth:`stop` waits 75 s
    for that by default (the broker's own ``--shutdown-timeout-s`` is 60 s).
    """

    _kind = "broker"
    _ready_line = _ready_line_pattern("broker")
    # the broker's own shutdown_timeout_s (60 s by default) plus its gRPC grace and closing
    _stop_timeout_s = 75.0

    def __init__(
        self,
        metadata_url: str,
        *,
        log_path: Path,
        broker_id: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Describe the broker; nothing runs until :meth:`start`.

        ``broker_id`` is passed as ``--broker-id``. ``extra_args`` follow the harness's own
        flags, so they override them (the last value of a flag wins): any ``BrokerConfig``
        flag, say ``["--session-ttl-s", "2", "--load-shedding-interval-ms", "2000"]``. ``env``
        is added to this process's environment, with ``GRPC_VERBOSITY=ERROR`` and without
        ``MAGNETAR_*`` config variables. The broker's stderr goes to ``log_path``.
        """
        super().__init__(
            metadata_url, node_id=broker_id, log_path=log_path, extra_args=extra_args, env=env
        )

    def __repr__(self) -> str:
        return (
            f"BrokerNode(broker_id={self._node_id!r}, {self._where()}, log_path={self._log_path})"
        )

    @property
    def broker_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

    @property
    def service_url(self) -> str:
        """``"magnetar://127.0.0.1:PORT"`` of the current (or last) incarnation."""
        return f"magnetar://{self.address}"

    def _kind_args(self) -> list[str]:
        if self._configured_id is None:
            return []
        return ["--broker-id", self._configured_id]

    def _unnamed(self) -> str:
        return f"broker logging to {self._log_path}"


class StandaloneNode(ServerNode):
    """One ``magnetar standalone`` OS process on 127.0.0.1: embedded metadata, bookies and a
    broker in one process, all data under ``data_dir`` (kept across :meth:`restart`).

    The light way to test against real Magnetar: ``async with StandaloneNode(tmp_path / "m")
    as node: ... node.service_url``. Kill, pause, resume and restart work as for the other
    nodes. The broker port is ``port`` (default: a free one on every start, so a restart may
    move it; pass a fixed port when clients must find it again).
    """

    _kind = "standalone"
    _ready_line = re.compile(
        r"^magnetar standalone ready in (?P<ready_s>[0-9.]+) s: service URL"
        r" magnetar://(?P<address>\S+) \((?P<bookies>\d+) bookies; metrics:"
        r" http://(?P<http_host>[^:/]+):(?P<http_port>\d+)/metrics; data: (?P<data>.+)\)$"
    )
    _stop_timeout_s = 75.0

    def __init__(
        self,
        data_dir: Path,
        *,
        bookies: int = 3,
        port: int = 0,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            f"embedded://{data_dir}",
            node_id="standalone",
            log_path=log_path or data_dir.with_name(data_dir.name + ".log"),
            extra_args=extra_args,
            env=env,
        )
        self._data_dir = data_dir
        self._bookies = bookies
        self._port = port
        self.ready_s: float | None = None
        """How long the last start took, as the process itself reported it."""

    def __repr__(self) -> str:
        return f"StandaloneNode(data_dir={self._data_dir}, {self._where()})"

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def service_url(self) -> str:
        """``"magnetar://127.0.0.1:PORT"`` of the current (or last) incarnation."""
        return f"magnetar://{self.address}"

    def _on_ready(self, ready: re.Match[str]) -> None:
        self._address = ready["address"]
        self._http_port = int(ready["http_port"])
        self.ready_s = float(ready["ready_s"])

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "magnetar.cli", "standalone",
            "--data-dir", str(self._data_dir),
            "--port", str(self._port),
            "--http-port", "0",
            "--bookies", str(self._bookies),
            "--bind-host", HOST,
            "--advertised-host", HOST,
            *self._extra_args,
        ]  # fmt: skip

    def _kind_args(self) -> list[str]:
        return []

    def _unnamed(self) -> str:
        return f"standalone on {self._data_dir}"


class LocalCluster:
    """An etcd (owned, or shared through ``metadata_url``), ``bookies`` bookie processes and
    ``brokers`` broker processes.

    Bookie ``i`` runs on ``root / f"bookie-{i}"`` as ``f"{bookie_id_prefix}-{i}"``, in zone
    ``zones[i % len(zones)]`` when zones are given. Broker ``i`` runs as
    ``f"{broker_id_prefix}-{i}"`` and logs to ``root / f"broker-{i}.log"``. The node objects
    exist once :meth:`start` has run (an owned etcd's URL is known only then).
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
        brokers: int = 0,
        broker_args: Sequence[str] = (),
        broker_id_prefix: str = "broker",
    ) -> None:
        """Describe the cluster; nothing runs until :meth:`start`.

        Without ``metadata_url`` the cluster starts its own etcd under ``root / "etcd"`` (one
        server, or ``etcd_members`` of them) and stops it with the servers; with one it uses
        that store and leaves it alone. ``bookie_args`` go to every bookie's command line,
        ``broker_args`` to every broker's (say ``["--session-ttl-s", "2"]``).
        """
        if bookies < 0:
            raise ValueError(f"a cluster cannot have {bookies} bookies")
        if brokers < 0:
            raise ValueError(f"a cluster cannot have {brokers} brokers")
        if zones is not None and not zones:
            raise ValueError("zones, when given, must name at least one zone")
        self._root = root
        self._initial_bookies = bookies
        self._zones = tuple(zones) if zones is not None else None
        self._bookie_args = tuple(bookie_args)
        self._bookie_id_prefix = bookie_id_prefix
        self._bookies: list[BookieNode] = []
        self._initial_brokers = brokers
        self._broker_args = tuple(broker_args)
        self._broker_id_prefix = broker_id_prefix
        self._brokers: list[BrokerNode] = []
        self._given_metadata_url = metadata_url
        self._etcd: EtcdServer | EtcdCluster | None = None
        if metadata_url is None:
            if etcd_members == 1:
                self._etcd = EtcdServer(data_dir=root / "etcd", name="etcd0")
            else:
                self._etcd = EtcdCluster(data_dir=root / "etcd", size=etcd_members)

    def __repr__(self) -> str:
        return (
            f"LocalCluster(root={self._root}, bookies={[b.bookie_id for b in self._bookies]}, "
            f"brokers={[b.broker_id for b in self._brokers]})"
        )

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
    def brokers(self) -> list[BrokerNode]:
        """The broker nodes, in index order (a new list; the nodes are shared)."""
        return list(self._brokers)

    @property
    def service_url(self) -> str:
        """What a client connects to: ``"magnetar://h1:p1,h2:p2"``, the brokers running now.

        A paused broker is left out (it would only make clients time out). Computed at each
        call, so read it again after a broker restarts on a new port. RuntimeError if no
        broker runs.
        """
        addresses = [
            node.address for node in self._brokers if node.is_running and not node.is_paused
        ]
        if not addresses:
            raise RuntimeError(f"{self!r} has no running broker, so no service URL")
        return "magnetar://" + ",".join(addresses)

    @property
    def etcd(self) -> EtcdServer | EtcdCluster | None:
        """The etcd this cluster started and owns, or None when it was handed a URL."""
        return self._etcd

    @property
    def root(self) -> Path:
        return self._root

    async def start(self, timeout_s: float = 60) -> None:
        """Start etcd, then every bookie not running (in parallel) and wait until all are
        registered, then every broker not running likewise.

        On failure every process of the cluster is killed and the first error is raised.
        """
        try:
            if self._etcd is not None:
                await self._etcd.start()
            while len(self._bookies) < self._initial_bookies:
                self._bookies.append(self._new_bookie())
            await self._start_nodes(self._bookies, timeout_s)
            await self.wait_registered(timeout_s=timeout_s)
            while len(self._brokers) < self._initial_brokers:
                self._brokers.append(self._new_broker())
            await self._start_nodes(self._brokers, timeout_s)
            await self.wait_brokers_registered(timeout_s=timeout_s)
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
        self._require_started("bookies")
        node = self._new_bookie(
            bookie_id=bookie_id, zone=zone, log_path=log_path, extra_args=extra_args, env=env
        )
        self._bookies.append(node)
        await node.start(timeout_s)
        await self.wait_registered([self._id_of(node)], timeout_s=timeout_s)
        return node

    async def add_broker(
        self,
        *,
        broker_id: str | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60,
    ) -> BrokerNode:
        """Start one more broker (next index; id, log and args as for the others unless given)
        and wait until it is registered. ``extra_args`` follow the cluster's ``broker_args``."""
        self._require_started("brokers")
        node = self._new_broker(
            broker_id=broker_id, log_path=log_path, extra_args=extra_args, env=env
        )
        self._brokers.append(node)
        await node.start(timeout_s)
        await self.wait_brokers_registered([self._id_of(node)], timeout_s=timeout_s)
        return node

    async def wait_registered(
        self, bookie_ids: Iterable[str] | None = None, timeout_s: float = 30
    ) -> None:
        """Wait until those bookies (default: every running one) are in the available list.

        For a running bookie of this cluster the record must carry its current address, so a
        registration a killed incarnation left behind does not count.
        """
        await self._wait_present(
            self._bookies,
            bookie_ids,
            kind="bookies",
            published=lambda node: node.address,
            read=self._read_bookies,
            timeout_s=timeout_s,
        )

    async def wait_unregistered(self, bookie_id: str, timeout_s: float = 30) -> None:
        """Wait until ``bookie_id`` is gone from the available list (stopped, or session expired:
        about the bookies' ``session_ttl_s`` after a SIGKILL)."""
        await self._poll(
            self._read_bookies,
            lambda found: {bookie_id} & found.keys(),
            "bookies",
            "unregistered",
            timeout_s,
        )

    async def wait_brokers_registered(
        self, broker_ids: Iterable[str] | None = None, timeout_s: float = 30
    ) -> None:
        """Wait until those brokers (default: every running one) are under ``/magnetar/brokers/``.

        For a running broker of this cluster the record must carry its current service URL, so
        a registration a killed incarnation left behind does not count.
        """
        await self._wait_present(
            self._brokers,
            broker_ids,
            kind="brokers",
            published=lambda node: node.service_url,
            read=self._read_brokers,
            timeout_s=timeout_s,
        )

    async def wait_broker_unregistered(self, broker_id: str, timeout_s: float = 30) -> None:
        """Wait until ``broker_id`` is gone from ``/magnetar/brokers/`` (stopped, or session
        expired: about the broker's ``session_ttl_s`` after a SIGKILL or a long pause)."""
        await self._poll(
            self._read_brokers,
            lambda found: {broker_id} & found.keys(),
            "brokers",
            "unregistered",
            timeout_s,
        )

    async def available_bookies(self) -> dict[str, str]:
        """The bookie ids in ``/magnetar/bookies/available/`` with the address each published."""
        return await self._read_once(self._read_bookies)

    async def registered_brokers(self) -> dict[str, str]:
        """The broker ids in ``/magnetar/brokers/`` with the service URL each published."""
        return await self._read_once(self._read_brokers)

    async def stop(self) -> None:
        """SIGTERM every broker (they hand their partitions over), then every bookie (they
        deregister), then stop the owned etcd.

        Everything stays configured: :meth:`start` brings the same cluster back.
        """
        try:
            await self._gather_all(node.stop() for node in self._brokers)
        finally:
            try:
                await self._gather_all(node.stop() for node in self._bookies)
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

    def _new_bookie(
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

    def _new_broker(
        self,
        *,
        broker_id: str | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> BrokerNode:
        index = len(self._brokers)
        return BrokerNode(
            self.metadata_url,
            broker_id=broker_id or f"{self._broker_id_prefix}-{index}",
            log_path=log_path or self._root / f"broker-{index}.log",
            extra_args=(*self._broker_args, *extra_args),
            env=env,
        )

    @staticmethod
    def _id_of(node: ServerNode) -> str:
        assert node.node_id is not None  # a started node knows its id
        return node.node_id

    def _require_started(self, what: str) -> None:
        if self._etcd is not None and not self._etcd_running():
            raise RuntimeError(f"{self!r}: start the cluster before adding {what}")

    def _etcd_running(self) -> bool:
        if isinstance(self._etcd, EtcdCluster):
            return any(member.is_running for member in self._etcd.members)
        return self._etcd is not None and self._etcd.is_running

    @staticmethod
    async def _start_nodes(nodes: Sequence[ServerNode], timeout_s: float) -> None:
        # every start runs to its end (success or its own cleanup) before one error is raised
        results = await asyncio.gather(
            *(node.start(timeout_s) for node in nodes if not node.is_running),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    @staticmethod
    async def _gather_all(stops: Iterable[Awaitable[None]]) -> None:
        """Await every stop to its end, then raise the first error, if any."""
        for result in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _kill_all(self) -> None:
        try:
            await self._gather_all(node.kill() for node in [*self._brokers, *self._bookies])
        finally:
            if self._etcd is not None:
                await self._etcd.stop()

    @staticmethod
    async def _read_bookies(store: MetadataStore) -> dict[str, str]:
        listing = await store.list(layout.BOOKIES_AVAILABLE)
        found: dict[str, str] = {}
        for record in listing.records:
            registration = cluster_pb2.BookieRegistration.FromString(record.value)
            found[record.key.removeprefix(layout.BOOKIES_AVAILABLE)] = registration.address
        return found

    @staticmethod
    async def _read_brokers(store: MetadataStore) -> dict[str, str]:
        listing = await store.list(layout.BROKERS)
        found: dict[str, str] = {}
        for record in listing.records:
            registration = cluster_pb2.BrokerRegistration.FromString(record.value)
            found[record.key.removeprefix(layout.BROKERS)] = registration.service_url
        return found

    async def _read_once(self, read: _RegistryReader) -> dict[str, str]:
        store = await open_store(self.metadata_url)
        try:
            return await read(store)
        finally:
            await store.close()

    async def _wait_present(
        self,
        nodes: Sequence[_Node],
        ids: Iterable[str] | None,
        *,
        kind: str,
        published: Callable[[_Node], str],
        read: _RegistryReader,
        timeout_s: float,
    ) -> None:
        """Wait until ``ids`` (default: every running node) are registered, each running node
        of this cluster with what its current incarnation publishes."""
        running = {self._id_of(node): published(node) for node in nodes if node.is_running}
        wanted = set(running) if ids is None else set(ids)

        def missing(found: dict[str, str]) -> set[str]:
            return {
                node_id
                for node_id in wanted
                if found.get(node_id) is None
                or (node_id in running and found[node_id] != running[node_id])
            }

        await self._poll(read, missing, kind, "registered", timeout_s)

    async def _poll(
        self,
        read: _RegistryReader,
        missing: Callable[[dict[str, str]], set[str]],
        kind: str,
        what: str,
        timeout_s: float,
    ) -> None:
        # A store of this call's own: the caller's event loop may differ from call to call.
        store = await open_store(self.metadata_url)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                found = await read(store)
                not_yet = missing(found)
                if not not_yet:
                    return
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{kind} {sorted(not_yet)} were not {what} within {timeout_s}s; "
                        f"registered now (id: address): {found}"
                    )
                await asyncio.sleep(_REGISTRATION_POLL_INTERVAL_S)
        finally:
            await store.close()
