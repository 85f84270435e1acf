"""A small HTTP server for what operators and Prometheus scrape: /metrics and /health.

Bookies (port 8000) and brokers (port 8080) serve their metrics and health on plain HTTP beside
their gRPC port. This is deliberately tiny: GET only, one response per connection, handlers
return bytes. No framework: one less dependency, and nothing here is on a data path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import structlog

log = structlog.get_logger("magnetar.http")


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[], Response | Awaitable[Response]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class StatusServer:
    """Serves ``routes`` (path -> handler) on ``host:port``."""

    def __init__(self, host: str, port: int, routes: dict[str, Handler]) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2:
                return
            method, path = parts[0], parts[1].split("?", 1)[0]
            handler = self.routes.get(path)
            if method != "GET":
                response = Response(405, b"only GET\n")
            elif handler is None:
                response = Response(404, f"no such path {path}\n".encode())
            else:
                result = handler()
                response = await result if isinstance(result, Awaitable) else result
            head = (
                f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
                f"Content-Type: {response.content_type}\r\n"
                f"Content-Length: {len(response.body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + response.body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("status_request_failed")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
