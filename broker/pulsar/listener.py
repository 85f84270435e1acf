"""The broker's listener for Pulsar's binary protocol: a TCP server handing each connection to a
:class:`~broker.pulsar.connection.PulsarConnection`.

It binds before the broker registers (the registration carries its ``pulsar://`` URL, which
lookups answer) and takes connections only once the broker has started. Stopping closes every
connection; their producers and consumers leave their partitions as on a client's disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from broker.pulsar.connection import FRAME_PADDING, PulsarConnection
from broker.service.broker import Broker
from magnetar.common.errors import InvalidConfigError

log = structlog.get_logger("magnetar.broker.pulsar")


class PulsarListener:
    """Create, :meth:`bind`, :meth:`serve` once the broker runs, :meth:`stop`."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._broker: Broker | None = None
        self._connections: set[PulsarConnection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def bind(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) without taking connections yet; the port."""
        try:
            self._server = await asyncio.start_server(
                self._accept, host, port, start_serving=False, reuse_address=True
            )
        except OSError as e:
            raise InvalidConfigError(
                f"cannot listen on {host}:{port} for Pulsar clients: {e.strerror or e}; stop"
                " the other process or choose another --pulsar-port",
                context={"address": f"{host}:{port}"},
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def serve(self, broker: Broker) -> None:
        """Take connections for ``broker``."""
        assert self._server is not None, "bind first"
        self._broker = broker
        await self._server.start_serving()
        log.info("pulsar_listener_serving", port=self.port, url=broker.pulsar_url)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        broker = self._broker
        if broker is None:
            writer.close()
            return
        connection = PulsarConnection(
            broker,
            reader,
            writer,
            max_frame_size=broker.config.max_message_bytes + FRAME_PADDING,
        )
        self._connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            if task is not None:
                self._tasks.discard(task)

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            with contextlib.suppress(Exception):
                await connection.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
