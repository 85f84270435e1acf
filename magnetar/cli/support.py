"""What the client-side commands of ``magnetar`` share: exit codes, the ``--service-url`` and
``--json`` options, the credential and TLS options, and table rendering.

Exit codes mean the same in every command:

- 0: done;
- 1: failed (the error is printed to stderr, naming what was wrong);
- 2: bad usage (argparse's own code);
- 3: the command is not built in this version;
- 4: timed out waiting (``consume`` got fewer messages than asked for, ``perf`` could not reach
  its target);
- 130: interrupted (Ctrl-C).

Credentials (:func:`add_credential_options`, turned into client settings by
:func:`client_settings`) come from flags or, for each flag not given, from ``MAGNETAR_*``
variables. A token or key never has a default shown in ``--help`` and never appears in an
error: errors name the flag, variable or file at fault instead.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magnetar.common.errors import MagnetarError

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_BUILT",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "add_client_options",
    "add_credential_options",
    "client_settings",
    "credential_flags_given",
    "error_text",
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
    """``--service-url`` (env ``MAGNETAR_SERVICE_URL``), the credential and TLS options
    (:func:`add_credential_options`) and, unless told not to, ``--json``."""
    parser.add_argument(
        "--service-url",
        default=os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_SERVICE_URL),
        help="brokers to talk to, magnetar://host:port[,host:port], or over TLS"
        f" magnetar+ssl://host:6651 (env MAGNETAR_SERVICE_URL; default {DEFAULT_SERVICE_URL})",
    )
    if json_output:
        parser.add_argument(
            "--json", action="store_true", help="print JSON (for scripts) instead of a table"
        )
    add_credential_options(parser)


# (flag, destination, environment variable) of every credential option that takes a value
_CREDENTIAL_FLAGS = (
    ("--auth-token", "auth_token", "MAGNETAR_AUTH_TOKEN"),
    ("--auth-token-file", "auth_token_file", "MAGNETAR_AUTH_TOKEN_FILE"),
    ("--tls-trust-certs-file", "tls_trust_certs_file", "MAGNETAR_TLS_TRUST_CERTS_FILE"),
    ("--tls-cert-file", "tls_cert_file", "MAGNETAR_TLS_CERT_FILE"),
    ("--tls-key-file", "tls_key_file", "MAGNETAR_TLS_KEY_FILE"),
)


def add_credential_options(parser: argparse.ArgumentParser) -> None:
    """``--auth-token``/``--auth-token-file`` (one or the other), ``--tls-trust-certs-file``,
    ``--tls-cert-file`` with ``--tls-key-file``, and ``--tls-allow-hostname-mismatch``; read
    by :func:`client_settings`. Their defaults are None whatever the environment holds, so
    ``--help`` never shows a variable's value (a token)."""
    group = parser.add_argument_group(
        "credentials and TLS",
        "How to prove who you are to brokers that require it, and which brokers to trust over"
        " TLS (magnetar+ssl:// service URLs). A flag wins over its environment variable.",
    )
    token = group.add_mutually_exclusive_group()
    token.add_argument(
        "--auth-token",
        metavar="TOKEN",
        help="a JWT token to present (env MAGNETAR_AUTH_TOKEN); other users of this machine may"
        " see a command line, so prefer --auth-token-file",
    )
    token.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="read the token from FILE (surrounding whitespace removed; env"
        " MAGNETAR_AUTH_TOKEN_FILE): better than --auth-token, which shows it in the process"
        " list",
    )
    group.add_argument(
        "--tls-trust-certs-file",
        metavar="FILE",
        help="PEM file of the CA certificates that sign the brokers' certificates (env"
        " MAGNETAR_TLS_TRUST_CERTS_FILE; default: the system's CAs)",
    )
    group.add_argument(
        "--tls-cert-file",
        metavar="FILE",
        help="a client certificate (PEM) to present over TLS: without a token its common name is"
        " the role; with one, it only opens connections to brokers that require mutual TLS;"
        " needs --tls-key-file (env MAGNETAR_TLS_CERT_FILE)",
    )
    group.add_argument(
        "--tls-key-file",
        metavar="FILE",
        help="the private key (PEM) of --tls-cert-file (env MAGNETAR_TLS_KEY_FILE)",
    )
    group.add_argument(
        "--tls-allow-hostname-mismatch",
        action="store_true",
        help="accept a broker certificate that does not name the host connected to (it must"
        " still be signed by a trusted CA); for tests, not for production",
    )
    parser.set_defaults(credentials_parser=parser)


def credential_flags_given(args: argparse.Namespace) -> list[str]:
    """The credential and TLS flags given on the command line (not from the environment)."""
    given = [flag for flag, dest, _ in _CREDENTIAL_FLAGS if getattr(args, dest, None) is not None]
    if getattr(args, "tls_allow_hostname_mismatch", False):
        given.append("--tls-allow-hostname-mismatch")
    return given


def _credential(args: argparse.Namespace, dest: str) -> tuple[str | None, str]:
    """The value of one credential option and where it came from (the flag, or the variable
    when the flag was not given)."""
    flag, _, variable = next(option for option in _CREDENTIAL_FLAGS if option[1] == dest)
    value: str | None = getattr(args, dest, None)
    if value is not None:
        return value, flag
    return os.environ.get(variable) or None, variable


def _read_token_file(text: str, source: str) -> str:
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415 - keep --help fast

    path = Path(text.removeprefix("file://"))
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise InvalidArgumentError(f"the token file {path} ({source}) does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not text"
        raise InvalidArgumentError(
            f"the token file {path} ({source}) cannot be read: {reason}"
        ) from None
    if not token:
        raise InvalidArgumentError(f"the token file {path} ({source}) is empty")
    return token


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword settings of ``magnetar.Client``/``AdminClient`` (and their asyncio cores)
    that the credential options ask for: ``authentication``, ``tls_trust_certs_file_path`` and
    ``tls_validate_hostname``.

    A token file is read now, once. A client certificate alone authenticates; with a token it
    is the transport's (``tls_certificate_file_path``). Contradictions are usage errors (exit
    2): a certificate without its key, both token variables.
    A file that cannot be read is an :class:`InvalidArgumentError` naming it and the option.
    """
    parser: argparse.ArgumentParser = args.credentials_parser
    token, token_source = _credential(args, "auth_token")
    token_file, token_file_source = _credential(args, "auth_token_file")
    if token is not None and token_file is not None:
        # only possible from the environment: the flags exclude each other in argparse
        if token_source.startswith("--"):
            token_file = None
        elif token_file_source.startswith("--"):
            token = None
        else:
            parser.error(
                "MAGNETAR_AUTH_TOKEN and MAGNETAR_AUTH_TOKEN_FILE are both set; unset one (or"
                " give --auth-token or --auth-token-file, which wins)"
            )
    cert_file, cert_source = _credential(args, "tls_cert_file")
    key_file, key_source = _credential(args, "tls_key_file")
    if token is not None and not token.strip():
        parser.error(f"{token_source} is empty")
    if (cert_file is None) != (key_file is None):
        given, missing = (cert_source, "key") if key_file is None else (key_source, "cert")
        by_flag = given.startswith("--")
        other = f"--tls-{missing}-file" if by_flag else f"MAGNETAR_TLS_{missing.upper()}_FILE"
        parser.error(f"{given} needs {other} too (a client certificate and its private key)")

    from magnetar.aio.auth import (  # noqa: PLC0415 - keep --help fast
        Authentication,
        AuthenticationTLS,
        AuthenticationToken,
    )
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415

    authentication: Authentication | None = None
    if token_file is not None:
        authentication = AuthenticationToken(_read_token_file(token_file, token_file_source))
    elif token is not None:
        authentication = AuthenticationToken(token)
    transport: dict[str, Any] = {}
    if cert_file is not None and key_file is not None:
        files = []
        for text, what, source in (
            (cert_file, "certificate", cert_source),
            (key_file, "key", key_source),
        ):
            path = Path(text.removeprefix("file://"))
            if not path.is_file():
                raise InvalidArgumentError(
                    f"the client {what} file {path} ({source}) does not exist"
                )
            files.append(path)
        if authentication is None:
            authentication = AuthenticationTLS(*files)  # the certificate is the role
        else:
            # with a token, the certificate only opens connections to brokers that require
            # mutual TLS; the token's role counts
            transport = {
                "tls_certificate_file_path": str(files[0]),
                "tls_private_key_file_path": str(files[1]),
            }
    trust_file, _ = _credential(args, "tls_trust_certs_file")
    return {
        "authentication": authentication,
        "tls_trust_certs_file_path": trust_file.removeprefix("file://") if trust_file else None,
        "tls_validate_hostname": not getattr(args, "tls_allow_hostname_mismatch", False),
        **transport,
    }


def error_text(error: MagnetarError) -> str:
    """An error as a client command prints it: its message, and for a TLS failure the flags
    that set what the library's message names (``tls_trust_certs_file_path`` ...)."""
    from magnetar.common.errors import TlsError  # noqa: PLC0415 - keep --help fast

    if isinstance(error, TlsError):
        return (
            f"{error.message} (the command's TLS options: --tls-trust-certs-file FILE,"
            " --tls-allow-hostname-mismatch, --tls-cert-file FILE with --tls-key-file FILE)"
        )
    return error.message


def table(rows: list[dict[str, object]], columns: list[str]) -> str:
    """``rows`` as a text table with upper-case headers; ``(none)`` when empty."""
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)
