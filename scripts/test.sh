#!/usr/bin/env bash
# The project's test command. On a fresh Debian machine it installs what is
# missing (redis-server and redis-tools from apt, a Python venv in .venv) and
# runs everything: rustfmt, the layer check of every crate
# (scripts/check-layers.py), clippy, the Rust tests, the Python tests (redis-py
# and a differential run against a real redis-server) and the redis-cli /
# redis-benchmark checks, and the Python connectors (the kvtier package, its
# LMCache plugin and SGLang backend, in a cached venv with torch, lmcache and
# sglang that tests/connectors/venv.sh builds outside the clone), the vLLM
# connector inside real vLLM engines (the CPU build, a generated model, in a
# cached venv that tests/vllm/venv.sh builds), the Kubernetes manifests
# (tests/k8s/run.sh: schemas, a pod's start), and every
# fuzz target for a few seconds (scripts/fuzz.sh, nightly + cargo-fuzz), and a
# short soak (scripts/soak.sh with SOAK_SECONDS=30). It prints a PASS/FAIL
# summary and exits non-zero if any step failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export KVTIER_BIN=${KVTIER_BIN:-$TARGET_DIR/debug/kvtier-server}
VENV=$ROOT/.venv
START=$(date +%s)
RESULTS=()
FAILED=0

summary() {
    local rc=$?
    echo
    echo "==================== summary ===================="
    local r
    for r in "${RESULTS[@]}"; do
        echo "  $r"
    done
    local verdict=PASS
    if [[ $FAILED -ne 0 || $rc -ne 0 ]]; then
        verdict=FAIL
    fi
    echo "  total $(($(date +%s) - START))s"
    echo "RESULT: $verdict"
    if [[ $verdict == FAIL && $rc -eq 0 ]]; then
        exit 1
    fi
}
trap summary EXIT

# step NAME SECONDS COMMAND...: runs a step with a time limit and records it.
step() {
    local name=$1 limit=$2
    shift 2
    echo
    echo "==================== $name ===================="
    local t0 rc=0
    t0=$(date +%s)
    if declare -F "$1" >/dev/null; then
        # A function of this script: run it in a child bash (exported below).
        timeout --kill-after=30 "$limit" bash -c '"$@"' _ "$@" || rc=$?
    else
        timeout --kill-after=30 "$limit" "$@" || rc=$?
    fi
    local took=$(($(date +%s) - t0))
    if [[ $rc -eq 0 ]]; then
        RESULTS+=("PASS  $name (${took}s)")
    else
        [[ $rc -eq 124 ]] && echo "$name: timed out after ${limit}s"
        RESULTS+=("FAIL  $name (exit $rc, ${took}s)")
        FAILED=1
    fi
    return 0
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    else
        sudo "$@"
    fi
}

apt_install() {
    if [[ ${apt_updated:-0} -eq 0 ]]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

install_deps() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null ||
        ! command -v redis-benchmark >/dev/null; then
        echo "installing redis-server and redis-tools"
        apt_install redis-server redis-tools
    fi
    if ! command -v python3 >/dev/null; then
        apt_install python3 python3-venv
    fi
    if [[ ! -f /usr/include/openssl/sha.h ]] || ! command -v g++ >/dev/null; then
        echo "installing g++ and libssl-dev (SGLang builds its page-hash extension with them)"
        apt_install g++ libssl-dev
    fi
    if ! command -v promtool >/dev/null; then
        echo "installing promtool (Debian's prometheus package: the /metrics checks)"
        apt_install prometheus
    fi
    if ! command -v openssl >/dev/null; then
        echo "installing openssl (certificates for the TLS tests)"
        apt_install openssl
    fi
    if ! command -v cargo >/dev/null; then
        echo "cargo is not on PATH: install the Rust toolchain (rustup) first" >&2
        return 1
    fi
    if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV"; then
            rm -rf "$VENV"
            apt_install python3-venv
            python3 -m venv "$VENV"
        fi
    fi
    if ! "$VENV/bin/python" -c 'import redis, hiredis, pytest' 2>/dev/null; then
        "$VENV/bin/pip" install -q -r tests/python/requirements.txt
    fi
    redis-server --version
    "$VENV/bin/python" -c 'import redis, hiredis, pytest; print("redis-py", redis.__version__, "hiredis", hiredis.__version__, "pytest", pytest.__version__)'
}

export VENV
export -f as_root apt_install install_deps
step "install dependencies" 900 install_deps
if [[ $FAILED -ne 0 ]]; then
    exit 1
fi
step "cargo fmt --check" 120 cargo fmt --all -- --check
step "layers: each crate imports one way" 60 python3 scripts/check-layers.py
step "cargo clippy" 1200 cargo clippy --all-targets -- -D warnings
step "cargo test" 1800 cargo test --workspace
step "cargo build kvtier-server" 1200 cargo build -p kvtier-server
step "pytest tests/python" 900 "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider -ra
step "connectors: kvtier package, LMCache, SGLang" 1200 tests/connectors/run.sh
step "vLLM end to end: kvtier connector in real engines" 1200 tests/vllm/run.sh
step "redis-cli and redis-benchmark" 600 scripts/cli-checks.sh
step "Kubernetes manifests: schemas, a pod's start" 600 tests/k8s/run.sh
step "fuzz targets (short)" 1200 env FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh
step "soak (short)" 900 env PROFILE=debug SOAK_SECONDS="${SOAK_SECONDS:-30}" scripts/soak.sh
if docker info >/dev/null 2>&1; then
    step "docker compose cluster" 1500 env PROFILE=debug scripts/docker-test.sh
else
    echo
    echo "==================== docker compose cluster ===================="
    echo "skipped: no Docker engine answers 'docker info'"
    RESULTS+=("SKIP  docker compose cluster (no Docker engine)")
fi
