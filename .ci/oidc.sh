#!/usr/bin/env bash
# Installs npm `oidc-provider` (pinned), a real OpenID provider that `tests/clients/oidc_provider.mjs`
# starts on loopback for the OAuth end-to-end tests, into a cache directory, once per version;
# prints the directory. Run the provider as `$DIR/node tests/clients/oidc_provider.mjs --modules $DIR`:
# `$DIR/node` is this machine's Node when oidc-provider 9 supports it (an LTS from 22 "Jod" on; on
# anything older it warns "Unsupported runtime"), else a Node 22 installed here from the npm
# package `node@22`, as `.ci/conformance.sh` does (this machine's Node 20 is such a case). The Python
# side of those tests needs nothing beyond `.ci/python-mcp.sh`'s venv (`mcp` brings httpx2 and PyJWT).
set -euo pipefail
DIR=${LAMPLIGHTER_OIDC:-$HOME/.cache/lamplighter-oidc}
VERSION=oidc-provider-9.13.3
installed() { [ -x "$DIR/node" ] && [ -d "$DIR/node_modules/oidc-provider" ] && [ "$(cat "$DIR/version" 2>/dev/null)" = "$VERSION" ]; }
if installed; then
  echo "$DIR"; exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install oidc-provider" >&2; exit 1; }
mkdir -p "$DIR"
# Tests that need the provider run side by side, each calling this script: one installs while
# the others wait (two `npm install`s into one folder fail with ENOTEMPTY), then find it done.
exec 9>"$DIR.lock"
flock 9
if installed; then
  echo "$DIR"; exit 0
fi
# oidc-provider 9 supports Node LTS releases from "Jod" (22) on; it declares no `engines`, so npm
# would not say, and it only warns at run time.
node_ok() { "$1" -e 'const l=process.release.lts;process.exit(l&&l.charCodeAt(0)>="J".charCodeAt(0)?0:1)' 2>/dev/null; }
PACKAGES=("oidc-provider@9.13.3")
if command -v node >/dev/null && node_ok "$(command -v node)"; then
  NODE=$(command -v node)
else
  PACKAGES+=("node@22")
  NODE="$DIR/node_modules/.bin/node"
fi
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "${PACKAGES[@]}" >&2
ln -sfn "$NODE" "$DIR/node"
"$DIR/node" --version >&2
echo "$VERSION" >"$DIR/version"
echo "$DIR"
