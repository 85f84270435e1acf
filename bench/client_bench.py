"""Client benchmark: the calls users write, one per message, against the batch calls, with the
sync client (``magnetar.Client``) and the asyncio one (``magnetar.aio``), on one ``magnetar
standalone``, and Redis Streams (``appendfsync always``) measured on the same machine in the
same run.

Run from the repository root::

    .venv/bin/python bench/client_bench.py            # full run, 200,000 messages a pattern
    .venv/bin/python bench/client_bench.py --quick    # smoke test, about two minutes

Every figure is labelled with the exact client call that produced it: ``send_async(msg,
callback)`` in a loop, ``msg = receive(); acknowledge(msg)``, ``send_many``, ``batch_receive``
and so on (see ``PATTERNS``). Each pattern runs in a fresh client process of its own (this
script with ``--worker``), so one pattern's heap and threads never weigh on the next; the
backlogs the receive patterns drain are filled beforehand with ``send_many_async`` and not
timed. Patterns are interleaved in rounds (the order rotated each round), so drift on the shared
machine hits every pattern alike; each figure is the median of the rounds, with its spread, and
each ratio is taken within a round, then its median.

The ratios are the targets of issue 22: each per-message call at least 0.40 of the best batch
call of its direction (send: the best ``send_many``; receive: the best ``batch_receive`` drain),
and, a moonshot, the sync ``send_async`` loop 10x Redis Streams driven from Python (redis-py,
1,000 pipelined XADDs a round trip, the server fsyncing every write). Redis needs
``redis-server`` (Debian) and ``redis`` (PyPI) in this venv; the setup step installs both when
missing (``--no-install``: it does not, and Redis is skipped with a note saying so).

It writes ``bench/results/client-<date>.json`` (every run) and ``client-<date>.md`` (the tables,
the ratios and the targets' verdicts); ``--quick`` writes ``client-<date>-quick.*``. See
bench/README.md ("Client calls"). Compare within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# harness.py sits next to this script, so it is importable when it is run as
# ``python bench/client_bench.py``: machine details, CPU accounting and the results harness.
from harness import (
    KEEP_DATA_HELP,
    REPO,
    add_output_options,
    add_quick_and_tag,
    all_ok,
    bench_main,
    bench_parser,
    failed_runs_section,
    free_port,
    log_tail,
    machine_cpu_seconds,
    machine_info,
    percentile,
    proc_cpu_seconds,
    quiet_logs,
    report_head,
    report_text,
    results_head,
    spread,
    spread_cell,
    stop_process,
)

# --- targets (reported with PASS / FAIL, never asserted) ------------------------------------------

PER_MESSAGE_MIN_RATIO = 0.40
"""A per-message call: at least this share of the best batch call of the same direction."""
REDIS_MOONSHOT_RATIO = 10.0
"""The sync ``send_async`` loop against Redis Streams (appendfsync always): this many times."""

MESSAGE_BYTES = 100
BATCH = 1_000
"""Messages per ``send_many`` / ``batch_receive`` call, and XADDs per Redis pipeline."""
SUBSCRIPTION = "bench"
READY_TIMEOUT_S = 180.0
"""How long ``magnetar standalone`` (or redis-server) may take to say it is ready."""
WORKER_MIN_RATE = 1_000
"""A worker is given as long as its messages would take at this many per second, plus a margin."""
WORKER_MARGIN_S = 90.0
WORKER_SCRIPT = str(Path(__file__).resolve())
REDIS_PY = "redis==8.1.0"
"""The Redis client installed into the venv by the setup step: for this benchmark only."""
TAIL_LINES = 30

# --- patterns -------------------------------------------------------------------------------------

SYNC, AIO, REDIS = "sync", "asyncio", "redis"
SEND, RECEIVE, LATENCY = "send", "receive", "latency"


@dataclass(frozen=True, slots=True)
class Pattern:
    """One way of sending or receiving, as a program writes it.

    ``call`` is the code the worker runs (and the label every figure carries); ``batch`` says
    whether it is a batch call (a denominator of the ratios) or one call per message.
    """

    key: str
    client: str
    direction: str
    call: str
    batch: bool = False

    @property
    def name(self) -> str:
        return f"{self.client}: {self.call}"


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "sync-send-async",
        SYNC,
        SEND,
        "producer.send_async(msg, callback) per message, then producer.flush()",
    ),
    Pattern("sync-send", SYNC, LATENCY, "producer.send(msg), one at a time"),
    Pattern(
        "sync-send-many", SYNC, SEND, f"producer.send_many(msgs), {BATCH:,} per call", batch=True
    ),
    Pattern(
        "sync-receive-ack", SYNC, RECEIVE, "msg = consumer.receive(); consumer.acknowledge(msg)"
    ),
    Pattern(
        "sync-batch-receive-ack",
        SYNC,
        RECEIVE,
        f"consumer.batch_receive({BATCH:,}), then consumer.acknowledge(msg) for each",
        batch=True,
    ),
    Pattern(
        "sync-listener",
        SYNC,
        RECEIVE,
        "client.subscribe(..., message_listener=fn); fn(consumer, msg) calls"
        " consumer.acknowledge(msg)",
    ),
    Pattern(
        "aio-send-async",
        AIO,
        SEND,
        "producer.send_async(msg, callback) per message (awaiting room while not"
        " producer.has_room()), then await producer.flush()",
    ),
    Pattern(
        "aio-send-many-async",
        AIO,
        SEND,
        f"producer.send_many_async(msgs, callback), {BATCH:,} per call, pipelined up to"
        " max_pending_messages",
        batch=True,
    ),
    Pattern(
        "aio-receive-ack",
        AIO,
        RECEIVE,
        "msg = await consumer.receive(); await consumer.acknowledge(msg)",
    ),
    Pattern(
        "aio-batch-receive-ack",
        AIO,
        RECEIVE,
        f"await consumer.batch_receive({BATCH:,}), then await consumer.acknowledge(msg) for each",
        batch=True,
    ),
    Pattern(
        "redis-xadd",
        REDIS,
        SEND,
        f"redis-py pipeline(transaction=False): {BATCH:,} XADDs per execute(), server with"
        " appendfsync always",
        batch=True,
    ),
)
PATTERN_BY_KEY = {p.key: p for p in PATTERNS}

SEND_MANY_KEYS = ("sync-send-many", "aio-send-many-async")
BATCH_DRAIN_KEYS = ("sync-batch-receive-ack", "aio-batch-receive-ack")


@dataclass(frozen=True, slots=True)
class Ratio:
    """``numerator`` over the best of ``denominators`` in the same round (the best of several
    batch calls: the fairest figure for the batch path), with a target when it has one."""

    key: str
    numerator: str
    denominators: tuple[str, ...]
    target: float | None
    what: str

    @property
    def name(self) -> str:
        goal = "" if self.target is None else f" >= {self.target:g}"
        return f"{self.what}{goal}"


RATIOS: tuple[Ratio, ...] = (
    Ratio(
        "sync-send-async/send-many",
        "sync-send-async",
        SEND_MANY_KEYS,
        PER_MESSAGE_MIN_RATIO,
        "sync send_async loop / best send_many",
    ),
    Ratio(
        "aio-send-async/send-many",
        "aio-send-async",
        SEND_MANY_KEYS,
        PER_MESSAGE_MIN_RATIO,
        "asyncio send_async loop / best send_many",
    ),
    Ratio(
        "sync-receive-ack/batch-drain",
        "sync-receive-ack",
        BATCH_DRAIN_KEYS,
        PER_MESSAGE_MIN_RATIO,
        "sync receive + acknowledge / best batch_receive drain",
    ),
    Ratio(
        "sync-listener/batch-drain",
        "sync-listener",
        BATCH_DRAIN_KEYS,
        PER_MESSAGE_MIN_RATIO,
        "sync message_listener / best batch_receive drain",
    ),
    Ratio(
        "aio-receive-ack/batch-drain",
        "aio-receive-ack",
        BATCH_DRAIN_KEYS,
        PER_MESSAGE_MIN_RATIO,
        "asyncio receive + acknowledge / best batch_receive drain",
    ),
    Ratio(
        "sync-send-async/redis",
        "sync-send-async",
        ("redis-xadd",),
        REDIS_MOONSHOT_RATIO,
        "moonshot: sync send_async loop / Redis Streams XADD (appendfsync always)",
    ),
    Ratio(
        "send-many/redis",
        "aio-send-many-async",
        ("redis-xadd",),
        None,
        "asyncio send_many_async / Redis Streams XADD (for reference)",
    ),
)


def round_order(patterns: Sequence[Pattern], round_index: int) -> list[Pattern]:
    """The patterns in the order a round runs them: rotated by one each round, so that no
    pattern always runs first or right after the same one."""
    if not patterns:
        return []
    shift = round_index % len(patterns)
    return [*patterns[shift:], *patterns[:shift]]


def listener_support() -> str | None:
    """None when ``client.subscribe(..., message_listener=fn)`` exists, else why not."""
    from magnetar import Client  # noqa: PLC0415
    from magnetar.aio import ConsumerConfig  # noqa: PLC0415

    if "message_listener" in inspect.signature(Client.subscribe).parameters:
        return None
    if "message_listener" in {f.name for f in dataclasses.fields(ConsumerConfig)}:
        return None
    return (
        "magnetar.Client.subscribe takes no message_listener (neither a parameter nor a"
        " ConsumerConfig field) in this version"
    )


# --- the client process ---------------------------------------------------------------------------


class _Window:
    """CPU of this process, the server and the machine over the timed part of a run."""

    def __init__(self, server_pid: int | None) -> None:
        self._server_pid = server_pid
        self._started_at = 0.0
        self._cpu = 0.0
        self._server = 0.0
        self._machine = (0.0, 0.0, 0.0)

    def _server_cpu(self) -> float:
        if self._server_pid is None:
            return 0.0
        with contextlib.suppress(OSError, ValueError, IndexError):
            return proc_cpu_seconds(self._server_pid)
        return 0.0

    def start(self) -> None:
        self._machine = machine_cpu_seconds()
        self._server = self._server_cpu()
        self._cpu = time.process_time()
        self._started_at = time.perf_counter()

    def stop(self, messages: int) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._started_at
        cpu = time.process_time() - self._cpu
        server = self._server_cpu() - self._server
        busy, _steal, total = machine_cpu_seconds()
        busy_s = busy - self._machine[0]
        total_s = max(total - self._machine[2], 1e-9)
        cores = os.cpu_count() or 1
        return {
            "messages": messages,
            "elapsed_s": elapsed,
            "msg_per_s": messages / elapsed if elapsed > 0 else 0.0,
            "client_cpu_pct": 100 * cpu / elapsed if elapsed > 0 else None,
            "client_us_per_msg": 1e6 * cpu / messages if messages else None,
            "server_cpu_pct": 100 * server / elapsed if elapsed > 0 else None,
            "server_us_per_msg": 1e6 * server / messages if messages else None,
            # /proc/stat counts every core: 100% of a core is 1 / cores of its total
            "machine_busy_pct": 100 * cores * busy_s / total_s,
            "others_pct": 100 * cores * busy_s / total_s
            - 100 * (cpu + server) / max(elapsed, 1e-9),
        }


def _payload(size: int) -> bytes:
    return os.urandom(size)


def _sync_send_async(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n, payload = spec["messages"], _payload(spec["size"])
    failed: list[BaseException] = []
    confirmed = 0

    def callback(error: BaseException | None, _message_id: object) -> None:
        nonlocal confirmed
        if error is None:
            confirmed += 1
        else:
            failed.append(error)

    with Client(spec["service_url"]) as client:
        producer = client.create_producer(spec["topic"])
        window.start()
        for _ in range(n):
            producer.send_async(payload, callback)
        producer.flush()
        out = window.stop(n)
        producer.close()
    return _checked(out, confirmed=confirmed, failed=failed, wanted=n)


def _sync_send(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n, payload = spec["send_count"], _payload(spec["size"])
    latencies: list[float] = []
    with Client(spec["service_url"]) as client:
        producer = client.create_producer(spec["topic"])
        for _ in range(spec["send_warmup"]):
            producer.send(payload)
        clock = time.perf_counter
        window.start()
        for _ in range(n):
            started = clock()
            producer.send(payload)
            latencies.append(clock() - started)
        out = window.stop(n)
        producer.close()
    ordered = sorted(latencies)
    out["latency_ms"] = {
        "p50": 1000 * percentile(ordered, 50),
        "p99": 1000 * percentile(ordered, 99),
        "max": 1000 * ordered[-1],
        "mean": 1000 * statistics.fmean(ordered),
    }
    return out


def _sync_send_many(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n, payload = spec["messages"], _payload(spec["size"])
    with Client(spec["service_url"]) as client:
        producer = client.create_producer(spec["topic"])
        window.start()
        sent = 0
        while sent < n:
            count = min(BATCH, n - sent)
            producer.send_many([payload] * count)
            sent += count
        out = window.stop(n)
        producer.close()
    return out


def _sync_receive_ack(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n = spec["messages"]
    with Client(spec["service_url"]) as client:
        # the clock starts before subscribing: no message is prefetched ahead of it
        window.start()
        consumer = client.subscribe(
            spec["topic"], SUBSCRIPTION, receiver_queue_size=spec["receiver_queue_size"]
        )
        for _ in range(n):
            msg = consumer.receive()
            consumer.acknowledge(msg)
        out = window.stop(n)
        consumer.close()
    return out


def _sync_batch_receive_ack(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n = spec["messages"]
    with Client(spec["service_url"]) as client:
        window.start()
        consumer = client.subscribe(
            spec["topic"], SUBSCRIPTION, receiver_queue_size=spec["receiver_queue_size"]
        )
        received = 0
        while received < n:
            batch = consumer.batch_receive(min(BATCH, n - received), spec["batch_timeout_ms"])
            for msg in batch:
                consumer.acknowledge(msg)
            received += len(batch)
        out = window.stop(received)
        consumer.close()
    return out


def _sync_listener(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar import Client  # noqa: PLC0415

    n = spec["messages"]
    done = threading.Event()
    received = 0
    failed: list[BaseException] = []

    def on_message(consumer: Any, msg: Any) -> None:
        nonlocal received
        try:
            consumer.acknowledge(msg)
        except Exception as e:  # noqa: BLE001 - counted and reported, the listener goes on
            failed.append(e)
        received += 1
        if received >= n:
            done.set()

    with Client(spec["service_url"]) as client:
        window.start()
        consumer = client.subscribe(
            spec["topic"],
            SUBSCRIPTION,
            receiver_queue_size=spec["receiver_queue_size"],
            message_listener=on_message,
        )
        if not done.wait(spec["timeout_s"]):
            raise TimeoutError(f"the listener saw {received:,} of {n:,} messages")
        out = window.stop(n)
        consumer.close()
    return _checked(out, confirmed=n - len(failed), failed=failed, wanted=n)


async def _aio_send_async(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar.aio import Client  # noqa: PLC0415

    n, payload = spec["messages"], _payload(spec["size"])
    failed: list[BaseException] = []
    confirmed = 0
    room = asyncio.Event()

    def callback(error: BaseException | None, _message_id: object) -> None:
        nonlocal confirmed
        if error is None:
            confirmed += 1
        else:
            failed.append(error)
        room.set()

    async with Client(spec["service_url"]) as client:
        producer = await client.create_producer(spec["topic"])
        window.start()
        for _ in range(n):
            while not producer.has_room():
                room.clear()
                await room.wait()
            producer.send_async(payload, callback)
        await producer.flush()
        out = window.stop(n)
        await producer.close()
    return _checked(out, confirmed=confirmed, failed=failed, wanted=n)


async def _aio_send_many_async(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar.aio import Client  # noqa: PLC0415

    n, payload = spec["messages"], _payload(spec["size"])
    failed: list[BaseException] = []
    in_flight = 0
    room = asyncio.Event()

    def callback(error: BaseException | None, _receipt: object) -> None:
        nonlocal in_flight
        in_flight -= 1
        if error is not None:
            failed.append(error)
        room.set()

    async with Client(spec["service_url"]) as client:
        producer = await client.create_producer(spec["topic"])
        runs_in_flight = max(1, producer.config.max_pending_messages // BATCH)
        window.start()
        sent = 0
        while sent < n:
            while in_flight >= runs_in_flight:
                room.clear()
                await room.wait()
            count = min(BATCH, n - sent)
            producer.send_many_async([payload] * count, callback)
            in_flight += 1
            sent += count
        await producer.flush()
        out = window.stop(n)
        await producer.close()
    return _checked(out, confirmed=n if not failed else 0, failed=failed, wanted=n)


async def _aio_receive_ack(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar.aio import Client  # noqa: PLC0415

    n = spec["messages"]
    async with Client(spec["service_url"]) as client:
        window.start()
        consumer = await client.subscribe(
            spec["topic"], SUBSCRIPTION, receiver_queue_size=spec["receiver_queue_size"]
        )
        for _ in range(n):
            msg = await consumer.receive()
            await consumer.acknowledge(msg)
        out = window.stop(n)
        await consumer.close()
    return out


async def _aio_batch_receive_ack(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    from magnetar.aio import Client  # noqa: PLC0415

    n = spec["messages"]
    async with Client(spec["service_url"]) as client:
        window.start()
        consumer = await client.subscribe(
            spec["topic"], SUBSCRIPTION, receiver_queue_size=spec["receiver_queue_size"]
        )
        received = 0
        while received < n:
            batch = await consumer.batch_receive(min(BATCH, n - received), spec["batch_timeout_ms"])
            for msg in batch:
                await consumer.acknowledge(msg)
            received += len(batch)
        out = window.stop(received)
        await consumer.close()
    return out


def _redis_xadd(spec: dict[str, Any], window: _Window) -> dict[str, Any]:
    import redis  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - bench only

    n, payload = spec["messages"], _payload(spec["size"])
    connection = redis.Redis(host="127.0.0.1", port=spec["redis_port"])
    try:
        connection.ping()
        pipe = connection.pipeline(transaction=False)
        stream = spec["topic"]
        window.start()
        sent = 0
        while sent < n:
            count = min(BATCH, n - sent)
            for _ in range(count):
                pipe.xadd(stream, {"d": payload})
            pipe.execute()
            sent += count
        out = window.stop(n)
        out["stream_length"] = connection.xlen(stream)
    finally:
        connection.close()
    if out["stream_length"] != n:
        out["error"] = f"the stream holds {out['stream_length']:,} entries, not {n:,}"
    return out


def _checked(
    out: dict[str, Any], *, confirmed: int, failed: list[BaseException], wanted: int
) -> dict[str, Any]:
    out["confirmed"] = confirmed
    if failed:
        out["errors"] = len(failed)
        out["error"] = f"{len(failed):,} failed, first: {failed[0]!r}"
    elif confirmed != wanted:
        out["error"] = f"{confirmed:,} of {wanted:,} confirmed"
    return out


SYNC_RUNNERS: dict[str, Callable[[dict[str, Any], _Window], dict[str, Any]]] = {
    "sync-send-async": _sync_send_async,
    "sync-send": _sync_send,
    "sync-send-many": _sync_send_many,
    "sync-receive-ack": _sync_receive_ack,
    "sync-batch-receive-ack": _sync_batch_receive_ack,
    "sync-listener": _sync_listener,
    "redis-xadd": _redis_xadd,
}
AIO_RUNNERS = {
    "aio-send-async": _aio_send_async,
    "aio-send-many-async": _aio_send_many_async,
    "aio-receive-ack": _aio_receive_ack,
    "aio-batch-receive-ack": _aio_batch_receive_ack,
}


def worker_main(spec_text: str) -> int:
    """One pattern, one run: its figures as one JSON line on stdout."""
    # the client library logs its connections at info; the figures are what is read
    quiet_logs()
    spec = json.loads(spec_text)
    if spec.get("tune_gc"):
        from magnetar.common.server.gc_tuning import tune_gc_for_throughput  # noqa: PLC0415

        tune_gc_for_throughput()
    key = spec["pattern"]
    window = _Window(spec.get("server_pid"))
    if key in AIO_RUNNERS:
        out = asyncio.run(AIO_RUNNERS[key](spec, window))
    else:
        out = SYNC_RUNNERS[key](spec, window)
    print(json.dumps(out), flush=True)
    return 0


# --- setup: Redis ---------------------------------------------------------------------------------


APT_INSTALL = [
    *("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o", "DPkg::Lock::Timeout=120"),
    *("install", "-y", "-q"),
]


def _as_root(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return command
    if shutil.which("sudo"):
        return ["sudo", "-n", *command]
    raise PermissionError(f"'{shlex.join(command)}' needs root (or sudo)")


def _redis_py_version() -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version("redis")
    return None


def setup_redis(*, install: bool) -> dict[str, Any]:
    """Find (or, with ``install``, install) ``redis-server`` from Debian and redis-py into this
    venv; what is there, and why Redis is skipped when it is."""
    out: dict[str, Any] = {"available": False, "installed": []}
    steps: list[tuple[str, list[str]]] = []
    if shutil.which("redis-server") is None:
        steps += [
            ("apt-get update", ["apt-get", "update", "-q"]),
            ("redis-server (Debian)", [*APT_INSTALL, "redis-server"]),
        ]
    if _redis_py_version() is None:
        steps.append((REDIS_PY, [sys.executable, "-m", "pip", "install", "-q", REDIS_PY]))
    if steps and not install:
        missing = ", ".join(name for name, _ in steps if name != "apt-get update")
        out["note"] = f"Redis skipped: {missing} missing and --no-install given"
        return out
    for name, step in steps:
        try:
            command = step if step[0] == sys.executable else _as_root(step)
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, PermissionError, subprocess.TimeoutExpired) as e:
            out["note"] = f"Redis skipped: installing {name} failed: {e}"
            return out
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            out["note"] = f"Redis skipped: installing {name} failed: {' | '.join(tail)}"
            return out
        if name != "apt-get update":
            out["installed"].append(name)
    server = shutil.which("redis-server")
    if server is None or _redis_py_version() is None:
        out["note"] = "Redis skipped: redis-server or redis-py still missing after installing"
        return out
    version = subprocess.run(
        [server, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    out.update(
        {
            "available": True,
            "server": server,
            "server_version": version,
            "redis_py": _redis_py_version(),
        }
    )
    return out


# --- the servers ----------------------------------------------------------------------------------


_URL = re.compile(r"magnetar://\S+")


@dataclass
class Server:
    """A server process of this run, its log, and how to reach it."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    address: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid


async def _spawn(name: str, command: list[str], log_path: Path) -> Server:
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=REPO,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops it in order
        )
    return Server(name, process, log_path)


async def start_standalone(directory: Path) -> Server:
    """``magnetar standalone`` as a user starts it, ready once it prints its service URL."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-c",
        "import sys; from magnetar.cli import main; sys.exit(main())",
        "standalone",
        "--data-dir",
        str(directory / "data"),
        "--port",
        str(free_port()),
        "--http-port",
        "0",
        "--pulsar-port",
        "0",
    ]
    server = await _spawn("standalone", command, directory / "standalone.log")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        text = server.log_path.read_text(errors="replace")
        for line in text.splitlines():
            if "magnetar://" in line and (found := _URL.search(line)):
                server.address = found.group(0).rstrip(";,)")
                return server
        if server.process.returncode is not None:
            raise RuntimeError(
                f"magnetar standalone exited with {server.process.returncode}:"
                f" {log_tail(server.log_path, TAIL_LINES)}"
            )
        await asyncio.sleep(0.1)
    await stop_server(server)
    raise RuntimeError(f"magnetar standalone was not ready within {READY_TIMEOUT_S:g} s")


async def start_redis(directory: Path, server_path: str) -> Server:
    """redis-server on a free port, its files in ``directory``: every write appended to the AOF
    and fsynced before the reply (``appendfsync always``), no RDB snapshots."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    port = free_port()
    command = [
        server_path,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip
    server = await _spawn("redis-server", command, directory / "redis.log")
    server.address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.returncode is not None:
            raise RuntimeError(
                f"redis-server exited with {server.process.returncode}:"
                f" {log_tail(server.log_path, TAIL_LINES)}"
            )
        if "Ready to accept connections" in server.log_path.read_text(errors="replace"):
            return server
        await asyncio.sleep(0.1)
    await stop_server(server)
    raise RuntimeError(f"redis-server was not ready within {READY_TIMEOUT_S:g} s")


async def stop_server(server: Server, grace_s: float = 20.0) -> None:
    """SIGINT (SIGTERM for Redis), then SIGKILL after ``grace_s``."""
    # the standalone stops as on Ctrl-C
    sig = signal.SIGTERM if server.name == "redis-server" else signal.SIGINT
    await stop_process(server.process, grace_s, sig)


# --- backlogs -------------------------------------------------------------------------------------


async def fill_backlog(client: Any, topic: str, messages: int, size: int) -> float:
    """Create ``topic`` and the subscription (at the earliest message, so that nothing is
    deleted as consumed), then publish ``messages`` with pipelined ``send_many_async``; the
    seconds it took (not part of any figure)."""
    started = time.perf_counter()
    admin = client.admin()
    try:
        await admin.create_topic(topic)
        await admin.create_subscription(topic, SUBSCRIPTION, "earliest")
    finally:
        await admin.close()
    producer = await client.create_producer(topic)
    payload = _payload(size)
    pending: deque[asyncio.Future[Any]] = deque()
    runs_in_flight = max(1, producer.config.max_pending_messages // BATCH)
    sent = 0
    while sent < messages:
        while len(pending) >= runs_in_flight:
            await pending.popleft()
        count = min(BATCH, messages - sent)
        pending.append(producer.send_many_async([payload] * count))
        sent += count
    for future in pending:
        await future
    await producer.close()
    return time.perf_counter() - started


# --- one run --------------------------------------------------------------------------------------


def worker_timeout_s(messages: int) -> float:
    return messages / WORKER_MIN_RATE + WORKER_MARGIN_S


async def run_worker(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One worker process: its figures, or why it failed."""
    command = [sys.executable, WORKER_SCRIPT, "--worker", json.dumps(spec)]
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=REPO,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        out, err = await process.communicate()
        return {
            "ok": False,
            "error": f"did not finish within {timeout_s:g} s (killed)",
            "stderr_tail": "\n".join(err.decode(errors="replace").splitlines()[-TAIL_LINES:]),
            "wall_s": time.perf_counter() - started,
        }
    result: dict[str, Any] = {"wall_s": time.perf_counter() - started}
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if process.returncode == 0 and lines:
        result.update(json.loads(lines[-1]))
        result["ok"] = "error" not in result
    else:
        result["ok"] = False
        result["error"] = f"the worker exited with {process.returncode}"
    if not result["ok"]:
        result["stderr_tail"] = "\n".join(err.decode(errors="replace").splitlines()[-TAIL_LINES:])
    return result


async def run_one(
    pattern: Pattern,
    round_index: int,
    *,
    args: argparse.Namespace,
    client: Any,
    standalone: Server,
    redis: Server | None,
) -> dict[str, Any]:
    topic = f"client-bench-{pattern.key}-r{round_index}-{os.urandom(3).hex()}"
    run: dict[str, Any] = {"pattern": pattern.key, "round": round_index, "topic": topic}
    messages = args.send_count if pattern.direction == LATENCY else args.messages
    try:
        if pattern.direction == RECEIVE:
            run["backlog_fill_s"] = round(
                await fill_backlog(client, topic, args.messages, MESSAGE_BYTES), 3
            )
        # what the fill (or the previous run) left in the page cache is written back first
        await asyncio.to_thread(os.sync)
        timeout_s = worker_timeout_s(messages)
        spec = {
            "pattern": pattern.key,
            "service_url": standalone.address,
            "topic": topic,
            "messages": messages,
            "send_count": args.send_count,
            "send_warmup": args.send_warmup,
            "size": MESSAGE_BYTES,
            "receiver_queue_size": args.receiver_queue_size,
            "batch_timeout_ms": 100,
            "server_pid": standalone.pid,
            "timeout_s": timeout_s,
            "tune_gc": args.tune_gc,
        }
        if pattern.client == REDIS:
            assert redis is not None
            spec["server_pid"] = redis.pid
            spec["redis_port"] = int(redis.address.rsplit(":", 1)[1])
        run.update(await run_worker(spec, timeout_s))
    except Exception as e:  # noqa: BLE001 - one failed run is reported, the rest still run
        run.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
    if not run["ok"]:
        server = redis if pattern.client == REDIS and redis is not None else standalone
        run["server_log_tail"] = log_tail(server.log_path, TAIL_LINES)
    return run


# --- figures --------------------------------------------------------------------------------------


FIGURES = (
    "msg_per_s",
    "client_us_per_msg",
    "server_us_per_msg",
    "client_cpu_pct",
    "server_cpu_pct",
    "machine_busy_pct",
    "others_pct",
)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pattern: every figure's spread over the rounds that succeeded."""
    out: dict[str, dict[str, Any]] = {}
    for pattern in PATTERNS:
        mine = [r for r in runs if r["pattern"] == pattern.key]
        if not mine:
            continue
        good = [r for r in mine if r["ok"]]
        figures: dict[str, Any] = {"runs": len(mine), "ok_runs": len(good)}
        for name in FIGURES:
            figures[name] = spread([r[name] for r in good if r.get(name) is not None])
        if pattern.direction == LATENCY:
            for q in ("p50", "p99", "max"):
                figures[f"latency_{q}_ms"] = spread([r["latency_ms"][q] for r in good])
        out[pattern.key] = figures
    return out


def ratios(
    runs: Sequence[dict[str, Any]], rounds: int, skipped: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Each ratio computed within each round (numerator over the best denominator of that
    round), then its median, spread, and the rounds in which it met its target. ``skipped``:
    patterns not run, and why (the reason of a ratio that could not be computed)."""
    skipped = skipped or {}
    rate: dict[tuple[str, int], float] = {
        (r["pattern"], r["round"]): r["msg_per_s"] for r in runs if r["ok"]
    }
    out: list[dict[str, Any]] = []
    for ratio in RATIOS:
        per_round: list[float] = []
        best_of: list[str] = []
        for round_index in range(rounds):
            top = max(
                (
                    (rate[(d, round_index)], d)
                    for d in ratio.denominators
                    if (d, round_index) in rate
                ),
                default=None,
            )
            numerator = rate.get((ratio.numerator, round_index))
            if top is None or numerator is None or top[0] <= 0:
                continue
            per_round.append(numerator / top[0])
            best_of.append(top[1])
        entry: dict[str, Any] = {
            "key": ratio.key,
            "name": ratio.name,
            "numerator": ratio.numerator,
            "denominators": list(ratio.denominators),
            "target": ratio.target,
            "per_round": per_round,
            "best_denominator_per_round": best_of,
            **spread(per_round),
        }
        if not per_round:
            entry["verdict"] = "NOT RUN"
            reasons = [
                f"{key} not measured: {skipped[key]}"
                for key in (ratio.numerator, *ratio.denominators)
                if key in skipped
            ]
            entry["why"] = "; ".join(reasons) or "no round measured both sides"
        elif ratio.target is None:
            entry["verdict"] = "-"
        else:
            entry["rounds_meeting"] = sum(1 for v in per_round if v >= ratio.target)
            entry["verdict"] = "PASS" if entry["median"] >= ratio.target else "FAIL"
        out.append(entry)
    return out


# --- the report -----------------------------------------------------------------------------------


def _ratio_line(entry: dict[str, Any]) -> str:
    head = f"- **{entry['verdict']}** {entry['name']}"
    if entry["median"] is None:
        return f"{head}: {entry.get('why', 'not measured')}"
    met = (
        f"; met in {entry['rounds_meeting']} of {entry['n']} rounds"
        if "rounds_meeting" in entry
        else ""
    )
    return (
        f"{head}: **{entry['median']:.3f}** (median of {entry['n']} rounds;"
        f" {entry['min']:.3f} to {entry['max']:.3f}{met})"
    )


def render_markdown(results: dict[str, Any]) -> str:
    p = results["parameters"]
    cores = results["machine"]["cpu_count"]
    redis = results["redis"]
    redis_text = (
        f"Redis: {redis['server_version']}, redis-py {redis['redis_py']}."
        if redis.get("available")
        else f"Redis: not measured ({redis.get('note', 'skipped')})."
    )
    summary = results["summary"]
    lines = [
        *report_head(results, "Client calls benchmark", raw_limits=False),
        "",
        (
            "One `magnetar standalone` (3 bookies, E3/Qw2/Qa2, every journal write"
            " `fdatasync`ed, embedded metadata, default settings), started as a user starts it."
            f" {redis_text} Each run is a fresh client process running one pattern on a fresh"
            f" topic, {p['messages']:,} messages of {p['message_bytes']} B"
            f" ({p['send_count']:,} sequential sends for `send`), default producer and consumer"
            f" settings but a receiver queue of {p['receiver_queue_size']:,}; backlogs filled"
            f" beforehand with `send_many_async` (not timed); `sync` before every run."
            f" {p['rounds']} rounds, every pattern once a round, the order rotated each round."
            f" Garbage collector: {'tuned as perf tunes it' if p['tune_gc'] else 'untuned'}."
        ),
        "",
        (
            "Each figure is the **median of the rounds** (min-max in brackets); a ratio is"
            " computed **within each round** (against the best batch call of that round), then"
            " its median taken. CPU is % of one core over the timed part of the run; the machine"
            f" has {cores} cores, so {100 * cores}% is all of it. The machine is shared and noisy:"
            " compare within this run only."
        ),
        "",
        "## Targets",
        "",
        *[_ratio_line(e) for e in results["ratios"] if e["target"] is not None],
        "",
        "For reference:",
        "",
        *[_ratio_line(e) for e in results["ratios"] if e["target"] is None],
        "",
        "## Every pattern",
        "",
        (
            "| pattern | the call | msg/s | client CPU us/msg | server CPU us/msg | client CPU"
            " % | server CPU % | machine busy % (others) | runs ok |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pattern in PATTERNS:
        f = summary.get(pattern.key)
        if f is None:
            continue
        lines.append(
            f"| {pattern.key} | {pattern.client}: `{pattern.call}`"
            f" | **{spread_cell(f['msg_per_s'])}**"
            f" | {spread_cell(f['client_us_per_msg'], '.2f')}"
            f" | {spread_cell(f['server_us_per_msg'], '.2f')}"
            f" | {spread_cell(f['client_cpu_pct'])} | {spread_cell(f['server_cpu_pct'])}"
            f" | {spread_cell(f['machine_busy_pct'])} ({spread_cell(f['others_pct'])})"
            f" | {f['ok_runs']} / {f['runs']} |"
        )
    latency = summary.get("sync-send")
    if latency is not None:
        lines += [
            "",
            (
                f"`sync-send` ({p['send_count']:,} sequential `producer.send(msg)`, after"
                f" {p['send_warmup']} not counted): latency p50"
                f" {spread_cell(latency['latency_p50_ms'], '.2f')} ms, p99"
                f" {spread_cell(latency['latency_p99_ms'], '.2f')} ms, max"
                f" {spread_cell(latency['latency_max_ms'], '.1f')} ms: send call -> the broker's"
                " receipt, the message stored on Qa bookies and `fdatasync`ed."
            ),
        ]
    if results["skipped"]:
        lines += ["", "## Not measured", ""]
        lines += [f"- {key}: {why}" for key, why in results["skipped"].items()]
    lines += [
        "",
        "## What the figures mean",
        "",
        (
            "- **msg/s**: messages over the timed part of the run: from the first call (before"
            " `subscribe` for the receive patterns, so nothing was prefetched ahead of the"
            " clock) to the last receipt (`flush` or `send_many`'s return) or the last"
            " message received and acknowledged. Acknowledgements are grouped by the client"
            " and not waited for (no `ack_receipts`)."
        ),
        (
            "- **client CPU us/msg**: the client process's CPU (every thread: the sync"
            " client's own event loop thread included) over the messages; **server CPU**:"
            " the standalone's (or redis-server's) one process; **others**: CPU no process"
            " of the run used (kernel threads, other tenants of the machine). At the low rate"
            " of `sync-send` the server's CPU per message is mostly its idle work."
        ),
        (
            f"- **ratios**: a per-message pattern over the best batch pattern of the same"
            f" round and direction (send: {', '.join(SEND_MANY_KEYS)}; receive:"
            f" {', '.join(BATCH_DRAIN_KEYS)}); targets are issue 22's: each per-message call"
            f" >= {PER_MESSAGE_MIN_RATIO:g} of the batch path, and (moonshot) the sync"
            f" `send_async` loop >= {REDIS_MOONSHOT_RATIO:g}x Redis Streams with"
            " `appendfsync always`, driven from Python as above."
        ),
        "",
    ]
    lines += failed_runs_section(results["runs"], lambda r: f"round {r['round']}, {r['pattern']}")
    return report_text(
        lines,
        "Every run (figures, CPU, the backlog fills' times), parameters and machine details",
        gap=False,
    )


# --- main -----------------------------------------------------------------------------------------


def chosen_patterns(args: argparse.Namespace, skipped: dict[str, str]) -> list[Pattern]:
    wanted = [p for p in PATTERNS if not args.only or p.key in args.only]
    return [p for p in wanted if p.key not in skipped]


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    from magnetar import __version__ as magnetar_version  # noqa: PLC0415
    from magnetar.aio import Client  # noqa: PLC0415

    started = time.time()
    skipped: dict[str, str] = {}
    if (why := listener_support()) is not None:
        skipped["sync-listener"] = why
    if args.no_redis:
        redis_setup: dict[str, Any] = {"available": False, "note": "Redis skipped: --no-redis"}
    else:
        redis_setup = await asyncio.to_thread(setup_redis, install=not args.no_install)
    if not redis_setup["available"]:
        skipped["redis-xadd"] = redis_setup["note"]
    patterns = chosen_patterns(args, skipped)
    results: dict[str, Any] = {
        **results_head("client", "client_bench.py", argv, started, args),
        "parameters": {
            "rounds": args.rounds,
            "messages": args.messages,
            "message_bytes": MESSAGE_BYTES,
            "batch": BATCH,
            "send_count": args.send_count,
            "send_warmup": args.send_warmup,
            "receiver_queue_size": args.receiver_queue_size,
            "tune_gc": args.tune_gc,
            "patterns": {p.key: p.name for p in patterns},
            "targets": {
                "per_message_min_ratio": PER_MESSAGE_MIN_RATIO,
                "redis_moonshot_ratio": REDIS_MOONSHOT_RATIO,
            },
        },
        "versions": {"magnetar": magnetar_version},
        "machine": machine_info(root),
        "redis": redis_setup,
        "skipped": skipped,
        "runs": [],
    }
    for key, why in skipped.items():
        print(f"{key}: not measured: {why}", flush=True)
    async with contextlib.AsyncExitStack() as stack:
        standalone = await start_standalone(root / "standalone")
        stack.push_async_callback(stop_server, standalone)
        results["standalone"] = {"service_url": standalone.address, "pid": standalone.pid}
        print(f"standalone {standalone.address} (pid {standalone.pid})", flush=True)
        redis: Server | None = None
        if any(p.client == REDIS for p in patterns):
            redis = await start_redis(root / "redis", redis_setup["server"])
            stack.push_async_callback(stop_server, redis)
            results["redis"]["address"] = redis.address
            print(f"redis-server {redis.address} (pid {redis.pid})", flush=True)
        client = Client(standalone.address)
        stack.push_async_callback(client.close)
        for round_index in range(args.rounds):
            for pattern in round_order(patterns, round_index):
                run = await run_one(
                    pattern,
                    round_index,
                    args=args,
                    client=client,
                    standalone=standalone,
                    redis=redis,
                )
                results["runs"].append(run)
                _print_run(run)
    results["summary"] = summarize(results["runs"])
    results["ratios"] = ratios(results["runs"], args.rounds, skipped)
    results["elapsed_s"] = time.time() - started
    return results


def _print_run(run: dict[str, Any]) -> None:
    head = f"round {run['round']} {run['pattern']:<23}"
    if not run["ok"]:
        print(f"{head} FAILED: {run.get('error')}", flush=True)
        return
    latency = run.get("latency_ms")
    extra = (
        f"  p50 {latency['p50']:.2f} ms  p99 {latency['p99']:.2f} ms" if latency is not None else ""
    )
    print(
        f"{head} {run['msg_per_s']:>10,.0f} msg/s  client {run['client_us_per_msg']:6.2f} us/msg"
        f"  server {run['server_us_per_msg']:6.2f} us/msg  machine busy"
        f" {run['machine_busy_pct']:.0f}%{extra}",
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "client_bench.py",
        (
            "The client calls users write (send_async in a loop, receive + acknowledge, a"
            " message listener) against the batch calls (send_many, batch_receive), sync and"
            " asyncio, on one magnetar standalone, with Redis Streams (appendfsync always,"
            " redis-py pipelines) in the same run; rounds interleaved, medians and spreads, and"
            " the ratios issue 22 targets with PASS/FAIL. Writes client-<date>.json and .md to"
            " --out. Exits 0 if every run succeeded (whatever the verdicts), else 1."
        ),
    )
    add("--messages", type=int, default=200_000, help="messages per pattern and round")
    add("--rounds", type=int, default=3, help="rounds; each runs every pattern once")
    add("--send-count", type=int, default=300, help="sequential sends of the sync send pattern")
    add("--send-warmup", type=int, default=20, help="... sent first, not counted")
    add(
        "--receiver-queue-size",
        type=int,
        default=10_000,
        help="the consumers' prefetch (the suite's drain uses 10,000; the client's default of"
        " 1,000 is one entry in flight, so a drain waits a round trip per entry)",
    )
    add(
        "--tune-gc",
        action="store_true",
        help="tune the client processes' garbage collector as magnetar perf does (default: the"
        " interpreter's settings, as an application has them)",
    )
    add(
        "--only",
        action="append",
        metavar="KEY",
        help="run only this pattern (repeatable): " + ", ".join(p.key for p in PATTERNS),
    )
    add("--no-redis", action="store_true", help="leave Redis Streams out")
    add(
        "--no-install",
        action="store_true",
        help="do not install redis-server (apt-get) or redis-py (pip, into this venv) when"
        " missing: Redis is then skipped with a note",
    )
    add_quick_and_tag(
        add,
        "client",
        quick="2 rounds of 20,000 messages, 100 sequential sends",
        tag="name the results client-<date>-<TAG>.*",
    )
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the servers' data, and removed at the end"
        ),
        keep_data_help=KEEP_DATA_HELP,
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = min(args.messages, 20_000)
        args.rounds = min(args.rounds, 2)
        args.send_count = min(args.send_count, 100)
        args.send_warmup = min(args.send_warmup, 10)
        args.tag = args.tag or "quick"
    if args.messages < 1 or args.rounds < 1 or args.send_count < 1 or args.send_warmup < 0:
        parser.error("--messages, --rounds and --send-count must be >= 1, --send-warmup >= 0")
    if args.receiver_queue_size < 1:
        parser.error("--receiver-queue-size must be >= 1")
    if args.only:
        unknown = set(args.only) - set(PATTERN_BY_KEY)
        if unknown:
            parser.error(f"unknown pattern(s) {sorted(unknown)}")
    return args


def _verdicts(results: dict[str, Any], args: argparse.Namespace) -> bool:
    for entry in results["ratios"]:
        value = "-" if entry["median"] is None else f"{entry['median']:.3f}"
        print(f"{entry['verdict']}: {entry['name']}: {value}")
    return all_ok("runs")(results, args)


def main(argv: list[str] | None = None) -> int:
    # the admin client logs at info; the benchmark's own output is enough
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    return bench_main(
        "client", argv, parse_args, bench, render_markdown, ok=_verdicts, worker=worker_main
    )


if __name__ == "__main__":
    raise SystemExit(main())
