"""``magnetar autorecovery``: one instance on its own, serving ``/health`` and ``/metrics`` over
HTTP."""

from __future__ import annotations

import socket

import structlog

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.metrics import AutorecoveryMetrics
from bookie.autorecovery.worker import Autorecovery
from magnetar.common.errors import InvalidConfigError
from magnetar.common.server.serving import run_until_signalled
from magnetar.common.server.status_http import Response, status_server
from metadata import MetadataStore, open_store

log = structlog.get_logger("magnetar.autorecovery")


class AutorecoveryProcess:
    """``magnetar autorecovery``: one instance, and /health and /metrics over HTTP.

    Create with :meth:`start`, end with :meth:`stop`. The HTTP server listens before the
    instance starts, so a taken port fails the start before it joins the election.
    """

    def __init__(
        self, config: AutorecoveryConfig, store: MetadataStore, *, owns_store: bool
    ) -> None:
        self.config = config
        self.store = store
        self._owns_store = owns_store
        self.instance = Autorecovery(store, config)
        self.metrics = AutorecoveryMetrics(self.instance)
        self._http = status_server(
            config,
            config.bind_host,
            config.http_port,
            {"/metrics": self._metrics, "/health": self._health_check},
            component="autorecovery",
        )
        self.http_port = 0

    @classmethod
    async def start(
        cls, config: AutorecoveryConfig, *, store: MetadataStore | None = None
    ) -> AutorecoveryProcess:
        """Open the metadata store (unless ``store`` is given, which it then does not close),
        listen on ``http_port``, start the instance."""
        if store is None:
            store = await open_store(config.store_config(config.metadata))
            self = cls(config, store, owns_store=True)
        else:
            self = cls(config, store, owns_store=False)
        try:
            try:
                self.http_port = await self._http.start()
            except OSError as e:
                raise InvalidConfigError(
                    f"cannot listen on {config.bind_host}:{config.http_port} for /metrics and"
                    f" /health: {e.strerror or e}; stop the other process or choose another"
                    " --http-port",
                    context={"address": f"{config.bind_host}:{config.http_port}"},
                ) from None
            await self.instance.start()
        except BaseException:
            await self.instance.close()
            await self._http.stop()
            await self._close_store()
            raise
        log.info("autorecovery_started", name=config.name, http_port=self.http_port)
        return self

    @property
    def http_host(self) -> str:
        """Where to reach the HTTP server: the bind address, or this machine's name."""
        host = self.config.bind_host
        return socket.gethostname() if host in ("", "0.0.0.0", "::") else host  # noqa: S104

    def _metrics(self) -> Response:
        return Response(200, self.metrics.render(), "text/plain; version=0.0.4")

    def _health_check(self) -> Response:
        ok, state = self.instance.health()
        return (
            Response(200, f"ok {state}\n".encode()) if ok else Response(503, f"{state}\n".encode())
        )

    async def stop(self) -> None:
        """Leave the election (another instance takes over), then stop serving."""
        await self.instance.close()
        await self._http.stop()
        await self._close_store()
        log.info("autorecovery_stopped", name=self.config.name)

    async def _close_store(self) -> None:
        if self._owns_store:
            await self.store.close()


async def run_autorecovery(config: AutorecoveryConfig) -> int:
    """Run an autorecovery instance until SIGTERM or SIGINT (``magnetar autorecovery``)."""
    return await run_until_signalled(
        lambda: AutorecoveryProcess.start(config),
        lambda p: (
            f"autorecovery {config.name} running"
            f" (metrics: {p._http.scheme}://{p.http_host}:{p.http_port}/metrics)"
        ),
        lambda p: p.stop(),
    )
