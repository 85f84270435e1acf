"""How a client proves who it is: a token, or a TLS client certificate (pulsar-client's names).

::

    client = magnetar.Client(
        "magnetar+ssl://broker.example:6651",
        authentication=magnetar.AuthenticationToken(token),
        tls_trust_certs_file_path="ca.pem",
    )

A token is sent once per call or stream (``authorization: Bearer <token>``), never per message.
Give :class:`AuthenticationToken` a callable instead of a string and it is asked again for
every new call or stream, and whenever a broker says a stream's token expired: a long-lived
producer or consumer then goes on with the fresh token, without reconnecting. The callable runs
on the client's event loop, so it should be quick (read a file, return a cached value); it may
also be a coroutine function. If it raises, the call or stream fails retriably
(:class:`AuthenticationExpiredError`) and is tried again, so a producer keeps its messages
while a token service is briefly down.

:class:`AuthenticationTLS` presents a client certificate on TLS connections (mutual TLS); the
broker takes its common name as the role.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path

from magnetar.common.errors import (
    AuthenticationError,
    AuthenticationExpiredError,
    InvalidArgumentError,
)

__all__ = ["Authentication", "AuthenticationTLS", "AuthenticationToken", "TokenSupplier"]

TokenSupplier = Callable[[], str] | Callable[[], Awaitable[str]]


class Authentication:
    """Base of the client's authentication methods; :data:`None` means no credentials."""

    async def token(self) -> str | None:
        """The token to send now, if this method sends one."""
        return None

    @property
    def certificate(self) -> tuple[Path, Path] | None:
        """``(cert_file, key_file)`` to present on TLS connections, if any."""
        return None


class AuthenticationToken(Authentication):
    """A JWT token, or a callable returning the current one (asked again when it expires)."""

    def __init__(self, token: str | TokenSupplier) -> None:
        if isinstance(token, str):
            if not token.strip():
                raise InvalidArgumentError("AuthenticationToken needs a token, got an empty one")
            self._token: str | None = token.strip()
            self._supplier: TokenSupplier | None = None
        elif callable(token):
            self._token = None
            self._supplier = token
        else:
            raise InvalidArgumentError(
                "AuthenticationToken takes a token string or a callable that returns one, got"
                f" {type(token).__name__}"
            )

    async def token(self) -> str:
        if self._supplier is None:
            assert self._token is not None
            return self._token
        try:
            value = self._supplier()
            if inspect.isawaitable(value):
                value = await value
        except Exception as e:
            # retriable: a supplier that fails now (its token service is down) may work on the
            # next reconnect, and a producer keeps its messages meanwhile. Only the exception's
            # type is named: its message might quote what the supplier read.
            raise AuthenticationExpiredError(
                f"the token supplier failed with {type(e).__name__} (see the chained error)"
            ) from e
        if not isinstance(value, str) or not value.strip():
            raise AuthenticationError(
                "the token supplier returned no token (it must return a non-empty string)"
            )
        return value.strip()

    def __repr__(self) -> str:
        return "AuthenticationToken(<supplier>)" if self._supplier else "AuthenticationToken(***)"


class AuthenticationTLS(Authentication):
    """A client certificate and its key (PEM files), presented on TLS connections."""

    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        for what, path in (("certificate", self.cert_file), ("key", self.key_file)):
            if not path.is_file():
                raise InvalidArgumentError(
                    f"AuthenticationTLS: the client {what} file {path} does not exist",
                    context={"file": str(path)},
                )

    @property
    def certificate(self) -> tuple[Path, Path]:
        return self.cert_file, self.key_file

    def __repr__(self) -> str:
        return f"AuthenticationTLS({str(self.cert_file)!r}, <key>)"
