"""Runs one bookie: identity, storage, service, gRPC and HTTP servers, registration.

``magnetar bookie`` runs one :class:`BookieProcess` per OS process; ``magnetar standalone`` and
the test kit run several in one process, sharing one metadata store. Start-up order is identity
(refuse a foreign or wiped directory before touching it), storage (recovery), the servers, and
registration last: a bookie is announced only once it can serve. Shutdown runs the other way, so
clients stop choosing the bookie before it stops answering.

Health, for Kubernetes probes (the contract is :mod:`magnetar.common.server.health`'s), on the gRPC
port: service ``""`` (:data:`READINESS_SERVICE`) is SERVING only while the bookie is registered
under a live metadata session and is not stopping; it drops when the session is lost or a stop
begins and comes back once the bookie has registered again. :data:`LIVENESS_SERVICE` is SERVING
from the end of start-up until a stop begins, whatever etcd does. HTTP ``/health`` answers 200
exactly when ``""`` is SERVING, 503 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import grpc
import grpc.aio
import structlog

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.worker import Autorecovery
from bookie.client.config import LedgerClientConfig
from bookie.framed.server import FramedBookieServer
from bookie.grpc.servicer import BookieServicer
from bookie.service.access import BookieAccess
from bookie.service.bookie import Bookie, DiskProbe
from bookie.service.config import BookieConfig
from bookie.service.metrics import BookieMetrics
from bookie.service.registration import Registration, establish_identity
from bookie.storage.engine import StorageEngine
from magnetar.common.errors import InvalidConfigError
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
from magnetar.common.server.status_http import Response, StatusServer, status_server
from metadata import MetadataStore, open_store
from proto.bookie.v1 import bookie_pb2, bookie_pb2_grpc

log = structlog.get_logger("magnetar.bookie.process")

SERVICE_NAME = "magnetar.bookie.v1.BookieService"
READINESS_SERVICE = _READINESS
"""gRPC health service name for readiness probes (the overall service, ``""``)."""
LIVENESS_SERVICE = SERVICE_NAME
"""gRPC health service name for liveness and startup probes: SERVING while the process runs."""
MAX_GRPC_MESSAGE_BYTES = 256 * 1024 * 1024


class BookieProcess:
    """A running bookie. Create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self) -> None:
        self.config: BookieConfig
        self.bookie: Bookie
        self.storage: StorageEngine
        self.store: MetadataStore
        self._owns_store = False
        self._server: grpc.aio.Server
        self._health: ProcessHealth
        self._http: StatusServer
        self._registration: Registration | None = None
        self._autorecovery: Autorecovery | None = None
        self.port = 0
        self.http_port = 0
        self.data_port = 0
        self.address = ""
        self.data_address = ""
        """host:port of the framed data protocol, which ledger clients use."""
        self.tls: ReloadingServerCredentials | None = None
        self._data: FramedBookieServer | None = None
        self.access: BookieAccess
        self._stopped = asyncio.Event()

    @classmethod
    async def start(
        cls,
        config: BookieConfig,
        *,
        store: MetadataStore | None = None,
        disk_probe: DiskProbe | None = None,
    ) -> BookieProcess:
        """Bring a bookie up; ``store`` shares a metadata store (standalone, tests)."""
        self = cls()
        self.config = config
        if store is None:
            self.store = await open_store(config.metadata_config())
            self._owns_store = True
        else:
            self.store = store
        try:
            await self._start(config, disk_probe)
        except BaseException:
            await self._close_store()
            raise
        return self

    async def _start(self, config: BookieConfig, disk_probe: DiskProbe | None) -> None:
        data_dir = Path(config.data_dir)
        identity = await establish_identity(self.store, data_dir, config.bookie_id)
        self.storage = await StorageEngine.open(data_dir / "storage", config.storage)
        metrics = BookieMetrics(identity.bookie_id)
        self.bookie = Bookie(
            config,
            self.storage,
            bookie_id=identity.bookie_id,
            disk_probe=disk_probe,
            metrics=metrics,
        )
        raise_file_limit()  # a descriptor per connection: up to max_connections
        self._server = grpc.aio.server(
            options=grpc_server_options(MAX_GRPC_MESSAGE_BYTES, config),
            # a request that does not decode: INVALID_ARGUMENT naming the field, one log line
            interceptors=[
                RequestDecoding(
                    [bookie_pb2.DESCRIPTOR.services_by_name["BookieService"]],
                    per_ip=ConnectionsPerIp(config.max_connections_per_ip),
                )
            ],
        )
        self.access = BookieAccess(
            config, client_roles=config.bookie_client_roles, bookie_id=identity.bookie_id
        )
        metrics.bind_access(self.access)
        bookie_pb2_grpc.add_BookieServiceServicer_to_server(
            BookieServicer(
                self.bookie,
                max_inflight_bytes=config.max_inflight_bytes_per_stream,
                access=self.access,
            ),
            self._server,
        )
        self._health = await ProcessHealth.serve(
            self._server, (LIVENESS_SERVICE,), bookie=identity.bookie_id
        )
        serve_reflection(self._server, (SERVICE_NAME,))
        try:
            if config.tls_cert_file is not None and config.tls_key_file is not None:
                self.tls = ReloadingServerCredentials(
                    config.tls_cert_file,
                    config.tls_key_file,
                    config.tls_trust_certs_file,
                    component="bookie",
                )
            self.port = listen(
                self._server,
                config.bind_host,
                config.port,
                credentials=self.tls.credentials if self.tls is not None else None,
            )
            await self._start_data_port(config)
        except InvalidConfigError:
            await self.storage.close()
            raise
        host = config.advertised_host or socket.gethostname()
        self.address = f"{host}:{self.port}"
        self.data_address = f"{host}:{self.data_port}"
        self.bookie.address = self.address
        if not config.authentication_enabled and not is_loopback(config.bind_host):
            log.warning(
                "authentication_disabled",
                bookie=identity.bookie_id,
                bind_host=config.bind_host,
                message=(
                    f"AUTHENTICATION IS OFF and the bookie listens on {config.bind_host}: anyone"
                    " who can reach its port may add to, read and fence any ledger. Keep bookie"
                    " ports on a network only brokers and autorecovery reach (the Helm chart's"
                    " NetworkPolicies do), or bind to 127.0.0.1."
                ),
            )
        self._http = status_server(
            config,
            config.bind_host,
            config.http_port,
            {"/metrics": self._metrics, "/health": self._health_check},
            component="bookie",
        )
        self.http_port = await self._http.start()
        await self._server.start()
        self.bookie.start()
        self._registration = Registration(
            self.store,
            identity,
            self.bookie.status,
            http_address=f"{host}:{self.http_port}",
            data_address=self.data_address,
            ttl_s=config.session_ttl_s,
            refresh_s=config.registration_refresh_s,
        )
        self.bookie.on_state_change(self._registration.changed)
        self._registration.on_registered_change(self._health.changed)
        await self._registration.start()
        if config.autorecovery:
            self._autorecovery = await Autorecovery(
                self.store,
                AutorecoveryConfig(
                    metadata=config.metadata,
                    name=f"bookie:{identity.bookie_id}",
                    # it reaches the other bookies as this bookie: with its own certificate
                    # (whose role must be one of their bookie_client_roles)
                    ledger=LedgerClientConfig(
                        tls_trust_certs_file=config.tls_trust_certs_file,
                        tls_cert_file=config.tls_cert_file,
                        tls_key_file=config.tls_key_file,
                    ),
                ),
            ).start()
        await self._health.started(self._ready)
        log.info(
            "bookie_started",
            bookie=identity.bookie_id,
            address=self.address,
            data_address=self.data_address,
            http_port=self.http_port,
            ledgers=len(self.storage.index.ledgers),
            read_only=self.bookie.read_only,
        )

    async def _start_data_port(self, config: BookieConfig) -> None:
        """Listen for the framed data protocol, with the gRPC port's TLS files and roles."""
        tls = None
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            tls = ReloadingSslContext(
                config.tls_cert_file,
                config.tls_key_file,
                config.tls_trust_certs_file,
                component="bookie-data",
            )
        self._data = FramedBookieServer(
            self.bookie,
            access=self.access,
            tls=tls,
            max_frame_bytes=config.max_data_frame_bytes,
            max_inflight_bytes=config.max_inflight_bytes_per_stream,
            max_connections=config.max_connections,
            handshake_timeout_s=config.connection_handshake_timeout_ms / 1000,
        )
        self.bookie.metrics.bind_data_port(self._data)
        try:
            self.data_port = await self._data.start(config.bind_host, config.data_port)
        except OSError as e:
            self._data = None
            raise InvalidConfigError(
                f"cannot listen on {config.bind_host}:{config.data_port} for the data protocol:"
                f" {e.strerror or e} (another Magnetar process?); stop the other process or"
                " choose another --data-port",
                context={"address": f"{config.bind_host}:{config.data_port}"},
            ) from None

    @property
    def data_server(self) -> FramedBookieServer | None:
        """The framed data port's server (its connection counters, for tests and metrics)."""
        return self._data

    @property
    def bookie_id(self) -> str:
        return self.bookie.bookie_id

    def _metrics(self) -> Response:
        return Response(200, self.bookie.metrics.render(), "text/plain; version=0.0.4")

    def _ready(self) -> bool:
        registration = self._registration
        return not self._stopped.is_set() and registration is not None and registration.registered

    def _health_check(self) -> Response:
        if self._registration is None:
            return Response(503, b"starting\n")
        if self._stopped.is_set():
            return Response(503, b"stopping\n")
        if not self._ready():
            return Response(503, b"not registered: no metadata session\n")
        state = "read-only" if self.bookie.read_only else "writable"
        return Response(200, f"ok {state}\n".encode())

    async def stop(self, grace_s: float = 5.0) -> None:
        """Leave the cluster, finish in-flight requests (up to ``grace_s``), close the files."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        # unready before leaving the cluster, so nothing new is sent to a bookie on its way out
        with contextlib.suppress(Exception):
            await self._health.stop()
        if self._autorecovery is not None:
            await self._autorecovery.close()
        if self._registration is not None:
            with contextlib.suppress(Exception):
                await self._registration.close()
        if self._data is not None:
            await self._data.stop(grace_s)
        await self._server.stop(grace_s)
        await self._http.stop()
        await self.bookie.stop()
        await self.storage.close()
        await self._close_store()
        log.info("bookie_stopped", bookie=self.bookie.bookie_id)

    async def _close_store(self) -> None:
        if self._owns_store:
            await self.store.close()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def run_bookie(config: BookieConfig) -> int:
    """Run a bookie until SIGTERM or SIGINT; the body of ``magnetar bookie``."""
    return await run_until_signalled(
        lambda: BookieProcess.start(config),
        lambda p: (
            f"bookie {p.bookie_id} serving on {p.address}, data on {p.data_address}"
            f" (metrics: {p._http.scheme}://{p.address.rsplit(':', 1)[0]}:{p.http_port}/metrics)"
        ),
        lambda p: p.stop(),
    )
