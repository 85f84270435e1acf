"""A fault-injecting wrapper around any metadata store, for tests of what sits on top of it.

Wrap a real store and make chosen operations fail or stall::

    faulty = FaultyMetadataStore(await open_store("memory://"))
    faulty.fail("keepalive", MetadataUnavailableError("injected"))   # every keepalive fails
    faulty.fail("put", BadVersionError("injected"), times=1)          # the next put fails once
    faulty.stall("txn", seconds=2.0)                                  # txns hang for 2 s
    faulty.heal()                                                     # back to normal

Operations are named after the public API: get, list, txn (create/put/delete go through it),
watch, grant_lease, keepalive, revoke_lease. Injected errors are raised before the wrapped store
is called, so the operation has no effect (as with a request that never reached the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from magnetar.common.errors import InvalidArgumentError, MetadataError
from metadata.api import (
    Compare,
    Lease,
    Listing,
    MetadataStore,
    Record,
    TxnOp,
    TxnResult,
    Watch,
)

OPERATIONS = ("get", "list", "txn", "watch", "grant_lease", "keepalive", "revoke_lease")


@dataclass(slots=True)
class _Fault:
    error: MetadataError | None
    stall_s: float
    times: int | None


class FaultyMetadataStore(MetadataStore):
    """Delegates to ``inner`` except where a fault is injected."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self._faults: dict[str, _Fault] = {}
        self.injected: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        """How many times each operation was hit by a fault."""

    @property
    def description(self) -> str:
        return f"faulty({self.inner.description})"

    def fail(self, operation: str, error: MetadataError, *, times: int | None = None) -> None:
        """Make ``operation`` raise ``error`` (the next ``times`` calls, or until healed)."""
        self._faults[self._check(operation)] = _Fault(error, 0.0, times)

    def stall(self, operation: str, seconds: float, *, times: int | None = None) -> None:
        """Make ``operation`` wait ``seconds`` before it runs."""
        self._faults[self._check(operation)] = _Fault(None, seconds, times)

    def heal(self, operation: str | None = None) -> None:
        if operation is None:
            self._faults.clear()
        else:
            self._faults.pop(self._check(operation), None)

    @staticmethod
    def _check(operation: str) -> str:
        if operation not in OPERATIONS:
            raise InvalidArgumentError(
                f"unknown metadata operation {operation!r}; one of {', '.join(OPERATIONS)}"
            )
        return operation

    async def _inject(self, operation: str) -> None:
        fault = self._faults.get(operation)
        if fault is None:
            return
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                del self._faults[operation]
        self.injected[operation] += 1
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        if fault.error is not None:
            raise fault.error

    async def _do_get(self, key: str) -> Record | None:
        await self._inject("get")
        return await self.inner.get(key)

    async def _do_list(self, prefix: str) -> Listing:
        await self._inject("list")
        return await self.inner.list(prefix)

    async def _do_txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        await self._inject("txn")
        return await self.inner.txn(compares, ops)

    async def _do_watch(self, prefix: str, start_revision: int | None) -> Watch:
        await self._inject("watch")
        return await self.inner.watch(prefix, start_revision=start_revision)

    async def _do_grant_lease(self, ttl_s: int) -> Lease:
        await self._inject("grant_lease")
        return await self.inner.grant_lease(ttl_s)

    async def _do_keepalive(self, lease_id: int) -> int:
        await self._inject("keepalive")
        return await self.inner.keepalive(lease_id)

    async def _do_revoke_lease(self, lease_id: int) -> None:
        await self._inject("revoke_lease")
        await self.inner.revoke_lease(lease_id)

    async def _do_close(self) -> None:
        await self.inner.close()
