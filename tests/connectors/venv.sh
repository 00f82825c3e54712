#!/usr/bin/env bash
# Prints the path of the connector tests' Python venv, building it first when
# it is missing. The venv lives outside the clone, in
# ${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}/venv-<hash>, where <hash> covers the
# requirement files and this script: a rerun on the same machine reuses it, a
# change to any of them builds a new one (older ones are removed).
#
# Progress goes to stderr; stdout is only the venv path.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}
hash=$(cat "$here/requirements.txt" "$here/requirements-nodeps.txt" "$here/venv.sh" |
    sha256sum | cut -c1-16)
venv=$cache/venv-$hash

if [[ -x $venv/bin/python && -f $venv/.complete ]]; then
    echo "$venv"
    exit 0
fi

mkdir -p "$cache"
# A partial venv (an interrupted build) is rebuilt from scratch.
rm -rf "$venv" "$venv.tmp"
for old in "$cache"/venv-*; do
    [[ -e $old && $old != "$venv" ]] && rm -rf "$old"
done
echo "building $venv (first run on this machine: torch and its CUDA libraries, ~5 GB)" >&2
t0=$(date +%s)
python3 -m venv "$venv.tmp" >&2
"$venv.tmp/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
"$venv.tmp/bin/pip" install -q --disable-pip-version-check --no-deps \
    -r "$here/requirements-nodeps.txt" >&2
# A venv's scripts name their interpreter by absolute path: move, then fix.
mv "$venv.tmp" "$venv"
grep -rlI --null "$venv.tmp" "$venv/bin" | xargs -0 -r sed -i "s#$venv.tmp#$venv#g"
"$venv/bin/python" -c 'import torch, lmcache, sglang.srt.mem_cache.hicache_storage' >&2
touch "$venv/.complete"
echo "built $venv in $(($(date +%s) - t0))s" >&2
echo "$venv"
