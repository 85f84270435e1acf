"""Ledger-client benchmark: replicated adds through ``LedgerClient`` to a local cluster of real
bookie processes, for three quorum settings side by side, and the writer's stall when a bookie
of its ensemble is SIGKILLed. The raw limits of this machine (disk append+fdatasync, loopback
gRPC) are measured in the same run, at its start and at its end.

Run from the repository root::

    .venv/bin/python bench/ledger_bench.py              # full run, about two minutes
    .venv/bin/python bench/ledger_bench.py --quick      # smoke test, about 30 seconds

Its results, ``ledger-<date>.json`` with every raw figure and ``.md`` with the tables, go where
every benchmark's go (bench/harness.py); what each figure means: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from harness import (
    KIB,
    MB,
    RAW_1M,
    RAW_4K_OPS,
    RAW_4K_P50,
    RAW_4M,
    RAW_RTT_P50,
    RAW_RTT_P99,
    ClusterSample,
    LogClock,
    add_output_options,
    add_quick_and_tag,
    add_workload_time_options,
    all_ok,
    bench_main,
    bench_parser,
    latency_summary,
    log_tail,
    loop_cpu_over,
    machine_info,
    ms,
    proc_cpu_seconds,
    raw_limits_at,
    raw_limits_table,
    raw_pair,
    report_head,
    report_text,
    results_head,
    sample_cluster,
    size_name,
    watching,
)

from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_client import LedgerClient
from bookie.client.write_handle import WriteHandle
from magnetar.testing import BookieNode, LocalCluster
from metadata import MetadataStore, open_store

T = TypeVar("T")  # what timed_run samples at both ends of its window

BOOKIES = 4  # one more than the widest ensemble, so the failover has a replacement to pick

# Flagged in the "what limits it" row when at or above these. A thread near 100% of a core is
# the ceiling of a single event loop; the machine near all its cores leaves every process waiting
# for CPU; a journal whose sync stage is in fdatasync most of the time is near the disk's limit
# (at 100% it syncs back to back, and every add waits for a sync to finish before its own).
BUSY_THREAD_PCT = 85.0
BUSY_MACHINE_FRACTION = 0.85
BUSY_DISK_PCT = 70.0


# --- workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quorum:
    ensemble: int
    write: int
    ack: int

    @property
    def name(self) -> str:
        return f"E{self.ensemble}/Qw{self.write}/Qa{self.ack}"


QUORUMS = (Quorum(1, 1, 1), Quorum(2, 2, 2), Quorum(3, 2, 2))


@dataclass(frozen=True, slots=True)
class Workload:
    """One writer on one new ledger, keeping ``window`` adds in flight (the handle's
    ``max_pending_adds``, with ``max_pending_bytes`` set to exactly that many entries) and
    letting the event loop run after every ``turn_entries`` adds (0: only when ``add_async``
    waits for room, so a whole freed window is refilled in one loop turn)."""

    quorum: Quorum
    entry_bytes: int
    window: int
    turn_entries: int

    @property
    def burst(self) -> bool:
        return self.turn_entries == 0

    @property
    def name(self) -> str:
        burst = ", whole window per loop turn" if self.burst else ""
        return f"{self.quorum.name}, {size_name(self.entry_bytes)}{burst}"

    @property
    def key(self) -> str:
        q = self.quorum
        return f"E{q.ensemble}Qw{q.write}Qa{q.ack}-{size_name(self.entry_bytes)}".replace(" ", "")

    @property
    def in_flight_bytes(self) -> int:
        return self.window * self.entry_bytes


# Window (adds in flight) and adds per loop turn for each entry size, chosen by measuring on this
# machine with --window and --turn-entries (README, "Choosing the window"). 1 KiB: 1,024 in
# flight, 256 per turn; windows of 2,048 and 4,096 gave the same entries/s within the noise, at
# two and four times the latency. 64 KiB: 128 in flight (8 MiB, as bookie_bench found for one
# bookie's add stream), 16 per turn (1 MiB, the client's largest add message); 64 gave less, 256
# about the same at twice the latency.
#
# Why adds per turn at all: the handle sends every entry added in one loop turn to a bookie as
# one call, and the bookie client never splits a call, so a writer that refills its whole
# window in one turn sends the whole window as one message and waits for its one answer. The
# "whole window per loop turn" rows (turn 0) measure that, next to the paced rows.
WINDOWS = {1 * KIB: (1024, 256), 64 * KIB: (128, 16)}
FULL_SIZES = (1 * KIB, 64 * KIB)
QUICK_SIZES = (1 * KIB,)


def all_workloads(sizes: tuple[int, ...]) -> list[Workload]:
    return [Workload(q, size, *WINDOWS[size]) for size in sizes for q in QUORUMS]


# --- small helpers --------------------------------------------------------------------------------


async def wait_for_view(client: LedgerClient, cluster: LocalCluster, timeout_s: float = 30) -> None:
    """Until the client sees every running bookie at its current address."""
    async with asyncio.timeout(timeout_s):
        while True:
            running = {n.bookie_id: n.address for n in cluster.bookies if n.is_running}
            seen: dict[str | None, str] = {b: r.address for b, r in client.view.bookies.items()}
            if all(seen.get(b) == a for b, a in running.items()):
                return
            await asyncio.sleep(0.05)


# --- the client's log, timed -------------------------------------------------------------------


# times the ledger client's events the failover is broken down by
LOG_CLOCK = LogClock(
    frozenset({"bookie_add_stream_broken", "ledger_bookie_failed", "ensemble_changed"})
)


# --- the load -------------------------------------------------------------------------------------


class AddTarget(Protocol):
    """What the writer needs of a ``WriteHandle`` (the stub below has it too)."""

    @property
    def pending(self) -> int: ...

    @property
    def ensemble_changes(self) -> int: ...

    async def add_async(self, payload: bytes) -> asyncio.Future[int]: ...


class StubHandle:
    """A handle whose adds complete at once: running the writer against it measures what the
    benchmark's own bookkeeping costs per add."""

    pending = 0
    ensemble_changes = 0

    async def add_async(self, payload: bytes) -> asyncio.Future[int]:  # noqa: ARG002 - the handle's signature
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future


class Writer:
    """Adds one payload over and over to one ledger and times each add.

    Without ``rate_per_s`` it keeps the handle's pending window full: ``add_async`` waits
    whenever the window is full. With it, adds are issued at that fixed rate (catching up after
    a stall, as a producer with a steady arrival rate would). A reaper takes the futures in
    order (the handle confirms entries in order) and stamps each completion.
    """

    def __init__(
        self,
        handle: AddTarget,
        entry_bytes: int,
        *,
        window: int = 0,
        turn_entries: int = 0,
        rate_per_s: float | None = None,
        keep_all: bool = False,
    ) -> None:
        self.handle = handle
        self.window = window
        self.turn_entries = turn_entries
        self.entry_bytes = entry_bytes
        self.payload = os.urandom(entry_bytes)
        self.rate_per_s = rate_per_s
        self.keep_all = keep_all
        self.stop = False
        self.issued = 0
        self._pending: deque[tuple[float, asyncio.Future[int]]] = deque()
        self._more = asyncio.Event()
        self._empty = asyncio.Event()  # set by the reaper whenever it has taken every add
        # the measured window: adds completed in [start, end) count
        self.start = float("inf")
        self.end = float("inf")
        self.entries = 0
        self.latencies: list[float] = []
        self.failed = 0
        self.first_error = ""
        # keep_all: (issued at, completed at, ok) of every add, for the failover
        self.timeline: list[tuple[float, float, bool]] = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def produce(self) -> None:
        handle, payload, pending, clock = (
            self.handle,
            self.payload,
            self._pending,
            time.perf_counter,
        )
        if self.rate_per_s is None:
            window, turn, in_turn = self.window, self.turn_entries, 0
            while not self.stop:
                if handle.pending >= window:
                    in_turn = 0  # add_async is about to wait for room: a new loop turn
                elif turn and in_turn >= turn:
                    await asyncio.sleep(0)
                    in_turn = 0
                started = clock()
                future = await handle.add_async(payload)
                in_turn += 1
                pending.append((started, future))
                self._more.set()
                self.issued += 1
            return
        began = clock()
        while not self.stop:
            due = int((clock() - began) * self.rate_per_s)
            while self.issued < due and not self.stop:
                started = clock()
                future = await handle.add_async(payload)
                pending.append((started, future))
                self._more.set()
                self.issued += 1
            await asyncio.sleep(0.001)

    async def reap(self) -> None:
        pending, clock = self._pending, time.perf_counter
        while True:
            if not pending:
                self._empty.set()
                self._more.clear()
                await self._more.wait()
                continue
            oldest = pending[0][1]
            if not oldest.done():
                # not `await oldest`: cancelling the reaper must not cancel the add
                await asyncio.wait((oldest,))
            now = clock()
            while pending and pending[0][1].done():
                started, future = pending.popleft()
                ok = not future.cancelled() and future.exception() is None
                if not ok:
                    self.failed += 1
                    if not self.first_error:
                        self.first_error = repr(
                            future.exception() if not future.cancelled() else "cancelled"
                        )
                if self.keep_all:
                    self.timeline.append((started, now, ok))
                if ok and self.start <= now < self.end:
                    self.entries += 1
                    self.latencies.append(now - started)
            if self.failed and not self.keep_all:
                raise RuntimeError(
                    f"{self.failed} add(s) failed, the first with {self.first_error}"
                )

    async def drain(self, timeout_s: float) -> None:
        """Until every add issued has completed (the producer has stopped)."""
        if self._pending:
            self._empty.clear()
            await asyncio.wait_for(self._empty.wait(), timeout_s)


async def measure_writer_cost(seconds: float, turn_entries: int) -> dict[str, Any]:
    """CPU of this process's event loop per add, with the writer driving a stub handle."""
    writer = Writer(StubHandle(), KIB, window=1 << 30, turn_entries=turn_entries)
    tasks = [asyncio.create_task(writer.produce()), asyncio.create_task(writer.reap())]
    try:
        cpu = await loop_cpu_over(writer, seconds, proc_cpu_seconds)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "seconds": seconds,
        "turn_entries": turn_entries,
        "adds": writer.entries,
        "event_loop_cpu_s": cpu,
        "us_per_add": 1e6 * cpu / writer.entries if writer.entries else float("nan"),
    }


async def timed_run(
    writer: Writer,
    cluster: LocalCluster,
    *,
    warmup_s: float,
    duration_s: float,
    sample: Callable[[LocalCluster, int], Awaitable[T]],
) -> tuple[T, T]:
    """Run ``writer`` for ``warmup_s`` unmeasured, then ``duration_s`` measured, and drain it:
    ``sample`` (CPU and counters) taken as the measured window opens and as it closes."""
    tasks = [
        asyncio.create_task(writer.produce(), name="produce"),
        asyncio.create_task(writer.reap(), name="reap"),
    ]
    try:
        loop_tid = threading.get_native_id()
        await watching(tasks, cluster, warmup_s)
        before = await sample(cluster, loop_tid)
        writer.start = time.perf_counter()
        writer.end = writer.start + duration_s
        await watching(tasks, cluster, duration_s)
        after = await sample(cluster, loop_tid)
        writer.stop = True
        await tasks[0]
        await writer.drain(60)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return before, after


async def snapshot(cluster: LocalCluster, loop_tid: int) -> ClusterSample:
    # the event loop's CPU as this benchmark has always read it: /proc/<tid>/stat
    return await sample_cluster(cluster, loop_tid, loop_cpu=proc_cpu_seconds)


def _thread_deltas(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """% of a core per thread over the window, busiest first, threads under 1% left out."""
    pct = {k: 100 * (v - before.get(k, 0.0)) / seconds for k, v in after.items()}
    return dict(
        sorted(((k, round(v, 1)) for k, v in pct.items() if v >= 1.0), key=lambda kv: -kv[1])
    )


def cpu_and_disk(
    before: ClusterSample, after: ClusterSample, payload_bytes: int, cores: int
) -> dict[str, Any]:
    seconds = after.at - before.at
    bench = after.bench_cpu - before.bench_cpu
    loop = after.bench_loop_cpu - before.bench_loop_cpu
    bookies = {b: after.bookies[b] - before.bookies.get(b, 0.0) for b in after.bookies}
    bookie_sum = sum(bookies.values())
    etcd = after.etcd - before.etcd
    busy = after.machine[0] - before.machine[0]
    steal = after.machine[1] - before.machine[1]
    per_bookie: dict[str, dict[str, Any]] = {}
    for b in after.bookies:
        m0, m1 = before.metrics.get(b, {}), after.metrics.get(b, {})
        delta = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
        threads = _thread_deltas(before.bookie_threads.get(b, {}), after.bookie_threads[b], seconds)
        per_bookie[b] = {
            "cpu_pct": 100 * bookies[b] / seconds,
            "busiest_thread": next(iter(threads.items()), ("-", 0.0)),
            "threads_pct": threads,
            "metrics_delta": delta,
            "journal_bytes": delta.get("group_bytes", 0.0),
            "stored_payload_bytes": delta.get("add_bytes", 0.0),
            "fdatasync_busy_pct": 100 * delta.get("sync_seconds", 0.0) / seconds,
            "proc_write_bytes": after.bookie_write_bytes[b] - before.bookie_write_bytes.get(b, 0),
        }
    groups = sum(p["metrics_delta"].get("groups", 0.0) for p in per_bookie.values())
    journal = sum(p["journal_bytes"] for p in per_bookie.values())
    stored = sum(p["stored_payload_bytes"] for p in per_bookie.values())
    disk = sum(p["proc_write_bytes"] for p in per_bookie.values())
    bench_threads = _thread_deltas(before.bench_threads, after.bench_threads, seconds)
    return {
        "measured_s": seconds,
        "bench_cpu_s": bench,
        "bookies_cpu_s": bookie_sum,
        "etcd_cpu_s": etcd,
        "machine_busy_cpu_s": busy,
        "machine_steal_cpu_s": steal,
        # percent of one core; the machine has `cores` cores
        "bench_pct": 100 * bench / seconds,
        "bench_event_loop_pct": 100 * loop / seconds,
        "bench_threads_pct": bench_threads,
        "bookies_pct": 100 * bookie_sum / seconds,
        "etcd_pct": 100 * etcd / seconds,
        "machine_busy_pct": 100 * busy / seconds,
        "machine_steal_pct": 100 * steal / seconds,
        "other_pct": 100 * (busy - bench - bookie_sum - etcd) / seconds,
        "cores": cores,
        "bookies": per_bookie,
        "disk": {
            "journal_bytes": journal,
            "journal_mb_per_s": journal / seconds / MB,
            "group_commits": groups,
            "mean_group_commit_bytes": journal / groups if groups else 0.0,
            "bookie_stored_payload_bytes": stored,
            "proc_write_bytes": disk,
            "proc_write_mb_per_s": disk / seconds / MB,
            # bytes the bookies' journals took per payload byte the writer had confirmed in
            # about the same window: Qw copies, plus each frame's header
            "journal_bytes_per_payload_byte": journal / payload_bytes if payload_bytes else 0.0,
            "stored_copies_per_payload_byte": stored / payload_bytes if payload_bytes else 0.0,
            "proc_write_bytes_per_payload_byte": disk / payload_bytes if payload_bytes else 0.0,
        },
    }


def limits(result: dict[str, Any]) -> list[str]:
    """What was at (or near) its limit during a workload, from the CPU and disk figures."""
    cpu = result["cpu"]
    found = []
    if cpu["bench_event_loop_pct"] >= BUSY_THREAD_PCT:
        found.append(f"writer's event loop {cpu['bench_event_loop_pct']:.0f}%")
    for bookie, b in cpu["bookies"].items():
        name, pct = b["busiest_thread"]
        if pct >= BUSY_THREAD_PCT:
            found.append(f"{bookie} {_thread_label(name)} {pct:.0f}%")
        if b["fdatasync_busy_pct"] >= BUSY_DISK_PCT:
            found.append(
                f"{bookie} journal in fdatasync {b['fdatasync_busy_pct']:.0f}% of the time"
            )
    cores = cpu["cores"]
    if cpu["machine_busy_pct"] >= BUSY_MACHINE_FRACTION * 100 * cores:
        found.append(f"all CPUs: machine {cpu['machine_busy_pct']:.0f}% of {100 * cores}%")
    if not found:
        busiest = max((b["busiest_thread"][1] for b in cpu["bookies"].values()), default=0.0)
        found.append(
            f"none at its limit (writer's loop {cpu['bench_event_loop_pct']:.0f}%, busiest bookie"
            f" thread {busiest:.0f}%, machine {cpu['machine_busy_pct']:.0f}% of {100 * cores}%)"
        )
    return found


async def run_workload(
    cluster: LocalCluster,
    store: MetadataStore,
    workload: Workload,
    *,
    warmup_s: float,
    duration_s: float,
) -> dict[str, Any]:
    q = workload.quorum
    config = LedgerClientConfig(
        max_pending_adds=workload.window,
        max_pending_bytes=workload.window * workload.entry_bytes,
    )
    result: dict[str, Any] = {
        "name": workload.name,
        "key": workload.key,
        "parameters": {
            **asdict(workload),
            "in_flight_bytes": workload.in_flight_bytes,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
            "ledger_client_config": asdict(config),
        },
    }
    client = await LedgerClient.start(store, config)
    handle: WriteHandle | None = None
    try:
        await wait_for_view(client, cluster)
        handle = await client.create_ledger(
            ensemble_size=q.ensemble, write_quorum=q.write, ack_quorum=q.ack
        )
        result["ledger_id"] = handle.ledger_id
        result["ensemble"] = list(handle.metadata.last_segment.bookies)
        writer = Writer(
            handle,
            workload.entry_bytes,
            window=workload.window,
            turn_entries=workload.turn_entries,
        )
        before, after = await timed_run(
            writer, cluster, warmup_s=warmup_s, duration_s=duration_s, sample=snapshot
        )
        entries = writer.entries
        payload = entries * workload.entry_bytes
        result.update(
            {
                "ok": True,
                "entries": entries,
                "payload_bytes": payload,
                "entries_per_s": entries / duration_s,
                "mb_per_s": payload / duration_s / MB,
                "add_latency": latency_summary(writer.latencies),
                "failed_adds": writer.failed,
                "ensemble_changes": handle.ensemble_changes,
                "cpu": cpu_and_disk(before, after, payload, os.cpu_count() or 1),
            }
        )
        result["limits"] = limits(result)
        await asyncio.wait_for(handle.close(), 30)
    except Exception as e:  # noqa: BLE001 - one failed workload is reported, the rest still run
        result.update(_failure(e, cluster))
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return result


def _failure(error: Exception, cluster: LocalCluster) -> dict[str, Any]:
    """A failed run's result: its error and every bookie's log tail."""
    return {
        "ok": False,
        "error": f"{error!r}",
        "bookie_log_tails": {str(n.bookie_id): log_tail(n.log_path) for n in cluster.bookies},
    }


def _print_workload(r: dict[str, Any]) -> None:
    if not r["ok"]:
        print(f"{r['name']}: FAILED {r['error']}", flush=True)
        return
    lat, cpu, p = r["add_latency"], r["cpu"], r["parameters"]
    print(
        f"{r['name']} (window {p['window']}, {p['turn_entries']} per turn):"
        f" {r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:,.1f} MB/s,"
        f" add p50 {ms(lat['p50_us'])} p99 {ms(lat['p99_us'])};"
        f" CPU bench {cpu['bench_pct']:.0f}% (loop {cpu['bench_event_loop_pct']:.0f}%)"
        f" bookies {cpu['bookies_pct']:.0f}% machine {cpu['machine_busy_pct']:.0f}%;"
        f" limit: {'; '.join(r['limits'])}",
        flush=True,
    )


# --- failover -------------------------------------------------------------------------------------


def _gaps(times: list[float]) -> list[tuple[float, float]]:
    """(start, length) of each gap between consecutive completion instants."""
    distinct = sorted(set(times))
    return [(a, b - a) for a, b in itertools.pairwise(distinct)]


async def run_failover(
    cluster: LocalCluster,
    store: MetadataStore,
    repetition: int,
    *,
    rate_per_s: float,
    before_s: float,
    after_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    config = LedgerClientConfig()
    result: dict[str, Any] = {
        "repetition": repetition,
        "parameters": {
            "quorum": "E3/Qw2/Qa2",
            "entry_bytes": KIB,
            "rate_per_s": rate_per_s,
            "steady_before_kill_s": before_s,
            "observed_after_kill_s": after_s,
            "ledger_client_config": asdict(config),
        },
    }
    tasks: list[asyncio.Task[None]] = []
    victim: BookieNode | None = None
    client = await LedgerClient.start(store, config)
    try:
        await wait_for_view(client, cluster)
        handle = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        ensemble = list(handle.metadata.last_segment.bookies)
        victim_id = ensemble[repetition % len(ensemble)]
        victim = next(n for n in cluster.bookies if n.bookie_id == victim_id)
        result.update({"ledger_id": handle.ledger_id, "ensemble_before": ensemble})
        result["victim"] = {"bookie_id": victim_id, "position": ensemble.index(victim_id)}
        writer = Writer(handle, KIB, rate_per_s=rate_per_s, keep_all=True)
        tasks = [
            asyncio.create_task(writer.produce(), name="produce"),
            asyncio.create_task(writer.reap(), name="reap"),
        ]
        await watching(tasks, cluster, before_s)
        LOG_CLOCK.seen.clear()
        killed_at = time.perf_counter()
        await victim.kill()  # SIGKILL is sent before its first await; then it waits for the exit
        deadline = killed_at + timeout_s
        while True:
            done, _ = await asyncio.wait(tasks, timeout=0.05, return_when="FIRST_COMPLETED")
            for task in done:
                task.result()
            now = time.perf_counter()
            if handle.ensemble_changes >= 1 and now - killed_at >= after_s:
                break
            if now >= deadline:
                break
        writer.stop = True
        await tasks[0]
        await writer.drain(timeout_s)
        await asyncio.wait_for(handle.close(), 30)

        timeline = writer.timeline
        done_times = [t for _, t, _ in timeline]
        after_kill = [t for t in done_times if t > killed_at]
        issued_after = [t for s, t, _ in timeline if s >= killed_at]
        # the steady flow: the last second before the kill (or all of it after its first 0.2 s)
        steady_from = killed_at - min(1.0, max(before_s - 0.2, 0.0))
        gaps = _gaps([t for t in done_times if t >= steady_from])
        longest = max(gaps, key=lambda g: g[1], default=(killed_at, float("nan")))
        baseline = _gaps([t for t in done_times if steady_from <= t < killed_at])
        steady = [t - s for s, t, _ in timeline if steady_from <= t < killed_at]
        around = [t - s for s, t, _ in timeline if t >= killed_at]
        ms = 1e3
        result.update(
            {
                "ok": True,
                "adds_issued": writer.issued,
                "adds_completed": len(timeline),
                "failed_adds": writer.failed,
                "first_error": writer.first_error,
                "ensemble_changes": handle.ensemble_changes,
                "ensemble_after": list(handle.metadata.last_segment.bookies),
                "victim_replaced": victim_id not in handle.metadata.last_segment.bookies,
                "achieved_rate_per_s": len(timeline) / (done_times[-1] - done_times[0])
                if len(done_times) > 1
                else 0.0,
                "kill_to_next_completion_ms": (min(after_kill) - killed_at) * ms
                if after_kill
                else None,
                "kill_to_first_completion_of_add_issued_after_kill_ms": (
                    (min(issued_after) - killed_at) * ms if issued_after else None
                ),
                **{
                    f"kill_to_{name}_ms": (t - killed_at) * ms if t is not None else None
                    for name, t in (
                        (event, LOG_CLOCK.first_after(event, killed_at))
                        for event in sorted(LOG_CLOCK.events)
                    )
                },
                "longest_gap_ms": longest[1] * ms,
                "longest_gap_starts_after_kill_ms": (longest[0] - killed_at) * ms,
                "longest_gap_before_kill_ms": max((g[1] for g in baseline), default=0.0) * ms,
                "add_latency_before_kill": latency_summary(steady),
                "add_latency_after_kill": latency_summary(around),
            }
        )
        result["ok"] = (
            writer.failed == 0 and handle.ensemble_changes >= 1 and result["victim_replaced"]
        )
    except Exception as e:  # noqa: BLE001 - reported with the others; the run goes on
        result.update(_failure(e, cluster))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await client.close()
    if victim is not None and not victim.is_running:
        # the next repetition finds the cluster whole again (not on Ctrl-C: the run is ending)
        await victim.start()
        await cluster.wait_registered()
    return result


def _print_failover(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"failover #{r['repetition'] + 1}: FAILED {r['error']}", flush=True)
        return
    print(
        f"failover #{r['repetition'] + 1} (killed {r['victim']['bookie_id']}):"
        f" next completion after {_opt_ms(r['kill_to_next_completion_ms'])},"
        f" first completion of an add issued after the kill"
        f" {_opt_ms(r['kill_to_first_completion_of_add_issued_after_kill_ms'])},"
        f" longest gap {r['longest_gap_ms']:,.1f} ms"
        f" (from {r['longest_gap_starts_after_kill_ms']:+,.1f} ms),"
        f" stream broken {_opt_ms(r['kill_to_bookie_add_stream_broken_ms'])},"
        f" ensemble changed {_opt_ms(r['kill_to_ensemble_changed_ms'])};"
        f" failed adds {r['failed_adds']}, ensemble changes {r['ensemble_changes']}",
        flush=True,
    )


def _opt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} ms"


FAILOVER_FIGURES = (
    "kill_to_next_completion_ms",
    "kill_to_first_completion_of_add_issued_after_kill_ms",
    "longest_gap_ms",
    "kill_to_bookie_add_stream_broken_ms",
    "kill_to_ledger_bookie_failed_ms",
    "kill_to_ensemble_changed_ms",
)


def failover_medians(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in FAILOVER_FIGURES:
        values = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


# --- report ---------------------------------------------------------------------------------------


def _qname(r: dict[str, Any]) -> str:
    q = r["parameters"]["quorum"]
    return f"E{q['ensemble']}/Qw{q['write']}/Qa{q['ack']}"


def _busiest_bookie_thread(r: dict[str, Any]) -> str:
    bookie, b = max(r["cpu"]["bookies"].items(), key=lambda kv: kv[1]["busiest_thread"][1])
    name, pct = b["busiest_thread"]
    return f"{pct:.0f}% ({bookie}, {_thread_label(name)})"


def _thread_label(name: str) -> str:
    base, _, tid = name.partition(":")
    return "event loop" if base == "main" else f"thread {tid}"


def _busiest_journal(r: dict[str, Any]) -> str:
    busy = max(b["fdatasync_busy_pct"] for b in r["cpu"]["bookies"].values())
    return f"{busy:.0f}% of the time"


def _machine(r: dict[str, Any]) -> str:
    c = r["cpu"]
    return f"{c['machine_busy_pct']:.0f}% ({c['other_pct']:.0f}%; {c['machine_steal_pct']:.0f}%)"


def _side_by_side(results: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    cores = results["machine"]["cpu_count"]
    small_ops = raw_pair(results, "append_fdatasync_4k", "ops_per_s")
    small_p50 = raw_pair(results, "append_fdatasync_4k", "latency.p50_us")
    bw = (
        f"append+fdatasync 1 MiB {raw_pair(results, 'append_fdatasync_1m', 'mb_per_s')};"
        f" 4 MiB {raw_pair(results, 'append_fdatasync_4m', 'mb_per_s')} MB/s"
    )
    rtt = raw_pair(results, "grpc_unary_round_trip", "latency.p50_us")
    rows: list[tuple[str, Any, str]] = [
        ("entries/s", lambda r: f"**{r['entries_per_s']:,.0f}**",
         f"4 KiB append+fdatasync {small_ops} ops/s"),
        ("MB/s (payload)", lambda r: f"**{r['mb_per_s']:,.1f}**", bw),
        ("add latency p50", lambda r: ms(r["add_latency"]["p50_us"]),
         f"gRPC round trip p50 {rtt} us; 4 KiB fdatasync p50 {small_p50} us"),
        ("add latency p99", lambda r: ms(r["add_latency"]["p99_us"]), ""),
        ("add latency p99.9", lambda r: ms(r["add_latency"]["p999_us"]), ""),
        ("add latency max", lambda r: ms(r["add_latency"]["max_us"]), ""),
        ("latency samples", lambda r: f"{r['add_latency']['samples']:,}", ""),
        ("bench process CPU (the writer)", lambda r: f"{r['cpu']['bench_pct']:.0f}%",
         f"{100 * cores}% = all {cores} cores"),
        ("of it, its event loop thread", lambda r: f"{r['cpu']['bench_event_loop_pct']:.0f}%",
         "100% = one thread's limit"),
        ("of it, the benchmark's own bookkeeping", lambda r:
         f"~{r['entries_per_s'] * results['writer_cost']['us_per_add'] / 1e4:.0f}%",
         f"{results['writer_cost']['us_per_add']:.2f} us per add, measured on a stub handle"),
        ("bookie processes CPU (sum of 4)", lambda r: f"{r['cpu']['bookies_pct']:.0f}%", ""),
        ("busiest bookie thread", _busiest_bookie_thread, "100% = one thread's limit"),
        ("etcd CPU", lambda r: f"{r['cpu']['etcd_pct']:.0f}%", ""),
        ("machine busy (other; stolen)", _machine, f"{100 * cores}%"),
        ("journal bytes per payload byte", lambda r:
         f"{r['cpu']['disk']['journal_bytes_per_payload_byte']:.2f}", "Qw copies + frame headers"),
        ("journal MB/s, all bookies", lambda r: f"{r['cpu']['disk']['journal_mb_per_s']:,.1f}",
         bw),
        ("mean group commit", lambda r:
         f"{r['cpu']['disk']['mean_group_commit_bytes'] / KIB:,.0f} KiB", ""),
        ("busiest journal: in fdatasync", _busiest_journal, "100% = syncing back to back"),
        ("what limits it", lambda r: "; ".join(r["limits"]), ""),
    ]  # fmt: skip
    lines = [
        f"| figure | {' | '.join(_qname(r) for r in runs)} | raw limit, same run (start / end) |",
        "|---|" + "---|" * len(runs) + "---|",
    ]  # fmt: skip
    for label, get, raw in rows:
        cells = [get(r) if r["ok"] else "FAILED" for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {raw} |")
    lines += [f"\n**{r['name']} FAILED**: `{r['error']}`" for r in runs if not r["ok"]]
    return lines


def _by_size(runs: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["parameters"]["entry_bytes"], []).append(r)
    return out


def _failover_lines(fo: dict[str, Any]) -> list[str]:
    p = fo["runs"][0]["parameters"]
    med = fo["medians"]
    lines = [
        "",
        "## Failover: a bookie of the ensemble SIGKILLed under a steady add rate",
        "",
        (
            f"{p['quorum']}, {size_name(p['entry_bytes'])} entries issued at a fixed"
            f" {p['rate_per_s']:,.0f} entries/s by one writer (default `LedgerClientConfig`: add"
            f" timeout {p['ledger_client_config']['add_timeout_ms']:,} ms, pending limit"
            f" {p['ledger_client_config']['max_pending_adds']:,} adds), a fresh ledger and ledger"
            f" client each time. After {p['steady_before_kill_s']:g} s of steady flow one bookie of"
            " the ledger's ensemble is SIGKILLed; the flow is watched for"
            f" {p['observed_after_kill_s']:g} s more, then the ledger is closed and the killed"
            " bookie restarted before the next repetition."
        ),
        "",
        (
            "| # | killed | SIGKILL to next completed add | SIGKILL to first completion of an add"
            " issued after it | longest gap between completions (starts at) | longest gap in"
            " the steady flow before | failed adds | ensemble changes | ensemble before / after |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fo["runs"]:
        n = r["repetition"] + 1
        if "error" in r:
            lines.append(f"| {n} | FAILED: `{r['error']}` | | | | | | | |")
            continue
        lines.append(
            f"| {n} | {r['victim']['bookie_id']} (position {r['victim']['position']})"
            f" | {_opt_ms(r['kill_to_next_completion_ms'])}"
            f" | {_opt_ms(r['kill_to_first_completion_of_add_issued_after_kill_ms'])}"
            f" | **{r['longest_gap_ms']:,.1f} ms**"
            f" ({r['longest_gap_starts_after_kill_ms']:+,.1f} ms)"
            f" | {r['longest_gap_before_kill_ms']:,.1f} ms"
            f" | {r['failed_adds']} | {r['ensemble_changes']}"
            f" | {', '.join(r['ensemble_before'])} / {', '.join(r['ensemble_after'])} |"
        )
    lines += [
        (
            f"| median | | {_opt_ms(med['kill_to_next_completion_ms'])}"
            f" | {_opt_ms(med['kill_to_first_completion_of_add_issued_after_kill_ms'])}"
            f" | **{_opt_ms(med['longest_gap_ms'])}** | | | | |"
        ),
        "",
        "Where the stall went, from the ledger client's own log events (timed when logged):",
        "",
        (
            "| # | SIGKILL to the add stream seen broken (`bookie_add_stream_broken`) | to the"
            " writer giving up on the bookie (`ledger_bookie_failed`) | to the new ensemble"
            " stored in the metadata (`ensemble_changed`) | to the first completion of an add"
            " issued after the kill |"
        ),
        "|---|---|---|---|---|",
    ]
    for r in fo["runs"]:
        if "error" in r:
            continue
        lines.append(
            f"| {r['repetition'] + 1}"
            f" | {_opt_ms(r['kill_to_bookie_add_stream_broken_ms'])}"
            f" | {_opt_ms(r['kill_to_ledger_bookie_failed_ms'])}"
            f" | {_opt_ms(r['kill_to_ensemble_changed_ms'])}"
            f" | {_opt_ms(r['kill_to_first_completion_of_add_issued_after_kill_ms'])} |"
        )
    lines.append(
        f"| median | {_opt_ms(med['kill_to_bookie_add_stream_broken_ms'])}"
        f" | {_opt_ms(med['kill_to_ledger_bookie_failed_ms'])}"
        f" | {_opt_ms(med['kill_to_ensemble_changed_ms'])}"
        f" | {_opt_ms(med['kill_to_first_completion_of_add_issued_after_kill_ms'])} |"
    )
    lines += [
        "",
        (
            "| # | add latency in the steady flow: p50 / p99 / max | adds completing after the"
            " kill: p50 / p99 / max | adds completed | achieved rate |"
        ),
        "|---|---|---|---|---|",
    ]
    for r in fo["runs"]:
        if "error" in r:
            continue
        b, a = r["add_latency_before_kill"], r["add_latency_after_kill"]
        lines.append(
            f"| {r['repetition'] + 1}"
            f" | {ms(b['p50_us'])} / {ms(b['p99_us'])} / {ms(b['max_us'])}"
            f" | {ms(a['p50_us'])} / {ms(a['p99_us'])} / {ms(a['max_us'])}"
            f" | {r['adds_completed']:,} | {r['achieved_rate_per_s']:,.0f}/s |"
        )
    lines += [
        "",
        (
            "The writer confirms entries in order, so the first entry waiting on the dead bookie"
            " holds back every later one: the longest gap between completions is the stall an"
            " application sees. The next completed add after the SIGKILL is usually an entry"
            " whose replicas had both answered already; the first completion of an add issued"
            " after the kill had to wait for the ensemble change. Completion instants are taken"
            " when the benchmark's reaper task wakes (within a loop turn of the future"
            " completing). After the ensemble change the writer re-sends what the dead bookie owed"
            " to the replacement, which this (fresh) ledger client has not connected to before."
        ),
    ]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    cores = m["cpu_count"]
    lines = [
        *report_head(results, "Ledger-client benchmark"),
        "",
        (
            f"One `LocalCluster`: its own etcd and {results['parameters']['bookies']} `magnetar"
            " bookie` processes with default settings, all on this machine, like the benchmark"
            " process itself, which runs the writer (`LedgerClient`, one ledger per workload)."
            " MB = 10^6 bytes of entry payload. Add latency is per entry, from the `add_async`"
            " call (so it includes waiting for room in the window) until its future completed,"
            " i.e. until Qa bookies had fdatasync'ed it and every earlier entry. CPU % is of one"
            f" core: the machine has {cores} cores, so {100 * cores}% is all of it. Raw limits read"
            " `start / end` of the run. No targets: figures only. The machine is shared and"
            " noisy: compare within this run only."
        ),
        "",
        *raw_limits_table(
            results, (RAW_4K_OPS, RAW_4K_P50, RAW_1M, RAW_4M, RAW_RTT_P50, RAW_RTT_P99)
        ),
    ]

    for size, runs in _by_size(results["workloads"]).items():
        p = runs[0]["parameters"]
        lines += [
            "",
            f"## {size_name(size)} entries: quorums side by side",
            "",
            (
                f"One writer, {p['window']:,} adds in flight ({size_name(p['window'] * size)}),"
                f" letting the event loop run after every {p['turn_entries']:,} adds;"
                f" {p['warmup_s']:g} s warm-up, {p['duration_s']:g} s measured per workload."
            ),
            "",
            *_side_by_side(results, runs),
        ]
    lines += [
        "",
        (
            "Bytes written to disk per MB of payload differ by Qw: E1/Qw1 stores each entry once,"
            " E2/Qw2 and E3/Qw2 twice (the journal row shows it, frame headers included), so the"
            " same payload MB/s costs the bookies Qw times the journal bandwidth and the CPU to"
            " receive, check and write it. E3/Qw2 spreads the two copies over three bookies,"
            " each taking two thirds of the entries. 'What limits it' names every thread at"
            f" >= {BUSY_THREAD_PCT:.0f}% of a core, every journal in fdatasync"
            f" >= {BUSY_DISK_PCT:.0f}% of the time, and the machine when it is"
            f" >= {BUSY_MACHINE_FRACTION:.0%} busy."
        ),
    ]

    if results["burst_workloads"]:
        paced = {r["key"]: r for r in results["workloads"]}
        lines += [
            "",
            "## The same writers refilling their whole window in one loop turn",
            "",
            (
                "The window and everything else as above, but the writer never lets the event"
                " loop run on its own: when completions free room, it refills the whole window"
                " in one turn. The handle then sends it to each bookie as one call, and the"
                " bookie client sends a call as one message however large, so writer and bookies"
                " take turns on window-sized batches."
            ),
            "",
            (
                "| workload | entries/s paced / whole window | MB/s | add p50 | add p99 | mean"
                " group commit | bench CPU | bookies CPU | machine busy |"
            ),
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for burst in results["burst_workloads"]:
            steady = paced.get(burst["key"])
            if steady is None or not steady["ok"] or not burst["ok"]:
                lines.append(f"| {burst['name']} | FAILED | | | | | | | |")
                continue

            cells = [
                " / ".join(fmt.format(get(r)) for r in (steady, burst))
                for fmt, get in (
                    ("{:,.0f}", lambda r: r["entries_per_s"]),
                    ("{:,.1f}", lambda r: r["mb_per_s"]),
                    ("{}", lambda r: ms(r["add_latency"]["p50_us"])),
                    ("{}", lambda r: ms(r["add_latency"]["p99_us"])),
                    ("{:,.0f} KiB", lambda r: r["cpu"]["disk"]["mean_group_commit_bytes"] / KIB),
                    ("{:.0f}%", lambda r: r["cpu"]["bench_pct"]),
                    ("{:.0f}%", lambda r: r["cpu"]["bookies_pct"]),
                    ("{:.0f}%", lambda r: r["cpu"]["machine_busy_pct"]),
                )
            ]
            name = f"{_qname(burst)}, {size_name(burst['parameters']['entry_bytes'])}"
            lines.append(f"| {name} | " + " | ".join(cells) + " |")

    if results["failover"]["runs"]:
        lines += _failover_lines(results["failover"])
    return report_text(
        lines, "Raw figures, parameters, per-thread CPU and machine details", next_to="it"
    )


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    keys = ", ".join(w.key for w in all_workloads(FULL_SIZES))
    parser, add = bench_parser(
        "ledger_bench.py",
        (
            "Benchmark the ledger client against a local cluster of real processes (its own etcd"
            f" and {BOOKIES} bookies, default settings): one pipelined writer per workload,"
            " quorums E1/Qw1/Qa1, E2/Qw2/Qa2 and E3/Qw2/Qa2 side by side, 1 KiB and 64 KiB"
            " entries; entries/s, MB/s, add latency p50/p99/p99.9/max, CPU of the benchmark"
            " process and of the bookies, machine busy. The same workloads again with the"
            " writer refilling its whole window in one event-loop turn. Then failover: SIGKILL a"
            " bookie of an E3/Qw2/Qa2 ensemble under a steady add rate and measure the writer's"
            " stall. The raw limits of this machine are measured in the same run at its start"
            " and end. Writes ledger-<date>.json and .md to --out. Exits 0 if every workload"
            " and failover succeeded, else 1 (results are written either way)."
        ),
    )
    add_workload_time_options(add)
    add_quick_and_tag(
        add,
        "ledger",
        quick="1 s per workload, 0.5 s per raw measurement, only 1 KiB entries, one failover",
    )
    add("--only", action="append", metavar="KEY", help=f"run only this workload; keys: {keys}")
    add("--window", type=int, help="adds in flight for every workload (default: per size)")
    add(
        "--turn-entries",
        type=int,
        help="adds per event-loop turn for every paced workload (default: per size)",
    )
    add("--no-burst", action="store_true", help="skip the whole-window-per-turn comparison")
    add("--failover-reps", type=int, default=3, help="failover repetitions (0: none)")
    add("--failover-rate", type=float, default=2000.0, help="entries/s during the failover")
    add(
        "--failover-before-s",
        type=float,
        default=1.5,
        help="seconds of steady flow before the SIGKILL",
    )
    add(
        "--failover-after-s",
        type=float,
        default=3.0,
        help="seconds watched after the SIGKILL (at least until the ensemble changed)",
    )
    add(
        "--failover-timeout-s",
        type=float,
        default=60.0,
        help="give up on a failover repetition after this long",
    )
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the cluster and the raw disk tests (so both"
            " are on the same file system) and removed at the end"
        ),
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s = 1.0
        args.raw_s = 0.5
        args.failover_reps = min(args.failover_reps, 1)
        args.tag = args.tag or "quick"
    if args.only:
        unknown = set(args.only) - {w.key for w in all_workloads(FULL_SIZES)}
        if unknown:
            parser.error(f"unknown workload(s) {sorted(unknown)}")
    if args.window is not None and args.window < 1:
        parser.error("--window must be at least 1")
    if args.turn_entries is not None and args.turn_entries < 0:
        parser.error("--turn-entries must be at least 0")
    return args


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    workloads = all_workloads(QUICK_SIZES if args.quick else FULL_SIZES)
    if args.only:
        workloads = [w for w in all_workloads(FULL_SIZES) if w.key in args.only]
    turn = args.turn_entries
    return [
        dataclasses.replace(
            w, window=args.window or w.window, turn_entries=w.turn_entries if turn is None else turn
        )
        for w in workloads
    ]


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    print(f"cluster data and raw disk tests in {root}", flush=True)
    workloads = chosen_workloads(args)
    bursts = [] if args.no_burst else [dataclasses.replace(w, turn_entries=0) for w in workloads]
    bursts = [w for w in bursts if w not in workloads]
    results: dict[str, Any] = {
        **results_head("ledger", "ledger_bench.py", argv, started, args),
        "parameters": {
            "bookies": BOOKIES,
            "bookie_settings": "defaults (LocalCluster, no extra bookie arguments)",
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "raw_s": args.raw_s,
            "windows_and_turns": {size_name(k): v for k, v in WINDOWS.items()},
            "window_override": args.window,
            "turn_entries_override": args.turn_entries,
            "failover_reps": args.failover_reps,
            "failover_rate_per_s": args.failover_rate,
        },
        "machine": machine_info(root),
        "raw_limits": {},
        "workloads": [],
        "burst_workloads": [],
        "failover": {"runs": [], "medians": {}},
    }
    await raw_limits_at(results, "start", root / "raw", args.raw_s)
    results["writer_cost"] = await measure_writer_cost(1.0, WINDOWS[KIB][1])
    print(
        f"the benchmark's own cost per add (stub handle): "
        f"{results['writer_cost']['us_per_add']:.2f} us of its event loop",
        flush=True,
    )
    cluster = LocalCluster(root / "cluster", bookies=BOOKIES)
    store: MetadataStore | None = None
    try:
        await cluster.start()
        results["cluster"] = {
            "metadata_url": cluster.metadata_url,
            "bookies": [n.bookie_id for n in cluster.bookies],
        }
        store = await open_store(cluster.metadata_url)
        for group, chosen in (("workloads", workloads), ("burst_workloads", bursts)):
            for workload in chosen:
                result = await run_workload(
                    cluster, store, workload, warmup_s=args.warmup_s, duration_s=args.duration_s
                )
                results[group].append(result)
                _print_workload(result)
        for repetition in range(args.failover_reps):
            result = await run_failover(
                cluster,
                store,
                repetition,
                rate_per_s=args.failover_rate,
                before_s=args.failover_before_s,
                after_s=args.failover_after_s,
                timeout_s=args.failover_timeout_s,
            )
            results["failover"]["runs"].append(result)
            _print_failover(result)
        results["failover"]["medians"] = failover_medians(results["failover"]["runs"])
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        await cluster.aclose()
    await raw_limits_at(results, "end", root / "raw", args.raw_s)
    results["elapsed_s"] = time.time() - started
    return results


def main(argv: list[str] | None = None) -> int:
    # the ledger client logs every ledger it creates and closes: only warnings (a bookie failed)
    # reach the console; LOG_CLOCK times the events the failover is broken down by
    ok = all_ok("workloads", "burst_workloads", "failover.runs")
    return bench_main(
        "ledger", argv, parse_args, bench, render_markdown, ok=ok, log_clock=LOG_CLOCK
    )


if __name__ == "__main__":
    raise SystemExit(main())
