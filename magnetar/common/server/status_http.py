"""A small HTTP server for what operators and Prometheus scrape (/metrics and /health), and for
a few small admin calls (a broker's Pulsar-style admin REST API, mounted under a path prefix).

Bookies (port 8000), brokers (port 8080) and autorecovery (8001) serve their metrics and health
beside their gRPC port. This is deliberately tiny: one response per connection, handlers return
bytes. The status paths are GET only. A path prefix given in ``apps`` (only brokers give one)
takes GET, PUT, POST and DELETE with a small body. No framework: one less dependency, and
nothing here is on a data path.

It is reachable by whoever reaches the port, so it gives nothing away and cannot be held:

- it answers only the paths it serves, and a refusal does not echo what it was sent (the admin
  API's errors name the topic they concern, as Pulsar's do);
- a request must arrive whole (request line, headers of at most :data:`MAX_HEADER_LINES`
  lines, and its body) within ``request_timeout_s``, counted from the connection, not per line:
  a client that trickles a header line or a body byte every few seconds is cut off at the
  deadline;
- a body needs a ``Content-Length`` (no chunked bodies) of at most ``max_body_bytes``; a larger
  one is refused unread;
- the handler of an admin call has ``handler_timeout_s`` to answer, and the answer is written
  within ``request_timeout_s`` (a client that does not read it is cut off);
- at most ``max_connections`` connections are served at once; beyond that a new connection is
  closed at once, unread, so slow clients cannot pile up;
- with ``tls`` it speaks HTTPS, the certificate reloaded from its files when they change;
- it can listen on an address of its own (``http_bind_host``), apart from the data ports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import structlog

from magnetar.common.security.config import HttpSettings
from magnetar.common.security.tls import ReloadingSslContext

log = structlog.get_logger("magnetar.http")

MAX_HEADER_LINES = 100
"""Header lines a request may carry at most."""
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_BODY_BYTES = 16 * 1024
"""The largest request body an app takes (admin calls carry a number, a boolean or a small
JSON object)."""
DEFAULT_HANDLER_TIMEOUT_S = 60.0
KEPT_HEADERS = frozenset(
    {"authorization", "content-length", "content-type", "host", "transfer-encoding"}
)
"""The headers a request keeps (the others are read and dropped, so a head of many long lines
holds no memory)."""
LINGER_S = 1.0
"""How long a connection stays half-closed after its response, for the client to close it."""
APP_METHODS = frozenset({"GET", "PUT", "POST", "DELETE"})
"""The methods a path under an app's prefix takes."""


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[], Response | Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Request:
    """A whole request for an app: read within the deadline, its body within the bound."""

    method: str
    path: str
    """The path as sent (percent-encoded), without the query."""
    query: str = ""
    """What followed ``?``, as sent."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The :data:`KEPT_HEADERS` it sent, names lower-cased; one sent twice keeps its last
    value."""
    body: bytes = b""
    peer: str = ""
    """The client's address, for logs (``ipv4:127.0.0.1:51234``)."""


App = Callable[[Request], Awaitable[Response]]

_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    412: "Precondition Failed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class StatusServer:
    """Serves ``routes`` (path -> handler, GET only) on ``host:port``, and every path under a
    prefix of ``apps`` (prefix -> app) with the app."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Handler],
        *,
        tls: ReloadingSslContext | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        apps: Mapping[str, App] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        handler_timeout_s: float = DEFAULT_HANDLER_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self.apps = dict(apps or {})
        self.max_body_bytes = max_body_bytes
        self.handler_timeout_s = handler_timeout_s
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
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    if self.tls is not None:
                        await writer.start_tls(self.tls.current())
                    answer = await self._answer(reader, writer)
            except TimeoutError:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self._write(writer, Response(408, b"request not received in time\n")), 1
                    )
                return
            if isinstance(answer, Request):
                answer = await self._run_app(answer)
            async with asyncio.timeout(self.request_timeout_s):
                await self._write(writer, answer)
            await self._linger(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, TimeoutError):
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
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then read what the client still sends until it closes (at most
        :data:`LINGER_S`): closing with a refused body unread would reset the connection, and a
        reset can lose the response before the client reads it."""
        if not writer.can_write_eof():
            return
        writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while await reader.read(64 * 1024):
                    pass

    async def _run_app(self, request: Request) -> Response:
        app = self._app_for(request.path)
        assert app is not None
        try:
            async with asyncio.timeout(self.handler_timeout_s):
                return await app(request)
        except TimeoutError:
            return Response(504, b"the request did not finish in time\n")

    def _app_for(self, path: str) -> App | None:
        for prefix, app in self.apps.items():
            if path.startswith(prefix):
                return app
        return None

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str]] | None:
        """The request line and the headers; None when there are too many."""
        request_line = await reader.readline()
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return request_line, headers
            name, colon, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if colon and name in KEPT_HEADERS:
                headers[name] = value.strip()
        return None

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Response | Request:
        """The response to a status path or a refusal, or the whole request for an app."""
        try:
            head = await self._read_head(reader)
        except ValueError:  # a line over the stream's limit
            return Response(431, b"header line too long\n")
        if head is None:
            return Response(431, b"too many header lines\n")
        request_line, headers = head
        parts = request_line.decode("latin-1").split()
        if len(parts) < 2:
            return Response(400, b"not an HTTP request\n")
        method, (path, _, query) = parts[0], parts[1].partition("?")
        handler = self.routes.get(path)
        if handler is None and self._app_for(path) is not None:
            if method not in APP_METHODS:
                return Response(405, b"only GET, PUT, POST and DELETE\n")
            body = await self._read_body(reader, method, headers)
            if isinstance(body, Response):
                return body
            return Request(method, path, query, headers, body, peer=_peer(writer))
        if method != "GET":
            return Response(405, b"only GET\n")
        if handler is None:
            # the path is not echoed: nothing a client sends comes back to it
            return Response(404, b"no such path; this server has " + self._paths() + b"\n")
        result = handler()
        return await result if isinstance(result, Awaitable) else result

    async def _read_body(
        self, reader: asyncio.StreamReader, method: str, headers: Mapping[str, str]
    ) -> bytes | Response:
        """The body its Content-Length announces, or the refusal of a body that has none, a
        bad one or too large a one (refused unread)."""
        if "transfer-encoding" in headers:
            return Response(411, b"send the body with a Content-Length, not chunked\n")
        length_text = headers.get("content-length")
        if length_text is None:
            if method in ("PUT", "POST"):
                return Response(411, b"a PUT or POST needs a Content-Length header\n")
            return b""
        if not length_text.isdigit() or len(length_text) > 12:
            return Response(400, b"Content-Length is not a number of bytes\n")
        length = int(length_text)
        if length > self.max_body_bytes:
            return Response(
                413, f"a request body is at most {self.max_body_bytes:,} bytes\n".encode()
            )
        return await reader.readexactly(length)

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


def _peer(writer: asyncio.StreamWriter) -> str:
    address = writer.get_extra_info("peername")
    if isinstance(address, tuple) and len(address) >= 2:
        family = "ipv6" if ":" in str(address[0]) else "ipv4"
        return f"{family}:{address[0]}:{address[1]}"
    return str(address or "")


def status_server(
    settings: HttpSettings,
    bind_host: str,
    port: int,
    routes: dict[str, Handler],
    *,
    component: str,
    apps: Mapping[str, App] | None = None,
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
        apps=apps,
    )
