"""JWT tokens as Pulsar makes them: keys, signing, reading a token's claims.

Two kinds of key sign a token:

- a **secret key** (HS256, HS384, HS512): the same bytes sign and verify. A key file's bytes,
  exactly as stored, are the key (``magnetar tokens create-secret-key`` writes 32 random bytes;
  with ``--base64`` their base64 text, which is then the key as it stands);
- a **key pair** (RS256/384/512 on an RSA key, ES256/384/512 on an EC key): the private key
  signs, brokers hold only the public key. PEM and DER files are both read.

The role is a claim of the token (``sub`` by default, Pulsar's ``tokenAuthClaim``). A token may
carry ``exp`` (expiry), ``nbf`` (not before) and ``aud`` (audience). This module never logs a key
or a token, and its errors never hold one.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from magnetar.common.errors import InvalidArgumentError

__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "SECRET_ALGORITHMS",
    "SigningKey",
    "TokenFile",
    "VerifyingKey",
    "create_key_pair",
    "create_secret_key",
    "create_token",
    "load_signing_key",
    "load_verifying_key",
    "load_verifying_keys",
    "parse_duration_s",
    "read_token_unverified",
]

SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
ASYMMETRIC_ALGORITHMS = RSA_ALGORITHMS + EC_ALGORITHMS
SECRET_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
"""A secret key as long as its algorithm's hash (RFC 7518 3.2): 256 bits for HS256, as
``pulsar tokens create-secret-key`` makes."""

_EC_CURVES: dict[str, type[ec.SECP256R1 | ec.SECP384R1 | ec.SECP521R1]] = {
    "ES256": ec.SECP256R1,
    "ES384": ec.SECP384R1,
    "ES512": ec.SECP521R1,
}
_DURATION = re.compile(r"^(?P<amount>\d+)(?P<unit>s|m|h|d|w|y)?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}

KeyKind = Literal["secret", "rsa", "ec"]


@dataclasses.dataclass(frozen=True)
class SigningKey:
    """A key that signs tokens: secret bytes or a private key, with its algorithms."""

    kind: KeyKind
    key: Any = dataclasses.field(repr=False)
    algorithms: tuple[str, ...]

    @property
    def default_algorithm(self) -> str:
        return self.algorithms[0]


@dataclasses.dataclass(frozen=True)
class VerifyingKey:
    """A key that verifies tokens: secret bytes or a public key, and the algorithms it allows
    (never an HMAC algorithm on a public key: that is the classic algorithm-confusion hole)."""

    kind: KeyKind
    key: Any = dataclasses.field(repr=False)
    algorithms: tuple[str, ...]


def parse_duration_s(text: str) -> int:
    """``30s``, ``15m``, ``1h``, ``7d``, ``2w``, ``1y`` or plain seconds, as seconds (> 0)."""
    match = _DURATION.match(text.strip())
    if match is None or int(match["amount"]) <= 0:
        raise InvalidArgumentError(
            f"a duration is a positive number with an optional unit s, m, h, d, w or y"
            f" (e.g. 1h, 30d), got {text!r}"
        )
    return int(match["amount"]) * _UNIT_S[match["unit"] or "s"]


# --- keys ---------------------------------------------------------------------------------------


def create_secret_key(algorithm: str = "HS256", *, as_base64: bool = False) -> bytes:
    """A new random secret key for ``algorithm`` (what to write to the key file)."""
    size = SECRET_KEY_BYTES.get(algorithm)
    if size is None:
        raise InvalidArgumentError(
            f"a secret key is for one of {', '.join(SECRET_ALGORITHMS)}, got {algorithm!r}"
        )
    key = secrets.token_bytes(size)
    return base64.b64encode(key) if as_base64 else key


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new ``(private_key_pem, public_key_pem)`` for ``algorithm`` (RS* or ES*)."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm in EC_ALGORITHMS:
        private = ec.generate_private_key(_EC_CURVES[algorithm]())
    else:
        raise InvalidArgumentError(
            f"a key pair is for one of {', '.join(ASYMMETRIC_ALGORITHMS)}, got {algorithm!r}"
        )
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def _read(path: Path | str, what: str) -> bytes:
    path = Path(str(path).removeprefix("file://"))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"{what} {path} does not exist", context={"file": path}
        ) from None
    except OSError as e:
        raise InvalidArgumentError(
            f"{what} {path} cannot be read: {e.strerror or e}", context={"file": path}
        ) from None
    if not data:
        raise InvalidArgumentError(f"{what} {path} is empty", context={"file": path})
    return data


def _ec_algorithm(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> str:
    for algorithm, curve in _EC_CURVES.items():
        if isinstance(key.curve, curve):
            return algorithm
    raise InvalidArgumentError(
        f"EC keys for tokens use P-256, P-384 or P-521, not {key.curve.name}"
    )


def load_signing_key(path: Path | str, *, secret: bool) -> SigningKey:
    """The secret key (``secret=True``: the file's bytes) or private key (PEM or DER) in
    ``path``."""
    data = _read(path, "secret key file" if secret else "private key file")
    if secret:
        return SigningKey("secret", data, SECRET_ALGORITHMS)
    try:
        private = (
            serialization.load_pem_private_key(data, password=None)
            if data.lstrip().startswith(b"-----")
            else serialization.load_der_private_key(data, password=None)
        )
    except (ValueError, TypeError):
        raise InvalidArgumentError(
            f"private key file {path} holds no unencrypted RSA or EC private key (PEM or DER)",
            context={"file": path},
        ) from None
    if isinstance(private, rsa.RSAPrivateKey):
        return SigningKey("rsa", private, RSA_ALGORITHMS)
    if isinstance(private, ec.EllipticCurvePrivateKey):
        return SigningKey("ec", private, (_ec_algorithm(private),))
    raise InvalidArgumentError(
        f"private key file {path} holds a {type(private).__name__}; tokens use RSA or EC keys",
        context={"file": path},
    )


def _public_verifying_key(public: object, path: Path | str) -> VerifyingKey:
    if isinstance(public, rsa.RSAPublicKey):
        return VerifyingKey("rsa", public, RSA_ALGORITHMS)
    if isinstance(public, ec.EllipticCurvePublicKey):
        return VerifyingKey("ec", public, (_ec_algorithm(public),))
    raise InvalidArgumentError(
        f"public key file {path} holds a {type(public).__name__}; tokens use RSA or EC keys",
        context={"file": path},
    )


_PEM_PUBLIC_BEGIN = b"-----BEGIN PUBLIC KEY-----"
_PEM_PUBLIC_END = b"-----END PUBLIC KEY-----"


def load_verifying_keys(path: Path | str, *, secret: bool) -> tuple[VerifyingKey, ...]:
    """The key(s) that verify tokens: the secret key (``secret=True``: the file's bytes), or the
    public key(s) of a PEM or DER file. A PEM file may hold several public keys (old and new
    during a rotation); a token verified by any of them is good."""
    data = _read(path, "secret key file" if secret else "public key file")
    if secret:
        return (VerifyingKey("secret", data, SECRET_ALGORITHMS),)
    try:
        if data.lstrip().startswith(b"-----"):
            blocks = [
                _PEM_PUBLIC_BEGIN + block.split(_PEM_PUBLIC_END)[0] + _PEM_PUBLIC_END + b"\n"
                for block in data.split(_PEM_PUBLIC_BEGIN)[1:]
            ] or [data]
            publics = [serialization.load_pem_public_key(block) for block in blocks]
        else:
            publics = [serialization.load_der_public_key(data)]
    except (ValueError, TypeError):
        raise InvalidArgumentError(
            f"public key file {path} holds no RSA or EC public key (PEM or DER)",
            context={"file": path},
        ) from None
    return tuple(_public_verifying_key(public, path) for public in publics)


def load_verifying_key(path: Path | str, *, secret: bool) -> VerifyingKey:
    """The one key that verifies tokens (see :func:`load_verifying_keys`)."""
    return load_verifying_keys(path, secret=secret)[0]


# --- tokens -------------------------------------------------------------------------------------


def create_token(
    key: SigningKey,
    subject: str,
    *,
    expiry_s: int | None = None,
    algorithm: str | None = None,
    audience: str | None = None,
    claim: str = "sub",
    headers: Mapping[str, str] | None = None,
    now_s: float | None = None,
) -> str:
    """A signed token for role ``subject`` (in ``claim``), expiring ``expiry_s`` from now (never
    when None)."""
    if not subject:
        raise InvalidArgumentError("a token needs a subject: the role it stands for")
    chosen = algorithm or key.default_algorithm
    if chosen not in key.algorithms:
        raise InvalidArgumentError(
            f"a {key.kind} key signs with {', '.join(key.algorithms)}, not {chosen!r}"
        )
    claims: dict[str, Any] = {claim: subject}
    issued = int(time.time() if now_s is None else now_s)
    if expiry_s is not None:
        claims["exp"] = issued + expiry_s
    if audience:
        claims["aud"] = audience
    return jwt.encode(claims, key.key, algorithm=chosen, headers=dict(headers or {}))


def read_token_unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(header, claims)`` of a token, without checking its signature (``tokens show``)."""
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.DecodeError as e:
        raise InvalidArgumentError(f"not a JWT token: {e}") from None
    return dict(header), dict(claims)


class TokenFile:
    """A token kept in a file, read again when the file changes (checked at most once a
    second), so it can be rotated in place: a process's own credentials towards other
    components (a broker's to bookies and other brokers)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(str(path).removeprefix("file://"))
        self._token: str | None = None
        self._stamp: tuple[int, int] | None = None
        self._checked_at = -1.0
        self.read()  # a file that is not there fails the start, naming it

    def read(self) -> str:
        """The current token; the last good one while the file cannot be read."""
        now = time.monotonic()
        if self._token is not None and now - self._checked_at < 1.0:
            return self._token
        self._checked_at = now
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp or self._token is None:
                token = self.path.read_text(encoding="utf-8").strip()
                if not token:
                    raise InvalidArgumentError(f"the token file {self.path} is empty")
                self._token, self._stamp = token, stamp
        except (OSError, UnicodeDecodeError) as e:
            if self._token is None:
                raise InvalidArgumentError(
                    f"the token file {self.path} cannot be read: {getattr(e, 'strerror', e)}",
                    context={"file": str(self.path)},
                ) from None
        return self._token

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"
