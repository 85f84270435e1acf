"""Bookie index benchmark: memory of the entry index for dense and sparse entry ids.

Issue 23, finding 9: nine one-byte adds with entry ids 2^20 apart grew a bookie's index by about
100 MiB, because a ledger's locations were one array from entry 0. This measures, each workload
in a fresh process of its own (so one workload's memory does not hide another's):

- ``RSS`` (``VmRSS`` of ``/proc/self/status``) before and after the entries are indexed;
- the index's own accounting (``Index.memory_bytes()``, where the code has it);
- the time per indexed entry (printed, never asserted: the machine is shared and noisy).

Run from the repository root::

    .venv/bin/python bench/bookie_index_bench.py                  # every workload, ~20 seconds
    .venv/bin/python bench/bookie_index_bench.py --label before   # e.g. with PYTHONPATH at an
                                                                  # older checkout

It prints a table and merges its figures, under ``--label`` (default ``current``), into
``bench/results/bookie-index-<date>.json``, then writes ``bookie-index-<date>.md`` with one table
per label. The ``engine-*`` workloads go through a real storage engine (segment files, group
commit, fdatasync) in a temporary directory instead of the bare index.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import MIB, REPO, RESULTS, quiet_logs


@dataclass(frozen=True, slots=True)
class Workload:
    key: str
    what: str
    entries: int
    stride: int
    """Entry ids are ``i * stride`` (1: dense)."""
    engine: bool = False


WORKLOADS = (
    Workload("dense-1M", "1,000,000 entries, ids 0..999,999, one ledger", 1_000_000, 1),
    Workload(
        "striped-1M", "1,000,000 entries, every 3rd id missing (E3/Qw2 striping)", 1_000_000, 0
    ),
    Workload("sparse-9x2^20", "9 entries, ids 2^20 apart (finding 9)", 9, 1 << 20),
    Workload(
        "sparse-250x2^20",
        "250 entries, ids 2^20 apart (finding 9's 3 GiB projection)",
        250,
        1 << 20,
    ),
    Workload(
        "engine-sparse-9x2^20",
        "9 one-byte adds, ids 2^20 apart, storage engine",
        9,
        1 << 20,
        engine=True,
    ),
    Workload(
        "engine-dense-20k",
        "20,000 one-byte adds, dense ids, storage engine",
        20_000,
        1,
        engine=True,
    ),
)
BY_KEY = {w.key: w for w in WORKLOADS}
OLD_CODE_LIMIT_IDS = 1 << 26
"""The bare-index workloads refuse an id range past this on code whose index has no accounting
(the pre-issue-23 array from entry 0): 250 ids 2^20 apart would take ~3 GiB there."""


@dataclass(frozen=True, slots=True)
class Result:
    key: str
    what: str
    entries: int
    id_range: int
    rss_before_bytes: int
    rss_after_bytes: int
    index_accounted_bytes: int | None
    ns_per_entry: float
    skipped: str = ""

    @property
    def rss_growth_bytes(self) -> int:
        return self.rss_after_bytes - self.rss_before_bytes

    @classmethod
    def of(
        cls,
        workload: Workload,
        ids: list[int],
        rss: tuple[int, int],
        accounted: int | None,
        seconds: float,
        *,
        skipped: str = "",
    ) -> Result:
        """What ``workload`` measured: its ``ids`` stored in ``seconds``, the RSS before and
        after, and what the index says it holds (None: it does not say)."""
        before, after = rss
        return cls(
            workload.key,
            workload.what,
            len(ids),
            ids[-1] + 1,
            before,
            after,
            accounted,
            seconds / len(ids) * 1e9,
            skipped,
        )


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def entry_ids(workload: Workload) -> Iterator[int]:
    if workload.stride == 0:  # two of every three ids, as one bookie of an E3/Qw2 ensemble
        produced = 0
        entry = 0
        while produced < workload.entries:
            if entry % 3 != 2:
                yield entry
                produced += 1
            entry += 1
        return
    yield from (i * workload.stride for i in range(workload.entries))


def run_index(workload: Workload) -> Result:
    from bookie.storage.index import Index  # noqa: PLC0415 - measured from a clean start

    ids = list(entry_ids(workload))
    index = Index()
    accounted = getattr(index, "memory_bytes", None)
    if accounted is None and ids[-1] > OLD_CODE_LIMIT_IDS:
        skipped = "an index without accounting would allocate GiBs"
        return Result.of(workload, ids, (0, 0), None, 0.0, skipped=skipped)
    before = rss_bytes()
    started = time.perf_counter()
    for n, entry_id in enumerate(ids):
        index.put_entry(1, entry_id, entry_id - 1, 1, n * 64, 64)
    elapsed = time.perf_counter() - started
    after = rss_bytes()
    memory = index.memory_bytes() if accounted is not None else None
    return Result.of(workload, ids, (before, after), memory, elapsed)


def run_engine(workload: Workload) -> Result:
    from bookie.entries import entry_checksum  # noqa: PLC0415
    from bookie.storage.config import StorageConfig  # noqa: PLC0415
    from bookie.storage.engine import EntryToStore, StorageEngine  # noqa: PLC0415

    ids = list(entry_ids(workload))

    async def run(directory: Path) -> Result:
        engine = await StorageEngine.open(directory, StorageConfig(gc_interval_s=0))
        adds = [EntryToStore(1, e, -1, entry_checksum(1, e, -1, b"x"), b"x") for e in ids]
        before = rss_bytes()
        started = time.perf_counter()
        for start in range(0, len(adds), 1000):
            await engine.add_entries(adds[start : start + 1000])
        elapsed = time.perf_counter() - started
        after = rss_bytes()
        accounted = getattr(engine.index, "memory_bytes", None)
        await engine.close()
        memory = accounted() if accounted is not None else None
        return Result.of(workload, ids, (before, after), memory, elapsed)

    with tempfile.TemporaryDirectory(prefix="magnetar-index-bench-") as tmp:
        return asyncio.run(run(Path(tmp)))


def run_one(key: str) -> None:
    """In the child process: run one workload and print its result as JSON."""

    quiet_logs()
    workload = BY_KEY[key]
    result = run_engine(workload) if workload.engine else run_index(workload)
    print(json.dumps(asdict(result)))


def run_in_child(key: str) -> Result:
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, __file__, "--one", key],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    ).stdout
    return Result(**json.loads(out.strip().splitlines()[-1]))


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.2f}"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| workload | entries | id range | RSS before (MiB) | RSS after (MiB)"
            " | RSS growth (MiB) | index accounted (MiB) | ns per entry |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["skipped"]:
            lines.append(
                f"| {r['key']} | {r['entries']:,} | {r['id_range']:,}"
                f" | skipped: {r['skipped']} |||||"
            )
            continue
        growth = r["rss_after_bytes"] - r["rss_before_bytes"]
        lines.append(
            f"| {r['key']} | {r['entries']:,} | {r['id_range']:,} | {mib(r['rss_before_bytes'])}"
            f" | {mib(r['rss_after_bytes'])} | {mib(growth)} | {mib(r['index_accounted_bytes'])}"
            f" | {r['ns_per_entry']:,.0f} |"
        )
    return "\n".join(lines)


def write_report(path: Path, runs: dict[str, Any]) -> None:
    parts = [
        f"# Bookie index memory, {path.stem.removeprefix('bookie-index-')}",
        "",
        (
            "Produced by `.venv/bin/python bench/bookie_index_bench.py [--label L]` (see its"
            " docstring). Each workload ran in a fresh process; RSS is `VmRSS` before and after"
            ' the entries were indexed, "index accounted" is `Index.memory_bytes()` (absent'
            " before issue 23). The machine is shared: the times are indications, not figures"
            " to compare across runs."
        ),
        "",
        "| workload | what |",
        "|---|---|",
        *(f"| {w.key} | {w.what} |" for w in WORKLOADS),
    ]
    for label, run in runs.items():
        parts += [
            "",
            f"## {label}",
            "",
            (
                f"Commit `{run['commit']}`, Python {run['python']}, code from `{run['code']}`,"
                f" {run['when']}."
            ),
            "",
            table(run["results"]),
        ]
    path.write_text("\n".join(parts) + "\n")


def git_commit(directory: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--short", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--label", default="current", help="name of this run in the results")
    parser.add_argument(
        "--workloads", default=",".join(BY_KEY), help="comma-separated workload keys"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.one:
        run_one(args.one)
        return 0
    import bookie  # noqa: PLC0415 - which checkout's code is measured

    code_dir = Path(bookie.__file__).resolve().parent.parent
    results = []
    for key in args.workloads.split(","):
        result = run_in_child(key)
        results.append(asdict(result))
        print(
            f"{key:>22}: RSS {mib(result.rss_before_bytes)} -> {mib(result.rss_after_bytes)} MiB"
            f" (+{mib(result.rss_growth_bytes)}), index accounted"
            f" {mib(result.index_accounted_bytes)} MiB, {result.ns_per_entry:,.0f} ns/entry"
            + (f" [skipped: {result.skipped}]" if result.skipped else ""),
            flush=True,
        )
    if args.no_write:
        return 0
    date = dt.datetime.now(dt.UTC).date().isoformat()
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS / f"bookie-index-{date}.json"
    runs = json.loads(json_path.read_text()) if json_path.exists() else {}
    runs[args.label] = {
        "commit": git_commit(code_dir),
        "code": str(code_dir.relative_to(REPO) if code_dir.is_relative_to(REPO) else code_dir),
        "python": platform.python_version(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "results": results,
    }
    json_path.write_text(json.dumps(runs, indent=2) + "\n")
    write_report(RESULTS / f"bookie-index-{date}.md", runs)
    print(f"wrote {json_path} and its .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
