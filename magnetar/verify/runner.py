"""One verify run: a real cluster, the workload, the nemesis, the drain, the checker, the report.

1. Start etcd (3 members), bookies and brokers as OS processes (``LocalCluster``). As root,
   every bookie's data lives on its own small tmpfs (for ``fill-disk``) and one more broker
   runs in its own network namespace (for the ``cut-broker-*`` faults).
2. Start the workload and let it warm up.
3. Run the nemesis' seeded schedule for ``duration_s``, then heal everything.
4. Keep producing ``settle_s`` more, at least the recovery bound (the recovered cluster must
   serve, every partition within the bound), then drain: stop
   producing, let every subscription catch up, read every partition from its start.
5. Check the history and write the report.

With ``secure`` (``magnetar verify --secure``, :mod:`magnetar.verify.secure`) every hop runs
TLS and authentication, and halfway through the nemesis every certificate and the token
signing key are rotated, while the faults go on.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from magnetar.common.log import configure_logging
from magnetar.testing import LocalCluster
from magnetar.testing.cluster import tmpfs_unsupported_reason
from magnetar.testing.netns import netns_unsupported_reason
from magnetar.verify.availability import DEFAULT_RECOVERY_BOUND_S
from magnetar.verify.checker import Verdict, check
from magnetar.verify.history import History
from magnetar.verify.nemesis import FAULT_KINDS, Nemesis, describe, plan, supported_kinds
from magnetar.verify.report import write_report
from magnetar.verify.secure import (
    HOPS,
    NAMESPACE,
    SecureCluster,
    SecureSetup,
    count_log_events,
    prepare_namespace,
    wait_presenting_current,
)
from magnetar.verify.workload import SUBSCRIPTIONS, Clock, Workload, WorkloadConfig


@dataclass(frozen=True, kw_only=True)
class VerifyConfig:
    """What one run does (``magnetar verify`` flags)."""

    duration_s: float = 60.0
    """How long the nemesis runs."""
    seed: int = 0
    faults: tuple[str, ...] = FAULT_KINDS
    """Kinds to inject (those this machine cannot are left out and reported)."""
    pace: float = 1.0
    """Scales fault lengths and the gaps between them (0.5: twice as many faults)."""
    zombie_s: float = 0.0
    """The first ``pause-broker`` and ``cut-broker-etcd`` faults last at least this long (more
    than ``session_ttl_s`` makes sure a fast-paced run has a zombie broker)."""
    bookies: int = 4
    brokers: int = 2
    """Brokers on the host; one more runs in a network namespace when the machine allows."""
    etcd_members: int = 3
    partitions: int = 4
    producers: int = 2
    keys: int = 8
    rate: float = 300.0
    message_size: int = 100
    session_ttl_s: int = 4
    """Broker and bookie session TTL: how soon a dead or paused one loses its work."""
    bookie_disk_mb: int = 256
    warmup_s: float = 3.0
    settle_s: float = 5.0
    recovery_bound_s: float = DEFAULT_RECOVERY_BOUND_S
    """A partition out (no acknowledged send while sent to) longer than this with no fault
    active that could explain it, e.g. this long after the faults healed, fails the run."""
    drain_timeout_s: float = 120.0
    out_dir: Path = Path("verify-report")
    work_dir: Path | None = None
    """Where the cluster's data and logs go (a temporary directory by default)."""
    keep: bool = False
    """Keep the work directory (it is kept anyway when the run fails)."""
    save_history: bool = False
    secure: bool = False
    """TLS and authentication on every hop, and one rotation of every certificate and of the
    token signing key halfway through the nemesis (:mod:`magnetar.verify.secure`)."""
    token_expiry_s: int = 10
    """Secure runs: how long each of the workload's tokens is valid (refreshed in band)."""
    command: str = ""
    """The command line, for the report's replay line."""
    client_log: bool = False
    """Log this process's client library (every stream's subscribes, reconnects and
    disconnects) at info level to ``client.log`` in the work directory, for explaining a
    failure; its warnings then go there, not to stderr. The ``magnetar verify`` command sets
    it."""

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration_s}")
        if self.pace <= 0:
            raise ValueError(f"pace must be > 0, got {self.pace}")
        unknown = [k for k in self.faults if k not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        if self.bookies < 3:
            raise ValueError(f"verify needs at least 3 bookies (E3/Qw2/Qa2), got {self.bookies}")
        if self.brokers < 1:
            raise ValueError(f"verify needs at least 1 broker, got {self.brokers}")
        if self.etcd_members < 1:
            raise ValueError(f"verify needs at least 1 etcd member, got {self.etcd_members}")
        if not self.recovery_bound_s > 0:
            raise ValueError(f"recovery bound must be > 0 seconds, got {self.recovery_bound_s}")
        if self.token_expiry_s < 2:
            raise ValueError(f"token expiry must be >= 2 seconds, got {self.token_expiry_s}")


@dataclass
class Outcome:
    verdict: Verdict
    history: History
    paths: dict[str, Path]
    work_dir: Path
    schedule: list[str]


async def run_verify(config: VerifyConfig, say: Callable[[str], None]) -> Outcome:
    """Run once; the outcome carries the verdict and where the report went."""
    work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="magnetar-verify-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    client_log = _log_client_to(work_dir / "client.log") if config.client_log else None
    clock = Clock()
    netns_reason = netns_unsupported_reason()
    tmpfs_reason = tmpfs_unsupported_reason()
    isolated = 1 if netns_reason is None and any(k.startswith("cut-") for k in config.faults) else 0
    use_tmpfs = tmpfs_reason is None and "fill-disk" in config.faults
    options: dict[str, Any] = {
        "bookies": config.bookies,
        "brokers": config.brokers,
        "etcd_members": config.etcd_members,
        "bookie_args": ["--session-ttl-s", str(config.session_ttl_s)],
        "broker_args": [
            "--session-ttl-s",
            str(config.session_ttl_s),
            *("--managed-ledger-ensemble-size", "3"),
            *("--managed-ledger-write-quorum", "2"),
            *("--managed-ledger-ack-quorum", "2"),
        ],
        "fixed_broker_ports": True,
        "bookie_tmpfs_mb": config.bookie_disk_mb if use_tmpfs else None,
        "isolated_brokers": isolated,
    }
    secure: SecureSetup | None = None
    cluster: LocalCluster
    if config.secure:
        secure = SecureSetup(work_dir / "security", token_expiry_s=config.token_expiry_s)
        cluster = SecureCluster(work_dir / "cluster", secure, **options)
    else:
        cluster = LocalCluster(work_dir / "cluster", **options)
    subscriptions = [name for name, _, _ in SUBSCRIPTIONS]
    history = History(seed=config.seed)
    workload: Workload | None = None
    rotation: asyncio.Task[None] | None = None
    exit_watch: asyncio.Task[None] | None = None
    passed = False
    try:
        say(f"starting the cluster in {work_dir}")
        await cluster.start(timeout_s=120)
        history.phases["cluster"] = clock.now()
        reasons = supported_kinds(cluster)
        if netns_reason is not None:
            for kind in ("cut-broker-etcd", "cut-broker-bookies"):
                reasons[kind] = netns_reason
        if tmpfs_reason is not None:
            reasons["fill-disk"] = tmpfs_reason
        kinds = [k for k in config.faults if reasons.get(k) is None]
        unsupported = {k: str(reasons[k]) for k in config.faults if reasons.get(k) is not None}
        schedule = plan(
            config.seed,
            config.duration_s,
            kinds,
            pace=config.pace,
            zombie_s=config.zombie_s,
        )
        lines = describe(schedule)
        say(f"seed {config.seed}: {len(schedule)} faults in {config.duration_s:g}s")
        say(f"  kinds: {', '.join(kinds)}")
        for kind, reason in unsupported.items():
            say(f"  not injected here: {kind}: {reason}")
        for line in lines:
            say(line)
        history.config = {
            "command": config.command
            or f"magnetar verify --duration {config.duration_s:g} --seed {config.seed}",
            "duration_s": config.duration_s,
            "pace": config.pace,
            "zombie_s": config.zombie_s,
            "etcd_members": config.etcd_members,
            "bookies": config.bookies,
            "brokers": len(cluster.brokers),
            "isolated_broker": cluster.isolated_broker is not None,
            "ensemble": 3,
            "write_quorum": 2,
            "ack_quorum": 2,
            "session_ttl_s": config.session_ttl_s,
            "recovery_bound_s": config.recovery_bound_s,
            "bookie_disk_mb": config.bookie_disk_mb if use_tmpfs else None,
            "partitions": config.partitions,
            "producers": config.producers,
            "keys": config.keys,
            "rate": config.rate,
            "message_size": config.message_size,
            "dedup": True,
            "subscriptions": subscriptions,
            "secure": config.secure,
            "kinds": kinds,
            "unsupported": unsupported,
            "python": sys.version.split()[0],
        }

        def service_url() -> str:
            # a secure cluster's brokers have no plaintext port: magnetar+ssl:// only
            return cluster.tls_service_url if secure is not None else cluster.service_url

        namespace = "public/default"
        client_settings: Callable[[], dict[str, Any]] | None = None
        admin_settings: Callable[[], dict[str, Any]] | None = None
        if isinstance(cluster, SecureCluster) and secure is not None:
            await prepare_namespace(service_url(), secure)
            namespace = NAMESPACE
            client_settings = secure.client_settings
            admin_settings = partial(secure.client_settings, admin=True)
            history.config["token_expiry_s"] = config.token_expiry_s
            history.security = {"secure": True, "hops": list(HOPS)}
            say("secure: " + "; ".join(HOPS))
        topic = f"persistent://{namespace}/verify-{config.seed}-{random.getrandbits(24):06x}"
        workload = Workload(
            service_url,
            WorkloadConfig(
                topic=topic,
                partitions=config.partitions,
                producers=config.producers,
                keys=config.keys,
                rate=config.rate,
                message_size=config.message_size,
            ),
            history,
            clock,
            config.seed,
            client_settings=client_settings,
            admin_settings=admin_settings,
        )
        await workload.start()
        history.phases["workload"] = clock.now()
        say(f"{clock.now():8.2f}s workload running on {topic}")
        await asyncio.sleep(config.warmup_s)
        nemesis = Nemesis(cluster, history, clock, say=say)
        # a server that dies without a kill-fault fails the run, whenever it happens
        exit_watch = asyncio.create_task(nemesis.watch_exits())
        history.phases["nemesis"] = clock.now()
        if isinstance(cluster, SecureCluster):
            midway = history.phases["nemesis"] + config.duration_s / 2
            rotation = asyncio.create_task(_rotate(cluster, history, clock, midway, say))
        await nemesis.run(schedule)
        # the schedule may end early; the nemesis phase lasts its whole duration
        remaining = history.phases["nemesis"] + config.duration_s - clock.now()
        if remaining > 0:
            await asyncio.sleep(remaining)
        problems = await nemesis.heal_all()
        for problem in problems:
            say(f"could not heal: {problem}")
        history.phases["healed"] = clock.now()
        # long enough to see every partition recover within the bound
        settle_s = max(config.settle_s, config.recovery_bound_s)
        say(f"{clock.now():8.2f}s nemesis done, cluster healed; settling {settle_s:g}s")
        await asyncio.sleep(settle_s)
        history.phases["drain"] = clock.now()
        await workload.drain(config.drain_timeout_s)
        if rotation is not None:
            await rotation
        if isinstance(cluster, SecureCluster):
            await _check_after_run(cluster, history, clock, say)
        exit_watch.cancel()
        nemesis.check_exits()
        history.phases["end"] = clock.now()
        for error in workload.errors[:20]:
            say(f"workload: {error}")
        verdict = check(history)
        paths = write_report(config.out_dir, history, verdict, lines)
        if config.save_history:
            paths["history"] = config.out_dir / "history.json"
            history.save(paths["history"])
        passed = verdict.ok
        return Outcome(verdict, history, paths, work_dir, lines)
    finally:
        if exit_watch is not None:
            exit_watch.cancel()
        if rotation is not None and not rotation.done():
            rotation.cancel()
        if workload is not None:
            await workload.close()
        await cluster.aclose()
        if client_log is not None:
            configure_logging(mode="console", level="warning", stream=sys.stderr)
            client_log.close()
        if passed and not config.keep and config.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)


def _log_client_to(path: Path) -> TextIO:
    """Send this process's logs (the client library's) to ``path``, as JSON lines at info."""
    stream = path.open("a", encoding="utf-8")
    configure_logging(mode="json", level="info", stream=stream)
    return stream


def _after_heal(summary: dict[str, Any]) -> str:
    after_heal = summary["recovery_after_heal"]
    if not after_heal or not after_heal["count"]:
        return "no partition was out during a fault"
    figures = [
        "never" if after_heal[k] is None else f"{after_heal[k]:.2f}s"
        for k in ("p50_s", "p99_s", "max_s")
    ]
    longest = summary["recovery_lateness"]["max_s"]
    return "first ack after heal p50 {} p99 {} max {}; longest out with no fault {}".format(
        *figures, "never recovered" if longest is None else f"{longest:.2f}s"
    )


async def _rotate(
    cluster: SecureCluster,
    history: History,
    clock: Clock,
    at: float,
    say: Callable[[str], None],
) -> None:
    """At ``at``: re-issue every certificate in place and add a new token key, then sign with
    it; wait until every server presents its new certificate (a process that is down or
    paused then does once it is back)."""
    setup = cluster.security
    delay = at - clock.now()
    if delay > 0:
        await asyncio.sleep(delay)
    started = clock.now()
    history.phases["rotation"] = started
    active = [
        f"#{f.index} {f.kind}:{f.target}"
        for f in history.faults
        if f.started_at is not None and f.ended_at is None
    ]
    tokens_before = setup.tokens_issued
    names = await asyncio.to_thread(setup.rotate_certificates)
    generation = await asyncio.to_thread(setup.add_token_key)
    written = clock.now()
    say(
        f"{started:8.2f}s rotation: {len(names)} certificates re-issued, token key"
        f" {generation} added; faults active: {', '.join(active) or 'none'}"
    )
    unreachable: set[str] = set()
    probing = asyncio.create_task(
        wait_presenting_current(cluster, started, clock.now, timeout_s=90, unreachable=unreachable)
    )
    try:
        # every broker looks at its key bundle at most once a second: only then sign with
        # the new key
        await asyncio.sleep(3)
        await asyncio.to_thread(setup.sign_with_newest_key)
        signing = clock.now()
        presented = await probing
    finally:
        probing.cancel()
    during = [
        f"#{f.index} {f.kind}:{f.target} at {f.started_at:.1f}s"
        for f in history.faults
        if f.started_at is not None and started < f.started_at <= clock.now()
    ]
    late = sorted(
        label + (" (unreachable)" if label in unreachable else "")
        for label, took in presented.items()
        if took is None
    )
    slowest = max((t for t in presented.values() if t is not None), default=0.0)
    say(
        f"{clock.now():8.2f}s rotation: {len(presented) - len(late)} of {len(presented)} TLS"
        f" listeners present their new certificate (the last after {slowest:.1f}s)"
        + (f"; not yet: {', '.join(late)}" if late else "")
    )
    history.security["rotation"] = {
        "at": round(started, 3),
        "into_nemesis_s": round(started - history.phases["nemesis"], 3),
        "files_written_at": round(written, 3),
        "signing_with_new_key_at": round(signing, 3),
        "certificates": names,
        "token_key_generation": generation,
        "faults_active": active,
        "faults_started_while_waiting": during,
        "tokens_issued_before": tokens_before,
        "presented_new_after_s": presented,
    }


async def _check_after_run(
    cluster: SecureCluster, history: History, clock: Clock, say: Callable[[str], None]
) -> None:
    """Which certificate every server presents now, and what the servers logged."""
    setup = cluster.security
    unreachable: set[str] = set()
    final = await wait_presenting_current(
        cluster, clock.now(), clock.now, timeout_s=30, unreachable=unreachable
    )
    history.security["final_certificates"] = {k: v is not None for k, v in final.items()}
    history.security["unreachable_at_end"] = sorted(unreachable)
    history.security["tokens_issued"] = setup.tokens_issued
    history.security["tokens_by_key"] = {str(k): v for k, v in setup.tokens_by_key.items()}
    history.security["token_expiry_s"] = setup.token_expiry_s
    root = cluster.root
    broker_logs = [b.log_path for b in cluster.brokers]
    history.security["broker_log_events"] = count_log_events(
        broker_logs,
        (
            "stream_credentials_refreshed",
            "stream_credentials_expired",
            "authentication_failed",
            "authorization_denied",
            "token_key_reloaded",
            "tls_certificate_reloaded",
            "tls_certificate_reload_failed",
        ),
    )
    history.security["bookie_log_events"] = count_log_events(
        [b.log_path for b in cluster.bookies],
        (
            "tls_certificate_reloaded",
            "tls_certificate_reload_failed",
            "authentication_failed",
            "authorization_denied",
        ),
    )
    history.security["etcd_logs"] = str(root / "etcd")
    stale = sorted(
        k + (" (unreachable: is it running?)" if k in unreachable else "")
        for k, v in final.items()
        if v is None
    )
    say(
        f"{clock.now():8.2f}s certificates at the end: {len(final) - len(stale)} of"
        f" {len(final)} TLS listeners present the rotated one"
        + (f"; not: {', '.join(stale)}" if stale else "")
    )


def verify_main(config: VerifyConfig, *, as_json: bool) -> int:
    """``magnetar verify``: run, print the outcome, exit 0 when every check passed."""
    import json  # noqa: PLC0415

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    outcome = asyncio.run(run_verify(config, say))
    verdict = outcome.verdict
    if as_json:
        body = {"seed": config.seed, **verdict.summary(), "report": str(outcome.paths["json"])}
        if config.secure:
            body["rotated_at_s"] = outcome.history.security.get("rotation", {}).get("at")
        print(json.dumps(body, separators=(",", ":")), flush=True)
    else:
        summary = verdict.summary()
        word = "PASSED" if verdict.ok else "FAILED"
        secure = ""
        if config.secure:
            rotation = outcome.history.security.get("rotation", {})
            secure = f" (secure; rotated at {rotation.get('at', float('nan')):.1f}s)"
        print(
            f"{word}{secure}: seed {config.seed}, {summary['faults']} faults,"
            f" {summary['acked']} acked,"
            f" {summary['lost']} lost, {summary['duplicates']} duplicates,"
            f" {summary['reordered']} reordered,"
            f" {summary['unexplained_redeliveries_after_ack']} unexplained redeliveries;"
            f" longest unavailability {summary['longest_unavailability_s']}s;"
            f" {summary['late_recoveries']} late recoveries"
            f" (bound {summary['recovery_bound_s']:g}s, {_after_heal(summary)})"
        )
        for problem in verdict.problems():
            print(f"  {problem}")
        print(f"report: {outcome.paths['summary']}")
    if not verdict.ok:
        print(
            f"the cluster's data and logs, and the client's (client.log), are kept in"
            f" {outcome.work_dir}",
            file=sys.stderr,
        )
    return 0 if verdict.ok else 1
