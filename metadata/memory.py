"""The memory metadata store: the same semantics as the others, in process, for unit tests."""

from __future__ import annotations

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from metadata.config import MetadataStoreConfig
from metadata.local import LocalCore, LocalMetadataStore


class MemoryMetadataStore(LocalMetadataStore):
    """Nothing is persisted; leases expire by the injected clock (``memory://``)."""

    def __init__(
        self, config: MetadataStoreConfig | None = None, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        config = config or MetadataStoreConfig(url="memory://")
        core = LocalCore(config, clock=clock)
        super().__init__(config, core)
        core.start()

    @property
    def description(self) -> str:
        return "memory://"
