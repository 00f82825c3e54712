# Helpers the bench and test scripts share; `source "$(dirname "$0")/lib.sh"`.

# A free TCP port on 127.0.0.1 (the kernel picks it).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# json FILE EXPR: EXPR evaluated in Python with the file's JSON as `r`.
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# trace_unique_blocks FILE: distinct hash_ids in a Mooncake JSONL trace.
trace_unique_blocks() {
  python3 -c "
import json, sys
ids = set()
for line in open(sys.argv[1]):
    if line.strip():
        ids.update(json.loads(line)['hash_ids'])
print(len(ids))" "$1"
}

# bench_setup NAME: what a benchmark of real kvtier processes starts with.
# Checks for redis-cli and python3, builds the binaries (release, or debug
# with PROFILE=debug), sets BIN (SERVER_BIN, when set, instead: another
# build's kvtier-server against this build's client), BENCH, WORK (a
# temporary directory named after NAME) and PIDS (append the servers you
# start), and on exit stops them and removes WORK.
bench_setup() {
  local tool
  for tool in redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool"; exit 1; }
  done
  local profile=${PROFILE:-release}
  if [[ $profile == release ]]; then
    cargo build --release -q -p kvtier-server -p kvtier-bench
  else
    cargo build -q -p kvtier-server -p kvtier-bench
  fi
  BIN=${SERVER_BIN:-target/$profile/kvtier-server}
  BENCH=target/$profile/kvtier-bench
  WORK=$(mktemp -d -t "kvtier-$1.XXXXXX")
  PIDS=()
  trap 'stop_all; rm -rf "$WORK"' EXIT
}

# stop_all: stops every process in PIDS and waits for them.
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # Only these: a script's other children (a `tee` it writes through) go on.
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# ticks PID: CPU ticks (user + system, CLK_TCK a second) a process has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wait_up PORT: waits (at most 10 s) until a server answers PING on PORT.
wait_up() {
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "node on $1 did not start"; exit 1
}

# docker_base_image TAG WORK: where no registry can be reached, makes the
# Debian bookworm image the Dockerfiles start from (a minimal root
# filesystem from debootstrap, in WORK, loaded with `docker import`) unless
# the engine has TAG already. Returns 0 when it made the image (the caller
# removes it when done), 1 when TAG was there. Needs as_root and apt_install.
docker_base_image() {
  local tag=$1 work=$2
  docker image inspect "$tag" >/dev/null 2>&1 && return 1
  echo "making $tag with debootstrap (no registry)"
  command -v debootstrap >/dev/null || apt_install debootstrap
  as_root debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
  as_root rm -rf "$work/rootfs/var/cache/apt/archives"/*.deb "$work/rootfs/var/lib/apt/lists"/*
  as_root tar -C "$work/rootfs" -c . | docker import - "$tag" >/dev/null
  as_root rm -rf "$work/rootfs"
  return 0
}

# docker_prebuilt PROFILE: builds kvtier-server and kvtier-bench on the host
# (release or debug) and puts them in docker/prebuilt/, which
# docker/Dockerfile's build stage copies instead of compiling (no Rust image
# to pull). The caller removes docker/prebuilt/ when done.
docker_prebuilt() {
  echo "building kvtier ($1) on the host for the image's build stage"
  if [[ $1 == release ]]; then
    cargo build --release -q -p kvtier-server -p kvtier-bench
  else
    cargo build -q -p kvtier-server -p kvtier-bench
  fi
  mkdir -p docker/prebuilt
  cp "target/$1/kvtier-server" "target/$1/kvtier-bench" docker/prebuilt/
}

# baseline_tree REV: a checkout of revision REV beside the working tree (a git
# worktree under target/baseline/, kept for the next run); prints which
# revision it is and sets BASELINE_SRC.
baseline_tree() {
  local rev
  rev=$(git rev-parse --short "$1")
  BASELINE_SRC=target/baseline/src-$rev
  [[ -d $BASELINE_SRC ]] || git worktree add --detach "$BASELINE_SRC" "$rev" >/dev/null
  echo "baseline: $rev ($(git log -1 --format=%s "$rev" | cut -c1-70))"
}

# build_baseline REV: builds kvtier-server at revision REV (baseline_tree, its
# own target directory, kept too) and sets BASELINE_BIN.
build_baseline() {
  baseline_tree "$1"
  CARGO_TARGET_DIR=$PWD/target/baseline/target cargo build --release -q \
    --manifest-path "$BASELINE_SRC/Cargo.toml" -p kvtier-server
  BASELINE_BIN=$PWD/target/baseline/target/release/kvtier-server
}
