#!/usr/bin/env bash
# Warm slot hand-off, measured: the Mooncake synthetic trace replayed once as
# fast as possible to warm three kvtier nodes on loopback ports (WARMUP=no
# skips it), then again (dialect, timestamps honoured at SPEED x, so the hit
# rate is steady); JOIN_AT seconds into that replay, a fourth node is started with the
# four-node list and CLUSTER SETNODES spreads it. The replay's connections
# stay on the first three nodes, which forward the newcomer's slots to it.
# Reported: the block hit rate in the WINDOW seconds before the join and in
# the WINDOW seconds after it, and their ratio, with the hand-off
# (--cluster-handoff-ms HANDOFF_MS), without it (0), and with no join at all
# (the same windows of the same replay on three nodes: how much the hit
# rate rises by itself as the trace goes on), alternated REPS times in one
# run. Goal: after / before >= 0.9 with the hand-off.
#
#   scripts/bench-handoff.sh
#   SPEED=15 JOIN_AT=30 WINDOW=20 REPS=1 scripts/bench-handoff.sh   # quick
#
# Environment: TRACE, WARMUP (yes), SPEED (6: the 1,022 s trace in 170 s), JOIN_AT (80),
# WINDOW (60), BLOCK (16KiB), MAXMEM_MB per node (768), HANDOFF_MS (120000),
# REPS (1), CONCURRENCY (8).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
TRACE=${TRACE:-bench/traces/mooncake_synthetic_trace.jsonl}
SPEED=${SPEED:-6}
JOIN_AT=${JOIN_AT:-80}
WINDOW=${WINDOW:-60}
BLOCK=${BLOCK:-16KiB}
MAXMEM_MB=${MAXMEM_MB:-768}
HANDOFF_MS=${HANDOFF_MS:-120000}
REPS=${REPS:-1}
CONCURRENCY=${CONCURRENCY:-8}
WARMUP=${WARMUP:-yes}

[[ -f $TRACE ]] || { echo "no trace at $TRACE (set TRACE)" >&2; exit 1; }
bench_setup bench-handoff

# run MODE HANDOFF_MS [JOIN]: one replay, with a join midway unless JOIN is
# "no"; prints the figures.
run() {
  local mode=$1 handoff=$2 join=${3:-yes}
  local ports=("$(free_port)" "$(free_port)" "$(free_port)" "$(free_port)")
  local three="n1@127.0.0.1:${ports[0]},n2@127.0.0.1:${ports[1]},n3@127.0.0.1:${ports[2]}"
  local four="$three,n4@127.0.0.1:${ports[3]}"
  start() { # index list epoch
    "$BIN" --port "${ports[$1]}" --threads 1 --maxmemory "${MAXMEM_MB}mb" --metrics-addr none \
      --cluster-nodes "$2" --node-id "n$(($1 + 1))" --cluster-epoch "$3" \
      --cluster-node-timeout 1000 --cluster-handoff-ms "$handoff" >"$WORK/$mode-n$(($1 + 1)).log" 2>&1 &
    PIDS+=($!)
    wait_up "${ports[$1]}"
  }
  for i in 0 1 2; do start "$i" "$three" 0; done
  local targets="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
  if [[ $WARMUP == yes ]]; then
    "$BENCH" trace "$TRACE" --protocol dialect --block-bytes "$BLOCK" --concurrency "$CONCURRENCY" \
      --as-fast-as-possible --target "$targets" >"$WORK/$mode-warmup.log" 2>&1 || { cat "$WORK/$mode-warmup.log"; exit 1; }
  fi
  local json=$WORK/$mode.json
  "$BENCH" trace "$TRACE" --protocol dialect --block-bytes "$BLOCK" --concurrency "$CONCURRENCY" \
    --speed "$SPEED" --target "$targets" \
    --json "$json" >"$WORK/$mode-trace.log" 2>&1 &
  local replay=$!
  sleep "$JOIN_AT"
  local info="no fourth node"
  if [[ $join == yes ]]; then
    start 3 "$four" 1
    redis-cli -p "${ports[0]}" cluster setnodes "$four" 1 >/dev/null
  fi
  wait "$replay" || { cat "$WORK/$mode-trace.log"; exit 1; }
  if [[ $join == yes ]]; then
    info="newcomer: $(redis-cli -p "${ports[3]}" info cluster | tr -d '\r' | grep -E '^cluster_handoff_(fetched|missed|deleted)' | tr '\n' ' ')"
  fi
  python3 - "$json" "$JOIN_AT" "$WINDOW" "$mode" "$info" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
join, window, mode, info = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
blocks, hits = r["blocks_per_second"], r["hit_blocks_per_second"]
def rate(a, b):
    n = sum(blocks[a:b]); return sum(hits[a:b]) / n if n else float("nan")
before, after = rate(max(0, join - window), join), rate(join, join + window)
assert r["verification_failures"] == 0 and r["errors"] == 0, r
print(f"{mode:>12}: hit rate before {before:.3f}, after {after:.3f}, after/before {after / before:.3f}; "
      f"whole run {r['block_hit_rate']:.3f}; {info}")
PY
  stop_all
}

echo "== $TRACE at ${SPEED}x, blocks of $BLOCK, a fourth node joins at ${JOIN_AT} s, windows of ${WINDOW} s"
for rep in $(seq "$REPS"); do
  run handoff "$HANDOFF_MS"
  run no-handoff 0
  run no-join "$HANDOFF_MS" no
done
