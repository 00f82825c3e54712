#!/usr/bin/env bash
# Writes under eviction on the store alone: bench/src/bin/kvtier-store-writes.rs
# (one shard's Store, no network) built from this tree and, with
# BASELINE_REV, the same file built against that revision's store crate.
# Timed (the servers' sockets and a client on the same two cores make a
# 3% difference invisible in bench-eviction.sh's cost part; this leaves the
# store) and counted: cachegrind simulates the caches (D1 as this CPU's
# 48 KiB, the last level as its 2 MiB L2, beyond which a line comes from
# the shared L3 or memory) over a fixed key sequence, so instructions and
# misses per write repeat (to about 1%: the maps' hash seeds are random). Per write = (run of 3W writes - run of W
# writes) / 2W, both after the same fill: the fill and start-up cancel.
#
#   BASELINE_REV=8ed0fab scripts/bench-store-writes.sh
#
# Environment: BASELINE_REV (a git revision of this repository; without it
# only this tree), REPS (10 timed turns each, taken in alternating order),
# WRITES (2000000 timed writes a turn), POLICY (prefix), COUNT (1: the
# cachegrind counts; 0: timing only), W (50000).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "missing python3"; exit 1; }
COUNT=${COUNT:-1}
if [[ $COUNT == 1 ]]; then
  command -v valgrind >/dev/null || { echo "missing valgrind (apt-get install valgrind)"; exit 1; }
fi
REPS=${REPS:-10}; WRITES=${WRITES:-2000000}; POLICY=${POLICY:-prefix}; W=${W:-50000}
cargo build --release -q -p kvtier-bench
declare -A bin_of=([new]=target/release/kvtier-store-writes)
builds=(new)
WORK=$(mktemp -d -t kvtier-store-writes.XXXXXX)
cleanup() {
  [[ -d $WORK/tree ]] && git worktree remove --force "$WORK/tree" >/dev/null 2>&1
  git worktree prune
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -n ${BASELINE_REV:-} ]]; then
  # The harness as a crate of its own, on the old store crate, with the
  # workspace's release profile.
  git worktree add -f --detach "$WORK/tree" "$BASELINE_REV" >/dev/null 2>&1
  mkdir -p "$WORK/harness/src"
  cp bench/src/bin/kvtier-store-writes.rs "$WORK/harness/src/main.rs"
  cp "$WORK/tree/Cargo.lock" "$WORK/harness/"
  {
    printf '[package]\nname = "kvtier-store-writes"\nversion = "0.0.0"\nedition = "2021"\n\n'
    printf '[dependencies]\nbytes = "1"\nkvtier-store = { path = "%s/tree/store" }\n\n' "$WORK"
    sed -n '/^\[profile.release\]/,/^$/p' Cargo.toml
    printf '\n[workspace]\n'
  } >"$WORK/harness/Cargo.toml"
  CARGO_TARGET_DIR=target/store-writes-base cargo build --release -q \
    --manifest-path "$WORK/harness/Cargo.toml"
  bin_of[base]=target/store-writes-base/release/kvtier-store-writes
  builds+=(base)
fi
# A build's revision (this tree's marked "+" when it has uncommitted changes).
rev_of() {
  if [[ $1 == base ]]; then git rev-parse --short "$BASELINE_REV"; return; fi
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +)"
}

# Timed turns.
for rep in $(seq "$REPS"); do
  order=("${builds[@]}"); (( rep % 2 == 0 )) && order=($(printf '%s\n' "${builds[@]}" | tac))
  for b in "${order[@]}"; do
    "${bin_of[$b]}" --policy "$POLICY" --writes "$WRITES" | awk '{print $3}' >>"$WORK/ns-$b"
  done
done

# Counted: two runs per build, W and 3W writes after the same fill.
count() {
  local b=$1 w=$2
  valgrind --tool=cachegrind --cache-sim=yes --D1=49152,12,64 --LL=2097152,16,64 \
    --cachegrind-out-file=/dev/null "${bin_of[$b]}" --policy "$POLICY" --writes "$w" --chunks 1 2>&1 \
    | tr -d ',' | awk '/I *refs/ {ir = $4} /D1 *misses/ {d1 = $6} /LL misses/ {rd = $6; wr = $9}
                       END {print ir, d1, rd, wr}' >"$WORK/count-$b-$w"
}
if [[ $COUNT == 1 ]]; then
  for b in "${builds[@]}"; do
    count "$b" "$W" & count "$b" $((3 * W)) &
    wait
  done
fi

echo "## Writes under eviction on the store alone ($POLICY, 256 MiB, 4 KiB values to random keys of 1M)"
echo
echo "| build | ns/write (median of $REPS) | spread | instructions/write | D1 read misses/write | L2 read misses/write | L2 write misses/write |"
echo "|---|---|---|---|---|---|---|"
for b in "${builds[@]}"; do echo "$b $(rev_of "$b")"; done >"$WORK/builds"
python3 - "$WORK" "$COUNT" "$W" <<'EOF'
import os, statistics, sys
work, count, w = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
rows = {}
for line in open(os.path.join(work, "builds")):
    b, rev = line.split()
    ns = [float(x) for x in open(os.path.join(work, f"ns-{b}")).read().split()]
    med = statistics.median(ns)
    cells = [f"{med:.0f}", f"±{(max(ns) - min(ns)) / med * 50:.0f}%"]
    per = []
    if count:
        lo, hi = ([float(x) for x in open(os.path.join(work, f"count-{b}-{n}")).read().split()] for n in (w, 3 * w))
        per = [(h - l) / (2 * w) for l, h in zip(lo, hi)]
        cells += [f"{per[0]:,.0f}"] + [f"{p:.2f}" for p in per[1:]]
    else:
        cells += ["-"] * 4
    rows[b] = [med] + per
    print(f"| {b} ({rev}) | " + " | ".join(cells) + " |")
if "base" in rows:
    ratios = [f"{n / b:.3f}x" for n, b in zip(rows["new"], rows["base"])]
    print(f"| new/base | {ratios[0]} | | " + " | ".join(ratios[1:] or ["-"] * 4) + " |")
EOF
echo
echo "Command: \`BASELINE_REV=${BASELINE_REV:-} scripts/bench-store-writes.sh\` on $(date +%F), $(nproc) cores."
