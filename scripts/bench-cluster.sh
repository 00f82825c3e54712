#!/usr/bin/env bash
# A three-node kvtier cluster on loopback ports, measured in one run
# (kvtier-bench as the client, its connections spread over the three nodes):
#
#  skew   Zipf-skewed reads of a set of hot blocks (kvtier-bench skew), with
#         hot-block copies on (--hot-key-threshold $HOT) and off (0): total
#         throughput, and the busiest node's share of the reads against the
#         mean. Goal with copies: busiest <= 1.3x the mean, throughput
#         >= 1.5x copies off.
#  trace  The Mooncake synthetic trace (dialect) through the cluster and
#         against a single node with the same total memory: block hit rate
#         (must match) and p50/p99 of lookup, fetch, store.
#  hop    The latency one forwarding hop adds: GETs of 4 KiB values, one
#         connection, no pipelining, against a single node and against one
#         cluster node (two thirds of the keys live on the other nodes).
#
#   scripts/bench-cluster.sh
#   PARTS=skew SKEW_SECS=5 scripts/bench-cluster.sh
#
# Environment: PARTS ("skew trace hop"), REPS (3: runs alternate, medians
# reported), SKEW_SECS (8), SKEW_KEYS (1000), SKEW_BLOCK (64KiB), SKEW_CONNS
# (48), HOT (200 reads/s), THREADS per node (1), TRACE, TRACE_LIMIT (2000
# requests), TRACE_BLOCK (64KiB).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"skew trace hop"}
REPS=${REPS:-3}
SKEW_SECS=${SKEW_SECS:-8}
SKEW_KEYS=${SKEW_KEYS:-1000}
SKEW_BLOCK=${SKEW_BLOCK:-64KiB}
SKEW_CONNS=${SKEW_CONNS:-48}
HOT=${HOT:-200}
THREADS=${THREADS:-1}
TRACE=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
TRACE_LIMIT=${TRACE_LIMIT:-2000}
TRACE_BLOCK=${TRACE_BLOCK:-64KiB}
MAXMEM_MB=${MAXMEM_MB:-3072}

bench_setup bench-cluster
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

# start_cluster EXTRA...: three nodes; sets PORTS and TARGETS.
start_cluster() {
  PORTS=("$(free_port)" "$(free_port)" "$(free_port)")
  local list="n1@127.0.0.1:${PORTS[0]},n2@127.0.0.1:${PORTS[1]},n3@127.0.0.1:${PORTS[2]}"
  for i in 0 1 2; do
    "$BIN" --port "${PORTS[$i]}" --threads "$THREADS" --metrics-addr none \
      --maxmemory "$((MAXMEM_MB / 3))mb" --cluster-nodes "$list" --node-id "n$((i + 1))" "$@" \
      >"$WORK/n$i.log" 2>&1 &
    PIDS+=($!)
  done
  for p in "${PORTS[@]}"; do wait_up "$p"; done
  TARGETS="127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}"
}

if [[ " $PARTS " == *" skew "* ]]; then
  echo "== skew: $SKEW_KEYS blocks of $SKEW_BLOCK, zipf 0.99, $SKEW_CONNS connections over 3 nodes, ${SKEW_SECS}s, $REPS round(s)"
  declare -A OPS SHARE
  for rep in $(seq "$REPS"); do
    for mode in on off; do
      hot=$HOT; [[ $mode == off ]] && hot=0
      start_cluster --hot-key-threshold "$hot"
      out=$WORK/skew-$mode-$rep.json
      "$BENCH" skew --target "$TARGETS" --keys "$SKEW_KEYS" --block-size "$SKEW_BLOCK" \
        --connections "$SKEW_CONNS" --duration "$SKEW_SECS" --json "$out" >"$WORK/skew-$mode-$rep.log" 2>&1 \
        || { cat "$WORK/skew-$mode-$rep.log"; exit 1; }
      OPS[$mode]+=" $(json "$out" 'r["ops_per_sec"]')"
      SHARE[$mode]+=" $(json "$out" 'r["busiest_over_mean"]')"
      printf '  round %s copies %-3s %10.0f reads/s  busiest node %.2fx the mean  (%s)\n' "$rep" "$mode" \
        "$(json "$out" 'r["ops_per_sec"]')" "$(json "$out" 'r["busiest_over_mean"]')" \
        "$(json "$out" '" ".join(str(x) for x in r["shard_reads"])')"
      stop_all
    done
  done
  on=$(median ${OPS[on]}); off=$(median ${OPS[off]})
  echo
  echo "| copies | reads/s (median) | busiest node / mean (median) |"
  echo "|---|---|---|"
  printf '| on (threshold %s/s) | %.0f | %.2fx |\n' "$HOT" "$on" "$(median ${SHARE[on]})"
  printf '| off | %.0f | %.2fx |\n' "$off" "$(median ${SHARE[off]})"
  python3 -c "import sys; print(f'throughput with copies / without: {float(sys.argv[1])/float(sys.argv[2]):.2f}x')" "$on" "$off"
fi

if [[ " $PARTS " == *" trace "* ]]; then
  [[ -f $TRACE ]] || { echo "no trace at $TRACE (set TRACE)" >&2; exit 1; }
  echo "== trace: $TRACE_LIMIT requests of the Mooncake synthetic trace, blocks of $TRACE_BLOCK, dialect, 8 in flight"
  TARGS=(trace "$TRACE" --protocol dialect --block-bytes "$TRACE_BLOCK" --concurrency 8 --limit "$TRACE_LIMIT" --as-fast-as-possible)
  declare -A RES
  for rep in $(seq "$REPS"); do
    for mode in single cluster; do
      if [[ $mode == single ]]; then
        port=$(free_port)
        "$BIN" --port "$port" --threads "$THREADS" --metrics-addr none --maxmemory "${MAXMEM_MB}mb" >"$WORK/single.log" 2>&1 &
        PIDS+=($!); wait_up "$port"; target=127.0.0.1:$port
      else
        start_cluster; target=$TARGETS
      fi
      out=$WORK/trace-$mode-$rep.json
      "$BENCH" "${TARGS[@]}" --target "$target" --json "$out" >"$WORK/trace-$mode-$rep.log" 2>&1 \
        || { cat "$WORK/trace-$mode-$rep.log"; exit 1; }
      RES[$mode]+="$out "
      printf '  round %s %-7s hit rate %.4f  lookup p50 %6.0f µs p99 %6.0f µs  fetch p50 %6.0f µs p99 %6.0f µs  store p50 %6.0f µs p99 %6.0f µs  failures %s\n' \
        "$rep" "$mode" "$(json "$out" 'r["block_hit_rate"]')" \
        "$(json "$out" 'r["latency"]["lookup"]["p50_us"]')" "$(json "$out" 'r["latency"]["lookup"]["p99_us"]')" \
        "$(json "$out" 'r["latency"]["fetch"]["p50_us"]')" "$(json "$out" 'r["latency"]["fetch"]["p99_us"]')" \
        "$(json "$out" 'r["latency"]["store"]["p50_us"]')" "$(json "$out" 'r["latency"]["store"]["p99_us"]')" \
        "$(json "$out" 'r["verification_failures"]')"
      stop_all
    done
  done
  echo
  echo "| | block hit rate | lookup p50 / p99 µs | fetch p50 / p99 µs | store p50 / p99 µs |"
  echo "|---|---|---|---|---|"
  for mode in single cluster; do
    python3 - "$mode" ${RES[$mode]} <<'EOF'
import json, statistics, sys
mode, files = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f)) for f in files]
m = lambda f: statistics.median(f(r) for r in runs)
lat = lambda op, q: m(lambda r: r["latency"][op][q])
print(f"| {mode} | {m(lambda r: r['block_hit_rate']):.4f} | "
      + " | ".join(f"{lat(op, 'p50_us'):.0f} / {lat(op, 'p99_us'):.0f}" for op in ("lookup", "fetch", "store")) + " |")
EOF
  done
fi

if [[ " $PARTS " == *" hop "* ]]; then
  echo "== hop: GET of 4 KiB values (1000 keys), 1 connection, pipeline 1, 5 s"
  declare -A P50 P99
  for rep in $(seq "$REPS"); do
    for mode in single cluster; do
      if [[ $mode == single ]]; then
        port=$(free_port)
        "$BIN" --port "$port" --threads "$THREADS" --metrics-addr none >"$WORK/single.log" 2>&1 &
        PIDS+=($!); wait_up "$port"; target=127.0.0.1:$port
      else
        start_cluster; target=127.0.0.1:${PORTS[0]}
      fi
      out=$WORK/hop-$mode-$rep.json
      "$BENCH" kv --target "$target" --ratio 0:1 --keys 1000 --value-size 4KiB --prefill \
        --connections 1 --pipeline 1 --duration 5 --json "$out" >"$WORK/hop-$mode-$rep.log" 2>&1 \
        || { cat "$WORK/hop-$mode-$rep.log"; exit 1; }
      P50[$mode]+=" $(json "$out" 'r["latency"]["get"]["p50_us"]')"
      P99[$mode]+=" $(json "$out" 'r["latency"]["get"]["p99_us"]')"
      stop_all
    done
  done
  s50=$(median ${P50[single]}); c50=$(median ${P50[cluster]})
  echo "| GET 4 KiB | p50 µs | p99 µs |"
  echo "|---|---|---|"
  printf '| single node | %.1f | %.1f |\n' "$s50" "$(median ${P99[single]})"
  printf '| cluster node (2/3 forwarded) | %.1f | %.1f |\n' "$c50" "$(median ${P99[cluster]})"
  python3 -c "import sys; s,c=map(float,sys.argv[1:]); print(f'one hop adds about {(c-s)/(2/3):.0f} µs at p50')" "$s50" "$c50"
fi
