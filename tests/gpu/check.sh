#!/usr/bin/env bash
# kvtier.vllm's staging path on one NVIDIA GPU (outside CI): a machine with
# PyTorch and CUDA, no vLLM, no network. Run from the repository root:
#
#   tests/gpu/check.sh
#
# It needs a kvtier-server binary (KVTIER_BIN, default
# target/release/kvtier-server; carry a stripped one to such a machine:
# `strip -o tests/gpu/carry/kvtier-server target/release/kvtier-server`) and
# redis-py (installed from tests/gpu/carry/*.whl when it is missing:
# `pip download --no-deps -d tests/gpu/carry redis`). tests/gpu/carry is
# ignored by git; name it in the device tool's carry.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CARRY=tests/gpu/carry
BIN=${KVTIER_BIN:-}
if [[ -z $BIN ]]; then
    if [[ -x $CARRY/kvtier-server ]]; then BIN=$CARRY/kvtier-server; else BIN=target/release/kvtier-server; fi
fi
PY=${PYTHON:-python3}
if ! "$PY" -c 'import redis' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps "$CARRY"/redis-*.whl
fi
PORT=${PORT:-7399}
"$BIN" --port "$PORT" --metrics-addr none --maxmemory 8gb >/tmp/kvtier-gpu-check.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 0.2)" 2>/dev/null && break
    sleep 0.2
done
timeout 300 "$PY" tests/gpu/check.py --url "kvtier://127.0.0.1:$PORT"
