"""``magnetar topics|subscriptions|produce|consume|cluster`` as a user runs them: the commands
as subprocesses against one real standalone for the module; exit codes, tables, JSON and the
messages that travel. The pure helpers (time, message id and property parsing, value rendering,
progress) are tested in-process at the end."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from magnetar.aio.admin import AdminClient
from magnetar.aio.message_id import MessageId
from magnetar.cli.client import parse_message_id, parse_property, parse_time_ms
from magnetar.cli.messages import MESSAGE_IDS_LISTED, Progress, format_value
from magnetar.cli.support import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE
from magnetar.testing import StandaloneNode

on_node = pytest.mark.asyncio(loop_scope="module")

ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("MAGNETAR_SERVICE_URL", "MAGNETAR_METADATA", "MAGNETAR_LOG_FORMAT")
} | {"GRPC_VERBOSITY": "ERROR"}

# Python ignores Ctrl-C in a child that inherited an ignored SIGINT (a background job): the
# interrupt tests start the CLI with Python's own handler in place.
INTERRUPTIBLE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " sys.argv[0] = 'magnetar'; runpy.run_module('magnetar.cli', run_name='__main__')"
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("cli-client") / "data") as node:
        yield node


@pytest_asyncio.fixture(loop_scope="module")
async def admin(node: StandaloneNode) -> AsyncIterator[AdminClient]:
    """The test's own view of the cluster, to set up and to check what the CLI did."""
    async with AdminClient(node.service_url, operation_timeout_s=10) as admin:
        yield admin


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


async def magnetar(*args: str, stdin: bytes | None = None) -> Run:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Run(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ok(run: Run) -> Run:
    assert run.code == EXIT_OK, str(run)
    return run


# --- topics --------------------------------------------------------------------------------------


@on_node
async def test_topic_lifecycle_tables_and_json(node: StandaloneNode) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("orders")
    full = f"public/default/{topic}"

    created = ok(await magnetar("topics", "create", topic, "--partitions", "2", *url))
    assert created.out.strip() == f"created {full} (2 partitions)"
    again, plain, with_policies = await asyncio.gather(
        magnetar("topics", "create", topic, *url),
        magnetar("topics", "create", f"{topic}-plain", "--json", *url),
        magnetar(
            "topics", "create", f"{topic}-policies", "--json",
            "--retention-time-ms", "-1", "--retention-size-bytes", "1000000",
            "--message-ttl-ms", "60000", "--no-deduplication",
            "-p", "owner=team-a", "-p", "expr=a=b", *url,
        ),
    )  # fmt: skip
    assert again.code == EXIT_FAILED
    assert again.err.strip() == f"magnetar topics: topic {full} already exists"
    assert ok(plain).json() == {"topic": f"{full}-plain", "partitions": 0}
    assert ok(with_policies).json() == {"topic": f"{full}-policies", "partitions": 0}

    info, info_json, listing, listing_json, other_namespace = await asyncio.gather(
        magnetar("topics", "get", f"{topic}-policies", *url),
        magnetar("topics", "get", f"{topic}-policies", "--json", *url),
        magnetar("topics", "list", *url),
        magnetar("topics", "list", "--namespace", "public/default", "--json", *url),
        magnetar("topics", "list", "--namespace", "other/ns", "--json", *url),
    )
    got = ok(info_json).json()
    assert got["properties"] == {"owner": "team-a", "expr": "a=b"}
    assert got["policies"] == {
        "retention_time_ms": -1,
        "retention_size_bytes": 1000000,
        "message_ttl_ms": 60000,
        "backlog_quota_bytes": None,
        "deduplication": False,
        "max_redelivery_count": None,
    }
    assert "deduplication=false" in ok(info).out
    assert "properties  expr=a=b, owner=team-a" in info.out
    rows = {line.split()[0]: line.split()[1] for line in ok(listing).out.splitlines()[1:]}
    assert rows[full] == "2"
    assert rows[f"{full}-plain"] == "0"
    assert listing.out.splitlines()[0].split() == ["TOPIC", "PARTITIONS"]
    assert {"topic": full, "partitions": 2} in ok(listing_json).json()
    assert ok(other_namespace).json() == []

    # grow, and refuse to shrink
    grown = ok(await magnetar("topics", "update-partitions", topic, "3", *url))
    assert grown.out.strip() == f"{full} now has 3 partitions"
    shrink, partitions, partitions_json = await asyncio.gather(
        magnetar("topics", "update-partitions", topic, "2", *url),
        magnetar("topics", "partitions", topic, *url),
        magnetar("topics", "partitions", topic, "--json", *url),
    )
    assert shrink.code == EXIT_FAILED
    assert "can only grow" in shrink.err
    lines = ok(partitions).out.splitlines()
    assert lines[0] == f"{full}: 3 partitions"
    assert lines[1].split() == ["PARTITION", "TOPIC", "OWNER", "EARLIEST", "NEXT"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [str(i), f"{full}-partition-{i}", "standalone"] for i in range(3)
    ]
    document = ok(partitions_json).json()
    assert document["partitions"] == 3
    assert [(p["partition"], p["next_offset"]) for p in document["details"]] == [
        (0, 0),
        (1, 0),
        (2, 0),
    ]

    unloaded = ok(await magnetar("topics", "unload", topic, "--json", *url))
    assert unloaded.json() == {"topic": full, "unloaded": True}

    deleted, deleted_json = await asyncio.gather(
        magnetar("topics", "delete", topic, *url),
        magnetar("topics", "delete", f"{topic}-plain", "--json", *url),
    )
    assert ok(deleted).out.strip() == f"deleted {full}"
    assert ok(deleted_json).json() == {"topic": f"{full}-plain", "deleted": True}
    after = ok(await magnetar("topics", "list", "--json", *url)).json()
    assert full not in {t["topic"] for t in after}


@on_node
async def test_topic_stats_summary_and_internal(node: StandaloneNode) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("stats")
    full = f"public/default/{topic}"
    ok(await magnetar("topics", "create", topic, "--partitions", "2", *url))
    ok(await magnetar("subscriptions", "create", topic, "billing", "--position", "earliest", *url))
    ok(await magnetar("produce", topic, "-m", "one", "-m", "two", "-n", "3", "-k", "k", *url))

    human, as_json, internal, internal_json = await asyncio.gather(
        magnetar("topics", "stats", topic, *url),
        magnetar("topics", "stats", topic, "--json", *url),
        magnetar("topics", "stats", topic, "--internal", *url),
        magnetar("topics", "stats", topic, "--internal", "--json", *url),
    )
    stats = ok(as_json).json()
    assert stats["topic"] == full
    assert sum(p["next_offset"] for p in stats["partitions"]) == 6
    assert all(p["ledgers"] == [] for p in stats["partitions"])

    text = ok(human).out
    assert f"topic       {full}" in text
    assert "partitions  2" in text
    assert "rate in" in text
    assert "storage" in text
    table = text.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("PARTITION"))
    assert table[header].split()[:4] == ["PARTITION", "OWNER", "EARLIEST", "NEXT"]
    assert sorted(int(line.split()[3]) for line in table[header + 1 : header + 3]) == [0, 6]
    sub_header = next(i for i, line in enumerate(table) if line.startswith("SUBSCRIPTION"))
    assert table[sub_header + 1].split()[:3] == ["billing", "exclusive", "6"]

    assert "LEDGER" in ok(internal).out
    assert "CURSOR" in internal.out
    partitions = ok(internal_json).json()["partitions"]
    assert any(p["ledgers"] for p in partitions)
    assert {c["name"] for p in partitions for c in p["cursors"]} == {"billing"}


# --- produce and consume -------------------------------------------------------------------------


@on_node
async def test_produce_then_consume_round_trip(node: StandaloneNode) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("round-trip")
    produced = ok(
        await magnetar(
            "produce", topic, "-m", "hello", "-m", "wörld", "-k", "user-7",
            "-p", "source=cli", "-p", "expr=x=1", "--json", *url,
        )
    ).json()  # fmt: skip
    assert produced["topic"] == f"public/default/{topic}"
    assert produced["published"] == 2
    assert produced["failed"] == 0
    ids = produced["message_ids"]
    assert len(ids) == 2
    assert (produced["first_message_id"], produced["last_message_id"]) == (ids[0], ids[-1])

    consumed = ok(
        await magnetar(
            "consume", topic, "-s", "sub", "--position", "earliest", "-n", "2", "--json", *url
        )
    )
    messages = consumed.json_lines()
    assert [m["value"] for m in messages] == ["hello", "wörld"]
    assert [m["encoding"] for m in messages] == ["utf-8", "utf-8"]
    assert [m["message_id"] for m in messages] == ids
    assert [m["offset"] for m in messages] == [0, 1]
    assert {m["key"] for m in messages} == {"user-7"}
    assert all(m["properties"] == {"source": "cli", "expr": "x=1"} for m in messages)
    assert all(m["topic"] == f"public/default/{topic}" for m in messages)
    assert f"received 2 message(s) from public/default/{topic}" in consumed.err

    # both were acknowledged: nothing more comes, and the timeout says how many arrived
    late = await magnetar("consume", topic, "-s", "sub", "-n", "1", "--timeout", "0.5", *url)
    assert late.code == EXIT_TIMEOUT, str(late)
    assert "timed out after 0.5 s with 0 of 1 message(s)" in late.err
    assert late.out == ""

    # the human form: a header line per message, then the value
    again = ok(
        await magnetar("consume", topic, "--reader", "--position", "earliest", "-n", "2", *url)
    )
    lines = again.out.splitlines()
    assert lines[0].startswith(f"----- offset=0 id={ids[0]} topic=public/default/{topic}")
    assert "key='user-7'" in lines[0]
    assert 'properties={"expr": "x=1", "source": "cli"}' in lines[0]
    assert lines[1:] == ["hello", lines[2], "wörld"]


@on_node
async def test_delayed_produce_reaches_a_shared_subscription_when_due(
    node: StandaloneNode,
) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("delayed")
    ok(await magnetar("topics", "create", topic, *url))
    ok(await magnetar("subscriptions", "create", topic, "work", *url))
    ok(await magnetar("produce", topic, "-m", "later", "--deliver-after-ms", "8000", *url))
    ok(await magnetar("produce", topic, "-m", "now", *url))
    consumed = ok(
        await magnetar(
            "consume", topic, "-s", "work", "-t", "shared", "-n", "2", "--timeout", "20",
            "--json", *url,
        )
    )  # fmt: skip
    # the second message overtakes the first, which waits until it is due
    assert [m["value"] for m in consumed.json_lines()] == ["now", "later"]
    bad = await magnetar("produce", topic, "-m", "x", "--deliver-after-ms", "-5", *url)
    assert bad.code == EXIT_USAGE, str(bad)


@on_node
async def test_produce_from_stdin_and_files(node: StandaloneNode, tmp_path: Path) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("lines")
    from_stdin = ok(await magnetar("produce", topic, *url, stdin=b"one\r\ntwo\n\nfour\n"))
    assert from_stdin.out.startswith(f"published 4 message(s) to public/default/{topic}")
    assert "last message id" in from_stdin.out

    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"five\nsix")  # no newline at the end
    dash, from_file = await asyncio.gather(
        magnetar("produce", topic, "-f", "-", "-n", "2", "--json", *url, stdin=b"\x00\xff\n"),
        magnetar("produce", topic, "-f", str(lines), "--json", *url),
    )
    assert ok(dash).json()["published"] == 2
    assert ok(from_file).json()["published"] == 2

    read = ok(
        await magnetar(
            "consume", topic, "--reader", "--position", "earliest", "-n", "8", "--json", *url
        )
    ).json_lines()
    values = [
        m["value"] if m["encoding"] == "utf-8" else base64.b64decode(m["value"]) for m in read
    ]
    assert values[:4] == ["one", "two", "", "four"]
    assert sorted(values[4:], key=repr) == sorted(
        ["five", "six", b"\x00\xff", b"\x00\xff"], key=repr
    )
    binary = next(m for m in read if m["encoding"] == "base64")
    assert binary["value"] == base64.b64encode(b"\x00\xff").decode()

    human = ok(
        await magnetar("consume", topic, "--reader", "--position", "earliest", "-n", "8", *url)
    )
    assert "<2 bytes, not UTF-8> 00ff" in human.out


@on_node
async def test_produce_many_and_failures(node: StandaloneNode, tmp_path: Path) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("too-large")
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (6 * 1024 * 1024) + b"\nsmall\n")
    failed, missing, many = await asyncio.gather(
        magnetar("produce", topic, "-f", str(big), *url),
        magnetar("produce", topic, "-f", str(tmp_path / "nope.txt"), *url),
        magnetar("produce", unique("many"), "-m", "x", "-n", str(MESSAGE_IDS_LISTED + 5), "--json",
                 *url),
    )  # fmt: skip
    document = ok(many).json()
    assert document["published"] == MESSAGE_IDS_LISTED + 5
    assert len(document["message_ids"]) == MESSAGE_IDS_LISTED
    assert document["first_message_id"] == document["message_ids"][0]
    assert document["last_message_id"] not in document["message_ids"]
    assert failed.code == EXIT_FAILED, str(failed)
    assert "magnetar produce: 1 of 2 message(s) failed" in failed.err
    assert "MessageTooLargeError" in failed.err
    assert failed.out.startswith("published 1 message(s)")
    assert missing.code == EXIT_FAILED
    assert "cannot read" in missing.err
    assert "nope.txt" in missing.err


@on_node
async def test_consume_types_no_ack_and_usage(node: StandaloneNode) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("types")
    ok(await magnetar("topics", "create", topic, "--partitions", "2", *url))
    ok(await magnetar("produce", topic, "-m", "a", "-m", "b", "-m", "c", *url))

    unacked = ok(
        await magnetar(
            "consume", topic, "-s", "s", "--position", "earliest", "-n", "3", "--no-ack",
            "--json", *url,
        )
    )  # fmt: skip
    assert sorted(m["value"] for m in unacked.json_lines()) == ["a", "b", "c"]
    # --no-ack left them on the subscription
    redelivered = ok(await magnetar("consume", topic, "-s", "s", "-n", "3", "--json", *url))
    assert sorted(m["value"] for m in redelivered.json_lines()) == ["a", "b", "c"]
    assert {m["redelivery_count"] for m in redelivered.json_lines()} == {1}

    # -t reaches the broker (which may not serve every type yet: then it says so)
    kinds = ("failover", "shared", "key_shared")
    runs = await asyncio.gather(
        *(
            magnetar(
                "consume",
                topic,
                "-s",
                kind,
                "-t",
                kind,
                "--position",
                "earliest",
                "-n",
                "3",
                "--json",
                *url,
            )
            for kind in kinds
        )
    )
    for kind, run in zip(kinds, runs, strict=True):
        if run.code == EXIT_OK:
            assert sorted(m["value"] for m in run.json_lines()) == ["a", "b", "c"]
        else:
            assert run.code == EXIT_FAILED, str(run)
            assert f"subscription type {kind}" in run.err

    both, neither, bad_type = await asyncio.gather(
        magnetar("consume", topic, "-s", "s", "--reader", *url),
        magnetar("consume", topic, *url),
        magnetar("consume", topic, "-s", "s", "-t", "fanout", *url),
    )
    assert both.code == EXIT_USAGE
    assert "--reader reads without a subscription" in both.err
    assert neither.code == EXIT_USAGE
    assert "give a subscription with -s" in neither.err
    assert bad_type.code == EXIT_USAGE
    assert "invalid choice: 'fanout'" in bad_type.err


@on_node
async def test_ctrl_c_ends_consume(node: StandaloneNode, admin: AdminClient) -> None:
    topic = unique("ctrl-c")
    await admin.create_topic(topic)
    outcomes = {}
    for count, subscription in (("0", "forever"), ("5", "five")):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", INTERRUPTIBLE, "consume", topic, "-s", subscription,
            "-n", count, "--service-url", node.service_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
        )  # fmt: skip
        try:
            async with asyncio.timeout(30):
                while True:  # wait until it is attached and waiting for messages
                    stats = await admin.topic_stats(topic)
                    subs = stats["partitions"][0]["subscriptions"]
                    if any(s["subscription"] == subscription and s["consumers"] for s in subs):
                        break
                    await asyncio.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        outcomes[count] = (process.returncode, err.decode())
    assert outcomes["0"][0] == EXIT_OK, outcomes["0"][1]  # -n 0 runs until Ctrl-C: normal end
    assert outcomes["5"][0] == EXIT_INTERRUPTED, outcomes["5"][1]
    assert "interrupted after 0 of 5 message(s)" in outcomes["5"][1]


# --- subscriptions -------------------------------------------------------------------------------


@on_node
async def test_subscriptions_list_create_reset_delete(
    node: StandaloneNode, admin: AdminClient
) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("subs")
    full = f"public/default/{topic}"
    await admin.create_topic(topic)
    created, created_json = await asyncio.gather(
        magnetar("subscriptions", "create", topic, "audit", "--position", "earliest", *url),
        magnetar("subscriptions", "create", topic, "tail", "--json", *url),
    )
    assert ok(created).out.strip() == f"created subscription 'audit' on {full} at earliest"
    assert ok(created_json).json() == {"topic": full, "subscription": "tail", "position": "latest"}
    # three produce commands: three entries, so every message can be addressed on its own
    ids = []
    for value in ("m0", "m1", "m2"):
        run = ok(await magnetar("produce", topic, "-m", value, "--json", *url))
        ids.append(run.json()["last_message_id"])

    listing, listing_json = await asyncio.gather(
        magnetar("subscriptions", "list", topic, *url),
        magnetar("subscriptions", "list", topic, "--json", *url),
    )
    rows = [line.split() for line in ok(listing).out.splitlines()]
    assert rows[0] == ["SUBSCRIPTION", "TYPE", "BACKLOG", "UNACKED", "RATE_OUT", "CONSUMERS"]
    assert [(r[0], r[2]) for r in rows[1:]] == [("audit", "3"), ("tail", "3")]
    backlog = {r["subscription"]: r["backlog_messages"] for r in ok(listing_json).json()}
    assert backlog == {"audit": 3, "tail": 3}

    async def consume(count: int) -> list[str]:
        run = await magnetar("consume", topic, "-s", "audit", "-n", str(count), "--json", *url)
        assert run.code == EXIT_OK, str(run)
        return [m["value"] for m in run.json_lines()]

    async def nothing_left() -> bool:
        run = await magnetar("consume", topic, "-s", "audit", "--timeout", "0.3", *url)
        return run.code == EXIT_TIMEOUT and run.out == ""

    assert await consume(3) == ["m0", "m1", "m2"]
    assert await nothing_left()

    reset = ok(await magnetar("subscriptions", "reset", topic, "audit", "--to-earliest", *url))
    assert reset.out.strip() == f"reset subscription 'audit' of {full} to the earliest message"
    assert await consume(3) == ["m0", "m1", "m2"]

    ok(await magnetar("subscriptions", "reset", topic, "audit", "--message-id", ids[1], *url))
    assert await consume(2) == ["m1", "m2"]
    ok(await magnetar("subscriptions", "reset", topic, "audit", "--offset", "2", *url))
    assert await consume(1) == ["m2"]
    ok(await magnetar("subscriptions", "reset", topic, "audit", "--time", "-1h", *url))
    assert await consume(3) == ["m0", "m1", "m2"]
    ok(await magnetar("subscriptions", "reset", topic, "audit", "--to-earliest", *url))
    future = ok(
        await magnetar(
            "subscriptions", "reset", topic, "audit", "--time", "2999-01-01T00:00:00Z",
            "--json", *url,
        )
    )  # fmt: skip
    year_2999_ms = int(datetime(2999, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert future.json()["reset_to"] == {"publish_time_ms": year_2999_ms}
    assert await nothing_left()
    ok(await magnetar("subscriptions", "reset", topic, "audit", "--to-earliest", *url))
    ok(await magnetar("subscriptions", "reset", topic, "audit", "--to-latest", *url))
    assert await nothing_left()

    deleted, missing, busy_topic = await asyncio.gather(
        magnetar("subscriptions", "delete", topic, "tail", *url),
        magnetar("subscriptions", "delete", topic, "nope", *url),
        magnetar("subscriptions", "list", unique("no-such-topic"), *url),
    )
    assert ok(deleted).out.strip() == f"deleted subscription 'tail' of {full}"
    assert missing.code == EXIT_FAILED
    assert "has no subscription 'nope'" in missing.err
    assert busy_topic.code == EXIT_FAILED
    assert "does not exist" in busy_topic.err
    assert await admin.list_subscriptions(topic) == ["audit"]


@on_node
async def test_reset_by_message_id_moves_only_its_partition(
    node: StandaloneNode, admin: AdminClient
) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("by-id")
    await admin.create_topic(topic, 2)
    await admin.create_subscription(topic, "s", "earliest")
    produced = [
        ok(await magnetar("produce", topic, "-m", v, "-k", "same-key", "--json", *url)).json()
        for v in ("a", "b")
    ]
    second = MessageId(*(int(x) for x in produced[1]["last_message_id"].split(":")))
    no_partition = f"{second.ledger_id}:{second.entry_id}"
    refused = await magnetar(
        "subscriptions", "reset", topic, "s", "--message-id", no_partition, *url
    )
    assert refused.code == EXIT_FAILED
    assert "names no partition" in refused.err

    ok(await magnetar("subscriptions", "reset", topic, "s", "--to-latest", *url))
    moved = ok(
        await magnetar(
            "subscriptions", "reset", topic, "s", "--message-id", str(second), "--json", *url
        )
    ).json()
    assert moved["topic"] == f"public/default/{topic}-partition-{second.partition}"
    got = ok(await magnetar("consume", topic, "-s", "s", "-n", "1", "--json", *url)).json_lines()
    assert [m["value"] for m in got] == ["b"]


# --- cluster -------------------------------------------------------------------------------------


@on_node
async def test_cluster_views_through_the_admin_service(
    node: StandaloneNode, admin: AdminClient
) -> None:
    url = ("--service-url", node.service_url)
    topic = unique("owned")
    await admin.create_topic(topic, 2)
    ok(await magnetar("produce", topic, "-m", "x", *url))
    ledger_id = (await admin.list_ledgers(topic))[0]["ledger_id"]

    runs = await asyncio.gather(
        magnetar("cluster", "brokers", *url),
        magnetar("cluster", "brokers", "--json", *url),
        magnetar("cluster", "ownership", *url),
        magnetar("cluster", "ownership", "--broker", "standalone", "--json", *url),
        magnetar("cluster", "ownership", "--broker", "nobody", "--json", *url),
        magnetar("cluster", "bookies", *url),
        magnetar("cluster", "bookies", "--json", *url),
        magnetar("cluster", "ledgers", "--topic", topic, *url),
        magnetar("cluster", "ledgers", "--json", *url),
        magnetar("cluster", "ledger", str(ledger_id), *url),
        magnetar("cluster", "ledger", str(ledger_id), "--json", *url),
    )
    (brokers, brokers_json, owners, owners_json, nobody, bookies, bookies_json) = runs[:7]
    (ledgers, ledgers_json, ledger, ledger_json) = runs[7:]
    for run in runs:
        ok(run)

    assert brokers.out.splitlines()[0].split()[:3] == ["BROKER", "SERVICE_URL", "HTTP"]
    assert brokers.out.splitlines()[1].split()[:2] == ["standalone", node.service_url]
    assert [b["broker_id"] for b in brokers_json.json()] == ["standalone"]

    partitions = {f"public/default/{topic}-partition-{i}" for i in range(2)}
    assert partitions <= {line.split()[0] for line in owners.out.splitlines()[1:]}
    assert partitions <= {o["partition_topic"] for o in owners_json.json()}
    assert nobody.json() == []

    bookie_rows = [line.split() for line in bookies.out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in bookie_rows] == [(f"bookie-{i}", "writable") for i in range(3)]
    assert {b["state"] for b in bookies_json.json()} == {"writable"}

    ledger_rows = [line.split() for line in ledgers.out.splitlines()[1:]]
    assert {r[-1] for r in ledger_rows} == partitions
    assert ledger_id in {entry["ledger_id"] for entry in ledgers_json.json()}
    assert ledger.out.splitlines()[1].split()[:3] == [str(ledger_id), "open", "E3/Qw2/Qa2"]
    assert ledger_json.json()["summary"]["ledger_id"] == ledger_id
    assert len(ledger_json.json()["ensembles"][0]["bookie_ids"]) == 3


async def test_cluster_source_flags() -> None:
    both, topic_without_admin, no_metadata = await asyncio.gather(
        magnetar("cluster", "bookies", "--metadata", "memory://", "--service-url", "magnetar://x"),
        magnetar("cluster", "ledgers", "--metadata", "memory://", "--topic", "t"),
        magnetar("cluster", "under-replicated"),
    )
    assert both.code == EXIT_USAGE
    assert "not allowed with argument --metadata" in both.err
    assert topic_without_admin.code == EXIT_USAGE
    assert "--topic needs --service-url" in topic_without_admin.err
    assert no_metadata.code == EXIT_USAGE
    assert "--metadata" in no_metadata.err
    # the metadata store still answers directly
    assert (
        ok(await magnetar("cluster", "ledgers", "--metadata", "memory://", "--json")).json() == []
    )


# --- bad input -----------------------------------------------------------------------------------


@on_node
async def test_bad_input_gets_clear_errors(node: StandaloneNode) -> None:
    url = ("--service-url", node.service_url)
    runs = await asyncio.gather(
        magnetar("topics", "list", "--service-url", "http://localhost:6650"),
        magnetar("topics", "list", "--service-url", "magnetar://127.0.0.1:1",
                 "--operation-timeout-s", "0.3"),
        magnetar("produce", "t", "-m", "x", "--service-url", "magnetar://127.0.0.1:1",
                 "--operation-timeout-s", "0.3"),
        magnetar("topics", "stats", unique("missing"), *url),
        magnetar("topics", "partitions", unique("missing"), *url),
        magnetar("topics", "stats", "no spaces allowed", *url),
        magnetar("produce", "t", "-m", "x", "-p", "novalue", *url),
        magnetar("subscriptions", "reset", "t", "s", "--message-id", "12:x", *url),
        magnetar("subscriptions", "reset", "t", "s", "--time", "yesterday", *url),
        magnetar("subscriptions", "reset", "t", "s", *url),
        magnetar("topics", "list", "--operation-timeout-s", "0", *url),
        magnetar("topics", "list", "--namespace", "not-a-namespace", *url),
    )  # fmt: skip
    (bad_url, unreachable, unreachable_produce, no_topic, no_topic_partitions, bad_name) = runs[:6]
    (bad_property, bad_id, bad_time, no_target, bad_timeout, bad_namespace) = runs[6:]

    assert bad_url.code == EXIT_FAILED
    assert bad_url.err.startswith("magnetar topics: invalid service URL 'http://localhost:6650'")
    for run in (unreachable, unreachable_produce):
        assert run.code == EXIT_FAILED, str(run)
        assert "Check that a broker runs there" in run.err
        assert "Traceback" not in run.err
    assert no_topic.code == EXIT_FAILED
    assert no_topic.err.startswith("magnetar topics: topic public/default/missing-")
    assert no_topic.err.strip().endswith("does not exist")
    assert no_topic_partitions.code == EXIT_FAILED
    assert "does not exist" in no_topic_partitions.err
    assert bad_name.code == EXIT_FAILED
    assert "invalid topic name 'no spaces allowed'" in bad_name.err
    assert bad_property.code == EXIT_USAGE
    assert "expected KEY=VALUE, got 'novalue'" in bad_property.err
    assert bad_id.code == EXIT_USAGE
    assert "a message id is LEDGER:ENTRY[:BATCH_INDEX[:PARTITION]]" in bad_id.err
    assert bad_time.code == EXIT_USAGE
    assert "got 'yesterday'" in bad_time.err
    assert no_target.code == EXIT_USAGE
    assert "one of the arguments --to-earliest" in no_target.err
    assert bad_timeout.code == EXIT_USAGE
    assert "expected a number of seconds > 0" in bad_timeout.err
    assert bad_namespace.code == EXIT_FAILED
    assert "a namespace is 'tenant/namespace'" in bad_namespace.err


# --- helpers, in-process -------------------------------------------------------------------------


def test_times_are_epoch_ms_iso_or_relative() -> None:
    assert parse_time_ms("1795000000000") == 1795000000000
    assert parse_time_ms("2026-11-21T10:00:00Z") == 1795255200000
    assert parse_time_ms("2026-11-21T10:00:00") == 1795255200000  # no offset: UTC
    assert parse_time_ms("2026-11-21T11:00:00+01:00") == 1795255200000
    now = 1_800_000_000_000
    assert parse_time_ms("-30s", now_ms=now) == now - 30_000
    assert parse_time_ms("-10m", now_ms=now) == now - 600_000
    assert parse_time_ms("-2h", now_ms=now) == now - 7_200_000
    assert parse_time_ms("-1d", now_ms=now) == now - 86_400_000
    assert parse_time_ms("-1.5h", now_ms=now) == now - 5_400_000
    assert parse_time_ms("-250ms", now_ms=now) == now - 250
    for bad in ("yesterday", "10m", "-10w", ""):
        with pytest.raises(Exception, match="a time is milliseconds since the epoch"):
            parse_time_ms(bad)


def test_message_ids_and_properties() -> None:
    assert parse_message_id("15:0:3:1") == MessageId(15, 0, 3, 1)
    assert parse_message_id("15:0") == MessageId(15, 0, -1, -1)
    assert parse_message_id("15:0:2") == MessageId(15, 0, 2, -1)
    assert str(parse_message_id(" 7:8:-1:-1 ")) == "7:8:-1:-1"
    for bad in ("15", "a:b", "1:2:3:4:5", "-1:0", ""):
        with pytest.raises(Exception, match="a message id is"):
            parse_message_id(bad)
    assert parse_property("k=v") == ("k", "v")
    assert parse_property("k=") == ("k", "")
    assert parse_property("k=a=b") == ("k", "a=b")
    for bad in ("k", "=v"):
        with pytest.raises(Exception, match="expected KEY=VALUE"):
            parse_property(bad)


def test_values_are_utf8_or_base64() -> None:
    assert format_value("héllo".encode()) == ("héllo", "utf-8")
    assert format_value(b"") == ("", "utf-8")
    assert format_value(b"\x00\xff") == (base64.b64encode(b"\x00\xff").decode(), "base64")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_once_per_interval_on_terminals_only() -> None:
    now = [0.0]
    terminal = _Terminal()
    progress = Progress(terminal, interval_s=1.0, clock=lambda: now[0])
    shown = []
    for step in range(30):  # 3 s in 0.1 s steps
        now[0] = step / 10
        if progress.due():
            shown.append(now[0])
            progress.show(f"{step} sent")
    progress.done()
    assert shown == [1.0, 2.0]
    assert terminal.getvalue() == "\r10 sent\x1b[K\r20 sent\x1b[K\n"

    piped = io.StringIO()
    quiet = Progress(piped, interval_s=0.0)
    assert not quiet.due()
    quiet.done()
    assert piped.getvalue() == ""
