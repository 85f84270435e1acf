"""A small HTTP server for what operators and Prometheus scrape: /metrics and /health.

Bookies (port 8000), brokers (port 8080) and autorecovery (8001) serve their metrics and health
beside their gRPC port. This is deliberately tiny: GET only, one response per connection,
handlers return bytes. No framework: one less dependency, and nothing here is on a data path.

It is reachable by whoever reaches the port, so it gives nothing away and cannot be held:

- it answers only the paths it serves, and a refusal does not echo what it was sent;
- a request must arrive whole (request line and headers, at most :data:`MAX_HEADER_LINES`
  lines) within ``request_timeout_s``, counted from the connection, not per line: a client that
  trickles a header line every few seconds is cut off at the deadline;
- at most ``max_connections`` connections are served at once; beyond that a new connection is
  closed at once, unread, so slow clients cannot pile up;
- with ``tls`` it speaks HTTPS, the certificate reloaded from its files when they change;
- it can listen on an address of its own (``http_bind_host``), apart from the data ports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import structlog

from magnetar.common.security.config import HttpSettings
from magnetar.common.security.tls import ReloadingSslContext

log = structlog.get_logger("magnetar.http")

MAX_HEADER_LINES = 100
"""Header lines a request may carry at most."""
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[], Response | Awaitable[Response]]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class StatusServer:
    """Serves ``routes`` (path -> handler) on ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Handler],
        *,
        tls: ReloadingSslContext | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self.tls = tls
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.active = 0
        """Connections being served now."""
        self.peak = 0
        """The most connections served at once so far."""
        self.served = 0
        """Connections taken (not refused) so far."""
        self.refused = 0
        """Connections refused because ``max_connections`` were being served."""
        self._server: asyncio.Server | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.max_connections:
            self.refused += 1
            writer.transport.abort()  # no TLS handshake, no reading: it costs nothing to refuse
            return
        self.active += 1
        self.served += 1
        self.peak = max(self.peak, self.active)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                if self.tls is not None:
                    await writer.start_tls(self.tls.current())
                response = await self._answer(reader)
                await self._write(writer, response)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._write(writer, Response(408, b"request not received in time\n")), 1
                )
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        except Exception:
            log.exception("status_request_failed")
        finally:
            self.active -= 1
            # close (the response may still be in the buffer), but never wait long for the
            # peer: a TLS close waits for its close_notify
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            writer.transport.abort()

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
        """The request line, once the headers are read too; None when there are too many."""
        request_line = await reader.readline()
        for _ in range(MAX_HEADER_LINES):
            if (await reader.readline()) in (b"\r\n", b"\n", b""):
                return request_line
        return None

    async def _answer(self, reader: asyncio.StreamReader) -> Response:
        try:
            request_line = await self._read_head(reader)
        except ValueError:  # a line over the stream's limit
            return Response(431, b"header line too long\n")
        if request_line is None:
            return Response(431, b"too many header lines\n")
        parts = request_line.decode("latin-1").split()
        if len(parts) < 2:
            return Response(400, b"not an HTTP request\n")
        method, path = parts[0], parts[1].split("?", 1)[0]
        handler = self.routes.get(path)
        if method != "GET":
            return Response(405, b"only GET\n")
        if handler is None:
            # the path is not echoed: nothing a client sends comes back to it
            return Response(404, b"no such path; this server has " + self._paths() + b"\n")
        result = handler()
        return await result if isinstance(result, Awaitable) else result

    def _paths(self) -> bytes:
        return ", ".join(sorted(self.routes)).encode()

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response) -> None:
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + response.body)
        await writer.drain()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def status_server(
    settings: HttpSettings,
    bind_host: str,
    port: int,
    routes: dict[str, Handler],
    *,
    component: str,
) -> StatusServer:
    """The status server a process's settings describe (address, TLS, bounds)."""
    tls = None
    if settings.http_tls_cert_file is not None and settings.http_tls_key_file is not None:
        tls = ReloadingSslContext(
            settings.http_tls_cert_file, settings.http_tls_key_file, component=f"{component}-http"
        )
    return StatusServer(
        settings.http_bind_host or bind_host,
        port,
        routes,
        tls=tls,
        max_connections=settings.http_max_connections,
    )
