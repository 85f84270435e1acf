"""The ``magnetar`` command.

Every command DESIGN §5 names is listed here so that ``magnetar --help`` shows the whole product;
the ones not built yet say so and exit with status 3 instead of pretending.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from magnetar import __version__

EXIT_NOT_BUILT = 3

COMMANDS = {
    "standalone": "everything in one process: embedded metadata, 3 bookies, 1 broker",
    "bookie": "run a bookie (storage node)",
    "broker": "run a broker",
    "topics": "create, list, delete topics; stats; partitions",
    "subscriptions": "list, reset, delete subscriptions",
    "produce": "send messages from the command line",
    "consume": "receive messages on the command line",
    "cluster": "brokers, bookies, ownership, ledgers",
    "perf": "produce / consume / end-to-end load with latency percentiles",
    "verify": "fault-injecting durability checker",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="magnetar",
        description="Magnetar: a Pulsar-style messaging system in Python.",
    )
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    print(
        f"magnetar {args.command}: not built yet in {__version__}. The foundation (metadata"
        " store, wire protocol) is in place; see CHANGELOG.md for what has landed.",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT


if __name__ == "__main__":
    sys.exit(main())
