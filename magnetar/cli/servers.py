"""The server commands of ``magnetar``: ``bookie``, ``standalone``, ``broker`` and
``autorecovery``. They take their settings from flags, ``MAGNETAR_*`` environment variables and
an optional ``--config`` TOML file (flags win), and log JSON lines to stderr unless
``--log-format console``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import structlog

from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.files import restrict_umask
from magnetar.common.log import configure_logging
from magnetar.common.server.event_loop import (
    DEFAULT_EVENT_LOOP,
    EVENT_LOOPS,
    loop_factory,
    run_on,
    running_loop_name,
)
from magnetar.common.server.gc_tuning import tune_gc_for_throughput

log = structlog.get_logger("magnetar.server")

SERVER_SUMMARIES = {
    "bookie": "run a bookie (storage node)",
    "standalone": "everything in one process: embedded metadata, 3 bookies, 1 broker",
    "broker": "run a broker (stateless partition owner)",
    "autorecovery": "run the autorecovery role (re-replicates the ledgers of lost bookies)",
}
"""The server commands. Their flags come from the servers' config classes, which are heavy to
import: a command line builds them in full only for the command it runs (or for ``--help``)."""


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
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=os.environ.get("MAGNETAR_EVENT_LOOP", DEFAULT_EVENT_LOOP),
        help="the event loop: asyncio (default), uvloop (the speedups extra; see"
        " docs/cli.md) or auto (uvloop when installed) (env MAGNETAR_EVENT_LOOP)",
    )


def add_server_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str
) -> None:
    """The full parser of one server command (its flags need its config class)."""
    if name == "bookie":
        from bookie.service.config import BookieConfig  # noqa: PLC0415 - keep --help fast

        bookie = commands.add_parser(
            "bookie",
            help=SERVER_SUMMARIES["bookie"],
            description="Run a bookie: the durable storage node (gRPC on --port, metrics on"
            " --http-port).",
        )
        _add_server_options(bookie)
        add_config_arguments(bookie, BookieConfig)
        return

    if name == "standalone":
        from magnetar.cli.standalone import StandaloneConfig  # noqa: PLC0415

        standalone = commands.add_parser(
            "standalone",
            help=SERVER_SUMMARIES["standalone"],
            description="Run Magnetar in one process: embedded metadata (no etcd), --bookies"
            " bookies and one broker, all data under --data-dir (kept across restarts). Prints"
            " the service URL when ready; Ctrl-C stops it cleanly.",
        )
        _add_server_options(standalone)
        standalone.set_defaults(log_format=os.environ.get("MAGNETAR_LOG_FORMAT", "console"))
        standalone.set_defaults(log_level=os.environ.get("MAGNETAR_LOG_LEVEL", "warning"))
        add_config_arguments(standalone, StandaloneConfig)
        return

    if name == "broker":
        from broker.service.config import BrokerConfig  # noqa: PLC0415

        broker = commands.add_parser(
            "broker",
            help=SERVER_SUMMARIES["broker"],
            description="Run a broker: owns partitions through the metadata store, serves"
            " producers and consumers on --port (gRPC), metrics and health on --http-port."
            " SIGTERM hands its partitions to other brokers before exiting.",
        )
        _add_server_options(broker)
        add_config_arguments(broker, BrokerConfig)
        return

    if name == "autorecovery":
        from bookie.autorecovery.config import AutorecoveryConfig  # noqa: PLC0415

        autorecovery = commands.add_parser(
            "autorecovery",
            help=SERVER_SUMMARIES["autorecovery"],
            description="Run an autorecovery instance. One instance in the cluster is active at"
            " a time (elected through the metadata store); the others wait to take over."
            " Metrics and health on --http-port.",
        )
        _add_server_options(autorecovery)
        add_config_arguments(autorecovery, AutorecoveryConfig)
        return
    raise ValueError(f"not a server command: {name!r}")


def run_server(args: argparse.Namespace) -> int:
    """Run ``magnetar bookie|standalone|broker|autorecovery`` until it is stopped."""
    # an unknown choice or a missing uvloop is refused before anything starts
    loop_factory(args.event_loop)
    run = {
        "bookie": _run_bookie,
        "standalone": _run_standalone,
        "broker": _run_broker,
        "autorecovery": _run_autorecovery,
    }[args.command]
    return run(args)


def _serve(args: argparse.Namespace, main: Coroutine[Any, Any, int]) -> int:
    """Run a server's main coroutine on the event loop ``--event-loop`` names."""

    async def logged() -> int:
        log.info("event_loop", loop=running_loop_name())
        return await main

    return run_on(args.event_loop, logged)


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
    return _serve(args, run_bookie(config))


def _run_standalone(args: argparse.Namespace) -> int:
    from magnetar.cli.standalone import StandaloneConfig, run_standalone  # noqa: PLC0415

    restrict_umask()  # data, keys and logs this server writes are its user's only

    configure_logging(mode=args.log_format, level=args.log_level, stream=sys.stderr)
    sys.setswitchinterval(0.001)
    config = load_config(
        StandaloneConfig,
        file=args.config,
        overrides=config_overrides_from_args(args, StandaloneConfig),
    )
    tune_gc_for_throughput()  # see magnetar/common/server/gc_tuning.py
    return _serve(args, run_standalone(config))


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
    return _serve(args, run_broker(config))


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
    return _serve(args, run_autorecovery(config))
