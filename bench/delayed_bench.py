"""Delayed-delivery benchmark: do normal messages still flow, and how fast, while a shared
subscription holds many delayed messages aside?

Run from the repository root::

    .venv/bin/python bench/delayed_bench.py              # 100,000 delayed, a few minutes
    .venv/bin/python bench/delayed_bench.py --quick      # 10,000 delayed, smoke test

It starts a ``magnetar.testing.LocalCluster`` (its own etcd, 3 bookies, 1 broker, default
settings) and runs the same measurement on two fresh topics, one shared subscription each:

1. **fill**: ``--delayed`` messages due in an hour, each followed by an immediate "fill"
   message (so each delayed message is an entry of its own), sent with ``send_async``; the
   consumer receives and acknowledges every fill message, which leaves one acknowledgement hole
   per delayed entry (0 delayed: nothing is sent);
2. **measure**: ``--messages`` immediate messages of 100 B sent with ``send_async`` at most
   ``--window`` unconfirmed, received and acknowledged per message by the same consumer;
   throughput is messages over the time from the first send to the last receive, latency is
   send call -> receive on one clock (the send time travels in the payload).

A warm-up run of 1,000 messages on a topic of its own comes first and is not recorded. It
records the broker's RSS and the subscription's statistics (``delayed_entries``,
``ack_hole_ranges``, ``blocked``) after each phase, and writes
``bench/results/delayed-<date>[-quick].json`` and ``.md``. The machine is shared and noisy:
compare figures within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

# harness.py sits next to this script (importable when run as ``python bench/...``)
from harness import (
    REPO,
    bench_main,
    latency_summary,
    machine_info,
    report_preamble,
    rss_bytes,
)

import magnetar
from magnetar.aio import Client, Consumer, Producer
from magnetar.testing import LocalCluster

HOUR_MS = 3_600_000
SUBSCRIPTION = "work"


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """``--data-root``, ``--out`` and ``--tag``, as both delayed-delivery benchmarks take them."""
    parser.add_argument("--data-root", type=Path, default=REPO / "bench")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tag", default="")


def results_start(script: str, argv: list[str], root: Path) -> dict[str, Any]:
    """The keys that open the results of both delayed-delivery benchmarks (``bench/<script>``)."""
    return {
        "command": " ".join([".venv/bin/python", f"bench/{script}", *argv]),
        "date": dt.date.today().isoformat(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(root),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delayed", type=int, default=100_000, help="delayed messages pending")
    parser.add_argument("--messages", type=int, default=20_000, help="normal messages measured")
    parser.add_argument("--window", type=int, default=1_000, help="unconfirmed sends at most")
    parser.add_argument("--quick", action="store_true", help="10,000 delayed, 5,000 measured")
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.delayed, args.messages = min(args.delayed, 10_000), min(args.messages, 5_000)
        args.tag = args.tag or "quick"
    for name in ("delayed", "messages", "window"):
        if getattr(args, name) < (0 if name == "delayed" else 1):
            parser.error(f"--{name} must be >= {0 if name == 'delayed' else 1}")
    return args


def subscription_stats(service_url: str, topic: str) -> dict[str, Any]:
    with magnetar.AdminClient(service_url) as admin:
        subs = admin.topic_stats(topic)["partitions"][0]["subscriptions"]
    sub = next(s for s in subs if s["subscription"] == SUBSCRIPTION)
    keys = ("delayed_entries", "ack_hole_ranges", "ack_ranges_over_limit", "blocked")
    return {k: sub.get(k) for k in keys}


async def send_delayed(producer: Producer, count: int, window: int) -> None:
    """``count`` messages due in an hour, each an entry of its own followed by an immediate
    one (to be acknowledged: a hole each), at most ``window`` unconfirmed."""
    due_ms = int(time.time() * 1000) + HOUR_MS
    pending: list[asyncio.Future[Any]] = []
    for _ in range(count):
        pending.append(producer.send_async(b"later", deliver_at_ms=due_ms))
        pending.append(producer.send_async(b"fill"))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


async def take_fills(consumer: Consumer, count: int) -> None:
    """Receive and acknowledge the ``count`` immediate messages; a delayed one is an error."""
    for _ in range(count):
        message = await consumer.receive(timeout_millis=120_000)
        if message.data() != b"fill":
            raise RuntimeError(f"a delayed message came early: {message.data()!r}")
        await consumer.acknowledge(message)


async def one_run(cluster: LocalCluster, delayed: int, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"delayed-bench-{delayed}-{int(time.time())}"
    url = cluster.service_url
    broker_pid = cluster.brokers[0].pid
    run: dict[str, Any] = {"delayed": delayed, "messages": args.messages}
    async with Client(url) as client:
        consumer = await client.subscribe(
            topic, SUBSCRIPTION, "shared", initial_position="earliest", receiver_queue_size=1000
        )
        producer = await client.create_producer(topic)
        started = time.monotonic()
        if delayed:
            await send_delayed(producer, delayed, args.window)
            await take_fills(consumer, delayed)
        run["fill_s"] = time.monotonic() - started
        await asyncio.sleep(2)  # the last acks reach the broker
        run["after_fill"] = await asyncio.to_thread(subscription_stats, url, topic)
        run["after_fill"]["broker_rss_bytes"] = rss_bytes(broker_pid) or 0

        latencies: list[float] = []

        async def receive_all() -> float:
            for _ in range(args.messages):
                message = await consumer.receive(timeout_millis=120_000)
                sent = float(message.data()[:24].decode())
                latencies.append(time.time() - sent)
                await consumer.acknowledge(message)
            return time.monotonic()

        receiver = asyncio.create_task(receive_all())
        first_send = time.monotonic()
        pending = []
        for _ in range(args.messages):
            stamp = f"{time.time():<24.6f}".encode()
            pending.append(producer.send_async(stamp + b"x" * 76))
            if len(pending) >= args.window:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        last_receive = await receiver
        run["throughput_msg_s"] = args.messages / (last_receive - first_send)
        run["latency"] = latency_summary(latencies)
        run["after_measure"] = await asyncio.to_thread(subscription_stats, url, topic)
        run["after_measure"]["broker_rss_bytes"] = rss_bytes(broker_pid) or 0
        await producer.close()
        await consumer.close()
    return run


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    results: dict[str, Any] = {**results_start("delayed_bench.py", argv, root), "runs": []}
    async with LocalCluster(root / "cluster", bookies=3, brokers=1) as cluster:
        await cluster.wait_brokers_registered()
        # a first topic pays for connections, lookups and ledger creation: not recorded
        await one_run(cluster, 0, argparse.Namespace(**{**vars(args), "messages": 1000}))
        for delayed in (0, args.delayed):
            run = await one_run(cluster, delayed, args)
            print(
                f"{delayed:>7} delayed: {run['throughput_msg_s']:,.0f} msg/s,"
                f" p50 {run['latency']['p50_us'] / 1000:.1f} ms,"
                f" p99 {run['latency']['p99_us'] / 1000:.1f} ms, {run['after_measure']}",
                file=sys.stderr,
            )
            results["runs"].append(run)
    results["elapsed_s"] = time.time() - started
    return results


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Delayed delivery: normal messages with many delayed ones pending",
        "",
        *report_preamble(results),
        "",
        "One shared subscription per topic; the delayed messages are due in an hour and each is",
        "an entry of its own followed by an acknowledged immediate one (one hole each). Then the",
        "measured messages (100 B, `send_async`, `receive` + `acknowledge` per message).",
        "",
        (
            "| delayed pending | fill s | msg/s | p50 ms | p99 ms | max ms | delayed_entries"
            " | ack_hole_ranges | blocked | broker RSS MiB |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for run in results["runs"]:
        after = run["after_measure"]
        lat = run["latency"]
        lines.append(
            f"| {run['delayed']:,} | {run['fill_s']:.1f} | {run['throughput_msg_s']:,.0f}"
            f" | {lat['p50_us'] / 1000:.1f} | {lat['p99_us'] / 1000:.1f}"
            f" | {lat['max_us'] / 1000:.1f} | {after['delayed_entries']:,}"
            f" | {after['ack_hole_ranges']:,} | {after['blocked']}"
            f" | {after['broker_rss_bytes'] / 2**20:,.0f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # figures only, no verdicts: 0 whenever the run ends
    return bench_main(
        "delayed", argv, parse_args, bench, render_markdown, ok=lambda _results, _args: True
    )


if __name__ == "__main__":
    raise SystemExit(main())
