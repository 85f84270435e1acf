"""Hostile and buggy input against every broker and bookie RPC (issue 23): mutated protobuf
bytes, random bytes, extreme values, invalid UTF-8 and stream messages in the wrong order, to a
real cluster (etcd, 3 bookie processes, a broker process) while a control producer and consumer
run beside them.

What must hold: every process stays up (same pid), each process's memory stays under a bound,
no call hangs (each answers, with any status, within its deadline), and the control traffic
loses, duplicates and reorders nothing. The short form (the default run) sends about a thousand
inputs in under a minute; ``MAGNETAR_FUZZ_INPUTS`` raises the count per method (the soak form).

The inputs are seeded (``SEED``), so a failure is replayed by running the test again.
Integer fields get values outside the ids the cluster's own ledgers use (extremes, or above a
million), so that an input cannot delete or fence the control topic's ledger: a bookie serves
any caller its role allows, and here that is everyone (the test is about robustness, not
authorization).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory

from magnetar.aio import Client
from magnetar.common.errors import ReceiveTimeoutError
from magnetar.testing import LocalCluster
from proto.admin.v1 import admin_pb2
from proto.bookie.v1 import bookie_pb2
from proto.broker.v1 import broker_pb2

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

SEED = 20261125
INPUTS_PER_METHOD = int(os.environ.get("MAGNETAR_FUZZ_INPUTS", "30"))
CONCURRENCY = 8
CALL_DEADLINE_S = 15.0
RSS_BOUND_MIB = 1024
CONTROL_MESSAGES = 400

FD = _descriptor.FieldDescriptor
EXTREME_INTS = [
    -(2**63), -(2**31), -1, 2**31 - 1, 2**31, 2**32, 2**53, 2**62, 2**63 - 1,
]  # fmt: skip
INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b", b"\xf8\x88\x80\x80\x80"]


@dataclass
class Outcome:
    calls: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    hangs: list[str] = field(default_factory=list)
    by_method: dict[str, dict[str, int]] = field(default_factory=dict)

    def saw(self, status: grpc.StatusCode | str, label: str = "") -> None:
        name = status if isinstance(status, str) else status.name
        self.statuses[name] = self.statuses.get(name, 0) + 1
        counts = self.by_method.setdefault(label, {})
        counts[name] = counts.get(name, 0) + 1


# --- generating inputs ----------------------------------------------------------------------------


def _int(rng: random.Random, unsigned: bool) -> int:
    value = rng.choice([*EXTREME_INTS, rng.randint(1_000_000, 2**40)])
    if unsigned:
        value = abs(value) % 2**64
    return value


def _string(rng: random.Random) -> str:
    return rng.choice(
        [
            "",
            "x" * rng.choice([1, 300, 10_000, 100_000]),
            f"fuzz-{rng.getrandbits(32):08x}",
            "persistent://" + "/".join(f"t{rng.getrandbits(16)}" for _ in range(rng.randint(1, 5))),
            "ünïcødé-☃-" + str(rng.random()),
            "-partition-" + str(_int(rng, unsigned=False)),
            "../../etc/passwd",
        ]
    )


def fill(message: Any, rng: random.Random, depth: int = 0) -> None:
    """Set a random subset of ``message``'s fields to random, often extreme, values."""
    desc = message.DESCRIPTOR
    chosen_oneofs: set[str] = set()
    for f in desc.fields:
        oneof = f.containing_oneof
        if oneof is not None:
            if oneof.name in chosen_oneofs or rng.random() < 0.5:
                continue
            chosen_oneofs.add(oneof.name)
        elif rng.random() < 0.3:
            continue
        count = rng.choice([1, 1, 2, 50]) if f.is_repeated else 1
        for _ in range(count):
            _set(message, f, rng, depth)


def _set(message: Any, f: FD, rng: random.Random, depth: int) -> None:
    if f.type == FD.TYPE_MESSAGE:
        if depth > 4:
            return
        entry_type = f.message_type
        assert entry_type is not None
        if entry_type.GetOptions().map_entry:
            key_f = entry_type.fields_by_name["key"]
            value_f = entry_type.fields_by_name["value"]
            key = _scalar(key_f, rng)
            target = getattr(message, f.name)
            if value_f.type == FD.TYPE_MESSAGE:
                fill(target[key], rng, depth + 1)
            else:
                target[key] = _scalar(value_f, rng)
            return
        child = getattr(message, f.name).add() if f.is_repeated else getattr(message, f.name)
        fill(child, rng, depth + 1)
        if not f.is_repeated:
            child.SetInParent()
        return
    value = _scalar(f, rng)
    if f.is_repeated:
        getattr(message, f.name).append(value)
    else:
        setattr(message, f.name, value)


def _scalar(f: FD, rng: random.Random) -> Any:
    if f.type in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        return _int(rng, unsigned=False)
    if f.type in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return _int(rng, unsigned=True)
    if f.type in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return rng.choice([-(2**31), -1, 2**31 - 1, rng.randint(1_000_000, 2**31 - 1)])
    if f.type in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return rng.choice([2**32 - 1, 2**31, rng.randint(1_000_000, 2**32 - 1)])
    if f.type == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if f.type == FD.TYPE_STRING:
        return _string(rng)
    if f.type == FD.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 100, 5_000, 300_000]))
    if f.type == FD.TYPE_ENUM:
        assert f.enum_type is not None
        return rng.choice([*(v.number for v in f.enum_type.values), 7, 99, -1, 2**31 - 1])
    if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300, float("inf"), float("nan")])
    raise AssertionError(f"no generator for field type {f.type}")


def mutate(data: bytes, rng: random.Random) -> bytes:
    """Bit flips, truncation, duplication, splices of random bytes."""
    if not data:
        return rng.randbytes(rng.randint(1, 64))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        at = rng.randrange(len(buf)) if buf else 0
        if kind == 0 and buf:
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del buf[at:]
        elif kind == 2:
            buf[at:at] = buf[at : at + rng.randint(1, 32)]
        elif kind == 3:
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        else:
            buf[at:at] = b"\x0a" + bytes([len(piece := rng.choice(INVALID_UTF8))]) + piece
    return bytes(buf)


def one_input(method: Any, rng: random.Random) -> bytes:
    """One request message's bytes for ``method``: random bytes, a random message, or a
    mutated one; or one with a string field holding invalid UTF-8."""
    cls = message_factory.GetMessageClass(method.input_type)
    choice = rng.random()
    if choice < 0.15:
        return rng.randbytes(rng.randint(0, 200))
    message = cls()
    fill(message, rng)
    data = message.SerializeToString()
    if choice < 0.55:
        return data
    if choice < 0.7:
        strings = [f for f in method.input_type.fields if f.type == FD.TYPE_STRING]
        if strings:
            f = rng.choice(strings)
            bad = rng.choice(INVALID_UTF8)
            tag = (f.number << 3) | 2
            return data + _varint(tag) + _varint(len(bad)) + bad
    return mutate(data, rng)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# --- sending them ---------------------------------------------------------------------------------

IDENTITY: Callable[[bytes], bytes] = lambda b: b  # noqa: E731 - a serializer that is no-op


async def fuzz_method(
    channel: grpc.aio.Channel, service: Any, method: Any, rng: random.Random, outcome: Outcome
) -> None:
    path = f"/{service.full_name}/{method.name}"
    label = f"{service.name}.{method.name}"
    if method.client_streaming:
        call = channel.stream_stream(
            path, request_serializer=IDENTITY, response_deserializer=IDENTITY
        )
        requests = [one_input(method, rng) for _ in range(rng.randint(1, 6))]
        rng.shuffle(requests)  # messages in the wrong order, too

        async def run() -> None:
            stream = call(iter(requests), timeout=CALL_DEADLINE_S)
            try:
                async for _ in stream:
                    pass
                outcome.saw(await stream.code(), label)
            finally:
                stream.cancel()

    else:
        unary = channel.unary_unary(
            path, request_serializer=IDENTITY, response_deserializer=IDENTITY
        )
        request = one_input(method, rng)

        async def run() -> None:
            await unary(request, timeout=CALL_DEADLINE_S)
            outcome.saw("OK", label)

    outcome.calls += 1
    try:
        await run()
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not method.client_streaming:
            outcome.hangs.append(label)
        outcome.saw(e.code(), label)


# --- the control traffic --------------------------------------------------------------------------


async def control_traffic(url: str, topic: str, stop: asyncio.Event) -> tuple[list[int], list[int]]:
    """Send one message every 20 ms until ``stop`` (at least a quarter of CONTROL_MESSAGES),
    then receive until everything sent came; what was sent and what was received."""
    sent: list[int] = []
    received: list[int] = []
    done_sending = asyncio.Event()
    async with Client(url, operation_timeout_s=60) as client:
        consumer = await client.subscribe(topic, "control", initial_position="earliest")
        producer = await client.create_producer(topic)

        async def consume() -> None:
            while not (done_sending.is_set() and len(received) >= len(sent)):
                with contextlib.suppress(ReceiveTimeoutError):
                    message = await consumer.receive(timeout_millis=1_000)
                    received.append(int(message.data()))
                    await consumer.acknowledge(message)

        reading = asyncio.create_task(consume())
        i = 0
        while not stop.is_set() or i < CONTROL_MESSAGES // 4:
            await producer.send(str(i).encode())
            sent.append(i)
            i += 1
            await asyncio.sleep(0.02)
        done_sending.set()
        async with asyncio.timeout(60):
            await reading
    return sent, received


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


SERVICES = [
    ("broker", broker_pb2.DESCRIPTOR.services_by_name["BrokerService"]),
    ("broker", admin_pb2.DESCRIPTOR.services_by_name["AdminService"]),
    ("bookie", bookie_pb2.DESCRIPTOR.services_by_name["BookieService"]),
]


@pytest.mark.timeout(600)
async def test_no_input_harms_the_cluster_or_other_clients(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    async with LocalCluster(tmp_path / "cluster", bookies=3, brokers=1) as cluster:
        processes = {
            "broker": cluster.brokers[0],
            **{f"bookie-{i}": b for i, b in enumerate(cluster.bookies)},
        }
        pids = {name: p.pid for name, p in processes.items()}
        topic = f"control-{uuid.uuid4().hex[:8]}"
        stop = asyncio.Event()
        control = asyncio.create_task(control_traffic(cluster.service_url, topic, stop))
        outcome = Outcome()
        channels = {
            "broker": grpc.aio.insecure_channel(cluster.brokers[0].address),
            "bookie": grpc.aio.insecure_channel(cluster.bookies[0].address),
        }
        peak: dict[str, float] = {}
        try:
            jobs = [
                (channels[target], service, method, random.Random(rng.random()))
                for _ in range(INPUTS_PER_METHOD)
                for target, service in SERVICES
                for method in service.methods
            ]
            rng.shuffle(jobs)
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(job: tuple[Any, Any, Any, random.Random]) -> None:
                async with gate:
                    await fuzz_method(*job, outcome)
                    for name, p in processes.items():
                        peak[name] = max(peak.get(name, 0.0), rss_mib(p.pid or 0))

            await asyncio.gather(*(one(job) for job in jobs))
        finally:
            stop.set()
            sent, received = await control
            for channel in channels.values():
                await channel.close()

        print(
            f"fuzz: {outcome.calls} calls, statuses {outcome.statuses}, peak RSS MiB {peak},"
            f" control {len(sent)} sent / {len(received)} received"
        )
        unhandled = {m: c for m, c in outcome.by_method.items() if "UNKNOWN" in c}
        # every process is the one that started, and still runs
        assert {name: p.pid for name, p in processes.items()} == pids
        assert all(p.is_running for p in processes.values())
        assert all(mib < RSS_BOUND_MIB for mib in peak.values()), peak
        # every call answered within its deadline, and no handler failed unhandled (UNKNOWN);
        # INTERNAL is the client's transport seeing a stream reset while it still wrote
        assert outcome.hangs == [], outcome
        assert unhandled == {}, unhandled
        assert outcome.calls == len(jobs)
        # the control traffic: everything, once, in order
        assert len(sent) >= CONTROL_MESSAGES // 4
        assert received == sent, (len(sent), len(received))
        # the inputs reached the handlers: not every call was refused at the door
        assert outcome.statuses.get("OK", 0) > 0, outcome.statuses
