"""The servers' event loop: asyncio against uvloop (``--event-loop uvloop``, the speedups extra),
on the suite's cluster and workloads, in one run.

Each round starts the suite's cluster twice, once per loop, the order alternating between rounds
so that the machine's drift falls on both alike: its own etcd, 3 bookie processes and 1 broker
process (E3/Qw2/Qa2, every group commit fdatasynced), every bookie and the broker started with
``--event-loop asyncio`` or ``--event-loop uvloop``. On each, the suite's workloads (its
``run_workload``, driving the real ``magnetar perf``, which itself stays on asyncio):

- ``rate2000-1p-100B``: end to end at 2,000 msg/s of 100 B, 1 partition: the latency target's
  workload, and the broker plus bookie CPU per message;
- ``rate50000-1p-100B``: end to end at 50,000 msg/s;
- ``max-1p-100B``: produce at the highest rate the cluster takes.

Run from the repository root::

    .venv/bin/python bench/event_loop_bench.py            # 3 rounds, 10 s per workload
    .venv/bin/python bench/event_loop_bench.py --quick    # 1 round, 4 s per workload

It writes ``bench/results/event-loop-<date>[-quick].json`` and ``.md``: per loop and workload
the median (and range over rounds) of the rate, the end-to-end p50 and p99 and the CPU
milliseconds per message of the broker and the bookies, and uvloop's figure over asyncio's.
The machine is shared and noisy: compare within one run only.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path
from typing import Any

# harness.py, broker_bench.py and suite.py sit next to this script
from broker_bench import BOOKIES, BROKER_ARGS
from harness import (
    add_output_options,
    add_quick_and_tag,
    bench_main,
    bench_parser,
    machine_info,
    report_head,
    report_text,
    results_head,
    spread,
    spread_cell,
)
from suite import WORKLOADS, Workload, run_workload

from magnetar.testing import LocalCluster

LOOPS = ("asyncio", "uvloop")
KEYS = ("rate2000-1p-100B", "rate50000-1p-100B", "max-1p-100B")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser, add = bench_parser("event_loop_bench.py", __doc__.split("\n\n")[0])
    add("--rounds", type=int, default=3, help="rounds, each running every loop once")
    add("--duration-s", type=float, default=10.0, help="measured seconds per workload")
    add("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each workload")
    add_quick_and_tag(add, "event-loop", quick="1 round, 4 s per workload")
    add_output_options(add, data_root_help="where the clusters' temporary data goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration_s = 1, min(args.duration_s, 4.0)
    if args.rounds < 1 or args.duration_s <= 0:
        parser.error("--rounds must be >= 1 and --duration-s > 0")
    return args


def round_order(round_index: int) -> tuple[str, ...]:
    """The loops in the order round ``round_index`` runs them: alternating which goes first."""
    return LOOPS if round_index % 2 == 0 else LOOPS[::-1]


def workloads() -> list[Workload]:
    by_key = {w.key: w for w in WORKLOADS}
    return [by_key[k] for k in KEYS]


def figures(result: dict[str, Any]) -> dict[str, float | None]:
    """The figures of one workload's result that the report compares."""
    if not result.get("ok"):
        return {"msg_per_s": None, "p50_ms": None, "p99_ms": None, "cpu_ms_per_msg": None}
    per_message = (result.get("cost") or {}).get("ms_per_message") or {}
    return {
        "msg_per_s": result["msg_per_s"],
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "cpu_ms_per_msg": per_message.get("broker_bookies"),
    }


async def one_cluster(root: Path, loop: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the suite's cluster on ``loop``, run every workload once, stop it."""
    flag = ["--event-loop", loop]
    cluster = LocalCluster(
        root, bookies=BOOKIES, brokers=1, broker_args=[*BROKER_ARGS, *flag], bookie_args=flag
    )
    results = []
    try:
        await cluster.start()
        for workload in workloads():
            result = await run_workload(
                cluster,
                workload,
                duration_s=args.duration_s,
                backlog_messages=0,
                loop_tid=threading.get_native_id(),
                warmup_s=args.warmup_s,
            )
            results.append({"loop": loop, **result, "figures": figures(result)})
    finally:
        await cluster.aclose()
        shutil.rmtree(root, ignore_errors=True)
    return results


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per workload and loop, the :func:`spread` of each figure over the rounds."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key in KEYS:
        out[key] = {}
        for loop in LOOPS:
            mine = [r["figures"] for r in runs if r["key"] == key and r["loop"] == loop]
            out[key][loop] = {f: spread([m[f] for m in mine]) for f in FIGURES}
    return out


FIGURES = ("msg_per_s", "p50_ms", "p99_ms", "cpu_ms_per_msg")


def ratio(summary: dict[str, dict[str, Any]], figure: str) -> float | None:
    """uvloop's median over asyncio's, for one workload's ``figure``."""
    a = summary["asyncio"][figure]["median"]
    u = summary["uvloop"][figure]["median"]
    if a is None or u is None or a == 0:
        return None
    return float(u) / float(a)


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    results: dict[str, Any] = {
        **results_head("event-loop", "event_loop_bench.py", argv, started, args),
        "parameters": {
            "rounds": args.rounds,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "bookies": BOOKIES,
            "broker_args": BROKER_ARGS,
            "workloads": list(KEYS),
        },
        "machine": machine_info(root),
        "runs": [],
    }
    for r in range(args.rounds):
        for loop in round_order(r):
            print(f"round {r + 1}/{args.rounds}: {loop}", flush=True)
            for run in await one_cluster(root / f"r{r}-{loop}", loop, args):
                results["runs"].append({"round": r, **run})
    results["summary"] = summarize(results["runs"])
    results["elapsed_s"] = time.time() - started
    return results


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_markdown(results: dict[str, Any]) -> str:
    p = results["parameters"]
    lines = [
        *report_head(results, "Event loop: asyncio against uvloop", raw_limits=False),
        "",
        (
            f"{p['rounds']} round(s); in each, the suite's cluster (etcd, {p['bookies']} bookies, 1"
            " broker, E3/Qw2/Qa2) started once per loop (the order alternating), every bookie and"
            f" the broker on that loop; {p['duration_s']:g} s per workload after"
            f" {p['warmup_s']:g} s of warm-up; `magnetar perf` on asyncio in both. Median (min-max)"
            " over the rounds; *CPU*: milliseconds of the broker's and the bookies' CPU per"
            " message; *uvloop / asyncio*: the ratio of the medians."
        ),
        "",
        "| workload | loop | msg/s | p50 ms | p99 ms | CPU ms/msg |",
        "|---|---|---:|---:|---:|---:|",
    ]
    summary = results["summary"]
    for key in KEYS:
        for loop in LOOPS:
            s = summary[key][loop]
            lines.append(
                f"| {key} | {loop} | {spread_cell(s['msg_per_s'])}"
                f" | {spread_cell(s['p50_ms'], '.2f')} | {spread_cell(s['p99_ms'], '.2f')}"
                f" | {spread_cell(s['cpu_ms_per_msg'], '.3f')} |"
            )
        lines.append(
            f"| {key} | uvloop / asyncio | {_ratio_cell(ratio(summary[key], 'msg_per_s'))}"
            f" | {_ratio_cell(ratio(summary[key], 'p50_ms'))}"
            f" | {_ratio_cell(ratio(summary[key], 'p99_ms'))}"
            f" | {_ratio_cell(ratio(summary[key], 'cpu_ms_per_msg'))} |"
        )
    failed = [r for r in results["runs"] if not r.get("ok")]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [
            f"- round {r['round'] + 1}, {r['loop']}, {r['key']}: {r['error']}" for r in failed
        ]
    return report_text(lines, "Every run's figures, parameters and machine details")


def main(argv: list[str] | None = None) -> int:
    return bench_main(
        "event-loop",
        argv,
        parse_args,
        bench,
        render_markdown,
        ok=lambda results, _args: all(r.get("ok") for r in results["runs"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
