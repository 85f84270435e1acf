"""What the client-side commands of ``magnetar`` share: exit codes, the ``--service-url`` and
``--json`` options, and table rendering.

Exit codes mean the same in every command:

- 0: done;
- 1: failed (the error is printed to stderr, naming what was wrong);
- 2: bad usage (argparse's own code);
- 3: the command is not built in this version;
- 4: timed out waiting (``consume`` got fewer messages than asked for, ``perf`` could not reach
  its target);
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_BUILT",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "add_client_options",
    "table",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_BUILT = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

DEFAULT_SERVICE_URL = "magnetar://localhost:6650"


def add_client_options(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    """``--service-url`` (env ``MAGNETAR_SERVICE_URL``) and, unless told not to, ``--json``."""
    parser.add_argument(
        "--service-url",
        default=os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_SERVICE_URL),
        help="brokers to talk to, magnetar://host:port[,host:port] (env MAGNETAR_SERVICE_URL;"
        f" default {DEFAULT_SERVICE_URL})",
    )
    if json_output:
        parser.add_argument(
            "--json", action="store_true", help="print JSON (for scripts) instead of a table"
        )


def table(rows: list[dict[str, object]], columns: list[str]) -> str:
    """``rows`` as a text table with upper-case headers; ``(none)`` when empty."""
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)
