"""Regenerate the Python code of every .proto under proto/, or check that it has not drifted.

    python scripts/genproto.py           # regenerate in place
    python scripts/genproto.py --check   # exit 1 if the committed code differs from a fresh run

Generated per .proto: ``*_pb2.py`` and its typed stub ``*_pb2.pyi`` (mypy-protobuf), plus
``*_pb2_grpc.py`` / ``*_pb2_grpc.pyi`` for files that declare a service. The output depends only on
the pinned grpcio-tools, protobuf and mypy-protobuf versions, so a drift means either a .proto
changed without regenerating, or the pins moved.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_sources() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_root: Path) -> None:
    """Run protoc for every source, writing the generated tree under ``out_root``."""
    import grpc_tools  # noqa: PLC0415 - a dev dependency, needed only here

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    sources = [str(p.relative_to(ROOT)) for p in proto_sources()]
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--mypy_out=quiet:{out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_grpc_out=quiet:{out_root}",
        *sources,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    # Files without a service get empty gRPC modules; drop them so the tree shows what is real.
    for source in proto_sources():
        if "\nservice " not in source.read_text():
            rel = source.relative_to(ROOT).with_suffix("")
            for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
                (out_root / f"{rel}{suffix}").unlink(missing_ok=True)


def generated_files(root: Path) -> set[Path]:
    return {
        p.relative_to(root)
        for p in (root / "proto").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


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
        print("Generated protocol code has drifted from proto/*.proto:", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        print("Run: python scripts/genproto.py  (and commit the result)", file=sys.stderr)
        return 1
    print(f"proto: generated code matches {len(proto_sources())} .proto files")
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
    for proto_folder in {p.parent for p in (ROOT / "proto").rglob("*.proto")}:
        folder = proto_folder
        while folder != ROOT:
            (folder / "__init__.py").touch()
            folder = folder.parent
    print(f"proto: regenerated code for {len(proto_sources())} .proto files")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code drifted")
    args = parser.parse_args()
    os.chdir(ROOT)
    return check() if args.check else regenerate()


if __name__ == "__main__":
    sys.exit(main())
