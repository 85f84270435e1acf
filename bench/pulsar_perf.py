"""Load for Magnetar's Pulsar port, driven by the real ``pulsar-client`` (PyPI, its C++ core),
measured as ``magnetar perf`` measures Magnetar's own client on the gRPC port.

Run from the repository root::

    .venv/bin/python bench/pulsar_perf.py produce TOPIC --service-url pulsar://HOST:PORT --rate 0
    .venv/bin/python bench/pulsar_perf.py end-to-end TOPIC --service-url pulsar://HOST:PORT \\
        --rate 2000 --duration 20

Two modes, as perf's:

- ``produce``: one producer, ``send_async`` per message with a callback, as fast as allowed
  (``--rate 0``) or at a fixed rate (a token bucket), at most ``--max-pending`` sends awaiting
  their receipt. Latency per message: the send call -> the callback of its receipt.
- ``end-to-end``: one producer as above and one consumer in this process; the consumer's message
  listener (a thread of the C++ client) acknowledges every message. Each payload carries its
  send time (``time.perf_counter_ns`` in its first 8 bytes, big-endian, as perf stamps it), so
  the latency is send call -> the listener's call, on one clock.

The producer batches as perf's does by default: up to 1,000 messages / 128 KiB / 1 ms a batch
(Pulsar's client waits 10 ms by default), at most 10,000 sends pending; it has no self-clocking
(a batch waits out its delay unless it fills), which Magnetar's client has. The consumer's
receiver queue is the client's default, 1,000 messages, as perf's.

The client runs its own threads (I/O, the listener); this script's main thread sends, and calls
back into Python from them take the GIL. What it prints is what ``magnetar perf --json
--json-progress`` prints: a JSON object a second on stderr (``progress``, ``t_s``, ``warmup``,
``msg_per_s``, ``mb_per_s``, ``p50_ms``, ``p99_ms``, ``pending``, ``errors``) and the summary as
one JSON line on stdout (``mode``, ``api``, ``messages``, ``msg_per_s``, ``latency_ms``, ...), so
``bench/suite.py`` reads it as it reads a perf run (the ``pulsar-*`` workloads). Without
``--json`` the summary is printed as JSON too, indented. Exit status 0, 1 if a message failed or
was not received, 2 for bad arguments, 130 when interrupted (Ctrl-C or SIGINT: the figures so
far are printed first).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

# the repository's own code, whichever checkout the interpreter's environment points at
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from magnetar.cli.perf import LatencyHistogram, latency_ms  # noqa: E402

MODES = ("produce", "end-to-end")
STAMP = struct.Struct(">q")
"""The send time in the first bytes of an end-to-end payload (as ``magnetar perf`` writes it)."""
CHUNK = 500
"""Sends made before the send loop looks at the clock and the window again (as perf's)."""
MB = 1_000_000
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
CLIENT = "pulsar-client"


# --- the command line -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; a bad value exits with status 2 and a message naming it."""
    parser = argparse.ArgumentParser(
        prog="pulsar_perf.py",
        description=(
            "Load for Magnetar's Pulsar port with the real pulsar-client: produce (send_async per"
            " message) or end-to-end (send_async; a message listener acknowledging each"
            " message), measured and printed as `magnetar perf --json --json-progress` does."
        ),
    )
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("topic", metavar="TOPIC", help="tenant/namespace/topic, or a bare name")
    parser.add_argument(
        "--service-url", required=True, help="the Pulsar listener, pulsar://HOST:PORT"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="messages per second, 0: as fast as possible (default 0)",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="run this long first without counting it (--duration comes on top; default 0)",
    )
    parser.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    parser.add_argument("--batch-max-messages", type=int, default=1000)
    parser.add_argument("--batch-max-bytes", type=int, default=128 * 1024)
    parser.add_argument("--batch-delay-ms", type=int, default=1)
    parser.add_argument(
        "--max-pending",
        type=int,
        default=10_000,
        help="sends awaiting their receipt, at most (default 10000)",
    )
    parser.add_argument(
        "--receiver-queue-size", type=int, default=1000, help="the consumer's (default 1000)"
    )
    parser.add_argument(
        "--operation-timeout-s",
        type=float,
        default=30.0,
        help="limit for connecting and for the last receipts and deliveries (default 30)",
    )
    parser.add_argument("--json", action="store_true", help="the summary as one JSON line")
    parser.add_argument(
        "--json-progress", action="store_true", help="a JSON progress object a second on stderr"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None."""
    if not args.service_url.startswith("pulsar://"):
        return f"--service-url is a pulsar:// URL (the Pulsar listener), got {args.service_url!r}"
    if not math.isfinite(args.rate) or args.rate < 0:
        return f"--rate is >= 0 (0: as fast as possible), got {args.rate:g}"
    if not math.isfinite(args.duration) or args.duration <= 0:
        return f"--duration is > 0 seconds, got {args.duration:g}"
    if not math.isfinite(args.warmup_s) or args.warmup_s < 0:
        return f"--warmup-s is >= 0 seconds, got {args.warmup_s:g}"
    if args.operation_timeout_s <= 0:
        return f"--operation-timeout-s is > 0, got {args.operation_timeout_s:g}"
    positive = (
        "size",
        "batch_max_messages",
        "batch_max_bytes",
        "max_pending",
        "receiver_queue_size",
    )
    for name in positive:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} is >= 1, got {getattr(args, name)}"
    if args.batch_delay_ms < 0:
        return f"--batch-delay-ms is >= 0, got {args.batch_delay_ms}"
    if args.mode == "end-to-end" and args.size < STAMP.size:
        return f"end-to-end: --size is at least {STAMP.size} (the send time), got {args.size}"
    return None


def producer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``pulsar.Client.create_producer`` keywords: batching on, perf's default limits. The
    script keeps its own window of ``--max-pending`` sends, so the client's queue (as large)
    never fills and a send never blocks in it."""
    return {
        "batching_enabled": True,
        "batching_max_messages": args.batch_max_messages,
        "batching_max_allowed_size_in_bytes": args.batch_max_bytes,
        "batching_max_publish_delay_ms": args.batch_delay_ms,
        "max_pending_messages": args.max_pending,
        "block_if_queue_full": False,
    }


def api_name(mode: str) -> str:
    """The client calls behind the figures, as a summary names them (``api``)."""
    send = f"{CLIENT} send_async"
    return send if mode == "produce" else f"{send}; message_listener + acknowledge"


# --- counting -------------------------------------------------------------------------------------


class Meter:
    """Messages, bytes, errors and latencies (microseconds), counted from the client's threads
    under one lock; the latencies of the current second apart until ``take_interval``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages = 0
        self.bytes = 0
        self.errors = 0
        self.error_examples: list[str] = []
        self.interval = LatencyHistogram()
        self.total = LatencyHistogram()

    def count(self, nbytes: int, latency_us: int | None) -> None:
        with self.lock:
            self.messages += 1
            self.bytes += nbytes
            if latency_us is not None:
                self.interval.record(latency_us)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors += 1
            if len(self.error_examples) < 3 and text not in self.error_examples:
                self.error_examples.append(text)

    def take_interval(self) -> LatencyHistogram:
        with self.lock:
            interval, self.interval = self.interval, LatencyHistogram()
            self.total.add(interval)
            return interval

    def reset_latencies(self) -> tuple[int, int]:
        """Drop the latencies so far (the warm-up's): the messages and bytes counted by then."""
        with self.lock:
            self.interval = LatencyHistogram()
            self.total = LatencyHistogram()
            return self.messages, self.bytes


def progress_line(
    mode: str,
    *,
    t_s: float,
    warmup: bool,
    seconds: float,
    messages: int,
    nbytes: int,
    interval: LatencyHistogram,
    pending: int,
    errors: int,
) -> dict[str, Any]:
    """One second's progress object, as ``magnetar perf --json-progress`` prints it."""
    seconds = max(seconds, 1e-9)
    p50 = p99 = None
    if interval.count:
        p50, p99 = (v / 1000 for v in interval.percentiles(50, 99))
    return {
        "progress": mode,
        "t_s": round(t_s, 3),
        "warmup": warmup,
        "msg_per_s": round(messages / seconds, 1),
        "mb_per_s": round(nbytes / seconds / MB, 3),
        "p50_ms": p50,
        "p99_ms": p99,
        "pending": pending,
        "errors": errors,
    }


@dataclass
class Window:
    """The measured window: messages and bytes counted before it (the warm-up's) are left out of
    the rates, and the time runs from the end of the warm-up (or the start) to ``ended_at``."""

    started_at: float
    warm_at: float | None = None
    warm_messages: int = 0
    warm_bytes: int = 0
    ended_at: float = 0.0


def summary(
    args: argparse.Namespace,
    meter: Meter,
    window: Window,
    *,
    interrupted: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The run's summary, in ``magnetar perf``'s keys (its ``--json`` line)."""
    meter.take_interval()  # the last partial second joins the whole run's histogram
    histogram = meter.total
    measured_from = window.started_at if window.warm_at is None else window.warm_at
    duration = max(window.ended_at - measured_from, 1e-9)
    messages = meter.messages - window.warm_messages
    measured_bytes = meter.bytes - window.warm_bytes
    out: dict[str, Any] = {
        "mode": args.mode,
        "topic": args.topic,
        "client": CLIENT,
        "api": api_name(args.mode),
        "messages": meter.messages,
        "bytes": meter.bytes,
        "duration_s": round(duration, 3),
        "msg_per_s": round(messages / duration, 1),
        "mb_per_s": round(measured_bytes / duration / MB, 3),
        "latency_ms": latency_ms(histogram),
        "errors": meter.errors,
    }
    if args.warmup_s > 0:
        out["warmup_s"] = args.warmup_s
        out["warmup_completed"] = window.warm_at is not None
        out["measured_messages"] = messages
    out.update(extra)
    out["rate_target"] = args.rate
    out["size"] = args.size
    out["producer_settings"] = producer_settings(args)
    out["interrupted"] = interrupted
    return out


# --- the load -------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the threads share: the arguments, the stop signal, the window."""

    args: argparse.Namespace
    stop: threading.Event = field(default_factory=threading.Event)
    interrupted: bool = False
    window: Window = field(default_factory=lambda: Window(time.monotonic()))
    meters: list[Meter] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        measured_s: float = self.args.warmup_s + self.args.duration
        return self.window.started_at + measured_s

    def on_interrupt(self, _signum: int, _frame: FrameType | None) -> None:
        self.interrupted = True
        self.stop.set()

    def start(self, main: Meter) -> None:
        self.window.started_at = time.monotonic()
        if self.args.warmup_s <= 0:
            return

        def end_warmup() -> None:
            self.window.warm_messages, self.window.warm_bytes = main.reset_latencies()
            for meter in self.meters:
                if meter is not main:
                    meter.reset_latencies()
            self.window.warm_at = time.monotonic()

        timer = threading.Timer(self.args.warmup_s, end_warmup)
        timer.daemon = True
        timer.start()


class Sender:
    """One producer's send loop in the calling thread: a token bucket for ``--rate``, a window
    of ``--max-pending`` sends awaiting their receipt (the callback runs on a client thread)."""

    def __init__(self, run: Run, producer: Any, meter: Meter, *, stamped: bool) -> None:
        self.run = run
        self.producer = producer
        self.meter = meter
        self.stamped = stamped
        self.sent = 0
        self.done = 0
        self.room = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self._low_water = run.args.max_pending // 2

    @property
    def in_flight(self) -> int:
        return self.sent - self.done

    def _on_receipt(self, started_ns: int, result: Any, _message_id: Any) -> None:
        import pulsar  # noqa: PLC0415 - loaded already; a callback must not raise

        latency_us = (time.perf_counter_ns() - started_ns) // 1000
        meter = self.meter
        if result != pulsar.Result.Ok:
            meter.error(str(result))
        with meter.lock:
            if result == pulsar.Result.Ok:
                meter.messages += 1
                meter.bytes += self.run.args.size
                meter.interval.record(latency_us)
            self.done += 1
            left = self.sent - self.done
        if left <= self._low_water:
            self.room.set()
            if not left:
                self.idle.set()

    def loop(self) -> None:
        run = self.run
        args = run.args
        clock = time.perf_counter_ns
        stamp = STAMP.pack
        payload = os.urandom(args.size)
        padding = payload[STAMP.size :]
        send = self.producer.send_async
        on_receipt = self._on_receipt
        rate = args.rate
        capacity = max(1.0, rate / 10)  # at most 100 ms of sends in one burst after a stall
        tokens = 1.0
        refilled_at = time.monotonic()
        deadline = run.deadline
        while not run.stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                break
            room = args.max_pending - self.in_flight
            if room <= 0:
                self.room.clear()
                if self.in_flight >= args.max_pending:  # a receipt may have come meanwhile
                    self.room.wait(min(0.1, deadline - now))
                continue
            count = min(room, CHUNK)
            if rate:
                tokens = min(capacity, tokens + (now - refilled_at) * rate)
                refilled_at = now
                if tokens < 1:
                    time.sleep(min(max((1 - tokens) / rate, 0.001), deadline - now))
                    continue
                count = min(count, int(tokens))
                tokens -= count
            with self.meter.lock:
                self.sent += count
            self.idle.clear()
            for _ in range(count):
                started = clock()
                content = stamp(started) + padding if self.stamped else payload
                send(content, functools.partial(on_receipt, started))
            time.sleep(0)  # let the client's threads take the GIL for their callbacks

    def drain(self, timeout_s: float) -> bool:
        """Wait for every receipt (or failure); the producer's batch is flushed first."""
        self.producer.flush()
        return self.idle.wait(timeout_s)


def report_progress(run: Run, meter: Meter, pending: Callable[[], int]) -> None:
    """A progress object a second on stderr, from the start, until the run stops."""
    window = run.window
    last_at, last_messages, last_bytes = window.started_at, 0, 0
    tick = 1
    while not run.stop.wait(max(0.0, window.started_at + tick - time.monotonic())):
        tick += 1
        now = time.monotonic()
        interval = meter.take_interval()
        messages, nbytes = meter.messages, meter.bytes
        line = progress_line(
            run.args.mode,
            t_s=now - window.started_at,
            warmup=window.warm_at is None and run.args.warmup_s > 0,
            seconds=now - last_at,
            messages=messages - last_messages,
            nbytes=nbytes - last_bytes,
            interval=interval,
            pending=pending(),
            errors=meter.errors,
        )
        last_at, last_messages, last_bytes = now, messages, nbytes
        if run.args.json_progress:
            print(json.dumps(line), file=sys.stderr, flush=True)
        else:
            print(
                f"{line['progress']} {line['t_s']:6.1f} s {line['msg_per_s']:10,.0f} msg/s"
                f"  p50 {line['p50_ms']} ms  p99 {line['p99_ms']} ms  pending {line['pending']:,}",
                file=sys.stderr,
                flush=True,
            )


def _start_reporter(run: Run, meter: Meter, pending: Callable[[], int]) -> threading.Thread:
    thread = threading.Thread(
        target=report_progress, args=(run, meter, pending), name="progress", daemon=True
    )
    if not run.args.quiet:
        thread.start()
    return thread


def _stop(run: Run, reporter: threading.Thread) -> None:
    run.window.ended_at = time.monotonic()
    run.stop.set()
    if reporter.is_alive():
        reporter.join()


def produce(run: Run, client: Any) -> tuple[dict[str, Any], bool]:
    args = run.args
    meter = Meter()
    run.meters.append(meter)
    producer = client.create_producer(args.topic, **producer_settings(args))
    sender = Sender(run, producer, meter, stamped=False)
    run.start(meter)
    reporter = _start_reporter(run, meter, lambda: sender.in_flight)
    sender.loop()
    drained = sender.drain(1.0 if run.interrupted else args.operation_timeout_s)
    _stop(run, reporter)
    producer.close()
    out = summary(
        args,
        meter,
        run.window,
        interrupted=run.interrupted,
        sent=sender.sent,
        unconfirmed=sender.in_flight,
        latency_clock="send call -> receipt callback, this process's perf_counter",
    )
    return out, drained and not meter.errors


def end_to_end(run: Run, client: Any) -> tuple[dict[str, Any], bool]:
    import pulsar  # noqa: PLC0415

    args = run.args
    meter = Meter()
    publish = Meter()
    run.meters += [meter, publish]
    unpack = STAMP.unpack_from
    clock = time.perf_counter_ns

    def on_message(consumer: Any, message: Any) -> None:
        data = message.data()
        latency_us = None
        if len(data) >= STAMP.size:
            latency_us = (clock() - unpack(data)[0]) // 1000
        meter.count(len(data), latency_us)
        consumer.acknowledge(message)

    consumer = client.subscribe(
        args.topic,
        f"pulsar-perf-e2e-{uuid.uuid4().hex[:10]}",
        consumer_type=pulsar.ConsumerType.Exclusive,
        message_listener=on_message,
        receiver_queue_size=args.receiver_queue_size,
        initial_position=pulsar.InitialPosition.Latest,
    )
    producer = client.create_producer(args.topic, **producer_settings(args))
    sender = Sender(run, producer, publish, stamped=True)
    run.start(meter)
    reporter = _start_reporter(
        run, meter, lambda: publish.messages + sender.in_flight - meter.messages
    )
    sender.loop()
    wait_s = 1.0 if run.interrupted else args.operation_timeout_s
    sender.drain(wait_s)
    give_up = time.monotonic() + wait_s
    while meter.messages < publish.messages and time.monotonic() < give_up:
        time.sleep(0.01)
    _stop(run, reporter)
    producer.close()
    consumer.unsubscribe()
    consumer.close()
    missing = max(0, publish.messages - meter.messages)
    publish.take_interval()
    publish_histogram = publish.total
    out = summary(
        args,
        meter,
        run.window,
        interrupted=run.interrupted,
        sent=publish.messages,
        missing=missing,
        publish_latency_ms=latency_ms(publish_histogram),
        latency_clock="send call -> message listener, this process's perf_counter",
    )
    out["errors"] += publish.errors
    meter.error_examples += publish.error_examples
    if missing and not run.interrupted:
        print(
            f"pulsar_perf.py end-to-end: {missing:,} of {publish.messages:,} confirmed messages"
            f" were not received within {wait_s:g} s after sending stopped",
            file=sys.stderr,
        )
    return out, not missing and not out["errors"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import pulsar  # noqa: PLC0415 - the real client, loaded once the arguments are good

    run = Run(args)
    signal.signal(signal.SIGINT, run.on_interrupt)
    client = pulsar.Client(
        args.service_url,
        operation_timeout_seconds=max(1, math.ceil(args.operation_timeout_s)),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        load = produce if args.mode == "produce" else end_to_end
        out, ok = load(run, client)
    except pulsar.PulsarException as e:
        print(f"pulsar_perf.py {args.mode}: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        client.close()
    examples = [m.error_examples for m in run.meters]
    if out["errors"]:
        first = [text for texts in examples for text in texts][:3]
        print(
            f"pulsar_perf.py {args.mode}: {out['errors']:,} messages failed; first errors: "
            + " | ".join(first),
            file=sys.stderr,
        )
    print(json.dumps(out) if args.json else json.dumps(out, indent=2), flush=True)
    if run.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
