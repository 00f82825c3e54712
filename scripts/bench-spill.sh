#!/usr/bin/env bash
# The NVMe spill tier, measured in one run (kvtier-bench as the client, fio
# as the reference for the disk):
#
#  read   Four times maxmemory of 256 KiB blocks loaded, then GETs at random
#         across all of them. Throughput served from the spill tier (its
#         disk reads per second) against fio's O_DIRECT random reads of the
#         same block size, at the same concurrency, in the same directory.
#  p99    p99 of GETs of DRAM-resident blocks with the tier idle, then while
#         another client keeps it busy writing (new blocks evicting old
#         ones) and reading (cold blocks) at BG_RATE requests/s; the ratio
#         busy / idle.
#  admit  Trace replay (Mooncake synthetic trace) with DRAM at 10% of the
#         trace's unique bytes and the disk at 50%, for each
#         --spill-admission: block hit rate and bytes written to disk.
#
#   scripts/bench-spill.sh
#   PARTS="read p99" CONC=16 MAXMEM=512 DIR=/var/tmp/kvtier-bench scripts/bench-spill.sh
#
# MAXMEM is in MiB. DIR must be on the disk to measure (default: a fresh
# directory under /var/tmp, removed afterwards).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"read p99 admit"}
CONC=${CONC:-16}
MAXMEM=${MAXMEM:-256}
SECONDS_RUN=${SECONDS_RUN:-15}
TRACE=${TRACE:-bench/traces/mooncake_synthetic_trace.jsonl}
ADMISSIONS=${ADMISSIONS:-"all 1 2"}
# Background load of the p99 part, requests/s of 256 KiB (half SETs, half
# GETs of cold blocks): 1600/s is ~200 MB/s written to and ~200 MB/s read
# from the tier, a busy disk that leaves the CPU to the measured client.
BG_RATE=${BG_RATE:-1600}
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
BASE=${DIR:-$(mktemp -d -p /var/tmp kvtier-bench-spill.XXXXXX)}
mkdir -p "$BASE"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -z "${DIR:-}" ]] && rm -rf "$BASE"
}
trap cleanup EXIT
info() { redis-cli -p "$1" info spill | tr -d '\r' | awk -F: -v k="$2" '$1==k {print $2}'; }

start_kvtier() { # port dir extra... ; sets KV_PID
  local port=$1 dir=$2; shift 2
  rm -rf "$dir"; mkdir -p "$dir"
  target/release/kvtier-server --port "$port" --metrics-addr none --spill-dir "$dir" "$@" >"$BASE/server.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "kvtier did not start"; cat "$BASE/server.log"; exit 1
}
stop_kvtier() { redis-cli -p "$1" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true; }

block=$((256 * 1024))
if [[ " $PARTS " == *" read "* ]]; then
  keys=$(( MAXMEM * 4 * 1024 * 1024 / block ))
  port=$(free_port)
  start_kvtier "$port" "$BASE/kv" --maxmemory "${MAXMEM}mb" --spill-io-threads "$CONC"
  # Load (prefill) then read uniformly across everything.
  target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 0:1 --keys "$keys" \
    --value-size 256KiB --connections "$CONC" --prefill --duration 3 --json "$BASE/warm.json" >/dev/null
  r0=$(info "$port" spill_read_bytes)
  target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 0:1 --keys "$keys" \
    --value-size 256KiB --connections "$CONC" --duration "$SECONDS_RUN" --json "$BASE/read.json" >/dev/null
  r1=$(info "$port" spill_read_bytes)
  secs=$(json "$BASE/read.json" "r['seconds']")
  total=$(json "$BASE/read.json" "r['read_gb_per_sec']")
  hits=$(json "$BASE/read.json" "r['hit_rate']")
  fails=$(json "$BASE/read.json" "r['verification_failures']")
  used=$(info "$port" spill_used_bytes)
  direct=$(info "$port" spill_direct_io)
  stop_kvtier "$port"
  spill=$(python3 -c "print((${r1} - ${r0}) / ${secs} / 1e9)")
  # fio: the same directory, a file as large as what the tier held.
  mkdir -p "$BASE/fio"
  size=$(( used > block * 64 ? used : block * 64 ))
  fio --name=spill --directory="$BASE/fio" --rw=randread --bs=256k --direct=1 \
    --ioengine=libaio --iodepth="$CONC" --size="$size" --runtime="$SECONDS_RUN" --time_based \
    --output-format=json >"$BASE/fio.json" 2>/dev/null
  fio_gb=$(json "$BASE/fio.json" "r['jobs'][0]['read']['bw_bytes'] / 1e9")
  rm -rf "$BASE/fio"
  echo "## read: 256 KiB blocks, 4x maxmemory (${MAXMEM} MiB), concurrency $CONC, O_DIRECT $direct"
  echo "| measure | GB/s |"
  echo "|---|---|"
  printf '| kvtier GETs (DRAM and disk), hit rate %s, %s wrong bytes | %.3f |\n' "$hits" "$fails" "$total"
  printf '| kvtier reads from the spill tier | %.3f |\n' "$spill"
  printf '| fio randread O_DIRECT libaio iodepth %s | %.3f |\n' "$CONC" "$fio_gb"
  python3 -c "print(f'| **spill tier / fio** | **{${spill} / ${fio_gb}:.2f}** |')"
  echo
fi

if [[ " $PARTS " == *" p99 "* ]]; then
  cold=$(( MAXMEM * 3 * 1024 * 1024 / block ))
  p99_run() { # tag spill(yes/no) -> fills $BASE/<tag>-idle.json, $BASE/<tag>-busy.json, W/R deltas
    local tag=$1 port; port=$(free_port)
    if [[ $2 == yes ]]; then
      start_kvtier "$port" "$BASE/kv" --maxmemory "${MAXMEM}mb"
    else
      target/release/kvtier-server --port "$port" --metrics-addr none --maxmemory "${MAXMEM}mb" \
        >"$BASE/server.log" 2>&1 &
      KV_PID=$!; PIDS+=("$KV_PID")
      for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    fi
    # Cold blocks: with the tier, most of them on disk.
    target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 0:1 --keys "$cold" \
      --key-prefix cold: --value-size 256KiB --connections 4 --prefill --requests 1 >/dev/null
    hot() {
      target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 0:1 --keys 64 --key-prefix hot: \
        --value-size 64KiB --connections 4 --client-threads 1 --prefill --duration "$SECONDS_RUN" --json "$1" >/dev/null
    }
    hot "$BASE/$tag-idle.json"
    W0=$(info "$port" spill_writes); R0=$(info "$port" spill_reads)
    # The busy tier: writes of new blocks (evictions to disk) and reads of
    # cold ones (disk reads), from a second client, for longer than the
    # measurement.
    target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 1:1 --keys $(( cold * 2 )) \
      --key-prefix cold: --value-size 256KiB --connections 4 --client-threads 1 --rate "$BG_RATE" \
      --duration $(( SECONDS_RUN + 4 )) >/dev/null &
    BG=$!; PIDS+=("$BG")
    sleep 2
    hot "$BASE/$tag-busy.json"
    W1=$(info "$port" spill_writes); R1=$(info "$port" spill_reads)
    wait "$BG" || true
    stop_kvtier "$port"
  }
  p99_run tier yes
  writes=$(( ${W1:-0} - ${W0:-0} )); reads=$(( ${R1:-0} - ${R0:-0} ))
  p99_run dram no
  p() { json "$BASE/$1.json" "r['latency']['get']['p99_us']"; }
  idle=$(p tier-idle); busy=$(p tier-busy); ref=$(p dram-busy); ref_idle=$(p dram-idle)
  echo "## p99: GETs of 64 DRAM-resident 64 KiB blocks (4 connections), tier idle vs busy ($BG_RATE req/s of 256 KiB, 1:1 SET:GET)"
  echo "| server | load | p99 µs | spill writes | spill reads |"
  echo "|---|---|---|---|---|"
  echo "| with spill tier | idle | $idle | - | - |"
  echo "| with spill tier | busy | $busy | $writes | $reads |"
  echo "| DRAM only (reference) | idle | $ref_idle | - | - |"
  echo "| DRAM only (reference) | same load, evictions drop | $ref | - | - |"
  python3 -c "print(f'| **busy / idle, with the tier** | | **{${busy} / ${idle}:.2f}** | | |')"
  python3 -c "print(f'| busy with the tier / same load without it | | {${busy} / ${ref}:.2f} | | |')"
  echo
fi

if [[ " $PARTS " == *" admit "* ]]; then
  [[ -f "$TRACE" ]] || { echo "trace not found: $TRACE"; exit 1; }
  tblock=65536
  unique=$(trace_unique_blocks "$TRACE")
  ubytes=$(( unique * tblock ))
  echo "## admit: trace replay, $unique unique blocks of 64 KiB; DRAM 10%, disk 50% of unique bytes"
  echo "| --spill-admission | block hit rate | bytes written to disk | of which rewritten by reclaim | spill hits |"
  echo "|---|---|---|---|---|"
  for a in none $ADMISSIONS; do
    port=$(free_port)
    if [[ $a == none ]]; then
      # The DRAM tier alone, for reference.
      target/release/kvtier-server --port "$port" --metrics-addr none --maxmemory $(( ubytes / 10 )) \
        >"$BASE/server.log" 2>&1 &
      KV_PID=$!; PIDS+=("$KV_PID")
      for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    else
      start_kvtier "$port" "$BASE/kv" --maxmemory $(( ubytes / 10 )) --spill-max-bytes $(( ubytes / 2 )) \
        --spill-admission "$a"
    fi
    target/release/kvtier-bench trace "$TRACE" --target "127.0.0.1:$port" --concurrency 1 \
      --json "$BASE/trace.json" >/dev/null
    rate=$(json "$BASE/trace.json" "r['block_hit_rate']")
    ideal=$(json "$BASE/trace.json" "r['ideal_block_hit_rate']")
    wb=$(info "$port" spill_write_bytes); rw=$(info "$port" spill_rewrites); sh=$(info "$port" spill_hits)
    stop_kvtier "$port"
    if [[ $a == none ]]; then
      printf '| (no spill tier: DRAM only) | %.3f | - | - | - |\n' "$rate"
    else
      printf '| %s | %.3f | %s MiB | %s records | %s |\n' "$a" "$rate" $(( wb / 1048576 )) "$rw" "$sh"
    fi
  done
  printf '| (unlimited memory: the most any cache can hit) | %.3f | | | |\n' "$ideal"
  echo
fi
echo "Command: PARTS=\"$PARTS\" CONC=$CONC MAXMEM=$MAXMEM scripts/bench-spill.sh on $(date -u +%Y-%m-%d), $(nproc) cores"
