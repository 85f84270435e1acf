"""The broker's listeners for Pulsar's binary protocol: TCP servers handing each connection to a
:class:`~broker.pulsar.connection.PulsarConnection`.

A listener binds before the broker registers (the registration carries its ``pulsar://`` or
``pulsar+ssl://`` URL, which lookups answer) and takes connections only once the broker has
started. Stopping closes every connection; their producers and consumers leave their partitions
as on a client's disconnect.

The TLS listener (``pulsar_tls_port``) handshakes each connection with the context of a
:class:`~magnetar.common.security.tls.ReloadingSslContext` as it is at that moment, so a
certificate rotated on disk is used by the next connection, with no restart. With a trust file,
a client must present a certificate one of its CAs signed (as on the gRPC TLS port), and the
certificate's common name is what the ``tls`` authentication method takes as the role. A
handshake that fails or does not end within ``connection_handshake_timeout_ms`` closes that
connection only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import structlog

from broker.pulsar.connection import FRAME_PADDING, PulsarConnection
from broker.service.broker import Broker
from magnetar.common.errors import InvalidConfigError
from magnetar.common.security.tls import ReloadingSslContext

log = structlog.get_logger("magnetar.broker.pulsar")


class PulsarListener:
    """Create, :meth:`bind`, :meth:`serve` once the broker runs, :meth:`stop`."""

    def __init__(
        self, *, tls: ReloadingSslContext | None = None, handshake_timeout_s: float = 10.0
    ) -> None:
        self.tls = tls
        """The certificate, key and trusted CAs of a TLS listener (None: plaintext)."""
        self._handshake_timeout_s = handshake_timeout_s
        self.handshake_failures = 0
        """TLS handshakes refused or not finished in time, since start."""
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
            flag = "--pulsar-tls-port" if self.tls is not None else "--pulsar-port"
            raise InvalidConfigError(
                f"cannot listen on {host}:{port} for Pulsar clients: {e.strerror or e}; stop"
                f" the other process or choose another {flag}",
                context={"address": f"{host}:{port}"},
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def serve(self, broker: Broker) -> None:
        """Take connections for ``broker``."""
        assert self._server is not None, "bind first"
        self._broker = broker
        await self._server.start_serving()
        log.info(
            "pulsar_listener_serving",
            port=self.port,
            url=broker.pulsar_url_tls if self.tls is not None else broker.pulsar_url,
            mutual_tls=self.tls.mutual if self.tls is not None else None,
        )

    async def _handshake(self, writer: asyncio.StreamWriter) -> bool:
        """TLS on a new connection, with the certificate in force now; whether it worked."""
        assert self.tls is not None
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                await writer.start_tls(self.tls.current())
        except (ssl.SSLError, OSError, TimeoutError) as e:
            # a client that does not trust us, presents no or a foreign certificate, or speaks
            # plaintext to this port: its connection only
            self.handshake_failures += 1
            host, port = (writer.get_extra_info("peername") or ("?", 0))[:2]
            log.info(
                "pulsar_tls_handshake_failed",
                peer=f"ipv4:{host}:{port}",
                error=getattr(e, "reason", None) or type(e).__name__,
            )
            writer.transport.abort()
            return False
        return True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        broker = self._broker
        if broker is None:
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # from here, so that stop() ends a handshake in progress too
        connection: PulsarConnection | None = None
        try:
            if self.tls is not None and not await self._handshake(writer):
                return
            connection = PulsarConnection(
                broker,
                reader,
                writer,
                max_frame_size=broker.config.max_message_bytes + FRAME_PADDING,
                tls=self.tls is not None,
            )
            self._connections.add(connection)
            await connection.run()
        finally:
            if connection is not None:
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
