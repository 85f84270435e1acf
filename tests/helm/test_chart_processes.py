"""The chart's containers, started as Kubernetes would start them (the rendered args, config file
and environment) against a real etcd: the init Job's command succeeds (twice), every probe gets
SERVING from the port and service it names, and the `helm test` pod's script passes."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from magnetar.testing.etcd import EtcdServer, free_port
from magnetar.testing.probes import SERVING, grpc_health, http_get
from tests.helm.chart import NAMESPACE, RELEASE, container_env, render

pytestmark = pytest.mark.etcd

MAGNETAR = [sys.executable, "-m", "magnetar.cli"]


async def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *MAGNETAR, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


async def health(port: int, service: str, timeout_s: float = 30) -> int:
    """The status the probe would see, waiting (as the startup probe does) for the port."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            status = await grpc_health(f"127.0.0.1:{port}", service)
            if status == SERVING or asyncio.get_running_loop().time() > deadline:
                return status
        except grpc.aio.AioRpcError:
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)


async def answers(probe: dict[str, Any], named_ports: dict[str, int]) -> bool:
    """Whether the probe, as the kubelet runs it, passes (waiting for the process to start)."""
    if "grpc" in probe:
        spec = probe["grpc"]
        return await health(spec["port"], spec.get("service", "")) == SERVING
    kind = "httpGet" if "httpGet" in probe else "tcpSocket"
    port = probe[kind]["port"]
    port = named_ports[port] if isinstance(port, str) else port
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            if kind == "httpGet":
                if (await http_get(port, probe["httpGet"]["path"]))[0] == 200:
                    return True
            else:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return True
        except OSError:
            pass
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.2)


async def test_the_chart_s_processes_answer_its_probes(tmp_path: Path) -> None:
    ports = {
        name: free_port()
        for name in ("broker", "broker_http", "bookie", "bookie_http", "autorecovery_http")
    }
    rendered = render(
        {
            "broker": {
                "ports": {"grpc": ports["broker"], "http": ports["broker_http"]},
                "config": {"ledger": {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}},
            },
            "bookie": {
                "replicaCount": 1,
                "ports": {"grpc": ports["bookie"], "http": ports["bookie_http"]},
            },
            "autorecovery": {"ports": {"http": ports["autorecovery_http"]}},
        }
    )
    processes: list[asyncio.subprocess.Process] = []
    logs: list[Any] = []
    async with EtcdServer(data_dir=tmp_path / "etcd", name="chart") as etcd:
        # What differs from a pod: the metadata URL (this etcd, not the in-cluster names), the
        # bookie's data directory (no volume here) and the advertised host (no pod DNS).
        overrides = {"MAGNETAR_METADATA": etcd.url, "MAGNETAR_ADVERTISED_HOST": "127.0.0.1"}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}

        job = rendered.get("Job", f"{RELEASE}-magnetar-init")["spec"]["template"]["spec"]
        args = list(job["containers"][0]["args"])
        args[args.index("--metadata") + 1] = etcd.url
        env = {**base_env, **container_env(job["containers"][0], {})}
        for attempt in ("first", "again"):
            code, out = await run(args, env)
            assert code == 0, f"init job ({attempt}): {out}"
        code, out = await run(["cluster", "info", "--metadata", etcd.url], env)
        assert code == 0, out
        assert RELEASE in out

        try:
            started: list[tuple[str, dict[str, Any]]] = []
            for kind, name, component in (
                ("StatefulSet", f"{RELEASE}-magnetar-bookie", "bookie"),
                ("Deployment", f"{RELEASE}-magnetar-broker", "broker"),
                ("Deployment", f"{RELEASE}-magnetar-autorecovery", "autorecovery"),
            ):
                container = rendered.container(kind, name)
                config_map = rendered.get("ConfigMap", name)
                config_file = tmp_path / f"{component}.toml"
                config_file.write_text(config_map["data"][f"{component}.toml"])
                args = list(container["args"])
                args[args.index("--config") + 1] = str(config_file)
                pod = {
                    "metadata.name": f"{name}-0",
                    "metadata.namespace": NAMESPACE,
                    "status.podIP": "127.0.0.1",
                }
                env = {**base_env, **container_env(container, pod), **overrides}
                if component == "bookie":
                    env["MAGNETAR_DATA_DIR"] = str(tmp_path / "bookie-data")
                log = (tmp_path / f"{component}.log").open("wb")
                logs.append(log)
                processes.append(
                    await asyncio.create_subprocess_exec(
                        *MAGNETAR, *args, env=env, stdout=log, stderr=log
                    )
                )
                started.append((component, container))

            for component, container in started:
                named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    assert await answers(container[probe], named), f"{component} {probe}"
                if "http" in named:
                    assert (await http_get(named["http"], "/metrics"))[0] == 200
            # the broker came up under its pod name; autorecovery is still running
            code, out = await run(
                ["cluster", "brokers", "--service-url", f"magnetar://127.0.0.1:{ports['broker']}"],
                base_env,
            )
            assert f"{RELEASE}-magnetar-broker-0" in out, out

            # `helm test`: the test pod's script, as it is rendered, against these processes
            # (the service URL points here instead of at the broker Service)
            pod = rendered.get("Pod", f"{RELEASE}-magnetar-test")["spec"]["containers"][0]
            env = {**base_env, **container_env(pod, {})}
            env["MAGNETAR_SERVICE_URL"] = f"magnetar://127.0.0.1:{ports['broker']}"
            env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
            test_pod = await asyncio.create_subprocess_exec(
                *pod["command"],
                *pod["args"],
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out_bytes, _ = await asyncio.wait_for(test_pod.communicate(), 90)
            assert test_pod.returncode == 0, out_bytes.decode()
            assert b"hello-from-helm-test" in out_bytes

            assert all(p.returncode is None for p in processes), [
                (tmp_path / f"{c}.log").read_text()[-2000:] for c, _ in started
            ]
        finally:
            for process in processes:
                if process.returncode is None:
                    process.terminate()
            for process in processes:
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            for log in logs:
                log.close()
