"""The benchmarks' one harness: what every script under bench/ measures and reports the same way.

- figures: percentiles and latency summaries, sizes and durations as the reports print them;
- the processes: CPU of a process, of each of its threads and of the machine, memory from
  /proc/<pid>/status, a free port, a log's tail, stopping a child process, watching a run's
  tasks and servers; the libraries' logs kept quiet, or timed (:class:`LogClock`);
- the machine: its details and the file system of the data, and its raw limits (append +
  ``fdatasync`` of 4 KiB, 1 MiB and 4 MiB, and a loopback gRPC round trip) in the same run;
- ``magnetar perf``'s output (its per-second progress lines and its ``--json`` summary), read as
  it comes with a snapshot at both ends of the measured window (:class:`PerfOutput`);
- the run: the options the scripts share (``--out``, ``--data-root``, ``--raw-s``), the head of
  the results, the preamble and the failed-runs section of the report, and
  :func:`run_and_write`, which runs a benchmark in a temporary directory, stops it on Ctrl-C or
  SIGTERM, and writes ``<name>-<date>[-<tag>].json`` and ``.md``.

The scripts run as ``python bench/<name>.py``, which puts bench/ on the path, so they import
this module as ``harness``. Each writes its results to ``bench/results/`` (``--out``);
``--quick`` tags them ``-quick``, so a smoke test never replaces a full run. The machine is
shared and noisy: compare figures within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import grpc
import grpc.aio
import structlog

from magnetar.testing import LocalCluster

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
KIB = 1024
MIB = 1024 * 1024
MB = 1_000_000  # bandwidths are reported in MB/s = 10^6 bytes/s of entry payload

S = TypeVar("S")  # a snapshot of a run, taken when its window opens and when it closes


# --- figures --------------------------------------------------------------------------------------


def size_name(n: int) -> str:
    """``100 B``, ``1 KiB``, ``4 MiB``: a size as the reports name it."""
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def opt(value: float | None, fmt: str = ",.2f") -> str:
    """A figure that may be missing, ``-`` if it is."""
    return "-" if value is None else format(value, fmt)


def ms(us: float) -> str:
    """Microseconds as a report cell in milliseconds."""
    return f"{us / 1000:,.2f} ms"


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted list; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100), at least 1
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    """p50/p99/p99.9/max/mean in microseconds, with the sample count they rest on."""
    values = sorted(seconds)
    us = 1e6
    return {
        "samples": len(values),
        "p50_us": percentile(values, 50) * us,
        "p99_us": percentile(values, 99) * us,
        "p999_us": percentile(values, 99.9) * us,
        "max_us": (values[-1] * us) if values else float("nan"),
        "mean_us": (sum(values) / len(values) * us) if values else float("nan"),
    }


def busiest_cell(per_process: dict[str, list[Any]], *, who: bool = True) -> str:
    """The busiest of the processes' busiest threads (``{process: [thread, % of a core]}``) as
    a report cell: ``85% (broker-0, event loop)``, or without ``who`` ``85% event loop``; ``-``
    when there is none."""
    if not per_process:
        return "-"
    process, (name, pct) = max(per_process.items(), key=lambda kv: kv[1][1])
    thread = "event loop" if name == "main" else "thread " + name
    return f"{pct:.0f}% ({process}, {thread})" if who else f"{pct:.0f}% {thread}"


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max of the values that exist (say, one per round), with their count;
    None figures when none do."""
    present = [v for v in values if v is not None]
    if not present:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {
        "n": len(present),
        "median": statistics.median(present),
        "min": min(present),
        "max": max(present),
    }


def spread_cell(figure: dict[str, Any] | None, spec: str = ",.0f") -> str:
    """A :func:`spread` as a report cell: ``median (min-max)``, or the one value."""
    if not figure or figure.get("median") is None:
        return "-"
    if figure["n"] == 1:
        return format(figure["median"], spec)
    return (
        f"{format(figure['median'], spec)} ({format(figure['min'], spec)}-"
        f"{format(figure['max'], spec)})"
    )


# --- the processes --------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine since boot, from /proc/stat.

    Steal is time the hypervisor ran something else while this VM wanted the CPU: a sign of
    the noisy neighbours the figures must be read against. It is not counted as busy.
    """
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    values += [0] * (8 - len(values))
    ticks = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]  # idle + iowait
    steal = values[7]
    total = sum(values[:8])  # guest time is already counted in user
    return (total - idle - steal) / ticks, steal / ticks, total / ticks


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (``/proc/loadavg``): on a shared machine,
    how many others wanted the CPU around a measurement."""
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of a process, by ``name:tid`` (threads that ended are gone).

    The main thread (tid = pid) is named ``main``: in a bookie and in this script it runs the
    asyncio event loop. Python threads keep the process's name, so the others are told apart
    by tid only.
    """
    out: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = (task / "stat").read_text()
                name = (
                    "main"
                    if task.name == str(pid)
                    else text[text.index("(") + 1 : text.rindex(")")]
                )
                fields = text[text.rindex(")") + 2 :].split()
                out[f"{name}:{task.name}"] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def thread_cpu(tid: int) -> float:
    """CPU seconds of one thread of this process.

    From /proc/<pid>/task/<tid>/stat: /proc/<tid>/stat of the main thread (tid = pid) would
    count every thread of the process.
    """
    text = Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Windowed(Protocol):
    """A load that counts only what happens between ``start`` and ``end`` (perf_counter)."""

    start: float
    end: float


async def loop_cpu_over(load: Windowed, seconds: float, cpu: Callable[[int], float]) -> float:
    """CPU seconds of this thread (the event loop), by ``cpu(tid)``, over a window of
    ``seconds`` that opens 0.2 s after the call and that ``load`` is told to count."""
    await asyncio.sleep(0.2)
    tid = threading.get_native_id()
    before = cpu(tid)
    load.start = time.perf_counter()
    load.end = load.start + seconds
    await asyncio.sleep(seconds)
    return cpu(tid) - before


def proc_write_bytes(pid: int) -> int:
    """Bytes this process caused to be written to storage (``write_bytes`` of /proc/<pid>/io)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def _status_bytes(pid: int | None, key: str) -> int | None:
    """A ``kB`` line of /proc/<pid>/status in bytes, or None if the process is gone."""
    if pid is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * KIB
    return None


def rss_bytes(pid: int | None) -> int | None:
    """VmRSS of a process (bytes), or None if it is gone."""
    return _status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int | None) -> int | None:
    """VmHWM (peak RSS since start, or since :func:`reset_peak_rss`) of a process, in bytes."""
    return _status_bytes(pid, "VmHWM")


def reset_peak_rss(pid: int | None) -> bool:
    """Reset a process's VmHWM to its current RSS (``5`` to /proc/<pid>/clear_refs, Linux 4.0+)."""
    if pid is None:
        return False
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick for port 0); it may be taken again by
    the time a server binds it, which would show as a failed run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


BOOKIE_COUNTERS = {
    "magnetar_bookie_adds_total": "adds",
    "magnetar_bookie_add_bytes_total": "add_bytes",
    "magnetar_bookie_group_commit_bytes_count": "groups",
    "magnetar_bookie_group_commit_bytes_sum": "group_bytes",
    "magnetar_bookie_fdatasync_seconds_count": "syncs",
    "magnetar_bookie_fdatasync_seconds_sum": "sync_seconds",
}
"""A bookie's add and journal counters in its /metrics, and the names the results give them."""


async def scrape_counters(url: str, names: Mapping[str, str] = BOOKIE_COUNTERS) -> dict[str, float]:
    """The counters ``names`` maps (metric -> name in the results) from a server's /metrics at
    ``url``; a metric it does not show is left out."""

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    found: dict[str, float] = {}
    for line in (await asyncio.to_thread(fetch)).splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            found[names[name]] = float(line.rsplit(" ", 1)[1])
    return found


@dataclass(slots=True)
class ClusterSample:
    """CPU, disk writes and bookie counters of every process of a cluster and of this one, at
    one instant (by bookie or broker id)."""

    at: float
    bench_cpu: float
    bench_loop_cpu: float
    bench_threads: dict[str, float]
    bookies: dict[str, float]
    bookie_threads: dict[str, dict[str, float]]
    bookie_write_bytes: dict[str, int]
    brokers: dict[str, float]
    broker_threads: dict[str, dict[str, float]]
    etcd: float
    machine: tuple[float, float, float]
    metrics: dict[str, dict[str, float]]


async def sample_cluster(
    cluster: LocalCluster, loop_tid: int, loop_cpu: Callable[[int], float] = thread_cpu
) -> ClusterSample:
    """A :class:`ClusterSample` of ``cluster``'s running servers and this process, whose event
    loop runs in thread ``loop_tid`` (its CPU by ``loop_cpu``)."""
    bookies = [n for n in cluster.bookies if n.pid is not None]
    brokers = [n for n in cluster.brokers if n.pid is not None]
    metrics = await asyncio.gather(
        *(scrape_counters(f"http://127.0.0.1:{n.http_port}/metrics") for n in bookies)
    )
    etcd_pid = getattr(cluster.etcd, "pid", None)
    return ClusterSample(
        at=time.perf_counter(),
        bench_cpu=time.process_time(),
        bench_loop_cpu=loop_cpu(loop_tid),
        bench_threads=thread_cpu_seconds(os.getpid()),
        bookies={str(n.bookie_id): proc_cpu_seconds(n.pid or 0) for n in bookies},
        bookie_threads={str(n.bookie_id): thread_cpu_seconds(n.pid or 0) for n in bookies},
        bookie_write_bytes={str(n.bookie_id): proc_write_bytes(n.pid or 0) for n in bookies},
        brokers={str(n.broker_id): proc_cpu_seconds(n.pid or 0) for n in brokers},
        broker_threads={str(n.broker_id): thread_cpu_seconds(n.pid or 0) for n in brokers},
        etcd=proc_cpu_seconds(etcd_pid) if etcd_pid else 0.0,
        machine=machine_cpu_seconds(),
        metrics={str(n.bookie_id): m for n, m in zip(bookies, metrics, strict=True)},
    )


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a server's log, for the results of a failed run."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


async def stop_process(
    process: asyncio.subprocess.Process,
    grace_s: float = 15.0,
    sig: signal.Signals = signal.SIGINT,
) -> None:
    """``sig`` (SIGINT: perf prints its partial figures), then SIGKILL after ``grace_s``."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def settle_disk() -> float:
    """Write back every dirty page (``sync``) before a workload, so that what the previous one
    left in the page cache is not flushed by kernel threads inside this one's window."""
    started = time.perf_counter()
    await asyncio.to_thread(os.sync)
    await asyncio.sleep(0.5)
    return time.perf_counter() - started


async def watching(
    tasks: Sequence[asyncio.Task[Any]], cluster: LocalCluster | None, seconds: float
) -> None:
    """Sleep, but fail at once if a task ends with an error or (unless ``cluster`` is None: a
    server is meant to be down) a server process of the cluster dies."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when="FIRST_COMPLETED")
    for task in done:
        task.result()
    if cluster is None:
        return
    dead = [n.bookie_id for n in cluster.bookies if not n.is_running]
    dead += [n.broker_id for n in cluster.brokers if not n.is_running]
    if dead:
        raise RuntimeError(f"server process(es) {dead} exited")


class LogClock:
    """A structlog processor that notes when the libraries logged the ``events`` a run is broken
    down by, and lets only warnings and errors through to the console (see
    :func:`configure_logs`)."""

    SHOWN = frozenset({"warning", "error", "critical", "exception"})

    def __init__(self, events: frozenset[str]) -> None:
        self.events = events
        self.seen: list[tuple[float, str]] = []

    def __call__(self, _logger: Any, method_name: str, event: Any) -> Any:
        if event.get("event") in self.events:
            self.seen.append((time.perf_counter(), event["event"]))
        if method_name not in self.SHOWN:
            raise structlog.DropEvent
        return event

    def after(self, name: str, since: float) -> list[float]:
        """When ``name`` was logged at or after ``since`` (``time.perf_counter()``)."""
        return [t for t, e in self.seen if e == name and t >= since]

    def first_after(self, name: str, since: float) -> float | None:
        return next((t for t, e in self.seen if e == name and t >= since), None)


def quiet_logs() -> None:
    """Let only warnings and errors of the libraries' logs through to the console: the
    benchmark's own output is enough."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def configure_logs(clock: LogClock) -> None:
    """Route every log event through ``clock``: it times the events it watches for and shows
    only warnings and errors."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[clock, *structlog.get_config()["processors"]],
    )


# --- the machine ----------------------------------------------------------------------------------


def filesystem_of(path: Path) -> dict[str, Any]:
    """Mount point, device and type of the file system holding ``path``, and its space."""
    p = path.resolve()
    while not os.path.ismount(p):
        p = p.parent
    device, fstype = "?", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == str(p):
            device, fstype = parts[0], parts[2]  # the last match is the one mounted on top
    usage = shutil.disk_usage(path)
    return {
        "path": str(path),
        "mount_point": str(p),
        "device": device,
        "type": fstype,
        "total_bytes": usage.total,
        "free_bytes": usage.free,
    }


def machine_info(data_root: Path) -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_total = int(Path("/proc/meminfo").read_text().split()[1]) * KIB
    commit, dirty = "?", None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain"],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_bytes": mem_total,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "grpcio": grpc.__version__,
        "filesystem": filesystem_of(data_root),
        "git_commit": commit,
        "git_dirty": dirty,
    }


# --- the raw limits of this machine ---------------------------------------------------------------


def append_fdatasync(directory: Path, write_bytes: int, seconds: float) -> dict[str, Any]:
    """Append ``write_bytes`` and fdatasync, in a loop, to a new file: the journal's pattern."""
    path = directory / f"raw-{write_bytes}.log"
    data = os.urandom(write_bytes)
    latencies: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        deadline = started + seconds
        now = started
        while now < deadline:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
            after = time.perf_counter()
            latencies.append(after - now)
            now = after
        elapsed = now - started
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    ops = len(latencies)
    return {
        "write_bytes": write_bytes,
        "seconds": elapsed,
        "ops": ops,
        "ops_per_s": ops / elapsed,
        "mb_per_s": ops * write_bytes / elapsed / MB,
        "latency": latency_summary(latencies),
    }


async def grpc_round_trip(seconds: float) -> dict[str, Any]:
    """Sequential tiny unary calls to an in-process grpc.aio server over loopback TCP.

    Client and server share this process and its event loop, so one round trip includes the
    Python/gRPC cost of both sides: the floor of one request/response between two processes.
    """

    async def ping(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(ping)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/bench.Echo/Ping"
            )
            payload = b"x" * 16
            for _ in range(200):  # connect, warm caches
                await call(payload)
            latencies: list[float] = []
            started = time.perf_counter()
            deadline = started + seconds
            now = started
            while now < deadline:
                await call(payload)
                after = time.perf_counter()
                latencies.append(after - now)
                now = after
            elapsed = now - started
    finally:
        await server.stop(None)
    return {
        "payload_bytes": len(payload),
        "seconds": elapsed,
        "calls": len(latencies),
        "calls_per_s": len(latencies) / elapsed,
        "latency": latency_summary(latencies),
    }


async def measure_raw_limits(directory: Path, seconds: float) -> dict[str, Any]:
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    started = time.time()
    small = await asyncio.to_thread(append_fdatasync, directory, 4 * KIB, seconds)
    large_1m = await asyncio.to_thread(append_fdatasync, directory, 1 * MIB, seconds)
    large_4m = await asyncio.to_thread(append_fdatasync, directory, 4 * MIB, seconds)
    rtt = await grpc_round_trip(seconds)
    return {
        "at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "append_fdatasync_4k": small,
        "append_fdatasync_1m": large_1m,
        "append_fdatasync_4m": large_4m,
        "grpc_unary_round_trip": rtt,
    }


async def raw_limits_at(
    results: dict[str, Any], when: str, directory: Path, seconds: float
) -> None:
    """Measure the raw limits (``when`` is ``start`` or ``end``) into ``results["raw_limits"]``
    and print them."""
    results["raw_limits"][when] = await measure_raw_limits(directory, seconds)
    print_raw(when, results["raw_limits"][when])


def print_raw(label: str, raw: dict[str, Any]) -> None:
    print(
        f"raw limits ({label}): 4 KiB append+fdatasync"
        f" {raw['append_fdatasync_4k']['ops_per_s']:,.0f} ops/s"
        f" (p50 {raw['append_fdatasync_4k']['latency']['p50_us']:,.0f} us);"
        f" 1 MiB {raw['append_fdatasync_1m']['mb_per_s']:,.0f} MB/s;"
        f" 4 MiB {raw['append_fdatasync_4m']['mb_per_s']:,.0f} MB/s;"
        f" gRPC round trip p50 {raw['grpc_unary_round_trip']['latency']['p50_us']:,.0f} us",
        flush=True,
    )


def raw_pair(results: dict[str, Any], key: str, metric: str, fmt: str = ",.0f") -> str:
    """A raw-limit figure at the start and at the end of a run, ``start / end`` (``-`` where
    one is missing); ``metric`` is a dotted path, e.g. ``latency.p50_us``."""
    raw = results["raw_limits"]
    values = []
    for when in ("start", "end"):
        value: Any = raw.get(when, {}).get(key)
        for part in metric.split("."):
            value = None if value is None else value.get(part)
        values.append("-" if value is None else format(value, fmt))
    return " / ".join(values)


# The rows of a report's raw-limits table: label, key, figure (dotted path) and unit.
RawRow = tuple[str, str, str, str]
RAW_4K_OPS: RawRow = ("4 KiB append + fdatasync", "append_fdatasync_4k", "ops_per_s", "ops/s")
RAW_4K_P50: RawRow = (
    "4 KiB append + fdatasync, p50",
    "append_fdatasync_4k",
    "latency.p50_us",
    "us",
)
RAW_4K_P99: RawRow = (
    "4 KiB append + fdatasync, p99",
    "append_fdatasync_4k",
    "latency.p99_us",
    "us",
)
RAW_1M: RawRow = ("1 MiB append + fdatasync", "append_fdatasync_1m", "mb_per_s", "MB/s")
RAW_4M: RawRow = ("4 MiB append + fdatasync", "append_fdatasync_4m", "mb_per_s", "MB/s")
RAW_RTT_P50: RawRow = (
    "loopback gRPC unary round trip, p50",
    "grpc_unary_round_trip",
    "latency.p50_us",
    "us",
)
RAW_RTT_P99: RawRow = (
    "loopback gRPC unary round trip, p99",
    "grpc_unary_round_trip",
    "latency.p99_us",
    "us",
)


def raw_limits_table(
    results: dict[str, Any], rows: Sequence[RawRow], *, one_column: bool = False
) -> list[str]:
    """The report's section on the raw limits measured at the start and the end of the run:
    a column each, or ``start / end`` in one column."""
    lines = ["## Raw limits of this machine (same run)", ""]
    if one_column:
        lines += ["| measure | start / end |", "|---|---|"]
        lines += [
            f"| {label} | {raw_pair(results, key, metric)} {unit} |"
            for label, key, metric, unit in rows
        ]
        return lines
    lines += ["| measure | start | end |", "|---|---|---|"]
    for label, key, metric, unit in rows:
        a, b = raw_pair(results, key, metric).split(" / ")
        lines.append(f"| {label} | {a} {unit} | {b} {unit} |")
    return lines


# --- magnetar perf's output -----------------------------------------------------------------------


# The progress line perf prints to stderr every second (magnetar/perf.py, _Run._report):
# "produce    3.0 s     201,234 msg/s     20.12 MB/s  p50    7.123 ms  p99   40.000 ms  pending 9"
_PROGRESS = re.compile(
    r"^(?P<mode>produce|consume|end-to-end)\s+(?P<t>\d+(?:\.\d+)?) s\s+(?P<rate>[\d,]+) msg/s"
    r"\s+(?P<mb>\d+(?:\.\d+)?) MB/s\s+p50\s+(?P<p50>\d+(?:\.\d+)?|-) ms"
    r"\s+p99\s+(?P<p99>\d+(?:\.\d+)?|-) ms\s+pending (?P<pending>-?[\d,]+)"
    r"(?:\s+errors (?P<errors>[\d,]+))?\s*$"
)


def parse_progress(line: str) -> dict[str, Any] | None:
    """One of perf's per-second progress lines as numbers (its ``--json-progress`` objects, or
    the human lines), or None for any other line."""
    text = line.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or "progress" not in value:
            return None
        keys = ("t_s", "msg_per_s", "mb_per_s", "p50_ms", "p99_ms", "pending", "errors")
        return {key: value.get(key) for key in keys} | {"warmup": bool(value.get("warmup"))}
    match = _PROGRESS.match(text)
    if match is None:
        return None

    def ms(text: str) -> float | None:
        return None if text == "-" else float(text)

    return {
        "t_s": float(match["t"]),
        "msg_per_s": int(match["rate"].replace(",", "")),
        "mb_per_s": float(match["mb"]),
        "p50_ms": ms(match["p50"]),
        "p99_ms": ms(match["p99"]),
        "pending": int(match["pending"].replace(",", "")),
        "errors": int(match["errors"].replace(",", "")) if match["errors"] else 0,
    }


def parse_summary(line: str) -> dict[str, Any] | None:
    """perf's ``--json`` summary line (one JSON object with a "mode"), or None."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "mode" in value else None


def perf_environment() -> dict[str, str]:
    return {**os.environ, "GRPC_VERBOSITY": "ERROR"}


async def spawn_piped(*command: str) -> asyncio.subprocess.Process:
    """A child process (perf, or a script's own worker) in the repository, its stdout and
    stderr piped, its stdin empty, with gRPC's own logging quiet."""
    return await asyncio.create_subprocess_exec(
        *command,
        cwd=REPO,
        env=perf_environment(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@dataclass(slots=True)
class PerfOutput(Generic[S]):
    """What a process running ``magnetar perf`` prints, read as it comes: its progress lines
    (stderr), its summary (stdout), and a snapshot (``snap``, of CPU say) at the first progress
    line after the warm-up and at the summary, the window every figure of the run is read in.

    ``started``, when given (a ``time.perf_counter()``), stamps each progress line ``at_s``;
    ``on_progress`` sees each one as it comes. Other lines are kept, the last few of each.
    """

    snap: Callable[[], Awaitable[S | None]]
    tail_lines: int = 30
    started: float | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    progress: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: deque[str] = field(init=False)
    stdout_other: deque[str] = field(default_factory=lambda: deque(maxlen=10))
    summary: dict[str, Any] | None = None
    first: S | None = None
    last: S | None = None

    def __post_init__(self) -> None:
        self.stderr_tail = deque(maxlen=self.tail_lines)

    async def read(self, process: asyncio.subprocess.Process) -> None:
        """Read both streams of ``process`` to their end."""
        assert process.stderr is not None
        assert process.stdout is not None
        await asyncio.gather(self._read_stderr(process.stderr), self._read_stdout(process.stdout))

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            parsed = parse_progress(line)
            if parsed is None:
                self.stderr_tail.append(line)
                continue
            if self.started is not None:
                parsed["at_s"] = round(time.perf_counter() - self.started, 3)
            self.progress.append(parsed)
            if self.on_progress is not None:
                self.on_progress(parsed)
            if self.first is None and not parsed.get("warmup"):
                self.first = await self.snap()  # figures count from the end of the warm-up

    async def _read_stdout(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace")
            parsed = parse_summary(line)
            if parsed is None:
                self.stdout_other.append(line.rstrip())
                continue
            self.last = await self.snap()
            self.summary = parsed


def summary_errors(summary: dict[str, Any] | None, who: str) -> list[str]:
    """What a perf summary says went wrong: none printed (by ``who``), or messages failed."""
    if summary is None:
        return [f"{who} printed no summary"]
    if summary.get("errors"):
        return [f"{summary['errors']:,} messages failed"]
    return []


# --- the run and its report -----------------------------------------------------------------------


def python_path() -> str:
    """This interpreter, relative to the repository when it is the repository's venv."""
    path = Path(sys.executable)
    with contextlib.suppress(ValueError):
        return str(path.relative_to(REPO))
    return str(path)


def results_head(
    name: str, script: str, argv: list[str], started: float, args: argparse.Namespace
) -> dict[str, Any]:
    """The keys that open every script's results: the benchmark's name, its date and start, the
    command that ran it (``bench/<script>`` and ``argv``), and its ``--quick`` and ``--tag``."""
    return {
        "benchmark": name,
        "date": dt.date.today().isoformat(),
        "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([python_path(), f"bench/{script}", *argv]),
        "quick": args.quick,
        "tag": args.tag,
    }


def add_workload_time_options(add: Callable[..., Any]) -> None:
    """``--duration-s`` and ``--warmup-s`` of each workload, and ``--raw-s``."""
    add("--duration-s", type=float, default=5.0, help="measured seconds per workload")
    add("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each workload")
    add_raw_s_option(add)


def add_raw_s_option(add: Callable[..., Any], default: float = 1.5) -> None:
    """``--raw-s``: how long each raw limit is measured (:func:`raw_limits_at`)."""
    add(
        "--raw-s",
        type=float,
        default=default,
        help="seconds per raw-limit measurement (each of 4, at start and at end)",
    )


def bench_parser(
    script: str, description: str
) -> tuple[argparse.ArgumentParser, Callable[..., Any]]:
    """The command line of ``bench/<script>``, with every default shown in ``--help``, and its
    ``add_argument``."""
    parser = argparse.ArgumentParser(
        prog=f"bench/{script}",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    return parser, parser.add_argument


def add_quick_and_tag(
    add: Callable[..., Any], name: str, *, quick: str, tag: str | None = None
) -> None:
    """``--quick`` (a smoke test: ``quick`` says what it runs; its results are tagged
    ``quick``) and ``--tag`` (``tag``, or by default: so that a variant run does not replace
    the full run's files)."""
    add(
        "--quick",
        action="store_true",
        help=f"smoke test: {quick}; results go to {name}-<date>-quick.* (unless --tag is given)",
    )
    add(
        "--tag",
        help=tag
        or f"name the results {name}-<date>-<TAG>.*, so that a variant run does not replace the"
        " full run's files",
    )


KEEP_DATA_HELP = "leave the temporary directory (with the logs)"


def add_output_options(
    add: Callable[..., Any], *, data_root_help: str, keep_data_help: str | None = None
) -> None:
    """``--out`` (where the results go) and ``--data-root`` (where the temporary directory
    of :func:`run_and_write` is made); with ``keep_data_help``, ``--keep-data`` (leave that
    directory)."""
    add("--out", type=Path, default=RESULTS, help="directory for the results")
    add("--data-root", type=Path, default=REPO / "bench", help=data_root_help)
    if keep_data_help is not None:
        add("--keep-data", action="store_true", help=keep_data_help)


def report_head(results: dict[str, Any], title: str, *, raw_limits: bool = True) -> list[str]:
    """A report's first lines: ``# <title>, <date>`` (with `` (<tag>)`` after a tagged run), a
    blank line and the :func:`report_preamble`."""
    tag = f" ({results['tag']})" if results["tag"] else ""
    return [
        f"# {title}, {results['date']}{tag}",
        "",
        *report_preamble(results, raw_limits=raw_limits),
    ]


def report_preamble(results: dict[str, Any], *, raw_limits: bool = True) -> list[str]:
    """The command, machine and file-system lines that open every benchmark report; the last
    says the raw limits were measured in the same tree as the data, unless ``raw_limits`` is
    False (a benchmark that does not measure them)."""
    m = results["machine"]
    cores = m["cpu_count"]
    fs = m["filesystem"]
    data = (
        f"Data file system: {fs['device']} ({fs['type']}) on {fs['mount_point']},"
        f" {fs['free_bytes'] / 1e9:,.0f} GB free of {fs['total_bytes'] / 1e9:,.0f} GB."
    )
    return [
        f"Command: `{results['command']}`  ",
        (
            f"Started {results['started_at']}, took {results['elapsed_s']:.0f} s. Git"
            f" {m['git_commit'][:12]}{' (uncommitted changes)' if m['git_dirty'] else ''}.  "
        ),
        (
            f"Machine: {cores} cores ({m['cpu_model']}), {m['memory_bytes'] / 2**30:.1f} GiB,"
            f" kernel {m['kernel']}, Python {m['python']}, grpcio {m['grpcio']}.  "
        ),
        data + " Raw limits and bookie data are in the same directory tree."
        if raw_limits
        else data,
    ]


def report_text(
    lines: Sequence[str], json_holds: str, *, next_to: str = "this one", gap: bool = True
) -> str:
    """The report: ``lines``, then (after a blank line, unless not ``gap``) the line that says
    what the ``.json`` file next to it holds (``json_holds``, say "Raw figures, parameters and
    machine details")."""
    last = f"{json_holds}: the `.json` file next to {next_to}."
    return "\n".join([*lines, *([""] if gap else []), last, ""])


def failed_runs_section(
    runs: Sequence[dict[str, Any]], name: Callable[[dict[str, Any]], str]
) -> list[str]:
    """The report's "Failed runs": each failed run (``name`` says which), its error, and the
    tails of its client's stderr and of the server's log; nothing when none failed."""
    failed = [r for r in runs if not r["ok"]]
    if not failed:
        return []
    lines = ["## Failed runs", ""]
    for run in failed:
        lines += [
            f"- {name(run)}: {run.get('error')}",
            "",
            "```",
            run.get("stderr_tail", ""),
            "--- server log tail",
            run.get("server_log_tail", ""),
            "```",
            "",
        ]
    return lines


BenchBody = Callable[[argparse.Namespace, list[str], Path], Awaitable[dict[str, Any]]]


async def _cancellable(
    body: BenchBody, args: argparse.Namespace, argv: list[str], root: Path
) -> dict[str, Any]:
    # SIGTERM cancels the run like Ctrl-C does, so the benchmark's finally blocks stop its servers
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    return await body(args, argv, root)


def run_and_write(
    name: str,
    args: argparse.Namespace,
    argv: list[str],
    body: BenchBody,
    render: Callable[[dict[str, Any]], str],
    *,
    keep_data: bool = False,
) -> dict[str, Any] | None:
    """Run a benchmark in a temporary directory under ``args.data_root`` (removed afterwards
    unless ``keep_data``), then write ``<name>-<date>[-<tag>].json`` and ``.md`` to
    ``args.out``. Returns the results, or None when interrupted (Ctrl-C or SIGTERM)."""
    args.data_root.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f".{name}-bench-", dir=args.data_root))
    try:
        results = asyncio.run(_cancellable(body, args, argv, root))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; servers stopped", file=sys.stderr)
        return None
    finally:
        if keep_data:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{results['date']}{'-' + args.tag if args.tag else ''}"
    json_path, md_path = args.out / f"{stem}.json", args.out / f"{stem}.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(render(results))
    print(f"wrote {json_path} and {md_path}")
    return results


def bench_main(
    name: str,
    argv: list[str] | None,
    parse_args: Callable[[list[str]], argparse.Namespace],
    body: BenchBody,
    render: Callable[[dict[str, Any]], str],
    *,
    ok: Callable[[dict[str, Any], argparse.Namespace], bool],
    log_clock: LogClock | None = None,
    worker: Callable[[str], int] | None = None,
    refusal: Callable[[argparse.Namespace], str | None] | None = None,
) -> int:
    """A script's ``main``: ``--worker SPEC`` runs ``worker`` (the script as a child process of
    its own run). Else it parses ``argv`` (None: the command line); prints what ``refusal``
    says, if anything, and exits 2; keeps the libraries' logs quiet (or timed by
    ``log_clock``); runs :func:`run_and_write` (keeping the temporary directory when the script
    has ``--keep-data`` and it is given). The exit status: 130 when interrupted, else 0 if
    ``ok(results, args)`` (which may print the verdicts first), else 1."""
    argv = sys.argv[1:] if argv is None else argv
    if worker is not None and argv[:1] == ["--worker"]:
        return worker(argv[1])
    args = parse_args(argv)
    if refusal is not None and (reason := refusal(args)) is not None:
        print(reason, file=sys.stderr)
        return 2
    if log_clock is None:
        quiet_logs()
    else:
        configure_logs(log_clock)
    keep_data = bool(getattr(args, "keep_data", False))
    results = run_and_write(name, args, argv, body, render, keep_data=keep_data)
    if results is None:
        return 130
    return 0 if ok(results, args) else 1


def print_checks(checks: Sequence[dict[str, Any]]) -> None:
    """Each target's verdict on the console: ``PASS: <name>`` (`` (<workload>)`` if it has
    one)."""
    for c in checks:
        print(f"{c['verdict']}: {c['name']}" + (f" ({c['workload']})" if "workload" in c else ""))


def all_ok(*groups: str) -> Callable[[dict[str, Any], argparse.Namespace], bool]:
    """Whether every run in each of these lists of the results (say ``"runs"``, or
    ``"failover.runs"`` a level down) succeeded."""

    def ok(results: dict[str, Any], _args: argparse.Namespace) -> bool:
        for group in groups:
            runs: Any = results
            for key in group.split("."):
                runs = runs[key]
            if not all(run["ok"] for run in runs):
                return False
        return True

    return ok
