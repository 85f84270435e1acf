"""When the drain runs out of time, the report says what the lagging subscriptions held.

A verify run that fails because a subscription was not given every acknowledged message needs
both sides of each partition's stream to be explained: the broker's consumers (permits,
unacknowledged messages, its cursor) and the client's (connected, queued messages, permits not
yet given back). Here a real cluster runs the workload, its consumers stop taking messages, and
the drain runs out of time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually
from magnetar.verify.checker import check
from magnetar.verify.history import History
from magnetar.verify.report import summary_markdown
from magnetar.verify.workload import Clock, Workload, WorkloadConfig

pytestmark = [pytest.mark.etcd]


def acked(history: History) -> int:
    return sum(1 for send in history.sends if send.outcome == "acked")


def names_of(subscription: str) -> set[str]:
    return {f"{subscription}-{i}" for i in range(1 if subscription == "exclusive" else 2)}


async def test_a_drain_that_runs_out_of_time_reports_both_sides_of_each_stream(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path, bookies=3, brokers=1) as cluster:
        await cluster.wait_brokers_registered()
        history = History(seed=1)
        config = WorkloadConfig(
            topic="persistent://public/default/stalls",
            partitions=1,
            producers=1,
            rate=200.0,
            subscriptions=(("exclusive", "exclusive", 1), ("shared", "shared", 2)),
        )
        workload = Workload(cluster.service_url, config, history, Clock(), seed=1)
        await workload.start()
        try:
            await asyncio.sleep(1.0)  # some messages go out and are consumed
            # the application stops taking messages; its consumers stay open
            tasks, workload._consumer_tasks = workload._consumer_tasks, []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # messages acknowledged from now on are taken by nobody (on a loaded machine the
            # producer may not have sent any yet: wait for some)
            acked_before = acked(history)
            await eventually(lambda: acked(history) >= acked_before + 20, what="more sends acked")
            await workload.drain(timeout_s=1.0)
        finally:
            assert workload.client is not None
            await workload.client.close()

    stalls = {(s["subscription"], s["partition"]): s for s in history.stalls}
    assert set(stalls) == {("exclusive", 0), ("shared", 0)}
    missing = sum(s["missing"] for s in history.stalls if s["subscription"] == "exclusive")
    assert missing > 0
    for (subscription, _partition), stall in stalls.items():
        broker = stall["broker"]
        assert isinstance(broker, dict), broker
        assert broker["subscription"] == subscription
        assert broker["owner"]
        assert broker["cursor"]["name"] == subscription
        assert {c["consumer_name"] for c in broker["consumers"]} == names_of(subscription)
        assert all(isinstance(c["available_permits"], int) for c in broker["consumers"])
        assert set(stall["clients"]) == names_of(subscription)
        for state in stall["clients"].values():
            assert state is not None
            assert state["connected"] is True
            assert set(state) >= {"connected", "broker", "queued", "permits_to_give_back"}

    verdict = check(history)
    page = summary_markdown(history, verdict)
    assert "## Stalled at the drain" in page
    assert "| exclusive | 0 |" in page
    assert History.from_json(history.to_json()).stalls == history.stalls
