"""The README's shell examples that start servers run as written: the
"Three nodes on one machine" block, with its ``target/release/kvtier-server``
pointed at the binary under test (``KVTIER_BIN``), in a process group of its
own that the test stops. (Several servers on one host: each serves its
metrics at its port + 3000, issue 54.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import ROOT, kvtier_binary


def example(after: str) -> str:
    """The first ```sh block after the line containing ``after``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    m = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M).search(text, start)
    assert m is not None, "no sh block after %r" % after
    return m.group(1)


def test_three_nodes_on_one_machine_as_written(tmp_path: Path) -> None:
    script = example("Three nodes on one machine").replace(
        "target/release/kvtier-server", str(kvtier_binary())
    )
    log = tmp_path / "out.log"
    with log.open("w") as out:
        p = subprocess.Popen(
            ["bash", "-c", script + "\nwait"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "OK" not in log.read_text():
                time.sleep(0.1)
            text = log.read_text()
            assert re.search(r"^OK$", text, re.M), text
            got = subprocess.run(
                ["redis-cli", "-c", "-p", "7003", "get", "hello"], capture_output=True, text=True, timeout=10
            )
            assert got.stdout.strip() == "world", got
            # Every node is up, each with its own metrics endpoint.
            for port in (7001, 7002, 7003):
                ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
                assert ping.stdout.strip() == "PONG", (port, ping, log.read_text())
            assert "cannot serve metrics" not in log.read_text()
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(20)
