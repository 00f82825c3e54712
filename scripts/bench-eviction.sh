#!/usr/bin/env bash
# The eviction policy study, reproducible: hit rates of the store's policies
# against exact LRU, prefix-aware LRU and Belady's MIN on the standard traces
# (docs/traces.md) and the Mooncake synthetic trace, from `kvtier-bench sim`
# (the store's own eviction code, no server); the default confirmed through
# a real server with `kvtier-bench trace`; and DRAM+disk against DRAM-only.
#
#   scripts/bench-eviction.sh                     # all three parts
#   PARTS="sim" TRACES="synthetic conv-1" scripts/bench-eviction.sh
#
# Environment: PARTS ("sim confirm spill cost"; cost needs BASELINE_BIN; "seeds": the
# calibrated chat shapes generated again with SEEDS ("11 12 13 14") and the share of
# the gap SEED_POLICIES (prefix,mq) close on each, with the mean), TRACE_DIR (/tmp/kvtier-traces,
# generated there when missing), TRACES (the ten of docs/traces.md), CAPACITIES
# ("0.05,0.1,0.25"), POLICIES (prefix,allkeys-lru,allkeys-lfu plus the
# references), SIM_BLOCK (1MiB), CONFIRM_CAP (0.1), REPLAY_BLOCK (64KiB:
# the server replays move every byte), THREADS (nproc), SPILL_TRACES
# ("conv-1 synthetic chat-1"), SPILL_DISK (1: the spill tier's size in DRAMs), BASELINE_BIN (an older kvtier-server: its `prefix`
# replayed beside this build's in the confirm part, and the cost part's
# baseline), REPS (5), COST_SECS (5), COST_MEM (256mb), COST_THREADS
# ("1 THREADS": the servers' --threads), COST_CMDS ("SET MSETBLOCK
# CHAIN64"; SETFIT is the control: SETs to 40k keys, which fit) and
# COST_POLICIES ("prefix allkeys-lru") for the cost part, OUT (markdown
# file).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"sim confirm spill cost"}
TRACE_DIR=${TRACE_DIR:-/tmp/kvtier-traces}
TRACES=${TRACES:-"synthetic conv-1 conv-2 sys-1 agent-1 rag-1 mix-1 chat-1 chat-2 chat-3"}
CAPACITIES=${CAPACITIES:-0.05,0.1,0.25}
POLICIES=${POLICIES:-prefix,allkeys-lru,allkeys-lfu,lru,prefix-lru,belady}
SIM_BLOCK=${SIM_BLOCK:-1MiB}
CONFIRM_CAP=${CONFIRM_CAP:-0.1}
REPLAY_BLOCK=${REPLAY_BLOCK:-64KiB}
THREADS=${THREADS:-$(nproc)}
SPILL_TRACES=${SPILL_TRACES:-"conv-1 synthetic chat-1"}
SEEDS=${SEEDS:-"11 12 13 14"}
SEED_POLICIES=${SEED_POLICIES:-prefix,mq}
SPILL_DISK=${SPILL_DISK:-1}
BASELINE_BIN=${BASELINE_BIN:-}
OUT=${OUT:-}
command -v redis-cli >/dev/null || { echo "missing redis-cli (apt-get install redis-tools)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
BENCH=target/release/kvtier-bench
for t in $TRACES $SPILL_TRACES; do
  if [[ $t != synthetic && ! -f $TRACE_DIR/$t.jsonl ]]; then
    python3 bench/gen_traces.py standard --out-dir "$TRACE_DIR" --only "$t" >/dev/null
  fi
done
[[ -f $TRACE_DIR/synthetic.jsonl ]] || cp bench/traces/mooncake_synthetic_trace.jsonl "$TRACE_DIR/synthetic.jsonl"
PID=""; TMP=$(mktemp -d)
COST_PIDS=()
trap '[[ -n "$PID" ]] && kill "$PID" 2>/dev/null; kill "${COST_PIDS[@]}" 2>/dev/null || true; rm -rf "$TMP"; wait 2>/dev/null || true' EXIT
report=""
say() { echo "$1"; report+="$1"$'\n'; }

# replay TRACE MAXMEMORY POLICY [BIN] [extra server args...] -> "hit_rate spill_writes spill_hits"
# (a BIN other than this build's is an older server: no PARTIAL hint)
replay() {
  local trace=$1 mem=$2 policy=$3 bin=${4:-target/release/kvtier-server} port hint=()
  shift 4 || shift $#
  [[ $bin != target/release/kvtier-server ]] && hint=(--no-partial-hint)
  port=$(free_port)
  "$bin" --port "$port" --threads "$THREADS" --metrics-addr none \
    --maxmemory "$mem" --maxmemory-policy "$policy" "$@" >/dev/null 2>&1 &
  PID=$!
  wait_up "$port"
  $BENCH trace "$trace" --target "127.0.0.1:$port" --block-bytes "$REPLAY_BLOCK" \
    --concurrency 1 --json "$TMP/run.json" "${hint[@]}" >/dev/null
  local writes hits
  writes=$(redis-cli -p "$port" info spill | tr -d '\r' | awk -F: '$1 == "spill_writes" {print $2}')
  hits=$(redis-cli -p "$port" info spill | tr -d '\r' | awk -F: '$1 == "spill_hits" {print $2}')
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  echo "$(json "$TMP/run.json" "r['block_hit_rate']") ${writes:-0} ${hits:-0}"
}

# sim TRACE POLICIES CAPS BLOCK SHARDS -> JSON in $TMP/sim.json
sim() { $BENCH sim "$1" --policy "$2" --capacity "$3" --block-bytes "$4" --shards "$5" --json "$TMP/sim.json" >/dev/null; }
# sim_field FIELD POLICY CAP: from $TMP/sim.json
sim_field() { json "$TMP/sim.json" "[x['$1'] for x in r['results'] if x['policy'] == '$2' and abs(x['capacity'] - $3) < 1e-9][0]"; }
sim_rate() { sim_field block_hit_rate "$1" "$2"; }

if [[ " $PARTS " == *" sim "* ]]; then
  say "## Policies on the store's code: kvtier-bench sim, $SIM_BLOCK blocks, one shard"
  say ""
  say "| trace | policy | $(echo "$CAPACITIES" | sed 's/,/ | /g') |"
  say "|---|---|$(echo "$CAPACITIES" | sed 's/[^,]*/---/g; s/,/|/g')|"
  gaps=""
  for t in $TRACES; do
    sim "$TRACE_DIR/$t.jsonl" "$POLICIES" "$CAPACITIES" "$SIM_BLOCK" 1
    for p in ${POLICIES//,/ }; do
      row="| $t | $p |"
      for c in ${CAPACITIES//,/ }; do row+=" $(printf '%.4f' "$(sim_rate "$p" "$c")") |"; done
      say "$row"
    done
    row="| $t |"
    for c in ${CAPACITIES//,/ }; do
      row+=" $(python3 -c "l, b, p = $(sim_rate lru "$c"), $(sim_rate belady "$c"), $(sim_rate prefix "$c"); print(f'{(p - l) / (b - l) * 100:+.1f}%' if b > l else '-')") |"
    done
    gaps+="$row"$'\n'
  done
  say ""
  say "Share of the LRU→Belady gap the default \`prefix\` closes:"
  say ""
  say "| trace | $(echo "$CAPACITIES" | sed 's/,/ | /g') |"
  say "|---|$(echo "$CAPACITIES" | sed 's/[^,]*/---/g; s/,/|/g')|"
  say "${gaps%$'\n'}"
  say ""
fi

if [[ " $PARTS " == *" seeds "* ]]; then
  # The calibrated conversation shapes of docs/traces.md, each generated
  # again with seeds no choice of the policy saw: a cell of one trace moves
  # by a few points of the gap with the seed alone.
  say "## The calibrated shapes over seeds: kvtier-bench sim, $SIM_BLOCK blocks, one shard"
  say ""
  say "Share of the LRU→Belady gap ($(echo "$SEED_POLICIES" | sed 's/,/, /g') at $(echo "$CAPACITIES" | sed 's/,/, /g') of the unique bytes):"
  say ""
  say "| shape | seed | $(for p in ${SEED_POLICIES//,/ }; do for c in ${CAPACITIES//,/ }; do printf '%s %s | ' "$p" "$c"; done; done)"
  say "|---|---|$(for p in ${SEED_POLICIES//,/ }; do for c in ${CAPACITIES//,/ }; do printf -- '---|'; done; done)"
  shares="$TMP/shares"; : > "$shares"
  for shape in chat chat-2 chat-3; do
    case $shape in
      chat) args=(--requests 12000) ;;
      chat-2) args=(--requests 24000 --rate 4.6 --set gap_min=80 --set gap_median=960) ;;
      chat-3) args=(--requests 30000) ;;
    esac
    for seed in $SEEDS; do
      f="$TRACE_DIR/$shape-seed$seed.jsonl"
      [[ -f $f ]] || python3 bench/gen_traces.py chat "${args[@]}" --seed "$seed" --out "$f" >/dev/null 2>&1
      sim "$f" "$SEED_POLICIES,lru,belady" "$CAPACITIES" "$SIM_BLOCK" 1
      row="| $shape | $seed |"
      for p in ${SEED_POLICIES//,/ }; do
        for c in ${CAPACITIES//,/ }; do
          share=$(python3 -c "l, b, v = $(sim_rate lru "$c"), $(sim_rate belady "$c"), $(sim_rate "$p" "$c"); print(f'{(v - l) / (b - l) * 100:.1f}' if b > l else 'nan')")
          echo "$p $c $share" >> "$shares"
          row+=" $share% |"
        done
      done
      say "$row"
    done
  done
  for stat in mean min max; do
    row="| all | $stat |"
    for p in ${SEED_POLICIES//,/ }; do
      for c in ${CAPACITIES//,/ }; do
        row+=" $(python3 -c "
import statistics, sys
v = [float(x.split()[2]) for x in open(sys.argv[1]) if x.split()[:2] == [sys.argv[2], sys.argv[3]]]
print(f'{dict(mean=statistics.mean, min=min, max=max)[sys.argv[4]](v):.1f}%')" "$shares" "$p" "$c" "$stat") |"
      done
    done
    say "$row"
  done
  say ""
fi

if [[ " $PARTS " == *" confirm "* ]]; then
  say "## The default through a real server: kvtier-bench trace, $REPLAY_BLOCK blocks, --threads $THREADS, maxmemory ${CONFIRM_CAP} of unique bytes"
  say ""
  head="| trace | sim prefix | server prefix | difference | sim allkeys-lru | server allkeys-lru |"
  rule="|---|---|---|---|---|---|"
  [[ -n $BASELINE_BIN ]] && { head+=" old build's prefix (server) |"; rule+="---|"; }
  say "$head"; say "$rule"
  for t in $TRACES; do
    sim "$TRACE_DIR/$t.jsonl" prefix,allkeys-lru "$CONFIRM_CAP" "$REPLAY_BLOCK" "$THREADS"
    mem=$(sim_field budget_bytes prefix "$CONFIRM_CAP")
    sp=$(sim_rate prefix "$CONFIRM_CAP"); sl=$(sim_rate allkeys-lru "$CONFIRM_CAP")
    read -r rp _ _ < <(replay "$TRACE_DIR/$t.jsonl" "$mem" prefix)
    read -r rl _ _ < <(replay "$TRACE_DIR/$t.jsonl" "$mem" allkeys-lru)
    row="| $t | $(printf '%.4f' "$sp") | $(printf '%.4f' "$rp") | $(python3 -c "print(f'{$rp - $sp:+.4f}')") | $(printf '%.4f' "$sl") | $(printf '%.4f' "$rl") |"
    if [[ -n $BASELINE_BIN ]]; then
      read -r ro _ _ < <(replay "$TRACE_DIR/$t.jsonl" "$mem" prefix "$BASELINE_BIN")
      row+=" $(printf '%.4f' "$ro") |"
    fi
    say "$row"
  done
  say ""
fi

if [[ " $PARTS " == *" spill "* ]]; then
  say "## DRAM + disk against DRAM only: DRAM ${CONFIRM_CAP} of unique bytes, a spill tier ${SPILL_DISK} times as large"
  say ""
  say "| trace | policy | DRAM only | DRAM + disk | disk writes | disk hits |"
  say "|---|---|---|---|---|---|"
  for t in $SPILL_TRACES; do
    sim "$TRACE_DIR/$t.jsonl" lru "$CONFIRM_CAP" "$REPLAY_BLOCK" 1
    mem=$(sim_field budget_bytes lru "$CONFIRM_CAP")
    for p in prefix allkeys-lru; do
      read -r dram _ _ < <(replay "$TRACE_DIR/$t.jsonl" "$mem" "$p")
      rm -rf "$TMP/spill"; mkdir -p "$TMP/spill"
      read -r both writes hits < <(replay "$TRACE_DIR/$t.jsonl" "$mem" "$p" "" \
        --spill-dir "$TMP/spill" --spill-max-bytes "$(python3 -c "print(int($mem * $SPILL_DISK))")")
      say "| $t | $p | $(printf '%.4f' "$dram") | $(printf '%.4f' "$both") | $writes | $hits |"
    done
  done
  say ""
fi
if [[ " $PARTS " == *" cost "* && -n $BASELINE_BIN ]]; then
  # Writes under eviction, this build against BASELINE_BIN (same flags). One
  # server per build and policy, filled past maxmemory first, so every
  # measured write evicts; the servers take turns REPS times (each rep starts
  # with the next one), each measured run sized by a calibration run to last
  # about COST_SECS. Reported: the median ops/s, the ratio, the baseline's own
  # spread ((max - min) / median: the noise band) and the server's CPU time
  # per write (from /proc, user + system; the client shares the two cores, so
  # this is the steadier figure, and the only one that moves while the
  # client is the limit). WORSE: more than 5% slower, or 5% more CPU per
  # write, beyond the baseline's band.
  REPS=${REPS:-5}; COST_SECS=${COST_SECS:-5}; COST_MEM=${COST_MEM:-256mb}
  COST_THREADS=${COST_THREADS:-"1 $THREADS"}; COST_CMDS=${COST_CMDS:-"SET MSETBLOCK CHAIN64"}
  value=$(head -c 4096 /dev/zero | tr '\0' v)
  chain=(MSETBLOCK 64)
  for _ in $(seq 64); do chain+=("key:__rand_int__" "$value"); done
  chain+=(CHAIN)
  hz=$(getconf CLK_TCK)
  # bench PORT N CMD -> "ops/s" (50 clients; -P 16 for one-block writes,
  # -P 1 for the 64-block chain: 12.8 MB in flight). One client thread: with
  # --threads redis-benchmark ends a run on a 250 ms tick, which quantizes a
  # 5 s run's rate by 5%.
  bench() {
    local port=$1 n=$2 cmd=$3 args pipe=16 keys=1000000
    case $cmd in
      SET) args=(SET "key:__rand_int__" "$value");;
      # The control: the same SETs to 40k keys, which fit (160 MB of
      # values): each overwrites a resident key and nothing is evicted, so
      # what differs is not eviction (the queues still take a slot per
      # write).
      SETFIT) args=(SET "key:__rand_int__" "$value"); keys=40000;;
      MSETBLOCK) args=(MSETBLOCK 1 "key:__rand_int__" "$value");;
      CHAIN64) args=("${chain[@]}"); pipe=1;;
    esac
    redis-benchmark -p "$port" -n "$n" -c 50 -P "$pipe" -r "$keys" -q "${args[@]}" 2>/dev/null \
      | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | awk '{print $1}'
  }
  say "## Writes under eviction: this build against BASELINE_BIN, maxmemory $COST_MEM"
  say ""
  say "4 KiB values to random keys of 1M, 50 clients (-P 16; the chain -P 1), $REPS turns of about ${COST_SECS} s each."
  say ""
  say "| command | policy | --threads | new ops/s | base ops/s | new/base | base spread | new CPU µs/op | base CPU µs/op | CPU new/base | base CPU spread | |"
  say "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for t in $COST_THREADS; do for p in ${COST_POLICIES:-prefix allkeys-lru}; do
    declare -A port_of=() pid_of=()
    for which in new base; do
      bin=target/release/kvtier-server; [[ $which == base ]] && bin=$BASELINE_BIN
      port=$(free_port)
      "$bin" --port "$port" --threads "$t" --metrics-addr none --maxmemory "$COST_MEM" \
        --maxmemory-policy "$p" >/dev/null 2>&1 &
      pid_of[$which]=$!; port_of[$which]=$port; COST_PIDS+=($!)
      wait_up "$port"
      bench "$port" 200000 SET >/dev/null  # 800 MB of writes: full, evicting
    done
    for cmd in $COST_CMDS; do
      declare -A rps=() cpu=()
      if [[ $cmd == SETFIT ]]; then
        # Every one of the 40k keys written (and so resident) first.
        for which in new base; do bench "${port_of[$which]}" 400000 SETFIT >/dev/null; done
      fi
      n=$(( $(bench "${port_of[new]}" 2000 "$cmd" | awk '{printf "%d", $1}') * COST_SECS ))
      (( n < 2000 )) && n=2000
      for rep in $(seq "$REPS"); do
        order=(new base); (( rep % 2 == 0 )) && order=(base new)
        for which in "${order[@]}"; do
          t0=$(ticks "${pid_of[$which]}")
          r=$(bench "${port_of[$which]}" "$n" "$cmd")
          t1=$(ticks "${pid_of[$which]}")
          rps[$which]+="$r "
          cpu[$which]+="$(awk -v t="$((t1 - t0))" -v n="$n" -v hz="$hz" 'BEGIN {printf "%.3f", t * 1e6 / hz / n}') "
        done
      done
      row=$(python3 -c "
import statistics, sys
n, b, cn, cb = ([float(x) for x in a.split()] for a in sys.argv[1:5])
mn, mb, mcn, mcb = (statistics.median(v) for v in (n, b, cn, cb))
band = (max(b) - min(b)) / mb
cband = (max(cb) - min(cb)) / mcb
worse = 'WORSE' if mn / mb < 0.95 - band or mcn / mcb > 1.05 + cband else 'ok'
print(f'{mn:.0f} | {mb:.0f} | {mn / mb:.3f}x | ±{band * 50:.0f}% | {mcn:.2f} | {mcb:.2f} | {mcn / mcb:.3f}x | ±{cband * 50:.0f}% | {worse}')" \
        "${rps[new]}" "${rps[base]}" "${cpu[new]}" "${cpu[base]}")
      name=$cmd; [[ $cmd == CHAIN64 ]] && name="MSETBLOCK 64 CHAIN"
      [[ $cmd == SETFIT ]] && name="SET, 40k keys (no eviction)"
      say "| $name | $p | $t | $row |"
      unset rps cpu
    done
    kill "${pid_of[new]}" "${pid_of[base]}"; wait 2>/dev/null || true; COST_PIDS=()
    unset port_of pid_of
  done; done
  say ""
fi
say "Command: \`PARTS=\"$PARTS\" scripts/bench-eviction.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores, commit $(git rev-parse --short HEAD)."
[[ -n "$OUT" ]] && printf '%s' "$report" > "$OUT"
exit 0
