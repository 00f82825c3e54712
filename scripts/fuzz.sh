#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS each (default 60)
# from its seed corpus (fuzz/corpus/<target>, committed; new inputs go to a
# temporary directory, so the seeds stay as they are). A crash, a panic, a
# leak or an input slower than 10 s fails the run; libFuzzer saves the input
# under fuzz/artifacts/<target>/, to be turned into a regression test. Needs
# the nightly toolchain (the product itself builds on stable); installs it
# (rustup) and cargo-fuzz (crates.io) when they are missing.
#
#   scripts/fuzz.sh
#   FUZZ_SECONDS=10 TARGETS="request_parser commands" scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS=${FUZZ_SECONDS:-60}
TARGETS=${TARGETS:-"request_parser inline_parser reply_parser spill_record commands"}

if ! rustup toolchain list | grep -q '^nightly'; then
    # As scripts/test.sh installs everything else it needs.
    echo "cargo fuzz needs the nightly toolchain: installing it (rustup toolchain install nightly --profile minimal)"
    rustup toolchain install nightly --profile minimal
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
cargo +nightly fuzz build --fuzz-dir fuzz -O
WORK=$(mktemp -d -t kvtier-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for target in $TARGETS; do
  echo "== $target: ${SECS} s"
  # The in-process server keeps what the commands store across inputs:
  # that is its job, not a leak.
  leaks=1
  [[ $target == commands ]] && leaks=0
  mkdir -p "$WORK/$target"
  ASAN_OPTIONS=detect_leaks=$leaks cargo +nightly fuzz run --fuzz-dir fuzz -O "$target" "$WORK/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$SECS" -detect_leaks="$leaks" -timeout=10 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 2>"$WORK/$target.log" \
    || { tail -40 "$WORK/$target.log"; echo "FAIL: $target (input saved under fuzz/artifacts/$target/)"; exit 1; }
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$WORK/$target.log" | tr '\n' ' '; echo
done
echo "PASS: every target ran ${SECS} s without a finding"
