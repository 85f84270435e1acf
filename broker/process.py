"""Runs one broker: metadata store, ledger client, the broker core, gRPC and HTTP servers (the
HTTP port serves /metrics, /health and Pulsar's admin REST API under /admin/v2/).

``magnetar broker`` runs one :class:`BrokerProcess`; ``magnetar standalone`` and tests may run
one in-process with a shared metadata store. SIGTERM hands every partition over to other
brokers before the process exits.

Health, for Kubernetes probes (the contract is :mod:`magnetar.common.server.health`'s), on the gRPC
port: service ``""`` (:data:`READINESS_SERVICE`) is SERVING only while the broker holds a live
metadata session and is not stopping; it drops the moment the session is lost or a stop begins,
before any partition is handed over, and comes back when the broker has a new session. The
broker's service names (:data:`LIVENESS_SERVICE` and the admin service) are SERVING from the end
of start-up until a stop begins, whatever etcd does. HTTP ``/health`` answers 200 exactly when
``""`` is SERVING, 503 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import grpc.aio
import structlog

from bookie.client.ledger_client import LedgerClient
from broker.grpc.admin import AdminServicer
from broker.grpc.servicer import BrokerServicer
from broker.http.admin_rest import PREFIX as ADMIN_REST_PREFIX
from broker.http.admin_rest import PulsarAdminRest
from broker.pulsar.entries import magnetar_entry
from broker.pulsar.listener import PulsarListener
from broker.service.broker import Broker
from broker.service.config import BrokerConfig
from broker.service.metrics import BrokerMetrics
from magnetar import __version__
from magnetar.common.grpc_decoding import RequestDecoding
from magnetar.common.peer_limits import ConnectionsPerIp
from magnetar.common.security.config import is_loopback
from magnetar.common.security.tls import ReloadingServerCredentials, ReloadingSslContext
from magnetar.common.server.health import READINESS_SERVICE as _READINESS
from magnetar.common.server.health import ProcessHealth
from magnetar.common.server.serving import (
    grpc_server_options,
    listen,
    raise_file_limit,
    run_until_signalled,
    serve_reflection,
)
from magnetar.common.server.status_http import Request, Response, StatusServer, status_server
from metadata import MetadataStore, open_store
from proto.admin.v1 import admin_pb2, admin_pb2_grpc
from proto.broker.v1 import broker_pb2, broker_pb2_grpc

log = structlog.get_logger("magnetar.broker.process")

READINESS_SERVICE = _READINESS
"""gRPC health service name for readiness probes (the overall service, ``""``)."""
LIVENESS_SERVICE = "magnetar.broker.v1.BrokerService"
"""gRPC health service name for liveness and startup probes: SERVING while the process runs."""
SERVICE_NAMES = (LIVENESS_SERVICE, "magnetar.admin.v1.AdminService")
"""The broker's gRPC services; each is a liveness name on the health service."""
MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024


class BrokerProcess:
    """A running broker. Create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self) -> None:
        self.config: BrokerConfig
        self.store: MetadataStore
        self.broker: Broker
        self.ledger_client: LedgerClient
        self._owns_store = False
        self._server: grpc.aio.Server
        self._health: ProcessHealth
        self._http: StatusServer
        self._admin: AdminServicer
        self._admin_rest_api: PulsarAdminRest
        self.port = 0
        self.tls_port = 0
        self.http_port = 0
        self.pulsar_port = 0
        """Port of the Pulsar-protocol listener (0: none)."""
        self.pulsar_tls_port = 0
        """Port of the TLS Pulsar-protocol listener (0: none)."""
        self._pulsar: PulsarListener | None = None
        self._pulsar_tls: PulsarListener | None = None
        self.address = ""
        self.tls_address = ""
        self.tls: ReloadingServerCredentials | None = None
        self._started = False
        self._stopped = asyncio.Event()

    @classmethod
    async def start(
        cls, config: BrokerConfig, *, store: MetadataStore | None = None
    ) -> BrokerProcess:
        self = cls()
        self.config = config
        if store is None:
            self.store = await open_store(config.metadata_config())
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
        raise_file_limit()  # a descriptor per connection: up to max_connections
        self._server = grpc.aio.server(
            options=grpc_server_options(MAX_GRPC_MESSAGE_BYTES, config),
            interceptors=[
                RequestDecoding(
                    [
                        broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
                        admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
                    ],
                    per_ip=ConnectionsPerIp(config.max_connections_per_ip),
                )
            ],
        )
        host = config.advertised_host or socket.gethostname()
        if config.port is not None:
            self.port = listen(self._server, config.bind_host, config.port)
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            self.tls = ReloadingServerCredentials(
                config.tls_cert_file,
                config.tls_key_file,
                config.tls_trust_certs_file,
                component="broker",
            )
            self.tls_port = listen(
                self._server,
                config.bind_host,
                config.tls_port,
                flag="--tls-port",
                credentials=self.tls.credentials,
            )
            self.tls_address = f"{host}:{self.tls_port}"
        self.address = f"{host}:{self.port}" if self.port else self.tls_address
        broker_id = config.broker_id or f"{host}-{self.port or self.tls_port}".replace(":", "-")
        _warn_if_open(config, broker_id)
        self.ledger_client = await LedgerClient.start(
            self.store, config.ledger, creator=f"broker:{broker_id}"
        )
        self._http = status_server(
            config,
            config.bind_host,
            config.http_port,
            {"/metrics": self._metrics, "/health": self._health_check},
            component="broker",
            apps={ADMIN_REST_PREFIX: self._admin_rest},
        )
        self.http_port = await self._http.start()
        # plaintext, like `port`: a broker whose plaintext gRPC port is off (TLS only) opens none
        if config.pulsar_port is not None and config.port is not None:
            self._pulsar = PulsarListener()
            self.pulsar_port = await self._pulsar.bind(config.bind_host, config.pulsar_port)
        if (
            config.pulsar_tls_port is not None
            and config.tls_cert_file is not None
            and config.tls_key_file is not None
        ):
            self._pulsar_tls = PulsarListener(
                tls=ReloadingSslContext(
                    config.tls_cert_file,
                    config.tls_key_file,
                    config.tls_trust_certs_file,
                    component="broker-pulsar",
                ),
                handshake_timeout_s=config.connection_handshake_timeout_ms / 1000,
            )
            self.pulsar_tls_port = await self._pulsar_tls.bind(
                config.bind_host, config.pulsar_tls_port
            )
        self.broker = Broker(
            config,
            self.store,
            self.ledger_client,
            broker_id=broker_id,
            service_url=f"magnetar://{host}:{self.port}" if self.port else "",
            service_url_tls=f"magnetar+ssl://{self.tls_address}" if self.tls_port else "",
            http_address=f"{host}:{self.http_port}",
            pulsar_url=f"pulsar://{host}:{self.pulsar_port}" if self.pulsar_port else "",
            pulsar_url_tls=(
                f"pulsar+ssl://{host}:{self.pulsar_tls_port}" if self.pulsar_tls_port else ""
            ),
            version=__version__,
        )
        self.metrics = BrokerMetrics(self.broker)
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(
            BrokerServicer(
                self.broker,
                entry_for_client=lambda entry: magnetar_entry(entry, config.max_message_bytes),
            ),
            self._server,
        )
        self._admin = AdminServicer(self.broker)
        self._admin_rest_api = PulsarAdminRest(self._admin)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self._admin, self._server)
        self._health = await ProcessHealth.serve(self._server, SERVICE_NAMES, broker=broker_id)
        serve_reflection(self._server, SERVICE_NAMES)
        await self._server.start()
        await self.broker.start()
        for listener in (self._pulsar, self._pulsar_tls):
            if listener is not None:
                await listener.serve(self.broker)
        self._started = True
        self.broker.on_serving_change(self._health.changed)
        await self._health.started(self._ready)
        log.info(
            "broker_serving",
            broker=broker_id,
            address=self.address if self.port else None,
            tls_address=self.tls_address or None,
            http_port=self.http_port,
            pulsar_port=self.pulsar_port or None,
            pulsar_tls_port=self.pulsar_tls_port or None,
            authentication=config.authentication_enabled,
            authorization=config.authorization_enabled,
        )

    @property
    def broker_id(self) -> str:
        return self.broker.broker_id

    async def _admin_rest(self, request: Request) -> Response:
        """Pulsar's admin REST API, once the admin service is up (the HTTP port opens first)."""
        if not self._started:
            return Response(503, b'{"reason": "the broker is starting"}', "application/json")
        return await self._admin_rest_api(request)

    def _metrics(self) -> Response:
        return Response(200, self.metrics.render(), "text/plain; version=0.0.4")

    def _ready(self) -> bool:
        return self._started and not self._stopped.is_set() and self.broker.serving

    def _health_check(self) -> Response:
        if not self._started:
            return Response(503, b"starting\n")
        if self._stopped.is_set():
            return Response(503, b"stopping\n")
        if not self._ready():
            return Response(503, b"no metadata session\n")
        topics = list(self.broker.topics.topics.values())
        body = f"ok {len(topics)} partitions"
        # still ready: a broker cannot fix its bookies, and it serves reads meanwhile
        stalled = [t for t in topics if t.ml.write_problem is not None]
        if stalled:
            problem = stalled[0].ml.write_problem
            assert problem is not None
            body += f"; {len(stalled)} cannot write (e.g. {stalled[0].name}: {problem.message})"
        return Response(200, f"{body}\n".encode())

    async def stop(self, *, graceful: bool = True, grace_s: float = 5.0) -> None:
        """Hand partitions over (graceful), then stop serving and close everything."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        # unready before anything else, so clients stop coming while the partitions move
        with contextlib.suppress(Exception):
            await self._health.stop()
        if graceful:
            await self.broker.shutdown()
        else:
            await self.broker.close()
        await self._server.stop(grace_s)
        for listener in (self._pulsar, self._pulsar_tls):
            if listener is not None:
                await listener.stop()
        await self._admin.close()
        await self._http.stop()
        await self.ledger_client.close()
        if self._owns_store:
            await self.store.close()
        log.info("broker_process_stopped", broker=self.broker_id)


def _warn_if_open(config: BrokerConfig, broker_id: str) -> None:
    """One prominent line when anyone who can reach the broker may use it."""
    if config.authentication_enabled or is_loopback(config.bind_host):
        return
    log.warning(
        "authentication_disabled",
        broker=broker_id,
        bind_host=config.bind_host,
        message=(
            f"AUTHENTICATION IS OFF and the broker listens on {config.bind_host}: anyone who can"
            " reach it may produce, consume, delete topics and reset subscriptions. Turn on"
            " authentication_enabled (see docs/security.md) or bind to 127.0.0.1."
        ),
    )


def ready_line(process: BrokerProcess) -> str:
    """What ``magnetar broker`` prints once it serves (the test kit and scripts wait for it)."""
    host = process.address.rsplit(":", 1)[0]
    tls = f", TLS on {process.tls_address}" if process.tls_port else ""
    pulsar = f", Pulsar on {host}:{process.pulsar_port}" if process.pulsar_port else ""
    if process.pulsar_tls_port:
        pulsar += f", Pulsar TLS on {host}:{process.pulsar_tls_port}"
    return (
        f"broker {process.broker_id} serving on {process.address}{tls}{pulsar}"
        f" (metrics: {process._http.scheme}://{host}:{process.http_port}/metrics)"
    )


async def run_broker(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM or SIGINT (handing its partitions over then); the body of
    ``magnetar broker``."""
    return await run_until_signalled(
        lambda: BrokerProcess.start(config), ready_line, lambda p: p.stop()
    )
