"""Starts the StatefulSet's container of deploy/kubernetes as a pod would and
checks the node it makes (tests/k8s/run.sh runs this with the manifests).

The pod is `kvtier-1` of three in namespace `ci`: its command and arguments
are the manifest's, its environment the manifest's with the downward API
filled in (pod name, namespace, IP 127.0.0.1) and the Secrets made here (an
ACL file, a peer password, scripts/test-certs.sh's certificates). The only
changes: the mount paths point into a temporary directory, and maxmemory
and the spill tier's size are small. It runs in a network namespace of its
own (the ports are the manifest's, 6379, 6380 and 9379); the peers' names do
not resolve there, so the node serves alone, as a pod whose peers have not
started yet does.

Checked: the kustomization lists every manifest; the node answers NOAUTH,
then serves the ACL's user; it names itself and its two peers as the
manifest says (node id, announced hostname); TLS on 6380 with the
certificate from the Secret; /metrics on 9379; the readiness and liveness
probes' commands pass; its log is JSON line by line; SIGTERM stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
import yaml

ROOT = Path(__file__).resolve().parents[2]
POD = {"metadata.name": "kvtier-1", "metadata.namespace": "ci", "status.podIP": "127.0.0.1"}
USERS_ACL = (
    "user default off\n"
    "user peer on >peer-secret -@all +cluster|peer\n"
    "user engine on >engine-secret ~* +@all\n"
)
SECRETS = {("kvtier-acl", "masterauth"): "peer-secret"}
#: Small enough for a test machine (the manifest asks for 12gb and 400gb).
SMALL = {"KVTIER_MAXMEMORY": "256mb", "KVTIER_SPILL_MAX_BYTES": "1gb"}


def fail(why: str) -> None:
    print("FAIL:", why, file=sys.stderr)
    sys.exit(1)


def load(paths: list[str]) -> list[dict[str, Any]]:
    docs = []
    for p in paths:
        docs += [d for d in yaml.safe_load_all(Path(p).read_text()) if d]
    return docs


def check_kustomization(paths: list[str]) -> None:
    k = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "kustomization.yaml").read_text())
    listed = sorted(k["resources"])
    files = sorted(Path(p).name for p in paths)
    if listed != files:
        fail("kustomization.yaml lists %s, the directory has %s" % (listed, files))


def container_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = POD[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = SECRETS[(ref["name"], ref["key"])]
    return {**env, **SMALL}


def mounts(spec: dict[str, Any], container: dict[str, Any], root: Path) -> dict[str, Path]:
    """Each mount path -> a directory under ``root`` holding what the pod
    would see there (the Secrets' files, an empty data volume)."""
    certs = root / "certs"
    subprocess.run([str(ROOT / "scripts" / "test-certs.sh"), str(certs)], check=True, capture_output=True)
    secret_files = {
        "kvtier-acl": {"users.acl": USERS_ACL, "masterauth": "peer-secret"},
        "kvtier-tls": {
            "tls.crt": (certs / "server.crt").read_text(),
            "tls.key": (certs / "server.key").read_text(),
            "ca.crt": (certs / "ca.crt").read_text(),
        },
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for m in container["volumeMounts"]:
        d = root / m["name"]
        d.mkdir()
        volume = volumes.get(m["name"])
        if volume is not None:
            for name, text in secret_files[volume["secret"]["secretName"]].items():
                (d / name).write_text(text)
        out[m["mountPath"]] = d
    return out


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail("the node exited %s:\n%s" % (proc.returncode, log.read_text()))
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return
        except redis.exceptions.AuthenticationError:
            return
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    fail("port %d did not answer:\n%s" % (port, log.read_text()))


def main() -> None:
    paths = sys.argv[1:]
    if os.environ.get("KVTIER_IN_NETNS") != "1":
        if os.geteuid() != 0:
            print("skipped: the pod's start needs root for a network namespace")
            return
        os.environ["KVTIER_IN_NETNS"] = "1"
        os.execvp("unshare", ["unshare", "--net", sys.executable, __file__, *paths])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    check_kustomization(paths)
    docs = load(paths)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    container = spec["containers"][0]
    if container["env"][0]["name"] != "POD_NAME" or sts["spec"]["replicas"] != int(
        container_env(container)["KVTIER_REPLICAS"]
    ):
        fail("replicas and KVTIER_REPLICAS differ")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = container["args"][0]
        for path, d in sorted(mounts(spec, container, root).items(), key=lambda kv: -len(kv[0])):
            script = script.replace(path, str(d))
        env = dict(os.environ, **container_env(container))
        env["PATH"] = "%s:%s" % (Path(os.environ["KVTIER_BIN"]).parent, env["PATH"])
        log = root / "kvtier.log"
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [*container["command"], script], env=env, stdout=log_file, stderr=log_file
            )
        try:
            check_node(proc, log, container, root)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print("pod kvtier-1: manifests valid, node started and checked")


def check_node(proc: subprocess.Popen[bytes], log: Path, container: dict[str, Any], root: Path) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    wait_port(ports["resp"], proc, log)
    try:
        redis.Redis(port=ports["resp"]).ping()
        fail("the default user answered: the ACL file was not loaded")
    except redis.exceptions.AuthenticationError:
        pass
    c = redis.Redis(port=ports["resp"], username="engine", password="engine-secret")
    assert c.set("k", "v") and c.get("k") == b"v"
    nodes = c.execute_command("CLUSTER", "NODES")
    text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    lines = [line for line in text.splitlines() if line]
    if len(lines) != 3:
        fail("CLUSTER NODES lists %d nodes, not 3:\n%s" % (len(lines), text))
    me = [line for line in lines if "myself" in line]
    if len(me) != 1 or "kvtier-1.kvtier.ci.svc.cluster.local" not in me[0]:
        fail("this node is not kvtier-1 announcing its pod's DNS name:\n%s" % text)
    if not all(any("kvtier-%d" % i in line for line in lines) for i in range(3)):
        fail("the peers are not kvtier-0..2:\n%s" % text)

    tls = redis.Redis(
        port=ports["resp-tls"],
        ssl=True,
        ssl_ca_certs=str(root / "certs" / "ca.crt"),
        username="engine",
        password="engine-secret",
    )
    if tls.get("k") != b"v":
        fail("TLS on %d did not serve the key" % ports["resp-tls"])
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % ports["metrics"], timeout=5) as r:
        if b"kvtier_" not in r.read():
            fail("/metrics has no kvtier_ series")
    for probe in ("readinessProbe", "livenessProbe"):
        if subprocess.run(container[probe]["exec"]["command"]).returncode != 0:
            fail("the %s's command failed" % probe)

    proc.send_signal(signal.SIGTERM)
    if proc.wait(timeout=30) != 0:
        fail("SIGTERM: exit %s" % proc.returncode)
    lines = [line for line in log.read_text().splitlines() if line]
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            fail("a log line is not JSON: %r" % line)
        if not {"time", "level", "target", "message", "fields"} <= set(event):
            fail("a log line lacks a key: %r" % line)
    if not any("listening on" in json.loads(line)["message"] for line in lines):
        fail("no 'listening on' in the log")


if __name__ == "__main__":
    main()
