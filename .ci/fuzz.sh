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
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz() { cargo +nightly fuzz "$@"; }
else
  export RUSTC_BOOTSTRAP=1
  fuzz() { cargo fuzz "$@"; }
fi
fuzz build --fuzz-dir tests/fuzz
for target in $(fuzz list --fuzz-dir tests/fuzz); do
  work=$(mktemp -d)
  echo "fuzz: $target for ${each}s"
  if ! fuzz run --fuzz-dir tests/fuzz "$target" "$work" "tests/fuzz/corpus/$target" -- \
      -max_total_time="$each" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$work.log" 2>&1; then
    tail -60 "$work.log"
    for crash in tests/fuzz/artifacts/"$target"/*; do
      [ -f "$crash" ] || continue
      echo "input that failed ($crash), hex:"
      od -An -tx1 -v "$crash" | tr -d ' \n'; echo
    done
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^Done" "$work.log" || true
  rm -rf "$work" "$work.log"
done
