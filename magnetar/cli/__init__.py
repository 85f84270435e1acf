"""The ``magnetar`` command.

Every command DESIGN §5 names is listed so that ``magnetar --help`` shows the whole product; the
ones not built yet say so and exit with status 3 instead of pretending. This module builds the
parser and runs the command; the commands live in one module per group:

- :mod:`~magnetar.cli.servers`: ``bookie``, ``standalone`` (:mod:`~magnetar.cli.standalone` runs
  it), ``broker``, ``autorecovery``;
- :mod:`~magnetar.cli.cluster`: ``cluster``, through a broker or on the metadata store;
- :mod:`~magnetar.cli.topics`, :mod:`~magnetar.cli.subscriptions`, :mod:`~magnetar.cli.messages`
  (``produce``, ``consume``) and :mod:`~magnetar.cli.tenants` (``tenants``, ``namespaces``),
  with what they share in :mod:`~magnetar.cli.client`;
- :mod:`~magnetar.cli.perf`, :mod:`~magnetar.cli.tokens` and :mod:`~magnetar.cli.verify`.

:mod:`~magnetar.cli.support` holds what every command shares: exit codes, credential options,
tables. Server commands take their settings from flags, ``MAGNETAR_*`` environment variables and
an optional ``--config`` TOML file (flags win), and log JSON lines to stderr unless
``--log-format console``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from magnetar import __version__
from magnetar.cli.servers import SERVER_SUMMARIES, add_server_command, run_server
from magnetar.cli.support import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_BUILT,
    EXIT_OK,
    EXIT_USAGE,
    error_text,
)
from magnetar.cli.verify import VERIFY_SUMMARY, add_verify_command, run_verify
from magnetar.common.errors import MagnetarError

NOT_BUILT: dict[str, str] = {}


_HEAVY_SUMMARIES = {**SERVER_SUMMARIES, "verify": VERIFY_SUMMARY}
"""Commands whose flags come from heavy modules (the servers' config classes, the checker):
built in full only when they are the command run, or for ``magnetar --help``."""


def _invoked(argv: Sequence[str] | None) -> str | None:
    """The command a command line runs (its first word), if that is all it needs."""
    words = list(sys.argv[1:] if argv is None else argv)
    return words[0] if words and not words[0].startswith("-") else None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the command line, the server commands and ``verify``
    that it does not run get their summary only, not the flags that need their heavy config
    classes: every client command starts about half a second sooner that way."""
    command = _invoked(argv) if argv is not None else None

    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = argparse.ArgumentParser(
        prog="magnetar",
        description="Magnetar: a Pulsar-style messaging system in Python.",
    )
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in _HEAVY_SUMMARIES.items():
        if not wanted(name):
            commands.add_parser(name, help=summary, description=summary)
    for name in SERVER_SUMMARIES:
        if wanted(name):
            add_server_command(commands, name)

    from magnetar.cli.cluster import add_cluster_command  # noqa: PLC0415
    from magnetar.cli.messages import add_consume_command, add_produce_command  # noqa: PLC0415
    from magnetar.cli.perf import add_perf_command  # noqa: PLC0415
    from magnetar.cli.subscriptions import add_subscriptions_command  # noqa: PLC0415
    from magnetar.cli.tenants import add_namespaces_command, add_tenants_command  # noqa: PLC0415
    from magnetar.cli.tokens import add_tokens_command  # noqa: PLC0415
    from magnetar.cli.topics import add_topics_command  # noqa: PLC0415

    add_cluster_command(commands)
    add_topics_command(commands)
    add_subscriptions_command(commands)
    add_produce_command(commands)
    add_consume_command(commands)
    add_tenants_command(commands)
    add_namespaces_command(commands)
    add_perf_command(commands)
    add_tokens_command(commands)
    if wanted("verify"):
        add_verify_command(commands)

    for name, summary in NOT_BUILT.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


_SERVERS = frozenset(SERVER_SUMMARIES)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command in _SERVERS:
            return run_server(args)
        if args.command == "cluster":
            from magnetar.cli.cluster import run_cluster  # noqa: PLC0415

            return run_cluster(args)
        from magnetar.cli.client import CLIENT_COMMANDS, run_client_command  # noqa: PLC0415

        if args.command in CLIENT_COMMANDS:
            return run_client_command(args)
        if args.command == "perf":
            from magnetar.cli.perf import run_perf  # noqa: PLC0415

            return run_perf(args)
        if args.command == "tokens":
            from magnetar.cli.tokens import run_tokens  # noqa: PLC0415

            return run_tokens(args)
        if args.command == "verify":
            return run_verify(args, argv)
    except MagnetarError as e:
        print(f"magnetar {args.command}: {error_text(e)}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:  # a port in use, a data directory that cannot be created ...
        print(f"magnetar {args.command}: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        # servers treat Ctrl-C as their normal stop; an interrupted client command did not finish
        return EXIT_OK if args.command in _SERVERS else EXIT_INTERRUPTED
    print(
        f"magnetar {args.command}: not built yet in {__version__}; see CHANGELOG.md for what has"
        " landed.",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT
