"""Writes go on with fewer than E bookies, as long as Qw remain (issue 24, item 2), with real
etcd, bookie and broker processes: 3 bookies, E3/Qw2/Qa2 (the standalone's shape).

SIGKILL a bookie of the ensemble while a producer sends: every send is acknowledged, none is
lost, and the topic's next ledger is on the two bookies left, reported as under-striped. Once
the bookie is back, later ledgers are full width again. With two bookies gone (fewer than Qw
writable) a send that times out names the cause, and so do the topic stats and the broker's
health detail. The stall each fault causes is measured by ``bench/bookie_loss_bench.py``, not
asserted here.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc.aio
import pytest

from magnetar.aio import Client
from magnetar.common.errors import OperationTimeoutError
from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually
from proto.admin.v1 import admin_pb2 as admin
from proto.admin.v1 import admin_pb2_grpc
from tests.broker.workload import Workload

# about 50 s (four processes started, three bookie faults): a soak test; the default run has
# tests/bookie/test_ledger_faults.py and tests/broker/managed_ledger/test_write_failure.py
pytestmark = [pytest.mark.etcd, pytest.mark.soak, pytest.mark.timeout(240)]

TOPIC = "public/default/narrow"
PARTITION = f"{TOPIC}-partition-0"
ARGS = [
    "--load-shedding-enabled",
    "false",
    # roll often, so that a ledger made after the bookie is back shows up soon
    "--managed-ledger-max-entries-per-ledger",
    "150",
    "--managed-ledger-min-ledger-age-ms",
    "0",
    "--managed-ledger-retention-time-ms",
    "-1",
    "--managed-ledger-retention-size-bytes",
    "-1",
]


async def ledgers_of(
    stub: admin_pb2_grpc.AdminServiceAsyncStub,
) -> list[admin.GetLedgerResponse]:
    stats = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=TOPIC, internal=True))
    return [
        await stub.GetLedger(admin.GetLedgerRequest(ledger_id=ledger.ledger_id))
        for ledger in stats.partitions[0].ledgers
    ]


def bookies_of(ledger: admin.GetLedgerResponse) -> set[str]:
    return {b for e in ledger.ensembles for b in e.bookie_ids}


async def test_writes_go_on_under_striped_and_below_qw_the_cause_is_named(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path, bookies=3, brokers=1, broker_args=ARGS) as cluster:
        broker = cluster.brokers[0]
        channel = grpc.aio.insecure_channel(broker.address)
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        await stub.CreateTopic(admin.CreateTopicRequest(topic="narrow", partitions=1))
        work = Workload(cluster.service_url, TOPIC, 1)
        await work.start()
        await work.wait_acked(300)
        before = {ledger.summary.ledger_id for ledger in await ledgers_of(stub)}

        victim = cluster.bookies[1]
        await victim.kill()
        await work.wait_acked(600)
        after_kill = [lg for lg in await ledgers_of(stub) if lg.summary.ledger_id not in before]
        narrow = [lg for lg in after_kill if lg.summary.ensemble_size == 2]
        assert narrow, [lg.summary for lg in after_kill]
        for ledger in narrow:
            assert ledger.summary.intended_ensemble_size == 3  # reported as under-striped
            assert (ledger.summary.write_quorum_size, ledger.summary.ack_quorum_size) == (2, 2)
            assert victim.bookie_id not in bookies_of(ledger)
        seen = {lg.summary.ledger_id for lg in after_kill}

        await victim.start()  # back: the next ledgers are full width again
        async with asyncio.timeout(60):
            while True:
                await work.wait_acked(100)
                later = [lg for lg in await ledgers_of(stub) if lg.summary.ledger_id not in seen]
                if any(lg.summary.ensemble_size == 3 for lg in later):
                    break
        full = next(lg for lg in later if lg.summary.ensemble_size == 3)
        assert full.summary.intended_ensemble_size == 3
        assert bookies_of(full) == {b.bookie_id for b in cluster.bookies}

        await work.stop()
        totals = work.verify()
        assert totals["failed"] == 0, work.logs[0].failed[:3]  # no send failed
        assert totals["acked"] >= 900

        # fewer writable bookies than Qw: entries wait, and everything says why
        await cluster.bookies[1].kill()
        await cluster.bookies[2].kill()
        async with Client(cluster.service_url, operation_timeout_s=30) as client:
            producer = await client.create_producer(PARTITION, send_timeout_ms=3000)
            with pytest.raises(OperationTimeoutError) as timed_out:
                await producer.send(b"0:-1")
            message = timed_out.value.message
            assert "not enough writable bookies" in message, message
            assert "1 writable (bookie-0)" in message, message
            assert "unreachable" in message, message
            stats = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=TOPIC))
            assert "not enough writable bookies" in stats.partitions[0].write_problem
            assert stats.partitions[0].write_problem_since_ms > 0
            url = f"http://{broker.http_address}/health"
            health = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
            assert b"1 cannot write" in health
            assert b"not enough writable bookies" in health

            await cluster.bookies[1].start()

            async def writing() -> bool:
                stats = await stub.GetTopicStats(admin.GetTopicStatsRequest(topic=TOPIC))
                return not stats.partitions[0].write_problem

            await eventually(writing, timeout_s=60, interval_s=0.1)
            await producer.send(b"0:-2")  # writing again
            await producer.close()
        await channel.close()
