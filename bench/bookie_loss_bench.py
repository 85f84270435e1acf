"""Bookie-loss benchmark: the producer's longest stall when a bookie of the topic's ensemble is
SIGKILLed (issue 24, item 2), with exactly E bookies and with one spare.

Run from the repository root::

    .venv/bin/python bench/bookie_loss_bench.py                 # 3 runs per case, a few minutes
    .venv/bin/python bench/bookie_loss_bench.py --runs 1        # smoke test
    .venv/bin/python bench/bookie_loss_bench.py --baseline      # also once with under-striped
                                                                # ledgers off (the old way)

Each run starts etcd, the bookies and one broker as real processes (``magnetar.testing``),
creates a one-partition topic with E3/Qw2/Qa2 ledgers, and sends with one synchronous producer
(one message in flight, ``send_timeout_ms`` 60 s so that nothing times out). After 2 s it
SIGKILLs a bookie of the partition's current ledger and keeps sending for 6 s. The *stall* is the
longest time between two consecutive acknowledgements from 1 s before the kill to the end of
the window (or from the last acknowledgement to the end, if none came); it is what the producer
sees as unavailability. Failed sends are counted (target: none).

Cases: ``exactly-E`` (3 bookies: no replacement exists; the ledger is closed at its confirmed
end and writing goes on in a ledger on the two bookies left) and ``one-spare`` (4 bookies: the
ensemble changes to the spare). Target (issue 24): exactly-E stall <= 2 s, one-spare <= 0.1 s.

It writes ``bench/results/bookie-loss-<date>.json`` (every run) and ``.md`` (the table). The
machine is shared and noisy: the load average is recorded with each run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc.aio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from magnetar.aio import Client  # noqa: E402
from magnetar.common.errors import MagnetarError  # noqa: E402
from magnetar.testing import LocalCluster  # noqa: E402
from proto.admin.v1 import admin_pb2 as admin  # noqa: E402
from proto.admin.v1 import admin_pb2_grpc  # noqa: E402

TOPIC = "public/default/loss"
PARTITION = f"{TOPIC}-partition-0"
BEFORE_KILL_S = 2.0
AFTER_KILL_S = 6.0


async def one_run(case: str, bookies: int, *, under_striped: bool) -> dict[str, Any]:
    args = ["--load-shedding-enabled", "false"]
    if not under_striped:
        args += ["--ledger-under-striped-ledgers", "false"]
    with tempfile.TemporaryDirectory(prefix="bookie-loss-") as root:
        async with LocalCluster(Path(root), bookies=bookies, brokers=1, broker_args=args) as c:
            broker = c.brokers[0]
            channel = grpc.aio.insecure_channel(broker.address)
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            await stub.CreateTopic(admin.CreateTopicRequest(topic="loss", partitions=1))
            acks: list[float] = []
            failed: list[str] = []
            stop = asyncio.Event()
            async with Client(c.service_url, operation_timeout_s=60) as client:
                producer = await client.create_producer(PARTITION, send_timeout_ms=60_000)

                async def send() -> None:
                    n = 0
                    while not stop.is_set():
                        try:
                            await producer.send(f"m{n}".encode())
                        except MagnetarError as e:
                            failed.append(f"{type(e).__name__}: {e.message}")
                        else:
                            acks.append(time.monotonic())
                        n += 1

                started = time.monotonic()
                sender = asyncio.create_task(send())
                await asyncio.sleep(BEFORE_KILL_S)
                stats = await stub.GetTopicStats(
                    admin.GetTopicStatsRequest(topic=TOPIC, internal=True)
                )
                current = stats.partitions[0].ledgers[-1].ledger_id
                ledger = await stub.GetLedger(admin.GetLedgerRequest(ledger_id=current))
                ensemble = list(ledger.ensembles[-1].bookie_ids)
                victim = next(b for b in c.bookies if b.bookie_id == ensemble[0])
                killed_at = time.monotonic()
                await victim.kill()
                await asyncio.sleep(AFTER_KILL_S)
                window_end = time.monotonic()
                stop.set()
                await sender
                after = await stub.GetTopicStats(
                    admin.GetTopicStatsRequest(topic=TOPIC, internal=True)
                )
                ledgers = after.partitions[0].ledgers
                newer = [lg.ledger_id for lg in ledgers if lg.ledger_id > current]
                widths = []
                for ledger_id in newer:
                    summary = (
                        await stub.GetLedger(admin.GetLedgerRequest(ledger_id=ledger_id))
                    ).summary
                    widths.append(f"E{summary.ensemble_size}(of {summary.intended_ensemble_size})")
                await producer.close()
            await channel.close()
    # no acknowledgement until the window's end counts as a stall to the end
    window = [t for t in acks if killed_at - 1.0 <= t <= window_end] + [window_end]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    first_after = next((t for t in acks if t > killed_at), None)
    # the same measure with no fault: the longest gap before the stall window (the first
    # 0.5 s of sending, connections warming up, left out)
    quiet = [t for t in acks if started + 0.5 <= t < killed_at - 1.0]
    quiet_gaps = [b - a for a, b in itertools.pairwise(quiet)]
    return {
        "case": case,
        "bookies": bookies,
        "under_striped_ledgers": under_striped,
        "victim": victim.bookie_id,
        "stall_ms": round(max(gaps) * 1000, 1) if gaps else None,
        "kill_to_next_ack_ms": round((first_after - killed_at) * 1000, 1) if first_after else None,
        "quiet_max_gap_ms": round(max(quiet_gaps) * 1000, 1) if quiet_gaps else None,
        "acked": len(acks),
        "acked_after_kill": sum(1 for t in acks if t > killed_at),
        "failed": len(failed),
        "failures": failed[:3],
        "later_ledgers": widths,
        "load_average": os.getloadavg()[0],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    stalls = [r["stall_ms"] for r in runs if r["stall_ms"] is not None]
    return {
        "runs": len(runs),
        "stall_ms_median": round(statistics.median(stalls), 1) if stalls else None,
        "stall_ms_max": max(stalls) if stalls else None,
        "quiet_max_gap_ms_max": max(
            (r["quiet_max_gap_ms"] for r in runs if r.get("quiet_max_gap_ms") is not None),
            default=None,
        ),
        "failed_sends": sum(r["failed"] for r in runs),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"# Bookie-loss benchmark, {results['date']}",
        "",
        "`.venv/bin/python bench/bookie_loss_bench.py"
        + (" --baseline" if results["baseline"] else "")
        + f" --runs {results['runs_per_case']}`",
        "",
        (
            f"Machine: {results['cpu_count']} cores, shared with other test runs (load average"
            " per run below). One broker, one partition, E3/Qw2/Qa2, one synchronous producer;"
            " a bookie of the current ledger's ensemble SIGKILLed 2 s in. *Stall*: the longest"
            " time between two consecutive acknowledgements from 1 s before the kill until 6 s"
            " after it. *Longest gap without a fault*: the same measure over the 0.5 s before"
            " that window (the noise floor of this machine at that moment)."
        ),
        "",
        (
            "| case | bookies | under-striped ledgers | runs | stall median (ms) |"
            " stall max (ms) | longest gap without a fault (ms) | failed sends | target |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    targets = {"exactly-E": "<= 2000 ms, none failed", "one-spare": "<= 100 ms (keep)"}
    for key, summary in results["summary"].items():
        case, bookies, on = key.split("/")
        lines.append(
            f"| {case} | {bookies} | {on} | {summary['runs']} | {summary['stall_ms_median']} |"
            f" {summary['stall_ms_max']} | {summary['quiet_max_gap_ms_max']} |"
            f" {summary['failed_sends']} |"
            f" {targets.get(case, '-') if on == 'on' else 'the old way'} |"
        )
    lines += [
        "",
        "## Runs",
        "",
        (
            "| case | bookies | under-striped | victim | stall (ms) | kill to next ack (ms) |"
            " longest gap without a fault (ms) | acked after kill | failed |"
            " ledgers after the kill | load |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        lines.append(
            f"| {r['case']} | {r['bookies']} | {'on' if r['under_striped_ledgers'] else 'off'} |"
            f" {r['victim']} | {r['stall_ms']} | {r['kill_to_next_ack_ms']} |"
            f" {r.get('quiet_max_gap_ms')} | {r['acked_after_kill']} | {r['failed']} |"
            f" {' '.join(r['later_ledgers'])} |"
            f" {r['load_average']:.1f} |"
        )
    lines += [
        "",
        (
            "`E2(of 3)` is an under-striped ledger: made on the two bookies left, with Qw 2 and"
            " Qa 2 as before. With one spare the ledger keeps its width through an ensemble"
            " change (no new ledger, unless a roll by entries falls in the window). With"
            " under-striped ledgers off and exactly E bookies (the behaviour before this"
            " change), the writer waits for the killed bookie, which does not come back: the"
            " stall is the whole window after the kill, and the send in flight failed when its"
            " 60 s send timeout ended, with `last problem: None` (after 30 s the writer gives"
            " up, and recovering its ledger needs a replacement bookie too); the baseline row"
            " appears only with `--baseline`. *Kill to next ack* is short whatever the case:"
            " entries whose write set avoids the killed bookie still complete. Compare each"
            " run's stall with its noise floor and load average: on a loaded machine both grow."
        ),
        "",
    ]
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    parser.add_argument(
        "--baseline", action="store_true", help="also one run with under-striped ledgers off"
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--date", default=dt.date.today().isoformat())
    args = parser.parse_args()
    plan = [("exactly-E", 3, True), ("one-spare", 4, True)]
    runs: list[dict[str, Any]] = []
    for case, bookies, on in plan:
        for i in range(args.runs):
            run = await one_run(case, bookies, under_striped=on)
            print(f"{case} run {i + 1}: {json.dumps(run)}", flush=True)
            runs.append(run)
    if args.baseline:
        run = await one_run("exactly-E", 3, under_striped=False)
        print(f"exactly-E baseline: {json.dumps(run)}", flush=True)
        runs.append(run)
    summary: dict[str, Any] = {}
    for r in runs:
        key = f"{r['case']}/{r['bookies']}/{'on' if r['under_striped_ledgers'] else 'off'}"
        summary.setdefault(key, []).append(r)
    results = {
        "date": args.date,
        "cpu_count": os.cpu_count(),
        "runs_per_case": args.runs,
        "baseline": args.baseline,
        "summary": {k: summarize(v) for k, v in summary.items()},
        "runs": runs,
    }
    await asyncio.to_thread(write, Path(args.out), args.date, results)


def write(out: Path, date: str, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bookie-loss-{date}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"bookie-loss-{date}.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    asyncio.run(main())
