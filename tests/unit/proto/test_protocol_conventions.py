"""The protocol follows its conventions: versioned packages, *_UNSPECIFIED zeros, snake_case."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

ROOT = Path(__file__).resolve().parents[3]
PROTO_FILES = sorted(p.relative_to(ROOT) for p in (ROOT / "proto").rglob("*.proto"))


def module_of(path: Path) -> FileDescriptor:
    module = importlib.import_module(".".join(path.with_suffix("").parts) + "_pb2")
    return module.DESCRIPTOR  # type: ignore[no-any-return]


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
    format_packages = {module_of(p).package for p in PROTO_FILES if p.parts[1] == "format"}
    assert format_packages == {"magnetar.format.v1"}
    for path in PROTO_FILES:
        file = module_of(path)
        if path.parts[1] == "format":
            assert not file.services_by_name, f"{path} is a persisted format: no services"
        for dependency in file.dependencies:
            assert not (
                path.parts[1] != "format" and dependency.name.startswith("proto/format/")
            ), f"wire file {path} imports persisted format {dependency.name}"
