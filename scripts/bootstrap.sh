#!/usr/bin/env bash
# Set up what Magnetar needs on a fresh Debian machine with Python 3.11, idempotently:
#   bash scripts/bootstrap.sh           the virtualenv (.venv) with Magnetar, its dev tools and the
#                                       Spark connector's extras (PySpark)
#   bash scripts/bootstrap.sh --etcd    the same, plus Debian's etcd-server and a Java runtime
#                                       (for Spark) for the tests
# Re-running is cheap: pip runs again only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

want_etcd=0
for arg in "$@"; do
  case "$arg" in
    --etcd) want_etcd=1 ;;
    *) echo "bootstrap: unknown argument $arg" >&2; exit 2 ;;
  esac
done

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

stamp=.venv/.magnetar-installed
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing Magnetar and its dev tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,spark,helm]"
  echo "$want" > "$stamp"
fi

if [ "$want_etcd" = 1 ] && ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  echo "bootstrap: installing Debian's etcd-server (the tests start their own on free ports)"
  apt_install etcd-server
fi

if [ "$want_etcd" = 1 ] && ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing a Java runtime (PySpark runs Spark on it)"
  apt_install default-jre-headless
fi
