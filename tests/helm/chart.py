"""Rendering the Helm chart offline (Helm's own engine, from PyPI's helm-python-sdk) and reading
the objects it makes, for the chart's tests."""

from __future__ import annotations

import base64
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


def secret_files(secret: dict[str, Any]) -> dict[str, bytes]:
    """A rendered Secret's files (key -> content)."""
    files = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
    files.update({k: v.encode() for k, v in secret.get("stringData", {}).items()})
    return files


@dataclass
class Mounts:
    """A container's Secret and ConfigMap volumes, written under a directory of this machine as
    the kubelet projects them; :meth:`local` rewrites the container's paths to them."""

    paths: dict[str, Path]
    """mountPath in the container -> where it is here."""

    def local(self, text: str) -> str:
        for mount_path in sorted(self.paths, key=len, reverse=True):
            text = text.replace(mount_path, str(self.paths[mount_path]))
        return text


def mount(rendered: Rendered, pod: dict[str, Any], container: dict[str, Any], root: Path) -> Mounts:
    """Write the Secret and ConfigMap volumes ``container`` mounts (their ``items``, or every
    key) under ``root``, owner-only; emptyDir and claimed volumes are left out. Paths in the
    ConfigMaps' files (a config file naming a certificate) are rewritten to the local ones."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    paths: dict[str, Path] = {}
    config_files: list[Path] = []
    for volume_mount in container.get("volumeMounts", []):
        volume = volumes.get(volume_mount["name"])
        if volume is None or not ("secret" in volume or "configMap" in volume):
            continue
        if "secret" in volume:
            source = volume["secret"]
            files = secret_files(rendered.get("Secret", source["secretName"]))
        else:
            source = volume["configMap"]
            data = rendered.get("ConfigMap", source["name"])["data"]
            files = {k: v.encode() for k, v in data.items()}
        items = source.get("items") or [{"key": k, "path": k} for k in files]
        directory = root / volume["name"]
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for item in items:
            target = directory / item["path"]
            target.write_bytes(files[item["key"]])
            target.chmod(0o600)
            if "configMap" in volume:
                config_files.append(target)
        sub_path = volume_mount.get("subPath")
        paths[volume_mount["mountPath"]] = directory / sub_path if sub_path else directory
    mounts = Mounts(paths)
    for config_file in config_files:
        config_file.write_text(mounts.local(config_file.read_text()))
    return mounts
