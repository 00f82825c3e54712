#!/usr/bin/env bash
# A change against its base, in one run: builds revision BASE (default
# HEAD~1) beside the working tree and runs scripts/bench-vs-redis.sh and
# scripts/bench-prefix.sh with that build as the baseline, so every cell is
# measured for redis-server, this build and the base alternately. Compare
# the new/base ratios against the noise band each table reports.
#
#   scripts/bench-before-after.sh ee19b2e
#   REPS=5 SIZES="64 65536" scripts/bench-before-after.sh HEAD~3
#
# The base is checked out in a git worktree under target/baseline/ and built
# with its own target directory (kept for the next run).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
BASE=${1:-HEAD~1}
build_baseline "$BASE"
export BASELINE_BIN
echo
echo "== redis-benchmark cells (scripts/bench-vs-redis.sh) =="
scripts/bench-vs-redis.sh
echo
echo "== the dialect (scripts/bench-prefix.sh) =="
scripts/bench-prefix.sh
