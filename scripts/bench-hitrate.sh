#!/usr/bin/env bash
# Hit rate under memory pressure: replay the Mooncake synthetic trace as a
# KV-cache connector would (PREFIXLEN of each request's chain, MGETPREFIX of
# the hit prefix, MSETBLOCK CHAIN of the missing suffix) with maxmemory at a
# fraction of the trace's unique bytes, under the `prefix` policy and under
# `allkeys-lru`, and print the block-level prefix hit rate beside the
# unlimited-memory maximum. Requests are replayed in order on one connection
# so the result does not depend on timing.
#
#   scripts/bench-hitrate.sh
#   BLOCK=16384 PERCENTS="10 25 50" POLICIES="prefix allkeys-lru" scripts/bench-hitrate.sh
#
# With REDIS=1 (default) a redis-server with the same maxmemory and
# allkeys-lru is replayed too (redis-pipelined protocol: pipelined EXISTS,
# MGET, MSET), as the reference a Redis deployment would give.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
TRACE=${TRACE:-bench/traces/mooncake_synthetic_trace.jsonl}
BLOCK=${BLOCK:-16384}
PERCENTS=${PERCENTS:-"10 25 50"}
POLICIES=${POLICIES:-"prefix allkeys-lru"}
THREADS=${THREADS:-$(nproc)}
REDIS=${REDIS:-1}
OUT=${OUT:-}
[[ -f "$TRACE" ]] || { echo "trace not found: $TRACE"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
unique=$(trace_unique_blocks "$TRACE")
unique_bytes=$(( unique * BLOCK ))
PID=""; TMP=$(mktemp -d)
trap '[[ -n "$PID" ]] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; wait 2>/dev/null || true' EXIT

replay() { # maxmemory policy -> block hit rate
  local port; port=$(free_port)
  target/release/kvtier-server --port "$port" --threads "$THREADS" --metrics-addr none \
    --maxmemory "$1" --maxmemory-policy "$2" >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  target/release/kvtier-bench trace "$TRACE" --target "127.0.0.1:$port" --block-bytes "$BLOCK" \
    --concurrency 1 --json "$TMP/run.json" >/dev/null
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['block_hit_rate'], r['ideal_block_hit_rate'])" "$TMP/run.json"
}

redis_replay() { # maxmemory -> block hit rate
  local port; port=$(free_port)
  redis-server --port "$port" --save '' --appendonly no --maxmemory "$1" \
    --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  target/release/kvtier-bench trace "$TRACE" --target "127.0.0.1:$port" --block-bytes "$BLOCK" \
    --concurrency 1 --protocol redis-pipelined --json "$TMP/run.json" >/dev/null
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['block_hit_rate'])" "$TMP/run.json"
}

header="| maxmemory (of unique bytes) |"; rule="|---|"
for p in $POLICIES; do header+=" kvtier $p |"; rule+="---|"; done
[[ $REDIS == 1 ]] && { header+=" redis-server allkeys-lru |"; rule+="---|"; }
header+=" unlimited-memory maximum |"; rule+="---|"
table="$header"$'\n'"$rule"
echo "trace: $unique unique blocks of $BLOCK bytes = $unique_bytes bytes"
echo "$header"; echo "$rule"
for pct in $PERCENTS; do
  mem=$(( unique_bytes * pct / 100 ))
  row="| ${pct}% ($(( mem / 1048576 )) MiB) |"
  ideal=""
  for p in $POLICIES; do
    read -r rate ideal < <(replay "$mem" "$p")
    row+=" $(printf '%.3f' "$rate") |"
  done
  if [[ $REDIS == 1 ]]; then
    row+=" $(printf '%.3f' "$(redis_replay "$mem")") |"
  fi
  row+=" $(printf '%.3f' "$ideal") |"
  echo "$row"
  table+=$'\n'"$row"
done
if [[ -n "$OUT" ]]; then
  { echo "$table"; echo; echo "Command: \`BLOCK=$BLOCK PERCENTS=\"$PERCENTS\" scripts/bench-hitrate.sh\` on $(date -u +%Y-%m-%d), kvtier --threads $THREADS; $unique unique blocks."; } > "$OUT"
fi
