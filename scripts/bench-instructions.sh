#!/usr/bin/env bash
# CPU per request, counted not timed: valgrind's callgrind counts the
# instructions a server executes for a fixed workload (repeatable whatever
# else the machine is doing), minus what the same server executes for no
# workload, divided by the requests. One client, no pipelining.
#
#   scripts/bench-instructions.sh                    # kvtier --threads 1 and 2, redis-server
#   BASELINE_BIN=target/baseline/target/release/kvtier-server scripts/bench-instructions.sh
#
# For kvtier rows marked "tasks" only the connection tasks and the shard
# mailboxes are counted (callgrind --toggle-collect), so the cron (expiry,
# metrics) does not depend on how long the run took under valgrind; rows
# marked "process" count the whole process (event loop, scheduler, cron at
# --hz 1) as redis-server's row does: that is the like-for-like figure. The
# top functions of each server's GET run (self cost) follow the table. With --threads 2
# a single-key command costs a cross-shard hop or not depending on which
# shard accepted the connection: that column is for the multi-key dialect.
# Environment: N (2000 requests per multi-key cell, 10x for single keys),
# VALUE (bytes per block, default 2048).
#
# TENANTS=1 adds this build with two tenants named (`--tenant`, the
# workload's keys matching the second pattern) to either table, counted
# only and with shares (eviction per tenant).
#
# EVICTION=1 counts writes under eviction instead: SET, MSETBLOCK and MSETBLOCK
# CHAIN (a one-block chain write, which the `prefix` classes see) of one
# 4 KiB value to random keys on a server (--threads 1, whole process) with
# 32 MiB of maxmemory already full, so each write evicts, under `prefix`
# and `allkeys-lru`, for this build and BASELINE_BIN (an older policy).
# CHAIN64=1 adds a column: a 64-block chain write (MSETBLOCK 64 ... CHAIN,
# N writes) on --threads 2, where a chain's blocks fall at random on the
# two shards and each change of shard sends link events across.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
for tool in valgrind redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install valgrind redis-tools)"; exit 1; }
done
cargo build --release -q -p kvtier-server
# The build just made (CARGO_TARGET_DIR honoured, as cargo does).
BIN=${CARGO_TARGET_DIR:-target}/release/kvtier-server
N=${N:-2000}
# Idle polling (--idle-poll-us) spends instructions waiting for the next
# request, as many as the wall clock allows: off here, so the count is the
# request's own work. Builds older than the flag run without it.
poll_off() {
  local help; help=$("$1" --help 2>&1 || true)
  if [[ $help == *idle-poll-us* ]]; then echo "--idle-poll-us 0"; fi
}
VALUE=${VALUE:-2048}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

KEYS=$(for i in $(seq 0 63); do printf "blk:%04d " "$i"; done)
BLOCK=$(head -c "$VALUE" /dev/zero | tr '\0' 'x')

# counted OUT PORT REQUESTS VALGRIND_ARGS... -> total instructions: starts
# a server on PORT under callgrind (its command line after the callgrind
# options), runs the function REQUESTS against it once it answers, shuts it
# down and reads the total from OUT. REQUESTS sees its caller's locals.
counted() {
  local out=$1 port=$2 requests=$3 pid
  shift 3
  valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  "$requests" "$port"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" 2>/dev/null || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}

# per_op TOTAL BASE N -> instructions per request
per_op() { awk -v t="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.0f", (t - b) / n}'; }

# single_requests PORT: the 64 keys, then $work ($kind: which server)
single_requests() {
  local port=$1 args=()
  for k in $KEYS; do args+=("$k" "$BLOCK"); done
  if [[ $kind == kvtier* ]]; then
    redis-cli -p "$port" msetblock 64 "${args[@]}" chain >/dev/null
  else
    redis-cli -p "$port" mset "${args[@]}" >/dev/null
  fi
  # shellcheck disable=SC2086
  case $work in
    none) ;;
    get|set) redis-benchmark -p "$port" -n $((N * 10)) -c 1 -t "$work" -d 64 >/dev/null 2>&1 ;;
    prefixlen) redis-benchmark -p "$port" -n "$N" -c 1 prefixlen 64 $KEYS >/dev/null 2>&1 ;;
    mgetprefix) redis-benchmark -p "$port" -n "$N" -c 1 mgetprefix 64 $KEYS >/dev/null 2>&1 ;;
    exists1) redis-benchmark -p "$port" -n "$N" -c 1 exists blk:0000 >/dev/null 2>&1 ;;
    mget) redis-benchmark -p "$port" -n "$N" -c 1 mget $KEYS >/dev/null 2>&1 ;;
  esac
}

# instructions SERVER_KIND BIN THREADS WORKLOAD -> total instructions
instructions() {
  local kind=$1 bin=$2 threads=$3 work=$4 port out total
  port=$(free_port); out=$WORK/cg.$port
  local POLL; POLL=$(poll_off "$bin")
  # shellcheck disable=SC2086
  if [[ $kind == kvtier ]]; then
    total=$(counted "$out" "$port" single_requests \
      --toggle-collect='*connection::accept*' --toggle-collect='*run_mailbox*' \
      "$bin" --port "$port" --threads "$threads" --metrics-addr none $POLL $EXTRA)
  elif [[ $kind == kvtier-process ]]; then
    total=$(counted "$out" "$port" single_requests \
      "$bin" --port "$port" --threads "$threads" --metrics-addr none --hz 1 $POLL $EXTRA)
  else
    total=$(counted "$out" "$port" single_requests \
      redis-server --port "$port" --save '' --appendonly no)
  fi
  cp "$out" "$WORK/last.$kind.$threads.$work"
  echo "$total"
}

# per_request KIND BIN THREADS WORKLOAD REQUESTS
per_request() {
  local base total
  base=$(instructions "$1" "$2" "$3" none)
  total=$(instructions "$1" "$2" "$3" "$4")
  per_op "$total" "$base" "$5"
}

# evicting_requests PORT: 80 MiB of writes into 32 MiB (full, and evicting,
# before the count), then $work
evicting_requests() {
  local port=$1 value
  value=$(head -c 4096 /dev/zero | tr '\0' v)
  redis-benchmark -p "$port" -n 20000 -c 1 -P 16 -r 1000000 SET key:__rand_int__ "$value" >/dev/null 2>&1
  writes() { redis-benchmark -p "$port" -n $((N * 5)) -c 1 -r 1000000 "$@" >/dev/null 2>&1; }
  case $work in
    none) ;;
    set) writes SET key:__rand_int__ "$value" ;;
    msetblock) writes MSETBLOCK 1 key:__rand_int__ "$value" ;;
    chain) writes MSETBLOCK 1 key:__rand_int__ "$value" CHAIN ;;
    chain64)
      local args=(MSETBLOCK 64)
      for _ in $(seq 64); do args+=(key:__rand_int__ "$value"); done
      redis-benchmark -p "$port" -n "$N" -c 1 -r 100000000 "${args[@]}" CHAIN >/dev/null 2>&1 ;;
  esac
}

# evicting BIN POLICY WORKLOAD [THREADS] -> total instructions (see EVICTION above)
evicting() {
  local bin=$1 policy=$2 work=$3 threads=${4:-1} port
  port=$(free_port)
  local POLL; POLL=$(poll_off "$bin")
  # shellcheck disable=SC2086
  counted "$WORK/ev.$port" "$port" evicting_requests "$bin" --port "$port" --threads "$threads" \
    --metrics-addr none --hz 1 $POLL $EXTRA --maxmemory 32mb --maxmemory-policy "$policy"
}

# TENANTS=1: rows of this build with two tenants named, whose patterns the
# workload's keys match (the second one: two prefix tests per key).
TENANT_FLAGS="--tenant name=blocks,keys=blk:* --tenant name=strings,keys=key:*"
SHARE_FLAGS="--tenant name=blocks,keys=blk:*,share=30% --tenant name=strings,keys=key:*,share=60%"
EXTRA=""
if [[ ${EVICTION:-0} == 1 ]]; then
  builds=("this build|$BIN")
  [[ ${TENANTS:-0} == 1 ]] && builds+=("this build, 2 tenants|$BIN|$TENANT_FLAGS"
                                      "this build, 2 tenants with shares|$BIN|$SHARE_FLAGS")
  [[ -n "${BASELINE_BIN:-}" ]] && builds+=("baseline|$BASELINE_BIN")
  echo "instructions per write under eviction (callgrind, --threads 1 unless marked t=2, whole process, 4 KiB values, maxmemory 32mb full)"
  chain64=${CHAIN64:-0}
  if [[ $chain64 == 1 ]]; then
    echo "| build | policy | SET | MSETBLOCK 1 | MSETBLOCK 1 CHAIN | MSETBLOCK 64 CHAIN, t=2 |"
    echo "|---|---|---|---|---|---|"
  else
    echo "| build | policy | SET | MSETBLOCK 1 | MSETBLOCK 1 CHAIN |"
    echo "|---|---|---|---|---|"
  fi
  for b in "${builds[@]}"; do
    IFS='|' read -r name bin EXTRA <<<"$b"
    for policy in prefix allkeys-lru; do
      base=$(evicting "$bin" "$policy" none)
      row="| $name | $policy |"
      for work in set msetblock chain; do
        total=$(evicting "$bin" "$policy" "$work")
        row+=" $(per_op "$total" "$base" $((N * 5))) |"
      done
      if [[ $chain64 == 1 ]]; then
        base=$(evicting "$bin" "$policy" none 2)
        total=$(evicting "$bin" "$policy" chain64 2)
        row+=" $(per_op "$total" "$base" "$N") |"
      fi
      echo "$row"
    done
  done
  exit 0
fi

servers=("kvtier t=1 tasks|kvtier|$BIN|1" "kvtier t=2 tasks|kvtier|$BIN|2"
  "kvtier t=1 process|kvtier-process|$BIN|1" "kvtier t=2 process|kvtier-process|$BIN|2")
if [[ ${TENANTS:-0} == 1 ]]; then
  servers+=("kvtier t=1 tasks, 2 tenants|kvtier|$BIN|1|$TENANT_FLAGS"
            "kvtier t=1 tasks, 2 tenants with shares|kvtier|$BIN|1|$SHARE_FLAGS")
fi
if [[ -n "${BASELINE_BIN:-}" ]]; then
  servers+=("baseline t=1|kvtier|$BASELINE_BIN|1" "baseline t=2|kvtier|$BASELINE_BIN|2")
fi
servers+=("redis-server|redis|redis-server|1")

echo "instructions per request (callgrind), one client, values of $VALUE bytes, 64-key commands over a 64-block chain"
header="| server | GET 64 B | SET 64 B | PREFIXLEN 64 | MGETPREFIX 64 |"
echo "$header"; echo "|---|---|---|---|---|"
for s in "${servers[@]}"; do
  IFS='|' read -r name kind bin threads EXTRA <<<"$s"
  g=$(per_request "$kind" "$bin" "$threads" get $((N * 10)))
  st=$(per_request "$kind" "$bin" "$threads" set $((N * 10)))
  if [[ $kind == kvtier* ]]; then
    p=$(per_request "$kind" "$bin" "$threads" prefixlen "$N")
    m=$(per_request "$kind" "$bin" "$threads" mgetprefix "$N")
  else
    # Redis's nearest: EXISTS of one key (a lookup is 64 of them) and MGET.
    p="$(per_request "$kind" "$bin" "$threads" exists1 "$N") per EXISTS"
    m="$(per_request "$kind" "$bin" "$threads" mget "$N") (MGET)"
  fi
  echo "| $name | $g | $st | $p | $m |"
done

for run in kvtier-process.1.get redis.1.get; do
  echo
  echo "top functions by instructions (self), $run, $((N * 10)) GETs:"
  callgrind_annotate --inclusive=no "$WORK/last.$run" 2>/dev/null \
    | awk '/^-+$/ {n++; next} n >= 3 && NF >= 2 {print} ' | head -15 || true
done
