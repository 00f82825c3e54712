#!/usr/bin/env bash
# docker/vllm/docker-compose.yml on a real Docker engine with no registry: a
# prefill and a decode vLLM engine (the CPU build) sharing one kvtier.
#
#  1. the base image made with debootstrap where the engine lacks it, and
#     kvtier built on the host for the kvtier image (as scripts/docker-test.sh
#     does); the vLLM image built from docker/vllm/Dockerfile (torch and vLLM
#     from the package registry: several GB, minutes the first time), trusting
#     the CA certificates this host trusts (docker/vllm/ca/);
#  2. kvtier, the model (generated, random weights) and both engines started,
#     the engines healthy;
#  3. pd-client run: each prompt prefilled by one engine and decoded by the
#     other, which must read every block the first one stored from kvtier
#     (INFO keyspace_hits); its table printed;
#  4. everything it created removed (containers, volume, the kvtier image,
#     the base image if it made it); the vLLM image is kept for the next run
#     unless RMI=1.
#
# Not part of scripts/test.sh (the image alone takes longer than the whole
# suite's budget allows); tests/vllm runs the same connector in real engines
# without containers. Environment: PROMPTS (3), TOKENS (4096), KEEP=1 leaves
# everything running, PROFILE (release).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
ROOT=$PWD
PROJECT=kvtier-vllm-pd-$$
COMPOSE_FILE=docker/vllm/docker-compose.yml
BASE_TAG=debian:bookworm-slim
CREATED_BASE=0
WORK=$(mktemp -d -t kvtier-vllm-pd.XXXXXX)

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 || {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
  }
}
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  COMPOSE=(docker-compose)
fi
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$COMPOSE_FILE" "$@"; }

export KVTIER_IMAGE=kvtier-pd:$$ KVTIER_RUST_IMAGE=$BASE_TAG KVTIER_BASE_IMAGE=$BASE_TAG
export KVTIER_VLLM_IMAGE=kvtier-vllm:latest KVTIER_HOST_IP=127.0.0.1
export KVTIER_PORT=$(free_port) PREFILL_PORT=$(free_port) DECODE_PORT=$(free_port)

cleanup() {
  local rc=$?
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "left running: ${COMPOSE[*]} -p $PROJECT -f $COMPOSE_FILE down -v"
  else
    [[ $rc -ne 0 ]] && { compose logs --tail 30 >&2 2>&1 || true; }
    compose --profile client down -v --remove-orphans >/dev/null 2>&1 || true
    docker image rm -f "$KVTIER_IMAGE" >/dev/null 2>&1 || true
    [[ ${RMI:-0} == 1 ]] && { docker image rm -f "$KVTIER_VLLM_IMAGE" >/dev/null 2>&1 || true; }
    docker image prune -f --filter label=io.kvtier.stage=build >/dev/null 2>&1 || true
    if [[ $CREATED_BASE == 1 ]]; then docker image rm -f "$BASE_TAG" >/dev/null 2>&1 || true; fi
  fi
  rm -rf "$ROOT/docker/prebuilt" "$WORK" "$ROOT/docker/vllm/ca/host.crt"
  exit $rc
}
trap cleanup EXIT

docker_base_image "$BASE_TAG" "$WORK" && CREATED_BASE=1
docker_prebuilt "${PROFILE:-release}"
# The image installs from the package registry: it trusts what this host
# trusts (a TLS proxy's CA included).
cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" docker/vllm/ca/host.crt

t0=$(date +%s)
echo "building the images (the vLLM image: torch and vLLM from the package registry)"
compose build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
echo "built in $(($(date +%s) - t0)) s; vLLM image $(docker image inspect -f '{{.Size}}' "$KVTIER_VLLM_IMAGE" | awk '{printf "%.1f GB", $1/1e9}')"

t0=$(date +%s)
compose up -d
compose --profile client run --rm pd-client --prompts "${PROMPTS:-3}" --tokens "${TOKENS:-4096}"
echo "engines up and prompts handed over in $(($(date +%s) - t0)) s"
