"""The ``magnetar`` command.

Every command DESIGN §5 names is listed so that ``magnetar --help`` shows the whole product; the
ones not built yet say so and exit with status 3 instead of pretending. Server commands take
their settings from flags, ``MAGNETAR_*`` environment variables and an optional ``--config``
TOML file (flags win), and log JSON lines to stderr unless ``--log-format console``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from magnetar import __version__
from magnetar.cli_support import (
    DEFAULT_SERVICE_URL,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_BUILT,
    EXIT_OK,
    EXIT_USAGE,
    add_credential_options,
    credential_flags_given,
    error_text,
    table,
)
from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.errors import MagnetarError
from magnetar.common.files import restrict_umask
from magnetar.common.log import configure_logging
from magnetar.common.server.gc_tuning import tune_gc_for_throughput

if TYPE_CHECKING:
    from metadata import MetadataStore, MetadataStoreConfig

NOT_BUILT: dict[str, str] = {}


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument(
        "--log-format",
        choices=["json", "console"],
        default=os.environ.get("MAGNETAR_LOG_FORMAT", "json"),
        help="log lines as JSON (default; env MAGNETAR_LOG_FORMAT) or for humans",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("MAGNETAR_LOG_LEVEL", "info"),
        help="debug, info, warning or error (env MAGNETAR_LOG_LEVEL)",
    )


_OPERATIONS = frozenset({"init", "info", "decommission-bookie"})
_METADATA_ONLY = frozenset({"under-replicated"}) | _OPERATIONS
_ADMIN_ONLY = frozenset({"brokers", "ownership"})
DEFAULT_INIT_WAIT_S = 120.0
DEFAULT_DECOMMISSION_TIMEOUT_S = 3600.0
_DECOMMISSION_REPORT_S = 10.0


def _add_cluster_source(parser: argparse.ArgumentParser, name: str) -> None:
    """``--service-url`` (through a broker's admin service) and/or ``--metadata`` (the store
    itself), whichever the view supports."""
    from magnetar.cli_client import DEFAULT_OPERATION_TIMEOUT_S, positive_seconds  # noqa: PLC0415

    if name in _METADATA_ONLY:
        parser.add_argument(
            "--metadata",
            default=None,
            required="MAGNETAR_METADATA" not in os.environ,
            help="the metadata store at this URL (env MAGNETAR_METADATA)",
        )
        _add_etcd_options(parser)
        return
    source = parser.add_mutually_exclusive_group()
    if name not in _ADMIN_ONLY:
        source.add_argument(
            "--metadata",
            default=None,
            help="read the metadata store at this URL (env MAGNETAR_METADATA)",
        )
    source.add_argument(
        "--service-url",
        default=None,
        help="ask the brokers at magnetar://host:port[,host:port] or magnetar+ssl://host:port"
        " (env MAGNETAR_SERVICE_URL; the default when no metadata URL is given:"
        f" {DEFAULT_SERVICE_URL})",
    )
    parser.add_argument(
        "--operation-timeout-s",
        type=positive_seconds,
        default=DEFAULT_OPERATION_TIMEOUT_S,
        metavar="S",
        help="with --service-url: give up on the brokers after this long (default"
        f" {DEFAULT_OPERATION_TIMEOUT_S:g})",
    )
    add_credential_options(parser)  # for the brokers; a metadata store has its own settings
    if name not in _ADMIN_ONLY:
        _add_etcd_options(parser)


def _add_etcd_options(parser: argparse.ArgumentParser) -> None:
    """``--etcd-trust-certs-file``, ``--etcd-cert-file``, ``--etcd-key-file``, ``--etcd-user``
    and ``--etcd-password-file`` (and their MAGNETAR_ETCD_* variables), as the servers take them:
    for commands that read the metadata store directly."""
    from metadata.config import EtcdSecuritySettings  # noqa: PLC0415

    add_config_arguments(parser, EtcdSecuritySettings)


def _store_config(args: argparse.Namespace) -> MetadataStoreConfig:
    """The metadata store a command reads directly: ``--metadata`` and etcd's credentials."""
    from metadata.config import EtcdSecuritySettings  # noqa: PLC0415

    security = load_config(
        EtcdSecuritySettings, overrides=config_overrides_from_args(args, EtcdSecuritySettings)
    )
    return security.store_config(args.metadata)


def _cluster_service_url(args: argparse.Namespace) -> str | None:
    """The service URL to ask, or None to read the metadata store: an explicit --service-url
    or --metadata wins; then MAGNETAR_METADATA; then MAGNETAR_SERVICE_URL or the default."""
    if getattr(args, "service_url", None):
        return str(args.service_url)
    if getattr(args, "metadata", None):
        return None
    if args.cluster_command not in _ADMIN_ONLY and os.environ.get("MAGNETAR_METADATA"):
        args.metadata = os.environ["MAGNETAR_METADATA"]
        return None
    return os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_SERVICE_URL)


_SERVER_SUMMARIES = {
    "bookie": "run a bookie (storage node)",
    "standalone": "everything in one process: embedded metadata, 3 bookies, 1 broker",
    "broker": "run a broker (stateless partition owner)",
    "autorecovery": "run the autorecovery role (re-replicates the ledgers of lost bookies)",
    "verify": "fault-injecting durability checker (starts its own cluster; see docs/verify.md)",
}
"""Commands whose flags come from heavy modules (the servers' config classes, the checker):
built in full only when they are the command run, or for ``magnetar --help``."""


def _invoked(argv: Sequence[str] | None) -> str | None:
    """The command a command line runs (its first word), if that is all it needs."""
    words = list(sys.argv[1:] if argv is None else argv)
    return words[0] if words and not words[0].startswith("-") else None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the command line, the server commands and ``verify``
    that it does not run get their summary only, not the flags that need their heavy config
    classes: every client command starts about half a second sooner that way."""
    command = _invoked(argv) if argv is not None else None

    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = argparse.ArgumentParser(
        prog="magnetar",
        description="Magnetar: a Pulsar-style messaging system in Python.",
    )
    parser.add_argument("--version", action="version", version=f"magnetar {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in _SERVER_SUMMARIES.items():
        if not wanted(name):
            commands.add_parser(name, help=summary, description=summary)

    if wanted("bookie"):
        from bookie.service.config import BookieConfig  # noqa: PLC0415 - keep --help fast

        bookie = commands.add_parser(
            "bookie",
            help=_SERVER_SUMMARIES["bookie"],
            description="Run a bookie: the durable storage node (gRPC on --port, metrics on"
            " --http-port).",
        )
        _add_server_options(bookie)
        add_config_arguments(bookie, BookieConfig)

    if wanted("standalone"):
        from magnetar.standalone import StandaloneConfig  # noqa: PLC0415

        standalone = commands.add_parser(
            "standalone",
            help=_SERVER_SUMMARIES["standalone"],
            description="Run Magnetar in one process: embedded metadata (no etcd), --bookies"
            " bookies and one broker, all data under --data-dir (kept across restarts). Prints"
            " the service URL when ready; Ctrl-C stops it cleanly.",
        )
        _add_server_options(standalone)
        standalone.set_defaults(log_format=os.environ.get("MAGNETAR_LOG_FORMAT", "console"))
        standalone.set_defaults(log_level=os.environ.get("MAGNETAR_LOG_LEVEL", "warning"))
        add_config_arguments(standalone, StandaloneConfig)

    if wanted("broker"):
        from broker.service.config import BrokerConfig  # noqa: PLC0415

        broker = commands.add_parser(
            "broker",
            help=_SERVER_SUMMARIES["broker"],
            description="Run a broker: owns partitions through the metadata store, serves"
            " producers and consumers on --port (gRPC), metrics and health on --http-port."
            " SIGTERM hands its partitions to other brokers before exiting.",
        )
        _add_server_options(broker)
        add_config_arguments(broker, BrokerConfig)

    if wanted("autorecovery"):
        from bookie.autorecovery.config import AutorecoveryConfig  # noqa: PLC0415

        autorecovery = commands.add_parser(
            "autorecovery",
            help=_SERVER_SUMMARIES["autorecovery"],
            description="Run an autorecovery instance. One instance in the cluster is active at"
            " a time (elected through the metadata store); the others wait to take over."
            " Metrics and health on --http-port.",
        )
        _add_server_options(autorecovery)
        add_config_arguments(autorecovery, AutorecoveryConfig)

    cluster = commands.add_parser(
        "cluster",
        help="brokers, bookies, ownership, ledgers, under-replicated ledgers; init, info,"
        " decommission-bookie",
        description="Inspect the cluster, through a broker (--service-url) or by reading the"
        " metadata store directly (--metadata); initialise it (init) and retire bookies"
        " (decommission-bookie) in the metadata store.",
    )
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="WHAT", required=True)
    for name, summary in (
        ("brokers", "live brokers: address, version, partitions owned, load"),
        ("ownership", "which broker owns each loaded partition"),
        ("bookies", "bookies the cluster knows, and which are available"),
        ("ledgers", "every ledger with its state and quorums"),
        ("ledger", "one ledger's metadata: state, ensembles"),
        ("under-replicated", "ledgers autorecovery still has to re-replicate"),
    ):
        sub = cluster_commands.add_parser(name, help=summary, description=summary)
        _add_cluster_source(sub, name)
        sub.set_defaults(cluster_parser=sub)
        sub.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        if name == "ledger":
            sub.add_argument("ledger_id", type=int)
        if name == "ledgers":
            sub.add_argument("--topic", help="only this topic's ledgers (with --service-url)")
        if name == "ownership":
            sub.add_argument("--broker", metavar="BROKER_ID", help="only this broker's partitions")

    _add_cluster_operations(cluster_commands)

    from magnetar.cli_client import add_client_commands  # noqa: PLC0415
    from magnetar.cli_tokens import add_tokens_command  # noqa: PLC0415
    from magnetar.perf import add_perf_command  # noqa: PLC0415

    add_client_commands(commands)
    add_perf_command(commands)
    add_tokens_command(commands)
    if wanted("verify"):
        _add_verify_command(commands)

    for name, summary in NOT_BUILT.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _seconds_at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _cluster_name(text: str) -> str:
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415
    from metadata.cluster_info import check_cluster_name  # noqa: PLC0415

    try:
        return check_cluster_name(text)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _add_cluster_operations(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cluster init``, ``cluster info`` and ``cluster decommission-bookie``: they act on the
    metadata store itself (``--metadata``), never through a broker."""
    from magnetar.cli_client import positive_seconds  # noqa: PLC0415

    summary = (
        "initialise a new cluster's metadata (once; repeating it with the same name is a no-op)"
    )
    init = commands.add_parser(
        "init",
        help=summary,
        description="Write the cluster's record (its name and metadata format) at"
        " /magnetar/cluster, create-only. Run it once before the first bookie and broker"
        " start. Run again with the same name it says the cluster is already initialised and"
        " exits 0; with another name it fails. It keeps trying to reach the metadata store for"
        " --wait-s seconds, so it may start before etcd is up.",
    )
    _add_cluster_source(init, "init")
    init.add_argument(
        "--cluster-name",
        type=_cluster_name,
        default=os.environ.get("MAGNETAR_CLUSTER_NAME"),
        required="MAGNETAR_CLUSTER_NAME" not in os.environ,
        metavar="NAME",
        help="the cluster's name: 1-63 letters, digits, '.', '_' or '-', starting with a letter"
        " or digit (env MAGNETAR_CLUSTER_NAME)",
    )
    init.add_argument(
        "--wait-s",
        type=_seconds_at_least_zero,
        default=DEFAULT_INIT_WAIT_S,
        metavar="S",
        help="keep trying to reach the metadata store for this long before failing (default"
        f" {DEFAULT_INIT_WAIT_S:g}; 0: try once)",
    )

    summary = "the cluster's name, metadata format version and creation time"
    info = commands.add_parser("info", help=summary, description=summary)
    _add_cluster_source(info, "info")
    info.add_argument("--json", action="store_true", help="one JSON object instead of a table")

    summary = "retire a stopped bookie for good, once no ledger needs it (frees its id)"
    decommission = commands.add_parser(
        "decommission-bookie",
        help=summary,
        description="Retire a bookie that is stopped for good (like BookKeeper's"
        " decommissionbookie). Refuses a bookie the cluster does not know or that is still"
        " running. Waits until no ledger's ensembles name the bookie any more (autorecovery"
        " re-replicates the ledgers of a lost bookie), printing how many still do, then deletes"
        " its cookie so a new bookie with an empty data directory may take the id.",
    )
    decommission.add_argument("bookie_id", metavar="BOOKIE_ID")
    _add_cluster_source(decommission, "decommission-bookie")
    decommission.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=DEFAULT_DECOMMISSION_TIMEOUT_S,
        metavar="S",
        help="give up (exit 1, cookie kept) if ledgers still reference the bookie after this"
        f" long (default {DEFAULT_DECOMMISSION_TIMEOUT_S:g})",
    )
    decommission.add_argument(
        "--poll-interval-s",
        type=positive_seconds,
        default=2.0,
        metavar="S",
        help="how often to look at the ledgers (default 2)",
    )
    for sub in (init, info, decommission):
        sub.set_defaults(cluster_parser=sub)


def _add_verify_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from magnetar.verify.nemesis import FAULT_KINDS  # noqa: PLC0415

    summary = _SERVER_SUMMARIES["verify"]
    verify = commands.add_parser("verify", help=summary, description=summary)
    add = verify.add_argument
    add("--duration", type=float, default=60.0, metavar="S", help="seconds of faults (60)")
    add("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    add("--json", action="store_true", help="print the summary as one JSON line")
    add(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where report.json, timeline.png and summary.md go (verify-<seed>/)",
    )
    add(
        "--faults",
        default=",".join(FAULT_KINDS),
        metavar="KINDS",
        help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)})",
    )
    add(
        "--pace",
        type=float,
        default=1.0,
        help="scale fault lengths and gaps (0.5: twice as many faults; default 1)",
    )
    add(
        "--zombie-s",
        type=float,
        default=0.0,
        metavar="S",
        help="the first pause-broker and cut-broker-etcd faults last at least S seconds"
        " (more than the 4 s session TTL: a zombie broker even at a fast pace)",
    )
    add(
        "--recovery-bound-s",
        type=float,
        default=5.0,
        metavar="S",
        help="fail when a partition acknowledges no send for more than S seconds with no fault"
        " active that could explain it, e.g. S seconds after the faults healed (5)",
    )
    add("--bookies", type=int, default=4, help="bookies (4)")
    add(
        "--brokers",
        type=int,
        default=2,
        help="brokers on the host (2); one more runs in a network namespace when root",
    )
    add("--etcd-members", type=int, default=3, help="etcd members (3)")
    add("--partitions", type=int, default=4, help="partitions of the topic (4)")
    add("--producers", type=int, default=2, help="producers (2)")
    add("--keys", type=int, default=8, help="keys per producer (8)")
    add("--rate", type=float, default=300.0, help="messages per second in all (300)")
    add("--message-size", type=int, default=100, metavar="BYTES", help="payload size (100)")
    add("--work-dir", type=Path, default=None, help="cluster data and logs (a temp dir)")
    add("--keep", action="store_true", help="keep the work dir even when the run passes")
    add("--save-history", action="store_true", help="also write every event to history.json")
    add(
        "--secure",
        action="store_true",
        help="TLS and authentication on every hop (clients, brokers, bookies, etcd, HTTPS"
        " metrics), and every certificate and the token key rotated halfway through",
    )
    add(
        "--token-expiry-s",
        type=int,
        default=10,
        metavar="S",
        help="with --secure: how long each client token is valid, refreshed in band (10)",
    )


def _run_verify(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    import random  # noqa: PLC0415

    from magnetar.verify.runner import VerifyConfig, verify_main  # noqa: PLC0415

    configure_logging(mode="console", level="warning", stream=sys.stderr)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    faults = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    words = list(sys.argv[1:] if argv is None else argv)
    if args.seed is None:
        words += ["--seed", str(seed)]
    try:
        config = VerifyConfig(
            duration_s=args.duration,
            seed=seed,
            faults=faults,
            pace=args.pace,
            zombie_s=args.zombie_s,
            recovery_bound_s=args.recovery_bound_s,
            bookies=args.bookies,
            brokers=args.brokers,
            etcd_members=args.etcd_members,
            partitions=args.partitions,
            producers=args.producers,
            keys=args.keys,
            rate=args.rate,
            message_size=args.message_size,
            out_dir=args.out or Path(f"verify-{seed}"),
            work_dir=args.work_dir,
            keep=args.keep,
            save_history=args.save_history,
            secure=args.secure,
            token_expiry_s=args.token_expiry_s,
            command="magnetar " + " ".join(words),
        )
    except ValueError as e:
        print(f"magnetar verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    return verify_main(config, as_json=args.json)


def _run_bookie(args: argparse.Namespace) -> int:
    from bookie.process import run_bookie  # noqa: PLC0415
    from bookie.service.config import BookieConfig  # noqa: PLC0415

    restrict_umask()  # data, keys and logs this server writes are its user's only

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    # The journal's write+fdatasync thread must get the GIL back quickly when its syscalls
    # return, or group commits queue behind the event loop's 5 ms default slice.
    sys.setswitchinterval(0.001)
    config = load_config(
        BookieConfig, file=args.config, overrides=config_overrides_from_args(args, BookieConfig)
    )
    tune_gc_for_throughput()  # see magnetar/common/server/gc_tuning.py
    return asyncio.run(run_bookie(config))


def _run_standalone(args: argparse.Namespace) -> int:
    from magnetar.standalone import StandaloneConfig, run_standalone  # noqa: PLC0415

    restrict_umask()  # data, keys and logs this server writes are its user's only

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    sys.setswitchinterval(0.001)
    config = load_config(
        StandaloneConfig,
        file=args.config,
        overrides=config_overrides_from_args(args, StandaloneConfig),
    )
    tune_gc_for_throughput()  # see magnetar/common/server/gc_tuning.py
    return asyncio.run(run_standalone(config))


def _run_broker(args: argparse.Namespace) -> int:
    from broker.process import run_broker  # noqa: PLC0415
    from broker.service.config import BrokerConfig  # noqa: PLC0415

    restrict_umask()  # data, keys and logs this server writes are its user's only

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    sys.setswitchinterval(0.001)
    config = load_config(
        BrokerConfig, file=args.config, overrides=config_overrides_from_args(args, BrokerConfig)
    )
    tune_gc_for_throughput()  # see magnetar/common/server/gc_tuning.py
    return asyncio.run(run_broker(config))


def _run_autorecovery(args: argparse.Namespace) -> int:
    from bookie.autorecovery.config import AutorecoveryConfig  # noqa: PLC0415
    from bookie.autorecovery.process import run_autorecovery  # noqa: PLC0415

    restrict_umask()  # data, keys and logs this server writes are its user's only

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    config = load_config(
        AutorecoveryConfig,
        file=args.config,
        overrides=config_overrides_from_args(args, AutorecoveryConfig),
    )
    return asyncio.run(run_autorecovery(config))


async def _cluster(args: argparse.Namespace) -> int:
    from bookie.autorecovery.records import list_under_replicated  # noqa: PLC0415
    from bookie.client.bookies import BookieRecord  # noqa: PLC0415
    from bookie.client.ledger_metadata import LedgerMetadataStore  # noqa: PLC0415
    from metadata import layout, open_store  # noqa: PLC0415
    from proto.format.v1 import cluster_pb2  # noqa: PLC0415

    configure_logging(mode="console", level="warning", stream=sys.stderr)
    if args.cluster_command == "init":
        return await _cluster_init(args)
    store = await open_store(_store_config(args))
    try:
        if args.cluster_command == "info":
            return await _cluster_info(store, as_json=args.json)
        if args.cluster_command == "decommission-bookie":
            return await _decommission_bookie(store, args)
        rows: list[dict[str, object]]
        columns: list[str]
        if args.cluster_command == "bookies":
            available = {
                r.key.rsplit("/", 1)[1]: BookieRecord.from_bytes(r.value)
                for r in (await store.list(layout.BOOKIES_AVAILABLE)).records
            }
            rows = []
            for record in (await store.list(layout.BOOKIE_COOKIES)).records:
                bookie_id = record.key.rsplit("/", 1)[1]
                live = available.get(bookie_id)
                rows.append(
                    {
                        "bookie": bookie_id,
                        "state": ("writable" if live.writable else "read-only") if live else "down",
                        "address": live.address if live else "",
                        "zone": (live.zone or "") if live else "",
                        "ledgers": live.ledger_count if live else "",
                        "free_gb": round(live.free_bytes / 1e9, 1) if live else "",
                        "instance": cluster_pb2.BookieRegistration.FromString(
                            record.value
                        ).instance_id,
                    }
                )
            columns = ["bookie", "state", "address", "zone", "ledgers", "free_gb"]
        elif args.cluster_command in ("ledgers", "ledger"):
            ledgers = LedgerMetadataStore(store)
            ids = (
                [args.ledger_id] if args.cluster_command == "ledger" else await ledgers.ledger_ids()
            )
            rows = []
            for ledger_id in ids:
                metadata = await ledgers.read(ledger_id)
                rows.append(
                    {
                        "ledger": ledger_id,
                        "state": metadata.state.name.lower(),
                        "quorums": f"E{metadata.ensemble_size}/Qw{metadata.write_quorum}"
                        f"/Qa{metadata.ack_quorum}",
                        # a ledger made on fewer bookies than its E while fewer were writable
                        "striping": (
                            f"under-striped ({metadata.ensemble_size} of"
                            f" {metadata.intended_ensemble_size})"
                            if metadata.under_striped
                            else "full"
                        ),
                        "last_entry": metadata.last_entry_id,
                        "ensembles": " ".join(
                            f"{s.first_entry_id}:{','.join(s.bookies)}" for s in metadata.segments
                        ),
                        # e.g. recovery-unbacked-lac, which recovery sets when it met a LAC
                        # that no replica backed
                        "properties": ",".join(
                            f"{k}={v.decode('utf-8', errors='replace')}"
                            for k, v in sorted(metadata.custom.items())
                        ),
                    }
                )
            columns = ["ledger", "state", "quorums", "striping", "last_entry", "ensembles"]
            if args.cluster_command == "ledger":
                columns.append("properties")
        else:
            rows = [
                {
                    "ledger": r.ledger_id,
                    "lost_bookies": ",".join(r.lost_bookies),
                    "fragments": r.fragments,
                    "since_ms": r.since_ms,
                }
                for r in await list_under_replicated(store)
            ]
            columns = ["ledger", "lost_bookies", "fragments", "since_ms"]
    finally:
        await store.close()
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows, columns))
    return EXIT_OK


def _iso_time(ms: int) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


async def _cluster_init(args: argparse.Namespace) -> int:
    from metadata.cluster_info import initialize_cluster_waiting  # noqa: PLC0415

    def waiting(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    from metadata.config import EtcdSecuritySettings  # noqa: PLC0415

    security = load_config(
        EtcdSecuritySettings, overrides=config_overrides_from_args(args, EtcdSecuritySettings)
    )
    result = await initialize_cluster_waiting(
        args.metadata,
        args.cluster_name,
        wait_s=args.wait_s,
        on_wait=waiting,
        security=security,
    )
    info = result.info
    if result.created:
        print(
            f"initialised cluster {info.cluster_name} (metadata format {info.format_version})"
            f" in {args.metadata}"
        )
    else:
        print(
            f"cluster {info.cluster_name} is already initialised (since"
            f" {_iso_time(info.created_ms)}, metadata format {info.format_version}); nothing to do"
        )
    return EXIT_OK


async def _cluster_info(store: MetadataStore, *, as_json: bool) -> int:
    from metadata import layout  # noqa: PLC0415
    from metadata.cluster_info import read_cluster_info  # noqa: PLC0415

    info = await read_cluster_info(store)
    if info is None:
        print(
            f"magnetar cluster: the cluster is not initialised ({store.description} has no"
            f" {layout.CLUSTER}); run: magnetar cluster init --cluster-name NAME",
            file=sys.stderr,
        )
        return EXIT_FAILED
    row: dict[str, object] = {
        "cluster_name": info.cluster_name,
        "format_version": info.format_version,
        "created": _iso_time(info.created_ms),
        "created_ms": info.created_ms,
    }
    if as_json:
        print(json.dumps(row))
    else:
        print(table([row], ["cluster_name", "format_version", "created"]))
    return EXIT_OK


async def _decommission_bookie(store: MetadataStore, args: argparse.Namespace) -> int:
    from bookie.decommission import (  # noqa: PLC0415
        DecommissionProgress,
        decommission_bookie,
        describe_progress,
    )

    shown: tuple[int, float] | None = None  # (ledger count, elapsed_s) last printed

    def progress(now: DecommissionProgress) -> None:
        nonlocal shown
        count = len(now.ledgers)
        if shown is None or shown[0] != count or now.elapsed_s - shown[1] >= _DECOMMISSION_REPORT_S:
            print(f"waiting: {describe_progress(now)}", file=sys.stderr, flush=True)
            shown = (count, now.elapsed_s)

    result = await decommission_bookie(
        store,
        args.bookie_id,
        timeout_s=args.timeout_s,
        poll_interval_s=args.poll_interval_s,
        on_progress=progress,
    )
    print(
        f"decommissioned bookie {result.bookie_id}: no ledger references it"
        f" ({result.ledgers_at_start} did when this started; waited {result.waited_s:.0f} s)"
        f" and its cookie is deleted, so a bookie with an empty data directory may now start"
        f" as {result.bookie_id}"
    )
    return EXIT_OK


_SERVERS = frozenset({"bookie", "broker", "standalone", "autorecovery"})


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "bookie":
            return _run_bookie(args)
        if args.command == "standalone":
            return _run_standalone(args)
        if args.command == "broker":
            return _run_broker(args)
        if args.command == "autorecovery":
            return _run_autorecovery(args)
        if args.command == "cluster":
            service_url = _cluster_service_url(args)
            if service_url is not None:
                from magnetar.cli_client import run_cluster_admin  # noqa: PLC0415

                args.service_url = service_url
                return run_cluster_admin(args)
            if getattr(args, "topic", None):
                args.cluster_parser.error("--topic needs --service-url (not --metadata)")
            if given := credential_flags_given(args):
                args.cluster_parser.error(
                    f"{', '.join(given)}: credentials and TLS settings are for the brokers"
                    " (--service-url), not the metadata store (--metadata)"
                )
            return asyncio.run(_cluster(args))
        from magnetar.cli_client import CLIENT_COMMANDS, run_client_command  # noqa: PLC0415

        if args.command in CLIENT_COMMANDS:
            return run_client_command(args)
        if args.command == "perf":
            from magnetar.perf import run_perf  # noqa: PLC0415

            return run_perf(args)
        if args.command == "tokens":
            from magnetar.cli_tokens import run_tokens  # noqa: PLC0415

            return run_tokens(args)
        if args.command == "verify":
            return _run_verify(args, argv)
    except MagnetarError as e:
        print(f"magnetar {args.command}: {error_text(e)}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:  # a port in use, a data directory that cannot be created ...
        print(f"magnetar {args.command}: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        # servers treat Ctrl-C as their normal stop; an interrupted client command did not finish
        return EXIT_OK if args.command in _SERVERS else EXIT_INTERRUPTED
    print(
        f"magnetar {args.command}: not built yet in {__version__}; see CHANGELOG.md for what has"
        " landed.",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT


if __name__ == "__main__":
    sys.exit(main())
