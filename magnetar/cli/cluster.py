"""``magnetar cluster``: the cluster's brokers, bookies, ownership, ledgers and under-replicated
ledgers, read through a broker's admin service (``--service-url``) or from the metadata store
itself (``--metadata``); and the operations on the metadata store: ``init``, ``info`` and
``decommission-bookie``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from magnetar.cli.client import (
    DEFAULT_OPERATION_TIMEOUT_S,
    admin_client,
    emit,
    format_time,
    positive_seconds,
)
from magnetar.cli.support import (
    DEFAULT_SERVICE_URL,
    EXIT_FAILED,
    EXIT_OK,
    add_credential_options,
    credential_flags_given,
    table,
)
from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.log import configure_logging

if TYPE_CHECKING:
    from metadata import MetadataStore, MetadataStoreConfig

_OPERATIONS = frozenset({"init", "info", "decommission-bookie"})
_METADATA_ONLY = frozenset({"under-replicated"}) | _OPERATIONS
_ADMIN_ONLY = frozenset({"brokers", "ownership"})
DEFAULT_INIT_WAIT_S = 120.0
DEFAULT_DECOMMISSION_TIMEOUT_S = 3600.0
_DECOMMISSION_REPORT_S = 10.0


def add_cluster_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``cluster`` parser: its views and its operations."""
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


def _add_cluster_source(parser: argparse.ArgumentParser, name: str) -> None:
    """``--service-url`` (through a broker's admin service) and/or ``--metadata`` (the store
    itself), whichever the view supports."""
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


def run_cluster(args: argparse.Namespace) -> int:
    """Run ``magnetar cluster ...``: through a broker's admin service, or on the metadata
    store itself; its exit status."""
    service_url = _cluster_service_url(args)
    if service_url is not None:
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


def run_cluster_admin(args: argparse.Namespace) -> int:
    """``magnetar cluster brokers|ownership|bookies|ledgers|ledger`` through a broker's admin
    service (``--service-url``)."""
    rows: list[dict[str, Any]]
    document: object
    with admin_client(args) as admin:
        what = args.cluster_command
        if what == "brokers":
            document = admin.list_brokers()
            rows = [
                {
                    "broker": b["broker_id"],
                    "service_url": b["service_url"],
                    "http": b["http_address"],
                    "version": b["version"],
                    "partitions": b["owned_partitions"],
                    "rate_in": f"{b['msg_rate_in']:.1f}",
                    "rate_out": f"{b['msg_rate_out']:.1f}",
                    "cpu": f"{b['cpu_percent']:.0f}%",
                    "started": format_time(b["start_time_ms"]),
                }
                for b in document
            ]
            columns = list(rows[0]) if rows else ["broker"]
        elif what == "ownership":
            document = admin.list_ownership(args.broker or "")
            rows = [
                {
                    "partition": o["partition_topic"],
                    "broker": o["broker_id"],
                    "broker_url": o["broker_url"],
                    "since": format_time(o["acquired_ms"]),
                }
                for o in document
            ]
            columns = ["partition", "broker", "broker_url", "since"]
        elif what == "bookies":
            document = admin.list_bookies()
            rows = [
                {
                    "bookie": b["bookie_id"],
                    "state": b["state"],
                    "address": b["address"],
                    "free_gb": round(b["free_disk_bytes"] / 1e9, 1),
                    "total_gb": round(b["total_disk_bytes"] / 1e9, 1),
                    "version": b["version"],
                    "labels": ",".join(f"{k}={v}" for k, v in sorted(b["labels"].items())),
                }
                for b in document
            ]
            columns = ["bookie", "state", "address", "free_gb", "total_gb", "version", "labels"]
        elif what == "ledgers":
            document = admin.list_ledgers(args.topic or "")
            rows = [_ledger_row(ledger) for ledger in document]
            columns = ["ledger", "state", "quorums", "striping", "last_entry", "length", "topic"]
        else:
            document = admin.get_ledger(args.ledger_id)
            rows = [
                {
                    **_ledger_row(document["summary"]),
                    "created": format_time(document["created_ms"]),
                    "ensembles": " ".join(
                        f"{e['first_entry_id']}:{','.join(e['bookie_ids'])}"
                        for e in document["ensembles"]
                    ),
                    "properties": ",".join(
                        f"{k}={v}" for k, v in sorted(document["properties"].items())
                    ),
                }
            ]
            columns = ["ledger", "state", "quorums", "striping", "last_entry", "length"]
            columns += ["ensembles", "created", "properties"]
    return emit(args, document, table(rows, columns))


def _ledger_row(ledger: dict[str, Any]) -> dict[str, Any]:
    return {
        "ledger": ledger["ledger_id"],
        "state": ledger["state"].lower(),
        "quorums": f"E{ledger['ensemble_size']}/Qw{ledger['write_quorum_size']}"
        f"/Qa{ledger['ack_quorum_size']}",
        "striping": _striping(ledger["ensemble_size"], ledger.get("intended_ensemble_size", 0)),
        "last_entry": ledger["last_entry_id"],
        "length": ledger["length"],
        "topic": ledger["topic"] or "-",
    }


def _striping(ensemble_size: int, intended: int) -> str:
    """``full``, or ``under-striped (2 of 3)`` for a ledger made on fewer bookies than its E
    while fewer were writable (0: a broker too old to say)."""
    if intended > ensemble_size:
        return f"under-striped ({ensemble_size} of {intended})"
    return "full"
