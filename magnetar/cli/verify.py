"""``magnetar verify``: the fault-injecting durability checker (it starts its own cluster; see
docs/verify.md). The checker is imported only when the command runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from magnetar.cli.support import EXIT_USAGE
from magnetar.common.log import configure_logging

VERIFY_SUMMARY = "fault-injecting durability checker (starts its own cluster; see docs/verify.md)"


def add_verify_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from magnetar.verify.nemesis import FAULT_KINDS  # noqa: PLC0415

    summary = VERIFY_SUMMARY
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


def run_verify(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
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
            client_log=True,
        )
    except ValueError as e:
        print(f"magnetar verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    return verify_main(config, as_json=args.json)
