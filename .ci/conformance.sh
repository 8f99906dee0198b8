#!/usr/bin/env bash
# Installs the official MCP conformance suite and the Node.js it needs (22, from the npm package
# `node@22`: this machine's own Node is older), and MCP Inspector 0.15 (its CLI, on the TypeScript
# SDK that once rejected our tool list), into a cache directory, once per version; prints the
# directory. `tests/tests/e2e/conformance.rs` calls it and runs both against a worker.
set -euo pipefail
DIR=${LAMPLIGHTER_CONFORMANCE:-$HOME/.cache/lamplighter-conformance}
VERSION=0.2.0-alpha.12+inspector-0.15.0
installed() { [ -x "$DIR/node_modules/.bin/node" ] && [ "$(cat "$DIR/version" 2>/dev/null)" = "$VERSION" ]; }
if installed; then
  echo "$DIR"; exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install the conformance suite" >&2; exit 1; }
mkdir -p "$DIR"
# The tests that need the suite run side by side, each calling this script: one installs while
# the others wait (two `npm install`s into one folder fail with ENOTEMPTY), then find it done.
exec 9>"$DIR.lock"
flock 9
if installed; then
  echo "$DIR"; exit 0
fi
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error node@22 "@modelcontextprotocol/conformance@0.2.0-alpha.12" \
  "@modelcontextprotocol/inspector@0.15.0" >&2
"$DIR/node_modules/.bin/node" --version >&2
echo "$VERSION" >"$DIR/version"
echo "$DIR"
