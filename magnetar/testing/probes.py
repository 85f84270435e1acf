"""Asking a server what a Kubernetes probe asks it: the gRPC health service, and HTTP GETs of
its status paths (/health, /metrics). For tests of probes, the chart and the processes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def grpc_health(address: str, service: str = "", *, timeout_s: float = 2) -> int:
    """The status ``grpc.health.v1.Health/Check`` gives ``service`` at ``host:port`` (one
    channel per call, as a probe opens one); raises ``grpc.aio.AioRpcError`` if it cannot."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
    return int(answer.status)


async def http_get(
    port: int,
    path: str = "/health",
    *,
    host: str = "127.0.0.1",
    timeout_s: float = 5,
    tls: ssl.SSLContext | None = None,
) -> tuple[int, str]:
    """One GET of ``path`` (HTTPS with ``tls``, a client context trusting the server's CA): the
    status code and the body (the status servers close the connection after each response)."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None
        )
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            if tls is not None:
                writer.transport.abort()  # a TLS close would wait for the server's close_notify
            else:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body
