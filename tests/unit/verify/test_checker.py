"""The verify checker against hand-made histories: each rule catches its violation, and the
behaviours the system is allowed (redelivery before an ack, a rewind, an ack lost to a broker
crash within the persist interval) are not counted as violations."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from magnetar.verify.checker import Verdict, check
from magnetar.verify.history import (
    Delivery,
    Fault,
    History,
    Send,
    Stored,
    Switch,
    decode_payload,
    encode_payload,
)
from magnetar.verify.nemesis import FAULT_KINDS, Nemesis, plan
from magnetar.verify.report import summary_markdown, write_report
from magnetar.verify.workload import Clock

SUBS = ["exclusive", "failover", "shared", "key_shared"]


class Run:
    """Builds a history: every send acked and stored at the next offset of its partition."""

    def __init__(self) -> None:
        self.history = History(seed=7, config={"subscriptions": SUBS, "dedup": True})
        self.history.drain_complete = True
        self.history.phases = {"workload": 0.0, "producers_stopped": 10.0}
        self.offsets: dict[int, int] = {}
        self.seqs: dict[tuple[str, str], int] = {}

    def send(self, key: str, *, partition: int = 0, at: float = 1.0, store: bool = True) -> Send:
        producer = "p0"
        seq = self.seqs.get((producer, key), 0)
        self.seqs[(producer, key)] = seq + 1
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        send = Send(producer, key, seq, at, "acked", at + 0.01, partition, 10, offset, -1)
        self.history.sends.append(send)
        if store:
            self.history.stored.append(
                Stored(partition, offset, 10, offset, -1, producer, key, seq)
            )
        return send

    def deliver(
        self,
        send: Send,
        subscription: str,
        *,
        at: float,
        consumer: str = "",
        acked_at: float | None = None,
        received_at: float | None = None,
        stream_opened_at: float | None = None,
    ) -> Delivery:
        delivery = Delivery(
            subscription=subscription,
            subscription_type=subscription,
            consumer=consumer or f"{subscription}-0",
            at=at,
            partition=send.partition,
            ledger_id=send.ledger_id,
            entry_id=send.entry_id,
            batch_index=-1,
            offset=send.entry_id,
            producer=send.producer,
            key=send.key,
            seq=send.seq,
            redelivery_count=0,
            acked_at=acked_at,
            received_at=received_at,
            stream_opened_at=stream_opened_at,
        )
        self.history.deliveries.append(delivery)
        return delivery

    def deliver_everywhere(self, sends: list[Send], start: float = 2.0) -> None:
        at = start
        for subscription in SUBS:
            for send in sends:
                at += 0.01
                self.deliver(send, subscription, at=at, acked_at=at + 0.005)


def test_a_clean_run_passes_with_its_counts() -> None:
    run = Run()
    sends = [run.send(f"k{i % 3}", partition=i % 2, at=i * 0.1) for i in range(20)]
    run.deliver_everywhere(sends)
    verdict = check(run.history)
    assert verdict.ok, verdict.problems()
    assert (verdict.acked, verdict.stored, verdict.lost, verdict.duplicates) == (20, 20, 0, 0)
    assert verdict.delivered == dict.fromkeys(SUBS, 20)
    assert verdict.summary()["acked"] == 20


def test_an_acknowledged_message_missing_from_the_log_is_lost() -> None:
    run = Run()
    kept = run.send("a")
    gone = run.send("a", store=False)
    run.deliver_everywhere([kept])
    verdict = check(run.history)
    assert not verdict.ok
    assert verdict.lost_from_log == 1
    assert verdict.lost == 1  # not counted again per subscription: it was never stored
    assert f"#{gone.seq}" in verdict.samples["lost"][0]


def test_a_stored_message_a_subscription_never_got_is_lost_for_that_subscription() -> None:
    run = Run()
    sends = [run.send("a"), run.send("b")]
    run.deliver_everywhere(sends)
    run.history.deliveries = [
        d for d in run.history.deliveries if not (d.subscription == "shared" and d.key == "b")
    ]
    verdict = check(run.history)
    assert verdict.lost_by_subscription["shared"] == 1
    assert verdict.lost == 1
    assert not verdict.ok


def test_a_failed_send_may_be_stored_or_not() -> None:
    run = Run()
    stored_anyway = run.send("a")
    stored_anyway.outcome = "failed"
    not_stored = run.send("a", store=False)
    not_stored.outcome = "failed"
    run.deliver_everywhere([stored_anyway])
    verdict = check(run.history)
    assert verdict.ok, verdict.problems()
    assert (verdict.failed, verdict.lost) == (2, 0)


def test_a_message_stored_twice_is_a_duplicate_unless_dedup_is_off() -> None:
    run = Run()
    send = run.send("a")
    run.history.stored.append(Stored(0, 1, 10, 1, -1, "p0", "a", send.seq))
    run.deliver_everywhere([send])
    verdict = check(run.history)
    assert verdict.duplicates == 1
    assert not verdict.ok
    run.history.config["dedup"] = False
    verdict = check(run.history)
    assert verdict.duplicates == 1
    assert verdict.ok, verdict.problems()


def test_one_producers_messages_for_a_key_stored_out_of_order_are_reordered() -> None:
    run = Run()
    first, second = run.send("a"), run.send("a")
    run.history.stored = [
        Stored(0, 0, 10, 0, -1, "p0", "a", second.seq),
        Stored(0, 1, 10, 1, -1, "p0", "a", first.seq),
    ]
    verdict = check(run.history)
    assert verdict.reordered >= 1
    assert verdict.misplaced == 2  # and their acks named other positions
    assert any("log:" in s for s in verdict.samples["reordered"])


def test_stored_elsewhere_than_its_ack_said_is_misplaced() -> None:
    run = Run()
    send = run.send("a")
    run.history.stored[0].entry_id = 99
    run.deliver_everywhere([send])
    assert check(run.history).misplaced == 1


def test_an_exclusive_consumer_may_rewind_but_a_new_message_must_not_overtake() -> None:
    run = Run()
    a, b, c = run.send("a"), run.send("b"), run.send("c")
    for subscription in ("failover", "shared", "key_shared"):
        for i, send in enumerate((a, b, c)):
            run.deliver(send, subscription, at=2 + i, acked_at=2.5 + i)
    # a rewind: 0, 1, then 0, 1 again (redeliveries), then 2: fine
    for i, send in enumerate((a, b, a, b, c)):
        run.deliver(send, "exclusive", at=2 + i * 0.1)
    assert check(run.history).ok
    # new offset 1 given after offset 2: a reorder
    run.history.deliveries = [d for d in run.history.deliveries if d.subscription != "exclusive"]
    for i, send in enumerate((a, c, b)):
        run.deliver(send, "exclusive", at=2 + i * 0.1, acked_at=2.05 + i * 0.1)
    verdict = check(run.history)
    assert verdict.reordered == 1
    assert "exclusive" in verdict.samples["reordered"][0]


def test_failover_order_is_per_consumer() -> None:
    run = Run()
    a, b, c = run.send("a"), run.send("b"), run.send("c")
    for subscription in ("exclusive", "shared", "key_shared"):
        for i, send in enumerate((a, b, c)):
            run.deliver(send, subscription, at=2 + i, acked_at=2.5 + i)
    # consumer 0 had 0..2 queued; consumer 1 took over and was given 1 and 2 again
    run.deliver(a, "failover", at=2.0, consumer="failover-0", acked_at=2.01)
    run.deliver(b, "failover", at=2.1, consumer="failover-1", acked_at=2.11)
    run.deliver(c, "failover", at=2.2, consumer="failover-1", acked_at=2.21)
    run.deliver(b, "failover", at=2.3, consumer="failover-0")
    # that last one came after failover-1 acked it: only a switch just then explains it
    assert check(run.history).unexplained_redeliveries_after_ack == 1
    run.history.switches.append(Switch(2.35, "failover", "failover-0", 0, active=False))
    verdict = check(run.history)
    assert verdict.ok, verdict.problems()
    assert verdict.explained_redeliveries_after_ack == 1


def test_key_shared_first_deliveries_of_a_key_follow_its_order_across_consumers() -> None:
    run = Run()
    first, second = run.send("a"), run.send("a")
    for subscription in ("exclusive", "failover", "shared"):
        run.deliver(first, subscription, at=2, acked_at=2.1)
        run.deliver(second, subscription, at=3, acked_at=3.1)
    run.deliver(second, "key_shared", at=2.0, consumer="key_shared-1", acked_at=2.1)
    run.deliver(first, "key_shared", at=2.5, consumer="key_shared-0", acked_at=2.6)
    verdict = check(run.history)
    assert verdict.reordered == 1
    assert "key a" in verdict.samples["reordered"][0]


def test_shared_subscriptions_are_not_checked_for_order() -> None:
    run = Run()
    first, second = run.send("a"), run.send("a")
    for subscription in ("exclusive", "failover", "key_shared"):
        run.deliver(first, subscription, at=2, acked_at=2.1)
        run.deliver(second, subscription, at=3, acked_at=3.1)
    run.deliver(second, "shared", at=2.0, acked_at=2.1)
    run.deliver(first, "shared", at=2.5, acked_at=2.6)
    assert check(run.history).ok


def test_a_redelivery_after_a_confirmed_ack_fails_whatever_fault_was_running() -> None:
    """A receipt means persisted: no crash, pause or cut may bring the message back (the
    checker once excused kill-broker, pause-broker and cut-broker-etcd near the ack; the long
    run of seed 20261122 showed those were a client bug, since fixed)."""
    run = Run()
    send = run.send("a")
    run.deliver_everywhere([send], start=2.0)
    shared_ack = next(d.acked_at for d in run.history.deliveries if d.subscription == "shared")
    assert shared_ack is not None
    run.deliver(send, "shared", at=6.0)
    verdict = check(run.history)
    assert verdict.unexplained_redeliveries_after_ack == 1
    assert not verdict.ok
    for kind in ("kill-broker", "pause-broker", "cut-broker-etcd"):
        run.history.faults = [
            Fault(0, kind, "broker-0", 0.0, 1.0, started_at=shared_ack + 0.1, ended_at=5.0)
        ]
        verdict = check(run.history)
        assert verdict.unexplained_redeliveries_after_ack == 1, kind
        assert verdict.explained_by == {}
        assert not verdict.ok


def test_a_copy_its_client_got_before_the_ack_was_confirmed_is_in_flight_not_lost() -> None:
    """magnetar verify --seed 2 (CI): after a failover the new owner sent shared-1 what its
    stored cursor called unacknowledged, while shared-0 resent its unconfirmed ack of it; the
    ack was confirmed, then shared-1's application took the copy from its queue. The broker
    sent it before the ack was confirmed: at-least-once. A copy the client got after the
    confirmation is still a violation."""
    run = Run()
    send = run.send("a")
    run.deliver(send, "shared", at=2.0, consumer="shared-0", acked_at=10.0)
    run.deliver(send, "shared", at=10.1, consumer="shared-1", received_at=9.9)
    verdict = check(run.history)
    assert verdict.redelivered_after_ack == 1
    assert verdict.explained_by == {"in_flight": 1}
    assert verdict.unexplained_redeliveries_after_ack == 0

    late = Run()
    send = late.send("a")
    late.deliver(send, "shared", at=2.0, consumer="shared-0", acked_at=10.0)
    late.deliver(send, "shared", at=10.2, consumer="shared-1", received_at=10.05)
    verdict = check(late.history)
    assert verdict.unexplained_redeliveries_after_ack == 1
    assert "its client got it at 10.050s" in " ".join(verdict.problems())
    assert not verdict.ok


def test_another_consumers_copy_on_a_stream_opened_before_the_receipt_was_sent_before_it() -> None:
    """magnetar verify --seed 2 --secure (the test in tests/verify): the new owner sent
    shared-1 what its stored cursor called unacknowledged; shared-0 then reconnected and resent
    its unconfirmed acks of 32 of them, confirmed at 50.060 s; shared-1's client got the copies
    at 50.114-50.211 s, slowed on their way. Its stream was opened before the receipt, so the
    broker sent them before it: at-least-once. On a stream opened after the receipt, or to the
    consumer whose own ack was confirmed (copy and receipt share its stream, in order), a copy
    is still a violation."""

    def redelivered(consumer: str, stream_opened_at: float) -> Verdict:
        run = Run()
        send = run.send("a")
        for subscription in ("exclusive", "failover", "key_shared"):
            run.deliver(send, subscription, at=2.0, acked_at=2.01)
        run.deliver(send, "shared", at=2.0, consumer="shared-0", acked_at=50.060)
        run.deliver(
            send,
            "shared",
            at=50.152,
            consumer=consumer,
            received_at=50.114,
            stream_opened_at=stream_opened_at,
        )
        return check(run.history)

    verdict = redelivered("shared-1", stream_opened_at=49.0)
    assert verdict.ok, verdict.problems()
    assert verdict.redelivered_after_ack == 1
    assert verdict.explained_by == {"open_stream": 1}

    after = redelivered("shared-1", stream_opened_at=50.080)
    assert after.unexplained_redeliveries_after_ack == 1
    assert "on a stream opened at 50.080s" in " ".join(after.problems())

    own = redelivered("shared-0", stream_opened_at=49.0)
    assert own.unexplained_redeliveries_after_ack == 1
    assert own.explained_by == {}


def test_a_redelivery_before_the_ack_was_confirmed_is_at_least_once() -> None:
    run = Run()
    send = run.send("a")
    run.deliver_everywhere([send])
    run.deliver(send, "shared", at=1.5)  # given twice before any ack: fine
    verdict = check(run.history)
    assert verdict.ok, verdict.problems()
    assert verdict.redeliveries == 1


def test_bytes_no_producer_wrote_are_phantoms() -> None:
    run = Run()
    send = run.send("a")
    run.deliver_everywhere([send])
    ghost = run.deliver(send, "shared", at=3.0)
    ghost.phantom = True
    run.history.stored.append(Stored(1, 0, 11, 0, -1, "p9", "z", 0))
    verdict = check(run.history)
    assert verdict.phantoms == 2
    assert not verdict.ok


def test_an_unfinished_drain_fails_the_run() -> None:
    run = Run()
    run.history.drain_complete = False
    assert not check(run.history).ok


def test_unavailability_windows_name_the_faults_active_then() -> None:
    run = Run()
    for at in (0.5, 1.0, 1.5, 5.5, 6.0, 9.8):
        run.send("a", at=at)
    run.history.faults.append(Fault(0, "kill-bookie", "bookie-1", 2.0, 2.0, 2.0, 4.0))
    verdict = check(run.history, gap_s=1.0)
    gaps = [(round(w.start, 2), round(w.end, 2)) for w in verdict.windows]
    assert gaps == [(1.51, 5.51), (6.01, 9.81)]
    assert verdict.windows[0].faults == ["kill-bookie:bookie-1"]
    assert verdict.windows[1].faults == []
    assert verdict.longest_window_s == pytest.approx(4.0)


def test_payloads_carry_their_name_and_reject_corruption() -> None:
    payload = encode_payload("verify-producer-1", "k3", 42, 100)
    assert len(payload) == 100
    assert decode_payload(payload) == ("verify-producer-1", "k3", 42)
    corrupt = payload[:30] + bytes([payload[30] ^ 1]) + payload[31:]
    assert decode_payload(corrupt) is None
    assert decode_payload(b"\xff\xfe") is None
    assert decode_payload(b"v1|p|k|x|pad|00000000") is None
    short = encode_payload("p", "k", 1, 16)
    assert decode_payload(short) == ("p", "k", 1)


def test_the_schedule_is_seeded_covers_every_kind_first_and_fits() -> None:
    first = plan(11, 120, FAULT_KINDS)
    assert first == plan(11, 120, FAULT_KINDS)
    assert first != plan(12, 120, FAULT_KINDS)
    assert {f.kind for f in first[: len(FAULT_KINDS)]} == set(FAULT_KINDS)
    assert all(f.at_s + f.duration_s <= 120 for f in first)
    assert all(a.at_s + a.duration_s < b.at_s for a, b in itertools.pairwise(first))
    fast = plan(11, 60, FAULT_KINDS, pace=0.3, zombie_s=6.0)
    for kind in ("pause-broker", "cut-broker-etcd"):
        assert next(f for f in fast if f.kind == kind).duration_s >= 6.0
    faster = plan(11, 120, FAULT_KINDS, pace=0.5)
    assert len(faster) > len(first)
    assert plan(3, 60, []) == []
    with pytest.raises(ValueError, match="unknown fault kinds \\['flood'\\]"):
        plan(1, 60, ["flood"])


def test_a_saved_history_checks_the_same_and_the_report_is_written(tmp_path: Path) -> None:
    run = Run()
    sends = [run.send("a", at=0.2 * i) for i in range(10)]
    run.deliver_everywhere(sends)
    run.deliver(sends[0], "exclusive", at=9.0)
    run.history.faults.append(Fault(0, "pause-broker", "broker-1", 1.0, 2.0, 1.0, 3.0))
    run.history.save(tmp_path / "history.json")
    again = History.load(tmp_path / "history.json")
    assert check(again).summary() == check(run.history).summary()

    verdict = check(again)
    paths = write_report(tmp_path / "report", again, verdict, ["  #0 at 1.00s pause-broker"])
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert '"lost": 0' in paths["json"].read_text()
    text = paths["summary"].read_text()
    # the exclusive consumer got sends[0] again long after its ack was confirmed
    assert "**FAILED**: unexplained redeliveries after ack: 1" in text
    assert "delivered again at 9.000s" in text
    assert "Replay: `magnetar verify --seed 7`" in text
    assert "| acked | 10 |" in text
    assert "pause-broker x1" in summary_markdown(again, verdict)


class FakeNode:
    """A server as the nemesis sees it."""

    def __init__(self, name: str) -> None:
        self.bookie_id = self.broker_id = name
        self.is_running = True
        self.exit_code: int | None = None
        self.is_paused = False
        self.disk_filled = False

    async def kill(self) -> None:
        self.is_running, self.exit_code = False, -9

    async def start(self, timeout_s: float = 1) -> None:
        self.is_running, self.exit_code = True, None


async def test_a_server_that_exits_without_a_kill_fault_fails_the_run() -> None:
    bookie, broker = FakeNode("bookie-0"), FakeNode("broker-0")
    cluster = SimpleNamespace(etcd=None, bookies=[bookie], brokers=[broker], isolated_host=None)
    run = Run()
    run.deliver_everywhere([run.send("k")])
    said: list[str] = []
    nemesis = Nemesis(cluster, run.history, Clock(), say=said.append)  # type: ignore[arg-type]
    await nemesis._kill(bookie)  # a kill-fault: expected
    assert nemesis.check_exits() == []
    broker.is_running, broker.exit_code = False, -11  # a crash
    [line] = nemesis.check_exits()
    assert "broker-0" in line
    assert "exit status -11" in line
    assert nemesis.check_exits() == []  # once per incarnation
    assert await nemesis.heal_all() == []
    assert bookie.is_running
    assert broker.is_running
    verdict = check(run.history)
    assert not verdict.ok
    assert verdict.problems() == [f"unexpected exit: {line}"]
    assert verdict.summary()["unexpected_exits"] == 1
    assert "unexpected exit" in summary_markdown(run.history, verdict)
