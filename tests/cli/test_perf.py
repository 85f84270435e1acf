"""``magnetar perf`` as a user runs it: a real standalone, the command as a subprocess.

Figures are never asserted (no rates, no latency targets): only counts, the shape of the
summary, exit codes, and that latencies are ordered and no longer than the run itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from magnetar.aio.admin import AdminClient
from magnetar.testing import StandaloneNode

pytestmark = pytest.mark.asyncio(loop_scope="module")

LATENCY_KEYS = {"p50", "p95", "p99", "p99_9", "max"}
ENV = {**os.environ, "GRPC_VERBOSITY": "ERROR"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("perf") / "data") as node:
        yield node


async def start_perf(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        "perf",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )


async def perf(*args: str, timeout_s: float = 100) -> tuple[int, str, str]:
    process = await start_perf(*args)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def one_json_line(out: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    summary = json.loads(lines[0])
    assert isinstance(summary, dict)
    return summary


def check_latency(latency: dict[str, float], *, within_ms: float) -> None:
    assert set(latency) == LATENCY_KEYS
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["p99_9"]
    assert latency["p99_9"] <= latency["max"] <= within_ms


def topic() -> str:
    return f"perf-{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def produced(node: StandaloneNode) -> tuple[str, dict[str, Any], float]:
    """20,000 messages published by ``perf produce``: the topic, the summary, the wall time."""
    name = topic()
    started = time.monotonic()
    code, out, err = await perf(
        "produce", name, "--service-url", node.service_url, "--num-messages", "20000", "--json"
    )
    assert code == 0, err
    return name, one_json_line(out), (time.monotonic() - started) * 1000


async def test_produce_sends_exactly_the_messages_asked_for(
    produced: tuple[str, dict[str, Any], float],
) -> None:
    name, summary, wall_ms = produced
    assert summary["mode"] == "produce"
    assert summary["api"] == "send_async"  # the per-message call is the default
    assert summary["topic"] == name
    assert summary["messages"] == 20000
    assert summary["bytes"] == 20000 * 100
    assert summary["errors"] == 0
    assert summary["interrupted"] is False
    assert summary["duration_s"] > 0
    assert summary["msg_per_s"] > 0
    assert summary["mb_per_s"] > 0
    check_latency(summary["latency_ms"], within_ms=wall_ms)


async def test_consume_from_earliest_gets_every_produced_message(
    node: StandaloneNode, produced: tuple[str, dict[str, Any], float]
) -> None:
    name = produced[0]
    code, out, err = await perf(
        "consume",
        name,
        "--service-url",
        node.service_url,
        "--position",
        "earliest",
        "--num-messages",
        "20000",
        "--json",
    )
    assert code == 0, err
    summary = one_json_line(out)
    assert summary["mode"] == "consume"
    assert summary["api"] == "receive + acknowledge"
    assert summary["messages"] == 20000
    assert summary["bytes"] == 20000 * 100
    assert summary["errors"] == 0
    assert set(summary["latency_ms"]) == LATENCY_KEYS
    assert summary["subscription"].endswith("(deleted)")


async def test_consume_of_more_than_there_is_times_out_with_status_4(
    node: StandaloneNode, produced: tuple[str, dict[str, Any], float]
) -> None:
    code, out, err = await perf(
        "consume",
        produced[0],
        "--service-url",
        node.service_url,
        "--position",
        "earliest",
        "--num-messages",
        "20001",
        "--idle-timeout-s",
        "1",
        "--json",
        "--quiet",
    )
    assert code == 4, err
    assert one_json_line(out)["messages"] == 20000
    assert "got 20,000 of 20,001 messages" in err


async def test_end_to_end_receives_what_it_sent(node: StandaloneNode) -> None:
    started = time.monotonic()
    code, out, err = await perf(
        "end-to-end",
        topic(),
        "--service-url",
        node.service_url,
        "--rate",
        "500",
        "--duration",
        "3",
        "--json",
    )
    wall_ms = (time.monotonic() - started) * 1000
    assert code == 0, err
    summary = one_json_line(out)
    assert summary["mode"] == "end-to-end"
    assert summary["api"] == "send_async; receive + acknowledge"
    assert summary["sent"] > 0
    assert summary["messages"] == summary["sent"]
    assert summary["missing"] == 0
    assert summary["errors"] == 0
    check_latency(summary["latency_ms"], within_ms=wall_ms)
    check_latency(summary["publish_latency_ms"], within_ms=wall_ms)
    assert summary["latency_ms"]["p50"] > 0
    assert "end-to-end" in err  # progress lines


async def test_warmup_is_left_out_and_json_progress_is_one_object_a_second(
    node: StandaloneNode,
) -> None:
    code, out, err = await perf(
        "end-to-end",
        topic(),
        "--service-url",
        node.service_url,
        "--rate",
        "500",
        "--warmup-s",
        "1.5",
        "--duration",
        "2",
        "--json",
        "--json-progress",
        "--batch-api",
    )
    assert code == 0, err
    summary = one_json_line(out)
    assert summary["api"] == "send_many_async; batch_receive + acknowledge_cumulative"
    assert summary["warmup_s"] == 1.5
    assert summary["warmup_completed"] is True
    # every message counts as sent and received; the rate is over the 2 s after the warm-up
    assert summary["messages"] == summary["sent"] > summary["measured_messages"] > 0
    # the rate is the measured messages over the measured window (no clock in the check)
    measured_rate = summary["measured_messages"] / summary["duration_s"]
    assert summary["msg_per_s"] == pytest.approx(measured_rate, rel=0.01)
    progress = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(progress) >= 2
    assert progress[0]["progress"] == "end-to-end"
    assert progress[0]["warmup"] is True
    assert progress[-1]["warmup"] is False
    assert {"t_s", "msg_per_s", "mb_per_s", "p50_ms", "p99_ms", "pending", "errors"} <= set(
        progress[-1]
    )


async def test_batch_api_sends_runs_and_drains_in_batches_and_says_so(
    node: StandaloneNode,
) -> None:
    name = topic()
    code, out, err = await perf(
        "produce", name, "--service-url", node.service_url, "-n", "5000", "--batch-api", "--json"
    )
    assert code == 0, err
    summary = one_json_line(out)
    assert summary["api"] == "send_many_async"
    assert summary["messages"] == 5000
    # shared subscriptions cannot acknowledge cumulatively: each message is acknowledged
    for subscription_type, api in (
        ("exclusive", "batch_receive + acknowledge_cumulative"),
        ("shared", "batch_receive + acknowledge"),
    ):
        code, out, err = await perf(
            "consume",
            name,
            "--service-url",
            node.service_url,
            "--position",
            "earliest",
            "-t",
            subscription_type,
            "-n",
            "5000",
            "--batch-receive",
            "--json",
        )
        assert code == 0, err
        summary = one_json_line(out)
        assert summary["api"] == api
        assert summary["messages"] == 5000
        assert summary["errors"] == 0
    # the human summary names the call too
    code, out, err = await perf(
        "produce", name, "--service-url", node.service_url, "-n", "10", "--quiet"
    )
    assert code == 0, err
    assert "  api         send_async\n" in out


async def test_batch_api_and_per_message_together_are_a_usage_error() -> None:
    code, out, err = await perf("produce", "t", "--batch-api", "--per-message")
    assert code == 2
    assert out == ""
    assert "not allowed with argument" in err


async def test_partitions_creates_a_partitioned_topic(node: StandaloneNode) -> None:
    name = topic()
    code, out, err = await perf(
        "produce",
        name,
        "--service-url",
        node.service_url,
        "--partitions",
        "3",
        "--producers",
        "2",
        "--num-messages",
        "3001",
        "--json",
    )
    assert code == 0, err
    summary = one_json_line(out)
    assert summary["partitions"] == 3
    assert summary["messages"] == 3001
    admin = AdminClient(node.service_url)
    try:
        assert await admin.get_partitions(name) == 3
    finally:
        await admin.close()
    # a second run uses the topic as it is, and says so
    code, out, err = await perf(
        "produce",
        name,
        "--service-url",
        node.service_url,
        "--partitions",
        "5",
        "-n",
        "10",
        "--quiet",
    )
    assert code == 0, err
    assert "exists already with 3 partitions" in err
    assert "messages    10 in" in out


async def test_unreachable_service_url_fails_with_status_1() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"magnetar://127.0.0.1:{port}"
    code, out, err = await perf(
        "produce", "t", "--service-url", url, "--operation-timeout-s", "1", "-n", "10"
    )
    assert code == 1
    assert out == ""
    assert err.startswith("magnetar perf produce: ")
    assert f"127.0.0.1:{port}" in err
    assert "Traceback" not in err


async def test_ctrl_c_prints_the_partial_summary_and_exits_130(node: StandaloneNode) -> None:
    process = await start_perf(
        "produce", topic(), "--service-url", node.service_url, "--rate", "200", "--json"
    )
    assert process.stderr is not None
    try:
        # the first progress line: the load is running
        line = await asyncio.wait_for(process.stderr.readline(), 60)
        assert line.startswith(b"produce "), line
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 130, err
    summary = one_json_line(out.decode())
    assert summary["interrupted"] is True
    assert summary["messages"] > 0
    assert summary["errors"] == 0
