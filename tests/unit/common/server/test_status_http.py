"""The status server's requests for an app (a path prefix that takes PUT, POST, DELETE and a
body): a request arrives whole or not at all, its body is bounded and announced, and the status
paths answer as before whatever the app's clients send."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from magnetar.common.server.status_http import Request, Response, StatusServer
from magnetar.testing.eventually import eventually
from magnetar.testing.probes import http_get

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """An app that answers 200 and keeps what it was sent."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.hang = False

    async def __call__(self, request: Request) -> Response:
        self.requests.append(request)
        if self.hang:
            await asyncio.Event().wait()
        return Response(200, b'{"ok": true}', "application/json")


@pytest.fixture
def app() -> Recorder:
    return Recorder()


@pytest.fixture
async def server(app: Recorder) -> AsyncIterator[StatusServer]:
    server = StatusServer(
        "127.0.0.1",
        0,
        {"/metrics": lambda: Response(200, b"m 1\n")},
        apps={"/admin/": app},
        max_body_bytes=64,
        request_timeout_s=1.0,
        handler_timeout_s=1.0,
    )
    await server.start()
    yield server
    await server.stop()


async def exchange(port: int, raw: bytes, *, pause_s: float = 0.0) -> tuple[int, bytes]:
    """Send ``raw`` (then wait ``pause_s`` before reading); the status and body answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        if pause_s:
            await asyncio.sleep(pause_s)
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_an_app_gets_the_whole_request(server: StatusServer, app: Recorder) -> None:
    status, body = await exchange(
        server.port,
        b"PUT /admin/v2/persistent/t/n/x/partitions?force=true HTTP/1.1\r\n"
        b"Host: x\r\nAuthorization: Bearer abc\r\nContent-Length: 1\r\n\r\n3",
    )
    assert (status, body) == (200, b'{"ok": true}')
    [request] = app.requests
    assert request.method == "PUT"
    assert request.path == "/admin/v2/persistent/t/n/x/partitions"
    assert request.query == "force=true"
    assert request.headers["authorization"] == "Bearer abc"
    assert request.body == b"3"
    assert request.peer.startswith("ipv4:127.0.0.1:")
    # a GET or DELETE needs no Content-Length
    assert (await exchange(server.port, b"DELETE /admin/x HTTP/1.1\r\n\r\n"))[0] == 200
    assert app.requests[-1].body == b""


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"PUT /admin/x HTTP/1.1\r\n\r\n3", 411, b"Content-Length"),
        (b"POST /admin/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n3\r\n0\r\n\r\n", 411,
         b"not chunked"),
        (b"PUT /admin/x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, b"not a number"),
        (b"PUT /admin/x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400, b"not a number"),
        (b"PUT /admin/x HTTP/1.1\r\nContent-Length: 65\r\n\r\n" + b"1" * 65, 413, b"at most 64"),
        (b"PUT /admin/x HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n", 400,
         b"not a number"),
        (b"PATCH /admin/x HTTP/1.1\r\nContent-Length: 1\r\n\r\n3", 405, b"only GET, PUT"),
        (b"PUT /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\n3", 405, b"only GET"),
        (b"POST /elsewhere HTTP/1.1\r\nContent-Length: 1\r\n\r\n3", 405, b"only GET"),
        (b"GET /elsewhere HTTP/1.1\r\n\r\n", 404, b"no such path"),
    ],
)  # fmt: skip
async def test_bad_requests_are_refused_before_the_app_and_the_server_goes_on(
    server: StatusServer, app: Recorder, raw: bytes, status: int, says: bytes
) -> None:
    answer = await exchange(server.port, raw)
    assert answer[0] == status, answer
    assert says in answer[1]
    assert b"elsewhere" not in answer[1]  # nothing sent comes back
    assert app.requests == []
    assert await http_get(server.port, "/metrics") == (200, "m 1\n")


async def test_a_body_that_does_not_arrive_in_time_is_cut_off(
    server: StatusServer, app: Recorder
) -> None:
    # the deadline counts from the connection: a body announced and never sent ends in 408
    status, body = await exchange(
        server.port, b"POST /admin/x HTTP/1.1\r\nContent-Length: 10\r\n\r\n12"
    )
    assert (status, body) == (408, b"request not received in time\n")
    assert app.requests == []
    assert server.active == 0
    assert await http_get(server.port, "/metrics") == (200, "m 1\n")


async def test_an_app_that_does_not_answer_in_time_gets_504(
    server: StatusServer, app: Recorder
) -> None:
    app.hang = True
    status, _ = await exchange(server.port, b"GET /admin/x HTTP/1.1\r\n\r\n")
    assert status == 504
    # the connection is let go once the client closes it (the server lingers until then)
    await eventually(lambda: server.active == 0, what="the connection let go")


async def test_a_client_that_hangs_up_mid_body_costs_nothing(
    server: StatusServer, app: Recorder
) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"PUT /admin/x HTTP/1.1\r\nContent-Length: 10\r\n\r\n12")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    assert await http_get(server.port, "/metrics") == (200, "m 1\n")
    assert app.requests == []


async def test_servers_without_apps_refuse_every_other_method_as_before() -> None:
    server = StatusServer("127.0.0.1", 0, {"/health": lambda: Response(200, b"ok\n")})
    await server.start()
    try:
        assert await exchange(
            server.port, b"PUT /admin/x HTTP/1.1\r\nContent-Length: 1\r\n\r\n3"
        ) == (405, b"only GET\n")
        assert (await exchange(server.port, b"GET /admin/x HTTP/1.1\r\n\r\n"))[0] == 404
    finally:
        await server.stop()
