"""``magnetar perf``: load generation with latency percentiles (being written)."""

from __future__ import annotations

import argparse
import sys

from magnetar.cli_support import EXIT_NOT_BUILT


def add_perf_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    summary = "produce / consume / end-to-end load with latency percentiles"
    sub = commands.add_parser("perf", help=summary, description=summary)
    sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run_perf(args: argparse.Namespace) -> int:  # noqa: ARG001
    print("magnetar perf: not built yet", file=sys.stderr)
    return EXIT_NOT_BUILT
