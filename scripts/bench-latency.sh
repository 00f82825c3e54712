#!/usr/bin/env bash
# One client's round trip, in one run: redis-server and kvtier in each
# configuration (shard count × pinning, and the defaults) started side by
# side and measured by the same blocking client (kvtier-bench latency),
# targets alternated round by round, with the client unpinned and then
# pinned to each core in turn.
#   CLIENT_CPUS="all 0 1"   where the client runs ("all": unpinned)
#   CONFIGS="..."           kvtier configurations, NAME:FLAGS (FLAGS with
#                           commas for spaces), default below
#   BASELINE_BIN=path      an older kvtier-server build, run with its
#                           defaults as target "kvtier-base"
#   BASELINE_FLAGS=...      flags for it (commas for spaces), e.g. the
#                           --maxmemory of the configurations compared
# Extra arguments go to `kvtier-bench latency` (e.g. --rounds 3 --ops get).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "missing redis-server (apt-get install redis-server)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
CLIENT_CPUS=${CLIENT_CPUS:-"all 0 1"}
CONFIGS=${CONFIGS:-"kvtier-default: kvtier-t2-pin-nopoll:--threads,2,--pin-threads,yes,--idle-poll-us,0 kvtier-t2-nopin-nopoll:--threads,2,--pin-threads,no,--idle-poll-us,0 kvtier-t2-nopin-poll:--threads,2,--pin-threads,no kvtier-t1-pin-nopoll:--threads,1,--pin-threads,yes,--idle-poll-us,0 kvtier-t1-nopin-poll:--threads,1,--pin-threads,no"}
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
RD=$(free_port)
redis-server --port "$RD" --save '' --appendonly no >/dev/null 2>&1 & PIDS+=($!)
TARGETS=(--target "redis=127.0.0.1:$RD")
PORTS="$RD"
for c in $CONFIGS; do
  name=${c%%:*}; flags=${c#*:}
  port=$(free_port)
  # shellcheck disable=SC2086
  target/release/kvtier-server --port "$port" --metrics-addr none ${flags//,/ } >/dev/null 2>&1 & PIDS+=($!)
  TARGETS+=(--target "$name=127.0.0.1:$port")
  PORTS+=" $port"
done
if [[ -n "${BASELINE_BIN:-}" ]]; then
  port=$(free_port)
  bflags=${BASELINE_FLAGS:-}
  # shellcheck disable=SC2086
  "$BASELINE_BIN" --port "$port" --metrics-addr none ${bflags//,/ } >/dev/null 2>&1 & PIDS+=($!)
  TARGETS+=(--target "kvtier-base=127.0.0.1:$port")
  PORTS+=" $port"
fi
for port in $PORTS; do
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
# cpu_report PORT: server CPU seconds, commands and idle polling so far
cpu_report() {
  redis-cli -p "$1" info 2>/dev/null | tr -d '\r' | awk -F: '
    $1 == "used_cpu_user" || $1 == "used_cpu_sys" {cpu += $2}
    $1 == "total_commands_processed" {n = $2}
    $1 == "idle_poll_us" {poll = $2}
    $1 == "idle_poll_hits" {hits = $2}
    END {printf "%.3f %d %d %d\n", cpu, n, poll, hits}'
}
for cpu in $CLIENT_CPUS; do
  declare -A BEFORE=()
  for port in $PORTS; do BEFORE[$port]=$(cpu_report "$port"); done
  echo "## client on CPU: $cpu"
  if [[ "$cpu" == all ]]; then
    target/release/kvtier-bench latency "${TARGETS[@]}" "$@"
  else
    taskset -c "$cpu" target/release/kvtier-bench latency "${TARGETS[@]}" "$@"
  fi
  echo
  echo "server CPU over this run (INFO used_cpu_user + used_cpu_sys; idle polling from INFO idle_poll_us):"
  echo "| target | CPU µs per command | polling µs per command | requests caught polling |"
  echo "|---|---|---|---|"
  i=0
  for t in "${TARGETS[@]}"; do
    [[ $t == --target ]] && continue
    name=${t%%=*}; port=${t##*:}
    read -r c0 n0 p0 h0 <<<"${BEFORE[$port]}"
    read -r c1 n1 p1 h1 <<<"$(cpu_report "$port")"
    awk -v name="$name" -v c="$(awk -v a="$c0" -v b="$c1" 'BEGIN {print b - a}')" -v n=$((n1 - n0)) -v p=$((p1 - p0)) -v h=$((h1 - h0)) \
      'BEGIN {n = (n > 0) ? n : 1; printf "| %s | %.1f | %.1f | %.0f%% |\n", name, c * 1e6 / n, p / n, 100 * h / n}'
    i=$((i + 1))
  done
  echo
done
