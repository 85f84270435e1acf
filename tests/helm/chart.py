"""Rendering the Helm chart offline (Helm's own engine, from PyPI's helm-python-sdk) and reading
the objects it makes, for the chart's tests."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "magnetar"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))
RELEASE = "rel"
NAMESPACE = "messaging"

helm_python.disable_logging()  # template failures are raised; Helm's log lines only repeat them
_CHART = helm_python.Chart.load(CHART_DIR)


def ci_values(path: Path) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text())
    return values if isinstance(values, dict) else {}


@dataclass
class Rendered:
    """Every object of one rendering, with lookups by kind and name."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in self.of_kind(kind))

    def workloads(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(object, pod spec) of everything that runs pods."""
        for o in self.objects:
            if o["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
                yield o, o["spec"]["template"]["spec"]
            elif o["kind"] == "Pod":
                yield o, o["spec"]

    def config_toml(self, component: str) -> dict[str, Any]:
        """The TOML config file a component's ConfigMap holds, parsed."""
        config_map = self.get("ConfigMap", f"{RELEASE}-magnetar-{component}")
        return tomllib.loads(config_map["data"][f"{component}.toml"])

    def container(self, kind: str, name: str) -> dict[str, Any]:
        containers = self.get(kind, name)["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return dict(containers[0])


def render(values: dict[str, Any] | None = None) -> Rendered:
    manifests = _CHART.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects += [o for o in yaml.safe_load_all(text) if o]
    return Rendered(objects, notes)


_VAR = re.compile(r"\$\((\w+)\)")


def container_env(container: dict[str, Any], pod_fields: dict[str, str]) -> dict[str, str]:
    """A container's environment as Kubernetes would set it: fieldRef values taken from
    ``pod_fields`` (by field path), and $(VAR) references expanded."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
        else:
            env[item["name"]] = pod_fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env
