"""The Node.js client of examples/node, against a real ``magnetar standalone``, with the Python
client on the other end: Node produces and Python consumes, Python produces and Node consumes and
acknowledges, and a Node producer and a Node consumer each keep going across a broker-side close
with nothing lost or duplicated. The example speaks the protocol from the .proto files alone,
so these tests hold the wire contract to what a client in another language sees.

Node.js and npm must be installed (scripts/bootstrap.sh --etcd installs them and runs ``npm ci``
in examples/node); the tests run ``npm ci`` themselves when the packages are missing or stale.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from magnetar.aio import Client
from magnetar.aio.admin import AdminClient
from magnetar.aio.routing import key_partition
from magnetar.common.keys import key_hash
from magnetar.testing import StandaloneNode

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
NPM_STAMP = EXAMPLE / "node_modules" / ".magnetar-npm-ci"
"""The same stamp as scripts/bootstrap.sh's: the hash of the package-lock.json installed."""
WAIT_S = 60.0
"""How long a Node.js program may stay silent before the test gives up (a hang, not a figure)."""

on_node = pytest.mark.asyncio(loop_scope="module")

MOVING = {"ERROR_CODE_SERVICE_NOT_READY", "ERROR_CODE_MANAGED_LEDGER_CLOSED"}
"""The codes a client sees while a partition it uses is unloaded (both retriable)."""


def npm_ci() -> None:
    """Install the example's packages exactly as package-lock.json says, unless installed."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} is not installed: the Node.js example's tests need Node.js 18 or newer"
                " and npm (scripts/bootstrap.sh --etcd installs them)"
            )
    want = hashlib.sha256((EXAMPLE / "package-lock.json").read_bytes()).hexdigest()
    if NPM_STAMP.is_file() and NPM_STAMP.read_text().strip() == want:
        return
    result = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"npm ci in {EXAMPLE} failed:\n{result.stdout}\n{result.stderr}")
    NPM_STAMP.write_text(want + "\n")


@pytest.fixture(scope="module")
def node_packages() -> None:
    npm_ci()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(
    tmp_path_factory: pytest.TempPathFactory, node_packages: None
) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("node-example") / "data") as node:
        yield node


@pytest_asyncio.fixture(loop_scope="module")
async def admin(standalone: StandaloneNode) -> AsyncIterator[AdminClient]:
    async with AdminClient(standalone.service_url, operation_timeout_s=10) as admin:
        yield admin


class NodeProgram:
    """One of the example's programs, running: JSON lines in (stdin) and out (stdout)."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, script: str, *args: str) -> NodeProgram:
        process = await asyncio.create_subprocess_exec(
            "node",
            script,
            *args,
            cwd=EXAMPLE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process, script)

    async def write(self, lines: list[dict[str, Any]]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("".join(json.dumps(line) + "\n" for line in lines).encode())
        await self.process.stdin.drain()

    async def next_event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), WAIT_S)
        if not line:
            await self.fail("ended")
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def until(self, kind: str, count: int = 1) -> None:
        """Read events until ``count`` of ``kind`` were seen (in all)."""
        while sum(e["event"] == kind for e in self.events) < count:
            await self.next_event()

    async def finish(self) -> list[dict[str, Any]]:
        """Close stdin, read every event to the end, and check the program succeeded."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        while line := await asyncio.wait_for(self.process.stdout.readline(), WAIT_S):
            self.events.append(json.loads(line))
        if await asyncio.wait_for(self.process.wait(), WAIT_S) != 0:
            await self.fail(f"exited with {self.process.returncode}")
        return self.events

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    async def fail(self, what: str) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        assert self.process.stderr is not None
        stderr = (await self.process.stderr.read()).decode()
        pytest.fail(f"node {self.name} {what}; events: {self.events[-5:]}\nstderr:\n{stderr}")


def sent_messages(prefix: str, count: int) -> list[dict[str, Any]]:
    """Keyed messages (four keys, one not ASCII) and keyless ones, each with properties."""
    keys = ["alpha", "beta", "ключ", "delta", None]
    return [
        {
            "value": f"{prefix} {i} ü",
            "key": keys[i % len(keys)],
            "properties": {"i": str(i), "origin": prefix},
        }
        for i in range(count)
    ]


def per_key(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The values of each key, in the order given (keyless messages go round robin over the
    partitions: no order among them)."""
    order: dict[str, list[str]] = defaultdict(list)
    for m in messages:
        if m["key"] is not None:
            order[m["key"]].append(m["value"])
    return dict(order)


def test_key_hashes_and_partitions_match_pythons(node_packages: None) -> None:
    keys = ["", "a", "alpha", "ключ", "order-42", "x" * 300]
    script = (
        "const m = require('./magnetar');"
        f"const keys = {json.dumps(keys)};"
        "console.log(JSON.stringify(keys.map((k) => [m.keyHash(k), m.keyPartition(k, 7)])));"
    )
    result = subprocess.run(
        ["node", "-e", script], cwd=EXAMPLE, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == [[key_hash(k), key_partition(k, 7)] for k in keys]


@on_node
@pytest.mark.parametrize("compression", ["none", "zlib"])
async def test_node_produces_and_python_consumes(
    standalone: StandaloneNode, admin: AdminClient, compression: str
) -> None:
    topic = f"node-to-python-{compression}"
    await admin.create_topic(topic, partitions=3)
    sent = sent_messages(f"node-{compression}", 60)
    args = ["--service-url", standalone.service_url, "--topic", topic]
    producer = await NodeProgram.start(
        "produce.js", *args, *(["--zlib"] if compression == "zlib" else [])
    )
    await producer.write(sent)
    events = await producer.finish()
    receipts = producer.of("receipt")
    assert len(receipts) == len(sent)
    assert not any(r["duplicate"] for r in receipts)
    assert events[-1] == {"event": "done", "sent": len(sent), "reconnects": 0}

    async with Client(standalone.service_url) as client:
        consumer = await client.subscribe(topic, "python", initial_position="earliest")
        received = []
        for _ in sent:
            message = await consumer.receive(timeout_millis=int(WAIT_S * 1000))
            received.append(message)
            await consumer.acknowledge(message)
    got: list[dict[str, Any]] = [
        {"value": m.data().decode(), "key": m.partition_key(), "properties": m.properties()}
        for m in received
    ]
    assert sorted(got, key=lambda m: m["value"]) == sorted(sent, key=lambda m: m["value"])
    assert per_key(got) == per_key(sent)
    # a key's partition is the one the Python client would choose
    partitions = {m.message_id().partition for m in received if m.partition_key() == "alpha"}
    assert partitions == {key_partition("alpha", 3)}
    # what the Node producer's receipts said is where Python found each message
    where = {r["value"]: (r["message_id"]["partition"], r["offset"]) for r in receipts}
    assert {m.data().decode(): (m.message_id().partition, m.offset()) for m in received} == where


@on_node
async def test_python_produces_and_node_consumes_and_acknowledges(
    standalone: StandaloneNode, admin: AdminClient
) -> None:
    topic = "python-to-node"
    await admin.create_topic(topic, partitions=2)
    sent = sent_messages("python", 40)
    async with Client(standalone.service_url) as client:
        producer = await client.create_producer(topic)
        ids = [
            await producer.send(
                m["value"].encode(), partition_key=m["key"], properties=m["properties"]
            )
            for m in sent
        ]
        args = ["--service-url", standalone.service_url, "--topic", topic]
        consumer = await NodeProgram.start(
            "consume.js", *args, "--subscription", "node", "--count", str(len(sent))
        )
        await consumer.finish()
        assert consumer.of("done") == [{"event": "done", "received": 40, "redelivered": 0}]
        messages = consumer.of("message")
        got = [{k: m[k] for k in ("value", "key", "properties")} for m in messages]
        assert sorted(got, key=lambda m: m["value"]) == sorted(sent, key=lambda m: m["value"])
        assert per_key(got) == per_key(sent)
        # each message where the Python producer's receipt said it was stored
        where = {
            m["value"]: tuple(m["message_id"][f] for f in ("partition", "ledger_id", "entry_id"))
            for m in messages
        }
        assert where == {
            m["value"]: (i.partition, i.ledger_id, i.entry_id)
            for m, i in zip(sent, ids, strict=True)
        }

        # Node acknowledged everything (and waited for the broker to apply it): a new consumer
        # of the subscription gets only what comes next, on each partition
        markers = {}
        for partition in range(2):
            key = next(k for k in map(str, range(100)) if key_partition(k, 2) == partition)
            markers[key] = f"after {partition}"
        python = await client.subscribe(topic, "node", subscription_type="shared")
        for key, value in markers.items():
            await producer.send(value.encode(), partition_key=key)
        after = [await python.receive(timeout_millis=int(WAIT_S * 1000)) for _ in markers]
        assert sorted(m.data().decode() for m in after) == sorted(markers.values())


@on_node
async def test_a_node_producer_keeps_going_across_a_broker_side_close(
    standalone: StandaloneNode, admin: AdminClient
) -> None:
    topic = "node-reconnect"
    await admin.create_topic(topic)
    sent: list[dict[str, Any]] = []

    async def send(count: int) -> None:
        more = [{"value": f"r{len(sent) + i}", "key": f"k{i % 3}"} for i in range(count)]
        sent.extend(more)
        await producer.write(more)

    producer = await NodeProgram.start(
        "produce.js",
        *("--service-url", standalone.service_url, "--topic", topic),
        *("--producer-name", "node-reconnect"),
    )
    await send(100)
    await producer.until("receipt", 100)
    # the broker closes the producer (a `closed` message): messages go on until it has seen
    # that (each batch written is answered by receipts or by the reconnect), and after
    unload = asyncio.create_task(admin.unload_topic(topic))
    while not producer.of("reconnecting"):
        assert len(sent) < 20_000, "the producer never saw the broker close it"
        await send(10)
        await producer.next_event()
    await unload
    await send(100)
    events = await producer.finish()
    # the partition moved (here: back to the same broker, the only one)
    reconnecting = producer.of("reconnecting")
    assert reconnecting
    assert {e["code"] for e in reconnecting} <= MOVING, reconnecting
    assert events[-1] == {"event": "done", "sent": len(sent), "reconnects": len(reconnecting)}
    receipts = producer.of("receipt")
    assert sorted(r["sequence_id"] for r in receipts) == list(range(len(sent)))

    # exactly once, in order: every message at its offset, and the next one stored is ours
    async with Client(standalone.service_url) as client:
        reader = await client.create_reader(topic, "earliest")
        stored = [await reader.read_next(timeout_millis=int(WAIT_S * 1000)) for _ in sent]
        assert [m.data().decode() for m in stored] == [m["value"] for m in sent]
        assert [m.offset() for m in stored] == list(range(len(sent)))
        offsets = {m.data().decode(): m.offset() for m in stored}
        # a resend's duplicate receipt may not know the original offset any more
        assert all(offsets[r["value"]] == r["offset"] for r in receipts if not r["duplicate"])
        producer_py = await client.create_producer(topic)
        await producer_py.send(b"next")
        assert (await reader.read_next(timeout_millis=int(WAIT_S * 1000))).data() == b"next"


@on_node
async def test_a_node_consumer_keeps_going_across_a_broker_side_close(
    standalone: StandaloneNode, admin: AdminClient
) -> None:
    topic = "node-consumer-reconnect"
    await admin.create_topic(topic)
    values = [f"c{i}" for i in range(100)]
    async with Client(standalone.service_url) as client:
        producer = await client.create_producer(topic)
        for value in values[:50]:
            await producer.send(value.encode())
        consumer = await NodeProgram.start(
            "consume.js",
            *("--service-url", standalone.service_url, "--topic", topic),
            *("--subscription", "node", "--type", "exclusive", "--count", str(len(values))),
        )
        await consumer.until("message", 10)
        await admin.unload_topic(topic)  # the broker closes the consumer's stream
        for value in values[50:]:
            await producer.send(value.encode())
        await consumer.finish()
        reconnecting = consumer.of("reconnecting")
        assert reconnecting
        assert {e["code"] for e in reconnecting} <= MOVING, reconnecting
        # every message once, in order (a message delivered again is acknowledged, not counted)
        assert [m["value"] for m in consumer.of("message")] == values
        assert [m["offset"] for m in consumer.of("message")] == list(range(len(values)))

        # and every one acknowledged: a new consumer of the subscription gets only what is next
        python = await client.subscribe(topic, "node", subscription_type="exclusive")
        await producer.send(b"after")
        after = await python.receive(timeout_millis=int(WAIT_S * 1000))
        assert after.data() == b"after"
