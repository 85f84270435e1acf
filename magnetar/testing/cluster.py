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
        await broker.kill()  # another broker finds its port closed and ends its session
        await cluster.wait_broker_unregistered("broker-0")
        await broker.restart()  # the same broker id (the cluster names its brokers)
        await cluster.add_broker(extra_args=["--load-shedding-interval-ms", "2000"])

Fault tests that need more than processes dying get two more kinds of fault (both need root):

    async with LocalCluster(
        tmp_path, bookies=3, brokers=1, isolated_brokers=1, fixed_broker_ports=True,
        bookie_tmpfs_mb=64,
    ) as cluster:
        host = cluster.isolated_host  # the last broker runs in a network namespace of its own
        await host.cut("etcd")  # ... cut off from etcd; also "bookies" and "clients"
        await host.heal("etcd")
        cluster.bookies[0].fill_disk()  # its tmpfs is full: the bookie turns read-only
        cluster.bookies[0].free_disk()

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
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar, TypeVar

from magnetar.testing._processes import AsyncLifecycle, ManagedProcess
from magnetar.testing.etcd import HOST, EtcdCluster, EtcdServer, EtcdTls, free_port
from magnetar.testing.netns import LINKS, IsolatedHost, netns_unsupported_reason
from metadata import MetadataStore, layout, open_store
from metadata.config import EtcdSecuritySettings
from proto.format.v1 import cluster_pb2

__all__ = ["BookieNode", "BrokerNode", "LocalCluster", "ServerNode", "StandaloneNode", "Tmpfs"]

_Node = TypeVar("_Node", bound="ServerNode")

_POLL_INTERVAL_S = 0.02
_REGISTRATION_POLL_INTERVAL_S = 0.1
_DRAIN_WAIT_S = 2.0
_LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16_000
# Logging stays configurable from the outside; every other MAGNETAR_* variable is a config
# field, and a developer's own (say MAGNETAR_BOOKIE_ID) must not reach test servers.
_INHERITED_MAGNETAR_VARIABLES = frozenset({"MAGNETAR_LOG_LEVEL", "MAGNETAR_LOG_FORMAT"})


@dataclasses.dataclass(frozen=True)
class _Registry:
    """Where one kind of server registers, and what each registration publishes (a bookie its
    address, a broker its service URL)."""

    kind: str
    prefix: str
    published: Callable[[bytes], str]
    skip_empty: bool = False
    """Leave out a registration that published nothing (say, no TLS URL)."""

    async def read(self, store: MetadataStore) -> dict[str, str]:
        """id -> what it published, for every registration under :attr:`prefix`."""
        listing = await store.list(self.prefix)
        found = {
            record.key.removeprefix(self.prefix): self.published(record.value)
            for record in listing.records
        }
        return {k: v for k, v in found.items() if v} if self.skip_empty else found


_BOOKIES = _Registry(
    "bookies",
    layout.BOOKIES_AVAILABLE,
    lambda value: cluster_pb2.BookieRegistration.FromString(value).address,
)
_BROKERS = _Registry(
    "brokers",
    layout.BROKERS,
    lambda value: cluster_pb2.BrokerRegistration.FromString(value).service_url,
)


def _ready_line_pattern(kind: str) -> re.Pattern[str]:
    """What ``magnetar <kind>`` prints to stdout, once, when it serves and is registered."""
    return re.compile(
        rf"^{kind} (?P<node_id>\S+) serving on (?P<address>\S+?)"
        r"(?:, TLS on (?P<tls_address>\S+?))?(?:, data on (?P<data_address>\S+?))?"
        r"(?:, Pulsar on (?P<pulsar_address>\S+?))?"
        r"(?:, Pulsar TLS on (?P<pulsar_tls_address>\S+?))?"
        r" \(metrics: https?://(?P<http_host>\S+):(?P<http_port>\d+)/metrics\)$"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Network:
    """Where a server of a :class:`LocalCluster` listens, and how it reaches etcd."""

    bind_host: str
    advertised_host: str
    metadata_url: str
    command_prefix: tuple[str, ...] = ()


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


class ServerNode(ManagedProcess):
    """One ``magnetar <kind>`` server OS process: what bookies and brokers share.

    The process listens on ``bind_host`` (127.0.0.1 unless told otherwise) and advertises
    ``advertised_host``; its gRPC port is ``port`` (0: a free one), its HTTP port a free one.
    It prints one ready line (``<kind> <id> serving on <host:port> (metrics:
    http://<host>:<port>/metrics)``; a bookie adds ``, data on <host:port>``, its data protocol)
    once it serves and is registered; :meth:`start` waits for that line. Each :meth:`start` is a
    new incarnation, on new ports unless ``port`` is fixed.
    ``command_prefix`` goes before the command, say ``["ip", "netns", "exec", NAME]`` to run it
    in another network namespace; the prefix must exec the server (as ``ip netns exec`` does),
    so that signals reach the server itself.
    """

    _kind: ClassVar[str]
    """The ``magnetar`` subcommand, which is also the first word of the ready line."""
    _ready_line: ClassVar[re.Pattern[str]]
    _log_tail_lines = _LOG_TAIL_LINES
    _log_tail_bytes = _LOG_TAIL_BYTES

    def __init__(
        self,
        metadata_url: str,
        *,
        node_id: str | None,
        log_path: Path,
        extra_args: Sequence[str],
        env: Mapping[str, str] | None,
        bind_host: str = HOST,
        advertised_host: str = HOST,
        port: int = 0,
        command_prefix: Sequence[str] = (),
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0 (a free one) or a port number, got {port}")
        super().__init__(log_path)
        self._metadata_url = metadata_url
        self._bind_host = bind_host
        self._advertised_host = advertised_host
        self._port = port
        self._command_prefix = tuple(command_prefix)
        self._configured_id = node_id
        self._node_id = node_id
        self._extra_args = tuple(extra_args)
        self._env = dict(env) if env is not None else None
        self._reader: _StdoutReader | None = None
        self._address: str | None = None
        self.tls_address: str | None = None
        """host:port of the TLS listener, when the server has one besides its plaintext one."""
        self._data_address: str | None = None
        self.pulsar_address: str | None = None
        """host:port of a broker's listener for Pulsar's binary protocol."""
        self.pulsar_tls_address: str | None = None
        """host:port of a broker's TLS listener for Pulsar's binary protocol (TLS on)."""
        self._http_host: str | None = None
        self._http_port: int | None = None

    @property
    def node_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

    @property
    def address(self) -> str:
        """``"HOST:PORT"`` of the gRPC service of the current (or last) incarnation, as the
        server advertises it (``"127.0.0.1:PORT"`` by default)."""
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
    def http_address(self) -> str:
        """``"HOST:PORT"`` of ``/metrics`` and ``/health`` of the current (or last) incarnation."""
        return f"{self._http_host or HOST}:{self.http_port}"

    @property
    def port(self) -> int:
        """The gRPC port every incarnation binds, or 0 when each takes a free one."""
        return self._port

    @property
    def command_prefix(self) -> tuple[str, ...]:
        return self._command_prefix

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
        self.tls_address = ready.groupdict().get("tls_address")
        self._data_address = ready.groupdict().get("data_address")
        self.pulsar_address = ready.groupdict().get("pulsar_address")
        self.pulsar_tls_address = ready.groupdict().get("pulsar_tls_address")
        self._http_host = ready["http_host"]
        self._http_port = int(ready["http_port"])

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

    def __repr__(self) -> str:
        # BookieNode(bookie_id='bookie-0', 127.0.0.1:PORT, data_dir=...)
        return (
            f"{type(self).__name__}({self._kind}_id={self._node_id!r}, {self._where()},"
            f" {self._repr_detail()})"
        )

    def _repr_detail(self) -> str:
        """What names this node besides its id and address (its data dir, its log)."""
        return f"log_path={self._log_path}"

    # -- internals ---------------------------------------------------------------------------

    def _command(self) -> list[str]:
        return [
            *self._command_prefix,
            sys.executable, "-m", "magnetar.cli", self._kind,
            "--metadata", self._metadata_url,
            "--port", str(self._port),
            "--http-port", "0",
            "--bind-host", self._bind_host,
            "--advertised-host", self._advertised_host,
            *self._kind_args(),
            *self._extra_args,
        ]  # fmt: skip

    def _set_network(self, network: _Network) -> None:
        """Where the next incarnation listens and finds its metadata (a re-created network)."""
        self._bind_host = network.bind_host
        self._advertised_host = network.advertised_host
        self._metadata_url = network.metadata_url
        self._command_prefix = network.command_prefix

    def _spawn(self) -> tuple[subprocess.Popen[bytes], _StdoutReader]:
        if self._proc is not None and not self.is_running:
            self._detach_process()  # it died on its own; its stdout is at EOF
        self._prepare()
        proc = self._popen(self._command(), env=_server_environment(self._env), stdout_to_log=False)
        assert proc.stdout is not None  # stdout=PIPE gives one
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

    async def _forget_process(self) -> None:
        """After the process exited: let the reader finish the log, drop the process."""
        if self._reader is not None:
            await self._wait_drained(self._reader)
        self._detach_process()

    def _detach_process(self) -> None:
        super()._detach_process()
        self._reader = None

    @staticmethod
    async def _wait_drained(reader: _StdoutReader) -> None:
        await asyncio.to_thread(reader.finished.wait, _DRAIN_WAIT_S)


def _unmount_quietly(mount_point: Path) -> None:
    """Finalizer: unmount a tmpfs a test left mounted (lazily if something still uses it)."""
    if os.path.ismount(mount_point):
        result = subprocess.run(["umount", str(mount_point)], capture_output=True, check=False)
        if result.returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def tmpfs_unsupported_reason() -> str | None:
    """None when this process can mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a small file system needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    probe = Path(tempfile.mkdtemp(prefix="magnetar-tmpfs-probe-"))
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            return f"mount -t tmpfs failed: {mounted.stderr.strip()}"
        subprocess.run(["umount", str(probe)], check=False)
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


class Tmpfs:
    """A tmpfs of ``size_mb`` MiB mounted at ``mount_point``: a small disk of its own that a
    test can fill (root only).

    :meth:`mount` and :meth:`unmount` are idempotent; a mount a test forgets is unmounted when
    this object is garbage-collected or the interpreter exits. What is on it is gone once it is
    unmounted.
    """

    FILLER_NAME = "filler"
    """The file :meth:`fill` grows, at the top of the file system."""

    def __init__(self, mount_point: Path, size_mb: int) -> None:
        if size_mb < 1:
            raise ValueError(f"a tmpfs needs at least 1 MiB, got size_mb={size_mb}")
        self._mount_point = mount_point
        self._size_mb = size_mb
        self._unmounter: weakref.finalize[..., Tmpfs] | None = None

    def __repr__(self) -> str:
        state = "mounted" if self.is_mounted else "not mounted"
        return f"Tmpfs({self._mount_point}, {self._size_mb} MiB, {state})"

    @property
    def mount_point(self) -> Path:
        return self._mount_point

    @property
    def size_bytes(self) -> int:
        return self._size_mb * 1024 * 1024

    @property
    def is_mounted(self) -> bool:
        return os.path.ismount(self._mount_point)

    @property
    def filler_path(self) -> Path:
        return self._mount_point / self.FILLER_NAME

    @property
    def filled(self) -> bool:
        """Whether :meth:`fill` left a filler file (not yet removed by :meth:`free`)."""
        return self.filler_path.exists()

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer can still put on the file system."""
        stat = os.statvfs(self._mount_point)
        return stat.f_bavail * stat.f_frsize

    def mount(self) -> None:
        """Mount it (an empty file system) unless it is mounted already."""
        if self.is_mounted:
            return
        if os.geteuid() != 0:
            raise RuntimeError(
                f"mounting a tmpfs at {self._mount_point} needs root; this process runs as "
                f"uid {os.geteuid()}"
            )
        self._mount_point.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self._size_mb}m,mode=0755",
             "magnetar-test", str(self._mount_point)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"cannot mount a {self._size_mb} MiB tmpfs at {self._mount_point}: "
                f"{result.stderr.strip()}"
            )
        self._unmounter = weakref.finalize(self, _unmount_quietly, self._mount_point)

    def unmount(self) -> None:
        """Unmount it (lazily, if a process still has files open on it). Idempotent."""
        if self._unmounter is not None:
            self._unmounter()
            self._unmounter = None
        else:
            _unmount_quietly(self._mount_point)

    def fill(self, leave_bytes: int = 1 << 20) -> int:
        """Grow :attr:`filler_path` until at most ``leave_bytes`` stay free (to within a page);
        returns how many bytes it grew by (0 if no more than that was free already)."""
        if leave_bytes < 0:
            raise ValueError(f"leave_bytes must be >= 0, got {leave_bytes}")
        if not self.is_mounted:
            raise RuntimeError(f"{self!r}: mount it before filling it")
        with self.filler_path.open("ab") as filler:
            start = filler.seek(0, os.SEEK_END)
            size = start
            page = os.statvfs(self._mount_point).f_frsize
            # others (the bookie) may write at the same time, so measure again each round
            for _ in range(100):
                excess = self.free_bytes() - leave_bytes
                if excess < page:
                    break
                with contextlib.suppress(OSError):  # ENOSPC: someone took some; measure again
                    os.posix_fallocate(filler.fileno(), size, excess - excess % page)
                size = os.fstat(filler.fileno()).st_size
        return size - start

    def free(self) -> None:
        """Remove what :meth:`fill` wrote."""
        self.filler_path.unlink(missing_ok=True)


class BookieNode(ServerNode):
    """One ``magnetar bookie`` OS process, on a data dir fixed for its life.

    The bookie keeps its identity in its data dir, so every :meth:`start` after the first is
    the same bookie, usually on a new port (each incarnation listens on port 0). On SIGTERM
    it deregisters and closes its files; :meth:`stop` waits 30 s for that by default.

    It listens on and advertises ``host`` (127.0.0.1 by default). Given a :class:`Tmpfs` that
    holds ``data_dir``, the data lives on that small file system of its own (mounted at the
    first start and kept across restarts, so a killed bookie comes back with its data), and
    :meth:`fill_disk` makes the disk full.
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
        host: str = HOST,
        tmpfs: Tmpfs | None = None,
    ) -> None:
        """Describe the bookie; nothing runs until :meth:`start`.

        ``bookie_id`` is passed as ``--bookie-id``; without it the bookie picks one at its first
        start. ``extra_args`` follow the harness's own flags, so they override them (the last
        value of a flag wins). ``env`` is added to this process's environment, with
        ``GRPC_VERBOSITY=ERROR`` and without ``MAGNETAR_*`` config variables.
        ``log_path`` defaults to ``data_dir.with_suffix(".log")``. ``host`` is the address it
        binds and advertises. ``tmpfs``, when given, must hold ``data_dir`` (say
        ``Tmpfs(root / "b.fs", 64)`` with ``data_dir=root / "b.fs" / "data"``; keep the log
        elsewhere); the caller unmounts it (or :meth:`aclose` does).
        """
        if tmpfs is not None and not data_dir.is_relative_to(tmpfs.mount_point):
            raise ValueError(f"data_dir {data_dir} is not on the tmpfs at {tmpfs.mount_point}")
        super().__init__(
            metadata_url,
            node_id=bookie_id,
            log_path=log_path or data_dir.with_suffix(".log"),
            extra_args=extra_args,
            env=env,
            bind_host=host,
            advertised_host=host,
        )
        self._data_dir = data_dir
        self._zone = zone
        self._tmpfs = tmpfs

    def _repr_detail(self) -> str:
        return f"data_dir={self._data_dir}"

    @property
    def bookie_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

    @property
    def data_address(self) -> str:
        """``"HOST:PORT"`` of the framed data protocol of the current (or last) incarnation:
        where a :class:`~bookie.client.bookie_client.BookieClient` connects."""
        if self._data_address is None:
            raise RuntimeError(f"{self!r} has not been started, so it has no data address yet")
        return self._data_address

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def tmpfs(self) -> Tmpfs | None:
        """The file system of its own the data dir is on, if it has one."""
        return self._tmpfs

    @property
    def disk_filled(self) -> bool:
        """Whether :meth:`fill_disk` filled its disk and :meth:`free_disk` has not freed it."""
        return self._tmpfs is not None and self._tmpfs.is_mounted and self._tmpfs.filled

    def fill_disk(self, leave_bytes: int = 1 << 20) -> int:
        """Fill the bookie's own file system with a file beside its data dir until at most
        ``leave_bytes`` stay free; returns the bytes written.

        With the defaults (1 MiB left of tens of MiB) its disk usage passes the bookie's
        ``readonly_disk_usage`` and the bookie turns read-only at its next disk check
        (``--disk-check-interval-s``). RuntimeError if the bookie has no :class:`Tmpfs`.
        """
        return self._require_tmpfs("fill its disk").fill(leave_bytes)

    def free_disk(self) -> None:
        """Remove what :meth:`fill_disk` wrote; the bookie turns writable at its next check."""
        self._require_tmpfs("free its disk").free()

    async def aclose(self) -> None:
        """Stop for good, and unmount its tmpfs, if it has one (its data goes with it)."""
        try:
            await self.stop()
        finally:
            if self._tmpfs is not None:
                self._tmpfs.unmount()

    def _require_tmpfs(self, action: str) -> Tmpfs:
        if self._tmpfs is None:
            raise RuntimeError(
                f"cannot {action}: {self._describe()} has no file system of its own (its data"
                f" dir {self._data_dir} is on the machine's disk, which a test must not fill);"
                " give it a Tmpfs, or use LocalCluster(bookie_tmpfs_mb=N)"
            )
        if not self._tmpfs.is_mounted:
            raise RuntimeError(f"cannot {action}: {self._tmpfs!r} is not mounted (start it first)")
        return self._tmpfs

    def _kind_args(self) -> list[str]:
        args = ["--data-dir", str(self._data_dir), "--data-port", "0"]
        if self._configured_id is not None:
            args += ["--bookie-id", self._configured_id]
        if self._zone is not None:
            args += ["--zone", self._zone]
        return args

    def _unnamed(self) -> str:
        return f"bookie at {self._data_dir}"

    def _prepare(self) -> None:
        if self._tmpfs is not None:
            self._tmpfs.mount()
        self._data_dir.parent.mkdir(parents=True, exist_ok=True)
        super()._prepare()


class _ClientFacingNode(ServerNode):
    """A server that clients connect to (a broker, or a standalone process): its URLs."""

    @property
    def service_url(self) -> str:
        """``"magnetar://HOST:PORT"`` of the current (or last) incarnation."""
        return f"magnetar://{self.address}"

    @property
    def tls_service_url(self) -> str:
        """``"magnetar+ssl://HOST:PORT"`` of its TLS listener (started with ``--tls-cert-file``)."""
        if self.tls_address is None:
            raise RuntimeError(f"{self!r} has no TLS listener (start it with --tls-cert-file)")
        return f"magnetar+ssl://{self.tls_address}"

    @property
    def pulsar_url(self) -> str:
        """``"pulsar://HOST:PORT"`` of its listener for Pulsar's protocol, for Pulsar clients."""
        if self.pulsar_address is None:
            raise RuntimeError(f"{self!r} has no Pulsar listener")
        return f"pulsar://{self.pulsar_address}"

    @property
    def pulsar_ssl_url(self) -> str:
        """``"pulsar+ssl://HOST:PORT"`` of its TLS listener for Pulsar's protocol (started with
        ``--tls-cert-file``), for Pulsar clients over TLS."""
        if self.pulsar_tls_address is None:
            raise RuntimeError(
                f"{self!r} has no TLS Pulsar listener (start it with --tls-cert-file)"
            )
        return f"pulsar+ssl://{self.pulsar_tls_address}"


class BrokerNode(_ClientFacingNode):
    """One ``magnetar broker`` OS process (on 127.0.0.1 unless told otherwise).

    A broker keeps nothing on disk: its identity is ``broker_id`` when one is given (then every
    :meth:`start` is the same broker, on a new port unless ``port`` is fixed), else the broker
    names itself ``<host>-<port>`` and each incarnation is a new broker. On SIGTERM it
    deregisters and hands its partitions over to other brokers, which may take a few seconds;
    :meth:`stop` waits 75 s for that by default (the broker's own ``--shutdown-timeout-s`` is
    60 s).
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
        bind_host: str = HOST,
        advertised_host: str = HOST,
        port: int = 0,
        command_prefix: Sequence[str] = (),
    ) -> None:
        """Describe the broker; nothing runs until :meth:`start`.

        ``broker_id`` is passed as ``--broker-id``. ``extra_args`` follow the harness's own
        flags, so they override them (the last value of a flag wins): any ``BrokerConfig``
        flag, say ``["--session-ttl-s", "2", "--load-shedding-interval-ms", "2000"]``. ``env``
        is added to this process's environment, with ``GRPC_VERBOSITY=ERROR`` and without
        ``MAGNETAR_*`` config variables. The broker's stderr goes to ``log_path``.
        ``bind_host``/``advertised_host`` are its ``--bind-host``/``--advertised-host``; a
        ``port`` other than 0 is bound by every incarnation, so a restarted broker keeps its
        address. ``command_prefix`` runs it through, say, ``ip netns exec NAME``.
        """
        super().__init__(
            metadata_url,
            node_id=broker_id,
            log_path=log_path,
            extra_args=extra_args,
            env=env,
            bind_host=bind_host,
            advertised_host=advertised_host,
            port=port,
            command_prefix=command_prefix,
        )

    @property
    def broker_id(self) -> str | None:
        """The id from the ready line; before the first start, the one given (or None)."""
        return self._node_id

    def _kind_args(self) -> list[str]:
        # the TLS port is used only when TLS is on (--tls-cert-file in extra_args)
        named = [] if self._configured_id is None else ["--broker-id", self._configured_id]
        return ["--tls-port", "0", "--pulsar-port", "0", "--pulsar-tls-port", "0", *named]

    def _unnamed(self) -> str:
        return f"broker logging to {self._log_path}"


class StandaloneNode(_ClientFacingNode):
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
        r" (?:magnetar://(?P<address>[^\s,]+))?(?:, )?(?:magnetar\+ssl://(?P<tls_address>\S+))?"
        r" \((?:pulsar://(?P<pulsar_address>[^\s;]+); )?"
        r"(?:pulsar\+ssl://(?P<pulsar_tls_address>[^\s;]+); )?(?P<bookies>\d+) bookies; metrics:"
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

    def _on_ready(self, ready: re.Match[str]) -> None:
        self.tls_address = ready["tls_address"]
        self.pulsar_address = ready["pulsar_address"]
        self.pulsar_tls_address = ready["pulsar_tls_address"]
        self._address = ready["address"] or self.tls_address
        self._http_host = ready["http_host"]
        self._http_port = int(ready["http_port"])
        self.ready_s = float(ready["ready_s"])

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "magnetar.cli", "standalone",
            "--data-dir", str(self._data_dir),
            "--port", str(self._port),
            "--tls-port", "0",  # used only when TLS is on (--tls-cert-file in extra_args)
            "--http-port", "0",
            "--pulsar-port", "0",
            "--pulsar-tls-port", "0",  # used only when TLS is on, as --tls-port
            "--bookies", str(self._bookies),
            "--bind-host", HOST,
            "--advertised-host", HOST,
            *self._extra_args,
        ]  # fmt: skip

    def _kind_args(self) -> list[str]:
        return []

    def _unnamed(self) -> str:
        return f"standalone on {self._data_dir}"


class LocalCluster(AsyncLifecycle):
    """An etcd (owned, or shared through ``metadata_url``), ``bookies`` bookie processes and
    ``brokers`` broker processes.

    Bookie ``i`` runs on ``root / f"bookie-{i}"`` as ``f"{bookie_id_prefix}-{i}"``, in zone
    ``zones[i % len(zones)]`` when zones are given. Broker ``i`` runs as
    ``f"{broker_id_prefix}-{i}"`` and logs to ``root / f"broker-{i}.log"``. The node objects
    exist once :meth:`start` has run (an owned etcd's URL is known only then).

    Fault options (each off by default):

    - ``fixed_broker_ports``: every broker binds a port picked once, on every incarnation, so a
      restarted broker keeps its address and :attr:`service_url` stays valid.
    - ``bookie_tmpfs_mb`` (root only): bookie ``i`` keeps its data on a tmpfs of its own of
      that many MiB, mounted at ``root / f"bookie-{i}.fs"`` (data dir ``.../data``, log
      ``root / f"bookie-{i}.log"``), for :meth:`BookieNode.fill_disk`. The file systems stay
      mounted across :meth:`stop` and :meth:`start` (the bookies keep their data) and are
      unmounted by :meth:`aclose`.
    - ``isolated_brokers=1`` (root only): one more broker, the last of :attr:`brokers`, runs in
      an :class:`~magnetar.testing.netns.IsolatedHost` (:attr:`isolated_host`), reaching etcd
      through its "etcd" link, the bookies through its "bookies" link, and reached by clients
      and the other brokers through its "clients" link, each of which a test can cut and heal.
      For that, etcd also listens on ``gateway("etcd")``, every bookie binds and advertises
      ``gateway("bookies")``, and every other broker binds and advertises
      ``gateway("clients")`` (processes on this machine reach all three addresses whatever
      the links' state). The namespace is created by the first :meth:`start`, kept (with its
      links healed) by :meth:`stop`, and removed by :meth:`aclose`.
    """

    _broker_registry: ClassVar[_Registry] = _BROKERS
    """Where :meth:`wait_brokers_registered` finds the brokers, and what it reads of each."""

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
        fixed_broker_ports: bool = False,
        bookie_tmpfs_mb: int | None = None,
        isolated_brokers: int = 0,
        etcd_tls: EtcdTls | None = None,
        etcd_user: tuple[str, str] | None = None,
    ) -> None:
        """Describe the cluster; nothing runs until :meth:`start`.

        Without ``metadata_url`` the cluster starts its own etcd under ``root / "etcd"`` (one
        server, or ``etcd_members`` of them) and stops it with the servers; with one it uses
        that store and leaves it alone. ``bookie_args`` go to every bookie's command line,
        ``broker_args`` to every broker's (say ``["--session-ttl-s", "2"]``), the isolated
        one's included. The fault options are described on the class.

        A secure etcd of its own: ``etcd_tls`` serves its client port over TLS (and requires
        client certificates); ``etcd_user`` (name, password) turns etcd's authentication on
        once it runs. Every server, and the cluster's own reads, then get etcd's credentials
        (``--etcd-trust-certs-file`` ... ``--etcd-password-file``).
        """
        if bookies < 0:
            raise ValueError(f"a cluster cannot have {bookies} bookies")
        if brokers < 0:
            raise ValueError(f"a cluster cannot have {brokers} brokers")
        if zones is not None and not zones:
            raise ValueError("zones, when given, must name at least one zone")
        if isolated_brokers not in (0, 1):
            raise ValueError(f"isolated_brokers must be 0 or 1, got {isolated_brokers}")
        if isolated_brokers and metadata_url is not None:
            raise ValueError(
                "isolated_brokers needs the cluster's own etcd (it must also listen on the"
                " isolated host's etcd link); do not pass metadata_url with it"
            )
        if isolated_brokers and (reason := netns_unsupported_reason()) is not None:
            raise RuntimeError(f"isolated_brokers=1 is not possible on this machine: {reason}")
        if bookie_tmpfs_mb is not None:
            if bookie_tmpfs_mb < 1:
                raise ValueError(f"bookie_tmpfs_mb must be at least 1, got {bookie_tmpfs_mb}")
            if os.geteuid() != 0:
                raise RuntimeError(
                    "bookie_tmpfs_mb needs root (it mounts a tmpfs per bookie); this process"
                    f" runs as uid {os.geteuid()}"
                )
        self._root = root
        self._fixed_broker_ports = fixed_broker_ports
        self._broker_ports: dict[int, int] = {}
        self._bookie_tmpfs_mb = bookie_tmpfs_mb
        self._isolated_brokers = isolated_brokers
        self._isolated_host: IsolatedHost | None = None
        self._isolated_broker: BrokerNode | None = None
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
        self._etcd_user = etcd_user
        self.etcd_security = EtcdSecuritySettings()
        """etcd's credentials, as every server of the cluster gets them."""
        if etcd_tls is not None or etcd_user is not None:
            password_file = None
            if etcd_user is not None:
                password_file = root / "etcd-password"
                root.mkdir(parents=True, exist_ok=True)
                password_file.write_text(etcd_user[1])
                password_file.chmod(0o600)
            self.etcd_security = EtcdSecuritySettings(
                etcd_trust_certs_file=etcd_tls.ca_file if etcd_tls else None,
                etcd_cert_file=etcd_tls.client_cert_file if etcd_tls else None,
                etcd_key_file=etcd_tls.client_key_file if etcd_tls else None,
                etcd_user=etcd_user[0] if etcd_user else None,
                etcd_password_file=password_file,
            )
        self._etcd: EtcdServer | EtcdCluster | None = None
        if metadata_url is None:
            if etcd_members == 1:
                self._etcd = EtcdServer(data_dir=root / "etcd", name="etcd0", tls=etcd_tls)
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
    def isolated_host(self) -> IsolatedHost | None:
        """The network namespace the isolated broker runs in (``isolated_brokers=1``), from
        :meth:`start` until :meth:`aclose`; else None."""
        host = self._isolated_host
        return host if host is not None and host.is_created else None

    @property
    def isolated_broker(self) -> BrokerNode | None:
        """The broker in :attr:`isolated_host` (the last of the initial brokers), once
        :meth:`start` has made it; None without ``isolated_brokers``."""
        return self._isolated_broker

    @property
    def service_url(self) -> str:
        """What a client connects to: ``"magnetar://h1:p1,h2:p2"``, the brokers running now
        (the isolated broker included).

        A paused broker is left out (it would only make clients time out). Computed at each
        call, so read it again after a broker restarts on a new port (with
        ``fixed_broker_ports`` it only changes as brokers stop and start). RuntimeError if no
        broker runs.
        """
        addresses = [
            node.address for node in self._brokers if node.is_running and not node.is_paused
        ]
        if not addresses:
            raise RuntimeError(f"{self!r} has no running broker, so no service URL")
        return "magnetar://" + ",".join(addresses)

    @property
    def tls_service_url(self) -> str:
        """``"magnetar+ssl://h1:p1,h2:p2"``: the TLS listeners of the brokers running now (the
        brokers run with ``--tls-cert-file``)."""
        addresses = [
            node.tls_address
            for node in self._brokers
            if node.is_running and not node.is_paused and node.tls_address
        ]
        if not addresses:
            raise RuntimeError(f"{self!r} has no running broker with a TLS listener")
        return "magnetar+ssl://" + ",".join(addresses)

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

        With ``isolated_brokers=1`` the isolated host is created first (unless it exists). On
        failure every process of the cluster is killed, the isolated host and the bookies' file
        systems are removed, and the first error is raised.
        """
        try:
            if self._isolated_brokers and self.isolated_host is None:
                self._isolated_host = IsolatedHost()
                await self._isolated_host.create()
                self._wire_network()
            if self._etcd is not None:
                await self._etcd.start()
                if self._etcd_user is not None and isinstance(self._etcd, EtcdServer):
                    await self._etcd.enable_auth({self._etcd_user[0]: self._etcd_user[1]})
            while len(self._bookies) < self._initial_bookies:
                self._bookies.append(self._new_bookie())
            await self._start_nodes(self._bookies, timeout_s)
            await self.wait_registered(timeout_s=timeout_s)
            while len(self._brokers) < self._initial_brokers + self._isolated_brokers:
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
        return await self._add(self._bookies, node, self.wait_registered, timeout_s)

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
        return await self._add(self._brokers, node, self.wait_brokers_registered, timeout_s)

    async def wait_registered(
        self, bookie_ids: Iterable[str] | None = None, timeout_s: float = 30
    ) -> None:
        """Wait until those bookies (default: every running one) are in the available list.

        For a running bookie of this cluster the record must carry its current address, so a
        registration a killed incarnation left behind does not count.
        """
        await self._wait_present(
            _BOOKIES, self._bookies, bookie_ids, lambda node: node.address, timeout_s
        )

    async def wait_unregistered(self, bookie_id: str, timeout_s: float = 30) -> None:
        """Wait until ``bookie_id`` is gone from the available list (stopped, or session expired:
        about the bookies' ``session_ttl_s`` after a SIGKILL)."""
        await self._wait_gone(_BOOKIES, bookie_id, timeout_s)

    async def wait_brokers_registered(
        self, broker_ids: Iterable[str] | None = None, timeout_s: float = 30
    ) -> None:
        """Wait until those brokers (default: every running one) are under ``/magnetar/brokers/``.

        For a running broker of this cluster the record must carry its current service URL, so
        a registration a killed incarnation left behind does not count.
        """
        await self._wait_present(
            self._broker_registry, self._brokers, broker_ids, self._published_by, timeout_s
        )

    async def wait_broker_unregistered(self, broker_id: str, timeout_s: float = 30) -> None:
        """Wait until ``broker_id`` is gone from ``/magnetar/brokers/``: stopped; SIGKILLed and
        found dead by another broker's probes (well within a second, unless
        ``--peer-probe-interval-ms 0``); or its session expired (about its ``session_ttl_s``
        after a SIGKILL nobody noticed, a long pause, or a cut from etcd)."""
        await self._wait_gone(_BROKERS, broker_id, timeout_s)

    async def available_bookies(self) -> dict[str, str]:
        """The bookie ids in ``/magnetar/bookies/available/`` with the address each published."""
        return await self._read_once(_BOOKIES)

    async def registered_brokers(self) -> dict[str, str]:
        """The broker ids in ``/magnetar/brokers/`` with the service URL each published."""
        return await self._read_once(_BROKERS)

    async def stop(self) -> None:
        """SIGTERM every broker (they hand their partitions over), then every bookie (they
        deregister), then stop the owned etcd.

        Everything stays configured: :meth:`start` brings the same cluster back. The isolated
        host stays too, but its cut links are healed first, so that the brokers' graceful
        shutdown can reach etcd and the bookies; the bookies' file systems stay mounted.
        """
        host = self.isolated_host
        if host is not None:
            for link in LINKS:
                if host.is_cut(link):
                    await host.heal(link)
        try:
            await self._gather_all(node.stop() for node in self._brokers)
        finally:
            try:
                await self._gather_all(node.stop() for node in self._bookies)
            finally:
                if self._etcd is not None:
                    await self._etcd.stop()

    async def aclose(self) -> None:
        """Stop for good: :meth:`stop`, then remove the isolated host and unmount the bookies'
        file systems (their data goes with them). The data under ``root`` that is on the
        machine's disk is left for the test to inspect."""
        try:
            await self.stop()
        finally:
            await self._remove_fault_fixtures()

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
        tmpfs: Tmpfs | None = None
        data_dir = self._root / f"bookie-{index}"
        if self._bookie_tmpfs_mb is not None:
            tmpfs = Tmpfs(self._root / f"bookie-{index}.fs", self._bookie_tmpfs_mb)
            data_dir = tmpfs.mount_point / "data"
            # the log stays off the small file system, where a full disk would cut it short
            log_path = log_path or self._root / f"bookie-{index}.log"
        return BookieNode(
            data_dir,
            self.metadata_url,
            bookie_id=bookie_id or f"{self._bookie_id_prefix}-{index}",
            zone=zone,
            log_path=log_path,
            extra_args=(
                *self._etcd_args(),
                *self._bookie_args,
                *self._bookie_own_args(index),
                *extra_args,
            ),
            env=env,
            host=self._bookie_network().bind_host,
            tmpfs=tmpfs,
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
        isolated = self._isolated_brokers == 1 and index == self._initial_brokers
        network = self._broker_network(isolated=isolated)
        port = 0
        if self._fixed_broker_ports:
            if index not in self._broker_ports:
                self._broker_ports[index] = free_port()
            port = self._broker_ports[index]
        node = BrokerNode(
            network.metadata_url,
            broker_id=broker_id or f"{self._broker_id_prefix}-{index}",
            log_path=log_path or self._root / f"broker-{index}.log",
            extra_args=(
                *self._etcd_args(),
                *self._broker_args,
                *self._broker_own_args(index),
                *extra_args,
            ),
            env=env,
            bind_host=network.bind_host,
            advertised_host=network.advertised_host,
            port=port,
            command_prefix=network.command_prefix,
        )
        if isolated:
            self._isolated_broker = node
        return node

    def _published_by(self, node: BrokerNode) -> str:
        """What a running broker of this cluster publishes (:attr:`_broker_registry`)."""
        return node.service_url

    def _bookie_own_args(self, index: int) -> Sequence[str]:  # noqa: ARG002 - a hook
        """Flags of bookie ``index`` alone (a subclass's: say its certificate), after the
        cluster's ``bookie_args`` and before the caller's ``extra_args``."""
        return ()

    def _broker_own_args(self, index: int) -> Sequence[str]:  # noqa: ARG002 - a hook
        """Flags of broker ``index`` alone, as :meth:`_bookie_own_args` for bookies."""
        return ()

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
            try:
                if self._etcd is not None:
                    await self._etcd.stop()
            finally:
                await self._remove_fault_fixtures()

    async def _remove_fault_fixtures(self) -> None:
        """Remove the isolated host and unmount the bookies' tmpfs (their processes are gone)."""
        try:
            if self._isolated_host is not None:
                await self._isolated_host.close()
        finally:
            for node in self._bookies:
                if node.tmpfs is not None:
                    node.tmpfs.unmount()

    def _wire_network(self) -> None:
        """Point etcd and the existing nodes at the (new) isolated host's addresses (a start
        after an :meth:`aclose` makes a new host)."""
        host = self._isolated_host
        assert host is not None  # only called once it is created
        assert self._etcd is not None  # isolated_brokers refuses a given metadata_url
        self._etcd.extra_client_hosts = [host.gateway("etcd")]
        for bookie in self._bookies:
            bookie._set_network(self._bookie_network())
        for broker in self._brokers:
            broker._set_network(self._broker_network(isolated=broker is self._isolated_broker))

    def _bookie_network(self) -> _Network:
        host = self.isolated_host
        address = host.gateway("bookies") if host is not None else HOST
        return _Network(bind_host=address, advertised_host=address, metadata_url=self.metadata_url)

    def _broker_network(self, *, isolated: bool) -> _Network:
        host = self.isolated_host
        if host is None:
            return _Network(bind_host=HOST, advertised_host=HOST, metadata_url=self.metadata_url)
        if not isolated:
            # the isolated broker must reach the others too (admin calls are forwarded to a
            # partition's owner), and inside its namespace 127.0.0.1 is its own
            address = host.gateway("clients")
            return _Network(
                bind_host=address, advertised_host=address, metadata_url=self.metadata_url
            )
        assert self._etcd is not None  # isolated_brokers refuses a given metadata_url
        return _Network(
            bind_host="0.0.0.0",  # noqa: S104 - every address of its own namespace
            advertised_host=host.address,
            metadata_url=self._etcd.url_on(host.gateway("etcd")),
            command_prefix=tuple(host.command_prefix),
        )

    def _etcd_args(self) -> list[str]:
        """The flags that give a server etcd's credentials."""
        security = self.etcd_security
        given = (
            ("--etcd-trust-certs-file", security.etcd_trust_certs_file),
            ("--etcd-cert-file", security.etcd_cert_file),
            ("--etcd-key-file", security.etcd_key_file),
            ("--etcd-user", security.etcd_user),
            ("--etcd-password-file", security.etcd_password_file),
        )
        return [item for flag, value in given if value is not None for item in (flag, str(value))]

    async def open_store(self) -> MetadataStore:
        """A store on the cluster's metadata, with etcd's credentials (close it yourself)."""
        return await open_store(self.etcd_security.store_config(self.metadata_url))

    async def _read_once(self, registry: _Registry) -> dict[str, str]:
        store = await self.open_store()
        try:
            return await registry.read(store)
        finally:
            await store.close()

    async def _add(
        self,
        nodes: list[_Node],
        node: _Node,
        wait_registered: Callable[..., Awaitable[None]],
        timeout_s: float,
    ) -> _Node:
        """Start a node made for this cluster, one more of ``nodes``, and wait until
        ``wait_registered`` sees it."""
        nodes.append(node)
        await node.start(timeout_s)
        await wait_registered([self._id_of(node)], timeout_s=timeout_s)
        return node

    async def _wait_gone(self, registry: _Registry, node_id: str, timeout_s: float) -> None:
        await self._poll(
            registry, lambda found: {node_id} & found.keys(), "unregistered", timeout_s
        )

    async def _wait_present(
        self,
        registry: _Registry,
        nodes: Sequence[_Node],
        ids: Iterable[str] | None,
        published: Callable[[_Node], str],
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

        await self._poll(registry, missing, "registered", timeout_s)

    async def _poll(
        self,
        registry: _Registry,
        missing: Callable[[dict[str, str]], set[str]],
        what: str,
        timeout_s: float,
    ) -> None:
        # A store of this call's own: the caller's event loop may differ from call to call.
        store = await self.open_store()
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                found = await registry.read(store)
                not_yet = missing(found)
                if not not_yet:
                    return
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{registry.kind} {sorted(not_yet)} were not {what} within {timeout_s}s; "
                        f"registered now (id: address): {found}"
                    )
                await asyncio.sleep(_REGISTRATION_POLL_INTERVAL_S)
        finally:
            await store.close()
