#!/usr/bin/env bash
# Start Magnetar standalone (embedded metadata, no etcd), installing it first if needed (with its
# runtime dependencies only: no PySpark, no dev or Helm tools).
# Arguments go to `magnetar standalone`:  bash scripts/standalone.sh --data-dir ./data
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --runtime
exec .venv/bin/magnetar standalone "$@"
