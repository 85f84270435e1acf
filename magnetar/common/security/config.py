"""The security settings servers share, Pulsar's names in snake case.

Each group is a frozen, keyword-only dataclass that a server's config inherits, so that the
settings keep their flat names (``--tls-cert-file``, ``MAGNETAR_TLS_CERT_FILE``, ``tls_cert_file``
in TOML), as the issue and Pulsar's ``broker.conf`` spell them, in every process that has them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from magnetar.common.config import config_error

__all__ = [
    "AUTHENTICATION_PROVIDERS",
    "AuthenticationSettings",
    "ConnectionSettings",
    "HttpSettings",
    "TlsSettings",
    "is_loopback",
]

AUTHENTICATION_PROVIDERS = ("token", "tls")
"""``token``: a JWT in the call's metadata; ``tls``: the common name of a verified client
certificate."""


def is_loopback(host: str) -> bool:
    """Whether a server listening on ``host`` can be reached only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """TLS on a server's listener: its certificate and key, and whom it trusts."""

    tls_cert_file: Path | None = None
    """PEM certificate (chain) of the TLS listener; with tls_key_file, turns TLS on. Reloaded when
    the file changes."""

    tls_key_file: Path | None = None
    """PEM private key of tls_cert_file. Reloaded when the file changes."""

    tls_trust_certs_file: Path | None = None
    """PEM CA certificates. When set, every TLS client must present a certificate signed by one
    of them (mutual TLS; the 'tls' provider takes its common name as the role)."""

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def __post_init__(self) -> None:
        self._check_tls()

    def _check_tls(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("tls_cert_file", "tls_key_file")
                if self.tls_cert_file is not None
                else ("tls_key_file", "tls_cert_file")
            )
            raise config_error(missing, None, f"must be set together with {given}")
        if self.tls_trust_certs_file is not None and self.tls_cert_file is None:
            raise config_error(
                "tls_trust_certs_file",
                str(self.tls_trust_certs_file),
                "needs tls_cert_file and tls_key_file (it verifies clients of the TLS listener)",
            )


@dataclass(frozen=True, kw_only=True)
class AuthenticationSettings:
    """Who may connect: authentication providers, token keys and superusers."""

    authentication_enabled: bool = False
    """Refuse every call and stream that does not present valid credentials."""

    authentication_providers: tuple[str, ...] = ("token",)
    """How clients prove who they are: token (a JWT), tls (a client certificate's common name),
    or both."""

    token_secret_key_file: Path | None = None
    """File whose bytes are the secret key that signs tokens (HS256/384/512). Reloaded when it
    changes."""

    token_public_key_file: Path | None = None
    """PEM or DER public key(s) that verify tokens (RS256/384/512, ES256/384/512); a PEM file may
    hold several, for key rotation. Reloaded when it changes."""

    token_static_file: Path | None = None
    """File of static tokens, one 'ROLE SHA256' line each (the SHA-256 of the token, in hex): a
    bearer token whose hash is listed is that role (the Helm chart's superuser token, made
    without a signing tool). Reloaded when it changes."""

    token_auth_claim: str = "sub"  # noqa: S105 - a claim name, not a secret
    """The token claim that holds the role."""

    token_audience: str | None = None
    """When set, a token's aud claim must name this audience."""

    superuser_roles: tuple[str, ...] = ()
    """Roles that may do anything: every topic, tenant and cluster operation."""

    authentication_refresh_grace_ms: int = 10_000
    """A stream whose token expired is asked for a fresh one and closed (retriably) if none comes
    within this time."""

    def __post_init__(self) -> None:
        self._check_authentication()

    def _check_authentication(self) -> None:
        unknown = [p for p in self.authentication_providers if p not in AUTHENTICATION_PROVIDERS]
        if unknown:
            raise config_error(
                "authentication_providers",
                ",".join(self.authentication_providers),
                f"each must be one of {', '.join(AUTHENTICATION_PROVIDERS)}",
            )
        if self.authentication_enabled and not self.authentication_providers:
            raise config_error(
                "authentication_providers", "", "must name at least one provider when enabled"
            )
        if (
            self.authentication_enabled
            and "token" in self.authentication_providers
            and self.token_secret_key_file is None
            and self.token_public_key_file is None
            and self.token_static_file is None
        ):
            raise config_error(
                "token_secret_key_file",
                None,
                "or token_public_key_file or token_static_file must be set for the token provider",
            )
        if self.token_secret_key_file is not None and self.token_public_key_file is not None:
            raise config_error(
                "token_public_key_file",
                str(self.token_public_key_file),
                "cannot be set together with token_secret_key_file (tokens are signed one way)",
            )
        if not self.token_auth_claim:
            raise config_error("token_auth_claim", self.token_auth_claim, "must not be empty")
        if self.authentication_refresh_grace_ms < 0:
            raise config_error(
                "authentication_refresh_grace_ms",
                self.authentication_refresh_grace_ms,
                "must be >= 0",
            )
        if any(not role for role in self.superuser_roles):
            raise config_error("superuser_roles", self.superuser_roles, "must not hold empty roles")


@dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """The HTTP port of /metrics and /health: where it listens, TLS, and its bounds."""

    http_bind_host: str | None = None
    """Address /metrics and /health listen on (default: bind_host); a separate address keeps
    them apart from the data ports."""

    http_tls_cert_file: Path | None = None
    """PEM certificate (chain) to serve /metrics and /health over HTTPS; reloaded when it
    changes."""

    http_tls_key_file: Path | None = None
    """PEM private key of http_tls_cert_file."""

    http_max_connections: int = 64
    """Connections served at once at most; more are closed at once (slow clients cannot pile
    up)."""

    def _check_http(self) -> None:
        if (self.http_tls_cert_file is None) != (self.http_tls_key_file is None):
            raise config_error(
                "http_tls_key_file",
                str(self.http_tls_key_file),
                "must be set together with http_tls_cert_file",
            )
        if self.http_max_connections < 1:
            raise config_error("http_max_connections", self.http_max_connections, "must be >= 1")

    def __post_init__(self) -> None:
        self._check_http()


@dataclass(frozen=True, kw_only=True)
class ConnectionSettings:
    """Bounds on the gRPC connections a server holds (Pulsar's ``brokerMaxConnections``): a
    client that opens connections and never speaks, or never closes them, cannot use up the
    process's file descriptors and lock other clients out."""

    max_connections: int = 4096
    """gRPC connections held at once at most, over every listener; a connection beyond it is
    closed as soon as it is accepted (the client sees UNAVAILABLE and retries). 0: no bound
    but the process's file limit (which a server raises to its hard limit at start)."""

    max_connections_per_ip: int = 1024
    """Connections from one IP address that may have calls or streams open at once; a call on
    a further one is refused with UNAVAILABLE, naming the address (clients retry). Connections
    that open no call are bounded by the other settings here. 0: no bound."""

    connection_handshake_timeout_ms: int = 10_000
    """A connection that has not completed its TLS handshake and sent its HTTP/2 settings
    within this long is closed (a TCP connection that never speaks is not held)."""

    max_connection_idle_ms: int = 900_000
    """A connection with no call or stream open for this long is closed (its client reconnects
    when it next needs it). 0: idle connections are kept."""

    def _check_connections(self) -> None:
        if self.max_connections < 0:
            raise config_error("max_connections", self.max_connections, "must be >= 0")
        if self.max_connections_per_ip < 0:
            raise config_error(
                "max_connections_per_ip", self.max_connections_per_ip, "must be >= 0"
            )
        if self.connection_handshake_timeout_ms < 100:
            raise config_error(
                "connection_handshake_timeout_ms",
                self.connection_handshake_timeout_ms,
                "must be >= 100",
            )
        if self.max_connection_idle_ms < 0:
            raise config_error(
                "max_connection_idle_ms", self.max_connection_idle_ms, "must be >= 0"
            )

    def __post_init__(self) -> None:
        self._check_connections()
