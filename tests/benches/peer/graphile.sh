#!/usr/bin/env bash
# Installs the PostgreSQL drain bench's peer: graphile-worker 0.18 and the Node.js it needs
# (22.18 or later: from the npm package `node@22`, as .ci/conformance.sh does), into a cache
# folder, once; prints that folder. The driver, graphile_drain.mjs, is copied beside them (an
# ES module finds its packages from where it lives).
set -euo pipefail
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/lamplighter-bench/graphile-worker-0.18.0"
if [ ! -x "$DIR/node_modules/.bin/node" ] || [ ! -d "$DIR/node_modules/graphile-worker" ]; then
  command -v npm >/dev/null || { echo "npm is needed to install the graphile-worker peer" >&2; exit 1; }
  mkdir -p "$DIR"
  npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error node@22 graphile-worker@0.18.0 >&2
fi
cp "$(dirname "$0")/graphile_drain.mjs" "$DIR/"
echo "$DIR"
