"""The ``magnetar`` command.

Every command DESIGN §5 names is listed so that ``magnetar --help`` shows the whole product; the
ones not built yet say so and exit with status 3 instead of pretending. Server commands take
their settings from flags, ``MAGNETAR_*`` environment variables and an optional ``--config``
TOML file (flags win), and log JSON lines to stderr unless ``--log-format console``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from magnetar import __version__
from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.errors import MagnetarError
from magnetar.common.log import configure_logging

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_BUILT = 3

NOT_BUILT = {
    "standalone": "everything in one process: embedded metadata, 3 bookies, 1 broker",
    "broker": "run a broker",
    "topics": "create, list, delete topics; stats; partitions",
    "subscriptions": "list, reset, delete subscriptions",
    "produce": "send messages from the command line",
    "consume": "receive messages on the command line",
    "cluster": "brokers, bookies, ownership, ledgers",
    "perf": "produce / consume / end-to-end load with latency percentiles",
    "verify": "fault-injecting durability checker",
}


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument(
        "--log-format",
        choices=["json", "console"],
        default=os.environ.get("MAGNETAR_LOG_FORMAT", "json"),
        help="log lines as JSON (default; env MAGNETAR_LOG_FORMAT) or for humans",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("MAGNETAR_LOG_LEVEL", "info"),
        help="debug, info, warning or error (env MAGNETAR_LOG_LEVEL)",
    )


def build_parser() -> argparse.ArgumentParser:
    from bookie.service.config import BookieConfig  # noqa: PLC0415 - keep --help fast

    parser = argparse.ArgumentParser(
        prog="magnetar",
        description="Magnetar: a Pulsar-style messaging system in Python.",
    )
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bookie = commands.add_parser(
        "bookie",
        help="run a bookie (storage node)",
        description="Run a bookie: the durable storage node (gRPC on --port, metrics on"
        " --http-port).",
    )
    _add_server_options(bookie)
    add_config_arguments(bookie, BookieConfig)

    for name, summary in NOT_BUILT.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _run_bookie(args: argparse.Namespace) -> int:
    from bookie.process import run_bookie  # noqa: PLC0415
    from bookie.service.config import BookieConfig  # noqa: PLC0415

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    # The journal's write+fdatasync thread must get the GIL back quickly when its syscalls
    # return, or group commits queue behind the event loop's 5 ms default slice.
    sys.setswitchinterval(0.001)
    config = load_config(
        BookieConfig, file=args.config, overrides=config_overrides_from_args(args, BookieConfig)
    )
    return asyncio.run(run_bookie(config))


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "bookie":
            return _run_bookie(args)
    except MagnetarError as e:
        print(f"magnetar {args.command}: {e.message}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    print(
        f"magnetar {args.command}: not built yet in {__version__}; see CHANGELOG.md for what has"
        " landed.",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT


if __name__ == "__main__":
    sys.exit(main())
