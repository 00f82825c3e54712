#!/usr/bin/env bash
# kvtier against redis-server, side by side in one run, measured by the same
# client (kvtier-bench) with the same memory budget and eviction policy:
#
#   kv     64 KiB and 1 MiB values, SET:GET 1:10, 50 connections
#   trace  the Mooncake synthetic trace: redis-sequential and redis-pipelined
#          against both servers, the block dialect against kvtier (compared
#          with Redis's best, redis-pipelined)
#   pd     prefill -> decode hand-off: kvtier MGETPREFIX ... BLOCK, Redis
#          polling MGET (it has no blocking read)
#   skew   Zipf-skewed reads of hot blocks
#
# Each scenario runs against kvtier, then Redis (REPS times, alternating; the
# median is reported), both servers flushed before every run. Prints one
# table with kvtier/Redis ratios and writes it into docs/benchmarks.md
# between the bench-compare markers (the rest of the file is kept).
#
#   scripts/bench-compare.sh            # ~10 minutes on 2 cores
#   QUICK=1 scripts/bench-compare.sh    # ~1-2 minutes: a smoke run
#
# Environment: QUICK (0), REPS (1), MAXMEMORY (4gb), THREADS (kvtier shards,
# default: cores), CLIENT_THREADS (2), TRACE (bench/traces/
# mooncake_synthetic_trace.jsonl), OUT (docs/benchmarks.md; "-" to skip),
# KEEP (keep the JSON of every run in this directory).
#
# Compare ratios, not absolute numbers across runs or machines: on a small
# shared machine client and servers compete for the same cores.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
QUICK=${QUICK:-0}
REPS=${REPS:-1}
MAXMEMORY=${MAXMEMORY:-4gb}
THREADS=${THREADS:-$(nproc)}
CLIENT_THREADS=${CLIENT_THREADS:-2}
TRACE=${TRACE:-$ROOT/bench/traces/mooncake_synthetic_trace.jsonl}
OUT=${OUT:-docs/benchmarks.md}
START=$(date +%s)

for tool in redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install redis-server redis-tools python3)" >&2; exit 1; }
done
[[ -f $TRACE ]] || { echo "no trace at $TRACE (set TRACE)" >&2; exit 1; }

if [[ $QUICK == 1 ]]; then
    KV_SECS=5; KV64_KEYS=2000; KV1M_KEYS=200
    TRACE_LIMIT=1000; TRACE_BLOCK=16KiB
    PD_CHAINS=60; PD_BLOCKS=8
    SKEW_SECS=5; SKEW_KEYS=500
else
    KV_SECS=15; KV64_KEYS=10000; KV1M_KEYS=1000
    TRACE_LIMIT=all; TRACE_BLOCK=64KiB
    PD_CHAINS=300; PD_BLOCKS=16
    SKEW_SECS=15; SKEW_KEYS=1000
fi

TRACE_ARGS=(--block-bytes "$TRACE_BLOCK" --concurrency 8)
if [[ $TRACE_LIMIT != all ]]; then TRACE_ARGS+=(--limit "$TRACE_LIMIT"); fi

echo "building release binaries..."
cargo build --release -q -p kvtier-server -p kvtier-bench
SERVER=$ROOT/target/release/kvtier-server
BENCH=$ROOT/target/release/kvtier-bench

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [[ -n ${KEEP:-} ]]; then
        mkdir -p "$KEEP" && cp "$WORK"/*.json "$KEEP"/ 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


KV_PORT=$(free_port)
"$SERVER" --port "$KV_PORT" --threads "$THREADS" --metrics-addr none \
    --maxmemory "$MAXMEMORY" --maxmemory-policy allkeys-lru >"$WORK/kvtier.log" 2>&1 &
PIDS+=($!)
RD_PORT=$(free_port)
redis-server --port "$RD_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --maxmemory "$MAXMEMORY" --maxmemory-policy allkeys-lru >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for port in "$KV_PORT" "$RD_PORT"; do
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    redis-cli -p "$port" ping >/dev/null || { echo "server on port $port did not start" >&2; exit 1; }
done
addr() { if [[ $1 == kvtier ]]; then echo "127.0.0.1:$KV_PORT"; else echo "127.0.0.1:$RD_PORT"; fi; }

# run NAME SERVER ARGS...: one kvtier-bench run against a freshly flushed
# server; its JSON goes to $WORK/NAME.SERVER.REP.json.
run() {
    local name=$1 who=$2
    shift 2
    local port=${KV_PORT}
    [[ $who == redis ]] && port=$RD_PORT
    redis-cli -p "$port" flushall >/dev/null
    local json=$WORK/$name.$who.$rep.json log=$WORK/$name.$who.$rep.log
    printf '  %-18s %-7s ' "$name" "$who"
    local t0=$SECONDS
    if ! "$BENCH" --client-threads "$CLIENT_THREADS" "$@" --target "$(addr "$who")" --json "$json" >"$log" 2>&1; then
        echo "FAILED"
        cat "$log" >&2
        exit 1
    fi
    echo "$((SECONDS - t0))s"
}

for rep in $(seq "$REPS"); do
    echo "round $rep of $REPS"
    for who in kvtier redis; do
        run kv64 "$who" kv --value-size 64KiB --ratio 1:10 --keys "$KV64_KEYS" --prefill \
            --connections 50 --duration "$KV_SECS"
    done
    for who in kvtier redis; do
        run kv1m "$who" kv --value-size 1MiB --ratio 1:10 --keys "$KV1M_KEYS" --prefill \
            --connections 50 --duration "$KV_SECS"
    done
    run trace-dialect kvtier trace "$TRACE" --protocol dialect "${TRACE_ARGS[@]}"
    for proto in sequential pipelined; do
        for who in kvtier redis; do
            run "trace-$proto" "$who" trace "$TRACE" --protocol "redis-$proto" "${TRACE_ARGS[@]}"
        done
    done
    run pd kvtier pd --wait block --chains "$PD_CHAINS" --chain-blocks "$PD_BLOCKS" --block-size 256KiB
    run pd redis pd --wait poll --chains "$PD_CHAINS" --chain-blocks "$PD_BLOCKS" --block-size 256KiB
    for who in kvtier redis; do
        run skew "$who" skew --keys "$SKEW_KEYS" --block-size 256KiB --connections 64 \
            --duration "$SKEW_SECS"
    done
done

CMD=scripts/bench-compare.sh
if [[ $REPS != 1 ]]; then CMD="REPS=$REPS $CMD"; fi
if [[ $QUICK == 1 ]]; then CMD="QUICK=1 $CMD"; fi
export WORK REPS CMD THREADS CLIENT_THREADS MAXMEMORY TRACE_LIMIT TRACE_BLOCK KV_SECS PD_CHAINS PD_BLOCKS SKEW_SECS
TABLE=$WORK/table.md
python3 - >"$TABLE" <<'PY'
import glob, json, os, statistics, datetime

work = os.environ["WORK"]
reps = int(os.environ["REPS"])

def runs(name, who):
    return [json.load(open(p)) for p in sorted(glob.glob(f"{work}/{name}.{who}.*.json"))]

def get(report, path):
    for part in path.split("."):
        report = report[part]
    return report

def median(name, who, path):
    rs = runs(name, who)
    if not rs:
        return None, False
    values = [get(r, path) for r in rs]
    cpu = [r.get("client_cpu") or r.get("kv", {}).get("client_cpu") or {} for r in rs]
    saturated = any(c.get("saturated") for c in cpu)
    return statistics.median(values), saturated

def fmt(v, unit):
    if v is None:
        return "—"
    if unit == "GB/s":
        return f"{v:.3f}"
    if unit in ("rate", "share"):
        return f"{v:.3f}"
    if unit == "n":
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"

# (scenario label, kvtier run, redis run, metric label, JSON path, unit, higher is better)
rows = []
for name, label in [("kv64", "kv 64 KiB, 1:10"), ("kv1m", "kv 1 MiB, 1:10")]:
    rows += [
        (label, name, name, "ops/s", "ops_per_sec", "ops/s", True),
        (label, name, name, "read GB/s", "read_gb_per_sec", "GB/s", True),
        (label, name, name, "GET p50 µs", "latency.get.p50_us", "µs", False),
        (label, name, name, "GET p99 µs", "latency.get.p99_us", "µs", False),
    ]
for name, label, kv_run in [
    ("trace-sequential", "trace, redis-sequential (both)", "trace-sequential"),
    ("trace-pipelined", "trace, redis-pipelined (both)", "trace-pipelined"),
    ("trace-pipelined", "trace, kvtier dialect vs Redis redis-pipelined", "trace-dialect"),
]:
    rows += [
        (label, kv_run, name, "requests/s", "requests_per_sec", "req/s", True),
        (label, kv_run, name, "GB/s moved", "gb_per_sec", "GB/s", True),
        (label, kv_run, name, "lookup p50 µs", "latency.lookup.p50_us", "µs", False),
        (label, kv_run, name, "request p50 µs", "latency.request.p50_us", "µs", False),
        (label, kv_run, name, "request p99 µs", "latency.request.p99_us", "µs", False),
        (label, kv_run, name, "block hit rate", "block_hit_rate", "rate", None),
    ]
label = "pd, kvtier MGETPREFIX BLOCK vs Redis MGET polling"
rows += [
    (label, "pd", "pd", "hand-offs/s", "handoffs_per_sec", "1/s", True),
    (label, "pd", "pd", "hand-off p50 µs", "latency.handoff.p50_us", "µs", False),
    (label, "pd", "pd", "hand-off p99 µs", "latency.handoff.p99_us", "µs", False),
    (label, "pd", "pd", "timeouts", "timeouts", "n", None),
]
label = "skew, Zipf 0.99 over hot 256 KiB blocks"
rows += [
    (label, "skew", "skew", "GET ops/s", "ops_per_sec", "ops/s", True),
    (label, "skew", "skew", "GET p99 µs", "kv.latency.get.p99_us", "µs", False),
    (label, "skew", "skew", "hottest shard share", "hottest_shard_share", "share", None),
]

env = os.environ
print(
    f"`{env['CMD']}` on {datetime.date.today().isoformat()}: {os.cpu_count()} cores; "
    f"kvtier `--threads {env['THREADS']}` and redis-server (one thread) both with "
    f"`--maxmemory {env['MAXMEMORY']} --maxmemory-policy allkeys-lru`; "
    f"kvtier-bench `--client-threads {env['CLIENT_THREADS']}`; median of {reps} run(s) per cell."
)
print()
print("| scenario | metric | kvtier | Redis | kvtier/Redis |")
print("|---|---|---|---|---|")
notes = set()
for label, kv_run, rd_run, metric, path, unit, higher in rows:
    kv, kv_sat = median(kv_run, "kvtier", path)
    rd, rd_sat = median(rd_run, "redis", path)
    kv_s, rd_s = fmt(kv, unit), fmt(rd, unit)
    if kv_sat:
        kv_s += " †"; notes.add("sat")
    if rd_sat:
        rd_s += " †"; notes.add("sat")
    if higher is None or kv is None or rd is None or rd == 0:
        ratio = "—"
    else:
        ratio = f"{kv / rd:.2f}×"
        if higher is False:
            ratio += " (lower is better)"
    if label == "skew, Zipf 0.99 over hot 256 KiB blocks" and metric == "hottest shard share":
        rd_s = "— (one thread)"
    print(f"| {label} | {metric} | {kv_s} | {rd_s} | {ratio} |")
print()
print(
    f"Scenarios: kv runs {env['KV_SECS']} s per server after `--prefill`, 50 connections; "
    + ("trace replays the whole Mooncake synthetic trace" if env['TRACE_LIMIT'] == "all"
       else f"trace replays the first {env['TRACE_LIMIT']} requests of the Mooncake synthetic trace")
    + f" with "
    f"{env['TRACE_BLOCK']} blocks, 8 in flight, from an empty server; pd hands off "
    f"{env['PD_CHAINS']} chains of {env['PD_BLOCKS']} × 256 KiB blocks (4 prefill, 4 decode workers); "
    f"skew reads for {env['SKEW_SECS']} s with 64 connections. Every fetched value was verified "
    "(a wrong byte fails the run)."
)
if "sat" in notes:
    print()
    print("† the client was CPU-saturated in that run: the figure is a lower bound.")
PY

echo
cat "$TABLE"

if [[ $OUT != - ]]; then
    python3 - "$OUT" "$TABLE" <<'PY'
import os, sys
out, table = sys.argv[1], open(sys.argv[2]).read().rstrip("\n")
start, end = "<!-- bench-compare:start -->", "<!-- bench-compare:end -->"
block = f"{start}\n{table}\n{end}"
if os.path.exists(out):
    text = open(out).read()
else:
    text = (
        "# Benchmarks\n\n"
        "Every number here comes from a script in `scripts/` run on the machine named\n"
        "with it; compare ratios, not absolute numbers across machines.\n\n"
        "## kvtier vs Redis: `scripts/bench-compare.sh`\n\n"
        "kvtier-bench (see [bench.md](bench.md)) against kvtier and redis-server in\n"
        "one run, same client, same memory budget.\n\n"
    )
if start in text and end in text and text.index(start) < text.index(end):
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1]
    text = before + block + after
else:
    text = text.rstrip("\n") + "\n\n" + block + "\n"
open(out, "w").write(text)
PY
    echo
    echo "table written to $OUT"
fi
echo "bench-compare: $(($(date +%s) - START))s"
