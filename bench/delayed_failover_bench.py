"""Delayed delivery across a move of the partition: how long do normal messages wait when a
new owner takes over a subscription holding many delayed messages aside?

Run from the repository root::

    .venv/bin/python bench/delayed_failover_bench.py              # 100,000 delayed, ~6 minutes
    .venv/bin/python bench/delayed_failover_bench.py --quick      # 10,000 delayed

It runs the same scenario twice, each on a ``magnetar.testing.LocalCluster`` of its own (its own
etcd, 3 bookies, 2 brokers): once with the persisted delay index (the default settings) and once
without it (``--dispatch-delayed-index-bucket-entries 0``, the behaviour before the index: a new
owner reads every delayed entry again). Per cluster:

1. **fill**: ``--delayed`` messages due in an hour, each followed by an immediate one that the
   shared subscription's consumer receives and acknowledges (one entry and one hole per delayed
   message); then it waits until the subscription holds them all aside and the index's buckets
   are written (``dispatch_delayed_index_seal_ms`` and a margin);
2. **unload**: a graceful move (``unload_topic``); a probe message is sent right after it, and
   the figure is the time from the unload call to the probe's arrival at the consumer;
3. **kill**: the owning broker is SIGKILLed, a probe is sent at once, and the figure is the time
   from the kill to the probe's arrival (this includes the crash failover itself).

After each move it also records how long until the new owner holds all the delayed messages aside
again, and how many it loaded from the index (``delayed_entries_loaded``). No delayed message may
arrive (they are due in an hour): the run fails if one does. Results go to
``bench/results/delayed-failover-<date>[-quick].json`` and ``.md``. The machine is shared and
noisy: compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

# harness.py, delayed_bench.py and failover_bench.py sit next to this script
from delayed_bench import SUBSCRIPTION, add_run_options, results_start, send_delayed, take_fills
from failover_bench import owner_of
from harness import (
    bench_main,
    report_preamble,
)

from magnetar.aio import AdminClient, Client
from magnetar.common.errors import MagnetarError
from magnetar.testing import LocalCluster
from metadata import open_store

SEAL_WAIT_S = 8.0
"""Longer than dispatch_delayed_index_seal_ms (5 s): every bucket is written before a move."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delayed", type=int, default=100_000, help="delayed messages pending")
    parser.add_argument("--window", type=int, default=1_000, help="unconfirmed sends at most")
    parser.add_argument("--quick", action="store_true", help="10,000 delayed")
    parser.add_argument(
        "--held-timeout",
        type=float,
        default=300.0,
        help="seconds to wait, after a move, for every delayed message to be held aside again",
    )
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.delayed = min(args.delayed, 10_000)
        args.tag = args.tag or "quick"
    if args.delayed < 1 or args.window < 1:
        parser.error("--delayed and --window must be >= 1")
    return args


async def sub_stats(admin: AdminClient, topic: str) -> dict[str, Any]:
    stats = await admin.topic_stats(topic)
    return dict(stats["partitions"][0]["subscriptions"][0])


async def wait_held(
    admin: AdminClient, topic: str, delayed: int, since: float, timeout_s: float
) -> tuple[float | None, int | None]:
    """Seconds from ``since`` until the subscription holds ``delayed`` entries aside, and how
    many it held at the last answer of its stats (``None``: no answer came); ``None`` seconds
    when it did not within ``timeout_s`` (without the index a new owner may never hold them all
    again: reading them back is bounded by the ack-hole budget)."""
    held: int | None = None
    while True:
        try:
            held = int((await sub_stats(admin, topic))["delayed_entries"])
            if held >= delayed:
                return time.monotonic() - since, held
        except Exception:  # noqa: BLE001 - the partition is moving: ask again
            pass
        if time.monotonic() - since > timeout_s:
            return None, held
        await asyncio.sleep(0.1)


async def probe(client: Client, consumer: Any, topic: str, label: str, since: float) -> float:
    """Send one message now (trying again while the partition is not served yet); seconds from
    ``since`` until the consumer has it."""
    deadline = time.monotonic() + 300
    while True:
        try:
            producer = await client.create_producer(topic)
            try:
                await producer.send(label.encode())
            finally:
                await producer.close()
            break
        except MagnetarError:
            if time.monotonic() > deadline:
                raise
    while True:
        message = await consumer.receive(timeout_millis=300_000)
        await consumer.acknowledge(message)
        data = message.data()
        if data == label.encode():
            return time.monotonic() - since
        if data.startswith(b"later"):
            raise RuntimeError(f"a delayed message arrived an hour early: {data!r}")
        # an immediate message whose ack did not reach the old owner: delivered again


async def one_cluster(root: Path, args: argparse.Namespace, *, index: bool) -> dict[str, Any]:
    broker_args = [] if index else ["--dispatch-delayed-index-bucket-entries", "0"]
    run: dict[str, Any] = {"index": index, "delayed": args.delayed}
    name = "index" if index else "no-index"
    async with LocalCluster(
        root / f"cluster-{name}", bookies=3, brokers=2, broker_args=broker_args
    ) as cluster:
        await cluster.wait_brokers_registered()
        store = await open_store(cluster.metadata_url)
        topic = f"delayed-failover-{name}-{int(time.time())}"
        async with Client(cluster.service_url) as client, AdminClient(cluster.service_url) as admin:
            await admin.create_topic(topic)
            consumer = await client.subscribe(
                topic, SUBSCRIPTION, "shared", initial_position="earliest", receiver_queue_size=1000
            )
            producer = await client.create_producer(topic)
            started = time.monotonic()
            await send_delayed(producer, args.delayed, args.window)
            await producer.close()
            await take_fills(consumer, args.delayed)
            fill_s, held = await wait_held(admin, topic, args.delayed, started, 3_600)
            if fill_s is None:
                raise RuntimeError(f"held {held} of {args.delayed} delayed aside after the fill")
            run["fill_s"] = time.monotonic() - started
            await asyncio.sleep(SEAL_WAIT_S)
            run["before"] = await sub_stats(admin, topic)

            moved_at = time.monotonic()
            await admin.unload_topic(topic)
            run["unload_probe_s"] = await probe(client, consumer, topic, "after-unload", moved_at)
            run["unload_held_s"], run["unload_held"] = await wait_held(
                admin, topic, args.delayed, moved_at, args.held_timeout
            )
            run["after_unload"] = await sub_stats(admin, topic)
            await asyncio.sleep(SEAL_WAIT_S)

            owner = await owner_of(store, f"public/default/{topic}-partition-0")
            if owner is None:
                owner = await owner_of(store, f"public/default/{topic}")
            victim = next(b for b in cluster.brokers if b.broker_id == owner)
            killed_at = time.monotonic()
            await victim.kill()
            run["kill_probe_s"] = await probe(client, consumer, topic, "after-kill", killed_at)
            run["kill_held_s"], run["kill_held"] = await wait_held(
                admin, topic, args.delayed, killed_at, args.held_timeout
            )
            run["after_kill"] = await sub_stats(admin, topic)
            await consumer.close()
        await store.close()
    print(
        f"{name}: unload probe {run['unload_probe_s']:.2f} s, held again"
        f" {held_cell(run, 'unload')} s (loaded {run['after_unload']['delayed_entries_loaded']});"
        f" kill probe {run['kill_probe_s']:.2f} s, held again {held_cell(run, 'kill')} s (loaded"
        f" {run['after_kill']['delayed_entries_loaded']})",
        file=sys.stderr,
    )
    return run


def held_cell(run: dict[str, Any], prefix: str) -> str:
    """The *held again* figure, or how many were held when the wait ran out."""
    seconds = run[f"{prefix}_held_s"]
    if seconds is None:
        held = run[f"{prefix}_held"]
        if held is None:
            return "not known (its stats did not answer before the timeout)"
        return f"not all (held {held:,} at the timeout)"
    return f"{seconds:.2f}"


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    results: dict[str, Any] = {
        **results_start("delayed_failover_bench.py", argv, root),
        "runs": [await one_cluster(root, args, index=i) for i in (True, False)],
    }
    results["elapsed_s"] = time.time() - started
    return results


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Delayed delivery across a move: normal messages after a new owner takes over",
        "",
        *report_preamble(results),
        "",
        "One shared subscription holding the delayed messages (due in an hour) aside, each an",
        "entry of its own with an acknowledged immediate one after it. *probe*: from the",
        "unload call (or the SIGKILL of the owner) to a message sent right after it arriving;",
        "*held again*: until the new owner holds every delayed message aside; *loaded*: how many",
        "of them it took from the delay index instead of reading them again.",
        "",
        "| delay index | delayed | fill s | move | probe s | held again s | loaded |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for run in results["runs"]:
        for move, key in (("unload", "after_unload"), ("SIGKILL", "after_kill")):
            prefix = "unload" if move == "unload" else "kill"
            lines.append(
                f"| {'on' if run['index'] else 'off'} | {run['delayed']:,} | {run['fill_s']:.0f}"
                f" | {move} | {run[f'{prefix}_probe_s']:.2f} | {held_cell(run, prefix)}"
                f" | {run[key]['delayed_entries_loaded']:,} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    # figures only, no verdicts: 0 whenever the run ends
    return bench_main(
        "delayed-failover",
        argv,
        parse_args,
        bench,
        render_markdown,
        ok=lambda _results, _args: True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
