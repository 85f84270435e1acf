"""Throw-away certificates and tokens for tests and examples: a real CA, real keys, on disk.

::

    pki = TestPki(tmp_path / "pki")                      # a new CA (ca.pem)
    broker = pki.issue("broker", hosts=["localhost", "127.0.0.1"])   # broker.pem, broker.key
    alice = pki.issue("alice")                           # a client certificate, CN=alice
    stranger = TestPki(tmp_path / "other").issue("mallory")          # another CA's

    tokens = TestTokens(tmp_path / "tokens")             # secret.key (HS256)
    token = tokens.create("alice", expiry_s=60)
    rsa = TestTokens(tmp_path / "rsa", algorithm="RS256")           # private.pem, public.pem

Certificates come from ``trustme`` (a development dependency: ``pip install magnetar[dev]``),
tokens from :mod:`magnetar.common.security.tokens`, the code ``magnetar tokens`` runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magnetar.common.security.tokens import (
    SECRET_ALGORITHMS,
    create_key_pair,
    create_secret_key,
    create_token,
    load_signing_key,
)

__all__ = ["CertFiles", "TestPki", "TestTokens"]

DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its key, as PEM files."""

    cert_file: Path
    key_file: Path
    common_name: str


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` owner-only, replacing it in one step (a reader never sees a
    half-written key)."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)
    temporary.replace(path)


class TestPki:
    """A certificate authority of its own, writing what it issues under ``directory``."""

    __test__ = False  # a helper, not a pytest test class

    def __init__(self, directory: Path, *, name: str = "Magnetar test CA") -> None:
        import trustme  # noqa: PLC0415 - a development dependency, needed only here

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._ca: Any = trustme.CA(organization_name=name)
        self.ca_file = directory / "ca.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(
        self,
        common_name: str,
        *,
        hosts: Sequence[str] = DEFAULT_HOSTS,
        name: str | None = None,
    ) -> CertFiles:
        """A certificate for ``common_name`` (the role, for a client), valid for ``hosts``
        (the names and addresses a server is reached by), written to ``<name>.pem`` and
        ``<name>.key`` (``name`` defaults to the common name). Issuing again to the same name
        replaces the files: a rotation."""
        leaf = self._ca.issue_cert(*(hosts or (common_name,)), common_name=common_name)
        stem = name or common_name
        files = CertFiles(
            self.directory / f"{stem}.pem", self.directory / f"{stem}.key", common_name
        )
        _write_private(files.key_file, leaf.private_key_pem.bytes())
        _write_private(files.cert_file, b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        return files


class TestTokens:
    """A token signing key under ``directory``, and tokens signed with it."""

    __test__ = False

    def __init__(self, directory: Path, *, algorithm: str = "HS256") -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        self.algorithm = algorithm
        if algorithm in SECRET_ALGORITHMS:
            self.secret_key_file: Path | None = directory / "secret.key"
            _write_private(self.secret_key_file, create_secret_key(algorithm))
            self.private_key_file: Path | None = None
            self.public_key_file: Path | None = None
            self._signing = load_signing_key(self.secret_key_file, secret=True)
        else:
            private, public = create_key_pair(algorithm)
            self.secret_key_file = None
            self.private_key_file = directory / "private.pem"
            self.public_key_file = directory / "public.pem"
            _write_private(self.private_key_file, private)
            self.public_key_file.write_bytes(public)
            self._signing = load_signing_key(self.private_key_file, secret=False)

    @property
    def broker_args(self) -> list[str]:
        """The flags that make a broker verify these tokens."""
        if self.secret_key_file is not None:
            return ["--token-secret-key-file", str(self.secret_key_file)]
        assert self.public_key_file is not None
        return ["--token-public-key-file", str(self.public_key_file)]

    def create(self, role: str, *, expiry_s: int | None = None, audience: str | None = None) -> str:
        return create_token(
            self._signing, role, expiry_s=expiry_s, algorithm=self.algorithm, audience=audience
        )

    def write(self, role: str, *, expiry_s: int | None = None) -> Path:
        """A token for ``role`` in a file of its own (``<role>.token``)."""
        path = self.directory / f"{role}.token"
        _write_private(path, self.create(role, expiry_s=expiry_s).encode())
        return path
