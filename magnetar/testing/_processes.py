"""Child processes of the test kit: kill, reap and wait, without asyncio child watchers.

The kit's processes (etcd, bookies) are ``subprocess.Popen`` children polled from asyncio, so
that a process started in one event loop (a session fixture) can be stopped from another (a
test). These helpers are shared by :mod:`magnetar.testing.etcd` and
:mod:`magnetar.testing.cluster`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

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
