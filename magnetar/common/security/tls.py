"""TLS for gRPC: a server's credentials that follow their files, and a client's checked channels.

**Servers.** :class:`ReloadingServerCredentials` gives a gRPC server TLS credentials whose
certificate, key and trusted CAs are re-read when their files change, with no restart: gRPC asks
for the current configuration at each new handshake, so connections made before a rotation keep
their session and the next connection gets the new certificate. A pair that does not fit (a key
written before its certificate, mid-rotation) is not used: the old one stays until the files
agree. gRPC for Python can either ignore client certificates or require them, not accept them
when offered, so a trust file means mutual TLS: every client must present a certificate it
signed.

**Clients.** :func:`open_secure_channel` checks a broker's TLS first, with Python's ``ssl`` (a
handshake, and an HTTP/2 greeting so that a refused client certificate shows too), and only then
opens the gRPC channel. A failure is a :class:`TlsError` that says what to fix (no trust file,
the wrong host name, a refused certificate), at once, where gRPC alone would retry an opaque
``UNAVAILABLE`` until a deadline. The check also makes ``tls_validate_hostname=False`` possible,
which gRPC cannot do by itself: the chain is verified, and gRPC is told to expect the name the
certificate itself holds.

Like :mod:`magnetar.common.grpc_errors`, this module imports gRPC; the gRPC-free layers do not
import it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import ssl
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from magnetar.common.errors import InvalidConfigError, ServiceUnavailableError, TlsError

__all__ = [
    "ClientTls",
    "ReloadingServerCredentials",
    "ReloadingSslContext",
    "open_secure_channel",
]

log = structlog.get_logger("magnetar.tls")

_RELOAD_CHECK_INTERVAL_S = 1.0
_NAME_MISMATCH = (62, 64)
"""OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH."""
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""The HTTP/2 connection preface and an empty SETTINGS frame: a server that accepted the client
answers with its own SETTINGS; one that refused its certificate sends an alert instead."""


def _stamp(paths: Sequence[Path]) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(stamps)


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidConfigError(
            f"{what} {path} cannot be read: {e.strerror or e}", context={"file": str(path)}
        ) from None
    if not data.strip():
        raise InvalidConfigError(f"{what} {path} is empty", context={"file": str(path)})
    return data


@dataclasses.dataclass(frozen=True)
class _Material:
    cert_chain: bytes
    private_key: bytes = dataclasses.field(repr=False)
    trust: bytes | None
    subject: str
    not_after: datetime


def _load_material(cert_file: Path, key_file: Path, trust_file: Path | None) -> _Material:
    """Read and check a certificate, its key and the trusted CAs; :class:`InvalidConfigError`
    naming the file and the problem (never the key) when they cannot be used together."""
    chain = _read(cert_file, "TLS certificate file")
    key = _read(key_file, "TLS key file")
    trust = _read(trust_file, "TLS trust file") if trust_file is not None else None
    try:
        cert = x509.load_pem_x509_certificate(chain)
    except ValueError:
        raise InvalidConfigError(
            f"TLS certificate file {cert_file} holds no PEM certificate",
            context={"file": str(cert_file)},
        ) from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise InvalidConfigError(
            f"TLS key file {key_file} holds no unencrypted PEM private key",
            context={"file": str(key_file)},
        ) from None
    public_format = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*public_format) != private.public_key().public_bytes(
        *public_format
    ):
        raise InvalidConfigError(
            f"TLS key file {key_file} is not the key of the certificate in {cert_file}",
            context={"file": str(key_file)},
        )
    if trust is not None:
        try:
            x509.load_pem_x509_certificates(trust)
        except ValueError:
            raise InvalidConfigError(
                f"TLS trust file {trust_file} holds no PEM certificate",
                context={"file": str(trust_file)},
            ) from None
    return _Material(
        chain, key, trust, cert.subject.rfc4514_string(), cert.not_valid_after_utc.astimezone(UTC)
    )


class ReloadingServerCredentials:
    """gRPC server credentials read from files, re-read when the files change.

    ``credentials`` goes to ``server.add_secure_port``. ``reloads`` counts the configurations
    taken after the first; ``reload_failures`` the changes that could not be used.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        trust_file: Path | None = None,
        *,
        component: str,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.trust_file = trust_file
        self.component = component
        self.reloads = 0
        self.reload_failures = 0
        self._paths = [p for p in (cert_file, key_file, trust_file) if p is not None]
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()
        try:
            self._stamps = _stamp(self._paths)
        except OSError as e:
            raise InvalidConfigError(
                f"TLS file {e.filename} cannot be read: {e.strerror}",
                context={"file": str(e.filename)},
            ) from None
        material = _load_material(cert_file, key_file, trust_file)
        self._log_loaded(material, "tls_certificate_loaded")
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._configuration(material),
            self._fetch,
            require_client_authentication=trust_file is not None,
        )

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate (a trust file is set)."""
        return self.trust_file is not None

    def _configuration(self, material: _Material) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(material.private_key, material.cert_chain)], root_certificates=material.trust
        )

    def _log_loaded(self, material: _Material, event: str) -> None:
        facts: dict[str, object] = {
            "component": self.component,
            "certificate": str(self.cert_file),
            "subject": material.subject,
            "not_after": material.not_after.isoformat(timespec="seconds"),
            "mutual": self.mutual,
        }
        if material.not_after < datetime.now(UTC):
            log.warning("tls_certificate_expired", **facts)
        else:
            log.info(event, **facts)

    def _fetch(self) -> Any:
        """gRPC's question at each handshake: a new configuration, or None to keep the one it
        has. Looks at the files at most once a second; never raises (gRPC would fail the
        handshake)."""
        now = time.monotonic()
        if now - self._checked_at < _RELOAD_CHECK_INTERVAL_S:
            return None
        with self._lock:
            self._checked_at = now
            try:
                stamps = _stamp(self._paths)
            except OSError:
                return None  # a file being replaced: look again at the next handshake
            if stamps == self._stamps:
                return None
            try:
                material = _load_material(self.cert_file, self.key_file, self.trust_file)
            except InvalidConfigError as e:
                # most likely the key or certificate of a rotation is written and the other
                # not yet: keep serving the old pair, and try again when a file changes again
                self.reload_failures += 1
                self._stamps = stamps
                log.warning("tls_certificate_reload_failed", component=self.component, error=str(e))
                return None
            self._stamps = stamps
            self.reloads += 1
        self._log_loaded(material, "tls_certificate_reloaded")
        return self._configuration(material)


# --- clients ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How a client makes TLS connections."""

    trust_certs_file: Path | None = None
    """CAs that sign the servers' certificates; None: the system's."""
    validate_hostname: bool = True
    """Whether a server's certificate must name the host connected to."""
    cert_file: Path | None = None
    """A client certificate to present (mutual TLS), with ``key_file``."""
    key_file: Path | None = None


def _split_target(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def _certificate_name(peercert: dict[str, Any]) -> str | None:
    """The name gRPC should expect when host names are not validated: the certificate's first
    DNS name, else its first IP address, else its common name."""
    alt = peercert.get("subjectAltName", ())
    for kind in ("DNS", "IP Address"):
        for key, value in alt:
            if key == kind:
                return str(value)
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _client_context(tls: ClientTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            cafile=str(tls.trust_certs_file) if tls.trust_certs_file else None
        )
    except (OSError, ssl.SSLError) as e:
        raise TlsError(
            f"tls_trust_certs_file_path {tls.trust_certs_file} cannot be used: {e}",
            context={"file": str(tls.trust_certs_file)},
        ) from None
    context.check_hostname = tls.validate_hostname
    context.set_alpn_protocols(["h2"])
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as e:
            raise TlsError(
                f"the client certificate {tls.cert_file} or its key {tls.key_file} cannot be"
                f" used: {getattr(e, 'strerror', None) or e}",
                context={"file": str(tls.cert_file)},
            ) from None
    return context


async def _check(target: str, tls: ClientTls, timeout_s: float) -> str | None:
    """Handshake with ``target`` as gRPC will; the certificate's own name (see
    :func:`_certificate_name`). :class:`TlsError` when TLS cannot work, and
    :class:`ServiceUnavailableError` when the server cannot be reached at all."""
    host, port = _split_target(target)
    context = _client_context(tls)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=host
            )
            peercert = writer.get_extra_info("peercert") or {}
            writer.write(_HTTP2_GREETING)
            await writer.drain()
            answer = await reader.read(9)
            if not answer:
                raise TlsError(
                    f"broker {target} closed the TLS connection after the handshake: it requires"
                    " a client certificate (mutual TLS) signed by a CA it trusts, and this client"
                    + (
                        f" gave {tls.cert_file}, which it refused"
                        if tls.cert_file is not None
                        else " gave none"
                    ),
                    context={"broker": target},
                )
    except ssl.SSLCertVerificationError as e:
        if e.verify_code in _NAME_MISMATCH:
            raise TlsError(
                f"the TLS certificate of broker {target} does not name the host connected to"
                f" ({e.verify_message}): connect by a name the certificate holds (the brokers'"
                " advertised host), or set tls_validate_hostname=False",
                context={"broker": target, "reason": str(e.verify_message)},
            ) from None
        raise TlsError(
            f"the TLS certificate of broker {target} is not trusted ({e.verify_message}): set"
            " tls_trust_certs_file_path to the CA that signed it",
            context={"broker": target, "reason": str(e.verify_message)},
        ) from None
    except ssl.SSLError as e:
        reason = e.reason or str(e)
        raise TlsError(
            f"broker {target} refused the TLS connection ({reason}): check that the client"
            " certificate is signed by a CA the broker trusts, and that the port is a TLS port",
            context={"broker": target, "reason": str(reason)},
        ) from None
    except TimeoutError:
        raise ServiceUnavailableError(
            f"cannot reach {target}: no TLS handshake within {timeout_s} s",
            context={"peer": target},
        ) from None
    except OSError as e:
        raise ServiceUnavailableError(
            f"cannot reach {target}: {e.strerror or e}", context={"peer": target}
        ) from None
    finally:
        if writer is not None:
            # abort, not close: a TLS close waits (up to 30 s) for the server's close_notify,
            # which gRPC servers do not send
            writer.transport.abort()
    return None if tls.validate_hostname else _certificate_name(peercert)


def _read_optional(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as e:
        raise TlsError(
            f"{what} {path} cannot be read: {e.strerror or e}", context={"file": str(path)}
        ) from None


async def open_secure_channel(
    target: str,
    tls: ClientTls,
    options: Sequence[tuple[str, Any]] = (),
    *,
    timeout_s: float = 10.0,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A TLS gRPC channel to ``target`` (``host:port``), opened once the server's TLS was
    checked (see the module's docs)."""
    name = await _check(target, tls, timeout_s)
    channel_options = list(options)
    if name is not None:
        channel_options.append(("grpc.ssl_target_name_override", name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_optional(tls.trust_certs_file, "tls_trust_certs_file_path"),
        private_key=_read_optional(tls.key_file, "the client key file"),
        certificate_chain=_read_optional(tls.cert_file, "the client certificate file"),
    )
    return grpc.aio.secure_channel(
        target, credentials, options=channel_options, interceptors=interceptors
    )


class ReloadingSslContext:
    """A server ``ssl.SSLContext`` for plain-Python servers (the HTTP status port, the bookie
    data port), rebuilt when the certificate, key or trust file changes (looked at once a
    second at most), like :class:`ReloadingServerCredentials` does for gRPC. A pair that does
    not fit is not used. With ``trust_file``, clients must present a certificate one of its CAs
    signed (mutual TLS), as on the gRPC ports."""

    def __init__(
        self, cert_file: Path, key_file: Path, trust_file: Path | None = None, *, component: str
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.trust_file = trust_file
        self.component = component
        self.reloads = 0
        self._paths = [p for p in (cert_file, key_file, trust_file) if p is not None]
        self._checked_at = time.monotonic()
        try:
            self._stamps = _stamp(self._paths)
        except OSError as e:
            raise InvalidConfigError(
                f"TLS file {e.filename} cannot be read: {e.strerror}",
                context={"file": str(e.filename)},
            ) from None
        _load_material(cert_file, key_file, trust_file)
        self._context = self._build()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate (a trust file is set)."""
        return self.trust_file is not None

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        if self.trust_file is not None:
            context.load_verify_locations(cafile=str(self.trust_file))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked_at < _RELOAD_CHECK_INTERVAL_S:
            return self._context
        self._checked_at = now
        try:
            stamps = _stamp(self._paths)
            if stamps != self._stamps:
                self._stamps = stamps
                _load_material(self.cert_file, self.key_file, self.trust_file)
                self._context = self._build()
                self.reloads += 1
                log.info(
                    "tls_certificate_reloaded",
                    component=self.component,
                    certificate=str(self.cert_file),
                )
        except (OSError, ssl.SSLError, InvalidConfigError) as e:
            log.warning("tls_certificate_reload_failed", component=self.component, error=str(e))
        return self._context
