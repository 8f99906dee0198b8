#!/usr/bin/env bash
# Runs every fuzz target in tests/fuzz for FUZZ_SECONDS each (60 by default) with libFuzzer,
# from the committed corpus; fails on the first crash or broken invariant and prints the input
# (hex) so it can be committed under tests/fuzz/regressions/TARGET/ with the fix. A long run:
#   FUZZ_SECONDS=3600 bash .ci/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
each=${FUZZ_SECONDS:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
# libFuzzer's instrumentation needs nightly flags: the nightly toolchain where there is one,
# else the stable one told to accept them.
# (grep reads the whole list: with -q it could stop early and fail rustup on a closed pipe.)
if rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
  fuzz() { cargo +nightly fuzz "$@"; }
else
  export RUSTC_BOOTSTRAP=1
  fuzz() { cargo fuzz "$@"; }
fi
fuzz build --fuzz-dir tests/fuzz
targets=$(fuzz list --fuzz-dir tests/fuzz)
[ -n "$targets" ] || { echo "fuzz: no targets found in tests/fuzz" >&2; exit 1; }
# One libFuzzer process is one core: run the targets two at a time, as the machine has two cores,
# so each still gets its full time and the step takes half as long.
run_one() {
  local target=$1 work
  work=$(mktemp -d)
  mkdir -p "$work/corpus" "$work/artifacts"
  # New inputs go to a scratch corpus; the committed corpus and the regressions are seeds.
  local seeds=("tests/fuzz/corpus/$target")
  [ -d "tests/fuzz/regressions/$target" ] && seeds+=("tests/fuzz/regressions/$target")
  if ! fuzz run --fuzz-dir tests/fuzz "$target" "$work/corpus" "${seeds[@]}" -- \
      -max_total_time="$each" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" >"$work/log" 2>&1; then
    echo "fuzz: $target FAILED"
    tail -60 "$work/log"
    for crash in "$work"/artifacts/*; do
      [ -f "$crash" ] || continue
      echo "input that failed ($(basename "$crash")), hex:"
      od -An -tx1 -v "$crash" | tr -d ' \n'; echo
    done
    return 1
  fi
  echo "fuzz: $target for ${each}s"
  grep -E "^stat::number_of_executed_units|^Done" "$work/log" || true
  rm -rf "$work"
}
# Each target's report goes to its own file and is printed whole once its pair ends, so two
# reports never interleave.
parallel=${FUZZ_JOBS:-2}
reports=$(mktemp -d)
failed=0
set -- $targets
while [ $# -gt 0 ]; do
  pair=()
  while [ $# -gt 0 ] && [ ${#pair[@]} -lt "$parallel" ]; do
    run_one "$1" >"$reports/$1" 2>&1 &
    pair+=("$!"); shift
  done
  for pid in "${pair[@]}"; do wait "$pid" || failed=1; done
  cat "$reports"/*; rm -f "$reports"/*
done
rm -rf "$reports"
[ "$failed" = 0 ] || { echo "fuzz: a target failed (above)" >&2; exit 1; }
