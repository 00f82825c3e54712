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
# the number of cores), OUT (markdown table file, default: stdout only).
set -euo pipefail

cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SIZES=${SIZES:-"64 4096 65536 262144 1048576"}
PIPELINES=${PIPELINES:-"1 16"}
CLIENTS=${CLIENTS:-50}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-}

for tool in redis-server redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install redis-server redis-tools)"; exit 1; }
done
cargo build --release -q -p kvtier-server
BIN=target/release/kvtier-server

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start_kvtier() { # port threads
  "$BIN" --port "$1" --threads "$2" --metrics-addr none >/dev/null 2>&1 &
  PIDS+=($!)
}
REDIS_PORT=$(free_port); KV1_PORT=$(free_port); KVN_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
PIDS+=($!)
start_kvtier "$KV1_PORT" 1
start_kvtier "$KVN_PORT" "$THREADS"
for port in $REDIS_PORT $KV1_PORT $KVN_PORT; do
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

# requests per run: enough for ~1 s at a few GB/s, bounded for tiny values
requests() { # size pipeline
  local n=$(( 2000000000 / ($1 + 64) ))
  (( n > 400000 )) && n=400000
  (( $2 == 1 && n > 100000 )) && n=100000
  (( n < 2000 )) && n=2000
  echo "$n"
}

# prints "SET_rps GET_rps"
run() { # port size pipeline
  local n; n=$(requests "$2" "$3")
  redis-cli -p "$1" flushall >/dev/null
  redis-benchmark -p "$1" -t set,get -n "$n" -c "$CLIENTS" -P "$3" -d "$2" -q 2>/dev/null \
    | tr '\r' '\n' | awk '/^SET: .*requests per second/ {s=$2} /^GET: .*requests per second/ {g=$2} END {print s+0, g+0}'
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

header="| value | -P | op | redis ops/s | kvtier t=1 ops/s | ratio t=1 | kvtier t=$THREADS ops/s | ratio t=$THREADS | kvtier t=1 GB/s |"
rule="|---|---|---|---|---|---|---|---|---|"
table="$header"$'\n'"$rule"
echo "$header"; echo "$rule"
for size in $SIZES; do
  for pipe in $PIPELINES; do
    declare -A samples=()
    for _ in $(seq "$REPS"); do
      for who in redis kv1 kvn; do
        case $who in redis) port=$REDIS_PORT;; kv1) port=$KV1_PORT;; kvn) port=$KVN_PORT;; esac
        read -r s g < <(run "$port" "$size" "$pipe")
        samples[$who-SET]+="$s "; samples[$who-GET]+="$g "
      done
    done
    for op in SET GET; do
      r=$(echo "${samples[redis-$op]}" | median)
      k1=$(echo "${samples[kv1-$op]}" | median)
      kn=$(echo "${samples[kvn-$op]}" | median)
      row=$(awk -v size="$size" -v p="$pipe" -v op="$op" -v r="$r" -v k1="$k1" -v kn="$kn" 'BEGIN {
        rr = (r > 0) ? k1 / r : 0; rn = (r > 0) ? kn / r : 0;
        printf "| %d | %d | %s | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.2f |", size, p, op, r, k1, rr, kn, rn, k1 * size / 1e9 }')
      echo "$row"
      table+=$'\n'"$row"
    done
    unset samples
  done
done
if [[ -n "$OUT" ]]; then
  { echo "$table"; echo; echo "Command: \`REPS=$REPS SIZES=\"$SIZES\" PIPELINES=\"$PIPELINES\" CLIENTS=$CLIENTS scripts/bench-vs-redis.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores."; } > "$OUT"
  echo "table written to $OUT"
fi
