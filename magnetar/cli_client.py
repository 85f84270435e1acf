"""The client-side commands of ``magnetar``: topics, subscriptions, produce, consume (being
written)."""

from __future__ import annotations

import argparse
import sys

from magnetar.cli_support import EXIT_NOT_BUILT

CLIENT_COMMANDS = {
    "topics": "create, list, delete topics; stats; partitions",
    "subscriptions": "list, create, reset, delete subscriptions",
    "produce": "send messages from the command line",
    "consume": "receive messages on the command line",
}


def add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, summary in CLIENT_COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run_client_command(args: argparse.Namespace) -> int:
    print(f"magnetar {args.command}: not built yet", file=sys.stderr)
    return EXIT_NOT_BUILT
