#!/usr/bin/env bash
# The docker-compose deployment, tested on a real Docker engine with no
# registry:
#
#  1. what a registry would give: a minimal Debian bookworm root filesystem
#     made with debootstrap and loaded with `docker import` as
#     debian:bookworm-slim (the tag docker/Dockerfile uses), unless the engine
#     has that image already; kvtier-server and kvtier-bench built on the host
#     and put in docker/prebuilt/, which the Dockerfile's build stage copies
#     instead of compiling (RUST_IMAGE is the same Debian image here);
#  2. the image built and the three-node cluster of docker/docker-compose.yml
#     started, every node healthy (its HEALTHCHECK PINGs it);
#  3. driven from the host with redis-cli (each node, keys of every node) and
#     kvtier-bench (connections over the three nodes), and from a container on
#     the compose network with kvtier-bench, a RESP exchange over bash's
#     /dev/tcp, and redis-cli (plain, -c) in a client container (Debian's
#     redis-tools on the same base image); cluster-aware clients on the host
#     (redis-cli --cluster check and -c, redis-py RedisCluster RESP2/3) through
#     the announced published ports;
#  4. every node's /metrics scraped and checked with `promtool check metrics`;
#     docker/prometheus.yml checked and run (Debian's prometheus binary in the
#     base image, on the compose network) until it scrapes all three nodes;
#     the Grafana dashboard's metrics checked against the documented ones;
#  5. one node stopped: the other two keep serving every command within the
#     node timeout + 1 s; restarted: it rejoins and owns its slots again;
#  6. everything it created removed (containers, network, volumes, images,
#     the imported base image if it made it, docker/prebuilt/).
#
# scripts/test.sh runs it when `docker info` answers. Environment:
# PROFILE=debug uses the debug binaries (what test.sh has just built; the
# default is release); KEEP=1 leaves the cluster running (and prints how to
# stop it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
ROOT=$PWD
PROJECT=kvtier-test-$$
COMPOSE_FILE=docker/docker-compose.yml
BASE_TAG=debian:bookworm-slim
IMAGE=kvtier-test:$$
CLIENT_IMAGE=kvtier-test-client:$$
CREATED_BASE=0
WORK=$(mktemp -d -t kvtier-docker.XXXXXX)

log() { printf '\n== %s\n' "$*"; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 || {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
  }
}

if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  echo "neither 'docker compose' nor docker-compose is installed"; exit 1
fi
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE" "$@"; }

export KVTIER_IMAGE=$IMAGE KVTIER_RUST_IMAGE=$BASE_TAG KVTIER_BASE_IMAGE=$BASE_TAG
export KVTIER_NODE_TIMEOUT=1000 KVTIER_HOST_IP=127.0.0.1
for i in 1 2 3; do
  export "KVTIER_PORT_$i=$(free_port)" "KVTIER_METRICS_$i=$(free_port)"
done
PORTS=("$KVTIER_PORT_1" "$KVTIER_PORT_2" "$KVTIER_PORT_3")
METRICS=("$KVTIER_METRICS_1" "$KVTIER_METRICS_2" "$KVTIER_METRICS_3")

cleanup() {
  local rc=$?
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "left running: ${COMPOSE[*]} -p $PROJECT -f $COMPOSE_FILE down -v --rmi local"
  else
    if [[ $rc -ne 0 ]]; then
      compose logs --tail 40 >&2 2>&1 || true
    fi
    compose down -v --rmi local --remove-orphans >/dev/null 2>&1 || true
    docker ps -aq --filter "ancestor=$IMAGE" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
    docker rm -f -v "$PROJECT-prometheus" >/dev/null 2>&1 || true
    docker ps -aq --filter "ancestor=$CLIENT_IMAGE" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
    docker image rm -f "$IMAGE" "$CLIENT_IMAGE" >/dev/null 2>&1 || true
    docker image prune -f --filter label=io.kvtier.stage=build >/dev/null 2>&1 || true
    if [[ $CREATED_BASE == 1 ]]; then docker image rm -f "$BASE_TAG" >/dev/null 2>&1 || true; fi
  fi
  rm -rf "$ROOT/docker/prebuilt" "$WORK"
  exit $rc
}
trap cleanup EXIT

for tool in redis-cli python3 curl; do
  command -v "$tool" >/dev/null || apt_install "$tool" redis-tools
done
command -v promtool >/dev/null || { log "installing promtool (Debian's prometheus package)"; apt_install prometheus; }

docker_base_image "$BASE_TAG" "$WORK" && CREATED_BASE=1
PROFILE=${PROFILE:-release}
docker_prebuilt "$PROFILE"
BIN_DIR=target/$PROFILE

log "building the image and starting the cluster ($PROJECT)"
compose build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
compose up -d
healthy() { # service
  local id
  id=$(compose ps -q "$1")
  [[ -n $id && $(docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null) == healthy ]]
}
wait_healthy() {
  for _ in $(seq 120); do
    if healthy kvtier-1 && healthy kvtier-2 && healthy kvtier-3; then return; fi
    sleep 0.5
  done
  echo "the nodes did not become healthy"; compose ps; exit 1
}
wait_healthy
user=$(docker inspect -f '{{.Config.User}}' "$(compose ps -q kvtier-1)")
[[ $user == kvtier ]] || { echo "the container runs as '$user', not kvtier"; exit 1; }
echo "three nodes healthy, running as $user"

cli() { redis-cli -p "$1" "${@:2}"; }
live_nodes() { cli "$1" cluster info | tr -d '\r' | awk -F: '$1=="cluster_live_nodes" {print $2}'; }
for _ in $(seq 40); do
  [[ $(live_nodes "${PORTS[0]}") == 3 ]] && break
  sleep 0.25
done
[[ $(live_nodes "${PORTS[0]}") == 3 ]] || { echo "the nodes do not see each other"; cli "${PORTS[0]}" cluster nodes; exit 1; }

log "redis-cli from the host: writes through every node, reads through every node"
for i in $(seq 0 59); do
  out=$(cli "${PORTS[$((i % 3))]}" set "docker:key:$i" "value-$i")
  [[ $out == OK ]] || { echo "SET docker:key:$i: $out"; exit 1; }
done
for p in "${PORTS[@]}"; do
  for i in 0 7 13 29 42 59; do
    out=$(cli "$p" get "docker:key:$i")
    [[ $out == "value-$i" ]] || { echo "GET docker:key:$i on port $p: $out"; exit 1; }
  done
done
owners=$(for p in "${PORTS[@]}"; do cli "$p" dbsize; done | tr '\n' ' ')
echo "keys per node: $owners"
for n in $owners; do [[ $n -gt 0 ]] || { echo "a node holds no key: $owners"; exit 1; }; done
out=$(cli "${PORTS[1]}" msetblock 3 docker:b0 x docker:b1 y docker:b2 z CHAIN | tr '\n' ' ')
[[ $out == "1 1 1 " ]] || { echo "MSETBLOCK: $out"; exit 1; }
out=$(cli "${PORTS[2]}" prefixlen 4 docker:b0 docker:b1 docker:b2 docker:nope)
[[ $out == 3 ]] || { echo "PREFIXLEN: $out"; exit 1; }

log "kvtier-bench from the host, connections over the three nodes"
targets="127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}"
"$BIN_DIR/kvtier-bench" kv --target "$targets" --ratio 1:4 --keys 2000 --value-size 16KiB \
  --connections 12 --requests 20000 --json "$WORK/host.json" >"$WORK/host.log" 2>&1 \
  || { cat "$WORK/host.log"; exit 1; }
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['verification_failures']==0 and r['errors']==0, r; print(f\"{r['ops_per_sec']:.0f} ops/s, 0 verification failures\")" "$WORK/host.json"

log "from a container on the compose network"
network=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$(compose ps -q kvtier-1)")
docker run --rm --network "$network" --entrypoint kvtier-bench "$IMAGE" kv \
  --target kvtier-1:6379,kvtier-2:6379,kvtier-3:6379 --ratio 1:4 --keys 1000 --value-size 4KiB \
  --key-prefix container: --connections 6 --requests 5000 >"$WORK/container.log" 2>&1 || { cat "$WORK/container.log"; exit 1; }
grep -E "ops/s" "$WORK/container.log" | head -1
# GET then QUIT: the server answers both and closes, so cat ends.
out=$(timeout 30 docker run --rm --network "$network" --entrypoint bash "$IMAGE" -c \
  'exec 3<>/dev/tcp/kvtier-2/6379; printf "GET docker:key:7\r\nQUIT\r\n" >&3; cat <&3' | tr -d '\r' | sed -n 2p)
[[ $out == "value-7" ]] || { echo "RESP from a container: '$out'"; exit 1; }
echo "GET through kvtier-2 from a container: $out"
# redis-cli in a client container (Debian's redis-tools on the same base):
# plain and cluster-following (-c), by service name (the nodes forward, so no
# MOVED reaches it; the announced addresses are the host's).
printf 'FROM %s\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends redis-tools && rm -rf /var/lib/apt/lists/*\n' "$BASE_TAG" \
  | docker build -q -t "$CLIENT_IMAGE" - >"$WORK/client-build.log" 2>&1 || { tail -20 "$WORK/client-build.log"; exit 1; }
incli() { docker run --rm --network "$network" "$CLIENT_IMAGE" redis-cli "$@"; }
out=$(incli -h kvtier-3 get docker:key:13)
[[ $out == "value-13" ]] || { echo "redis-cli in a container: '$out'"; exit 1; }
for i in 1 2 3 4 5; do
  out=$(incli -c -h kvtier-1 set "docker:cli:$i" "c$i"); [[ $out == OK ]] || { echo "redis-cli -c SET: $out"; exit 1; }
done
out=$(incli -c -h kvtier-2 mget docker:cli:1 docker:cli:5 | tr '\n' ' ')
[[ $out == "c1 c5 " ]] || { echo "redis-cli -c MGET: '$out'"; exit 1; }
echo "redis-cli in a container: GET, -c SET and MGET: all good"

log "cluster-aware clients on the host, through the announced (published) ports"
redis-cli --cluster check "127.0.0.1:${PORTS[0]}" >"$WORK/check.txt" 2>&1 || true
grep -q "All 16384 slots covered" "$WORK/check.txt" && grep -q "All nodes agree about slots configuration" "$WORK/check.txt" \
  || { cat "$WORK/check.txt"; exit 1; }
for p in "${PORTS[@]}"; do
  grep -q "127.0.0.1:$p" "$WORK/check.txt" || { echo "redis-cli --cluster check does not name 127.0.0.1:$p"; cat "$WORK/check.txt"; exit 1; }
done
out=$(redis-cli -c -p "${PORTS[1]}" get docker:key:13); [[ $out == "value-13" ]] || { echo "redis-cli -c on the host: '$out'"; exit 1; }
PY=${VENV:+$VENV/bin/python}
if [[ -z $PY ]] || ! "$PY" -c 'import redis' 2>/dev/null; then
  python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q 'redis>=5.3,<9' >/dev/null
  PY=$WORK/venv/bin/python
fi
"$PY" - "${PORTS[@]}" <<'PY'
import sys
from redis.cluster import ClusterNode, RedisCluster
ports = sorted(int(p) for p in sys.argv[1:])
for protocol in (2, 3):
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", ports[0])], protocol=protocol, socket_timeout=10)
    primaries = sorted((n.host, n.port) for n in rc.get_primaries())
    assert primaries == [("127.0.0.1", p) for p in ports], primaries
    keys = [f"docker:rc{protocol}:{i}" for i in range(100)]
    for k in keys:
        assert rc.set(k, k)
    assert all(rc.get(k) == k.encode() for k in keys)
    assert len(rc.keys(f"docker:rc{protocol}:*", target_nodes=RedisCluster.PRIMARIES)) == 100
    rc.close()
print(f"redis-py RedisCluster from the host: primaries {primaries}, 100 keys written and read (RESP2, RESP3)")
PY

log "metrics: every node, promtool check metrics"
for i in 0 1 2; do
  curl -sf "http://127.0.0.1:${METRICS[$i]}/metrics" >"$WORK/metrics-$i.txt"
  grep -q '^kvtier_commands_total' "$WORK/metrics-$i.txt" || { echo "node $((i + 1)): no kvtier_commands_total"; exit 1; }
  grep -q '^kvtier_cluster_node_up' "$WORK/metrics-$i.txt" || { echo "node $((i + 1)): no kvtier_cluster_node_up"; exit 1; }
  promtool check metrics <"$WORK/metrics-$i.txt" || { echo "node $((i + 1)): promtool found problems"; exit 1; }
  echo "node $((i + 1)): $(grep -c '^# HELP' "$WORK/metrics-$i.txt") metric families, promtool clean"
done

log "observability profile: Prometheus config and Grafana dashboard"
promtool check config docker/prometheus.yml >/dev/null || { promtool check config docker/prometheus.yml; exit 1; }
python3 - "$WORK/metrics-0.txt" README.md <<'PY'
import json, re, sys
scraped = open(sys.argv[1]).read()
readme = open(sys.argv[2]).read()
dash = json.load(open("docker/grafana/dashboards/kvtier.json"))
names = set()
for panel in dash["panels"]:
    for t in panel["targets"]:
        names |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"kvtier_[a-z_]+", t["expr"])}
missing = sorted(n for n in names if n not in readme)
assert not missing, f"dashboard uses undocumented metrics: {missing}"
live = sorted(n for n in names if re.search(rf"^{n}(_bucket)?[{{ ]", scraped, re.M))
print(f"dashboard: {len(dash['panels'])} panels, {len(names)} metrics, all documented; {len(live)} already exported by node 1")
PY

log "Prometheus with docker/prometheus.yml on the compose network (Debian's prometheus binary in the base image: prom/prometheus cannot be pulled here)"
prom_port=$(free_port)
docker run -d --name "$PROJECT-prometheus" --network "$network" -p "127.0.0.1:$prom_port:9090" \
  -v "$(command -v prometheus):/usr/local/bin/prometheus:ro" \
  -v "$ROOT/docker/prometheus.yml:/etc/prometheus/prometheus.yml:ro" \
  --entrypoint /usr/local/bin/prometheus "$BASE_TAG" \
  --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/tmp/prometheus >/dev/null
targets_up() {
  curl -sf "http://127.0.0.1:$prom_port/api/v1/targets" | python3 -c '
import json, sys
t = json.load(sys.stdin)["data"]["activeTargets"]
print(sum(x["health"] == "up" for x in t if x["labels"]["job"] == "kvtier"))' 2>/dev/null || echo 0
}
for _ in $(seq 60); do [[ $(targets_up) == 3 ]] && break; sleep 0.5; done
[[ $(targets_up) == 3 ]] || { echo "Prometheus does not see 3 kvtier targets up"; docker logs "$PROJECT-prometheus" 2>&1 | tail -20; exit 1; }
for _ in $(seq 40); do
  n=$(curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode 'query=count(kvtier_commands_total) by (instance)' \
    | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))' 2>/dev/null || echo 0)
  [[ $n == 3 ]] && break
  sleep 0.5
done
[[ $n == 3 ]] || { echo "Prometheus has kvtier_commands_total from $n node(s), not 3"; exit 1; }
echo "Prometheus scrapes all 3 nodes (targets up, kvtier_commands_total from each)"
docker rm -f "$PROJECT-prometheus" >/dev/null

log "stopping kvtier-3: the other two keep serving"
slots_before=$(cli "${PORTS[0]}" cluster slots | md5sum)
compose stop -t 5 kvtier-3 >/dev/null 2>&1
sleep 2   # node timeout (1 s) + 1 s
for p in "${PORTS[0]}" "${PORTS[1]}"; do
  for i in $(seq 0 59); do
    out=$(cli "$p" get "docker:key:$i")
    [[ $out != *ERR* && $out != *TRYAGAIN* ]] || { echo "GET docker:key:$i on $p after the loss: $out"; exit 1; }
    out=$(cli "$p" set "docker:key:$i" "after-$i")
    [[ $out == OK ]] || { echo "SET docker:key:$i on $p after the loss: $out"; exit 1; }
  done
  [[ $(live_nodes "$p") == 2 ]] || { echo "node on $p does not see the loss"; exit 1; }
done
echo "every command on the two survivors succeeded"

log "restarting kvtier-3: it rejoins and owns its slots again"
compose start kvtier-3 >/dev/null 2>&1
wait_healthy
for _ in $(seq 40); do
  [[ $(live_nodes "${PORTS[0]}") == 3 && $(live_nodes "${PORTS[1]}") == 3 ]] && break
  sleep 0.25
done
[[ $(cli "${PORTS[0]}" cluster slots | md5sum) == "$slots_before" ]] || { echo "the slot map differs after the rejoin"; exit 1; }
# kvtier-3 learns the others' announced endpoints from its first pings.
for _ in $(seq 40); do
  [[ $(cli "${PORTS[2]}" cluster slots | md5sum) == "$slots_before" ]] && break
  sleep 0.25
done
[[ $(cli "${PORTS[2]}" cluster slots | md5sum) == "$slots_before" ]] || { echo "kvtier-3 has another slot map"; cli "${PORTS[2]}" cluster nodes; exit 1; }
out=$(cli "${PORTS[0]}" set docker:rejoined yes); [[ $out == OK ]]
out=$(cli "${PORTS[2]}" get docker:rejoined); [[ $out == yes ]] || { echo "GET after rejoin: $out"; exit 1; }
echo "kvtier-3 is back with its slots"

log "PASS: docker compose cluster"
