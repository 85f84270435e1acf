"""Standalone benchmark: how long ``magnetar standalone`` takes to be ready on a fresh data
directory and on a restart with data in it, how much memory and CPU it uses while idle, and how
long a clean shutdown (SIGINT) takes.

Run from the repository root::

    .venv/bin/python bench/standalone_bench.py              # full run, about four minutes
    .venv/bin/python bench/standalone_bench.py --quick      # smoke test, under a minute

Each run starts the real command (``.venv/bin/magnetar standalone``, default settings, free ports)
on a new data directory, waits for its ready line, lets it idle, writes some state through the
client library (a topic with 10,000 messages of 100 B and a subscription that acknowledged half
of them), stops it with SIGINT, starts it again on the same directory, lets it idle again, checks
that the subscription resumes where it was, and stops it again. It writes
``bench/results/standalone-<date>.json`` (every figure of every run) and ``standalone-<date>.md``
(the table); ``--quick`` writes ``standalone-<date>-quick.*`` so a smoke test never replaces a
full run. See bench/README.md ("Standalone") for what each figure means. The machine is shared
and noisy: compare figures within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# harness.py sits next to this script, so it is importable when the script is run as
# ``python bench/standalone_bench.py``; machine details and the results harness are shared.
from harness import (
    KIB,
    MIB,
    REPO,
    add_output_options,
    add_quick_and_tag,
    all_ok,
    bench_main,
    bench_parser,
    free_port,
    machine_info,
    percentile,
    proc_cpu_seconds,
    python_path,
    report_head,
    report_text,
    results_head,
)

from magnetar.aio import Client, MessageId

READY_RE = re.compile(r"magnetar standalone ready in ([0-9.]+) s: service URL (\S+)")
TOPIC = "standalone-bench"
SUBSCRIPTION = "standalone-bench-sub"
NUMBER_DIGITS = 8  # a message starts with its number, zero-padded
SEND_WINDOW = 1_000  # messages unconfirmed at most while writing the state
READY_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 60.0
RECEIVE_TIMEOUT_MS = 30_000
STDERR_TAIL_LINES = 60


# --- the process ----------------------------------------------------------------------------------


@dataclass
class Running:
    """One ``magnetar standalone`` process and what its pipes said."""

    proc: subprocess.Popen[bytes]
    spawned: float  # time.monotonic() just before Popen
    ready_event: threading.Event = field(default_factory=threading.Event)
    ready_at: float | None = None  # time.monotonic() when the ready line was read
    ready_line: str | None = None
    stdout_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES)
    )
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES)
    )
    readers: list[threading.Thread] = field(default_factory=list)

    def read_stdout(self, pipe: IO[bytes]) -> None:
        # a thread of its own, so the ready line is timed when it arrives, whatever the
        # benchmark's event loop is doing
        for raw in pipe:
            line = raw.decode(errors="replace").rstrip("\n")
            if self.ready_at is None and READY_RE.search(line):
                self.ready_at = time.monotonic()
                self.ready_line = line
                self.ready_event.set()
            self.stdout_tail.append(line)
        self.ready_event.set()  # end of output: the process is gone, ready or not

    def read_stderr(self, pipe: IO[bytes]) -> None:
        # drained so the process never blocks on a full pipe; the tail goes into the results
        # of a failed run
        for raw in pipe:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        for thread in self.readers:
            thread.join(timeout=5)

    def log_tail(self) -> list[str]:
        return [*self.stdout_tail, *self.stderr_tail]


def standalone_command(
    data_dir: Path, port: int, http_port: int, extra: list[str] | None = None
) -> list[str]:
    magnetar = Path(sys.executable).parent / "magnetar"
    return [
        str(magnetar),
        "standalone",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--pulsar-port",
        "0",
        *(extra or []),
    ]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GRPC_VERBOSITY"] = "ERROR"
    # the command's own defaults (console logs at warning), not whatever the caller exported
    for name in ("MAGNETAR_LOG_LEVEL", "MAGNETAR_LOG_FORMAT"):
        env.pop(name, None)
    return env


async def start_standalone(command: list[str], procs: list[Running]) -> Running:
    """Spawn the command and wait for its ready line. The process is added to ``procs`` before
    anything can fail, so the caller's finally block kills it."""
    spawned = time.monotonic()
    proc = subprocess.Popen(  # noqa: ASYNC220 - the spawn is what is timed; it does not wait
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=REPO,
    )
    running = Running(proc=proc, spawned=spawned)
    procs.append(running)
    assert proc.stdout is not None
    assert proc.stderr is not None
    for target, pipe in ((running.read_stdout, proc.stdout), (running.read_stderr, proc.stderr)):
        thread = threading.Thread(target=target, args=(pipe,), daemon=True)
        thread.start()
        running.readers.append(thread)
    await asyncio.to_thread(running.ready_event.wait, READY_TIMEOUT_S)
    if running.ready_at is None:
        state = "exited with " + str(proc.poll()) if proc.poll() is not None else "still running"
        raise RuntimeError(f"no ready line within {READY_TIMEOUT_S:.0f} s ({state})")
    return running


def ready_figures(running: Running) -> dict[str, Any]:
    assert running.ready_at is not None
    assert running.ready_line is not None
    match = READY_RE.search(running.ready_line)
    assert match is not None
    return {
        "pid": running.proc.pid,
        "ready_wall_s": running.ready_at - running.spawned,
        "ready_self_reported_s": float(match.group(1)),
        "service_url": match.group(2),
        "ready_line": running.ready_line,
    }


def proc_status(pid: int) -> dict[str, int]:
    """Memory (bytes) and thread count from /proc/<pid>/status."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "RssFile", "VmSize", "Threads"}
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            parts = value.split()
            out[key] = int(parts[0]) * KIB if len(parts) > 1 and parts[1] == "kB" else int(parts[0])
    return out


async def measure_idle(running: Running, idle_s: float) -> dict[str, Any]:
    """CPU used from the ready line to ``idle_s`` after it, then memory and threads."""
    assert running.ready_at is not None
    pid = running.proc.pid
    cpu_before, at_before = proc_cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(max(0.0, running.ready_at + idle_s - at_before))
    cpu_after, at_after = proc_cpu_seconds(pid), time.monotonic()
    if running.proc.poll() is not None:
        raise RuntimeError(f"the standalone exited while idle (code {running.proc.returncode})")
    status = proc_status(pid)
    window = at_after - at_before
    return {
        "window_s": window,
        "cpu_s": cpu_after - cpu_before,
        "cpu_pct": 100 * (cpu_after - cpu_before) / window if window > 0 else float("nan"),
        "cpu_total_s": cpu_after,  # since the process started: start-up included
        "rss_bytes": status.get("VmRSS"),
        "hwm_bytes": status.get("VmHWM"),
        "rss_anon_bytes": status.get("RssAnon"),
        "rss_file_bytes": status.get("RssFile"),
        "vm_size_bytes": status.get("VmSize"),
        "threads": status.get("Threads"),
    }


async def shutdown(running: Running) -> dict[str, Any]:
    """SIGINT (Ctrl-C), then wait for the process to exit."""
    signalled = time.monotonic()
    running.proc.send_signal(signal.SIGINT)
    try:
        code = await asyncio.to_thread(running.proc.wait, SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        running.kill()
        return {"shutdown_s": None, "exit_code": None, "timed_out": True}
    exited = time.monotonic()
    for thread in running.readers:
        await asyncio.to_thread(thread.join, 5)
    return {"shutdown_s": exited - signalled, "exit_code": code, "timed_out": False}


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- the state written before the restart ---------------------------------------------------------


def payload(number: int, size: int) -> bytes:
    head = str(number).zfill(NUMBER_DIGITS).encode()
    return head + b"x" * max(0, size - len(head))


def number_of(data: bytes) -> int:
    return int(data[:NUMBER_DIGITS])


async def write_state(service_url: str, messages: int, size: int) -> dict[str, Any]:
    """A subscription from the earliest message, ``messages`` messages of ``size`` bytes, the
    first half of them received and acknowledged (cumulatively, with a receipt)."""
    started = time.monotonic()
    async with Client(service_url) as client:
        consumer = await client.subscribe(
            TOPIC, SUBSCRIPTION, initial_position="earliest", ack_receipts=True
        )
        producer = await client.create_producer(TOPIC)
        connected = time.monotonic()
        pending: collections.deque[asyncio.Future[MessageId]] = collections.deque()
        for number in range(messages):
            if len(pending) >= SEND_WINDOW:
                await pending.popleft()
            pending.append(producer.send_async(payload(number, size)))
        await producer.flush()
        await asyncio.gather(*pending)
        produced = time.monotonic()
        acked = messages // 2
        last = None
        for expected in range(acked):
            last = await consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            if number_of(last.data()) != expected:
                raise RuntimeError(
                    f"received message {number_of(last.data())}, expected {expected}"
                )
        if last is not None:
            await consumer.acknowledge_cumulative(last)
        consumed = time.monotonic()
        await consumer.close()
        await producer.close()
    return {
        "topic": TOPIC,
        "subscription": SUBSCRIPTION,
        "messages": messages,
        "message_bytes": size,
        "acknowledged": acked,
        "connect_s": connected - started,
        "produce_s": produced - connected,
        "consume_s": consumed - produced,
    }


async def check_resume(service_url: str, expected: int) -> dict[str, Any]:
    """After the restart: the subscription's first message must be the first unacknowledged
    one. Also times a new client's first message (the topic is loaded on first use)."""
    started = time.monotonic()
    async with Client(service_url) as client:
        consumer = await client.subscribe(TOPIC, SUBSCRIPTION, initial_position="earliest")
        subscribed = time.monotonic()
        message = await consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        received = time.monotonic()
        await consumer.close()
    first = number_of(message.data())
    return {
        "first_message": first,
        "expected": expected,
        "ok": first == expected,
        "subscribe_s": subscribed - started,
        "first_message_s": received - started,
    }


# --- one run --------------------------------------------------------------------------------------


async def one_run(index: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    data_dir = root / f"run-{index}"
    port, http_port = free_port(), free_port()
    command = standalone_command(data_dir, port, http_port, args.standalone_arg)
    run: dict[str, Any] = {"index": index, "ok": False, "port": port, "http_port": http_port}
    procs: list[Running] = []
    try:
        fresh = await start_standalone(command, procs)
        run["fresh"] = ready_figures(fresh)
        run["fresh"]["idle"] = await measure_idle(fresh, args.idle_s)
        run["state"] = await write_state(
            run["fresh"]["service_url"], args.messages, args.message_bytes
        )
        run["fresh"].update(await shutdown(fresh))
        run["state"]["data_dir_bytes"] = tree_bytes(data_dir)

        # the same data directory and ports, as a user restarting it would
        restart = await start_standalone(command, procs)
        run["restart"] = ready_figures(restart)
        run["restart"]["idle"] = await measure_idle(restart, args.idle_s)
        run["resume"] = await check_resume(
            run["restart"]["service_url"], run["state"]["acknowledged"]
        )
        run["restart"].update(await shutdown(restart))
        run["ok"] = (
            run["fresh"]["exit_code"] == 0
            and run["restart"]["exit_code"] == 0
            and run["resume"]["ok"]
        )
    except Exception as error:  # noqa: BLE001 - a failed run is recorded and the others go on
        run["error"] = f"{type(error).__name__}: {error}"
        run["traceback"] = traceback.format_exc()
    finally:
        for running in procs:
            running.kill()
        if not run["ok"]:
            run["log_tail"] = [line for running in procs for line in running.log_tail()]
        shutil.rmtree(data_dir, ignore_errors=True)
    return run


def _print_run(run: dict[str, Any]) -> None:
    if "error" in run:
        print(f"run {run['index']}: FAILED: {run['error']}", flush=True)
        for line in run.get("log_tail", [])[-10:]:
            print(f"    {line}", flush=True)
        return
    f, r = run["fresh"], run["restart"]
    print(
        f"run {run['index']}: fresh ready {f['ready_wall_s'] * 1000:,.0f} ms"
        f" (self {f['ready_self_reported_s']:.2f} s), restart ready"
        f" {r['ready_wall_s'] * 1000:,.0f} ms (self {r['ready_self_reported_s']:.2f} s);"
        f" idle RSS {f['idle']['rss_bytes'] / MIB:.0f} / {r['idle']['rss_bytes'] / MIB:.0f} MiB,"
        f" CPU {f['idle']['cpu_pct']:.1f} / {r['idle']['cpu_pct']:.1f}%;"
        f" shutdown {f['shutdown_s'] * 1000:,.0f} / {r['shutdown_s'] * 1000:,.0f} ms"
        f" (exit {f['exit_code']} / {r['exit_code']}); resumed at message"
        f" {run['resume']['first_message']:,}{'' if run['resume']['ok'] else ' (WRONG)'}",
        flush=True,
    )


# --- where start-up goes --------------------------------------------------------------------------


async def time_command(command: list[str]) -> float:
    """Wall seconds from spawn to exit of a short command (it must succeed)."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=REPO,
    )
    try:
        _, stderr = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {proc.returncode}: {stderr.decode()}")
    return elapsed


async def measure_imports(runs: int) -> dict[str, Any]:
    """The interpreter alone, and the interpreter plus every module the standalone command
    imports, each spawned and timed to exit: the part of time-to-ready before any server
    starts."""
    python = sys.executable
    commands = {
        "interpreter": [python, "-c", "pass"],
        "imports": [python, "-c", "import magnetar.cli, magnetar.cli.standalone"],
    }
    times: dict[str, list[float]] = {key: [] for key in commands}
    for _ in range(runs):
        for key, command in commands.items():
            times[key].append(await time_command(command))
    return {key: summary(values) for key, values in times.items()} | {
        "commands": {
            key: shlex.join([python_path(), *command[1:]]) for key, command in commands.items()
        }
    }


# --- summary and report ---------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    """p50 (nearest rank) / min / max / n; None when there are no values."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return {"n": 0, "p50": None, "min": None, "max": None}
    return {
        "n": len(ordered),
        "p50": percentile(ordered, 50),
        "min": ordered[0],
        "max": ordered[-1],
    }


FIGURES: tuple[tuple[str, str, tuple[str, ...], float, str], ...] = (
    # key, label, path in a run, scale, unit
    ("fresh_ready_wall", "fresh: time to ready, wall", ("fresh", "ready_wall_s"), 1000, "ms"),
    (
        "fresh_ready_self",
        "fresh: time to ready, self-reported",
        ("fresh", "ready_self_reported_s"),
        1000,
        "ms",
    ),
    ("restart_ready_wall", "restart: time to ready, wall", ("restart", "ready_wall_s"), 1000, "ms"),
    (
        "restart_ready_self",
        "restart: time to ready, self-reported",
        ("restart", "ready_self_reported_s"),
        1000,
        "ms",
    ),
    (
        "restart_first_message",
        "restart: new client to first message",
        ("resume", "first_message_s"),
        1000,
        "ms",
    ),
    ("fresh_idle_rss", "fresh: idle RSS (VmRSS)", ("fresh", "idle", "rss_bytes"), 1 / MIB, "MiB"),
    ("fresh_idle_hwm", "fresh: peak RSS (VmHWM)", ("fresh", "idle", "hwm_bytes"), 1 / MIB, "MiB"),
    (
        "restart_idle_rss",
        "restart: idle RSS (VmRSS)",
        ("restart", "idle", "rss_bytes"),
        1 / MIB,
        "MiB",
    ),
    (
        "restart_idle_hwm",
        "restart: peak RSS (VmHWM)",
        ("restart", "idle", "hwm_bytes"),
        1 / MIB,
        "MiB",
    ),
    ("fresh_idle_cpu", "fresh: idle CPU", ("fresh", "idle", "cpu_pct"), 1, "% of a core"),
    ("restart_idle_cpu", "restart: idle CPU", ("restart", "idle", "cpu_pct"), 1, "% of a core"),
    ("fresh_threads", "fresh: threads when idle", ("fresh", "idle", "threads"), 1, ""),
    ("restart_threads", "restart: threads when idle", ("restart", "idle", "threads"), 1, ""),
    (
        "fresh_startup_cpu",
        "fresh: CPU time from spawn to end of idle window",
        ("fresh", "idle", "cpu_total_s"),
        1000,
        "ms",
    ),
    (
        "fresh_shutdown",
        "fresh (after writing the state): shutdown, SIGINT to exit",
        ("fresh", "shutdown_s"),
        1000,
        "ms",
    ),
    (
        "restart_shutdown",
        "restart: shutdown, SIGINT to exit",
        ("restart", "shutdown_s"),
        1000,
        "ms",
    ),
)


def _dig(run: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = run
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["ok"]]
    figures = {}
    for key, label, path, scale, unit in FIGURES:
        s = summary([_dig(r, path) for r in ok])
        for k in ("p50", "min", "max"):
            if s[k] is not None:
                s[k] *= scale
        figures[key] = {"label": label, "unit": unit, **s}
    exit_codes = [_dig(r, (phase, "exit_code")) for r in runs for phase in ("fresh", "restart")]
    return {
        "runs": len(runs),
        "ok_runs": len(ok),
        "figures": figures,
        "exit_codes": [c for c in exit_codes if c is not None],
        "all_exit_codes_zero": all(c == 0 for c in exit_codes if c is not None)
        and bool(exit_codes),
        "resumed_correctly": sum(1 for r in runs if _dig(r, ("resume", "ok"))),
    }


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "MiB":
        return f"{value:,.1f}"
    if unit.startswith("%"):
        return f"{value:.2f}"
    if unit == "ms" and value < 100:
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def render_markdown(results: dict[str, Any]) -> str:
    s = results["summary"]
    p = results["parameters"]
    imports = results["imports"]
    lines = [
        *report_head(results, "Standalone benchmark", raw_limits=False),
        "",
        (
            f"`{p['command']}` with default settings ({p['bookies']}), on free ports, {s['runs']}"
            f" runs ({s['ok_runs']} succeeded), each on a new data directory: start (fresh),"
            f" {p['idle_s']:g} s idle, write {p['messages']:,} messages of {p['message_bytes']} B"
            f" to one topic and acknowledge half of them on a subscription, SIGINT; start again"
            f" on the same directory (restart), {p['idle_s']:g} s idle, check that the"
            " subscription resumes at the first unacknowledged message, SIGINT. No targets:"
            " figures only. The machine is shared and noisy: compare within this run only."
        ),
        "",
        "| figure | p50 | min | max | unit |",
        "|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {f['label']} | {_fmt(f['p50'], f['unit'])} | {_fmt(f['min'], f['unit'])} |"
        f" {_fmt(f['max'], f['unit'])} | {f['unit']} |"
        for f in s["figures"].values()
    )
    codes = collections.Counter(s["exit_codes"])
    lines += [
        "",
        (
            f"Exit codes after SIGINT: {', '.join(f'{c} ({n}x)' for c, n in sorted(codes.items()))}"
            f" ({'all 0' if s['all_exit_codes_zero'] else 'NOT all 0'}). The subscription resumed"
            f" at the first unacknowledged message after {s['resumed_correctly']} of"
            f" {s['runs']} restarts."
        ),
        "",
        "| before any server starts (spawn to exit) | p50 | min | max | unit |",
        "|---|---|---|---|---|",
    ]
    for key, label in (
        ("interpreter", f"the interpreter alone: `{imports['commands']['interpreter']}`"),
        ("imports", f"interpreter + imports: `{imports['commands']['imports']}`"),
    ):
        f = imports[key]
        lines.append(
            f"| {label} | {_fmt(f['p50'] * 1000, 'ms')} | {_fmt(f['min'] * 1000, 'ms')} |"
            f" {_fmt(f['max'] * 1000, 'ms')} | ms |"
        )
    failed = [r for r in results["runs"] if not r["ok"]]
    if failed:
        lines += ["", "## Failed runs", ""]
        for r in failed:
            lines.append(f"- run {r['index']}: {r.get('error', 'see the .json file')}")
    lines += [
        "",
        "## What the figures mean",
        "",
        (
            "- **time to ready, wall**: from just before `subprocess.Popen` until the benchmark"
            " read the ready line (`magnetar standalone ready in X s: ...`, on stdout) from the"
            " pipe, in a thread of its own. **self-reported** is that X: the process's age when"
            " it was ready, from `/proc/self/stat` (interpreter start and imports included, in"
            " 10 ms ticks, printed to 0.01 s). The difference is the spawn and the pipe."
        ),
        (
            "- **restart**: the same data directory and ports after a clean SIGINT shutdown, with"
            " the topic's ledgers, the metadata and the subscription's position in it. **new"
            " client to first message**: after the restart's idle window, a new client"
            " subscribes on the same subscription and receives its first message (which loads"
            " the topic, if the broker had not loaded it at start)."
        ),
        (
            f"- **idle RSS / peak RSS**: `VmRSS` and `VmHWM` from `/proc/<pid>/status`,"
            f" {p['idle_s']:g} s after the ready line with no client connected (MiB = 2^20"
            " bytes). The peak is the most the process held since it started: for the"
            " fresh start that is start-up itself, for the restart start-up and recovery."
        ),
        (
            "- **idle CPU**: user + system CPU time of the process (`/proc/<pid>/stat`, all"
            " threads) over the idle window, as % of one core (counted in 10 ms ticks: one"
            " tick in the window is 0.1% at 10 s idle): background work (lease and load"
            " reports, journal and gRPC timers). **CPU time from spawn to end of idle window**:"
            " its total CPU since it started, i.e. mostly what starting cost."
            f" The machine has {results['machine']['cpu_count']} cores."
        ),
        ("- **threads**: `Threads` from `/proc/<pid>/status` at the end of the idle window."),
        (
            "- **shutdown**: from SIGINT until the process had exited (`waitpid`), with its"
            " exit code, which must be 0. The fresh process is stopped right after the client"
            " that wrote the state closed; the restarted one right after the resume check."
        ),
        (
            "- **before any server starts**: a new interpreter doing nothing, and one importing"
            " every module the standalone command imports, timed from spawn to exit: the part"
            " of time to ready that is not starting servers."
        ),
    ]
    return report_text(
        lines,
        "Every run's figures, the ready lines, the state written and machine details",
        next_to="it",
    )


# --- main -----------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    print(f"data directories in {root}", flush=True)
    example = standalone_command(Path("DIR"), 0, 0, args.standalone_arg)
    results: dict[str, Any] = {
        **results_head("standalone", "standalone_bench.py", argv, started, args),
        "parameters": {
            "command": shlex.join(
                [
                    str(Path(example[0]).relative_to(REPO))
                    if Path(example[0]).is_relative_to(REPO)
                    else example[0],
                    "standalone",
                    "--data-dir",
                    "DIR",
                    "--port",
                    "P",
                    "--http-port",
                    "H",
                    *(args.standalone_arg or []),
                ]
            ),
            "bookies": "3 bookies, E3/Qw2/Qa2"
            if not args.standalone_arg
            else "see --standalone-arg",
            "child_env": {"GRPC_VERBOSITY": "ERROR"},
            "runs": args.runs,
            "idle_s": args.idle_s,
            "messages": args.messages,
            "message_bytes": args.message_bytes,
            "send_window": SEND_WINDOW,
        },
        "machine": machine_info(root),
        "runs": [],
    }
    results["imports"] = await measure_imports(args.runs)
    print(
        f"interpreter alone {results['imports']['interpreter']['p50'] * 1000:,.0f} ms, with the"
        f" standalone's imports {results['imports']['imports']['p50'] * 1000:,.0f} ms (p50)",
        flush=True,
    )
    for index in range(args.runs):
        run = await one_run(index, args, root)
        results["runs"].append(run)
        _print_run(run)
    results["summary"] = summarize(results["runs"])
    results["elapsed_s"] = time.time() - started
    for figure in results["summary"]["figures"].values():
        print(
            f"{figure['label']}: p50 {_fmt(figure['p50'], figure['unit'])}, min"
            f" {_fmt(figure['min'], figure['unit'])}, max {_fmt(figure['max'], figure['unit'])}"
            f" {figure['unit']}",
            flush=True,
        )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "standalone_bench.py",
        (
            "Benchmark `magnetar standalone` as a real process: time to ready on a fresh data"
            " directory and on a restart with data in it (wall, from spawn to the ready line,"
            " and as the process reports it), idle RSS, threads and CPU after --idle-s, and"
            " the time from SIGINT to exit with the exit code; p50/min/max over --runs runs."
            " Writes standalone-<date>.json and .md to --out. Exits 0 if every run succeeded"
            " (exit codes 0, subscription resumed where it was), else 1 (results are written"
            " either way)."
        ),
    )
    add("--runs", type=int, default=10, help="runs (each: a fresh start and a restart)")
    add("--idle-s", type=float, default=10.0, help="idle seconds after ready before measuring")
    add("--messages", type=int, default=10_000, help="messages written before the restart")
    add("--message-bytes", type=int, default=100, help="size of each message")
    add(
        "--standalone-arg",
        action="append",
        help="an extra argument for `magnetar standalone` (repeatable), e.g."
        " --standalone-arg=--bookies --standalone-arg=1",
    )
    add_quick_and_tag(add, "standalone", quick="3 runs, 3 s idle")
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the data directories and removed at the end"
        ),
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = min(args.runs, 3)
        args.idle_s = min(args.idle_s, 3.0)
        args.tag = args.tag or "quick"
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.message_bytes < NUMBER_DIGITS:
        parser.error(f"--message-bytes must be at least {NUMBER_DIGITS}")
    if args.messages < 2:
        parser.error("--messages must be at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    # the client library logs its connections; the benchmark's own output is enough
    return bench_main("standalone", argv, parse_args, bench, render_markdown, ok=all_ok("runs"))


if __name__ == "__main__":
    raise SystemExit(main())
