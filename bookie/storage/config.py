"""Settings of the bookie's storage engine."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.config import config_error


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """How the storage engine writes, indexes and compacts."""

    max_group_wait_ms: float = 0.0
    """Longest an add waits for others to share its fdatasync (0: none; groups still form while
    the previous fdatasync runs)."""

    max_group_bytes: int = 8 * 1024 * 1024
    """A group commit is written as soon as this many bytes are waiting."""

    max_segment_bytes: int = 512 * 1024 * 1024
    """A segment file is sealed and a new one started past this size."""

    max_entry_bytes: int = 5 * 1024 * 1024
    """Largest entry payload accepted."""

    checkpoint_interval_s: float = 60.0
    """How often the index is checkpointed (restart replays only the log after the checkpoint)."""

    checkpoint_after_bytes: int = 256 * 1024 * 1024
    """Also checkpoint once this much log has been written since the last checkpoint."""

    gc_interval_s: float = 300.0
    """How often garbage collection runs (0: only when asked)."""

    gc_max_live_ratio: float = 0.5
    """Sealed segments with less than this fraction of live bytes are compacted."""

    def __post_init__(self) -> None:
        if self.max_group_wait_ms < 0:
            raise config_error("max_group_wait_ms", self.max_group_wait_ms, "must be >= 0")
        for name in ("max_group_bytes", "max_segment_bytes", "max_entry_bytes"):
            value = getattr(self, name)
            if value < 1024:
                raise config_error(name, value, "must be at least 1024")
        if self.max_entry_bytes + 1024 > self.max_segment_bytes:
            raise config_error(
                "max_entry_bytes", self.max_entry_bytes, "must leave room in a segment"
            )
        if self.checkpoint_interval_s <= 0:
            raise config_error("checkpoint_interval_s", self.checkpoint_interval_s, "must be > 0")
        if self.checkpoint_after_bytes < 1:
            raise config_error("checkpoint_after_bytes", self.checkpoint_after_bytes, "must be > 0")
        if self.gc_interval_s < 0:
            raise config_error("gc_interval_s", self.gc_interval_s, "must be >= 0")
        if not 0 < self.gc_max_live_ratio <= 1:
            raise config_error("gc_max_live_ratio", self.gc_max_live_ratio, "must be in (0, 1]")
