"""Security benchmark: what TLS and authentication + authorization cost a producer and an
end-to-end flow, measured against real servers in one run.

Run from the repository root::

    .venv/bin/python bench/security_bench.py                # full run, about nine minutes
    .venv/bin/python bench/security_bench.py --quick        # smoke test, about two minutes
    .venv/bin/python bench/security_bench.py --hops every   # TLS on every hop, about five minutes

Two servers run side by side, identical but for authentication and authorization: one with both
off, one with both on (HS256 tokens; the client's role is not a superuser, only granted produce
and consume on the benchmark's namespace, so every lookup, producer and consumer goes through
the authorization checks). Each has a plaintext and a TLS listener, so TLS is compared with
plaintext on the same server, and auth on with auth off between two otherwise identical servers.
Four variants: plaintext, TLS, plaintext + auth, TLS + auth. A server is, by default, the suite's
``LocalCluster`` (its own etcd, 3 bookie processes, 1 broker process); ``--server standalone``
makes it one ``magnetar standalone`` process instead, whose single process is saturated by any
fixed rate from about 500 entries/s on this machine, so its end-to-end latency at 2,000 msg/s is
queueing (see bench/README.md).

That default (``--hops client``) has TLS between client and broker only: the broker's links to
its bookies and to etcd are plaintext in every variant. ``--hops every`` measures TLS on every
hop instead (the Security II target: produce throughput >= 80% of plaintext's, end-to-end p99 at
2,000 msg/s at most 2 ms above plaintext's). Its two servers are ``LocalCluster``s identical but
for TLS, authentication off on both brokers; two variants, each on its own server:

- *plaintext on every hop*: ``magnetar://`` client -> broker -> bookies -> etcd, all plaintext;
- *TLS on every hop*: the client over ``magnetar+ssl://`` (and the admin calls that make and
  delete the topics); the broker to its bookies over mutual TLS (``--ledger-tls-*``: a client
  certificate whose common name, :data:`BOOKIE_CLIENT_ROLE`, is the role the bookies'
  ``--bookie-client-roles`` allow; the bookies serve ``--tls-cert-file`` with
  ``--tls-trust-certs-file`` and ``--authentication-providers tls``); every process (broker,
  bookies, the harness) to etcd over TLS with a client certificate (etcd's
  ``--client-cert-auth``).

Both brokers have a plaintext and a TLS listener, as in the default mode (the benchmark's
traffic uses one of them). Certificates come from a throw-away ``trustme`` CA.

Each workload is the code of ``magnetar perf`` (its send loop and meters: the suite's "produce
throughput" and "end-to-end latency at 2,000 msg/s"), run in a client process of its own that
this script spawns (``--worker``), because ``magnetar perf`` has no flags for tokens or a trusted
CA yet. Workloads and variants are interleaved in rounds, so drift on the shared machine hits
every variant alike; each figure is the median of the rounds, with its spread.

It writes ``bench/results/security-<date>.json`` (every run) and ``security-<date>.md`` (the
tables, the ratios and the targets' verdicts); ``--quick`` writes ``security-<date>-quick.*``,
``--hops every`` ``security-<date>-every-hop.*`` (``-every-hop-quick`` with ``--quick``).
See bench/README.md ("Security") for what each figure means. Compare within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# harness.py and the other benchmarks sit next to this script, so they are importable when it is
# run as ``python bench/security_bench.py``: the harness measures and reports, the broker's
# settings are broker_bench's and the rate a fixed-rate run must reach is the suite's.
from broker_bench import BROKER_ARGS
from harness import (
    KEEP_DATA_HELP,
    PerfOutput,
    add_output_options,
    all_ok,
    bench_main,
    bench_parser,
    failed_runs_section,
    log_tail,
    machine_cpu_seconds,
    machine_info,
    opt,
    proc_cpu_seconds,
    quiet_logs,
    report_head,
    report_text,
    results_head,
    spawn_piped,
    spread,
    spread_cell,
    stop_process,
    summary_errors,
)
from suite import RATE_REACHED_FRACTION

from magnetar.aio import AdminClient, AuthenticationToken
from magnetar.common.errors import MagnetarError
from magnetar.testing import LocalCluster, StandaloneNode
from magnetar.testing.etcd import EtcdTls
from magnetar.testing.security import TestPki, TestTokens

# --- targets (reported with PASS / FAIL, never asserted) ------------------------------------------

TLS_MIN_THROUGHPUT_RATIO = 0.85
"""TLS on: produce throughput at least this share of plaintext's."""
TLS_MAX_P99_INCREASE_MS = 1.0
"""TLS on: end-to-end p99 at 2,000 msg/s at most this many ms above plaintext's."""
AUTH_MIN_THROUGHPUT_RATIO = 0.95
"""Authentication and authorization on: produce throughput at least this share of off's."""
EVERY_HOP_MIN_THROUGHPUT_RATIO = 0.80
"""``--hops every`` (Security II): TLS on every hop, produce throughput at least this share of
plaintext on every hop's."""
EVERY_HOP_MAX_P99_INCREASE_MS = 2.0
"""``--hops every``: end-to-end p99 at 2,000 msg/s at most this many ms above plaintext's."""

MESSAGE_BYTES = 100
LATENCY_RATE = 2_000
TENANT = "bench"
NAMESPACE = f"{TENANT}/security"
SUPERUSER = "bench-admin"
CLIENT_ROLE = "bench-client"
"""The workloads' role: granted produce and consume on NAMESPACE, nothing else."""
RUN_TIMEOUT_MARGIN_S = 90.0
WORKER_SCRIPT = str(Path(__file__).resolve())
"""This script: each run's client is ``python bench/security_bench.py --worker SPEC``."""
TAIL_LINES = 30
BOOKIE_CLIENT_ROLE = "broker"
"""``--hops every``: the common name of the broker's client certificate towards its bookies,
and the one role the bookies' ``--bookie-client-roles`` allow."""
SERVER_HOSTS = ("127.0.0.1", "localhost")
"""The names the servers' certificates are valid for (every process runs on this machine)."""


# --- variants and workloads -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variant:
    """How the client reaches the broker: over TLS or plaintext, to the server with
    authentication and authorization on (a token) or off (anonymous). With ``every_hop`` the
    server is one whose every hop is like the client's: TLS throughout (the broker to its
    bookies and every process to etcd too), or plaintext throughout."""

    key: str
    tls: bool
    auth: bool
    every_hop: bool = False

    @property
    def name(self) -> str:
        transport = "TLS" if self.tls else "plaintext"
        if self.every_hop:
            return f"{transport} on every hop"
        return f"{transport}, auth {'on' if self.auth else 'off'}"

    @property
    def server(self) -> str:
        if self.every_hop:
            return "all-tls" if self.tls else "all-plaintext"
        return "auth-on" if self.auth else "auth-off"


VARIANTS: tuple[Variant, ...] = (
    Variant("plain", tls=False, auth=False),
    Variant("tls", tls=True, auth=False),
    Variant("plain-auth", tls=False, auth=True),
    Variant("tls-auth", tls=True, auth=True),
)
"""``--hops client`` (the default): TLS between client and broker, and authentication."""
EVERY_HOP_VARIANTS: tuple[Variant, ...] = (
    Variant("plain-hops", tls=False, auth=False, every_hop=True),
    Variant("tls-hops", tls=True, auth=False, every_hop=True),
)
"""``--hops every``: plaintext on every hop, TLS on every hop (two servers)."""
VARIANT_BY_KEY = {v.key: v for v in (*VARIANTS, *EVERY_HOP_VARIANTS)}

PRODUCE, END_TO_END = "produce", "end-to-end"


@dataclass(frozen=True, slots=True)
class Workload:
    """One ``magnetar perf`` load on a fresh 1-partition topic, 100 B messages.

    - ``produce``: ``perf produce --rate 0 --batch-api`` with the client's default settings,
      sends in runs with ``send_many_async`` (the suite's ``max-1p-100B-batch``), or with
      ``per_message`` one ``send_async`` call, future and callback per message (the loop users
      write, perf's default since issue 22; the suite's ``max-1p-100B``);
    - ``end-to-end``: ``perf end-to-end --rate 2000 --batch-api``: one producer and one
      consumer in the process, latency send -> receive on one clock (the suite's
      ``rate2000-1p-100B`` as it was before perf's default became the per-message calls).
    """

    key: str
    mode: str
    rate: int = 0
    per_message: bool = False

    @property
    def name(self) -> str:
        if self.mode == END_TO_END:
            return f"end-to-end at {self.rate:,} msg/s"
        loop = "send_async per message" if self.per_message else "send_many (suite)"
        return f"produce at max rate, {loop}"


WORKLOADS: tuple[Workload, ...] = (
    Workload("produce", PRODUCE),
    Workload("produce-per-message", PRODUCE, per_message=True),
    Workload(f"e2e-{LATENCY_RATE}", END_TO_END, rate=LATENCY_RATE),
)
WORKLOAD_BY_KEY = {w.key: w for w in WORKLOADS}

TLS_PAIRS: tuple[tuple[str, str], ...] = (("plain", "tls"), ("plain-auth", "tls-auth"))
"""(baseline, variant): TLS against plaintext on the same server."""
AUTH_PAIRS: tuple[tuple[str, str], ...] = (("plain", "plain-auth"), ("tls", "tls-auth"))
"""(baseline, variant): auth on against off, two identical servers, same transport."""
EVERY_HOP_PAIRS: tuple[tuple[str, str], ...] = (("plain-hops", "tls-hops"),)
"""(baseline, variant): TLS on every hop against plaintext on every hop, two servers."""

CLIENT_HOP, EVERY_HOP = "client", "every"


@dataclass(frozen=True, slots=True)
class Hops:
    """What one run compares (``--hops``): its variants, its pairs and its targets."""

    key: str
    variants: tuple[Variant, ...]
    tls_pairs: tuple[tuple[str, str], ...]
    auth_pairs: tuple[tuple[str, str], ...]
    tls_min_throughput_ratio: float
    tls_max_p99_increase_ms: float
    tls_label: str
    """What the TLS verdicts call the TLS side."""
    issue: str
    """The issue that set the targets."""


HOPS: dict[str, Hops] = {
    CLIENT_HOP: Hops(
        CLIENT_HOP,
        VARIANTS,
        TLS_PAIRS,
        AUTH_PAIRS,
        TLS_MIN_THROUGHPUT_RATIO,
        TLS_MAX_P99_INCREASE_MS,
        tls_label="TLS on",
        issue="Security I",
    ),
    EVERY_HOP: Hops(
        EVERY_HOP,
        EVERY_HOP_VARIANTS,
        EVERY_HOP_PAIRS,
        (),
        EVERY_HOP_MIN_THROUGHPUT_RATIO,
        EVERY_HOP_MAX_P99_INCREASE_MS,
        tls_label="TLS on every hop (client -> broker -> bookies, and etcd)",
        issue="Security II",
    ),
}


def hops_of(results: dict[str, Any]) -> Hops:
    """The mode a run's results were measured in (runs from before ``--hops``: the default)."""
    return HOPS[results.get("parameters", {}).get("hops") or CLIENT_HOP]


def round_order(round_index: int, variants: Sequence[Variant] = VARIANTS) -> list[Variant]:
    """The variants in the order a round runs them: rotated by one each round, so that no
    variant always runs first (after another workload) or last."""
    shift = round_index % len(variants)
    return [*variants[shift:], *variants[:shift]]


def topic_name(workload: Workload, variant: Variant, round_index: int) -> str:
    return f"{NAMESPACE}/{workload.key}-{variant.key}-r{round_index}"


def perf_args(
    workload: Workload,
    topic: str,
    service_url: str,
    *,
    duration_s: float,
    warmup_s: float,
    message_bytes: int = MESSAGE_BYTES,
) -> list[str]:
    """The ``magnetar perf`` arguments of one run (after ``perf``): what the worker parses with
    perf's own parser, so every default is perf's."""
    args = [
        workload.mode,
        topic,
        "--service-url",
        service_url,
        "--json",
        "--json-progress",
        "--size",
        str(message_bytes),
        "--rate",
        str(workload.rate),
        "--duration",
        f"{duration_s:g}",
    ]
    if warmup_s > 0:
        args += ["--warmup-s", f"{warmup_s:g}"]
    # what this benchmark measured when the batch calls were perf's default
    args.append("--per-message" if workload.per_message else "--batch-api")
    return args


# --- the client process ---------------------------------------------------------------------------


def worker_main(spec_text: str) -> int:
    """One perf run with a client that may carry a token and trust a CA.

    ``spec_text`` is JSON: ``perf_args`` (as :func:`perf_args` makes them), ``token_file`` (or
    null), ``trust_file`` (or null). The summary goes to stdout and the progress to stderr, as
    ``magnetar perf --json --json-progress`` prints them.
    """
    from magnetar.cli import perf  # noqa: PLC0415 - the worker needs only this
    from magnetar.common.server.gc_tuning import tune_gc_for_throughput  # noqa: PLC0415

    # the client library logs its connections at info; perf's own output is what is read
    quiet_logs()
    spec = json.loads(spec_text)
    parser = argparse.ArgumentParser(prog="magnetar")
    perf.add_perf_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["perf", *spec["perf_args"]])
    tune_gc_for_throughput()  # as run_perf does: the process is the load generator's
    try:
        return asyncio.run(_worker(args, spec))
    except KeyboardInterrupt:
        return 130


async def _worker(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    # perf's own _main, with the client's authentication and TLS settings added
    from magnetar.aio import Client  # noqa: PLC0415
    from magnetar.cli import perf  # noqa: PLC0415

    run = perf._Run(args)
    run.main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, run.on_interrupt)
    settings: dict[str, Any] = {"operation_timeout_s": args.operation_timeout_s}
    if spec.get("trust_file"):
        settings["tls_trust_certs_file_path"] = spec["trust_file"]
    authentication = None
    if spec.get("token_file"):
        token = await asyncio.to_thread(Path(spec["token_file"]).read_text)
        authentication = AuthenticationToken(token)
    client = Client(args.service_url, authentication=authentication, **settings)
    mode = {PRODUCE: perf._produce, END_TO_END: perf._end_to_end}[args.perf_mode]
    try:
        return await mode(run, client)
    except MagnetarError as e:
        print(f"security_bench worker: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 1
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        with contextlib.suppress(MagnetarError, TimeoutError):
            await asyncio.wait_for(client.close(), args.operation_timeout_s)


# --- the servers ----------------------------------------------------------------------------------


STANDALONE, CLUSTER = "standalone", "cluster"


@dataclass
class Server:
    """One security mode's server: a standalone process, or a ``LocalCluster`` (its own etcd,
    the bookies and one broker, each a process of its own)."""

    name: str
    kind: str
    node: StandaloneNode | LocalCluster
    admin: AdminClient

    @property
    def service_url(self) -> str:
        return self.node.service_url

    @property
    def tls_service_url(self) -> str:
        return self.node.tls_service_url

    def processes(self) -> dict[str, int | None]:
        """name -> pid of every process whose CPU is the server's."""
        node = self.node
        if isinstance(node, StandaloneNode):
            return {"standalone": node.pid}
        out: dict[str, int | None] = {f"broker-{i}": b.pid for i, b in enumerate(node.brokers)}
        out.update({f"bookie-{i}": b.pid for i, b in enumerate(node.bookies)})
        out["etcd"] = getattr(node.etcd, "pid", None)
        return out

    @property
    def log_path(self) -> Path:
        node = self.node
        return node.log_path if isinstance(node, StandaloneNode) else node.brokers[0].log_path


@dataclass
class Servers:
    """The two servers (auth off, auth on) and the client's credentials."""

    by_name: dict[str, Server]
    ca_file: Path
    token_file: Path

    def url(self, variant: Variant) -> str:
        server = self.by_name[variant.server]
        return server.tls_service_url if variant.tls else server.service_url

    def spec(self, variant: Variant, args: list[str]) -> dict[str, Any]:
        return {
            "perf_args": args,
            "token_file": str(self.token_file) if variant.auth else None,
            "trust_file": str(self.ca_file) if variant.tls else None,
        }


def server_args(pki: TestPki, tokens: TestTokens, *, auth: bool) -> list[str]:
    """Both servers: a TLS listener (the certificate of ``pki``) next to the plaintext one; the
    auth-on server also verifies ``tokens`` and checks every request's permissions."""
    cert = pki.issue("broker")
    args = ["--tls-cert-file", str(cert.cert_file), "--tls-key-file", str(cert.key_file)]
    if auth:
        args += [
            "--authentication-enabled",
            "true",
            *tokens.broker_args,
            "--superuser-roles",
            SUPERUSER,
            "--authorization-enabled",
            "true",
        ]
    return args


@dataclass(frozen=True)
class EveryHopTls:
    """``--hops every``: what makes a ``LocalCluster``'s every hop TLS, besides the broker's
    own TLS listener (:func:`server_args`)."""

    bookie_args: list[str]
    """Every bookie: mutual TLS on its port, only :data:`BOOKIE_CLIENT_ROLE` let in."""
    broker_args: list[str]
    """The broker's ledger client: the CA, and its client certificate towards the bookies."""
    etcd_tls: EtcdTls
    """etcd serves TLS and requires client certificates; every process presents one."""


def every_hop_tls(pki: TestPki) -> EveryHopTls:
    """Certificates from ``pki`` for every hop of one cluster, and the flags that use them
    (the flags ``magnetar/verify/secure.py`` gives its secure cluster, without its tokens,
    users and HTTPS metrics: the benchmark measures TLS alone)."""
    bookie = pki.issue("bookie", hosts=SERVER_HOSTS)
    ledger_client = pki.issue(BOOKIE_CLIENT_ROLE, name="broker-ledger-client")
    etcd = pki.issue("etcd", hosts=SERVER_HOSTS)
    etcd_client = pki.issue("etcd-client")
    return EveryHopTls(
        bookie_args=[
            *("--tls-cert-file", str(bookie.cert_file)),
            *("--tls-key-file", str(bookie.key_file)),
            *("--tls-trust-certs-file", str(pki.ca_file)),  # mutual TLS: clients present one
            *("--authentication-enabled", "true"),
            *("--authentication-providers", "tls"),  # the role is the certificate's CN
            *("--bookie-client-roles", BOOKIE_CLIENT_ROLE),
        ],
        broker_args=[
            *("--ledger-tls-trust-certs-file", str(pki.ca_file)),
            *("--ledger-tls-cert-file", str(ledger_client.cert_file)),
            *("--ledger-tls-key-file", str(ledger_client.key_file)),
        ],
        etcd_tls=EtcdTls(
            etcd.cert_file,
            etcd.key_file,
            pki.ca_file,
            client_cert_file=etcd_client.cert_file,
            client_key_file=etcd_client.key_file,
        ),
    )


@dataclass(frozen=True)
class ServerPlan:
    """One of a run's two servers: its name (what :attr:`Variant.server` says), whether its
    broker checks tokens and permissions, and whether its every hop is TLS."""

    name: str
    auth: bool
    every_hop_tls: bool


def server_plans(hops: Hops) -> list[ServerPlan]:
    """The servers of a run in mode ``hops``: one for each server its variants name, in the
    order they first name it."""
    plans: dict[str, ServerPlan] = {}
    for variant in hops.variants:
        plans.setdefault(
            variant.server,
            ServerPlan(
                variant.server, auth=variant.auth, every_hop_tls=variant.every_hop and variant.tls
            ),
        )
    return list(plans.values())


async def start_servers(
    root: Path,
    kind: str,
    bookies: int,
    stack: contextlib.AsyncExitStack,
    hops: Hops = HOPS[CLIENT_HOP],
) -> Servers:
    pki = TestPki(root / "pki")
    tokens = TestTokens(root / "tokens")
    token_file = tokens.write(CLIENT_ROLE)
    by_name: dict[str, Server] = {}
    for plan in server_plans(hops):
        name, auth = plan.name, plan.auth
        security = server_args(pki, tokens, auth=auth)
        node: StandaloneNode | LocalCluster
        if kind == STANDALONE:
            node = StandaloneNode(root / name, bookies=bookies, extra_args=security)
        elif plan.every_hop_tls:
            hop = every_hop_tls(pki)
            node = LocalCluster(
                root / name,
                bookies=bookies,
                brokers=1,
                bookie_args=hop.bookie_args,
                broker_args=[*BROKER_ARGS, *security, *hop.broker_args],
                etcd_tls=hop.etcd_tls,
            )
        else:
            # the suite's cluster: E3/Qw2/Qa2 written out, load shedding off, one broker
            node = LocalCluster(
                root / name, bookies=bookies, brokers=1, broker_args=[*BROKER_ARGS, *security]
            )
        await stack.enter_async_context(node)
        authentication = AuthenticationToken(tokens.create(SUPERUSER)) if auth else None
        if plan.every_hop_tls:
            # the topics are made and deleted over TLS too
            admin = AdminClient(
                node.tls_service_url,
                authentication=authentication,
                tls_trust_certs_file_path=str(pki.ca_file),
            )
        else:
            admin = AdminClient(node.service_url, authentication=authentication)
        stack.push_async_callback(admin.close)
        by_name[name] = Server(name, kind, node, admin)
        # the same tenant, namespace and grant on both, so the servers differ only in whether
        # they check them
        await admin.create_tenant(TENANT, [])
        await admin.create_namespace(NAMESPACE)
        await admin.grant_permission(NAMESPACE, CLIENT_ROLE, ["produce", "consume"])
    return Servers(by_name, pki.ca_file, token_file)


# --- one run --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Cpu:
    """CPU seconds of the processes that matter, at one moment."""

    at: float
    server: float | None
    server_parts: dict[str, float]
    other_server: float | None
    client: float | None
    harness: float
    machine_busy: float
    machine_steal: float


def _cpu_of(pid: int | None) -> float | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        return proc_cpu_seconds(pid)
    return None


def _sum_cpu(processes: dict[str, int | None]) -> tuple[float | None, dict[str, float]]:
    parts = {name: _cpu_of(pid) for name, pid in processes.items()}
    if any(v is None for v in parts.values()):
        return None, {}
    found = {name: v for name, v in parts.items() if v is not None}
    return sum(found.values()), found


def take_cpu(server: Server, other: Server, client_pid: int) -> Cpu:
    busy, steal, _total = machine_cpu_seconds()
    total, parts = _sum_cpu(server.processes())
    return Cpu(
        time.monotonic(),
        total,
        parts,
        _sum_cpu(other.processes())[0],
        _cpu_of(client_pid),
        time.process_time(),  # this script: it only reads the client's output
        busy,
        steal,
    )


def cpu_between(before: Cpu, after: Cpu) -> dict[str, Any]:
    """% of one core of each process over the window (200% is all of a 2-core machine)."""
    seconds = after.at - before.at

    def pct(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or seconds <= 0:
            return None
        return 100 * (b - a) / seconds

    out: dict[str, Any] = {
        "window_s": round(seconds, 3),
        "server_pct": pct(before.server, after.server),
        "server_parts_pct": {
            name: pct(before.server_parts.get(name), value)
            for name, value in after.server_parts.items()
        },
        "other_server_pct": pct(before.other_server, after.other_server),
        "client_pct": pct(before.client, after.client),
        "harness_pct": pct(before.harness, after.harness),
        "machine_busy_pct": pct(before.machine_busy, after.machine_busy),
        "machine_steal_pct": pct(before.machine_steal, after.machine_steal),
    }
    # CPU nothing of this benchmark was charged with: other tenants' work, kernel threads
    ours = (out["server_pct"], out["other_server_pct"], out["client_pct"], out["harness_pct"])
    if out["machine_busy_pct"] is not None and None not in ours:
        out["others_pct"] = out["machine_busy_pct"] - sum(v for v in ours if v is not None)
    else:
        out["others_pct"] = None
    return out


QUIET_WINDOW_S = 0.5
"""How long the machine is watched, idle, before each run (as broker_bench's settle_disk
sleeps after its sync)."""


@dataclass
class WaitBudget:
    """Seconds the whole run may still spend waiting for other tenants to go quiet."""

    seconds: float


def _our_cpu(servers: Servers) -> float | None:
    """CPU seconds of every server process of the benchmark, and of this script."""
    total = time.process_time()
    for server in servers.by_name.values():
        cpu, _parts = _sum_cpu(server.processes())
        if cpu is None:
            return None
        total += cpu
    return total


async def settle(servers: Servers, *, quiet_pct: float, budget: WaitBudget) -> dict[str, Any]:
    """Before a run: write back the page cache (``sync``, as ``broker_bench.settle_disk``),
    then watch the idle machine for QUIET_WINDOW_S; while other tenants (the machine's busy
    CPU minus every process of this benchmark) use more than ``quiet_pct`` of a core, keep
    watching, as long as ``budget`` lasts. A run then starts on a quiet machine when one can
    be had within the budget; what it saw is recorded either way."""
    started = time.monotonic()
    await asyncio.to_thread(os.sync)
    waited = 0.0
    while True:
        busy_before, ours_before, at_before = (
            machine_cpu_seconds()[0],
            _our_cpu(servers),
            time.monotonic(),
        )
        await asyncio.sleep(QUIET_WINDOW_S)
        busy_after, ours_after, at_after = (
            machine_cpu_seconds()[0],
            _our_cpu(servers),
            time.monotonic(),
        )
        others: float | None = None
        if ours_before is not None and ours_after is not None:
            busy = busy_after - busy_before
            others = 100 * (busy - (ours_after - ours_before)) / (at_after - at_before)
        if others is None or others <= quiet_pct or budget.seconds <= 0:
            break
        budget.seconds -= at_after - at_before
        waited += at_after - at_before
    return {
        "settle_s": round(time.monotonic() - started, 3),
        "waited_for_quiet_s": round(waited, 3),
        "others_before_pct": None if others is None else round(others, 1),
    }


async def run_one(
    servers: Servers,
    workload: Workload,
    variant: Variant,
    round_index: int,
    *,
    duration_s: float,
    warmup_s: float,
    position: int,
    quiet_pct: float,
    budget: WaitBudget,
) -> dict[str, Any]:
    """One client process for one workload and variant, on a fresh topic: its perf summary and
    the CPU of the server, the client and the machine from perf's first progress line after
    the warm-up to its summary line."""
    topic = topic_name(workload, variant, round_index)
    url = servers.url(variant)
    args = perf_args(workload, topic, url, duration_s=duration_s, warmup_s=warmup_s)
    server = servers.by_name[variant.server]
    other = next(s for name, s in servers.by_name.items() if name != variant.server)
    result: dict[str, Any] = {
        "workload": workload.key,
        "variant": variant.key,
        "round": round_index,
        "position": position,
        "topic": topic,
        "command": shlex.join(["magnetar", "perf", *args])
        + (f"  # as role {CLIENT_ROLE} (token)" if variant.auth else "")
        + ("  # trusting the test CA" if variant.tls else ""),
        "ok": False,
    }
    await server.admin.create_topic(topic, partitions=1)
    result.update(await settle(servers, quiet_pct=quiet_pct, budget=budget))
    # the machine is shared: how busy it was when the run started, next to the others' CPU
    result["load_average_1m"] = os.getloadavg()[0]
    spec = json.dumps(servers.spec(variant, args))
    started = time.monotonic()
    process = await spawn_piped(sys.executable, WORKER_SCRIPT, "--worker", spec)

    async def snap() -> Cpu:
        return take_cpu(server, other, process.pid)

    # CPU counts from the end of the warm-up, as in the suite
    out = PerfOutput[Cpu](snap, tail_lines=TAIL_LINES)
    timeout_s = warmup_s + duration_s + RUN_TIMEOUT_MARGIN_S
    errors = await _drive_client(process, out, timeout_s)
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    # each server keeps the same handful of topics loaded from round to round
    try:
        await server.admin.delete_topic(topic, force=True)
    except MagnetarError as e:
        result["delete_topic_error"] = f"{type(e).__name__}: {e.message}"
    result["exit_code"] = process.returncode
    result["summary"] = out.summary
    result["progress"] = out.progress
    first, last = out.first, out.last
    if first is not None and last is not None and last.at > first.at:
        result["cpu"] = cpu_between(first, last)
    errors += summary_errors(out.summary, "the client")
    if process.returncode != 0:
        errors.append(f"the client exited with {process.returncode}")
    if "cpu" not in result:
        errors.append("no CPU window (no progress line after the warm-up)")
    if errors:
        result["error"] = "; ".join(errors)
        result["stderr_tail"] = "\n".join(out.stderr_tail)
        result["server_log_tail"] = log_tail(server.log_path)
    else:
        result["ok"] = True
        result["figures"] = run_figures(workload, out.summary, result["cpu"])
    return result


async def _drive_client(
    process: asyncio.subprocess.Process, out: PerfOutput[Cpu], timeout_s: float
) -> list[str]:
    """Read the client's output to its end, interrupting it after ``timeout_s``, and reap it."""
    errors: list[str] = []
    try:
        try:
            await asyncio.wait_for(out.read(process), timeout_s)
        except TimeoutError:
            errors.append(f"the client did not finish within {timeout_s:g} s (interrupted)")
            await stop_process(process)
        await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return errors


def run_figures(
    workload: Workload, summary: dict[str, Any] | None, cpu: dict[str, Any]
) -> dict[str, float | None]:
    """The figures of one run that the report compares (a flat dict, None where missing)."""
    summary = summary or {}
    latency = summary.get("latency_ms") or {}
    rate: float | None = summary.get("msg_per_s")
    server = cpu.get("server_pct")
    client = cpu.get("client_pct")
    broker = (cpu.get("server_parts_pct") or {}).get("broker-0")

    def per_message_us(pct: float | None) -> float | None:
        if pct is None or not rate:
            return None
        return pct / 100 / rate * 1e6

    out: dict[str, float | None] = {
        "msg_per_s": rate,
        "p50_ms": latency.get("p50"),
        "p99_ms": latency.get("p99"),
        "p99_9_ms": latency.get("p99_9"),
        "max_ms": latency.get("max"),
        "server_cpu_pct": server,
        "broker_cpu_pct": broker,
        "client_cpu_pct": client,
        "server_us_per_msg": per_message_us(server),
        "client_us_per_msg": per_message_us(client),
        # where TLS between client and broker is decrypted and encrypted (and, with --hops
        # every, the bookie links' too)
        "broker_us_per_msg": per_message_us(broker),
        "machine_busy_pct": cpu.get("machine_busy_pct"),
        "others_pct": cpu.get("others_pct"),
    }
    if workload.mode == END_TO_END:
        publish = summary.get("publish_latency_ms") or {}
        out["publish_p50_ms"] = publish.get("p50")
        out["publish_p99_ms"] = publish.get("p99")
        out["rate_reached"] = (
            1.0 if rate is not None and rate >= RATE_REACHED_FRACTION * workload.rate else 0.0
        )
    return out


# --- figures over the rounds ----------------------------------------------------------------------


def by_round(
    runs: Sequence[dict[str, Any]], workload: str, variant: str, figure: str
) -> dict[int, float]:
    """round -> the figure of the successful run of ``workload`` and ``variant`` in it."""
    out: dict[int, float] = {}
    for run in runs:
        if run["workload"] != workload or run["variant"] != variant or not run["ok"]:
            continue
        value = run["figures"].get(figure)
        if value is not None:
            out[run["round"]] = value
    return out


def summarize(
    runs: Sequence[dict[str, Any]], variants: Sequence[Variant] = VARIANTS
) -> dict[str, dict[str, dict[str, Any]]]:
    """workload -> variant -> figure -> spread over the rounds (and ``runs`` / ``ok_runs``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for workload in WORKLOADS:
        for variant in variants:
            mine = [
                r for r in runs if r["workload"] == workload.key and r["variant"] == variant.key
            ]
            ok = [r for r in mine if r["ok"]]
            figures: dict[str, Any] = {"runs": len(mine), "ok_runs": len(ok)}
            names = sorted({name for r in ok for name in r["figures"]})
            for name in names:
                figures[name] = spread([r["figures"].get(name) for r in ok])
            out.setdefault(workload.key, {})[variant.key] = figures
    return out


def paired(
    runs: Sequence[dict[str, Any]],
    workload: str,
    pair: tuple[str, str],
    figure: str,
    combine: Callable[[float, float], float],
) -> dict[str, Any]:
    """``combine(baseline, variant)`` of ``figure`` in each round where both ran: the two ran
    seconds apart, so drift of the machine cancels out of each round's value. Returns the
    spread of those values and the values by round."""
    base = by_round(runs, workload, pair[0], figure)
    other = by_round(runs, workload, pair[1], figure)
    values = {r: combine(base[r], other[r]) for r in sorted(base.keys() & other.keys())}
    return {**spread(list(values.values())), "by_round": values}


def ratio(baseline: float, variant: float) -> float:
    return variant / baseline if baseline else float("nan")


def difference(baseline: float, variant: float) -> float:
    return variant - baseline


def comparisons(
    runs: Sequence[dict[str, Any]], hops: Hops = HOPS[CLIENT_HOP]
) -> list[dict[str, Any]]:
    """Every pair the targets speak of, per round: throughput ratios (and server CPU per
    message) of the produce workloads, p50/p99/p99.9 differences of the end-to-end one."""
    out: list[dict[str, Any]] = []
    for kind, pairs in (("tls", hops.tls_pairs), ("auth", hops.auth_pairs)):
        for pair in pairs:
            for workload in WORKLOADS:
                entry: dict[str, Any] = {
                    "kind": kind,
                    "workload": workload.key,
                    "baseline": pair[0],
                    "variant": pair[1],
                }
                if workload.mode == PRODUCE:
                    entry["throughput_ratio"] = paired(runs, workload.key, pair, "msg_per_s", ratio)
                    entry["server_cpu_per_msg_ratio"] = paired(
                        runs, workload.key, pair, "server_us_per_msg", ratio
                    )
                    entry["broker_cpu_per_msg_ratio"] = paired(
                        runs, workload.key, pair, "broker_us_per_msg", ratio
                    )
                    entry["client_cpu_per_msg_ratio"] = paired(
                        runs, workload.key, pair, "client_us_per_msg", ratio
                    )
                else:
                    for figure in ("p50_ms", "p99_ms", "p99_9_ms"):
                        entry[f"{figure}_increase"] = paired(
                            runs, workload.key, pair, figure, difference
                        )
                    entry["server_cpu_ratio"] = paired(
                        runs, workload.key, pair, "server_cpu_pct", ratio
                    )
                out.append(entry)
    return out


# --- verdicts -------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _find(
    found: Sequence[dict[str, Any]], kind: str, workload: str, pair: tuple[str, str]
) -> dict[str, Any] | None:
    return next(
        (
            c
            for c in found
            if c["kind"] == kind
            and c["workload"] == workload
            and (c["baseline"], c["variant"]) == pair
        ),
        None,
    )


def _row(entry: dict[str, Any] | None, figure: str, ok: Callable[[float], bool]) -> dict[str, Any]:
    if entry is None or entry[figure]["median"] is None:
        return {"verdict": "FAIL", "why": "no round in which both variants ran"}
    value = entry[figure]
    return {
        "measured": value["median"],
        "min": value["min"],
        "max": value["max"],
        "rounds": value["n"],
        # how far the verdict stands above the noise: a median that passes in 3 rounds of 5
        # and fails in 2 is a coin toss, one that passes in 5 of 5 is not
        "rounds_meeting": sum(1 for v in value["by_round"].values() if ok(v)),
        "verdict": _verdict(ok(value["median"])),
    }


def checks(
    found: Sequence[dict[str, Any]],
    summary: dict[str, dict[str, dict[str, Any]]],
    hops: Hops = HOPS[CLIENT_HOP],
) -> list[dict[str, Any]]:
    """The targets of ``hops``, each judged on every pair it speaks of (both servers for TLS,
    both transports for auth; both produce patterns for throughput): PASS only if every row
    passes. Each row's figure is the median over the rounds of that round's ratio or
    difference. ``--hops every`` has the two TLS targets only, on its one pair."""
    latency = next(w for w in WORKLOADS if w.mode == END_TO_END)
    min_ratio, max_increase = hops.tls_min_throughput_ratio, hops.tls_max_p99_increase_ms
    tls_name = f"{hops.tls_label}: produce throughput >= {min_ratio:.0%} of plaintext"
    out = [_throughput_check(found, "tls", hops.tls_pairs, min_ratio, tls_name)]

    rows = []
    for pair in hops.tls_pairs:
        row = _row(
            _find(found, "tls", latency.key, pair),
            "p99_ms_increase",
            lambda v: v <= max_increase,
        )
        # a run that fell behind the rate has no latency at that rate
        short = [
            f"{key} delivered {figures['msg_per_s']['min']:,.0f} of {latency.rate:,} msg/s"
            for key in pair
            if (figures := summary.get(latency.key, {}).get(key, {}))
            and figures.get("rate_reached", {}).get("min") == 0.0
        ]
        if short and row["verdict"] == "PASS":
            row["verdict"] = "FAIL"
        if short:
            row["why"] = "; ".join(short)
        rows.append(_pair_row(latency.key, pair, row))
    name = (
        f"{hops.tls_label}: end-to-end p99 at {latency.rate:,} msg/s <= plaintext's +"
        f" {max_increase:g} ms"
    )
    out.append(_check("tls-latency", name, "p99_ms_increase", rows))
    if not hops.auth_pairs:
        return out
    out.append(
        _throughput_check(
            found,
            "auth",
            hops.auth_pairs,
            AUTH_MIN_THROUGHPUT_RATIO,
            "authentication + authorization on: produce throughput >="
            f" {AUTH_MIN_THROUGHPUT_RATIO:.0%} of off",
        )
    )
    return out


def _pair_row(workload: str, pair: tuple[str, str], row: dict[str, Any]) -> dict[str, Any]:
    return {"workload": workload, "baseline": pair[0], "variant": pair[1], **row}


def _check(key: str, name: str, figure: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A target: PASS only if every row passes."""
    verdict = _verdict(all(r["verdict"] == "PASS" for r in rows))
    return {"key": key, "name": name, "figure": figure, "rows": rows, "verdict": verdict}


def _throughput_check(
    found: Sequence[dict[str, Any]],
    kind: str,
    pairs: Sequence[tuple[str, str]],
    min_ratio: float,
    name: str,
) -> dict[str, Any]:
    """The ``<kind>-throughput`` target: each produce workload of each pair at ``min_ratio``
    of its baseline's throughput at least."""
    rows = []
    for pair in pairs:
        for workload in WORKLOADS:
            if workload.mode != PRODUCE:
                continue
            row = _row(
                _find(found, kind, workload.key, pair),
                "throughput_ratio",
                lambda v: v >= min_ratio,
            )
            rows.append(_pair_row(workload.key, pair, row))
    return _check(f"{kind}-throughput", name, "throughput_ratio", rows)


# --- the report -----------------------------------------------------------------------------------


def _broker(figures: dict[str, Any]) -> str:
    """`` (broker N)`` for a cluster, whose server CPU is several processes; empty otherwise."""
    broker = figures.get("broker_cpu_pct")
    if not broker or broker.get("median") is None:
        return ""
    return f" (broker {broker['median']:.0f})"


def _figure_value(figure: str, value: float) -> str:
    if figure.endswith("_increase"):
        return f"{value:+.2f} ms"
    return f"{value:.3f}"


def _check_lines(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for check in results["checks"]:
        lines.append(f"- **{check['verdict']}** {check['name']}")
        for row in check["rows"]:
            pair = (
                f"{VARIANT_BY_KEY[row['variant']].name} vs {VARIANT_BY_KEY[row['baseline']].name}"
            )
            head = f"  - {row['verdict']}: {WORKLOAD_BY_KEY[row['workload']].name}, {pair}"
            if "measured" in row:
                value = _figure_value(check["figure"], row["measured"])
                low = _figure_value(check["figure"], row["min"])
                high = _figure_value(check["figure"], row["max"])
                why = f"; {row['why']}" if "why" in row else ""
                lines.append(
                    f"{head}: **{value}** (median of {row['rounds']} rounds; {low} to {high};"
                    f" met in {row['rounds_meeting']} of {row['rounds']} rounds{why})"
                )
            else:
                lines.append(f"{head}: {row['why']}")
    return lines


def _variant_tables(results: dict[str, Any]) -> list[str]:
    summary = results["summary"]
    variants = hops_of(results).variants
    lines: list[str] = []
    for workload in WORKLOADS:
        per_variant = summary[workload.key]
        lines += ["", f"### {workload.name}", ""]
        if workload.mode == PRODUCE:
            lines += [
                (
                    "| variant | msg/s | publish latency p50 / p99 ms | server CPU % | server"
                    " us/msg | client CPU % | client us/msg | machine busy % (others) | runs ok |"
                ),
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for variant in variants:
                f = per_variant[variant.key]
                lines.append(
                    f"| {variant.name} | {spread_cell(f.get('msg_per_s'))} |"
                    f" {spread_cell(f.get('p50_ms'), '.1f')} /"
                    f" {spread_cell(f.get('p99_ms'), '.1f')} |"
                    f" {spread_cell(f.get('server_cpu_pct'))}{_broker(f)} |"
                    f" {spread_cell(f.get('server_us_per_msg'), '.2f')} |"
                    f" {spread_cell(f.get('client_cpu_pct'))} |"
                    f" {spread_cell(f.get('client_us_per_msg'), '.2f')} |"
                    f" {spread_cell(f.get('machine_busy_pct'))}"
                    f" ({spread_cell(f.get('others_pct'))}) |"
                    f" {f['ok_runs']} / {f['runs']} |"
                )
        else:
            lines += [
                (
                    "| variant | delivered msg/s | end-to-end p50 ms | p99 ms | p99.9 ms | max ms"
                    " | publish p99 ms | server CPU % | client CPU % | machine busy % (others)"
                    " | runs ok |"
                ),
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for variant in variants:
                f = per_variant[variant.key]
                lines.append(
                    f"| {variant.name} | {spread_cell(f.get('msg_per_s'))} |"
                    f" {spread_cell(f.get('p50_ms'), '.2f')} |"
                    f" {spread_cell(f.get('p99_ms'), '.2f')} |"
                    f" {spread_cell(f.get('p99_9_ms'), '.2f')} |"
                    f" {spread_cell(f.get('max_ms'), '.1f')} |"
                    f" {spread_cell(f.get('publish_p99_ms'), '.2f')} |"
                    f" {spread_cell(f.get('server_cpu_pct'), '.1f')}{_broker(f)} |"
                    f" {spread_cell(f.get('client_cpu_pct'), '.1f')} |"
                    f" {spread_cell(f.get('machine_busy_pct'))}"
                    f" ({spread_cell(f.get('others_pct'))}) |"
                    f" {f['ok_runs']} / {f['runs']} |"
                )
    return lines


def _ratio_cell(value: dict[str, Any], spec: str = ".3f", sign: str = "") -> str:
    if value["median"] is None:
        return "-"
    median = format(value["median"], sign + spec)
    return (
        f"**{median}** ({format(value['min'], sign + spec)} to {format(value['max'], sign + spec)})"
    )


def _broker_ratio(value: dict[str, Any] | None) -> str:
    if not value or value["median"] is None:
        return ""
    return f" ({value['median']:.3f})"


def _comparison_tables(results: dict[str, Any]) -> list[str]:
    found = results["comparisons"]
    lines = [
        (
            "| comparison | workload | throughput ratio | CPU per message ratio: server (its"
            " broker) | client |"
        ),
        "|---|---|---|---|---|",
    ]
    for c in found:
        if "throughput_ratio" not in c:
            continue
        what = f"{VARIANT_BY_KEY[c['variant']].name} / {VARIANT_BY_KEY[c['baseline']].name}"
        lines.append(
            f"| {what} | {WORKLOAD_BY_KEY[c['workload']].name} |"
            f" {_ratio_cell(c['throughput_ratio'])} |"
            f" {_ratio_cell(c['server_cpu_per_msg_ratio'])}"
            f"{_broker_ratio(c.get('broker_cpu_per_msg_ratio'))} |"
            f" {_ratio_cell(c['client_cpu_per_msg_ratio'])} |"
        )
    lines += [
        "",
        (
            "| comparison | workload | p50 increase ms | p99 increase ms | p99.9 increase ms"
            " | server CPU ratio |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for c in found:
        if "p99_ms_increase" not in c:
            continue
        what = f"{VARIANT_BY_KEY[c['variant']].name} - {VARIANT_BY_KEY[c['baseline']].name}"
        lines.append(
            f"| {what} | {WORKLOAD_BY_KEY[c['workload']].name} |"
            f" {_ratio_cell(c['p50_ms_increase'], '.2f', '+')} |"
            f" {_ratio_cell(c['p99_ms_increase'], '.2f', '+')} |"
            f" {_ratio_cell(c['p99_9_ms_increase'], '.2f', '+')} |"
            f" {_ratio_cell(c['server_cpu_ratio'])} |"
        )
    return lines


def _quiet_line(results: dict[str, Any]) -> str:
    p = results["parameters"]
    runs = results["runs"]
    seen = [r["others_before_pct"] for r in runs if r.get("others_before_pct") is not None]
    noisy = sum(1 for v in seen if v > p.get("quiet_pct", 0))
    waited = sum(r.get("waited_for_quiet_s", 0.0) for r in runs)
    return (
        f"Before each run: `sync`, then the idle machine watched in {QUIET_WINDOW_S:g} s windows"
        f" until other tenants used at most {p.get('quiet_pct', 0):g}% of a core (at most"
        f" {p.get('max_wait_s', 0):g} s of waiting in the whole run): {waited:,.0f} s waited;"
        f" {noisy} of {len(runs)} runs started with others above that. During each run,"
        " *others* in the tables below says what they used."
    )


def _setup_text(results: dict[str, Any], servers_text: str) -> str:
    """What the two servers are and how they differ."""
    if hops_of(results).key != EVERY_HOP:
        return (
            f"{servers_text} side by side, each with a plaintext and a TLS listener (a"
            " certificate from a throw-away CA), identical but for `--authentication-enabled true"
            f" --token-secret-key-file ... --superuser-roles {SUPERUSER}"
            " --authorization-enabled true` on one of them. On the auth-on server the client's"
            f" token is for role `{CLIENT_ROLE}`, which is not a superuser: it was granted"
            f" produce and consume on `{NAMESPACE}` and nothing else. TLS is between client and"
            " broker only: the broker's links to its bookies and to etcd are plaintext in every"
            " variant."
        )
    return (
        f"{servers_text} side by side, identical but for TLS (authentication off on both; each"
        " broker has a plaintext and a TLS listener, and the benchmark's traffic uses one of"
        " them). On the *plaintext on every hop* server, the client reaches the broker over"
        " `magnetar://`, the broker its bookies and every process etcd in plaintext. On the"
        " *TLS on every hop* server (certificates from a throw-away CA), the client reaches the"
        " broker over `magnetar+ssl://` (as do the admin calls that make and delete the"
        " topics); the broker reaches its bookies over mutual TLS, presenting a client"
        f" certificate whose common name `{BOOKIE_CLIENT_ROLE}` is the one role the bookies"
        " allow (bookies: `--tls-cert-file ... --tls-key-file ... --tls-trust-certs-file ..."
        " --authentication-enabled true --authentication-providers tls --bookie-client-roles"
        f" {BOOKIE_CLIENT_ROLE}`; broker: `--ledger-tls-trust-certs-file ..."
        " --ledger-tls-cert-file ... --ledger-tls-key-file ...`); and the broker, the bookies"
        " and the harness reach etcd over TLS with a client certificate (etcd"
        " `--client-cert-auth`; the servers `--etcd-trust-certs-file ... --etcd-cert-file ..."
        " --etcd-key-file ...`). Two variants, one per server."
    )


def render_markdown(results: dict[str, Any]) -> str:
    hops = hops_of(results)
    p = results["parameters"]
    cores = results["machine"]["cpu_count"]
    if p.get("server") == STANDALONE:
        servers_text = (
            f"Two `magnetar standalone` processes ({p['bookies']} bookies each, embedded"
            " metadata, default settings: E3/Qw2/Qa2, every group commit `fdatasync`ed)"
        )
        server_cpu_text = (
            "A server's CPU is its one process: broker, bookies and metadata store together."
        )
        server_processes = "the standalone process (broker, bookies and metadata store)"
    else:
        servers_text = (
            f"Two `LocalCluster`s as the suite's (each its own etcd, {p['bookies']} `magnetar"
            " bookie` processes with default storage settings, 1 `magnetar broker`"
            f" `{' '.join(p['cluster_broker_args'])}`)"
        )
        server_cpu_text = (
            "A server's CPU is the sum of its broker, bookies and etcd (the broker's own share"
            " in brackets)."
        )
        server_processes = (
            "the server's processes (broker, bookies and etcd; the broker alone in brackets)"
        )
    if hops.key == EVERY_HOP:
        tls_scope_text = (
            "TLS is on every hop of the TLS server, so its server-side cost is spread over the"
            " broker, the bookies and etcd: the server's us/msg is the figure, the broker's"
            " only a part of it."
        )
    else:
        tls_scope_text = (
            "TLS is between client and broker only (the broker's links to its bookies are"
            " plaintext either way), so its server-side cost is the broker's."
        )
    durations = ", ".join(f"{k} {v:g} s" for k, v in p["duration_s"].items())
    lines = [
        *report_head(results, "Security benchmark", raw_limits=False),
        "",
        _setup_text(results, servers_text),
        "",
        (
            "Each run is one client"
            " process running `magnetar perf`'s own code on a fresh 1-partition topic with"
            f" {p['message_bytes']} B messages and the client's default settings, after a"
            f" `sync`; {p['rounds']} rounds, each running every workload once per variant in a"
            " rotated order, so the variants of one workload run seconds apart. Measured time"
            f" per run (after a {p['warmup_s']:g} s warm-up left out of every figure):"
            f" {durations}."
        ),
        "",
        (
            "Each figure is the **median of the rounds** (min-max in brackets); a ratio or"
            " difference is computed **within each round** (the two variants ran seconds apart)"
            " and then its median taken. CPU is % of one core from the client's first progress"
            " line after the warm-up to its summary line; the machine has"
            f" {cores} cores, so {100 * cores}% is all of it. {server_cpu_text} The machine is"
            " shared and noisy: compare within this run only."
        ),
        "",
        _quiet_line(results),
        "",
        "## Targets",
        "",
        f"From the {hops.issue} issue; reported, never asserted.",
        "",
        *_check_lines(results),
        "",
        "## Ratios and differences (per round, then the median)",
        "",
        *_comparison_tables(results),
        "",
        "## Every variant",
        *_variant_tables(results),
        "",
        "## What the figures mean",
        "",
        (
            "- **msg/s** (produce): messages receipted by the broker per second over the"
            " measured time, perf's own figure; one producer, at most 10,000 sends pending,"
            " batches of up to 1,000 messages / 128 KiB / 1 ms. *send_many (suite)* is `perf"
            " --batch-api` (runs of up to 500 messages per `send_many_async` call, one future"
            " per run), the suite's `max-1p-100B-batch`; *send_async per message* is perf's"
            " default, one call, future and callback per message, as most programs write it."
        ),
        (
            "- **publish latency** (produce): send call -> broker receipt; at max rate it is"
            " mostly the 10,000-message window queueing, so it follows throughput."
        ),
        (
            f"- **end-to-end** at {LATENCY_RATE:,} msg/s: one producer and one consumer in the"
            " client process; latency is send -> receive on one clock (the send time travels"
            " in the payload). **delivered msg/s** must reach"
            f" {RATE_REACHED_FRACTION:.0%} of the rate for the latency to count."
        ),
        (
            f"- **server CPU %** / **us/msg**: user + system CPU of {server_processes} over"
            " the window, and that divided by msg/s: the server's CPU cost per message, the"
            " figure where TLS's cost shows even when throughput is limited elsewhere."
            f" {tls_scope_text} **client CPU %** likewise for the client process (TLS costs"
            " the client too). **machine busy**: all"
            " processes, from `/proc/stat` (near 200%: the machine is the limit); **others**:"
            " what no process of this benchmark (servers, client, this script) used."
        ),
        "",
    ]
    lines += failed_runs_section(
        results["runs"], lambda r: f"round {r['round']}, {r['workload']}, {r['variant']}"
    )
    return report_text(
        lines,
        "Every run (command, perf's summary and per-second progress, CPU), parameters and"
        " machine details",
        gap=False,
    )


# --- main -----------------------------------------------------------------------------------------


def targets(hops: Hops) -> dict[str, float]:
    """The targets of a run in mode ``hops``, as its results record them."""
    out = {
        "tls_min_throughput_ratio": hops.tls_min_throughput_ratio,
        "tls_max_p99_increase_ms": hops.tls_max_p99_increase_ms,
    }
    if hops.auth_pairs:
        out["auth_min_throughput_ratio"] = AUTH_MIN_THROUGHPUT_RATIO
    out["rate_reached_fraction"] = RATE_REACHED_FRACTION
    return out


def default_tag(*, quick: bool, hops: str) -> str | None:
    """What a run's results files are tagged with when ``--tag`` is not given: nothing for a
    full default run, so ``security-<date>.*``; ``quick`` and ``every-hop`` keep the other
    kinds of run from overwriting it (and each other)."""
    parts = (["every-hop"] if hops == EVERY_HOP else []) + (["quick"] if quick else [])
    return "-".join(parts) or None


def durations(args: argparse.Namespace) -> dict[str, float]:
    return {
        "produce": args.produce_s,
        "produce-per-message": args.per_message_s,
        f"e2e-{LATENCY_RATE}": args.e2e_s,
    }


async def bench(args: argparse.Namespace, argv: list[str], root: Path) -> dict[str, Any]:
    started = time.time()
    seconds = durations(args)
    hops = HOPS[args.hops]
    results: dict[str, Any] = {
        **results_head("security", "security_bench.py", argv, started, args),
        "parameters": {
            "rounds": args.rounds,
            "quiet_pct": args.quiet_pct,
            "max_wait_s": args.max_wait_s,
            "server": args.server,
            "hops": hops.key,
            "bookies": args.bookies,
            "cluster_broker_args": BROKER_ARGS if args.server == CLUSTER else None,
            "message_bytes": MESSAGE_BYTES,
            "warmup_s": args.warmup_s,
            "duration_s": seconds,
            "latency_rate": LATENCY_RATE,
            "variants": {v.key: v.name for v in hops.variants},
            "workloads": {w.key: w.name for w in WORKLOADS},
            "namespace": NAMESPACE,
            "client_role": CLIENT_ROLE,
            "targets": targets(hops),
        },
        "machine": machine_info(root),
        "runs": [],
    }
    async with contextlib.AsyncExitStack() as stack:
        servers = await start_servers(root, args.server, args.bookies, stack, hops)
        results["servers"] = {
            name: {
                "kind": server.kind,
                "processes": server.processes(),
                "service_url": server.service_url,
                "tls_service_url": server.tls_service_url,
            }
            for name, server in servers.by_name.items()
        }
        print(
            f"servers ({args.server}): "
            + "; ".join(
                f"{name} {server.service_url} {server.tls_service_url}"
                for name, server in servers.by_name.items()
            ),
            flush=True,
        )
        budget = WaitBudget(args.max_wait_s)
        for round_index in range(args.rounds):
            for workload in WORKLOADS:
                for position, variant in enumerate(round_order(round_index, hops.variants)):
                    run = await run_one(
                        servers,
                        workload,
                        variant,
                        round_index,
                        duration_s=seconds[workload.key],
                        warmup_s=args.warmup_s,
                        position=position,
                        quiet_pct=args.quiet_pct,
                        budget=budget,
                    )
                    results["runs"].append(run)
                    _print_run(run)
    results["waited_for_quiet_s"] = round(sum(r["waited_for_quiet_s"] for r in results["runs"]), 1)
    results["summary"] = summarize(results["runs"], hops.variants)
    results["comparisons"] = comparisons(results["runs"], hops)
    results["checks"] = checks(results["comparisons"], results["summary"], hops)
    results["elapsed_s"] = time.time() - started
    return results


def _print_run(run: dict[str, Any]) -> None:
    head = f"round {run['round']} {run['workload']:<20} {run['variant']:<11}"
    if not run["ok"]:
        print(f"{head} FAILED: {run.get('error')}", flush=True)
        return
    f = run["figures"]
    if run.get("waited_for_quiet_s"):
        head += f" (waited {run['waited_for_quiet_s']:.0f} s for a quiet machine)"
    print(
        f"{head} {opt(f['msg_per_s'], ',.0f'):>9} msg/s  p50 {opt(f['p50_ms'])} ms"
        f"  p99 {opt(f['p99_ms'])} ms  server CPU {opt(f['server_cpu_pct'], '.0f')}%"
        f"  client CPU {opt(f['client_cpu_pct'], '.0f')}%",
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser, add = bench_parser(
        "security_bench.py",
        (
            "What TLS and authentication + authorization cost: two real servers (auth off and"
            " on, each with a plaintext and a TLS listener; LocalClusters as the suite's, or"
            " standalones), four variants (plaintext, TLS,"
            " plaintext + auth, TLS + auth) interleaved in rounds; produce throughput (perf's"
            " send_many loop and a send_async-per-message loop) and end-to-end latency at"
            " 2,000 msg/s, with the server's and the client's CPU. Writes security-<date>.json"
            " and .md to --out with PASS/FAIL for each target. Exits 0 if every run succeeded"
            " (whatever the verdicts), else 1 (results are written either way)."
        ),
    )
    add("--rounds", type=int, default=6, help="rounds; each runs every workload per variant")
    add("--produce-s", type=float, default=4.0, help="measured seconds of a produce run")
    add("--per-message-s", type=float, default=3.0, help="... of a per-message produce run")
    add("--e2e-s", type=float, default=7.0, help="... of an end-to-end run")
    add("--warmup-s", type=float, default=1.0, help="seconds each run goes first, not counted")
    add(
        "--quiet-pct",
        type=float,
        default=25.0,
        help="before each run, wait while other tenants of the machine use more than this %% of"
        " a core (watched in 0.5 s windows with the servers idle)",
    )
    add(
        "--max-wait-s",
        type=float,
        default=240.0,
        help="seconds the whole run may spend waiting for a quiet machine; then runs start"
        " whatever the others do (what they used is recorded with each run)",
    )
    add(
        "--server",
        choices=(CLUSTER, STANDALONE),
        default=CLUSTER,
        help="what each security mode runs on: a LocalCluster as the suite's (its own etcd,"
        " bookie processes and one broker process, E3/Qw2/Qa2), or one `magnetar standalone`"
        " process (broker, bookies and metadata in one process: saturated by any fixed rate"
        " from about 500 entries/s on a 2-core machine, so its latency at 2,000 msg/s is"
        " queueing)",
    )
    add(
        "--hops",
        choices=tuple(HOPS),
        default=CLIENT_HOP,
        help="client: TLS between client and broker only, and authentication (four variants on"
        " two servers: auth off and on, each with both listeners); every: TLS on every hop"
        " (client -> broker over magnetar+ssl://, broker -> bookies over mutual TLS, every"
        " process -> etcd over TLS with a client certificate) against plaintext on every hop,"
        " two variants on two clusters, with the Security II targets (throughput >= 80%%, p99"
        " at 2,000 msg/s <= +2 ms); needs --server cluster",
    )
    add("--bookies", type=int, default=3, help="bookies of each server")
    add(
        "--quick",
        action="store_true",
        help="smoke test: 2 rounds of 2 / 1.5 / 3 s runs; results go to security-<date>-quick.*"
        " (-every-hop-quick with --hops every) unless --tag is given",
    )
    add(
        "--tag",
        help="name the results security-<date>-<TAG>.* (default: none, 'quick', 'every-hop' or"
        " 'every-hop-quick')",
    )
    add_output_options(
        add,
        data_root_help=(
            "a temporary directory is made here for the servers' data, certificates and tokens,"
            " and removed at the end"
        ),
        keep_data_help=KEEP_DATA_HELP,
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 2)
        args.produce_s = min(args.produce_s, 2.0)
        args.per_message_s = min(args.per_message_s, 1.5)
        args.e2e_s = min(args.e2e_s, 3.0)
        args.warmup_s = min(args.warmup_s, 0.5)
    args.tag = args.tag or default_tag(quick=args.quick, hops=args.hops)
    if args.hops == EVERY_HOP and args.server != CLUSTER:
        parser.error(
            "--hops every needs --server cluster: a standalone's broker reaches its bookies"
            " inside its one process, with no hop to encrypt"
        )
    if args.rounds < 1 or args.bookies < 1:
        parser.error("--rounds and --bookies must be at least 1")
    if min(args.produce_s, args.per_message_s, args.e2e_s) <= 0 or args.warmup_s < 0:
        parser.error("run durations must be > 0 and --warmup-s >= 0")
    return args


def _verdicts(results: dict[str, Any], args: argparse.Namespace) -> bool:
    for check in results["checks"]:
        print(f"{check['verdict']}: {check['name']}")
        for row in check["rows"]:
            value = _figure_value(check["figure"], row["measured"]) if "measured" in row else "-"
            print(
                f"    {row['verdict']} {row['workload']} {row['variant']} vs"
                f" {row['baseline']}: {value}"
            )
    return all_ok("runs")(results, args)


def main(argv: list[str] | None = None) -> int:
    # the test kit and the admin client log at info; the benchmark's own output is enough
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    return bench_main(
        "security", argv, parse_args, bench, render_markdown, ok=_verdicts, worker=worker_main
    )


if __name__ == "__main__":
    raise SystemExit(main())
