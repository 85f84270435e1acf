"""Bookie benchmark: add throughput and latency of one real bookie process, next to the raw
limits of this machine (disk append+fdatasync, loopback gRPC) measured in the same run.

Run from the repository root::

    .venv/bin/python bench/bookie_bench.py              # full run, about a minute
    .venv/bin/python bench/bookie_bench.py --quick      # smoke test, about 10 seconds

Its results: ``bookie-<date>.json`` (every raw figure) and ``.md`` (the tables), written as
every benchmark writes them (see bench/harness.py); bench/README.md says what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    BOOKIE_COUNTERS,
    KIB,
    MB,
    RAW_1M,
    RAW_4K_OPS,
    RAW_4K_P50,
    RAW_4K_P99,
    RAW_4M,
    RAW_RTT_P50,
    RAW_RTT_P99,
    REPO,
    add_output_options,
    add_quick_and_tag,
    add_workload_time_options,
    all_ok,
    bench_main,
    bench_parser,
    latency_summary,
    machine_cpu_seconds,
    machine_info,
    ms,
    print_checks,
    proc_cpu_seconds,
    raw_limits_at,
    raw_limits_table,
    raw_pair,
    report_head,
    report_text,
    results_head,
    scrape_counters,
    size_name,
    stop_process,
)

from bookie.client.bookie_client import BookieClient
from bookie.entries import AddEntry, entry_checksum

TARGET_64K_BANDWIDTH_RATIO = 0.70
TARGET_1K_ENTRIES_PER_S = 20_000


# --- workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """One run against a fresh bookie: ``ledgers`` writers, each keeping ``window`` calls of
    ``batch`` entries of ``entry_bytes`` in flight."""

    entry_bytes: int
    ledgers: int
    batch: int
    window: int

    @property
    def name(self) -> str:
        return f"{size_name(self.entry_bytes)} x {self.ledgers} ledger{'s' * (self.ledgers > 1)}"

    @property
    def key(self) -> str:
        return f"{size_name(self.entry_bytes)}x{self.ledgers}".replace(" ", "")

    @property
    def in_flight_bytes_per_ledger(self) -> int:
        return self.entry_bytes * self.batch * self.window


# Batch (entries per add_entries call) and window (calls in flight per ledger) keep the pipeline
# full. The client packs every call waiting on its one stream into messages of up to 4 MiB, and
# the bookie answers per message, so with 4 MiB or less in flight the whole window travels as one
# message and bookie and client take turns (stop-and-wait; `--batch 4 --window 4` on 64KiBx1
# shows it). Hence 8 MiB in flight in all, two messages, for 1 KiB and 64 KiB entries, split
# evenly over 16 ledgers, since the stream they share is what has to stay full. 100 B entries
# are capped at 4096 entries (400 KiB) in flight: 8 MiB would be 84,000 entries and a third of a
# second of queueing per add, for about a quarter more entries/s.
FULL_WORKLOADS = (
    Workload(entry_bytes=100, ledgers=1, batch=256, window=16),
    Workload(entry_bytes=100, ledgers=16, batch=64, window=4),
    Workload(entry_bytes=1 * KIB, ledgers=1, batch=512, window=16),
    Workload(entry_bytes=1 * KIB, ledgers=16, batch=128, window=4),
    Workload(entry_bytes=64 * KIB, ledgers=1, batch=16, window=8),
    Workload(entry_bytes=64 * KIB, ledgers=16, batch=4, window=2),
)
QUICK_WORKLOADS = tuple(w for w in FULL_WORKLOADS if w.ledgers == 1 and w.entry_bytes >= KIB)


# --- the bookie process ---------------------------------------------------------------------------


class BookieRunner:
    """One ``magnetar bookie`` process on a fresh data directory; always stopped by :meth:`stop`."""

    def __init__(self, data_dir: Path, extra_args: list[str]) -> None:
        self.data_dir = data_dir
        self.args = [
            sys.executable,
            "-m",
            "magnetar.cli",
            "bookie",
            "--data-dir",
            str(data_dir),
            "--metadata",
            f"embedded://{data_dir / 'meta'}",
            "--port",
            "0",
            "--http-port",
            "0",
            "--data-port",
            "0",
            "--bind-host",
            "127.0.0.1",
            "--advertised-host",
            "127.0.0.1",
            "--log-format",
            "json",
            *extra_args,
        ]
        self.log_path = data_dir.parent / f"{data_dir.name}.stderr.log"
        self.process: asyncio.subprocess.Process | None = None
        self.address = ""
        """host:port of its gRPC service."""
        self.data_address = ""
        """host:port of its data protocol (where the ledger client connects)."""
        self.metrics_url = ""

    async def start(self, timeout_s: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True)
        with self.log_path.open("wb") as log_file:
            self.process = await asyncio.create_subprocess_exec(
                *self.args,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"the bookie did not start within {timeout_s} s") from None
        text = line.decode().strip()
        # "bookie <id> serving on 127.0.0.1:PORT, data on 127.0.0.1:DATA
        #  (metrics: http://127.0.0.1:HTTP/metrics)"
        if " serving on " not in text:
            await self.process.wait()
            raise RuntimeError(
                f"the bookie exited with {self.process.returncode} before it was ready"
                " (its log is below)"
            )
        self.address = text.split(" serving on ", 1)[1].split()[0].rstrip(",")
        self.data_address = text.split(" data on ", 1)[1].split()[0]
        self.metrics_url = text.rsplit("metrics: ", 1)[1].rstrip(")")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def check_alive(self) -> None:
        if self.process is not None and self.process.returncode is not None:
            raise RuntimeError(
                f"the bookie exited with {self.process.returncode} (its log is below)"
            )

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    async def scrape(self) -> dict[str, float]:
        """The bookie's journal and add counters, and the adds it refused, from its /metrics."""
        return await scrape_counters(
            self.metrics_url,
            {**BOOKIE_COUNTERS, "magnetar_bookie_adds_refused_total": "adds_refused"},
        )

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not ended within ``grace_s``."""
        process = self.process
        if process is None:
            return None
        await stop_process(process, grace_s, signal.SIGTERM)
        return process.returncode


# --- the load -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """Adds completed inside the measured window [start, end)."""

    start: float = float("inf")
    end: float = float("inf")
    stop: bool = False
    entries: int = 0
    payload_bytes: int = 0
    calls: int = 0
    refused_entries: int = 0
    latencies: list[float] = field(default_factory=list)


class LedgerWriter:
    """Adds consecutive entries to one ledger, ``window`` calls of ``batch`` entries in flight."""

    def __init__(
        self, client: BookieClient, ledger_id: int, workload: Workload, tally: Tally
    ) -> None:
        self.client = client
        self.ledger_id = ledger_id
        self.workload = workload
        self.tally = tally
        self.payload = os.urandom(workload.entry_bytes)
        self.next_entry_id = 0
        self.last_add_confirmed = -1
        self._done: dict[int, int] = {}  # first entry id of a completed call -> its last

    def _next_batch(self) -> list[AddEntry]:
        first = self.next_entry_id
        self.next_entry_id += self.workload.batch
        lac, ledger_id, payload = self.last_add_confirmed, self.ledger_id, self.payload
        return [
            AddEntry(ledger_id, e, lac, payload, entry_checksum(ledger_id, e, lac, payload))
            for e in range(first, first + self.workload.batch)
        ]

    def _confirm(self, first: int, last: int) -> None:
        # the LAC moves over a contiguous run of acknowledged entries only, as a real writer's
        self._done[first] = last
        while (nxt := self.last_add_confirmed + 1) in self._done:
            self.last_add_confirmed = self._done.pop(nxt)

    async def _pipe(self) -> None:
        tally = self.tally
        size = self.workload.entry_bytes
        while not tally.stop:
            batch = self._next_batch()
            started = time.perf_counter()
            failures = await self.client.add_entries(batch)
            ended = time.perf_counter()
            self._confirm(batch[0].entry_id, batch[-1].entry_id)
            if tally.start <= ended < tally.end:
                tally.latencies.append(ended - started)
                tally.calls += 1
                stored = len(batch) - len(failures)
                tally.entries += stored
                tally.payload_bytes += stored * size
                tally.refused_entries += len(failures)
            if failures:
                raise RuntimeError(
                    f"the bookie refused {len(failures)} entries of ledger {self.ledger_id}:"
                    f" {failures[0].error!r}"
                )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workload.window):
                group.create_task(self._pipe())


async def run_workload(
    workload: Workload,
    data_dir: Path,
    *,
    warmup_s: float,
    duration_s: float,
    bookie_args: list[str],
) -> dict[str, Any]:
    bookie = BookieRunner(data_dir, bookie_args)
    result: dict[str, Any] = {
        "name": workload.name,
        "key": workload.key,
        "parameters": {
            **asdict(workload),
            "in_flight_bytes_per_ledger": workload.in_flight_bytes_per_ledger,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
        },
        "bookie_command": shlex.join(bookie.args),
    }
    client: BookieClient | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        await bookie.start()
        client = BookieClient(bookie.data_address)
        tally = Tally()
        writers = [LedgerWriter(client, 1000 + i, workload, tally) for i in range(workload.ledgers)]
        tasks = [asyncio.create_task(w.run(), name=f"writer-{w.ledger_id}") for w in writers]

        async def sleep_watching(seconds: float) -> None:
            # fail fast if a writer or the bookie dies instead of sleeping through it
            done, _ = await asyncio.wait(tasks, timeout=seconds, return_when="FIRST_COMPLETED")
            for task in done:
                task.result()
            bookie.check_alive()

        await sleep_watching(warmup_s)
        metrics_before = await bookie.scrape()
        bookie_cpu_before = proc_cpu_seconds(bookie.pid)
        client_cpu_before = time.process_time()
        machine_before = machine_cpu_seconds()
        tally.start = time.perf_counter()
        tally.end = tally.start + duration_s
        await sleep_watching(duration_s)
        ended = time.perf_counter()
        measured_s = ended - tally.start
        bookie_cpu = proc_cpu_seconds(bookie.pid) - bookie_cpu_before
        client_cpu = time.process_time() - client_cpu_before
        machine_after = machine_cpu_seconds()
        metrics_after = await bookie.scrape()
        tally.stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        elapsed = duration_s  # adds are counted by completion time inside [start, start + duration)
        delta = {k: metrics_after.get(k, 0.0) - metrics_before.get(k, 0.0) for k in metrics_after}
        machine_busy = machine_after[0] - machine_before[0]
        machine_steal = machine_after[1] - machine_before[1]
        machine_total = machine_after[2] - machine_before[2]
        groups = delta.get("groups", 0.0)
        result.update(
            {
                "ok": True,
                "client_max_message_bytes": client.max_message_bytes,
                "entries": tally.entries,
                "calls": tally.calls,
                "payload_bytes": tally.payload_bytes,
                "refused_entries": tally.refused_entries,
                "entries_per_s": tally.entries / elapsed,
                "mb_per_s": tally.payload_bytes / elapsed / MB,
                "calls_per_s": tally.calls / elapsed,
                "add_latency": latency_summary(tally.latencies),
                "cpu": {
                    "measured_s": measured_s,
                    "bookie_cpu_s": bookie_cpu,
                    "client_cpu_s": client_cpu,
                    "machine_busy_cpu_s": machine_busy,
                    "machine_steal_cpu_s": machine_steal,
                    "machine_total_cpu_s": machine_total,
                    # percent of one core; the machine has cpu_count cores
                    "bookie_pct": 100 * bookie_cpu / measured_s,
                    "client_pct": 100 * client_cpu / measured_s,
                    "machine_busy_pct": 100 * machine_busy / measured_s,
                    "machine_steal_pct": 100 * machine_steal / measured_s,
                    "other_pct": 100 * (machine_busy - bookie_cpu - client_cpu) / measured_s,
                },
                "bookie_journal": {
                    "delta": delta,
                    "group_commits_per_s": groups / elapsed,
                    "mean_group_bytes": delta.get("group_bytes", 0.0) / groups if groups else 0.0,
                    "mean_write_fdatasync_us": (
                        1e6 * delta.get("sync_seconds", 0.0) / delta["syncs"]
                        if delta.get("syncs")
                        else 0.0
                    ),
                    "disk_busy_pct": 100 * delta.get("sync_seconds", 0.0) / elapsed,
                },
            }
        )
    except Exception as e:  # noqa: BLE001 - one failed workload is reported, the rest still run
        result.update({"ok": False, "error": f"{e!r}", "bookie_log_tail": bookie.log_tail()})
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        result["bookie_exit_code"] = await bookie.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _print_workload(r: dict[str, Any]) -> None:
    if not r["ok"]:
        print(f"{r['name']}: FAILED {r['error']}", flush=True)
        return
    lat, cpu = r["add_latency"], r["cpu"]
    print(
        f"{r['name']}: {r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:,.1f} MB/s,"
        f" add p50 {lat['p50_us'] / 1000:,.2f} ms p99 {lat['p99_us'] / 1000:,.2f} ms;"
        f" CPU bookie {cpu['bookie_pct']:.0f}% client {cpu['client_pct']:.0f}%"
        f" machine {cpu['machine_busy_pct']:.0f}%",
        flush=True,
    )


# --- report ---------------------------------------------------------------------------------------


def checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The two targets of the issue, each on the best of the 1- and 16-ledger runs."""
    ran = {w["parameters"]["entry_bytes"] for w in results["workloads"]}
    workloads = [w for w in results["workloads"] if w["ok"]]
    raw = (results["raw_limits"]["start"], results["raw_limits"]["end"])
    # reference bandwidth: the better of 1 MiB and 4 MiB writes, averaged over start and end
    by_size = {
        key: [r[key]["mb_per_s"] for r in raw]
        for key in ("append_fdatasync_1m", "append_fdatasync_4m")
    }
    ref_key = max(by_size, key=lambda k: sum(by_size[k]))
    ref = sum(by_size[ref_key]) / len(by_size[ref_key])
    out = []

    big = [w for w in workloads if w["parameters"]["entry_bytes"] == 64 * KIB]
    best = max(big, key=lambda w: w["mb_per_s"], default=None)
    check: dict[str, Any] = {
        "name": "64 KiB entries reach >= 70% of raw large append+fdatasync bandwidth",
        "reference": f"{ref_key} mean of start/end",
        "reference_mb_per_s": ref,
        "reference_samples_mb_per_s": by_size[ref_key],
        "target_ratio": TARGET_64K_BANDWIDTH_RATIO,
    }
    if 64 * KIB not in ran:
        check.update({"verdict": "NOT RUN", "why": "no 64 KiB workload was selected"})
    elif best is None:
        check.update({"verdict": "MISS", "why": "no 64 KiB workload completed"})
    else:
        ratio = best["mb_per_s"] / ref
        check.update(
            {
                "workload": best["name"],
                "measured_mb_per_s": best["mb_per_s"],
                "ratio": ratio,
                "ratio_vs_start_and_end": [best["mb_per_s"] / v for v in by_size[ref_key]],
                "verdict": "PASS" if ratio >= TARGET_64K_BANDWIDTH_RATIO else "MISS",
            }
        )
    out.append(check)

    small = [w for w in workloads if w["parameters"]["entry_bytes"] == KIB]
    best = max(small, key=lambda w: w["entries_per_s"], default=None)
    check = {
        "name": "1 KiB entries reach >= 20,000 entries/s",
        "target_entries_per_s": TARGET_1K_ENTRIES_PER_S,
    }
    if KIB not in ran:
        check.update({"verdict": "NOT RUN", "why": "no 1 KiB workload was selected"})
    elif best is None:
        check.update({"verdict": "MISS", "why": "no 1 KiB workload completed"})
    else:
        check.update(
            {
                "workload": best["name"],
                "measured_entries_per_s": best["entries_per_s"],
                "ratio": best["entries_per_s"] / TARGET_1K_ENTRIES_PER_S,
                "verdict": "PASS" if best["entries_per_s"] >= TARGET_1K_ENTRIES_PER_S else "MISS",
            }
        )
    out.append(check)
    return out


def render_markdown(results: dict[str, Any]) -> str:
    start, end = results["raw_limits"]["start"], results["raw_limits"]["end"]
    m = results["machine"]

    small_ops = raw_pair(results, "append_fdatasync_4k", "ops_per_s")
    small_p50 = raw_pair(results, "append_fdatasync_4k", "latency.p50_us")
    small_p99 = raw_pair(results, "append_fdatasync_4k", "latency.p99_us")
    bw_1m = raw_pair(results, "append_fdatasync_1m", "mb_per_s")
    bw_4m = raw_pair(results, "append_fdatasync_4m", "mb_per_s")
    big1_p50 = raw_pair(results, "append_fdatasync_1m", "latency.p50_us")
    big4_p50 = raw_pair(results, "append_fdatasync_4m", "latency.p50_us")
    rtt_p50 = raw_pair(results, "grpc_unary_round_trip", "latency.p50_us")
    rtt_p99 = raw_pair(results, "grpc_unary_round_trip", "latency.p99_us")
    cores = m["cpu_count"]

    lines = [
        *report_head(results, "Bookie benchmark"),
        "",
        (
            "MB = 10^6 bytes of entry payload. Latency is per `add_entries` call (a batch of"
            " entries of one ledger), from the call to its return, i.e. until the bookie has"
            " fdatasync'ed it."
            " CPU % is of one core: the machine has"
            f" {cores} cores, so {100 * cores}% is all of it. Raw limits read `start / end` of the"
            " run. The machine is shared and noisy: compare within this run only."
        ),
        "",
        "## Checks",
        "",
    ]
    for c in results["checks"]:
        if "workload" not in c:
            lines.append(f"- **{c['verdict']}** {c['name']}: {c['why']}")
        elif "measured_mb_per_s" in c:
            lines.append(
                f"- **{c['verdict']}** {c['name']}: best is {c['workload']} at"
                f" {c['measured_mb_per_s']:,.0f} MB/s = **{c['ratio']:.0%}** of"
                f" {c['reference_mb_per_s']:,.0f} MB/s ({c['reference']}; vs start / end alone:"
                f" {' / '.join(f'{r:.0%}' for r in c['ratio_vs_start_and_end'])})."
            )
        else:
            lines.append(
                f"- **{c['verdict']}** {c['name']}: best is {c['workload']} at"
                f" **{c['measured_entries_per_s']:,.0f} entries/s**"
                f" ({c['ratio']:.0%} of the target)."
            )
    lines += [
        "",
        *raw_limits_table(
            results,
            (RAW_4K_OPS, RAW_4K_P50, RAW_4K_P99, RAW_1M, RAW_4M, RAW_RTT_P50, RAW_RTT_P99),
        ),
    ]

    lines += [
        "",
        "## Summary",
        "",
        (
            "| workload | entries/s | MB/s | add p50 | add p99 | add p99.9 | add max | bookie CPU"
            " | client CPU | machine busy |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in results["workloads"]:
        if not w["ok"]:
            lines.append(f"| {w['name']} | FAILED (below) | | | | | | | | |")
            continue
        lat, cpu = w["add_latency"], w["cpu"]
        lines.append(
            f"| {w['name']} | {w['entries_per_s']:,.0f} | {w['mb_per_s']:,.1f}"
            f" | {ms(lat['p50_us'])} | {ms(lat['p99_us'])} | {ms(lat['p999_us'])}"
            f" | {ms(lat['max_us'])} | {cpu['bookie_pct']:.0f}% | {cpu['client_pct']:.0f}%"
            f" | {cpu['machine_busy_pct']:.0f}% |"
        )

    for w in results["workloads"]:
        p = w["parameters"]
        lines += [
            "",
            f"## {w['name']}",
            "",
            (
                f"{p['ledgers']} ledger(s), each keeping {p['window']} calls of {p['batch']}"
                f" entries of {size_name(p['entry_bytes'])} in flight"
                f" ({size_name(p['in_flight_bytes_per_ledger'])} per ledger,"
                f" {size_name(p['in_flight_bytes_per_ledger'] * p['ledgers'])} in all);"
                f" {p['warmup_s']:g} s warm-up, {p['duration_s']:g} s measured."
            ),
            "",
        ]
        if not w["ok"]:
            lines += [
                f"**FAILED**: `{w['error']}`",
                "",
                "```",
                w.get("bookie_log_tail", ""),
                "```",
            ]
            continue
        lat, cpu, j = w["add_latency"], w["cpu"], w["bookie_journal"]
        size = p["entry_bytes"]
        per_sync = f"{size * p['batch'] / KIB:,.1f} KiB"
        lines += [
            "| figure | measured | raw limit, same run (start / end) |",
            "|---|---|---|",
            (
                f"| entries/s | {w['entries_per_s']:,.0f} | 4 KiB append+fdatasync:"
                f" {small_ops} ops/s (one fdatasync per entry would give this) |"
            ),
            (
                f"| MB/s (payload) | {w['mb_per_s']:,.1f} | append+fdatasync 1 MiB: {bw_1m} MB/s;"
                f" 4 MiB: {bw_4m} MB/s |"
            ),
            (
                f"| add calls/s ({p['batch']} entries, {per_sync} each) | {w['calls_per_s']:,.0f}"
                f" | gRPC round trips/s, one at a time:"
                f" {start['grpc_unary_round_trip']['calls_per_s']:,.0f} /"
                f" {end['grpc_unary_round_trip']['calls_per_s']:,.0f} |"
            ),
            (
                f"| add latency p50 | {ms(lat['p50_us'])} | fdatasync 4 KiB p50 {small_p50} us;"
                f" gRPC round trip p50 {rtt_p50} us |"
            ),
            (
                f"| add latency p99 | {ms(lat['p99_us'])} | fdatasync 4 KiB p99 {small_p99} us;"
                f" gRPC round trip p99 {rtt_p99} us |"
            ),
            f"| add latency p99.9 | {ms(lat['p999_us'])} | ({lat['samples']:,} samples) |",
            f"| add latency max | {ms(lat['max_us'])} | |",
            (
                f"| bookie CPU | {cpu['bookie_pct']:.0f}% of a core | {100 * cores}% = all"
                f" {cores} cores |"
            ),
            f"| client (this script) CPU | {cpu['client_pct']:.0f}% of a core | |",
            (
                f"| whole machine busy | {cpu['machine_busy_pct']:.0f}% (other processes and"
                f" kernel: {cpu['other_pct']:.0f}%; stolen by the hypervisor:"
                f" {cpu['machine_steal_pct']:.0f}%) | {100 * cores}% |"
            ),
            (
                f"| bookie group commits/s | {j['group_commits_per_s']:,.0f}"
                f" (mean {j['mean_group_bytes'] / KIB:,.0f} KiB each) | 4 KiB fdatasyncs/s:"
                f" {small_ops} |"
            ),
            (
                f"| bookie write+fdatasync time | mean {j['mean_write_fdatasync_us']:,.0f} us,"
                f" per group, {j['disk_busy_pct']:.0f}% of the time | one append+fdatasync p50:"
                f" 1 MiB {big1_p50} us; 4 MiB {big4_p50} us |"
            ),
        ]
    return report_text(lines, "Raw figures, parameters and machine details")


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "bookie_bench.py",
        (
            "Benchmark one real bookie process: adds of 100 B, 1 KiB and 64 KiB entries from 1"
            " and 16 concurrent ledgers, each ledger keeping a window of add_entries calls in"
            " flight; entries/s, MB/s, add latency p50/p99/p99.9/max, bookie and client CPU."
            " The raw limits of this machine (4 KiB append+fdatasync ops/s, 1 MiB and 4 MiB"
            " append+fdatasync MB/s, loopback gRPC round trip) are measured in the same file"
            " system at the start and at the end of the run. Writes bookie-<date>.json and"
            " bookie-<date>.md to --out; checks two targets (64 KiB entries >= 70% of raw"
            " large-append bandwidth; 1 KiB entries >= 20,000 entries/s) and reports PASS or"
            " MISS. Exits 0 whatever the verdicts, 1 if a workload failed (results are written"
            " either way)."
        ),
    )
    add_workload_time_options(add)
    add_quick_and_tag(
        add,
        "bookie",
        quick="1 s per workload, 0.5 s per raw measurement, only 1 KiB and 64 KiB entries from"
        " 1 ledger",
        tag="name the results bookie-<date>-<TAG>.*, e.g. for a run with --only, --batch or"
        " --bookie-arg, so it does not replace the full run's files",
    )
    add(
        "--only",
        action="append",
        metavar="KEY",
        help="run only this workload (repeatable); keys: "
        + ", ".join(w.key for w in FULL_WORKLOADS),
    )
    add("--batch", type=int, help="entries per add_entries call, for every workload run")
    add("--window", type=int, help="add_entries calls in flight per ledger, for every workload run")
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for bookie data and the raw disk tests (so both"
            " are on the same file system) and removed at the end"
        ),
    )
    add(
        "--bookie-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every bookie, e.g. --bookie-arg=--storage-max-group-wait-ms=0"
        " (repeatable; recorded in the results)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s = 1.0
        args.raw_s = 0.5
        args.tag = args.tag or "quick"
    if args.only:
        unknown = set(args.only) - {w.key for w in FULL_WORKLOADS}
        if unknown:
            parser.error(f"unknown workload(s) {sorted(unknown)}")
    for name in ("batch", "window"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    workloads = QUICK_WORKLOADS if args.quick else FULL_WORKLOADS
    if args.only:
        workloads = tuple(w for w in FULL_WORKLOADS if w.key in args.only)
    return [
        dataclasses.replace(w, batch=args.batch or w.batch, window=args.window or w.window)
        for w in workloads
    ]


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    print(f"data and raw disk tests in {root}", flush=True)
    results: dict[str, Any] = {
        **results_head("bookie", "bookie_bench.py", argv, started, args),
        "parameters": {
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "raw_s": args.raw_s,
            "bookie_args": args.bookie_arg,
        },
        "machine": machine_info(root),
        "raw_limits": {},
        "workloads": [],
    }
    await raw_limits_at(results, "start", root / "raw", args.raw_s)
    for workload in chosen_workloads(args):
        result = await run_workload(
            workload,
            root / workload.key,
            warmup_s=args.warmup_s,
            duration_s=args.duration_s,
            bookie_args=args.bookie_arg,
        )
        results["workloads"].append(result)
        _print_workload(result)
    await raw_limits_at(results, "end", root / "raw", args.raw_s)
    results["elapsed_s"] = time.time() - started
    results["checks"] = checks(results)
    return results


def _verdicts(results: dict[str, Any], args: argparse.Namespace) -> bool:
    print_checks(results["checks"])
    return all_ok("workloads")(results, args)


def main(argv: list[str] | None = None) -> int:
    # the client logs each add stream it closes; the benchmark's own output is enough
    return bench_main("bookie", argv, parse_args, bench, render_markdown, ok=_verdicts)


if __name__ == "__main__":
    raise SystemExit(main())
