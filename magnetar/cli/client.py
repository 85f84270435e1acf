"""What the client-side commands of ``magnetar`` share: the argument types, the options every
command has, one sync client per command, output helpers, and :func:`run_client_command`.

The commands themselves are grouped in :mod:`~magnetar.cli.topics` (``topics``),
:mod:`~magnetar.cli.subscriptions` (``subscriptions``), :mod:`~magnetar.cli.messages`
(``produce`` and ``consume``), :mod:`~magnetar.cli.tenants` (``tenants`` and ``namespaces``) and
:mod:`~magnetar.cli.cluster` (the ``cluster`` views, through a broker or the metadata store).

Each command opens one sync client (``magnetar.AdminClient`` or ``magnetar.Client``) on
``--service-url`` with ``--operation-timeout-s`` (default 10 s, so that a broker that is not
there fails the command quickly instead of after the library's 30 s) and the credentials and
TLS settings of :func:`magnetar.cli.support.client_settings`, does its work and closes it.
Output is a human table or summary, or with ``--json`` one JSON document (``consume``: one JSON
object per message and line). Errors are the client's typed errors (a refusal is an
``AuthenticationError`` or ``AuthorizationError``); ``magnetar.cli`` prints their message and
exits 1. Bad flag values (``k=v``, message ids, times) are usage errors (exit 2).
``docs/cli.md`` is the user's reference; keep it in step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from magnetar.cli.support import (
    EXIT_OK,
    add_client_options,
    client_settings,
)

if TYPE_CHECKING:
    from magnetar.aio.message_id import MessageId
    from magnetar.client import AdminClient, Client


CLIENT_COMMANDS = {
    "topics": "create, list, get, delete topics; stats; partitions; unload",
    "subscriptions": "list, create, reset, delete subscriptions",
    "produce": "send messages from the command line, a file or stdin",
    "consume": "receive (and acknowledge) messages on the command line",
    "tenants": "create, update, list, get, delete tenants and their admin roles",
    "namespaces": "create, list, delete namespaces; grant, revoke and list permissions",
}


DEFAULT_OPERATION_TIMEOUT_S = 10.0


def parse_property(text: str) -> tuple[str, str]:
    """``"k=v"`` as ``("k", "v")``; the value may hold ``=``, the key may not be empty."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_property_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``-p/--property K=V`` (repeatable), collected as ``args.properties``."""
    parser.add_argument(
        "-p",
        "--property",
        dest="properties",
        action="append",
        type=parse_property,
        default=[],
        metavar="K=V",
        help=help_text,
    )


def parse_message_id(text: str) -> MessageId:
    """A message id as ``magnetar`` prints it, ``ledger:entry:batch_index:partition``; the last
    two parts may be left out (batch index -1: the whole entry; partition -1: not
    partitioned)."""
    from magnetar.aio.message_id import MessageId  # noqa: PLC0415 - keep --help fast

    parts = text.strip().split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if not 2 <= len(numbers) <= 4 or numbers[0] < 0 or numbers[1] < 0:
        raise argparse.ArgumentTypeError(
            f"a message id is LEDGER:ENTRY[:BATCH_INDEX[:PARTITION]] as consume and produce print"
            f" it (e.g. 15:0:3:1), got {text!r}"
        )
    return MessageId(*numbers)


NEGATIVE_VALUE = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(?:\.\d+)?(?:ms|s|m|h|d)$")
"""What argparse must take as a value although it starts with ``-``: numbers, relative times."""


_RELATIVE = re.compile(r"^-(?P<amount>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d)$")


_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time_ms(text: str, *, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch, from ms since the epoch, ISO-8601 (no offset: UTC), or
    a time relative to now (``-30s``, ``-10m``, ``-2h``, ``-1d``)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    match = _RELATIVE.match(text)
    if match:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        return now - int(float(match["amount"]) * _UNIT_MS[match["unit"]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "a time is milliseconds since the epoch, ISO-8601 (2026-11-21T10:00:00Z; no offset"
            f" means UTC) or relative to now (-30s, -10m, -2h, -1d), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def add_options(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    add_client_options(parser, json_output=json_output)
    parser.add_argument(
        "--operation-timeout-s",
        type=positive_seconds,
        default=DEFAULT_OPERATION_TIMEOUT_S,
        metavar="S",
        help="give up on a broker that does not answer after this long (default"
        f" {DEFAULT_OPERATION_TIMEOUT_S:g})",
    )


def add_action(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    handler: Callable[[argparse.Namespace], int],
    *,
    json_output: bool = True,
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=summary, description=summary)
    add_options(parser, json_output=json_output)
    parser.set_defaults(handler=handler, parser=parser)
    return parser


def run_client_command(args: argparse.Namespace) -> int:
    """Run a command built by :func:`add_client_commands`; its exit status."""
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # the reader of our output went away (`magnetar consume -n 0 | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def admin_client(args: argparse.Namespace) -> AdminClient:
    from magnetar.client import AdminClient  # noqa: PLC0415 - keep --help fast

    settings = client_settings(args)
    return AdminClient(args.service_url, operation_timeout_s=args.operation_timeout_s, **settings)


def sync_client(args: argparse.Namespace) -> Client:
    from magnetar.client import Client  # noqa: PLC0415

    settings = client_settings(args)
    return Client(args.service_url, operation_timeout_s=args.operation_timeout_s, **settings)


def full_topic_name(topic: str) -> str:
    from magnetar.aio.names import parse_topic  # noqa: PLC0415

    return parse_topic(topic).full


def print_json(value: object) -> None:
    print(json.dumps(value))


def emit(args: argparse.Namespace, document: object, human: str) -> int:
    if args.json:
        print_json(document)
    else:
        print(human)
    return EXIT_OK


def format_time(ms: int) -> str:
    """ms since the epoch as ISO-8601 UTC to the second; empty for 0 (unknown)."""
    if ms <= 0:
        return ""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def format_size(count: float) -> str:
    """A byte count for humans: 950 B, 12.3 KiB, 4.0 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_rate(messages: float, size: float) -> str:
    return f"{messages:.1f} msg/s, {format_size(size)}/s"
