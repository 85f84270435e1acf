"""Benchmark suite: OpenMessaging-Benchmark-style workloads against a real multi-process cluster
(its own etcd, 3 bookie processes, 1 broker process, ledgers E3/Qw2/Qa2, every group commit
``fdatasync``ed), each driven by the real ``magnetar perf`` command, next to the raw limits of
this machine (append+fdatasync rate, group-commit bandwidth, loopback gRPC round trip) measured
in the same run, at its start and at its end. The Pulsar port is measured beside three gRPC
workloads: ``bench/pulsar_perf.py`` drives the real ``pulsar-client`` (``pulsar-produce``,
``pulsar-e2e-2000``, ``pulsar-e2e-50000``), and its max-rate throughput is judged against 80% of
the gRPC port's (issue 26).

Run from the repository root::

    .venv/bin/python bench/suite.py                 # full run, about ten minutes
    .venv/bin/python bench/suite.py --quick         # smoke test, under two minutes
    .venv/bin/python bench/suite.py --grow-gb 20    # and the opt-in stored-data growth part
    .venv/bin/python bench/suite.py --quick --only pulsar-port   # the Pulsar port and its pairs

It writes ``bench/results/suite-<date>.json`` (every figure), ``suite-<date>.md`` (the summary,
with the targets' verdicts), ``suite-<date>-throughput.png`` and ``suite-<date>-latency.png``
(and ``suite-<date>-grow.png`` with ``--grow-gb``); ``--quick`` writes ``suite-<date>-quick.*``
so a smoke test never replaces a full run. See bench/README.md ("Suite") for what each figure
means. The machine is shared and noisy: compare figures within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# harness.py and broker_bench.py sit next to this script, so they are importable when it is run
# as ``python bench/suite.py``. The cluster's settings and its CPU accounting are broker_bench's,
# so that both benchmarks measure the cluster the same way.
from broker_bench import BOOKIES, BROKER_ARGS, QUORUM, limits, usage_delta
from harness import (
    KIB,
    MIB,
    RAW_4K_OPS,
    RAW_4K_P50,
    RAW_4K_P99,
    RAW_4M,
    RAW_RTT_P50,
    RAW_RTT_P99,
    ClusterSample,
    PerfOutput,
    add_output_options,
    add_quick_and_tag,
    add_raw_s_option,
    all_ok,
    bench_main,
    bench_parser,
    busiest_cell,
    load_average,
    log_tail,
    machine_info,
    opt,
    peak_rss_bytes,
    print_checks,
    proc_cpu_seconds,
    python_path,
    raw_limits_at,
    raw_limits_table,
    raw_pair,
    report_head,
    report_text,
    reset_peak_rss,
    results_head,
    rss_bytes,
    sample_cluster,
    settle_disk,
    size_name,
    spawn_piped,
    stop_process,
    summary_errors,
    thread_cpu_seconds,
)

from magnetar.testing import LocalCluster

GB = 1_000_000_000
SUITE_RAW_ROWS = (
    RAW_4K_OPS,
    RAW_4K_P50,
    RAW_4K_P99,
    (
        "1 MiB append + fdatasync (group-commit bandwidth)",
        "append_fdatasync_1m",
        "mb_per_s",
        "MB/s",
    ),
    RAW_4M,
    RAW_RTT_P50,
    RAW_RTT_P99,
)

# --- targets (reported with PASS / MISS, never asserted) ------------------------------------------

TARGET_PRODUCE_MSG_PER_S = 500_000
"""One producer, 100 B messages, E3/Qw2/Qa2 with fdatasync on every bookie."""
TARGET_BACKLOG_MSG_PER_S = 800_000
"""One consumer draining a backlog of 100 B messages (the target names 10 million)."""
TARGET_BACKLOG_MESSAGES = 10_000_000
LATENCY_TARGETS_MS: dict[int, dict[str, float]] = {
    2_000: {"p50": 3.0, "p99": 10.0},
    50_000: {"p99": 20.0},
}
"""End-to-end latency (send -> receive) at a fixed rate: percentile -> at most this many ms."""
RATE_REACHED_FRACTION = 0.95
"""A fixed-rate workload must deliver this share of its rate for its latency to count."""
DEFAULT_RSS_BOUND_MIB = 512
GROW_MIN_RATIO = 0.90
"""Throughput while the last 10% of the data was written over while the first 10% was: "does
not fall" means within 10%."""
GROW_EDGE_FRACTION = 0.10

# Disk space the grow part needs per payload byte: Qw copies, plus the broker's entry envelope,
# the batch framing of small messages, the bookies' index and etcd (a first 0.3 GB run of 1 KiB
# messages used 2.4 bytes of the file system per payload byte). GROW_FLOOR_BYTES stay free
# whatever happens: below it the producer is stopped early.
GROW_DISK_BYTES_PER_PAYLOAD_BYTE = QUORUM[1] * 1.4
GROW_FLOOR_BYTES = 5 * GB

PERF_TIMEOUT_MARGIN_S = 120.0
"""A perf process gets its expected duration plus this long before it is interrupted."""
BACKLOG_TIMEOUT_MIN_RATE = 10_000
"""A backlog phase is given as long as this many messages per second would take (plus margin)."""
RSS_SAMPLE_INTERVAL_S = 0.2
BACKLOG_SUBSCRIPTION = "suite-drain"
"""Created on the backlog's topic before it is produced: without a subscription (and with the
default retention of 0) the broker deletes every rolled-over ledger as consumed, and the drain
would find only the last one (a first full run drained 4.84 of 10 million messages)."""
CONSUMER_QUEUE = 10_000
"""The drain's ``--receiver-queue-size``. The client's default (1,000, as Pulsar's) is one
1,000-message entry in flight: the consumer then waits a round trip for every entry."""


# --- workloads ------------------------------------------------------------------------------------

MAX_RATE, FIXED_RATE, BACKLOG = "max-rate", "fixed-rate", "backlog"
MAGNETAR, PULSAR = "magnetar", "pulsar"
"""The protocols a workload's client speaks: Magnetar's gRPC port (``magnetar perf``), or the
Pulsar port (``bench/pulsar_perf.py``, the real ``pulsar-client``)."""
PULSAR_PERF = "bench/pulsar_perf.py"
"""The Pulsar port's load generator, relative to the repository (perf processes run there)."""
PULSAR_TARGET_RATIO = 0.80
"""Issue 26: the Pulsar port's max-rate throughput at least this share of the gRPC port's."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One topic of ``partitions`` partitions, messages of ``message_bytes``.

    - max-rate: ``magnetar perf produce --rate 0`` for the workload duration;
    - fixed-rate: ``magnetar perf end-to-end --rate RATE`` for the workload duration;
    - backlog: ``magnetar perf produce --rate 0 --num-messages N``, then ``magnetar perf consume
      --subscription suite-drain --num-messages N``: one consumer draining the backlog through
      the subscription created (at the earliest message) before the produce.

    perf makes one client call per message by default (``send_async``; ``receive`` then
    ``acknowledge``); a ``batch_api`` workload runs it with ``--batch-api`` (``send_many_async``
    runs; ``batch_receive``, one acknowledgement per batch), its key ending in ``-batch``.

    A ``pulsar`` workload runs ``bench/pulsar_perf.py produce|end-to-end`` instead: the real
    ``pulsar-client`` against the broker's Pulsar port (``send_async`` per message; a message
    listener acknowledging each one), keyed ``pulsar-produce`` and ``pulsar-e2e-RATE``; its
    ``counterpart`` is the gRPC workload it is compared with.
    """

    kind: str
    partitions: int
    message_bytes: int
    rate: int = 0
    batch_api: bool = False
    protocol: str = MAGNETAR

    @property
    def key(self) -> str:
        if self.protocol == PULSAR:
            return "pulsar-produce" if self.kind == MAX_RATE else f"pulsar-e2e-{self.rate}"
        head = {MAX_RATE: "max", BACKLOG: "backlog"}.get(self.kind, f"rate{self.rate}")
        size = size_name(self.message_bytes).replace(" ", "")
        return f"{head}-{self.partitions}p-{size}{'-batch' if self.batch_api else ''}"

    @property
    def counterpart(self) -> str | None:
        """The key of the gRPC workload a Pulsar-port workload is compared with (None for a
        gRPC workload): the same kind, rate, partitions and size, per-message calls."""
        if self.protocol != PULSAR:
            return None
        return Workload(self.kind, self.partitions, self.message_bytes, self.rate).key

    @property
    def api(self) -> str:
        """The client calls perf makes, as its summaries name them (phases joined by ``, then``)."""
        if self.protocol == PULSAR:
            send = "pulsar-client send_async"
            return send if self.kind == MAX_RATE else f"{send}; message_listener + acknowledge"
        send = "send_many_async" if self.batch_api else "send_async"
        receive = (
            "batch_receive + acknowledge_cumulative" if self.batch_api else "receive + acknowledge"
        )
        if self.kind == MAX_RATE:
            return send
        if self.kind == FIXED_RATE:
            return f"{send}; {receive}"
        return f"{send}, then {receive}"

    @property
    def topic(self) -> str:
        return f"suite-{self.key}"

    @property
    def name(self) -> str:
        what = {MAX_RATE: "max rate", BACKLOG: "backlog drain"}.get(
            self.kind, f"{self.rate:,} msg/s"
        )
        partitions = f"{self.partitions} partition{'s' * (self.partitions > 1)}"
        calls = ", batch API" if self.batch_api else ""
        port = ", Pulsar port (pulsar-client)" if self.protocol == PULSAR else ""
        return f"{what}, {partitions}, {size_name(self.message_bytes)}{calls}{port}"


PARTITIONS = (1, 16)
MESSAGE_SIZES = (100, 1 * KIB)
FIXED_RATES = (2_000, 50_000)
PULSAR_WORKLOADS: tuple[Workload, ...] = (
    Workload(MAX_RATE, 1, 100, protocol=PULSAR),
    *(Workload(FIXED_RATE, 1, 100, r, protocol=PULSAR) for r in FIXED_RATES),
)
"""Issue 26: the Pulsar port at max rate and at 2,000 and 50,000 msg/s, 100 B, 1 partition."""


def beside_counterparts(
    workloads: Sequence[Workload], extra: Sequence[Workload]
) -> tuple[Workload, ...]:
    """``workloads`` with each of ``extra`` right after its counterpart (at the end if it has
    none there), so that the two run one after the other and read side by side."""
    out: list[Workload] = []
    placed: set[str] = set()
    for w in workloads:
        out.append(w)
        for e in extra:
            if e.counterpart == w.key:
                out.append(e)
                placed.add(e.key)
    out += [e for e in extra if e.key not in placed]
    return tuple(out)


WORKLOADS: tuple[Workload, ...] = beside_counterparts(
    (
        # the per-message calls (perf's default) and the batch calls side by side
        *(
            Workload(MAX_RATE, p, s, batch_api=batch)
            for s in MESSAGE_SIZES
            for p in PARTITIONS
            for batch in (False, True)
        ),
        *(
            Workload(FIXED_RATE, p, s, r)
            for r in FIXED_RATES
            for s in MESSAGE_SIZES
            for p in PARTITIONS
        ),
        *(
            Workload(BACKLOG, p, 100, batch_api=batch)
            for p in PARTITIONS
            for batch in (False, True)
        ),
    ),
    PULSAR_WORKLOADS,
)
PULSAR_GROUP_KEY = "pulsar-port"
"""``--only pulsar-port``: the Pulsar-port workloads and their gRPC counterparts."""
GROW_KEY = "grow"


def perf_base(mode: str, topic: str, service_url: str) -> list[str]:
    """The start of a ``magnetar perf`` command line (interpreter left out)."""
    return [
        "-m",
        "magnetar.cli",
        "perf",
        mode,
        topic,
        "--service-url",
        service_url,
        "--json",
        "--json-progress",
    ]


def perf_phases(
    workload: Workload,
    service_url: str,
    *,
    duration_s: float,
    backlog_messages: int,
    warmup_s: float = 0.0,
    pulsar_url: str | None = None,
) -> list[tuple[str, list[str], float]]:
    """(phase, perf arguments, timeout in seconds) of a workload, in order. A timed phase runs
    ``warmup_s`` first, left out of its figures (``perf --warmup-s``). A Pulsar-port workload
    runs ``bench/pulsar_perf.py`` against ``pulsar_url``, with perf's output options."""
    size = ["--size", str(workload.message_bytes)]
    if workload.batch_api:
        size.append("--batch-api")
    topic = ["--partitions", str(workload.partitions)]
    timed = ["--duration", f"{duration_s:g}"]
    if warmup_s > 0:
        timed += ["--warmup-s", f"{warmup_s:g}"]
    timeout_s = warmup_s + duration_s + PERF_TIMEOUT_MARGIN_S
    if workload.protocol == PULSAR:
        if pulsar_url is None:
            raise ValueError(f"{workload.key} needs the broker's Pulsar URL")
        mode = "produce" if workload.kind == MAX_RATE else "end-to-end"
        args = [PULSAR_PERF, mode, workload.topic, "--service-url", pulsar_url, "--json"]
        rate = ["--rate", str(workload.rate)]
        return [(mode, [*args, "--json-progress", *size, *rate, *timed], timeout_s)]
    if workload.kind == MAX_RATE:
        args = perf_base("produce", workload.topic, service_url)
        return [("produce", [*args, *topic, *size, "--rate", "0", *timed], timeout_s)]
    if workload.kind == FIXED_RATE:
        args = perf_base("end-to-end", workload.topic, service_url)
        rate = ["--rate", str(workload.rate)]
        return [("end-to-end", [*args, *topic, *size, *rate, *timed], timeout_s)]
    count = ["--num-messages", str(backlog_messages)]
    timeout_s = backlog_messages / BACKLOG_TIMEOUT_MIN_RATE + PERF_TIMEOUT_MARGIN_S
    produce = perf_base("produce", workload.topic, service_url)
    consume = perf_base("consume", workload.topic, service_url)
    return [
        ("produce", [*produce, *topic, *size, "--rate", "0", *count], timeout_s),
        (
            "consume",
            [
                *consume,
                "--subscription",
                BACKLOG_SUBSCRIPTION,
                "--receiver-queue-size",
                str(CONSUMER_QUEUE),
                *(["--batch-api"] if workload.batch_api else []),
                *count,
            ],
            timeout_s,
        ),
    ]


# --- what perf prints -----------------------------------------------------------------------------

# --- figures from the per-second series -----------------------------------------------------------


def grow_ratio(
    series: Sequence[dict[str, Any]], edge: float = GROW_EDGE_FRACTION
) -> dict[str, Any]:
    """Throughput while the first ``edge`` of the data was written against while the last was.

    ``series`` is perf's per-second progress (``msg_per_s``, ``mb_per_s``, one entry a second).
    A second belongs to the first part if the data written before it is under ``edge`` of the
    total, to the last part if the data written up to its end is over ``1 - edge``; throughput
    of a part is its MB over its seconds. The ratio is last over first (1.0: no change).
    """
    total = sum(s["mb_per_s"] for s in series)
    if not series or total <= 0:
        return {"first_mb_per_s": None, "last_mb_per_s": None, "ratio": None, "seconds": 0}
    first: list[float] = []
    last: list[float] = []
    written = 0.0
    for s in series:
        if written < edge * total:
            first.append(s["mb_per_s"])
        written += s["mb_per_s"]
        if written > (1 - edge) * total:
            last.append(s["mb_per_s"])
    first_rate = sum(first) / len(first)
    last_rate = sum(last) / len(last)
    return {
        "edge_fraction": edge,
        "first_seconds": len(first),
        "last_seconds": len(last),
        "first_mb_per_s": first_rate,
        "last_mb_per_s": last_rate,
        "ratio": last_rate / first_rate if first_rate else None,
        "seconds": len(series),
        "total_mb": total,
    }


def _number(value: float) -> str:
    """1,000,000 or 0.5: as a person would write the number on the command line."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,}"


def grow_disk_needed(grow_gb: float) -> int:
    """Free bytes the grow part needs before it starts (its data, plus the floor kept free)."""
    return int(grow_gb * GB * GROW_DISK_BYTES_PER_PAYLOAD_BYTE) + GROW_FLOOR_BYTES


# --- verdicts -------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def checks(
    workloads: Sequence[dict[str, Any]],
    *,
    rss_bound_mib: float,
    grow: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The targets of the issue, each with PASS, MISS or NOT RUN and the figures behind it.

    Throughput targets take the better of the 1- and 16-partition workloads (one producer or
    one consumer either way); latency targets must hold in every workload of that rate (both
    sizes, both partition counts), and only count where the rate was delivered; the RSS bound
    must hold in every max-rate and backlog workload. Those targets are Magnetar's own client's
    (the gRPC port's), except the RSS bound, which holds for the Pulsar port's max rate too; the
    last check is the Pulsar port's throughput against the gRPC port's, within this run.
    """
    own = [w for w in workloads if w.get("protocol", MAGNETAR) == MAGNETAR]
    return [
        _produce_check(own),
        _backlog_check(own),
        *(_latency_check(own, rate, limits_ms) for rate, limits_ms in LATENCY_TARGETS_MS.items()),
        _rss_check(workloads, rss_bound_mib),
        _grow_check(grow),
        pulsar_port_check(workloads),
    ]


def pulsar_pairs(workloads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each Pulsar-port workload of the run beside its gRPC counterpart of the same run: both
    rates and their ratio (Pulsar over gRPC), end-to-end (or publish, at max rate) p50 and p99,
    and the broker's and bookies' CPU per message. A side that did not run or failed is None."""
    by_key = {w["key"]: w for w in workloads}
    pairs = []
    for w in workloads:
        if w.get("protocol") != PULSAR:
            continue
        grpc = by_key.get(w.get("counterpart") or "")
        sides = {"pulsar": w if w["ok"] else None, "grpc": grpc if grpc and grpc["ok"] else None}
        pair: dict[str, Any] = {
            "pulsar": w["key"],
            "grpc": w.get("counterpart"),
            "grpc_ran": grpc is not None,
            "kind": w["kind"],
            "rate": w["rate"],
        }
        for side, r in sides.items():
            pair[side + "_figures"] = None if r is None else _pair_figures(r)
        pulsar, grpc_figures = pair["pulsar_figures"], pair["grpc_figures"]
        ratio = None
        if pulsar is not None and grpc_figures is not None and grpc_figures["msg_per_s"] > 0:
            ratio = pulsar["msg_per_s"] / grpc_figures["msg_per_s"]
        pair["throughput_ratio"] = ratio
        pairs.append(pair)
    return pairs


def _pair_figures(r: dict[str, Any]) -> dict[str, Any]:
    """What a side of a Pulsar / gRPC pair is read by."""
    cost = r.get("cost") or {}
    per_message = cost.get("ms_per_message") or {}
    cpu = (r["phases"][-1].get("cpu") if r.get("phases") else None) or {}
    return {
        "msg_per_s": r["msg_per_s"],
        # the load process (its client) and the broker, % of one core: which one was busy
        "client_cpu_pct": cpu.get("perf_pct"),
        "broker_cpu_pct": cpu.get("broker_pct"),
        "latency_ms": {p: r["latency_ms"].get(p) for p in ("p50", "p99")},
        "api": r.get("api"),
        "cpu_ms_per_message": per_message.get("broker_bookies"),
        "broker_cpu_ms_per_message": per_message.get("broker"),
        "messages_per_entry": cost.get("messages_per_entry"),
    }


def pulsar_port_check(workloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 26: the Pulsar port's max-rate throughput (``pulsar-produce``: pulsar-client,
    ``send_async`` per message) at least 80% of the gRPC port's (``max-1p-100B``: Magnetar's
    client, ``send_async`` per message), both 100 B to 1 partition, in the same run."""
    check: dict[str, Any] = {
        "name": (
            "Pulsar port at max rate (pulsar-client) >= "
            f"{PULSAR_TARGET_RATIO:.0%} of the gRPC port's (Magnetar's client), send_async per"
            " message, 100 B, 1 partition, same run"
        ),
        "target_ratio": PULSAR_TARGET_RATIO,
    }
    pair = next((p for p in pulsar_pairs(workloads) if p["kind"] == MAX_RATE), None)
    if pair is None:
        check.update({"verdict": "NOT RUN", "why": "no pulsar-produce workload was selected"})
        return check
    # the workloads it speaks of, for the summary table's target column
    check["pair"] = [pair["pulsar"], pair["grpc"]]
    if not pair["grpc_ran"]:
        check.update(
            {
                "verdict": "NOT RUN",
                "why": f"{pair['grpc']} did not run in this run (the ratio is taken within one"
                " run only)",
            }
        )
    elif pair["throughput_ratio"] is None:
        failed = [pair[side] for side in ("pulsar", "grpc") if pair[side + "_figures"] is None]
        why = f"{' and '.join(failed)} failed" if failed else f"{pair['grpc']} delivered nothing"
        check.update({"verdict": "MISS", "why": why})
    else:
        ratio = pair["throughput_ratio"]
        check.update(
            {
                "pulsar_msg_per_s": pair["pulsar_figures"]["msg_per_s"],
                "grpc_msg_per_s": pair["grpc_figures"]["msg_per_s"],
                "measured_ratio": ratio,
                "verdict": _verdict(ratio >= PULSAR_TARGET_RATIO),
            }
        )
    return check


def _best(
    workloads: Sequence[dict[str, Any]], kind: str, size: int
) -> tuple[dict[str, Any] | None, bool]:
    """The fastest workload of a kind and size that completed, and whether any was selected."""
    selected = [w for w in workloads if w["kind"] == kind and w["message_bytes"] == size]
    good = [w for w in selected if w["ok"]]
    return max(good, key=lambda w: w["msg_per_s"], default=None), bool(selected)


def _per_api(workloads: Sequence[dict[str, Any]], kind: str, size: int) -> dict[str, Any]:
    """The best workload of each set of client calls: per message and batch side by side."""
    found: dict[str, dict[str, Any]] = {}
    for w in workloads:
        if w["kind"] != kind or w["message_bytes"] != size or not w["ok"]:
            continue
        api = w.get("api") or "?"
        if api not in found or w["msg_per_s"] > found[api]["msg_per_s"]:
            found[api] = {"workload": w["key"], "msg_per_s": w["msg_per_s"]}
    return found


def _throughput_check(
    workloads: Sequence[dict[str, Any]],
    kind: str,
    *,
    name: str,
    target: int,
    what: str,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A msg/s target on the best 100 B workload of a kind (``what`` names them), and that
    workload; ``extra`` are more of its figures to note next to the measured one."""
    best, selected = _best(workloads, kind, 100)
    check: dict[str, Any] = {"name": name, "target_msg_per_s": target}
    if not selected:
        check.update({"verdict": "NOT RUN", "why": f"no {what} workload was selected"})
    elif best is None:
        check.update({"verdict": "MISS", "why": f"no {what} workload completed"})
    else:
        check.update(
            {
                "workload": best["key"],
                "api": best.get("api"),
                "measured_msg_per_s": best["msg_per_s"],
                **{key: best[key] for key in extra},
                "ratio": best["msg_per_s"] / target,
                "verdict": _verdict(best["msg_per_s"] >= target),
                "per_api": _per_api(workloads, kind, 100),
            }
        )
    return check, best


def _produce_check(workloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    check, _ = _throughput_check(
        workloads,
        MAX_RATE,
        name=f"one producer, 100 B messages: >= {TARGET_PRODUCE_MSG_PER_S:,} msg/s",
        target=TARGET_PRODUCE_MSG_PER_S,
        what="max-rate 100 B",
    )
    return check


def _backlog_check(workloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    check, consumer = _throughput_check(
        workloads,
        BACKLOG,
        name=(
            f"one consumer draining a {TARGET_BACKLOG_MESSAGES:,}-message backlog (100 B):"
            f" >= {TARGET_BACKLOG_MSG_PER_S:,} msg/s"
        ),
        target=TARGET_BACKLOG_MSG_PER_S,
        what="backlog",
        extra=("backlog_messages",),
    )
    if consumer is not None and consumer["backlog_messages"] < TARGET_BACKLOG_MESSAGES:
        check["note"] = (
            f"backlog of {consumer['backlog_messages']:,} messages, not the"
            f" {TARGET_BACKLOG_MESSAGES:,} the target names"
        )
    return check


def _latency_check(
    workloads: Sequence[dict[str, Any]], rate: int, limits_ms: dict[str, float]
) -> dict[str, Any]:
    wanted = " and ".join(f"{p} <= {v:g} ms" for p, v in limits_ms.items())
    check: dict[str, Any] = {
        "name": f"end-to-end latency at {rate:,} msg/s: {wanted}",
        "limits_ms": limits_ms,
    }
    selected = [w for w in workloads if w["kind"] == FIXED_RATE and w["rate"] == rate]
    if not selected:
        check.update({"verdict": "NOT RUN", "why": f"no {rate:,} msg/s workload was selected"})
        return check
    per = [_latency_entry(w, rate, limits_ms) for w in selected]
    check["workloads"] = per
    check["verdict"] = _verdict(all(e["verdict"] == "PASS" for e in per))
    return check


def _latency_entry(w: dict[str, Any], rate: int, limits_ms: dict[str, float]) -> dict[str, Any]:
    """One fixed-rate workload against the latency limits of its rate."""
    entry: dict[str, Any] = {"workload": w["key"]}
    if not w["ok"]:
        entry.update({"verdict": "MISS", "why": "failed"})
        return entry
    latency = w["latency_ms"]
    reached = w["msg_per_s"] >= RATE_REACHED_FRACTION * rate
    within = all(latency.get(p) is not None and latency[p] <= v for p, v in limits_ms.items())
    entry.update(
        {
            "measured_ms": {p: latency.get(p) for p in limits_ms},
            "msg_per_s": w["msg_per_s"],
            "rate_reached": reached,
            "verdict": _verdict(within and reached),
        }
    )
    if not reached:
        entry["why"] = f"delivered {w['msg_per_s']:,.0f} of {rate:,} msg/s"
    return entry


def _rss_check(workloads: Sequence[dict[str, Any]], rss_bound_mib: float) -> dict[str, Any]:
    check: dict[str, Any] = {
        "name": f"broker RSS under max-rate load stays under {rss_bound_mib:g} MiB",
        "bound_mib": rss_bound_mib,
    }
    loaded = [w for w in workloads if w["kind"] in (MAX_RATE, BACKLOG)]
    measured = [w for w in loaded if w.get("broker_rss_max_mib") is not None]
    if not loaded:
        check.update({"verdict": "NOT RUN", "why": "no max-rate or backlog workload was selected"})
    elif not measured:
        check.update({"verdict": "MISS", "why": "the broker's RSS was not measured"})
    else:
        top = max(measured, key=lambda w: w["broker_rss_max_mib"])
        check.update(
            {
                "workload": top["key"],
                "measured_max_mib": top["broker_rss_max_mib"],
                "per_workload_mib": {w["key"]: w["broker_rss_max_mib"] for w in measured},
                "verdict": _verdict(
                    top["broker_rss_max_mib"] < rss_bound_mib and len(measured) == len(loaded)
                ),
            }
        )
    return check


def _grow_check(grow: dict[str, Any] | None) -> dict[str, Any]:
    check: dict[str, Any] = {
        "name": (
            "throughput does not fall as stored data grows: last 10% / first 10% of the data"
            f" >= {GROW_MIN_RATIO:.2f}"
        ),
        "target_ratio": GROW_MIN_RATIO,
    }
    if grow is None:
        check.update({"verdict": "NOT RUN", "why": "opt-in: --grow-gb N"})
    elif not grow.get("ok") or grow.get("ratio", {}).get("ratio") is None:
        check.update({"verdict": "MISS", "why": grow.get("error", "no throughput figures")})
    else:
        ratio = grow["ratio"]
        check.update(
            {
                "measured_ratio": ratio["ratio"],
                "first_mb_per_s": ratio["first_mb_per_s"],
                "last_mb_per_s": ratio["last_mb_per_s"],
                "stored_gb": grow["payload_gb"],
                "verdict": _verdict(ratio["ratio"] >= GROW_MIN_RATIO),
            }
        )
    return check


# --- measuring the processes ----------------------------------------------------------------------


@dataclass(slots=True)
class Snapshot:
    """The cluster's CPU and counters (``broker_bench.usage``) and the perf process's CPU."""

    cluster: ClusterSample
    perf_cpu: float | None
    perf_threads: dict[str, float]


async def snapshot(cluster: LocalCluster, loop_tid: int, perf_pid: int) -> Snapshot:
    # the perf process first: it may be about to exit
    perf_cpu: float | None = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        perf_cpu = proc_cpu_seconds(perf_pid)
    threads = thread_cpu_seconds(perf_pid)
    return Snapshot(await sample_cluster(cluster, loop_tid), perf_cpu, threads)


def cpu_between(before: Snapshot, after: Snapshot, cores: int) -> dict[str, Any]:
    """CPU of every process over a window, % of one core (``broker_bench.usage_delta``, plus the
    perf process, which the machine's *other* no longer includes)."""
    cpu = usage_delta(before.cluster, after.cluster, cores)
    seconds = cpu["measured_s"]
    perf = None
    if before.perf_cpu is not None and after.perf_cpu is not None:
        perf = 100 * (after.perf_cpu - before.perf_cpu) / seconds
    loop_key = next((k for k in after.perf_threads if k.startswith("main:")), None)
    loop = None
    if loop_key is not None and loop_key in before.perf_threads:
        loop = 100 * (after.perf_threads[loop_key] - before.perf_threads[loop_key]) / seconds
    # the "bench" of broker_bench is this script here: it only watches
    cpu["suite_pct"] = cpu.pop("bench_pct")
    cpu["suite_event_loop_pct"] = cpu.pop("bench_event_loop_pct")
    cpu["perf_pct"] = perf
    cpu["perf_event_loop_pct"] = loop
    cpu["other_pct"] -= perf or 0.0
    seconds_in = cpu["measured_s"]
    counters = cpu["bookie_counters"]
    cpu["stored_entries_per_s"] = cpu["stored_entries"] / seconds_in if seconds_in else 0.0
    cpu["fdatasyncs_per_s"] = counters.get("syncs", 0.0) / seconds_in if seconds_in else 0.0
    cpu["group_commits_per_s"] = counters.get("groups", 0.0) / seconds_in if seconds_in else 0.0
    return cpu


COST_PROCESSES = (("broker", "broker_pct"), ("bookies", "bookies_pct"))
"""The data path's processes whose CPU is counted per message: the broker, all bookies together,
and their sum (``broker_bookies``)."""


def cpu_cost(cpu: dict[str, Any], summary: dict[str, Any] | None, phase: str) -> dict[str, Any]:
    """CPU milliseconds per message of the broker, of the bookies (all of them) and of both,
    over the CPU window, and per stored entry where the window stored entries.

    Messages in the window: perf's rate (its summary's msg_per_s, over the measured run) times
    the window when the window starts at a progress line, else every message perf counted (the
    window then spans the whole process). Entries: the bookies' adds over Qw in the window
    (``stored_entries``); a consume phase stores none, and the entries it reads are not counted
    anywhere, so it has no per-entry figure. {} without a window or a summary.
    """
    if not cpu or summary is None:
        return {}
    seconds = cpu["measured_s"]
    if str(cpu.get("window", "")).startswith("first progress line"):
        messages = summary["msg_per_s"] * seconds
    else:
        messages = float(summary["messages"])
    cpu_ms = {name: 10 * cpu[key] * seconds for name, key in COST_PROCESSES}
    cpu_ms["broker_bookies"] = sum(cpu_ms.values())
    entries = cpu.get("stored_entries") or 0.0
    if phase == "consume" or entries < 1:
        entries = 0.0
    return {
        "messages": messages,
        "entries": entries or None,
        "messages_per_entry": messages / entries if entries else None,
        "cpu_ms": cpu_ms,
        "ms_per_message": ({k: v / messages for k, v in cpu_ms.items()} if messages >= 1 else None),
        "ms_per_entry": {k: v / entries for k, v in cpu_ms.items()} if entries else None,
    }


def what_limits(cpu: dict[str, Any]) -> list[str]:
    """``broker_bench.limits`` with the perf process as the client."""
    return limits({**cpu, "bench_event_loop_pct": cpu.get("perf_event_loop_pct") or 0.0})


# --- one perf process -----------------------------------------------------------------------------


async def run_phase(
    cluster: LocalCluster,
    phase: str,
    perf_args: list[str],
    *,
    timeout_s: float,
    loop_tid: int,
    stop_early: Callable[[], str | None] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run one ``magnetar perf`` process to its end, sampling the broker's RSS all along and the
    CPU of every process at its first progress line after the warm-up and at its summary line.

    ``stop_early`` is asked every sample; a reason from it interrupts perf (SIGINT: it prints
    its figures so far). ``on_progress`` sees each progress line as it comes.
    """
    broker = cluster.brokers[0]
    result: dict[str, Any] = {
        "phase": phase,
        "command": shlex.join([python_path(), *perf_args]),
        "timeout_s": timeout_s,
    }
    hwm_reset = reset_peak_rss(broker.pid)
    started = time.perf_counter()
    process = await spawn_piped(sys.executable, *perf_args)

    async def safe_snapshot() -> Snapshot | None:
        # a server that died shows in the result's errors; the readers must go on reading
        try:
            return await snapshot(cluster, loop_tid, process.pid)
        except Exception as e:  # noqa: BLE001
            out.stderr_tail.append(f"(suite: measuring CPU failed: {e!r})")
            return None

    out = PerfOutput[Snapshot](safe_snapshot, started=started, on_progress=on_progress)
    sampler = _RssSampler(process, broker.pid, stop_early)
    spawned, timed_out, reader_error = await _drive_phase(process, out, sampler, timeout_s)
    peak = peak_rss_bytes(broker.pid) if hwm_reset else None
    result["elapsed_s"] = round(time.perf_counter() - started, 3)
    result["exit_code"] = process.returncode
    result["summary"] = out.summary
    result["progress"] = out.progress
    result["stderr_tail"] = "\n".join(out.stderr_tail)
    if out.stdout_other:
        result["stdout_other"] = "\n".join(out.stdout_other)
    result["broker_rss"] = sampler.figures(peak)
    result.update(_phase_cpu(out.first, spawned, out.last))
    result["cost"] = cpu_cost(result.get("cpu") or {}, out.summary, phase)
    if sampler.stopped_for:
        result["stopped_early"] = sampler.stopped_for
    errors: list[str] = []
    if reader_error:
        errors.append(f"reading perf's output failed: {reader_error}")
    if timed_out:
        errors.append(f"perf did not finish within {timeout_s:g} s (interrupted)")
    errors += summary_errors(out.summary, "perf")
    errors += _exit_errors(cluster, process.returncode, stopped=bool(sampler.stopped_for))
    result["ok"] = not errors
    if errors:
        result["error"] = "; ".join(errors)
    return result


class _RssSampler:
    """The broker's RSS every ``RSS_SAMPLE_INTERVAL_S`` while perf runs; asks ``stop_early``
    at every sample, and interrupts perf (SIGINT) the first time it gives a reason."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        pid: int | None,
        stop_early: Callable[[], str | None] | None,
    ) -> None:
        self.process = process
        self.pid = pid
        self.stop_early = stop_early
        self.samples: list[int] = []
        self.stopped_for = ""

    async def run(self) -> None:
        while self.process.returncode is None:
            value = rss_bytes(self.pid)
            if value is not None:
                self.samples.append(value)
            if self.stop_early is not None and not self.stopped_for:
                reason = self.stop_early()
                if reason:
                    self.stopped_for = reason
                    with contextlib.suppress(ProcessLookupError):
                        self.process.send_signal(signal.SIGINT)
            await asyncio.sleep(RSS_SAMPLE_INTERVAL_S)

    def figures(self, peak: int | None) -> dict[str, Any]:
        samples = self.samples
        return {
            "samples": len(samples),
            "interval_s": RSS_SAMPLE_INTERVAL_S,
            "max_mib": max(samples) / MIB if samples else None,
            "last_mib": samples[-1] / MIB if samples else None,
            # VmHWM, reset when the phase started: catches a peak between two samples
            "peak_mib": peak / MIB if peak is not None else None,
        }


async def _drive_phase(
    process: asyncio.subprocess.Process,
    out: PerfOutput[Snapshot],
    sampler: _RssSampler,
    timeout_s: float,
) -> tuple[Snapshot | None, bool, str]:
    """Read perf's output to its end (SIGINT after ``timeout_s``) while sampling, and reap it:
    the snapshot taken as it started, whether it timed out, and what failed the readers."""
    timed_out = False
    reader_error = ""
    sampling: asyncio.Task[None] | None = None
    readers: asyncio.Future[Any] | None = None
    try:
        spawned = await out.snap()
        sampling = asyncio.create_task(sampler.run(), name="rss-sampler")
        readers = asyncio.ensure_future(out.read(process))
        done, _ = await asyncio.wait({readers}, timeout=timeout_s)
        if not done:
            # SIGINT first: perf prints its figures so far, which the readers still collect
            timed_out = True
            await stop_process(process)
            await asyncio.wait({readers}, timeout=5)
        if readers.done() and not readers.cancelled() and readers.exception() is not None:
            reader_error = repr(readers.exception())
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            await stop_process(process)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        for task in (readers, sampling):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    return spawned, timed_out, reader_error


def _phase_cpu(
    first: Snapshot | None, spawned: Snapshot | None, last: Snapshot | None
) -> dict[str, Any]:
    """The CPU of every process from perf's first progress line after the warm-up (or from its
    start, if none came before its summary) to its summary line, and what limited the run."""
    window_start = first if first is not None else spawned
    if last is None or window_start is None or last.cluster.at <= window_start.cluster.at:
        return {}
    cpu = cpu_between(window_start, last, os.cpu_count() or 1)
    cpu["window"] = (
        "first progress line to summary line"
        if window_start is first
        else "process start to summary line (no progress line before it)"
    )
    return {"cpu": cpu, "limits": what_limits(cpu)}


def _exit_errors(cluster: LocalCluster, exit_code: int | None, *, stopped: bool) -> list[str]:
    """perf's exit status (130 is fine when the suite stopped it) and any server that exited."""
    errors: list[str] = []
    if exit_code != 0 and not (stopped and exit_code == 130):
        errors.append(f"perf exited with {exit_code}")
    broker = cluster.brokers[0]
    if not broker.is_running:
        errors.append(f"the broker exited with {broker.exit_code}")
    dead = [n.bookie_id for n in cluster.bookies if not n.is_running]
    if dead:
        errors.append(f"bookie(s) {dead} exited")
    return errors


def _print_phase(name: str, r: dict[str, Any]) -> None:
    summary = r.get("summary")
    if summary is None:
        print(f"{name} {r['phase']}: FAILED {r.get('error')}", flush=True)
        return
    latency = summary["latency_ms"]
    cpu = r.get("cpu")
    cpu_text = ""
    if cpu is not None:
        perf = cpu["perf_pct"]
        cpu_text = (
            f"; CPU perf {'-' if perf is None else format(perf, '.0f')}%"
            f" broker {cpu['broker_pct']:.0f}% bookies {cpu['bookies_pct']:.0f}%"
            f" machine {cpu['machine_busy_pct']:.0f}%; CPU ms per message broker / bookies /"
            f" both {cost_cell(r.get('cost'))}; limit: {'; '.join(r.get('limits', []))}"
        )
    rss = r["broker_rss"]["max_mib"]
    print(
        f"{name} {r['phase']}: {summary['msg_per_s']:,.0f} msg/s, {summary['mb_per_s']:,.1f} MB/s,"
        f" {summary['messages']:,} messages; latency p50 {opt(latency['p50'])} p99"
        f" {opt(latency['p99'])} ms; broker RSS max"
        f" {'-' if rss is None else format(rss, ',.0f')} MiB{cpu_text}"
        + (f"; FAILED {r['error']}" if not r["ok"] else ""),
        flush=True,
    )


# --- workloads, the grow part, the run -----------------------------------------------------------


def _raise_if_failed(phase: dict[str, Any]) -> None:
    if not phase["ok"]:
        raise RuntimeError(f"{phase['phase']}: {phase['error']}")


async def prepare_backlog(service_url: str, workload: Workload) -> None:
    """Create the backlog's topic and its subscription (at the earliest message), so that what
    is produced is kept until the drain has read it."""
    from magnetar.aio import AdminClient  # noqa: PLC0415 - the benchmark's own client

    async with AdminClient(service_url) as admin:
        await admin.create_topic(workload.topic, workload.partitions)
        await admin.create_subscription(workload.topic, BACKLOG_SUBSCRIPTION, "earliest")


async def prepare_topic(service_url: str, workload: Workload) -> None:
    """Create a Pulsar-port workload's topic with its partitions, as perf does for its own
    (``--partitions``): with 1 partition, Pulsar's client sees a non-partitioned topic."""
    from magnetar.aio import AdminClient  # noqa: PLC0415 - the benchmark's own client

    async with AdminClient(service_url) as admin:
        await admin.create_topic(workload.topic, workload.partitions)


async def run_workload(
    cluster: LocalCluster,
    workload: Workload,
    *,
    duration_s: float,
    backlog_messages: int,
    loop_tid: int,
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "key": workload.key,
        "name": workload.name,
        "kind": workload.kind,
        "partitions": workload.partitions,
        "message_bytes": workload.message_bytes,
        "rate": workload.rate,
        "batch_api": workload.batch_api,
        "protocol": workload.protocol,
        "counterpart": workload.counterpart,
        "topic": workload.topic,
        "phases": [],
        "loadavg_before": load_average(),
    }
    if workload.kind == BACKLOG:
        result["backlog_messages"] = backlog_messages
    else:
        result["duration_s"] = duration_s
        result["warmup_s"] = warmup_s
    try:
        if workload.kind == BACKLOG:
            await prepare_backlog(cluster.service_url, workload)
        if workload.protocol == PULSAR:
            await prepare_topic(cluster.service_url, workload)
        phases = perf_phases(
            workload,
            cluster.service_url,
            duration_s=duration_s,
            backlog_messages=backlog_messages,
            warmup_s=warmup_s,
            pulsar_url=cluster.brokers[0].pulsar_url if workload.protocol == PULSAR else None,
        )
        for phase, perf_args, timeout_s in phases:
            result.setdefault("sync_before_s", []).append(await settle_disk())
            r = await run_phase(cluster, phase, perf_args, timeout_s=timeout_s, loop_tid=loop_tid)
            result["phases"].append(r)
            _print_phase(workload.key, r)
            _raise_if_failed(r)
        key = result["phases"][-1]
        summary = key["summary"]
        result.update(
            {
                "ok": True,
                "msg_per_s": summary["msg_per_s"],
                "mb_per_s": summary["mb_per_s"],
                "messages": summary["messages"],
                "latency_ms": summary["latency_ms"],
                "latency_clock": summary.get("latency_clock"),
                # the client calls behind the figures, as perf named them
                "api": summary.get("api"),
                # broker / bookie CPU per message (and per entry), beside the latencies
                "cost": key.get("cost"),
            }
        )
        if workload.kind == FIXED_RATE:
            result["publish_latency_ms"] = summary.get("publish_latency_ms")
        if workload.kind == BACKLOG:
            produced = result["phases"][0]["summary"]
            result["produce_msg_per_s"] = produced["msg_per_s"]
            result["produce_latency_ms"] = produced["latency_ms"]
            result["produce_api"] = produced.get("api")
            result["produce_cost"] = result["phases"][0].get("cost")
    except Exception as e:  # noqa: BLE001 - one failed workload is reported, the rest still run
        result.update({"ok": False, "error": f"{e}" if isinstance(e, RuntimeError) else f"{e!r}"})
        with contextlib.suppress(Exception):
            result["broker_log_tail"] = log_tail(cluster.brokers[0].log_path, 30)
        for phase_result in result["phases"]:
            if not phase_result["ok"]:
                result["perf_stderr_tail"] = phase_result.get("stderr_tail", "")
        # bring back whatever died, so that the next workload finds the whole cluster
        with contextlib.suppress(Exception):
            if any(not n.is_running for n in [*cluster.bookies, *cluster.brokers]):
                await cluster.start()
                result["cluster_restarted"] = True
    rss = [p["broker_rss"] for p in result["phases"]]
    values = [v for r in rss for v in (r["max_mib"], r["peak_mib"]) if v is not None]
    result["broker_rss_max_mib"] = max(values) if values else None
    result["loadavg_after"] = load_average()
    return result


async def run_grow(args: argparse.Namespace, root: Path, loop_tid: int) -> dict[str, Any]:
    """Produce at max rate to a fresh cluster until ``--grow-gb`` GB of payload are stored,
    keeping every second's throughput; the cluster's data is deleted afterwards."""
    size, partitions = args.grow_message_bytes, args.grow_partitions
    messages = math.ceil(args.grow_gb * GB / size)
    directory = root / "grow"
    result: dict[str, Any] = {
        "grow_gb": args.grow_gb,
        "message_bytes": size,
        "partitions": partitions,
        "messages": messages,
        "floor_free_bytes": GROW_FLOOR_BYTES,
    }
    free = shutil.disk_usage(root).free
    needed = grow_disk_needed(args.grow_gb)
    result["free_bytes_at_start"] = free
    result["needed_bytes"] = needed
    if free < needed:
        result.update(
            {
                "ok": False,
                "error": (
                    f"not enough disk space for --grow-gb {_number(args.grow_gb)}:"
                    f" {free / GB:,.1f} GB free, {needed / GB:,.1f} GB needed"
                ),
            }
        )
        return result
    cluster = LocalCluster(directory, bookies=BOOKIES, brokers=1, broker_args=BROKER_ARGS)
    floor = GROW_FLOOR_BYTES
    disk: list[tuple[float, int]] = []

    def stop_early() -> str | None:
        left = shutil.disk_usage(root).free
        if left < floor:
            return f"free space fell to {left / GB:,.1f} GB (floor {floor / GB:,.0f} GB)"
        return None

    def on_progress(p: dict[str, Any]) -> None:
        used = free - shutil.disk_usage(root).free
        p["disk_used_gb"] = round(used / GB, 3)
        disk.append((p["t_s"], used))
        if int(p["t_s"]) % 30 == 0:
            print(
                f"grow: {p['t_s']:,.0f} s, {p['msg_per_s']:,} msg/s, {p['mb_per_s']:,.1f} MB/s,"
                f" disk used {used / GB:,.1f} GB",
                flush=True,
            )

    try:
        await cluster.start()
        await settle_disk()
        perf_args = [
            *perf_base("produce", "suite-grow", cluster.service_url),
            "--partitions", str(partitions),
            "--size", str(size),
            "--rate", "0",
            "--num-messages", str(messages),
        ]  # fmt: skip
        timeout_s = messages / BACKLOG_TIMEOUT_MIN_RATE + PERF_TIMEOUT_MARGIN_S
        phase = await run_phase(
            cluster,
            "produce",
            perf_args,
            timeout_s=timeout_s,
            loop_tid=loop_tid,
            stop_early=stop_early,
            on_progress=on_progress,
        )
        result["phase"] = phase
        summary = phase.get("summary") or {}
        result["payload_gb"] = summary.get("bytes", 0) / GB
        result["disk_used_gb"] = disk[-1][1] / GB if disk else None
        result["ratio"] = grow_ratio(phase["progress"])
        result["ok"] = phase["ok"] and not phase.get("stopped_early")
        if not result["ok"]:
            result["error"] = phase.get("error") or phase.get("stopped_early", "")
            result["broker_log_tail"] = log_tail(cluster.brokers[0].log_path, 30)
        ratio = result["ratio"]["ratio"]
        print(
            f"grow: {result['payload_gb']:,.1f} GB of payload in {phase['elapsed_s']:,.0f} s;"
            f" last 10% / first 10% of the data: {opt(ratio)}",
            flush=True,
        )
    except Exception as e:  # noqa: BLE001 - reported with the rest of the results
        result.update({"ok": False, "error": f"{e!r}"})
    finally:
        await cluster.aclose()
        # the grow part's data is deleted whatever --keep-data says: it is tens of GB
        for node in cluster.bookies:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        if not args.keep_data:
            shutil.rmtree(directory, ignore_errors=True)
    return result


def _pulsar_client_version() -> str | None:
    """The installed pulsar-client's version (None without it: the Pulsar workloads fail)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("pulsar-client")
    except PackageNotFoundError:
        return None


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    if not args.only:
        return list(WORKLOADS)
    wanted = set(args.only)
    if PULSAR_GROUP_KEY in wanted:
        wanted |= {w.key for w in PULSAR_WORKLOADS} | {
            w.counterpart or "" for w in PULSAR_WORKLOADS
        }
    return [w for w in WORKLOADS if w.key in wanted]


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    print(f"cluster data and raw disk tests in {root}", flush=True)
    workloads = chosen_workloads(args)
    results: dict[str, Any] = {
        **results_head("suite", "suite.py", argv, started, args),
        "parameters": {
            "bookies": BOOKIES,
            "brokers": 1,
            "metadata": "etcd (the cluster's own, one member)",
            "quorum": "E{}/Qw{}/Qa{}".format(*QUORUM),
            "broker_args": BROKER_ARGS,
            "bookie_settings": "defaults (every group commit fdatasynced)",
            "duration_s": args.duration_s,
            "backlog_messages": args.backlog_messages,
            "rss_bound_mib": args.rss_bound_mib,
            "raw_s": args.raw_s,
            "perf": "defaults: 1 producer, batches of up to 1,000 messages / 128 KiB / 1 ms,"
            " 10,000 pending; consumer receiver queue 1,000; one send_async / receive +"
            " acknowledge call per message, or with --batch-api (the -batch workloads)"
            " send_many_async runs and batch_receive",
            "grow_gb": args.grow_gb,
            "grow_message_bytes": args.grow_message_bytes,
            "grow_partitions": args.grow_partitions,
            "pulsar_client": _pulsar_client_version(),
            "pulsar_perf": "bench/pulsar_perf.py against the broker's Pulsar port: 1 producer,"
            " batching on with perf's limits (1,000 messages / 128 KiB / 1 ms, no"
            " self-clocking), 10,000 pending; send_async per message; 1 exclusive consumer,"
            " receiver queue 1,000, a message listener acknowledging each message",
        },
        "targets": {
            "produce_msg_per_s": TARGET_PRODUCE_MSG_PER_S,
            "backlog_msg_per_s": TARGET_BACKLOG_MSG_PER_S,
            "backlog_messages": TARGET_BACKLOG_MESSAGES,
            "latency_ms": {str(k): v for k, v in LATENCY_TARGETS_MS.items()},
            "rate_reached_fraction": RATE_REACHED_FRACTION,
            "rss_bound_mib": args.rss_bound_mib,
            "grow_min_ratio": GROW_MIN_RATIO,
        },
        "machine": machine_info(root),
        "raw_limits": {},
        "loadavg": {"start": load_average()},
        "workloads": [],
        "grow": None,
    }
    await raw_limits_at(results, "start", root / "raw", args.raw_s)
    loop_tid = threading.get_native_id()
    if workloads:
        cluster = LocalCluster(
            root / "cluster", bookies=BOOKIES, brokers=1, broker_args=BROKER_ARGS
        )
        try:
            cluster_started = time.perf_counter()
            await cluster.start()
            results["cluster"] = {
                "metadata_url": cluster.metadata_url,
                "service_url": cluster.service_url,
                "pulsar_url": cluster.brokers[0].pulsar_url,
                "bookies": [n.bookie_id for n in cluster.bookies],
                "brokers": [n.broker_id for n in cluster.brokers],
                "start_s": time.perf_counter() - cluster_started,
            }
            for workload in workloads:
                result = await run_workload(
                    cluster,
                    workload,
                    duration_s=args.duration_s,
                    backlog_messages=args.backlog_messages,
                    loop_tid=loop_tid,
                    warmup_s=args.warmup_s,
                )
                results["workloads"].append(result)
                if not result["ok"]:
                    print(f"{workload.key}: FAILED {result['error']}", flush=True)
        finally:
            await cluster.aclose()
            if not args.keep_data:
                # gigabytes, and the grow part needs the room (its check counts what is free)
                shutil.rmtree(cluster.root, ignore_errors=True)
    if args.grow_gb:
        results["grow"] = await run_grow(args, root, loop_tid)
    # the cluster's writes still in the page cache would be flushed into the raw measurement
    results["sync_before_raw_end_s"] = await settle_disk()
    await raw_limits_at(results, "end", root / "raw", args.raw_s)
    results["loadavg"]["end"] = load_average()
    results["elapsed_s"] = time.time() - started
    results["checks"] = checks(
        results["workloads"], rss_bound_mib=args.rss_bound_mib, grow=results["grow"]
    )
    return results


# --- plots ----------------------------------------------------------------------------------------


def _stem(results: dict[str, Any]) -> str:
    tag = results.get("tag")
    return f"suite-{results['date']}{'-' + tag if tag else ''}"


def _loaded_phases(results: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every phase of the max-rate and backlog workloads, with its workload (the fixed-rate
    ones deliver their rate or not: see the latency plot's labels)."""
    for w in results["workloads"]:
        if w["kind"] != FIXED_RATE:
            for phase in w["phases"]:
                yield w, phase


def _throughput_bars(results: dict[str, Any]) -> list[tuple[str, float, str]]:
    """A bar per phase with a summary: label, msg/s and colour (green: a backlog drain)."""
    bars: list[tuple[str, float, str]] = []
    for w, phase in _loaded_phases(results):
        summary = phase.get("summary")
        if summary is None:
            continue
        label = w["key"] + (f" ({phase['phase']})" if w["kind"] == BACKLOG else "")
        color = "#2ca02c" if phase["phase"] == "consume" else "#1f77b4"
        bars.append((label, summary["msg_per_s"], color))
    return bars


def plot_throughput(path: Path, results: dict[str, Any]) -> None:
    """Bars: msg/s per workload (targets as lines); below, every second of the max-rate and
    backlog phases."""
    import matplotlib  # noqa: PLC0415 - a heavy import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    bars = _throughput_bars(results)
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 10), dpi=100, gridspec_kw={"height_ratios": [3, 2]}
    )
    if bars:
        top.barh(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
        top.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        top.invert_yaxis()
        for i, (_, value, _) in enumerate(bars):
            top.text(value, i, f" {value:,.0f}", va="center", fontsize=7)
    top.axvline(
        TARGET_PRODUCE_MSG_PER_S, color="#1f77b4", ls="--", lw=1,
        label=f"target: one producer, 100 B, {TARGET_PRODUCE_MSG_PER_S:,} msg/s",
    )  # fmt: skip
    top.axvline(
        TARGET_BACKLOG_MSG_PER_S, color="#2ca02c", ls="--", lw=1,
        label=f"target: one consumer draining a backlog, {TARGET_BACKLOG_MSG_PER_S:,} msg/s",
    )  # fmt: skip
    top.legend(fontsize=7, loc="lower right")
    thousands = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    top.xaxis.set_major_formatter(thousands)
    top.set_xlabel("messages per second (perf's summary: the whole run)")
    top.set_title(
        "Max rate: blue = produce (send -> receipt), green = one consumer draining the backlog",
        fontsize=10,
    )
    for w, phase in _loaded_phases(results):
        series = phase.get("progress") or []
        if series:
            label = w["key"] + (f" {phase['phase']}" if w["kind"] == BACKLOG else "")
            bottom.plot(
                [p["t_s"] for p in series], [p["msg_per_s"] for p in series], lw=1, label=label
            )
    bottom.set_xlabel("seconds since the phase started measuring")
    bottom.set_ylabel("messages per second")
    bottom.set_ylim(bottom=0)
    bottom.yaxis.set_major_formatter(thousands)
    bottom.set_title(
        "Every second of the max-rate and backlog phases (perf's progress)", fontsize=10
    )
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_latency(path: Path, results: dict[str, Any]) -> None:
    """Latency percentiles per workload, log scale: end-to-end at fixed rates (targets as marks),
    and publish latency (send -> receipt) at max rate."""
    import matplotlib  # noqa: PLC0415 - a heavy import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    # minor ticks: only 2 and 5 of each decade, or the labels run into each other
    sparse = FuncFormatter(
        lambda v, _pos: (
            f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""
        )
    )
    keys = ("p50", "p95", "p99", "p99_9", "max")
    panels = (
        ([w for w in results["workloads"] if w["kind"] == FIXED_RATE and w["ok"]], "latency_ms",
         "End-to-end latency at fixed rates (send -> receive, one clock); x: a target"),
        ([w for w in results["workloads"] if w["kind"] == MAX_RATE and w["ok"]], "latency_ms",
         "Publish latency at max rate (send call -> broker receipt)"),
    )  # fmt: skip
    figure, axes = plt.subplots(2, 1, figsize=(12, 9), dpi=100)
    width = 0.8 / len(keys)
    for axis, (chosen, field_name, title) in zip(axes, panels, strict=True):
        for j, k in enumerate(keys):
            values = [(w[field_name] or {}).get(k) or float("nan") for w in chosen]
            xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(chosen))]
            axis.bar(xs, values, width, label=k.replace("_", "."))
        for i, w in enumerate(chosen):
            for p, limit in LATENCY_TARGETS_MS.get(w["rate"], {}).items():
                j = keys.index(p)
                x = i + (j - (len(keys) - 1) / 2) * width
                axis.plot([x], [limit], marker="x", color="red", ms=8)
        labels = [f"{w['key']}\n{w['msg_per_s']:,.0f} msg/s" for w in chosen]
        axis.set_xticks(range(len(chosen)), labels, fontsize=7, rotation=20)
        axis.set_yscale("log")
        shown = [v for w in chosen for k in keys if (v := (w[field_name] or {}).get(k))]
        shown += [v for w in chosen for v in LATENCY_TARGETS_MS.get(w["rate"], {}).values()]
        if shown:  # bars on a log scale start at the axis: start it at least 2x below them all
            axis.set_ylim(bottom=10 ** math.floor(math.log10(min(shown)) - 0.3))
        axis.yaxis.set_major_formatter(plain)
        axis.yaxis.set_minor_formatter(sparse)
        axis.set_ylabel("ms")
        axis.set_title(title, fontsize=10)
        axis.grid(axis="y", which="both", alpha=0.3)
        if chosen:
            axis.legend(fontsize=7, ncol=len(keys))
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_grow(path: Path, grow: dict[str, Any]) -> None:
    """Throughput every second while the stored data grows, first and last 10% shaded."""
    import matplotlib  # noqa: PLC0415 - a heavy import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    series = grow.get("phase", {}).get("progress") or []
    figure, axis = plt.subplots(figsize=(12, 5), dpi=100)
    seconds = [p["t_s"] for p in series]
    # each progress line is the second before it
    axis.step(seconds, [p["mb_per_s"] for p in series], where="pre", lw=1, color="black")
    if any("disk_used_gb" in p for p in series):
        disk = axis.twinx()
        disk.plot(seconds, [p.get("disk_used_gb") for p in series], lw=1, ls="--", color="#7f7f7f")
        disk.set_ylabel("file system used since the start, GB (dashed)", color="#7f7f7f")
        disk.set_ylim(bottom=0)
    ratio = grow.get("ratio") or {}
    if series and ratio.get("first_seconds"):
        axis.axvspan(0, seconds[ratio["first_seconds"] - 1], color="#1f77b4", alpha=0.15)
        axis.axvspan(seconds[-ratio["last_seconds"]] - 1, seconds[-1], color="#ff7f0e", alpha=0.15)
    axis.set_xlabel("seconds since producing started")
    axis.set_ylabel(f"payload MB/s ({size_name(grow['message_bytes'])} messages)")
    axis.set_ylim(bottom=0)
    value = ratio.get("ratio")
    axis.set_title(
        f"Max-rate produce while {grow.get('payload_gb', 0):,.1f} GB are stored"
        f" (x{QUORUM[1]} on the bookies); last 10% / first 10% of the data:"
        f" {'-' if value is None else format(value, '.2f')}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    stem = _stem(results)
    paths = [out / f"{stem}-throughput.png", out / f"{stem}-latency.png"]
    plot_throughput(paths[0], results)
    plot_latency(paths[1], results)
    if results.get("grow") and results["grow"].get("phase"):
        paths.append(out / f"{stem}-grow.png")
        plot_grow(paths[-1], results["grow"])
    return paths


# --- report ---------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _check_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for c in results["checks"]:
        head = f"- **{c['verdict']}** {c['name']}"
        if "why" in c and "workload" not in c and "workloads" not in c:
            lines.append(f"{head}: {c['why']}.")
        elif "measured_msg_per_s" in c:
            note = f"; {c['note']}" if "note" in c else ""
            others = "; ".join(
                f"`{api}` {best['msg_per_s']:,.0f} msg/s ({best['workload']})"
                for api, best in c.get("per_api", {}).items()
            )
            lines.append(
                f"{head}: **{c['measured_msg_per_s']:,.0f} msg/s** ({c['workload']},"
                f" `{c.get('api') or '?'}`, {c['ratio']:.1%} of the target{note})."
                + (f" Best of each set of client calls: {others}." if others else "")
            )
        elif "workloads" in c:
            parts = []
            for e in c["workloads"]:
                if "measured_ms" not in e:
                    parts.append(f"{e['workload']} {e['verdict']} ({e['why']})")
                    continue
                figures = ", ".join(f"{p} {opt(v)} ms" for p, v in e["measured_ms"].items())
                why = f"; {e['why']}" if "why" in e else ""
                parts.append(f"{e['workload']} {e['verdict']} ({figures}{why})")
            lines.append(f"{head}: " + "; ".join(parts) + ".")
        elif "measured_max_mib" in c:
            each = ", ".join(f"{k} {v:,.0f}" for k, v in c["per_workload_mib"].items())
            lines.append(
                f"{head}: max **{c['measured_max_mib']:,.0f} MiB** ({c['workload']}); per"
                f" workload, MiB: {each}."
            )
        elif "pulsar_msg_per_s" in c:
            pulsar, grpc = c["pair"]
            lines.append(
                f"{head}: **{c['measured_ratio']:.1%}** ({c['pulsar_msg_per_s']:,.0f} msg/s"
                f" ({pulsar}) against {c['grpc_msg_per_s']:,.0f} msg/s ({grpc}))."
            )
        elif "measured_ratio" in c:
            lines.append(
                f"{head}: **{c['measured_ratio']:.2f}** ({c['first_mb_per_s']:,.1f} MB/s while"
                f" the first 10% was written, {c['last_mb_per_s']:,.1f} MB/s the last 10%;"
                f" {c['stored_gb']:,.1f} GB of payload)."
            )
        else:
            lines.append(f"{head}: {c.get('why', '')}.")
    return lines


def _verdict_cell(results: dict[str, Any], w: dict[str, Any]) -> str:
    """The verdicts that speak of this workload, for the summary table."""
    found = []
    for c in results["checks"]:
        if c.get("workload") == w["key"] and "measured_max_mib" not in c:
            found.append(c["verdict"])
        if w["key"] in c.get("pair", ()):
            found.append(f"{c['verdict']} (Pulsar / gRPC)")
        found.extend(e["verdict"] for e in c.get("workloads", []) if e["workload"] == w["key"])
    return " ".join(found) or "-"


def _rss_verdict(results: dict[str, Any], w: dict[str, Any]) -> str:
    bound = results["parameters"]["rss_bound_mib"]
    value = w.get("broker_rss_max_mib")
    if value is None:
        return "-"
    mark = f" {_verdict(value < bound)}" if w["kind"] in (MAX_RATE, BACKLOG) else ""
    return f"{value:,.0f}{mark}"


def _summary_table(results: dict[str, Any]) -> list[str]:
    cores = results["machine"]["cpu_count"]
    lines = [
        (
            "| workload | msg/s | payload MB/s | entries/s | journal MB/s (all bookies) |"
            " fdatasyncs/s (all bookies) | latency p50 | p99 | p99.9 | CPU ms per message:"
            " broker / bookies / both (per entry) | broker RSS max, MiB |"
            " CPU perf / broker / bookies / machine | target |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        (
            "| *raw limit, this machine (start / end)* | | | gRPC round trips/s, one at a"
            f" time: {raw_pair(results, 'grpc_unary_round_trip', 'calls_per_s')} | append +"
            f" fdatasync 1 MiB: {raw_pair(results, 'append_fdatasync_1m', 'mb_per_s')};"
            f" 4 MiB: {raw_pair(results, 'append_fdatasync_4m', 'mb_per_s')} | 4 KiB append +"
            f" fdatasync: {raw_pair(results, 'append_fdatasync_4k', 'ops_per_s')} |"
            + " |".join(
                f" gRPC round trip {raw_pair(results, 'grpc_unary_round_trip', f'latency.{q}')}"
                f" us; 4 KiB fdatasync {raw_pair(results, 'append_fdatasync_4k', f'latency.{q}')}"
                " us"
                for q in ("p50_us", "p99_us", "p999_us")
            )
            + " | | |"
            f" {100 * cores}% = {cores} cores | |"
        ),
    ]
    for w in results["workloads"]:
        for phase in w["phases"] or [{}]:
            label = w["name"] + (f": {phase.get('phase')}" if w["kind"] == BACKLOG else "")
            summary = phase.get("summary")
            if summary is None:
                lines.append(f"| {label} | FAILED (below) |" + " |" * 11)
                continue
            label += f", `{summary.get('api') or '?'}`"
            latency = summary["latency_ms"]
            cpu = phase.get("cpu") or {}
            is_key = phase is w["phases"][-1]
            cpu_cell = (
                " / ".join(
                    _pct(cpu.get(k))
                    for k in ("perf_pct", "broker_pct", "bookies_pct", "machine_busy_pct")
                )
                if cpu
                else "-"
            )
            rss = phase["broker_rss"]
            rss_values = [v for v in (rss["max_mib"], rss["peak_mib"]) if v is not None]
            rss_cell = f"{max(rss_values):,.0f}" if rss_values else "-"
            if is_key:
                rss_cell = _rss_verdict(results, w)
            lines.append(
                f"| {label} | **{summary['msg_per_s']:,.0f}** | {summary['mb_per_s']:,.1f}"
                f" | {opt(cpu.get('stored_entries_per_s'), ',.0f')}"
                f" | {opt(cpu.get('journal_mb_per_s'), ',.1f')}"
                f" | {opt(cpu.get('fdatasyncs_per_s'), ',.0f')}"
                f" | {opt(latency['p50'])} ms | {opt(latency['p99'])} ms"
                f" | {opt(latency['p99_9'])} ms | {cost_cell(phase.get('cost'))}"
                f" | {rss_cell} | {cpu_cell}"
                f" | {_verdict_cell(results, w) if is_key else '-'} |"
            )
    return lines


def _workload_detail(results: dict[str, Any], w: dict[str, Any]) -> list[str]:
    lines = ["", f"### {w['name']} (`{w['key']}`)", ""]
    if not w["ok"]:
        lines += [f"**FAILED**: `{w.get('error')}`", ""]
    for phase in w["phases"]:
        lines += [f"`{phase['command']}`", ""]
        summary = phase.get("summary")
        if not phase["ok"]:
            lines += [
                f"**{phase['phase']} FAILED**: `{phase.get('error')}`; perf's stderr:",
                "",
                "```",
                phase.get("stderr_tail", ""),
                "```",
                "",
            ]
        if summary is None:
            continue
        latency = summary["latency_ms"]
        cpu = phase.get("cpu") or {}
        rss = phase["broker_rss"]
        entries_per_s = opt(cpu.get("stored_entries_per_s"), ",.0f")
        journal_mb_per_s = opt(cpu.get("journal_mb_per_s"), ",.1f")
        lines += [
            "| figure | measured | raw limit, same run (start / end) |",
            "|---|---|---|",
            f"| client calls | `{summary.get('api') or '?'}` | |",
            (
                f"| {phase['phase']}: messages/s | **{summary['msg_per_s']:,.0f}**"
                f" ({summary['messages']:,} in {summary['duration_s']:,.1f} s)"
                f" | one gRPC round trip at a time:"
                f" {raw_pair(results, 'grpc_unary_round_trip', 'calls_per_s')}/s |"
            ),
            (
                f"| entries/s stored (bookie adds / Qw) | {entries_per_s} | 4 KiB append +"
                " fdatasync:"
                f" {raw_pair(results, 'append_fdatasync_4k', 'ops_per_s')}/s |"
            ),
            (
                f"| journal MB/s, all bookies (Qw copies) | {journal_mb_per_s} | append +"
                " fdatasync 1 MiB:"
                f" {raw_pair(results, 'append_fdatasync_1m', 'mb_per_s')} MB/s; 4 MiB:"
                f" {raw_pair(results, 'append_fdatasync_4m', 'mb_per_s')} MB/s |"
            ),
            (
                f"| fdatasyncs/s, all bookies; busiest journal in fdatasync |"
                f" {opt(cpu.get('fdatasyncs_per_s'), ',.0f')};"
                f" {_pct(cpu.get('busiest_journal_fdatasync_pct'))} of the time | 4 KiB append +"
                f" fdatasync: {raw_pair(results, 'append_fdatasync_4k', 'ops_per_s')}/s |"
            ),
            (
                f"| latency p50 / p95 | {opt(latency['p50'])} / {opt(latency['p95'])} ms |"
                f" gRPC round trip p50"
                f" {raw_pair(results, 'grpc_unary_round_trip', 'latency.p50_us')} us; 4 KiB"
                f" fdatasync p50 {raw_pair(results, 'append_fdatasync_4k', 'latency.p50_us')}"
                " us |"
            ),
            (
                f"| latency p99 / p99.9 / max | {opt(latency['p99'])} /"
                f" {opt(latency['p99_9'])} / {opt(latency['max'])} ms | gRPC round trip p99"
                f" {raw_pair(results, 'grpc_unary_round_trip', 'latency.p99_us')} us; 4 KiB"
                f" fdatasync p99 {raw_pair(results, 'append_fdatasync_4k', 'latency.p99_us')}"
                " us |"
            ),
        ]
        lines.append(_cost_row(phase.get("cost")))
        if summary.get("publish_latency_ms"):
            pub = summary["publish_latency_ms"]
            lines.append(
                f"| publish latency (send -> receipt) p50 / p99 / max | {opt(pub['p50'])} /"
                f" {opt(pub['p99'])} / {opt(pub['max'])} ms | |"
            )
        lines.append(
            f"| broker RSS: max of {rss['samples']} samples / peak (VmHWM) |"
            f" {opt(rss['max_mib'], ',.0f')} / {opt(rss['peak_mib'], ',.0f')} MiB |"
            f" bound {results['parameters']['rss_bound_mib']:g} MiB |"
        )
        if cpu:
            busiest = busiest_cell(cpu["broker_busiest_thread"], who=False)
            lines += [
                (
                    f"| CPU: perf (its event loop) / broker (busiest thread) / bookies / etcd |"
                    f" {_pct(cpu['perf_pct'])} ({_pct(cpu['perf_event_loop_pct'])}) /"
                    f" {_pct(cpu['broker_pct'])} ({busiest}) /"
                    f" {_pct(cpu['bookies_pct'])} / {_pct(cpu['etcd_pct'])} |"
                    f" {100 * results['machine']['cpu_count']}% = all cores |"
                ),
                (
                    f"| machine busy (other; stolen) | {_pct(cpu['machine_busy_pct'])}"
                    f" ({_pct(cpu['other_pct'])}; {_pct(cpu['machine_steal_pct'])}) | |"
                ),
                f"| what limits it | {'; '.join(phase.get('limits', []))} | |",
            ]
        lines.append("")
    return lines


def _cost_row(cost: dict[str, Any] | None) -> str:
    """The workload table's row of CPU per message (and per entry)."""
    head = "| CPU ms per message: broker / bookies / broker + bookies (per entry) |"
    if not cost or not cost.get("ms_per_message"):
        return f"{head} - | |"
    entries = cost.get("messages_per_entry")
    note = (
        f"{entries:,.1f} messages per entry"
        if entries
        else "entries not known (a consume phase: the entries read are not counted)"
    )
    return f"{head} {cost_cell(cost)} | {note} |"


def cost_cell(cost: dict[str, Any] | None) -> str:
    """``broker / bookies / both`` ms of CPU per message, and per entry in brackets when known."""
    if not cost or not cost.get("ms_per_message"):
        return "-"
    keys = ("broker", "bookies", "broker_bookies")
    # three significant digits: a large batch's messages cost thousandths of a millisecond
    cell = " / ".join(f"{cost['ms_per_message'][k]:#.3g}" for k in keys)
    per_entry = cost.get("ms_per_entry")
    if per_entry:
        cell += " (" + " / ".join(f"{per_entry[k]:#.3g}" for k in keys) + ")"
    return cell


def _busiest(per_process: dict[str, list[Any]]) -> str:
    if not per_process:
        return "-"
    _, (name, pct) = max(per_process.items(), key=lambda kv: kv[1][1])
    return f"{pct:.0f}% {'event loop' if name == 'main' else 'thread ' + name}"


def _grow_lines(results: dict[str, Any]) -> list[str]:
    grow = results.get("grow")
    if grow is None:
        return []
    lines = [
        "",
        "## Throughput as stored data grows",
        "",
        (
            f"A fresh cluster (same settings); one `magnetar perf produce --rate 0` of"
            f" {grow['messages']:,} messages of {size_name(grow['message_bytes'])} to a topic of"
            f" {grow['partitions']} partition(s), i.e. {grow['grow_gb']:g} GB of payload, stored"
            f" {QUORUM[1]} times; every second's throughput is perf's progress line. Its data is"
            " deleted afterwards."
        ),
        "",
    ]
    if not grow.get("ok"):
        lines += [f"**FAILED or stopped**: `{grow.get('error')}`", ""]
    phase = grow.get("phase")
    if phase is not None:
        ratio = grow["ratio"]
        summary = phase.get("summary") or {}
        first_mb_per_s = opt(ratio.get("first_mb_per_s"), ",.1f")
        last_mb_per_s = opt(ratio.get("last_mb_per_s"), ",.1f")
        first_s, last_s = ratio.get("first_seconds", 0), ratio.get("last_seconds", 0)
        payload_gb = grow.get("payload_gb", 0)
        disk_gb = opt(grow.get("disk_used_gb"), ",.1f")
        mean_msg = opt(summary.get("msg_per_s"), ",.0f")
        mean_mb = opt(summary.get("mb_per_s"), ",.1f")
        lines += [
            f"`{phase['command']}`",
            "",
            f"![throughput as data grows]({_stem(results)}-grow.png)",
            "",
            "| figure | measured |",
            "|---|---|",
            f"| payload stored | {payload_gb:,.1f} GB in {phase['elapsed_s']:,.0f} s |",
            f"| disk used (file system, all bookies) | {disk_gb} GB |",
            f"| mean | {mean_msg} msg/s, {mean_mb} MB/s |",
            f"| while the first 10% was written | {first_mb_per_s} MB/s ({first_s} s) |",
            f"| while the last 10% was written | {last_mb_per_s} MB/s ({last_s} s) |",
            f"| last / first | **{opt(ratio.get('ratio'))}** |",
            f"| broker RSS max | {opt(phase['broker_rss']['max_mib'], ',.0f')} MiB |",
        ]  # fmt: skip
    return lines


def _loadavg_text(results: dict[str, Any]) -> str:
    """The machine's load averages at the start and the end of the run, as a sentence."""
    loadavg = results.get("loadavg") or {}
    if not loadavg:
        return ""
    said = "; ".join(
        f"{when} {' / '.join(f'{v:.1f}' for v in loadavg[when])}"
        for when in ("start", "end")
        if when in loadavg
    )
    return f" Load average (1 / 5 / 15 min): {said}."


def _load_cell(w: dict[str, Any] | None) -> str:
    """A workload's 1-minute load average before -> after it."""
    if w is None or "loadavg_before" not in w or "loadavg_after" not in w:
        return "-"
    return f"{w['loadavg_before'][0]:.1f} -> {w['loadavg_after'][0]:.1f}"


def _pulsar_lines(results: dict[str, Any]) -> list[str]:
    """The Pulsar-port workloads beside their gRPC counterparts (issue 26), if any ran."""
    pairs = pulsar_pairs(results["workloads"])
    if not pairs:
        return []
    by_key = {w["key"]: w for w in results["workloads"]}

    def side(figures: dict[str, Any] | None, key: str) -> str:
        if figures is None:
            return "-"
        if key == "latency":
            latency = figures["latency_ms"]
            return f"{opt(latency['p50'])} / {opt(latency['p99'])} ms"
        if key == "msg_per_s":
            return f"{figures['msg_per_s']:,.0f}"
        if key == "cpu":
            return f"{_pct(figures['client_cpu_pct'])} / {_pct(figures['broker_cpu_pct'])}"
        return opt(figures[key], "#.3g" if key == "cpu_ms_per_message" else ",.1f")

    lines = [
        "",
        "## Pulsar port beside the gRPC port",
        "",
        (
            "Each Pulsar-port workload runs right after its gRPC counterpart on the same"
            " cluster: `bench/pulsar_perf.py`, the real `pulsar-client`"
            f" {results['parameters'].get('pulsar_client') or '(not installed)'} (C++ core)"
            " against the broker's Pulsar port, beside `magnetar perf` (Magnetar's own client)"
            " against its gRPC port; one producer, `send_async` per message, batching on with"
            " the same limits, 100 B, 1 partition. Latency is send call -> receipt at max rate"
            " (10,000 sends pending: mostly queueing) and send -> receive on one clock at a"
            " fixed rate. CPU per message is the broker's and the 3 bookies' together over the"
            " same window; CPU client / broker is the load process's (`magnetar perf` or"
            " `pulsar_perf.py`, with the client's threads) and the broker's, % of one core, so"
            " the busier one shows what limited the run. Pulsar / gRPC is the ratio of msg/s;"
            " issue 26's goal is at least"
            f" {PULSAR_TARGET_RATIO:.0%} at max rate. The load average (1 min, before -> after"
            " each workload) says how busy the shared machine was."
        ),
        "",
        (
            "| workload | gRPC msg/s | Pulsar msg/s | Pulsar / gRPC | latency p50 / p99, gRPC"
            " | latency p50 / p99, Pulsar | broker + bookies CPU ms per message, gRPC | ... Pulsar"
            " | messages per entry, gRPC | ... Pulsar | CPU client / broker, gRPC | ... Pulsar"
            " | load average, gRPC | ... Pulsar |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        grpc, pulsar = p["grpc_figures"], p["pulsar_figures"]
        ratio = p["throughput_ratio"]
        lines.append(
            f"| {p['pulsar']} / {p['grpc']} | {side(grpc, 'msg_per_s')}"
            f" | {side(pulsar, 'msg_per_s')} | {'-' if ratio is None else f'**{ratio:.1%}**'}"
            f" | {side(grpc, 'latency')} | {side(pulsar, 'latency')}"
            f" | {side(grpc, 'cpu_ms_per_message')} | {side(pulsar, 'cpu_ms_per_message')}"
            f" | {side(grpc, 'messages_per_entry')} | {side(pulsar, 'messages_per_entry')}"
            f" | {side(grpc, 'cpu')} | {side(pulsar, 'cpu')}"
            f" | {_load_cell(by_key.get(p['grpc'] or ''))} | {_load_cell(by_key[p['pulsar']])} |"
        )
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    p = results["parameters"]
    cores = results["machine"]["cpu_count"]
    stem = _stem(results)
    lines = [
        *report_head(results, "Benchmark suite"),
        "",
        (
            f"One `LocalCluster`: its own etcd, {p['bookies']} `magnetar bookie` processes"
            f" (default storage settings: every group commit `fdatasync`ed), 1 `magnetar broker`"
            f" (`{' '.join(p['broker_args'])}`), ledgers {p['quorum']}. Each workload is one run"
            " of the real `magnetar perf` command (a process of its own, default client"
            " settings; the `pulsar-*` workloads run `bench/pulsar_perf.py` instead, see"
            " below) on a fresh topic; before each, the page cache is written back (`sync`)."
            " perf makes one client call per message (`send_async`; `receive` then"
            " `acknowledge`) except in the `-batch` workloads (`--batch-api`: `send_many_async`"
            " runs; `batch_receive` with one acknowledgement per batch); every figure is named"
            " with the calls that produced it."
            f" Max-rate and fixed-rate workloads run {p['duration_s']:g} s; a backlog is"
            f" {p['backlog_messages']:,} messages produced at max rate, then drained by one"
            " consumer from the earliest message. Figures are perf's own summary over its whole"
            " run; CPU and bookie counters are from its first progress line (1 s in) to its"
            " summary line; the broker's RSS is sampled every"
            f" {RSS_SAMPLE_INTERVAL_S:g} s through the whole run (and its VmHWM reset at the"
            " start and read at the end)."
        ),
        "",
        (
            "MB = 10^6 bytes. CPU % is of one core: the machine has"
            f" {cores} cores, so {100 * cores}% is all of it. Raw limits read `start / end` of"
            " the run. The machine is shared and noisy: compare within this run only."
            + _loadavg_text(results)
        ),
        "",
        "## Targets",
        "",
        *_check_lines(results),
        "",
        "## Summary",
        "",
        *_summary_table(results),
        "",
        (
            "Latency: end-to-end (send -> receive, one clock) for the fixed-rate workloads;"
            " send call -> broker receipt for max-rate produce; for a backlog drain, now minus"
            " the broker's publish time, i.e. the age of the backlog (not a latency). Entries/s"
            " are the bookies' adds over Qw; journal MB/s and fdatasyncs/s are summed over the"
            " bookies (each entry is written and synced on Qw of them)."
        ),
        "",
        *_pulsar_lines(results),
        "",
        f"![throughput]({stem}-throughput.png)",
        "",
        f"![latency]({stem}-latency.png)",
        "",
        *raw_limits_table(results, SUITE_RAW_ROWS, one_column=True),
    ]
    lines += _grow_lines(results)
    lines += ["", "## Every workload"]
    for w in results["workloads"]:
        lines += _workload_detail(results, w)
        if not w["ok"] and w.get("broker_log_tail"):
            lines += ["Broker log tail:", "", "```", w["broker_log_tail"], "```", ""]
    return report_text(
        lines, "Raw figures, perf's per-second progress, parameters and machine details"
    )


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "suite.py",
        (
            "OpenMessaging-Benchmark-style workloads against a real cluster (own etcd, 3 bookie"
            " processes, 1 broker process, E3/Qw2/Qa2, fdatasync on every group commit), each"
            " run by the real `magnetar perf` command on a fresh topic: 1 and 16 partitions,"
            " 100 B and 1 KiB messages, max rate (produce), fixed 2,000 and 50,000 msg/s"
            " (end-to-end latency), and a backlog drained by one consumer; produce and backlog"
            " each with perf's per-message calls (send_async; receive + acknowledge) and with"
            " --batch-api (send_many_async; batch_receive), labelled; and the Pulsar port with"
            " the real pulsar-client (bench/pulsar_perf.py: pulsar-produce, pulsar-e2e-2000,"
            " pulsar-e2e-50000), each right after its gRPC counterpart, their throughput ratio"
            " judged against 80%. The raw limits of"
            " this machine (4 KiB append+fdatasync ops/s, 1 MiB and 4 MiB append+fdatasync MB/s,"
            " loopback gRPC round trip) are measured at the start and the end. Writes"
            " suite-<date>.json, .md, -throughput.png and -latency.png to --out, with PASS/MISS"
            " for each target. Exits 0 if every workload ran (whatever the verdicts), 1 if one"
            " failed (results are written either way)."
        ),
    )
    add("--duration-s", type=float, default=20.0, help="seconds per max-rate or fixed-rate run")
    add(
        "--warmup-s",
        type=float,
        default=3.0,
        help="seconds each max-rate or fixed-rate run goes first without counting (default 3)",
    )
    add(
        "--backlog-messages",
        type=int,
        default=TARGET_BACKLOG_MESSAGES,
        help="messages produced, then drained, in each backlog workload",
    )
    add(
        "--rss-bound-mib",
        type=float,
        default=DEFAULT_RSS_BOUND_MIB,
        help="the broker's RSS must stay under this in max-rate and backlog workloads",
    )
    add_raw_s_option(add)
    add(
        "--grow-gb",
        type=float,
        default=0.0,
        help="opt-in: afterwards, on a fresh cluster, produce at max rate until this many GB"
        " (10^9 bytes) of payload are stored (twice: Qw2) and record every second's throughput;"
        " refused if the disk cannot hold it; the data is deleted afterwards",
    )
    add("--grow-message-bytes", type=int, default=KIB, help="message size of the grow part")
    add("--grow-partitions", type=int, default=1, help="partitions of the grow part's topic")
    add_quick_and_tag(
        add,
        "suite",
        quick="2 s per workload, a backlog of 100,000 messages, 0.5 s per raw measurement",
    )
    add(
        "--only",
        action="append",
        metavar="KEY",
        help="run only this workload (repeatable); keys: "
        + ", ".join(w.key for w in WORKLOADS)
        + f"; '{PULSAR_GROUP_KEY}': the Pulsar-port workloads and their gRPC counterparts;"
        f" '{GROW_KEY}' alone runs only the --grow-gb part",
    )
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the cluster's data and the raw disk tests (so"
            " both are on the same file system) and removed at the end"
        ),
        keep_data_help=(
            "leave the temporary directory (the servers' logs and data; never the grow part's"
            " data) in place, and print where it is"
        ),
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s = min(args.duration_s, 2.0)
        args.warmup_s = min(args.warmup_s, 0.5)
        args.backlog_messages = min(args.backlog_messages, 100_000)
        args.raw_s = 0.5
        args.tag = args.tag or "quick"
    if args.only:
        unknown = set(args.only) - {w.key for w in WORKLOADS} - {GROW_KEY, PULSAR_GROUP_KEY}
        if unknown:
            parser.error(f"unknown workload(s) {sorted(unknown)}")
        if GROW_KEY in args.only and not args.grow_gb:
            parser.error(f"--only {GROW_KEY} needs --grow-gb N")
    if args.duration_s <= 0 or args.backlog_messages < 1 or args.raw_s <= 0:
        parser.error("--duration-s and --raw-s must be > 0, --backlog-messages >= 1")
    if args.grow_gb < 0 or args.grow_message_bytes < 1 or args.grow_partitions < 1:
        parser.error("--grow-gb >= 0, --grow-message-bytes >= 1, --grow-partitions >= 1")
    return args


def disk_refusal(args: argparse.Namespace) -> str | None:
    """Why the run cannot start for lack of disk space, or None."""
    if not args.grow_gb:
        return None
    args.data_root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.data_root).free
    needed = grow_disk_needed(args.grow_gb)
    if free >= needed:
        return None
    fits_gb = max(0.0, (free - GROW_FLOOR_BYTES) / GB / GROW_DISK_BYTES_PER_PAYLOAD_BYTE)
    return (
        f"--grow-gb {_number(args.grow_gb)} needs {needed / GB:,.1f} GB free in"
        f" {args.data_root} (the payload stored {QUORUM[1]} times with overhead:"
        f" {GROW_DISK_BYTES_PER_PAYLOAD_BYTE:g} bytes per payload byte, plus"
        f" {GROW_FLOOR_BYTES / GB:,.0f} GB kept free), and {free / GB:,.1f} GB are free;"
        f" --grow-gb {math.floor(fits_gb):,} would fit"
    )


def _refusal(args: argparse.Namespace) -> str | None:
    reason = disk_refusal(args)
    return None if reason is None else f"bench/suite.py: {reason}"


def _plots_and_verdicts(results: dict[str, Any], args: argparse.Namespace) -> bool:
    for path in write_plots(results, args.out):
        print(f"wrote {path}")
    print_checks(results["checks"])
    ok = all_ok("workloads")(results, args)
    if results["grow"] is not None:
        ok = ok and bool(results["grow"].get("ok"))
    return ok


def main(argv: list[str] | None = None) -> int:
    # the test kit and the metadata client log at info; the suite's own output is enough
    ok = _plots_and_verdicts
    return bench_main("suite", argv, parse_args, bench, render_markdown, ok=ok, refusal=_refusal)


if __name__ == "__main__":
    raise SystemExit(main())
