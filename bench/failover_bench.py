"""Failover benchmark: how long a sync producer stalls when the broker that owns its topic dies
(SIGKILL, host alive), and how long until another broker serves it when the owner is cut off
from etcd (a network namespace whose etcd link goes down). Default settings everywhere.

Run from the repository root, as root (the cut case needs network namespaces)::

    .venv/bin/python bench/failover_bench.py                      # 10 crash + 3 cut runs, ~4 min
    .venv/bin/python bench/failover_bench.py --crash-runs 2 --cut-runs 1 --tag quick

It writes ``bench/results/failover-<date>[-<tag>].json`` (every run's figures) and ``.md`` (the
summary). Each run uses a fresh topic and a new client; one sync producer sends numbered
messages back to back. Figures per run:

- ``stall_ms``: the longest gap between two consecutive acknowledged sends, from one second
  before the fault to the end of the run (the producer's view of the outage);
- ``served_ms``: from the fault to the first acknowledged send stored in a ledger the old owner
  did not write (the new owner serves);
- ``unregistered_ms``: from the fault to the old owner's registration disappearing from etcd
  (its lease revoked by a peer, or expired);
- ``lost``: acknowledged messages a consumer reading the topic from the start did not get.

Targets (issue 24): crash, p50 stall <= 1 s and max <= 2 s over 10 runs; cut from etcd, served
within session_ttl_s + 1 s (11 s). The machine is shared: figures vary from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

import magnetar
from magnetar.common.errors import MagnetarError, ReceiveTimeoutError
from magnetar.testing import BrokerNode, LocalCluster
from metadata import MetadataStore, layout, open_store
from proto.format.v1 import cluster_pb2

SESSION_TTL_S = 10  # the default; the cut target is this plus one second
WARMUP_S = 1.5
AFTER_S = 2.0
WAIT_SERVED_S = 40.0


@dataclass
class Sender:
    """A sync producer sending numbered messages back to back, in a thread of its own."""

    producer: Any
    acks: list[tuple[float, int, int]] = field(default_factory=list)
    """(monotonic time, message number, ledger id)"""
    failures: list[tuple[int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            try:
                message_id = self.producer.send(str(number).encode())
            except MagnetarError as e:
                self.failures.append((number, f"{type(e).__name__}: {e.message}"))
            else:
                self.acks.append((time.monotonic(), number, message_id.ledger_id))
            number += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def ledgers_before(self, moment: float) -> set[int]:
        return {ledger for t, _, ledger in list(self.acks) if t <= moment}

    def served_at(self, moment: float, old_ledgers: set[int]) -> float | None:
        for t, _, ledger in list(self.acks):
            if t > moment and ledger not in old_ledgers:
                return t
        return None

    def stall_s(self, since: float) -> float:
        times = [t for t, _, _ in self.acks if t >= since]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def wait_watched(node: BrokerNode, peers: int, timeout_s: float = 30) -> None:
    """Until ``node`` has seen ``peers`` other brokers listening (a broker ends only the session
    of a peer it saw alive: one refusing from the start is taken for a misconfiguration)."""
    url = f"http://{node.http_address}/metrics"
    line = f'magnetar_broker_peers_watched{{broker="{node.broker_id}"}} {peers}.0'
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        if line in text.decode():
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{node.broker_id} did not see {peers} peer(s) listening in {timeout_s} s")


async def owner_of(store: MetadataStore, topic: str) -> str | None:
    record = await store.get(layout.ownership(topic))
    if record is None:
        return None
    owner = cluster_pb2.OwnershipRecord()
    owner.ParseFromString(record.value)
    return owner.broker_id


async def watch_unregistered(store: MetadataStore, broker_id: str, since: float) -> float | None:
    """Seconds from ``since`` until ``broker_id``'s registration is gone (polled every 20 ms)."""
    while await store.get(layout.broker(broker_id)) is not None:  # noqa: ASYNC110 - polls etcd
        await asyncio.sleep(0.02)
    return time.monotonic() - since


def read_back(client: Any, topic: str, acked: set[int], timeout_s: float = 60) -> set[int]:
    """The acknowledged numbers a consumer reading from the start did not get."""
    consumer = client.subscribe(topic, "read-back", initial_position="earliest")
    missing = set(acked)
    deadline = time.monotonic() + timeout_s
    try:
        while missing and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=1000)
            except ReceiveTimeoutError:
                continue
            missing.discard(int(message.data()))
            consumer.acknowledge(message)
    finally:
        consumer.close()
    return missing


async def start_sender(service_url: str, topic: str) -> tuple[Any, Sender]:
    client = await asyncio.to_thread(magnetar.Client, service_url)
    producer = await asyncio.to_thread(client.create_producer, topic)
    sender = Sender(producer)
    sender.start()
    return client, sender


async def finish(client: Any, sender: Sender, topic: str, fault_at: float) -> dict[str, Any]:
    await asyncio.sleep(AFTER_S)
    await asyncio.to_thread(sender.stop)
    acked = {n for _, n, _ in sender.acks}
    missing = await asyncio.to_thread(read_back, client, topic, acked)
    await asyncio.to_thread(client.close)
    return {
        "stall_ms": round(sender.stall_s(fault_at - 1.0) * 1000),
        "acked": len(acked),
        "failed_sends": len(sender.failures),
        "first_failures": sender.failures[:3],
        "lost": len(missing),
    }


async def wait_served(sender: Sender, fault_at: float, old: set[int]) -> float | None:
    deadline = time.monotonic() + WAIT_SERVED_S
    while time.monotonic() < deadline:
        served = sender.served_at(fault_at, old)
        if served is not None:
            return served - fault_at
        await asyncio.sleep(0.02)
    return None


async def crash_run(cluster: LocalCluster, store: MetadataStore, index: int) -> dict[str, Any]:
    topic = f"public/default/crash-{index}"
    client, sender = await start_sender(cluster.service_url, topic)
    await asyncio.sleep(WARMUP_S)
    owner = await owner_of(store, topic)
    victim = next(b for b in cluster.brokers if b.broker_id == owner)
    survivor = next(b for b in cluster.brokers if b is not victim)
    await wait_watched(survivor, 1)
    fault_at = time.monotonic()
    await victim.kill()
    old = sender.ledgers_before(fault_at)
    unregistered = asyncio.create_task(watch_unregistered(store, victim.broker_id or "", fault_at))
    served_s = await wait_served(sender, fault_at, old)
    result = await finish(client, sender, topic, fault_at)
    unregistered_s = await asyncio.wait_for(unregistered, timeout=SESSION_TTL_S + 5)
    await victim.start()
    await cluster.wait_brokers_registered()
    return {
        "run": index,
        "victim": victim.broker_id,
        "served_ms": None if served_s is None else round(served_s * 1000),
        "unregistered_ms": None if unregistered_s is None else round(unregistered_s * 1000),
        **result,
    }


async def cut_run(
    cluster: LocalCluster, store: MetadataStore, isolated: BrokerNode, index: int
) -> dict[str, Any]:
    host = cluster.isolated_host
    assert host is not None
    # new topics until one lands on the isolated broker (lookups spread them over both)
    for attempt in range(12):
        topic = f"public/default/cut-{index}-{attempt}"
        client, sender = await start_sender(cluster.service_url, topic)
        await asyncio.sleep(0.5)
        if await owner_of(store, topic) == isolated.broker_id:
            break
        await asyncio.to_thread(sender.stop)
        await asyncio.to_thread(client.close)
    else:
        raise RuntimeError("no topic landed on the isolated broker in 12 tries")
    await asyncio.sleep(WARMUP_S)
    fault_at = time.monotonic()
    await host.cut("etcd")
    old = sender.ledgers_before(fault_at)
    unregistered = asyncio.create_task(
        watch_unregistered(store, isolated.broker_id or "", fault_at)
    )
    served_s = await wait_served(sender, fault_at, old)
    result = await finish(client, sender, topic, fault_at)
    unregistered_s = await asyncio.wait_for(unregistered, timeout=SESSION_TTL_S + 5)
    await host.heal("etcd")
    await cluster.wait_brokers_registered(timeout_s=60)
    return {
        "run": index,
        "victim": isolated.broker_id,
        "served_ms": None if served_s is None else round(served_s * 1000),
        "unregistered_ms": None if unregistered_s is None else round(unregistered_s * 1000),
        **result,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, Any]:
        values = [r[key] for r in runs if r[key] is not None]
        if not values:
            return {"p50": None, "max": None, "missing": len(runs)}
        return {
            "p50": round(statistics.median(values)),
            "max": max(values),
            "missing": len(runs) - len(values),
        }

    return {
        "runs": len(runs),
        "stall_ms": stats("stall_ms"),
        "served_ms": stats("served_ms"),
        "unregistered_ms": stats("unregistered_ms"),
        "lost": sum(r["lost"] for r in runs),
        "failed_sends": sum(r["failed_sends"] for r in runs),
    }


def progress(kind: str, run: dict[str, Any]) -> None:
    print(
        f"{kind} run {run['run']}: stall {run['stall_ms']} ms, served after"
        f" {run['served_ms']} ms, unregistered after {run['unregistered_ms']} ms,"
        f" {run['acked']} acked, {run['lost']} lost, {run['failed_sends']} failed sends",
        flush=True,
    )


async def bench(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "command": " ".join(["bench/failover_bench.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "settings": "defaults: session_ttl_s 10, peer_probe_interval_ms 250, client backoff"
        " 50 ms doubling to 1 s",
    }
    if args.crash_runs:
        runs = []
        cluster = LocalCluster(root / "crash", bookies=3, brokers=2)
        await cluster.start()
        store = await open_store(cluster.metadata_url)
        try:
            for i in range(args.crash_runs):
                runs.append(await crash_run(cluster, store, i))
                progress("crash", runs[-1])
        finally:
            await store.close()
            await cluster.aclose()
        results["crash"] = {"summary": summary(runs), "runs": runs}
    if args.cut_runs:
        runs = []
        cluster = LocalCluster(root / "cut", bookies=3, brokers=1, isolated_brokers=1)
        await cluster.start()
        store = await open_store(cluster.metadata_url)
        isolated = cluster.isolated_broker
        assert isolated is not None
        try:
            for i in range(args.cut_runs):
                runs.append(await cut_run(cluster, store, isolated, i))
                progress("cut", runs[-1])
        finally:
            await store.close()
            await cluster.aclose()
        results["cut_from_etcd"] = {"summary": summary(runs), "runs": runs}
    return results


def _fig(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Failover benchmark, {results['date']}",
        "",
        (
            f"Command: `{results['command']}` ({results['cpus']} CPUs, shared machine)."
            f" Settings: {results['settings']}. etcd, 3 bookies and 2 brokers as real processes"
            " (magnetar.testing.LocalCluster); one sync producer per run on a fresh topic."
        ),
        "",
        (
            "| case | runs | producer stall p50 / max (ms) | served by another broker p50 / max"
            " (ms) | old owner unregistered p50 / max (ms) | lost | failed sends | target |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    cases = [
        ("crash", "SIGKILL of the owner (host alive)", "stall p50 <= 1,000, max <= 2,000"),
        (
            "cut_from_etcd",
            "owner cut from etcd (netns link down)",
            f"served <= {(SESSION_TTL_S + 1) * 1000:,}",
        ),
    ]
    for key, label, target in cases:
        if key not in results:
            continue
        s = results[key]["summary"]
        lines.append(
            f"| {label} | {s['runs']} | {_fig(s['stall_ms']['p50'])} / {_fig(s['stall_ms']['max'])}"
            f" | {_fig(s['served_ms']['p50'])} / {_fig(s['served_ms']['max'])}"
            f" | {_fig(s['unregistered_ms']['p50'])} / {_fig(s['unregistered_ms']['max'])}"
            f" | {s['lost']} | {s['failed_sends']} | {target} |"
        )
    lines += [
        "",
        (
            "- *producer stall*: the longest gap between two consecutive acknowledged sends, from"
            " one second before the fault to two seconds after the partition was served again."
        ),
        (
            "- *served by another broker*: fault to the first acknowledged send in a ledger the"
            " old owner did not write."
        ),
        (
            "- *old owner unregistered*: fault to its registration leaving etcd (crash: a peer"
            " revoked its lease after two refused connections; cut: its lease expired)."
        ),
        (
            "- *lost*: acknowledged messages a consumer reading each topic from the start did not"
            " receive."
        ),
        "",
        "Every run:",
        "",
        "| case | run | stall (ms) | served (ms) | unregistered (ms) | acked | lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, _, _ in cases:
        for r in results.get(key, {}).get("runs", []):
            lines.append(
                f"| {key} | {r['run']} | {_fig(r['stall_ms'])} | {_fig(r['served_ms'])}"
                f" | {_fig(r['unregistered_ms'])} | {r['acked']:,} | {r['lost']} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crash-runs", type=int, default=10, help="SIGKILL runs (default 10)")
    parser.add_argument("--cut-runs", type=int, default=3, help="etcd-cut runs (default 3)")
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # the client logs each reconnect; the benchmark's own lines are enough
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    root = Path(tempfile.mkdtemp(prefix=".failover-bench-", dir=args.data_root))
    try:
        results = asyncio.run(bench(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"failover-{results['date']}{'-' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(render_markdown(results))
    print(render_markdown(results))
    print(f"wrote {args.out / stem}.json and .md")
    ok = True
    if "crash" in results:
        s = results["crash"]["summary"]
        ok &= s["lost"] == 0 and s["stall_ms"]["missing"] == 0
    if "cut_from_etcd" in results:
        ok &= results["cut_from_etcd"]["summary"]["lost"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
