"""``magnetar standalone``: a whole Magnetar in one process, for a laptop.

Embedded metadata (no etcd), N bookies (3 by default: ledgers are written E3/Qw2/Qa2; with 1
bookie E1/Qw1/Qa1) and one broker, all under one data directory, so topics, messages and
subscription positions survive a restart. Every server is the real one, talking gRPC over
loopback; only the process boundary is gone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from bookie.client.config import LedgerClientConfig
from bookie.service.config import BookieConfig
from broker.service.config import DEFAULT_PULSAR_PORT, DEFAULT_PULSAR_TLS_PORT, BrokerConfig
from magnetar.common.config import config_error
from magnetar.common.files import private_dir
from magnetar.common.security.config import AuthenticationSettings, TlsSettings

if TYPE_CHECKING:
    from bookie.process import BookieProcess
    from broker.process import BrokerProcess
    from metadata import MetadataStore

# The servers are imported when a standalone starts, not with this module: the CLI reads
# StandaloneConfig from here to build its flags, and every `magnetar` command builds them.

log = structlog.get_logger("magnetar.standalone")

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class StandaloneConfig(AuthenticationSettings, TlsSettings):
    """Everything in one process: embedded metadata, bookies and one broker."""

    data_dir: Path = Path("magnetar-data")
    """Directory of all data: metadata, and one sub-directory per bookie; kept across restarts."""

    port: int | None = 6650
    """gRPC port of the broker: the service URL is magnetar://<advertised host>:<port> (empty:
    no plaintext listener, TLS only)."""

    tls_port: int = 6651
    """TLS gRPC port of the broker (magnetar+ssl://), open when tls_cert_file and tls_key_file
    are set."""

    http_port: int = 8080
    """HTTP port of the broker's /metrics and /health (0: any free port)."""

    pulsar_port: int | None = DEFAULT_PULSAR_PORT
    """Port of the broker's listener for Pulsar's binary protocol (pulsar://), for Pulsar's own
    clients (0: any free port; empty: none). Given the gRPC port (--pulsar-port 6650, for tools
    that hard-code Pulsar's ports), it takes it, and gRPC moves to 6660."""

    pulsar_tls_port: int | None = DEFAULT_PULSAR_TLS_PORT
    """TLS port of the broker's listener for Pulsar's binary protocol (pulsar+ssl://), open when
    tls_cert_file and tls_key_file are set (0: any free port; empty: none). Given the TLS gRPC
    port (--pulsar-tls-port 6651, Pulsar's brokerServicePortTls), it takes it, and TLS gRPC
    moves to 6661."""

    bookies: int = 3
    """Bookies to run (1 to 9); ledgers use E3/Qw2/Qa2 with 3 or more, else E=Qw=Qa=bookies."""

    bind_host: str = "127.0.0.1"
    """Address the broker listens on (0.0.0.0 to accept other machines); the bookies stay on
    127.0.0.1, since only the broker in this process uses them."""

    advertised_host: str = "127.0.0.1"
    """Host name clients use to reach the broker."""

    authorization_enabled: bool = False
    """Check every call against tenant admins, namespace permissions and superusers (needs
    authentication_enabled)."""

    def __post_init__(self) -> None:
        if not 1 <= self.bookies <= 9:
            raise config_error("bookies", self.bookies, "must be from 1 to 9")
        for name in ("port", "http_port", "tls_port", "pulsar_port", "pulsar_tls_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise config_error(name, value, "must be a port number from 0 to 65535")
        if self.pulsar_port and self.pulsar_port == self.port == DEFAULT_PULSAR_PORT:
            raise config_error(
                "pulsar_port",
                self.pulsar_port,
                f"is also port's: give gRPC another port than {DEFAULT_PULSAR_PORT}",
            )
        if (
            self.pulsar_tls_port
            and self.pulsar_tls_port == self.tls_port == DEFAULT_PULSAR_TLS_PORT
        ):
            raise config_error(
                "pulsar_tls_port",
                self.pulsar_tls_port,
                f"is also tls_port's: give TLS gRPC another port than {DEFAULT_PULSAR_TLS_PORT}",
            )
        # the broker's own rules (a listener at least, authorization with authentication...)
        self.broker_config(ledger=LedgerClientConfig())

    def security_settings(self) -> dict[str, object]:
        """The security settings the broker takes from this config."""
        names = [
            f.name
            for group in (AuthenticationSettings, TlsSettings)
            for f in dataclasses.fields(group)
        ]
        return {name: getattr(self, name) for name in (*names, "authorization_enabled")}

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port: ``port``, unless the Pulsar listener asked for it (Pulsar tools
        hard-code 6650, Magnetar's default), when gRPC takes the Pulsar listener's default."""
        if self.pulsar_port and self.pulsar_port == self.port:
            return DEFAULT_PULSAR_PORT
        return self.port

    @property
    def grpc_tls_port(self) -> int:
        """The TLS gRPC port: ``tls_port``, unless the TLS Pulsar listener asked for it (Pulsar
        tools hard-code 6651), when TLS gRPC takes the TLS Pulsar listener's default."""
        if self.pulsar_tls_port and self.pulsar_tls_port == self.tls_port:
            return DEFAULT_PULSAR_TLS_PORT
        return self.tls_port

    def broker_config(self, *, ledger: LedgerClientConfig) -> BrokerConfig:
        return BrokerConfig(
            metadata="memory://",  # unused: the shared store is passed in
            port=self.grpc_port,
            pulsar_port=self.pulsar_port,
            pulsar_tls_port=self.pulsar_tls_port,
            tls_port=self.grpc_tls_port,
            http_port=self.http_port,
            bind_host=self.bind_host,
            advertised_host=self.advertised_host,
            broker_id="standalone",
            ledger=ledger,
            **self.security_settings(),  # type: ignore[arg-type]
        )

    def quorums(self) -> tuple[int, int, int]:
        if self.bookies >= 3:
            return 3, 2, 2
        return self.bookies, self.bookies, self.bookies


class Standalone:
    """The running servers. Create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self, config: StandaloneConfig, store: MetadataStore) -> None:
        self.config = config
        self.store = store
        self.bookies: list[BookieProcess] = []
        self.broker: BrokerProcess | None = None
        self.ready_s = 0.0

    @classmethod
    async def start(cls, config: StandaloneConfig) -> Standalone:
        started = time.monotonic()
        data_dir = private_dir(config.data_dir.resolve())
        from bookie.process import BookieProcess  # noqa: PLC0415 - see the imports above
        from broker.process import BrokerProcess  # noqa: PLC0415
        from metadata import open_store  # noqa: PLC0415

        store = await open_store(f"embedded://{data_dir / 'metadata'}")
        self = cls(config, store)
        try:
            for index in range(config.bookies):
                bookie = BookieConfig(
                    data_dir=data_dir / f"bookie-{index}",
                    metadata="memory://",  # unused: the shared store is passed in
                    port=0,
                    http_port=0,
                    data_port=0,
                    # only the broker in this process talks to these bookies: they stay on
                    # loopback whatever bind_host says, so nothing outside can reach them
                    bind_host=LOOPBACK,
                    advertised_host=LOOPBACK,
                    bookie_id=f"bookie-{index}",
                )
                self.bookies.append(await BookieProcess.start(bookie, store=store))
            e, qw, qa = config.quorums()
            self.broker = await BrokerProcess.start(
                config.broker_config(
                    ledger=LedgerClientConfig(ensemble_size=e, write_quorum=qw, ack_quorum=qa)
                ),
                store=store,
            )
        except BaseException:
            await self.stop()
            raise
        self.ready_s = _process_age_s() or (time.monotonic() - started)
        log.info("standalone_ready", service_url=self.service_url, ready_s=round(self.ready_s, 3))
        return self

    @property
    def service_url(self) -> str:
        """``magnetar://host:port``, or ``magnetar+ssl://`` when there is no plaintext port."""
        assert self.broker is not None
        if not self.broker.port:
            return self.tls_service_url
        return f"magnetar://{self.broker.address}"

    @property
    def tls_service_url(self) -> str:
        """``magnetar+ssl://host:port`` ("" without TLS)."""
        assert self.broker is not None
        return f"magnetar+ssl://{self.broker.tls_address}" if self.broker.tls_port else ""

    @property
    def pulsar_url(self) -> str:
        """``pulsar://host:port`` of the Pulsar-protocol listener ("" without one)."""
        assert self.broker is not None
        return self.broker.broker.pulsar_url

    @property
    def pulsar_tls_url(self) -> str:
        """``pulsar+ssl://host:port`` of the TLS Pulsar-protocol listener ("" without one)."""
        assert self.broker is not None
        return self.broker.broker.pulsar_url_tls

    def ready_line(self) -> str:
        assert self.broker is not None
        host = self.broker.address.rsplit(":", 1)[0]
        urls = self.service_url
        if self.broker.port and self.broker.tls_port:
            urls += f", {self.tls_service_url}"
        pulsar = "".join(f"{url}; " for url in (self.pulsar_url, self.pulsar_tls_url) if url)
        return (
            f"magnetar standalone ready in {self.ready_s:.2f} s: service URL {urls}"
            f" ({pulsar}{len(self.bookies)} bookies; metrics:"
            f" http://{host}:{self.broker.http_port}"
            f"/metrics; data: {self.config.data_dir.resolve()})"
        )

    async def stop(self) -> None:
        """Broker first (its partitions closed cleanly), then the bookies, then metadata."""
        # each server is stopped even if another failed to; failures are logged, not hidden
        if self.broker is not None:
            try:
                await self.broker.stop()
            except Exception:
                log.exception("standalone_broker_stop_failed")
            self.broker = None
        for bookie in reversed(self.bookies):
            try:
                await bookie.stop()
            except Exception:
                log.exception("standalone_bookie_stop_failed", bookie=bookie.bookie_id)
        self.bookies.clear()
        await self.store.close()
        log.info("standalone_stopped")


def _process_age_s() -> float | None:
    """Seconds since this process started (imports included), from /proc; None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))


async def run_standalone(config: StandaloneConfig) -> int:
    """The body of ``magnetar standalone``: serve until Ctrl-C or SIGTERM."""
    from magnetar.common.server.serving import run_until_signalled  # noqa: PLC0415

    return await run_until_signalled(
        lambda: Standalone.start(config), Standalone.ready_line, Standalone.stop
    )
