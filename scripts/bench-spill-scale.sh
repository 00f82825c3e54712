#!/usr/bin/env bash
# The spill tier at scale, in one run (kvtier-bench as the client, fio as the
# reference for the disk, same directory):
#
#  fio      The disk: sequential 1 MiB writes (O_DIRECT, libaio QD 8), and
#           256 KiB random reads at QD 32 and 128 with three engines: psync
#           (one thread per request in flight, what kvtier's I/O threads do),
#           libaio and io_uring.
#  ingest   Blocks of 4 KiB, 64 KiB and 1 MiB SET as fast as 16 connections
#           can into a 256 MiB DRAM tier (every evicted block written,
#           --spill-admission all): GB/s into the tier against fio's
#           sequential write, and every write not stored (INFO
#           refused_writes, spill_dropped: both must be 0).
#  restart  For each of SIZES (GB): that much of 256 KiB blocks written,
#           SIGTERM, restart: time to the first answer, time until every
#           block is indexed (INFO spill_loading 0), DRAM per block on disk
#           ((RSS - used_memory) / blocks); then random GETs across all of
#           them at 32 and 128 connections (--spill-io-threads as many)
#           against fio psync at the same depth. Last, the largest size
#           after SIGKILL (the open segments scanned).
#  throttle The disk slowed to THROTTLE_MB MB/s of writes (a blkio cgroup
#           the server and fio run in): 64 KiB and 1 MiB blocks SET at 0.8 of
#           what fio writes there, then as fast as 8 connections go: what
#           reaches the tier, what is refused or dropped (by cause), and how
#           much the writers were slowed (their achieved rate).
#  index    INDEX_BLOCKS small blocks (16 KiB) listed in sparse segments
#           (kvtier-bench spill-index: footers only, no disk for the data):
#           restart time and DRAM per block at a count the disk could not
#           hold.
#
#   scripts/bench-spill-scale.sh
#   PARTS="restart" SIZES="4" scripts/bench-spill-scale.sh
#
# DIR must be on the disk to measure (default: a fresh directory under
# /var/tmp, removed afterwards); it needs max(SIZES) + 8 GB free.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"fio ingest restart throttle index"}
THROTTLE_MB=${THROTTLE_MB:-200}
SIZES=${SIZES:-"10 20 40"}
INGEST_GB=${INGEST_GB:-4}
INDEX_BLOCKS=${INDEX_BLOCKS:-10000000}
READ_SECS=${READ_SECS:-10}
command -v fio >/dev/null || { echo "missing fio (apt-get install fio)"; exit 1; }
command -v redis-cli >/dev/null || { echo "missing redis-cli (apt-get install redis-tools)"; exit 1; }
cargo build --release -q -p kvtier-server -p kvtier-bench
BASE=${DIR:-$(mktemp -d -p /var/tmp kvtier-bench-scale.XXXXXX)}
mkdir -p "$BASE"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -z "${DIR:-}" ]] && rm -rf "$BASE"
}
trap cleanup EXIT
field() { redis-cli -p "$1" info "$2" | tr -d '\r' | awk -F: -v k="$3" '$1==k {print $2}'; }
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }

LAUNCH=()  # a command to start the server through (the throttle part's cgroup)
start_kvtier() { # port dir extra... ; sets KV_PID, STARTED (when the process started)
  local port=$1 dir=$2; shift 2
  mkdir -p "$dir"
  STARTED=$(now)
  "${LAUNCH[@]}" target/release/kvtier-server --port "$port" --metrics-addr none --spill-dir "$dir" "$@" \
    >>"$BASE/server.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 2000); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.005; done
  echo "kvtier did not start"; tail "$BASE/server.log"; exit 1
}
wait_loaded() { # port -> seconds since STARTED when every block was indexed
  local port=$1
  until [[ "$(field "$port" spill spill_loading)" == 0 ]]; do sleep 0.02; done
  calc "$(now) - $STARTED"
}
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
BASE_RSS=0
base_rss() { # extra flags -> sets BASE_RSS: RSS - used_memory of an empty server
  local port; port=$(free_port)
  rm -rf "$BASE/empty"
  start_kvtier "$port" "$BASE/empty" "$@"
  wait_loaded "$port" >/dev/null
  BASE_RSS=$(( $(rss "$KV_PID") - $(field "$port" memory used_memory) ))
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
  rm -rf "$BASE/empty"
}
per_block() { # port pid -> bytes of DRAM per block on disk beyond the DRAM tier and an empty server
  local used blocks
  used=$(field "$1" memory used_memory); blocks=$(field "$1" spill spill_recovered)
  calc "($(rss "$2") - $used - $BASE_RSS) / max($blocks, 1)"
}
fio_json() { json "$1" "$2"; }
fio_read() { # engine depth size_bytes -> GB/s of 256 KiB random reads
  local engine=$1 depth=$2 jobs=1 iodepth=$2
  [[ $engine == psync ]] && { jobs=$depth; iodepth=1; }
  mkdir -p "$BASE/fio"
  # One file shared by every job (psync's threads), as the segments are.
  fio --name=r --filename="$BASE/fio/file" --rw=randread --bs=256k --direct=1 --ioengine="$engine" \
    --iodepth="$iodepth" --numjobs="$jobs" --size="$3" --runtime="$READ_SECS" --time_based \
    --group_reporting --output-format=json >"$BASE/fio.json" 2>/dev/null
  fio_json "$BASE/fio.json" "r['jobs'][0]['read']['bw_bytes'] / 1e9"
}

echo "# spill tier at scale, $(date -u +%F), commit $(git rev-parse --short HEAD), $(nproc) cores"
echo

FIO_WRITE=""
if [[ " $PARTS " == *" fio "* || " $PARTS " == *" ingest "* ]]; then
  mkdir -p "$BASE/fio"
  fio --name=w --directory="$BASE/fio" --rw=write --bs=1m --direct=1 --ioengine=libaio --iodepth=8 \
    --size=4g --end_fsync=1 --output-format=json >"$BASE/fio-w.json" 2>/dev/null
  FIO_WRITE=$(fio_json "$BASE/fio-w.json" "r['jobs'][0]['write']['bw_bytes'] / 1e9")
  rm -rf "$BASE/fio"
fi
if [[ " $PARTS " == *" fio "* ]]; then
  echo "## fio: the disk under the spill directory"
  echo "| measure | GB/s |"
  echo "|---|---|"
  printf '| sequential write, 1 MiB, O_DIRECT, libaio QD 8 | %.3f |\n' "$FIO_WRITE"
  # Engines taken in turn, three rounds: the median of each.
  for depth in 32 128; do
    declare -A runs=()
    for _ in 1 2 3; do
      for engine in psync libaio io_uring; do
        runs[$engine]="${runs[$engine]:-} $(fio_read "$engine" "$depth" 4g || echo 0)"
      done
    done
    for engine in psync libaio io_uring; do
      printf '| random read 256 KiB, QD %s, %s (runs:%s) | %.3f |\n' "$depth" "$engine" "${runs[$engine]}" \
        "$(python3 -c "import statistics; print(statistics.median([float(x) for x in '${runs[$engine]}'.split()]))")"
    done
    unset runs
  done
  rm -rf "$BASE/fio"
  echo
fi

if [[ " $PARTS " == *" ingest "* ]]; then
  echo "## ingest: SETs from 16 connections into a 256 MiB DRAM tier, ${INGEST_GB} GB per size (fio sequential write $(printf %.3f "$FIO_WRITE") GB/s)"
  echo "| block | GB/s into the tier | / fio write | refused_writes | spill_dropped | spill_written GB |"
  echo "|---|---|---|---|---|---|"
  for size in 4KiB 64KiB 1MiB; do
    bytes=$(python3 -c "print({'4KiB': 4096, '64KiB': 65536, '1MiB': 1 << 20}['$size'])")
    keys=$(( INGEST_GB * 1000000000 / bytes ))
    port=$(free_port); dir="$BASE/ingest"
    rm -rf "$dir"
    start_kvtier "$port" "$dir" --maxmemory 256mb --spill-admission all
    t0=$(now)
    ok=yes
    target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 1:0 --keys "$keys" \
      --value-size "$size" --connections 16 --prefill --requests 1 >"$BASE/ingest.log" 2>&1 || ok=no
    secs=$(calc "$(now) - $t0")
    # Until the last batches are on disk.
    until [[ "$(field "$port" spill spill_queue_depth)" == 0 ]]; do sleep 0.05; done
    refused=$(field "$port" stats refused_writes); dropped=$(field "$port" spill spill_dropped)
    written=$(field "$port" spill spill_write_bytes)
    [[ $ok == no ]] && refused="$refused ($(tail -1 "$BASE/ingest.log"))"
    gb=$(calc "$keys * $bytes / $secs / 1e9")
    printf '| %s | %.3f | %.2f | %s | %s | %.2f |\n' "$size" "$gb" "$(calc "$gb / $FIO_WRITE")" \
      "$refused" "$dropped" "$(calc "$written / 1e9")"
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
    rm -rf "$dir"
  done
  echo
fi

if [[ " $PARTS " == *" restart "* ]]; then
  base_rss --maxmemory 256mb --spill-io-threads 128
  echo "## restart: 256 KiB blocks through a 256 MiB DRAM tier, SIGTERM, start again (caches dropped)"
  echo "| GB on disk | blocks | first answer s | index loaded s | s per TB | footers / scanned | DRAM B per block | spill reads GB/s QD 32 (/ fio psync) | QD 128 (/ fio psync) | wrong bytes |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  dir="$BASE/restart"
  last=0
  for gb in $SIZES; do
    keys=$(( gb * 1000000000 / 262144 ))
    rm -rf "$dir"
    port=$(free_port)
    start_kvtier "$port" "$dir" --maxmemory 256mb --spill-admission all
    target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 1:0 --keys "$keys" \
      --value-size 256KiB --connections 16 --prefill --requests 1 >/dev/null
    redis-cli -p "$port" shutdown >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
    on_disk=$(du -sB1 "$dir" | cut -f1)
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    start_kvtier "$port" "$dir" --maxmemory 256mb --spill-io-threads 128
    first=$(calc "$(now) - $STARTED")
    wait_loaded "$port" >/dev/null
    # The loader's own clock: from the listeners up to every shard holding
    # its records (polling INFO would add its own period).
    loaded=$(calc "$(field "$port" spill spill_load_ms) / 1000")
    blocks=$(field "$port" spill spill_recovered)
    how="$(field "$port" spill spill_footers_read) / $(field "$port" spill spill_segments_scanned)"
    dram=$(per_block "$port" "$KV_PID")
    reads=""; fails=0
    for depth in 32 128; do
      r0=$(field "$port" spill spill_read_bytes)
      target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 0:1 --keys "$keys" \
        --value-size 256KiB --connections "$depth" --duration "$READ_SECS" --json "$BASE/read.json" >/dev/null
      r1=$(field "$port" spill spill_read_bytes)
      got=$(calc "($r1 - $r0) / $(json "$BASE/read.json" "r['seconds']") / 1e9")
      fails=$(( fails + $(json "$BASE/read.json" "r['verification_failures']") ))
      ref=$(fio_read psync "$depth" 4g)
      rm -rf "$BASE/fio"
      reads="$reads $(printf '%.3f (%.2f) |' "$got" "$(calc "$got / $ref")")"
    done
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
    printf '| %.1f | %s | %.3f | %.2f | %.0f | %s | %.0f |%s %s |\n' "$(calc "$on_disk / 1e9")" "$blocks" \
      "$first" "$loaded" "$(calc "$loaded / ($on_disk / 1e12)")" "$how" "$dram" "$reads" "$fails"
    last=$gb
  done
  # The largest again, with 2 GB more written and then SIGKILL: the
  # segments being written have no footer and are scanned.
  port=$(free_port)
  start_kvtier "$port" "$dir" --maxmemory 256mb --spill-admission all
  wait_loaded "$port" >/dev/null
  target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 1:0 --keys 7629 --key-prefix more: \
    --value-size 256KiB --connections 16 --prefill --requests 1 >/dev/null
  kill -9 "$KV_PID"; wait "$KV_PID" 2>/dev/null || true
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  start_kvtier "$port" "$dir" --maxmemory 256mb
  first=$(calc "$(now) - $STARTED")
  wait_loaded "$port" >/dev/null
  printf '| %s + 2 after SIGKILL | %s | %.3f | %.2f | | %s / %s | | | | |\n' "$last" \
    "$(field "$port" spill spill_recovered)" "$first" "$(calc "$(field "$port" spill spill_load_ms) / 1000")" \
    "$(field "$port" spill spill_footers_read)" "$(field "$port" spill spill_segments_scanned)"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
  rm -rf "$dir"
  echo
fi

if [[ " $PARTS " == *" throttle "* ]]; then
  cg=/sys/fs/cgroup/blkio/kvtier-bench-$$
  dev=$(df --output=source "$BASE" | tail -1)
  majmin=$(printf '%d:%d' "0x$(stat -c %t "$dev")" "0x$(stat -c %T "$dev")")
  if mkdir -p "$cg" 2>/dev/null && echo "$majmin $(( THROTTLE_MB * 1000000 ))" >"$cg/blkio.throttle.write_bps_device"; then
    trap 'cleanup; rmdir "$cg" 2>/dev/null || true' EXIT
    LAUNCH=(bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$cg")
    mkdir -p "$BASE/fio"
    "${LAUNCH[@]}" fio --name=w --directory="$BASE/fio" --rw=write --bs=1m --direct=1 --ioengine=libaio \
      --iodepth=8 --size=2g --runtime=10 --time_based --output-format=json >"$BASE/fio-t.json" 2>/dev/null
    rm -rf "$BASE/fio"
    disk=$(fio_json "$BASE/fio-t.json" "r['jobs'][0]['write']['bw_bytes'] / 1e9")
    echo "## throttle: writes limited to ${THROTTLE_MB} MB/s (fio sequential write there: $(printf %.3f "$disk") GB/s), SETs for 20 s into a 256 MiB DRAM tier"
    echo "| block | offered | achieved GB/s | / fio | refused_writes | spill_dropped (causes) | written to disk GB/s |"
    echo "|---|---|---|---|---|---|---|"
    for size in 64KiB 1MiB; do
      bytes=$(python3 -c "print({'64KiB': 65536, '1MiB': 1 << 20}['$size'])")
      for load in 0.8 max; do
        port=$(free_port); dir="$BASE/throttle"
        rm -rf "$dir"
        start_kvtier "$port" "$dir" --maxmemory 256mb --spill-admission all
        w0=$(field "$port" spill spill_write_bytes)
        rate=0
        [[ $load != max ]] && rate=$(calc "$load * $disk * 1e9 / $bytes")
        target/release/kvtier-bench kv --target "127.0.0.1:$port" --ratio 1:0 --keys 100000000 \
          --value-size "$size" --connections 8 --rate "$rate" --duration 20 --json "$BASE/t.json" >/dev/null
        w1=$(field "$port" spill spill_write_bytes)
        got=$(json "$BASE/t.json" "r['write_gb_per_sec']")
        causes=$(redis-cli -p "$port" info spill | tr -d '\r' | awk -F: '$1 ~ /^spill_dropped_/ && $2 != 0 {printf "%s %s ", substr($1, 15), $2}')
        printf '| %s | %s | %.3f | %.2f | %s | %s %s| %.3f |\n' "$size" \
          "$([[ $load == max ]] && echo "as fast as 8 connections go" || echo "$load of fio")" "$got" \
          "$(calc "$got / $disk")" "$(field "$port" stats refused_writes)" "$(field "$port" spill spill_dropped)" \
          "${causes:+($causes)}" "$(calc "($w1 - $w0) / 20 / 1e9")"
        redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
      done
    done
    LAUNCH=()
    rm -rf "$BASE/throttle"
    echo
  else
    echo "## throttle: skipped (no blkio cgroup to limit the disk with)"
    echo
  fi
fi

if [[ " $PARTS " == *" index "* ]]; then
  echo "## index: ${INDEX_BLOCKS} blocks of 16 KiB listed in sparse segments (footers only)"
  echo "| blocks | footers MB | first answer s | index loaded s | s per TB of 16 KiB blocks | DRAM B per block (key 45 B) |"
  echo "|---|---|---|---|---|---|"
  dir="$BASE/index"
  rm -rf "$dir"
  target/release/kvtier-bench spill-index "$dir" --blocks "$INDEX_BLOCKS" --value-size 16KiB >/dev/null
  footers=$(du -sB1 "$dir" | cut -f1)
  base_rss --maxmemory 256mb
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  port=$(free_port)
  start_kvtier "$port" "$dir" --maxmemory 256mb
  first=$(calc "$(now) - $STARTED")
  wait_loaded "$port" >/dev/null
  loaded=$(calc "$(field "$port" spill spill_load_ms) / 1000")
  dram=$(per_block "$port" "$KV_PID")
  printf '| %s | %.0f | %.3f | %.2f | %.0f | %.0f |\n' "$INDEX_BLOCKS" "$(calc "$footers / 1e6")" "$first" \
    "$loaded" "$(calc "$loaded / ($INDEX_BLOCKS * 16384 / 1e12)")" "$dram"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$KV_PID" 2>/dev/null || true
  rm -rf "$dir"
  echo
fi
