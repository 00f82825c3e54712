#!/usr/bin/env bash
# LMCache's remote connectors side by side in one run, through LMCache 0.5.6's
# own RemoteBackend (CPU): its redis:// connector on redis-server 7, the
# kvtier plugin on kvtier, LMCache's resp:// native connector on kvtier, and
# redis:// on kvtier; and kvtier's vLLM connector's save and load paths
# (tests/vllm/bench_io.py, in the vLLM venv; VLLM=0 skips it); 64-chunk
# prompts of 32 MiB and 2 MiB chunks. Prints
# lookup latency, store/retrieve GB/s and the Python process's CPU per GB,
# with ratios; then, on a three-node kvtier cluster (hot-key copies off, so
# the coordination itself is measured), a node coordinating every command
# against the client's default (reads split by owner, batches striped). Compare ratios, not absolute numbers across
# runs: the machine is shared and noisy.
#
#   scripts/bench-connectors.sh                  # both chunk sizes
#   CHUNK_TOKENS=16 REPS=1 ROUNDS=1 scripts/bench-connectors.sh   # quick look
#   CLIENT_BASELINE=d4db37b VLLM=0 scripts/bench-connectors.sh      # the plugin before/after
#
# CLIENT_BASELINE=REV also runs the LMCache plugin with the Python package
# (clients/python) of revision REV, as plugin@base, taking turns with today's.
#
# Environment: KVTIER_BIN (default target/release/kvtier-server, built when
# missing), REPS (3), ROUNDS (3: every connector runs this many times, taking
# turns, and each figure is the median of its rounds), LOOKUPS (30), CHUNK_TOKENS ("256,16"), MAXMEMORY (6gb,
# both servers), OUT (file for the output, default stdout only).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$(dirname "$0")/.."
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-3}
LOOKUPS=${LOOKUPS:-30}
CHUNK_TOKENS=${CHUNK_TOKENS:-256,16}
MAXMEMORY=${MAXMEMORY:-6gb}
BIN=${KVTIER_BIN:-target/release/kvtier-server}
if [[ ! -x $BIN ]]; then
    cargo build --release -q -p kvtier-server
fi
command -v redis-server >/dev/null || { echo "missing redis-server (apt-get install redis-server)"; exit 1; }

VENV=$(tests/connectors/venv.sh)
# The vLLM connector is timed in the vLLM tests' venv (VLLM=0: skip it).
VLLM_ARGS=()
if [[ ${VLLM:-1} != 0 ]]; then
    VLLM_ARGS=(--vllm-python "$(tests/vllm/venv.sh)/bin/python")
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_port() { for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "port $1 did not answer"; exit 1; }

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --maxmemory "$MAXMEMORY" --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
PIDS+=($!)
KV_PORT=$(free_port)
# A 64-chunk prompt of 32 MiB chunks is a third of the tier: its lookup may
# hold half of it (PREFIXLEN ... HOLD counts only what it can hold).
"$BIN" --port "$KV_PORT" --metrics-addr none --maxmemory "$MAXMEMORY" \
    --hold-max-memory 3gb --hold-client-max-memory 3gb >/dev/null 2>&1 &
PIDS+=($!)
C1=$(free_port); C2=$(free_port); C3=$(free_port)
MEMBERS="n1@127.0.0.1:$C1,n2@127.0.0.1:$C2,n3@127.0.0.1:$C3"
for i in 1 2 3; do
    port_var=C$i
    "$BIN" --port "${!port_var}" --threads 1 --metrics-addr none --maxmemory 1gb \
        --cluster-nodes "$MEMBERS" --node-id "n$i" --hot-key-threshold 0 >/dev/null 2>&1 &
    PIDS+=($!)
done
for p in "$REDIS_PORT" "$KV_PORT" "$C1" "$C2" "$C3"; do wait_port "$p"; done

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(redis-server --version | cut -d' ' -f1-3), kvtier $("$BIN" --version | cut -d' ' -f2), lmcache $("$VENV/bin/python" -c 'import lmcache; print(lmcache.__version__)'), $(nproc) cores"
echo "# command: REPS=$REPS ROUNDS=$ROUNDS LOOKUPS=$LOOKUPS CHUNK_TOKENS=$CHUNK_TOKENS${CLIENT_BASELINE:+ CLIENT_BASELINE=$CLIENT_BASELINE} VLLM=${VLLM:-1} scripts/bench-connectors.sh"
BASE_ARGS=()
if [[ -n ${CLIENT_BASELINE:-} ]]; then
    baseline_tree "$CLIENT_BASELINE"
    BASE_ARGS=(--baseline-client "$PWD/$BASELINE_SRC/clients/python")
fi
run() {
    "$VENV/bin/python" tests/connectors/bench_connectors.py "${BASE_ARGS[@]}" \
        --redis "127.0.0.1:$REDIS_PORT" --kvtier "127.0.0.1:$KV_PORT" \
        --cluster "127.0.0.1:$C1,127.0.0.1:$C2,127.0.0.1:$C3" \
        --reps "$REPS" --rounds "$ROUNDS" --lookups "$LOOKUPS" --chunk-tokens "$CHUNK_TOKENS" "${VLLM_ARGS[@]}" \
        2> >(grep -v ' INFO' >&2)
}
if [[ -n ${OUT:-} ]]; then
    run | tee "$OUT"
else
    run
fi
