#!/usr/bin/env bash
# Static checks: lint, format, types (strict, generated code excluded), import contracts, that
# the generated protocol code matches the .proto files, and buf's lint, format and breaking-change
# checks of the .proto files (scripts/buf.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
status=0
run() { echo "== $*"; "$@" || status=1; }
run .venv/bin/ruff check .
run .venv/bin/ruff format --check .
run .venv/bin/mypy
run .venv/bin/lint-imports
run .venv/bin/python scripts/genproto.py --check
run bash scripts/buf.sh
run .venv/bin/python scripts/gendocs.py --check
exit $status
