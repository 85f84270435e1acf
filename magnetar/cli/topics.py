"""``magnetar topics``: create, list, get and delete topics; their stats and partitions; unload."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any

from magnetar.cli.client import (
    CLIENT_COMMANDS,
    add_action,
    add_property_option,
    admin_client,
    emit,
    format_rate,
    format_size,
    format_time,
    full_topic_name,
    int_at_least,
)
from magnetar.cli.support import table


def add_topics_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``topics`` parser."""
    topics = commands.add_parser(
        "topics", help=CLIENT_COMMANDS["topics"], description=CLIENT_COMMANDS["topics"]
    )
    what = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)

    create = add_action(
        what, "create", "create a topic (partitioned with --partitions N)", _topic_create
    )
    create.add_argument("topic")
    create.add_argument(
        "--partitions",
        type=int_at_least(0),
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
    add_property_option(create, "a topic property (repeatable)")

    listing = add_action(what, "list", "list topics", _topic_list)
    listing.add_argument("--namespace", default="", metavar="TENANT/NS", help="only this namespace")

    get = add_action(
        what, "get", "a topic's partitions, policies, properties, creation time", _topic_get
    )
    get.add_argument("topic")

    delete = add_action(what, "delete", "delete a topic and all its messages", _topic_delete)
    delete.add_argument("topic")
    delete.add_argument(
        "--force", action="store_true", help="even with producers or consumers attached"
    )

    stats = add_action(
        what, "stats", "rates, storage, offsets, subscriptions, consumers", _topic_stats
    )
    stats.add_argument("topic")
    stats.add_argument(
        "--internal", action="store_true", help="also each partition's ledgers and cursors"
    )

    partitions = add_action(
        what, "partitions", "partition count, owners, earliest and next offsets", _partitions
    )
    partitions.add_argument("topic")

    grow = add_action(
        what, "update-partitions", "grow a partitioned topic to N partitions", _update_partitions
    )
    grow.add_argument("topic")
    grow.add_argument("partitions", type=int_at_least(1), metavar="N")

    unload = add_action(
        what, "unload", "release the topic from its brokers (placed again)", _unload
    )
    unload.add_argument("topic")


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
    with admin_client(args) as admin:
        created = admin.create_topic(
            args.topic, args.partitions, policies=policies, properties=dict(args.properties)
        )
    count = created["partitions"]
    shape = f"{count} partitions" if count else "not partitioned"
    return emit(args, created, f"created {created['topic']} ({shape})")


def _topic_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        topics = admin.list_topics(args.namespace)
    return emit(args, topics, table(topics, ["topic", "partitions"]))


def _topic_get(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        info = admin.get_topic(args.topic)
    policies = {k: v for k, v in info["policies"].items() if v is not None}
    lines = [
        f"topic       {info['topic']}",
        f"partitions  {info['partitions'] or 'not partitioned'}",
        f"created     {format_time(info['created_ms'])}",
        "policies    "
        + (
            ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(policies.items()))
            or "(broker defaults)"
        ),
        "properties  "
        + (", ".join(f"{k}={v}" for k, v in sorted(info["properties"].items())) or "(none)"),
    ]
    return emit(args, info, "\n".join(lines))


def _topic_delete(args: argparse.Namespace) -> int:
    name = full_topic_name(args.topic)
    with admin_client(args) as admin:
        admin.delete_topic(name, force=args.force)
    return emit(args, {"topic": name, "deleted": True}, f"deleted {name}")


def subscription_rows(stats: dict[str, Any], names: Iterable[str]) -> list[dict[str, Any]]:
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


def subscription_table(rows: list[dict[str, Any]]) -> str:
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
        f"rate in     {format_rate(stats['msg_rate_in'], stats['msg_throughput_in'])}",
        f"rate out    {format_rate(stats['msg_rate_out'], stats['msg_throughput_out'])}",
        f"storage     {format_size(stats['storage_size_bytes'])}",
        "",
        table(
            [
                {
                    "partition": _partition_label(p),
                    "owner": p["owner_broker_id"] or "(not loaded)",
                    "earliest": p["earliest_offset"],
                    "next": p["next_offset"],
                    "max_backlog": backlog[p["partition_topic"]],
                    "storage": format_size(p["storage_size_bytes"]),
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
            f" {format_time(p['write_problem_since_ms'])}: {p['write_problem']}"
            for p in partitions
            if p.get("write_problem")
        ),
        "",
        subscription_table(subscription_rows(stats, ())),
    ]
    ledgers = [
        {
            "partition": _partition_label(p),
            "ledger": ledger["ledger_id"],
            "entries": ledger["entries"],
            "size": format_size(ledger["size_bytes"]),
            "first_offset": ledger["first_offset"],
            "created": format_time(ledger["created_ms"]),
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
    with admin_client(args) as admin:
        stats = admin.topic_stats(args.topic, internal=args.internal)
    return emit(args, stats, render_stats(stats))


def _partitions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
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
    return emit(args, {"topic": stats["topic"], "partitions": count, "details": rows}, human)


def _update_partitions(args: argparse.Namespace) -> int:
    name = full_topic_name(args.topic)
    with admin_client(args) as admin:
        count = admin.update_partitions(name, args.partitions)
    return emit(args, {"topic": name, "partitions": count}, f"{name} now has {count} partitions")


def _unload(args: argparse.Namespace) -> int:
    name = full_topic_name(args.topic)
    with admin_client(args) as admin:
        admin.unload_topic(name)
    return emit(args, {"topic": name, "unloaded": True}, f"unloaded {name}")
