"""Broker benchmark: how long a partition is unavailable to a producer when its owner crashes
(SIGKILL) or is stopped (SIGTERM), and what producing through a broker costs next to writing the
same entries straight to the bookies with ``LedgerClient``, in the same run.

Run from the repository root::

    .venv/bin/python bench/broker_bench.py              # full run, about five minutes
    .venv/bin/python bench/broker_bench.py --quick      # smoke test, under a minute

Every raw figure and every failover run go to ``broker-<date>.json``, the tables to ``.md``
(named and placed as bench/harness.py does for every benchmark); bench/README.md ("Broker")
explains the figures.
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
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc.aio
from harness import (
    KIB,
    MB,
    MIB,
    RAW_1M,
    RAW_4K_OPS,
    RAW_4M,
    RAW_RTT_P50,
    ClusterSample,
    LogClock,
    add_output_options,
    add_quick_and_tag,
    add_raw_s_option,
    all_ok,
    bench_main,
    bench_parser,
    busiest_cell,
    latency_summary,
    log_tail,
    loop_cpu_over,
    machine_info,
    ms,
    raw_limits_at,
    raw_limits_table,
    report_head,
    report_text,
    results_head,
    sample_cluster,
    settle_disk,
    size_name,
    thread_cpu,
    watching,
)

# harness.py and ledger_bench.py sit next to this script, so they are importable when it is run
# as ``python bench/broker_bench.py``. The direct ledger writer is ledger_bench's, so that both
# benchmarks measure the ledger path the same way.
from ledger_bench import Writer, timed_run, wait_for_view

from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_client import LedgerClient
from magnetar.aio import Client, MessageId, Producer, SendCallback
from magnetar.common.errors import MagnetarError, ReceiveTimeoutError
from magnetar.testing import BrokerNode, LocalCluster
from metadata import EventType, MetadataStore, layout, open_store
from proto.admin.v1 import admin_pb2 as admin
from proto.admin.v1 import admin_pb2_grpc
from proto.format.v1 import cluster_pb2

BOOKIES = 3
QUORUM = (3, 2, 2)  # E/Qw/Qa for the broker's managed ledgers and for the direct writer alike
QUORUM_ARGS = [
    "--managed-ledger-ensemble-size", str(QUORUM[0]),
    "--managed-ledger-write-quorum", str(QUORUM[1]),
    "--managed-ledger-ack-quorum", str(QUORUM[2]),
]  # fmt: skip
# Load shedding would move partitions on its own between and during runs.
BROKER_ARGS = [*QUORUM_ARGS, "--load-shedding-enabled", "false"]
FAILOVER_BROKERS = 2  # the owner, and the one broker it can fail over to
DEFAULT_TTLS = (10, 3)  # the broker's default session TTL, and a short one
KINDS = ("crash", "graceful")
MESSAGE_SIZES = (1 * KIB, 64 * KIB)
NUMBER_DIGITS = 12  # a failover message starts with its number, zero-padded

BUSY_THREAD_PCT = 85.0
BUSY_MACHINE_FRACTION = 0.85


# --- logs, timed ----------------------------------------------------------------------------------


# times the client library's reconnects, which the failover is broken down by
LOG_CLOCK = LogClock(frozenset({"producer_reconnecting", "producer_connected"}))

# What the brokers log (JSON, wall-clock timestamps) that a failover is broken down by.
BROKER_EVENTS = frozenset(
    {
        "broker_stopping",
        "ownership_released",
        "broker_process_stopped",
        "lock_acquired",
        "ledger_recovered",
        "ledger_created",
        "ownership_acquired",
        "producer_opened",
    }
)


def broker_log_events(path: Path, offset: int) -> list[tuple[float, str, dict[str, Any]]]:
    """(wall time, event, record) of the BROKER_EVENTS a broker logged after byte ``offset``."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
            if record.get("event") not in BROKER_EVENTS:
                continue
            stamp = dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
        except (ValueError, KeyError, TypeError):
            continue
        found.append((stamp.timestamp(), record["event"], record))
    return found


def process_age_s(pid: int | None) -> float | None:
    """Seconds since the process started (field 22 of /proc/<pid>/stat, against /proc/uptime)."""
    if pid is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        text = Path(f"/proc/{pid}/stat").read_text()
        started = int(text[text.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    return None


def log_size(node: BrokerNode) -> int:
    with contextlib.suppress(OSError):
        return node.log_path.stat().st_size
    return 0


# --- cluster helpers ------------------------------------------------------------------------------


def admin_stub(node: BrokerNode) -> tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(node.address)
    return channel, admin_pb2_grpc.AdminServiceStub(channel)


def running_broker(cluster: LocalCluster, *, besides: BrokerNode | None = None) -> BrokerNode:
    for node in cluster.brokers:
        if node.is_running and node is not besides:
            return node
    raise RuntimeError(f"no running broker in {cluster!r}")


async def owner_of(stub: admin_pb2_grpc.AdminServiceAsyncStub, partition: str) -> str:
    listing = await stub.ListOwnership(admin.ListOwnershipRequest())
    for o in listing.ownership:
        if o.partition_topic == partition:
            return o.broker_id
    return ""


class OwnershipWatch:
    """Notes (when, PUT/DELETE, broker id) of every change of one partition's ownership key, as
    etcd reports it: a DELETE is the old owner's lease expiring (crash) or its release
    (graceful), a PUT the new owner taking the lock."""

    def __init__(self, store: MetadataStore, partition: str) -> None:
        self._store = store
        self._key = layout.ownership(partition)
        self.events: list[tuple[float, str, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        watch = await self._store.watch(self._key)

        async def follow() -> None:
            async with watch:
                async for event in watch:
                    if event.key != self._key:
                        continue
                    broker = ""
                    if event.type is EventType.PUT:
                        record = cluster_pb2.OwnershipRecord()
                        record.ParseFromString(event.value)
                        broker = record.broker_id
                    self.events.append((time.perf_counter(), event.type.value, broker))

        self._task = asyncio.create_task(follow(), name="ownership-watch")

    def first(self, kind: str, since: float) -> tuple[float, str] | None:
        return next(((t, b) for t, k, b in self.events if k == kind and t >= since), None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# --- CPU and bookie counters --------------------------------------------------------------------


def _busiest(before: dict[str, float], after: dict[str, float], seconds: float) -> list[Any]:
    """[thread, % of a core] of the busiest thread over the window ("main" is the event loop)."""
    pct = {k: 100 * (v - before.get(k, 0.0)) / seconds for k, v in after.items()}
    name, value = max(pct.items(), key=lambda kv: kv[1], default=("-", 0.0))
    return [name.partition(":")[0], round(value, 1)]


def usage_delta(before: ClusterSample, after: ClusterSample, cores: int) -> dict[str, Any]:
    seconds = after.at - before.at
    bench = after.bench_cpu - before.bench_cpu
    loop = after.bench_loop_cpu - before.bench_loop_cpu
    brokers = {b: after.brokers[b] - before.brokers.get(b, 0.0) for b in after.brokers}
    bookies = {b: after.bookies[b] - before.bookies.get(b, 0.0) for b in after.bookies}
    etcd = after.etcd - before.etcd
    busy = after.machine[0] - before.machine[0]
    steal = after.machine[1] - before.machine[1]
    counters: dict[str, float] = {}
    sync_busy: dict[str, float] = {}
    for b, m1 in after.metrics.items():
        m0 = before.metrics.get(b, {})
        for k, v in m1.items():
            counters[k] = counters.get(k, 0.0) + v - m0.get(k, 0.0)
        sync_busy[b] = 100 * (m1.get("sync_seconds", 0.0) - m0.get("sync_seconds", 0.0)) / seconds
    adds, add_bytes = counters.get("adds", 0.0), counters.get("add_bytes", 0.0)
    broker_threads = {
        b: _busiest(before.broker_threads.get(b, {}), t, seconds)
        for b, t in after.broker_threads.items()
    }
    bookie_threads = {
        b: _busiest(before.bookie_threads.get(b, {}), t, seconds)
        for b, t in after.bookie_threads.items()
    }
    return {
        "measured_s": seconds,
        "cores": cores,
        # percent of one core; the machine has `cores` cores
        "bench_pct": 100 * bench / seconds,
        "bench_event_loop_pct": 100 * loop / seconds,
        "brokers_pct": {b: 100 * v / seconds for b, v in brokers.items()},
        "broker_pct": 100 * sum(brokers.values()) / seconds,
        "broker_busiest_thread": broker_threads,
        "bookies_pct": 100 * sum(bookies.values()) / seconds,
        "bookie_busiest_thread": bookie_threads,
        "etcd_pct": 100 * etcd / seconds,
        "machine_busy_pct": 100 * busy / seconds,
        "machine_steal_pct": 100 * steal / seconds,
        "other_pct": 100
        * (busy - bench - sum(brokers.values()) - sum(bookies.values()) - etcd)
        / seconds,
        "bookie_counters": counters,
        # every stored copy counts once in the bookies' counters: Qw copies per entry
        "bookie_adds": adds,
        "stored_entries": adds / QUORUM[1],
        "mean_stored_entry_bytes": add_bytes / adds if adds else 0.0,
        "journal_mb_per_s": counters.get("group_bytes", 0.0) / seconds / MB,
        "busiest_journal_fdatasync_pct": max(sync_busy.values(), default=0.0),
    }


def cpu_per_entry(cpu: dict[str, Any], entries_per_s: float) -> dict[str, float]:
    """Microseconds of CPU per stored entry, by process: the machine is saturated in most
    workloads, so throughput is about the cores divided by what one entry costs."""
    if not entries_per_s:
        return {}
    per = 1e4 / entries_per_s  # % of a core -> us per entry
    return {
        "client": cpu["bench_pct"] * per,
        "broker": cpu["broker_pct"] * per,
        "bookies": cpu["bookies_pct"] * per,
        "etcd": cpu["etcd_pct"] * per,
        "other": cpu["other_pct"] * per,
        "machine": cpu["machine_busy_pct"] * per,
    }


def limits(cpu: dict[str, Any]) -> list[str]:
    """What was at (or near) its limit during a workload."""
    found = []
    if cpu["bench_event_loop_pct"] >= BUSY_THREAD_PCT:
        found.append(f"client's event loop {cpu['bench_event_loop_pct']:.0f}%")
    for who, busiest in (
        *cpu["broker_busiest_thread"].items(),
        *cpu["bookie_busiest_thread"].items(),
    ):
        name, pct = busiest
        if pct >= BUSY_THREAD_PCT:
            found.append(f"{who} {'event loop' if name == 'main' else 'a thread'} {pct:.0f}%")
    cores = cpu["cores"]
    if cpu["machine_busy_pct"] >= BUSY_MACHINE_FRACTION * 100 * cores:
        found.append(f"all CPUs: machine {cpu['machine_busy_pct']:.0f}% of {100 * cores}%")
    if not found:
        found.append(
            f"none at its limit (client loop {cpu['bench_event_loop_pct']:.0f}%, machine"
            f" {cpu['machine_busy_pct']:.0f}% of {100 * cores}%)"
        )
    return found


# --- throughput through the broker ---------------------------------------------------------------


class Sends(Protocol):
    """What :class:`WindowProducer` needs of a producer (``magnetar.aio.Producer`` has it)."""

    def send_async(self, content: bytes, callback: SendCallback | None = None) -> object: ...


class WindowProducer:
    """Keeps ``window`` messages of one size in flight on one producer (client batching on),
    letting the event loop run after every ``turn`` messages, and counts the receipts that
    arrive in the measured window [start, end).

    A plain counter, not an ``asyncio.Semaphore``: in Python 3.11 ``Semaphore.locked()`` walks
    its waiters, and with tens of thousands of acquires a second it took a fifth of the event
    loop in a profile of this benchmark.
    """

    def __init__(self, producer: Sends, message_bytes: int, window: int, turn: int) -> None:
        self.producer = producer
        self.payload = os.urandom(message_bytes)
        self.window = window
        self.turn = turn
        self.in_flight = 0
        self._room = asyncio.Event()
        self.stop = False
        self.sent = 0
        self.start = float("inf")
        self.end = float("inf")
        self.messages = 0
        self.entries = 0
        self.latencies: list[float] = []
        self.failed = 0
        self.first_error = ""

    async def run(self) -> None:
        producer, payload, room, clock, done = (
            self.producer,
            self.payload,
            self._room,
            time.perf_counter,
            self._done,
        )
        window, turn, in_turn = self.window, self.turn, 0
        while not self.stop:
            if self.in_flight >= window:
                room.clear()
                await room.wait()  # a new loop turn
                in_turn = 0
                continue
            if in_turn >= turn:
                await asyncio.sleep(0)
                in_turn = 0
            self.in_flight += 1
            producer.send_async(payload, callback=functools.partial(done, clock()))
            in_turn += 1
            self.sent += 1

    def _done(
        self, sent_at: float, error: MagnetarError | None, message_id: MessageId | None
    ) -> None:
        self.in_flight -= 1
        self._room.set()
        if error is not None or message_id is None:
            self.failed += 1
            self.first_error = self.first_error or repr(error)
            return
        now = time.perf_counter()
        if self.start <= now < self.end:
            self.messages += 1
            self.latencies.append(now - sent_at)
            if message_id.batch_index == 0:  # every entry holds exactly one message 0
                self.entries += 1


class StubProducer:
    """Confirms every message at once: :class:`WindowProducer` driving it measures what the
    benchmark's own bookkeeping costs per message."""

    _ID = MessageId(1, 0, 0, 0, 1)

    def send_async(self, content: bytes, callback: SendCallback | None = None) -> object:  # noqa: ARG002 - the producer's signature
        if callback is not None:
            callback(None, self._ID)
        return None


async def measure_own_cost(seconds: float, turn: int) -> dict[str, Any]:
    """CPU of this process's event loop per message, with the load driving a stub producer."""
    load = WindowProducer(StubProducer(), KIB, 1 << 30, turn)
    task = asyncio.create_task(load.run())
    try:
        cpu = await loop_cpu_over(load, seconds, thread_cpu)
    finally:
        load.stop = True
        await asyncio.gather(task, return_exceptions=True)
    return {
        "seconds": seconds,
        "messages": load.messages,
        "event_loop_cpu_s": cpu,
        "us_per_message": 1e6 * cpu / load.messages if load.messages else float("nan"),
    }


def window_for(item_bytes: int, window_bytes: int, turn_bytes: int) -> tuple[int, int]:
    """Items in flight and items per loop turn for a byte budget (at least one of each)."""
    return max(1, window_bytes // item_bytes), max(1, turn_bytes // item_bytes)


async def run_broker_throughput(
    cluster: LocalCluster,
    message_bytes: int,
    *,
    index: int,
    window_bytes: int,
    turn_bytes: int,
    warmup_s: float,
    duration_s: float,
) -> dict[str, Any]:
    window, turn = window_for(message_bytes, window_bytes, turn_bytes)
    topic = f"throughput-{size_name(message_bytes).replace(' ', '')}-{index}"
    partition = f"public/default/{topic}-partition-0"
    result: dict[str, Any] = {
        "path": "broker",
        "message_bytes": message_bytes,
        "parameters": {
            "topic": partition,
            "window_messages": window,
            "messages_per_loop_turn": turn,
            "in_flight_bytes": window * message_bytes,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
            "producer": "defaults (batching on: 1,000 messages / 128 KiB / 1 ms per batch),"
            f" max_pending_messages={window}",
        },
    }
    node = running_broker(cluster)
    channel, stub = admin_stub(node)
    client = Client(cluster.service_url, operation_timeout_s=60)
    task: asyncio.Task[None] | None = None
    try:
        await stub.CreateTopic(admin.CreateTopicRequest(topic=topic, partitions=1))
        producer = await client.create_producer(
            partition, send_timeout_ms=120_000, max_pending_messages=window
        )
        load = WindowProducer(producer, message_bytes, window, turn)
        task = asyncio.create_task(load.run(), name="produce")
        loop_tid = threading.get_native_id()
        await watching([task], cluster, warmup_s)
        before = await sample_cluster(cluster, loop_tid)
        load.start = time.perf_counter()
        load.end = load.start + duration_s
        await watching([task], cluster, duration_s)
        after = await sample_cluster(cluster, loop_tid)
        load.stop = True
        await task
        await asyncio.wait_for(producer.flush(), 120)
        cpu = usage_delta(before, after, os.cpu_count() or 1)
        stats = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=partition, internal=True))
        entries = load.entries
        messages = load.messages
        stored_entry = cpu["mean_stored_entry_bytes"]
        result.update(
            {
                "ok": load.failed == 0,
                "messages": messages,
                "entries": entries,
                "failed_sends": load.failed,
                "first_error": load.first_error,
                "messages_per_s": messages / duration_s,
                "payload_mb_per_s": messages * message_bytes / duration_s / MB,
                "entries_per_s": entries / duration_s,
                "messages_per_entry": messages / entries if entries else 0.0,
                "stored_entry_bytes": stored_entry,
                "stored_mb_per_s": entries * stored_entry / duration_s / MB,
                "latency": latency_summary(load.latencies),
                "cpu": cpu,
                "cpu_us_per_entry": cpu_per_entry(cpu, entries / duration_s),
                "limits": limits(cpu),
                "ledgers": [
                    {
                        "ledger_id": ledger.ledger_id,
                        "entries": ledger.entries,
                        "state": ledger.state,
                    }
                    for p in stats.partitions
                    for ledger in p.ledgers
                ],
            }
        )
        if load.failed:
            result["error"] = f"{load.failed} send(s) failed, the first with {load.first_error}"
    except Exception as e:  # noqa: BLE001 - one failed workload is reported, the rest still run
        result.update({"ok": False, "error": f"{e!r}", "broker_log_tail": log_tail(node.log_path)})
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 60)
        await channel.close()
    return result


async def run_direct_throughput(
    cluster: LocalCluster,
    store: MetadataStore,
    entry_bytes: int,
    *,
    message_bytes: int,
    messages_per_entry: float,
    window_bytes: int,
    turn_bytes: int,
    warmup_s: float,
    duration_s: float,
) -> dict[str, Any]:
    window, turn = window_for(entry_bytes, window_bytes, turn_bytes)
    config = LedgerClientConfig(max_pending_adds=window, max_pending_bytes=window * entry_bytes)
    result: dict[str, Any] = {
        "path": "direct",
        "message_bytes": message_bytes,
        "parameters": {
            "entry_bytes": entry_bytes,
            "window_entries": window,
            "entries_per_loop_turn": turn,
            "in_flight_bytes": window * entry_bytes,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
            "quorum": "E{}/Qw{}/Qa{}".format(*QUORUM),
            "max_pending_adds": config.max_pending_adds,
            "max_pending_bytes": config.max_pending_bytes,
        },
    }
    client = await LedgerClient.start(store, config)
    try:
        await wait_for_view(client, cluster)
        handle = await client.create_ledger(
            ensemble_size=QUORUM[0], write_quorum=QUORUM[1], ack_quorum=QUORUM[2]
        )
        writer = Writer(handle, entry_bytes, window=window, turn_entries=turn)
        before, after = await timed_run(
            writer, cluster, warmup_s=warmup_s, duration_s=duration_s, sample=sample_cluster
        )
        await asyncio.wait_for(handle.close(), 30)
        cpu = usage_delta(before, after, os.cpu_count() or 1)
        entries = writer.entries
        result.update(
            {
                "ok": writer.failed == 0,
                "entries": entries,
                "failed_adds": writer.failed,
                "entries_per_s": entries / duration_s,
                "stored_entry_bytes": entry_bytes,
                "stored_mb_per_s": entries * entry_bytes / duration_s / MB,
                # the messages these entries would carry, had the broker's client packed them
                "messages_per_entry": messages_per_entry,
                "messages_per_s": entries * messages_per_entry / duration_s,
                "payload_mb_per_s": entries * messages_per_entry * message_bytes / duration_s / MB,
                "latency": latency_summary(writer.latencies),
                "cpu": cpu,
                "cpu_us_per_entry": cpu_per_entry(cpu, entries / duration_s),
                "limits": limits(cpu),
            }
        )
    except Exception as e:  # noqa: BLE001 - one failed workload is reported, the rest still run
        result.update({"ok": False, "error": f"{e!r}"})
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return result


def _print_throughput(r: dict[str, Any]) -> None:
    name = f"{size_name(r['message_bytes'])} messages, {r['path']}"
    if not r["ok"]:
        print(f"{name}: FAILED {r.get('error')}", flush=True)
        return
    cpu, lat = r["cpu"], r["latency"]
    print(
        f"{name}: {r['messages_per_s']:,.0f} messages/s, {r['entries_per_s']:,.0f} entries/s"
        f" of {r['stored_entry_bytes'] / KIB:,.1f} KiB, {r['stored_mb_per_s']:,.1f} MB/s stored;"
        f" latency p50 {ms(lat['p50_us'])} p99 {ms(lat['p99_us'])};"
        f" CPU client {cpu['bench_pct']:.0f}% (loop {cpu['bench_event_loop_pct']:.0f}%)"
        f" broker {cpu['broker_pct']:.0f}% bookies {cpu['bookies_pct']:.0f}%"
        f" machine {cpu['machine_busy_pct']:.0f}%; limit: {'; '.join(r['limits'])}",
        flush=True,
    )


def overhead(broker: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    """Broker throughput over direct throughput, on entries of the same size."""
    if not (broker["ok"] and direct["ok"]) or not direct["entries_per_s"]:
        return {}
    return {
        "message_bytes": broker["message_bytes"],
        "entries_ratio": broker["entries_per_s"] / direct["entries_per_s"],
        "messages_ratio": broker["messages_per_s"] / direct["messages_per_s"]
        if direct["messages_per_s"]
        else 0.0,
        "stored_bytes_ratio": broker["stored_mb_per_s"] / direct["stored_mb_per_s"]
        if direct["stored_mb_per_s"]
        else 0.0,
    }


# --- failover -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    at: float
    number: int
    ledger_id: int
    entry_id: int


def numbered(number: int, size: int) -> bytes:
    return f"{number:0{NUMBER_DIGITS}d}".encode().ljust(size, b".")


class SteadyProducer:
    """Sends numbered messages at a steady pace, at most ``in_flight`` unconfirmed, and notes
    when each receipt arrived and which ledger it names. Failed sends are noted, not retried."""

    def __init__(
        self, producer: Producer, *, in_flight: int, interval_s: float, message_bytes: int
    ) -> None:
        self.producer = producer
        self.gate = asyncio.Semaphore(in_flight)
        self.interval_s = interval_s
        self.message_bytes = message_bytes
        self.stop = False
        self.sent = 0
        self.acks: list[Ack] = []
        self.failed: list[tuple[int, str]] = []
        self._receipt = asyncio.Event()

    async def run(self) -> None:
        while not self.stop:
            await self.gate.acquire()
            number = self.sent
            self.producer.send_async(
                numbered(number, self.message_bytes),
                callback=functools.partial(self._done, number),
            )
            self.sent += 1
            await asyncio.sleep(self.interval_s)

    def _done(self, number: int, error: MagnetarError | None, message_id: MessageId | None) -> None:
        self.gate.release()
        if error is not None or message_id is None:
            self.failed.append((number, repr(error)))
            return
        self.acks.append(
            Ack(time.perf_counter(), number, message_id.ledger_id, message_id.entry_id)
        )
        self._receipt.set()

    def first_ack_after(self, moment: float, *, not_in: frozenset[int] = frozenset()) -> Ack | None:
        return next((a for a in self.acks if a.at > moment and a.ledger_id not in not_in), None)

    async def wait_for_ack(self, moment: float, *, not_in: frozenset[int], timeout_s: float) -> Ack:
        """The first receipt after ``moment`` naming a ledger not in ``not_in``, once it came."""
        async with asyncio.timeout(timeout_s):
            while (ack := self.first_ack_after(moment, not_in=not_in)) is None:
                self._receipt.clear()
                await self._receipt.wait()
        return ack


async def read_back(client: Client, partition: str, stored: int, timeout_s: float) -> list[int]:
    """The numbers of the first ``stored`` messages of the partition, in order."""
    reader = await client.create_reader(partition, "earliest")
    numbers: list[int] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(numbers) < stored:
                try:
                    message = await reader.read_next(timeout_millis=5000)
                except ReceiveTimeoutError:
                    break
                numbers.append(int(message.data()[:NUMBER_DIGITS]))
    finally:
        with contextlib.suppress(Exception):
            await reader.close()
    return numbers


async def run_failover(
    cluster: LocalCluster,
    store: MetadataStore,
    *,
    ttl_s: int,
    kind: str,
    index: int,
    steady_s: float,
    kill_delay_s: float,
    after_s: float,
    in_flight: int,
    interval_s: float,
    message_bytes: int,
) -> dict[str, Any]:
    topic = f"failover-ttl{ttl_s}-{kind}-{index}"
    partition = f"public/default/{topic}-partition-0"
    result: dict[str, Any] = {
        "ttl_s": ttl_s,
        "kind": kind,
        "run": index,
        "topic": partition,
        "kill_delay_s": kill_delay_s,
    }
    channel, stub = admin_stub(running_broker(cluster))
    client = Client(cluster.service_url, operation_timeout_s=60)
    ownership = OwnershipWatch(store, partition)
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Task[None] | None = None
    try:
        await stub.CreateTopic(admin.CreateTopicRequest(topic=topic, partitions=1))
        producer = await client.create_producer(partition, send_timeout_ms=120_000)
        load = SteadyProducer(
            producer, in_flight=in_flight, interval_s=interval_s, message_bytes=message_bytes
        )
        task = asyncio.create_task(load.run(), name="produce")
        await watching([task], cluster, steady_s + kill_delay_s)
        owner = await owner_of(stub, partition)
        victim = next(b for b in cluster.brokers if b.broker_id == owner)
        stats = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=partition, internal=True))
        old_ledgers = frozenset(
            {ledger.ledger_id for p in stats.partitions for ledger in p.ledgers}
            | {a.ledger_id for a in load.acks}
        )
        await ownership.start()
        offsets = {str(b.broker_id): log_size(b) for b in cluster.brokers}
        acked_before = len(load.acks)
        LOG_CLOCK.seen.clear()

        exited_at: list[float] = []
        result["victim_age_s"] = process_age_s(victim.pid)
        t0 = time.perf_counter()
        wall0 = time.time()
        stopping = asyncio.create_task(_take_down(victim, kind, exited_at), name="take-down")
        first_new = await load.wait_for_ack(t0, not_in=old_ledgers, timeout_s=3 * ttl_s + 30)
        settle = time.perf_counter() + after_s
        while time.perf_counter() < settle or len(load.acks) < acked_before + 100:
            await watching([task], None, 0.05)
        await asyncio.wait_for(stopping, 120)
        result["victim_exit_code"] = victim.exit_code
        load.stop = True
        await task
        await asyncio.wait_for(producer.flush(), 120)
        await producer.close()

        stored, new_owner = await _stored_and_owner(cluster, partition)
        numbers = await read_back(client, partition, stored, 60)
        acked = {a.number for a in load.acks}
        seen = set(numbers)
        first_any = load.first_ack_after(t0)
        connected = LOG_CLOCK.after("producer_connected", t0)
        reconnects = LOG_CLOCK.after("producer_reconnecting", t0)
        deleted = ownership.first("delete", t0)
        created = ownership.first("put", t0)
        last_before = max((a.at for a in load.acks if a.at <= t0), default=t0)

        def ms(t: float | None) -> float | None:
            return None if t is None else (t - t0) * 1e3

        def log_ms(broker_id: str, event: str, **match: str) -> float | None:
            return _log_event_ms(cluster, offsets, wall0, broker_id, event, **match)

        lost = sorted(acked - seen)
        result.update(
            {
                "victim": victim.broker_id,
                "new_owner": new_owner,
                "old_ledgers": sorted(old_ledgers),
                "new_ledger": first_new.ledger_id,
                "failover_ms": ms(first_new.at),
                "first_receipt_any_ledger_ms": ms(first_any.at if first_any else None),
                "last_receipt_before_ms": ms(last_before),
                "victim_exited_ms": ms(exited_at[0]) if exited_at else None,
                "owner_key_deleted_ms": ms(deleted[0] if deleted else None),
                "owner_key_created_ms": ms(created[0] if created else None),
                "owner_key_created_by": created[1] if created else "",
                # nobody owned the partition: after a crash, mostly the client waiting out its
                # backoff before the lookup that assigns the partition again
                "owner_key_vacant_ms": (created[0] - deleted[0]) * 1e3
                if created and deleted
                else None,
                "client_reconnect_attempts": len(reconnects),
                "client_last_reconnect_ms": ms(max(reconnects)) if reconnects else None,
                "client_connected_ms": ms(connected[0] if connected else None),
                "old_owner_released_ms": log_ms(
                    str(victim.broker_id), "ownership_released", topic=partition
                ),
                "new_owner_lock_acquired_ms": log_ms(new_owner, "lock_acquired", path=partition),
                "new_owner_ledger_recovered_ms": log_ms(new_owner, "ledger_recovered"),
                "new_owner_ownership_acquired_ms": log_ms(
                    new_owner, "ownership_acquired", topic=partition
                ),
                "new_owner_producer_opened_ms": log_ms(
                    new_owner, "producer_opened", topic=partition
                ),
                "sent": load.sent,
                "acked": len(acked),
                "failed_sends": len(load.failed),
                "first_failure": load.failed[0][1] if load.failed else "",
                "stored": stored,
                "read_back": len(numbers),
                "lost": len(lost),
                "lost_numbers": lost[:20],
                "stored_twice": len(numbers) - len(seen),
                "out_of_order": sum(1 for a, b in itertools.pairwise(numbers) if b < a),
            }
        )
        result["ok"] = not lost and not load.failed and result["stored_twice"] == 0
    except Exception as e:  # noqa: BLE001 - reported with the others; the run goes on
        result.update(
            {
                "ok": False,
                "error": f"{e!r}",
                "broker_log_tails": {
                    str(b.broker_id): log_tail(b.log_path) for b in cluster.brokers
                },
            }
        )
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if stopping is not None:
            await asyncio.gather(stopping, return_exceptions=True)
        await ownership.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 30)
        await channel.close()
    result["restart_s"] = await _restore(cluster, topic)
    return result


async def _take_down(node: BrokerNode, kind: str, exited_at: list[float]) -> None:
    """SIGKILL (``crash``) or SIGTERM (``graceful``) a broker, and note when it exited."""
    # both send their signal before their first await, then wait for the exit
    await (node.kill() if kind == "crash" else node.stop())
    exited_at.append(time.perf_counter())


async def _stored_and_owner(cluster: LocalCluster, partition: str) -> tuple[int, str]:
    """How many messages a partition holds, and its owner, as a running broker tells."""
    channel, stub = admin_stub(running_broker(cluster))
    try:
        after = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=partition))
        return after.partitions[0].next_offset, after.partitions[0].owner_broker_id
    finally:
        await channel.close()


def _log_event_ms(
    cluster: LocalCluster,
    offsets: dict[str, int],
    wall0: float,
    broker_id: str,
    event: str,
    **match: str,
) -> float | None:
    """Milliseconds from ``wall0`` to the first ``event`` a broker logged since then (past
    ``offsets``, its log's size when the run started) whose fields end with ``match``."""
    node = next((b for b in cluster.brokers if b.broker_id == broker_id), None)
    if node is None:
        return None
    for wall, name, record in broker_log_events(node.log_path, offsets.get(broker_id, 0)):
        if (
            name == event
            and wall >= wall0
            and all(record.get(k, "").endswith(v) for k, v in match.items())
        ):
            return (wall - wall0) * 1e3
    return None


async def _restore(cluster: LocalCluster, topic: str) -> float:
    """Bring every broker up again, so the next run finds both (a new process for the one that
    went away), and delete the run's topic, so it is not among those a stopping broker hands
    over; the seconds the restart took."""
    restart_started = time.perf_counter()
    for node in cluster.brokers:
        if not node.is_running:
            await node.start()
    await cluster.wait_brokers_registered()
    restart_s = time.perf_counter() - restart_started
    with contextlib.suppress(Exception):
        channel, stub = admin_stub(running_broker(cluster))
        try:
            await stub.DeleteTopic(admin.DeleteTopicRequest(topic=topic, force=True), timeout=30)
        finally:
            await channel.close()
    return restart_s


def _age(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} s"


def _opt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"


def _print_failover(r: dict[str, Any]) -> None:
    name = f"TTL {r['ttl_s']} s, {r['kind']} #{r['run'] + 1}"
    if "error" in r:
        print(f"{name}: FAILED {r['error']}", flush=True)
        return
    print(
        f"{name}: {r['victim']} -> {r['new_owner']}: first receipt from a new ledger after"
        f" **{_opt_ms(r['failover_ms'])}** (owner key gone {_opt_ms(r['owner_key_deleted_ms'])},"
        f" taken {_opt_ms(r['owner_key_created_ms'])}, client connected"
        f" {_opt_ms(r['client_connected_ms'])}, {r['client_reconnect_attempts']} reconnect"
        f" attempts); acked {r['acked']:,}, lost {r['lost']}, stored twice {r['stored_twice']},"
        f" failed sends {r['failed_sends']}",
        flush=True,
    )


FAILOVER_FIGURES = (
    "failover_ms",
    "owner_key_deleted_ms",
    "owner_key_created_ms",
    "owner_key_vacant_ms",
    "new_owner_ledger_recovered_ms",
    "new_owner_ownership_acquired_ms",
    "client_connected_ms",
    "first_receipt_any_ledger_ms",
    "victim_exited_ms",
    "client_reconnect_attempts",
)


def failover_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (TTL, kind): p50 (median), min, max of each figure over the runs that succeeded."""
    out: dict[str, Any] = {}
    for key in sorted({(r["ttl_s"], r["kind"]) for r in runs}, key=lambda k: (-k[0], k[1])):
        group = [r for r in runs if (r["ttl_s"], r["kind"]) == key]
        good = [r for r in group if "error" not in r]
        figures: dict[str, Any] = {}
        for name in FAILOVER_FIGURES:
            values = [r[name] for r in good if r.get(name) is not None]
            figures[name] = (
                {
                    "p50": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
                if values
                else None
            )
        out[f"ttl{key[0]}-{key[1]}"] = {
            "ttl_s": key[0],
            "kind": key[1],
            "runs": len(group),
            "failed_runs": len(group) - len(good),
            "runs_with_loss": sum(1 for r in good if r["lost"]),
            "acked": sum(r["acked"] for r in good),
            "lost": sum(r["lost"] for r in good),
            "stored_twice": sum(r["stored_twice"] for r in good),
            "failed_sends": sum(r["failed_sends"] for r in good),
            "figures": figures,
        }
    return out


# --- report ---------------------------------------------------------------------------------------


def _fig(summary: dict[str, Any], name: str, stat: str) -> str:
    f = summary["figures"].get(name)
    return "-" if f is None else f"{f[stat]:,.0f} ms"


def _failover_lines(results: dict[str, Any]) -> list[str]:
    p = results["parameters"]["failover"]
    summary = results["failover"]["summary"]
    lines = [
        "",
        "## Failover",
        "",
        (
            f"Per session TTL, one `LocalCluster` (its own etcd, {BOOKIES} bookies,"
            f" {FAILOVER_BROKERS} brokers with `{' '.join(p['broker_args'])}`). Each run creates"
            " a new 1-partition topic and produces to its partition with one `magnetar.aio`"
            f" producer: a {p['message_bytes']} B message every {p['interval_ms']:g} ms, at most"
            f" {p['in_flight']} unconfirmed. After {p['steady_s']:g} s the partition's owner is"
            " SIGTERMed (graceful) or, after a further random 0 to TTL/3 s, SIGKILLed (crash: the"
            " owner refreshes its lease every TTL/3, and the wait puts the crash at a random"
            " point of that cycle). **Failover time** is from the signal to"
            " the first receipt naming a ledger other than those the partition had before"
            " (receipts the old owner sent just before dying do not count). The flow goes on"
            f" for {p['after_s']:g} s more (and at least 100 receipts), then the producer"
            " flushes and closes, and a reader reads the partition from the earliest message:"
            " every acknowledged message must be there. Then the broker that went away is"
            " started again (a new process, same broker id) and the topic deleted; crash and"
            " graceful runs alternate. p50 is the median of the runs."
        ),
        "",
        (
            "| session TTL | kind | runs | failover p50 | min | max | acked | lost | stored"
            " twice | failed sends |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        failed = f" ({s['failed_runs']} failed)" if s["failed_runs"] else ""
        lines.append(
            f"| {s['ttl_s']} s | {s['kind']} | {s['runs']}{failed}"
            f" | **{_fig(s, 'failover_ms', 'p50')}** | {_fig(s, 'failover_ms', 'min')}"
            f" | **{_fig(s, 'failover_ms', 'max')}** | {s['acked']:,} | {s['lost']}"
            f" | {s['stored_twice']} | {s['failed_sends']} |"
        )
    lines += [
        "",
        "Where the time goes (p50 over the runs, ms after the signal):",
        "",
        (
            "| session TTL | kind | old owner's key gone from etcd | new owner took the key |"
            " (key vacant: taken - gone) | new owner recovered the old ledger | new owner ready"
            " (`ownership_acquired`) | client's producer connected | first receipt from the"
            " new ledger | old owner's process exited | client reconnect attempts |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        attempts = s["figures"].get("client_reconnect_attempts")
        lines.append(
            f"| {s['ttl_s']} s | {s['kind']}"
            + "".join(
                f" | {_fig(s, name, 'p50')}"
                for name in (
                    "owner_key_deleted_ms",
                    "owner_key_created_ms",
                    "owner_key_vacant_ms",
                    "new_owner_ledger_recovered_ms",
                    "new_owner_ownership_acquired_ms",
                    "client_connected_ms",
                    "failover_ms",
                    "victim_exited_ms",
                )
            )
            + f" | {'-' if attempts is None else format(attempts['p50'], 'g')} |"
        )
    lines += [
        "",
        (
            "The etcd times come from a watch on the partition's ownership key in the benchmark"
            " process; the broker times from the brokers' own log lines (wall clock, same"
            " machine); the client times from the client library's log events. A crashed"
            " owner's key goes when its session lease expires: the broker refreshes the lease"
            " every TTL/3, so that is between 2/3 of the TTL and the TTL after the SIGKILL, plus"
            " up to about 0.5 s for etcd to notice (it looks for expired leases every 500 ms)."
            " Until then lookups still name the dead owner, and the client retries with its"
            " backoff (50 ms doubling to 1 s, ±10%); the first attempt after the key is gone"
            " assigns the partition to the survivor, so the key stays vacant for up to a"
            " backoff step. After a SIGTERM the old owner releases the key itself and the"
            " client reconnects after its first backoff step (50 ms). *First receipt (any"
            " ledger)*, in the JSON, is not in this table: it is either a receipt the old owner"
            " had already sent (a few ms) or the failover itself."
        ),
        "",
        "Every run:",
        "",
        (
            "| TTL | kind | # | old owner (its age) -> new owner | failover | key gone | key"
            " taken | ready | connected | reconnects | acked | stored | lost | stored twice |"
            " failed sends |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["failover"]["runs"]:
        head = f"| {r['ttl_s']} s | {r['kind']} | {r['run'] + 1}"
        if "error" in r:
            lines.append(f"{head} | FAILED: `{r['error']}` |" + " |" * 11)
            continue
        lines.append(
            f"{head} | {r['victim']} ({_age(r.get('victim_age_s'))}) -> {r['new_owner']}"
            f" | **{_opt_ms(r['failover_ms'])}**"
            f" | {_opt_ms(r['owner_key_deleted_ms'])} | {_opt_ms(r['owner_key_created_ms'])}"
            f" | {_opt_ms(r['new_owner_ownership_acquired_ms'])}"
            f" | {_opt_ms(r['client_connected_ms'])} | {r['client_reconnect_attempts']}"
            f" | {r['acked']:,} | {r['stored']:,} | {r['lost']} | {r['stored_twice']}"
            f" | {r['failed_sends']} |"
        )
    return lines


def _throughput_lines(results: dict[str, Any]) -> list[str]:
    p = results["parameters"]["throughput"]
    runs = results["throughput"]["runs"]
    cores = results["machine"]["cpu_count"]
    lines = [
        "",
        "## Produce throughput: through a broker, and straight to the bookies",
        "",
        (
            f"One `LocalCluster` (its own etcd, {BOOKIES} bookies, 1 broker with"
            f" `{' '.join(p['broker_args'])}`), E{QUORUM[0]}/Qw{QUORUM[1]}/Qa{QUORUM[2]} on both"
            " paths. **Broker**: one `magnetar.aio` producer (default batching: a batch is sealed"
            " at 1,000 messages, 128 KiB or 1 ms) on a 1-partition topic, keeping"
            f" {p['window_mib']:g} MiB of messages unconfirmed (`send_async` with a callback),"
            f" letting the event loop run after every {p['turn_mib']:g} MiB. One batch is one"
            " entry. **Direct**: one `LedgerClient` writer (ledger_bench's) on a new ledger of"
            " the same bookies, with entries of the mean size the broker's entries had on the"
            f" bookies in the first broker run, {p['window_mib']:g} MiB of adds in flight,"
            f" {p['turn_mib']:g} MiB per loop turn. Its messages/s are its entries/s times the"
            f" broker run's messages per entry. {p['warmup_s']:g} s warm-up, {p['duration_s']:g} s"
            " measured; a receipt or add counts if it completed inside the measured window."
            f" {p['rounds']} round(s), each both paths for each size; the second round runs the"
            " direct writer first. Before every workload the page cache is written back"
            " (`sync`), so that one workload's writeback does not fall into the next one's"
            " window."
        ),
        "",
    ]
    if not runs:
        return [*lines, "Not run."]
    runs = sorted(runs, key=lambda r: (r["message_bytes"], r["round"], r["path"]))
    header = [f"{size_name(r['message_bytes'])}, {r['path']} #{r['round']}" for r in runs]
    own = results.get("own_cost", {}).get("us_per_message", 0.0)
    rows: list[tuple[str, Any]] = [
        ("messages/s", lambda r: f"**{r['messages_per_s']:,.0f}**"),
        ("payload MB/s (messages)", lambda r: f"{r['payload_mb_per_s']:,.1f}"),
        ("entries/s", lambda r: f"**{r['entries_per_s']:,.0f}**"),
        ("messages per entry", lambda r: f"{r['messages_per_entry']:,.1f}"),
        ("entry size on the bookies", lambda r: f"{r['stored_entry_bytes'] / KIB:,.1f} KiB"),
        ("entry MB/s", lambda r: f"**{r['stored_mb_per_s']:,.1f}**"),
        ("latency p50 (send / add)", lambda r: ms(r["latency"]["p50_us"])),
        ("latency p99", lambda r: ms(r["latency"]["p99_us"])),
        ("latency max", lambda r: ms(r["latency"]["max_us"])),
        ("bench process CPU (the client)", lambda r: f"{r['cpu']['bench_pct']:.0f}%"),
        ("of it, its event loop thread", lambda r: f"{r['cpu']['bench_event_loop_pct']:.0f}%"),
        ("of it, the benchmark's own bookkeeping", lambda r: (
            f"~{r['messages_per_s'] * own / 1e4:.0f}%" if r["path"] == "broker" else "-")),
        ("broker process CPU", lambda r: f"{r['cpu']['broker_pct']:.0f}%"),
        ("broker's busiest thread", lambda r: busiest_cell(r["cpu"]["broker_busiest_thread"])),
        ("bookie processes CPU (sum of 3)", lambda r: f"{r['cpu']['bookies_pct']:.0f}%"),
        ("busiest bookie thread", lambda r: busiest_cell(r["cpu"]["bookie_busiest_thread"])),
        ("etcd CPU", lambda r: f"{r['cpu']['etcd_pct']:.0f}%"),
        ("machine busy (other; stolen)", lambda r: (
            f"{r['cpu']['machine_busy_pct']:.0f}% ({r['cpu']['other_pct']:.0f}%;"
            f" {r['cpu']['machine_steal_pct']:.0f}%)")),
        ("journal MB/s, all bookies", lambda r: f"{r['cpu']['journal_mb_per_s']:,.1f}"),
        ("busiest journal in fdatasync", lambda r:
         f"{r['cpu']['busiest_journal_fdatasync_pct']:.0f}% of the time"),
        ("CPU per entry: client / broker / bookies / other", lambda r: " / ".join(
            f"{r['cpu_us_per_entry'][k]:,.0f}" for k in ("client", "broker", "bookies", "other"))
         + " us"),
        ("CPU per entry, whole machine", lambda r:
         f"**{r['cpu_us_per_entry']['machine']:,.0f} us**"),
        ("what limits it", lambda r: "; ".join(r["limits"])),
    ]  # fmt: skip
    lines += [
        "| figure | " + " | ".join(header) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label, get in rows:
        cells = [get(r) if r["ok"] else "FAILED" for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [f"\n**{r['path']} {r['message_bytes']} B FAILED**: `{r.get('error')}`"
              for r in runs if not r["ok"]]  # fmt: skip
    lines += [
        "",
        "**Broker overhead ratio** (broker throughput / direct throughput, same entries):",
        "",
    ]
    for o in results["throughput"]["overall"]:
        rounds = ", ".join(
            f"{r['entries_ratio']:.2f}"
            for r in results["throughput"]["ratios"]
            if r["message_bytes"] == o["message_bytes"]
        )
        b, d = o["broker"], o["direct"]
        lines.append(
            f"- {size_name(o['message_bytes'])} messages: **{o['entries_ratio']:.2f}** (mean"
            f" over the rounds: broker {b['messages_per_s']:,.0f} messages/s ="
            f" {b['entries_per_s']:,.0f} entries/s = {b['stored_mb_per_s']:,.1f} MB/s of entries;"
            f" direct {d['messages_per_s']:,.0f} messages/s = {d['entries_per_s']:,.0f}"
            f" entries/s = {d['stored_mb_per_s']:,.1f} MB/s); per round: {rounds}"
        )
    lines += [
        "",
        (
            "Latency is per message for the broker path (from `send_async` to its callback, i.e."
            " until the broker had the entry confirmed by Qa bookies and the receipt was back)"
            " and per entry for the direct path (from `add_async` to completion); with a full"
            " window both are mostly queueing. CPU % is of one core: the machine has"
            f" {cores} cores, so {100 * cores}% is all of it. The bench process runs the client"
            " library in the broker rows and the ledger client in the direct rows; its own"
            " bookkeeping (counting receipts, timing each message) was measured at"
            f" {own:.2f} us per message against a stub producer. *Other* is CPU time no process"
            " of the cluster was charged with (kernel threads: page-cache writeback, the file"
            " system journal, softirqs; other tenants), from `/proc/stat`. *CPU per entry* is"
            " each share divided by the entries/s."
        ),
    ]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        *report_head(results, "Broker benchmark"),
        "",
        (
            "Every server is a real process on this machine, like the benchmark process itself,"
            " which runs the clients. MB = 10^6 bytes. No targets: figures only. The machine is"
            " shared and noisy: compare within this run only."
        ),
    ]
    if results["failover"]["runs"]:
        lines += _failover_lines(results)
    if results["throughput"]["runs"]:
        lines += _throughput_lines(results)
    lines += ["", *raw_limits_table(results, (RAW_4K_OPS, RAW_1M, RAW_4M, RAW_RTT_P50))]
    return report_text(
        lines, "Raw figures, parameters, per-run breakdowns and machine details", next_to="it"
    )


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "broker_bench.py",
        (
            "Benchmark brokers as real processes against real etcd and bookie processes."
            " Failover: the owner of a partition a producer writes to is SIGKILLed (crash) or"
            " SIGTERMed (graceful); the time from the signal to the first receipt from a new"
            " ledger, p50/max over --runs runs each, for every --ttl (the brokers'"
            " --session-ttl-s), and a check that every acknowledged message can be read back."
            " Throughput: one producer through a broker against LedgerClient straight to the"
            " same bookies with entries of the same size, for 1 KiB and 64 KiB messages, and"
            " the ratio. Raw limits of this machine at the start and the end. Writes"
            " broker-<date>.json and .md to --out. Exits 0 if every run succeeded and no"
            " acknowledged message was lost, else 1 (results are written either way)."
        ),
    )
    add("--runs", type=int, default=10, help="failover runs per TTL and kind")
    add(
        "--ttl",
        type=int,
        action="append",
        help=f"a broker session TTL to run the failovers with (repeatable; default {DEFAULT_TTLS})",
    )
    add("--steady-s", type=float, default=1.5, help="seconds of steady flow before the signal")
    add(
        "--after-s",
        type=float,
        default=0.5,
        help="seconds the flow goes on after the first receipt from the new ledger",
    )
    add(
        "--seed",
        type=int,
        default=1,
        help="seed of the random extra wait (0 to TTL/3) before each SIGKILL",
    )
    add("--in-flight", type=int, default=20, help="failover producer: messages unconfirmed at most")
    add("--interval-ms", type=float, default=2.0, help="failover producer: pause between sends")
    add("--failover-message-bytes", type=int, default=100, help="failover message size")
    add(
        "--rounds",
        type=int,
        default=2,
        help="throughput rounds (each: both paths for each message size; even rounds run the"
        " direct writer first)",
    )
    add("--duration-s", type=float, default=5.0, help="measured seconds per throughput workload")
    add("--warmup-s", type=float, default=2.0, help="unmeasured seconds before each one")
    add("--window-mib", type=float, default=8.0, help="bytes in flight, both paths (MiB)")
    add("--turn-mib", type=float, default=1.0, help="bytes added per event-loop turn (MiB)")
    add_raw_s_option(add, default=1.0)
    add("--no-failover", action="store_true", help="skip the failover runs")
    add("--no-throughput", action="store_true", help="skip the throughput comparison")
    add_quick_and_tag(
        add,
        "broker",
        quick="1 failover run per TTL and kind, 1 s warm-up and 1 s measured per throughput"
        " workload, 0.5 s per raw measurement",
    )
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the clusters and the raw disk tests and"
            " removed at the end"
        ),
        keep_data_help=(
            "leave the temporary directory (the servers' logs, e.g. broker-<i>.log in each"
            " cluster's directory) in place, and print where it is"
        ),
    )
    args = parser.parse_args(argv)
    args.ttl = args.ttl or list(DEFAULT_TTLS)
    if args.quick:
        args.runs = min(args.runs, 1)
        args.rounds = min(args.rounds, 1)
        args.duration_s = 1.0
        args.warmup_s = 1.0
        args.raw_s = 0.5
        args.tag = args.tag or "quick"
    if any(t < 2 for t in args.ttl):
        parser.error("--ttl must be at least 2 (the broker's own minimum)")
    if args.runs < 0 or args.in_flight < 1 or args.failover_message_bytes < NUMBER_DIGITS:
        parser.error("--runs >= 0, --in-flight >= 1, --failover-message-bytes >= 12")
    return args


async def bench_failover(args: argparse.Namespace, root: Path, results: dict[str, Any]) -> None:
    for ttl in args.ttl:
        broker_args = [*BROKER_ARGS, "--session-ttl-s", str(ttl)]
        cluster = LocalCluster(
            root / f"failover-ttl{ttl}",
            bookies=BOOKIES,
            brokers=FAILOVER_BROKERS,
            broker_args=broker_args,
        )
        store: MetadataStore | None = None
        # A broker refreshes its lease every TTL/3, and its lease expires a TTL after the last
        # refresh. The victim is usually the broker restarted after the previous run, so without
        # this it would die at about the same point of its refresh cycle every time; a random
        # extra wait makes that point uniform, as for a crash that comes at any moment.
        rng = random.Random(f"{args.seed}-{ttl}")
        try:
            await cluster.start()
            store = await open_store(cluster.metadata_url)
            for index in range(args.runs):
                for kind in KINDS:
                    delay = rng.uniform(0, ttl / 3) if kind == "crash" else 0.0
                    result = await run_failover(
                        cluster,
                        store,
                        ttl_s=ttl,
                        kind=kind,
                        index=index,
                        steady_s=args.steady_s,
                        kill_delay_s=delay,
                        after_s=args.after_s,
                        in_flight=args.in_flight,
                        interval_s=args.interval_ms / 1000,
                        message_bytes=args.failover_message_bytes,
                    )
                    results["failover"]["runs"].append(result)
                    _print_failover(result)
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            await cluster.aclose()


async def bench_throughput(args: argparse.Namespace, root: Path, results: dict[str, Any]) -> None:
    window_bytes, turn_bytes = int(args.window_mib * MIB), int(args.turn_mib * MIB)
    cluster = LocalCluster(root / "throughput", bookies=BOOKIES, brokers=1, broker_args=BROKER_ARGS)
    store: MetadataStore | None = None
    # the direct writer copies the entry size and messages per entry of the broker's entries
    shape: dict[int, tuple[int, float]] = {}
    try:
        await cluster.start()
        store = await open_store(cluster.metadata_url)
        for round_ in range(args.rounds):
            for size in MESSAGE_SIZES:
                # every second round runs the direct writer first, so that neither path
                # always runs right after the other's writes
                paths = (
                    ("broker", "direct")
                    if round_ % 2 == 0 or size not in shape
                    else (
                        "direct",
                        "broker",
                    )
                )
                pair: dict[str, dict[str, Any]] = {}
                for path in paths:
                    settled_s = await settle_disk()
                    if path == "broker":
                        r = await run_broker_throughput(
                            cluster,
                            size,
                            index=round_,
                            window_bytes=window_bytes,
                            turn_bytes=turn_bytes,
                            warmup_s=args.warmup_s,
                            duration_s=args.duration_s,
                        )
                        if r["ok"] and size not in shape:
                            shape[size] = (round(r["stored_entry_bytes"]), r["messages_per_entry"])
                    else:
                        entry_bytes, per_entry = shape.get(size, (size, 1.0))
                        r = await run_direct_throughput(
                            cluster,
                            store,
                            entry_bytes,
                            message_bytes=size,
                            messages_per_entry=per_entry,
                            window_bytes=window_bytes,
                            turn_bytes=turn_bytes,
                            warmup_s=args.warmup_s,
                            duration_s=args.duration_s,
                        )
                    r["round"] = round_ + 1
                    r["sync_before_s"] = settled_s
                    results["throughput"]["runs"].append(r)
                    pair[path] = r
                    _print_throughput(r)
                ratio = overhead(pair["broker"], pair["direct"])
                if ratio:
                    ratio["round"] = round_ + 1
                    results["throughput"]["ratios"].append(ratio)
                    print(
                        f"{size_name(size)}, round {round_ + 1}: broker / direct ="
                        f" {ratio['entries_ratio']:.2f} (entries/s)",
                        flush=True,
                    )
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        await cluster.aclose()
    results["throughput"]["overall"] = overall_ratios(results["throughput"]["runs"])


def overall_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per message size: the mean over the rounds of each path, and their ratio."""
    out = []
    for size in MESSAGE_SIZES:
        means: dict[str, dict[str, float]] = {}
        for path in ("broker", "direct"):
            ok = [r for r in runs if r["message_bytes"] == size and r["path"] == path and r["ok"]]
            if ok:
                means[path] = {
                    k: statistics.mean(r[k] for r in ok)
                    for k in ("messages_per_s", "entries_per_s", "stored_mb_per_s")
                }
                means[path]["rounds"] = len(ok)
        if len(means) == 2 and means["direct"]["entries_per_s"]:
            b, d = means["broker"], means["direct"]
            out.append(
                {
                    "message_bytes": size,
                    "broker": b,
                    "direct": d,
                    "entries_ratio": b["entries_per_s"] / d["entries_per_s"],
                    "messages_ratio": b["messages_per_s"] / d["messages_per_s"],
                    "stored_bytes_ratio": b["stored_mb_per_s"] / d["stored_mb_per_s"],
                }
            )
    return out


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    print(f"clusters and raw disk tests in {root}", flush=True)
    results: dict[str, Any] = {
        **results_head("broker", "broker_bench.py", argv, started, args),
        "parameters": {
            "bookies": BOOKIES,
            "quorum": "E{}/Qw{}/Qa{}".format(*QUORUM),
            "raw_s": args.raw_s,
            "failover": {
                "brokers": FAILOVER_BROKERS,
                "ttls_s": args.ttl,
                "runs_per_ttl_and_kind": args.runs,
                "broker_args": [*BROKER_ARGS, "--session-ttl-s", "<TTL>"],
                "steady_s": args.steady_s,
                "crash_extra_wait": "uniform 0..TTL/3 s, seeded",
                "seed": args.seed,
                "after_s": args.after_s,
                "in_flight": args.in_flight,
                "interval_ms": args.interval_ms,
                "message_bytes": args.failover_message_bytes,
                "producer": "defaults, send_timeout_ms=120000",
                "client": "defaults (backoff 50 ms doubling to 1 s), operation_timeout_s=60",
            },
            "throughput": {
                "brokers": 1,
                "broker_args": BROKER_ARGS,
                "message_sizes": list(MESSAGE_SIZES),
                "rounds": args.rounds,
                "window_mib": args.window_mib,
                "turn_mib": args.turn_mib,
                "warmup_s": args.warmup_s,
                "duration_s": args.duration_s,
            },
        },
        "machine": machine_info(root),
        "raw_limits": {},
        "failover": {"runs": [], "summary": {}},
        "throughput": {"runs": [], "ratios": [], "overall": []},
    }
    await raw_limits_at(results, "start", root / "raw", args.raw_s)
    turn = window_for(KIB, int(args.window_mib * MIB), int(args.turn_mib * MIB))[1]
    results["own_cost"] = await measure_own_cost(1.0, turn)
    print(
        f"the benchmark's own cost per message (stub producer):"
        f" {results['own_cost']['us_per_message']:.2f} us of its event loop",
        flush=True,
    )
    if not args.no_throughput:
        await bench_throughput(args, root, results)
    if not args.no_failover:
        await bench_failover(args, root, results)
        results["failover"]["summary"] = failover_summary(results["failover"]["runs"])
        for s in results["failover"]["summary"].values():
            f = s["figures"]["failover_ms"]
            if f is not None:
                print(
                    f"TTL {s['ttl_s']} s, {s['kind']}: failover p50 {f['p50']:,.0f} ms, max"
                    f" {f['max']:,.0f} ms over {f['n']} runs; lost {s['lost']} of"
                    f" {s['acked']:,} acknowledged",
                    flush=True,
                )
    await raw_limits_at(results, "end", root / "raw", args.raw_s)
    results["elapsed_s"] = time.time() - started
    return results


def main(argv: list[str] | None = None) -> int:
    # the client library logs every reconnect: only warnings reach the console; LOG_CLOCK times
    # the events the failover is broken down by
    ok = all_ok("throughput.runs", "failover.runs")
    return bench_main(
        "broker", argv, parse_args, bench, render_markdown, ok=ok, log_clock=LOG_CLOCK
    )


if __name__ == "__main__":
    raise SystemExit(main())
