"""Settings of the ledger client (the broker's and autorecovery's way to bookies)."""

from __future__ import annotations

from dataclasses import dataclass

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

    max_pending_adds: int = 10_000
    """Adds in flight per ledger before add() waits (back-pressure)."""

    max_pending_bytes: int = 64 * 1024 * 1024
    """Payload bytes in flight per ledger before add() waits (back-pressure)."""

    recovery_read_batch: int = 64
    """Entries recovery reads ahead at a time."""

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
