"""Regenerate the Python code of every .proto under proto/, or check that it has not drifted.

    python scripts/genproto.py           # regenerate in place
    python scripts/genproto.py --check   # exit 1 if the committed code differs from a fresh run

Generated per .proto: ``*_pb2.py`` and its typed stub ``*_pb2.pyi`` (mypy-protobuf), plus
``*_pb2_grpc.py`` / ``*_pb2_grpc.pyi`` for files that declare a service.

Where things are: the sources are a buf module rooted at ``proto/`` (buf.yaml), each file in the
folder of its package, ``proto/magnetar/broker/v1/broker.proto`` for ``magnetar.broker.v1``, and
they import each other by that path (``import "magnetar/common/v1/types.proto"``), which is also
the file's name in the descriptors (and so in server reflection). The generated Python sits where
it always has, ``proto/broker/v1/broker_pb2.py``, imported as ``proto.broker.v1.broker_pb2``:
protoc writes ``magnetar/broker/v1/...`` modules into a scratch folder, and this script moves them
to ``proto/broker/v1/`` and rewrites their references to each other to match (``from
magnetar.common.v1 import types_pb2`` would otherwise name Magnetar's own ``magnetar`` package).

Vendored files: ``VENDORED`` lists .proto files of other projects that Magnetar speaks, kept
verbatim outside the buf module (whose lint rules they do not follow) with a note of where they
came from: Pulsar's ``third_party/pulsar/PulsarApi.proto`` (package ``pulsar.proto``, proto2) is
generated as ``proto/pulsar/PulsarApi_pb2.py``, imported as ``proto.pulsar.PulsarApi_pb2``, by the
same pinned tools, and checked for drift the same way. Its name in the descriptors is
``PulsarApi.proto``, as upstream.

The generated modules check their runtime when imported: ``*_pb2_grpc.py`` raises when grpcio is
older than the grpcio-tools that wrote it (``GRPC_GENERATED_VERSION``), and ``*_pb2.py`` raises
when protobuf is older than the protoc that wrote it (``ValidateProtobufRuntimeVersion``; some
protobuf releases also refuse, or warn about, code of another major version). Users install
Magnetar next to whatever grpcio and protobuf their environment has, anywhere in pyproject.toml's
ranges, so the code is written by the oldest tools of those ranges: protoc runs from
``GENERATOR``, grpcio-tools at the floor of the grpcio range, whose protoc writes protobuf 6.30.0
code (the floor of the protobuf range is 6.32.0). That grpcio-tools needs protobuf 6 and so
cannot live in .venv (protobuf 7): it gets a virtualenv of its own under .cache/genproto/, made
on first use. The typed stubs come from .venv's mypy-protobuf (pinned in the dev extra); they do
not depend on the protoc version.

Both modes also read the version every generated module demands and fail when it is above the
floor of pyproject.toml's grpcio or protobuf range, or of another protobuf major version. The
output depends only on ``GENERATOR`` and the pinned mypy-protobuf, so a drift means either a
.proto changed without regenerating, or those pins moved.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
# The floor of pyproject.toml's grpcio range; its bundled protoc writes protobuf 6.30.0 gencode.
GENERATOR = "grpcio-tools==1.72.1"
GENERATOR_HOME = ROOT / ".cache" / "genproto"

GRPC_DEMAND = re.compile(r"^GRPC_GENERATED_VERSION = '(?P<version>[^']+)'$", re.M)
PROTOBUF_DEMAND = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
    r"\s*(?P<major>\d+),\s*(?P<minor>\d+),\s*(?P<patch>\d+),\s*'(?P<suffix>[^']*)',"
)


SOURCE_ROOT = PROTO_DIR / "magnetar"
"""Where the sources of the ``magnetar.*`` packages live, each in its package's folder."""

# A reference to a generated module of ours, as protoc and mypy-protobuf write it for the source
# layout: `magnetar.common.v1.types_pb2`, `from magnetar.common.v1 import`, the import alias
# `magnetar_dot_common_dot_v1_dot_types__pb2` and the output path in the _grpc module's version
# check. Comments that name a protobuf message (`magnetar.format.v1.MessageBatch`) match none.
_V = r"v[0-9]+(?:(?:alpha|beta)[0-9]*)?"
MODULE_REFERENCES = (
    (re.compile(rf"\bmagnetar\.([a-z0-9_]+\.{_V}\.[a-z0-9_]+_pb2(?:_grpc)?)\b"), r"proto.\1"),
    (re.compile(rf"\bfrom magnetar\.([a-z0-9_]+\.{_V}) import "), r"from proto.\1 import "),
    (re.compile(rf"\bmagnetar_dot_([a-z0-9_]+_dot_{_V}_dot_)"), r"proto_dot_\1"),
    (re.compile(rf"\bmagnetar/([a-z0-9_]+/{_V}/[a-z0-9_]+_pb2(?:_grpc)?\.pyi?)\b"), r"proto/\1"),
)
LEFT_OVER = re.compile(r"^\s*(?:from|import) magnetar\b", re.M)


VENDORED = ((ROOT / "third_party" / "pulsar" / "PulsarApi.proto", Path("proto", "pulsar")),)
"""Vendored .proto files (kept verbatim) and the package folder their generated modules go to."""


def proto_sources() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def source_count() -> int:
    return len(proto_sources()) + len(VENDORED)


def python_path(source_relative: Path) -> Path:
    """Where the generated module of a path relative to the buf module lives, from the root."""
    if source_relative.parts[0] != "magnetar":
        # a file whose package is not magnetar.* (buf lint would say so too)
        raise SystemExit(
            f"proto/{source_relative}: .proto files belong under {SOURCE_ROOT.relative_to(ROOT)}/,"
            " in the folder of their package"
        )
    return Path("proto", *source_relative.parts[1:])


def relocate(text: str) -> str:
    """A generated module's text with its references to our generated modules moved to proto."""
    for pattern, replacement in MODULE_REFERENCES:
        text = pattern.sub(replacement, text)
    return text


def generator_python() -> Path:
    """The Python of the virtualenv that holds ``GENERATOR``, made (once) if needed."""
    venv = GENERATOR_HOME / GENERATOR.replace("==", "-")
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    GENERATOR_HOME.mkdir(parents=True, exist_ok=True)
    # Other checkouts' runs (or a parallel check) may be making it too.
    with (GENERATOR_HOME / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == GENERATOR and python.exists()):
            print(f"proto: installing {GENERATOR} into {venv.relative_to(ROOT)}", file=sys.stderr)
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
            # --no-deps: `python -m grpc_tools.protoc` needs nothing but grpcio-tools itself
            pip = [sys.executable, "-m", "pip", "--python", str(python)]
            install = ["install", "-q", "--disable-pip-version-check", "--no-deps", GENERATOR]
            subprocess.run([*pip, *install], check=True)
            stamp.write_text(GENERATOR)
    return python


def protoc(include: Path, scratch: Path, sources: list[Path]) -> None:
    """Run the pinned protoc and the stub plugins over ``sources`` (relative to ``include``)."""
    bin_dir = Path(sys.executable).parent
    cmd = [
        str(generator_python()),
        "-m",
        "grpc_tools.protoc",  # adds grpcio-tools' own well-known protos to the include path
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={scratch}",
        f"--mypy_out=quiet:{scratch}",
        f"--grpc_python_out={scratch}",
        f"--mypy_grpc_out=quiet:{scratch}",
        *map(str, sources),
    ]
    subprocess.run(cmd, check=True, cwd=include)


def generate_vendored(out_root: Path) -> None:
    """Generate each vendored file on its own, into its package folder under ``out_root``."""
    for source, package in VENDORED:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            protoc(source.parent, scratch, [Path(source.name)])
            if "\nservice " in source.read_text():
                raise SystemExit(f"{source.relative_to(ROOT)}: vendored services are not generated")
            module = ".".join((*package.parts, f"{source.stem}_pb2"))
            for suffix in ("_pb2.py", "_pb2.pyi"):
                written = scratch / f"{source.stem}{suffix}"
                # the classes' __module__ is where the module is imported from, as for ours
                named = "(DESCRIPTOR, '{}', _globals)"
                text = written.read_text()
                text = text.replace(named.format(f"{source.stem}_pb2"), named.format(module))
                target = out_root / package / written.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)


def generate(out_root: Path) -> None:
    """Run protoc for every source, writing the generated tree under ``out_root``."""
    sources = [p.relative_to(PROTO_DIR) for p in proto_sources()]
    generate_vendored(out_root)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        protoc(PROTO_DIR, scratch, sources)
        for source in sources:
            # Files without a service get empty gRPC modules; leave them out so the tree shows
            # what is real.
            has_service = "\nservice " in (PROTO_DIR / source).read_text()
            suffixes = GENERATED_SUFFIXES if has_service else ("_pb2.py", "_pb2.pyi")
            stem = source.with_suffix("")
            for suffix in suffixes:
                written = scratch / f"{stem}{suffix}"
                text = relocate(written.read_text())
                if LEFT_OVER.search(text):
                    raise SystemExit(f"{written.name}: an import of magnetar.* was not relocated")
                target = out_root / f"{python_path(source).with_suffix('')}{suffix}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)


def generated_files(root: Path) -> set[Path]:
    return {
        p.relative_to(root)
        for p in (root / "proto").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def range_floors() -> dict[str, Version]:
    """The lowest version pyproject.toml allows of each runtime dependency that has one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors: dict[str, Version] = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        for spec in requirement.specifier:
            if spec.operator in (">=", "=="):
                floors[requirement.name.lower()] = Version(spec.version)
    return floors


def runtime_problems(root: Path) -> list[str]:
    """Generated modules that would refuse the lowest grpcio or protobuf of the range."""
    floors = range_floors()
    grpcio, protobuf = floors.get("grpcio"), floors.get("protobuf")
    if grpcio is None or protobuf is None:
        return ["pyproject.toml: the grpcio and protobuf requirements need a floor (>=)"]
    problems: list[str] = []
    for rel in sorted(generated_files(root)):
        if rel.suffix != ".py":
            continue
        text = (root / rel).read_text()
        problems += [
            f"{rel} demands grpcio>={match['version']}; the floor is {grpcio}"
            for match in GRPC_DEMAND.finditer(text)
            if Version(match["version"]) > grpcio
        ]
        for match in PROTOBUF_DEMAND.finditer(text):
            demand = Version(f"{match['major']}.{match['minor']}.{match['patch']}")
            if demand > protobuf or demand.major != protobuf.major or match["suffix"]:
                problems.append(
                    f"{rel} is protobuf {demand}{match['suffix']} gencode; the floor {protobuf}"
                    " needs gencode of its own major version, no newer than itself"
                )
    return problems


def report_runtime_problems(root: Path) -> int:
    problems = runtime_problems(root)
    if problems:
        print("Generated protocol code would refuse the floor of the range:", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        print(f"Generate with the floor's tools (GENERATOR = {GENERATOR!r})", file=sys.stderr)
        return 1
    return 0


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        generate(fresh_root)
        fresh = generated_files(fresh_root)
        committed = generated_files(ROOT)
        problems: list[str] = []
        problems += [f"missing (not committed): {p}" for p in sorted(fresh - committed)]
        problems += [f"stale (no .proto makes it): {p}" for p in sorted(committed - fresh)]
        for rel in sorted(fresh & committed):
            if not filecmp.cmp(fresh_root / rel, ROOT / rel, shallow=False):
                diff = difflib.unified_diff(
                    (ROOT / rel).read_text().splitlines(),
                    (fresh_root / rel).read_text().splitlines(),
                    f"committed/{rel}",
                    f"regenerated/{rel}",
                    lineterm="",
                    n=1,
                )
                problems.append(f"differs: {rel}\n" + "\n".join(list(diff)[:40]))
    if problems:
        print("Generated protocol code has drifted from the .proto files:", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        print("Run: python scripts/genproto.py  (and commit the result)", file=sys.stderr)
        return 1
    if report_runtime_problems(ROOT):
        return 1
    print(f"proto: generated code matches {source_count()} .proto files ({GENERATOR})")
    return 0


def regenerate() -> int:
    for rel in generated_files(ROOT):
        (ROOT / rel).unlink()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for rel in generated_files(Path(tmp)):
            (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / rel, ROOT / rel)
    # Every folder that holds generated modules is a package.
    for module_folder in {(ROOT / rel).parent for rel in generated_files(ROOT)}:
        folder = module_folder
        while folder != ROOT:
            (folder / "__init__.py").touch()
            folder = folder.parent
    print(f"proto: regenerated code for {source_count()} .proto files ({GENERATOR})")
    return report_runtime_problems(ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code drifted")
    args = parser.parse_args()
    os.chdir(ROOT)
    return check() if args.check else regenerate()


if __name__ == "__main__":
    sys.exit(main())
