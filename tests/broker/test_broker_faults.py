"""Brokers as real processes against real etcd and real bookie processes: crash failover
(SIGKILL), a zombie owner (SIGSTOP past its lease), graceful handover (SIGTERM) and scale-out by
load shedding. Each test checks, with :class:`Workload`, that every acknowledged message was
consumed, in order per partition, with no gaps and nothing stored twice."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path

import grpc.aio
import pytest

from magnetar.testing import BrokerNode, LocalCluster
from magnetar.testing.eventually import eventually
from proto.admin.v1 import admin_pb2 as admin
from proto.admin.v1 import admin_pb2_grpc
from proto.broker.v1 import broker_pb2_grpc
from tests.broker.raw import RawProducer, produce_batch
from tests.broker.workload import Workload

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(240)]

TTL_ARGS = ["--session-ttl-s", "3", "--load-report-interval-ms", "500"]


def admin_stub(url: str) -> tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(url.removeprefix("magnetar://").split(",")[0])
    return channel, admin_pb2_grpc.AdminServiceStub(channel)


async def owners(stub: admin_pb2_grpc.AdminServiceAsyncStub) -> dict[str, str]:
    listing = await stub.ListOwnership(admin.ListOwnershipRequest())
    return {o.partition_topic: o.broker_id for o in listing.ownership}


async def test_crash_failover_loses_nothing(tmp_path: Path) -> None:
    # retention keeps consumed ledgers, so the old owner's last one can be inspected afterwards
    args = [
        *TTL_ARGS,
        "--load-shedding-enabled",
        "false",
        "--managed-ledger-retention-time-ms",
        "-1",
        "--managed-ledger-retention-size-bytes",
        "-1",
    ]
    async with LocalCluster(tmp_path, bookies=3, brokers=3, broker_args=args) as cluster:
        channel, stub = admin_stub(cluster.service_url)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="crash", partitions=4))
        work = Workload(cluster.service_url, "public/default/crash", 4)
        await work.start()
        await work.wait_acked(400)
        owned = await owners(stub)
        victim_id = owned["public/default/crash-partition-0"]
        victim = next(b for b in cluster.brokers if b.broker_id == victim_id)
        lost = [int(p.rsplit("-", 1)[1]) for p, b in owned.items() if b == victim_id]
        before = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic="crash", internal=True))
        last_ledger = before.partitions[0].ledgers[-1].ledger_id
        old_ledgers = {p.ledgers[-1].ledger_id for p in before.partitions}

        killed_at = time.monotonic()
        await victim.kill()
        await work.wait_acked(400, timeout_s=90)
        next_ack = await eventually(
            lambda: work.first_ack_after(killed_at, lost, not_in_ledgers=old_ledgers),
            timeout_s=60,
            what="a receipt from a new ledger",
            interval_s=0.05,
        )
        failover_s = next_ack - killed_at
        print(f"\ncrash failover: SIGKILL to next acknowledged send {failover_s * 1000:.0f} ms")
        await work.wait_acked(200)
        totals = await _finish(work)
        print(f"crash failover totals: {totals}")

        survivor = next(b for b in cluster.brokers if b is not victim)
        _, stub2 = admin_stub(survivor.service_url)
        ledger = await stub2.GetLedger(admin.GetLedgerRequest(ledger_id=last_ledger))
        assert ledger.summary.state == "CLOSED"  # fenced and closed by the new owner's recovery
        after = await stub2.GetTopicStats(
            admin.GetTopicStatsRequest(topic="crash-partition-0", internal=True)
        )
        assert after.partitions[0].owner_broker_id != victim_id
        assert after.partitions[0].ledgers[-1].ledger_id != last_ledger
        await channel.close()


async def test_a_crashed_process_is_replaced_long_before_its_session_could_expire(
    tmp_path: Path,
) -> None:
    # A 60 s session TTL: only the peer watchdog (a refused connection to the dead broker's
    # port, then its lease revoked) can explain a takeover within this test's 40 s waits.
    args = ["--session-ttl-s", "60", "--load-shedding-enabled", "false"]
    async with LocalCluster(tmp_path, bookies=3, brokers=2, broker_args=args) as cluster:
        channel, stub = admin_stub(cluster.service_url)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="sudden", partitions=2))
        work = Workload(cluster.service_url, "public/default/sudden", 2)
        await work.start()
        await work.wait_acked(200)
        owned = await owners(stub)
        victim_id = owned["public/default/sudden-partition-0"]
        victim = next(b for b in cluster.brokers if b.broker_id == victim_id)
        survivor = next(b for b in cluster.brokers if b is not victim)
        lost = [int(p.rsplit("-", 1)[1]) for p, b in owned.items() if b == victim_id]
        before = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic="sudden"))
        old_ledgers = {p.ledgers[-1].ledger_id for p in before.partitions if p.ledgers}
        await channel.close()
        # a peer is revoked only once it was seen listening (a refusal from the start is a
        # configuration problem, not a crash)
        await eventually(
            lambda: metric(survivor, "magnetar_broker_peers_watched", 1),
            timeout_s=30,
            interval_s=0.1,
        )

        killed_at = time.monotonic()
        await victim.kill()
        # its registration goes with its lease, far ahead of the 60 s TTL
        await cluster.wait_broker_unregistered(victim_id, timeout_s=40)
        await eventually(
            lambda: work.first_ack_after(killed_at, lost, not_in_ledgers=old_ledgers),
            timeout_s=40,
            what="a receipt from a new ledger",
            interval_s=0.05,
        )
        await work.wait_acked(200, timeout_s=40)

        channel, stub = admin_stub(survivor.service_url)
        assert set((await owners(stub)).values()) == {survivor.broker_id}
        assert await metric(survivor, "magnetar_broker_peer_leases_revoked_total", 1)
        totals = await _finish(work)
        print(f"\ncrash with a 60 s session TTL: totals {totals}")
        await channel.close()


async def metric(node: BrokerNode, name: str, value: int) -> bool:
    """Whether the broker's /metrics has ``name`` at ``value``."""
    url = f"http://{node.http_address}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    return re.search(rb"^%s\{[^}]*\} %d\.0$" % (name.encode(), value), text, re.M) is not None


async def _finish(work: Workload) -> dict[str, int]:
    await work.stop()
    totals = work.verify()
    assert totals["failed"] == 0, {p: log.failed[:3] for p, log in work.logs.items()}
    return totals


async def test_graceful_handover_is_invisible_to_clients(tmp_path: Path) -> None:
    async with LocalCluster(
        tmp_path, bookies=3, brokers=2, broker_args=[*TTL_ARGS, "--load-shedding-enabled", "false"]
    ) as cluster:
        channel, stub = admin_stub(cluster.service_url)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="calm", partitions=4))
        work = Workload(cluster.service_url, "public/default/calm", 4)
        await work.start()
        await work.wait_acked(400)
        leaving = cluster.brokers[0]
        staying = cluster.brokers[1]
        assert leaving.broker_id in (await owners(stub)).values()
        stopped_at = time.monotonic()
        await leaving.stop()  # SIGTERM: hands its partitions over
        assert leaving.exit_code == 0
        await work.wait_acked(400)
        handover_s = time.monotonic() - stopped_at
        _, stub = admin_stub(staying.service_url)
        assert set((await owners(stub)).values()) == {staying.broker_id}
        totals = await _finish(work)
        print(f"\ngraceful handover: stop took {handover_s:.2f} s; totals {totals}")
        assert not work.consumer_errors
        await channel.close()


async def test_zombie_owner_cannot_acknowledge_anything(tmp_path: Path) -> None:
    async with LocalCluster(
        tmp_path, bookies=3, brokers=2, broker_args=[*TTL_ARGS, "--load-shedding-enabled", "false"]
    ) as cluster:
        first, second = cluster.brokers
        channel, stub = admin_stub(first.service_url)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="zombie", partitions=0))
        zombie_channel = grpc.aio.insecure_channel(first.address)
        old = RawProducer(broker_pb2_grpc.BrokerServiceStub(zombie_channel))
        opened = await old.open("public/default/zombie", producer_name="z")
        assert opened.WhichOneof("kind") == "opened"
        await old.send(*(produce_batch(i, i, f"before-{i}".encode()) for i in range(5)))
        before = [r for resp in await old.receipts(5) for r in resp.receipts.receipts]
        assert len(before) == 5

        await first.pause()  # SIGSTOP: its lease runs out while it believes it owns the topic
        _, second_stub = admin_stub(second.service_url)
        # the second broker takes the partition over once the first's lease has run out
        # (fencing the zombie's ledger): until then it refuses, and taken() asks again
        second_channel = grpc.aio.insecure_channel(second.address)
        opened_new: list[RawProducer] = []

        async def taken() -> bool:
            candidate = RawProducer(broker_pb2_grpc.BrokerServiceStub(second_channel))
            response = await candidate.open("public/default/zombie", producer_name="n")
            if response.WhichOneof("kind") == "opened":
                opened_new.append(candidate)
                return True
            await candidate.close()
            return False

        await eventually(taken, timeout_s=30, interval_s=0.1)
        new = opened_new[0]
        await new.send(*(produce_batch(i, i, f"new-{i}".encode()) for i in range(5)))
        assert len([r for resp in await new.receipts(5) for r in resp.receipts.receipts]) == 5
        # the zombie wakes with batches waiting on its stream
        await old.send(*(produce_batch(i, i, f"zombie-{i}".encode()) for i in range(5, 10)))
        await first.resume()
        answers = []
        try:
            async with asyncio.timeout(20):
                while True:
                    response = await old.next()
                    answers.append(response)
                    if response.WhichOneof("kind") == "closed":
                        break
        except (TimeoutError, EOFError, grpc.aio.AioRpcError):
            pass
        zombie_receipts = [r for a in answers for r in a.receipts.receipts]
        assert zombie_receipts == [], "a zombie acknowledged a message"

        async def gave_up() -> bool:
            return set((await owners(second_stub)).values()) == {second.broker_id}

        await eventually(gave_up, timeout_s=30, interval_s=0.1)
        # the log holds exactly what was acknowledged: 5 before, 5 after, no zombie entry
        from tests.broker.raw import RawConsumer, values_of  # noqa: PLC0415

        reader = RawConsumer(
            broker_pb2_grpc.BrokerServiceStub(grpc.aio.insecure_channel(second.address))
        )
        await reader.subscribe("public/default/zombie", "", durable=False)
        await reader.flow(100)
        values = [v for d in await reader.deliveries(10) for v in values_of(d)]
        assert values == [f"before-{i}".encode() for i in range(5)] + [
            f"new-{i}".encode() for i in range(5)
        ]
        await asyncio.sleep(0.5)
        assert (await reader_pending(reader)) == 0
        for stream in (old, new, reader):
            await stream.close()
        await zombie_channel.close()
        await second_channel.close()
        await channel.close()


async def reader_pending(reader: object) -> int:
    """Deliveries that arrive within a short wait (nothing more should)."""
    try:
        extra = await asyncio.wait_for(reader.deliveries(1), 1.0)  # type: ignore[attr-defined]
    except TimeoutError:
        return 0
    return len(extra)


async def test_scale_out_spreads_partitions_without_loss(tmp_path: Path) -> None:
    shedding = [
        *TTL_ARGS,
        "--load-shedding-interval-ms",
        "2000",
        "--load-shedding-min-ownership-ms",
        "1000",
    ]
    async with LocalCluster(tmp_path, bookies=3, brokers=1, broker_args=shedding) as cluster:
        channel, stub = admin_stub(cluster.service_url)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="wide", partitions=8))
        work = Workload(cluster.brokers[0].service_url, "public/default/wide", 8, in_flight=5)
        await work.start()
        await work.wait_acked(400)
        assert set((await owners(stub)).values()) == {cluster.brokers[0].broker_id}
        started = time.monotonic()
        await cluster.add_broker()
        await cluster.add_broker()

        async def spread() -> bool:
            counts: dict[str, int] = {}
            for broker in (await owners(stub)).values():
                counts[broker] = counts.get(broker, 0) + 1
            return len(counts) == 3 and min(counts.values()) >= 2

        await eventually(spread, timeout_s=60, interval_s=0.1)
        spread_s = time.monotonic() - started
        await work.wait_acked(400)
        totals = await _finish(work)
        print(f"\nscale-out: 8 partitions spread over 3 brokers in {spread_s:.1f} s; {totals}")
        await channel.close()
