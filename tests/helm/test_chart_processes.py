"""The chart's containers, started as Kubernetes would start them (the rendered args, config file,
environment and mounted Secrets) against a real etcd: with the default values, everything runs
over TLS with the certificates the chart generated, and an unauthenticated client is refused.

- etcd serves TLS with the generated etcd certificate and requires client certificates, as the
  rendered etcd flags say; the init Job's command initialises the cluster with its certificate.
- A bookie, a broker and autorecovery start from their rendered commands and mounted files, one
  after the other (restarted, as the kubelet would, if one exits before its startup probe
  passes); every probe passes as the kubelet runs it (HTTPS /health and /metrics: it does not
  check the certificate); the broker's plaintext port is closed.
- A client without a token is refused (AuthenticationError); the generated superuser token over
  magnetar+ssl:// with the generated CA creates a topic, produces and consumes; the `helm test`
  pod's script passes; the bookie refuses a certificate of a role that is not a bookie client.
- With security off, the broker and the bookie answer their gRPC health probes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import magnetar.aio
from bookie.client.bookie_client import BookieClient, BookieCredentials
from magnetar.common.errors import AuthenticationError, AuthorizationError, MagnetarError
from magnetar.testing.etcd import EtcdServer, EtcdTls, free_port
from magnetar.testing.probes import SERVING, grpc_health, http_get
from metadata import open_store
from metadata.config import MetadataStoreConfig
from tests.helm.chart import NAMESPACE, RELEASE, Mounts, Rendered, container_env, mount, render

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(180)]

MAGNETAR = [sys.executable, "-m", "magnetar.cli"]
BROKER = f"{RELEASE}-magnetar-broker"
BOOKIE = f"{RELEASE}-magnetar-bookie"
AUTORECOVERY = f"{RELEASE}-magnetar-autorecovery"
ETCD = f"{RELEASE}-magnetar-etcd"

# What the kubelet does for an HTTPS probe: TLS without checking the certificate.
KUBELET_TLS = ssl.create_default_context()
KUBELET_TLS.check_hostname = False
KUBELET_TLS.verify_mode = ssl.CERT_NONE


async def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *MAGNETAR, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


async def read_cluster_record(config: MetadataStoreConfig) -> None:
    store = await open_store(config)
    try:
        await store.get("/magnetar/cluster")
    finally:
        await store.close()


def read(path: str | Path) -> str:
    return Path(path).read_text()


async def passes_once(probe: dict[str, Any], named_ports: dict[str, int]) -> bool:
    """One run of the probe, as the kubelet runs it."""
    try:
        if "grpc" in probe:
            spec = probe["grpc"]
            return await grpc_health(f"127.0.0.1:{spec['port']}", spec.get("service", "")) == (
                SERVING
            )
        kind = "httpGet" if "httpGet" in probe else "tcpSocket"
        port = probe[kind]["port"]
        port = named_ports[port] if isinstance(port, str) else port
        if kind == "httpGet":
            tls = KUBELET_TLS if probe["httpGet"].get("scheme") == "HTTPS" else None
            return (await http_get(port, probe["httpGet"]["path"], tls=tls))[0] == 200
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
    except (grpc.aio.AioRpcError, OSError, TimeoutError, IndexError, ValueError):
        return False
    return True


async def answers(
    probe: dict[str, Any],
    named_ports: dict[str, int],
    process: asyncio.subprocess.Process | None = None,
    timeout_s: float = 60,
) -> bool:
    """Whether the probe passes, waiting for the process to start (False at once if it exits)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await passes_once(probe, named_ports):
        if asyncio.get_running_loop().time() > deadline:
            return False
        if process is not None and process.returncode is not None:
            return False
        await asyncio.sleep(0.2)
    return True


class Pods:
    """The rendered pods' containers, with their Secrets and ConfigMaps written out here."""

    def __init__(self, rendered: Rendered, root: Path) -> None:
        self.rendered = rendered
        self.root = root

    def container(self, kind: str, name: str) -> tuple[dict[str, Any], Mounts]:
        obj = self.rendered.get(kind, name)
        pod = obj["spec"]["template"]["spec"] if kind != "Pod" else obj["spec"]
        container = pod["containers"][0]
        return container, mount(self.rendered, pod, container, self.root / name)


@dataclass
class Started:
    component: str
    container: dict[str, Any]
    log: Path
    process: asyncio.subprocess.Process | None = None


SERVERS = (
    ("StatefulSet", BOOKIE, "bookie"),
    ("Deployment", BROKER, "broker"),
    ("Deployment", AUTORECOVERY, "autorecovery"),
)


@contextlib.asynccontextmanager
async def servers(
    pods: Pods,
    tmp_path: Path,
    base_env: dict[str, str],
    overrides: dict[str, str],
    components: tuple[str, ...] = ("bookie", "broker", "autorecovery"),
) -> AsyncIterator[list[Started]]:
    """The bookie, the broker and autorecovery, started from their rendered commands, config
    files, environment and mounted files (the broker's shell wrapper, which only computes its
    pod DNS name, is tested apart); stopped, and checked to have run all along, at the end."""
    processes: list[asyncio.subprocess.Process] = []
    started: list[Started] = []
    logs: list[Any] = []
    try:
        for kind, name, component in SERVERS:
            if component not in components:
                continue
            container, mounts = pods.container(kind, name)
            args = [mounts.local(a) for a in container["args"]]
            pod = {
                "metadata.name": f"{name}-0",
                "metadata.namespace": NAMESPACE,
                "status.podIP": "127.0.0.1",
            }
            env = {**base_env, **container_env(container, pod), **overrides}
            env = {k: mounts.local(v) for k, v in env.items()}
            if component == "bookie":
                env["MAGNETAR_DATA_DIR"] = str(tmp_path / "bookie-data")
            log_path = tmp_path / f"{component}.log"
            log = log_path.open("ab")
            logs.append(log)
            server = Started(component, container, log_path)
            started.append(server)
            named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            # one at a time, in the order they depend on each other (as a cluster settles); a
            # process that exits before its startup probe passes (etcd did not answer in time
            # on a loaded machine, say) is started again, as the kubelet restarts a container
            for _restart in range(3):
                process = await asyncio.create_subprocess_exec(
                    *MAGNETAR, *args, env=env, stdout=log, stderr=log
                )
                processes.append(process)
                server.process = process
                if await answers(container["startupProbe"], named, process):
                    break
                assert process.returncode is not None, (
                    f"{component} startupProbe: {log_path.read_text()[-3000:]}"
                )
            else:
                pytest.fail(f"{component} kept exiting: {log_path.read_text()[-3000:]}")
        try:
            yield started
        except MagnetarError as error:
            tails = [s.log.read_text()[-2000:] for s in started]
            raise AssertionError(f"{error!r}; the processes' logs: {tails}") from error
        assert all(s.process is not None and s.process.returncode is None for s in started), [
            s.log.read_text()[-2000:] for s in started
        ]
    finally:
        # the other way round: a broker hands its partitions over while the bookie still runs
        for process in reversed(processes):
            if process.returncode is None:
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        for log in logs:
            log.close()


async def check_probes(started: list[Started], https_ca: Path | None) -> None:
    """Every probe passes as the kubelet runs it, and /metrics answers (over HTTPS, with a
    certificate of the cluster's CA, when ``https_ca``)."""
    for server in started:
        named = {p["name"]: p["containerPort"] for p in server.container.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert await answers(server.container[probe], named), (
                f"{server.component} {probe}: {server.log.read_text()[-3000:]}"
            )
        https = ssl.create_default_context(cafile=str(https_ca)) if https_ca else None
        assert (await http_get(named["http"], "/metrics", tls=https))[0] == 200


async def run_test_pod(pods: Pods, base_env: dict[str, str], service_url: str) -> str:
    """`helm test`: the test pod's script, with its mounted files, against these processes (the
    service URL points here instead of at the broker Service); its output."""
    test_pod, mounts = pods.container("Pod", f"{RELEASE}-magnetar-test")
    env = {**base_env, **container_env(test_pod, {})}
    env = {k: mounts.local(v) for k, v in env.items()}
    assert env["MAGNETAR_SERVICE_URL"].partition("://")[0] == service_url.partition("://")[0]
    env["MAGNETAR_SERVICE_URL"] = service_url
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    script = await asyncio.create_subprocess_exec(
        *test_pod["command"],
        *test_pod["args"],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out_bytes, _ = await asyncio.wait_for(script.communicate(), 90)
    out = out_bytes.decode()
    assert script.returncode == 0, out
    assert "hello-from-helm-test" in out
    return out


def free_ports() -> dict[str, int]:
    names = (
        "broker",
        "broker_tls",
        "broker_http",
        "bookie",
        "bookie_data",
        "bookie_http",
        "autorecovery_http",
    )
    return {name: free_port() for name in names}


def values_for(ports: dict[str, int]) -> dict[str, Any]:
    """The chart's values for one bookie (E1/Qw1/Qa1) on these free ports."""
    return {
        "broker": {
            "ports": {
                "grpc": ports["broker"],
                "grpcTls": ports["broker_tls"],
                "http": ports["broker_http"],
            },
            "config": {"ledger": {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}},
        },
        "bookie": {
            "replicaCount": 1,
            "ports": {
                "grpc": ports["bookie"],
                "data": ports["bookie_data"],
                "http": ports["bookie_http"],
            },
        },
        "autorecovery": {"ports": {"http": ports["autorecovery_http"]}},
    }


async def test_the_chart_s_processes_run_secure_with_the_generated_certificates(
    tmp_path: Path,
) -> None:
    ports = free_ports()
    rendered = render(values_for(ports))
    pods = Pods(rendered, tmp_path / "pods")

    # etcd as its rendered flags say, with the generated certificate (it names 127.0.0.1 too);
    # the harness's own calls present the init Job's certificate
    etcd_container, etcd_mounts = pods.container("StatefulSet", ETCD)
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in etcd_container["args"])
    assert flags["client-cert-auth"] == ""
    assert flags["listen-client-urls"].startswith("https://")
    init_container, init_mounts = pods.container("Job", f"{RELEASE}-magnetar-init")
    etcd_tls = EtcdTls(
        cert_file=Path(etcd_mounts.local(flags["cert-file"])),
        key_file=Path(etcd_mounts.local(flags["key-file"])),
        ca_file=Path(etcd_mounts.local(flags["trusted-ca-file"])),
        client_cert_file=Path(init_mounts.local("/etc/magnetar/tls/tls.crt")),
        client_key_file=Path(init_mounts.local("/etc/magnetar/tls/tls.key")),
    )
    async with EtcdServer(data_dir=tmp_path / "etcd", name="chart", tls=etcd_tls) as etcd:
        # What differs from a pod: the metadata URL (this etcd, not the in-cluster names), the
        # bookie's data directory (no volume here), the advertised hosts (no pod DNS here; the
        # certificates name 127.0.0.1 besides the pods' names) and the mount paths.
        overrides = {"MAGNETAR_METADATA": etcd.url, "MAGNETAR_ADVERTISED_HOST": "127.0.0.1"}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}

        # the init Job: its command, with its certificate for etcd
        args = [init_mounts.local(a) for a in init_container["args"]]
        args[args.index("--metadata") + 1] = etcd.url
        code, out = await run(args, {**base_env, **container_env(init_container, {})})
        assert code == 0, f"init job: {out}"
        # etcd refuses a process that trusts its CA but has no client certificate
        ca_only = MetadataStoreConfig(
            url=etcd.url, etcd_trust_certs_file=etcd_tls.ca_file, connect_timeout_ms=2000
        )
        with pytest.raises(MagnetarError):
            await read_cluster_record(ca_only)

        async with servers(pods, tmp_path, base_env, overrides) as started:
            await check_probes(started, https_ca=etcd_tls.ca_file)
            # nothing listens on the broker's plaintext port
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", ports["broker"])

            _, broker_mounts = pods.container("Deployment", BROKER)
            ca = broker_mounts.local("/etc/magnetar/tls/ca.crt")
            token = read(broker_mounts.local("/etc/magnetar/superuser/token"))
            url = f"magnetar+ssl://127.0.0.1:{ports['broker_tls']}"
            topic = "public/default/chart-secure"

            # without a token: refused
            async with magnetar.aio.Client(url, tls_trust_certs_file_path=ca) as stranger:
                with pytest.raises(AuthenticationError):
                    await stranger.create_producer(topic)
            # the generated superuser token: an admin call, a produce and a consume
            superuser = magnetar.aio.AuthenticationToken(token)
            async with magnetar.aio.AdminClient(
                url, tls_trust_certs_file_path=ca, authentication=superuser
            ) as admin:
                await admin.create_topic(topic)
            async with magnetar.aio.Client(
                url, tls_trust_certs_file_path=ca, authentication=superuser
            ) as client:
                consumer = await client.subscribe(topic, "s", initial_position="earliest")
                producer = await client.create_producer(topic)
                await producer.send(b"secure by default")
                message = await consumer.receive(timeout_millis=10_000)
                assert message.data() == b"secure by default"

            # the bookie takes the broker's certificate, and refuses the init Job's: its common
            # name, init, is not a bookie client role
            bookie_address = f"127.0.0.1:{ports['bookie_data']}"

            def bookie_client(mounts: Mounts) -> BookieClient:
                credentials = BookieCredentials(
                    trust_certs_file=Path(mounts.local("/etc/magnetar/tls/ca.crt")),
                    cert_file=Path(mounts.local("/etc/magnetar/tls/tls.crt")),
                    key_file=Path(mounts.local("/etc/magnetar/tls/tls.key")),
                )
                return BookieClient(bookie_address, timeout_s=5, credentials=credentials)

            allowed = bookie_client(broker_mounts)
            assert (await allowed.info()).bookie_id == f"{BOOKIE}-0"
            await allowed.close()
            refused = bookie_client(init_mounts)
            with pytest.raises(AuthorizationError, match="role 'init' may not"):
                await refused.info()
            await refused.close()

            # `helm test`: its script passes with its mounted CA and token
            await run_test_pod(pods, base_env, url)


async def test_with_security_off_the_processes_answer_their_grpc_probes(tmp_path: Path) -> None:
    """tls.enabled and auth.enabled false: plaintext everywhere, and the broker's and the
    bookie's probes are gRPC health probes again (autorecovery's differ only by the scheme)."""
    ports = free_ports()
    rendered = render({**values_for(ports), "tls": {"enabled": False}, "auth": {"enabled": False}})
    assert not rendered.of_kind("Secret")
    pods = Pods(rendered, tmp_path / "pods")
    async with EtcdServer(data_dir=tmp_path / "etcd", name="chart") as etcd:
        overrides = {"MAGNETAR_METADATA": etcd.url, "MAGNETAR_ADVERTISED_HOST": "127.0.0.1"}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}
        job, _ = pods.container("Job", f"{RELEASE}-magnetar-init")
        args = list(job["args"])
        args[args.index("--metadata") + 1] = etcd.url
        for attempt in ("first", "again"):  # after every upgrade too: a no-op then
            code, out = await run(args, {**base_env, **container_env(job, {})})
            assert code == 0, f"init job ({attempt}): {out}"
        async with servers(
            pods, tmp_path, base_env, overrides, components=("bookie", "broker")
        ) as started:
            for server in started:
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    assert "grpc" in server.container[probe], f"{server.component} {probe}"
            await check_probes(started, https_ca=None)
            await run_test_pod(pods, base_env, f"magnetar://127.0.0.1:{ports['broker']}")
