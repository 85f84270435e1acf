"""The client-side commands of ``magnetar``: ``topics``, ``subscriptions``, ``produce`` and
``consume``, ``tenants`` and ``namespaces`` (with their permissions; pulsar-admin's names and
flags), and the ``cluster`` views that go through a broker's admin service (``--service-url``).

Each command opens one sync client (``magnetar.AdminClient`` or ``magnetar.Client``) on
``--service-url`` with ``--operation-timeout-s`` (default 10 s, so that a broker that is not
there fails the command quickly instead of after the library's 30 s) and the credentials and
TLS settings of :func:`magnetar.cli_support.client_settings`, does its work and closes it.
Output is a human table or summary, or with ``--json`` one JSON document (``consume``: one JSON
object per message and line). Errors are the client's typed errors (a refusal is an
``AuthenticationError`` or ``AuthorizationError``); ``magnetar.cli`` prints their message and
exits 1. Bad flag values (``k=v``, message ids, times) are usage errors (exit 2).
``docs/cli.md`` is the user's reference; keep it in step.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from magnetar.cli_support import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    add_client_options,
    client_settings,
    table,
)

if TYPE_CHECKING:
    from magnetar.aio.message import Message
    from magnetar.aio.message_id import MessageId
    from magnetar.client import AdminClient, Client
    from magnetar.common.errors import MagnetarError

__all__ = [
    "CLIENT_COMMANDS",
    "DEFAULT_OPERATION_TIMEOUT_S",
    "MESSAGE_IDS_LISTED",
    "Progress",
    "add_client_commands",
    "format_value",
    "message_document",
    "parse_message_id",
    "parse_property",
    "parse_time_ms",
    "positive_seconds",
    "render_message",
    "render_stats",
    "run_client_command",
    "run_cluster_admin",
]

CLIENT_COMMANDS = {
    "topics": "create, list, get, delete topics; stats; partitions; unload",
    "subscriptions": "list, create, reset, delete subscriptions",
    "produce": "send messages from the command line, a file or stdin",
    "consume": "receive (and acknowledge) messages on the command line",
    "tenants": "create, update, list, get, delete tenants and their admin roles",
    "namespaces": "create, list, delete namespaces; grant, revoke and list permissions",
}

DEFAULT_OPERATION_TIMEOUT_S = 10.0

MESSAGE_IDS_LISTED = 1000
"""``produce --json`` lists the ids of the messages among the first this many sent (the first
and last ids are always given)."""

# --- argument types ------------------------------------------------------------------------------


def parse_property(text: str) -> tuple[str, str]:
    """``"k=v"`` as ``("k", "v")``; the value may hold ``=``, the key may not be empty."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_property_option(parser: argparse.ArgumentParser, help_text: str) -> None:
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


_NEGATIVE_VALUE = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(?:\.\d+)?(?:ms|s|m|h|d)$")
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


def _int_at_least(minimum: int) -> Callable[[str], int]:
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


# --- parsers -------------------------------------------------------------------------------------


def _options(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    add_client_options(parser, json_output=json_output)
    parser.add_argument(
        "--operation-timeout-s",
        type=positive_seconds,
        default=DEFAULT_OPERATION_TIMEOUT_S,
        metavar="S",
        help="give up on a broker that does not answer after this long (default"
        f" {DEFAULT_OPERATION_TIMEOUT_S:g})",
    )


def _sub(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    handler: Callable[[argparse.Namespace], int],
    *,
    json_output: bool = True,
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=summary, description=summary)
    _options(parser, json_output=json_output)
    parser.set_defaults(handler=handler, parser=parser)
    return parser


def add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``topics``, ``subscriptions``, ``produce`` and ``consume`` parsers."""
    topics = commands.add_parser(
        "topics", help=CLIENT_COMMANDS["topics"], description=CLIENT_COMMANDS["topics"]
    )
    what = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)

    create = _sub(what, "create", "create a topic (partitioned with --partitions N)", _topic_create)
    create.add_argument("topic")
    create.add_argument(
        "--partitions",
        type=_int_at_least(0),
        default=0,
        metavar="N",
        help="number of partitions (default 0: not partitioned)",
    )
    create.add_argument("--retention-time-ms", type=int, metavar="MS", help="-1: forever")
    create.add_argument("--retention-size-bytes", type=int, metavar="B", help="-1: no limit")
    create.add_argument("--message-ttl-ms", type=int, metavar="MS", help="0: never")
    create.add_argument("--backlog-quota-bytes", type=int, metavar="B", help="-1: no limit")
    create.add_argument(
        "--max-redelivery-count", type=int, metavar="N", help="then to the dead-letter topic"
    )
    create.add_argument(
        "--deduplication",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="drop resent messages by (producer, sequence id) (default: the broker's)",
    )
    _add_property_option(create, "a topic property (repeatable)")

    listing = _sub(what, "list", "list topics", _topic_list)
    listing.add_argument("--namespace", default="", metavar="TENANT/NS", help="only this namespace")

    get = _sub(what, "get", "a topic's partitions, policies, properties, creation time", _topic_get)
    get.add_argument("topic")

    delete = _sub(what, "delete", "delete a topic and all its messages", _topic_delete)
    delete.add_argument("topic")
    delete.add_argument(
        "--force", action="store_true", help="even with producers or consumers attached"
    )

    stats = _sub(what, "stats", "rates, storage, offsets, subscriptions, consumers", _topic_stats)
    stats.add_argument("topic")
    stats.add_argument(
        "--internal", action="store_true", help="also each partition's ledgers and cursors"
    )

    partitions = _sub(
        what, "partitions", "partition count, owners, earliest and next offsets", _partitions
    )
    partitions.add_argument("topic")

    grow = _sub(
        what, "update-partitions", "grow a partitioned topic to N partitions", _update_partitions
    )
    grow.add_argument("topic")
    grow.add_argument("partitions", type=_int_at_least(1), metavar="N")

    unload = _sub(what, "unload", "release the topic from its brokers (placed again)", _unload)
    unload.add_argument("topic")

    subscriptions = commands.add_parser(
        "subscriptions",
        help=CLIENT_COMMANDS["subscriptions"],
        description=CLIENT_COMMANDS["subscriptions"],
    )
    what = subscriptions.add_subparsers(
        dest="subscriptions_command", metavar="ACTION", required=True
    )
    sub_list = _sub(what, "list", "a topic's subscriptions with backlog and consumers", _sub_list)
    sub_list.add_argument("topic")

    sub_create = _sub(what, "create", "create a durable subscription", _sub_create)
    sub_create.add_argument("topic")
    sub_create.add_argument("subscription")
    sub_create.add_argument(
        "--position",
        choices=["earliest", "latest"],
        default="latest",
        help="where it starts (default latest: only messages published from now on)",
    )

    reset = _sub(what, "reset", "move a subscription (on every partition)", _sub_reset)
    # `--time -10m` is a value, not an unknown option (argparse would only let -10 through);
    # every parser on the way to the value classifies it
    for parser in (subscriptions, reset):
        parser._negative_number_matcher = _NEGATIVE_VALUE
    reset.add_argument("topic")
    reset.add_argument("subscription")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the first stored message")
    target.add_argument("--to-latest", action="store_true", help="after the last message")
    target.add_argument(
        "--offset", type=_int_at_least(0), metavar="N", help="this offset on every partition"
    )
    target.add_argument(
        "--message-id",
        type=parse_message_id,
        metavar="ID",
        help="this message (L:E:B:P as consume prints it; only its partition moves)",
    )
    target.add_argument(
        "--time",
        type=parse_time_ms,
        metavar="T",
        help="first message published at or after T: ms since the epoch, ISO-8601"
        " (2026-11-21T10:00:00Z), or relative (-30s, -10m, -2h, -1d)",
    )

    sub_delete = _sub(what, "delete", "delete a subscription", _sub_delete)
    sub_delete.add_argument("topic")
    sub_delete.add_argument("subscription")
    sub_delete.add_argument(
        "--force", action="store_true", help="even with consumers attached (they are closed)"
    )

    produce = commands.add_parser(
        "produce",
        help=CLIENT_COMMANDS["produce"],
        description="Publish messages: each -m, or each line of FILE, or each line of stdin"
        " (when neither is given, or FILE is '-'). Line endings are removed; empty lines are"
        " sent as empty messages.",
    )
    _options(produce)
    produce.set_defaults(handler=_produce, parser=produce)
    produce.add_argument("topic")
    source = produce.add_mutually_exclusive_group()
    source.add_argument(
        "-m",
        "--message",
        dest="messages",
        action="append",
        metavar="MSG",
        help="a message (repeatable)",
    )
    source.add_argument("-f", "--file", metavar="FILE", help="one message per line; '-': stdin")
    produce.add_argument("-k", "--key", help="partition key of every message")
    _add_property_option(produce, "a property of every message (repeatable)")
    produce.add_argument(
        "-n",
        "--repeat",
        type=_int_at_least(1),
        default=1,
        metavar="N",
        help="send each message N times in a row (default 1)",
    )
    produce.add_argument(
        "--deliver-after-ms",
        type=_int_at_least(0),
        metavar="MS",
        help="shared and key_shared subscriptions receive the messages no earlier than this"
        " many ms from now (exclusive and failover ones at once)",
    )

    consume = commands.add_parser(
        "consume",
        help=CLIENT_COMMANDS["consume"],
        description="Receive messages on a subscription, print each and acknowledge it (or"
        " read them with --reader, no subscription). Exits 4 when --timeout passes before -n"
        " messages arrived.",
    )
    _options(consume)
    consume.set_defaults(handler=_consume, parser=consume)
    consume.add_argument("topic")
    consume.add_argument("-s", "--subscription", help="subscription name (not with --reader)")
    consume.add_argument(
        "-t",
        "--subscription-type",
        choices=["exclusive", "failover", "shared", "key_shared"],
        default="exclusive",
        help="default exclusive",
    )
    consume.add_argument(
        "-n",
        "--num-messages",
        type=_int_at_least(0),
        default=1,
        metavar="NUM",
        help="stop after NUM messages (default 1; 0: until Ctrl-C or --timeout)",
    )
    consume.add_argument(
        "--position",
        choices=["earliest", "latest"],
        default="latest",
        help="where a new subscription or a reader starts (default latest)",
    )
    consume.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="stop waiting after this long in all (default: wait for ever)",
    )
    consume.add_argument("--no-ack", action="store_true", help="do not acknowledge")
    consume.add_argument(
        "--reader", action="store_true", help="read from --position without a subscription"
    )
    _add_tenant_commands(commands)
    _add_namespace_commands(commands)


def _roles(text: str) -> list[str]:
    """``"r1,r2"`` as ``["r1", "r2"]`` (spaces and empty items dropped)."""
    return [role.strip() for role in text.split(",") if role.strip()]


_ACTIONS = ("produce", "consume")


def _actions(text: str) -> list[str]:
    """``"produce,consume"`` as ``["produce", "consume"]``; an unknown action is a usage error."""
    actions = [a.strip().lower() for a in text.split(",") if a.strip()]
    unknown = [a for a in actions if a not in _ACTIONS]
    if unknown or not actions:
        raise argparse.ArgumentTypeError(
            f"the actions are {' and '.join(_ACTIONS)}, comma-separated (e.g."
            f" produce,consume), got {text!r}"
        )
    return list(dict.fromkeys(actions))


def _add_tenant_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = commands.add_parser(
        "tenants",
        help=CLIENT_COMMANDS["tenants"],
        description="Tenants and the roles that administer them (their namespaces, permissions"
        " and topics). Creating, updating and deleting tenants needs a superuser.",
    )
    what = tenants.add_subparsers(dest="tenants_command", metavar="ACTION", required=True)
    roles_help = "comma-separated roles that administer the tenant (e.g. -r ops,team-a)"
    create = _sub(what, "create", "create a tenant", _tenant_create)
    create.add_argument("tenant", metavar="TENANT")
    create.add_argument(
        "-r", "--admin-roles", type=_roles, default=[], metavar="ROLES", help=roles_help
    )
    update = _sub(what, "update", "replace a tenant's admin roles", _tenant_update)
    update.add_argument("tenant", metavar="TENANT")
    update.add_argument(
        "-r",
        "--admin-roles",
        type=_roles,
        required=True,
        metavar="ROLES",
        help=roles_help + "; replaces the current ones ('' for none)",
    )
    _sub(what, "list", "the tenants this role may see (all of them for a superuser)", _tenant_list)
    get = _sub(what, "get", "a tenant's admin roles", _tenant_get)
    get.add_argument("tenant", metavar="TENANT")
    delete = _sub(
        what, "delete", "delete a tenant (refused while it has namespaces)", _tenant_delete
    )
    delete.add_argument("tenant", metavar="TENANT")


def _add_namespace_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    namespaces = commands.add_parser(
        "namespaces",
        help=CLIENT_COMMANDS["namespaces"],
        description="Namespaces (TENANT/NAMESPACE) and the permissions they grant roles on their"
        " topics. Needs an admin of the tenant or a superuser.",
    )
    what = namespaces.add_subparsers(dest="namespaces_command", metavar="ACTION", required=True)
    create = _sub(what, "create", "create a namespace", _namespace_create)
    create.add_argument("namespace", metavar="TENANT/NAMESPACE")
    listing = _sub(what, "list", "a tenant's namespaces", _namespace_list)
    listing.add_argument("tenant", metavar="TENANT")
    delete = _sub(
        what, "delete", "delete a namespace (refused while it has topics)", _namespace_delete
    )
    delete.add_argument("namespace", metavar="TENANT/NAMESPACE")
    grant = _sub(
        what,
        "grant-permission",
        "let a role produce and/or consume on every topic of a namespace",
        _grant_permission,
    )
    grant.add_argument("namespace", metavar="TENANT/NAMESPACE")
    grant.add_argument("--role", required=True, help="the role (a token's subject)")
    grant.add_argument(
        "--actions",
        type=_actions,
        required=True,
        metavar="ACTIONS",
        help="produce, consume or produce,consume; replaces what the role had here",
    )
    revoke = _sub(
        what, "revoke-permission", "take every permission on a namespace from a role", _revoke
    )
    revoke.add_argument("namespace", metavar="TENANT/NAMESPACE")
    revoke.add_argument("--role", required=True, help="the role")
    permissions = _sub(what, "permissions", "the roles granted on a namespace", _permissions)
    permissions.add_argument("namespace", metavar="TENANT/NAMESPACE")


# --- running -------------------------------------------------------------------------------------


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


def _admin(args: argparse.Namespace) -> AdminClient:
    from magnetar.client import AdminClient  # noqa: PLC0415 - keep --help fast

    settings = client_settings(args)
    return AdminClient(args.service_url, operation_timeout_s=args.operation_timeout_s, **settings)


def _client(args: argparse.Namespace) -> Client:
    from magnetar.client import Client  # noqa: PLC0415

    settings = client_settings(args)
    return Client(args.service_url, operation_timeout_s=args.operation_timeout_s, **settings)


def _full_name(topic: str) -> str:
    from magnetar.aio.names import parse_topic  # noqa: PLC0415

    return parse_topic(topic).full


def _print_json(value: object) -> None:
    print(json.dumps(value))


def _emit(args: argparse.Namespace, document: object, human: str) -> int:
    if args.json:
        _print_json(document)
    else:
        print(human)
    return EXIT_OK


def _time(ms: int) -> str:
    """ms since the epoch as ISO-8601 UTC to the second; empty for 0 (unknown)."""
    if ms <= 0:
        return ""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def _size(count: float) -> str:
    """A byte count for humans: 950 B, 12.3 KiB, 4.0 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _rate(messages: float, size: float) -> str:
    return f"{messages:.1f} msg/s, {_size(size)}/s"


# --- topics --------------------------------------------------------------------------------------


def _topic_create(args: argparse.Namespace) -> int:
    policies = {
        name: getattr(args, name)
        for name in (
            "retention_time_ms",
            "retention_size_bytes",
            "message_ttl_ms",
            "backlog_quota_bytes",
            "max_redelivery_count",
            "deduplication",
        )
        if getattr(args, name) is not None
    }
    with _admin(args) as admin:
        created = admin.create_topic(
            args.topic, args.partitions, policies=policies, properties=dict(args.properties)
        )
    count = created["partitions"]
    shape = f"{count} partitions" if count else "not partitioned"
    return _emit(args, created, f"created {created['topic']} ({shape})")


def _topic_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.list_topics(args.namespace)
    return _emit(args, topics, table(topics, ["topic", "partitions"]))


def _topic_get(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        info = admin.get_topic(args.topic)
    policies = {k: v for k, v in info["policies"].items() if v is not None}
    lines = [
        f"topic       {info['topic']}",
        f"partitions  {info['partitions'] or 'not partitioned'}",
        f"created     {_time(info['created_ms'])}",
        "policies    "
        + (
            ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(policies.items()))
            or "(broker defaults)"
        ),
        "properties  "
        + (", ".join(f"{k}={v}" for k, v in sorted(info["properties"].items())) or "(none)"),
    ]
    return _emit(args, info, "\n".join(lines))


def _topic_delete(args: argparse.Namespace) -> int:
    name = _full_name(args.topic)
    with _admin(args) as admin:
        admin.delete_topic(name, force=args.force)
    return _emit(args, {"topic": name, "deleted": True}, f"deleted {name}")


def _subscription_rows(stats: dict[str, Any], names: Iterable[str]) -> list[dict[str, Any]]:
    """One row per subscription, summed over the partitions."""
    rows: dict[str, dict[str, Any]] = {
        name: {
            "subscription": name,
            "type": "",
            "backlog_messages": 0,
            "unacked_messages": 0,
            "msg_rate_out": 0.0,
            "consumers": [],
        }
        for name in names
    }
    for partition in stats["partitions"]:
        for sub in partition["subscriptions"]:
            row = rows.setdefault(
                sub["subscription"],
                {
                    "subscription": sub["subscription"],
                    "type": "",
                    "backlog_messages": 0,
                    "unacked_messages": 0,
                    "msg_rate_out": 0.0,
                    "consumers": [],
                },
            )
            row["type"] = sub["subscription_type"]
            row["backlog_messages"] += sub["backlog_messages"]
            row["unacked_messages"] += sub["unacked_messages"]
            row["msg_rate_out"] += sub["msg_rate_out"]
            for consumer in sub["consumers"]:
                if consumer["consumer_name"] not in row["consumers"]:
                    row["consumers"].append(consumer["consumer_name"])
    return [rows[name] for name in sorted(rows)]


def _subscription_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no subscriptions"
    return table(
        [
            {
                **row,
                "backlog": row["backlog_messages"],
                "unacked": row["unacked_messages"],
                "rate_out": f"{row['msg_rate_out']:.1f}",
                "consumers": ", ".join(row["consumers"]) or "-",
            }
            for row in rows
        ],
        ["subscription", "type", "backlog", "unacked", "rate_out", "consumers"],
    )


def _partition_label(partition: dict[str, Any]) -> str:
    return "-" if partition["partition"] < 0 else str(partition["partition"])


def render_stats(stats: dict[str, Any]) -> str:
    """``topics stats`` for humans: totals, one row per partition, one per subscription, and
    with internal stats each partition's ledgers and cursors."""
    partitions = stats["partitions"]
    backlog = {
        p["partition_topic"]: max((s["backlog_messages"] for s in p["subscriptions"]), default=0)
        for p in partitions
    }
    partitioned = bool(partitions) and partitions[0]["partition"] >= 0
    lines = [
        f"topic       {stats['topic']}",
        f"partitions  {len(partitions) if partitioned else 'not partitioned'}",
        f"rate in     {_rate(stats['msg_rate_in'], stats['msg_throughput_in'])}",
        f"rate out    {_rate(stats['msg_rate_out'], stats['msg_throughput_out'])}",
        f"storage     {_size(stats['storage_size_bytes'])}",
        "",
        table(
            [
                {
                    "partition": _partition_label(p),
                    "owner": p["owner_broker_id"] or "(not loaded)",
                    "earliest": p["earliest_offset"],
                    "next": p["next_offset"],
                    "max_backlog": backlog[p["partition_topic"]],
                    "storage": _size(p["storage_size_bytes"]),
                    "rate_in": f"{p['msg_rate_in']:.1f}",
                    "rate_out": f"{p['msg_rate_out']:.1f}",
                    "publishers": len(p["publishers"]),
                }
                for p in partitions
            ],
            [
                "partition",
                "owner",
                "earliest",
                "next",
                "max_backlog",
                "storage",
                "rate_in",
                "rate_out",
                "publishers",
            ],
        ),
        *(
            f"cannot write: partition {_partition_label(p)} since"
            f" {_time(p['write_problem_since_ms'])}: {p['write_problem']}"
            for p in partitions
            if p.get("write_problem")
        ),
        "",
        _subscription_table(_subscription_rows(stats, ())),
    ]
    ledgers = [
        {
            "partition": _partition_label(p),
            "ledger": ledger["ledger_id"],
            "entries": ledger["entries"],
            "size": _size(ledger["size_bytes"]),
            "first_offset": ledger["first_offset"],
            "created": _time(ledger["created_ms"]),
            "state": ledger["state"].lower() or "-",
        }
        for p in partitions
        for ledger in p["ledgers"]
    ]
    cursors = [
        {
            "partition": _partition_label(p),
            "cursor": cursor["name"],
            "mark_delete": _position(cursor["mark_delete"]),
            "read_position": _position(cursor["read_position"]),
            "ack_ranges": cursor["ack_ranges"],
        }
        for p in partitions
        for cursor in p["cursors"]
    ]
    if ledgers or cursors:
        lines += [
            "",
            table(
                ledgers,
                ["partition", "ledger", "entries", "size", "first_offset", "created", "state"],
            ),
            "",
            table(cursors, ["partition", "cursor", "mark_delete", "read_position", "ack_ranges"]),
        ]
    return "\n".join(lines)


def _position(position: dict[str, Any] | None) -> str:
    if not position:
        return "-"
    return f"{position['ledger_id']}:{position['entry_id']}"


def _topic_stats(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        stats = admin.topic_stats(args.topic, internal=args.internal)
    return _emit(args, stats, render_stats(stats))


def _partitions(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        count = admin.get_partitions(args.topic)
        stats = admin.topic_stats(args.topic)
    rows = [
        {
            "partition": p["partition"],
            "partition_topic": p["partition_topic"],
            "owner_broker_id": p["owner_broker_id"],
            "earliest_offset": p["earliest_offset"],
            "next_offset": p["next_offset"],
        }
        for p in stats["partitions"]
    ]
    shape = f"{count} partitions" if count else "not partitioned"
    human = f"{stats['topic']}: {shape}\n" + table(
        [
            {
                "partition": _partition_label(r),
                "topic": r["partition_topic"],
                "owner": r["owner_broker_id"] or "(not loaded)",
                "earliest": r["earliest_offset"],
                "next": r["next_offset"],
            }
            for r in rows
        ],
        ["partition", "topic", "owner", "earliest", "next"],
    )
    return _emit(args, {"topic": stats["topic"], "partitions": count, "details": rows}, human)


def _update_partitions(args: argparse.Namespace) -> int:
    name = _full_name(args.topic)
    with _admin(args) as admin:
        count = admin.update_partitions(name, args.partitions)
    return _emit(args, {"topic": name, "partitions": count}, f"{name} now has {count} partitions")


def _unload(args: argparse.Namespace) -> int:
    name = _full_name(args.topic)
    with _admin(args) as admin:
        admin.unload_topic(name)
    return _emit(args, {"topic": name, "unloaded": True}, f"unloaded {name}")


# --- subscriptions -------------------------------------------------------------------------------


def _sub_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        names = admin.list_subscriptions(args.topic)
        stats = admin.topic_stats(args.topic)
    rows = _subscription_rows(stats, names)
    return _emit(args, rows, _subscription_table(rows))


def _sub_create(args: argparse.Namespace) -> int:
    name = _full_name(args.topic)
    with _admin(args) as admin:
        admin.create_subscription(name, args.subscription, args.position)
    return _emit(
        args,
        {"topic": name, "subscription": args.subscription, "position": args.position},
        f"created subscription {args.subscription!r} on {name} at {args.position}",
    )


def _sub_reset(args: argparse.Namespace) -> int:
    from magnetar.aio.names import parse_topic  # noqa: PLC0415
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415

    name = parse_topic(args.topic)
    target: Any = None
    publish_time_ms: int | None = None
    with _admin(args) as admin:
        if args.to_earliest:
            target, where = "earliest", "the earliest message"
        elif args.to_latest:
            target, where = "latest", "the end"
        elif args.offset is not None:
            target, where = args.offset, f"offset {args.offset}"
        elif args.time is not None:
            publish_time_ms = args.time
            where = f"the first message published at or after {_time(args.time) or args.time}"
        else:
            target = args.message_id
            where = f"message {target}"
            # A message id lives in one partition: move only that one (the id's ledger means
            # nothing to the others).
            if not name.is_partition and admin.get_partitions(name.full) > 0:
                if target.partition < 0:
                    raise InvalidArgumentError(
                        f"{name.full} is partitioned and message id {args.message_id} names no"
                        " partition; give LEDGER:ENTRY:BATCH:PARTITION as consume prints it, or"
                        " the partition topic (TOPIC-partition-N)"
                    )
                name = name.partition_name(target.partition)
        admin.reset_cursor(name.full, args.subscription, target, publish_time_ms=publish_time_ms)
    return _emit(
        args,
        {
            "topic": name.full,
            "subscription": args.subscription,
            "reset_to": str(target) if target is not None else {"publish_time_ms": args.time},
        },
        f"reset subscription {args.subscription!r} of {name.full} to {where}",
    )


def _sub_delete(args: argparse.Namespace) -> int:
    name = _full_name(args.topic)
    with _admin(args) as admin:
        admin.delete_subscription(name, args.subscription, force=args.force)
    return _emit(
        args,
        {"topic": name, "subscription": args.subscription, "deleted": True},
        f"deleted subscription {args.subscription!r} of {name}",
    )


# --- tenants and namespaces ----------------------------------------------------------------------


def _role_list(roles: list[str]) -> str:
    return ", ".join(roles) or "(none)"


def _tenant_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.create_tenant(args.tenant, args.admin_roles)
    return _emit(
        args,
        {"tenant": args.tenant, "admin_roles": args.admin_roles},
        f"created tenant {args.tenant} (admin roles: {_role_list(args.admin_roles)})",
    )


def _tenant_update(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.update_tenant(args.tenant, args.admin_roles)
    return _emit(
        args,
        {"tenant": args.tenant, "admin_roles": args.admin_roles},
        f"updated tenant {args.tenant} (admin roles: {_role_list(args.admin_roles)})",
    )


def _tenant_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        tenants = sorted(admin.list_tenants())
    return _emit(args, tenants, table([{"tenant": t} for t in tenants], ["tenant"]))


def _tenant_get(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        info = admin.get_tenant(args.tenant)
    human = f"tenant       {info['tenant']}\nadmin roles  {_role_list(info['admin_roles'])}"
    return _emit(args, info, human)


def _tenant_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_tenant(args.tenant)
    return _emit(args, {"tenant": args.tenant, "deleted": True}, f"deleted tenant {args.tenant}")


def _namespace_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.create_namespace(args.namespace)
    return _emit(args, {"namespace": args.namespace}, f"created namespace {args.namespace}")


def _namespace_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        namespaces = sorted(admin.list_namespaces(args.tenant))
    return _emit(args, namespaces, table([{"namespace": n} for n in namespaces], ["namespace"]))


def _namespace_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_namespace(args.namespace)
    return _emit(
        args,
        {"namespace": args.namespace, "deleted": True},
        f"deleted namespace {args.namespace}",
    )


def _grant_permission(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.grant_permission(args.namespace, args.role, args.actions)
    return _emit(
        args,
        {"namespace": args.namespace, "role": args.role, "actions": args.actions},
        f"granted {', '.join(args.actions)} on {args.namespace} to role {args.role}",
    )


def _revoke(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.revoke_permission(args.namespace, args.role)
    return _emit(
        args,
        {"namespace": args.namespace, "role": args.role, "revoked": True},
        f"revoked the permissions of role {args.role} on {args.namespace}",
    )


def _permissions(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        granted = admin.permissions(args.namespace)
    rows: list[dict[str, object]] = [
        {"role": role, "actions": ",".join(actions)} for role, actions in sorted(granted.items())
    ]
    return _emit(args, granted, table(rows, ["role", "actions"]))


# --- produce -------------------------------------------------------------------------------------


class Progress:
    """A progress line on a terminal's stderr, at most once per ``interval_s``; silent when the
    stream is not a terminal (a pipe, a file, a test)."""

    def __init__(
        self,
        stream: IO[str],
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool | None = None,
    ) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._clock = clock
        self._enabled = stream.isatty() if enabled is None else enabled
        self._started = clock()
        self._next = self._started + interval_s
        self._shown = False

    def due(self) -> bool:
        """Whether a line should be shown now (never when disabled)."""
        return self._enabled and self._clock() >= self._next

    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def show(self, text: str) -> None:
        """Replace the progress line with ``text``."""
        self._next = self._clock() + self._interval_s
        self._stream.write(f"\r{text}\x1b[K")
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        """End the progress line (so that what follows starts on a line of its own)."""
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = False


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-1]  # noqa: PLW2901 - the line without its ending
            if line.endswith(b"\r"):
                line = line[:-1]  # noqa: PLW2901
        yield line


def _payloads(args: argparse.Namespace) -> Iterator[bytes]:
    if args.messages is not None:
        for text in args.messages:
            yield os.fsencode(text)  # the bytes the user typed, even when not valid UTF-8
        return
    if args.file is None or args.file == "-":
        if sys.stdin.isatty():
            print(
                "magnetar produce: reading messages from stdin, one per line; Ctrl-D ends",
                file=sys.stderr,
            )
        yield from _lines(sys.stdin.buffer)
        return
    try:
        stream = open(args.file, "rb")  # noqa: SIM115 - closed below, also on errors
    except OSError as e:
        from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415

        raise InvalidArgumentError(f"cannot read {args.file}: {e.strerror}") from None
    with stream:
        yield from _lines(stream)


class _Tally:
    """What the broker answered, kept by send callbacks on the client's thread."""

    def __init__(self) -> None:
        self.confirmed = 0
        self.failed = 0
        self.first_error: MagnetarError | None = None
        self.listed: dict[int, str] = {}
        self.first_index = -1
        self.first_id = ""
        self.last_index = -1
        self.last_id = ""

    def callback(self, index: int) -> Callable[[MagnetarError | None, MessageId | None], None]:
        def done(error: MagnetarError | None, message_id: MessageId | None) -> None:
            if error is not None:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = error
                return
            self.confirmed += 1
            text = str(message_id)
            if index < MESSAGE_IDS_LISTED:
                self.listed[index] = text
            if index > self.last_index:
                self.last_index, self.last_id = index, text
            if self.first_index < 0 or index < self.first_index:
                self.first_index, self.first_id = index, text

        return done


def _produce(args: argparse.Namespace) -> int:
    properties = dict(args.properties)
    tally = _Tally()
    sent = 0
    progress = Progress(sys.stderr)
    interrupted = False
    with _client(args) as client:
        producer = client.create_producer(args.topic)
        topic = producer.topic()
        try:
            for payload in _payloads(args):
                for _ in range(args.repeat):
                    producer.send_async(
                        payload,
                        tally.callback(sent),
                        properties=properties or None,
                        partition_key=args.key,
                        deliver_after_ms=args.deliver_after_ms,
                    )
                    sent += 1
                if progress.due():
                    rate = sent / max(progress.elapsed_s(), 1e-9)
                    progress.show(
                        f"magnetar produce: {sent} sent, {tally.confirmed} confirmed,"
                        f" {rate:.0f} msg/s"
                    )
            producer.flush()
        except KeyboardInterrupt:
            interrupted = True
            producer.flush()  # what was handed to the producer still goes out
        finally:
            progress.done()
    listed = [tally.listed[i] for i in sorted(tally.listed)]
    if args.json:
        _print_json(
            {
                "topic": topic,
                "published": tally.confirmed,
                "failed": tally.failed,
                "first_message_id": tally.first_id or None,
                "last_message_id": tally.last_id or None,
                "message_ids": listed,
            }
        )
    elif tally.confirmed:
        print(f"published {tally.confirmed} message(s) to {topic}; last message id {tally.last_id}")
    else:
        print(f"published no messages to {topic}")
    if tally.failed:
        error = tally.first_error
        assert error is not None
        print(
            f"magnetar produce: {tally.failed} of {sent} message(s) failed; first error:"
            f" {error.message} ({type(error).__name__})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if interrupted:
        print(f"magnetar produce: interrupted after {sent} message(s)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


# --- consume -------------------------------------------------------------------------------------


def format_value(data: bytes) -> tuple[str, str]:
    """``(text, encoding)``: the payload as UTF-8 text, or base64 when it is not UTF-8."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def message_document(message: Message) -> dict[str, Any]:
    """One consumed message as ``consume --json`` prints it."""
    value, encoding = format_value(message.data())
    return {
        "topic": message.topic_name(),
        "offset": message.offset(),
        "message_id": str(message.message_id()),
        "key": message.partition_key(),
        "properties": message.properties(),
        "publish_time_ms": message.publish_timestamp(),
        "event_time_ms": message.event_timestamp(),
        "redelivery_count": message.redelivery_count(),
        "producer_name": message.producer_name(),
        "value": value,
        "encoding": encoding,
    }


def render_message(message: Message) -> str:
    """One consumed message for humans: a header line, then the value (hex when binary)."""
    header = [
        f"offset={message.offset()}",
        f"id={message.message_id()}",
        f"topic={message.topic_name()}",
        f"published={_time(message.publish_timestamp())}",
    ]
    key = message.partition_key()
    if key is not None:
        header.append(f"key={key!r}")
    properties = message.properties()
    if properties:
        header.append(f"properties={json.dumps(properties, sort_keys=True)}")
    if message.redelivery_count():
        header.append(f"redeliveries={message.redelivery_count()}")
    data = message.data()
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        value = f"<{len(data)} bytes, not UTF-8> {data.hex()}"
    return "----- " + " ".join(header) + "\n" + value


def _consume(args: argparse.Namespace) -> int:
    from magnetar.common.errors import ReceiveTimeoutError  # noqa: PLC0415

    parser: argparse.ArgumentParser = args.parser
    if args.reader and args.subscription:
        parser.error("--reader reads without a subscription; leave out -s/--subscription")
    if not args.reader and not args.subscription:
        parser.error("give a subscription with -s/--subscription (or read with --reader)")
    wanted = args.num_messages
    received = 0
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    topic = args.topic
    with _client(args) as client:
        # prefetch no more than asked for, so a shared subscription's other consumers get the rest
        queue = min(wanted, 1000) if wanted else 1000
        source: Any = None
        # Ctrl-C ends the command the same way wherever it lands, even while it subscribes
        try:
            if args.reader:
                source = client.create_reader(args.topic, args.position, receiver_queue_size=queue)
                receive = source.read_next
            else:
                source = client.subscribe(
                    args.topic,
                    args.subscription,
                    args.subscription_type,
                    initial_position=args.position,
                    receiver_queue_size=queue,
                )
                receive = source.receive
            topic = source.topic()
            while wanted == 0 or received < wanted:
                timeout_ms: int | None = None
                if deadline is not None:
                    timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    message = receive(timeout_ms)
                except ReceiveTimeoutError:
                    break
                if args.json:
                    print(json.dumps(message_document(message)), flush=True)
                else:
                    print(render_message(message), flush=True)
                received += 1
                if not args.reader and not args.no_ack:
                    source.acknowledge(message)
        except KeyboardInterrupt:
            if wanted:
                print(
                    f"magnetar consume: interrupted after {received} of {wanted} message(s)",
                    file=sys.stderr,
                )
                return EXIT_INTERRUPTED
        finally:
            if source is not None:
                source.close()  # flushes the acknowledgements
    print(f"magnetar consume: received {received} message(s) from {topic}", file=sys.stderr)
    if wanted and received < wanted:
        print(
            f"magnetar consume: timed out after {args.timeout:g} s with {received} of {wanted}"
            " message(s)",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return EXIT_OK


# --- cluster (through the admin service) ---------------------------------------------------------


def run_cluster_admin(args: argparse.Namespace) -> int:
    """``magnetar cluster brokers|ownership|bookies|ledgers|ledger`` through a broker's admin
    service (``--service-url``)."""
    rows: list[dict[str, Any]]
    document: object
    with _admin(args) as admin:
        what = args.cluster_command
        if what == "brokers":
            document = admin.list_brokers()
            rows = [
                {
                    "broker": b["broker_id"],
                    "service_url": b["service_url"],
                    "http": b["http_address"],
                    "version": b["version"],
                    "partitions": b["owned_partitions"],
                    "rate_in": f"{b['msg_rate_in']:.1f}",
                    "rate_out": f"{b['msg_rate_out']:.1f}",
                    "cpu": f"{b['cpu_percent']:.0f}%",
                    "started": _time(b["start_time_ms"]),
                }
                for b in document
            ]
            columns = list(rows[0]) if rows else ["broker"]
        elif what == "ownership":
            document = admin.list_ownership(args.broker or "")
            rows = [
                {
                    "partition": o["partition_topic"],
                    "broker": o["broker_id"],
                    "broker_url": o["broker_url"],
                    "since": _time(o["acquired_ms"]),
                }
                for o in document
            ]
            columns = ["partition", "broker", "broker_url", "since"]
        elif what == "bookies":
            document = admin.list_bookies()
            rows = [
                {
                    "bookie": b["bookie_id"],
                    "state": b["state"],
                    "address": b["address"],
                    "free_gb": round(b["free_disk_bytes"] / 1e9, 1),
                    "total_gb": round(b["total_disk_bytes"] / 1e9, 1),
                    "version": b["version"],
                    "labels": ",".join(f"{k}={v}" for k, v in sorted(b["labels"].items())),
                }
                for b in document
            ]
            columns = ["bookie", "state", "address", "free_gb", "total_gb", "version", "labels"]
        elif what == "ledgers":
            document = admin.list_ledgers(args.topic or "")
            rows = [_ledger_row(ledger) for ledger in document]
            columns = ["ledger", "state", "quorums", "striping", "last_entry", "length", "topic"]
        else:
            document = admin.get_ledger(args.ledger_id)
            rows = [
                {
                    **_ledger_row(document["summary"]),
                    "created": _time(document["created_ms"]),
                    "ensembles": " ".join(
                        f"{e['first_entry_id']}:{','.join(e['bookie_ids'])}"
                        for e in document["ensembles"]
                    ),
                    "properties": ",".join(
                        f"{k}={v}" for k, v in sorted(document["properties"].items())
                    ),
                }
            ]
            columns = ["ledger", "state", "quorums", "striping", "last_entry", "length"]
            columns += ["ensembles", "created", "properties"]
    return _emit(args, document, table(rows, columns))


def _ledger_row(ledger: dict[str, Any]) -> dict[str, Any]:
    return {
        "ledger": ledger["ledger_id"],
        "state": ledger["state"].lower(),
        "quorums": f"E{ledger['ensemble_size']}/Qw{ledger['write_quorum_size']}"
        f"/Qa{ledger['ack_quorum_size']}",
        "striping": _striping(ledger["ensemble_size"], ledger.get("intended_ensemble_size", 0)),
        "last_entry": ledger["last_entry_id"],
        "length": ledger["length"],
        "topic": ledger["topic"] or "-",
    }


def _striping(ensemble_size: int, intended: int) -> str:
    """``full``, or ``under-striped (2 of 3)`` for a ledger made on fewer bookies than its E
    while fewer were writable (0: a broker too old to say)."""
    if intended > ensemble_size:
        return f"under-striped ({ensemble_size} of {intended})"
    return "full"
