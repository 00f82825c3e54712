#!/usr/bin/env bash
# Prints the path of a cached Python venv for one group of tests, building it
# first when it is missing:
#
#   tests/venv.sh NAME DIR IMPORTS
#
# The venv lives outside the clone, in
# ${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}/NAME-<hash>, where <hash> covers
# DIR/requirements.txt (installed with their dependencies),
# DIR/requirements-nodeps.txt (installed with --no-deps) and this script: a
# rerun on the same machine reuses it, a change to any of them builds a new
# one (older NAME-* venvs are removed). IMPORTS is a Python statement the
# finished venv must run (e.g. 'import torch, vllm').
#
# Progress goes to stderr; stdout is only the venv path.
set -euo pipefail

name=$1
dir=$(cd "$2" && pwd)
imports=$3
cache=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}
hash=$(cat "$dir/requirements.txt" "$dir/requirements-nodeps.txt" "${BASH_SOURCE[0]}" |
    sha256sum | cut -c1-16)
venv=$cache/$name-$hash

if [[ -x $venv/bin/python && -f $venv/.complete ]]; then
    echo "$venv"
    exit 0
fi

mkdir -p "$cache"
# A partial venv (an interrupted build) is rebuilt from scratch.
rm -rf "$venv" "$venv.tmp"
for old in "$cache/$name"-*; do
    [[ -e $old && $old != "$venv" ]] && rm -rf "$old"
done
echo "building $venv (first run on this machine: torch and its CUDA libraries, ~6 GB)" >&2
t0=$(date +%s)
python3 -m venv "$venv.tmp" >&2
"$venv.tmp/bin/pip" install -q --disable-pip-version-check -r "$dir/requirements.txt" >&2
"$venv.tmp/bin/pip" install -q --disable-pip-version-check --no-deps \
    -r "$dir/requirements-nodeps.txt" >&2
# A venv's scripts name their interpreter by absolute path: move, then fix.
mv "$venv.tmp" "$venv"
grep -rlI --null "$venv.tmp" "$venv/bin" | xargs -0 -r sed -i "s#$venv.tmp#$venv#g"
"$venv/bin/python" -c "$imports" >&2
touch "$venv/.complete"
echo "built $venv in $(($(date +%s) - t0))s" >&2
echo "$venv"
