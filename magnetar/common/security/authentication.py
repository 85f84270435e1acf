"""Authentication: from what a connection presents to the role it acts as.

Every server adapter (the broker's gRPC services today, Pulsar's protocol and the bookies next)
gathers a call's :class:`Credentials` and asks :class:`AuthenticationService` for its
:class:`Principal`, once per call or stream, never per message. Two providers, Pulsar's:

- ``token``: a JWT (``authorization: Bearer <token>``), verified with the secret key or the public
  key(s); the role is its ``token_auth_claim`` (``sub``). Verified tokens are remembered (a small
  cache keyed by the token, checked against its expiry each time), so a client that reconnects
  often costs one signature check, not one per call.
- ``tls``: the common name of a client certificate that the TLS handshake already verified
  against ``tls_trust_certs_file``.

A refusal is an :class:`AuthenticationError` saying what was wrong (no credentials, bad
signature, expired, no role) and never holding the token. Every refusal is counted by reason
(:attr:`AuthenticationService.failures`, exported as a metric) and logged with the peer's
address, at most :data:`FAILURE_LOG_PER_S` lines a second so that a flood of bad attempts cannot
flood the log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections import Counter, OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import jwt
import structlog

from magnetar.common.errors import AuthenticationError, InvalidArgumentError, InvalidConfigError
from magnetar.common.security.config import AuthenticationSettings
from magnetar.common.security.tokens import VerifyingKey, load_verifying_keys

__all__ = [
    "ANONYMOUS",
    "FAILURE_LOG_PER_S",
    "AuthenticationService",
    "Credentials",
    "Principal",
    "RefusalLog",
]

log = structlog.get_logger("magnetar.security")

_E = TypeVar("_E", bound=AuthenticationError)

FAILURE_LOG_PER_S = 10
"""Refusals logged per second at most; the rest are counted and reported in the next line."""
_CACHE_ENTRIES = 4096
_KEY_CHECK_INTERVAL_S = 1.0
"""How often, at most, the key files are looked at for a change."""


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who a call acts as."""

    role: str
    """The role ("" when authentication is off: anyone)."""
    method: str
    """``token``, ``tls``, or ``none`` when authentication is off."""
    expires_at_ms: int | None = None
    """When the credentials stop being valid (a token's exp); None: never."""

    @property
    def anonymous(self) -> bool:
        return self.method == "none"


ANONYMOUS = Principal(role="", method="none")
"""Every caller, when authentication is off."""


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """What one call or stream presented."""

    peer: str
    """The caller's address, for logs (``ipv4:10.0.0.7:51234``)."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """A bearer token, or None."""
    certificate_common_name: str | None = None
    """The common name of the client certificate the TLS handshake verified, or None."""


class _KeyFile:
    """Verifying key(s) from one file, re-read when the file changes."""

    def __init__(self, path: Path, *, secret: bool) -> None:
        self.path = path
        self.secret = secret
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self.keys: tuple[VerifyingKey, ...] = ()
        self._lock = threading.Lock()
        self.reload(force=True)

    def _file_stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, *, force: bool = False) -> bool:
        """Re-read the file if it changed; whether the keys changed. A file that cannot be read
        now (mid-rotation) keeps the old keys; at start it fails the start."""
        now = time.monotonic()
        if not force and now - self._checked_at < _KEY_CHECK_INTERVAL_S:
            return False
        with self._lock:
            self._checked_at = now
            try:
                stamp = self._file_stamp()
                if stamp == self._stamp:
                    return False
                keys = load_verifying_keys(self.path, secret=self.secret)
            except (OSError, InvalidArgumentError) as e:
                if force:
                    raise InvalidConfigError(
                        f"cannot load the token key: {e}", context={"file": str(self.path)}
                    ) from None
                log.warning("token_key_reload_failed", file=str(self.path), error=str(e))
                return False
            self._stamp = stamp
            changed = bool(self.keys)
            self.keys = keys
        if changed:
            log.info("token_key_reloaded", file=str(self.path), keys=len(keys))
        return changed


class _StaticTokens:
    """Static tokens by the SHA-256 of each, from ``token_static_file``, re-read when it
    changes (looked at once a second at most)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._checked_at = -1.0
        self.roles: dict[str, str] = {}
        self._load(force=True)

    def _load(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < _KEY_CHECK_INTERVAL_S:
            return
        self._checked_at = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            roles = _parse_static_tokens(self.path.read_text(encoding="utf-8"), self.path)
        except (OSError, ValueError, InvalidConfigError) as e:
            if force:
                raise InvalidConfigError(
                    f"cannot load the static tokens: {e}", context={"file": str(self.path)}
                ) from None
            log.warning("static_tokens_reload_failed", file=str(self.path), error=str(e))
            return
        self._stamp, self.roles = stamp, roles

    def role_of(self, digest: bytes) -> str | None:
        self._load()
        return self.roles.get(digest.hex())


def _parse_static_tokens(text: str, path: Path) -> dict[str, str]:
    roles: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if (
            len(parts) != 2
            or len(parts[1]) != 64
            or not all(c in "0123456789abcdef" for c in parts[1].lower())
        ):
            raise InvalidConfigError(
                f"{path}, line {number}: expected 'ROLE SHA256-HEX' (64 hex digits)",
                context={"file": str(path)},
            )
        roles[parts[1].lower()] = parts[0]
    return roles


class RefusalLog:
    """Warnings about refusals, at most ``per_s`` a second; the rest are counted and the count
    rides on the next line that is logged (``suppressed_since_last``)."""

    def __init__(self, per_s: int = FAILURE_LOG_PER_S) -> None:
        self.per_s = per_s
        self._window = 0
        self._in_window = 0
        self._suppressed = 0

    def warn(self, event: str, **facts: object) -> None:
        self._emit(log.warning, event, facts)

    def info(self, event: str, **facts: object) -> None:
        self._emit(log.info, event, facts)

    def _emit(self, method: Any, event: str, facts: dict[str, object]) -> None:
        second = int(time.monotonic())
        if second != self._window:
            self._window = second
            self._in_window = 0
        if self._in_window >= self.per_s:
            self._suppressed += 1
            return
        self._in_window += 1
        if self._suppressed:
            facts["suppressed_since_last"] = self._suppressed
            self._suppressed = 0
        method(event, **facts)


def _token_key(token: str) -> bytes:
    # the cache holds a digest, so a memory dump of it holds no usable token
    return hashlib.sha256(token.encode()).digest()


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


class AuthenticationService:
    """Turns :class:`Credentials` into a :class:`Principal`, or refuses them."""

    def __init__(self, settings: AuthenticationSettings, *, component: str = "broker") -> None:
        self.settings = settings
        self.enabled = settings.authentication_enabled
        self.component = component
        self.providers = frozenset(settings.authentication_providers)
        self.superusers = frozenset(settings.superuser_roles)
        self.failures: Counter[str] = Counter()
        """Refusals by reason, since start (the ``..._authentication_failures`` metric)."""
        self._failure_log = RefusalLog(FAILURE_LOG_PER_S)
        self._cache: OrderedDict[bytes, Principal] = OrderedDict()
        self._static = (
            _StaticTokens(settings.token_static_file)
            if settings.token_static_file is not None
            else None
        )
        self._key_file: _KeyFile | None = None
        if settings.token_secret_key_file is not None:
            self._key_file = _KeyFile(settings.token_secret_key_file, secret=True)
        elif settings.token_public_key_file is not None:
            self._key_file = _KeyFile(settings.token_public_key_file, secret=False)

    def is_superuser(self, principal: Principal) -> bool:
        return principal.anonymous or principal.role in self.superusers

    # --- authenticate -------------------------------------------------------------------------

    def authenticate(self, credentials: Credentials) -> Principal:
        """The principal of a call; :class:`AuthenticationError` when it cannot be trusted.

        A token wins over a certificate: a client that sends a token over mutual TLS acts as the
        token's role (Pulsar's clients choose one method too)."""
        if not self.enabled:
            return ANONYMOUS
        if credentials.token is not None and "token" in self.providers:
            return self.authenticate_token(credentials.token, credentials.peer)
        if credentials.certificate_common_name is not None and "tls" in self.providers:
            if not credentials.certificate_common_name:
                raise self._refuse(
                    "no_role", credentials.peer, "the client certificate has no common name"
                )
            return Principal(credentials.certificate_common_name, "tls")
        if credentials.token is not None:
            raise self._refuse(
                "method_not_enabled",
                credentials.peer,
                f"this {self.component} does not accept tokens (authentication providers:"
                f" {', '.join(sorted(self.providers))})",
            )
        wanted = " or ".join(
            {"token": "a token", "tls": "a client certificate"}[p] for p in sorted(self.providers)
        )
        raise self._refuse(
            "no_credentials",
            credentials.peer,
            f"authentication is required: no credentials were presented (give {wanted})",
        )

    def authenticate_token(self, token: str, peer: str) -> Principal:
        """The principal of a bearer token (also for a stream's refreshed token)."""
        if self._key_file is not None and self._key_file.reload():
            self._cache.clear()  # a rotated key: tokens of the old one must be checked again
        key = _token_key(token)
        if self._static is not None:
            role = self._static.role_of(key)
            if role is not None:
                return Principal(role, "token")
        cached = self._cache.get(key)
        now_ms = int(time.time() * 1000)
        if cached is not None:
            if cached.expires_at_ms is None or cached.expires_at_ms > now_ms:
                self._cache.move_to_end(key)
                return cached
            del self._cache[key]
        principal = self._verify(token, peer)
        self._cache[key] = principal
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return principal

    def _verify(self, token: str, peer: str) -> Principal:
        if self._key_file is None:
            if self._static is not None:
                raise self._refuse("bad_signature", peer, "the token is not a known token")
            raise self._refuse("method_not_enabled", peer, "no token key is configured")
        if not token:
            raise self._refuse("malformed", peer, "the token is empty")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise self._refuse("malformed", peer, "the token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        keys = [k for k in self._key_file.keys if algorithm in k.algorithms]
        if not keys:
            allowed = sorted({a for k in self._key_file.keys for a in k.algorithms})
            raise self._refuse(
                "bad_signature",
                peer,
                f"the token is signed with {algorithm!r}; this {self.component} accepts"
                f" {', '.join(allowed)}",
            )
        settings = self.settings
        claim = settings.token_auth_claim
        options: jwt.types.Options = {"require": [claim]}
        if settings.token_audience is None:
            options["verify_aud"] = False
        for verifying in keys:
            try:
                claims = jwt.decode(
                    token,
                    verifying.key,
                    algorithms=list(verifying.algorithms),
                    audience=settings.token_audience,
                    options=options,
                )
            except jwt.InvalidSignatureError:
                continue  # another key of a rotation may verify it
            except jwt.ExpiredSignatureError:
                expired = _unverified_exp(token)
                when = f" at {_when(expired * 1000)}" if expired else ""
                raise self._refuse("expired", peer, f"the token expired{when}") from None
            except jwt.ImmatureSignatureError:
                raise self._refuse(
                    "not_yet_valid", peer, "the token is not valid yet (nbf)"
                ) from None
            except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as e:
                if isinstance(e, jwt.MissingRequiredClaimError) and e.claim == claim:
                    raise self._refuse(
                        "no_role", peer, f"the token names no role (no {claim!r} claim)"
                    ) from None
                raise self._refuse(
                    "wrong_audience",
                    peer,
                    f"the token is not for audience {settings.token_audience!r}",
                ) from None
            except jwt.InvalidTokenError:
                raise self._refuse(
                    "malformed", peer, "the token is not a well-formed JWT"
                ) from None
            role = claims.get(claim)
            if not isinstance(role, str) or not role:
                raise self._refuse(
                    "no_role", peer, f"the token's {claim!r} claim is not a role name"
                )
            exp = claims.get("exp")
            expires = int(exp * 1000) if isinstance(exp, int | float) else None
            return Principal(role, "token", expires)
        raise self._refuse(
            "bad_signature",
            peer,
            "the token's signature does not match this "
            f"{self.component}'s {'secret' if self._key_file.secret else 'public'} key"
            " (signed with another key?)",
        )

    def _refuse(self, reason: str, peer: str, message: str) -> AuthenticationError:
        return self.refuse(AuthenticationError, reason, peer, message)

    def refuse(self, error: type[_E], reason: str, peer: str, message: str) -> _E:
        """Count and log a refusal for ``reason``; the error (of class ``error``) to raise."""
        self.failures[reason] += 1
        self._failure_log.warn(
            "authentication_failed", reason=reason, peer=peer, component=self.component
        )
        return error(message, context={"reason": reason})


def _unverified_exp(token: str) -> int | None:
    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    except jwt.InvalidTokenError:
        return None
    return int(exp) if isinstance(exp, int | float) else None
