#!/usr/bin/env bash
# The checks of the .proto files, with the buf CLI pinned in tools/buf/package-lock.json, over the
# buf module in proto/ (buf.yaml):
#   buf lint      the STANDARD rules: packages in their folders, versioned, names and suffixes
#   buf format    every file is as `buf format -w` writes it
#   buf breaking  no breaking change (the FILE rules) since the last release tag v*; skipped,
#                 saying so, while there is none
# bash scripts/bootstrap.sh --etcd installs buf (npm ci in tools/buf); this runs the same npm ci,
# with the same stamp, when buf is missing or its lock file changed, so either may come first.
#   bash scripts/buf.sh            all three
#   bash scripts/buf.sh lint ...   one buf command, with its arguments, on the checkout
set -euo pipefail
cd "$(dirname "$0")/.."

tools=tools/buf
buf="$tools/node_modules/.bin/buf"
npm_want="$(sha256sum "$tools/package-lock.json" | cut -d' ' -f1)"
npm_stamp="$tools/node_modules/.magnetar-npm-ci"
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_want" ] || [ ! -x "$buf" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "buf: needs npm to install the buf CLI (bash scripts/bootstrap.sh --etcd installs it)" >&2
    exit 1
  fi
  echo "buf: installing the buf CLI (npm ci in $tools)"
  (cd "$tools" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$npm_want" > "$npm_stamp"
fi

if [ "$#" -gt 0 ]; then
  exec "$buf" "$@"
fi

status=0
echo "buf $("$buf" --version): lint"
"$buf" lint || status=1
echo "buf: format"
# --exit-code: a file that formatting would change fails, with the diff shown
"$buf" format --diff --exit-code || status=1
# The nearest release tag this commit descends from (a clone made with --depth may not see it).
if release="$(git describe --tags --abbrev=0 --match 'v*' HEAD 2>/dev/null)"; then
  echo "buf: breaking changes since $release"
  "$buf" breaking --against ".git#tag=$release" || status=1
else
  echo "buf: no release tag (v*) before this commit: the breaking-change check is skipped"
fi
exit $status
