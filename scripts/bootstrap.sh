#!/usr/bin/env bash
# Set up what Magnetar needs on a fresh Debian machine with Python 3.11, idempotently:
#   bash scripts/bootstrap.sh --runtime  the virtualenv (.venv) with Magnetar and its runtime
#                                        dependencies only: what `magnetar standalone` needs
#   bash scripts/bootstrap.sh            .venv with Magnetar, its dev tools and the extras of
#                                        the Spark connector (PySpark), the Helm chart's tests and
#                                        the speedups (uvloop, for --event-loop uvloop)
#   bash scripts/bootstrap.sh --etcd     the same, plus Debian's etcd-server, a Java runtime
#                                        (for Spark), the Node.js example's npm packages
#                                        (examples/node/node_modules) for the tests and the buf
#                                        CLI (tools/buf/node_modules) for the .proto checks
# Versions are exact: constraints/pinned.txt (users get pyproject.toml's ranges),
# examples/node/package-lock.json and tools/buf/package-lock.json. Re-running is cheap: pip runs
# again only when pyproject.toml, the constraints or this script changed, npm ci only when a lock
# file changed. A stamp
# per kind says what is in: a full install holds the runtime too, so --runtime after it installs
# nothing and removes nothing, and a full install after --runtime adds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."

want_etcd=0
want_full=1
for arg in "$@"; do
  case "$arg" in
    --etcd) want_etcd=1 ;;
    --runtime) want_full=0 ;;
    *) echo "bootstrap: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ "$want_etcd" = 1 ] && [ "$want_full" = 0 ]; then
  echo "bootstrap: --etcd is for the tests, which need the full install; drop --runtime" >&2
  exit 2
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "bootstrap: '$*' needs root (or sudo)" >&2; return 1
  fi
}

apt_install() {
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q "$@"
}

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "bootstrap: Magnetar needs Python >= 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    # Debian ships venv/ensurepip separately
    rm -rf .venv
    apt_install python3-venv
    "$PYTHON" -m venv .venv
  fi
fi

want="$(cat pyproject.toml constraints/pinned.txt scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
runtime_stamp=.venv/.magnetar-runtime
full_stamp=.venv/.magnetar-full
installed() { [ "$(cat "$1" 2>/dev/null)" = "$want" ]; }
pip_install() {
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints/pinned.txt "$@"
}
if [ "$want_full" = 1 ]; then
  if ! installed "$full_stamp"; then
    echo "bootstrap: installing Magnetar, its dev tools, PySpark and the Helm test tools into .venv"
    pip_install -e ".[dev,spark,helm,speedups]"
    echo "$want" > "$runtime_stamp"
    echo "$want" > "$full_stamp"
  fi
elif ! installed "$runtime_stamp" && ! installed "$full_stamp"; then
  echo "bootstrap: installing Magnetar and its runtime dependencies into .venv"
  pip_install -e .
  echo "$want" > "$runtime_stamp"
fi
rm -f .venv/.magnetar-installed  # the single stamp of before

if [ "$want_etcd" = 1 ] && ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  echo "bootstrap: installing Debian's etcd-server (the tests start their own on free ports)"
  apt_install etcd-server
fi

if [ "$want_etcd" = 1 ] && ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing a Java runtime (PySpark runs Spark on it)"
  apt_install default-jre-headless
fi

# tests/interop runs the Node.js example against a standalone, and scripts/buf.sh runs buf from
# tools/buf; each runs the same npm ci with the same stamp when its packages are missing, so
# either may come first
if [ "$want_etcd" = 1 ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "bootstrap: installing Node.js and npm (tests/interop runs examples/node)"
    apt_install nodejs npm
  fi
  for npm_dir in examples/node tools/buf; do
    npm_want="$(sha256sum "$npm_dir/package-lock.json" | cut -d' ' -f1)"
    npm_stamp="$npm_dir/node_modules/.magnetar-npm-ci"
    if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_want" ]; then
      echo "bootstrap: installing the npm packages of $npm_dir (npm ci)"
      (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error)
      echo "$npm_want" > "$npm_stamp"
    fi
  done
fi
