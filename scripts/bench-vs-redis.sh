#!/usr/bin/env bash
# kvtier vs redis-server, side by side in one run, measured by the same client
# (redis-benchmark). For each cell (value size x pipeline depth x SET/GET) the
# servers are run alternately, REPS times, and the median ops/s is reported
# with the kvtier/Redis ratio. Compare ratios, never absolute numbers across
# runs: the machine is shared and noisy.
#
#   scripts/bench-vs-redis.sh                 # full table
#   REPS=1 SIZES="64 65536" scripts/bench-vs-redis.sh   # quick look
#
# Environment: REPS (3), SIZES ("64 4096 65536 262144 1048576"),
# PIPELINES ("1 16"), CLIENTS (50), THREADS (kvtier default-thread count:
# the number of cores), BENCH_THREADS (redis-benchmark --threads, default 2:
# one client thread saturates near 1.1 GB/s here, before either server does),
# OUT (markdown table file, default: stdout only).
#
# Besides ops/s, each cell reports the server CPU time per request (from
# /proc/PID/stat): an efficiency figure that does not depend on whether the
# client or the server was the limit.
#
# MAXMEMORY=256mb measures under eviction: every server gets that maxmemory
# (kvtier with --maxmemory-policy $POLICY, default prefix; redis-server with
# allkeys-lru) and SETs go to KEYSPACE (default 1000000) random keys, so
# once full, each SET evicts.
#
# BASELINE_BIN=path/to/an/older/kvtier-server adds that build to the
# rotation (t=1 and t=THREADS), with the ratio of this build to it and the
# baseline's own run-to-run spread (max-min over median of its REPS) as the
# noise band; a cell more than 5% worse beyond that band is marked WORSE
# (scripts/bench-before-after.sh builds the baseline from a git revision).
# KV_FLAGS and BASELINE_FLAGS add flags to this build's servers and to the
# baseline's: BASELINE_BIN=target/release/kvtier-server
# BASELINE_FLAGS="--pin-threads no" compares two settings of one build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SIZES=${SIZES:-"64 4096 65536 262144 1048576"}
PIPELINES=${PIPELINES:-"1 16"}
CLIENTS=${CLIENTS:-50}
THREADS=${THREADS:-$(nproc)}
BENCH_THREADS=${BENCH_THREADS:-2}
TARGET_SECS=${TARGET_SECS:-8}
OUT=${OUT:-}

for tool in redis-server redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install redis-server redis-tools)"; exit 1; }
done
cargo build --release -q -p kvtier-server
BIN=target/release/kvtier-server


BASELINE_BIN=${BASELINE_BIN:-}
MAXMEMORY=${MAXMEMORY:-}
POLICY=${POLICY:-prefix}
KEYSPACE=${KEYSPACE:-1000000}
KV_LIMITS=(); REDIS_LIMITS=(); KEYS_ARGS=()
if [[ -n "$MAXMEMORY" ]]; then
  KV_LIMITS=(--maxmemory "$MAXMEMORY" --maxmemory-policy "$POLICY")
  REDIS_LIMITS=(--maxmemory "$MAXMEMORY" --maxmemory-policy allkeys-lru)
  KEYS_ARGS=(-r "$KEYSPACE")
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

read -r -a KV_EXTRA <<<"${KV_FLAGS:-}"
read -r -a BASE_EXTRA <<<"${BASELINE_FLAGS:-}"
start_kvtier() { # port threads [binary flags...]
  local port=$1 threads=$2 bin=${3:-$BIN}
  shift $(( $# < 3 ? $# : 3 ))
  "$bin" --port "$port" --threads "$threads" --metrics-addr none "${KV_LIMITS[@]}" "$@" >/dev/null 2>&1 &
  PIDS+=($!)
}
REDIS_PORT=$(free_port); KV1_PORT=$(free_port); KVN_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no --daemonize no "${REDIS_LIMITS[@]}" >/dev/null 2>&1 &
PIDS+=($!); REDIS_PID=$!
start_kvtier "$KV1_PORT" 1 "$BIN" "${KV_EXTRA[@]}"; KV1_PID=${PIDS[-1]}
start_kvtier "$KVN_PORT" "$THREADS" "$BIN" "${KV_EXTRA[@]}"; KVN_PID=${PIDS[-1]}
SERVERS="redis kv1 kvn"
PORTS="$REDIS_PORT $KV1_PORT $KVN_PORT"
if [[ -n "$BASELINE_BIN" ]]; then
  BASE1_PORT=$(free_port); BASEN_PORT=$(free_port)
  start_kvtier "$BASE1_PORT" 1 "$BASELINE_BIN" "${BASE_EXTRA[@]}"; BASE1_PID=${PIDS[-1]}
  start_kvtier "$BASEN_PORT" "$THREADS" "$BASELINE_BIN" "${BASE_EXTRA[@]}"; BASEN_PID=${PIDS[-1]}
  SERVERS+=" base1 basen"
  PORTS+=" $BASE1_PORT $BASEN_PORT"
fi
for port in $PORTS; do
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

# requests of a calibration run (an eighth of this); the measured runs then
# take about TARGET_SECS (8) at the rate found. With --threads,
# redis-benchmark ends a run on its 250 ms timer tick, so a run of 1.5 s is
# measured to within 17% and one of 8 s to within 3%.
requests() { # size pipeline
  local cap=1000000
  (( $2 > 1 )) && cap=10000000
  local n=$(( 20000000000 / ($1 + 64) ))
  (( n > cap )) && n=$cap
  (( n < 2000 )) && n=2000
  echo "$n"
}

HZ=$(getconf CLK_TCK)

# one redis-benchmark run: prints its requests per second
rate() { # port op n size pipeline
  local op_upper
  op_upper=$(echo "$2" | tr '[:lower:]' '[:upper:]')
  redis-benchmark -p "$1" -t "$2" -n "$3" -c "$CLIENTS" -P "$5" -d "$4" -q --threads "$BENCH_THREADS" "${KEYS_ARGS[@]}" 2>/dev/null \
    | tr '\r' '\n' | awk -v op="$op_upper" '$1 == op":" && /requests per second/ {print $2}'
}

# requests for about TARGET_SECS at this cell's rate, from a short
# calibration run (the 250 ms tick makes only long runs exact)
calibrated() { # port op size pipeline
  local n r
  n=$(( $(requests "$3" "$4") / 8 ))
  (( n < 2000 )) && n=2000
  r=$(rate "$1" "$2" "$n" "$3" "$4")
  awk -v r="${r:-0}" -v n="$n" -v t="$TARGET_SECS" 'BEGIN {m = int(r * t); print (m > n) ? m : n}'
}

# prints "SET_rps GET_rps SET_cpu_us_per_op GET_cpu_us_per_op"
run() { # port pid size pipeline
  local ns ng t0 t1 t1b t2 s g
  redis-cli -p "$1" flushall >/dev/null
  ns=$(calibrated "$1" set "$3" "$4")
  t0=$(ticks "$2")
  s=$(rate "$1" set "$ns" "$3" "$4")
  t1=$(ticks "$2")
  ng=$(calibrated "$1" get "$3" "$4")
  t1b=$(ticks "$2")
  g=$(rate "$1" get "$ng" "$3" "$4")
  t2=$(ticks "$2")
  awk -v s="${s:-0}" -v g="${g:-0}" -v a="$((t1 - t0))" -v b="$((t2 - t1b))" -v ns="$ns" -v ng="$ng" -v hz="$HZ" \
    'BEGIN {printf "%s %s %.3f %.3f\n", s, g, a * 1e6 / hz / ns, b * 1e6 / hz / ng}'
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# (max - min) / median of the samples: how much one server varies here
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; print (m > 0) ? (a[NR] - a[1]) / m : 0}'; }

header="| value | -P | op | redis ops/s | kvtier t=1 ops/s | ratio t=1 | kvtier t=$THREADS ops/s | ratio t=$THREADS | kvtier t=1 GB/s | CPU µs/op redis | CPU µs/op kvtier t=1 | CPU redis/kvtier |"
rule="|---|---|---|---|---|---|---|---|---|---|---|---|"
if [[ -n "$BASELINE_BIN" ]]; then
  header+=" base t=1 ops/s | new/base t=1 | base t=$THREADS ops/s | new/base t=$THREADS | base noise t=1 / t=$THREADS | |"
  rule+="---|---|---|---|---|---|"
fi
table="$header"$'\n'"$rule"
echo "$header"; echo "$rule"
for size in $SIZES; do
  for pipe in $PIPELINES; do
    declare -A samples=()
    read -ra order <<<"$SERVERS"
    for rep in $(seq "$REPS"); do
      # Each rep starts with the next server, so no server always runs first.
      for j in "${!order[@]}"; do
        who=${order[$(((j + rep) % ${#order[@]}))]}
        case $who in
          redis) port=$REDIS_PORT; pid=$REDIS_PID;;
          kv1) port=$KV1_PORT; pid=$KV1_PID;;
          kvn) port=$KVN_PORT; pid=$KVN_PID;;
          base1) port=$BASE1_PORT; pid=$BASE1_PID;;
          basen) port=$BASEN_PORT; pid=$BASEN_PID;;
        esac
        read -r s g cs cg < <(run "$port" "$pid" "$size" "$pipe")
        samples[$who-SET]+="$s "; samples[$who-GET]+="$g "
        samples[$who-SETcpu]+="$cs "; samples[$who-GETcpu]+="$cg "
      done
    done
    for op in SET GET; do
      r=$(echo "${samples[redis-$op]}" | median)
      k1=$(echo "${samples[kv1-$op]}" | median)
      kn=$(echo "${samples[kvn-$op]}" | median)
      rc=$(echo "${samples[redis-${op}cpu]}" | median)
      kc=$(echo "${samples[kv1-${op}cpu]}" | median)
      row=$(awk -v size="$size" -v p="$pipe" -v op="$op" -v r="$r" -v k1="$k1" -v kn="$kn" -v rc="$rc" -v kc="$kc" 'BEGIN {
        rr = (r > 0) ? k1 / r : 0; rn = (r > 0) ? kn / r : 0; cr = (kc > 0) ? rc / kc : 0;
        printf "| %d | %d | %s | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.2f | %.2f | %.2f | %.2fx |", size, p, op, r, k1, rr, kn, rn, k1 * size / 1e9, rc, kc, cr }')
      if [[ -n "$BASELINE_BIN" ]]; then
        b1=$(echo "${samples[base1-$op]}" | median)
        bn=$(echo "${samples[basen-$op]}" | median)
        n1=$(echo "${samples[base1-$op]}" | spread)
        nn=$(echo "${samples[basen-$op]}" | spread)
        row+=$(awk -v k1="$k1" -v kn="$kn" -v b1="$b1" -v bn="$bn" -v n1="$n1" -v nn="$nn" 'BEGIN {
          r1 = (b1 > 0) ? k1 / b1 : 0; rn = (bn > 0) ? kn / bn : 0;
          worse = (r1 < 0.95 - n1 || rn < 0.95 - nn) ? "WORSE" : "ok";
          printf " %.0f | %.3fx | %.0f | %.3fx | ±%.0f%% / ±%.0f%% | %s |", b1, r1, bn, rn, n1 * 50, nn * 50, worse }')
      fi
      echo "$row"
      table+=$'\n'"$row"
    done
    unset samples
  done
done
if [[ -n "$OUT" ]]; then
  { echo "$table"; echo; echo "Command: \`${BASELINE_BIN:+BASELINE_BIN=$BASELINE_BIN }${MAXMEMORY:+MAXMEMORY=$MAXMEMORY POLICY=$POLICY KEYSPACE=$KEYSPACE }REPS=$REPS SIZES=\"$SIZES\" PIPELINES=\"$PIPELINES\" CLIENTS=$CLIENTS BENCH_THREADS=$BENCH_THREADS scripts/bench-vs-redis.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores."; } > "$OUT"
  echo "table written to $OUT"
fi
