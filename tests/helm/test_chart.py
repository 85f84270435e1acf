"""The Helm chart, rendered offline by Helm's own engine: lint, Kubernetes schemas, and what the
objects must say (bookies keep volumes, brokers none; probes on the ports the processes listen
on; replica counts apart; etcd endpoints = members; non-root everywhere; bad values refused), and
its security: TLS on every connection with generated certificates that name what clients connect
to, kept across upgrades; authentication and authorization; NetworkPolicies; each part off."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.process import LIVENESS_SERVICE as BOOKIE_LIVENESS
from bookie.service.config import BookieConfig
from broker.process import LIVENESS_SERVICE as BROKER_LIVENESS
from broker.service.config import BrokerConfig
from magnetar.cli import build_parser
from magnetar.common.config import load_config
from tests.helm.chart import (
    CHART_DIR,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    ROOT,
    ci_values,
    container_env,
    render,
    secret_files,
)

# Oldest the chart supports (gRPC probes are GA from 1.27), and newer ones up to the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ("1.27.0", "1.30.0", "1.33.0", "1.37.0")
# Prometheus Operator and cert-manager resources: no schema ships with kubernetes-validate; checked
# by hand below.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}

FULL = CHART_DIR / "ci" / "full-values.yaml"
EXTERNAL = CHART_DIR / "ci" / "external-etcd-values.yaml"
MINIMAL = CHART_DIR / "ci" / "minimal-values.yaml"
BROKER = f"{RELEASE}-magnetar-broker"
BOOKIE = f"{RELEASE}-magnetar-bookie"
ETCD = f"{RELEASE}-magnetar-etcd"
AUTORECOVERY = f"{RELEASE}-magnetar-autorecovery"
INIT = f"{RELEASE}-magnetar-init"
TEST_POD = f"{RELEASE}-magnetar-test"


def ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_the_ci_values_files_are_the_four_named_in_the_docs() -> None:
    assert ids(CI_VALUES) == [
        "default-values",
        "external-etcd-values",
        "full-values",
        "minimal-values",
    ]


# --- helm lint --strict -----------------------------------------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
@pytest.mark.parametrize("kube_version", [KUBE_VERSIONS[0], KUBE_VERSIONS[-1]])
def test_helm_lint_strict_passes(values_file: Path, kube_version: str) -> None:
    report = helm_python.lint(
        CHART_DIR, ci_values(values_file), strict=True, kube_version=f"v{kube_version}"
    )
    assert report["errors"] == []
    # strict: a warning (2) fails as an error (3) would; an info (1) such as "icon is
    # recommended" does not
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# --- every object valid for each Kubernetes version ------------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_every_object_is_valid_for_each_kubernetes_version(values_file: Path) -> None:
    rendered = render(ci_values(values_file))
    custom = [o for o in rendered.objects if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS]
    for version in KUBE_VERSIONS:
        for obj in rendered.objects:
            if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"Kubernetes {version}: {obj['kind']} {obj['metadata']['name']}: "
                    f"{exc.message} at {'.'.join(map(str, exc.path))}"
                )
    for obj in custom:
        if obj["apiVersion"].startswith("cert-manager.io/"):
            check_cert_manager(obj, rendered)
        else:
            check_monitor(obj, rendered)


def secret_volumes(rendered: Any) -> set[str]:
    """Every Secret a pod of the release mounts."""
    return {
        v["secret"]["secretName"]
        for _, pod in rendered.workloads()
        for v in pod.get("volumes", [])
        if "secret" in v
    }


def check_cert_manager(obj: dict[str, Any], rendered: Any) -> None:
    """A Certificate fills a Secret pods mount (or the CA an Issuer of the release uses), from
    an issuer of the release or one named in the values; an Issuer is self-signed or a CA's."""
    spec = obj["spec"]
    if obj["kind"] == "Issuer":
        assert set(spec) in ({"selfSigned"}, {"ca"})
        if "ca" in spec:
            assert any(
                c["spec"]["secretName"] == spec["ca"]["secretName"] and c["spec"]["isCA"]
                for c in rendered.of_kind("Certificate")
            )
        return
    issuers = {i["metadata"]["name"] for i in rendered.of_kind("Issuer")}
    issuer = spec["issuerRef"]
    assert issuer["kind"] in ("Issuer", "ClusterIssuer")
    assert issuer["group"] == "cert-manager.io"
    assert issuer["kind"] == "ClusterIssuer" or issuer["name"] in issuers
    cas = {i["spec"]["ca"]["secretName"] for i in rendered.of_kind("Issuer") if "ca" in i["spec"]}
    assert spec["secretName"] in secret_volumes(rendered) | cas
    assert spec["commonName"]
    assert spec["privateKey"]["algorithm"] == "ECDSA"
    if not spec.get("isCA"):
        assert {"server auth", "client auth"} <= set(spec["usages"])
        for duration in ("duration", "renewBefore"):
            assert re.fullmatch(r"(\d+h)?(\d+m)?(\d+s)?", spec[duration]), duration


def check_monitor(monitor: dict[str, Any], rendered: Any) -> None:
    """A ServiceMonitor/PodMonitor selects a component that has a port named as it says."""
    spec = monitor["spec"]
    endpoints_key = "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    assert set(spec) == {"selector", "namespaceSelector", endpoints_key}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    labels = spec["selector"]["matchLabels"]
    endpoints = spec[endpoints_key]
    if monitor["kind"] == "ServiceMonitor":
        services = [s for s in rendered.of_kind("Service") if s["spec"]["selector"] == labels]
        assert services, f"{monitor['metadata']['name']} selects no Service"
        ports = {p["name"] for s in services for p in s["spec"]["ports"]}
    else:
        pods = [
            spec
            for o, spec in rendered.workloads()
            if o["kind"] != "Pod"
            and labels.items() <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"{monitor['metadata']['name']} selects no pods"
        ports = {p["name"] for s in pods for c in s["containers"] for p in c.get("ports", [])}
    for endpoint in endpoints:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
        # over HTTPS while the HTTP ports are: trusting the CA of the component's certificate
        # (in a Secret its pods mount), checking the name of its Service
        if "scheme" in endpoint:
            assert endpoint["scheme"] == "https"
            tls = endpoint["tlsConfig"]
            assert tls["ca"]["secret"]["key"] == "ca.crt"
            assert tls["ca"]["secret"]["name"] in secret_volumes(rendered)
            component = labels["app.kubernetes.io/component"]
            assert tls["serverName"] == f"{RELEASE}-magnetar-{component}.{NAMESPACE}.svc"


# --- storage: bookies keep volumes, brokers have none -----------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_bookies_have_persistent_volumes_and_brokers_have_none(values_file: Path) -> None:
    values = ci_values(values_file)
    rendered = render(values)
    bookies = rendered.get("StatefulSet", BOOKIE)
    claims = bookies["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    size = values.get("bookie", {}).get("persistence", {}).get("size", "50Gi")
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == size
    mounts = rendered.container("StatefulSet", BOOKIE)["volumeMounts"]
    data_mount = next(m["mountPath"] for m in mounts if m["name"] == "data")
    # the bookie's data directory is on that volume, in a directory of its own (not the
    # volume's root, where a file system may keep lost+found)
    data_dir = rendered.config_toml("bookie")["data_dir"]
    assert Path(data_dir).parent == Path(data_mount)
    # the identity is the pod's stable name: the same after a restart, tied to the volume
    env = {e["name"]: e for e in rendered.container("StatefulSet", BOOKIE)["env"]}
    assert env["MAGNETAR_BOOKIE_ID"]["value"] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert bookies["spec"]["serviceName"] == BOOKIE
    assert rendered.get("Service", BOOKIE)["spec"]["clusterIP"] == "None"

    brokers = rendered.get("Deployment", BROKER)
    pod = brokers["spec"]["template"]["spec"]
    assert all("persistentVolumeClaim" not in v for v in pod["volumes"])
    assert {v["name"] for v in pod["volumes"] if "emptyDir" in v} == {"tmp"}
    assert not list(rendered.of_kind("PersistentVolumeClaim"))
    # only bookies and etcd members claim volumes
    claimed = {o["metadata"]["name"] for o in rendered.of_kind("StatefulSet")}
    assert claimed == ({BOOKIE, ETCD} if values.get("etcd", {}).get("enabled", True) else {BOOKIE})


def test_the_bookies_have_anti_affinity_and_a_disruption_budget() -> None:
    rendered = render()
    pod = rendered.get("StatefulSet", BOOKIE)["spec"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    pdb = rendered.get("PodDisruptionBudget", BOOKIE)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == rendered.get("StatefulSet", BOOKIE)["spec"]["selector"]

    hard = render({"bookie": {"antiAffinity": "hard"}})
    pod = hard.get("StatefulSet", BOOKIE)["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    none = render({"bookie": {"antiAffinity": "none"}})
    assert "affinity" not in none.get("StatefulSet", BOOKIE)["spec"]["template"]["spec"]


def test_brokers_get_time_to_hand_their_partitions_over() -> None:
    rendered = render()
    pod = rendered.get("Deployment", BROKER)["spec"]["template"]["spec"]
    shutdown_s = BrokerConfig(metadata="memory://").shutdown_timeout_s
    assert pod["terminationGracePeriodSeconds"] > shutdown_s
    assert rendered.get("PodDisruptionBudget", BROKER)["spec"]["maxUnavailable"] == 1
    strategy = rendered.get("Deployment", BROKER)["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}

    longer = render(
        {"broker": {"config": {"shutdown_timeout_s": 200}, "terminationGracePeriodSeconds": 240}}
    )
    assert longer.config_toml("broker")["shutdown_timeout_s"] == 200


# --- probes on the ports the processes listen on ----------------------------------------------


PLAIN = {"tls": {"enabled": False}}
"""TLS off as a whole: the gRPC probes, on plaintext ports."""


def listening_ports(config: dict[str, Any], component: str) -> dict[str, int]:
    """The ports a process listens on, by the chart's port names, as its config file says."""
    ports = {"http": config["http_port"]}
    if config["port"] != "":  # an empty port: no plaintext listener
        ports["grpc"] = config["port"]
    if component == "broker" and "tls_cert_file" in config:
        ports["grpc-tls"] = config["tls_port"]
    if component == "broker" and config["pulsar_port"] != "":
        # Pulsar's protocol: plaintext only beside a plaintext gRPC port (the process opens it
        # only then), TLS only with the certificate
        assert config["port"] != ""
        ports["pulsar"] = config["pulsar_port"]
    if component == "broker" and config.get("pulsar_tls_port", "") != "":
        assert "tls_cert_file" in config
        ports["pulsar-tls"] = config["pulsar_tls_port"]
    if component == "bookie":
        ports["data"] = config["data_port"]
    return ports


@pytest.mark.parametrize(
    "values",
    [*(ci_values(f) for f in CI_VALUES), PLAIN],
    ids=[*ids(CI_VALUES), "tls-off"],
)
def test_probes_point_at_ports_the_processes_listen_on(values: dict[str, Any]) -> None:
    rendered = render(values)
    for kind, name, component, liveness in (
        ("StatefulSet", BOOKIE, "bookie", BOOKIE_LIVENESS),
        ("Deployment", BROKER, "broker", BROKER_LIVENESS),
    ):
        container = rendered.container(kind, name)
        config = rendered.config_toml(component)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # the process listens where its config file says, on every interface
        assert ports == listening_ports(config, component)
        assert config["bind_host"] == "0.0.0.0"
        assert container["args"][:1] == [component]
        config_path = container["args"][container["args"].index("--config") + 1]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == config_path)
        assert mount["subPath"] == f"{component}.toml"
        grpc_is_tls = "tls_cert_file" in config
        if grpc_is_tls:
            # a kubelet gRPC probe cannot speak TLS: HTTP(S) on the status port instead, with
            # the same meanings: /health is readiness (and the end of start-up), /metrics
            # answers while the process runs
            scheme = "HTTPS" if "http_tls_cert_file" in config else "HTTP"
            for probe, path in (
                ("startupProbe", "/health"),
                ("livenessProbe", "/metrics"),
                ("readinessProbe", "/health"),
            ):
                assert container[probe]["httpGet"] == {
                    "path": path,
                    "port": "http",
                    "scheme": scheme,
                }, f"{name} {probe}"
        else:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                grpc_probe = container[probe]["grpc"]
                assert grpc_probe["port"] == config["port"], f"{name} {probe}"
            # liveness and startup ask for the service that answers while the process runs;
            # readiness asks for the overall status, which follows the metadata session
            assert container["startupProbe"]["grpc"]["service"] == liveness
            assert container["livenessProbe"]["grpc"]["service"] == liveness
            assert "service" not in container["readinessProbe"]["grpc"]
        # Services and scrape annotations use the same ports
        service_ports = {p["name"]: p for p in rendered.get("Service", name)["spec"]["ports"]}
        assert {n: p["targetPort"] for n, p in service_ports.items()} == {n: n for n in ports}
        for port_name, port in service_ports.items():
            assert port["port"] == ports[port_name]
        annotations = rendered.get(kind, name)["spec"]["template"]["metadata"]["annotations"]
        if "prometheus.io/port" in annotations:
            assert annotations["prometheus.io/port"] == str(config["http_port"])
            scheme = "https" if "http_tls_cert_file" in config else "http"
            assert annotations["prometheus.io/scheme"] == scheme


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_autorecovery_is_probed_on_its_http_port(values_file: Path) -> None:
    rendered = render(ci_values(values_file))
    if not rendered.has("Deployment", AUTORECOVERY):
        assert ci_values(values_file)["autorecovery"]["enabled"] is False
        return
    container = rendered.container("Deployment", AUTORECOVERY)
    config = rendered.config_toml("autorecovery")
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": config["http_port"]
    }
    assert config["bind_host"] == "0.0.0.0"
    # readiness follows the metadata session (/health); liveness only that the process answers
    scheme = "HTTPS" if "http_tls_cert_file" in config else "HTTP"
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/health",
        "port": "http",
        "scheme": scheme,
    }
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["startupProbe"]["tcpSocket"] == {"port": "http"}
    service = rendered.get("Service", AUTORECOVERY)["spec"]
    assert service["ports"] == [{"name": "http", "port": config["http_port"], "targetPort": "http"}]


def test_changed_ports_move_probes_services_and_config_together() -> None:
    ports = {"grpc": 7650, "grpcTls": 7651, "http": 9080, "pulsar": 7660, "pulsarTls": 7661}
    rendered = render({"broker": {"ports": ports}})
    container = rendered.container("Deployment", BROKER)
    config = rendered.config_toml("broker")
    assert (config["tls_port"], config["pulsar_tls_port"]) == (7651, 7661)
    assert config["pulsar_port"] == ""  # no plaintext Pulsar listener beside TLS-only gRPC
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc-tls": 7651,
        "pulsar-tls": 7661,
        "http": 9080,
    }
    service = {p["name"]: p["port"] for p in rendered.get("Service", BROKER)["spec"]["ports"]}
    assert service == {"grpc-tls": 7651, "pulsar-tls": 7661, "http": 9080}
    assert ":7651" in rendered.notes
    plain = render({**PLAIN, "broker": {"ports": {**ports, "pulsarTls": None}}})
    config = plain.config_toml("broker")
    assert (config["port"], config["pulsar_port"]) == (7650, 7660)
    assert "pulsar_tls_port" not in config
    assert plain.container("Deployment", BROKER)["readinessProbe"]["grpc"]["port"] == 7650
    service = {p["name"]: p["port"] for p in plain.get("Service", BROKER)["spec"]["ports"]}
    assert service == {"grpc": 7650, "pulsar": 7660, "http": 9080}
    assert ":7650" in plain.notes
    # a null port closes that listener: configured empty, neither exposed nor let in
    closed = render({"broker": {"ports": {"pulsarTls": None}}})
    assert closed.config_toml("broker")["pulsar_tls_port"] == ""
    names = {p["name"] for p in closed.get("Service", BROKER)["spec"]["ports"]}
    assert names == {"grpc-tls", "http"}
    assert 6661 not in policies(closed)["broker"]


def test_two_broker_listeners_on_one_port_fail_saying_which() -> None:
    with pytest.raises(
        helm_python.HelmRenderError,
        match=re.escape("broker.ports.grpcTls and broker.ports.pulsarTls are both 6651"),
    ):
        render({"broker": {"ports": {"pulsarTls": 6651}}})


# --- replicas ---------------------------------------------------------------------------------


def replicas(rendered: Any) -> tuple[int | None, int]:
    broker = rendered.get("Deployment", BROKER)["spec"].get("replicas")
    return broker, rendered.get("StatefulSet", BOOKIE)["spec"]["replicas"]


def test_broker_and_bookie_replica_counts_change_independently() -> None:
    assert replicas(render()) == (2, 4)
    assert replicas(render({"broker": {"replicaCount": 7}})) == (7, 4)
    assert replicas(render({"bookie": {"replicaCount": 6}})) == (2, 6)
    assert replicas(render({"broker": {"replicaCount": 1}, "bookie": {"replicaCount": 9}})) == (
        1,
        9,
    )
    # the bookie count changes nothing of the brokers' pods, and the other way round, so
    # scaling one never restarts the other
    base = render()
    more_bookies = render({"bookie": {"replicaCount": 5}})
    more_brokers = render({"broker": {"replicaCount": 5}})
    assert (
        base.get("Deployment", BROKER)["spec"]["template"]
        == more_bookies.get("Deployment", BROKER)["spec"]["template"]
    )
    assert (
        base.get("StatefulSet", BOOKIE)["spec"]["template"]
        == more_brokers.get("StatefulSet", BOOKIE)["spec"]["template"]
    )


def test_the_autoscaler_owns_the_broker_count_when_on() -> None:
    rendered = render({"broker": {"autoscaling": {"enabled": True, "minReplicas": 3}}})
    assert replicas(rendered) == (None, 4)
    hpa = rendered.get("HorizontalPodAutoscaler", BROKER)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": BROKER,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    metric = hpa["spec"]["metrics"][0]["resource"]
    assert metric["name"] == "cpu"
    assert metric["target"]["averageUtilization"] == 70
    # the autoscaler needs a CPU request to compute utilisation against
    assert rendered.container("Deployment", BROKER)["resources"]["requests"]["cpu"]
    assert not render().of_kind("HorizontalPodAutoscaler")


# --- etcd -------------------------------------------------------------------------------------


def etcd_flags(container: dict[str, Any]) -> dict[str, str]:
    """etcd's --flag=value arguments by flag ("" for a flag without a value)."""
    return dict(a.removeprefix("--").partition("=")[::2] for a in container["args"])


def metadata_urls(rendered: Any) -> set[str]:
    """Every metadata URL the release hands to a process."""
    urls = {rendered.config_toml(c)["metadata"] for c in ("broker", "bookie")}
    if rendered.has("ConfigMap", AUTORECOVERY):
        urls.add(rendered.config_toml("autorecovery")["metadata"])
    job = rendered.get("Job", f"{RELEASE}-magnetar-init")["spec"]["template"]["spec"]
    args = job["containers"][0]["args"]
    urls.add(args[args.index("--metadata") + 1])
    return urls


@pytest.mark.parametrize("members", [1, 3, 5])
def test_the_etcd_endpoints_are_the_etcd_members(members: int) -> None:
    rendered = render({"etcd": {"replicaCount": members}})
    etcd = rendered.get("StatefulSet", ETCD)
    assert etcd["spec"]["replicas"] == members
    headless = rendered.get("Service", etcd["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == etcd["spec"]["selector"]["matchLabels"]
    container = rendered.container("StatefulSet", ETCD)
    client_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "client")
    domain = f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    expected = [f"{ETCD}-{i}.{domain}:{client_port}" for i in range(members)]
    (url,) = metadata_urls(rendered)
    assert url == "etcd://" + ",".join(expected)
    # each member advertises exactly that address, and the initial cluster lists them all
    args = etcd_flags(container)
    assert args["advertise-client-urls"] == f"https://$(POD_NAME).{domain}:{client_port}"
    peers = args["initial-cluster"].split(",")
    assert [p.split("=")[0] for p in peers] == [f"{ETCD}-{i}" for i in range(members)]
    peer_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "peer")
    assert [p.split("=")[1] for p in peers] == [
        f"https://{ETCD}-{i}.{domain}:{peer_port}" for i in range(members)
    ]
    assert rendered.get("PodDisruptionBudget", ETCD)["spec"]["maxUnavailable"] == 1


def test_external_etcd_replaces_the_in_chart_one() -> None:
    values = ci_values(EXTERNAL)
    rendered = render(values)
    assert metadata_urls(rendered) == {
        "etcd://" + ",".join(values["etcd"]["external"]["endpoints"])
    }
    etcd_objects = [
        o
        for o in rendered.objects
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "etcd"
    ]
    assert etcd_objects == []


# --- security ---------------------------------------------------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_every_container_runs_as_non_root(values_file: Path) -> None:
    rendered = render(ci_values(values_file))
    dockerfile_user = dockerfile_uid()
    seen = 0
    for obj, pod in rendered.workloads():
        pod_context = pod.get("securityContext", {})
        for container in pod.get("initContainers", []) + pod["containers"]:
            seen += 1
            context = {**pod_context, **container.get("securityContext", {})}
            where = f"{obj['kind']} {obj['metadata']['name']} container {container['name']}"
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser", 0) != 0, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            if container["image"].split(":")[0].endswith("/magnetar"):
                # the image's own user, so files it made are the process's
                assert context["runAsUser"] == dockerfile_user, where
        assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod.get("automountServiceAccountToken") is False
    assert seen >= 4
    # the account has no role: Magnetar never calls the Kubernetes API
    assert not rendered.of_kind("Role")
    assert not rendered.of_kind("ClusterRole")


MAGNETAR_WORKLOADS = (
    ("Deployment", BROKER, "broker"),
    ("StatefulSet", BOOKIE, "bookie"),
    ("Deployment", AUTORECOVERY, "autorecovery"),
    ("Job", INIT, "init"),
)
TLS_DIR = "/etc/magnetar/tls"


def pod_spec(rendered: Any, kind: str, name: str) -> dict[str, Any]:
    obj = rendered.get(kind, name)
    return dict(obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"])


def mounted_secrets(rendered: Any, kind: str, name: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """mountPath -> (Secret name, the volume's secret source) of a pod's first container."""
    pod = pod_spec(rendered, kind, name)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounted = {}
    for volume_mount in pod["containers"][0].get("volumeMounts", []):
        source = volumes.get(volume_mount["name"], {}).get("secret")
        if source is not None:
            mounted[volume_mount["mountPath"]] = (source["secretName"], source)
    return mounted


def certificate(rendered: Any, secret: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(secret_files(rendered.get("Secret", secret))["tls.crt"])


def names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:  # a client certificate only: the init Job's
        return []
    return [
        *san.get_values_for_type(x509.DNSName),
        *map(str, san.get_values_for_type(x509.IPAddress)),
    ]


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def covers(cert: x509.Certificate, host: str) -> bool:
    """Whether the certificate names ``host`` (a wildcard stands for one leftmost label)."""
    for name in names(cert):
        if name.startswith("*."):
            label, _, rest = host.partition(".")
            if label and rest == name[2:]:
                return True
        elif name == host:
            return True
    return False


def test_every_connection_is_tls_by_default() -> None:
    """Each process's settings point at files of its mounted certificate, and no plaintext
    listener is left: brokers (client port, HTTPS, to bookies, to etcd, to each other), bookies
    (mutual TLS), autorecovery, the init Job and etcd (clients and peers)."""
    rendered = render()
    for kind, name, component in MAGNETAR_WORKLOADS:
        mounted = mounted_secrets(rendered, kind, name)
        assert mounted[TLS_DIR][0] == f"{name}-tls", component
    broker = rendered.config_toml("broker")
    assert broker["port"] == ""  # no plaintext listener
    assert broker["tls_port"] == 6651
    assert "tls_trust_certs_file" not in broker  # token clients need no certificate
    bookie = rendered.config_toml("bookie")
    assert bookie["tls_trust_certs_file"] == f"{TLS_DIR}/ca.crt"  # mutual TLS
    autorecovery = rendered.config_toml("autorecovery")
    for config in (broker, bookie, autorecovery):
        assert config["http_tls_cert_file"] == f"{TLS_DIR}/tls.crt"
        assert config["http_tls_key_file"] == f"{TLS_DIR}/tls.key"
        assert config["etcd_trust_certs_file"] == f"{TLS_DIR}/ca.crt"
        assert config["etcd_cert_file"] == f"{TLS_DIR}/tls.crt"
        assert config["etcd_key_file"] == f"{TLS_DIR}/tls.key"
    for config in (broker, autorecovery):
        assert config["ledger"] == {
            "tls_trust_certs_file": f"{TLS_DIR}/ca.crt",
            "tls_cert_file": f"{TLS_DIR}/tls.crt",
            "tls_key_file": f"{TLS_DIR}/tls.key",
        }
    for config in (broker, bookie):
        assert config["tls_cert_file"] == f"{TLS_DIR}/tls.crt"
        assert config["tls_key_file"] == f"{TLS_DIR}/tls.key"
    assert broker["broker_client_trust_certs_file"] == f"{TLS_DIR}/ca.crt"
    args = rendered.container("Job", INIT)["args"]
    for flag, file in (("trust-certs", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key")):
        assert args[args.index(f"--etcd-{flag}-file") + 1] == f"{TLS_DIR}/{file}"
    # etcd: TLS for clients (certificates required) and for peers (of common name etcd)
    etcd = etcd_flags(rendered.container("StatefulSet", ETCD))
    mounted = mounted_secrets(rendered, "StatefulSet", ETCD)
    assert mounted["/etc/etcd/tls"][0] == f"{ETCD}-tls"
    for flag in ("listen-client-urls", "advertise-client-urls", "listen-peer-urls"):
        assert etcd[flag].startswith("https://"), flag
    assert etcd["initial-advertise-peer-urls"].startswith("https://")
    assert {f: etcd[f] for f in ("cert-file", "peer-cert-file")} == {
        "cert-file": "/etc/etcd/tls/tls.crt",
        "peer-cert-file": "/etc/etcd/tls/tls.crt",
    }
    assert etcd["trusted-ca-file"] == etcd["peer-trusted-ca-file"] == "/etc/etcd/tls/ca.crt"
    assert etcd["client-cert-auth"] == etcd["peer-client-cert-auth"] == ""
    assert etcd["peer-cert-allowed-cn"] == "etcd"
    # the broker Service offers only the TLS ports (gRPC, Pulsar's protocol)
    service = rendered.get("Service", BROKER)["spec"]["ports"]
    assert {p["name"]: p["port"] for p in service} == {
        "grpc-tls": 6651,
        "pulsar-tls": 6661,
        "http": 8080,
    }
    assert "magnetar+ssl://" in rendered.notes


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_secrets_are_mounted_read_only_and_only_where_needed(values_file: Path) -> None:
    rendered = render(ci_values(values_file))
    for obj, pod in rendered.workloads():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for volume_mount in container.get("volumeMounts", []):
                volume = volumes.get(volume_mount["name"], {})
                if "secret" in volume:
                    where = f"{obj['metadata']['name']} {volume_mount['mountPath']}"
                    assert volume_mount.get("readOnly") is True, where
                    assert volume["secret"]["defaultMode"] == 0o440, where
    # the private keys of the tokens stay with the brokers; the test pod gets the CA alone
    for kind, name, _ in MAGNETAR_WORKLOADS[1:]:
        if rendered.has(kind, name):
            assert "/etc/magnetar/token-key" not in mounted_secrets(rendered, kind, name)
            assert "/etc/magnetar/superuser" not in mounted_secrets(rendered, kind, name)
    test_pod = mounted_secrets(rendered, "Pod", TEST_POD)
    if TLS_DIR in test_pod:
        assert [i["key"] for i in test_pod[TLS_DIR][1]["items"]] == ["ca.crt"]


def test_the_generated_certificates_come_from_one_ca_with_the_roles_and_names_needed() -> None:
    rendered = render()
    secrets = {s["metadata"]["name"]: s for s in rendered.of_kind("Secret")}
    ca = certificate(rendered, f"{RELEASE}-magnetar-ca")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server_and_client = {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    for component in ("broker", "bookie", "autorecovery", "init", "etcd"):
        secret = secrets[f"{RELEASE}-magnetar-{component}-tls"]
        assert secret["type"] == "kubernetes.io/tls"
        files = secret_files(secret)
        assert files["ca.crt"] == secret_files(secrets[f"{RELEASE}-magnetar-ca"])["tls.crt"]
        cert = x509.load_pem_x509_certificate(files["tls.crt"])
        cert.verify_directly_issued_by(ca)
        assert common_name(cert) == component  # the role the bookies and etcd see
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert server_and_client <= set(usages)
        key = serialization.load_pem_private_key(files["tls.key"], password=None)
        spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    # the names clients connect to: the broker Service, each broker's advertised pod name
    broker = certificate(rendered, f"{BROKER}-tls")
    for host in (
        f"{BROKER}.{NAMESPACE}.svc.cluster.local",
        f"{BROKER}.{NAMESPACE}.svc",
        advertised_broker_host("10.1.2.3"),
        "localhost",
        "127.0.0.1",
    ):
        assert covers(broker, host), host
    # each bookie at the host it advertises
    bookie = certificate(rendered, f"{BOOKIE}-tls")
    env = container_env(rendered.container("StatefulSet", BOOKIE), {"metadata.name": f"{BOOKIE}-3"})
    assert covers(bookie, env["MAGNETAR_ADVERTISED_HOST"])
    # each etcd member at its client URL and its peer URL
    etcd = certificate(rendered, f"{ETCD}-tls")
    (url,) = metadata_urls(rendered)
    for endpoint in url.removeprefix("etcd://").split(","):
        assert covers(etcd, endpoint.rsplit(":", 1)[0]), endpoint
    peers = etcd_flags(rendered.container("StatefulSet", ETCD))["initial-cluster"].split(",")
    for peer in peers:
        assert covers(etcd, peer.split("://")[1].rsplit(":", 1)[0]), peer
    assert covers(etcd, f"{ETCD}.{NAMESPACE}.svc.cluster.local")
    # the Prometheus Operator checks the name of each component's Service
    monitored = render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    for monitor in monitored.of_kind("ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        secret = endpoint["tlsConfig"]["ca"]["secret"]["name"]
        assert covers(certificate(monitored, secret), endpoint["tlsConfig"]["serverName"])


def advertised_broker_host(pod_ip: str, values: dict[str, Any] | None = None) -> str:
    """The host a broker advertises: what its container's command makes of its pod IP."""
    container = render(values).container("Deployment", BROKER)
    with tempfile.TemporaryDirectory() as bin_dir:
        fake = Path(bin_dir) / "magnetar"  # stands for the image's entrypoint
        fake.write_text('#!/bin/sh\necho "$MAGNETAR_ADVERTISED_HOST $*"\n')
        fake.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "POD_IP": pod_ip}
        out = subprocess.run(
            [*container["command"], *container["args"]],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    assert out[1:] == container["args"]  # the arguments reach magnetar untouched
    return out[0]


def test_brokers_advertise_their_pod_dns_name_which_their_certificate_holds() -> None:
    assert advertised_broker_host("10.1.2.3") == f"10-1-2-3.{NAMESPACE}.pod.cluster.local"
    assert advertised_broker_host("fd00::5") == f"fd00--5.{NAMESPACE}.pod.cluster.local"
    other = {"clusterDomain": "k8s.example"}
    assert advertised_broker_host("10.0.0.1", other) == f"10-0-0-1.{NAMESPACE}.pod.k8s.example"
    # without TLS on the client port: the pod IP, as before
    plain = render(PLAIN).container("Deployment", BROKER)
    assert "command" not in plain
    env = container_env(plain, {"metadata.name": "b", "status.podIP": "10.1.2.3"})
    assert env["MAGNETAR_ADVERTISED_HOST"] == "10.1.2.3"


def test_brokers_and_bookies_authenticate_and_authorize_by_default() -> None:
    rendered = render()
    broker = rendered.config_toml("broker")
    assert broker["authentication_enabled"] is True
    assert broker["authorization_enabled"] is True
    assert broker["authentication_providers"] == ["token"]
    assert broker["superuser_roles"] == ["superuser"]
    assert broker["token_secret_key_file"] == "/etc/magnetar/token-key/secret.key"
    assert broker["token_static_file"] == "/etc/magnetar/superuser/static-tokens"
    # admin calls forwarded between brokers go as the superuser
    assert broker["broker_client_auth_token_file"] == "/etc/magnetar/superuser/token"
    mounted = mounted_secrets(rendered, "Deployment", BROKER)
    assert mounted["/etc/magnetar/token-key"][0] == f"{RELEASE}-magnetar-token-key"
    assert mounted["/etc/magnetar/superuser"][0] == f"{RELEASE}-magnetar-superuser"
    key = secret_files(rendered.get("Secret", f"{RELEASE}-magnetar-token-key"))["secret.key"]
    assert len(key) == 32
    superuser = secret_files(rendered.get("Secret", f"{RELEASE}-magnetar-superuser"))
    token = superuser["token"].decode()
    assert len(token) >= 32
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert superuser["static-tokens"].decode() == f"superuser {digest}\n"
    # the helm test pod acts as the superuser, over TLS
    env = container_env(rendered.get("Pod", TEST_POD)["spec"]["containers"][0], {})
    assert env["MAGNETAR_AUTH_TOKEN_FILE"] == "/etc/magnetar/superuser/token"
    assert env["MAGNETAR_TLS_TRUST_CERTS_FILE"] == f"{TLS_DIR}/ca.crt"
    assert env["MAGNETAR_SERVICE_URL"] == (
        f"magnetar+ssl://{BROKER}.{NAMESPACE}.svc.cluster.local:6651"
    )
    # bookies: the client certificate's common name is the role
    bookie = rendered.config_toml("bookie")
    assert bookie["authentication_enabled"] is True
    assert bookie["authentication_providers"] == ["tls"]
    assert bookie["bookie_client_roles"] == ["broker", "autorecovery"]
    # roles given in the config are added; bookies running autorecovery reach each other
    more = render(
        {
            "auth": {"superuserRole": "root"},
            "broker": {"config": {"superuser_roles": ["ops", "root"]}},
            "bookie": {"config": {"autorecovery": True, "bookie_client_roles": ["backup"]}},
        }
    )
    assert more.config_toml("broker")["superuser_roles"] == ["root", "ops"]
    assert more.config_toml("bookie")["bookie_client_roles"] == [
        "broker",
        "autorecovery",
        "bookie",
        "backup",
    ]
    static = secret_files(more.get("Secret", f"{RELEASE}-magnetar-superuser"))["static-tokens"]
    assert static.decode().startswith("root ")


def policy_peers(rule: dict[str, Any]) -> list[str]:
    """The components a NetworkPolicy rule lets in ("anyone" when it names no source)."""
    if "from" not in rule:
        return ["anyone"]
    peers = []
    for peer in rule["from"]:
        labels = peer.get("podSelector", {}).get("matchLabels", {})
        peers.append(labels.get("app.kubernetes.io/component", str(peer)))
    return peers


def policies(rendered: Any) -> dict[str, dict[int, list[str]]]:
    """component -> port -> who may connect, from the rendered NetworkPolicies."""
    found: dict[str, dict[int, list[str]]] = {}
    for policy in rendered.of_kind("NetworkPolicy"):
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        selected = spec["podSelector"]["matchLabels"]
        # it selects exactly one component's pods, by the labels its workload gives them
        (component,) = {
            o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            for o, _ in rendered.workloads()
            if o["kind"] != "Pod"
            and selected.items() <= o["spec"]["template"]["metadata"]["labels"].items()
        }
        ports = found.setdefault(component, {})
        for rule in spec["ingress"]:
            for port in rule["ports"]:
                ports.setdefault(port["port"], []).extend(policy_peers(rule))
    return found


def test_network_policies_let_in_only_who_needs_each_port() -> None:
    assert policies(render()) == {
        "broker": {6651: ["anyone"], 6661: ["anyone"], 8080: ["anyone"]},
        "bookie": {
            3181: ["broker", "autorecovery"],
            3182: ["broker", "autorecovery"],
            8000: ["anyone"],
        },
        "autorecovery": {8001: ["anyone"]},
        "etcd": {
            2379: ["broker", "bookie", "autorecovery", "init"],
            2380: ["etcd"],
            2381: ["anyone"],
        },
    }
    # restricted clients and scrapers; the plaintext port kept; bookies running autorecovery
    clients = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    found = policies(
        render(
            {
                "networkPolicy": {"clientFrom": clients, "metricsFrom": scrapers},
                "tls": {"broker": {"plaintextPort": True}},
                "bookie": {"config": {"autorecovery": True}},
            }
        )
    )
    client_peers = [str(clients[0]), "broker", "test"]
    scraper_peers = [str(scrapers[0])]
    assert found["broker"] == {
        6650: client_peers,
        6651: client_peers,
        6660: client_peers,
        6661: client_peers,
        8080: scraper_peers,
    }
    assert found["bookie"][3181] == found["bookie"][3182] == ["broker", "autorecovery", "bookie"]
    assert found["etcd"][2381] == found["bookie"][8000] == scraper_peers
    assert not render({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy")


def test_each_part_of_the_security_can_be_turned_off_and_notes_say_so() -> None:
    assert "WARNING" not in render().notes
    assert "not yet" not in render().notes
    plain = render({"tls": {"enabled": False}})
    assert [s["metadata"]["name"] for s in plain.of_kind("Secret")] == [
        f"{RELEASE}-magnetar-token-key",
        f"{RELEASE}-magnetar-superuser",
    ]
    for component in ("broker", "bookie", "autorecovery"):
        config = plain.config_toml(component)
        assert not [k for k in config if "tls" in k or k.startswith("etcd_")], component
    assert plain.config_toml("bookie").get("authentication_enabled") is None  # needs TLS
    assert "--etcd-cert-file" not in plain.container("Job", INIT)["args"]
    assert "https" not in str(plain.container("StatefulSet", ETCD)["args"])
    assert "TLS is off (tls.enabled)" in plain.notes

    broker_plain = render({"tls": {"broker": {"enabled": False}}})
    assert broker_plain.config_toml("broker")["port"] == 6650
    assert "tls_cert_file" not in broker_plain.config_toml("broker")
    assert "ledger" in broker_plain.config_toml("broker")  # to the bookies: still TLS
    assert "tls.broker.enabled" in broker_plain.notes

    kept = render({"tls": {"broker": {"plaintextPort": True}}})
    assert kept.config_toml("broker")["port"] == 6650
    assert kept.config_toml("broker")["tls_port"] == 6651
    assert "tls.broker.plaintextPort" in kept.notes

    bookies_plain = render({"tls": {"bookie": {"enabled": False}}})
    bookie = bookies_plain.config_toml("bookie")
    assert "tls_cert_file" not in bookie
    assert "authentication_enabled" not in bookie
    assert "ledger" not in bookies_plain.config_toml("broker")
    assert "tls.bookie.enabled" in bookies_plain.notes

    etcd_plain = render({"tls": {"etcd": {"enabled": False}}})
    assert "etcd_cert_file" not in etcd_plain.config_toml("broker")
    assert not etcd_plain.has("Secret", f"{ETCD}-tls")
    assert not etcd_plain.has("Secret", f"{INIT}-tls")
    assert "tls.etcd.enabled" in etcd_plain.notes

    http_plain = render({"tls": {"http": {"enabled": False}}})
    assert "http_tls_cert_file" not in http_plain.config_toml("broker")
    probe = http_plain.container("Deployment", BROKER)["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTP"
    assert "tls.http.enabled" in http_plain.notes

    open_brokers = render({"auth": {"enabled": False}})
    broker = open_brokers.config_toml("broker")
    assert not [k for k in broker if "auth" in k or "token" in k or "superuser" in k]
    assert not open_brokers.has("Secret", f"{RELEASE}-magnetar-superuser")
    assert "auth.enabled" in open_brokers.notes
    assert "MAGNETAR_AUTH_TOKEN_FILE" not in str(open_brokers.get("Pod", TEST_POD))

    no_authorization = render({"auth": {"authorization": False}})
    assert "authorization_enabled" not in no_authorization.config_toml("broker")
    assert "auth.authorization" in no_authorization.notes

    bookies_open = render({"auth": {"bookie": {"enabled": False}}})
    assert "authentication_enabled" not in bookies_open.config_toml("bookie")
    assert "auth.bookie.enabled" in bookies_open.notes

    assert "networkPolicy.enabled" in render({"networkPolicy": {"enabled": False}}).notes


def chart_with_a_cluster(tmp_path: Path) -> helm_python.Chart:
    """The chart with its Secret `lookup`s answered from the value `cluster` (name -> object)
    instead of a cluster's API server, which offline rendering does not have."""
    copy_dir = tmp_path / "magnetar"
    shutil.copytree(CHART_DIR, copy_dir)
    (copy_dir / "values.schema.json").unlink()  # `cluster` is no value of the real chart
    replaced = 0
    for template in (copy_dir / "templates" / "security").glob("*.yaml"):
        text, count = re.subn(
            r'lookup "v1" "Secret" \$namespace (\$\w+)',
            r"(get $.Values.cluster \1 | default dict)",
            template.read_text(),
        )
        template.write_text(text)
        replaced += count
    assert replaced == 4
    return helm_python.Chart.load(copy_dir)


def test_generated_secrets_are_kept_across_upgrades(tmp_path: Path) -> None:
    chart = chart_with_a_cluster(tmp_path)

    def secrets(values: dict[str, Any], cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
        manifests = chart.render(
            {**values, "cluster": cluster}, name=RELEASE, namespace=NAMESPACE, is_upgrade=True
        )
        objects = [
            o
            for path, text in manifests.items()
            if not path.endswith("NOTES.txt")
            for o in yaml.safe_load_all(text)
            if o
        ]
        return {o["metadata"]["name"]: o for o in objects if o.get("kind") == "Secret"}

    installed = secrets({}, {})
    assert len(installed) == 8  # token key, superuser token, CA and five certificates
    # an upgrade finds them, and keeps every one as it is
    assert secrets({}, installed) == installed
    # a new name on the broker certificate: that one is made again, by the same CA
    upgraded = secrets({"tls": {"broker": {"extraDnsNames": ["mq.example.com"]}}}, installed)
    changed = {name for name in installed if upgraded[name] != installed[name]}
    assert changed == {f"{BROKER}-tls"}
    assert covers(certificate_of(upgraded[f"{BROKER}-tls"]), "mq.example.com")
    # a certificate in its last 30 days is renewed; the others are kept
    expiring = copy.deepcopy(installed)
    soon = int(time.time()) + 10 * 86400
    expiring[f"{BOOKIE}-tls"]["metadata"]["annotations"]["magnetar/expires"] = str(soon)
    renewed = secrets({}, expiring)
    assert {name for name in installed if renewed[name] != installed[name]} == {f"{BOOKIE}-tls"}
    # a CA that is gone: a new one, and every certificate made again by it
    without_ca = {n: s for n, s in installed.items() if n != f"{RELEASE}-magnetar-ca"}
    remade = secrets({}, without_ca)
    assert {name for name in installed if remade[name] != installed[name]} == {
        f"{RELEASE}-magnetar-ca",
        *(
            f"{RELEASE}-magnetar-{c}-tls"
            for c in ("broker", "bookie", "autorecovery", "init", "etcd")
        ),
    }


def certificate_of(secret: dict[str, Any]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(secret_files(secret)["tls.crt"])


def test_certificates_from_cert_manager() -> None:
    rendered = render({"tls": {"source": "certManager"}})
    assert {s["metadata"]["name"] for s in rendered.of_kind("Secret")} == {
        f"{RELEASE}-magnetar-token-key",
        f"{RELEASE}-magnetar-superuser",
    }
    certificates = {c["metadata"]["name"]: c["spec"] for c in rendered.of_kind("Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in rendered.of_kind("Issuer")}
    # the chart's own CA: self-signed, and an Issuer of it
    assert issuers[f"{RELEASE}-magnetar-selfsigned"] == {"selfSigned": {}}
    assert certificates[f"{RELEASE}-magnetar-ca"]["isCA"] is True
    assert issuers[f"{RELEASE}-magnetar-ca"] == {"ca": {"secretName": f"{RELEASE}-magnetar-ca"}}
    generated = render()
    for component in ("broker", "bookie", "autorecovery", "init", "etcd"):
        spec = certificates[f"{RELEASE}-magnetar-{component}"]
        assert spec["commonName"] == component
        assert spec["secretName"] == f"{RELEASE}-magnetar-{component}-tls"
        assert spec["issuerRef"]["name"] == f"{RELEASE}-magnetar-ca"
        assert set(spec["usages"]) >= {"server auth", "client auth"}
        # the same names as the certificates Helm generates
        cert = certificate(generated, spec["secretName"])
        assert spec.get("dnsNames", []) + spec.get("ipAddresses", []) == names(cert)
    # the pods mount the same Secrets as with generated certificates
    for kind, name, _ in MAGNETAR_WORKLOADS:
        assert mounted_secrets(rendered, kind, name) == mounted_secrets(generated, kind, name)
    own = render({"tls": {"source": "certManager", "certManager": {"issuerRef": {"name": "corp"}}}})
    assert not own.of_kind("Issuer")
    assert {c["spec"]["issuerRef"]["name"] for c in own.of_kind("Certificate")} == {"corp"}


def test_certificates_from_secrets_you_name() -> None:
    values = ci_values(EXTERNAL)
    rendered = render(values)
    assert not rendered.of_kind("Certificate")
    generated = {s["metadata"]["name"] for s in rendered.of_kind("Secret")}
    assert generated == {f"{RELEASE}-magnetar-token-key", f"{RELEASE}-magnetar-superuser"}
    for kind, name, component in MAGNETAR_WORKLOADS[:3]:
        mounted = mounted_secrets(rendered, kind, name)
        assert mounted[TLS_DIR][0] == values["tls"][component]["secretName"]
        # the external etcd: its CA and client certificate, and a user
        assert mounted["/etc/magnetar/etcd-tls"][0] == "etcd-client-magnetar"
        assert mounted["/etc/magnetar/etcd-password"][0] == "etcd-magnetar-password"
        config = rendered.config_toml(component)
        assert config["etcd_cert_file"] == "/etc/magnetar/etcd-tls/tls.crt"
        assert config["etcd_trust_certs_file"] == "/etc/magnetar/etcd-tls/ca.crt"
        assert config["etcd_user"] == "magnetar"
        assert config["etcd_password_file"] == "/etc/magnetar/etcd-password/password"
    # the init Job has no certificate of the chart: the external etcd's only
    init = mounted_secrets(rendered, "Job", INIT)
    assert set(init) == {"/etc/magnetar/etcd-tls", "/etc/magnetar/etcd-password"}
    args = rendered.container("Job", INIT)["args"]
    assert args[args.index("--etcd-user") + 1] == "magnetar"


def test_your_own_token_key_and_superuser_token() -> None:
    rendered = render(
        {"auth": {"tokenKey": {"secretName": "k"}, "superuserToken": {"secretName": "t"}}}
    )
    assert not rendered.has("Secret", f"{RELEASE}-magnetar-token-key")
    assert not rendered.has("Secret", f"{RELEASE}-magnetar-superuser")
    mounted = mounted_secrets(rendered, "Deployment", BROKER)
    assert mounted["/etc/magnetar/token-key"][0] == "k"
    # a JWT of the superuser role, verified by the key: no static token
    assert [i["key"] for i in mounted["/etc/magnetar/superuser"][1]["items"]] == ["token"]
    assert "token_static_file" not in rendered.config_toml("broker")
    assert mounted_secrets(rendered, "Pod", TEST_POD)["/etc/magnetar/superuser"][0] == "t"


def test_notes_show_how_to_use_the_superuser_token_and_make_application_tokens() -> None:
    notes = render().notes
    url = "magnetar+ssl://localhost:6651"
    flags = "--tls-trust-certs-file /etc/magnetar/tls/ca.crt --auth-token-file"
    assert f"exec deploy/{BROKER} -- magnetar topics list --service-url {url} {flags}" in notes
    assert f"get secret {RELEASE}-magnetar-superuser -o jsonpath='{{.data.token}}'" in notes
    assert "magnetar tokens create --secret-key /etc/magnetar/token-key/secret.key" in notes
    assert "magnetar namespaces grant-permission" in notes
    # every command in the notes is one magnetar accepts
    parser = build_parser()
    for line in notes.splitlines():
        if "-- magnetar " in line:
            command = line.split("-- magnetar ", 1)[1].split(" > ")[0]
            parser.parse_args(shlex.split(command))


# --- config -----------------------------------------------------------------------------------


def test_config_changes_roll_only_the_pods_whose_config_changed() -> None:
    def checksums(rendered: Any) -> dict[str, str]:
        return {
            o["metadata"]["name"]: o["spec"]["template"]["metadata"]["annotations"][
                "checksum/config"
            ]
            for o in rendered.objects
            if o["kind"] in ("Deployment", "StatefulSet")
            and "checksum/config" in o["spec"]["template"]["metadata"].get("annotations", {})
        }

    base = checksums(render())
    assert set(base) == {BROKER, BOOKIE, AUTORECOVERY}
    changed = checksums(render({"broker": {"config": {"message_ttl_ms": 60000}}}))
    assert changed[BROKER] != base[BROKER]
    assert changed[BOOKIE] == base[BOOKIE]
    changed = checksums(render({"bookie": {"config": {"storage": {"gc_interval_s": 60}}}}))
    assert changed[BOOKIE] != base[BOOKIE]
    assert changed[BROKER] == base[BROKER]


COMPONENT_CONFIGS: dict[str, type[Any]] = {
    "broker": BrokerConfig,
    "bookie": BookieConfig,
    "autorecovery": AutorecoveryConfig,
}


def uncommented_config_blocks() -> dict[str, Any]:
    """values.yaml with every generated config line uncommented: all settings at their
    documented defaults."""
    lines = []
    inside = False
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        if line.startswith("    # >>> generated"):
            inside = True
        elif line.startswith("    # <<< generated"):
            inside = False
        elif inside:
            lines.append(line.replace("    # ", "    ", 1))
            continue
        lines.append(line)
    values = yaml.safe_load("\n".join(lines))
    return {c: values[c]["config"] for c in COMPONENT_CONFIGS}


def test_every_value_in_values_yaml_is_described() -> None:
    """Each key has a comment just above it, or lies inside a value described as a whole with
    `# --` (the requests and limits of a described `resources`, say). Group headers take a
    plain comment, which does not stand for the keys under them."""
    undescribed = []
    open_keys: dict[int, bool] = {}  # indent -> whether the key open there is a described value
    comment = ""  # the first line of the comment block just above, if any
    for number, line in enumerate((CHART_DIR / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = comment or stripped
            continue
        match = re.match(r"^( *)([A-Za-z_][\w.]*):", line)
        if match is None:
            comment = ""  # a blank line or a list item ends the comment block
            continue
        indent = len(match.group(1))
        open_keys = {i: d for i, d in open_keys.items() if i < indent}
        if not comment and not any(open_keys.values()):
            undescribed.append(f"{number}: {line}")
        open_keys[indent] = comment.startswith("# --")
        comment = ""
    assert undescribed == []


@pytest.mark.parametrize("component", list(COMPONENT_CONFIGS))
def test_values_yaml_documents_every_setting_at_its_real_default(
    component: str, tmp_path: Path
) -> None:
    """Uncommenting the whole generated block changes nothing: the documented defaults are the
    process's defaults, and the rendered TOML loads as the process would load it."""
    blocks = uncommented_config_blocks()
    rendered = render({c: {"config": blocks[c]} for c in COMPONENT_CONFIGS})
    toml_file = tmp_path / f"{component}.toml"
    config_map = rendered.get("ConfigMap", f"{RELEASE}-magnetar-{component}")
    toml_file.write_text(config_map["data"][f"{component}.toml"])
    cls = COMPONENT_CONFIGS[component]
    loaded: object = load_config(cls, file=toml_file, env={})
    plain = render()
    plain_file = tmp_path / "plain.toml"
    plain_file.write_text(
        plain.get("ConfigMap", config_map["metadata"]["name"])["data"][f"{component}.toml"]
    )
    assert loaded == load_config(cls, file=plain_file, env={})


def test_settings_of_every_type_reach_the_process_as_given(tmp_path: Path) -> None:
    given = {
        "allow_auto_topic_creation": False,  # bool
        "max_message_bytes": 1048576,  # int (Helm reads it as a float)
        "load_shedding_threshold": 0.35,  # float
        "shutdown_timeout_s": 45,  # float setting given as a whole number
        "managed_ledger": {
            "retention_size_bytes": 10737418240,
            "ensemble_size": 3,
            "write_quorum": None,
        },
        "ledger": {"add_timeout_ms": 12000},
    }
    rendered = render({"broker": {"config": copy.deepcopy(given)}})
    toml_file = tmp_path / "broker.toml"
    toml_file.write_text(rendered.get("ConfigMap", BROKER)["data"]["broker.toml"])
    config = load_config(BrokerConfig, file=toml_file, env={})
    assert config.allow_auto_topic_creation is False
    assert config.max_message_bytes == 1048576
    assert config.load_shedding_threshold == 0.35
    assert config.shutdown_timeout_s == 45.0
    assert config.managed_ledger.retention_size_bytes == 10737418240
    assert config.managed_ledger.ensemble_size == 3
    assert config.managed_ledger.write_quorum is None
    assert config.ledger.add_timeout_ms == 12000
    assert config.port is None  # TLS only
    assert config.tls_port == 6651
    assert config.http_port == 8080
    assert config.metadata.startswith("etcd://")


def test_container_commands_are_commands_magnetar_accepts() -> None:
    parser = build_parser()
    for values_file in CI_VALUES:
        for obj, pod in render(ci_values(values_file)).workloads():
            for container in pod["containers"]:
                wrapper = container.get("command", [""])[-1] == "magnetar"  # execs magnetar "$@"
                if "command" in container and not wrapper:  # etcd, and the helm test pod's shell
                    continue
                args = parser.parse_args(container["args"])
                assert args.command in {"bookie", "broker", "autorecovery", "cluster"}, obj


# --- bad values -------------------------------------------------------------------------------

SCHEMA_VIOLATIONS = [
    ({"broker": {"replicaCount": 0}}, "/broker/replicaCount", "minimum"),
    ({"brokers": {"replicaCount": 3}}, "additional properties 'brokers' not allowed", ""),
    ({"broker": {"config": {"max_mesage_bytes": 1}}}, "/broker/config", "'max_mesage_bytes'"),
    (
        {"bookie": {"config": {"storage": {"max_group_bytes": "8MB"}}}},
        "/bookie/config/storage/max_group_bytes",
        "want integer",
    ),
    ({"bookie": {"config": {"data_dir": "/data"}}}, "/bookie/config", "'data_dir' not allowed"),
    ({"bookie": {"antiAffinity": "always"}}, "/bookie/antiAffinity", "'soft', 'hard', 'none'"),
    ({"bookie": {"persistence": {"size": "lots"}}}, "/bookie/persistence/size", "pattern"),
    ({"broker": {"ports": {"grpc": 70000}}}, "/broker/ports/grpc", "maximum"),
    ({"logging": {"level": "verbose"}}, "/logging/level", "one of"),
    ({"etcd": {"external": {"endpoints": ["etcd-0"]}}}, "/etcd/external/endpoints/0", "pattern"),
    # the chart sets every file and the security switches from its tls and auth values
    ({"broker": {"config": {"tls_cert_file": "/x"}}}, "/broker/config", "'tls_cert_file'"),
    ({"broker": {"config": {"tls_port": 7000}}}, "/broker/config", "'tls_port'"),
    (
        {"broker": {"config": {"authentication_enabled": False}}},
        "/broker/config",
        "'authentication_enabled'",
    ),
    (
        {"bookie": {"config": {"authentication_providers": ["token"]}}},
        "/bookie/config",
        "'authentication_providers'",
    ),
    (
        {"autorecovery": {"config": {"ledger": {"tls_cert_file": "/x"}}}},
        "/autorecovery/config/ledger",
        "'tls_cert_file'",
    ),
    ({"tls": {"source": "vault"}}, "/tls/source", "'generate', 'secrets', 'certManager'"),
    ({"tls": {"secretName": "old"}}, "additional properties 'secretName' not allowed", ""),
    ({"auth": {"secretName": "old"}}, "additional properties 'secretName' not allowed", ""),
]


@pytest.mark.parametrize(("values", "where", "what"), SCHEMA_VIOLATIONS)
def test_values_breaking_the_schema_fail_naming_the_value(
    values: dict[str, Any], where: str, what: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as raised:
        render(values)
    assert where in str(raised.value)
    assert what in str(raised.value)
    report = helm_python.lint(CHART_DIR, values, strict=True)
    assert any(where in error for error in report["errors"])


RULE_VIOLATIONS = [
    ({"etcd": {"replicaCount": 2}}, "etcd.replicaCount: 2 members"),
    (
        {"bookie": {"replicaCount": 2}},
        "bookie.replicaCount: 2 bookies cannot hold ledgers striped over 3",
    ),
    (
        {
            "bookie": {"replicaCount": 4},
            "broker": {"config": {"managed_ledger": {"ensemble_size": 5}}},
        },
        "striped over 5",
    ),
    ({"etcd": {"enabled": False}}, "etcd.external.endpoints: list your etcd members"),
    (
        {"broker": {"terminationGracePeriodSeconds": 60}},
        "broker.terminationGracePeriodSeconds: 60 s",
    ),
    ({"tls": {"source": "secrets"}}, "tls.broker.secretName: name the Secret"),
    (
        {
            "tls": {
                "source": "secrets",
                **{c: {"secretName": c} for c in ("broker", "autorecovery", "init", "etcd")},
            }
        },
        "tls.bookie.secretName: name the Secret",
    ),
    ({"etcd": {"enabled": False, "external": {"endpoints": ["e:2379"]}}}, "etcd.external.tls"),
    (
        {
            "etcd": {
                "enabled": False,
                "external": {"endpoints": ["e:2379"], "tls": {"secretName": "e"}, "user": "m"},
            }
        },
        "etcd.external.passwordSecretName",
    ),
    (
        {"broker": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}},
        "minReplicas (5) is above maxReplicas (3)",
    ),
]


@pytest.mark.parametrize(("values", "message"), RULE_VIOLATIONS)
def test_values_that_cannot_work_together_fail_saying_why(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(values)


def test_the_schema_lists_every_setting_the_chart_does_not_set_itself() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    broker = schema["definitions"]["brokerConfig"]["properties"]
    assert "metadata" not in broker
    assert "port" not in broker
    assert broker["managed_ledger"]["properties"]["retention_time_ms"]["type"] == "integer"
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    # every setting that names a file: the chart mounts the files and points at them
    files = {f.name for f in dataclasses.fields(BrokerConfig) if "Path" in str(f.type)}
    assert "tls_cert_file" in files
    assert "token_static_file" in files
    assert set(broker) == fields - files - {
        "metadata",
        "port",
        "tls_port",
        "http_port",
        "pulsar_port",
        "pulsar_tls_port",
        "bind_host",
        "advertised_host",
        "broker_id",
        "authentication_enabled",
        "authentication_providers",
        "authorization_enabled",
        "etcd_user",
    }
    ledger = broker["ledger"]["properties"]
    assert "tls_cert_file" not in ledger
    assert "ensemble_size" in ledger
    bookie = schema["definitions"]["bookieConfig"]["properties"]
    assert "bookie_client_roles" in bookie  # added to the chart's
    assert "tls_trust_certs_file" not in bookie


# --- the image --------------------------------------------------------------------------------


def dockerfile_uid() -> int:
    text = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    return int(user[0])


def test_the_default_image_is_the_one_the_dockerfile_builds() -> None:
    text = (ROOT / "Dockerfile").read_text()
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the image is tagged with the version the Dockerfile installs
    assert chart["appVersion"] == project["version"]
    rendered = render()
    assert rendered.container("Deployment", BROKER)["image"] == (
        f"{values['image']['repository']}:{project['version']}"
    )
    # its entrypoint is the magnetar command, so the chart gives only a subcommand (the broker's
    # shell wrapper, which computes its pod DNS name, execs magnetar with them)
    assert re.search(r'^ENTRYPOINT \["magnetar"\]$', text, re.M)
    for kind, name, _ in MAGNETAR_WORKLOADS[1:]:
        assert "command" not in rendered.container(kind, name)
    shell, option, script, zeroth = rendered.container("Deployment", BROKER)["command"]
    assert (shell, option, zeroth) == ("/bin/sh", "-c", "magnetar")
    assert script.endswith('exec magnetar "$@"')
    # a slim Python the project supports, a non-root user the chart runs as
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases
    assert all(b.startswith("python:3.11-slim") for b in bases)
    assert project["requires-python"] == ">=3.11"
    assert dockerfile_uid() == values["podSecurityContext"]["runAsUser"] != 0
    # the default ports are exposed
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.M)[0].split()}
    assert exposed == {6650, 8080, 3181, 3182, 8000}
    # everything the wheel is built from is copied in
    packages = (
        project
        and tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
            "find"
        ]["include"]
    )
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, re.M))
    assert copied == {p.rstrip("*") for p in packages}
