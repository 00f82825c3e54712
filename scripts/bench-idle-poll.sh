#!/usr/bin/env bash
# Idle polling against paced and unpaced clients, in one run: redis-server,
# this build (its default --idle-poll-us), this build with --idle-poll-us 0,
# and the build before (BASE, default HEAD~1, built in a git worktree under
# target/baseline/ as scripts/bench-before-after.sh does). GETs of 1 KiB
# values, one client and eight, paced at RATES GETs/s (over all the
# clients) and unpaced; the servers take turns cell by cell. Per cell: GETs/s,
# the server's CPU per GET (every thread's run time from
# /proc/PID/task/*/schedstat, in ns), how much of it was polling (kvtier's
# INFO idle_poll_us: exact where the CPU figure is noisy), p50/p99/p99.9.
# Then each server's CPU while no client is connected.
#
#   scripts/bench-idle-poll.sh
#   scripts/bench-idle-poll.sh 2d6af56
#   REPS=3 SECS=4 scripts/bench-idle-poll.sh
#
# Environment: RATES ("1000 5000 20000"), CLIENTS ("1 8"), SECS (4), REPS (1:
# rounds, medians reported), THREADS (2), IDLE_SECS (3), CONTROL (0; 1: a
# second --idle-poll-us 0 server takes its turns too, and the goals line
# shows the two identical servers' ratios: the run's noise for a comparison
# of the same code).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
BASE=${1:-HEAD~1}
RATES=${RATES:-"1000 5000 20000"}
CLIENTS=${CLIENTS:-"1 8"}
SECS=${SECS:-4}
REPS=${REPS:-1}
THREADS=${THREADS:-2}
IDLE_SECS=${IDLE_SECS:-3}
CONTROL=${CONTROL:-0}
command -v redis-server >/dev/null || { echo "missing redis-server"; exit 1; }

bench_setup bench-idle-poll
build_baseline "$BASE"

# poll_us PORT: INFO's idle_poll_us of a kvtier server (0 for redis-server).
poll_us() { redis-cli -p "$1" info stats | awk -F: '/^idle_poll_us:/ {v = $2} END {printf "%.0f\n", v + 0}'; }

# run_ns PID: nanoseconds every thread of PID has run.
run_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }

declare -A PORT PID
SERVERS=(redis kvtier kvtier-poll0 base)
[[ $CONTROL == 1 ]] && SERVERS+=(kvtier-poll0-again)
for s in "${SERVERS[@]}"; do
  PORT[$s]=$(free_port)
  case $s in
    redis) redis-server --port "${PORT[$s]}" --save '' --appendonly no >"$WORK/$s.log" 2>&1 & ;;
    kvtier) "$BIN" --port "${PORT[$s]}" --threads "$THREADS" --metrics-addr none >"$WORK/$s.log" 2>&1 & ;;
    kvtier-poll0 | kvtier-poll0-again) "$BIN" --port "${PORT[$s]}" --threads "$THREADS" --metrics-addr none --idle-poll-us 0 >"$WORK/$s.log" 2>&1 & ;;
    base) "$BASELINE_BIN" --port "${PORT[$s]}" --threads "$THREADS" --metrics-addr none >"$WORK/$s.log" 2>&1 & ;;
  esac
  PID[$s]=$!
  PIDS+=($!)
  wait_up "${PORT[$s]}"
  "$BENCH" kv --target "127.0.0.1:${PORT[$s]}" --ratio 0:1 --keys 1000 --value-size 1KiB \
    --connections 4 --prefill --requests 1 >/dev/null
done

declare -A RESULT
for rep in $(seq "$REPS"); do
  for c in $CLIENTS; do
    for rate in $RATES 0; do
      order=("${SERVERS[@]}")
      # Servers take turns in a different order each round.
      for _ in $(seq $((rep % ${#order[@]}))); do order=("${order[@]:1}" "${order[0]}"); done
      for s in "${order[@]}"; do
        out=$WORK/$s-$c-$rate-$rep.json
        polled=$(poll_us "${PORT[$s]}")
        before=$(run_ns "${PID[$s]}")
        "$BENCH" kv --target "127.0.0.1:${PORT[$s]}" --ratio 0:1 --keys 1000 --value-size 1KiB \
          --connections "$c" --pipeline 1 --duration "$SECS" --rate "$rate" --json "$out" >/dev/null
        after=$(run_ns "${PID[$s]}")
        RESULT[$s,$c,$rate]+="$out:$((after - before)):$(($(poll_us "${PORT[$s]}") - polled)) "
      done
    done
  done
done

declare -A IDLE
for s in "${SERVERS[@]}"; do
  before=$(run_ns "${PID[$s]}")
  sleep "$IDLE_SECS"
  IDLE[$s]=$(( ($(run_ns "${PID[$s]}") - before) / IDLE_SECS / 1000 ))
done

python3 - "$REPS" "$CLIENTS" "$RATES 0" "${SERVERS[*]}" "$(for k in "${!RESULT[@]}"; do echo "$k=${RESULT[$k]}"; done)" <<'EOF'
import json, statistics, sys
reps, clients, rates, servers, raw = sys.argv[1:]
cells, spread = {}, {}
for line in raw.splitlines():
    key, runs = line.split("=", 1)
    s, c, r = key.split(",")
    got = []
    for run in runs.split():
        path, ns, polled = run.rsplit(":", 2)
        j = json.load(open(path))
        gets = max(j["ops"], 1)
        lat = j["latency"]["get"]
        got.append((j["ops_per_sec"], int(ns) / 1000 / gets, lat["p50_us"], lat["p99_us"], lat["p999_us"], int(polled) / gets))
    cells[(s, c, r)] = [statistics.median(x) for x in zip(*got)]
    spread[(s, c, r)] = (min(g[1] for g in got), max(g[1] for g in got), min(g[3] for g in got), max(g[3] for g in got))
print(f"medians of {reps} round(s); in brackets the rounds' lowest and highest")
print("| clients | GETs/s asked | server | GETs/s | server CPU µs per GET | of it polling | p50 µs | p99 µs | p99.9 µs |")
print("|---|---|---|---|---|---|---|---|---|")
for c in clients.split():
    for r in rates.split():
        for s in servers.split():
            ops, cpu, p50, p99, p999, poll = cells[(s, c, r)]
            lo, hi, p99lo, p99hi = spread[(s, c, r)]
            asked = "unpaced" if r == "0" else r
            print(f"| {c} | {asked} | {s} | {ops:,.0f} | {cpu:.1f} ({lo:.1f}–{hi:.1f}) | {poll:.2f} | {p50:.1f} | {p99:.1f} ({p99lo:.0f}–{p99hi:.0f}) | {p999:.1f} |")
print()
print("goals (this build against the others, same run):")
for c in clients.split():
    for r in rates.split():
        new = cells[("kvtier", c, r)]
        if r == "0":
            red = cells[("redis", c, r)]
            goal = " (goal >= 2)" if c == "1" else ""
            print(f"  {c} client(s), unpaced: GET rate {new[0] / red[0]:.2f}x redis-server's{goal}")
            continue
        red, off = cells[("redis", c, r)], cells[("kvtier-poll0", c, r)]
        print(f"  {c} client(s), {r}/s: CPU per GET {new[1] / red[1]:.2f}x redis-server's, "
              f"{new[1] / off[1]:.2f}x --idle-poll-us 0's (goals <= 1.1); p99 {new[3]:.1f} vs {off[3]:.1f} µs")
        again = cells.get(("kvtier-poll0-again", c, r))
        if again:
            print(f"    control, the same --idle-poll-us 0 server twice: CPU per GET {again[1] / off[1]:.2f}x, "
                  f"p99 {again[3]:.1f} vs {off[3]:.1f} µs")
EOF
echo
echo "CPU with no client connected (µs of run time per second):"
for s in "${SERVERS[@]}"; do printf '  %-13s %s\n' "$s" "${IDLE[$s]}"; done
