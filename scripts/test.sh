#!/usr/bin/env bash
# Run the whole test suite, installing what it needs first (the virtualenv, etcd-server).
# Extra arguments go to pytest:  bash scripts/test.sh tests/metadata -k watch
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --etcd
export GRPC_VERBOSITY=${GRPC_VERBOSITY:-ERROR}
exec .venv/bin/python -m pytest "$@"
