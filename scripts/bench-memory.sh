#!/usr/bin/env bash
# Memory efficiency: load the same payload (default 2 GiB) of fixed-size
# values into kvtier and into redis-server, one value size at a time, and
# report process RSS / payload bytes and the servers' own used_memory /
# payload. Both are loaded by the same client (kvtier-bench kv --prefill).
#
#   scripts/bench-memory.sh                        # 64 KiB, 256 KiB, 2 MiB
#   PAYLOAD_MB=512 SIZES="65536" scripts/bench-memory.sh
#
# Environment: PAYLOAD_MB (2048), SIZES ("65536 262144 2097152"), THREADS
# (kvtier shards, default: cores), OUT (markdown table file).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PAYLOAD_MB=${PAYLOAD_MB:-2048}
SIZES=${SIZES:-"65536 262144 2097152"}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-}
command -v redis-server >/dev/null || { echo "missing redis-server (apt-get install redis-server)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
PID=""
trap '[[ -n "$PID" ]] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true' EXIT

rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$1/status"; }
info_field() { redis-cli -p "$1" info memory | tr -d '\r' | awk -F: -v f="$2" '$1 == f {print $2}'; }

measure() { # server size -> "rss used_memory"
  local who=$1 size=$2 port keys
  port=$(free_port)
  if [[ $who == kvtier ]]; then
    target/release/kvtier-server --port "$port" --threads "$THREADS" --metrics-addr none >/dev/null 2>&1 &
  else
    redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
  fi
  PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  keys=$(( PAYLOAD_MB * 1024 * 1024 / size ))
  target/release/kvtier-bench kv --target "127.0.0.1:$port" --keys "$keys" --value-size "$size" \
    --prefill --ratio 0:1 --requests 1 --connections 8 >/dev/null
  sleep 1
  echo "$(rss "$PID") $(info_field "$port" used_memory)"
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
}

header="| value size | payload | redis RSS/payload | kvtier RSS/payload | redis used_memory/payload | kvtier used_memory/payload |"
rule="|---|---|---|---|---|---|"
table="$header"$'\n'"$rule"
echo "$header"; echo "$rule"
for size in $SIZES; do
  payload=$(( PAYLOAD_MB * 1024 * 1024 / size * size ))
  read -r r_rss r_used < <(measure redis "$size")
  read -r k_rss k_used < <(measure kvtier "$size")
  row=$(awk -v s="$size" -v p="$payload" -v rr="$r_rss" -v ru="$r_used" -v kr="$k_rss" -v ku="$k_used" 'BEGIN {
    printf "| %d KiB | %.0f MiB | %.3f | %.3f | %.3f | %.3f |", s / 1024, p / 1048576, rr / p, kr / p, ru / p, ku / p }')
  echo "$row"
  table+=$'\n'"$row"
done
if [[ -n "$OUT" ]]; then
  { echo "$table"; echo; echo "Command: \`PAYLOAD_MB=$PAYLOAD_MB SIZES=\"$SIZES\" scripts/bench-memory.sh\` on $(date -u +%Y-%m-%d), kvtier --threads $THREADS."; } > "$OUT"
fi
