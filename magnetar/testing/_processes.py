"""Child processes of the test kit: kill, reap and wait, without asyncio child watchers.

The kit's processes (etcd, bookies) are ``subprocess.Popen`` children polled from asyncio, so
that a process started in one event loop (a session fixture) can be stopped from another (a
test). These helpers, and the :class:`ManagedProcess` base that runs one such process through
its incarnations, are shared by :mod:`magnetar.testing.etcd` and :mod:`magnetar.testing.cluster`;
:class:`AsyncLifecycle` is the ``async with`` (start, then :meth:`~AsyncLifecycle.aclose`) that
processes and the clusters made of them share.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Self

KILL_WAIT_S = 10.0
"""How long a SIGKILLed or stopping child may take to go."""

POLL_INTERVAL_S = 0.01


def kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    """Finalizer: SIGKILL a child a test left behind, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_WAIT_S)


def process_state(pid: int) -> str | None:
    """The one-letter state of a Linux process from /proc ("T" when stopped), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


async def wait_exit(
    proc: subprocess.Popen[bytes], timeout_s: float, *, name: str, must: bool = False
) -> bool:
    """Wait for ``proc`` to exit; False at the timeout (RuntimeError if ``must``)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            if must:
                raise RuntimeError(f"{name} (pid {proc.pid}) did not exit in {timeout_s}s")
            return False
        await asyncio.sleep(POLL_INTERVAL_S)
    return True


async def wait_state(proc: subprocess.Popen[bytes], *, stopped: bool) -> None:
    """Wait until the kernel shows ``proc`` stopped (or running), so a pause is in force."""
    deadline = time.monotonic() + KILL_WAIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        state = process_state(proc.pid)
        if state is None or (state == "T") == stopped:
            return
        await asyncio.sleep(POLL_INTERVAL_S)


class AsyncLifecycle(abc.ABC):
    """Something a test starts and closes for good: ``async with`` is :meth:`start`, then
    :meth:`aclose` (a process, an etcd cluster, a :class:`~magnetar.testing.LocalCluster`)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start it and wait until it is ready."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop it for good."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class ManagedProcess(AsyncLifecycle):
    """One OS process a test drives, through its incarnations: what etcd members
    (:class:`~magnetar.testing.etcd.EtcdServer`) and Magnetar servers
    (:class:`~magnetar.testing.cluster.ServerNode`) share.

    Each :meth:`start` (the subclass's) spawns a new incarnation with :meth:`_popen`, which
    appends to one log file, remembers where this incarnation's output begins (for
    :meth:`_log_tail`), and registers a finalizer that SIGKILLs a process a test forgets.
    :meth:`stop` is SIGTERM then SIGKILL after ``_stop_timeout_s``; :meth:`kill` is SIGKILL (a
    crash); :meth:`pause` and :meth:`resume` are SIGSTOP and SIGCONT. :attr:`exit_code` keeps how
    the last incarnation ended.
    """

    _stop_timeout_s: ClassVar[float] = 10.0
    """How long :meth:`stop` waits after SIGTERM, by default, before it SIGKILLs."""
    _log_tail_lines: ClassVar[int | None] = None
    """Lines :meth:`_log_tail` keeps (None: every line of its last bytes)."""
    _log_tail_bytes: ClassVar[int] = 16_000

    def __init__(self, log_path: Path) -> None:
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[..., ManagedProcess] | None = None
        self._paused = False
        self._exit_code: int | None = None
        self._log_offset = 0

    # -- state -------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def pid(self) -> int | None:
        """The process id while the process runs (paused or not), else None."""
        return self._proc.pid if self.is_running and self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """True from a start until the process exits (a paused process is running)."""
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

    # -- lifecycle ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self, timeout_s: float = ...) -> None:
        """Start a new incarnation and wait until it is ready."""

    async def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it has not exited after ``timeout_s``
        (default: ``_stop_timeout_s``). :attr:`exit_code` tells which of the two ended it."""
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

    async def restart(self, *, graceful: bool = True, timeout_s: float | None = None) -> None:
        """Stop (or with ``graceful=False`` SIGKILL) and start again with the same arguments
        (``timeout_s``: the start's; None: its default)."""
        if graceful:
            await self.stop()
        else:
            await self.kill()
        if timeout_s is None:
            await self.start()
        else:
            await self.start(timeout_s)

    async def pause(self) -> None:
        """SIGSTOP the process: it keeps its sockets but answers nothing until resumed."""
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

    # -- for subclasses ----------------------------------------------------------------------

    @abc.abstractmethod
    def _describe(self) -> str:
        """How to name the process in messages (``etcd m0``, ``broker broker-1``)."""

    def _popen(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        stdout_to_log: bool,
    ) -> subprocess.Popen[bytes]:
        """Spawn an incarnation: stderr (and stdout, if ``stdout_to_log``; else a pipe) appended
        to the log after a line naming the command."""
        if self.is_running:
            raise RuntimeError(f"{self._describe()} is already running (pid {self.pid})")
        if self._proc is not None:
            # it died on its own; poll() has reaped it
            self._detach_process()
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"--- magnetar harness: {' '.join(command)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log if stdout_to_log else subprocess.PIPE,
                stderr=subprocess.STDOUT if stdout_to_log else log,
                env=dict(env),
                close_fds=True,
            )
        self._proc = proc
        self._paused = False
        self._exit_code = None
        self._reaper = weakref.finalize(self, kill_quietly, proc)
        return proc

    def _require_running(self, action: str) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"cannot {action} {self._describe()}: it is not running")
        return proc

    async def _forget_process(self) -> None:
        """After the process exited: drop it (a subclass may first finish reading it)."""
        self._detach_process()

    def _detach_process(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
        if self._proc is not None:
            self._exit_code = self._proc.returncode
        self._reaper = None
        self._proc = None
        self._paused = False

    def _log_tail(self) -> str:
        """The end of what this incarnation wrote to the log."""
        try:
            with self._log_path.open("rb") as log:
                log.seek(max(self._log_offset, log.seek(0, os.SEEK_END) - self._log_tail_bytes))
                text = log.read().decode(errors="replace")
        except OSError as error:
            return f"(cannot read the log: {error})"
        if self._log_tail_lines is None:
            return text
        return "\n".join(text.splitlines()[-self._log_tail_lines :])

    async def aclose(self) -> None:
        await self.stop()
