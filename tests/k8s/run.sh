#!/usr/bin/env bash
# The Kubernetes manifests of deploy/kubernetes (scripts/test.sh runs this):
# every object validated against the Kubernetes schemas (kubernetes-validate,
# strict: unknown fields are errors), the kustomization listing every file,
# then the StatefulSet's container started as a pod would start it
# (tests/k8s/pod_start.py, in a network namespace of its own). No cluster
# runs here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export KVTIER_BIN=${KVTIER_BIN:-$PWD/target/debug/kvtier-server}

venv=$(tests/venv.sh k8s tests/k8s 'import kubernetes_validate, yaml, redis')
manifests=()
for f in deploy/kubernetes/*.yaml; do
    [[ $(basename "$f") == kustomization.yaml ]] || manifests+=("$f")
done
"$venv/bin/kubernetes-validate" --strict "${manifests[@]}"
exec "$venv/bin/python" tests/k8s/pod_start.py "${manifests[@]}"
