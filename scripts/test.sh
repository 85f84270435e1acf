#!/usr/bin/env bash
# Run the whole test suite, installing what it needs first (the virtualenv, etcd-server).
# Extra arguments go to pytest:  bash scripts/test.sh tests/metadata -k watch
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --etcd
export GRPC_VERBOSITY=${GRPC_VERBOSITY:-ERROR}
# Two workers, each taking whole files (module fixtures such as a shared Spark session or cluster
# stay in one process): most tests wait on real processes, so two run in about 0.8 of the time.
# MAGNETAR_TEST_WORKERS=0 runs them in this process.
exec .venv/bin/python -m pytest -n "${MAGNETAR_TEST_WORKERS:-2}" --dist loadfile "$@"
