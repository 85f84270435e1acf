"""Runs one broker: metadata store, ledger client, the broker core, gRPC and HTTP servers.

``magnetar broker`` runs one :class:`BrokerProcess`; ``magnetar standalone`` and tests may run
one in-process with a shared metadata store. SIGTERM hands every partition over to other
brokers before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bookie.client.ledger_client import LedgerClient
from broker.grpc.admin import AdminServicer
from broker.grpc.servicer import BrokerServicer
from broker.service.broker import Broker
from broker.service.config import BrokerConfig
from broker.service.metrics import BrokerMetrics
from magnetar import __version__
from magnetar.common.serving import grpc_server_options, listen, run_until_signalled
from magnetar.common.status_http import Response, StatusServer
from metadata import MetadataStore, open_store
from proto.admin.v1 import admin_pb2_grpc
from proto.broker.v1 import broker_pb2_grpc

log = structlog.get_logger("magnetar.broker.process")

SERVICE_NAMES = ("magnetar.broker.v1.BrokerService", "magnetar.admin.v1.AdminService")
GRPC_OPTIONS = grpc_server_options(64 * 1024 * 1024)


class BrokerProcess:
    """A running broker. Create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self) -> None:
        self.config: BrokerConfig
        self.store: MetadataStore
        self.broker: Broker
        self.ledger_client: LedgerClient
        self._owns_store = False
        self._server: grpc.aio.Server
        self._health: health.aio.HealthServicer
        self._http: StatusServer
        self._admin: AdminServicer
        self.port = 0
        self.http_port = 0
        self.address = ""
        self._stopped = asyncio.Event()

    @classmethod
    async def start(
        cls, config: BrokerConfig, *, store: MetadataStore | None = None
    ) -> BrokerProcess:
        self = cls()
        self.config = config
        if store is None:
            self.store = await open_store(config.metadata)
            self._owns_store = True
        else:
            self.store = store
        try:
            await self._start(config)
        except BaseException:
            if self._owns_store:
                await self.store.close()
            raise
        return self

    async def _start(self, config: BrokerConfig) -> None:
        self._server = grpc.aio.server(options=GRPC_OPTIONS)
        self.port = listen(self._server, config.bind_host, config.port)
        host = config.advertised_host or socket.gethostname()
        self.address = f"{host}:{self.port}"
        broker_id = config.broker_id or f"{host}-{self.port}".replace(":", "-")
        self.ledger_client = await LedgerClient.start(
            self.store, config.ledger, creator=f"broker:{broker_id}"
        )
        self._http = StatusServer(
            config.bind_host,
            config.http_port,
            {"/metrics": self._metrics, "/health": self._health_check},
        )
        self.http_port = await self._http.start()
        self.broker = Broker(
            config,
            self.store,
            self.ledger_client,
            broker_id=broker_id,
            service_url=f"magnetar://{self.address}",
            http_address=f"{host}:{self.http_port}",
            version=__version__,
        )
        self.metrics = BrokerMetrics(self.broker)
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(
            BrokerServicer(self.broker), self._server
        )
        self._admin = AdminServicer(self.broker)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self._admin, self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._server.start()
        await self.broker.start()
        for service in ("", *SERVICE_NAMES):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("broker_serving", broker=broker_id, address=self.address, http_port=self.http_port)

    @property
    def broker_id(self) -> str:
        return self.broker.broker_id

    def _metrics(self) -> Response:
        return Response(200, self.metrics.render(), "text/plain; version=0.0.4")

    def _health_check(self) -> Response:
        session = self.broker.session
        if session is None or not session.alive:
            return Response(503, b"no metadata session\n")
        return Response(200, f"ok {len(self.broker.topics.topics)} partitions\n".encode())

    async def stop(self, *, graceful: bool = True, grace_s: float = 5.0) -> None:
        """Hand partitions over (graceful), then stop serving and close everything."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(Exception):
            await self._health.enter_graceful_shutdown()
        if graceful:
            await self.broker.shutdown()
        else:
            await self.broker.close()
        await self._server.stop(grace_s)
        await self._admin.close()
        await self._http.stop()
        await self.ledger_client.close()
        if self._owns_store:
            await self.store.close()
        log.info("broker_process_stopped", broker=self.broker_id)


async def run_broker(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM or SIGINT (handing its partitions over then); the body of
    ``magnetar broker``."""
    return await run_until_signalled(
        lambda: BrokerProcess.start(config),
        lambda p: (
            f"broker {p.broker_id} serving on {p.address}"
            f" (metrics: http://{p.address.rsplit(':', 1)[0]}:{p.http_port}/metrics)"
        ),
        lambda p: p.stop(),
    )
