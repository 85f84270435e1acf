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
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc.aio
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from magnetar.common.errors import InvalidConfigError

T = TypeVar("T")


def grpc_server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Message size limits, keepalives that notice dead clients, and an exclusive port."""
    return [
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
