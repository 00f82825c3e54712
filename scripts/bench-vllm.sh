#!/usr/bin/env bash
# kvtier inside real vLLM engines (the CPU build), in one run:
#
# 1. TTFT (tests/vllm/bench_ttft.py): a 12-layer, 768-wide Llama with random
#    weights generated here (12 KV heads, 128-token blocks: 4.5 MiB of KV a
#    block), one request at a time, over a full prefix hit (4,096-token
#    prompts served again), a shared 4,096-token system prompt and
#    multi-turn conversations; configurations: recompute (no connector),
#    vLLM's own prefix cache, vLLM's ExampleConnector (disk: its files in the
#    page cache, and disk-cold: the page cache dropped before each request,
#    as root), kvtier on one node and on a three-node cluster. LMCache's vLLM connector and vLLM's
#    own CPU offloading do not run on the CPU build (docs/connectors.md).
# 2. Prefill -> decode (tests/vllm/bench_pd.py): a kv_producer and a
#    kv_consumer engine of that model; the consumer is asked first and loads
#    the producer's blocks as they land: the producer's store time against
#    the time the consumer had every block, from the connectors' own clocks.
# 3. The scheduler's lookup of a 256-block prompt (tests/vllm/bench_lookup.py)
#    while a writer pushes the tier past maxmemory, beside redis-server
#    answering the same lookup as 256 pipelined EXISTS under the same writer.
#
#   scripts/bench-vllm.sh
#   PARTS=lookup scripts/bench-vllm.sh        # only part 3
#
#   BASELINE=abc123 CONFIGS=local,kvtier,kvtier-base scripts/bench-vllm.sh
#                                             # kvtier against abc123's connector
#                                             # (TTFT, and the P/D hand-off
#                                             # when abc123 is 4b0aa2e or later)
#
# Environment: PARTS ("ttft pd lookup"), CONFIGS (bench_ttft.py's, all),
# BASELINE (a git revision whose connector runs as kvtier-base), PD_PROMPTS (4),
# LAYERS/HIDDEN/KV_HEADS (12/768/12), OUT (file for the output).
# Compare ratios, not absolute numbers across runs: the machine is shared
# and noisy.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
bench_setup vllm
PARTS=${PARTS:-ttft pd lookup}
VENV=$(tests/vllm/venv.sh)
PY=$VENV/bin/python
"$PY" -m pip install -q --no-deps --no-build-isolation --force-reinstall ./clients/python

run() {
    echo "# $(date -u +%Y-%m-%dT%H:%MZ) kvtier $(git rev-parse --short HEAD), vllm $("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null), $(redis-server --version | cut -d' ' -f3), $(nproc) cores"
    echo "# command: PARTS=\"$PARTS\" scripts/bench-vllm.sh"
    MODEL=$WORK/llama-${LAYERS:-12}x${HIDDEN:-768}
    "$PY" tests/vllm/make_model.py "$MODEL" --layers "${LAYERS:-12}" --hidden "${HIDDEN:-768}" \
        --kv-heads "${KV_HEADS:-12}" >/dev/null 2>&1
    BASE_ARGS=()
    if [[ -n ${BASELINE:-} ]]; then
        # The earlier build's package under another name, beside this one.
        mkdir -p "$WORK/base"
        git archive "$BASELINE" clients/python/kvtier | tar -x -C "$WORK/base"
        rm -rf "$WORK/base/kvtier_base"
        mv "$WORK/base/clients/python/kvtier" "$WORK/base/kvtier_base"
        BASE_ARGS=(--baseline "$WORK/base")
    fi
    if [[ $PARTS == *ttft* ]]; then
        ONE=$(free_port)
        "$BIN" --port "$ONE" --metrics-addr none --maxmemory 8gb >/dev/null 2>&1 &
        PIDS+=($!)
        C1=$(free_port); C2=$(free_port); C3=$(free_port)
        MEMBERS="n1@127.0.0.1:$C1,n2@127.0.0.1:$C2,n3@127.0.0.1:$C3"
        for i in 1 2 3; do
            port_var=C$i
            "$BIN" --port "${!port_var}" --threads 1 --metrics-addr none --maxmemory 3gb \
                --cluster-nodes "$MEMBERS" --node-id "n$i" >/dev/null 2>&1 &
            PIDS+=($!)
        done
        for p in "$ONE" "$C1" "$C2" "$C3"; do wait_up "$p"; done
        "$PY" tests/vllm/bench_ttft.py --model "$MODEL" --kvtier "kvtier://127.0.0.1:$ONE" "${BASE_ARGS[@]}" \
            --cluster "kvtier://127.0.0.1:$C1,127.0.0.1:$C2,127.0.0.1:$C3" \
            --configs "${CONFIGS:-recompute,local,disk,disk-cold,kvtier,kvtier-cluster}"
        stop_all
    fi
    if [[ $PARTS == *pd* ]]; then
        ONE=$(free_port)
        "$BIN" --port "$ONE" --metrics-addr none --maxmemory 8gb >/dev/null 2>&1 &
        PIDS+=($!)
        wait_up "$ONE"
        "$PY" tests/vllm/bench_pd.py --model "$MODEL" --kvtier "kvtier://127.0.0.1:$ONE" "${BASE_ARGS[@]}" \
            --prompts "${PD_PROMPTS:-4}"
        stop_all
    fi
    if [[ $PARTS == *lookup* ]]; then
        KV=$(free_port); RS=$(free_port)
        "$BIN" --port "$KV" --metrics-addr none --maxmemory 512mb >/dev/null 2>&1 &
        PIDS+=($!)
        redis-server --port "$RS" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
            --maxmemory 512mb --maxmemory-policy allkeys-lru >/dev/null 2>&1 &
        PIDS+=($!)
        wait_up "$KV"; wait_up "$RS"
        "$PY" tests/vllm/bench_lookup.py --kvtier "127.0.0.1:$KV" --redis "127.0.0.1:$RS"
        stop_all
    fi
}
# (Not `run | tee`: the servers run() starts must be in this shell's PIDS,
# which the exit trap stops.)
if [[ -n ${OUT:-} ]]; then
    exec > >(tee "$OUT")
fi
run
