"""``magnetar tokens``: token keys and tokens, as Pulsar's ``pulsar tokens`` makes them.

- ``create-secret-key``: a secret key (HS256/384/512) to a file, or printed in base64;
- ``create-key-pair``: a private key (signs) and a public key (brokers verify with it);
- ``create``: a token for a role, signed with either, printed on stdout and nowhere else;
- ``show``: a token's header and claims, not verified;
- ``validate``: whether a broker holding a key would accept a token, and the role it names.

Key files are written owner-only (0600; a public key 0644), never over an existing file unless
``--force`` (then replaced in one step, so a reader never sees half a key). A key or a token
never appears in an error, a log line or ``--help``: errors name the file or the flag at fault.
The work is :mod:`magnetar.common.security.tokens`; ``validate`` asks the brokers' own
:class:`~magnetar.common.security.authentication.AuthenticationService`, so its verdict and its
reasons are a broker's. Key paths may be written ``file:///path``, as Pulsar takes them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from magnetar.cli.support import EXIT_OK

__all__ = ["add_tokens_command", "run_tokens"]

SUMMARY = "create token keys and tokens; show and validate tokens"

# ``magnetar.common.security.tokens`` imports PyJWT and cryptography; these copies keep
# ``magnetar --help`` fast (a test checks they agree)
SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
_RESERVED_HEADERS = frozenset({"alg"})
"""Header names ``--headers`` may not set: ``alg`` is ``--signature-algorithm``'s (and
``alg=none`` would make an unsigned token)."""


# --- argument types ------------------------------------------------------------------------------


def _path(text: str) -> Path:
    """A file path, plain or ``file:///path``."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty one")
    return Path(text.removeprefix("file://"))


def _duration_s(text: str) -> int:
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415 - keep --help fast
    from magnetar.common.security.tokens import parse_duration_s  # noqa: PLC0415

    try:
        return parse_duration_s(text)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key in _RESERVED_HEADERS:
        raise argparse.ArgumentTypeError(
            f"the {key!r} header is set by -a/--signature-algorithm, not --headers"
        )
    return key, value


# --- parsers -------------------------------------------------------------------------------------


def _command(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    handler: Callable[[argparse.Namespace], int],
    description: str,
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=summary, description=description)
    parser.set_defaults(tokens_handler=handler, tokens_parser=parser)
    return parser


def _add_token_source(parser: argparse.ArgumentParser) -> None:
    """The token to read: an argument, ``-i/--stdin`` or ``-f/--token-file`` (one of them)."""
    parser.add_argument(
        "token",
        nargs="?",
        metavar="TOKEN",
        help="the token (other users of this machine may see a command line: -f or -i keep it"
        " out of it)",
    )
    parser.add_argument("-i", "--stdin", action="store_true", help="read the token from stdin")
    parser.add_argument(
        "-f", "--token-file", type=_path, metavar="FILE", help="read the token from FILE"
    )


def add_tokens_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``tokens`` parser and its actions."""
    tokens = commands.add_parser(
        "tokens",
        help=SUMMARY,
        description="Make the keys that sign tokens and the tokens themselves (JWT, as Pulsar"
        " makes them), and read or check a token. A token stands for a role: its subject.",
    )
    what = tokens.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)

    secret = _command(
        what,
        "create-secret-key",
        "a new secret key (HS256/384/512): 32 random bytes",
        _create_secret_key,
        "Make a secret key: 32 random bytes. The same key file signs tokens (tokens create"
        " --secret-key) and verifies them (broker --token-secret-key-file): the file's bytes, as"
        " they are, are the key. Without --output the key is printed in base64 on stdout, for a"
        " secret store.",
    )
    secret.add_argument(
        "-o",
        "--output",
        type=_path,
        metavar="FILE",
        help="write the key to FILE, readable by its owner only (0600)",
    )
    secret.add_argument(
        "-b",
        "--base64",
        action="store_true",
        help="write the key's base64 text instead of its raw bytes (the text is then the key)",
    )
    secret.add_argument("--force", action="store_true", help="replace FILE if it exists")

    pair = _command(
        what,
        "create-key-pair",
        "a new private key (signs tokens) and its public key (brokers verify with it)",
        _create_key_pair,
        "Make a key pair: the private key signs tokens (tokens create --private-key), brokers"
        " hold only the public key (broker --token-public-key-file). PEM files; the private key"
        " is readable by its owner only (0600).",
    )
    pair.add_argument(
        "--output-private-key", type=_path, required=True, metavar="FILE", help="the private key"
    )
    pair.add_argument(
        "--output-public-key", type=_path, required=True, metavar="FILE", help="the public key"
    )
    pair.add_argument(
        "-a",
        "--signature-algorithm",
        choices=ASYMMETRIC_ALGORITHMS,
        default="RS256",
        metavar="ALG",
        help=f"one of {', '.join(ASYMMETRIC_ALGORITHMS)} (default RS256: a 2048-bit RSA key;"
        " ES*: an EC key)",
    )
    pair.add_argument("--force", action="store_true", help="replace files that exist")

    create = _command(
        what,
        "create",
        "a token for a role, signed with a secret or private key (printed on stdout)",
        _create,
        "Make a token for the role --subject, signed with a secret key or a private key, and"
        " print it on stdout (one line, nothing else).",
    )
    key = create.add_mutually_exclusive_group(required=True)
    key.add_argument(
        "-sk", "--secret-key", type=_path, metavar="FILE", help="sign with this secret key file"
    )
    key.add_argument(
        "-pk", "--private-key", type=_path, metavar="FILE", help="sign with this private key file"
    )
    create.add_argument(
        "-s", "--subject", required=True, metavar="ROLE", help="the role the token stands for"
    )
    create.add_argument(
        "-e",
        "--expiry-time",
        type=_duration_s,
        metavar="DURATION",
        help="valid for this long: 30m, 12h, 7d, 1y or seconds (default: never expires)",
    )
    create.add_argument(
        "-a",
        "--signature-algorithm",
        choices=SECRET_ALGORITHMS + ASYMMETRIC_ALGORITHMS,
        metavar="ALG",
        help=f"one of {', '.join(SECRET_ALGORITHMS + ASYMMETRIC_ALGORITHMS)}; default: HS256"
        " with a secret key, RS256 with an RSA key, ES256/384/512 with an EC key (by its curve)",
    )
    create.add_argument(
        "--audience", metavar="AUD", help="the aud claim (for brokers with --token-audience)"
    )
    create.add_argument(
        "--claim",
        default="sub",
        metavar="NAME",
        help="the claim that holds the role (the brokers' --token-auth-claim; default sub)",
    )
    create.add_argument(
        "--headers",
        type=_header,
        nargs="+",
        action="extend",
        default=[],
        metavar="K=V",
        help="extra header fields, such as kid=2026-11 (repeatable)",
    )

    show = _command(
        what,
        "show",
        "a token's header and claims as JSON (not verified)",
        _show,
        "Print a token's header and claims as JSON, and its expiry (exp) as an ISO time too."
        " The signature is not checked: use validate for that.",
    )
    _add_token_source(show)

    validate = _command(
        what,
        "validate",
        "check a token's signature and expiry with a key; print its role",
        _validate,
        "Check a token as a broker holding the key would: signature, expiry (exp, nbf), and"
        " with --audience the audience. Prints the role on stdout; an invalid token is an error"
        " (exit 1) saying why.",
    )
    _add_token_source(validate)
    key = validate.add_mutually_exclusive_group(required=True)
    key.add_argument("-sk", "--secret-key", type=_path, metavar="FILE", help="the secret key file")
    key.add_argument(
        "-pk", "--public-key", type=_path, metavar="FILE", help="the public key file (PEM or DER)"
    )
    validate.add_argument(
        "--audience",
        metavar="AUD",
        help="the token's aud claim must name AUD (default: not checked)",
    )
    validate.add_argument(
        "--claim", default="sub", metavar="NAME", help="the claim that holds the role (default sub)"
    )


# --- running -------------------------------------------------------------------------------------


def run_tokens(args: argparse.Namespace) -> int:
    """Run a ``tokens`` action; its exit status. Errors are :class:`InvalidArgumentError`
    (``magnetar.cli`` prints their message and exits 1) or usage errors (exit 2)."""
    handler: Callable[[argparse.Namespace], int] = args.tokens_handler
    return handler(args)


def _refuse(message: str) -> Exception:
    from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415

    return InvalidArgumentError(message)


def _open_new(path: Path, mode: int) -> int:
    """A new file at ``path`` with exactly ``mode``; FileExistsError when there is one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # exactly: the umask may have taken bits a public key needs
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write(path: Path, data: bytes, *, mode: int, force: bool, what: str) -> None:
    """Write ``data`` to ``path`` (created with ``mode``). Without ``force`` an existing file is
    an error; with it the file is replaced in one step (through a temporary file beside it, so
    an old file's looser mode does not carry over)."""
    target = path
    if force:
        target = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = _open_new(target, mode)
    except FileExistsError:
        if force:
            raise _refuse(f"cannot write the {what} {path}: {target} is in the way") from None
        raise _refuse(f"the {what} {path} exists already; give --force to replace it") from None
    except OSError as e:
        raise _refuse(f"cannot write the {what} {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if force:
            target.replace(path)
    except OSError as e:
        target.unlink(missing_ok=True)
        raise _refuse(f"cannot write the {what} {path}: {e.strerror or e}") from None


def _check_new(path: Path, *, force: bool, what: str) -> None:
    """Refuse early what :func:`_write` would refuse, so that no file of a pair is written
    when the other cannot be."""
    if path.is_dir():
        raise _refuse(f"the {what} {path} is a directory; give a file name")
    if not force and os.path.lexists(path):
        raise _refuse(f"the {what} {path} exists already; give --force to replace it")
    if not path.parent.is_dir():
        raise _refuse(f"cannot write the {what} {path}: the directory {path.parent} does not exist")


def _create_secret_key(args: argparse.Namespace) -> int:
    from magnetar.common.security.tokens import create_secret_key  # noqa: PLC0415

    if args.output is None:
        if args.force:
            args.tokens_parser.error("--force goes with -o/--output")
        # base64 even without --base64: raw bytes would garble a terminal
        print(create_secret_key(as_base64=True).decode("ascii"))
        return EXIT_OK
    _check_new(args.output, force=args.force, what="secret key file")
    _write(
        args.output,
        create_secret_key(as_base64=args.base64),
        mode=0o600,
        force=args.force,
        what="secret key file",
    )
    print(
        f"wrote a secret key to {args.output} (owner-only, 0600); brokers verify tokens with it"
        f" (--token-secret-key-file {args.output}), tokens are made with: magnetar tokens create"
        f" --secret-key {args.output} --subject ROLE"
    )
    return EXIT_OK


def _create_key_pair(args: argparse.Namespace) -> int:
    from magnetar.common.security.tokens import create_key_pair  # noqa: PLC0415

    private_path: Path = args.output_private_key
    public_path: Path = args.output_public_key
    if private_path.resolve() == public_path.resolve():
        args.tokens_parser.error("--output-private-key and --output-public-key name one file")
    _check_new(private_path, force=args.force, what="private key file")
    _check_new(public_path, force=args.force, what="public key file")
    private, public = create_key_pair(args.signature_algorithm)
    _write(private_path, private, mode=0o600, force=args.force, what="private key file")
    try:
        _write(public_path, public, mode=0o644, force=args.force, what="public key file")
    except Exception:
        if not args.force:  # the private key is ours, just made: no half pair left behind
            private_path.unlink(missing_ok=True)
        raise
    print(
        f"wrote an {args.signature_algorithm} key pair: the private key {private_path}"
        f" (owner-only, 0600) signs tokens (magnetar tokens create --private-key"
        f" {private_path} --subject ROLE); brokers verify them with the public key {public_path}"
        f" (--token-public-key-file {public_path})"
    )
    return EXIT_OK


def _create(args: argparse.Namespace) -> int:
    from magnetar.common.security.tokens import create_token, load_signing_key  # noqa: PLC0415

    if args.secret_key is not None:
        path: Path = args.secret_key
        key = load_signing_key(path, secret=True)
        if key.key.lstrip().startswith(b"-----BEGIN"):
            raise _refuse(
                f"the secret key file {path} holds a PEM key; sign with a private key through"
                " --private-key (a secret key is the bytes tokens create-secret-key writes)"
            )
    else:
        key = load_signing_key(args.private_key, secret=False)
    token = create_token(
        key,
        args.subject,
        expiry_s=args.expiry_time,
        algorithm=args.signature_algorithm,
        audience=args.audience,
        claim=args.claim,
        headers=dict(args.headers),
    )
    print(token)
    return EXIT_OK


def _read_token(args: argparse.Namespace) -> str:
    """The token given as an argument, on stdin or in a file; never quoted in an error."""
    sources = [args.token is not None, args.stdin, args.token_file is not None]
    if sum(sources) != 1:
        args.tokens_parser.error(
            "give the token in one way: as an argument, with -i/--stdin or with -f/--token-file"
        )
    if args.token is not None:
        token: str = args.token.strip()
        where = "the TOKEN argument"
    elif args.stdin:
        if sys.stdin.isatty():
            print("paste the token, then press Enter and Ctrl-D", file=sys.stderr)
        token = sys.stdin.read().strip()
        where = "stdin"
    else:
        path: Path = args.token_file
        where = f"the token file {path}"
        try:
            token = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise _refuse(f"{where} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "it is not text"
            raise _refuse(f"{where} cannot be read: {reason}") from None
    if not token:
        raise _refuse(f"{where} holds no token")
    return token


def _iso(seconds: float) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    text = datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def _show(args: argparse.Namespace) -> int:
    from magnetar.common.security.tokens import read_token_unverified  # noqa: PLC0415

    header, claims = read_token_unverified(_read_token(args))
    document: dict[str, Any] = {"header": header, "claims": claims}
    exp = claims.get("exp")
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        document["expires"] = _iso(exp)
        document["expired"] = exp <= time.time()
    print(json.dumps(document, indent=2))
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    from magnetar.common.errors import AuthenticationError  # noqa: PLC0415
    from magnetar.common.log import configure_logging  # noqa: PLC0415
    from magnetar.common.security.authentication import AuthenticationService  # noqa: PLC0415
    from magnetar.common.security.config import AuthenticationSettings  # noqa: PLC0415
    from magnetar.common.security.tokens import load_verifying_keys  # noqa: PLC0415

    # the service logs each refusal as a warning (without the token); here the error says it
    configure_logging(mode="console", level="error", stream=sys.stderr)
    token = _read_token(args)
    secret = args.secret_key is not None
    path: Path = args.secret_key if secret else args.public_key
    load_verifying_keys(path, secret=secret)  # its errors name the file and what is wrong
    settings = AuthenticationSettings(
        authentication_enabled=True,
        token_secret_key_file=path if secret else None,
        token_public_key_file=None if secret else path,
        token_auth_claim=args.claim,
        token_audience=args.audience,
    )
    service = AuthenticationService(settings, component="key file")
    try:
        principal = service.authenticate_token(token, "magnetar tokens validate")
    except AuthenticationError as e:
        raise _refuse(f"the token is not valid with the key in {path}: {e.message}") from None
    print(principal.role)
    return EXIT_OK
