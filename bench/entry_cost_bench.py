"""What one entry costs on its way in: tasks, thread hops, protobuf encodes and decodes, CPU.

Everything in this one process and one event loop, so that one set of counters sees the whole
path: a ``magnetar.aio`` producer -> the broker (gRPC Produce, topic, envelope, managed ledger)
-> the ledger client -> the framed data protocol -> three bookies (Qw 2, Qa 2) and back, on a
memory metadata store, the bookies' data on ``/dev/shm`` when the machine has it.

Workloads, each message alone in its entry (``batching_max_messages=1``):

- ``serial-100B``: one send at a time, 100-byte messages (entries travel alone, as at low
  rates: nothing amortises a per-entry cost);
- ``window-100B``: 64 sends in flight (group commits hold many entries);
- ``serial-128KiB``: one send at a time, 128 KiB messages (the copies and encodes of a large
  payload).

Each workload runs twice:

1. **counted**: every ``asyncio`` task created (a task factory), every executor submission
   (``loop.run_in_executor``, which ``asyncio.to_thread`` uses: a thread hop), and every
   protobuf ``SerializeToString`` / ``FromString`` / ``ParseFromString`` called from Python
   (a profile hook on C calls), each charged to the first frame of this repository on the
   stack (client, broker, managed ledger, ledger client, bookie data port, bookie). gRPC's own
   (de)serialization runs in its Cython core and is not seen: it is one encode and one decode
   per stream message. The bookies' journal group commits are counted too;
2. **timed**, without the hooks: p50/p99 of ``send`` and the process's CPU per message.

Run it on each tree, alternating (``git worktree add --detach /work/before main``), then render
the runs together (every figure the median of a tree's runs)::

    PYTHONPATH=/work/before .venv/bin/python bench/entry_cost_bench.py --json /tmp/before-1.json
    PYTHONPATH=. .venv/bin/python bench/entry_cost_bench.py --json /tmp/after-1.json
    ...
    .venv/bin/python bench/entry_cost_bench.py --before /tmp/before-*.json \\
        --after /tmp/after-*.json --out bench/results/entry-cost-<date>.md

``--quick`` runs fewer messages, ``--workloads`` some of them. Only code every tree has is used,
so any commit can be measured. It also times ``build_envelope`` around a 128 KiB batch alone (the
protobuf call counts cannot show what an encode carries).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
from harness import latency_summary

from bookie.process import BookieProcess
from broker.process import BrokerProcess
from broker.service.envelope import IncomingBatch, build_envelope
from magnetar.aio import Client
from magnetar.testing.inprocess import start_bookie_in_process
from metadata import open_store
from tests.broker.conftest import broker_config

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = {
    # name: (payload bytes, sends in flight)
    "serial-100B": (100, 1),
    "window-100B": (100, 64),
    "serial-128KiB": (128 * 1024, 1),
}
COMPONENTS = (
    ("magnetar/aio/", "client"),
    ("broker/grpc/", "broker gRPC adapter"),
    ("broker/service/", "broker service"),
    ("broker/managed_ledger/", "managed ledger"),
    ("bookie/client/", "ledger client"),
    ("bookie/framed/", "bookie data port"),
    ("bookie/service/", "bookie"),
    ("bookie/storage/", "bookie"),
    ("bench/", "this benchmark"),
)
BENCH = "this benchmark"
"""Its own tasks (the senders) are not the data path's: not counted."""
PROTOBUF_CALLS = frozenset(
    {"SerializeToString", "SerializePartialToString", "FromString", "ParseFromString"}
)


def component_of(frame: FrameType | None) -> str:
    """The component of the first frame of this repository from ``frame`` outwards."""
    while frame is not None:
        path = frame.f_code.co_filename
        for root in ROOTS:
            if path.startswith(root):
                relative = path[len(root) :]
                for prefix, name in COMPONENTS:
                    if relative.startswith(prefix):
                        return name
        frame = frame.f_back
    return "grpc / asyncio internals"


ROOTS: list[str] = []
"""The trees whose frames are charged (the one measured, and this script's)."""


class Counters:
    """Tasks, thread hops and protobuf calls, by component."""

    def __init__(self) -> None:
        self.tasks: collections.Counter[str] = collections.Counter()
        self.hops: collections.Counter[str] = collections.Counter()
        self.protobuf: collections.Counter[str] = collections.Counter()
        self.on = False

    def install(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        counters = self

        def task_factory(
            loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
        ) -> asyncio.Task[Any]:
            if counters.on and (by := component_of(sys._getframe(1))) != BENCH:
                counters.tasks[by] += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        real_run_in_executor = loop.run_in_executor

        def run_in_executor(executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
            if counters.on:
                target = func
                while hasattr(target, "func"):  # functools.partial(ctx.run, f, ...)
                    target = target.args[0] if target.func.__name__ == "run" else target.func
                name = getattr(target, "__qualname__", repr(target))
                counters.hops[f"{component_of(sys._getframe(1))}: {name}"] += 1
            return real_run_in_executor(executor, func, *args)

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "c_call" and counters.on and getattr(arg, "__name__", "") in PROTOBUF_CALLS:
                owner = getattr(arg, "__self__", None)
                message = owner.__name__ if isinstance(owner, type) else type(owner).__name__
                counters.protobuf[f"{component_of(frame)}: {message}.{arg.__name__}"] += 1

        loop.set_task_factory(task_factory)
        setattr(loop, "run_in_executor", run_in_executor)  # noqa: B010 - an instance's method
        sys.setprofile(profile)

        def uninstall() -> None:
            sys.setprofile(None)
            loop.set_task_factory(None)
            delattr(loop, "run_in_executor")  # the class's method again

        return uninstall


def envelope_us(size: int, rounds: int = 300) -> float:
    """Microseconds to build one entry's envelope around a batch of ``size`` bytes (the best of
    five runs: on a shared machine the mean measures the neighbours)."""
    batch = IncomingBatch(1, 1, 1, 1, os.urandom(size), 0, size)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for offset in range(rounds):
            build_envelope("producer", batch, offset, 1_700_000_000_000)
        best = min(best, time.perf_counter() - started)
    return best / rounds * 1e6


def groups(bookies: list[BookieProcess]) -> tuple[int, int]:
    """Group commits and records the bookies' journals made so far."""
    found = [b.storage.journal_stats for b in bookies]
    return sum(s.groups for s in found if s), sum(s.records for s in found if s)


async def send_all(producer: Any, payload: bytes, count: int, window: int) -> list[float]:
    latencies: list[float] = []
    left = count

    async def sender() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            await producer.send(payload)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(sender() for _ in range(window)))
    return latencies


async def run_workload(
    client: Client, bookies: list[BookieProcess], name: str, count: int, counters: Counters
) -> dict[str, Any]:
    size, window = WORKLOADS[name]
    payload = os.urandom(size)
    producer = await client.create_producer(f"public/default/cost-{name}", batching_max_messages=1)
    try:
        await send_all(producer, payload, 50, window)  # warm up
        # counted
        loop = asyncio.get_running_loop()
        uninstall = counters.install(loop)
        groups_before, records_before = groups(bookies)
        counters.on = True
        try:
            await send_all(producer, payload, count, window)
        finally:
            counters.on = False
            uninstall()
        groups_after, records_after = groups(bookies)
        # timed
        cpu = time.process_time()
        started = time.perf_counter()
        latencies = await send_all(producer, payload, count, window)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        await producer.close()
    per = 1 / count
    journal_hops = sum(n for key, n in counters.hops.items() if key.startswith("bookie:"))
    commits = groups_after - groups_before
    return {
        "messages": count,
        "payload_bytes": size,
        "window": window,
        "tasks_per_entry": {k: n * per for k, n in sorted(counters.tasks.items())},
        "thread_hops_per_entry": {k: n * per for k, n in sorted(counters.hops.items())},
        "protobuf_calls_per_entry": {k: n * per for k, n in sorted(counters.protobuf.items())},
        "group_commits_per_entry": commits * per,
        "entries_per_group_commit": (records_after - records_before) / commits if commits else 0,
        "bookie_thread_hops_per_group_commit": journal_hops / commits if commits else 0,
        "msgs_per_s": count / elapsed,
        "cpu_us_per_msg": cpu / count * 1e6,
        "latency": latency_summary(latencies),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    store = await open_store("memory://")
    bookies = [
        await start_bookie_in_process(store, args.data_root / f"bookie-{i}", f"bookie-{i}")
        for i in range(3)
    ]
    broker = await BrokerProcess.start(broker_config(), store=store)  # the tests' own
    results: dict[str, Any] = {"workloads": {}, "envelope_128KiB_us": envelope_us(128 * 1024)}
    try:
        async with Client(f"magnetar://{broker.address}") as client:
            for name in args.workloads:
                count = args.messages if WORKLOADS[name][0] < 4096 else args.messages // 4
                found = await run_workload(client, bookies, name, count, Counters())
                results["workloads"][name] = found
                print(
                    f"{name}: {found['msgs_per_s']:,.0f} msg/s, CPU"
                    f" {found['cpu_us_per_msg']:,.0f} us/msg, p50"
                    f" {found['latency']['p50_us']:,.0f} us; tasks/entry"
                    f" {sum(found['tasks_per_entry'].values()):.2f}, hops/commit"
                    f" {found['bookie_thread_hops_per_group_commit']:.2f}",
                    flush=True,
                )
    finally:
        with contextlib.suppress(Exception):
            await broker.stop(graceful=False, grace_s=0)
        for bookie in bookies:
            with contextlib.suppress(Exception):
                await bookie.stop(grace_s=0)
        await store.close()
    return results


def _median_of(values: list[Any]) -> Any:
    """The median of numbers; of dicts, the median of each key (0 where a run lacks it)."""
    if isinstance(values[0], dict):
        keys = {k for v in values for k in v}
        return {k: _median_of([v.get(k, 0) for v in values]) for k in sorted(keys)}
    return statistics.median(values)


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tree's runs as one: every figure the median over the runs (the counts hardly vary;
    the times do, on a shared machine)."""
    merged = dict(runs[0])
    merged["runs"] = len(runs)
    merged["envelope_128KiB_us"] = statistics.median(r["envelope_128KiB_us"] for r in runs)
    merged["loadavg_before"] = " | ".join(r["loadavg_before"] for r in runs)
    merged["loadavg_after"] = " | ".join(r["loadavg_after"] for r in runs)
    merged["workloads"] = {
        name: {
            key: _median_of([r["workloads"][name][key] for r in runs])
            for key in runs[0]["workloads"][name]
        }
        for name in runs[0]["workloads"]
    }
    return merged


def _rows(before: dict[str, float], after: dict[str, float]) -> list[str]:
    lines = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key, 0.0), after.get(key, 0.0)
        if b or a:
            lines.append(f"| {key} | {b:.2f} | {a:.2f} |")
    lines.append(f"| **total** | **{sum(before.values()):.2f}** | **{sum(after.values()):.2f}** |")
    return lines


def render(before: dict[str, Any], after: dict[str, Any], command: str) -> str:
    lines = [
        f"# What one entry costs: before and after ({after['date'][:10]})",
        "",
        f"Command: `{command}` (each tree measured by `bench/entry_cost_bench.py` first).",
        "",
        *(
            f"- {side}: `{r['commit']}` ({r['tree']}), {r.get('runs', 1)} run(s), medians;"
            f" /proc/loadavg before each: `{r['loadavg_before']}`; after each:"
            f" `{r['loadavg_after']}`"
            for side, r in (("before", before), ("after", after))
        ),
        "",
        (
            "One process: a `magnetar.aio` producer, one broker, three bookies (Qw 2, Qa 2) on"
            f" a memory store, data on {after['data_dir_on']}; each message alone in its entry."
            " Counts are per entry, charged to the first frame of the repository on the stack;"
            " gRPC's own (de)serialization (one encode and one decode per stream message, in"
            " its Cython core) is not in them. The 2-core machine is shared: read the times"
            " side by side, and the counts as exact."
        ),
        "",
        "| workload | figure | before | after |",
        "|---|---|---:|---:|",
        (
            f"| (alone) | `build_envelope` around a 128 KiB batch, µs |"
            f" {before['envelope_128KiB_us']:,.1f} | {after['envelope_128KiB_us']:,.1f} |"
        ),
    ]
    for name in after["workloads"]:
        b, a = before["workloads"][name], after["workloads"][name]
        rows = [
            ("messages/s", f"{b['msgs_per_s']:,.0f}", f"{a['msgs_per_s']:,.0f}"),
            (
                "CPU per message (whole process) µs",
                f"{b['cpu_us_per_msg']:,.0f}",
                f"{a['cpu_us_per_msg']:,.0f}",
            ),
            (
                "send p50 / p99 µs",
                f"{b['latency']['p50_us']:,.0f} / {b['latency']['p99_us']:,.0f}",
                f"{a['latency']['p50_us']:,.0f} / {a['latency']['p99_us']:,.0f}",
            ),
            (
                "tasks per entry",
                f"{sum(b['tasks_per_entry'].values()):.2f}",
                f"{sum(a['tasks_per_entry'].values()):.2f}",
            ),
            (
                "thread hops per entry",
                f"{sum(b['thread_hops_per_entry'].values()):.2f}",
                f"{sum(a['thread_hops_per_entry'].values()):.2f}",
            ),
            (
                "bookie thread hops per group commit",
                f"{b['bookie_thread_hops_per_group_commit']:.2f}",
                f"{a['bookie_thread_hops_per_group_commit']:.2f}",
            ),
            (
                "entries per group commit",
                f"{b['entries_per_group_commit']:.2f}",
                f"{a['entries_per_group_commit']:.2f}",
            ),
            (
                "protobuf encodes+decodes per entry (seen from Python)",
                f"{sum(b['protobuf_calls_per_entry'].values()):.2f}",
                f"{sum(a['protobuf_calls_per_entry'].values()):.2f}",
            ),
        ]
        lines += [f"| {name} | {what} | {x} | {y} |" for what, x, y in rows]
    for name in after["workloads"]:
        b, a = before["workloads"][name], after["workloads"][name]
        lines += ["", f"## {name}: where, per entry", ""]
        for title, key in (
            ("Tasks created", "tasks_per_entry"),
            ("Thread hops (executor submissions)", "thread_hops_per_entry"),
            ("Protobuf encodes and decodes called from Python", "protobuf_calls_per_entry"),
        ):
            lines += [f"{title}:", "", "| by | before | after |", "|---|---:|---:|"]
            lines += _rows(b[key], a[key])
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, help="write this tree's figures here")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="400 messages per workload")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--before", nargs="+", type=Path, help="runs of the old tree (JSON)")
    parser.add_argument("--after", nargs="+", type=Path, help="runs of the new tree (JSON)")
    parser.add_argument("--out", type=Path, help="with --before/--after: the markdown to write")
    args = parser.parse_args()
    if args.before and args.after:
        before = merge([json.loads(p.read_text()) for p in args.before])
        after = merge([json.loads(p.read_text()) for p in args.after])
        text = render(before, after, " ".join([Path(sys.executable).name, *sys.argv]))
        if args.out:
            args.out.write_text(text + "\n")
            args.out.with_suffix(".json").write_text(
                json.dumps({"before": before, "after": after}, indent=2) + "\n"
            )
        print(text)
        return
    if args.quick:
        args.messages = 400
    shm = Path("/dev/shm")
    args.data_root = Path(
        tempfile.mkdtemp(prefix="entry-cost-bench-", dir=shm if shm.is_dir() else None)
    )
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    tree = Path(sys.modules["bookie"].__file__ or "").resolve().parent.parent
    ROOTS[:] = [str(tree) + os.sep, str(REPO) + os.sep]
    head = {
        "tree": str(tree),
        "commit": subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_before": Path("/proc/loadavg").read_text().strip(),
        "data_dir_on": "tmpfs (/dev/shm)" if str(args.data_root).startswith("/dev/shm") else "disk",
    }
    try:
        results = head | asyncio.run(bench(args))
    finally:
        shutil.rmtree(args.data_root, ignore_errors=True)
    results["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
