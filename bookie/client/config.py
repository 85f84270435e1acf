"""Settings of the ledger client (the broker's and autorecovery's way to bookies)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from magnetar.common.config import config_error


@dataclass(frozen=True, kw_only=True)
class LedgerClientConfig:
    """How ledgers are placed, written and read."""

    ensemble_size: int = 3
    """Default E: bookies a new ledger is striped over."""

    write_quorum: int = 2
    """Default Qw: bookies each entry is written to."""

    ack_quorum: int = 2
    """Default Qa: acknowledgements an entry needs to be confirmed."""

    add_timeout_ms: int = 5000
    """A bookie that has not acknowledged an add in this time is replaced."""

    read_timeout_ms: int = 5000
    """A read waits this long for a bookie before trying another replica."""

    speculative_read_delay_ms: int = 200
    """After this long without an answer, the same read also goes to the next replica (0: off)."""

    ensemble_change_timeout_ms: int = 30_000
    """How long a writer waits for a replacement bookie before failing its pending adds."""

    under_striped_ledgers: bool = True
    """With fewer than E writable bookies, new ledgers go on as many as there are, down to Qw
    (each entry still has Qw copies and needs Qa acknowledgements), and a writer whose bookie
    fails with no replacement stops at once so its owner can roll to such a ledger. Off: a new
    ledger needs E writable bookies, and a writer waits ensemble_change_timeout_ms for one."""

    bookie_quarantine_ms: int = 60_000
    """A bookie that failed an add is left out of new ensembles for this long, unless it
    registers again (restarted) sooner: its registration outlives a crash by its session TTL."""

    max_pending_adds: int = 10_000
    """Adds in flight per ledger before add() waits (back-pressure)."""

    max_pending_bytes: int = 64 * 1024 * 1024
    """Payload bytes in flight per ledger before add() waits (back-pressure)."""

    recovery_read_batch: int = 64
    """Entries recovery reads ahead at a time."""

    tls_trust_certs_file: Path | None = None
    """CA certificates that sign the bookies' certificates: set it (or tls_cert_file) when the
    bookies serve TLS. Their certificates must name the hosts they advertise."""

    tls_cert_file: Path | None = None
    """Certificate (PEM) presented to the bookies (mutual TLS: its common name is the role,
    which must be in the bookies' bookie_client_roles or superuser_roles)."""

    tls_key_file: Path | None = None
    """Private key (PEM) of tls_cert_file."""

    auth_token_file: Path | None = None
    """Token presented to bookies that take tokens (instead of, or with, a certificate); read
    again when the file changes."""

    @property
    def tls_enabled(self) -> bool:
        """Whether bookies are reached over TLS."""
        return self.tls_trust_certs_file is not None or self.tls_cert_file is not None

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise config_error(
                "ack_quorum",
                (self.ensemble_size, self.write_quorum, self.ack_quorum),
                "need ensemble_size >= write_quorum >= ack_quorum >= 1",
            )
        for name in (
            "add_timeout_ms",
            "read_timeout_ms",
            "ensemble_change_timeout_ms",
            "bookie_quarantine_ms",
            "max_pending_adds",
            "max_pending_bytes",
            "recovery_read_batch",
        ):
            if getattr(self, name) < 1:
                raise config_error(name, getattr(self, name), "must be >= 1")
        if self.speculative_read_delay_ms < 0:
            raise config_error(
                "speculative_read_delay_ms", self.speculative_read_delay_ms, "must be >= 0"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise config_error(
                "tls_key_file", self.tls_key_file, "must be set together with tls_cert_file"
            )
