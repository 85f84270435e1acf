"""Broker-to-bookie data path: gRPC's AddEntries stream against the framed data protocol.

One real bookie process; the same adds sent to it through each transport in turn, several
rounds alternating the order, so that the machine's noise falls on both alike:

- ``grpc``: the AddEntries bidirectional stream, driven as the ledger client drove it before
  issue 27 (a sender task packing waiting adds into pre-encoded stream messages, a receiver
  mapping answers back by request id); the code is kept here, in :class:`GrpcAdds`;
- ``framed``: :class:`bookie.client.bookie_client.BookieClient`, which the ledger client uses now.

Two workloads per transport, 100-byte entries, one entry per add call:

- ``serial``: one add in flight at a time, for latency (p50/p99 of the round trip, which is one
  group commit of one entry on the bookie, plus the transport both ways);
- ``window``: 256 adds in flight, for throughput.

For each, the CPU seconds the client process and the bookie process used per entry
(``/proc/<pid>/stat`` and ``time.process_time``), which is the figure the transport changes.
The bookie's data directory is on ``/dev/shm`` when the machine has it, so fdatasync costs
little and the transport's share is what shows.

Run from the repository root::

    .venv/bin/python bench/data_path_bench.py            # 3 rounds of 5 s per case
    .venv/bin/python bench/data_path_bench.py --quick    # 1 round of 2 s per case

It writes ``bench/results/data-path-<date>.json`` and ``.md`` (``-quick`` for --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog
from bookie_bench import BookieRunner
from harness import latency_summary, machine_cpu_seconds, proc_cpu_seconds

from bookie.client.bookie_client import BookieClient, PendingAdd, take_message
from bookie.client.wire import encode_add_request
from bookie.entries import AddEntry, AddFailure, entry_checksum
from magnetar.common.grpc_errors import error_from_detail
from proto.bookie.v1 import bookie_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 100
WINDOW = 256


class GrpcAdds:
    """The ledger client's gRPC add path as it was before the data protocol (one
    AddEntries stream, pre-encoded requests, adds packed into messages of up to 1 MiB)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", 256 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
            ],
        )
        self.call: Any = self.channel.stream_stream(
            "/magnetar.bookie.v1.BookieService/AddEntries",
            request_serializer=None,
            response_deserializer=pb.AddEntriesResponse.FromString,
        )()
        self.outbox: deque[PendingAdd] = deque()
        self.ready = asyncio.Event()
        self.in_flight: dict[int, list[tuple[PendingAdd, Sequence[AddEntry]]]] = {}
        self.ids = itertools.count(1)
        self.messages_sent = 0
        self.tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._receive())]

    def add_entries_nowait(self, entries: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        future: asyncio.Future[list[AddFailure]] = asyncio.get_running_loop().create_future()
        self.outbox.append(PendingAdd(entries, future))
        self.ready.set()
        return future

    async def _send(self) -> None:
        limit = 1024 * 1024
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.outbox:
                parts, entries = take_message(self.outbox, limit)
                request_id = next(self.ids)
                self.in_flight[request_id] = parts
                await self.call.write(encode_add_request(request_id, entries))
                self.messages_sent += 1

    async def _receive(self) -> None:
        async for response in self.call:
            parts = self.in_flight.pop(response.request_id, [])
            errors = {
                (f.ledger_id, f.entry_id): error_from_detail(f.error) for f in response.failures
            }
            for pending, part in parts:
                pending.failures.extend(
                    AddFailure(e.ledger_id, e.entry_id, errors[(e.ledger_id, e.entry_id)])
                    for e in part
                    if (e.ledger_id, e.entry_id) in errors
                )
                pending.parts_out -= 1
                if pending.parts_out == 0 and not pending.future.done():
                    pending.future.set_result(pending.failures)

    async def close(self) -> None:
        self.call.cancel()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
        await self.channel.close()


class Adder:
    """Entries of one ledger, numbered in order, through one transport."""

    def __init__(
        self,
        send: Callable[[Sequence[AddEntry]], Awaitable[list[AddFailure]]],
        ledger_id: int,
        messages: Callable[[], int],
    ) -> None:
        self.send = send
        self.messages = messages
        self.ledger_id = ledger_id
        self.next_entry = 0

    def entry(self) -> AddEntry:
        entry_id = self.next_entry
        self.next_entry += 1
        lac = entry_id - 1
        return AddEntry(
            self.ledger_id,
            entry_id,
            lac,
            PAYLOAD,
            entry_checksum(self.ledger_id, entry_id, lac, PAYLOAD),
        )

    async def add(self) -> None:
        failures = await self.send([self.entry()])
        if failures:
            raise RuntimeError(f"the bookie refused an add: {failures[0].error}")


async def run_case(adder: Adder, window: int, seconds: float, bookie_pid: int) -> dict[str, Any]:
    latencies: list[float] = []
    done = 0
    stop_at = 0.0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await adder.add()
            latencies.append(time.perf_counter() - started)
            done += 1

    # warm up (connections, caches), then measure
    stop_at = time.perf_counter() + 0.5
    await asyncio.gather(*(worker() for _ in range(window)))
    latencies.clear()
    done = 0
    bookie_cpu = proc_cpu_seconds(bookie_pid)
    messages = adder.messages()
    client_cpu = time.process_time()
    machine = machine_cpu_seconds()
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(worker() for _ in range(window)))
    elapsed = time.perf_counter() - started
    bookie_cpu = proc_cpu_seconds(bookie_pid) - bookie_cpu
    messages = adder.messages() - messages
    client_cpu = time.process_time() - client_cpu
    machine_after = machine_cpu_seconds()
    busy = machine_after[0] - machine[0]
    total = machine_after[2] - machine[2]
    return {
        "adds": done,
        "elapsed_s": elapsed,
        "adds_per_s": done / elapsed,
        "adds_per_message": done / messages if messages else 0.0,
        "latency": latency_summary(latencies),
        "client_cpu_us_per_add": client_cpu / done * 1e6,
        "bookie_cpu_us_per_add": bookie_cpu / done * 1e6,
        "cpu_us_per_add": (client_cpu + bookie_cpu) / done * 1e6,
        "machine_busy_pct": 100 * busy / total if total else 0.0,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    root = args.data_root
    bookie = BookieRunner(root / "bookie", ["--max-connections-per-ip", "0"])
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_before": os.getloadavg(),
        "data_dir_on": "tmpfs (/dev/shm)" if str(root).startswith("/dev/shm") else "disk",
        "seconds_per_case": args.seconds,
        "rounds": [],
    }
    try:
        await bookie.start()
        ledger_ids = itertools.count(100)
        for round_index in range(args.rounds):
            order = ["grpc", "framed"] if round_index % 2 == 0 else ["framed", "grpc"]
            found: dict[str, Any] = {}
            for transport in order:
                for workload, window in (("serial", 1), ("window", WINDOW)):
                    client: GrpcAdds | BookieClient = (
                        GrpcAdds(bookie.address)
                        if transport == "grpc"
                        else BookieClient(bookie.data_address)
                    )
                    adder = Adder(
                        client.add_entries_nowait,
                        next(ledger_ids),
                        functools.partial(getattr, client, "messages_sent"),
                    )
                    try:
                        found[f"{transport}/{workload}"] = await run_case(
                            adder, window, args.seconds, bookie.pid
                        )
                    finally:
                        await client.close()
                    case = found[f"{transport}/{workload}"]
                    latency = case["latency"]
                    print(
                        f"round {round_index + 1} {transport:6} {workload:6}:"
                        f" {case['adds_per_s']:8.0f} adds/s"
                        f" ({case['adds_per_message']:.1f} a message),"
                        f" p50 {latency['p50_us']:7.0f} us, p99 {latency['p99_us']:7.0f} us,"
                        f" CPU {case['client_cpu_us_per_add']:6.1f}"
                        f" + {case['bookie_cpu_us_per_add']:6.1f} us/add (client + bookie),"
                        f" machine {case['machine_busy_pct']:.0f}% busy",
                        flush=True,
                    )
            results["rounds"].append(found)
    finally:
        with contextlib.suppress(Exception):
            await bookie.stop()
        shutil.rmtree(root, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    results["summary"] = summarize(results["rounds"])
    return results


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case, the median over rounds of each figure."""
    summary: dict[str, Any] = {}
    for case in rounds[0]:
        runs = [r[case] for r in rounds]
        summary[case] = {
            "adds_per_s": statistics.median(r["adds_per_s"] for r in runs),
            "p50_us": statistics.median(r["latency"]["p50_us"] for r in runs),
            "p99_us": statistics.median(r["latency"]["p99_us"] for r in runs),
            "client_cpu_us_per_add": statistics.median(r["client_cpu_us_per_add"] for r in runs),
            "bookie_cpu_us_per_add": statistics.median(r["bookie_cpu_us_per_add"] for r in runs),
            "cpu_us_per_add": statistics.median(r["cpu_us_per_add"] for r in runs),
            "machine_busy_pct": statistics.median(r["machine_busy_pct"] for r in runs),
        }
    return summary


def render(results: dict[str, Any]) -> str:
    lines = [
        (
            "# Data path: gRPC AddEntries stream against the framed data protocol"
            f" ({results['date'][:10]})"
        ),
        "",
        f"Command: `{results['command']}`  ",
        (
            f"Machine: {results['cpu_count']} cores, load average"
            f" {results['load_before'][0]:.1f} before, {results['load_after'][0]:.1f} after"
            " (shared with other work: read the figures side by side, not against other runs).  "
        ),
        (
            f"One bookie process, data directory on {results['data_dir_on']}; 100-byte entries,"
            f" one per add; {len(results['rounds'])} round(s) of"
            f" {results['seconds_per_case']:g} s per case, the order of the transports"
            " alternating; medians over the rounds."
        ),
        "",
        (
            "| case | adds/s | p50 µs | p99 µs | client CPU µs/add | bookie CPU µs/add"
            " | total CPU µs/add | machine busy |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, s in results["summary"].items():
        lines.append(
            f"| {case} | {s['adds_per_s']:,.0f} | {s['p50_us']:,.0f} | {s['p99_us']:,.0f} |"
            f" {s['client_cpu_us_per_add']:.1f} | {s['bookie_cpu_us_per_add']:.1f} |"
            f" {s['cpu_us_per_add']:.1f} | {s['machine_busy_pct']:.0f}% |"
        )
    summary = results["summary"]
    lines.append("")
    for workload in ("serial", "window"):
        g, f = summary.get(f"grpc/{workload}"), summary.get(f"framed/{workload}")
        if g and f:
            cpu = f["cpu_us_per_add"] / g["cpu_us_per_add"]
            rate = f["adds_per_s"] / g["adds_per_s"]
            p50 = f["p50_us"] / g["p50_us"]
            lines.append(
                f"- {workload}: framed against gRPC: CPU per add {cpu:.2f}x, throughput"
                f" {rate:.2f}x, p50 {p50:.2f}x."
            )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s per case")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    shm = Path("/dev/shm")
    args.data_root = Path(
        tempfile.mkdtemp(prefix="data-path-bench-", dir=shm if shm.is_dir() else None)
    )
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    results = asyncio.run(bench(args))
    name = f"data-path-{results['date'][:10]}{'-quick' if args.quick else ''}"
    out = REPO / "bench" / "results"
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{name}.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
