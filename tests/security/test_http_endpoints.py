"""The HTTP status port (metrics, health) can be held by no one, tells nothing, and speaks TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest

from magnetar.common.security.tls import ReloadingSslContext
from magnetar.common.server.status_http import Handler, Response, StatusServer
from magnetar.testing.probes import http_get
from magnetar.testing.security import TestPki

pytestmark = pytest.mark.timeout(60)


def routes() -> dict[str, Handler]:
    return {"/health": lambda: Response(200, b"ok\n"), "/metrics": lambda: Response(200, b"m 1\n")}


async def slow_client(port: int, stop: asyncio.Event) -> bytes:
    """Opens a request and sends one header line a second, forever; what the server says."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return b"refused"
    answer = b"still open"
    try:
        writer.write(b"GET /health HTTP/1.1\r\n")
        while not stop.is_set():
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(100), 1.0) or b"closed"
                break
    except (ConnectionError, OSError):
        answer = b"reset"
    finally:
        writer.transport.abort()
    return answer


async def test_slow_clients_are_bounded_and_cut_off(tmp_path: Path) -> None:
    server = StatusServer(
        "127.0.0.1",
        0,
        routes(),
        max_connections=20,
        request_timeout_s=2.0,
    )
    port = await server.start()
    stop = asyncio.Event()
    try:
        clients = [asyncio.create_task(slow_client(port, stop)) for _ in range(300)]
        # the deadline is for the whole request, not per line: every slow client is cut off
        results = await asyncio.wait_for(asyncio.gather(*clients), 20)
        assert b"still open" not in results
        assert any(r.startswith(b"HTTP/1.1 408") for r in results)
        assert server.peak <= 20, "never more than the cap held at once"
        assert server.refused >= 200, "the rest were turned away at once, unread"
        assert server.served + server.refused == 300
        assert server.active == 0
        status, body = await http_get(port, "/health")
        assert (status, body) == (200, "ok\n")
    finally:
        stop.set()
        await server.stop()


async def test_refusals_echo_nothing_and_limits_hold(tmp_path: Path) -> None:
    server = StatusServer("127.0.0.1", 0, routes())
    port = await server.start()
    try:
        status, body = await http_get(port, "/<script>alert(1)</script>")
        assert status == 404
        assert "script" not in body
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 431")
    finally:
        await server.stop()


async def https_get(port: int, ca_file: Path, path: str = "/health") -> tuple[str, str]:
    """The status line and the certificate's common name of one HTTPS GET."""
    context = ssl.create_default_context(cafile=str(ca_file))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    peer = writer.get_extra_info("peercert")
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.transport.abort()
    subject = {key: value for rdn in peer["subject"] for key, value in rdn}
    return answer.split(b"\r\n", 1)[0].decode(), subject["commonName"]


async def test_https_with_a_certificate_that_reloads(tmp_path: Path) -> None:
    pki = TestPki(tmp_path)
    pki.issue("status-v1", name="http")
    tls = ReloadingSslContext(tmp_path / "http.pem", tmp_path / "http.key", component="test")
    server = StatusServer("127.0.0.1", 0, routes(), tls=tls)
    port = await server.start()
    try:
        assert await https_get(port, pki.ca_file) == ("HTTP/1.1 200 OK", "status-v1")
        pki.issue("status-v2", name="http")
        await asyncio.sleep(1.1)
        assert await https_get(port, pki.ca_file) == ("HTTP/1.1 200 OK", "status-v2")
        # plain HTTP to the HTTPS port gets nothing
        with pytest.raises((ValueError, IndexError, OSError, asyncio.IncompleteReadError)):
            await http_get(port, "/health", timeout_s=3)
    finally:
        await server.stop()
