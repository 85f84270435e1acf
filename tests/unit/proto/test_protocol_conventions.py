"""The protocol follows its conventions: versioned packages, *_UNSPECIFIED zeros, snake_case,
each file in the folder of its package (as buf lint wants it), the language options of each file."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

ROOT = Path(__file__).resolve().parents[3]
MODULE_ROOT = ROOT / "proto"
"""The root of the buf module: files are named (and import each other) by their path from here."""
PROTO_FILES = sorted(p.relative_to(MODULE_ROOT) for p in MODULE_ROOT.rglob("*.proto"))


def module_of(path: Path) -> FileDescriptor:
    # magnetar/broker/v1/broker.proto is generated as proto/broker/v1/broker_pb2.py
    module_path = ("proto", *path.with_suffix("").parts[1:])
    module = importlib.import_module(".".join(module_path) + "_pb2")
    return module.DESCRIPTOR  # type: ignore[no-any-return]


def component_of(path: Path) -> str:
    """The middle of the package: ``format`` for magnetar/format/v1/entry.proto."""
    return path.parts[1]


def test_every_source_is_found() -> None:
    assert len(PROTO_FILES) >= 12, PROTO_FILES
    components = {component_of(p) for p in PROTO_FILES}
    assert components == {"admin", "bookie", "broker", "common", "format"}


def all_messages(descriptors) -> list[Descriptor]:
    found = []
    for message in descriptors:
        found.append(message)
        found.extend(all_messages(message.nested_types))
    return found


@pytest.mark.parametrize("path", PROTO_FILES, ids=str)
def test_file_conventions(path: Path) -> None:
    file = module_of(path)
    assert re.fullmatch(r"magnetar\.[a-z]+\.v[0-9]+", file.package), file.package
    # The generated module was made from this very file, named by its path in the module.
    assert file.name == path.as_posix()
    assert path.parent.as_posix() == file.package.replace(".", "/"), (
        f"{path} declares package {file.package}: it belongs in its package's folder"
    )
    enums: list[EnumDescriptor] = list(file.enum_types_by_name.values())
    for message in all_messages(file.message_types_by_name.values()):
        enums.extend(message.enum_types)
        for field in message.fields:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", field.name) or field.name in ("ID", "TTL"), (
                f"{message.full_name}.{field.name} is not snake_case"
            )
    for enum in enums:
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.full_name} zero value is {zero}"


def test_wire_and_persisted_formats_live_apart() -> None:
    format_packages = {module_of(p).package for p in PROTO_FILES if component_of(p) == "format"}
    assert format_packages == {"magnetar.format.v1"}
    for path in PROTO_FILES:
        file = module_of(path)
        if component_of(path) == "format":
            assert not file.services_by_name, f"{path} is a persisted format: no services"
        for dependency in file.dependencies:
            assert not (
                component_of(path) != "format" and dependency.name.startswith("magnetar/format/")
            ), f"wire file {path} imports persisted format {dependency.name}"


def expected_options(path: Path) -> dict[str, object]:
    """The language options of a file: one value per package, named after the package."""
    component, version = path.parts[1], path.parts[2]
    words = [component.capitalize(), version.upper()]
    return {
        "csharp_namespace": ".".join(["Magnetar", *words]),
        "go_package": (
            f"github.com/magnetar/magnetar/gen/go/magnetar/{component}/{version};"
            f"{component}{version}"
        ),
        "java_multiple_files": True,
        "java_outer_classname": "".join(w.capitalize() for w in path.stem.split("_")) + "Proto",
        "java_package": f"io.magnetar.{component}.{version}",
        "php_namespace": "\\".join(["Magnetar", *words]),
        "ruby_package": "::".join(["Magnetar", *words]),
    }


@pytest.mark.parametrize("path", PROTO_FILES, ids=str)
def test_language_options(path: Path) -> None:
    options = module_of(path).GetOptions()
    found = {name: getattr(options, name) for name in expected_options(path)}
    assert found == expected_options(path)
    # The outer class holds nothing with java_multiple_files, but must not clash with a message.
    assert found["java_outer_classname"] not in module_of(path).message_types_by_name
