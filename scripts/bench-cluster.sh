#!/usr/bin/env bash
# A three-node kvtier cluster on loopback ports, measured in one run
# (kvtier-bench as the client, its connections spread over the three nodes):
#
#  skew   Zipf-skewed reads of a set of hot blocks (kvtier-bench skew), with
#         hot-block copies on (--hot-key-threshold $HOT) and off (0): total
#         throughput, the busiest node's share of the reads against the
#         mean, and the nodes' CPU per read (the client shares this
#         machine's cores: reads per server CPU-second is what the nodes
#         could serve with clients elsewhere). Goal with copies: busiest
#         <= 1.1x the mean, throughput >= 1.5x copies off.
#  trace  The Mooncake synthetic trace (dialect) through the cluster and
#         against a single node with the same total memory: block hit rate
#         (must match) and p50/p99 of lookup, fetch, store.
#  incast $INCAST_CONNS connections fetching the same $INCAST_BLOCKS-block prefix
#         (MGETPREFIX, blocks of $INCAST_BLOCK): one node, then the cluster
#         (copies on, threshold $HOT) with plain clients (connections spread
#         over the nodes, each node answers the whole prefix) and with
#         cluster-aware ones (each owner its part); plain with copies off
#         beside them. GB/s, p50/p99 of a fetch, the nodes' CPU. Each run
#         follows 2 s of the same load (copies made, buffers grown).
#  hop    The latency one forwarding hop adds: GETs of 4 KiB values, one
#         connection, no pipelining, against a single node and against one
#         cluster node (two thirds of the keys live on the other nodes).
#
#   scripts/bench-cluster.sh
#   PARTS=skew SKEW_SECS=5 scripts/bench-cluster.sh
#
# Environment: PARTS ("skew incast trace hop"), REPS (3: runs alternate, medians
# reported), SKEW_SECS (8), SKEW_KEYS (1000), SKEW_BLOCK (64KiB), SKEW_CONNS
# (48), HOT (200 reads/s), THREADS per node (1), TRACE, TRACE_LIMIT (2000
# requests), TRACE_BLOCK (64KiB), INCAST_SECS (5), INCAST_BLOCKS (64),
# INCAST_BLOCK (64KiB), INCAST_CONNS (48).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"skew incast trace hop"}
REPS=${REPS:-3}
SKEW_SECS=${SKEW_SECS:-8}
SKEW_KEYS=${SKEW_KEYS:-1000}
SKEW_BLOCK=${SKEW_BLOCK:-64KiB}
SKEW_CONNS=${SKEW_CONNS:-48}
HOT=${HOT:-200}
THREADS=${THREADS:-1}
TRACE=${TRACE:-bench/traces/mooncake_synthetic_trace.jsonl}
TRACE_LIMIT=${TRACE_LIMIT:-2000}
TRACE_BLOCK=${TRACE_BLOCK:-64KiB}
MAXMEM_MB=${MAXMEM_MB:-3072}
INCAST_SECS=${INCAST_SECS:-5}
INCAST_BLOCKS=${INCAST_BLOCKS:-64}
INCAST_BLOCK=${INCAST_BLOCK:-64KiB}
INCAST_CONNS=${INCAST_CONNS:-48}

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

# node_ticks: CPU ticks the running servers have used.
node_ticks() { local t=0 p; for p in "${PIDS[@]}"; do t=$((t + $(ticks "$p"))); done; echo "$t"; }

if [[ " $PARTS " == *" skew "* ]]; then
  echo "== skew: $SKEW_KEYS blocks of $SKEW_BLOCK, zipf 0.99, $SKEW_CONNS connections over 3 nodes, ${SKEW_SECS}s, $REPS round(s)"
  declare -A OPS SHARE CPU
  for rep in $(seq "$REPS"); do
    for mode in on off; do
      hot=$HOT; [[ $mode == off ]] && hot=0
      start_cluster --hot-key-threshold "$hot"
      out=$WORK/skew-$mode-$rep.json
      before=$(node_ticks)
      "$BENCH" skew --target "$TARGETS" --keys "$SKEW_KEYS" --block-size "$SKEW_BLOCK" \
        --connections "$SKEW_CONNS" --duration "$SKEW_SECS" --json "$out" >"$WORK/skew-$mode-$rep.log" 2>&1 \
        || { cat "$WORK/skew-$mode-$rep.log"; exit 1; }
      ops=$(json "$out" 'r["ops_per_sec"]')
      # Server CPU per read: the nodes' ticks (the blocks' load included,
      # a few ms) over the reads of the run.
      cpu=$(python3 -c "import os,sys; print((int(sys.argv[1]) - int(sys.argv[2])) / os.sysconf('SC_CLK_TCK') * 1e6 / (float(sys.argv[3]) * float(sys.argv[4])))" \
        "$(node_ticks)" "$before" "$ops" "$SKEW_SECS")
      OPS[$mode]+=" $ops"
      SHARE[$mode]+=" $(json "$out" 'r["busiest_over_mean"]')"
      CPU[$mode]+=" $cpu"
      printf '  round %s copies %-3s %10.0f reads/s  busiest node %.2fx the mean  server CPU %.1f us/read  (%s)\n' "$rep" "$mode" \
        "$ops" "$(json "$out" 'r["busiest_over_mean"]')" "$cpu" \
        "$(json "$out" '" ".join(str(x) for x in r["shard_reads"])')"
      stop_all
    done
  done
  on=$(median ${OPS[on]}); off=$(median ${OPS[off]})
  con=$(median ${CPU[on]}); coff=$(median ${CPU[off]})
  echo
  echo "| copies | reads/s (median) | busiest node / mean (median) | server CPU µs per read | reads per server CPU-second |"
  echo "|---|---|---|---|---|"
  printf '| on (threshold %s/s) | %.0f | %.2fx | %.1f | %.0f |\n' "$HOT" "$on" "$(median ${SHARE[on]})" "$con" "$(python3 -c "print(1e6/$con)")"
  printf '| off | %.0f | %.2fx | %.1f | %.0f |\n' "$off" "$(median ${SHARE[off]})" "$coff" "$(python3 -c "print(1e6/$coff)")"
  python3 -c "import sys; on, off, con, coff = map(float, sys.argv[1:]); print(f'with copies / without: {on/off:.2f}x the reads/s, {coff/con:.2f}x the reads per server CPU-second')" "$on" "$off" "$con" "$coff"
fi

if [[ " $PARTS " == *" incast "* ]]; then
  echo "== incast: $INCAST_CONNS connections fetching one prefix of $INCAST_BLOCKS x $INCAST_BLOCK (MGETPREFIX), ${INCAST_SECS}s, $REPS round(s)"
  declare -A GBS P50 P99 NCPU
  MODES=(single plain aware plain-nocopies)
  for rep in $(seq "$REPS"); do
    for mode in "${MODES[@]}"; do
      aware=()
      case $mode in
        single)
          port=$(free_port)
          "$BIN" --port "$port" --threads "$THREADS" --metrics-addr none --maxmemory "$((MAXMEM_MB / 3))mb" >"$WORK/single.log" 2>&1 &
          PIDS+=($!); wait_up "$port"; target=127.0.0.1:$port ;;
        plain) start_cluster --hot-key-threshold "$HOT"; target=$TARGETS ;;
        aware) start_cluster --hot-key-threshold "$HOT"; target=$TARGETS; aware=(--cluster-aware) ;;
        plain-nocopies) start_cluster --hot-key-threshold 0; target=$TARGETS ;;
      esac
      out=$WORK/incast-$mode-$rep.json
      args=(incast --target "$target" --blocks "$INCAST_BLOCKS" --block-size "$INCAST_BLOCK" --connections "$INCAST_CONNS" "${aware[@]}")
      "$BENCH" "${args[@]}" --duration 2 >"$WORK/incast-warm.log" 2>&1 || { cat "$WORK/incast-warm.log"; exit 1; }
      before=$(node_ticks)
      "$BENCH" "${args[@]}" --duration "$INCAST_SECS" --json "$out" >"$WORK/incast-$mode-$rep.log" 2>&1 \
        || { cat "$WORK/incast-$mode-$rep.log"; exit 1; }
      cores=$(python3 -c "import os,sys; print((int(sys.argv[1]) - int(sys.argv[2])) / os.sysconf('SC_CLK_TCK') / float(sys.argv[3]))" \
        "$(node_ticks)" "$before" "$(json "$out" 'r["seconds"]')")
      GBS[$mode]+=" $(json "$out" 'r["gb_per_sec"]')"
      P50[$mode]+=" $(json "$out" 'r["latency"]["p50_us"]')"
      P99[$mode]+=" $(json "$out" 'r["latency"]["p99_us"]')"
      NCPU[$mode]+=" $cores"
      printf '  round %s %-15s %6.3f GB/s  fetch p50 %7.0f µs p99 %7.0f µs  server cores busy %.2f\n' "$rep" "$mode" \
        "$(json "$out" 'r["gb_per_sec"]')" "$(json "$out" 'r["latency"]["p50_us"]')" "$(json "$out" 'r["latency"]["p99_us"]')" "$cores"
      stop_all
    done
  done
  echo
  echo "| | GB/s (median) | vs one node | fetch p50 µs | fetch p99 µs | server cores busy |"
  echo "|---|---|---|---|---|---|"
  single=$(median ${GBS[single]})
  for mode in "${MODES[@]}"; do
    g=$(median ${GBS[$mode]})
    printf '| %s | %.3f | %.2fx | %.0f | %.0f | %.2f |\n' "$mode" "$g" "$(python3 -c "print($g / $single)")" \
      "$(median ${P50[$mode]})" "$(median ${P99[$mode]})" "$(median ${NCPU[$mode]})"
  done
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
