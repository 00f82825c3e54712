#!/usr/bin/env bash
# The connector tests (scripts/test.sh runs this): builds or reuses the cached
# venv (tests/connectors/venv.sh: torch, lmcache 0.5.6, sglang), installs the
# kvtier package from clients/python into it, checks formatting, lint and
# types (ruff, mypy) of it, of these tests and of bench/'s Python, then runs
# pytest against $KVTIER_BIN.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
export KVTIER_BIN=${KVTIER_BIN:-$ROOT/target/debug/kvtier-server}

t0=$(date +%s)
venv=$(tests/connectors/venv.sh)
echo "venv: $venv ($(($(date +%s) - t0))s)"
py=$venv/bin/python
# The venv's tools (ninja, which SGLang's C++ hash extension builds with) on PATH.
export PATH=$venv/bin:$PATH

# The package installs with pip (no torch, no lmcache: only redis-py).
"$py" -m pip install -q --no-deps --no-build-isolation --force-reinstall ./clients/python
"$py" -c 'import kvtier, sys; print("kvtier", kvtier.__version__, "from", kvtier.__file__)'

config=clients/python/pyproject.toml
"$venv/bin/ruff" format --config "$config" --check clients/python tests/connectors tests/vllm tests/gpu tests/k8s tests/kvtier_servers.py bench
"$venv/bin/ruff" check --config "$config" clients/python tests/connectors tests/vllm tests/gpu tests/k8s tests/kvtier_servers.py bench
"$venv/bin/mypy" --strict bench/gen_traces.py bench/trace_signals.py
# The trace generator's invariants and statistics (about 2 s).
"$py" bench/gen_traces.py selftest
(cd clients/python && "$venv/bin/mypy" kvtier)
for dir in tests/connectors tests/vllm; do
    (cd "$dir" && MYPYPATH=$ROOT/clients/python:$ROOT/tests "$venv/bin/mypy" --config-file "$ROOT/$config" .)
done

exec "$py" -m pytest tests/connectors -q -p no:cacheprovider -ra "$@"
