"""The pure parts of ``bench/pulsar_perf.py``, the Pulsar port's load generator: its arguments,
the producer's settings, what it prints (perf's progress objects and summary, which the suite
reads) and its send loop's window, driven by a fake producer."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pulsar
import pytest

_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
pulsar_perf: Any = importlib.import_module("pulsar_perf")
harness: Any = importlib.import_module("harness")

URL = "pulsar://127.0.0.1:6660"


def _args(*extra: str, mode: str = "produce") -> argparse.Namespace:
    args: argparse.Namespace = pulsar_perf.parse_args([mode, "t", "--service-url", URL, *extra])
    return args


def test_defaults_are_perfs_batching_limits_and_window():
    args = _args()
    assert (args.rate, args.duration, args.warmup_s, args.size) == (0.0, 10.0, 0.0, 100)
    assert pulsar_perf.producer_settings(args) == {
        "batching_enabled": True,
        "batching_max_messages": 1000,
        "batching_max_allowed_size_in_bytes": 128 * 1024,
        "batching_max_publish_delay_ms": 1,
        "max_pending_messages": 10_000,
        "block_if_queue_full": False,
    }
    assert args.receiver_queue_size == 1000
    assert pulsar_perf.api_name("produce") == "pulsar-client send_async"
    assert pulsar_perf.api_name("end-to-end") == (
        "pulsar-client send_async; message_listener + acknowledge"
    )


@pytest.mark.parametrize(
    ("extra", "mode", "named"),
    [
        (["--service-url", "magnetar://h:1"], "produce", "--service-url is a pulsar:// URL"),
        (["--rate", "-1"], "produce", "--rate is >= 0"),
        (["--rate", "nan"], "produce", "--rate is >= 0"),
        (["--duration", "0"], "produce", "--duration is > 0"),
        (["--warmup-s", "-0.5"], "produce", "--warmup-s is >= 0"),
        (["--max-pending", "0"], "produce", "--max-pending is >= 1"),
        (["--batch-delay-ms", "-1"], "produce", "--batch-delay-ms is >= 0"),
        (["--size", "7"], "end-to-end", "--size is at least 8"),
    ],
)
def test_bad_arguments_exit_2_naming_what_was_wrong(extra, mode, named, capsys):
    with pytest.raises(SystemExit) as exited:
        pulsar_perf.parse_args([mode, "t", "--service-url", URL, *extra])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_a_small_message_is_fine_when_it_carries_no_send_time():
    assert _args("--size", "1").size == 1
    with pytest.raises(SystemExit):
        pulsar_perf.parse_args(["consume", "t", "--service-url", URL])


def test_progress_objects_are_what_the_suite_reads_from_perf():
    interval = pulsar_perf.LatencyHistogram()
    for us in (1000, 2000, 3000, 4000):
        interval.record(us)
    line = pulsar_perf.progress_line(
        "end-to-end",
        t_s=2.0004,
        warmup=False,
        seconds=0.5,
        messages=1000,
        nbytes=100_000,
        interval=interval,
        pending=7,
        errors=0,
    )
    assert line["msg_per_s"] == 2000.0
    assert line["mb_per_s"] == 0.2
    # exact to the histogram's bucket: 1/128 of the value
    assert (line["p50_ms"], line["p99_ms"]) == pytest.approx((2.0, 4.0), rel=1 / 128)
    parsed = harness.parse_progress(json.dumps(line))
    assert parsed == {
        "t_s": 2.0,
        "msg_per_s": 2000.0,
        "mb_per_s": 0.2,
        "p50_ms": line["p50_ms"],
        "p99_ms": line["p99_ms"],
        "pending": 7,
        "errors": 0,
        "warmup": False,
    }
    empty = pulsar_perf.progress_line(
        "produce",
        t_s=1,
        warmup=True,
        seconds=1,
        messages=0,
        nbytes=0,
        interval=pulsar_perf.LatencyHistogram(),
        pending=0,
        errors=0,
    )
    assert (empty["p50_ms"], empty["p99_ms"], empty["warmup"]) == (None, None, True)


def test_the_summary_leaves_the_warmup_out_of_rates_and_latencies():
    args = _args("--warmup-s", "1", "--duration", "2")
    meter = pulsar_perf.Meter()
    for _ in range(500):
        meter.count(100, 900_000)  # the warm-up's: slow
    window = pulsar_perf.Window(started_at=10.0)
    window.warm_messages, window.warm_bytes = meter.reset_latencies()
    window.warm_at = 11.0
    for us in range(1, 1001):
        meter.count(100, us)
    window.ended_at = 13.0
    out = pulsar_perf.summary(args, meter, window, interrupted=False, sent=1500)
    assert harness.parse_summary(json.dumps(out)) == out
    assert out["mode"] == "produce"
    assert out["api"] == "pulsar-client send_async"
    assert out["messages"] == 1500
    assert out["measured_messages"] == 1000
    assert out["duration_s"] == 2.0
    assert out["msg_per_s"] == 500.0
    assert out["mb_per_s"] == 0.05
    assert out["latency_ms"]["p50"] == pytest.approx(0.5, rel=1 / 128)  # to the bucket
    assert out["latency_ms"]["max"] == 1.0
    assert out["warmup_completed"] is True
    assert out["sent"] == 1500
    assert out["errors"] == 0
    assert harness.summary_errors(out, "pulsar_perf") == []


def test_a_run_that_ended_in_its_warmup_is_measured_from_its_start():
    args = _args("--warmup-s", "5")
    meter = pulsar_perf.Meter()
    meter.count(100, 10)
    meter.error("ProducerQueueIsFull")
    meter.error("ProducerQueueIsFull")
    window = pulsar_perf.Window(started_at=0.0, ended_at=2.0)
    out = pulsar_perf.summary(args, meter, window, interrupted=True)
    assert out["warmup_completed"] is False
    assert out["msg_per_s"] == 0.5
    assert out["interrupted"] is True
    assert out["errors"] == 2
    assert meter.error_examples == ["ProducerQueueIsFull"]
    assert harness.summary_errors(out, "pulsar_perf") == ["2 messages failed"]


class _Producer:
    """A producer that holds every send's callback until told to confirm them."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.payloads: list[bytes] = []

    def send_async(self, content: bytes, callback: Any) -> None:
        self.payloads.append(content)
        self.callbacks.append(callback)

    def confirm(self, result: Any = pulsar.Result.Ok) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback(result, None)

    def flush(self) -> None:
        self.confirm()


def test_the_send_loop_keeps_at_most_max_pending_sends_unconfirmed():
    run = pulsar_perf.Run(_args("--max-pending", "7", "--duration", "0.2"))
    meter = pulsar_perf.Meter()
    producer = _Producer()
    sender = pulsar_perf.Sender(run, producer, meter, stamped=False)
    run.start(meter)
    sender.loop()  # nothing is confirmed: it sends the window, then waits out the duration
    assert sender.sent == 7
    assert sender.in_flight == 7
    assert not sender.idle.is_set()
    assert sender.drain(1.0)  # flush confirms them
    assert (sender.in_flight, meter.messages, meter.bytes) == (0, 7, 700)
    assert meter.take_interval().count == 7


def test_stamped_payloads_carry_their_send_time_and_failures_are_counted():
    run = pulsar_perf.Run(_args("--max-pending", "3", "--duration", "0.1", mode="end-to-end"))
    meter = pulsar_perf.Meter()
    producer = _Producer()
    sender = pulsar_perf.Sender(run, producer, meter, stamped=True)
    run.start(meter)
    sender.loop()
    stamps = [pulsar_perf.STAMP.unpack_from(p)[0] for p in producer.payloads]
    assert len(stamps) == 3
    assert stamps == sorted(stamps)
    assert all(len(p) == 100 for p in producer.payloads)
    producer.confirm(pulsar.Result.Timeout)
    assert (meter.messages, meter.errors, sender.in_flight) == (0, 3, 0)
    assert sender.idle.is_set()


def test_a_stopped_run_sends_nothing_more():
    run = pulsar_perf.Run(_args("--duration", "30"))
    run.on_interrupt(2, None)
    meter = pulsar_perf.Meter()
    sender = pulsar_perf.Sender(run, _Producer(), meter, stamped=False)
    run.start(meter)
    sender.loop()
    assert sender.sent == 0
    assert run.interrupted
