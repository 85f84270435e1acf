"""The nemesis: faults injected into a real multi-process cluster on a seeded schedule.

Fault kinds (what each does, and how it is healed):

============================  ==========================================================
``kill-bookie``               SIGKILL a bookie; start it again on the same data
``pause-bookie``              SIGSTOP a bookie (it answers nothing); SIGCONT
``kill-broker``               SIGKILL a broker; start it again
``pause-broker``              SIGSTOP a broker, sometimes longer than its session TTL (a
                              zombie that wakes up after others took its partitions); SIGCONT
``kill-etcd``                 SIGKILL one member of the 3-member etcd cluster; start it
``fill-disk``                 fill a bookie's (small, tmpfs) file system; free it
``cut-broker-etcd``           cut the broker in its own network namespace off from etcd
``cut-broker-bookies``        cut that broker off from the bookies
============================  ==========================================================

One fault at a time: each starts at its planned time, lasts its planned duration and is healed
before the next begins, so the cluster always keeps its quorums (3 of 4 bookies, 2 of 3 etcd
members, one broker at least). The schedule depends only on the seed, the run's duration and
the kinds this machine supports, and is printed before the run, so a failing run can be
replayed with ``--seed``. The first faults cover every kind once (in a seeded order), so even a
short run exercises all of them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

import structlog

from magnetar.testing import EtcdCluster, EtcdServer, LocalCluster
from magnetar.verify.history import Fault, History
from magnetar.verify.workload import Clock

log = structlog.get_logger("magnetar.verify")

FAULT_KINDS = (
    "kill-bookie",
    "pause-bookie",
    "kill-broker",
    "pause-broker",
    "kill-etcd",
    "fill-disk",
    "cut-broker-etcd",
    "cut-broker-bookies",
)
NETWORK_KINDS = ("cut-broker-etcd", "cut-broker-bookies")

# seconds a fault of each kind lasts (uniform), before the pace scales it
_DURATIONS: dict[str, tuple[float, float]] = {
    "kill-bookie": (1.0, 6.0),
    "pause-bookie": (1.0, 8.0),
    "kill-broker": (0.5, 5.0),
    "pause-broker": (1.0, 12.0),
    "kill-etcd": (2.0, 8.0),
    "fill-disk": (3.0, 10.0),
    "cut-broker-etcd": (2.0, 12.0),
    "cut-broker-bookies": (2.0, 10.0),
}
_GAP = (1.0, 5.0)
"""Quiet seconds between one fault's heal and the next fault."""


@dataclass(frozen=True)
class PlannedFault:
    index: int
    kind: str
    target_choice: float
    """Which target, as a fraction: index ``int(choice * len(candidates))`` at run time."""
    at_s: float
    duration_s: float


ZOMBIE_KINDS = ("pause-broker", "cut-broker-etcd")
"""Faults that make a zombie broker when they outlast its session."""


def plan(
    seed: int,
    duration_s: float,
    kinds: Sequence[str],
    *,
    pace: float = 1.0,
    zombie_s: float = 0.0,
) -> list[PlannedFault]:
    """The schedule: faults, one after another, that fit in ``duration_s``.

    ``pace`` scales every fault's duration and gap (0.5: twice as many faults in the same
    time). Every kind appears once before any appears twice, and the first fault of each of
    :data:`ZOMBIE_KINDS` lasts at least ``zombie_s`` (pass the session TTL plus a margin, so
    that even a fast-paced run has a broker lose its session while it still runs).
    """
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    if not kinds:
        return []
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    faults: list[PlannedFault] = []
    at = rng.uniform(*_GAP) * pace
    while True:
        kind = first[len(faults)] if len(faults) < len(first) else rng.choice(list(kinds))
        low, high = _DURATIONS[kind]
        length = rng.uniform(low, high) * pace
        if len(faults) < len(first) and kind in ZOMBIE_KINDS:
            length = max(length, zombie_s)
        if at + length > duration_s:
            break
        faults.append(PlannedFault(len(faults), kind, rng.random(), round(at, 3), round(length, 3)))
        at += length + rng.uniform(*_GAP) * pace
    return faults


def describe(schedule: Sequence[PlannedFault]) -> list[str]:
    """One printable line per planned fault."""
    return [
        f"  #{f.index:<3} at {f.at_s:7.2f}s  {f.kind:<19} for {f.duration_s:5.2f}s"
        f"  (target pick {f.target_choice:.3f})"
        for f in schedule
    ]


def supported_kinds(cluster: LocalCluster) -> dict[str, str | None]:
    """Every kind, with None when this cluster can inject it or the reason it cannot."""
    reasons: dict[str, str | None] = dict.fromkeys(FAULT_KINDS)
    if len(_etcd_members(cluster)) < 3:
        reasons["kill-etcd"] = "needs an owned etcd cluster of 3 members or more"
    if not all(b.tmpfs is not None for b in cluster.bookies):
        reasons["fill-disk"] = "bookies are not on their own small file systems (needs root)"
    if cluster.isolated_host is None:
        for kind in NETWORK_KINDS:
            reasons[kind] = "no broker runs in its own network namespace (needs root and ip)"
    if len(cluster.bookies) < 4:
        for kind in ("kill-bookie", "pause-bookie", "fill-disk"):
            reasons[kind] = reasons[kind] or "needs 4 bookies, so that 3 stay writable"
    if len(cluster.brokers) < 2:
        for kind in ("kill-broker", "pause-broker", *NETWORK_KINDS):
            reasons[kind] = reasons[kind] or "needs 2 brokers, so that one stays up"
    return reasons


class Nemesis:
    """Injects a schedule's faults into ``cluster``, recording each in ``history``."""

    def __init__(
        self,
        cluster: LocalCluster,
        history: History,
        clock: Clock,
        *,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.clock = clock
        self.say = say
        self._down: set[int] = set()
        """Nodes (``id``) this nemesis killed and has not started again."""
        self._reported: set[int] = set()

    async def run(self, schedule: Sequence[PlannedFault]) -> None:
        """Inject every fault at its time (relative to now) and heal it after its duration."""
        loop = asyncio.get_running_loop()
        zero = loop.time()
        offset = self.clock.now()
        for planned in schedule:
            delay = zero + planned.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            fault = Fault(
                index=planned.index,
                kind=planned.kind,
                target="",
                planned_at=offset + planned.at_s,
                planned_duration_s=planned.duration_s,
            )
            self.history.faults.append(fault)
            await self._one(fault, planned)

    async def _one(self, fault: Fault, planned: PlannedFault) -> None:
        try:
            heal = await self._inject(fault, planned.target_choice)
        except Exception as e:  # noqa: BLE001 - a fault that cannot be injected is reported
            fault.error = f"inject: {type(e).__name__}: {e}"
            self.say(f"fault #{fault.index} {fault.kind}: could not inject: {e}")
            return
        fault.started_at = self.clock.now()
        self.say(
            f"{fault.started_at:8.2f}s fault #{fault.index} {fault.kind} {fault.target}"
            f" for {planned.duration_s:.2f}s"
        )
        await asyncio.sleep(planned.duration_s)
        try:
            await heal()
        except Exception as e:  # noqa: BLE001 - heal_all tries again at the end
            fault.error = f"heal: {type(e).__name__}: {e}"
            self.say(f"fault #{fault.index} {fault.kind}: could not heal: {e}")
        fault.ended_at = self.clock.now()

    async def _inject(self, fault: Fault, choice: float) -> Callable[[], Awaitable[object]]:
        """Inject one fault (naming its target in ``fault``); returns what heals it."""
        cluster = self.cluster
        kind = fault.kind
        if kind in ("kill-bookie", "pause-bookie", "fill-disk"):
            bookie = _pick([b for b in cluster.bookies if b.is_running and not b.is_paused], choice)
            fault.target = str(bookie.bookie_id)
            if kind == "kill-bookie":
                await self._kill(bookie)
                return partial(self._start, bookie)
            if kind == "pause-bookie":
                await bookie.pause()
                return bookie.resume
            await asyncio.to_thread(bookie.fill_disk)
            return partial(asyncio.to_thread, bookie.free_disk)
        if kind in ("kill-broker", "pause-broker"):
            broker = _pick([b for b in cluster.brokers if b.is_running and not b.is_paused], choice)
            fault.target = str(broker.broker_id)
            if kind == "kill-broker":
                await self._kill(broker)
                return partial(self._start, broker)
            await broker.pause()
            return broker.resume
        if kind == "kill-etcd":
            member = _pick([m for m in _etcd_members(cluster) if m.is_running], choice)
            fault.target = member.name
            await self._kill(member)
            return partial(self._start, member)
        if kind in NETWORK_KINDS:
            host = cluster.isolated_host
            isolated = cluster.isolated_broker
            if host is None or isolated is None:
                raise RuntimeError("no broker runs in its own network namespace")
            link = "etcd" if kind == "cut-broker-etcd" else "bookies"
            fault.target = f"{isolated.broker_id}/{link}"
            await host.cut(link)
            return partial(host.heal, link)
        raise ValueError(f"unknown fault kind {kind!r}")

    async def _kill(self, node: ManagedNode) -> None:
        self._down.add(id(node))
        await node.kill()

    async def _start(self, node: ManagedNode) -> None:
        await node.start()
        self._down.discard(id(node))

    def _nodes(self) -> list[tuple[str, ManagedNode]]:
        cluster = self.cluster
        nodes: list[tuple[str, ManagedNode]] = [(m.name, m) for m in _etcd_members(cluster)]
        nodes += [(str(b.bookie_id), b) for b in cluster.bookies]
        nodes += [(str(b.broker_id), b) for b in cluster.brokers]
        return nodes

    def check_exits(self) -> list[str]:
        """Note every server that is not running though this nemesis did not kill it (it
        crashed, or exited on its own): recorded once per incarnation in the history, which
        fails the run. What was newly found."""
        found = []
        for name, node in self._nodes():
            key = id(node)
            if node.is_running:
                self._reported.discard(key)  # started again: a later exit is new
                continue
            if key in self._down:
                continue
            if key in self._reported:
                continue
            self._reported.add(key)
            line = (
                f"{name} was found not running at {self.clock.now():.2f}s without a kill-fault"
                f" (exit status {node.exit_code}; see its log)"
            )
            self.history.unexpected_exits.append(line)
            self.say(f"unexpected exit: {line}")
            found.append(line)
        return found

    async def watch_exits(self, interval_s: float = 1.0) -> None:
        """Run :meth:`check_exits` every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.check_exits()

    async def heal_all(self) -> list[str]:
        """Undo whatever is still broken (a heal that failed, a node that died); what could
        not be healed. A node that died without a kill-fault is recorded first."""
        self.check_exits()
        problems: list[str] = []
        cluster = self.cluster
        host = cluster.isolated_host
        if host is not None:
            for link in ("clients", "etcd", "bookies"):
                if host.is_cut(link):
                    await _attempt(problems, f"heal the {link} link", host.heal(link))
        for member in _etcd_members(cluster):
            if not member.is_running:
                await _attempt(problems, f"start {member.name}", member.start())
        for bookie in cluster.bookies:
            if bookie.disk_filled:
                await _attempt(
                    problems, f"free {bookie.bookie_id}'s disk", asyncio.to_thread(bookie.free_disk)
                )
            if bookie.is_paused:
                await _attempt(problems, f"resume {bookie.bookie_id}", bookie.resume())
            if not bookie.is_running:
                await _attempt(problems, f"start {bookie.bookie_id}", bookie.start())
        for broker in cluster.brokers:
            if broker.is_paused:
                await _attempt(problems, f"resume {broker.broker_id}", broker.resume())
            if not broker.is_running:
                await _attempt(problems, f"start {broker.broker_id}", broker.start())
        return problems


class ManagedNode(Protocol):
    """A server the nemesis kills and starts (a bookie, a broker or an etcd member)."""

    @property
    def is_running(self) -> bool: ...

    @property
    def exit_code(self) -> int | None: ...

    async def kill(self) -> None: ...

    async def start(self, timeout_s: float = ...) -> None: ...


T = TypeVar("T")


def _pick(candidates: list[T], choice: float) -> T:
    if not candidates:
        raise RuntimeError("no node is up to take this fault")
    return candidates[min(int(choice * len(candidates)), len(candidates) - 1)]


def _etcd_members(cluster: LocalCluster) -> list[EtcdServer]:
    etcd = cluster.etcd
    return etcd.members if isinstance(etcd, EtcdCluster) else []


async def _attempt(problems: list[str], what: str, action: Awaitable[object]) -> None:
    try:
        await action
    except Exception as e:  # noqa: BLE001 - collected and reported
        problems.append(f"{what}: {type(e).__name__}: {e}")
