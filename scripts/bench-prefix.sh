#!/usr/bin/env bash
# The block dialect against what a Redis KV-cache connector does today, in
# one run: kvtier and redis-server started side by side, measured by the same
# client (kvtier-bench prefix), servers alternated round by round.
#   - lookup of a 64-block chain: kvtier PREFIXLEN vs sequential EXISTS on
#     redis-server (LMCache's Redis connector)
#   - fetch of 32 blocks of 2 MiB: kvtier MGETPREFIX vs redis-server MGET
# Extra arguments go to `kvtier-bench prefix` (e.g. --lookups 500).
# BASELINE_BIN=path/to/an/older/kvtier-server runs the dialect's cells on
# that build too, alternated with this one (scripts/bench-before-after.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "missing redis-server (apt-get install redis-server)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
KV=$(free_port); RD=$(free_port)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
target/release/kvtier-server --port "$KV" --metrics-addr none >/dev/null 2>&1 & PIDS+=($!)
redis-server --port "$RD" --save '' --appendonly no >/dev/null 2>&1 & PIDS+=($!)
PORTS="$KV $RD"
BASE_ARGS=()
if [[ -n "${BASELINE_BIN:-}" ]]; then
  BP=$(free_port)
  "$BASELINE_BIN" --port "$BP" --metrics-addr none >/dev/null 2>&1 & PIDS+=($!)
  PORTS+=" $BP"
  BASE_ARGS=(--baseline "127.0.0.1:$BP")
fi
for port in $PORTS; do
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
target/release/kvtier-bench prefix --kvtier "127.0.0.1:$KV" --redis "127.0.0.1:$RD" "${BASE_ARGS[@]}" "$@"
