"""``magnetar perf``: load generation with latency percentiles.

Three modes, each one asyncio process driving the asyncio client (:mod:`magnetar.aio`) directly:

- ``produce``: P producers send fixed-size messages as fast as allowed (a token bucket, refilled
  in chunks) while at most ``--max-pending`` sends per producer wait for their receipt. Latency is
  per message, from the send call to the broker's receipt (the message is durable).
- ``consume``: one consumer drains the topic and acknowledges. Latency is now minus the message's
  publish timestamp: the broker's wall clock against this process's, so it means something only
  on one machine (or with well synchronised clocks), and for a backlog it is the age of the
  message.
- ``end-to-end``: one producer and one consumer in this process; each payload carries its send
  time (``time.perf_counter_ns`` in its first 8 bytes), so the latency is send -> receive on one
  clock.

By default every mode makes the calls most programs write, one per message, as pulsar-perf
does: ``send_async(content, callback)`` to publish, ``receive()`` then ``acknowledge(message)``
to consume. ``--batch-api`` measures the batch calls instead: runs of messages with
``send_many_async`` (one future per run), ``batch_receive`` with one acknowledgement per batch
(cumulative where the subscription type allows). The summary names the calls that produced its
figures (``api``), so a figure is never read as the other path's.

Latencies go into :class:`LatencyHistogram`, a log-linear (HdrHistogram-style) histogram kept in
this module. A line of progress per second goes to stderr, the summary to stdout (``--json``: one
JSON line). Exit codes, and the credential and TLS options, are those of
:mod:`magnetar.cli.support`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import struct
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any

from magnetar.cli.support import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    add_client_options,
    client_settings,
    error_text,
)

if TYPE_CHECKING:
    from magnetar.aio import Client, Consumer, Message, MessageId, Producer
    from magnetar.common.errors import MagnetarError

__all__ = ["LatencyHistogram", "add_perf_command", "nearest_rank", "run_perf"]

# --- the histogram -------------------------------------------------------------------------------

_SUB_BUCKET_BITS = 7
_SUB_BUCKETS = 1 << _SUB_BUCKET_BITS
"""Linear sub-buckets per power of two: a bucket is at most 1/128 (0.8%) of its lowest value."""

REPORTED_PERCENTILES = (50, 95, 99, 99.9)


def nearest_rank(percentile: float, count: int) -> int:
    """The 1-based rank of ``percentile`` (0..100) among ``count`` sorted values (nearest rank:
    the smallest value with at least ``percentile`` % of the values at or below it). Decimal
    arithmetic, so 99.9 of 1000 is rank 999, not 1000."""
    if not 0 <= percentile <= 100:
        raise ValueError(f"a percentile is between 0 and 100, got {percentile}")
    return max(1, math.ceil(Fraction(str(percentile)) * count / 100))


class LatencyHistogram:
    """Counts of non-negative integer values (microseconds here) in log-linear buckets.

    Values below 256 have a bucket each; above, every power of two is split into 128 equal
    buckets, so a bucket's width is at most 1/128 of its lowest value. ``record`` is a few integer
    operations (``bit_length``, a shift, an index); percentiles walk the buckets and answer the
    highest value of the bucket holding the nearest-rank value (never above the recorded
    maximum), so they are exact to the bucket. Minimum and maximum are exact. Values above
    ``highest`` (default about 12 days in microseconds) are counted as ``highest``.
    """

    __slots__ = ("_counts", "_highest", "_lowest", "count", "max", "total")

    def __init__(self, highest: int = 2**40 - 1) -> None:
        if highest < 1:
            raise ValueError(f"highest is >= 1, got {highest}")
        self._highest = highest
        self._counts = [0] * (self.bucket_index(highest) + 1)
        self._lowest = highest + 1
        self.count = 0
        self.total = 0
        self.max = 0

    @property
    def min(self) -> int:
        """The smallest value counted (0 when empty)."""
        return self._lowest if self.count else 0

    @staticmethod
    def bucket_index(value: int) -> int:
        """The bucket of ``value`` (>= 0): buckets are numbered in value order without gaps."""
        shift = value.bit_length() - _SUB_BUCKET_BITS - 1
        if shift <= 0:
            return value
        return (shift << _SUB_BUCKET_BITS) + (value >> shift)

    @staticmethod
    def bucket_bounds(index: int) -> tuple[int, int]:
        """The lowest and highest value (inclusive) of bucket ``index``."""
        if index < 2 * _SUB_BUCKETS:
            return index, index
        shift = (index >> _SUB_BUCKET_BITS) - 1
        lowest = (index - (shift << _SUB_BUCKET_BITS)) << shift
        return lowest, lowest + (1 << shift) - 1

    def record(self, value: int, count: int = 1) -> None:
        """Count ``value`` (negative values count as 0) ``count`` times."""
        # called per message: plain comparisons, no min()/max() calls
        if value > self._highest:
            value = self._highest
        elif value < 0:
            value = 0
        shift = value.bit_length() - _SUB_BUCKET_BITS - 1
        self._counts[value if shift <= 0 else (shift << _SUB_BUCKET_BITS) + (value >> shift)] += (
            count
        )
        if value > self.max:  # noqa: PLR1730
            self.max = value
        if value < self._lowest:  # noqa: PLR1730
            self._lowest = value
        self.count += count
        self.total += value * count

    def add(self, other: LatencyHistogram) -> None:
        """Add every value ``other`` counted (the histograms must have the same ``highest``)."""
        if other._highest != self._highest:
            raise ValueError("histograms of different ranges cannot be added")
        if not other.count:
            return
        self._counts = [a + b for a, b in zip(self._counts, other._counts, strict=True)]
        self._lowest = min(self._lowest, other._lowest)
        self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def percentile(self, percentile: float) -> int:
        """The nearest-rank ``percentile`` (0..100), exact to the bucket; 0 when empty."""
        return self.percentiles(percentile)[0]

    def percentiles(self, *wanted: float) -> list[int]:
        """Several percentiles in one walk over the buckets, in the order asked."""
        if not self.count:
            return [0 for _ in wanted]
        ranks = sorted((nearest_rank(p, self.count), i) for i, p in enumerate(wanted))
        out = [0] * len(wanted)
        seen = 0
        next_rank = 0
        for index, count in enumerate(self._counts):
            if not count:
                continue
            seen += count
            while next_rank < len(ranks) and ranks[next_rank][0] <= seen:
                highest = self.bucket_bounds(index)[1]
                out[ranks[next_rank][1]] = min(highest, self.max)
                next_rank += 1
            if next_rank == len(ranks):
                break
        return out


# --- the command line ----------------------------------------------------------------------------

DEFAULT_DURATION_S = 10.0
_SUBSCRIPTION_TYPES = ("exclusive", "failover", "shared", "key_shared")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _add_api_choice(
    parser: argparse.ArgumentParser, *, batch: str, alias: str | None = None
) -> None:
    """``--batch-api`` (and a mode's own alias for it) against the per-message default."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--batch-api",
        *([alias] if alias else []),
        dest="batch_api",
        action="store_true",
        help=f"measure the batch calls instead: {batch} (default: one call per message, as"
        " most programs make them)",
    )
    choice.add_argument(
        "--per-message",
        dest="batch_api",
        action="store_false",
        help="one call per message: the default, accepted for scripts that name it",
    )


def _add_common(parser: argparse.ArgumentParser, *, num_messages: bool = True) -> None:
    parser.add_argument("topic", metavar="TOPIC", help="tenant/namespace/topic, or a bare name")
    add_client_options(parser)
    if num_messages:
        parser.add_argument(
            "-n",
            "--num-messages",
            type=_positive_int,
            help="stop after this many messages (with --duration too: whichever comes first,"
            " and not reaching N is exit status 4)",
        )
    parser.add_argument(
        "-d",
        "--duration",
        type=_positive_float,
        help=f"seconds to run (default {DEFAULT_DURATION_S:g} unless --num-messages is given)",
    )
    parser.add_argument(
        "--warmup-s",
        type=_non_negative_float,
        default=0.0,
        help="run this long first without counting it: rates and latencies are over the time"
        " after it (--duration comes on top; default 0)",
    )
    parser.add_argument(
        "--operation-timeout-s",
        type=_positive_float,
        default=10.0,
        help="limit for connecting, creating producers and consumers, and for waiting on the"
        " last receipts (default 10)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress line every second on stderr"
    )
    parser.add_argument(
        "--json-progress",
        action="store_true",
        help="progress lines as JSON objects, one a second on stderr (for scripts)",
    )


def _add_producer_options(parser: argparse.ArgumentParser, *, default_rate: float) -> None:
    parser.add_argument(
        "-r",
        "--rate",
        type=_non_negative_float,
        default=default_rate,
        help=f"messages per second over all producers, 0: as fast as possible (default"
        f" {default_rate:g})",
    )
    parser.add_argument(
        "-m", "--size", type=_positive_int, default=100, help="message size in bytes (default 100)"
    )
    parser.add_argument(
        "--partitions",
        type=_positive_int,
        help="create the topic with this many partitions if it does not exist",
    )
    parser.add_argument(
        "--batch-max-messages",
        type=_positive_int,
        default=1000,
        help="a batch is sent once it holds this many messages (default 1000)",
    )
    parser.add_argument(
        "--batch-max-bytes",
        type=_positive_int,
        default=128 * 1024,
        help="... or this many bytes (default 131072)",
    )
    parser.add_argument(
        "--batch-delay-ms",
        type=_non_negative_float,
        default=1.0,
        help="... or this long after its first message (default 1)",
    )
    parser.add_argument(
        "--batch-self-clocking",
        choices=("on", "off"),
        default="on",
        help="on (default): a batch goes at once when none of its partition's partly filled"
        " batches awaits a receipt; off: every batch waits out --batch-delay-ms unless it fills",
    )
    parser.add_argument(
        "--max-pending",
        type=_positive_int,
        default=10_000,
        help="sends waiting for their receipt, at most, per producer (default 10000)",
    )


def add_perf_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    summary = "produce / consume / end-to-end load with latency percentiles"
    perf = commands.add_parser(
        "perf",
        help=summary,
        description=f"{summary}. Progress every second on stderr, the summary on stdout."
        " See docs/perf.md.",
    )
    modes = perf.add_subparsers(dest="perf_mode", metavar="MODE", required=True)

    produce = modes.add_parser(
        "produce",
        help="publish load; latency = send call -> broker receipt",
        description="Publish fixed-size messages from --producers producers, one send_async call"
        " per message (--batch-api: runs with send_many_async); per-message latency from the"
        " send call to the broker's receipt (the message is durable).",
    )
    _add_common(produce)
    _add_producer_options(produce, default_rate=0)
    _add_api_choice(
        produce,
        batch="runs of messages with send_many_async, one future and receipt per run",
        alias="--send-many",
    )
    produce.add_argument(
        "-p", "--producers", type=_positive_int, default=1, help="producers (default 1)"
    )

    consume = modes.add_parser(
        "consume",
        help="consume load; latency = now - publish timestamp (same machine clock)",
        description="Receive and acknowledge, one receive and one acknowledge call per message"
        " (--batch-api: batch_receive, one acknowledgement per batch); latency is now minus the"
        " broker's publish timestamp: two wall clocks, meaningful on one machine only.",
    )
    _add_common(consume)
    _add_api_choice(
        consume,
        batch="batch_receive, acknowledged once per batch (cumulatively for exclusive and"
        " failover subscriptions, each message for shared and key_shared)",
        alias="--batch-receive",
    )
    consume.add_argument(
        "-s",
        "--subscription",
        help="subscription name (default perf-<random>, deleted again at the end)",
    )
    consume.add_argument(
        "-t",
        "--subscription-type",
        choices=_SUBSCRIPTION_TYPES,
        default="exclusive",
        help="default exclusive",
    )
    consume.add_argument(
        "--position",
        choices=("earliest", "latest"),
        default="latest",
        help="where a new subscription starts (default latest)",
    )
    consume.add_argument(
        "--receiver-queue-size",
        type=_positive_int,
        default=1000,
        help="messages prefetched ahead of receive (default 1000)",
    )
    consume.add_argument(
        "--idle-timeout-s",
        type=_positive_float,
        default=10.0,
        help="with --num-messages: give up (exit 4) after this long without a message (default 10)",
    )

    end_to_end = modes.add_parser(
        "end-to-end",
        help="producer and consumer in one process; latency = send -> receive, one clock",
        description="One producer and one consumer (a fresh subscription at latest, deleted at"
        " the end) in this process; each payload carries its send time in its first 8 bytes."
        " send_async, receive and acknowledge per message (--batch-api: send_many_async runs,"
        " batch_receive and a cumulative acknowledgement per batch).",
    )
    _add_common(end_to_end, num_messages=False)
    _add_producer_options(end_to_end, default_rate=2000)
    _add_api_choice(
        end_to_end,
        batch="send_many_async runs, batch_receive and a cumulative acknowledgement per batch",
    )


def run_perf(args: argparse.Namespace) -> int:
    if args.perf_mode == "end-to-end" and args.size < _STAMP.size:
        print(
            f"magnetar perf end-to-end: --size is at least {_STAMP.size} (the send time travels"
            f" in the payload), got {args.size}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if getattr(args, "num_messages", None) is None and args.duration is None:
        args.duration = DEFAULT_DURATION_S
    from magnetar.common.server.gc_tuning import tune_gc_for_throughput  # noqa: PLC0415

    tune_gc_for_throughput()  # a perf process is ours: see the module for the figures
    settings = client_settings(args)  # before the run: a usage error exits here, a bad file fails
    try:
        return asyncio.run(_main(args, settings))
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being handled
        return EXIT_INTERRUPTED


# --- one run -------------------------------------------------------------------------------------

_STAMP = struct.Struct(">q")
_CHUNK = 500
"""Sends made before the send loop yields to the event loop (the streams need it to run)."""
_MB = 1_000_000


class _Meter:
    """What a run counted: messages, bytes, errors, and latencies (microseconds) of the current
    one-second interval, added to the whole run's histogram when the interval is taken."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.errors = 0
        self.error_examples: list[str] = []
        self.interval = LatencyHistogram()
        self.total = LatencyHistogram()

    def error(self, error: BaseException, count: int = 1) -> None:
        self.errors += count
        text = str(error)
        if len(self.error_examples) < 3 and text not in self.error_examples:
            self.error_examples.append(text)

    def take_interval(self) -> LatencyHistogram:
        interval, self.interval = self.interval, LatencyHistogram()
        self.total.add(interval)
        return interval

    def finish(self) -> LatencyHistogram:
        self.take_interval()
        return self.total


def latency_ms(histogram: LatencyHistogram) -> dict[str, float | None]:
    """p50 / p95 / p99 / p99.9 / max in ms, as the summary gives them (None when empty); also
    bench/pulsar_perf.py's, so that both load generators report alike."""
    keys = ("p50", "p95", "p99", "p99_9")
    if not histogram.count:
        return {**dict.fromkeys(keys), "max": None}
    values = histogram.percentiles(*REPORTED_PERCENTILES)
    out: dict[str, float | None] = {
        k: round(v / 1000, 3) for k, v in zip(keys, values, strict=True)
    }
    out["max"] = round(histogram.max / 1000, 3)
    return out


@dataclass
class _Run:
    """The state every mode shares: arguments, the stop and interrupt signals, the meter."""

    args: argparse.Namespace
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: bool = False
    started: bool = False
    """The load has started: from then on Ctrl-C ends it with a (partial) summary."""
    meter: _Meter = field(default_factory=_Meter)
    started_at: float = 0.0
    ended_at: float = 0.0
    wakeups: list[asyncio.Event] = field(default_factory=list)
    main_task: asyncio.Task[Any] | None = None
    warm_at: float | None = None
    """When the warm-up ended (None: no warm-up, or the run ended first)."""
    warm_messages: int = 0
    warm_bytes: int = 0
    other_meters: list[_Meter] = field(default_factory=list)
    """Meters whose latencies the warm-up also discards (end-to-end's publish meter)."""
    _reporter: asyncio.Task[None] | None = None
    _warmup: asyncio.TimerHandle | None = None

    @property
    def mode(self) -> str:
        return str(self.args.perf_mode)

    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(f"magnetar perf {self.mode}: {text}", file=sys.stderr, flush=True)

    def warn(self, text: str) -> None:
        print(f"magnetar perf {self.mode}: {text}", file=sys.stderr, flush=True)

    def on_interrupt(self) -> None:
        loop = asyncio.get_running_loop()
        # a second Ctrl-C raises KeyboardInterrupt at once
        loop.remove_signal_handler(signal.SIGINT)
        self.interrupted = True
        if not self.started and self.main_task is not None:
            self.main_task.cancel()  # still connecting: nothing to summarise
            return
        self.stop.set()
        for event in self.wakeups:
            event.set()

    def start_measuring(self, pending: Callable[[], int]) -> None:
        loop = asyncio.get_running_loop()
        self.started_at = loop.time()
        self.started = True
        warmup_s = getattr(self.args, "warmup_s", 0.0)
        if warmup_s > 0:
            self._warmup = loop.call_later(warmup_s, self._end_warmup)
        if not self.args.quiet:
            self._reporter = asyncio.create_task(self._report(pending), name="perf-progress")

    def _end_warmup(self) -> None:
        """From now on it counts: the latencies so far are dropped, rates start here."""
        self.warm_at = asyncio.get_running_loop().time()
        self.warm_messages = self.meter.messages
        self.warm_bytes = self.meter.bytes
        for meter in (self.meter, *self.other_meters):
            meter.interval = LatencyHistogram()
            meter.total = LatencyHistogram()

    async def stop_measuring(self, ended_at: float | None = None) -> None:
        """Stop the progress lines; the run's figures are over the time up to ``ended_at``
        (default now)."""
        if self._warmup is not None:
            self._warmup.cancel()
        self.ended_at = asyncio.get_running_loop().time() if ended_at is None else ended_at
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)

    @property
    def deadline(self) -> float:
        duration = self.args.duration
        warmup_s = getattr(self.args, "warmup_s", 0.0)
        return math.inf if duration is None else self.started_at + warmup_s + duration

    async def _report(self, pending: Callable[[], int]) -> None:
        loop = asyncio.get_running_loop()
        meter = self.meter
        last_at, last_messages, last_bytes = self.started_at, 0, 0
        tick = 1
        while True:
            await asyncio.sleep(max(0.0, self.started_at + tick - loop.time()))
            tick += 1
            now = loop.time()
            interval = meter.take_interval()
            seconds = max(now - last_at, 1e-9)
            rate = (meter.messages - last_messages) / seconds
            mb_rate = (meter.bytes - last_bytes) / seconds / _MB
            last_at, last_messages, last_bytes = now, meter.messages, meter.bytes
            p50 = p99 = 0.0
            if interval.count:
                p50, p99 = (v / 1000 for v in interval.percentiles(50, 99))
                latency = f"p50 {p50:8.3f} ms  p99 {p99:8.3f} ms"
            else:
                latency = f"p50 {'-':>8} ms  p99 {'-':>8} ms"
            errors = f"  errors {meter.errors:,}" if meter.errors else ""
            if getattr(self.args, "json_progress", False):
                line = {
                    "progress": self.mode,
                    "t_s": round(now - self.started_at, 3),
                    "warmup": self.warm_at is None and getattr(self.args, "warmup_s", 0.0) > 0,
                    "msg_per_s": round(rate, 1),
                    "mb_per_s": round(mb_rate, 3),
                    "p50_ms": p50 if interval.count else None,
                    "p99_ms": p99 if interval.count else None,
                    "pending": pending(),
                    "errors": meter.errors,
                }
                print(json.dumps(line), file=sys.stderr, flush=True)
                continue
            print(
                f"{self.mode} {now - self.started_at:6.1f} s  {rate:10,.0f} msg/s"
                f"  {mb_rate:8.2f} MB/s  {latency}  pending {pending():,}{errors}",
                file=sys.stderr,
                flush=True,
            )

    def summary(self, **extra: Any) -> dict[str, Any]:
        meter = self.meter
        histogram = meter.finish()
        measured_from = self.started_at if self.warm_at is None else self.warm_at
        duration = max(self.ended_at - measured_from, 1e-9)
        messages = meter.messages - self.warm_messages
        measured_bytes = meter.bytes - self.warm_bytes
        out: dict[str, Any] = {
            "mode": self.mode,
            "topic": self.args.topic,
            "messages": meter.messages,
            "bytes": meter.bytes,
            "duration_s": round(duration, 3),
            "msg_per_s": round(messages / duration, 1),
            "mb_per_s": round(measured_bytes / duration / _MB, 3),
            "latency_ms": latency_ms(histogram),
            "errors": meter.errors,
        }
        warmup_s = getattr(self.args, "warmup_s", 0.0)
        if warmup_s > 0:
            out["warmup_s"] = warmup_s
            out["warmup_completed"] = self.warm_at is not None
            out["measured_messages"] = messages
        out.update(extra)
        out["interrupted"] = self.interrupted
        return out


def _print_summary(run: _Run, summary: dict[str, Any], latency_meaning: str) -> None:
    if run.args.json:
        print(json.dumps(summary), flush=True)
        return
    latency = summary["latency_ms"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}"

    title = f"magnetar perf {summary['mode']} {summary['topic']}"
    if summary["interrupted"]:
        title += " (interrupted: partial figures)"
    counts = (
        f"  messages    {summary['messages']:,} in {summary['duration_s']:,.3f} s"
        f" ({summary['bytes']:,} bytes, {summary['errors']:,} errors)"
    )
    rates = f"  throughput  {summary['msg_per_s']:,.1f} msg/s  {summary['mb_per_s']:,.3f} MB/s"
    percentiles = (
        f"  latency ms  p50 {ms(latency['p50'])}  p95 {ms(latency['p95'])}"
        f"  p99 {ms(latency['p99'])}  p99.9 {ms(latency['p99_9'])}  max {ms(latency['max'])}"
    )
    lines = [title, counts, rates, percentiles, f"              ({latency_meaning})"]
    skip = {
        "mode",
        "topic",
        "messages",
        "bytes",
        "duration_s",
        "msg_per_s",
        "mb_per_s",
        "latency_ms",
        "errors",
        "interrupted",
        "latency_clock",
    }
    for key, value in summary.items():
        if key in skip:
            continue
        if key.endswith("latency_ms") and isinstance(value, dict):
            shown = "  ".join(f"{k.replace('_', '.')} {ms(v)}" for k, v in value.items())
            lines.append(f"  {key.removesuffix('_ms').replace('_', ' ')} ms  {shown}")
        else:
            lines.append(f"  {key.replace('_', ' '):<11} {value}")
    print("\n".join(lines), flush=True)


def _exit_code(run: _Run, *, reached: bool) -> int:
    meter = run.meter
    if meter.errors:
        print(
            f"magnetar perf {run.mode}: {meter.errors:,} messages failed; first errors: "
            + " | ".join(meter.error_examples),
            file=sys.stderr,
        )
    if run.interrupted:
        return EXIT_INTERRUPTED
    if meter.errors:
        return EXIT_FAILED
    return EXIT_OK if reached else EXIT_TIMEOUT


async def _main(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from magnetar.aio import Client  # noqa: PLC0415 - keep ``magnetar --help`` fast
    from magnetar.common.errors import MagnetarError  # noqa: PLC0415

    run = _Run(args)
    run.main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, run.on_interrupt)
    client: Client | None = None
    try:
        client = Client(args.service_url, operation_timeout_s=args.operation_timeout_s, **settings)
        mode = {"produce": _produce, "consume": _consume, "end-to-end": _end_to_end}[args.perf_mode]
        return await mode(run, client)
    except MagnetarError as e:
        print(f"magnetar perf {run.mode}: {error_text(e)}", file=sys.stderr)
        return EXIT_FAILED
    except asyncio.CancelledError:
        if not run.interrupted:
            raise
        print(f"magnetar perf {run.mode}: interrupted before the load started", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), args.operation_timeout_s)
            except (MagnetarError, TimeoutError) as e:
                # the figures are printed already; say why the end was not clean
                print(f"magnetar perf {run.mode}: closing the client: {e!r}", file=sys.stderr)


async def _ensure_topic(run: _Run, client: Client) -> int:
    """Create the topic with ``--partitions`` partitions if asked and it does not exist; the
    number of partitions producers will publish to."""
    from magnetar.common.errors import (  # noqa: PLC0415
        TopicAlreadyExistsError,
        TopicNotFoundError,
    )

    wanted = run.args.partitions
    if wanted is not None:
        admin = client.admin()
        try:
            try:
                existing = await admin.get_partitions(run.args.topic)
            except TopicNotFoundError:
                try:
                    await admin.create_topic(run.args.topic, wanted)
                    run.say(f"created {run.args.topic} with {wanted} partitions")
                    existing = wanted
                except TopicAlreadyExistsError:
                    existing = await admin.get_partitions(run.args.topic)
            if existing != wanted:
                run.warn(
                    f"{run.args.topic} exists already with {existing or 'no'} partitions;"
                    f" --partitions {wanted} ignored"
                )
        finally:
            await admin.close()
    return len(await client.get_topic_partitions(run.args.topic))


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s``."""
    if event.is_set():
        return True
    if timeout_s <= 0:
        return False
    try:
        async with asyncio.timeout(None if math.isinf(timeout_s) else timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class _SendLoad:
    """One producer's send loop: a token bucket for the rate, a window of pending sends."""

    def __init__(
        self,
        run: _Run,
        meter: _Meter,
        producer: Producer,
        *,
        rate: float,
        quota: int | None,
        size: int,
        max_pending: int,
        stamped: bool,
        per_message: bool = False,
    ) -> None:
        self._run = run
        self._meter = meter
        self._producer = producer
        self._rate = rate
        self._quota = quota
        self._size = size
        self._max_pending = max_pending
        self._low_water = max_pending // 2
        self._stamped = stamped
        self._per_message = per_message
        self.sent = 0
        self.in_flight = 0
        self._room = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        run.wakeups.append(self._room)

    def _on_receipt(
        self, started_ns: int, error: MagnetarError | None, _message_id: MessageId | None
    ) -> None:
        latency_ns = time.perf_counter_ns() - started_ns
        meter = self._meter
        if error is None:
            meter.messages += 1
            meter.bytes += self._size
            meter.interval.record(latency_ns // 1000)
        else:
            meter.error(error)
        self.in_flight -= 1
        if self.in_flight <= self._low_water:
            self._room.set()
            if not self.in_flight:
                self.idle.set()

    def _on_run_receipt(
        self, started_ns: int, count: int, error: MagnetarError | None, _receipt: object
    ) -> None:
        latency_ns = time.perf_counter_ns() - started_ns
        meter = self._meter
        if error is None:
            meter.messages += count
            meter.bytes += self._size * count
            meter.interval.record(latency_ns // 1000, count)
        else:
            meter.error(error, count)
        self.in_flight -= count
        if self.in_flight <= self._low_water:
            self._room.set()
            if not self.in_flight:
                self.idle.set()

    async def run(self) -> None:
        run = self._run
        loop = asyncio.get_running_loop()
        deadline = run.deadline
        send = self._producer.send_async
        send_many = self._producer.send_many_async
        on_receipt = self._on_receipt
        on_run_receipt = self._on_run_receipt
        per_message = self._per_message
        clock = time.perf_counter_ns
        stamp = _STAMP.pack
        payload = os.urandom(self._size)
        padding = payload[_STAMP.size :]
        rate = self._rate
        capacity = max(1.0, rate / 10)  # at most 100 ms of sends in one burst after a stall
        tokens = 1.0
        refilled_at = loop.time()
        quota = self._quota
        while not run.stop.is_set():
            now = loop.time()
            if now >= deadline or (quota is not None and self.sent >= quota):
                break
            room = self._max_pending - self.in_flight
            if room <= 0:
                self._room.clear()
                await _wait(self._room, deadline - now)
                continue
            count = min(room, _CHUNK)
            if quota is not None:
                count = min(count, quota - self.sent)
            if rate:
                tokens = min(capacity, tokens + (now - refilled_at) * rate)
                refilled_at = now
                if tokens < 1:
                    await asyncio.sleep(min(max((1 - tokens) / rate, 0.001), deadline - now))
                    continue
                count = min(count, int(tokens))
                tokens -= count
            self.in_flight += count
            self.sent += count
            self.idle.clear()
            if not per_message:
                # one run, one receipt: the messages of a chunk share their send time
                started = clock()
                content = stamp(started) + padding if self._stamped else payload
                send_many([content] * count, partial(on_run_receipt, started, count))
            elif self._stamped:
                for _ in range(count):
                    started = clock()
                    send(stamp(started) + padding, partial(on_receipt, started))
            else:
                for _ in range(count):
                    send(payload, partial(on_receipt, clock()))
            await asyncio.sleep(0)


async def _drain(run: _Run, loads: list[_SendLoad], timeout_s: float) -> bool:
    """Wait until every send got its receipt (or failed); cut short by Ctrl-C."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for load in loads:
        remaining = deadline - loop.time()
        if run.interrupted:
            remaining = min(remaining, 1.0)
        if not await _wait(load.idle, remaining):
            return False
    return True


def _shares(total: int | None, parts: int) -> list[int | None]:
    if total is None:
        return [None] * parts
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _send_api(args: argparse.Namespace) -> str:
    """The producer call that made the figures."""
    return "send_many_async" if args.batch_api else "send_async"


def _receive_api(args: argparse.Namespace, *, cumulative: bool) -> str:
    """The consumer calls that made the figures."""
    if not args.batch_api:
        return "receive + acknowledge"
    return f"batch_receive + {'acknowledge_cumulative' if cumulative else 'acknowledge'}"


def _producer_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "batching_max_messages": args.batch_max_messages,
        "batching_max_bytes": args.batch_max_bytes,
        "batching_max_publish_delay_ms": args.batch_delay_ms,
        "batching_self_clocking": args.batch_self_clocking == "on",
        "max_pending_messages": args.max_pending,
    }


async def _produce(run: _Run, client: Client) -> int:
    args = run.args
    partitions = await _ensure_topic(run, client)
    settings = _producer_settings(args)
    producers = [
        await client.create_producer(args.topic, **settings) for _ in range(args.producers)
    ]
    loads = [
        _SendLoad(
            run,
            run.meter,
            producer,
            rate=args.rate / args.producers,
            quota=quota,
            size=args.size,
            max_pending=args.max_pending,
            stamped=False,
            per_message=not args.batch_api,
        )
        for producer, quota in zip(
            producers, _shares(args.num_messages, args.producers), strict=True
        )
    ]
    run.start_measuring(pending=lambda: sum(load.in_flight for load in loads))
    await asyncio.gather(*(load.run() for load in loads))
    drained = await _drain(run, loads, args.operation_timeout_s + 30)
    await run.stop_measuring()
    sent = sum(load.sent for load in loads)
    unconfirmed = sum(load.in_flight for load in loads)
    summary = run.summary(
        api=_send_api(args),
        sent=sent,
        unconfirmed=unconfirmed,
        size=args.size,
        producers=args.producers,
        partitions=partitions,
        rate_target=args.rate,
        latency_clock="send call -> broker receipt, this process's monotonic clock",
    )
    _print_summary(run, summary, "send call -> broker receipt")
    if not drained and not run.interrupted:
        print(
            f"magnetar perf produce: {unconfirmed:,} messages still had no receipt after"
            f" {args.operation_timeout_s + 30:g} s",
            file=sys.stderr,
        )
        return EXIT_FAILED
    reached = args.num_messages is None or run.meter.messages >= args.num_messages
    return _exit_code(run, reached=reached)


async def _delete_subscription(run: _Run, client: Client, subscription: str) -> None:
    from magnetar.common.errors import MagnetarError  # noqa: PLC0415

    admin = client.admin()
    try:
        await admin.delete_subscription(run.args.topic, subscription)
    except MagnetarError as e:
        run.say(f"could not delete subscription {subscription!r}: {e.message}")
    finally:
        await admin.close()


async def _receive_some(consumer: Consumer, limit: int, wait_ms: int) -> list[Message]:
    """Up to ``limit`` messages already queued; when none are, the first to arrive within
    ``wait_ms`` and whatever came with it. Never waits for a batch to fill up, which would add
    the wait to every latency."""
    from magnetar.common.errors import ReceiveTimeoutError  # noqa: PLC0415

    batch = await consumer.batch_receive(max_messages=limit, timeout_millis=0)
    if batch:
        return batch
    try:
        first = await consumer.receive(timeout_millis=wait_ms)
    except ReceiveTimeoutError:
        return []
    if limit == 1:
        return [first]
    return [first, *await consumer.batch_receive(max_messages=limit - 1, timeout_millis=0)]


def _ack_batch(consumer: Consumer, batch: list[Message], *, cumulative: bool) -> Awaitable[Any]:
    if cumulative:
        last: dict[str, Message] = {}
        for message in batch:
            last[message.topic_name()] = message  # cheap: no message id per message
        return asyncio.gather(*(consumer.acknowledge_cumulative(m) for m in last.values()))
    return asyncio.gather(*(consumer.acknowledge(m) for m in batch))


@dataclass
class _Drained:
    """How a consume loop ended."""

    last_message_at: float
    timed_out: bool = False
    idle: bool = False


def _receive_timeout_ms(remaining_s: float) -> int:
    return 100 if remaining_s > 0.1 else max(1, int(remaining_s * 1000))


async def _consume_batches(run: _Run, consumer: Consumer, *, cumulative: bool) -> _Drained:
    """``--batch-api``: batch_receive, one acknowledgement (call) per batch."""
    args = run.args
    loop = asyncio.get_running_loop()
    meter = run.meter
    wanted = args.num_messages
    deadline = run.deadline
    out = _Drained(run.started_at)
    while not run.stop.is_set():
        now = loop.time()
        if now >= deadline:
            out.timed_out = wanted is not None
            break
        if wanted is not None and now - out.last_message_at >= args.idle_timeout_s:
            out.timed_out = out.idle = True
            break
        limit = 1000 if wanted is None else min(1000, wanted - meter.messages)
        batch = await _receive_some(consumer, limit, _receive_timeout_ms(deadline - now))
        if not batch:
            continue
        now_ms = time.time_ns() // 1_000_000
        record = meter.interval.record
        size = 0
        # the messages of one entry share its publish time: one record per run of them
        published, same = 0, 0
        for message in batch:
            size += len(message.data())
            publish_time_ms = message.publish_timestamp()
            if publish_time_ms == published:
                same += 1
                continue
            if same:
                record((now_ms - published) * 1000, same)
            published, same = publish_time_ms, 1
        record((now_ms - published) * 1000, same)
        meter.messages += len(batch)
        meter.bytes += size
        out.last_message_at = loop.time()
        await _ack_batch(consumer, batch, cumulative=cumulative)
        if wanted is not None and meter.messages >= wanted:
            break
    return out


async def _consume_each(run: _Run, consumer: Consumer) -> _Drained:
    """The default: ``message = await receive()``, then ``await acknowledge(message)``, one
    message at a time, as most programs consume."""
    from magnetar.common.errors import ReceiveTimeoutError  # noqa: PLC0415

    args = run.args
    loop = asyncio.get_running_loop()
    meter = run.meter
    wanted = math.inf if args.num_messages is None else args.num_messages
    idle_timeout_s = math.inf if args.num_messages is None else args.idle_timeout_s
    deadline = run.deadline
    receive = consumer.receive
    acknowledge = consumer.acknowledge
    clock = loop.time
    wall_ns = time.time_ns
    out = _Drained(run.started_at)
    while not run.stop.is_set():
        now = clock()
        if now >= deadline:
            out.timed_out = args.num_messages is not None
            break
        if now - out.last_message_at >= idle_timeout_s:
            out.timed_out = out.idle = True
            break
        try:
            message = await receive(_receive_timeout_ms(deadline - now))
        except ReceiveTimeoutError:
            continue
        # the histogram of the current second: the progress line swaps it every second
        meter.interval.record((wall_ns() // 1_000_000 - message.publish_timestamp()) * 1000)
        meter.messages += 1
        meter.bytes += len(message.data())
        out.last_message_at = clock()
        await acknowledge(message)
        if meter.messages >= wanted:
            break
    return out


async def _consume(run: _Run, client: Client) -> int:
    args = run.args
    subscription = args.subscription or f"perf-{uuid.uuid4().hex[:10]}"
    consumer = await client.subscribe(
        args.topic,
        subscription,
        args.subscription_type,
        initial_position=args.position,
        receiver_queue_size=args.receiver_queue_size,
    )
    cumulative = args.subscription_type in ("exclusive", "failover")
    meter = run.meter
    wanted = args.num_messages
    run.start_measuring(pending=lambda: len(consumer.queue))
    if args.batch_api:
        drained = await _consume_batches(run, consumer, cumulative=cumulative)
    else:
        drained = await _consume_each(run, consumer)
    # waiting in vain is not consuming: rates are over the time up to the last message
    await run.stop_measuring(drained.last_message_at if drained.idle else None)
    await consumer.close()
    if args.subscription is None:
        await _delete_subscription(run, client, subscription)
    summary = run.summary(
        api=_receive_api(args, cumulative=cumulative),
        subscription=subscription if args.subscription else f"{subscription} (deleted)",
        subscription_type=args.subscription_type,
        latency_clock="now - broker publish timestamp: two wall clocks (same machine)",
    )
    _print_summary(run, summary, "now - broker publish timestamp, wall clocks: same machine only")
    if drained.timed_out and not run.interrupted:
        print(
            f"magnetar perf consume: got {meter.messages:,} of {wanted:,} messages before"
            + (
                f" {args.idle_timeout_s:g} s passed without one"
                if drained.idle
                else " --duration ended"
            ),
            file=sys.stderr,
        )
    return _exit_code(run, reached=not drained.timed_out)


async def _end_to_end(run: _Run, client: Client) -> int:
    args = run.args
    partitions = await _ensure_topic(run, client)
    subscription = f"perf-e2e-{uuid.uuid4().hex[:10]}"
    consumer = await client.subscribe(
        args.topic, subscription, "exclusive", initial_position="latest"
    )
    producer = await client.create_producer(args.topic, **_producer_settings(args))
    publish_meter = _Meter()
    run.other_meters.append(publish_meter)
    load = _SendLoad(
        run,
        publish_meter,
        producer,
        rate=args.rate,
        quota=None,
        size=args.size,
        max_pending=args.max_pending,
        stamped=True,
        per_message=not args.batch_api,
    )
    meter = run.meter
    all_received = asyncio.Event()
    sending_done = False

    def check_all_received() -> None:
        if sending_done and load.idle.is_set() and meter.messages >= publish_meter.messages:
            all_received.set()

    async def receive_batches() -> None:
        clock = time.perf_counter_ns
        unpack = _STAMP.unpack_from
        while True:
            batch = await _receive_some(consumer, 1000, 100)
            if batch:
                now = clock()
                record = meter.interval.record
                size = 0
                for message in batch:
                    data = message.data()
                    size += len(data)
                    if len(data) >= _STAMP.size:
                        record((now - unpack(data)[0]) // 1000)
                meter.messages += len(batch)
                meter.bytes += size
                await _ack_batch(consumer, batch, cumulative=True)
            check_all_received()

    async def receive_each() -> None:
        from magnetar.common.errors import ReceiveTimeoutError  # noqa: PLC0415

        clock = time.perf_counter_ns
        unpack = _STAMP.unpack_from
        receive = consumer.receive
        acknowledge = consumer.acknowledge
        while True:
            try:
                message = await receive(100)
            except ReceiveTimeoutError:
                check_all_received()
                continue
            data = message.data()
            if len(data) >= _STAMP.size:
                meter.interval.record((clock() - unpack(data)[0]) // 1000)
            meter.messages += 1
            meter.bytes += len(data)
            await acknowledge(message)
            check_all_received()

    run.start_measuring(pending=lambda: publish_meter.messages + load.in_flight - meter.messages)
    receive = receive_batches if args.batch_api else receive_each
    receiver = asyncio.create_task(receive(), name="perf-receive")
    try:
        await load.run()
        sending_done = True
        await _drain(run, [load], args.operation_timeout_s + 30)
        check_all_received()
        run.wakeups.append(all_received)
        await _wait(all_received, 1.0 if run.interrupted else args.operation_timeout_s)
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
    await run.stop_measuring()
    await producer.close()
    await consumer.close()
    await _delete_subscription(run, client, subscription)
    publish = publish_meter.finish()
    meter.errors += publish_meter.errors
    meter.error_examples += publish_meter.error_examples
    sent = publish_meter.messages
    summary = run.summary(
        api=f"{_send_api(args)}; {_receive_api(args, cumulative=True)}",
        sent=sent,
        missing=max(0, sent - meter.messages),
        rate_target=args.rate,
        size=args.size,
        partitions=partitions,
        publish_latency_ms=latency_ms(publish),
        latency_clock="send -> receive, this process's perf_counter",
    )
    _print_summary(run, summary, "send -> receive, one clock")
    missing = sent - meter.messages
    if missing > 0 and not run.interrupted:
        print(
            f"magnetar perf end-to-end: {missing:,} of {sent:,} confirmed messages were not"
            f" received within {args.operation_timeout_s:g} s after sending stopped",
            file=sys.stderr,
        )
    return _exit_code(run, reached=missing <= 0)
