"""What every Magnetar server process shares: its gRPC server options, gRPC server reflection,
and the run loop of ``magnetar bookie`` / ``magnetar broker`` (serve until SIGTERM or SIGINT,
then stop).

Reflection (``grpc.reflection.v1alpha.ServerReflection``) lets grpcurl, Postman or evans list a
server's services and fetch their descriptors without the ``.proto`` files. It is served on the
same listeners as everything else, so TLS and mutual TLS apply to it as they do to every call,
but, like the health service, it asks for no token: it tells only what the published ``.proto``
files already say (the schema, never a topic, a ledger, a role or a setting), and the probes and
tools that read it have no credentials to give.
"""

from __future__ import annotations

import asyncio
import resource
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc.aio
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from magnetar.common.errors import InvalidConfigError
from magnetar.common.security.config import ConnectionSettings

T = TypeVar("T")


def grpc_server_options(
    max_message_bytes: int, limits: ConnectionSettings | None = None
) -> list[tuple[str, int]]:
    """Message size limits, keepalives that notice dead clients, an exclusive port, and the
    bounds on connections of ``limits``."""
    limits = limits or ConnectionSettings()
    bounds = [("grpc.server_handshake_timeout_ms", limits.connection_handshake_timeout_ms)]
    if limits.max_connections:
        # enforced as a connection is accepted, before any handshake
        bounds.append(("grpc.max_allowed_incoming_connections", limits.max_connections))
    if limits.max_connection_idle_ms:
        bounds.append(("grpc.max_connection_idle_ms", limits.max_connection_idle_ms))
    return [
        *bounds,
        # gRPC shares a port between servers by default (SO_REUSEPORT): a second broker or
        # standalone started on a taken port would then serve half the connections at random.
        # With it off, the second one fails to start, saying the port is in use.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def serve_reflection(server: grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Add gRPC server reflection to ``server`` (not started yet), listing ``service_names``,
    the health service and reflection itself."""
    reflection.enable_server_reflection(
        (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )


async def run_until_signalled(
    start: Callable[[], Awaitable[T]],
    ready_line: Callable[[T], str],
    stop: Callable[[T], Awaitable[None]],
) -> int:
    """Start a server, print its ready line (scripts and the test kit wait for it), serve until
    SIGTERM or SIGINT, then stop it. A signal during start-up stops it right after it started."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    server = await start()
    print(ready_line(server), flush=True)  # noqa: T201 - the ready line is the command's output
    await stopping.wait()
    await stop(server)
    return 0


def listen(
    server: grpc.aio.Server,
    host: str,
    port: int,
    *,
    flag: str = "--port",
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Bind ``server`` to ``host:port`` (0: any free port), over TLS when ``credentials`` are
    given; the port it got. A port that is taken raises :class:`InvalidConfigError` saying so,
    instead of gRPC's bare RuntimeError."""
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise InvalidConfigError(
            f"cannot listen on {host}:{port}: the port is in use (another Magnetar process?)"
            f" or the address is not this machine's; stop the other process or choose another"
            f" {flag}",
            context={"address": f"{host}:{port}"},
        )
    return bound


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit (a server holds a file
    descriptor per connection, and the usual soft limit of 1,024 is far below
    ``max_connections``); the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit of RLIM_INFINITY some kernels refuse
            return soft, hard
        soft = hard
    return soft, hard
