#!/usr/bin/env bash
# One tier shared by two tenants (the measure of issue 41): tenant B replays
# a conversation-shaped trace (bench/gen_traces.py conversation) under keys
# `b@...`; tenant A writes unique prompts that are never read again, under
# `a@...`, at FLOOD times B's byte rate. A's writes go out on B's own
# connection after each of B's requests (kvtier-bench trace --flood-ratio),
# so the ratio holds exactly, whatever the timing, and the replay is in
# order (concurrency 1): the figures do not depend on the machine's speed.
# B's trace has twice the tier's bytes of unique blocks.
#
# Prints B's block hit rate
#   - alone, in a tier of its guaranteed size (TIER/2),
#   - alone, in the whole tier,
#   - with A flooding the whole tier: kvtier with tenants, B guaranteed
#     half (`--tenant name=b,keys=b@*,share=50%`: the unnamed keys' half,
#     unused, is lent to A and B alike), the same with A given the other
#     half (nothing to lend), kvtier with one pool (no tenants), and
#     redis-server (allkeys-lru) for reference,
#   - with A idle, kvtier with the same tenants (B may use A's half),
# and the ratios the issue judges: B's hit rate under the flood over its
# rate alone in its guaranteed half (goal: >= 0.95), and with A idle
# against the whole tier's (goal: within 0.01).
#
#   scripts/bench-tenants.sh
#   TIER_MB=512 REQUESTS=3000 FLOOD=10 scripts/bench-tenants.sh
#
# Environment: TIER_MB (1024), REQUESTS (6000, of B's trace), SEED (1),
# FLOOD (10), THREADS ($(nproc)), REDIS (1: also redis-server), OUT (a file
# for the table).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
TIER_MB=${TIER_MB:-1024}
REQUESTS=${REQUESTS:-6000}
SEED=${SEED:-1}
FLOOD=${FLOOD:-10}
THREADS=${THREADS:-$(nproc)}
REDIS=${REDIS:-1}
OUT=${OUT:-}
bench_setup tenants

python3 bench/gen_traces.py conversation --requests "$REQUESTS" --seed "$SEED" -o "$WORK/b.jsonl" >/dev/null
unique=$(trace_unique_blocks "$WORK/b.jsonl")
tier=$(( TIER_MB << 20 ))
# B's unique blocks take twice the tier: its half is a quarter of them.
block=$(( 2 * tier / unique / 4096 * 4096 ))
(( block >= 4096 )) || block=4096

TENANTS=(--tenant 'name=a,keys=a@*' --tenant 'name=b,keys=b@*,share=50%')
HALVES=(--tenant 'name=a,keys=a@*,share=50%' --tenant 'name=b,keys=b@*,share=50%')

# replay SERVER MAXMEMORY FLOOD [SERVER FLAGS...] -> "B's hit rate, A's bytes / B's bytes"
replay() {
  local port protocol=dialect; port=$(free_port)
  if [[ $1 == redis ]]; then
    protocol=redis-pipelined
    redis-server --port "$port" --save '' --appendonly no --maxmemory "$2" \
      --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
  else
    "$BIN" --port "$port" --threads "$THREADS" --metrics-addr none \
      --maxmemory "$2" "${@:4}" >/dev/null 2>&1 &
  fi
  PIDS+=($!)
  wait_up "$port"
  "$BENCH" trace "$WORK/b.jsonl" --target "127.0.0.1:$port" --block-bytes "$block" \
    --protocol "$protocol" --concurrency 1 --key-prefix b@ --flood-ratio "$3" --flood-prefix a@ \
    --json "$WORK/run.json" >/dev/null
  stop_all
  json "$WORK/run.json" "'%.4f %.2f' % (r['block_hit_rate'], r['flood_bytes_written'] / max(1, r['bytes_written']))"
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, kvtier $(git rev-parse --short HEAD)"
echo "# command: TIER_MB=$TIER_MB REQUESTS=$REQUESTS SEED=$SEED FLOOD=$FLOOD scripts/bench-tenants.sh"
echo "# B: $REQUESTS requests of a conversation trace, $unique unique blocks of $block bytes ($(( unique * block >> 20 )) MiB); tier $TIER_MB MiB"
read -r half _ < <(replay kvtier $(( tier / 2 )) 0)
read -r whole _ < <(replay kvtier "$tier" 0)
read -r idle _ < <(replay kvtier "$tier" 0 "${TENANTS[@]}")
read -r shared ratio < <(replay kvtier "$tier" "$FLOOD" "${TENANTS[@]}")
read -r halves _ < <(replay kvtier "$tier" "$FLOOD" "${HALVES[@]}")
read -r pooled _ < <(replay kvtier "$tier" "$FLOOD")
over_half() { python3 -c "print('%.2f' % ($1 / $half))"; }
rows=("| B alone, guaranteed half ($(( TIER_MB / 2 )) MiB) | $half | 1.00 |"
      "| B alone, whole tier ($TIER_MB MiB) | $whole | $(over_half "$whole") |"
      "| B with A idle, kvtier tenants (B share 50%) | $idle | $(over_half "$idle") |"
      "| B with A flooding at ${ratio}x, kvtier tenants (B share 50%) | $shared | $(over_half "$shared") |"
      "| B with A flooding at ${ratio}x, kvtier tenants (A and B 50% each) | $halves | $(over_half "$halves") |"
      "| B with A flooding at ${ratio}x, kvtier one pool | $pooled | $(over_half "$pooled") |")
if [[ $REDIS == 1 ]]; then
  read -r rpooled rratio < <(replay redis "$tier" "$FLOOD")
  rows+=("| B with A flooding at ${rratio}x, redis-server allkeys-lru | $rpooled | $(over_half "$rpooled") |")
fi
table="| case | B's block hit rate | over B alone in its half |"$'\n'"|---|---|---|"
for r in "${rows[@]}"; do table+=$'\n'"$r"; done
echo "$table"
echo "goal with tenants (B guaranteed half): under the flood >= 0.95 of B alone in its half; with A idle, B's rate within 0.01 of the whole tier's"
python3 -c "print('measured: under the flood %.3f of B alone in its half (%.3f with nothing to lend); with A idle %+.4f from the whole tier' % ($shared / $half, $halves / $half, $idle - $whole))"
[[ -n $OUT ]] && echo "$table" > "$OUT"
exit 0
