"""Self-clocking batching, before and after, in one run on one cluster (issue 27).

End-to-end latency (send -> receive, one clock) and the cluster's CPU per message at a low rate
(the idle path: each message alone) and at 2,000 msg/s, 100 B, 1 partition, with the producer's
``batching_self_clocking`` off (the behaviour before it: every batch waits out the 1 ms
``batching_max_publish_delay_ms`` unless it fills) and on (the default), and on with a 5 ms
delay, through ``magnetar perf end-to-end --batch-self-clocking off|on --batch-delay-ms D``
(``--variants``). The cluster is the suite's (its own etcd, 3 bookies, 1 broker, E3/Qw2/Qa2,
every group commit ``fdatasync``ed); each run is measured as the suite measures a workload
(``suite.run_phase``), on a fresh topic. The variants take turns within each round, in reverse
order every other round, so that a change in the machine's load falls on all of them;
``/proc/loadavg`` is recorded before and after every run.

Run from the repository root::

    .venv/bin/python bench/batching_bench.py            # 2 rounds, 100 and 2,000 msg/s, 15 s
    .venv/bin/python bench/batching_bench.py --quick    # 1 round, 3 s each

It writes ``bench/results/batching-<date>[-<tag>].json`` and ``.md``. The machine is shared:
compare the variants within a run only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from broker_bench import BOOKIES, BROKER_ARGS, QUORUM
from harness import (
    add_output_options,
    machine_info,
    opt,
    quiet_logs,
    report_preamble,
    results_head,
    run_and_write,
    settle_disk,
)
from suite import PERF_TIMEOUT_MARGIN_S, cost_cell, perf_base, run_phase

from magnetar.testing import LocalCluster

DEFAULT_VARIANTS = ("off:1", "on:1", "on:5")
"""``--batch-self-clocking`` and ``--batch-delay-ms`` of perf, as ``MODE:DELAY_MS``: off with
the default 1 ms delay is the behaviour before self-clocking, on with 1 ms the default after; on
with a longer delay lets batches grow to a round trip under load while idle sends still go at
once."""


def parse_variant(text: str) -> tuple[str, float]:
    """``on:1`` -> ("on", 1.0); a clear error for anything else."""
    mode, _, delay = text.partition(":")
    try:
        delay_ms = float(delay)
    except ValueError:
        delay_ms = -1.0
    if mode not in ("on", "off") or delay_ms < 0:
        raise argparse.ArgumentTypeError(
            f"a variant is MODE:DELAY_MS with MODE on or off and DELAY_MS >= 0, got {text!r}"
        )
    return mode, delay_ms


def rate_name(rate: int) -> str:
    return f"{rate:,} msg/s" if rate else "max rate"


def variant_name(variant: tuple[str, float]) -> str:
    return f"{variant[0]}, {variant[1]:g} ms"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine (``/proc/loadavg``)."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def run_order(variants: list[tuple[str, float]], round_: int) -> list[tuple[str, float]]:
    """The variants in the order given in odd rounds, reversed in even ones."""
    return list(variants) if round_ % 2 else list(reversed(variants))


def perf_args(
    topic: str, service_url: str, rate: int, variant: tuple[str, float], args: argparse.Namespace
) -> list[str]:
    return [
        *perf_base("end-to-end", topic, service_url),
        "--partitions",
        "1",
        "--size",
        str(args.size),
        "--rate",
        str(rate),
        "--duration",
        f"{args.duration_s:g}",
        "--warmup-s",
        f"{args.warmup_s:g}",
        "--batch-self-clocking",
        variant[0],
        "--batch-delay-ms",
        f"{variant[1]:g}",
    ]


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    results: dict[str, Any] = {
        **results_head("batching", "batching_bench.py", argv, started, args),
        "parameters": {
            "bookies": BOOKIES,
            "brokers": 1,
            "quorum": "E{}/Qw{}/Qa{}".format(*QUORUM),
            "broker_args": BROKER_ARGS,
            "rates": args.rates,
            "size": args.size,
            "partitions": 1,
            "rounds": args.rounds,
            "variants": [variant_name(v) for v in args.variants],
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "perf": "end-to-end, one producer and one consumer in one process, send_async and"
            " receive + acknowledge per message; batching defaults (1,000 messages / 128 KiB /"
            " --batch-delay-ms) with --batch-self-clocking off or on",
        },
        "machine": machine_info(root),
        "runs": [],
    }
    loop_tid = threading.get_native_id()
    cluster = LocalCluster(root / "cluster", bookies=BOOKIES, brokers=1, broker_args=BROKER_ARGS)
    try:
        await cluster.start()
        for round_ in range(1, args.rounds + 1):
            for rate in args.rates:
                for index, variant in enumerate(run_order(args.variants, round_)):
                    topic = f"batching-{rate}-{round_}-{index}"
                    await settle_disk()
                    before = load_average()
                    r = await run_phase(
                        cluster,
                        "end-to-end",
                        perf_args(topic, cluster.service_url, rate, variant, args),
                        timeout_s=args.warmup_s + args.duration_s + PERF_TIMEOUT_MARGIN_S,
                        loop_tid=loop_tid,
                    )
                    r.pop("progress", None)  # the per-second series: not needed here
                    r.update(
                        {
                            "round": round_,
                            "rate": rate,
                            "self_clocking": variant[0],
                            "delay_ms": variant[1],
                            "variant": variant_name(variant),
                            "loadavg_before": before,
                            "loadavg_after": load_average(),
                        }
                    )
                    results["runs"].append(r)
                    print(run_line(r), flush=True)
    finally:
        await cluster.aclose()
    results["elapsed_s"] = time.time() - started
    results["summary"] = summarise(results["runs"], [variant_name(v) for v in args.variants])
    return results


def run_line(r: dict[str, Any]) -> str:
    head = f"round {r['round']} {rate_name(r['rate'])} self-clocking {r['variant']}"
    summary = r.get("summary")
    if summary is None:
        return f"{head}: FAILED {r.get('error')}"
    latency = summary["latency_ms"]
    return (
        f"{head}: {summary['msg_per_s']:,.0f} msg/s, p50 {opt(latency['p50'])} p99"
        f" {opt(latency['p99'])} ms; CPU ms per message broker / bookies / both"
        f" {cost_cell(r.get('cost'))}; load {r['loadavg_before']} -> {r['loadavg_after']}"
        + ("" if r["ok"] else f"; FAILED {r.get('error')}")
    )


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    """Per rate and variant: the median over rounds of each figure (and every round's value)."""
    out: list[dict[str, Any]] = []
    for rate in dict.fromkeys(r["rate"] for r in runs):
        for variant in variants:
            ok = [
                r
                for r in runs
                if r["rate"] == rate and r["variant"] == variant and r.get("summary")
            ]
            figures: dict[str, list[float]] = {}
            for r in ok:
                for name, value in run_figures(r).items():
                    if value is not None:
                        figures.setdefault(name, []).append(value)
            out.append(
                {
                    "rate": rate,
                    "variant": variant,
                    "rounds": len(ok),
                    "median": {k: statistics.median(v) for k, v in figures.items()},
                    "each": figures,
                }
            )
    return out


def run_figures(r: dict[str, Any]) -> dict[str, float | None]:
    """The figures of one run that the report compares."""
    summary = r["summary"]
    latency = summary["latency_ms"]
    publish = summary.get("publish_latency_ms") or {}
    cost = r.get("cost") or {}
    per_message = cost.get("ms_per_message") or {}
    cpu = r.get("cpu") or {}
    return {
        "msg_per_s": summary["msg_per_s"],
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "p99_9_ms": latency["p99_9"],
        "publish_p50_ms": publish.get("p50"),
        "messages_per_entry": cost.get("messages_per_entry"),
        "entries_per_s": cpu.get("stored_entries_per_s"),
        "broker_ms_per_message": per_message.get("broker"),
        "bookies_ms_per_message": per_message.get("bookies"),
        "broker_bookies_ms_per_message": per_message.get("broker_bookies"),
        "perf_pct": cpu.get("perf_pct"),
        "machine_busy_pct": cpu.get("machine_busy_pct"),
    }


_COLUMNS: dict[str, tuple[str, str]] = {
    # figure of run_figures: (column title, format)
    "p50_ms": ("e2e p50 ms", ".2f"),
    "p99_ms": ("e2e p99 ms", ".2f"),
    "p99_9_ms": ("p99.9 ms", ".2f"),
    "publish_p50_ms": ("send -> receipt p50 ms", ".2f"),
    "msg_per_s": ("msg/s", ",.0f"),
    "messages_per_entry": ("messages per entry", ".2f"),
    "broker_ms_per_message": ("broker CPU ms/msg", "#.3g"),
    "bookies_ms_per_message": ("bookies CPU ms/msg", "#.3g"),
    "broker_bookies_ms_per_message": ("broker + bookies ms/msg", "#.3g"),
    "perf_pct": ("perf CPU %", ".0f"),
    "machine_busy_pct": ("machine busy %", ".0f"),
}


def render_markdown(results: dict[str, Any]) -> str:
    tag = f" ({results['tag']})" if results.get("tag") else ""
    p = results["parameters"]
    lines = [
        f"# Self-clocking batching, before and after, {results['date']}{tag}",
        "",
        *report_preamble(results, raw_limits=False),
        "",
        (
            f"One cluster: {p['bookies']} bookies, {p['brokers']} broker, {p['quorum']}. Each run:"
            f" `magnetar perf end-to-end` on a fresh 1-partition topic, {p['size']} B messages,"
            f" {p['warmup_s']:g} s warm-up then {p['duration_s']:g} s measured;"
            " `--batch-self-clocking off` (before: every batch waits out the delay unless it"
            " fills) and `on` (after) with the `--batch-delay-ms` named (the variant"
            f" `MODE, DELAY`: {', '.join(p['variants'])}), in turn, the order reversed every"
            f" other round, {p['rounds']} round(s). CPU per message is the"
            " broker's and the bookies' CPU over the measured window divided by the messages"
            " delivered in it (`bench/suite.py`'s `cpu_cost`)."
        ),
        "",
        "## Medians over the rounds",
        "",
        "| rate | self-clocking, delay | rounds | "
        + " | ".join(title for title, _ in _COLUMNS.values())
        + " |",
        "|---|---|---|" + "---|" * len(_COLUMNS),
    ]
    for s in results["summary"]:
        cells = [opt(s["median"].get(key), fmt) for key, (_, fmt) in _COLUMNS.items()]
        lines.append(
            f"| {rate_name(s['rate'])} | {s['variant']} | {s['rounds']} | {' | '.join(cells)} |"
        )
    lines += [
        "",
        "## Every run",
        "",
        (
            "| round | rate | self-clocking, delay | e2e p50 / p99 / p99.9 / max ms | send ->"
            " receipt p50 ms | msg/s | entries/s | CPU ms per message: broker / bookies /"
            " both (per entry) | CPU % perf / broker / bookies / machine | load average"
            " before -> after |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        summary = r.get("summary")
        if summary is None:
            lines.append(
                f"| {r['round']} | {rate_name(r['rate'])} | {r['variant']} | FAILED:"
                f" {r.get('error')} |" + " |" * 6
            )
            continue
        latency = summary["latency_ms"]
        publish = summary.get("publish_latency_ms") or {}
        cpu = r.get("cpu") or {}
        cpu_cell = " / ".join(
            opt(cpu.get(k), ".0f")
            for k in ("perf_pct", "broker_pct", "bookies_pct", "machine_busy_pct")
        )
        lines.append(
            f"| {r['round']} | {rate_name(r['rate'])} | {r['variant']}"
            f" | {opt(latency['p50'])} / {opt(latency['p99'])} / {opt(latency['p99_9'])} /"
            f" {opt(latency['max'])} | {opt(publish.get('p50'))}"
            f" | {summary['msg_per_s']:,.0f} | {opt(cpu.get('stored_entries_per_s'), ',.0f')}"
            f" | {cost_cell(r.get('cost'))} | {cpu_cell}"
            f" | {r['loadavg_before']} -> {r['loadavg_after']} |"
        )
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/batching_bench.py",
        description=(
            "End-to-end latency and broker/bookie CPU per message with the producer's"
            " self-clocking batching off (before) and on (after), alternated on one cluster."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--rates",
        type=int,
        nargs="+",
        default=[100, 2_000],
        help="msg/s of each run; 0: as fast as possible",
    )
    add("--size", type=int, default=100, help="message size in bytes (at least 8)")
    add("--rounds", type=int, default=2, help="runs of every variant per rate")
    add(
        "--variants",
        type=parse_variant,
        nargs="+",
        default=[parse_variant(v) for v in DEFAULT_VARIANTS],
        metavar="MODE:DELAY_MS",
        help="self-clocking on/off and the batching delay of each run, in turn (default: "
        + " ".join(DEFAULT_VARIANTS)
        + ")",
    )
    add("--duration-s", type=float, default=15.0, help="measured seconds per run")
    add("--warmup-s", type=float, default=3.0, help="seconds per run before measuring")
    add("--quick", action="store_true", help="1 round of 3 s runs (tag: quick)")
    add("--tag", help="name the results batching-<date>-<TAG>.*")
    add_output_options(
        add, data_root_help="a temporary directory is made here for the cluster's data"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration_s, args.warmup_s = 1, 3.0, 1.0
        args.tag = args.tag or "quick"
    if min(args.rates) < 0 or args.size < 8 or args.rounds < 1 or args.duration_s <= 0:
        parser.error("--rates >= 0, --size >= 8, --rounds >= 1 and --duration-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """0 if every run finished, 1 if one failed (its error is in the results), 130 if
    interrupted."""
    given = sys.argv[1:] if argv is None else argv
    quiet_logs()
    results = run_and_write("batching", parse_args(given), given, bench, render_markdown)
    return 130 if results is None else int(not all(r["ok"] for r in results["runs"]))


if __name__ == "__main__":
    raise SystemExit(main())
