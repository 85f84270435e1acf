"""``magnetar subscriptions``: list, create, reset and delete a topic's subscriptions."""

from __future__ import annotations

import argparse
from typing import Any

from magnetar.cli.client import (
    CLIENT_COMMANDS,
    NEGATIVE_VALUE,
    add_action,
    admin_client,
    emit,
    format_time,
    full_topic_name,
    int_at_least,
    parse_message_id,
    parse_time_ms,
)
from magnetar.cli.topics import subscription_rows, subscription_table


def add_subscriptions_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """The ``subscriptions`` parser."""
    subscriptions = commands.add_parser(
        "subscriptions",
        help=CLIENT_COMMANDS["subscriptions"],
        description=CLIENT_COMMANDS["subscriptions"],
    )
    what = subscriptions.add_subparsers(
        dest="subscriptions_command", metavar="ACTION", required=True
    )
    sub_list = add_action(
        what, "list", "a topic's subscriptions with backlog and consumers", _sub_list
    )
    sub_list.add_argument("topic")

    sub_create = add_action(what, "create", "create a durable subscription", _sub_create)
    sub_create.add_argument("topic")
    sub_create.add_argument("subscription")
    sub_create.add_argument(
        "--position",
        choices=["earliest", "latest"],
        default="latest",
        help="where it starts (default latest: only messages published from now on)",
    )

    reset = add_action(what, "reset", "move a subscription (on every partition)", _sub_reset)
    # `--time -10m` is a value, not an unknown option (argparse would only let -10 through);
    # every parser on the way to the value classifies it
    for parser in (subscriptions, reset):
        parser._negative_number_matcher = NEGATIVE_VALUE
    reset.add_argument("topic")
    reset.add_argument("subscription")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the first stored message")
    target.add_argument("--to-latest", action="store_true", help="after the last message")
    target.add_argument(
        "--offset", type=int_at_least(0), metavar="N", help="this offset on every partition"
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

    sub_delete = add_action(what, "delete", "delete a subscription", _sub_delete)
    sub_delete.add_argument("topic")
    sub_delete.add_argument("subscription")
    sub_delete.add_argument(
        "--force", action="store_true", help="even with consumers attached (they are closed)"
    )


def _sub_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        names = admin.list_subscriptions(args.topic)
        stats = admin.topic_stats(args.topic)
    rows = subscription_rows(stats, names)
    return emit(args, rows, subscription_table(rows))


def _sub_create(args: argparse.Namespace) -> int:
    name = full_topic_name(args.topic)
    with admin_client(args) as admin:
        admin.create_subscription(name, args.subscription, args.position)
    return emit(
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
    with admin_client(args) as admin:
        if args.to_earliest:
            target, where = "earliest", "the earliest message"
        elif args.to_latest:
            target, where = "latest", "the end"
        elif args.offset is not None:
            target, where = args.offset, f"offset {args.offset}"
        elif args.time is not None:
            publish_time_ms = args.time
            where = f"the first message published at or after {format_time(args.time) or args.time}"
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
    return emit(
        args,
        {
            "topic": name.full,
            "subscription": args.subscription,
            "reset_to": str(target) if target is not None else {"publish_time_ms": args.time},
        },
        f"reset subscription {args.subscription!r} of {name.full} to {where}",
    )


def _sub_delete(args: argparse.Namespace) -> int:
    name = full_topic_name(args.topic)
    with admin_client(args) as admin:
        admin.delete_subscription(name, args.subscription, force=args.force)
    return emit(
        args,
        {"topic": name, "subscription": args.subscription, "deleted": True},
        f"deleted subscription {args.subscription!r} of {name}",
    )
