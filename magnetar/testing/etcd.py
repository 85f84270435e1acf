"""Real etcd processes for tests: one server, or a cluster of them, on free localhost ports.

This module owns finding the etcd binary, starting etcd processes with their own data dirs and
ports, waiting until they are healthy, and the faults tests inject into them: graceful stop,
SIGKILL, restart on the same data dir and ports, SIGSTOP/SIGCONT. It knows nothing of Magnetar's
metadata store; tests hand the store :attr:`EtcdServer.url` or :attr:`EtcdCluster.url`.

Typical use in a test::

    async with EtcdServer(data_dir=tmp_path / "etcd") as etcd:
        store = EtcdMetadataStore.from_url(etcd.url)  # "etcd://127.0.0.1:PORT"
        ...
        await etcd.restart()  # same data dir and ports, so clients reconnect to the same address

    async with EtcdCluster(data_dir=tmp_path / "etcd", size=3) as cluster:
        leader = await cluster.leader()
        await leader.kill()  # the other two keep a quorum
        await leader.start()  # rejoins with its old data

A server can also listen for clients on more addresses of this machine (``extra_client_hosts``),
say the host side of an :class:`~magnetar.testing.netns.IsolatedHost` link, so that a process in
another network namespace reaches it there (:meth:`EtcdServer.url_on`); peers always talk on
127.0.0.1.

etcd's own output goes to a log file next to each data dir (``<data_dir>.log``), never to the
test's stdout; start failures quote its tail. A process a test forgets to stop is killed when its
server object is garbage-collected or when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import ssl
import tempfile
import time
import weakref
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from magnetar.testing._processes import AsyncLifecycle, ManagedProcess

__all__ = [
    "DEFAULT_CLUSTER_TOKEN",
    "EtcdCluster",
    "EtcdMemberStatus",
    "EtcdServer",
    "EtcdTls",
    "find_etcd_binary",
    "free_port",
    "require_etcd_binary",
]

HOST = "127.0.0.1"
"""Where harness processes listen, unless told to listen elsewhere too."""
DEFAULT_CLUSTER_TOKEN = "magnetar-test"  # noqa: S105 - names a cluster, not a secret
"""``--initial-cluster-token`` unless told otherwise; keeps test clusters apart from real ones."""

_WELL_KNOWN_PATHS = (Path("/usr/bin/etcd"), Path("/usr/local/bin/etcd"))
_INSTALL_HINT = (
    "install it with `apt-get update && apt-get -o DPkg::Lock::Timeout=120 install -y "
    "etcd-server` (Debian/Ubuntu, gives /usr/bin/etcd), or run `bash scripts/test.sh`, "
    "which installs it"
)
_PROBE_TIMEOUT_S = 1.0
_POLL_INTERVAL_S = 0.05
_START_ATTEMPTS = 3
# Ports below the kernel's ephemeral range cannot be taken by some process's outgoing connection
# while an etcd member is down, so a member restarted on its old ports finds them free.
_FALLBACK_EPHEMERAL_LOW = 32768
_LOWEST_PICKED_PORT = 10000


def find_etcd_binary() -> Path | None:
    """Return the etcd binary on PATH, else at /usr/bin/etcd or /usr/local/bin/etcd, else None."""
    on_path = shutil.which("etcd")
    if on_path is not None:
        return Path(on_path)
    for candidate in _WELL_KNOWN_PATHS:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_etcd_binary() -> Path:
    """Return the etcd binary, or raise RuntimeError saying how to install it."""
    binary = find_etcd_binary()
    if binary is None:
        raise RuntimeError(
            f"the etcd binary is not on PATH nor in /usr/bin or /usr/local/bin; {_INSTALL_HINT}"
        )
    return binary


def _ephemeral_port_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW
    return low


def _reserve_ports(count: int, host: str = HOST) -> list[int]:
    """Pick ``count`` distinct ports that are free right now, preferring non-ephemeral ones.

    Every candidate stays bound until all are chosen, so the ports are distinct from each other.
    """
    low = _ephemeral_port_low()
    rng = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        tries = 0
        while len(held) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = (
                rng.randrange(_LOWEST_PICKED_PORT, low)
                if tries < 200 and low > _LOWEST_PICKED_PORT
                else 0
            )
            tries += 1
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port(host: str = HOST) -> int:
    """Return a TCP port on ``host`` that is free now, outside the ephemeral range if possible."""
    return _reserve_ports(1, host)[0]


@dataclass(frozen=True, kw_only=True)
class EtcdMemberStatus:
    """What one member says about itself (etcd's Maintenance.Status)."""

    member_id: int
    """This member's raft id."""
    leader_id: int
    """The raft id of the leader this member knows of; 0 when it knows none."""
    raft_term: int
    """The member's current raft term."""
    revision: int
    """The key-value store revision this member has applied."""


async def _http_json(
    port: int,
    method: str,
    path: str,
    body: bytes | None,
    timeout_s: float,
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """One HTTP/1.0 request to etcd's client port; returns the status code and decoded JSON body.

    HTTP/1.0 keeps the exchange trivial: no chunked bodies, the server closes when done.
    """
    payload = body or b""
    head = (
        f"{method} {path} HTTP/1.0\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode("ascii")
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(
            HOST, port, ssl=tls, server_hostname=HOST if tls is not None else None
        )
        try:
            writer.write(head + payload)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    status_line, _, rest = raw.partition(b"\r\n")
    _, _, response_body = rest.partition(b"\r\n\r\n")
    status = int(status_line.split(b" ", 2)[1])
    return status, json.loads(response_body)


def _etcd_free_environment() -> dict[str, str]:
    # etcd reads ETCD_* variables as flags; a developer's own settings must not leak in.
    return {key: value for key, value in os.environ.items() if not key.startswith("ETCD_")}


@dataclass(frozen=True)
class EtcdTls:
    """TLS of an etcd server's client port: its certificate and key, and the CA it trusts.

    With ``client_cert_auth`` (etcd's ``--client-cert-auth``) every client must present a
    certificate that CA signed; the harness presents ``client_cert_file`` for its own probes.
    """

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    client_cert_auth: bool = True

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert_file is not None and self.client_key_file is not None:
            context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes(),
            private_key=read(self.client_key_file),
            certificate_chain=read(self.client_cert_file),
        )


class _TempRoot:
    """A temporary directory an object made for itself: removed by :meth:`remove`, or when its
    owner is garbage-collected or the interpreter exits."""

    def __init__(self, owner: object, prefix: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self._remove = weakref.finalize(owner, shutil.rmtree, self.path, ignore_errors=True)

    def remove(self) -> None:
        self._remove()

    @staticmethod
    async def after(stopping: Awaitable[None], root: _TempRoot | None) -> None:
        """Await ``stopping``, then remove ``root`` (if there is one), even if stopping failed."""
        try:
            await stopping
        finally:
            if root is not None:
                root.remove()


class _PortInUseError(RuntimeError):
    """etcd exited at startup because one of its ports was taken."""


class EtcdServer(ManagedProcess):
    """One real etcd process on 127.0.0.1, alone or as a member of an :class:`EtcdCluster`.

    The data dir and both ports are fixed for the object's life, so :meth:`restart` brings the
    member back on the same address with the same data. Ports are picked free unless given.
    """

    _log_tail_bytes = 4000

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        name: str = "etcd0",
        client_port: int | None = None,
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        cluster_token: str = DEFAULT_CLUSTER_TOKEN,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        binary: Path | None = None,
        extra_client_hosts: Sequence[str] = (),
        tls: EtcdTls | None = None,
    ) -> None:
        """Describe the server; nothing runs until :meth:`start`.

        ``data_dir`` defaults to a temporary directory removed by :meth:`aclose` (or at exit).
        ``initial_cluster`` is etcd's ``name=peer_url,...`` list for cluster members; a lone
        server forms a cluster of itself. ``log_path`` defaults to ``<data_dir>.log``.
        ``extra_client_hosts`` are addresses of this machine where etcd also serves clients,
        on the same client port (see :attr:`extra_client_hosts`). With ``tls`` the client port
        is https (and its health is probed on a plain metrics port of its own).
        """
        self._temp_root: _TempRoot | None = None
        if data_dir is None:
            self._temp_root = _TempRoot(self, f"magnetar-{name}-")
            data_dir = self._temp_root.path / "data"
        super().__init__(log_path or data_dir.with_name(f"{data_dir.name}.log"))
        self._data_dir = data_dir
        self._name = name
        # Ports may be re-picked after a bind clash only when nobody else knows them yet.
        self._may_repick_ports = (
            client_port is None and peer_port is None and initial_cluster is None
        )
        if client_port is None or peer_port is None:
            picked = _reserve_ports(2)
            client_port = picked[0] if client_port is None else client_port
            peer_port = picked[1] if peer_port is None else peer_port
        self._client_port = client_port
        self._peer_port = peer_port
        self._initial_cluster = initial_cluster
        self._cluster_token = cluster_token
        self._extra_args = tuple(extra_args)
        self._binary = binary
        self._extra_client_hosts = tuple(extra_client_hosts)
        self.tls = tls
        self._metrics_port = _reserve_ports(1)[0] if tls is not None else None

    def __repr__(self) -> str:
        return f"EtcdServer(name={self._name!r}, endpoint={self.endpoint!r}, pid={self.pid})"

    # -- addresses and state ----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The member name (``--name``)."""
        return self._name

    @property
    def data_dir(self) -> Path:
        """etcd's data dir; kept across restarts."""
        return self._data_dir

    @property
    def client_port(self) -> int:
        return self._client_port

    @property
    def peer_port(self) -> int:
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:PORT"`` of the client port."""
        return f"{HOST}:{self._client_port}"

    @property
    def client_url(self) -> str:
        """``"http://127.0.0.1:PORT"`` of the client port (``https`` with TLS)."""
        return f"{self._client_scheme}://{self.endpoint}"

    @property
    def _client_scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def peer_url(self) -> str:
        """``"http://127.0.0.1:PORT"`` of the peer (raft) port."""
        return f"http://{HOST}:{self._peer_port}"

    @property
    def url(self) -> str:
        """Magnetar's metadata URL for this server alone: ``"etcd://127.0.0.1:PORT"``."""
        return f"etcd://{self.endpoint}"

    @property
    def extra_client_hosts(self) -> tuple[str, ...]:
        """Addresses where etcd serves clients besides 127.0.0.1, on the same client port.

        Each must be an address of this machine when etcd starts. Setting it takes effect at
        the next :meth:`start` (a running etcd keeps listening where it did).
        """
        return self._extra_client_hosts

    @extra_client_hosts.setter
    def extra_client_hosts(self, hosts: Sequence[str]) -> None:
        self._extra_client_hosts = tuple(hosts)

    def url_on(self, host: str) -> str:
        """Magnetar's metadata URL for this server at another of its client addresses
        (``host`` in :attr:`extra_client_hosts`): ``"etcd://HOST:PORT"``."""
        return f"etcd://{host}:{self._client_port}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, timeout_s: float = 20) -> None:
        """Start etcd and wait until it is healthy (``GET /health`` says true).

        A member of a cluster is healthy once it is part of a cluster with a leader and a
        quorum, so it cannot become healthy until enough of its peers run too. On failure the
        process is killed and the error quotes the tail of etcd's log.
        """
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._spawn()
            try:
                await self._wait_started(timeout_s)
            except _PortInUseError as error:
                if not self._may_repick_ports or attempt == _START_ATTEMPTS:
                    raise RuntimeError(str(error)) from None
                self._client_port, self._peer_port = _reserve_ports(2)
            except BaseException:
                await self.kill()
                raise
            else:
                return

    async def aclose(self) -> None:
        """Stop for good, and remove the data dir if this object created it."""
        await _TempRoot.after(self.stop(), self._temp_root)

    # -- etcd's own users ------------------------------------------------------------------

    async def enable_auth(self, users: dict[str, str], *, timeout_s: float = 10) -> None:
        """Create ``users`` (name -> password), each with read-write access to every key, and
        a root user, then turn etcd's authentication on: from then on every client must log in
        (etcd_user and etcd_password_file)."""
        from aetcd import rpc  # noqa: PLC0415 - only tests of etcd's auth need it

        target = self.endpoint
        if self.tls is not None:
            channel = grpc.aio.secure_channel(target, self.tls.channel_credentials())
        else:
            channel = grpc.aio.insecure_channel(target)
        try:
            auth = rpc.AuthStub(channel)
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=timeout_s)
            root_password = os.urandom(12).hex()
            await auth.UserAdd(
                rpc.AuthUserAddRequest(name="root", password=root_password), timeout=timeout_s
            )
            await auth.UserGrantRole(
                rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=timeout_s
            )
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="readwrite"), timeout=timeout_s)
            everything = rpc.Permission(
                permType=rpc.Permission.READWRITE, key=b"\0", range_end=b"\0"
            )
            await auth.RoleGrantPermission(
                rpc.AuthRoleGrantPermissionRequest(name="readwrite", perm=everything),
                timeout=timeout_s,
            )
            for name, password in users.items():
                await auth.UserAdd(
                    rpc.AuthUserAddRequest(name=name, password=password), timeout=timeout_s
                )
                await auth.UserGrantRole(
                    rpc.AuthUserGrantRoleRequest(user=name, role="readwrite"), timeout=timeout_s
                )
            await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout_s)
        finally:
            await channel.close()

    # -- probes ------------------------------------------------------------------------------

    async def is_healthy(self, timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
        """One ``GET /health`` probe: True when etcd reports itself healthy within ``timeout_s``."""
        if not self.is_running or self._paused:
            return False
        port = self._metrics_port or self._client_port
        try:
            _, body = await _http_json(port, "GET", "/health", None, timeout_s)
        except (OSError, TimeoutError, ValueError, IndexError):
            return False
        # etcd 3.4 sends {"health":"true"}; accept a JSON boolean as well
        return isinstance(body, dict) and str(body.get("health")).lower() == "true"

    async def wait_healthy(self, timeout_s: float = 20) -> None:
        """Wait until :meth:`is_healthy`; TimeoutError (quoting etcd's log) after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not await self.is_healthy(
            min(_PROBE_TIMEOUT_S, max(deadline - time.monotonic(), 0.05))
        ):
            self._raise_if_exited("while waiting for it to become healthy")
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"etcd {self._name} at {self.endpoint} was not healthy within {timeout_s}s; "
                    f"log {self._log_path}:\n{self._log_tail()}"
                )
            await asyncio.sleep(_POLL_INTERVAL_S)

    async def status(self, timeout_s: float = _PROBE_TIMEOUT_S) -> EtcdMemberStatus:
        """Ask this member for its raft status (through etcd's JSON gateway)."""
        _, body = await _http_json(
            self._client_port,
            "POST",
            "/v3/maintenance/status",
            b"{}",
            timeout_s,
            tls=self.tls.client_context() if self.tls is not None else None,
        )
        try:
            header = body["header"]
            return EtcdMemberStatus(
                member_id=int(header["member_id"]),
                leader_id=int(body.get("leader", 0)),
                raft_term=int(body.get("raftTerm", 0)),
                revision=int(header.get("revision", 0)),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"etcd {self._name} sent an unexpected status reply: {body!r}"
            ) from error

    # -- internals ---------------------------------------------------------------------------

    def _command(self, binary: Path) -> list[str]:
        initial_cluster = self._initial_cluster or f"{self._name}={self.peer_url}"
        client_urls = ",".join(
            [self.client_url]
            + [
                f"{self._client_scheme}://{host}:{self._client_port}"
                for host in self._extra_client_hosts
            ]
        )
        security: list[str] = []
        if self.tls is not None:
            security = [
                "--cert-file", str(self.tls.cert_file),
                "--key-file", str(self.tls.key_file),
                "--trusted-ca-file", str(self.tls.ca_file),
                "--listen-metrics-urls", f"http://{HOST}:{self._metrics_port}",
            ]  # fmt: skip
            if self.tls.client_cert_auth:
                security.append("--client-cert-auth")
        return [
            str(binary),
            "--name", self._name,
            "--data-dir", str(self._data_dir),
            "--listen-client-urls", client_urls,
            "--advertise-client-urls", client_urls,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster,
            # ignored once the data dir holds a member, which is what makes restarts work
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._cluster_token,
            "--logger", "zap",
            "--log-outputs", "stderr",
            "--log-level", "warn",
            *security,
            *self._extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        binary = self._binary or require_etcd_binary()
        self._data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._data_dir.mkdir(mode=0o700, exist_ok=True)
        self._popen(self._command(binary), env=_etcd_free_environment(), stdout_to_log=True)

    async def _wait_started(self, timeout_s: float) -> None:
        try:
            await self.wait_healthy(timeout_s)
        except RuntimeError:
            if self._proc is not None and self._proc.poll() is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    self._detach_process()
                    raise _PortInUseError(
                        f"etcd {self._name} could not listen on port {self._client_port} or "
                        f"{self._peer_port}: address already in use; log {self._log_path}:\n{tail}"
                    ) from None
            raise

    def _raise_if_exited(self, when: str) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"etcd {self._name} exited with code {proc.returncode} {when}; "
                f"log {self._log_path}:\n{self._log_tail()}"
            )

    def _describe(self) -> str:
        return f"etcd {self._name}"


class EtcdCluster(AsyncLifecycle):
    """``size`` etcd members on distinct free ports forming one new cluster.

    Lifecycle methods act on all members at once; a single member is stopped, killed, paused or
    restarted through :attr:`members`.
    """

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        size: int = 3,
        name_prefix: str = "etcd",
        cluster_token: str = DEFAULT_CLUSTER_TOKEN,
        extra_args: Sequence[str] = (),
        binary: Path | None = None,
        extra_client_hosts: Sequence[str] = (),
    ) -> None:
        """Describe the cluster; member ``i`` is named ``f"{name_prefix}{i}"``.

        Each member's data dir is ``data_dir / name`` and its log ``data_dir / f"{name}.log"``;
        ``data_dir`` defaults to a temporary directory removed by :meth:`aclose` (or at exit).
        ``extra_client_hosts`` are given to every member (:attr:`EtcdServer.extra_client_hosts`).
        """
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least 1 member, got size={size}")
        self._temp_root: _TempRoot | None = None
        if data_dir is None:
            self._temp_root = _TempRoot(self, "magnetar-etcd-cluster-")
            data_dir = self._temp_root.path
        self._data_dir = data_dir
        ports = _reserve_ports(2 * size)
        names = [f"{name_prefix}{i}" for i in range(size)]
        peer_ports = ports[size:]
        initial_cluster = ",".join(
            f"{name}=http://{HOST}:{port}" for name, port in zip(names, peer_ports, strict=True)
        )
        self._members = [
            EtcdServer(
                data_dir=data_dir / name,
                name=name,
                client_port=client_port,
                peer_port=peer_port,
                initial_cluster=initial_cluster,
                cluster_token=cluster_token,
                extra_args=extra_args,
                binary=binary,
                extra_client_hosts=extra_client_hosts,
            )
            for name, client_port, peer_port in zip(names, ports[:size], peer_ports, strict=True)
        ]

    def __repr__(self) -> str:
        return f"EtcdCluster(url={self.url!r})"

    @property
    def members(self) -> list[EtcdServer]:
        """The members, in name order (a new list each time; the servers are shared)."""
        return list(self._members)

    @property
    def endpoints(self) -> list[str]:
        """``"127.0.0.1:PORT"`` of every member's client port."""
        return [member.endpoint for member in self._members]

    @property
    def url(self) -> str:
        """Magnetar's metadata URL: ``"etcd://127.0.0.1:P1,127.0.0.1:P2,..."``."""
        return "etcd://" + ",".join(self.endpoints)

    @property
    def extra_client_hosts(self) -> tuple[str, ...]:
        """Where every member also serves clients (see :attr:`EtcdServer.extra_client_hosts`);
        setting it sets it on every member, for their next start."""
        return self._members[0].extra_client_hosts

    @extra_client_hosts.setter
    def extra_client_hosts(self, hosts: Sequence[str]) -> None:
        for member in self._members:
            member.extra_client_hosts = hosts

    def url_on(self, host: str) -> str:
        """Magnetar's metadata URL naming every member at ``host``, one of
        :attr:`extra_client_hosts`: ``"etcd://HOST:P1,HOST:P2,..."``."""
        return "etcd://" + ",".join(
            member.url_on(host).removeprefix("etcd://") for member in self._members
        )

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    async def start(self, timeout_s: float = 30) -> None:
        """Start every member that is not running and wait until all of them are healthy.

        The processes are spawned together first, since none is healthy before a quorum runs.
        On failure every member is killed.
        """
        try:
            for member in self._members:
                if not member.is_running:
                    member._spawn()
            await self.wait_healthy(timeout_s)
        except BaseException:
            await self.kill()
            raise

    async def wait_healthy(self, timeout_s: float = 30) -> None:
        """Wait until every running member is healthy."""
        # One after another against a shared deadline: they come up in parallel anyway.
        deadline = time.monotonic() + timeout_s
        for member in self._members:
            if member.is_running:
                await member.wait_healthy(max(deadline - time.monotonic(), 0.0))

    async def stop(self, timeout_s: float = 10) -> None:
        """Stop every member (SIGTERM, then SIGKILL after ``timeout_s``), the leader first.

        A stopping leader first hands leadership to a peer it still hears from. While peers
        are up that takes ~0.1 s; when they stopped moments ago it may still believe one is
        there and wait out etcd's request timeout (7 s with default timings). Stopping the
        current leader first, one member at a time, keeps every hand-over quick.
        """
        while running := [member for member in self._members if member.is_running]:
            leader = await self._current_leader()
            await (leader if leader is not None else running[0]).stop(timeout_s)

    async def kill(self) -> None:
        """SIGKILL every member."""
        await asyncio.gather(*(member.kill() for member in self._members))

    async def restart(self, *, graceful: bool = True, timeout_s: float = 30) -> None:
        """Stop (or SIGKILL) every member, then start them all on the same data and ports."""
        if graceful:
            await self.stop()
        else:
            await self.kill()
        await self.start(timeout_s)

    async def pause(self) -> None:
        """SIGSTOP every running member."""
        await asyncio.gather(
            *(m.pause() for m in self._members if m.is_running and not m.is_paused)
        )

    async def resume(self) -> None:
        """SIGCONT every paused member."""
        await asyncio.gather(*(m.resume() for m in self._members if m.is_paused))

    async def leader(self, timeout_s: float = 10) -> EtcdServer:
        """The member that is leader, as seen by the running members; waits up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (leader := await self._current_leader()) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no etcd leader among the running members within {timeout_s}s")
            await asyncio.sleep(_POLL_INTERVAL_S)
        return leader

    async def _current_leader(self) -> EtcdServer | None:
        """One round of status calls: the leader the running members agree on, if any."""
        by_id: dict[int, EtcdServer] = {}
        leader_ids: set[int] = set()
        for member in self._members:
            if not member.is_running or member.is_paused:
                continue
            try:
                status = await member.status()
            except (OSError, TimeoutError, ValueError, IndexError):
                continue
            by_id[status.member_id] = member
            if status.leader_id:
                leader_ids.add(status.leader_id)
        if len(leader_ids) == 1:
            return by_id.get(leader_ids.pop())
        return None

    async def aclose(self) -> None:
        """Stop every member for good, and remove the data dir if this object created it."""
        await _TempRoot.after(self.stop(), self._temp_root)
