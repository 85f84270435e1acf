"""Secure verify runs (``magnetar verify --secure``): TLS and authentication on every hop, and
one rotation of every certificate and of the token signing key in the middle of the run.

Every hop of a secure run:

- **clients → brokers**: ``magnetar+ssl://`` only (the brokers' plaintext port is off), with a
  token of the role :data:`APP_ROLE`, which may only produce and consume on the run's namespace
  (:data:`NAMESPACE`); the tenant, the namespace, the grant and the topic are made with a
  superuser's token first. The token supplier signs a fresh token, valid ``token_expiry_s``, at
  every call, so open streams are challenged and refreshed in band all through the run.
- **brokers → brokers** (forwarded admin calls): TLS, with a superuser token of their own.
- **brokers → bookies**: mutual TLS; the bookies take only the roles ``broker`` and
  ``autorecovery`` (the common name of the client certificate).
- **every process → etcd**: TLS with a client certificate (etcd requires one), logged in as
  the etcd user :data:`ETCD_USER`; the test kit's own reads go the same way.
- **metrics and health** of bookies and brokers: HTTPS, on each server's certificate.

Certificates and keys are throw-away ones (:mod:`magnetar.testing.security`); every server has
its own certificate, naming every address it may be reached at. The rotation re-issues each of
them (and the etcd client certificate) in place from the same CA, with new keys, adds a new
token signing key next to the old one in the brokers' key bundle and signs every later token
with the new key. The processes pick the new files up at their next connection; a process the
nemesis restarts comes back on the new files. :func:`presented_certificates` asks every server
which certificate it presents, so the report shows when each took the new one.

:class:`SecureCluster` is a :class:`~magnetar.testing.LocalCluster` that fills what the kit
does not do yet for a secure cluster with faults: a multi-member etcd over TLS with users,
certificates that name the isolated host's addresses (known only once it exists), a TLS port
kept across restarts for every broker, and brokers with no plaintext port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import secrets
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from magnetar.testing import BookieNode, BrokerNode, LocalCluster
from magnetar.testing.etcd import HOST, EtcdCluster, EtcdServer, EtcdTls, free_port
from magnetar.testing.netns import LINKS
from proto.format.v1 import cluster_pb2

if TYPE_CHECKING:
    from magnetar.testing.security import TestTokens

TENANT = "verify"
NAMESPACE = "verify/ns"
APP_ROLE = "verify-app"
"""The workload's role: produce and consume on :data:`NAMESPACE`, nothing else."""
ADMIN_ROLE = "verify-admin"
"""A superuser: makes the tenant, the namespace, the grant and the topic."""
BROKER_ROLE = "broker"
"""The brokers' role: a superuser towards other brokers, a bookie client towards bookies."""
ETCD_USER = "magnetar"
TOKEN_ALGORITHM = "ES256"  # noqa: S105 - an algorithm's name, not a secret

HOPS = (
    (
        "clients -> brokers: magnetar+ssl:// only (plaintext port off), token of role"
        f" '{APP_ROLE}' granted produce+consume on {NAMESPACE} (expiring, refreshed in band)"
    ),
    "brokers -> brokers: TLS, superuser token",
    "brokers -> bookies: mutual TLS, role 'broker' from the certificate",
    f"every process -> etcd: TLS with a client certificate, etcd user '{ETCD_USER}'",
    "bookie and broker metrics/health: HTTPS",
)


def _require_trustme() -> None:
    try:
        import trustme  # noqa: F401, PLC0415 - only to say what is missing
    except ImportError:
        raise RuntimeError(
            "magnetar verify --secure makes its own certificate authority with trustme, which"
            " is not installed (pip install 'magnetar[dev]')"
        ) from None


@dataclass(frozen=True)
class _Issued:
    name: str
    """The file stem: ``<name>.pem`` and ``<name>.key`` in the PKI directory."""
    common_name: str
    hosts: tuple[str, ...]


@dataclass
class SecureSetup:
    """The CA, the certificates, the token keys and the flags of one secure run."""

    directory: Path
    token_expiry_s: int = 10
    """How long each of the workload's tokens is valid: short, so open streams are asked for a
    fresh one in band several times a run."""
    tokens_issued: int = 0
    """Tokens the workload's supplier handed out (each call and each refresh asks)."""
    tokens_by_key: dict[int, int] = field(default_factory=dict)
    """The same, by the generation of the key that signed them (1, then 2 after the rotation)."""

    def __post_init__(self) -> None:
        _require_trustme()
        from magnetar.testing.security import TestPki, TestTokens  # noqa: PLC0415 - trustme

        if self.token_expiry_s < 2:
            raise ValueError(f"token expiry must be >= 2 s, got {self.token_expiry_s}")
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.pki = TestPki(self.directory / "pki", name="Magnetar verify CA")
        self._issued: dict[str, _Issued] = {}
        self._token_keys = [TestTokens(self.directory / "token-key-1", algorithm=TOKEN_ALGORITHM)]
        self._next_key: TestTokens | None = None
        self.public_keys_file = self.directory / "token-public-keys.pem"
        """The brokers' key bundle: every generation's public key (all of them verify)."""
        self._write_public_keys()
        self.broker_token_file = self.directory / "broker.token"
        self._write_private(self.broker_token_file, self._sign(BROKER_ROLE, None))
        self.etcd_password = secrets.token_hex(16)
        self.etcd_client = self.issue("etcd-client", ETCD_USER, [])

    # --- certificates ---------------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        return self.pki.ca_file

    def issue(self, name: str, common_name: str, hosts: Sequence[str]) -> _CertPaths:
        """Issue (or re-issue: a rotation) ``<name>.pem``/``<name>.key`` for ``hosts``."""
        issued = _Issued(name, common_name, tuple(hosts))
        self._issued[name] = issued
        self.pki.issue(common_name, hosts=issued.hosts or (common_name,), name=name)
        return self.paths(name)

    def paths(self, name: str) -> _CertPaths:
        return _CertPaths(self.pki.directory / f"{name}.pem", self.pki.directory / f"{name}.key")

    @property
    def certificate_names(self) -> list[str]:
        return sorted(self._issued)

    def etcd_tls(self, member: str) -> EtcdTls:
        server = self.paths(member)
        return EtcdTls(
            server.cert_file,
            server.key_file,
            self.ca_file,
            client_cert_file=self.etcd_client.cert_file,
            client_key_file=self.etcd_client.key_file,
        )

    # --- tokens ---------------------------------------------------------------------------------

    def _sign(self, role: str, expiry_s: int | None) -> str:
        return self._token_keys[-1].create(role, expiry_s=expiry_s)

    def app_token(self) -> str:
        """The workload's token supplier: a fresh token, signed with the newest key."""
        self.tokens_issued += 1
        generation = len(self._token_keys)
        self.tokens_by_key[generation] = self.tokens_by_key.get(generation, 0) + 1
        return self._sign(APP_ROLE, self.token_expiry_s)

    def admin_token(self) -> str:
        return self._sign(ADMIN_ROLE, 600)

    def _write_public_keys(self, extra: Sequence[TestTokens] = ()) -> None:
        bundle = b"".join(
            key.public_key_file.read_bytes().rstrip(b"\n") + b"\n"
            for key in (*self._token_keys, *extra)
            if key.public_key_file is not None
        )
        temporary = self.public_keys_file.with_suffix(".tmp")
        temporary.write_bytes(bundle)
        temporary.replace(self.public_keys_file)

    @staticmethod
    def _write_private(path: Path, text: str) -> None:
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.touch(mode=0o600)
        temporary.write_text(text)
        temporary.replace(path)

    # --- flags and client settings --------------------------------------------------------------

    def bookie_args(self) -> list[str]:
        """What every bookie gets (each adds its own certificate)."""
        return [
            *("--tls-trust-certs-file", str(self.ca_file)),
            *("--authentication-enabled", "true"),
            *("--authentication-providers", "tls"),
            *("--bookie-client-roles", f"{BROKER_ROLE},autorecovery"),
        ]

    def broker_args(self) -> list[str]:
        """What every broker gets (each adds its own certificate and TLS port)."""
        return [
            *("--authentication-enabled", "true"),
            *("--authentication-providers", "token"),
            *("--token-public-key-file", str(self.public_keys_file)),
            *("--superuser-roles", f"{ADMIN_ROLE},{BROKER_ROLE}"),
            *("--authorization-enabled", "true"),
            *("--broker-client-auth-token-file", str(self.broker_token_file)),
            *("--broker-client-trust-certs-file", str(self.ca_file)),
            *("--ledger-tls-trust-certs-file", str(self.ca_file)),
        ]

    def client_settings(self, *, admin: bool = False) -> dict[str, Any]:
        """``magnetar.aio.Client`` keyword settings: the CA, and the workload's token supplier
        (or a superuser's, with ``admin``)."""
        from magnetar.aio import AuthenticationToken  # noqa: PLC0415

        supplier = self.admin_token if admin else self.app_token
        return {
            "tls_trust_certs_file_path": str(self.ca_file),
            "authentication": AuthenticationToken(supplier),
        }

    # --- the rotation ---------------------------------------------------------------------------

    def rotate_certificates(self) -> list[str]:
        """Re-issue every certificate in place: new keys, the same CA, names and hosts."""
        for issued in list(self._issued.values()):
            self.issue(issued.name, issued.common_name, issued.hosts)
        return self.certificate_names

    def add_token_key(self) -> int:
        """A new token signing key, its public half added to the brokers' bundle (the old one
        stays: tokens signed with it are still good). Not used to sign until
        :meth:`sign_with_newest_key`; its generation."""
        from magnetar.testing.security import TestTokens  # noqa: PLC0415 - trustme

        generation = len(self._token_keys) + 1
        self._next_key = TestTokens(
            self.directory / f"token-key-{generation}", algorithm=TOKEN_ALGORITHM
        )
        self._write_public_keys(extra=[self._next_key])
        return generation

    def sign_with_newest_key(self) -> None:
        """Sign every later token with the key :meth:`add_token_key` made (the brokers' own
        token file too). Call it once every broker can have re-read the bundle (they look at
        it at most once a second)."""
        if self._next_key is not None:
            self._token_keys.append(self._next_key)
            self._next_key = None
        self._write_private(self.broker_token_file, self._sign(BROKER_ROLE, None))

    def expected_certificate(self, name: str) -> bytes:
        """The DER of the leaf certificate in ``<name>.pem`` now."""
        text = self.paths(name).cert_file.read_text()
        first = re.search(
            r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.DOTALL
        )
        assert first is not None  # written by TestPki
        return ssl.PEM_cert_to_DER_cert(first.group(0))


@dataclass(frozen=True)
class _CertPaths:
    cert_file: Path
    key_file: Path

    def server_args(self, prefix: str = "") -> list[str]:
        return [
            *(f"--{prefix}tls-cert-file", str(self.cert_file)),
            *(f"--{prefix}tls-key-file", str(self.key_file)),
        ]


async def prepare_namespace(service_url: str, setup: SecureSetup) -> None:
    """As a superuser: the run's tenant and namespace, and produce+consume for the workload."""
    from magnetar.aio import AdminClient  # noqa: PLC0415

    settings = setup.client_settings(admin=True)
    admin = AdminClient(
        service_url,
        authentication=settings.pop("authentication"),
        operation_timeout_s=60,
        **settings,
    )
    async with admin:
        await admin.create_tenant(TENANT, [ADMIN_ROLE])
        await admin.create_namespace(NAMESPACE)
        await admin.grant_permission(NAMESPACE, APP_ROLE, ["produce", "consume"])


# --- the cluster -------------------------------------------------------------------------------


class _SecureEtcdCluster(EtcdCluster):
    """An :class:`EtcdCluster` whose members serve TLS with certificates of their own and
    require client certificates, with etcd's authentication on (one user)."""

    def __init__(self, *, data_dir: Path, size: int, setup: SecureSetup) -> None:
        super().__init__(data_dir=data_dir, size=size)
        self._setup = setup
        self._auth_enabled = False
        plain = self.members
        initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in plain)
        self._members = [
            EtcdServer(
                data_dir=m.data_dir,
                name=m.name,
                client_port=m.client_port,
                peer_port=m.peer_port,
                initial_cluster=initial_cluster,
                tls=setup.etcd_tls(m.name),
            )
            for m in plain
        ]

    async def start(self, timeout_s: float = 30) -> None:
        # certificates now: the isolated host's etcd address is known only once it exists
        for member in self.members:
            if member.name not in self._setup.certificate_names:
                hosts = [HOST, "localhost", *member.extra_client_hosts]
                self._setup.issue(member.name, "etcd", hosts)
        await super().start(timeout_s)
        if not self._auth_enabled:
            await self.members[0].enable_auth({ETCD_USER: self._setup.etcd_password})
            self._auth_enabled = True


class SecureCluster(LocalCluster):
    """A :class:`LocalCluster` with TLS and authentication on every hop (see the module).

    Each bookie and broker gets a certificate of its own when its node is made, which is after
    the isolated host (if any) exists, so the certificate names its addresses. Every broker has
    no plaintext port and keeps its TLS port across restarts, so :attr:`tls_service_url` stays
    valid as brokers die and come back.
    """

    # the brokers publish no plaintext service URL: they are waited for by their TLS one
    _broker_registry = dataclasses.replace(
        LocalCluster._broker_registry,
        published=lambda value: cluster_pb2.BrokerRegistration.FromString(value).service_url_tls,
        skip_empty=True,
    )

    def __init__(
        self,
        root: Path,
        setup: SecureSetup,
        *,
        etcd_members: int,
        bookie_args: Sequence[str] = (),
        broker_args: Sequence[str] = (),
        **options: Any,
    ) -> None:
        self.security = setup
        self._tls_ports: dict[int, int] = {}
        super().__init__(
            root,
            etcd_members=etcd_members,
            bookie_args=[*setup.bookie_args(), *bookie_args],
            broker_args=[*setup.broker_args(), *broker_args],
            etcd_tls=setup.etcd_tls("etcd0"),
            etcd_user=(ETCD_USER, setup.etcd_password),
            **options,
        )
        # the kit's EtcdCluster takes neither TLS nor users; this one does
        self._etcd = _SecureEtcdCluster(data_dir=root / "etcd", size=etcd_members, setup=setup)

    def server_hosts(self) -> list[str]:
        """Every address a server of this cluster may be reached at."""
        hosts = [HOST, "localhost"]
        isolated = self.isolated_host
        if isolated is not None:
            for link in LINKS:
                hosts += [isolated.gateway(link), isolated.inside_address(link)]
        return hosts

    def _bookie_own_args(self, index: int) -> list[str]:
        # its certificate, made when its node is
        cert = self.security.issue(f"bookie-{index}", "bookie", self.server_hosts())
        return [*cert.server_args(), *cert.server_args("http-")]

    def _broker_own_args(self, index: int) -> list[str]:
        cert = self.security.issue(f"broker-{index}", BROKER_ROLE, self.server_hosts())
        tls_port = self._tls_ports.setdefault(index, free_port())
        return [
            *("--port", ""),  # no plaintext listener
            *("--tls-port", str(tls_port)),
            *cert.server_args(),
            *cert.server_args("http-"),
            *cert.server_args("ledger-"),  # its role towards the bookies
        ]

    def _published_by(self, node: BrokerNode) -> str:
        return node.tls_service_url


# --- which certificate each server presents ---------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One TLS listener of the cluster, and the certificate it should present."""

    label: str
    """``broker-0``, ``broker-0 https``, ``bookie-1``, ``etcd2`` ..."""
    host: str
    port: int
    certificate: str
    """The name of the certificate file it serves."""
    client_certificate: str | None
    """The certificate to present when it requires one."""


def endpoints(cluster: SecureCluster) -> list[tuple[Endpoint, bool]]:
    """Every TLS listener of the cluster, each with whether it can answer now (its process
    runs and is not paused)."""
    found: list[tuple[Endpoint, bool]] = []

    def split(address: str) -> tuple[str, int]:
        host, _, port = address.rpartition(":")
        return host, int(port)

    etcd = cluster.etcd
    members = etcd.members if isinstance(etcd, EtcdCluster) else []
    for member in members:
        up = member.is_running and not member.is_paused
        endpoint = Endpoint(member.name, HOST, member.client_port, member.name, "etcd-client")
        found.append((endpoint, up))
    nodes: list[tuple[str, BookieNode | BrokerNode]] = [
        *((f"bookie-{i}", b) for i, b in enumerate(cluster.bookies)),
        *((f"broker-{i}", b) for i, b in enumerate(cluster.brokers)),
    ]
    for name, node in nodes:
        up = node.is_running and not node.is_paused
        address = node.tls_address if isinstance(node, BrokerNode) else node.address
        with contextlib.suppress(RuntimeError):  # never started: nothing to ask
            if address is None:
                continue
            host, port = split(address)
            client = "broker-0" if isinstance(node, BookieNode) else None
            found.append((Endpoint(name, host, port, name, client), up))
            http_host, http_port = split(node.http_address)
            found.append((Endpoint(f"{name} https", http_host, http_port, name, None), up))
    return found


async def presented_certificate(
    endpoint: Endpoint, setup: SecureSetup, *, timeout_s: float = 3
) -> bytes:
    """The DER of the certificate ``endpoint`` presents in a TLS handshake (verified against
    the run's CA and host name)."""
    context = ssl.create_default_context(cafile=str(setup.ca_file))
    context.set_alpn_protocols(["h2", "http/1.1"])
    if endpoint.client_certificate is not None:
        client = setup.paths(endpoint.client_certificate)
        context.load_cert_chain(str(client.cert_file), str(client.key_file))
    async with asyncio.timeout(timeout_s):
        _, writer = await asyncio.open_connection(
            endpoint.host, endpoint.port, ssl=context, server_hostname=endpoint.host
        )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.transport.abort()  # a TLS close would wait for the server's close_notify
    return bytes(der)


async def wait_presenting_current(
    cluster: SecureCluster,
    started: float,
    clock: Callable[[], float],
    *,
    timeout_s: float,
    unreachable: set[str] | None = None,
) -> dict[str, float | None]:
    """Ask every TLS listener, again and again, until each presents the certificate now in its
    files; seconds from ``started`` (a ``clock()`` reading) until it did, None for one that did
    not within ``timeout_s`` (down, paused or cut off all along, or still on the old one). The
    labels of those that never completed a handshake are added to ``unreachable``."""
    setup = cluster.security
    took: dict[str, float | None] = {}
    reached: set[str] = set()
    deadline = time.monotonic() + timeout_s

    async def ask(endpoint: Endpoint) -> None:
        try:
            der = await presented_certificate(endpoint, setup)
        except (OSError, TimeoutError, ssl.SSLError):
            return  # down, paused since, cut off, or mid-restart: asked again next round
        reached.add(endpoint.label)
        if der == setup.expected_certificate(endpoint.certificate):
            took[endpoint.label] = round(clock() - started, 2)

    while True:
        pending = [(e, up) for e, up in endpoints(cluster) if took.get(e.label) is None]
        for endpoint, _ in pending:
            took.setdefault(endpoint.label, None)
        # all at once: one that hangs (paused after the list was made) delays no other
        await asyncio.gather(*(ask(endpoint) for endpoint, up in pending if up))
        if all(v is not None for v in took.values()) or time.monotonic() >= deadline:
            if unreachable is not None:
                unreachable.update(label for label in took if label not in reached)
            return took
        await asyncio.sleep(0.5)


def count_log_events(paths: Iterable[Path], events: Sequence[str]) -> dict[str, int]:
    """How many lines of the servers' logs carry each structlog event."""
    counts = dict.fromkeys(events, 0)
    patterns = {event: (f'"event": "{event}"', f'"event":"{event}"') for event in events}
    for path in paths:
        with contextlib.suppress(OSError), path.open(errors="replace") as log:
            for line in log:
                for event, needles in patterns.items():
                    if any(needle in line for needle in needles):
                        counts[event] += 1
    return counts
