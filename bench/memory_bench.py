"""Memory benchmark: how much of what a standalone takes for many small entries it gives back
once the topics are deleted (issue 23, finding 6: RSS went 58 -> 759 MiB after 900,000 tiny
entries and topic deletes, and stayed there).

Run from the repository root::

    .venv/bin/python bench/memory_bench.py              # 900,000 entries over 30 topics
    .venv/bin/python bench/memory_bench.py --quick      # 100,000 entries over 10 topics

One ``magnetar standalone`` process (3 bookies and the broker in it, default settings, free
ports, a fresh data directory). Its resident set size (``VmRSS`` in ``/proc/<pid>/status``) is
read: idle; after every topic got its entries (one message of 10 B per entry: the producer's
batching is off, so every message is an entry of its own); right after the topics are deleted;
and again after ``--settle-s`` seconds. Writes ``bench/results/memory-<date>.json`` and ``.md``
(``--quick``: ``memory-<date>-quick.*``). The figures are printed, never asserted: the machine
is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import REPO, RESULTS, free_port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def git_revision() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


async def workload(
    url: str, pid: int, *, entries: int, topics: int, settle_s: float, rounds: int
) -> dict[str, Any]:
    from magnetar.aio import AdminClient, Client  # noqa: PLC0415 - after the path is set

    figures: dict[str, Any] = {"idle_mib": rss_mib(pid), "rounds": []}
    per_topic = entries // topics
    for round_index in range(rounds):
        names = [f"memory-bench-{round_index}-{i}" for i in range(topics)]
        row: dict[str, Any] = {}
        started = time.monotonic()
        async with Client(url, operation_timeout_s=60) as client:
            for name in names:
                producer = await client.create_producer(name, batching_max_messages=1)
                sent = 0
                while sent < per_topic:
                    chunk = min(5_000, per_topic - sent)
                    await asyncio.gather(*(producer.send_async(b"x" * 10) for _ in range(chunk)))
                    sent += chunk
                await producer.close()
        row["write_s"] = round(time.monotonic() - started, 1)
        row["written_mib"] = rss_mib(pid)
        async with AdminClient(url) as admin:
            for name in names:
                await admin.delete_topic(name, force=True)
        row["deleted_mib"] = rss_mib(pid)
        await asyncio.sleep(settle_s)
        row["settled_mib"] = rss_mib(pid)
        figures["rounds"].append(row)
    figures["entries_per_round"] = per_topic * topics
    first, last = figures["rounds"][0], figures["rounds"][-1]
    grown = first["written_mib"] - figures["idle_mib"]
    kept = first["settled_mib"] - figures["idle_mib"]
    figures["given_back_share"] = round(1 - kept / grown, 3) if grown > 0 else None
    figures["growth_after_first_round_mib"] = round(last["settled_mib"] - first["settled_mib"], 1)
    return figures


def run(entries: int, topics: int, settle_s: float, rounds: int) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    port = free_port()
    env = dict(os.environ, MAGNETAR_LOG_LEVEL="warning")
    command = [
        sys.executable, "-m", "magnetar.cli", "standalone", "--data-dir", str(data),
        "--port", str(port), "--http-port", "0", "--pulsar-port", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if b"ready" in line:
                break
        else:
            raise RuntimeError("the standalone ended before it was ready")
        time.sleep(2)  # its first load report and lookups settle
        url = f"magnetar://127.0.0.1:{port}"
        return asyncio.run(
            workload(
                url, proc.pid, entries=entries, topics=topics, settle_s=settle_s, rounds=rounds
            )
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", str(data)], check=False)


def write(figures: dict[str, Any], args: argparse.Namespace, tag: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"memory-{dt.date.today().isoformat()}{tag}"
    meta = {
        "command": "python bench/memory_bench.py"
        + (" --quick" if args.quick else "")
        + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
        + (f" --tag {args.tag}" if args.tag else ""),
        "rounds": args.rounds,
        "git": git_revision(),
        "entries": args.entries,
        "topics": args.topics,
        "settle_s": args.settle_s,
    }
    stem.with_suffix(".json").write_text(json.dumps({**meta, "figures": figures}, indent=2))
    f = figures
    lines = [
        f"# Memory benchmark, {dt.date.today().isoformat()}",
        "",
        f"Command: `.venv/bin/{meta['command']}`. Git {meta['git']}.",
        "",
        (
            f"One `magnetar standalone` (3 bookies and the broker in one process). Each round"
            f" writes {f['entries_per_round']:,} entries of one 10 B message each over"
            f" {args.topics} topics, then deletes every topic and waits {args.settle_s:g} s."
            f" Resident set size of the process; idle before the first round:"
            f" {f['idle_mib']:.1f} MiB."
        ),
        "",
        "| round | write s | RSS written MiB | right after the deletes | settled |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {r['write_s']} | {r['written_mib']:.1f} | {r['deleted_mib']:.1f} |"
            f" {r['settled_mib']:.1f} |"
            for i, r in enumerate(f["rounds"])
        ),
        "",
        (
            f"Given back after the first round: {f['given_back_share']:.0%} of what its writes"
            f" took. Settled RSS after the last round minus after the first:"
            f" {f['growth_after_first_round_mib']:+.1f} MiB (what later rounds kept on top:"
            " a leak grows with every round, memory the allocators hold for reuse does not)."
        ),
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines))
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=900_000)
    parser.add_argument("--topics", type=int, default=30)
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3, help="write and delete this many times")
    parser.add_argument("--quick", action="store_true", help="100,000 entries over 10 topics")
    parser.add_argument("--tag", default=None, help="name the results memory-<date>-<TAG>.*")
    args = parser.parse_args()
    if args.quick:
        args.entries, args.topics, args.settle_s = 100_000, 10, 10.0
    tag = f"-{args.tag}" if args.tag else ("-quick" if args.quick else "")
    figures = run(args.entries, args.topics, args.settle_s, args.rounds)
    stem = write(figures, args, tag)
    print(json.dumps(figures))
    print(f"wrote {stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
