"""The Helm chart, rendered offline by Helm's own engine: lint, Kubernetes schemas, and what the
objects must say (bookies keep volumes, brokers none; probes on the ports the processes listen
on; replica counts apart; etcd endpoints = members; non-root everywhere; bad values refused)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from bookie.autorecovery import AutorecoveryConfig
from bookie.process import LIVENESS_SERVICE as BOOKIE_LIVENESS
from bookie.service.config import BookieConfig
from broker.process import LIVENESS_SERVICE as BROKER_LIVENESS
from broker.service.config import BrokerConfig
from magnetar.cli import build_parser
from magnetar.common.config import load_config
from tests.helm.chart import CHART_DIR, CI_VALUES, NAMESPACE, RELEASE, ROOT, ci_values, render

# Oldest the chart supports (gRPC probes are GA from 1.27), and newer ones up to the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ("1.27.0", "1.30.0", "1.33.0", "1.37.0")
# Prometheus Operator resources: no schema ships with kubernetes-validate; checked by hand below.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}

FULL = CHART_DIR / "ci" / "full-values.yaml"
EXTERNAL = CHART_DIR / "ci" / "external-etcd-values.yaml"
MINIMAL = CHART_DIR / "ci" / "minimal-values.yaml"
BROKER = f"{RELEASE}-magnetar-broker"
BOOKIE = f"{RELEASE}-magnetar-bookie"
ETCD = f"{RELEASE}-magnetar-etcd"
AUTORECOVERY = f"{RELEASE}-magnetar-autorecovery"


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
    custom = []
    for version in KUBE_VERSIONS:
        for obj in rendered.objects:
            if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
                custom.append(obj)
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"Kubernetes {version}: {obj['kind']} {obj['metadata']['name']}: "
                    f"{exc.message} at {'.'.join(map(str, exc.path))}"
                )
    for obj in custom:
        check_monitor(obj, rendered)


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


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ids(CI_VALUES))
def test_probes_point_at_ports_the_processes_listen_on(values_file: Path) -> None:
    rendered = render(ci_values(values_file))
    for kind, name, component, liveness in (
        ("StatefulSet", BOOKIE, "bookie", BOOKIE_LIVENESS),
        ("Deployment", BROKER, "broker", BROKER_LIVENESS),
    ):
        container = rendered.container(kind, name)
        config = rendered.config_toml(component)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # the process listens where its config file says, on every interface
        assert ports == {"grpc": config["port"], "http": config["http_port"]}
        assert config["bind_host"] == "0.0.0.0"
        assert container["args"][:1] == [component]
        config_path = container["args"][container["args"].index("--config") + 1]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == config_path)
        assert mount["subPath"] == f"{component}.toml"
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
        assert {n: p["targetPort"] for n, p in service_ports.items()} == {
            "grpc": "grpc",
            "http": "http",
        }
        annotations = rendered.get(kind, name)["spec"]["template"]["metadata"]["annotations"]
        if "prometheus.io/port" in annotations:
            assert annotations["prometheus.io/port"] == str(config["http_port"])


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
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["startupProbe"]["tcpSocket"] == {"port": "http"}
    service = rendered.get("Service", AUTORECOVERY)["spec"]
    assert service["ports"] == [{"name": "http", "port": config["http_port"], "targetPort": "http"}]


def test_changed_ports_move_probes_services_and_config_together() -> None:
    rendered = render({"broker": {"ports": {"grpc": 7650, "http": 9080}}})
    container = rendered.container("Deployment", BROKER)
    assert rendered.config_toml("broker")["port"] == 7650
    assert container["readinessProbe"]["grpc"]["port"] == 7650
    service = {p["name"]: p["port"] for p in rendered.get("Service", BROKER)["spec"]["ports"]}
    assert service == {"grpc": 7650, "http": 9080}
    assert ":7650" in rendered.notes


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
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert args["advertise-client-urls"] == f"http://$(POD_NAME).{domain}:{client_port}"
    peers = args["initial-cluster"].split(",")
    assert [p.split("=")[0] for p in peers] == [f"{ETCD}-{i}" for i in range(members)]
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


def test_tls_and_auth_secrets_are_mounted_and_flagged_as_not_yet_enforced() -> None:
    rendered = render(
        {
            "tls": {"enabled": True, "secretName": "tls-s"},
            "auth": {"enabled": True, "secretName": "auth-s"},
        }
    )
    for kind, name, wanted in (
        ("Deployment", BROKER, {"tls": "tls-s", "auth": "auth-s"}),
        ("StatefulSet", BOOKIE, {"tls": "tls-s"}),
    ):
        pod = rendered.get(kind, name)["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == wanted
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        for volume in wanted:
            assert mounts[volume] == f"/etc/magnetar/{volume}"
    assert "does not serve TLS yet" in rendered.notes
    assert "does not check credentials yet" in rendered.notes
    plain = render()
    assert "WARNING" not in plain.notes


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
    assert config.port == 6650
    assert config.http_port == 8080
    assert config.metadata.startswith("etcd://")


def test_container_commands_are_commands_magnetar_accepts() -> None:
    parser = build_parser()
    for values_file in CI_VALUES:
        for obj, pod in render(ci_values(values_file)).workloads():
            for container in pod["containers"]:
                if "command" in container:  # etcd, and the helm test pod's shell
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
    ({"tls": {"enabled": True}}, "tls.secretName"),
    ({"auth": {"enabled": True}}, "auth.secretName"),
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
    assert set(broker) == fields - {
        "metadata",
        "port",
        "http_port",
        "bind_host",
        "advertised_host",
        "broker_id",
    }


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
    # its entrypoint is the magnetar command, so the chart gives only a subcommand
    assert re.search(r'^ENTRYPOINT \["magnetar"\]$', text, re.M)
    assert "command" not in rendered.container("Deployment", BROKER)
    # a slim Python the project supports, a non-root user the chart runs as
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases
    assert all(b.startswith("python:3.11-slim") for b in bases)
    assert project["requires-python"] == ">=3.11"
    assert dockerfile_uid() == values["podSecurityContext"]["runAsUser"] != 0
    # the default ports are exposed
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.M)[0].split()}
    assert exposed == {6650, 8080, 3181, 8000}
    # everything the wheel is built from is copied in
    packages = (
        project
        and tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
            "find"
        ]["include"]
    )
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, re.M))
    assert copied == {p.rstrip("*") for p in packages}
