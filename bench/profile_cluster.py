"""Profile every process of a small cluster under an end-to-end load with py-spy.

Starts a ``LocalCluster`` as the suite does (its own etcd, 3 bookies, 1 broker, E3/Qw2/Qa2,
load shedding off), runs ``magnetar perf end-to-end --rate RATE`` against it, and after a 3 s
warm-up samples the broker, the first bookie and the perf process for 10 s with py-spy (which
must be installed: ``pip install py-spy``). It writes py-spy's raw (collapsed-stack) files and
prints each process's busiest frames, self and inclusive::

    .venv/bin/python bench/profile_cluster.py 2000   # writes /tmp/prof-{broker,bookie,perf}.txt
    .venv/bin/python bench/profile_cluster.py 50000 --out /tmp/p50k
    .venv/bin/python bench/profile_cluster.py 50000 --size 1024 --gil   # only GIL-holding time

This is how the 2026-11-22 suite run's "about 3 ms of CPU per entry" was attributed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import sys
import tempfile
from pathlib import Path

from magnetar.testing import LocalCluster

BROKER_ARGS = [
    *("--managed-ledger-ensemble-size", "3"),
    *("--managed-ledger-write-quorum", "2"),
    *("--managed-ledger-ack-quorum", "2"),
    *("--load-shedding-enabled", "false"),
]


def busiest(path: Path, top: int = 20) -> str:
    """The frames with the most samples in a py-spy raw file, self and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] += samples
        for frame in set(frames):
            within[frame] += samples
    lines = [f"{total} samples", "self:"]
    lines += [f"  {n / total:6.1%} {f}" for f, n in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {n / total:6.1%} {f}" for f, n in within.most_common(top)]
    return "\n".join(lines)


async def main(rate: int, out: Path, seconds: int, size: int, gil: bool) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    root = Path(tempfile.mkdtemp(prefix="profile-cluster-"))
    try:
        async with LocalCluster(root, bookies=3, brokers=1, broker_args=BROKER_ARGS) as cluster:
            perf = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "magnetar.cli", "perf", "end-to-end", "profiled"),
                *("--rate", str(rate), "--size", str(size), "--duration", str(seconds + 6)),
                *("--service-url", cluster.service_url, "--json", "-q"),
                stdout=asyncio.subprocess.PIPE,
            )
            await asyncio.sleep(3)
            targets = {
                "broker": cluster.brokers[0].pid,
                "bookie": cluster.bookies[0].pid,
                "perf": perf.pid,
            }
            spies = [
                await asyncio.create_subprocess_exec(
                    *(spy, "record", "-o", str(out / f"prof-{name}.txt"), "-f", "raw"),
                    *(("--gil",) if gil else ()),
                    *("-r", "250", "-d", str(seconds), "-p", str(pid)),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                for name, pid in targets.items()
            ]
            for process in spies:
                await process.wait()
            summary, _ = await perf.communicate()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(summary.decode().strip())
    for name in ("broker", "bookie", "perf"):
        print(f"=== {name}")
        print(busiest(out / f"prof-{name}.txt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rate", type=int, nargs="?", default=2000, help="messages per second")
    parser.add_argument("--out", type=Path, default=Path("/tmp"), help="where the files go")
    parser.add_argument("--seconds", type=int, default=10, help="how long py-spy samples")
    parser.add_argument("--size", type=int, default=100, help="message size in bytes")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL: where Python time goes, without the"
        " threads that wait (gRPC's poller, the journal's fdatasync, idle workers)",
    )
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(options.rate, options.out, options.seconds, options.size, options.gil))
