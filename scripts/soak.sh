#!/usr/bin/env bash
# Soak (bounded, loopback only): kvtier with a spill dir under mixed load
# (kvtier-bench kv and trace, a verified MSETBLOCK writer and reader) and
# hostile clients (random CLIENT KILLs, stalled readers, oversized,
# never-ending and malformed requests), stopped with SIGTERM and SIGKILL and
# restarted on the same spill dir in between. Fails on any wrong byte, on
# RSS above maxmemory + the client limits + a stated margin, or on an
# acknowledged block missing after a graceful restart; reports what survives
# a SIGKILL. See scripts/soak.py.
#   SOAK_SECONDS=300   load time in all (default about 6 minutes in all)
#   PROFILE=debug      use the debug build (scripts/test.sh's short run)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
bench_setup soak
PY=.venv/bin/python
[ -x "$PY" ] || { python3 -m venv .venv && .venv/bin/pip install -q -r tests/python/requirements.txt; }
timeout $(( ${SOAK_SECONDS:-300} * 2 + 300 )) "$PY" scripts/soak.py --bin "$BIN" --bench-bin "$BENCH" \
  --work "$WORK" --seconds "${SOAK_SECONDS:-300}"
