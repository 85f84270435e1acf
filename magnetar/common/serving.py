"""What every Magnetar server process shares: its gRPC server options and the run loop of
``magnetar bookie`` / ``magnetar broker`` (serve until SIGTERM or SIGINT, then stop)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc.aio

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
