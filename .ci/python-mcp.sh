#!/usr/bin/env bash
# Installs the official Python MCP SDK (PyPI `mcp`, pinned) into a venv, once per machine, and
# prints the venv's python. The end-to-end tests that drive the worker with a third-party MCP
# client call it (`tests/src/setup.rs`, `python_mcp`). pip's own cache keeps a second machine's
# install offline-fast.
set -euo pipefail
DIR=${LAMPLIGHTER_PYTHON_MCP:-$HOME/.cache/lamplighter-python-mcp}
MCP_VERSION=2.3.0
if [ ! -x "$DIR/venv/bin/python" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$MCP_VERSION" ]; then
  mkdir -p "$DIR"
  exec 8>"$DIR/.lock"
  flock 8
  if [ ! -x "$DIR/venv/bin/python" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$MCP_VERSION" ]; then
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv" >&2
    "$DIR/venv/bin/pip" install -q "mcp==$MCP_VERSION" >&2
    echo "$MCP_VERSION" >"$DIR/version"
  fi
fi
echo "$DIR/venv/bin/python"
