"""The shell examples of README.md and the redis-cli transcripts of
docs/commands.md run as written:

* the quick start's ``redis-cli`` lines, twice in a row, against a server on
  the port the text names (each ``# → ...`` comment is the reply);
* the "Three nodes on one machine" block, with its
  ``target/release/kvtier-server`` pointed at the binary under test
  (``KVTIER_BIN``), in a process group of its own that the test stops
  (several servers on one host: each serves its metrics at its port + 3000);
* every ``127.0.0.1:6379>`` / ``>`` transcript of docs/commands.md, in order,
  through ``redis-cli`` against a server started as that page starts one
  (its ``users.acl`` and ``kvtier-server --maxmemory ... --tenant ...``
  block): each reply line as printed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, _free_port, kvtier_binary


def example(after: str) -> str:
    """The first ```sh block of the README after the line containing ``after``."""
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


@pytest.fixture
def port_6379() -> Iterator[int]:
    """A kvtier on a free port, standing in for the examples' 6379."""
    port = _free_port()
    p = subprocess.Popen(
        [str(kvtier_binary()), "--port", str(port), "--metrics-addr", "none"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port)
        yield port
    finally:
        p.terminate()
        p.wait(20)


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if ping.stdout.strip() == "PONG":
            return
        time.sleep(0.1)
    raise AssertionError("no kvtier on port %d" % port)


def test_the_quick_start_commands_twice_as_written(port_6379: int) -> None:
    block = example("Then use any Redis client")
    assert block.count("redis-cli -p 6379") == 4, block
    for _ in range(2):
        for line in block.splitlines():
            command, _, reply = line.partition("# →")
            out = subprocess.run(
                ["bash", "-c", command.replace("-p 6379", "-p %d" % port_6379)],
                capture_output=True,
                text=True,
                timeout=10,
            )
            assert out.returncode == 0 and "ERR" not in out.stdout, (line, out)
            if reply:
                assert out.stdout.split() == reply.split(), (line, out.stdout)


COMMANDS_MD = ROOT / "docs" / "commands.md"
PROMPT = re.compile(r"^(?:127\.0\.0\.1:6379)?> (.*)$")


def transcripts() -> list[tuple[int, list[tuple[str, list[str]]]]]:
    """docs/commands.md's redis-cli transcripts: for each plain ``` block (by
    its first line's number) that shows prompts, its commands and the lines
    each prints."""
    found = []
    block: list[str] | None = None
    opened = 0
    for n, line in enumerate(COMMANDS_MD.read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block, opened = ([] if line == "```" else None), n
                if block is None:  # a ```lang block: skipped to its end
                    block = ["\0"]
            else:
                steps: list[tuple[str, list[str]]] = []
                for text in block:
                    prompt = PROMPT.match(text)
                    if prompt:
                        steps.append((prompt.group(1), []))
                    elif steps:
                        steps[-1][1].append(text)
                if steps and block[:1] != ["\0"]:
                    found.append((opened + 1, steps))
                block = None
        elif block is not None:
            block.append(line)
    return found


def test_the_commands_transcripts_as_written(tmp_path: Path) -> None:
    found = transcripts()
    assert len(found) >= 5, "the dialect's and the tenants' transcripts"
    # The server the page starts for its tenant examples, in a folder of its own.
    text = COMMANDS_MD.read_text()
    opened = text.index("\n```sh\necho 'user batch") + 7
    start = text[opened : text.index("\n```", opened)].strip()
    assert "\nkvtier-server " in start, start
    port = _free_port()
    script = start.replace("\nkvtier-server ", "\nexec %s " % kvtier_binary()) + " --port %d --metrics-addr none" % port
    server = subprocess.Popen(
        ["bash", "-c", script], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for(port)
        for line, steps in found:
            for command, want in steps:
                args = shlex.split(command, comments=True)
                got = subprocess.run(
                    ["redis-cli", "--no-raw", "-p", str(port), *args], capture_output=True, text=True, timeout=30
                )
                where = "docs/commands.md:%d %s" % (line, command)
                if want:
                    assert got.stdout.splitlines() == want, (where, got)
                else:  # a command shown without its reply: it must not fail
                    assert got.returncode == 0 and "(error)" not in got.stdout, (where, got)
    finally:
        server.terminate()
        server.wait(20)


def test_the_flag_table_lists_every_flag_of_help() -> None:
    """README's configuration table and ``kvtier-server --help`` name the
    same flags (a row may name several: ``--tls-cert-file``, ``--tls-key-file``)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration") : text.index("## Commands")]
    table = set()
    for row in section.splitlines():
        if row.startswith("| `--"):
            table.update(re.findall(r"`(--[a-z0-9-]+)`", row.split("|")[1]))
    helped = subprocess.run([str(kvtier_binary()), "--help"], capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and helped.stderr == "", "--help prints on stdout and exits 0"
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", helped.stdout, re.M)) - {"--help", "--version"}
    assert flags - table == set(), "flags missing from README's table"
    assert table - flags == set(), "README's table names flags the server does not have"


def test_every_decision_has_a_date_a_status_and_a_row_in_the_index() -> None:
    folder = ROOT / "docs" / "decisions"
    index = (folder / "README.md").read_text()
    files = sorted(p for p in folder.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert len(files) >= 50
    for p in files:
        head = p.read_text().splitlines()[:6]
        assert head[0].startswith("# "), p.name
        assert any(re.fullmatch(r"Date: \d{4}-\d{2}-\d{2}", line) for line in head), p.name
        assert any(line.startswith("Status: ") for line in head), p.name
        assert "(%s)" % p.name in index, "%s is not in docs/decisions/README.md" % p.name
